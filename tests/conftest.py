"""Shared pytest fixtures."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # make the plain helper modules next to us importable

from idx_fixture import write_image_dataset  # noqa: E402
from idx_fixture import write_idx as _write_idx  # noqa: E402

TINY_TRAIN_SIZE = 160
TINY_TEST_SIZE = 40


@pytest.fixture(autouse=True)
def _isolated_data_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tests away from the user's real cache and data folders."""
    monkeypatch.setenv("LIGHTNING_DPGAN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR", raising=False)


@pytest.fixture(scope="session")
def tiny_image_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir with ``mnist/`` and ``fashion-mnist/``, each a tiny learnable IDX dataset.

    160 train / 40 test 28x28 uint8 images, 10 balanced classes, each a distinct bar
    pattern plus noise. Not the canonical files: load them with ``verify_checksums=False``.
    """
    root = tmp_path_factory.mktemp("tiny_image_data")
    write_image_dataset(root / "mnist", TINY_TRAIN_SIZE, TINY_TEST_SIZE, seed=0)
    write_image_dataset(root / "fashion-mnist", TINY_TRAIN_SIZE, TINY_TEST_SIZE, seed=100)
    return root


@pytest.fixture
def write_idx() -> Callable[..., Path]:
    """The test-only IDX writer ``write_idx(path, array, compress=None)``."""
    return _write_idx
