"""``checkpoints/last.ckpt``, refreshed every N training batches and at the end.

Lightning's ``ModelCheckpoint`` counts optimizer steps (two or more per GAN batch); this
counts batches like ``--max-steps``. Each save goes to a temporary file that is renamed
into place, so a crash mid-save leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException


def save_checkpoint_atomically(trainer: L.Trainer, path: str | Path) -> Path:
    """``trainer.save_checkpoint`` to ``path`` via a temporary file (every rank must call it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        trainer.save_checkpoint(tmp, weights_only=False)  # the full state a resume needs: accountants, optimizers, loops
        if trainer.is_global_zero:
            os.replace(tmp, path)
    except BaseException:
        if trainer.is_global_zero:  # e.g. a full disk: the previous checkpoint stays, no half file is left
            tmp.unlink(missing_ok=True)
        raise
    return path


class LastCheckpoint(L.Callback):
    """Save ``path`` every ``every_n_steps`` training batches (0: only at the end),
    and at every step a callback after this one releases the generator's output
    (``release_every_n_steps``: the sample grids).

    Why the releases: a grid drawn at step n shows the generator trained by steps up to n. If the
    run were killed after it and resumed from an earlier checkpoint, those steps would be trained
    again with fresh noise while the grid (in the folder, or sent to W&B) keeps what the first
    noise gave, and no accountant would count the first. Saved first, the checkpoint holds every
    step the grid shows, so a resume never repeats them.
    """

    def __init__(self, path: str | Path, every_n_steps: int = 0, release_every_n_steps: int = 0) -> None:
        if every_n_steps < 0 or release_every_n_steps < 0:
            raise ValueError(f"every_n_steps and release_every_n_steps must be >= 0, got {every_n_steps}, "
                             f"{release_every_n_steps}")
        self.path = Path(path)
        self.every_n_steps = every_n_steps
        self.release_every_n_steps = release_every_n_steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        step = pl_module.train_steps
        if any(every and step % every == 0 for every in (self.every_n_steps, self.release_every_n_steps)):
            save_checkpoint_atomically(trainer, self.path)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        save_checkpoint_atomically(trainer, self.path)

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        """SIGTERM (``kill``, a scheduler's stop): Lightning stops between two training batches,
        where the networks and the accountant are whole, so the steps since the last save are
        kept rather than trained again. (Ctrl-C can land inside a batch: nothing is saved then.
        In several processes a save is a collective that a stopping peer may not join: not tried.)"""
        if isinstance(exception, SIGTERMException) and trainer.world_size == 1:
            save_checkpoint_atomically(trainer, self.path)
