"""A library's error, quoted inside a sentence of ours."""

from __future__ import annotations

from pathlib import Path


def first_line(error: BaseException) -> str:
    """The error's first non-empty line, without a final period (our sentence goes on after it), or
    its type's name when it says nothing. The first line is what went wrong; torch appends its
    dispatcher's tables after it, and parsers the text they choked on."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0].rstrip(". ") if lines else type(error).__name__


#: where a setting the user may never have typed came from, said beside its flag in a refusal
SET_BY = "given, or a config file's or the preset's"


#: binary units from the largest down: a size is said in the first it reaches one of
BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_size(count: float) -> str:
    """``count`` bytes in the largest binary unit it reaches one of: a message that said sizes
    in GiB alone read "0.0 GiB free" for a disk with hundreds of MiB left."""
    for unit, size in BYTE_UNITS:
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} bytes"


def named_file_text(path: Path, what: str, error: type[Exception]) -> str:
    """The text of a file the user named (``what``: "schema file", "config file"), refused as
    ``error`` with what to do when it is missing, a folder, or not UTF-8 (a bare codec error named
    neither the file nor the fix)."""
    if path.is_dir():
        raise error(f"{what} {path} is a folder: pass the file in it")
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        return path.read_text(encoding="utf-8-sig")  # Notepad's byte-order mark: JSON refuses it
    except UnicodeDecodeError as err:
        raise error(f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start}): save it as UTF-8") from None
