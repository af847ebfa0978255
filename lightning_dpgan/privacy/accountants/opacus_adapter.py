"""Adapter from Opacus' accountants to the ``Accountant`` contract.

DP-SGD on the discriminator (DPGAN, DP-CTGAN) is the Poisson-subsampled Gaussian
mechanism that Opacus already accounts for; its math is not re-derived here. This module
only keeps the history in our format (so it can be checkpointed and refused when
foreign) and hands it to ``opacus.accountants.RDPAccountant`` or ``PRVAccountant``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar, Literal

import numpy as np
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.accountant import IAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from opacus.accountants.utils import get_noise_multiplier

from lightning_dpgan.privacy.accountants.base import Accountant, Params
from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, search_probe_warnings_silenced

AccountantKind = Literal["rdp", "prv"]

_ORDERS = list(DEFAULT_ORDERS)  # Opacus' functions take a list

_OPACUS_ACCOUNTANTS: dict[str, type[IAccountant]] = {
    "rdp": RDPAccountant,
    "prv": PRVAccountant,
}


class UnreachableEpsilon(ValueError):
    """No noise multiplier meets the target: ``reason`` says why, without the remedy the message
    gives (a caller that set the target from other settings names those instead)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _check_kind(kind: str) -> None:
    if kind not in _OPACUS_ACCOUNTANTS:
        raise ValueError(
            f"unknown accountant kind {kind!r}; choose one of {sorted(_OPACUS_ACCOUNTANTS)}"
        )


class OpacusAccountant(Accountant):
    """Accounts the Poisson-subsampled Gaussian mechanism with an Opacus accountant.

    ``kind="rdp"``: Rényi-DP composition of the sampled Gaussian mechanism (Mironov,
    Talwar & Zhang 2019) converted as in Balle et al. 2020 — Opacus' analysis, on the
    project's order grid (``DEFAULT_ORDERS``, Opacus' up to 63 plus orders up to 1024).
    Opacus' own grid cannot report ε below about log(1/δ)/62 however much noise is added
    (0.103 at δ = 1e-5), so DP-SGD at ε = 0.1 would be refused.
    ``kind="prv"``: numerical composition of privacy-loss random variables (Gopi, Lee &
    Wutschitz 2021); tighter, and reports Opacus' upper bound on ε.
    """

    mechanism: ClassVar[str] = "gaussian-subsampled"
    param_names: ClassVar[tuple[str, ...]] = ("noise_multiplier", "sample_rate")

    def __init__(self, kind: AccountantKind = "rdp") -> None:
        _check_kind(kind)
        super().__init__()
        self.name = kind

    def resume_setting(self, saved_accountant: str) -> str:
        """DP-SGD's ``--privacy.accountant`` chooses between Opacus' accountants."""
        return f" (--privacy.accountant {saved_accountant})" if saved_accountant in _OPACUS_ACCOUNTANTS else ""

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:  # type: ignore[override]
        """Record one noisy step: noise std / clipping norm, and batch sampling rate."""
        super().step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)

    def to_opacus(self) -> IAccountant:
        """A fresh Opacus accountant holding this history, as Opacus stores it."""
        accountant = _OPACUS_ACCOUNTANTS[self.name]()
        accountant.history = [
            (params["noise_multiplier"], params["sample_rate"], num_steps)
            for params, num_steps in self._history
        ]
        return accountant

    def _validate_params(self, params: Params) -> None:
        if params["noise_multiplier"] <= 0:
            raise ValueError(
                f"noise_multiplier must be > 0, got {params['noise_multiplier']} "
                "(0 means no noise, i.e. no privacy)"
            )
        if not 0.0 < params["sample_rate"] <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {params['sample_rate']}")

    def _compute_epsilon(self, delta: float) -> float:
        # Floored at 0, as ``rdp_to_epsilon`` does for the other accountants: Opacus' conversions
        # go negative for a large delta (a negative bound only says (0, delta)-DP holds), and a
        # negative epsilon would lower the total when costs are summed (``compose_costs``).
        if self.name != "rdp":
            return max(float(self.to_opacus().get_epsilon(delta=delta)), 0.0)
        # What RDPAccountant.get_privacy_spent computes, with each (sigma, q)'s one-step RDP
        # cached: RDP composes additively, so k steps cost k times one step. Budget stopping
        # asks for epsilon after every batch, and Opacus would recompute the curve each time.
        rdp = sum(
            _one_step_rdp(params["noise_multiplier"], params["sample_rate"]) * num_steps
            for params, num_steps in self._history
        )
        epsilon, _ = get_privacy_spent(orders=_ORDERS, rdp=rdp, delta=delta)
        return max(float(epsilon), 0.0)


@lru_cache(maxsize=64)
def _one_step_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Opacus' RDP curve of one subsampled-Gaussian step, on ``DEFAULT_ORDERS``."""
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=_ORDERS)
    rdp.setflags(write=False)
    return rdp


def rdp_epsilon_floor(delta: float) -> float:
    """The smallest epsilon the RDP accountant reports at ``delta``, whatever the noise: its
    conversion of zero Rényi divergence on the order grid (about log(1/delta) / max order)."""
    with search_probe_warnings_silenced():  # the largest order is the best one here by construction
        epsilon, _ = get_privacy_spent(orders=_ORDERS, rdp=np.zeros(len(_ORDERS)), delta=delta)
    return max(float(epsilon), 0.0)


def floor_reason(kind: AccountantKind, floor: float) -> str:
    """Why a target at or below ``floor`` (:func:`rdp_epsilon_floor`, :func:`prv_epsilon_floor`)
    cannot be met, for an error message: no noise, step count or sample rate helps."""
    accountant = (f"the RDP accountant (orders up to {max(_ORDERS):g})" if kind == "rdp" else
                  "the PRV accountant (within its error margin)")
    return f"however much noise is added, {accountant} certifies no less than epsilon {floor:.3g} at that delta"


def prv_epsilon_floor(delta: float, sample_rate: float) -> float:
    """The smallest epsilon Opacus' PRV accountant reports at ``delta``, whatever the noise: one
    step at a noise multiplier of 1e6 (about its error margin, 0.01)."""
    accountant = PRVAccountant()
    accountant.history = [(1e6, sample_rate, 1)]
    with search_probe_warnings_silenced(), np.errstate(divide="ignore", invalid="ignore"):  # a probe, not the run's
        return float(accountant.get_epsilon(delta=delta))


#: Calibration stops within this share of the target below it (and at most 0.01 below): an
#: absolute 0.01 let a target of 0.05 spend 0.042, noise bought for nothing.
RELATIVE_TOLERANCE = 0.01


#: the least noise multiplier calibration returns: a target that this much noise already meets (1e300;
#: 1e4 only for a step or so at sample rate 1, where sigma 0.01 spends 5,600) is met by any more, and
#: Opacus' bisection towards 0 would never end
LEAST_CALIBRATED_SIGMA = 0.01


def _met_with_least_noise(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> bool:
    """Asked of RDP whatever the run's accountant: PRV's grid at so little noise takes tens of GB.
    (Should PRV report more, the budget stop still ends the run before its target.)"""
    accountant = _OPACUS_ACCOUNTANTS["rdp"]()
    accountant.history = [(LEAST_CALIBRATED_SIGMA, sample_rate, steps)]
    try:
        with search_probe_warnings_silenced():  # a probe: Opacus' words on its orders would confuse
            return float(accountant.get_epsilon(delta=delta, alphas=_ORDERS)) <= target_epsilon
    except (ValueError, ArithmeticError):  # the accountant cannot say: the search decides
        return False


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    kind: AccountantKind = "rdp",
    epsilon_tolerance: float | None = None,
) -> float:
    """Smallest noise multiplier (to ``epsilon_tolerance`` in ε: by default 0.01, or
    :data:`RELATIVE_TOLERANCE` of a target below 1) keeping ε ≤ target, and no less than
    :data:`LEAST_CALIBRATED_SIGMA`.

    Delegates to ``opacus.accountants.utils.get_noise_multiplier`` (a doubling then
    bisection search on σ), so the σ it returns reaches ``target_epsilon`` under the same
    accountant, on the same orders, that will later report ε. Raises ``ValueError`` with the
    inputs when no σ up to Opacus' cap of 1e6 reaches the target.
    """
    _check_kind(kind)
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    orders = {"alphas": _ORDERS} if kind == "rdp" else {}
    if _met_with_least_noise(target_epsilon, delta, sample_rate, steps):
        return LEAST_CALIBRATED_SIGMA
    if epsilon_tolerance is None:
        epsilon_tolerance = min(0.01, RELATIVE_TOLERANCE * target_epsilon)
    try:
        with search_probe_warnings_silenced():
            sigma = get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=kind,
                epsilon_tolerance=epsilon_tolerance,
                **orders,
            )
    except ValueError as error:
        floor = rdp_epsilon_floor(delta) if kind == "rdp" else prv_epsilon_floor(delta, sample_rate)
        if target_epsilon <= floor:  # no noise, steps or sample rate can help: the orders end there
            rdp_reaches = kind == "prv" and target_epsilon > rdp_epsilon_floor(delta)
            other = ", or use --privacy.accountant rdp" if rdp_reaches else ""
            reason = floor_reason(kind, floor)
            raise UnreachableEpsilon(
                f"cannot reach epsilon={target_epsilon:.6g} at delta={delta:.6g}: {reason}. Raise the target epsilon to "
                f"more than that, or the delta{other}", reason) from error
        reason = (f"with {steps} steps at sample rate {sample_rate} ({kind} accounting) even a noise multiplier of "
                  "1e6 spends more")
        raise UnreachableEpsilon(
            f"cannot reach epsilon={target_epsilon:.6g} at delta={delta:.6g}: {reason}. Raise the target epsilon, or "
            f"train for fewer steps or with a smaller sample rate. (Opacus: {error})", reason) from error
    return float(sigma)
