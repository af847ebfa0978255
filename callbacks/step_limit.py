"""Stop after a number of training batches.

Lightning's own ``max_steps`` counts optimizer steps, and a GAN makes two or more per
batch (discriminator and generator), so ``--max-steps`` is enforced here in batches: the
same unit privacy accountants count in.
"""
from __future__ import annotations

from typing import Any

import lightning as L


class StepLimit(L.Callback):
    """Stop training once the module has trained on ``max_steps`` batches."""

    def __init__(self, max_steps: int) -> None:
        if max_steps < 1:
            raise ValueError(f"--max-steps must be at least 1, got {max_steps}")
        self.max_steps = max_steps

    def _reached(self, pl_module: L.LightningModule) -> bool:
        return pl_module.train_steps >= self.max_steps

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._reached(pl_module):  # e.g. resuming a run that already finished
            trainer.should_stop = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._reached(pl_module):
            trainer.should_stop = True
