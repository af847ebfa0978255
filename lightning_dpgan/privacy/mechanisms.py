"""Noise mechanisms on aggregated votes: where the PATE and G-PATE noise is added.

Each function states its sensitivity and noise; the accountants in
:mod:`lightning_dpgan.privacy.accountants` charge for them. (DP-SGD's clipping and noise are
in :mod:`lightning_dpgan.privacy.dp_sgd`.)
"""
from __future__ import annotations

import torch
from torch import Tensor


def laplace_noise(shape: tuple[int, ...] | torch.Size, scale: float, generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> Tensor:
    """Float64 draws of Lap(``scale``), each the difference of two Exp(1) draws times ``scale``
    (torch has no Laplace sampler that takes a generator)."""
    exponentials = torch.empty((2, *shape), dtype=torch.float64, device=device).exponential_(generator=generator)
    return (exponentials[0] - exponentials[1]) * scale


def laplace_noisy_argmax(votes: Tensor, lap_inverse_scale: float, generator: torch.Generator | None = None) -> Tensor:
    """PATE's aggregation: ``argmax_j (votes[:, j] + Lap(1 / lambda))`` for each query (row).

    Sensitivity: one record lives in one teacher's partition, so changing it changes one
    teacher's vote: each count moves by at most 1 (two counts change). With Laplace noise of
    scale ``b = 1/lambda`` on every count, one answer is ``(2 lambda, 0)``-DP (PATE-GAN,
    Theorem 5's premise). ``lambda`` is the INVERSE scale: larger lambda, less noise.

    Args:
        votes: ``(queries, classes)`` counts of teachers per class.
        lap_inverse_scale: lambda > 0.
        generator: the mechanism's own (:class:`~lightning_dpgan.privacy.noise_source.NoiseSource`),
            on ``votes``' device; None draws from torch's global generator.
    Returns:
        ``(queries,)`` int64 class indices.
    """
    if lap_inverse_scale <= 0:
        raise ValueError(f"lap_inverse_scale (lambda) must be > 0, got {lap_inverse_scale}")
    if votes.dim() != 2:
        raise ValueError(f"votes must be (queries, classes), got shape {tuple(votes.shape)}")
    counts = votes.to(torch.float64)
    return torch.argmax(counts + laplace_noise(counts.shape, 1.0 / lap_inverse_scale, generator, votes.device), dim=1)


#: Marks a Confident-GNMax query that was not answered (the noisy maximum missed the threshold).
NO_ANSWER = -1


def confident_gnmax(votes: Tensor, threshold: float, sigma1: float, sigma2: float,
                    generator: torch.Generator | None = None) -> Tensor:
    """Confident-GNMax (Papernot et al. 2018, Algorithm 1; G-PATE's Algorithm 3), per query (row).

    Step 1: if ``max_j votes[j] + N(0, sigma1^2) >= threshold`` go on, else answer ``NO_ANSWER`` (⊥).
    Step 2: answer ``argmax_j (votes[j] + N(0, sigma2^2))``.

    Sensitivity: a record lives in one teacher's partition, so changing it moves one teacher's
    vote from one bin to another: the maximum count moves by at most 1 (step 1, L2-sensitivity
    1: ``(l, l / (2 sigma1^2))``-RDP at every order l), and the histogram by 1 in two bins
    (step 2, ``(l, l / sigma2^2)``-RDP, or its data-dependent bound). Step 2 is charged only
    for answered queries. The analysis is in :mod:`lightning_dpgan.privacy.analysis.gnmax`.

    Args:
        votes: ``(queries, bins)`` counts of teachers per bin.
        threshold: T, in teacher counts.
        sigma1, sigma2: standard deviations of the threshold and the answer noise (> 0).
        generator: the mechanism's own, on ``votes``' device; None draws from torch's global one.
    Returns:
        ``(queries,)`` int64 bin indices, ``NO_ANSWER`` where unanswered.
    """
    if not (sigma1 > 0 and sigma2 > 0):
        raise ValueError(f"sigma1 and sigma2 must be > 0, got {sigma1}, {sigma2}")
    if votes.dim() != 2:
        raise ValueError(f"votes must be (queries, bins), got shape {tuple(votes.shape)}")
    counts = votes.to(torch.float64)
    threshold_noise = torch.randn(counts.shape[0], dtype=torch.float64, device=votes.device, generator=generator)
    answer_noise = torch.randn(counts.shape, dtype=torch.float64, device=votes.device, generator=generator)
    noisy_max = counts.max(dim=1).values + sigma1 * threshold_noise
    answers = torch.argmax(counts + sigma2 * answer_noise, dim=1)
    return torch.where(noisy_max >= threshold, answers, torch.full_like(answers, NO_ANSWER))
