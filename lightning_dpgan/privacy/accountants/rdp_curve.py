"""Accountants that compose per-step RDP curves on a fixed grid of orders.

RDP composes by addition at every order α (Mironov 2017, Proposition 1), so any
mechanism whose per-step RDP is a known function of its parameters is accounted by
summing curves and converting once with ``rdp_to_epsilon``. Subclasses only provide
``step_rdp``; the Gaussian and the selected-critic (GS-WGAN) accountants build on this.
PATE-GAN's moments accountant and Confident-GNMax keep their own state (histograms of vote
gaps, noise pairs) and are not subclasses.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from lightning_dpgan.privacy.accountants.base import Accountant, AccountantStateError, Params
from lightning_dpgan.privacy.analysis.rdp import (
    DEFAULT_ORDERS,
    check_orders,
    gaussian_rdp,
    rdp_to_epsilon,
)

# Relative tolerance between a saved curve and the one its history recomputes: summing
# k identical steps one at a time and multiplying once differ by ~k float roundings.
_CURVE_RTOL = 1e-6


class RDPCurveAccountant(Accountant):
    """Sums per-step RDP curves over ``orders``; ε via the Opacus/Balle conversion.

    ``state_dict`` saves the summed curve next to the history; ``load_state_dict``
    recomputes the curve from the history and refuses the state when they disagree, so a
    hand-edited or truncated checkpoint cannot lower the budget spent.
    """

    name = "rdp"

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        super().__init__()
        self.orders = check_orders(orders)
        self._rdp = np.zeros_like(self.orders)

    @abc.abstractmethod
    def step_rdp(self, **mechanism_params: float) -> np.ndarray:
        """RDP of one step with these parameters, at each of ``self.orders``."""

    @property
    def rdp(self) -> np.ndarray:
        """The composed RDP curve of everything recorded so far (a copy)."""
        return self._rdp.copy()

    def get_privacy_spent(self, delta: float) -> tuple[float, float]:
        """``(ε, best order)``, as Opacus' ``RDPAccountant.get_privacy_spent``."""
        if not self._history:
            return 0.0, float("nan")
        return rdp_to_epsilon(self.orders, self._rdp, delta)

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the orders and the summed RDP curve."""
        state = super().state_dict()
        state["orders"] = self.orders.tolist()
        state["rdp"] = self._rdp.tolist()
        return state

    def _compute_epsilon(self, delta: float) -> float:
        return self.get_privacy_spent(delta)[0]

    def _record(self, params: Params, num_steps: int) -> None:
        self._rdp = self._rdp + num_steps * self._checked_step_rdp(params)

    def _restore(self, state: Mapping[str, Any], history: list[tuple[Params, int]]) -> None:
        orders = state.get("orders")
        if not isinstance(orders, list) or not np.array_equal(
            np.asarray(orders, dtype=float), self.orders
        ):
            raise AccountantStateError(
                "saved RDP curve was composed over different orders than this accountant's; "
                "construct the accountant with the orders stored in the checkpoint"
            )
        saved = self._parse_curve(state.get("rdp"))
        recomputed = np.zeros_like(self.orders)
        for params, num_steps in history:
            recomputed = recomputed + num_steps * self._checked_step_rdp(params)
        if not np.allclose(saved, recomputed, rtol=_CURVE_RTOL, atol=0.0):
            raise AccountantStateError(
                "saved RDP curve does not match the one its history composes; "
                "the checkpoint's privacy record is corrupt"
            )
        self._rdp = np.maximum(saved, recomputed)  # within rounding; never the smaller of the two

    def _parse_curve(self, raw: Any) -> np.ndarray:
        if not isinstance(raw, list) or len(raw) != len(self.orders):
            raise AccountantStateError(
                f"saved RDP curve must be a list of {len(self.orders)} numbers, got {raw!r}"
            )
        try:
            curve = np.asarray(raw, dtype=float)
        except (TypeError, ValueError) as error:
            raise AccountantStateError(f"saved RDP curve is not numeric: {error}") from error
        if np.any(np.isnan(curve)) or np.any(curve < 0):
            raise AccountantStateError("saved RDP curve has NaN or negative values")
        return curve

    def _checked_step_rdp(self, params: Params) -> np.ndarray:
        curve = np.asarray(self.step_rdp(**params), dtype=float)
        if curve.shape != self.orders.shape:
            raise ValueError(
                f"{type(self).__name__}.step_rdp returned shape {curve.shape}, "
                f"expected {self.orders.shape} (one value per order)"
            )
        return curve


class GaussianAccountant(RDPCurveAccountant):
    """The Gaussian mechanism without subsampling, L2-sensitivity 1.

    Each step is (α, α / (2σ²))-RDP (Mironov 2017, Proposition 7), so k steps compose
    to k·α / (2σ²). For releases where no amplification by subsampling is claimed,
    e.g. the gradient sanitizer's noisy clipped gradient (GS-WGAN, DP-SACTGAN).
    """

    mechanism: ClassVar[str] = "gaussian"
    param_names: ClassVar[tuple[str, ...]] = ("noise_multiplier",)

    def step(self, *, noise_multiplier: float) -> None:  # type: ignore[override]
        """Record one release with noise std = ``noise_multiplier`` × sensitivity."""
        super().step(noise_multiplier=noise_multiplier)

    def step_rdp(self, *, noise_multiplier: float) -> np.ndarray:  # type: ignore[override]
        """α / (2σ²) at each order (Mironov 2017, Proposition 7)."""
        return gaussian_rdp(self.orders, noise_multiplier)

    def _validate_params(self, params: Params) -> None:
        if params["noise_multiplier"] <= 0:
            raise ValueError(
                f"noise_multiplier must be > 0, got {params['noise_multiplier']} "
                "(0 means no noise, i.e. no privacy)"
            )
