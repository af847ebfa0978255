"""G-PATE's DPGradAgg (Long et al. 2021, Algorithm 2): teachers vote on projected gradients.

The object a G-PATE strategy puts in a module's GradientAggregator slot. For each generated
record, the K teachers' input-gradients are

1. projected to ``projection_dim`` (k) dimensions by a random matrix with N(0, 1/k) entries,
   drawn fresh for every record and independent of the data (so it costs no privacy);
2. clipped to (-c, c) and discretized into ``bins`` (B) bins of width 2c/B: each teacher
   casts one vote per projected dimension;
3. aggregated per dimension by Confident-GNMax (:func:`~lightning_dpgan.privacy.mechanisms.confident_gnmax`,
   where the noise is added): the answered bin's midpoint, or 0 where no answer was given;
4. projected back with the transposed matrix.

A batch is a handful of tensor operations: no loop over records, dimensions or teachers.
Each (record, dimension) pair is one query. Before anything noisy is drawn the vote
histograms go to ``check`` (which may refuse with ``PrivacyBudgetExhausted``); after the
threshold step the answered queries go to ``charge``. Both are the strategy's
(:mod:`lightning_dpgan.callbacks.gpate`), which owns the accountant.

Under DDP each rank holds a shard of the teachers: the projections are drawn on rank 0 and shared,
the ranks' vote histograms are added up, and the Confident-GNMax noise is drawn once, on rank 0.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from lightning_dpgan.distributed import drawn_by_rank_zero, sum_across_ranks
from lightning_dpgan.privacy.mechanisms import NO_ANSWER, confident_gnmax
from lightning_dpgan.privacy.noise_source import NoiseSource


def discretize(values: Tensor, clip: float, bins: int) -> Tensor:
    """Bin index in ``[0, bins)`` of each value clipped to ``[-clip, clip]`` (bins of width 2c/B)."""
    width = 2.0 * clip / bins
    return torch.floor((values.clamp(-clip, clip) + clip) / width).long().clamp_(0, bins - 1)


def bin_midpoints(index: Tensor, clip: float, bins: int) -> Tensor:
    """Midpoint of each bin; ``NO_ANSWER`` gives 0 (no movement along that dimension)."""
    width = 2.0 * clip / bins
    midpoints = -clip + (index.to(torch.float32) + 0.5) * width
    return torch.where(index == NO_ANSWER, torch.zeros_like(midpoints), midpoints)


def vote_histograms(bin_index: Tensor, bins: int) -> Tensor:
    """``bin_index [K, Q]`` (one vote per teacher and query) -> counts ``[Q, bins]``."""
    teachers, queries = bin_index.shape
    counts = torch.zeros(queries, bins, dtype=torch.int32, device=bin_index.device)
    return counts.scatter_add_(1, bin_index.T, torch.ones(queries, teachers, dtype=torch.int32, device=bin_index.device))


def random_projections(records: int, dimension: int, projection_dim: int, device: torch.device) -> Tensor:
    """One ``[dimension, projection_dim]`` matrix per record, entries N(0, 1/k): ``[records, d, k]``."""
    return torch.randn(records, dimension, projection_dim, device=device) / math.sqrt(projection_dim)


class ProjectedGradientAggregator:
    """Private aggregation of K teachers' gradients on each generated record (Algorithm 2)."""

    def __init__(
        self,
        projection_dim: int,
        bins: int,
        clip: float,
        sigma1: float,
        sigma2: float,
        threshold: float,
        check: Callable[[Tensor], None],
        charge: Callable[[Tensor, Tensor], None],
        noise: NoiseSource | None = None,
        on_answered: Callable[[Tensor], None] | None = None,
    ) -> None:
        """``on_answered`` receives each batch's answers (bin indices, ``NO_ANSWER`` where none was
        given): released values, so the strategy may count them at no privacy cost."""
        if projection_dim < 1 or bins < 2:
            raise ValueError(f"projection_dim must be >= 1 and bins >= 2, got {projection_dim}, {bins}")
        if not (clip > 0 and sigma1 > 0 and sigma2 > 0):
            raise ValueError(f"clip, sigma1 and sigma2 must be > 0, got {clip}, {sigma1}, {sigma2}")
        self.projection_dim, self.bins, self.clip = projection_dim, bins, float(clip)
        self.sigma1, self.sigma2, self.threshold = float(sigma1), float(sigma2), float(threshold)
        self.check, self.charge = check, charge
        self.noise = noise or NoiseSource()  # Confident-GNMax's draws; the projections are public
        self.on_answered = on_answered

    def aggregate(self, teacher_gradients: Tensor) -> Tensor:
        """``teacher_gradients [K, B, ...]`` (teacher k's gradient on record b) -> ``[B, ...]``."""
        teachers, records = teacher_gradients.shape[:2]
        flat = teacher_gradients.reshape(teachers, records, -1).float()
        projection = drawn_by_rank_zero(
            lambda: random_projections(records, flat.shape[-1], self.projection_dim, flat.device),
            (records, flat.shape[-1], self.projection_dim), torch.float32, flat.device)
        projected = torch.einsum("kbd,bdj->kbj", flat, projection)  # [K, B, k]
        votes = vote_histograms(discretize(projected, self.clip, self.bins).reshape(teachers, -1), self.bins)
        votes = sum_across_ranks(votes)  # DDP: each rank counted its shard of the teachers
        self.check(votes)  # may refuse: then nothing below is drawn
        answers = drawn_by_rank_zero(
            lambda: confident_gnmax(votes, self.threshold, self.sigma1, self.sigma2, self.noise.generator(votes.device)),
            (votes.shape[0],), torch.long, votes.device)
        self.charge(votes, answers != NO_ANSWER)
        if self.on_answered is not None:
            self.on_answered(answers)
        aggregated = bin_midpoints(answers, self.clip, self.bins).reshape(records, self.projection_dim)
        back = torch.einsum("bj,bdj->bd", aggregated, projection)
        return back.reshape(records, *teacher_gradients.shape[2:]).to(teacher_gradients.dtype)
