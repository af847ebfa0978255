"""Sample image grids: one row per class for conditional models, written while training.

Drawing samples only runs the generator, so it costs no privacy budget.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from lightning_dpgan.outputs import image_grid, images_to_uint8, write_png
from lightning_dpgan.random_streams import seeded_stream


def sample_grid(module: Any, columns: int = 10, seed: int = 0) -> np.ndarray:
    """A picture of ``module.sample``: row k holds class k (or ``columns`` rows if unconditional).

    A fixed seed draws the same latent vectors every time, so successive grids show the
    generator changing, not the noise.
    """
    rows = module.num_classes or columns
    labels = None
    if module.num_classes:
        labels = torch.arange(module.num_classes, device=module.device).repeat_interleave(columns)
    with seeded_stream(seed, module.device):  # the run's own streams, the GPU's too, go on untouched
        images = module.sample(rows * columns, labels)
    return image_grid(images_to_uint8(images), columns)


class SampleGrid(L.Callback):
    """Every ``every_n_steps`` training batches, write ``samples/step_<n>.png`` and log it."""

    def __init__(self, output_dir: str | Path, every_n_steps: int, columns: int = 10) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1, got {every_n_steps}")
        self.directory = Path(output_dir) / "samples"
        self.every_n_steps = every_n_steps
        self.columns = columns

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        step = pl_module.train_steps
        if step % self.every_n_steps or not trainer.is_global_zero:
            return
        picture = sample_grid(pl_module, self.columns)
        write_png(self.directory / f"step_{step:07d}.png", picture)
        log_image(trainer, "samples", picture, step - 1)  # the batch it follows, as the loggers number the scalars


def log_image(trainer: L.Trainer, key: str, picture: np.ndarray, step: int) -> None:
    """Send a picture to every logger that takes images (TensorBoard, W&B)."""
    for logger in trainer.loggers:
        experiment = getattr(logger, "experiment", None)
        if hasattr(logger, "log_image"):  # WandbLogger
            logger.log_image(key=key, images=[picture], step=step)
        elif hasattr(experiment, "add_image"):  # TensorBoard SummaryWriter
            dataformats = "HW" if picture.ndim == 2 else "HWC"
            experiment.add_image(key, picture, step, dataformats=dataformats)
