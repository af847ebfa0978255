"""PATE label aggregation: the object a PATE strategy puts in a module's LabelAggregator slot.

It answers each query (a generated record the teachers voted on) with the Laplace noisy argmax
of :func:`lightning_dpgan.privacy.mechanisms.laplace_noisy_argmax`, and charges every answered
query -- unanimous ones included -- to the accountant through ``on_answer`` *before* the noisy
answer is drawn; ``on_answer`` may refuse (raise ``PrivacyBudgetExhausted``), and then nothing
is released. ``on_released`` then sees the noisy labels themselves (post-processing of what
was released, free): the strategy counts them, so a run can say when every answer was one class.

Under DDP each rank's teachers are a shard of the K: the ranks' vote counts are added up first,
so the charge and the answer are those of the single-process mechanism, drawn once on rank 0.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from lightning_dpgan.distributed import drawn_by_rank_zero, sum_across_ranks
from lightning_dpgan.privacy.mechanisms import laplace_noisy_argmax
from lightning_dpgan.privacy.noise_source import NoiseSource


class PATELabelAggregator:
    """Noisy-argmax labels from binary teacher votes, each answer charged before it is returned."""

    def __init__(self, lap_inverse_scale: float, on_answer: Callable[[float, np.ndarray], None],
                 noise: NoiseSource | None = None, on_released: Callable[[Tensor], None] | None = None) -> None:
        if not lap_inverse_scale > 0:
            raise ValueError(f"lap_inverse_scale (lambda) must be > 0, got {lap_inverse_scale}")
        self.lap_inverse_scale = float(lap_inverse_scale)
        self.on_answer = on_answer
        self.noise = noise or NoiseSource()
        self.on_released = on_released

    def aggregate(self, votes: Tensor) -> Tensor:
        """``votes``: ``(queries, 2)`` counts ``(n_0, n_1)``; returns ``(queries,)`` noisy labels."""
        if votes.dim() != 2 or votes.shape[1] != 2:
            raise ValueError(f"PATE-GAN votes are (queries, 2) counts, got shape {tuple(votes.shape)}")
        votes = sum_across_ranks(votes.clone())  # DDP: each rank counted its shard of the teachers
        gaps = (votes[:, 0] - votes[:, 1]).abs().round().long().cpu().numpy()
        self.on_answer(self.lap_inverse_scale, gaps)
        # the noise is drawn once; every rank gets rank 0's answers
        generator = self.noise.generator(votes.device)
        labels = drawn_by_rank_zero(lambda: laplace_noisy_argmax(votes, self.lap_inverse_scale, generator),
                                    (votes.shape[0],), torch.long, votes.device)
        if self.on_released is not None:
            self.on_released(labels)
        return labels
