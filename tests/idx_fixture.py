"""Test helpers that write IDX files (test-only: the product only ever reads IDX)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

_TYPE_CODES = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype(">i2"): 0x0B, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}

IMAGE_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode ``array`` as IDX: magic (0, 0, type, ndim), big-endian dims, big-endian payload."""
    big_endian = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    header = struct.pack(">HBB", 0, _TYPE_CODES[big_endian], array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(big_endian).tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` to ``path`` as IDX, gzipped when ``compress`` (default: name ends in .gz)."""
    data = idx_bytes(array)
    if compress if compress is not None else path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def class_patterns(num_classes: int = 10) -> np.ndarray:
    """One bright bar per class: horizontal bars for the first half, vertical for the rest."""
    patterns = np.zeros((num_classes, 28, 28), dtype=np.float64)
    half = num_classes // 2
    for k in range(num_classes):
        offset = 2 + 5 * (k % half)
        if k < half:
            patterns[k, offset : offset + 4, 3:25] = 1.0
        else:
            patterns[k, 3:25, offset : offset + 4] = 1.0
    return patterns


def tiny_image_dataset(n: int, seed: int, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic, class-balanced uint8 images: the class's bar plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % num_classes).astype(np.uint8)
    pixels = 220.0 * class_patterns(num_classes)[labels] + rng.normal(20.0, 15.0, size=(n, 28, 28))
    return np.clip(pixels, 0, 255).round().astype(np.uint8), labels


def write_image_dataset(folder: Path, train_size: int, test_size: int, seed: int) -> Path:
    """Write a tiny dataset under ``folder`` with the four canonical MNIST file names."""
    folder.mkdir(parents=True, exist_ok=True)
    for offset, (split, n) in enumerate((("train", train_size), ("test", test_size))):
        images, labels = tiny_image_dataset(n, seed + offset)
        images_name, labels_name = IMAGE_FILES[split]
        write_idx(folder / images_name, images)
        write_idx(folder / labels_name, labels)
    return folder
