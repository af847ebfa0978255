"""Sample grids drawn while training: which classes go where, which noise, which file and step.

Fast unit tests with a stand-in module; ``tests/test_cli.py`` checks the same on real runs.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_dpgan.callbacks.samples import SampleGrid, sample_grid
from lightning_dpgan.outputs import images_to_uint8

SIDE, PAD = 4, 2


class StandInModule(SimpleNamespace):
    """``sample(n, labels)``: images whose first pixel row says the label (class k: -1 + 0.2 k)
    and whose other rows are uniform noise from the global random stream."""

    def __init__(self, num_classes: int | None, train_steps: int = 0) -> None:
        super().__init__(num_classes=num_classes, device=torch.device("cpu"), train_steps=train_steps, calls=[])

    def sample(self, n: int, labels: torch.Tensor | None) -> torch.Tensor:
        self.calls.append((n, None if labels is None else labels.tolist()))
        images = torch.rand(n, 1, SIDE, SIDE) * 2 - 1
        if labels is not None:
            images[:, :, 0, :] = (-1 + 0.2 * labels.float()).view(n, 1, 1)
        return images


def tiles(picture: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """The (rows, columns) grid's images, row-major, cut out of its padded picture."""
    out = []
    for row in range(rows):
        for col in range(columns):
            top, left = PAD + row * (SIDE + PAD), PAD + col * (SIDE + PAD)
            out.append(picture[top : top + SIDE, left : left + SIDE])
    return np.stack(out)


def test_a_conditional_grid_holds_class_k_in_row_k():
    """Row k is class k in every column: the labels are 0,0,0,1,1,1,... (not 0,1,2,0,1,2,...)."""
    module = StandInModule(num_classes=4)
    picture = sample_grid(module, columns=3)
    assert module.calls == [(12, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])]
    assert picture.shape == (4 * (SIDE + PAD) + PAD, 3 * (SIDE + PAD) + PAD)
    first_rows = tiles(picture, 4, 3)[:, 0, 0].reshape(4, 3)  # the label pixel of each tile
    expected = images_to_uint8(torch.tensor([-1 + 0.2 * k for k in range(4)]).view(4, 1, 1, 1))[:, 0, 0, 0]
    assert (first_rows == expected[:, None]).all()


def test_an_unconditional_grid_is_square():
    module = StandInModule(num_classes=None)
    picture = sample_grid(module, columns=3)
    assert module.calls == [(9, None)]
    assert picture.shape == (3 * (SIDE + PAD) + PAD, 3 * (SIDE + PAD) + PAD)


def test_a_grid_draws_its_seeds_noise_and_leaves_the_training_random_stream_alone():
    """Successive grids show the generator changing, not the noise: each draws with ``seed``
    whatever the global stream holds; and drawing one must not move that stream (training's
    noise, e.g. DP-SGD's, would otherwise depend on the sampling cadence)."""
    module = StandInModule(num_classes=None)
    torch.manual_seed(0)
    expected = images_to_uint8(module.sample(9, None))[:, 0]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    picture = sample_grid(module, columns=3, seed=0)
    assert torch.equal(torch.get_rng_state(), state)
    np.testing.assert_array_equal(tiles(picture, 3, 3), expected)
    assert not np.array_equal(sample_grid(module, columns=3, seed=1), picture)


class WandbLike:
    def __init__(self) -> None:
        self.logged = []

    def log_image(self, key, images, step):
        self.logged.append((key, images[0].shape, step))


class TensorBoardLike:
    def __init__(self) -> None:
        self.logged = []
        self.experiment = SimpleNamespace(add_image=lambda key, picture, step, dataformats: self.logged.append(
            (key, picture.shape, step, dataformats)))


def test_the_callback_writes_and_logs_a_grid_every_n_steps_on_rank_zero_only(tmp_path):
    """Every ``every_n_steps`` batches rank 0 writes ``samples/step_<n>.png`` and logs the picture
    at step n - 1 (the loggers number that batch's scalars from 0); other ranks write nothing."""
    wandb, tensorboard = WandbLike(), TensorBoardLike()
    callback = SampleGrid(tmp_path, every_n_steps=2, columns=3)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[wandb, tensorboard])
    module = StandInModule(num_classes=2)
    for step in range(1, 6):
        module.train_steps = step
        callback.on_train_batch_end(trainer, module, None, None, 0)
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["step_0000002.png", "step_0000004.png"]
    written = np.asarray(Image.open(tmp_path / "samples" / "step_0000004.png"))
    np.testing.assert_array_equal(written, sample_grid(StandInModule(num_classes=2), columns=3))
    shape = (2 * (SIDE + PAD) + PAD, 3 * (SIDE + PAD) + PAD)
    assert wandb.logged == [("samples", shape, 1), ("samples", shape, 3)]
    assert tensorboard.logged == [("samples", shape, 1, "HW"), ("samples", shape, 3, "HW")]  # grayscale: no channel axis

    other_rank = SampleGrid(tmp_path / "rank1", every_n_steps=2)
    module.train_steps = 2
    other_rank.on_train_batch_end(SimpleNamespace(is_global_zero=False, loggers=[wandb]), module, None, None, 0)
    assert not (tmp_path / "rank1").exists() and len(wandb.logged) == 2
    with pytest.raises(ValueError, match="at least 1"):
        SampleGrid(tmp_path, every_n_steps=0)
