"""Writing a run's files: every file is written to a temporary name and renamed, so a
crash never leaves a half-written privacy report or sample file that looks complete."""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import math
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import torch
import yaml
from PIL import Image


class OutputWriteError(OSError):
    """An output file could not be written (disk full, no permission, ...). Nothing was
    half-written: the file is absent, or still holds its previous content. ``errno`` is the
    cause's (``errno.ENOSPC`` for a full disk)."""

    def __init__(self, path: Path, cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        state = "still holds its previous content" if _exists(path) else "was not created"
        full = cause.errno in (errno.ENOSPC, errno.EDQUOT)
        in_the_way = _file_in_the_way(path)
        if full:
            advice = "Free some disk space (or write to another folder) and run again."
        elif in_the_way is not None:
            advice = f"{in_the_way} is a file, where the path needs a folder: write elsewhere and run again."
        else:
            advice = "Check that the folder is writable (or write to another folder) and run again."
        super().__init__(f"could not write {path}: {reason}. Nothing was half-written: {path.name} {state}. {advice}")
        self.errno, self.filename = cause.errno, str(path)

    def __str__(self) -> str:
        return self.args[0]


def _file_in_the_way(path: Path) -> Path | None:
    """The first of ``path``'s folders that exists as a file (``--out a.csv/x.csv`` beside an
    existing a.csv: mkdir says only "File exists"), None if there is none."""
    return next((folder for folder in reversed(path.parents) if _exists(folder) and not folder.is_dir()), None)


def _exists(path: Path) -> bool:
    """``path.exists()``, False where asking fails itself (a name too long for the file system
    raised OSError inside this error's own message)."""
    try:
        return path.exists()
    except OSError:
        return False


def file_creation_mask() -> int:
    """The process's file-creation mask (read by setting it, then restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary_prefix(path: Path) -> str:
    """``.NAME.HOST-PID.``: the writer's host and process, so that a later write can tell a
    temporary file whose writer was killed (SIGKILL, a lost node) from one still being written."""
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}."


def _writer_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


#: A temporary file untouched this long, whose writer's pid is gone, is an orphan. The age keeps
#: a live writer safe where a pid cannot tell (containers sharing a host name and a folder, not
#: their processes): a writer writes its file without pauses this long.
ORPHAN_AGE_S = 600


def remove_orphaned_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of ``path`` left by a writer on this host that no longer runs
    (a SIGKILL leaves them: nothing in the process can run), untouched for :data:`ORPHAN_AGE_S`.
    Those of live writers, and of other hosts (whose processes cannot be seen from here), are
    kept. Returns those removed. Not on Windows, where ``os.kill(pid, 0)`` would interrupt."""
    if os.name == "nt":
        return []
    # the whole name: mkstemp's part has no dot or dash, so a host "node" never matches "node-7.x"'s files
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{re.escape(socket.gethostname())}-(\d+)\.[A-Za-z0-9_]+\.tmp")
    removed = []
    for candidate in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        match = pattern.fullmatch(candidate.name)
        pid = int(match.group(1)) if match else 0
        if pid > 0 and pid != os.getpid() and _writer_is_gone(pid) and _untouched_for(candidate, ORPHAN_AGE_S):
            candidate.unlink(missing_ok=True)  # pid 0 would have signalled this process group
            removed.append(candidate)
    return removed


def _untouched_for(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime >= seconds
    except FileNotFoundError:
        return False


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it into place.

    If anything fails (a full disk, say), the temporary file is removed and ``path`` is left
    as it was; an ``OSError`` is raised again as :class:`OutputWriteError`, naming ``path``.
    Once written, the temporary files an earlier, killed writer of ``path`` left are removed
    (:func:`remove_orphaned_temporaries`)."""
    path = Path(path)
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o666 & ~file_creation_mask())  # mkstemp's 0600 would hide outputs from their readers
        os.replace(tmp_name, path)
    except BaseException as error:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, OutputWriteError):
            raise OutputWriteError(path, error) from error
        raise
    with contextlib.suppress(OSError):  # tidying: the file itself is written
        remove_orphaned_temporaries(path)
    return path


def _jsonable(value: Any) -> Any:
    """JSON has no inf/nan: report them as null rather than writing invalid JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (torch.Tensor, np.generic)):
        value = value.item() if getattr(value, "ndim", 0) == 0 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    text = json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_yaml(path: str | Path, data: dict[str, Any]) -> Path:
    text = yaml.safe_dump(_jsonable(data), sort_keys=False)
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_torch(path: str | Path, data: Any) -> Path:
    """An object as ``torch.save`` writes it (tensors and arrays inside kept as they are)."""
    return atomic_write(path, lambda f: torch.save(data, f))


def write_csv(path: str | Path, frame: pd.DataFrame) -> Path:
    """A DataFrame as CSV with its original column names (no index column)."""
    return write_csv_chunks(path, [frame])


def write_csv_chunks(path: str | Path, frames: Iterable[pd.DataFrame]) -> Path:
    """DataFrames written one after another as one CSV (the first one's header), atomically:
    a table too large to hold in memory at once."""
    def write(handle: BinaryIO) -> None:
        for index, frame in enumerate(frames):
            handle.write(frame.to_csv(index=False, header=index == 0).encode())

    return atomic_write(path, write)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex: ``privacy.json``'s ``synthetic_sha256`` names the
    synthetic table its guarantee was written for (``sha256sum`` gives the same)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def images_to_uint8(images: torch.Tensor) -> np.ndarray:
    """Map generator output in [-1, 1] to uint8 pixels, shape (N, C, H, W)."""
    pixels = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round()
    return pixels.to(torch.uint8).numpy()


def image_grid(pixels: np.ndarray, columns: int, padding: int = 2) -> np.ndarray:
    """Tile uint8 images (N, C, H, W) into one (rows*H, columns*W[, C]) picture, row-major."""
    n, channels, height, width = pixels.shape
    rows = math.ceil(n / columns)
    grid = np.zeros((channels, rows * (height + padding) + padding, columns * (width + padding) + padding), np.uint8)
    for index in range(n):
        row, col = divmod(index, columns)
        top, left = padding + row * (height + padding), padding + col * (width + padding)
        grid[:, top : top + height, left : left + width] = pixels[index]
    return grid[0] if channels == 1 else grid.transpose(1, 2, 0)


def write_png(path: str | Path, picture: np.ndarray) -> Path:
    image = Image.fromarray(picture)
    return atomic_write(path, lambda f: image.save(f, format="PNG"))
