"""``TeacherModel``: the base of the PATE-style modules (PATE-GAN, G-PATE).

In these models only K teachers read real records, each from its own disjoint partition; a
PATE-style strategy (:class:`~lightning_dpgan.callbacks.teachers.TeacherStrategy`) has the
module build them and feeds them. What leaves the teachers goes through the module's privacy
slot, so the module refuses to train without its strategy.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_dpgan.modules.base import GANModule
from lightning_dpgan.nets.ensemble import TeacherEnsemble, build_teacher_ensemble


class TeacherModel(GANModule):
    """A GAN module whose private data reaches only its K teachers."""

    # Subclasses set ``self.teachers = None`` in __init__ (a class attribute would shadow the
    # registered submodule), then build them from ``num_teachers`` when given.
    teachers: TeacherEnsemble | None

    def teacher_ensemble_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`build_teacher_ensemble` (architecture and sizes)."""
        raise NotImplementedError

    def build_teachers(self, num_teachers: int) -> TeacherEnsemble:
        """Create the K teachers (once; the count is saved with the hyper-parameters)."""
        if self.teachers is not None:
            if self.teachers.num_teachers != num_teachers:
                raise ValueError(f"this model already has {self.teachers.num_teachers} teachers, not {num_teachers}")
            return self.teachers
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be at least 1, got {num_teachers}")
        self.teachers = build_teacher_ensemble(num_teachers, self.data_shape, self.num_classes,
                                               **self.teacher_ensemble_kwargs())
        self.hparams["num_teachers"] = num_teachers
        return self.teachers

    def update_teachers(self, optimizer: Any, real: Tensor, real_labels: Tensor | None, fake: Tensor,
                        fake_labels: Tensor | None) -> Tensor:
        """One update of all teachers at once: teacher k on its own real minibatch ``real[k]``
        against the shared generated ``fake``. Summing the per-teacher mean losses gives each
        teacher exactly its own gradient. Returns the mean loss per teacher."""
        loss = self.teachers.discriminator_loss(real, real_labels, fake, fake_labels)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss.detach() / self.teachers.num_teachers

    def setup(self, stage: str) -> None:
        if stage == "fit" and (self.teachers is None or self.privacy is None):
            name = self.run_info.get("model", type(self).__name__.lower())
            raise ValueError(f"{name} trains only through its teachers' private votes: run it with --privacy {self.default_privacy}")

    def private_networks(self) -> dict[str, Any]:
        return {"teachers": self.teachers}
