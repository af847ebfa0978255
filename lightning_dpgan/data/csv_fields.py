"""Reading a CSV table whose rows must have the header's fields, no more.

pandas, given a row with one more field than the header, takes the row's first field as the
row's *index* and reads every other value under the next column's name: a whole file whose
rows end in an extra field trains silently on shifted columns. With ``index_col=False`` it
keeps the columns in place and drops the extra fields, with a ``ParserWarning``; here that
warning is an error naming the first such line, since a dropped value is data the user gave.
(A trailing comma on every row, a spreadsheet's habit, is an empty last field that pandas
reads as no field: accepted.)
"""
from __future__ import annotations

import csv
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: compressed files pandas opens itself; the first long line is looked for in plain text only
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zip", ".xz", ".zst", ".tar")

#: bytes after which a field's text starts (a separator, a line end, a quote, a blank)
_FIELD_START = np.zeros(256, dtype=bool)
_FIELD_START[list(b',\n\r"\t ')] = True
_SIGN = np.zeros(256, dtype=bool)
_SIGN[list(b"+-")] = True
_EXPONENT = np.zeros(256, dtype=bool)
_EXPONENT[list(b"eE")] = True
#: rows read at a time when counting leading zeros: memory stays flat whatever the file's size
LEADING_ZERO_CHUNK_ROWS = 200_000


class ExtraFieldsError(ValueError):
    """A data row has more fields than the CSV file's header."""


def read_csv_fields(path: Path | str, **kwargs: Any) -> pd.DataFrame:
    """``pandas.read_csv(path, index_col=False, **kwargs)``, refusing rows longer than the header."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)
        try:
            return pd.read_csv(path, index_col=False, **kwargs)
        except pd.errors.ParserWarning as warning:
            raise ExtraFieldsError(_extra_fields_message(Path(path))) from warning


def read_dataset_csv(path: Path | str, expected: str) -> pd.DataFrame:
    """A built-in dataset's CSV file, ``expected`` naming it ("the Kaggle creditcard.csv"): a row
    longer than the header, the first or a later one, makes the file damaged, not the user's input."""
    from lightning_dpgan.data.download import DataIntegrityError, compression_of, damaged_compression_refused

    try:
        with damaged_compression_refused(path, DataIntegrityError, f"is it {expected}? Copy or download it again"):
            frame = read_csv_fields(path, compression=compression_of(path))  # a gzipped copy under the plain name too
    except UnicodeDecodeError as error:
        raise DataIntegrityError(f"{path} is not a text CSV file ({error.reason} at byte {error.start}): "
                                 f"is it {expected}?") from error
    except pd.errors.EmptyDataError as error:  # pandas: "No columns to parse from file", naming none
        raise DataIntegrityError(f"{path} is empty: is it {expected}?") from error
    except ExtraFieldsError as error:
        raise DataIntegrityError(f"{error}: is it {expected}?") from error
    except pd.errors.ParserError as error:  # a row longer than the header, after the first
        reason = " ".join(str(error).split())
        raise DataIntegrityError(f"{path} cannot be read as a CSV table ({reason}): is it {expected}?") from error
    # the built-in files hold every field of every row: a blank one is a damaged (cut) row, not a
    # missing value for the user to drop or impute, as the schema's own refusal would have it
    damaged = frame.isna().any(axis=1)
    if damaged.any():
        rows = (frame.index[damaged] + 2).tolist()[:5]  # the header is line 1
        raise DataIntegrityError(f"{path}: {int(damaged.sum())} rows have fewer fields than the header or an empty one "
                                 f"(rows {rows}...): the file is damaged; is it {expected}?")
    return frame


def refuse_extra_columns(frame: pd.DataFrame, columns: Sequence[str], path: Path | str, whose: str, target: str) -> None:
    """A built-in file's columns beyond ``columns`` (the canonical file's, ``whose``): the schema's
    own refusal would send the user to edit a built-in schema, which is not theirs to edit, so
    the remedies are to remove them or to train on the file as any table (label ``target``)."""
    from lightning_dpgan.data.download import DataIntegrityError

    extra = [str(name) for name in frame.columns if name not in columns]
    if extra:
        raise DataIntegrityError(f"{path}: columns {extra} are not {whose}: remove them, or train on the file as any "
                                 f"table (--dataset csv --data.csv FILE --data.target {target})")


def _extra_fields_message(path: Path) -> str:
    where = first_long_line(path)
    at = f" (line {where[0]}: {where[1]} fields)" if where else ""
    if (mark := header_separator(path)) is not None:  # a European export: ';' between fields, decimal commas
        return (f"CSV file {path} has data rows with more fields than its header{at}: its header is separated by "
                f"{mark!r}, not commas, and the rows' commas are read as separators (decimal commas, say). The file "
                "must be comma-separated with decimal points: export it again as CSV with commas (or convert it, "
                f"e.g. with pandas.read_csv(path, sep={mark!r}, decimal=',').to_csv(new_path, index=False))")
    return (f"CSV file {path} has data rows with more fields than its header{at}: their values would be read "
            "under other columns' names or dropped. Check the delimiter, the quoting of fields holding commas, "
            "and that the header names every column")


#: the separators a spreadsheet writes in place of commas (a European locale's ';', a tab export)
OTHER_SEPARATORS = (";", "\t", "|")


def header_separator(path: Path) -> str | None:
    """The other separator (:data:`OTHER_SEPARATORS`) a plain-text file's header holds where it
    holds no comma, or None (a comma-separated header, a compressed file)."""
    from lightning_dpgan.data.download import compression_of

    if path.suffix.lower() in COMPRESSED_SUFFIXES or compression_of(path):
        return None
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            header = handle.readline()
    except (OSError, UnicodeDecodeError):
        return None
    if "," in header:
        return None
    return next((mark for mark in OTHER_SEPARATORS if mark in header), None)


def first_long_line(path: Path) -> tuple[int, int] | None:
    """``(line number, field count)`` of the first row with more non-empty fields than the header
    of a plain-text CSV file, or None (a compressed file, or none found)."""
    from lightning_dpgan.data.download import compression_of

    if path.suffix.lower() in COMPRESSED_SUFFIXES or compression_of(path):
        return None
    with open(path, newline="", encoding="utf-8") as handle:
        rows = csv.reader(handle)
        width = len(next(rows, []))
        for row in rows:
            while row and row[-1] == "":
                row = row[:-1]
            if len(row) > width:
                return rows.line_num, len(row)
    return None


__all__ = ["ExtraFieldsError", "first_long_line", "header_separator", "read_csv_fields", "read_dataset_csv", "refuse_extra_columns"]


def may_hold_leading_zeros(path: Path | str, block: int = 1 << 24) -> bool:
    """Whether a field of a plain-text CSV file may be a number written with a leading zero
    (``05``, ``-05``, ``"007"``): a zero after a field's start, or after a sign that is not an
    exponent's (``2e-05`` is not one), followed by a digit. False means none is; True (a date's
    ``-05``, a code in a text column) asks :func:`leading_zero_counts`. A scan of the bytes a
    block at a time, several times faster than reading the fields as text; a compressed file is
    not scanned (True)."""
    if Path(path).suffix.lower() in COMPRESSED_SUFFIXES:
        return True
    tail = b"\n\n\n"
    with open(path, "rb") as handle:
        while data := handle.read(block):
            text = np.frombuffer(tail + data, dtype=np.uint8)
            before, start, zero, digit = text[:-3], text[1:-2], text[2:-1], text[3:]
            field = _FIELD_START[start] | (_SIGN[start] & ~_EXPONENT[before])
            if (field & (zero == ord("0")) & (digit >= ord("0")) & (digit <= ord("9"))).any():
                return True
            tail = (tail + data)[-3:]
    return False


def leading_zero_counts(path: Path | str, columns: Sequence[str]) -> dict[str, int]:
    """How many fields of each of ``columns`` are written with a leading zero (``05``, ``-05``,
    `` 007``; ``0`` and ``0.5`` are not), read as text a chunk of rows at a time."""
    counts = dict.fromkeys(columns, 0)
    for chunk in pd.read_csv(path, usecols=list(columns), dtype=str, keep_default_na=False,
                             chunksize=LEADING_ZERO_CHUNK_ROWS):
        for name in columns:
            unsigned = np.char.lstrip(np.char.strip(chunk[name].to_numpy(dtype=str)), "+-")
            first_two = unsigned.astype("<U2")  # '05' of '05258'; '0' of '0', '0.' of '0.5'
            counts[name] += int((np.char.startswith(first_two, "0") & (np.char.str_len(first_two) == 2)
                                 & np.char.isdigit(first_two)).sum())
    return counts
