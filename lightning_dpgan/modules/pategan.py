"""``pategan``: PATE-GAN (Jordon, Yoon & van der Schaar, ICLR 2019), Algorithm 1.

Per training step (one generator iteration):

1. ``teacher_steps`` (nT) updates of all K teachers at once: teacher k sees a minibatch from its
   own disjoint partition of the training data (drawn by the PATE strategy's sampler) against
   one shared batch of generated records.
2. ``student_steps`` (nS) updates of the student on generated records labelled by the teachers'
   votes, aggregated by the LabelAggregator slot (Laplace noisy argmax, every answer charged).
   The student never sees real data.
3. One generator update against the student.

Only the teachers read real records; what leaves them is the noisy-argmax labels. Networks as
in the paper's appendix: generator and student of depth 3 with widths d, d/2, d (d = record
width), teachers of depth 1 (logistic regression), ReLU in the generator (the student is the
package's MLP discriminator, LeakyReLU(0.2), where the paper has ReLU), sigmoid outputs, Adam at 1e-4,
generator input z ~ U[0, 1]^d, Xavier-initialised generator. The generator minimises the
non-saturating loss -log S(G(z)) (same fixed point as the paper's log(1 - S(G(z))), stronger
early gradients).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dpgan.modules.base import check_at_least_one
from lightning_dpgan.modules.teachers import TeacherModel
from lightning_dpgan.privacy.slots import LabelAggregator, PrivacyBudgetExhausted


class PATEGAN(TeacherModel):
    """PATE-GAN: K teachers on disjoint partitions label data for a student via noisy PATE votes."""

    privacy_slot: ClassVar[type | None] = LabelAggregator
    default_privacy: ClassVar[str] = "pate"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        lr: float = 1e-4,
        teacher_steps: int = 5,
        student_steps: int = 5,
        teacher_hidden: Sequence[int] = (),
        num_teachers: int | None = None,
        teacher_lr: float | None = None,
        **kwargs: Any,
    ) -> None:
        width = math.prod(data_shape)
        paper_widths = (width, max(width // 2, 1), width)
        kwargs.setdefault("latent_dim", width)
        kwargs.setdefault("latent_distribution", "uniform")
        kwargs.setdefault("arch", "mlp")
        # tables: sigmoid, records in [0, 1]; images: tanh, pixels in [-1, 1] (the factory's convention)
        kwargs.setdefault("generator_kwargs", {"hidden": paper_widths, "norm": None})
        kwargs.setdefault("discriminator_kwargs", {"hidden": paper_widths})
        check_at_least_one(teacher_steps=teacher_steps, student_steps=student_steps)
        super().__init__(data_shape, num_classes, **kwargs)
        self.save_hyperparameters()
        self._xavier_init(self.generator)
        self.teachers = None  # built by the strategy, or here from the saved count when loading
        if num_teachers is not None:
            self.build_teachers(num_teachers)

    @staticmethod
    def _xavier_init(network: nn.Module) -> None:
        for layer in network.modules():
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)

    @property
    def student(self) -> nn.Module:
        """The student-discriminator (the base class's ``discriminator``)."""
        return self.discriminator

    def teacher_ensemble_kwargs(self) -> dict[str, Any]:
        return {"arch": "mlp", "hidden": tuple(self.hparams.teacher_hidden)}

    # ---------------------------------------------------------------- training
    def training_step(self, batch: tuple[list[Tensor], list[Tensor] | None], batch_idx: int) -> None:
        """``batch``: each teacher's minibatches for this step, nT tensors ``[K, b, ...]`` (+ labels)."""
        teacher_records, teacher_labels = batch
        opt_g, opt_s, opt_t = self.optimizers()
        n = teacher_records[0].shape[1]
        for t in range(self.hparams.teacher_steps):
            labels_t = None if teacher_labels is None else teacher_labels[t]
            teacher_loss = self.teacher_step(opt_t, teacher_records[t], labels_t, n)
        real_labels = []
        try:
            for _ in range(self.hparams.student_steps):
                student_loss, real_share = self.student_step(opt_s, n)
                real_labels.append(real_share)
        except PrivacyBudgetExhausted:
            self.trainer.should_stop = True  # the refused labels were never drawn: stop here
            return
        generator_loss = self.generator_step_pate(opt_g, n)
        self.train_steps += 1
        self.log_dict({"loss/teachers": teacher_loss, "loss/student": student_loss, "loss/generator": generator_loss},
                      prog_bar=True, batch_size=n)
        # the share of this step's released labels that said "real"; near 0 for a whole run, the
        # student only ever heard "generated" and the generator learned nothing from the data
        self.log("pate/real_label_share", torch.stack(real_labels).mean(), batch_size=n)

    def teacher_step(self, optimizer: Any, real: Tensor, labels: Tensor | None, n: int) -> Tensor:
        """All teachers at once: teacher k on its own real minibatch ``real[k]`` vs shared fakes.

        Summing the per-teacher mean losses gives each teacher exactly its own gradient."""
        latent, fake_labels = self.query_inputs(n)
        with torch.no_grad():
            fake = self.generator(latent, fake_labels)
        return self.update_teachers(optimizer, real, self.teacher_labels(labels), fake, self.teacher_labels(fake_labels))

    def teacher_labels(self, labels: Tensor | None) -> Tensor | None:
        """What the teachers are told about a record besides the record: its class label."""
        return labels

    def student_step(self, optimizer: Any, n: int) -> tuple[Tensor, Tensor]:
        """The student learns the teachers' noisy labels of generated records; returns its loss and
        the share of the labels that said "real"."""
        latent, fake_labels = self.query_inputs(n)
        with torch.no_grad():
            fake = self.generator(latent, fake_labels)
            real_votes = self.teachers.votes(fake, self.teacher_labels(fake_labels))
        votes = torch.stack([self.teachers.num_teachers - real_votes, real_votes], dim=1)
        targets = self.privacy.aggregate(votes).to(fake.dtype)
        loss = F.binary_cross_entropy_with_logits(self.student(fake, fake_labels), targets)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss.detach(), targets.mean()

    def generated_for_generator_step(self, n: int) -> tuple[Tensor, Tensor | None, Tensor]:
        """``(generated records, their labels, extra generator loss)`` for the generator step."""
        labels = self.sample_labels(n)
        fake = self.generator(self.sample_latent(n), labels)
        return fake, labels, fake.new_zeros(())

    def generator_step_pate(self, optimizer: Any, n: int) -> Tensor:
        self.student.requires_grad_(False)
        try:
            fake, labels, extra_loss = self.generated_for_generator_step(n)
            scores = self.student(fake, labels)
            loss = F.binary_cross_entropy_with_logits(scores, torch.ones_like(scores)) + extra_loss
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        finally:
            self.student.requires_grad_(True)
        return loss.detach()

    @property
    def teacher_lr(self) -> float:
        """The teachers' learning rate (``lr`` unless set): teacher updates release nothing, so
        teachers that learn faster vote more confidently for the same privacy cost."""
        return self.hparams.lr if self.hparams.teacher_lr is None else self.hparams.teacher_lr

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        lr = self.hparams.lr
        return [
            torch.optim.Adam(self.generator.parameters(), lr=lr),
            torch.optim.Adam(self.student.parameters(), lr=lr),
            self.teachers.make_optimizer(self.teacher_lr, betas=(0.9, 0.999)),
        ]
