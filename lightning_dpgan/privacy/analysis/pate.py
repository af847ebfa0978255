"""Moments-accountant bounds of the PATE Laplace noisy-argmax, as used by PATE-GAN.

PATE-GAN (Jordon, Yoon & van der Schaar, ICLR 2019), Algorithm 1 lines 16-19 and Theorems 3-5
of its appendix, which restate Papernot et al. (ICLR 2017, "Semi-supervised knowledge transfer
for deep learning from private training data", Theorems 2-3):

- One query answers ``argmax_j (n_j + Lap(1/lambda))`` over the teachers' vote counts
  ``n_0, n_1``. Changing one record changes one teacher's vote, so each count moves by at most
  1; the mechanism is ``(2*lambda, 0)``-DP. ``lambda`` is the *inverse* noise scale.
- Data-independent log-moment of one query: ``alpha(l) <= min(2 lambda^2 l (l + 1), 2 lambda l)``.
  The first is PATE-GAN's (Papernot et al.'s Theorem 2); the second holds for any
  ``2 lambda``-DP mechanism, whose privacy loss never exceeds ``2 lambda`` (Papernot et al.'s
  reference code caps the moments with it too). It is the smaller one once ``l + 1 > 1 / lambda``:
  for ties, near-ties and the data-independent figure, at the large orders the tail bound uses.
- Data-dependent: with ``q = (2 + lambda*gap) / (4 exp(lambda*gap))``, ``gap = |n_0 - n_1|``,
  ``alpha(l) <= log((1 - q) ((1 - q) / (1 - e^{2 lambda} q))^l + q e^{2 lambda l})``,
  valid only when ``q < (e^{2 lambda} - 1) / (e^{4 lambda} - 1)``; otherwise the
  data-independent bound applies. Each query is charged the smaller of the two.
- Log-moments add over queries; ``epsilon = min_l (alpha(l) + log(1/delta)) / l``.

The data-dependent figure depends on the votes, hence on the private data: releasing it
is not itself covered by the guarantee. Report it labelled as such, next to the
data-independent bound.
"""
from __future__ import annotations

import numpy as np

#: Moment orders l = 1..256 (PATE-GAN's Algorithm 1 keeps alpha(l) for l = 1, ..., L), then every
#: 64th or 128th up to 1024. The tail bound cannot go below log(1/delta) / l (0.115 at delta = 1e-5
#: for l = 100, so with L = 100 no query at all fits in epsilon = 0.1), and a query whose K teachers
#: agree is cheap only up to l ~ K / 2, where its q e^{2 lambda l} term takes over: a unanimous
#: vote therefore costs about 2 log(1/delta) / K, provided the grid has an order near K / 2. Every
#: order is valid for both bounds; more orders only tighten the minimum.
DEFAULT_MOMENT_ORDERS = np.concatenate([np.arange(1, 257, dtype=float),
                                        [320.0, 384.0, 448.0, 512.0, 640.0, 768.0, 896.0, 1024.0]])


def data_independent_moments(lap_inverse_scale: float, orders: np.ndarray = DEFAULT_MOMENT_ORDERS) -> np.ndarray:
    """``min(2 lambda^2 l (l + 1), 2 lambda l)`` at each order ``l``: one query, any votes."""
    lam = float(lap_inverse_scale)
    return np.minimum(2.0 * lam**2 * orders * (orders + 1.0), 2.0 * lam * orders)


def log_answer_probability_bound(lap_inverse_scale: float, vote_gap: np.ndarray) -> np.ndarray:
    """``log q`` for PATE-GAN's ``q = (2 + lambda*gap) / (4 exp(lambda*gap))``, a bound on the
    probability that the noisy argmax differs from the true plurality. In logs because ``q``
    itself underflows to 0 once ``lambda*gap`` passes ~745, and a zero ``q`` would make a query
    free at every order, when at orders above ~gap/2 its term ``q e^{2 lambda l}`` dominates."""
    scaled = float(lap_inverse_scale) * np.asarray(vote_gap, dtype=float)
    return np.log1p(scaled / 2.0) - np.log(2.0) - scaled


def data_dependent_moments(lap_inverse_scale: float, vote_gap: np.ndarray, orders: np.ndarray = DEFAULT_MOMENT_ORDERS) -> np.ndarray:
    """Per-query log-moments, shape ``(len(vote_gap), len(orders))``: the data-dependent bound
    where it is valid and smaller, else the data-independent one."""
    lam = float(lap_inverse_scale)
    gaps = np.atleast_1d(np.asarray(vote_gap, dtype=float))
    independent = np.broadcast_to(data_independent_moments(lam, orders), (gaps.size, orders.size))
    log_q = log_answer_probability_bound(lam, gaps)[:, None]
    # valid while q < (e^{2 lambda} - 1) / (e^{4 lambda} - 1) = 1 / (e^{2 lambda} + 1)
    valid = log_q < -np.logaddexp(0.0, 2 * lam)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # The bound in log space (high orders overflow e^{2 lambda l}): log of a sum of two terms.
        log_keep = np.log1p(-np.exp(log_q))
        log_ratio = log_keep - np.log1p(-np.exp(2 * lam + log_q))
        dependent = np.logaddexp(log_keep + orders * log_ratio, log_q + 2 * lam * orders)
    dependent = np.where(valid & np.isfinite(dependent), dependent, np.inf)
    return np.minimum(independent, dependent)


def moments_to_epsilon(moments: np.ndarray, delta: float, orders: np.ndarray = DEFAULT_MOMENT_ORDERS) -> float:
    """``min_l (alpha(l) + log(1/delta)) / l`` (Abadi et al. 2016, Theorem 2.2, tail bound)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return float(np.min((np.asarray(moments, dtype=float) + np.log(1.0 / delta)) / orders))
