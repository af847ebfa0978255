"""Disjoint teacher partitions and per-teacher minibatches for PATE-style models.

PATE's privacy argument needs each private record to reach exactly one teacher: changing one
record then changes at most one teacher's vote (or gradient), which is the sensitivity the
noisy aggregation is calibrated to. So the partition is drawn once, fixed for the whole run,
checkpointed, and every teacher draws its minibatches from its own part only. Public PATE
code has broken this by feeding every teacher the same part, or by letting teachers draw
fresh random subsets of the whole dataset each iteration; :class:`PartitionedSampler` makes
both impossible by construction.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_dpgan.privacy.validation import validate_int

STATE_FORMAT = 1


def disjoint_partitions(n: int, k: int, seed: int) -> list[Tensor]:
    """Split record indices ``0..n-1`` into ``k`` disjoint random parts of equal size (±1).

    A seeded permutation cut into ``k`` consecutive pieces: the parts cover all records and
    the same (n, k, seed) always gives the same parts.
    """
    if not 0 < k <= n:
        raise ValueError(f"cannot split {n} records into {k} non-empty teacher partitions")
    generator = torch.Generator().manual_seed(seed)
    return list(torch.tensor_split(torch.randperm(n, generator=generator), k))


def teacher_partitions(n: int, k: int, seed: int) -> list[Tensor]:
    """:func:`disjoint_partitions` with each part sorted: what datamodules hand PATE strategies."""
    return [part.sort().values for part in disjoint_partitions(n, k, seed)]


def records_digest(*tensors: Tensor | None) -> str:
    """SHA-256 of tensors' shapes, types and bytes, in order (``None`` skipped).

    The partitions are row positions: the same count of records in another order, or other
    records, would hand one person's record to a second teacher, which the accounting (one
    record, one teacher) does not allow. The digest lets a resume check that the rows are the
    ones the partitions were drawn for. It is kept in the (private) checkpoint only."""
    digest = hashlib.sha256()
    for tensor in tensors:
        if tensor is None:
            continue
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{tuple(tensor.shape)} {tensor.dtype};".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


class PartitionedSampler:
    """Each draw gives every teacher a minibatch from its own, fixed partition: ``[K, b, ...]``.

    Within a draw, teacher k's ``batch_size`` records are distinct records of partition k,
    chosen uniformly at random (a fresh subset of its own part each draw, as PATE-GAN's
    reference code does), so ``batch_size`` may not exceed the smallest partition. With
    ``replacement=True`` they are drawn with replacement instead, for parts smaller than a
    batch (K in the thousands on a small table).

    Drawing is vectorized over teachers: the partitions live in one padded index matrix
    ``[K, max_part]`` and a draw is one random key per slot (padding keyed +inf) followed by
    ``topk`` (or one uniform position per slot with replacement), with no Python loop over K.
    The data stays a reference and is never stored in :meth:`state_dict`, which holds the
    partitions and the random state, so a resumed run continues the same partitions and draws.
    """

    def __init__(
        self,
        data: Tensor,
        partitions: Sequence[Tensor],
        batch_size: int,
        labels: Tensor | None = None,
        replacement: bool = False,
        seed: int = 0,
    ) -> None:
        if labels is not None and labels.shape[0] != data.shape[0]:
            raise ValueError(f"{data.shape[0]} records but {labels.shape[0]} labels")
        self.data, self.labels = data, labels
        self.batch_size, self.replacement = batch_size, replacement
        self.generator = torch.Generator().manual_seed(seed)
        #: the teachers whose minibatches :meth:`draw` returns (a DDP rank's shard); the indices
        #: of all K are drawn either way, so every shard sees the draws a single process would
        self.shard = slice(None)
        self._set_partitions(partitions)

    @functools.cached_property
    def records_digest(self) -> str:
        """:func:`records_digest` of the records and labels (computed once: the data is fixed)."""
        return records_digest(self.data, self.labels)

    @property
    def num_teachers(self) -> int:
        return self.index.shape[0]

    @property
    def partitions(self) -> list[Tensor]:
        """The fixed partitions, one index tensor per teacher."""
        return [row[:size] for row, size in zip(self.index, self.sizes.tolist(), strict=True)]

    def draw_indices(self, count: int | None = None) -> Tensor:
        """Record indices ``[K, batch_size]`` for the next step, row k inside partition k; with
        ``count``, ``[count, K, batch_size]``: the next ``count`` draws in one call (the same
        random stream as ``count`` single draws, so the draws are those one at a time would give)."""
        shape = (self.num_teachers,) if count is None else (validate_int("count", count, 1), self.num_teachers)
        if self.replacement:
            uniform = torch.rand(*shape, self.batch_size, generator=self.generator)
            slots = (uniform * self.sizes.unsqueeze(1)).long().clamp_max(self.sizes.unsqueeze(1) - 1)
        else:
            keys = torch.rand(*shape, self.index.shape[1], generator=self.generator).masked_fill_(self._padding, float("inf"))
            slots = keys.topk(self.batch_size, dim=-1, largest=False, sorted=False).indices
        return torch.gather(self.index.expand(*shape, -1), -1, slots)

    def draw(self) -> tuple[Tensor, Tensor | None]:
        """The next step's records ``[K, b, ...]`` and, if given, their labels ``[K, b]`` (only
        the rows of :attr:`shard`)."""
        indices = self.draw_indices()[self.shard].to(self.data.device)
        labels = None if self.labels is None else self.labels[indices.to(self.labels.device)]
        return self.data[indices], labels

    def draw_steps(self, count: int) -> tuple[list[Tensor], list[Tensor] | None]:
        """The next ``count`` draws (a PATE step's nT teacher updates): their indices in one call,
        then one ``[K, b, ...]`` tensor per draw (and ``[K, b]`` labels), as ``count`` calls of
        :meth:`draw` would give. Separate tensors, not one ``[count, K, b, ...]`` block: on a CPU
        that block is a fresh allocation every step (138 MB for PATE-GAN's Adult preset) whose
        page faults took three times as long as the copying itself."""
        indices = self.draw_indices(count)[:, self.shard].to(self.data.device)
        records = [self.data[step] for step in indices]
        if self.labels is None:
            return records, None
        return records, [self.labels[step] for step in indices.to(self.labels.device)]

    def state_dict(self) -> dict[str, Any]:
        """Partitions (as a flat index list and part sizes) and the random state; no data."""
        return {
            "format": STATE_FORMAT,
            "num_records": int(self.data.shape[0]),
            "records_digest": self.records_digest,
            "indices": torch.cat(self.partitions),
            "sizes": self.sizes.clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore partitions and random state; refuse a state for other data or of another format."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown PartitionedSampler state format {state.get('format')!r}")
        if state["num_records"] != self.data.shape[0]:
            raise ValueError(f"state was saved for {state['num_records']} records, this data has {self.data.shape[0]}")
        saved = state.get("records_digest")  # absent from checkpoints written before it was kept
        if saved is not None and saved != self.records_digest:
            raise ValueError(
                f"state was saved for other training records: the same count ({self.data.shape[0]}), but other "
                "records or another order, so its fixed partitions would give some records to a second teacher. "
                "Resume on the data it was trained on, in the same order (its run's config.yaml has the settings)")
        self._set_partitions(list(torch.split(state["indices"], state["sizes"].tolist())))
        self.generator.set_state(state["generator"])

    def _set_partitions(self, partitions: Sequence[Tensor]) -> None:
        """Check the parts are disjoint, non-empty and in range, then store them padded."""
        parts = [torch.as_tensor(p, dtype=torch.long).flatten() for p in partitions]
        flat = torch.cat(parts)
        n = self.data.shape[0]
        if any(p.numel() == 0 for p in parts):
            raise ValueError("every teacher partition must hold at least one record")
        if flat.min() < 0 or flat.max() >= n:
            raise ValueError(f"partition indices must lie in [0, {n})")
        if flat.unique().numel() != flat.numel():
            raise ValueError("teacher partitions overlap: a record would reach more than one teacher")
        sizes = torch.tensor([p.numel() for p in parts])
        if not self.replacement and self.batch_size > int(sizes.min()):
            raise ValueError(
                f"batch_size {self.batch_size} exceeds the smallest partition ({int(sizes.min())} records): "
                "use a smaller batch or replacement=True"
            )
        self.sizes = sizes
        self.index = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)
        self._padding = torch.arange(self.index.shape[1]).unsqueeze(0) >= sizes.unsqueeze(1)


__all__ = ["PartitionedSampler", "disjoint_partitions", "teacher_partitions"]
