"""Stop after a number of training batches.

Lightning's own ``max_steps`` counts optimizer steps, and a GAN makes two or more per
batch (discriminator and generator), so ``--max-steps`` is enforced here in batches: the
same unit privacy accountants count in.
"""
from __future__ import annotations

from typing import Any

import lightning as L


def stop_floor_refusal(min_steps: int | None, min_epochs: int | None) -> str | None:
    """Why a Trainer's ``min_steps`` or ``min_epochs`` cannot be used, or None. Lightning trains
    on past a stop request (this limit's, the privacy budget's, a refused batch of answers) until
    they are met, and any ``min_steps``, 0 included, also makes it finish the first epoch: with
    ``--trainer.min_steps 0`` a DP-SGD run stopped by its budget after 8 steps trained 10 and
    reported epsilon 2.11 for a target of 2."""
    if min_steps is not None:
        floor = f"trainer.min_steps {min_steps}" + (" (even 0: Lightning then finishes the first epoch)"
                                                    if min_steps == 0 else "")
    elif min_epochs:
        floor = f"trainer.min_epochs {min_epochs}"
    else:
        return None
    return (f"{floor} would make training go on past a stop (the step limit, a private run's spent budget or "
            "refused answers): set the run's length with --max-steps or --max-epochs instead, and leave it out")


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
