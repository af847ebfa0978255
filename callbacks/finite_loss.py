"""``FiniteLossGuard``: stop a run whose losses became NaN or infinite.

A diverged GAN keeps "training" on NaN weights and would then write NaN samples, a
synthetic.csv of garbage and a checkpoint that looks fine. The guard checks the losses the
module logs (``loss/*``) after every batch and raises :class:`TrainingDivergedError` on the
first non-finite one, before any later callback (periodic checkpoint, sample grid) runs on the
broken weights; the run's outputs are then never written, and the last good checkpoint stays.
"""
from __future__ import annotations

import math
from typing import Any

import lightning as L


class TrainingDivergedError(ValueError):
    """A training loss became NaN or infinite."""


class FiniteLossGuard(L.Callback):
    """Raise :class:`TrainingDivergedError` when a logged ``loss/*`` value is not finite."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        for name, value in trainer.callback_metrics.items():
            if name.startswith("loss/") and not math.isfinite(float(value)):
                raise TrainingDivergedError(
                    f"{name} became {float(value)} at training step {pl_module.train_steps}: training diverged. "
                    "Nothing was written for this run; the last checkpoint (if any) is from before. Lower the "
                    "learning rates (--model.*lr*) or, for DP-SGD, the clipping norm, and start again."
                )
