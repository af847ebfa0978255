"""``wgan``: Wasserstein GAN (Arjovsky et al. 2017), the critic DPGAN makes private.

Weight clipping with RMSProp is the default because that is what DPGAN (Xie et al. 2018)
builds its privacy analysis on: clipping the weights bounds the critic's gradients. The
gradient penalty of WGAN-GP (Gulrajani et al. 2017) is an option for non-private runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dpgan.modules.base import GANModule


class WGAN(GANModule):
    """Wasserstein GAN: critic with weight clipping (RMSProp) or gradient penalty (Adam)."""

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        lr_generator: float = 5e-5,
        lr_discriminator: float = 5e-5,
        weight_clip: float = 0.01,
        gradient_penalty: float = 0.0,
        discriminator_steps: int = 5,
        **kwargs: Any,
    ) -> None:
        if weight_clip < 0 or gradient_penalty < 0:
            raise ValueError("weight_clip and gradient_penalty must be non-negative")
        super().__init__(data_shape, num_classes, discriminator_steps=discriminator_steps, **kwargs)
        self.save_hyperparameters()

    def discriminator_real_loss(self, real_scores: Tensor) -> Tensor:
        return -real_scores

    def discriminator_fake_loss(self, fake_scores: Tensor) -> Tensor:
        return fake_scores

    def generator_loss(self, fake_scores: Tensor) -> Tensor:
        return -fake_scores.mean()

    def discriminator_penalty(self, real: Tensor, labels: Tensor | None, fake: Tensor, fake_labels: Tensor | None) -> Tensor:
        return gradient_penalty(self.discriminator, real, labels, fake, self.hparams.gradient_penalty)

    def after_discriminator_step(self) -> None:
        clip = self.hparams.weight_clip
        if clip > 0 and self.hparams.gradient_penalty == 0:
            with torch.no_grad():
                for p in self.discriminator.parameters():
                    p.clamp_(-clip, clip)

    def build_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        if self.hparams.gradient_penalty > 0:
            betas = (0.0, 0.9)  # WGAN-GP's Adam settings
            return (
                torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr_generator, betas=betas),
                torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr_discriminator, betas=betas),
            )
        return (
            torch.optim.RMSprop(self.generator.parameters(), lr=self.hparams.lr_generator),
            torch.optim.RMSprop(self.discriminator.parameters(), lr=self.hparams.lr_discriminator),
        )


def gradient_penalty(discriminator: nn.Module, real: Tensor, labels: Tensor | None, fake: Tensor, weight: float) -> Tensor:
    """WGAN-GP's penalty (Gulrajani et al. 2017): ``weight * (||grad D(x_mix)|| - 1)^2`` per score.

    ``x_mix`` interpolates each real record with a generated one; with class labels or condition
    vectors only the records are interpolated and the real ones' conditions kept (the usual
    conditional WGAN-GP choice). Where several records share one score (CTGAN's pac), the norm is
    taken over each pack's gradient (the rows of the gradient, one per score) and the result has
    one entry per score.
    """
    if weight == 0:
        return real.new_zeros(())
    if fake.shape[0] != real.shape[0]:  # a short last batch, or a fixed generated batch size
        fake = fake[torch.arange(real.shape[0], device=fake.device) % fake.shape[0]]
    alpha = torch.rand(real.shape[0], *([1] * (real.dim() - 1)), device=real.device)
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    scores = discriminator(mixed, labels)
    (grad,) = torch.autograd.grad(scores.sum(), mixed, create_graph=True)
    return weight * (grad.reshape(scores.shape[0], -1).norm(dim=1) - 1) ** 2
