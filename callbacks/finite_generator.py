"""``FiniteGeneratorGuard``: stop a run whose generator became NaN or infinite.

A diverged GAN keeps "training" on NaN weights and would then write NaN samples, a
synthetic.csv of garbage and a checkpoint that looks fine. The guard checks the generator's
parameters after every batch and raises :class:`TrainingDivergedError` at the first non-finite
one, before any later callback (periodic checkpoint, sample grid) runs on the broken weights;
the run's outputs are then never written, and the last good checkpoint stays.

It looks at the generator only -- the released, private part -- and not at the discriminator's
or teachers' losses: those are computed on real records without noise, and stopping (or not)
on them would release a bit about the data outside any mechanism. A divergence of the
discriminator reaches the generator at its next step, and is caught there.
"""
from __future__ import annotations

from typing import Any

import lightning as L
import torch


#: the divergence's other remedy, for a strategy that clips (DP-SGD, the sanitizer): its noise grows
#: with the clipping bound
NOISE_REMEDY = (", or the noise's scale (--privacy.max_grad_norm or --privacy.max_norm, times the noise "
                "multiplier)")


class TrainingDivergedError(ValueError):
    """The generator's parameters became NaN or infinite."""


class FiniteGeneratorGuard(L.Callback):
    """Raise :class:`TrainingDivergedError` when a generator parameter is not finite."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        finite = torch.stack([p.detach().isfinite().all() for p in pl_module.generator.parameters()]).all()
        if not bool(finite):  # one device-to-host sync per batch
            from lightning_dpgan.modules.base import privacy_strategy_of

            strategy = privacy_strategy_of(trainer)  # a baseline, PATE or G-PATE has no clipping bound to lower
            clipped = any(hasattr(strategy, bound) for bound in ("max_grad_norm", "max_norm"))
            raise TrainingDivergedError(
                f"the generator's parameters became NaN or infinite at training step {pl_module.train_steps}: "
                "training diverged. No synthetic data or privacy report was written, and the last checkpoint (if "
                "any) is from before; the run folder keeps its config.yaml and logs/ (a rerun there needs "
                f"--overwrite). Lower the learning rates (--model.*lr*){NOISE_REMEDY if clipped else ''}, and start "
                "again."
            )
