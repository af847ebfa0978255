"""``gan``: the non-saturating GAN baseline (Goodfellow et al. 2014), trained without privacy."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_dpgan.modules.base import GANModule


class GAN(GANModule):
    """Non-saturating GAN (BCE losses, Adam); the non-private baseline."""

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        lr_generator: float = 2e-4,
        lr_discriminator: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.999),
        **kwargs: Any,
    ) -> None:
        super().__init__(data_shape, num_classes, **kwargs)
        self.save_hyperparameters()

    def discriminator_real_loss(self, real_scores: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(real_scores, torch.ones_like(real_scores), reduction="none")

    def discriminator_fake_loss(self, fake_scores: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(fake_scores, torch.zeros_like(fake_scores), reduction="none")

    def generator_loss(self, fake_scores: Tensor) -> Tensor:
        # Non-saturating form: maximise log D(G(z)) rather than minimise log(1 - D(G(z))).
        return F.binary_cross_entropy_with_logits(fake_scores, torch.ones_like(fake_scores))

    def build_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        betas = tuple(self.hparams.betas)
        return (
            torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr_generator, betas=betas),
            torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr_discriminator, betas=betas),
        )
