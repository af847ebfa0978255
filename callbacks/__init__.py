"""Lightning callbacks: privacy strategies, budget stopping, sample grids, step limits."""
from lightning_dpgan.callbacks.checkpoint import LastCheckpoint, save_checkpoint_atomically
from lightning_dpgan.callbacks.samples import SampleGrid, sample_grid
from lightning_dpgan.callbacks.step_limit import StepLimit

__all__ = ["LastCheckpoint", "SampleGrid", "StepLimit", "save_checkpoint_atomically", "sample_grid"]
