"""``patectgan``: PATE-CTGAN (Rosenblatt et al. 2020, "Differentially private synthetic data:
applied evaluations and enhancements") -- CTGAN's generator and conditions trained through
PATE-GAN's teacher/student scheme.

Per step, as :class:`~lightning_dpgan.modules.pategan.PATEGAN`: ``teacher_steps`` updates of the
K teachers, each on its own disjoint partition (the batched ensemble; the only networks that
read real records), ``student_steps`` updates of the student discriminator on generated
records labelled by the teachers' Laplace noisy-argmax votes (the PATE strategy charges each
answer), and one generator update against the student. The paper's appendix: embedding 128,
generator and student (256, 256), weight decay 1e-6, teacher/student iterations 5/5.

What CTGAN adds: mode-specific encoded records, the generator's residual network with
per-span activations, and conditions -- the student and the generator take condition
vectors (the DP category frequencies), and the generator pays CTGAN's condition
cross-entropy. The teachers judge records alone: a real record's condition is a function of
the record, so it would tell them nothing new.

Departures from the paper's PATE-CTGAN (its Fig. 7): one conditional generator, where the paper
starts k, one per data subset; PATE-GAN's scheme trains one generator against one student, and
only the teachers need the partitions. The teachers are the presets' logistic regressions
(configs/patectgan.yaml), where the paper's are CTGAN discriminators.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_dpgan.modules.conditional_table import ConditionalTableMixin, check_table_layout
from lightning_dpgan.modules.pategan import PATEGAN
from lightning_dpgan.nets.ctgan import CTGANDiscriminator, CTGANGenerator


class PATECTGAN(ConditionalTableMixin, PATEGAN):
    """PATE-CTGAN: CTGAN generator and student trained from K teachers' noisy votes."""

    default_privacy: ClassVar[str] = "pate"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        table_layout: dict[str, Any] | None = None,
        latent_dim: int = 128,
        generator_hidden: Sequence[int] = (256, 256),
        discriminator_hidden: Sequence[int] = (256, 256),
        teacher_hidden: Sequence[int] = (),
        lr: float = 2e-4,
        weight_decay: float = 1e-6,
        log_frequency: bool = True,
        gumbel_tau: float = 0.2,
        **kwargs: Any,
    ) -> None:
        self.table_layout = check_table_layout(table_layout)
        kwargs.setdefault("conditional", False)
        kwargs.setdefault("latent_distribution", "normal")
        super().__init__(data_shape, num_classes, lr=lr, teacher_hidden=teacher_hidden, latent_dim=latent_dim, **kwargs)
        self.save_hyperparameters()

    def make_networks(self) -> tuple[nn.Module, nn.Module]:
        h = self.hparams
        generator = CTGANGenerator(h.latent_dim, self.cond_dim, self.spans, hidden=tuple(h.generator_hidden),
                                   tau=h.gumbel_tau)
        student = CTGANDiscriminator(self.data_shape[0], self.cond_dim, hidden=tuple(h.discriminator_hidden), pac=1)
        return generator, student

    @staticmethod
    def _xavier_init(network: nn.Module) -> None:
        """CTGAN keeps PyTorch's default initialisation (PATE-GAN's Xavier init is not used)."""

    def teacher_labels(self, labels: Tensor | None) -> Tensor | None:
        """Teachers judge records alone (a real record's condition is a function of the record)."""
        return None

    def generated_for_generator_step(self, n: int) -> tuple[Tensor, Tensor | None, Tensor]:
        """Records for log-frequency conditions, and CTGAN's condition cross-entropy on their logits."""
        cond, column = self.generator_conditions(n)
        logits = self.generator.logits(self.sample_latent(n), cond)
        return self.generator.activate(logits), cond, self.condition_loss(logits, cond, column)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        h = self.hparams
        betas = (0.5, 0.9)
        return [
            torch.optim.Adam(self.generator.parameters(), lr=h.lr, betas=betas, weight_decay=h.weight_decay),
            torch.optim.Adam(self.student.parameters(), lr=h.lr, betas=betas, weight_decay=h.weight_decay),
            self.teachers.make_optimizer(self.teacher_lr, betas=(0.9, 0.999)),
        ]
