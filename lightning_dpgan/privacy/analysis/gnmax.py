"""RDP bounds of the Confident-GNMax aggregator, as used by G-PATE.

Papernot, Song, Mironov, Raghunathan, Talwar & Erlingsson, "Scalable Private Learning with
PATE", ICLR 2018 (Section 4 and Appendices B-C); G-PATE (Long et al., NeurIPS 2021,
Appendix A.4, whose Theorem 7 is Theorem 6 below). One query is a histogram ``n`` of
``C >= 2`` bins, ``n_i`` the number of teachers voting bin ``i``:

- Threshold step: answer only if ``max_i n_i + N(0, sigma1^2) >= T``, else ``⊥``. One
  teacher changes ``max_i n_i`` by at most 1, so this is a Gaussian mechanism of
  sensitivity 1: ``(lambda, lambda / (2 sigma1^2))``-RDP, charged for *every* query,
  answered or not.
- GNMax step (answered queries only): ``argmax_i (n_i + N(0, sigma2^2))``.
  Data-independent (Proposition 8): ``(lambda, lambda / sigma2^2)``-RDP.
- Data-dependent (Theorem 6): with ``q~ >= Pr[GNMax(D) != i*]``, ``i* = argmax_i n_i``,
  taken from the union bound of Proposition 7,
  ``q~ = sum_{i != i*} Pr[N(0, 2 sigma2^2) >= n_{i*} - n_i]``, capped at ``1 - 1/C``;
  for a mechanism that is ``(mu1, eps1)``- and ``(mu2, eps2)``-RDP, ``lambda <= mu1`` and
  ``q~ <= e^{(mu2 - 1) eps2} / ((mu1 / (mu1 - 1)) (mu2 / (mu2 - 1)))^{mu2}``,
  ``D_lambda <= log((1 - q~) A^{lambda-1} + q~ B^{lambda-1}) / (lambda - 1)`` with
  ``A = (1 - q~) / (1 - (q~ e^{eps2})^{(mu2 - 1) / mu2})`` and ``B = e^{eps1} / q~^{1/(mu1 - 1)}``.
  The higher orders are Proposition 10's: ``mu2 = sigma2 sqrt(-log q~)``, ``mu1 = mu2 + 1``,
  ``eps_i = mu_i / sigma2^2``. Each query is charged the smaller of the two bounds.
- RDP composes by addition at every order; ε through :func:`rdp_to_epsilon`.

Theorem 6 holds for *any* upper bound ``q~`` on the probability of not answering ``i*``, so
rounding ``log q~`` up (:func:`round_log_q_up`) keeps it valid; the accountant relies on that to
keep a compact histogram. As for PATE-GAN, the data-dependent figure depends on the votes,
hence on the private data: it is not itself covered by the guarantee (Papernot et al. 2018
release it through smooth sensitivity). Report it labelled as such, next to the
data-independent bound.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, check_orders
from lightning_dpgan.privacy.validation import validate_positive

#: Grid of the rounded ``log q~`` values (natural log). 0.01 loosens each query's ``q~`` by at
#: most 1 %, and keeps the distinct values a run meets to a few thousand.
LOG_Q_RESOLUTION = 0.01
#: Lowest rounded ``log q~``: ``q~ = e^{-1000}`` is already certainty for any sigma2 in use;
#: larger is still a valid bound, and ``-inf`` (a certain answer) gets a finite key.
LOG_Q_FLOOR = -1000.0


def _check_log_q(log_q: np.ndarray | float) -> np.ndarray:
    """``log q~`` as a 1-D float array: each a log-probability, ``-inf`` (certain) allowed."""
    values = np.atleast_1d(np.asarray(log_q, dtype=float))
    if values.ndim != 1:
        raise ValueError(f"log_q must be a scalar or 1-D (one per query), got shape {values.shape}")
    if np.isnan(values).any() or (values > 0).any():
        raise ValueError("log_q are logs of probabilities: they must be <= 0 and not NaN")
    return values


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - e^x)`` for ``x <= 0`` without cancellation (Mächler 2012: ``log1p(-e^x)``
    below ``-log 2``, ``log(-expm1(x))`` above); ``-inf`` at ``x = 0``."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(x < -math.log(2.0), np.log1p(-np.exp(np.minimum(x, 0.0))), np.log(-np.expm1(x)))


def threshold_rdp(sigma1: float, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """``lambda / (2 sigma1^2)``: the threshold check is a Gaussian mechanism on ``max_i n_i``,
    sensitivity 1 (Mironov 2017, Proposition 7). Charged whether or not the query is answered."""
    return check_orders(orders) / (2.0 * validate_positive("sigma1", sigma1) ** 2)


def gnmax_data_independent_rdp(sigma2: float, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """``lambda / sigma2^2`` (Papernot et al. 2018, Proposition 8): GNMax with any votes. Twice the
    Gaussian's figure because one teacher moves two counts, the one it leaves and the one it joins."""
    return check_orders(orders) / validate_positive("sigma2", sigma2) ** 2


def gnmax_log_q(counts: np.ndarray, sigma2: float) -> np.ndarray:
    """``log q~`` per query (Papernot et al. 2018, Proposition 7): a union bound on the probability
    that GNMax does not return the plurality ``i*``, shape ``[Q]`` for counts ``[Q, C]`` (or ``[C]``).

    ``n_i + N(0, sigma2^2)`` beats ``n_{i*} + N(0, sigma2^2)`` with probability
    ``Pr[N(0, 2 sigma2^2) >= n_{i*} - n_i]``; summed over ``i != i*`` in log space. The sum can exceed
    1 for near ties, so it is capped at ``1 - 1/C``: with ``C`` bins some bin has probability at
    least ``1/C``, and ``i*`` may be taken to be it (the reference implementation's cap too).
    """
    sigma = validate_positive("sigma2", sigma2)
    votes = np.asarray(counts, dtype=float)
    if votes.ndim == 1:
        votes = votes[None, :]
    if votes.ndim != 2 or votes.shape[1] < 2:
        raise ValueError(f"counts must have shape [C] or [Q, C] with C >= 2 bins, got {np.shape(counts)}")
    if not np.isfinite(votes).all() or (votes < 0).any():
        raise ValueError("counts are numbers of teachers: they must be finite and non-negative")
    num_bins = votes.shape[1]
    top = np.argmax(votes, axis=1)
    gaps = votes[np.arange(votes.shape[0]), top][:, None] - votes
    log_tail = norm.logsf(gaps, scale=math.sqrt(2.0) * sigma)
    log_tail[np.arange(votes.shape[0]), top] = -np.inf  # only the other bins can win instead of i*
    log_q = logsumexp(log_tail, axis=1)
    return np.minimum(log_q, math.log1p(-1.0 / num_bins))


def gnmax_data_dependent_rdp(
    log_q: np.ndarray | float, sigma2: float, orders: Sequence[float] = DEFAULT_ORDERS
) -> np.ndarray:
    """Per-query RDP of GNMax, shape ``[Q, len(orders)]``: Theorem 6 of Papernot et al. 2018 at
    ``log q~`` with Proposition 10's higher orders, where it applies and is smaller, else
    ``lambda / sigma2^2``.

    The bound applies at orders ``lambda < mu1`` when ``mu2 > 1`` (RDP needs order > 1), ``q~``
    is below Theorem 6's limit (where the bound is increasing in ``q~``, so an upper bound on
    the probability gives an upper bound on the divergence) and ``q~ e^{eps2} < 1`` (``A`` is
    positive). ``log q~ = -inf`` (GNMax's answer is certain) costs 0. Computed in log space:
    ``q~`` is routinely ``e^{-50}`` and below, where ``1 - q~`` in floats is exactly 1.
    """
    sigma = validate_positive("sigma2", sigma2)
    grid = check_orders(orders)
    logq = _check_log_q(log_q)
    variance = sigma * sigma
    result = np.tile(grid / variance, (logq.size, 1))

    certain = np.isneginf(logq)
    finite = ~certain
    mu2 = np.zeros_like(logq)
    mu2[finite] = sigma * np.sqrt(-logq[finite])
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / variance, mu2 / variance
    usable = finite & (mu2 > 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # log of Theorem 6's limit on q~: (mu2 - 1) eps2 - mu2 (log(mu1/(mu1-1)) + log(mu2/(mu2-1)))
        log_limit = (mu2 - 1.0) * eps2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0)))
    # -log q~ > eps2 (A > 0) is the same as mu2 > 1 with Proposition 10's orders; kept explicit
    # so the code reads as Theorem 6 and stays right if the choice of orders changes
    applies = usable & (logq <= log_limit) & (-logq > eps2)

    if applies.any():
        lq, m1, m2, e1, e2 = (v[applies][:, None] for v in (logq, mu1, mu2, eps1, eps2))
        log_1mq = _log1mexp(lq)  # log(1 - q~)
        log_a = log_1mq - _log1mexp((lq + e2) * (1.0 - 1.0 / m2))
        log_b = e1 - lq / (m1 - 1.0)
        steps = grid[None, :] - 1.0  # lambda - 1
        log_s = np.logaddexp(log_1mq + steps * log_a, lq + steps * log_b)
        # A >= 1 and B >= 1 under the conditions, so the bound is >= 0: clip float noise only.
        dependent = np.maximum(log_s / steps, 0.0)
        dependent = np.where(grid[None, :] < m1, dependent, np.inf)
        result[applies] = np.minimum(result[applies], dependent)
    result[certain] = 0.0
    return result


def round_log_q_up(
    log_q: np.ndarray | float, resolution: float = LOG_Q_RESOLUTION, floor: float = LOG_Q_FLOOR
) -> np.ndarray:
    """``log q~`` rounded *up* to a multiple of ``resolution``, at least ``floor``, at most 0.

    A larger ``q~`` is still an upper bound on the probability, so Theorem 6 still holds at the
    rounded value (the bound is only loosened); a few thousand distinct keys then summarise any
    number of queries exactly. ``-inf`` and anything below ``floor`` become ``floor`` (rounded up
    if ``floor`` is off the grid), keeping every key finite.
    """
    res = float(resolution)
    if not math.isfinite(res) or res < 1e-9:
        # the result is rounded to 10 decimals to remove float noise: a finer grid would blur
        raise ValueError(f"resolution must be a finite number >= 1e-9, got {resolution}")
    low = float(floor)
    if not math.isfinite(low) or low > 0:
        raise ValueError(f"floor must be a finite number <= 0, got {floor}")
    values = np.maximum(_check_log_q(log_q), low)
    steps = values / res
    # a value already on the grid (-15.29 is -1528.9999999999998 steps) stays put, so rounding
    # is idempotent and saved keys reload unchanged; float noise is ~1e-11 steps at the floor
    nearest = np.round(steps)
    steps = np.where(np.abs(steps - nearest) < 1e-6, nearest, np.ceil(steps))
    rounded = np.round(steps * res, 10)
    # never round down, whatever the float noise: a larger q~ is always a valid bound
    rounded = np.where(rounded < values, np.round(rounded + res, 10), rounded)
    return np.minimum(rounded, 0.0) + 0.0  # + 0.0 turns -0.0 into 0.0
