"""CTGAN's conditional vector, adapted so that real records keep their DP sampling.

CTGAN (Xu et al. 2019) trains with a conditional vector: pick a categorical column (or a declared
discrete numeric one, one-hot over its values) uniformly, pick one of its categories, and ask the generator for a record of that category (a
cross-entropy term makes it comply). Its *training-by-sampling* then draws the real rows the
critic compares against **by category**: it looks up the rows that hold the chosen category and
samples among them. That makes which real records enter a batch depend on the other records
(how many share a category), which breaks the record-independent sampling DP analyses rely on:
DP-SGD's Poisson subsampling (each record in a batch independently with probability q) and
PATE's fixed disjoint partitions.

So here the two sides are treated differently:

- **generator side** -- :meth:`ConditionalSampler.sample`: CTGAN's training-by-sampling
  (a column uniformly, then a category with probability ∝ log(1 + scale·frequency), or ∝
  frequency), using the category frequencies of the *DP histogram*
  (:attr:`TableTransformer.condition_frequencies`), which are public; no real row is read.
- **real side** -- :meth:`ConditionalSampler.from_records`: real records keep the batch their
  sampler (Poisson, partition) gave them, and each gets its own condition: a column chosen
  uniformly (public randomness) and the category that record holds. The condition is a
  function of that record alone plus public randomness, so it is part of the record's
  contribution and is covered by the same per-record sensitivity as the record itself.

:meth:`ConditionalSampler.condition_loss` is CTGAN's generator cross-entropy between the
generated block of the chosen column and the chosen category.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

#: Stands for CTGAN's row count in log(count + 1): frequencies here are normalised (a DP row
#: count is not released with them), so log(1 + scale * frequency) uses this public scale.
DEFAULT_LOG_SCALE = 1000.0


class ConditionalSampler:
    """Conditional vectors over the one-hot columns (categorical, declared discrete) of a table layout.

    Args:
        condition_spans: ``(start, width)`` of each condition column's one-hot block in the
            *encoded record* (:attr:`TableTransformer.condition_spans`).
        condition_frequencies: per condition column, its category frequencies (DP, public).
        log_scale: the ``scale`` of the log-frequency law.

    The conditional vector concatenates the condition columns' blocks (``cond_dim`` slots in
    all); ``cond_offsets[j]`` is where column ``j``'s block starts in it. A table without
    one-hot columns has ``cond_dim == 0``: empty conditions, column index -1, no loss.
    """

    def __init__(
        self,
        condition_spans: Sequence[Sequence[int]],
        condition_frequencies: Sequence[Sequence[float]],
        log_scale: float = DEFAULT_LOG_SCALE,
    ) -> None:
        spans = [(int(start), int(width)) for start, width in condition_spans]
        if len(spans) != len(condition_frequencies):
            raise ValueError(f"{len(spans)} condition spans but {len(condition_frequencies)} frequency lists")
        for (start, width), frequencies in zip(spans, condition_frequencies):
            if start < 0 or width < 1 or len(frequencies) != width:
                raise ValueError(f"condition span {(start, width)} does not match {len(frequencies)} frequencies")
        if not log_scale > 0:
            raise ValueError(f"log_scale must be > 0, got {log_scale!r}")
        self.spans = spans
        self.widths = torch.tensor([w for _, w in spans])
        self.cond_offsets = torch.cumsum(torch.tensor([0] + [w for _, w in spans[:-1]]), 0)
        self.frequencies = _padded([_normalised(f) for f in condition_frequencies], max([w for _, w in spans], default=0))
        self.log_scale = float(log_scale)

    @classmethod
    def from_layout(cls, layout: Mapping[str, Any], log_scale: float = DEFAULT_LOG_SCALE) -> ConditionalSampler:
        """From :meth:`TableTransformer.layout` (as stored in a model's hyper-parameters)."""
        return cls(layout["condition_spans"], layout["condition_frequencies"], log_scale)

    @property
    def n_columns(self) -> int:
        return len(self.spans)

    @property
    def cond_dim(self) -> int:
        return int(self.widths.sum())

    def category_probabilities(self, log_frequency: bool = True) -> torch.Tensor:
        """``(n_columns, max width)`` rows of category probabilities (0 beyond a column's width)."""
        weights = torch.log1p(self.frequencies * self.log_scale) if log_frequency else self.frequencies
        return weights / weights.sum(dim=1, keepdim=True)

    # --- generator side ----------------------------------------------------------------------

    def sample(
        self, n: int, log_frequency: bool = True, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-by-sampling for the generator: ``(cond (n, cond_dim), column_index (n,))``.

        Each row picks a condition column uniformly, then a category with probability ∝
        ``log(1 + scale·freq)`` (``log_frequency``) or ∝ ``freq``, from the public DP
        frequencies; no real record is read.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        if n == 0 or self.n_columns == 0:
            return torch.zeros(n, self.cond_dim), torch.full((n,), -1, dtype=torch.long)
        columns = torch.randint(self.n_columns, (n,), generator=generator)
        probabilities = self.category_probabilities(log_frequency)[columns]
        categories = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)
        return self._one_hot(columns, categories), columns

    # --- real side ---------------------------------------------------------------------------

    def from_records(
        self, records: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each real record's own condition: ``(cond, column_index)``, one row per record.

        A column is chosen uniformly per record (public randomness) and the record's category
        in it (argmax of its block) is copied; nothing about other records is used, and the
        batch itself is left as its sampler drew it.
        """
        if records.ndim != 2 or records.shape[1] < max([s + w for s, w in self.spans], default=0):
            raise ValueError(f"records of shape {tuple(records.shape)} do not hold the condition blocks {self.spans}")
        n = records.shape[0]
        if self.n_columns == 0:
            return records.new_zeros(n, 0), torch.full((n,), -1, dtype=torch.long, device=records.device)
        columns = torch.randint(self.n_columns, (n,), generator=generator)
        categories = torch.zeros(n, dtype=torch.long)
        for j, (start, width) in enumerate(self.spans):
            rows = columns == j
            categories[rows] = records[rows.to(records.device), start : start + width].argmax(dim=1).cpu()
        return self._one_hot(columns, categories).to(records.device, records.dtype), columns.to(records.device)

    def _one_hot(self, columns: torch.Tensor, categories: torch.Tensor) -> torch.Tensor:
        cond = torch.zeros(len(columns), self.cond_dim)
        cond[torch.arange(len(columns)), self.cond_offsets[columns] + categories] = 1.0
        return cond

    # --- generator loss ----------------------------------------------------------------------

    def condition_loss(self, logits: torch.Tensor, cond: torch.Tensor, column_index: torch.Tensor) -> torch.Tensor:
        """CTGAN's conditional loss: mean over rows of the cross-entropy between the generated
        logits of the chosen column's block (in the encoded record) and the chosen category
        (argmax of that column's block of ``cond``)."""
        column_index = column_index.to(logits.device).long()
        cond = cond.to(logits.device)
        total = logits.new_zeros(())
        for j, (start, width) in enumerate(self.spans):
            rows = column_index == j
            if not rows.any():
                continue
            offset = int(self.cond_offsets[j])
            target = cond[rows, offset : offset + width].argmax(dim=1)
            total = total + F.cross_entropy(logits[rows, start : start + width], target, reduction="sum")
        return total / max(len(logits), 1)


def _normalised(frequencies: Sequence[float]) -> torch.Tensor:
    weights = torch.as_tensor(list(frequencies), dtype=torch.float64).clamp(min=0.0)
    if weights.sum() <= 0:
        weights = torch.ones_like(weights)
    return weights / weights.sum()


def _padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
