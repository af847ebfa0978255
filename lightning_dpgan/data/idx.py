"""Reader for the IDX format used by MNIST and Fashion-MNIST.

Format: two zero bytes, a type byte, a dimension-count byte, then one big-endian uint32 per
dimension, then the row-major payload in big-endian order. See http://yann.lecun.com/exdb/mnist/.
"""

from __future__ import annotations

import math
import os
import struct
import zlib

import numpy as np

from lightning_dpgan.data.download import DataIntegrityError, open_decompressed

_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a gzipped or raw IDX file into a native-endian array of the header's shape.

    Raises :class:`DataIntegrityError` naming the file when it is not IDX data, or when the
    payload is shorter or longer than the header announces (e.g. a truncated download).
    """
    data = _read_all(path)
    dtype, shape, offset = _parse_header(path, data)
    expected = math.prod(shape) * dtype.itemsize  # Python integers: a forged header's shape wraps an int64
    actual = len(data) - offset
    if actual != expected:
        raise DataIntegrityError(
            f"{path}: header announces shape {shape} ({expected} payload bytes) but the file "
            f"holds {actual} payload bytes; the file is truncated or corrupt, re-download it."
        )
    array = np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def _read_all(path: str | os.PathLike[str]) -> bytes:
    with open_decompressed(path) as stream:
        try:
            return stream.read()
        except (OSError, EOFError, zlib.error) as err:
            raise DataIntegrityError(f"{path} is not a readable gzip file: {err}") from err


def _parse_header(path: str | os.PathLike[str], data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """Return ``(dtype, shape, payload offset)`` from the IDX header of ``data``."""
    if len(data) < 4:
        raise DataIntegrityError(f"{path} is too short to be an IDX file ({len(data)} bytes).")
    zero, type_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or type_code not in _DTYPES:
        raise DataIntegrityError(
            f"{path} is not an IDX file: bad magic number 0x{data[:4].hex()}."
        )
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise DataIntegrityError(f"{path}: IDX header is truncated.")
    shape = struct.unpack(f">{ndim}I", data[4:offset])
    return _DTYPES[type_code], shape, offset
