"""``TeacherModel``: the base of the PATE-style modules (PATE-GAN, G-PATE).

In these models only K teachers read real records, each from its own disjoint partition; a
PATE-style strategy (:class:`~lightning_dpgan.callbacks.teachers.TeacherStrategy`) has the
module build them and feeds them. What leaves the teachers goes through the module's privacy
slot, so the module refuses to train without its strategy.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_dpgan.distributed import from_rank_zero, gather_shards_on_rank_zero
from lightning_dpgan.modules.base import GANModule
from lightning_dpgan.nets.ensemble import TeacherEnsemble, build_teacher_ensemble

TEACHERS_PREFIX = "teachers."


class TeacherModel(GANModule):
    """A GAN module whose private data reaches only its K teachers."""

    # Subclasses set ``self.teachers = None`` in __init__ (a class attribute would shadow the
    # registered submodule), then build them from ``num_teachers`` when given.
    teachers: TeacherEnsemble | None

    def teacher_ensemble_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`build_teacher_ensemble` (architecture and sizes)."""
        raise NotImplementedError

    @property
    def generator_updates(self) -> int:
        """One generator step per training step (a refused one is not counted as a step)."""
        return self.train_steps

    def generator_updates_every_step(self, num_critics: Any = None) -> bool:
        return True

    def build_teachers(self, num_teachers: int, keep: slice | None = None) -> TeacherEnsemble:
        """Create the K teachers (once; the count is saved with the hyper-parameters).

        ``keep``: this process holds only these of the K (a DDP rank's shard), built as a
        single process would build them but without holding the others (a rank of N needs 1/N
        of the host memory of all K). Teachers built before (loaded with their count) are cut
        to the shard."""
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be at least 1, got {num_teachers}")
        if self.teachers is None:
            self.teachers = build_teacher_ensemble(num_teachers, self.data_shape, self.num_classes, keep=keep,
                                                   **self.teacher_ensemble_kwargs())
            self.set_hparam("num_teachers", num_teachers)
        elif self.hparams.get("num_teachers", self.teachers.num_teachers) != num_teachers:
            raise ValueError(f"this model already has {self.hparams['num_teachers']} teachers, not {num_teachers}")
        elif self.teacher_shard is not None and keep != self.teacher_shard:
            raise ValueError(f"this model holds teachers {self.teacher_shard} of {num_teachers}, not {keep}")
        elif keep is not None and self.teacher_shard is None:
            self.teachers.keep_teachers(keep)
        if keep is not None:
            self.teacher_shard = keep
        return self.teachers

    def parameters_per_teacher(self) -> int:
        """Parameters of one teacher (the ensemble's grow linearly in K): what the strategy's
        memory check multiplies before any of the K is built."""
        return sum(p.numel() for p in self._one_teacher().parameters())

    def teachers_train_in_chunks(self) -> bool:
        """Whether this model's teacher ensemble can train a slice of teachers at a time."""
        return self._one_teacher().supports_chunked_training

    def _one_teacher(self) -> TeacherEnsemble:
        return build_teacher_ensemble(1, self.data_shape, self.num_classes, **self.teacher_ensemble_kwargs())

    #: this process's slice of the K teachers under DDP (None: it holds all K)
    teacher_shard: slice | None = None

    def process_local_parameters(self) -> list[torch.nn.Parameter]:
        """The teachers of this rank's shard: never averaged nor broadcast across ranks."""
        return list(self.teachers.parameters()) if self.teacher_shard is not None else []

    def query_inputs(self, n: int) -> tuple[Tensor, Tensor | None]:
        """Latent codes and labels of ``n`` records to ask the teachers about: rank 0's on every
        rank, because the ranks' teacher shards must vote on the same records."""
        labels = self.sample_labels(n)
        latent = from_rank_zero(self.sample_latent(n))
        return latent, None if labels is None else from_rank_zero(labels)

    def update_teachers(self, optimizer: Any, real: Tensor, real_labels: Tensor | None, fake: Tensor,
                        fake_labels: Tensor | None) -> Tensor:
        """One update of all teachers at once: teacher k on its own real minibatch ``real[k]``
        against the shared generated ``fake``. Summing the per-teacher mean losses gives each
        teacher exactly its own gradient. Returns the mean loss per teacher. When one graph over
        all K would not fit in memory, the strategy has set the ensemble's ``train_chunk``: the
        same gradients, a slice of teachers at a time."""
        optimizer.zero_grad()
        if self.teachers.train_chunk:
            # manual_backward would scale the loss under 16-bit mixed precision, and the optimizer step unscales
            scaler = getattr(getattr(self.trainer, "precision_plugin", None), "scaler", None)
            scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
            loss = self.teachers.backward_in_chunks(real, real_labels, fake, fake_labels, loss_scale=scale)
        else:
            loss = self.teachers.discriminator_loss(real, real_labels, fake, fake_labels)
            self.manual_backward(loss)
        optimizer.step()
        return loss.detach() / self.teachers.num_teachers

    def setup(self, stage: str) -> None:
        if stage == "fit" and (self.teachers is None or self.privacy is None):  # refused before the base class warns
            name = self.run_info.get("model", type(self).__name__.lower())
            raise ValueError(f"{name} trains only through its teachers' private votes: run it with --privacy {self.default_privacy}")
        super().setup(stage)

    def private_networks(self) -> dict[str, Any]:
        return {"teachers": self.teachers}

    # -------------------------------------------------------------- checkpoints
    #: where the teachers' optimizer is in ``configure_optimizers``' list (the last one)
    teacher_optimizer_index = -1

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Under DDP, the checkpoint (written by rank 0) holds all K teachers and their Adam
        state, gathered from the ranks' shards into rank 0's host memory: it resumes under any
        number of processes. (The other ranks' copies of the checkpoint are never written.)"""
        super().on_save_checkpoint(checkpoint)
        if self.teacher_shard is None:
            return
        total = self.hparams.num_teachers
        for name, value in self._teacher_tensors(checkpoint):
            value[name] = gather_shards_on_rank_zero(value[name], total)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep this rank's shard of the checkpoint's K teachers (and of their Adam state), copied
        out: a view would keep all K alive in the optimizer's state. (A checkpoint read through
        :class:`~lightning_dpgan.checkpoint_io.ShareReadingCheckpointIO` arrives already cut.)"""
        super().on_load_checkpoint(checkpoint)
        for name, holder in self.keep_own_share(checkpoint):
            holder[name] = holder[name].clone()

    def holds_a_share(self) -> bool:
        return self.teacher_shard is not None

    def keep_own_share(self, checkpoint: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Under DDP, cut the checkpoint's K teachers and their Adam state to this rank's shard
        (views: from a memory-mapped file only the shard's pages are read when copied)."""
        if self.teacher_shard is None:
            return []
        total = self.hparams.num_teachers
        cut = [(name, holder) for name, holder in self._teacher_tensors(checkpoint) if holder[name].shape[0] == total]
        for name, holder in cut:
            holder[name] = holder[name][self.teacher_shard]
        return cut

    @classmethod
    def leave_out_for_sampling(cls, checkpoint: dict[str, Any]) -> None:
        """The teachers never reach the generator's samples, and thousands of them (the G-PATE
        presets': 1.6G parameters at K = 4000) would be built and filled in memory: a module
        loaded to sample has none."""
        checkpoint.setdefault("hyper_parameters", {})["num_teachers"] = None
        weights = checkpoint.get("state_dict", {})
        checkpoint["state_dict"] = {name: value for name, value in weights.items() if not name.startswith(TEACHERS_PREFIX)}

    def _teacher_tensors(self, checkpoint: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """``(key, holder)`` of every tensor stacked along the teacher dimension: the teachers'
        parameters and their optimizer's per-parameter state."""
        weights = checkpoint.get("state_dict", {})
        found = [(name, weights) for name in weights if name.startswith(TEACHERS_PREFIX)]
        optimizers = checkpoint.get("optimizer_states") or []
        if optimizers:
            states = optimizers[self.teacher_optimizer_index].get("state", {})
            for index, live in list(states.items()):
                # optimizer.state_dict() shares each parameter's state dict with the live optimizer:
                # edit a copy, or the running optimizer would get the gathered tensors
                state = states[index] = dict(live)
                found += [(key, state) for key, value in state.items() if torch.is_tensor(value) and value.dim() > 0]
        return found
