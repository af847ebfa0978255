"""Noise mechanisms on aggregated votes: where the PATE noise is added.

Each function states its sensitivity and noise; the accountants in
:mod:`lightning_dpgan.privacy.accountants` charge for them. (DP-SGD's clipping and noise are
in :mod:`lightning_dpgan.privacy.dp_sgd`.)
"""
from __future__ import annotations

import torch
from torch import Tensor


def laplace_noisy_argmax(votes: Tensor, lap_inverse_scale: float) -> Tensor:
    """PATE's aggregation: ``argmax_j (votes[:, j] + Lap(1 / lambda))`` for each query (row).

    Sensitivity: one record lives in one teacher's partition, so changing it changes one
    teacher's vote: each count moves by at most 1 (two counts change). With Laplace noise of
    scale ``b = 1/lambda`` on every count, one answer is ``(2 lambda, 0)``-DP (PATE-GAN,
    Theorem 5's premise). ``lambda`` is the INVERSE scale: larger lambda, less noise.

    Args:
        votes: ``(queries, classes)`` counts of teachers per class.
        lap_inverse_scale: lambda > 0.
    Returns:
        ``(queries,)`` int64 class indices.
    """
    if lap_inverse_scale <= 0:
        raise ValueError(f"lap_inverse_scale (lambda) must be > 0, got {lap_inverse_scale}")
    if votes.dim() != 2:
        raise ValueError(f"votes must be (queries, classes), got shape {tuple(votes.shape)}")
    counts = votes.to(torch.float64)
    laplace = torch.distributions.Laplace(torch.zeros((), dtype=torch.float64, device=votes.device), 1.0 / lap_inverse_scale)
    return torch.argmax(counts + laplace.sample(counts.shape), dim=1)
