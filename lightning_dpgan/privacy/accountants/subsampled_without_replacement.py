"""``SelectedCriticGaussianAccountant``: GS-WGAN's amplified steps (one of N critics answers).

GS-WGAN (Chen, Orekondy & Fritz, NeurIPS 2020) trains N critics on N disjoint partitions and, at
each generator step, releases the sanitized gradient of ONE critic drawn uniformly at random.
Each step is accounted as a Gaussian mechanism run on one "super-record" (a critic) sampled
without replacement from N, under replace-one neighbours: Wang, Balle & Kasiviswanathan (AISTATS
2019), Theorem 9, with ``gamma = 1 / N``
(:func:`~lightning_dpgan.privacy.analysis.subsampling.selected_critic_gaussian_rdp`).

Not the Poisson subsampled Gaussian (Mironov, Talwar & Zhang 2019, what Opacus computes): the
critic is not included by Poisson sampling -- exactly one is always queried -- and the critics not
holding the changed record do not answer with "the unchanged mechanism" of a Poisson analysis;
their answers differ from the changed critic's by up to the full sensitivity. The
without-replacement bound for replace-one neighbours is the one that fits.
"""
from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np

from lightning_dpgan.privacy.accountants.base import Params
from lightning_dpgan.privacy.accountants.rdp_curve import RDPCurveAccountant
from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, rdp_to_epsilon, search_probe_warnings_silenced
from lightning_dpgan.privacy.analysis.subsampling import selected_critic_gaussian_rdp


class SelectedCriticGaussianAccountant(RDPCurveAccountant):
    """Composes, per step, Theorem 9's bound for a Gaussian of ``noise_multiplier`` (sensitivity
    units) queried on one of ``num_critics`` critics drawn uniformly (``gamma = 1 / N``).

    With ``num_critics = 1`` a step costs exactly the plain Gaussian's ``alpha / (2 s^2)``.
    """

    mechanism: ClassVar[str] = "gaussian-selected-critic-wor"
    param_names: ClassVar[tuple[str, ...]] = ("noise_multiplier", "num_critics")

    def step(self, *, noise_multiplier: float, num_critics: int) -> None:  # type: ignore[override]
        """Record one release: a Gaussian of this multiplier, one critic of ``num_critics`` queried."""
        super().step(noise_multiplier=noise_multiplier, num_critics=num_critics)

    def step_rdp(self, *, noise_multiplier: float, num_critics: float) -> np.ndarray:  # type: ignore[override]
        """Theorem 9 with ``gamma = 1 / num_critics`` at each order (cached: every step of a run
        has the same parameters, and look-ahead asks for the curve many times)."""
        return _curve(tuple(self.orders.tolist()), float(noise_multiplier), int(num_critics)).copy()

    def _validate_params(self, params: Params) -> None:
        if params["noise_multiplier"] <= 0:
            raise ValueError(f"noise_multiplier must be > 0, got {params['noise_multiplier']} (0 means no privacy)")
        if params["num_critics"] < 1 or params["num_critics"] != int(params["num_critics"]):
            raise ValueError(f"num_critics must be an integer >= 1, got {params['num_critics']}")


@functools.lru_cache(maxsize=256)
def _curve(orders: tuple[float, ...], noise_multiplier: float, num_critics: int) -> np.ndarray:
    return selected_critic_gaussian_rdp(orders, noise_multiplier, num_critics)


#: The largest noise multiplier calibration tries (as Opacus' search for DP-SGD).
MAX_NOISE_MULTIPLIER = 1e6


def grid_epsilon_floor(orders: tuple[float, ...] | np.ndarray, delta: float) -> float:
    """The least epsilon an RDP curve on ``orders`` converts to at ``delta``, however much noise:
    zero divergence (the largest order is the best one here by construction)."""
    with search_probe_warnings_silenced():
        return float(rdp_to_epsilon(orders, np.zeros(len(orders)), delta)[0])


def calibrate_selected_critic_noise(
    target_epsilon: float, delta: float, steps: int, num_critics: int, orders: tuple[float, ...] | None = None
) -> float:
    """The smallest noise multiplier (sensitivity units) whose ``steps`` accounted steps spend at
    most ``target_epsilon`` at ``delta``: bisection on this accountant's own curve, so the
    calibration and the stopping rule agree. Epsilon falls as the noise grows, so the bracket is
    found by doubling and narrowed in log space to a relative 1e-4 (about 20 curve evaluations)."""
    grid = tuple(DEFAULT_ORDERS if orders is None else orders)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")

    def epsilon(noise: float) -> float:
        with search_probe_warnings_silenced():
            return rdp_to_epsilon(grid, steps * _curve(grid, noise, num_critics), delta)[0]

    floor = grid_epsilon_floor(grid, delta)
    if target_epsilon <= floor:  # no noise can help: zero divergence converts to this on the grid
        raise ValueError(f"cannot reach epsilon {target_epsilon:g} at delta {delta:g}: however much noise is added, the "
                         f"RDP orders (up to {max(grid):g}) certify no less than epsilon {floor:.3g} at that delta. "
                         "Raise the target epsilon to more than that, or the delta")
    low, high = 1e-3, 1.0
    while epsilon(high) > target_epsilon:
        if high >= MAX_NOISE_MULTIPLIER:
            raise ValueError(f"no noise multiplier up to {MAX_NOISE_MULTIPLIER:g} reaches epsilon {target_epsilon:g} in "
                             f"{steps} steps")
        low, high = high, min(high * 2.0, MAX_NOISE_MULTIPLIER)  # the cap itself is tried too
    while high / low > 1.0 + 1e-4:
        middle = float(np.sqrt(low * high))
        low, high = (middle, high) if epsilon(middle) > target_epsilon else (low, middle)
    return high


__all__ = ["SelectedCriticGaussianAccountant", "calibrate_selected_critic_noise"]
