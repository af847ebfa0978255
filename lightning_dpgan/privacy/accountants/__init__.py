"""Stateful privacy accountants over ``lightning_dpgan.privacy.analysis``."""

from lightning_dpgan.privacy.accountants.base import Accountant, AccountantStateError
from lightning_dpgan.privacy.accountants.opacus_adapter import (
    OpacusAccountant,
    calibrate_noise_multiplier,
)
from lightning_dpgan.privacy.accountants.gnmax import ConfidentGNMaxAccountant
from lightning_dpgan.privacy.accountants.pate import PATEMomentsAccountant
from lightning_dpgan.privacy.accountants.rdp_curve import GaussianAccountant, RDPCurveAccountant
from lightning_dpgan.privacy.accountants.subsampled_without_replacement import (
    SelectedCriticGaussianAccountant,
    calibrate_selected_critic_noise,
)

__all__ = [
    "Accountant",
    "AccountantStateError",
    "ConfidentGNMaxAccountant",
    "GaussianAccountant",
    "OpacusAccountant",
    "PATEMomentsAccountant",
    "RDPCurveAccountant",
    "SelectedCriticGaussianAccountant",
    "calibrate_noise_multiplier",
    "calibrate_selected_critic_noise",
]
