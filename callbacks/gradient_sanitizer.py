"""``GradientSanitizer``: the gradient-sanitizing strategy (DP-HOOK of DP-SACTGAN; GS-WGAN's hook).

It puts :class:`~lightning_dpgan.privacy.gradient_sanitizer.GradientSanitizerMechanism` in the
module's GradientSanitizer slot: the discriminator trains on real records without noise and is
never released, and every gradient that flows from it into the generator is clipped per
generated record and noised (sensitivity and noise are stated in that module). Each generator
step is charged to a :class:`~lightning_dpgan.privacy.accountants.GaussianAccountant` as a
Gaussian mechanism of noise multiplier ``sigma / (2 sqrt(B))``: ``(lambda, 2 B lambda / sigma^2)``-RDP,
DP-SACTGAN's Theorem 1, for B generated records per step (fixed by this strategy, so the
charge does not depend on the data).

No amplification is claimed: one real record may change the discriminator and so every
released gradient. (GS-WGAN gets amplification by training N discriminators on disjoint
subsets and querying one at random per step; that mode is not offered yet.)
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import lightning as L

from lightning_dpgan.callbacks.strategy import CalibratedNoiseStrategy
from lightning_dpgan.privacy.accountants import GaussianAccountant, calibrate_noise_multiplier
from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism, effective_noise_multiplier
from lightning_dpgan.privacy.slots import GradientSanitizer as GradientSanitizerSlot
from lightning_dpgan.privacy.validation import validate_positive


class GradientSanitizer(CalibratedNoiseStrategy):
    """Clip and noise the gradient the generator receives from the discriminator (DP-HOOK)."""

    name: ClassVar[str] = "sanitizer"
    slot: ClassVar[type] = GradientSanitizerSlot
    mechanism_name: ClassVar[str] = "gradient sanitizer (per-record clipping and Gaussian noise on dL/dG(z))"

    def __init__(
        self,
        noise_multiplier: float | None = None,
        max_norm: float = 1.0,
        generated_batch_size: int | None = None,
        target_epsilon: float | None = None,
        delta: float | None = None,
    ) -> None:
        """
        Args:
            noise_multiplier: sigma; the noise on each gradient entry is ``sigma * C / B``.
                Default: calibrated so that the planned generator steps spend ``--epsilon``.
            max_norm: C, each generated record's gradient is clipped to ``C / B``.
            generated_batch_size: B, generated records per generator step (default: the
                datamodule's batch size). It sets the privacy cost of a step.
        """
        super().__init__(noise_multiplier, target_epsilon, delta)
        self.max_norm = validate_positive("--privacy.max_norm", max_norm)
        if generated_batch_size is not None and generated_batch_size < 1:
            raise ValueError(f"--privacy.generated_batch_size must be at least 1, got {generated_batch_size}")
        self.generated_batch_size = generated_batch_size
        self.accountant = GaussianAccountant()

    def install(self, trainer: L.Trainer, pl_module: Any) -> None:
        batch_size = trainer.datamodule.hparams.batch_size
        self.generated_batch_size = self.generated_batch_size or batch_size
        pl_module.generated_batch_size = self.generated_batch_size
        if self.noise_multiplier is None:
            self.noise_multiplier = self._calibrate(trainer, pl_module, batch_size)
        self.mechanism = GradientSanitizerMechanism(self.max_norm, self.noise_multiplier, on_release=self._charge)
        pl_module.privacy = self.mechanism

    def _calibrate(self, trainer: L.Trainer, pl_module: Any, batch_size: int) -> float:
        """The smallest sigma whose planned generator steps stay within the target: each step is
        a Gaussian mechanism (no subsampling), so Opacus' calibration at sampling rate 1 gives
        the noise multiplier in sensitivity units, ``sigma / (2 sqrt(B))``."""
        batches = self.planned_batches(trainer, math.ceil(self.train_records / batch_size))
        steps = max(1, batches // getattr(pl_module.hparams, "discriminator_steps", 1))
        self.calibrated_for_steps = steps
        effective = calibrate_noise_multiplier(self.training_target, self.training_delta, 1.0, steps)
        return effective * 2.0 * math.sqrt(self.generated_batch_size)

    def _charge(self, batch: int) -> None:
        if batch != self.generated_batch_size:
            raise RuntimeError(f"a sanitized batch of {batch} records, but the strategy charges batches of {self.generated_batch_size}")
        self.accountant.step(**self.next_step_params())

    def next_step_params(self) -> dict[str, float]:
        return {"noise_multiplier": effective_noise_multiplier(self.noise_multiplier, self.generated_batch_size)}

    def report_parameters(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "max_norm": self.max_norm,
            "generated_batch_size": self.generated_batch_size,
            "effective_noise_multiplier": self.next_step_params()["noise_multiplier"] if self.generated_batch_size else None,
            "rdp_per_step": "2 B lambda / sigma^2 (DP-SACTGAN, Theorem 1)",
            "calibrated_for_steps": self.calibrated_for_steps,
            "generator_steps": len(self.accountant),
        }
