"""``gpate``: G-PATE (Long et al., "G-PATE: Scalable Differentially Private Data Generator via
Private Aggregation of Teacher Discriminators", NeurIPS 2021), Algorithm 1.

Per training step:

1. The student generator draws ``m`` records ``x = G(z)`` (``m`` = the teachers' minibatch size).
2. Every teacher takes one update on its own minibatch of ``m`` real records (from its own
   disjoint partition, drawn by the strategy's sampler) against the shared ``x``.
3. Every teacher's adversarial perturbation of each record -- the direction in which the
   teacher finds it more real (:meth:`GPATE.adversarial_perturbations`: by default minus the
   gradient of its generator loss, as the authors' code; Eq. 1's discriminator-loss form on
   request) -- goes to the GradientAggregator slot (DPGradAgg: projection, discretization,
   Confident-GNMax), the only path from the teachers to the generator.
4. The generator moves towards ``x + dx`` by minimising Eq. 2's loss (:func:`student_loss`).

The teachers are never released, so they train without noise; only the aggregated
perturbations are private. Networks (appendix A.5): images get
:class:`~lightning_dpgan.nets.gpate.GPATEGenerator` (FC 1024 + deconv 64 x 5x5 stride 2, label
at every layer) and :class:`~lightning_dpgan.nets.ensemble.ConvTeacher` teachers (conv 32 x 5x5
stride 2 + FC 256, label planes; no BatchNorm, which batched teachers cannot hold); tables get
MLPs (generator widths d, d/2, d with a sigmoid output as PATE-GAN's; teachers one hidden layer
of width d, our choice: the paper says only "the same architecture as PATE-GAN", whose teachers
this package reads as logistic regressions). Adam at 1e-3 for both, as the paper.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dpgan.argument_types import network_settings
from lightning_dpgan.modules.base import check_at_least_one
from lightning_dpgan.modules.teachers import TeacherModel
from lightning_dpgan.nets import build_networks
from lightning_dpgan.nets.ensemble import ConvTeacher, MLPTeacherEnsemble, teacher_arch
from lightning_dpgan.nets.gpate import GPATEGenerator
from lightning_dpgan.privacy.slots import GradientAggregator, PrivacyBudgetExhausted


#: What the teachers' input-gradients are taken of (see ``GPATE.adversarial_perturbations``).
PERTURBATIONS = ("generator-loss", "discriminator-loss")


def student_loss(fake: Tensor, target: Tensor) -> Tensor:
    """Eq. 2: the squared distance of each generated record to its target ``x + dx``, averaged
    over the records (not over every pixel, as ``F.mse_loss`` would).

    The targets are only ``|dx| ~ 1e-4`` away (the perturbations are clipped to the bins of
    ``+-clip``), so a per-pixel mean makes the generator's gradients ~784x smaller for MNIST:
    around Adam's ``eps = 1e-8``, which then damps the update of a large share of the weights
    (measured: 41 % of them below ``eps``, first steps at half size). The authors' code sums
    over records and pixels alike, a constant factor Adam does not see.
    """
    return (fake - target).pow(2).flatten(1).sum(dim=1).mean()


class GPATE(TeacherModel):
    """G-PATE: a student generator guided by privately aggregated gradients of K teachers."""

    privacy_slot: ClassVar[type | None] = GradientAggregator
    default_privacy: ClassVar[str] = "gpate"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        lr: float = 1e-3,
        teacher_lr: float = 1e-3,
        teacher_steps: int = 1,
        perturbation: str = "generator-loss",
        teacher_kwargs: dict[str, Any] | None = None,
        num_teachers: int | None = None,
        **kwargs: Any,
    ) -> None:
        is_image = len(data_shape) == 3
        width = math.prod(data_shape)
        if not is_image:
            kwargs.setdefault("arch", "mlp")
            kwargs.setdefault("generator_kwargs", {"hidden": (width, max(width // 2, 1), width), "output_activation": "sigmoid"})
        check_at_least_one(teacher_steps=teacher_steps)
        if perturbation not in PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}")
        super().__init__(data_shape, num_classes, **kwargs)
        self.save_hyperparameters()
        self.teacher_kwargs = dict(teacher_kwargs) if teacher_kwargs else ({} if is_image else {"hidden": (width,)})
        self._check_teacher_settings()
        self.teachers = None  # built by the strategy, or here from the saved count when loading
        if num_teachers is not None:
            self.build_teachers(num_teachers)

    def _check_teacher_settings(self) -> None:
        """``--model.teacher_kwargs`` against the teacher class they build, before any teacher is:
        the strategy builds them once training starts, where a misspelt key was a traceback."""
        arch = teacher_arch(self.teacher_kwargs.get("arch", "auto"), self.data_shape)
        teacher = ConvTeacher if arch == "conv" else MLPTeacherEnsemble
        settings = {key: value for key, value in self.teacher_kwargs.items() if key != "arch"}
        network_settings("model.teacher_kwargs", teacher, settings, provided=("num_classes", "keep"))

    def make_networks(self) -> tuple[nn.Module, None]:
        """The student generator, and no discriminator: the K teachers take that role."""
        h = self.hparams
        if len(self.data_shape) == 3:
            kwargs = network_settings("model.generator_kwargs", GPATEGenerator, h.generator_kwargs)
            return GPATEGenerator(h.latent_dim, self.data_shape, self.num_classes, **kwargs), None
        return build_networks("mlp", self.data_shape, h.latent_dim, self.num_classes, h.generator_kwargs)[0], None

    def teacher_ensemble_kwargs(self) -> dict[str, Any]:
        return self.teacher_kwargs

    # ---------------------------------------------------------------- training
    def training_step(self, batch: tuple[list[Tensor], list[Tensor] | None], batch_idx: int) -> None:
        """``batch``: each teacher's minibatches, nT tensors ``[K, m, ...]`` (+ labels ``[K, m]``), one
        per teacher update of this step (``teacher_steps``; the paper's 1)."""
        teacher_records, teacher_labels = batch
        n = teacher_records[0].shape[1]
        opt_g, opt_t = self.optimizers()
        latent, labels = self.query_inputs(n)
        fake = self.generator(latent, labels)
        for t in range(len(teacher_records)):
            real_labels = None if teacher_labels is None else teacher_labels[t]
            teacher_loss = self.update_teachers(opt_t, teacher_records[t], real_labels, fake.detach(), labels)
        try:
            perturbation = self.privacy.aggregate(self.adversarial_perturbations(fake.detach(), labels))
        except PrivacyBudgetExhausted:
            self.trainer.should_stop = True  # nothing was released: stop here
            return
        generator_loss = student_loss(fake, (fake + perturbation).detach())
        opt_g.zero_grad()
        self.manual_backward(generator_loss)
        opt_g.step()
        self.train_steps += 1
        self.log_dict({"loss/teachers": teacher_loss, "loss/generator": generator_loss}, prog_bar=True, batch_size=n)

    def adversarial_perturbations(self, fake: Tensor, labels: Tensor | None) -> Tensor:
        """Every teacher k's perturbation of every record b, ``[K, B, ...]``.

        ``generator-loss`` (default, as the authors' code): minus the gradient of the teacher's
        batch-mean generator loss ``-log D_k(x)``, i.e. ``(1 - D_k(x_b)) d logit / d x_b / B``.
        ``discriminator-loss`` (the paper's Eq. 1): the gradient of ``-log(1 - D_k(x))``, i.e.
        ``D_k(x_b) d logit / d x_b``. Both point where the teacher finds the record more real;
        Eq. 1's weight vanishes exactly where the teacher is sure a record is fake, which left
        the votes near 0 and split in our measurements (benchmarks/RESULTS.md).
        """
        if self.hparams.perturbation == "discriminator-loss":
            return self.teachers.input_gradients(fake, labels, transform=F.softplus)
        n = fake.shape[0]
        return self.teachers.input_gradients(fake, labels, transform=lambda logits: F.logsigmoid(logits) / n)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999)),
            self.teachers.make_optimizer(self.hparams.teacher_lr, betas=(0.5, 0.999)),
        ]
