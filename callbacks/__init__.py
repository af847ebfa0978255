"""Lightning callbacks: privacy strategies, budget stopping, sample grids, step limits.

The privacy strategies (``DPSGD``, ``PATEAggregation``, ``ProjectedVoting``,
``GradientSanitizer``), ``PrivacyBudgetStopping`` and the strategies' base class are imported on
first use (:mod:`lightning_dpgan.lazy_exports`).
"""
from lightning_dpgan import registry
from lightning_dpgan.callbacks.checkpoint import LastCheckpoint, save_checkpoint_atomically
from lightning_dpgan.callbacks.samples import SampleGrid, sample_grid
from lightning_dpgan.callbacks.step_limit import StepLimit
from lightning_dpgan.lazy_exports import lazy_exports, registry_targets

__all__ = ["LastCheckpoint", "SampleGrid", "StepLimit", "save_checkpoint_atomically", "sample_grid"]
_LAZY = {
    **registry_targets(registry.PRIVACY.values(), __name__),
    "PrivacyBudgetStopping": "lightning_dpgan.callbacks.budget:PrivacyBudgetStopping",
    "BudgetTooSmallError": "lightning_dpgan.callbacks.budget:BudgetTooSmallError",
    "PrivacyStrategy": "lightning_dpgan.callbacks.strategy:PrivacyStrategy",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ += list(_LAZY)
