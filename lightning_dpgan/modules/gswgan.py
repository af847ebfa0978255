"""``gswgan``: a WGAN-GP whose generator learns only through sanitized gradients (GS-WGAN,
Chen, Orekondy & Fritz, NeurIPS 2020; the same hook is DP-SACTGAN's DP-HOOK).

The critic trains on real records without noise (WGAN-GP: gradient penalty 10, Adam with
betas (0, 0.9), 5 critic steps per generator step) and is never released. The generator's only
contact with it is the gradient of its loss with respect to the generated records, which the
GradientSanitizer slot clips per record and noises (``lightning_dpgan.privacy.gradient_sanitizer``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from lightning_dpgan.modules.wgan import WGAN
from lightning_dpgan.privacy.slots import GradientSanitizer


class GSWGAN(WGAN):
    """GS-WGAN: WGAN-GP critic trained freely; the generator's gradients are sanitized."""

    privacy_slot: ClassVar[type | None] = GradientSanitizer
    default_privacy: ClassVar[str] = "sanitizer"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        lr_generator: float = 1e-4,
        lr_discriminator: float = 1e-4,
        gradient_penalty: float = 10.0,
        **kwargs: Any,
    ) -> None:
        if gradient_penalty <= 0:
            raise ValueError("gswgan's critic needs a gradient penalty > 0 (it has no weight clipping)")
        super().__init__(data_shape, num_classes, lr_generator=lr_generator, lr_discriminator=lr_discriminator,
                         gradient_penalty=gradient_penalty, **kwargs)
        self.save_hyperparameters()
