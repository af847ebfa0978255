"""Stateful privacy accountants over ``lightning_dpgan.privacy.analysis``."""

from lightning_dpgan.privacy.accountants.base import Accountant, AccountantStateError
from lightning_dpgan.privacy.accountants.opacus_adapter import (
    OpacusAccountant,
    calibrate_noise_multiplier,
)
from lightning_dpgan.privacy.accountants.gnmax import ConfidentGNMaxAccountant
from lightning_dpgan.privacy.accountants.pate import PATEMomentsAccountant
from lightning_dpgan.privacy.accountants.rdp_curve import GaussianAccountant, RDPCurveAccountant

__all__ = [
    "Accountant",
    "AccountantStateError",
    "ConfidentGNMaxAccountant",
    "GaussianAccountant",
    "OpacusAccountant",
    "PATEMomentsAccountant",
    "RDPCurveAccountant",
    "calibrate_noise_multiplier",
]
