"""RDP of a mechanism run on a subsample drawn WITHOUT replacement, and of GS-WGAN's critic selection.

Wang, Balle & Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical Moments
Accountant", AISTATS 2019 (arXiv:1808.00087), Theorem 9: let ``M`` be ``(alpha, eps(alpha))``-RDP
for datasets of size m that differ in one record (replace-one), and ``M o subsample`` run ``M`` on
m records drawn uniformly without replacement from n (``gamma = m / n``). For every integer
``alpha >= 2``, under replace-one neighbours of the n records, ``M o subsample`` is
``(alpha, eps'(alpha))``-RDP with

    eps'(alpha) <= 1/(alpha-1) * log(1
        + gamma^2 C(alpha, 2) min{4 (e^eps(2) - 1), e^eps(2) min{2, (e^eps(inf) - 1)^2}}
        + sum_{j=3}^{alpha} gamma^j C(alpha, j) e^{(j-1) eps(j)} min{2, (e^eps(inf) - 1)^j}).

This is the general bound (any base mechanism); for the Gaussian ``eps(inf) = inf`` and both
``min{2, .}`` are 2. The paper's Theorem 27 is tighter for the Gaussian specifically (and is
what ``dp_accounting``'s ``SampledWithoutReplacementDpEvent`` computes); Theorem 9 is what
GS-WGAN's own accounting used (autodp's ``compose_subsampled_mechanism``), and it is never below
Theorem 27, so it is the conservative choice.

Orders. The bound is for integers. The log-moment ``K(alpha) = (alpha - 1) eps(alpha)`` of any
mechanism is convex in alpha, so between two integers it lies below the chord of the integer
bounds (the paper's Corollary 10, as ``dp_accounting`` interpolates); below 2 we use
``eps'(2)``, valid because RDP is non-decreasing in alpha (it equals the chord from ``K(1) = 0``).

Finally the result is capped by the base mechanism's own curve: sampling can only help
(coupling each sample containing the changed record with the same sample without it gives pairs
of neighbouring inputs, and ``exp((alpha-1) D_alpha)`` is jointly convex), so ``min(eps', eps)``
is still a valid bound at every order.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from lightning_dpgan.privacy.analysis.rdp import check_orders, gaussian_rdp

#: ``eps(alpha)`` of the base mechanism at each given order (a vectorised function)
BaseRDP = Callable[[np.ndarray], np.ndarray]


def _log_expm1(x: np.ndarray | float) -> np.ndarray:
    """``log(e^x - 1)`` for x > 0 without overflow (``x + log(1 - e^-x)``); ``-inf`` at 0."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        return x + np.log(-np.expm1(-x))


def _log_binomials(alpha: int) -> np.ndarray:
    """``log C(alpha, j)`` for ``j = 0..alpha``, from cumulative sums of logs (no scipy needed)."""
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, alpha + 1, dtype=float)))])
    return log_factorial[alpha] - log_factorial - log_factorial[::-1]


def theorem9_log_moment(alpha: int, sampling_rate: float, base_rdp: BaseRDP, base_rdp_inf: float = math.inf) -> float:
    """``(alpha - 1) eps'(alpha)`` of Theorem 9 (the log of its bracket) at one integer ``alpha >= 2``.

    Computed in log space: the terms ``e^{(j-1) eps(j)}`` overflow a float long before the bound
    becomes useless (a Gaussian of multiplier 0.5 at j = 64 gives e^8064)."""
    if alpha < 2 or int(alpha) != alpha:
        raise ValueError(f"Theorem 9 holds for integer orders alpha >= 2, got {alpha}")
    alpha = int(alpha)
    log_gamma = math.log(sampling_rate)
    log_binom = _log_binomials(alpha)
    log_cap_inf = _log_expm1(base_rdp_inf) if math.isfinite(base_rdp_inf) else math.inf
    eps2 = float(base_rdp(np.array([2.0]))[0])
    second = min(math.log(4.0) + float(_log_expm1(eps2)), eps2 + min(math.log(2.0), 2.0 * log_cap_inf))
    terms = [2.0 * log_gamma + log_binom[2] + second]
    if alpha >= 3:
        j = np.arange(3, alpha + 1, dtype=float)
        caps = np.minimum(math.log(2.0), j * log_cap_inf)
        terms.extend(j * log_gamma + log_binom[3:] + (j - 1.0) * base_rdp(j) + caps)
    return float(np.logaddexp(0.0, np.logaddexp.reduce(np.asarray(terms))))


def subsampled_without_replacement_rdp(
    orders: Sequence[float], sampling_rate: float, base_rdp: BaseRDP, base_rdp_inf: float = math.inf
) -> np.ndarray:
    """Theorem 9's bound at every order of ``orders`` (interpolated between integers, ``eps'(2)``
    below 2), capped by the base curve. ``sampling_rate`` is ``gamma = m / n`` in (0, 1]."""
    grid = check_orders(orders)
    if not 0.0 < sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    base = np.asarray(base_rdp(grid), dtype=float)
    if sampling_rate == 1.0:
        return base  # no sampling: the mechanism itself
    below = np.maximum(np.floor(grid), 2.0).astype(int)
    above = np.maximum(np.ceil(grid), 2.0).astype(int)
    moments = {a: theorem9_log_moment(a, sampling_rate, base_rdp, base_rdp_inf) for a in np.union1d(below, above).tolist()}
    bound = np.empty_like(grid)
    for i, (order, low, high) in enumerate(zip(grid, below, above, strict=True)):
        if order <= 2.0:
            bound[i] = moments[2]  # eps'(alpha) <= eps'(2): RDP is non-decreasing in alpha
        elif low == high:
            bound[i] = moments[low] / (order - 1.0)
        else:  # convexity of the log-moment (Wang et al., Corollary 10)
            t = order - low
            bound[i] = ((1.0 - t) * moments[low] + t * moments[high]) / (order - 1.0)
    return np.minimum(bound, base)


def selected_critic_gaussian_rdp(orders: Sequence[float], noise_multiplier: float, num_critics: int) -> np.ndarray:
    """RDP of one GS-WGAN step: one of ``num_critics`` critics, drawn uniformly, answers through a
    Gaussian mechanism of ``noise_multiplier`` (in units of its L2 sensitivity).

    The N critics are N super-records (disjoint partitions, fixed for the run): a replaced record
    changes one critic arbitrarily, and since any two critics' clipped outputs differ by at most
    the sensitivity, the base mechanism is ``(alpha, alpha / (2 s^2))``-RDP between ANY two critics.
    Drawing the critic is then sampling one super-record of N without replacement: Theorem 9 with
    ``gamma = 1 / N``. With one critic there is no sampling and this is the plain Gaussian.
    """
    if isinstance(num_critics, bool) or int(num_critics) != num_critics or num_critics < 1:
        raise ValueError(f"num_critics must be an integer >= 1, got {num_critics}")
    gaussian_rdp(orders, noise_multiplier)  # validates the multiplier

    def base(alpha: np.ndarray) -> np.ndarray:
        return gaussian_rdp(alpha, noise_multiplier)

    return subsampled_without_replacement_rdp(orders, 1.0 / int(num_critics), base)


__all__ = ["selected_critic_gaussian_rdp", "subsampled_without_replacement_rdp", "theorem9_log_moment"]
