"""Rényi-DP curves and their conversion to (ε, δ)-DP.

Pure, stateless functions over a grid of RDP orders α. Every accountant that composes
RDP curves (the Gaussian and gradient-sanitizer accountants, Confident-GNMax) converts
through :func:`rdp_to_epsilon`, so all of them report ε with one and the same conversion —
the one Opacus uses. PATE-GAN's moments accountant is the exception: it sums log-moments and
converts with the moments accountant's own tail bound
(:func:`lightning_dpgan.privacy.analysis.pate.moments_to_epsilon`), as PATE-GAN states it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import get_privacy_spent

# Opacus' grid (fine near α = 1, integers up to 63) extended with high orders: strongly
# concentrated mechanisms — a long run of a large-σ Gaussian, or a data-dependent PATE
# bound with a clear teacher consensus — reach their best ε at orders in the hundreds
# (Papernot et al. 2018, "Scalable Private Learning with PATE", search up to α = 500).
DEFAULT_ORDERS: tuple[float, ...] = tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS) + (
    64.0,
    80.0,
    96.0,
    128.0,
    256.0,
    512.0,
    1024.0,
)


@contextmanager
def search_probe_warnings_silenced() -> Iterator[None]:
    """Around a search for σ: its probes far from the answer reach their best ε at one end of
    the order grid, and Opacus' "Optimal order is the largest alpha" (or "smallest") then
    speaks of a probe, not of any reported figure. Silenced for those messages alone; a report
    on the σ found still warns."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the (largest|smallest) alpha", category=UserWarning)
        yield


def check_orders(orders: Sequence[float]) -> np.ndarray:
    """Return ``orders`` as a float array, refusing orders RDP does not define.

    Rényi divergence of order α is only a privacy measure for α > 1 (Mironov 2017,
    Definition 3); α = ∞ is pure DP and has no place on a finite grid.
    """
    grid = np.asarray(orders, dtype=float)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"RDP orders must be a non-empty 1-D sequence, got shape {grid.shape}")
    if not np.all(np.isfinite(grid)) or np.any(grid <= 1.0):
        raise ValueError(f"RDP orders must be finite and > 1, got {grid.tolist()}")
    return grid


def gaussian_rdp(orders: Sequence[float], noise_multiplier: float) -> np.ndarray:
    """RDP of one Gaussian mechanism (no subsampling) with L2-sensitivity 1.

    Mironov 2017, "Rényi Differential Privacy", Proposition 7 / Table II: adding
    N(0, σ²) to a function of L2-sensitivity 1 is (α, α / (2σ²))-RDP for every α > 1.
    ``noise_multiplier`` is σ expressed in units of the sensitivity.
    """
    if not np.isfinite(noise_multiplier) or noise_multiplier <= 0:
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
    return check_orders(orders) / (2.0 * noise_multiplier**2)


def rdp_to_epsilon(
    orders: Sequence[float], rdp: Sequence[float], delta: float
) -> tuple[float, float]:
    """Convert a composed RDP curve to (ε, δ)-DP; return ``(ε, best order)``.

    Delegates to ``opacus.accountants.analysis.rdp.get_privacy_spent`` — Balle et al.
    2020, "Hypothesis Testing Interpretations and Rényi Differential Privacy",
    Theorem 21 — minimised over the grid, i.e. exactly the conversion of Opacus'
    ``RDPAccountant``. ε is floored at 0: a negative bound at some order only says that
    (0, δ)-DP already holds.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    grid = check_orders(orders)
    curve = np.asarray(rdp, dtype=float)
    if curve.shape != grid.shape:
        raise ValueError(
            f"rdp has shape {curve.shape} but orders has shape {grid.shape}; "
            "they must be evaluated on the same grid"
        )
    eps, best_order = get_privacy_spent(orders=grid, rdp=curve, delta=delta)
    return max(float(eps), 0.0), float(best_order)
