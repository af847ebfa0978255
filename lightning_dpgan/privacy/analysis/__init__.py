"""Pure privacy analysis: stateless RDP curves and their conversion to (ε, δ)-DP."""

from lightning_dpgan.privacy.analysis.rdp import (
    DEFAULT_ORDERS,
    check_orders,
    gaussian_rdp,
    rdp_to_epsilon,
)

__all__ = ["DEFAULT_ORDERS", "check_orders", "gaussian_rdp", "rdp_to_epsilon"]
