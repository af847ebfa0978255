"""``ctgan``: CTGAN (Xu, Skoularidou, Cuesta-Infante & Veeramachaneni, NeurIPS 2019), the
conditional tabular GAN that DP-CTGAN and DP-SACTGAN make private.

Records are mode-specific encoded (:mod:`lightning_dpgan.data.table_transformer`); the
generator is CTGAN's residual network with tanh / Gumbel-softmax outputs per span, the
discriminator CTGAN's LeakyReLU + dropout network over ``pac`` packed records. Both take the
condition vector of :mod:`lightning_dpgan.modules.conditional_table`. Adam with CTGAN's
settings (lr 2e-4, betas (0.5, 0.9), weight decay 1e-6). Losses: ``wasserstein`` (with an
optional gradient penalty, CTGAN's default of 10 when not private) or ``cross_entropy``.

Without a privacy strategy this is the non-private baseline.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dpgan.distributed import own_share_of_draw
from lightning_dpgan.modules.base import GANModule
from lightning_dpgan.modules.conditional_table import ConditionalTableMixin, check_table_layout
from lightning_dpgan.modules.wgan import gradient_penalty
from lightning_dpgan.nets.ctgan import CTGANDiscriminator, CTGANGenerator

LOSSES = ("wasserstein", "cross_entropy")


def pac_under_dp_sgd(pac: int) -> str:
    """The refusal of ``pac`` > 1 under DP-SGD, with its fix (the module's, and train's up front)."""
    return f"pac = {pac} under DP-SGD would let one record change many packs: set --model.pac 1 (DP-CTGAN's setting)"


class CTGAN(ConditionalTableMixin, GANModule):
    """CTGAN: conditional tabular GAN with mode-specific normalization (not private)."""

    default_privacy: ClassVar[str] = "none"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        table_layout: dict[str, Any] | None = None,
        latent_dim: int = 128,
        generator_hidden: Sequence[int] = (256, 256),
        discriminator_hidden: Sequence[int] = (256, 256),
        pac: int = 10,
        loss: str = "wasserstein",
        gradient_penalty: float = 10.0,
        lr_generator: float = 2e-4,
        lr_discriminator: float = 2e-4,
        weight_decay: float = 1e-6,
        log_frequency: bool = True,
        gumbel_tau: float = 0.2,
        discriminator_steps: int = 1,
        **kwargs: Any,
    ) -> None:
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if pac < 1:
            raise ValueError(f"--model.pac must be at least 1 (records per discriminator input), got {pac}")
        if gradient_penalty < 0:
            raise ValueError(f"--model.gradient_penalty must be 0 or more, got {gradient_penalty}")
        if loss == "cross_entropy" and gradient_penalty:
            raise ValueError("the gradient penalty belongs to the wasserstein loss: set gradient_penalty 0")
        self.table_layout = check_table_layout(table_layout)
        kwargs.setdefault("conditional", False)  # the condition vector replaces class labels
        super().__init__(data_shape, num_classes, latent_dim=latent_dim, discriminator_steps=discriminator_steps, **kwargs)
        self.save_hyperparameters()

    def make_networks(self) -> tuple[nn.Module, nn.Module]:
        h = self.hparams
        data_dim = self.data_shape[0]
        if sum(width for width, _ in self.spans) != data_dim:
            raise ValueError(f"the table layout's spans cover {sum(w for w, _ in self.spans)} slots, records have {data_dim}")
        generator = CTGANGenerator(h.latent_dim, self.cond_dim, self.spans, hidden=tuple(h.generator_hidden),
                                   tau=h.gumbel_tau)
        discriminator = CTGANDiscriminator(data_dim, self.cond_dim, hidden=tuple(h.discriminator_hidden), pac=h.pac)
        return generator, discriminator

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.gradient_privatizer is not None and self.hparams.pac > 1:
            # Packs are consecutive records of a batch: adding or removing one record shifts every
            # later record into another pack, so one record would change many "samples" whose
            # gradients DP-SGD clips one by one -- the clipping would no longer bound a record.
            raise ValueError(pac_under_dp_sgd(self.hparams.pac))

    # ------------------------------------------------------------------- losses
    def discriminator_real_loss(self, real_scores: Tensor) -> Tensor:
        if self.hparams.loss == "wasserstein":
            return -real_scores
        return F.softplus(-real_scores)  # binary cross-entropy with target 1

    def discriminator_fake_loss(self, fake_scores: Tensor) -> Tensor:
        if self.hparams.loss == "wasserstein":
            return fake_scores
        return F.softplus(fake_scores)  # binary cross-entropy with target 0

    def generator_loss(self, fake_scores: Tensor) -> Tensor:
        if self.hparams.loss == "wasserstein":
            return -fake_scores.mean()
        return F.softplus(-fake_scores).mean()  # non-saturating

    def discriminator_penalty(self, real: Tensor, labels: Tensor | None, fake: Tensor, fake_labels: Tensor | None) -> Tensor:
        return gradient_penalty(self.discriminator, real, labels, fake, self.hparams.gradient_penalty)

    # ----------------------------------------------------------------- training
    def generator_step(self, n: int) -> Tensor:
        """One generator update: adversarial loss on generated records (sanitized when a
        GradientSanitizer fills the slot), plus the condition cross-entropy on the logits
        (it reads no data and no private network, so it needs no sanitizing)."""
        opt_g = self.optimizers()[0]
        cond, column, latent = own_share_of_draw(lambda count: (*self.generator_conditions(count), self.sample_latent(count)), n)
        private = list(self.private_networks().values())
        for network in private:
            network.requires_grad_(False)
        try:
            with self.public_pass():
                logits = self.generator.logits(latent, cond)
                fake = self.sanitize_generated(self.generator.activate(logits))
                loss = self.adversarial_generator_loss(fake, cond) + self.condition_loss(logits, cond, column)
                opt_g.zero_grad()
                self.manual_backward(loss)
            opt_g.step()
        finally:
            for network in private:
                network.requires_grad_(True)
        return loss.detach()

    def adversarial_generator_loss(self, fake: Tensor, cond: Tensor | None) -> Tensor:
        """The generator's loss from the networks trained on real data (sanitized ``fake``)."""
        return self.generator_loss(self.discriminator(fake, cond))

    def build_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        h = self.hparams
        betas = (0.5, 0.9)
        return (
            torch.optim.Adam(self.generator.parameters(), lr=h.lr_generator, betas=betas, weight_decay=h.weight_decay),
            torch.optim.Adam(self.discriminator.parameters(), lr=h.lr_discriminator, betas=betas,
                             weight_decay=h.weight_decay),
        )
