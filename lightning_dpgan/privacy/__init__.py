"""Differential-privacy building blocks: analysis, accountants and input validation."""

from lightning_dpgan.privacy.accountants import (
    Accountant,
    AccountantStateError,
    GaussianAccountant,
    OpacusAccountant,
    RDPCurveAccountant,
    calibrate_noise_multiplier,
)
from lightning_dpgan.privacy.analysis import DEFAULT_ORDERS, gaussian_rdp, rdp_to_epsilon
from lightning_dpgan.privacy.validation import validate_delta, validate_epsilon, validate_positive

__all__ = [
    "DEFAULT_ORDERS",
    "Accountant",
    "AccountantStateError",
    "GaussianAccountant",
    "OpacusAccountant",
    "RDPCurveAccountant",
    "calibrate_noise_multiplier",
    "gaussian_rdp",
    "rdp_to_epsilon",
    "validate_delta",
    "validate_epsilon",
    "validate_positive",
]
