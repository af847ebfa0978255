"""Table schemas: the public description of a table that fixes how its rows are encoded.

A :class:`TableSchema` lists every column with its kind and *public* domain: bounds for numeric
columns, the category list for categorical ones. Encoding is a fixed map from that description
alone -- numeric values are clipped to their bounds and min-max scaled to [0, 1], categorical
values become one-hot blocks in the schema's category order -- so no statistic of the private
rows enters the encoder. Were the encoder fitted to the data (a min-max scaler, categories
"seen in the data"), a single record could move every other record's encoding, and that
leak would sit outside the privacy accounting of training.

Stated rule for values outside the schema:

- numeric values below/above the bounds are **clipped** to the bound and counted per column;
- categorical values not in the schema's list make the row **rejected** (dropped), counted per
  column; or, with ``unknown="blank"``, the row is kept and that column encoded as no category
  (an all-zero block); or they are an error with ``unknown="error"``;
- the label of a ``binary`` task must be one of its two classes; anything else is an error,
  because silently dropping rows of an unexpected class would change the task.

Dropping a row depends on that row alone, so training on the kept rows is as private as
training on all of them under add/remove-one neighbours, but the number of kept rows is a
count of the private data, and a run releases its number of training records (privacy.json,
DP-SGD's sample rate, the synthetic table's length). Under replace-one neighbours with a fixed
number of records (PATE's teachers, GS-WGAN's critics) a record replaced by one the schema
drops is a removal, which changes every teacher's partition. So runs train on ``"blank"``
encodings, which keep every row. The :class:`EncodingReport`
counts, however, are statistics of the private data: they are for the data holder and are
not covered by any privacy guarantee if published.
"""

from __future__ import annotations

import decimal
import json
import math
import re
import shlex
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml

from lightning_dpgan.error_text import named_file_text
from lightning_dpgan.unique_keys import RepeatedKeyError, UniqueKeyLoader, refuse_repeated_json_keys

KINDS = ("continuous", "integer", "categorical")
#: Slack (in steps) when counting the grid points below a column's upper bound: float rounding only.
_GRID_TOLERANCE = 1e-6
#: Largest magnitude of an integer column's bounds: whole numbers beyond it are not exact in a float.
LARGEST_EXACT_INTEGER = 2**53
#: Significant digits a continuous column's decoded value keeps without a step. The generator's
#: outputs are float32 (about 7 significant digits), so the digits past them are its rounding error,
#: not data: 75143.96875 in synthetic.csv where 75143.97 was drawn.
_DECODED_DIGITS = 7
LABEL_KINDS = ("binary", "categorical", "continuous")
UNKNOWN_RULES = ("drop", "blank", "error")


def _written_decimals(number: float) -> int:
    """The decimals of ``number`` as Python writes it (shortest round trip): 0.1 has 1, 1e-13 13,
    0.123456789012 12, 2500.0 none."""
    exponent = decimal.Decimal(repr(float(number))).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _significant(values: np.ndarray, width: float) -> np.ndarray:
    """``values`` rounded to :data:`_DECODED_DIGITS` significant digits of the smaller of each
    value and the column's ``width`` (high - low): a value is as fine as its float32 code was,
    whether that code held it on a linear scale (a fraction of the width) or a log scale (a
    fraction of itself). Whole numbers stay whole; zero stays zero."""
    scale = np.minimum(np.abs(values), width)
    with np.errstate(divide="ignore", invalid="ignore"):
        decimals = _DECODED_DIGITS - np.ceil(np.log10(scale))
    decimals = np.clip(np.where(np.isfinite(decimals), decimals, 0), 0, 300)
    factor = 10.0 ** decimals
    scaled = values * factor
    exact = np.abs(scaled) < 2.0**53  # past 2^53 a float has no digits after the point to drop
    return np.where(exact, np.round(scaled) / np.where(exact, factor, 1.0), values)


def column_names(value: Sequence[str] | str | None, flag: str | None = None) -> list[str]:
    """Column names from a list or a comma-separated string (as typed on the command line);
    ``None`` is none. With ``flag`` (the option that gave them), a name given twice is refused:
    it does nothing the first did not, so it is likely a typo for another column."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip() for item in items if str(item).strip()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if flag is not None and repeated:
        raise ValueError(f"{flag} names {', '.join(repr(name) for name in repeated)} more than once: give each "
                         "column once")
    return names


def as_flag_value(name: str) -> str:
    """``name`` as a --data.* column flag takes it, for a message's remedy: a flag's value is read
    as YAML, where null, ~, 2020 or on are no value, a number or a boolean (quoted, they stay
    text), and a comma separates two names (a YAML list keeps it in one)."""
    from lightning_dpgan.config import parse_value  # the CLI's reading (1e3 is a number there too)

    if "," in name:
        return shlex.quote(json.dumps([name]))
    try:
        read = parse_value(name)
    except (yaml.YAMLError, ValueError):  # 2020-13-45: a date YAML cannot build
        read = None
    return shlex.quote(name if read == name else json.dumps(name))


class SchemaError(ValueError):
    """A schema that is inconsistent, or a frame that does not fit its schema.

    Messages name the offending columns (and row counts) so the data holder can fix the data or
    the schema without guessing. ``problem`` is the message without its remedy, for a caller
    whose remedy differs (a synthetic table is written again, not fixed in a schema).
    """

    def __init__(self, message: str, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = message if problem is None else problem


def _refusal(problem: str, remedy: str) -> SchemaError:
    return SchemaError(f"{problem}: {remedy}", problem=problem)


def _python_scalar(value: Any) -> Any:
    """numpy scalars as plain Python values, so schemas stay YAML/JSON friendly."""
    return value.item() if isinstance(value, np.generic) else value


class PlainNumberLoader(UniqueKeyLoader):
    """YAML as :func:`yaml.safe_load` reads it, but for an unquoted number that YAML 1.1 reads
    otherwise than it is written -- ``010`` as 8 (octal), ``1:30`` as 90 (base 60), ``0x1A`` as 26 --
    which is refused: a category list ``[010, 020]`` would silently hold 8 and 16, which no record
    matches, and a bound would be another number. So is a key given twice in one mapping (a
    column's second ``bounds`` replaced its first in silence)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = super().construct_yaml_int(node)
        digits = node.value.lstrip("+-").replace("_", "")
        try:
            plain = int(node.value)
        except ValueError:
            plain = None
        if plain != value or (len(digits) > 1 and digits.startswith("0")):  # 007 is 7 either way, but not '007'
            _refuse_unplain_number(node, value)
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if ":" in node.value:
            _refuse_unplain_number(node, value)
        return value


def _refuse_unplain_number(node: yaml.ScalarNode, value: float) -> None:
    raise SchemaError(f"line {node.start_mark.line + 1}: {node.value} reads as the number {value} in YAML: quote it "
                      f"('{node.value}') if it is a category, or write the number plainly")


PlainNumberLoader.add_constructor("tag:yaml.org,2002:int", PlainNumberLoader.construct_yaml_int)
PlainNumberLoader.add_constructor("tag:yaml.org,2002:float", PlainNumberLoader.construct_yaml_float)


#: how a column's ``source`` begins when its bounds or categories are a DP estimate's (dp_bounds)
DP_ESTIMATE_SOURCE = "DP estimate"


@dataclass(frozen=True)
class Column:
    """One column: its kind and public domain.

    Args:
        name: the column name in the data.
        kind: ``"continuous"`` (float), ``"integer"`` (rounded on decoding) or ``"categorical"``.
        bounds: ``(low, high)`` for numeric kinds, ``low < high``.
        categories: the public category list of a categorical column, in one-hot order.
        step: the public resolution of a continuous column (King's floors come in half steps,
            bathrooms in quarters): its values are ``low + k * step``. Decoded values are
            rounded to that grid, so synthetic rows hold only values the real column can hold.
            It shapes decoding only: encoding, and so the scoring of tables from other tools
            or from runs trained before a step was declared, ignores it -- unless a
            mode-specific encoding declares the column discrete, which gives it one slot per
            grid value (such a run's transformer keeps its own schema, step included).
        source: where the public bounds/categories come from (documentation, a standard, a DP
            estimate); kept with the schema so a reader can check that they are public.
    """

    name: str
    kind: str
    bounds: tuple[float, float] | None = None
    categories: tuple[Any, ...] | None = None
    source: str = ""
    step: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"column names must be non-empty strings, got {self.name!r}")
        if self.kind not in KINDS:
            raise SchemaError(f"column '{self.name}': kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "categorical":
            self._check_categorical()
        else:
            self._check_numeric()

    def _check_numeric(self) -> None:
        if self.categories is not None:
            raise SchemaError(f"column '{self.name}' is {self.kind}: it takes bounds, not categories")
        if self.bounds is None or len(self.bounds) != 2:
            raise SchemaError(f"column '{self.name}' is {self.kind}: bounds=(low, high) are required")
        low, high = (float(b) for b in self.bounds)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise SchemaError(f"column '{self.name}': bounds must be finite with low < high, got {self.bounds}")
        if self.kind == "integer" and math.ceil(low) > math.floor(high):
            raise SchemaError(f"column '{self.name}': integer bounds {self.bounds} contain no integer")
        if self.kind == "integer" and max(abs(low), abs(high)) > LARGEST_EXACT_INTEGER:
            # records are encoded as floats and written as int64: beyond 2^53 neighbours merge, past
            # 2^63 a value wraps round to the most negative int64
            raise SchemaError(f"column '{self.name}': integer bounds {self.bounds} pass ±2^53 = ±{LARGEST_EXACT_INTEGER:,}, "
                              "beyond which whole numbers are not held exactly: declare the column continuous")
        object.__setattr__(self, "bounds", (low, high))
        if self.step is not None:
            self._check_step(low, high)

    def _check_step(self, low: float, high: float) -> None:
        if self.kind != "continuous":
            raise SchemaError(f"column '{self.name}' is {self.kind}: only a continuous column takes a step "
                              "(an integer column's step is 1)")
        step = self.step
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or not 0 < step <= high - low:
            raise SchemaError(f"column '{self.name}': step must be a number in (0, high - low], got {step!r}")
        object.__setattr__(self, "step", float(step))

    def typed(self, values: np.ndarray) -> np.ndarray:
        """Decoded numeric ``values`` as the column holds them: within the bounds, integer
        columns rounded (int64), a continuous column with a ``step`` on its grid."""
        low, high = self.bounds
        if self.kind == "integer":
            return np.clip(np.round(values), math.ceil(low), math.floor(high)).astype(np.int64)
        values = np.clip(values, low, high)
        if self.step is None:
            return np.clip(_significant(values, high - low), low, high)  # a bound of 8+ digits rounds outward
        on_grid = low + np.clip(np.round((values - low) / self.step), 0, self.grid_size - 1) * self.step
        return np.clip(self._on_grid_decimals(on_grid), low, high)

    @property
    def grid_size(self) -> int | None:
        """How many values :attr:`grid` holds (``None`` without a grid), without building it."""
        if self.kind == "integer":
            low, high = self.bounds
            return math.floor(high) - math.ceil(low) + 1
        if self.kind != "continuous" or self.step is None:
            return None
        low, high = self.bounds
        return math.floor((high - low) / self.step + _GRID_TOLERANCE) + 1

    @property
    def grid(self) -> np.ndarray | None:
        """Every value the column can hold, in order, when its domain is a public grid: an
        integer column's whole numbers within its bounds, a continuous column's ``low + k * step``
        (values as :meth:`typed` writes them); ``None`` for a continuous column without a step
        and for a categorical one. Public (bounds and step alone), so a histogram over it has
        one fixed bin per value."""
        size = self.grid_size
        if size is None:
            return None
        low, _ = self.bounds
        if self.kind == "integer":
            return np.arange(math.ceil(low), math.ceil(low) + size, dtype=np.int64)
        return np.clip(self._on_grid_decimals(low + np.arange(size) * self.step), *self.bounds)

    def _on_grid_decimals(self, values: np.ndarray) -> np.ndarray:
        """Grid values ``low + k * step`` rounded to the decimals ``low`` and ``step`` are written
        with, so a step such as 0.1 writes 0.3 rather than 0.30000000000000004. A fixed 10
        decimals wrote a 1e-13 step's values as 0.0 and cut a bound of 12 decimals short (below itself)."""
        decimals = max(_written_decimals(self.bounds[0]), _written_decimals(self.step))
        with np.errstate(over="ignore", invalid="ignore"):
            rounded = np.round(values, decimals)
        return np.where(np.isfinite(rounded), rounded, values)

    def grid_codes(self, values: np.ndarray) -> np.ndarray:
        """Each numeric value's position in :attr:`grid` (clipped to the bounds, then the nearest
        grid value), as int64. Needs a column with a grid."""
        grid = self.grid
        if grid is None:
            raise SchemaError(f"column '{self.name}' has no grid of values (an integer column, or a continuous one with a step)")
        spacing = 1.0 if self.kind == "integer" else self.step
        values = np.clip(np.asarray(values, dtype=np.float64), *self.bounds)
        return np.clip(np.round((values - float(grid[0])) / spacing), 0, len(grid) - 1).astype(np.int64)

    def _check_categorical(self) -> None:
        if self.bounds is not None:
            raise SchemaError(f"column '{self.name}' is categorical: it takes categories, not bounds")
        if self.categories is None or isinstance(self.categories, str) or len(self.categories) == 0:
            raise SchemaError(f"column '{self.name}' is categorical: a non-empty categories list is required")
        categories = tuple(_python_scalar(c) for c in self.categories)
        if any(c is None or (isinstance(c, float) and math.isnan(c)) for c in categories):
            raise SchemaError(f"column '{self.name}': categories cannot contain missing values")
        if len(set(categories)) != len(categories):
            raise SchemaError(f"column '{self.name}': categories must be unique, got {list(categories)}")
        object.__setattr__(self, "categories", categories)

    @property
    def is_numeric(self) -> bool:
        return self.kind != "categorical"

    @property
    def from_dp_estimate(self) -> bool:
        """Whether its bounds or categories are a DP estimate's (its ``source`` says so)."""
        return str(self.source).startswith(DP_ESTIMATE_SOURCE)

    @property
    def width(self) -> int:
        """Number of slots of this column in the encoded vector."""
        return 1 if self.is_numeric else len(self.categories)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.is_numeric:
            entry["bounds"] = list(self.bounds)
        else:
            entry["categories"] = list(self.categories)
        if self.step is not None:
            entry["step"] = self.step
        if self.source:
            entry["source"] = self.source
        return entry

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> Column:
        unknown = set(entry) - {"name", "kind", "bounds", "categories", "source", "step"}
        if unknown:
            raise SchemaError(f"column entry {dict(entry)!r} has unknown keys {sorted(unknown)}")
        bounds = entry.get("bounds")
        categories = _list_entry(f"column '{entry.get('name')}': categories", entry.get("categories"), "categories: [a, b]")
        return cls(
            name=entry.get("name"),
            kind=entry.get("kind"),
            bounds=_bounds_entry(entry.get("name"), bounds) if bounds is not None else None,
            categories=tuple(categories) if categories is not None else None,
            source=entry.get("source", ""),
            step=entry.get("step"),
        )


def _list_entry(what: str, value: Any, example: str) -> Any:
    """A schema entry that is a list, refused when it is a string or a mapping: ``tuple()`` read
    ``drop: pid`` as the columns 'p', 'i', 'd', and ``categories: "ny"`` as the classes n and y."""
    if isinstance(value, (str, bytes, Mapping)):
        raise SchemaError(f"{what} must be a list, got {value!r}: write it as a YAML list, e.g. {example}")
    return value


def _bounds_entry(name: Any, bounds: Any) -> tuple[float, float]:
    """A schema entry's ``bounds`` as two floats, refused by the column's name when they are not
    a list of two numbers."""
    wrong = SchemaError(f"column '{name}': bounds must be a list [low, high] of two numbers, got {bounds!r}")
    if isinstance(bounds, (str, bytes, Mapping)) or not isinstance(bounds, Sequence) or len(bounds) != 2:
        raise wrong
    if any(isinstance(b, bool) for b in bounds):
        raise wrong
    try:
        return tuple(float(b) for b in bounds)
    except (TypeError, ValueError) as error:
        raise wrong from error


#: What a column's ``to_dict()`` holds that does not change how rows are encoded: ``step`` only
#: shapes decoded values, ``source`` is provenance text
NOT_LAYOUT = ("step", "source")


def encoding_layout(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A schema's ``to_dict()`` without what does not change the encoding (:data:`NOT_LAYOUT`):
    two schemas with the same layout encode every row identically, so a checkpoint trained
    under one can be resumed, sampled and evaluated under the other (runs from before a
    built-in schema declared its steps keep decoding as they were trained, and a reworded
    source locks no run out). The file's columns listed as ``drop`` are never encoded: a DP
    estimate's schema holds none, the file it released lists them, and a resume under that file
    was refused as if its label or layout differed."""
    layout = {key: value for key, value in spec.items() if key != "drop"}
    layout["columns"] = [{k: v for k, v in column.items() if k not in NOT_LAYOUT} for column in spec.get("columns", [])]
    return layout


@dataclass(frozen=True)
class EncodingReport:
    """What encoding did to out-of-schema values: per-column clip and reject counts.

    ``clipped[name] = {"below": n, "above": m}`` counts values clipped to the bounds among the
    encoded rows; ``rejected[name]`` counts rows dropped because that column held a category
    outside the schema (a row with two unknown values counts in both columns). These are
    statistics of the private data, for the data holder only.
    """

    rows_in: int
    rows_encoded: int
    clipped: dict[str, dict[str, int]] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    #: rows kept with some column blank (``unknown="blank"``), among ``rows_encoded``
    rows_blanked: int = 0

    @property
    def rows_rejected(self) -> int:
        return self.rows_in - self.rows_encoded

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "rows_encoded": self.rows_encoded,
            "rows_rejected": self.rows_rejected,
            "rows_blanked": self.rows_blanked,
            "clipped": {name: dict(counts) for name, counts in self.clipped.items()},
            "rejected": dict(self.rejected),
        }

    def summary(self) -> str:
        """One line for logs: rows kept and the columns whose values were clipped or rejected."""
        clipped = {n: c["below"] + c["above"] for n, c in self.clipped.items() if c["below"] + c["above"]}
        rejected = {n: c for n, c in self.rejected.items() if c}
        blanked = f" ({self.rows_blanked} with an unknown category left blank)" if self.rows_blanked else ""
        return (
            f"encoded {self.rows_encoded}/{self.rows_in} rows{blanked}; "
            f"clipped values per column: {clipped or 'none'}; "
            f"{'blanked' if self.rows_blanked else 'rejected'} rows per column: {rejected or 'none'}"
        )


#: Why a schema file's yes/no categories may match no value of the data, and the fix.
YAML_BOOLEANS = ("YAML reads unquoted no/yes, true/false and on/off as booleans: quote the classes in the schema "
                 "file, e.g. ['no', 'yes']")


@dataclass(frozen=True)
class TableSchema:
    """The public description of a table: columns in order, the label and its kind.

    Args:
        columns: the columns, in the order of the encoded vector and of decoded frames.
        label: name of the label column (it is encoded as part of the record: GANs here
            generate whole rows), or ``None``.
        label_kind: ``"binary"`` (a categorical column with exactly two categories),
            ``"categorical"``, ``"continuous"`` (a numeric column), or ``None`` without label.
        drop: columns that may appear in the data and are ignored (identifiers, say); any
            other column not in the schema is an error rather than silently discarded.
    """

    columns: tuple[Column, ...]
    label: str | None = None
    label_kind: str | None = None
    drop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        columns = tuple(self.columns)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "drop", tuple(self.drop))
        if not columns or not all(isinstance(c, Column) for c in columns):
            raise SchemaError("a schema needs a non-empty sequence of Column objects")
        names = [c.name for c in columns]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise SchemaError(f"duplicate column names in schema: {duplicated}")
        overlap = sorted(set(self.drop) & set(names))
        if overlap:
            raise SchemaError(f"columns {overlap} are both schema columns and listed in drop")
        self._check_label()

    def _check_label(self) -> None:
        if self.label is None:
            if self.label_kind is not None:
                raise SchemaError(f"label_kind={self.label_kind!r} given without a label column")
            return
        if self.label not in self.names:
            raise SchemaError(f"label '{self.label}' is not one of the schema's columns {self.names}")
        if self.label_kind not in LABEL_KINDS:
            raise SchemaError(f"label_kind must be one of {LABEL_KINDS}, got {self.label_kind!r}")
        column = self.label_column
        if self.label_kind == "continuous" and not column.is_numeric:
            raise SchemaError(f"label '{self.label}' is continuous but the column is categorical")
        if self.label_kind in ("binary", "categorical") and column.is_numeric:
            raise SchemaError(f"label '{self.label}' is {self.label_kind} but the column is {column.kind}")
        if self.label_kind == "binary" and column.width != 2:
            raise SchemaError(
                f"label '{self.label}' must be binary (exactly 2 categories), "
                f"but the schema lists {column.width}: {list(column.categories)}"
            )
        if self.label_kind == "categorical" and column.width < 2:
            raise SchemaError(f"label '{self.label}' lists one class, {list(column.categories)}: a label to learn "
                              "needs at least two (list all of its classes)")

    # --- layout -----------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @cached_property
    def column_slices(self) -> dict[str, slice]:
        """Column name -> its slice of the encoded vector (generators and evaluators use it)."""
        slices, start = {}, 0
        for column in self.columns:
            slices[column.name] = slice(start, start + column.width)
            start += column.width
        return slices

    @property
    def encoded_dim(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def label_column(self) -> Column | None:
        return self.column(self.label) if self.label is not None else None

    @property
    def label_slice(self) -> slice | None:
        return self.column_slices[self.label] if self.label is not None else None

    @property
    def released_by_a_dp_estimate(self) -> bool:
        """Whether a column's source names a DP estimate: a schema file an earlier run released
        (``released_schema.yaml``), public now, though its estimate spent that run's budget."""
        return any(column.from_dp_estimate for column in self.columns)

    def without_label(self) -> TableSchema:
        """The features alone: the label leaves the columns and joins ``drop``, so frames that
        still hold it validate. QUAIL's synthesizer encodes records with it (the label is left
        to a separate DP label model)."""
        if self.label is None:
            raise SchemaError("the schema has no label column to leave out")
        features = tuple(c for c in self.columns if c.name != self.label)
        if not features:
            raise SchemaError(f"the label '{self.label}' is the schema's only column: no features are left")
        return TableSchema(columns=features, drop=self.drop + (self.label,))

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"no column '{name}' in schema; columns: {self.names}")

    # --- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping (YAML/JSON friendly) that :meth:`from_dict` reads back."""
        out: dict[str, Any] = {"label": self.label, "label_kind": self.label_kind}
        if self.drop:
            out["drop"] = list(self.drop)
        out["columns"] = [c.to_dict() for c in self.columns]
        return out

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> TableSchema:
        if not isinstance(spec, Mapping):
            raise SchemaError(f"a schema must be a mapping, got {type(spec).__name__}")
        unknown = set(spec) - {"columns", "label", "label_kind", "drop"}
        if unknown:
            raise SchemaError(f"unknown schema keys {sorted(unknown)}; expected columns, label, label_kind, drop")
        entries = spec.get("columns")
        if not isinstance(entries, Sequence) or isinstance(entries, str):
            raise SchemaError("a schema needs 'columns': a list of column entries")
        return cls(
            columns=tuple(Column.from_dict(entry) for entry in entries),
            label=spec.get("label"),
            label_kind=spec.get("label_kind"),
            drop=tuple(_list_entry("drop", spec.get("drop"), f"drop: [{spec.get('drop')}]") or ()),
        )

    @classmethod
    def load(cls, path: str | Path) -> TableSchema:
        """Read a schema from a ``.json`` file, or a YAML file (any other suffix)."""
        path = Path(path).expanduser()
        text = named_file_text(path, "schema file", SchemaError)
        try:
            if path.suffix.lower() == ".json":
                spec = json.loads(text, object_pairs_hook=refuse_repeated_json_keys)
            else:
                spec = yaml.load(text, Loader=PlainNumberLoader)
        except (json.JSONDecodeError, yaml.YAMLError, RepeatedKeyError) as err:
            raise SchemaError(f"schema file {path} cannot be parsed: {err}") from err
        except SchemaError as err:  # a number written so that YAML reads another
            raise SchemaError(f"schema file {path}, {err}") from err
        try:
            return cls.from_dict(spec)
        except SchemaError as err:
            raise SchemaError(f"schema file {path}: {err}") from err

    # --- validation --------------------------------------------------------------------------

    def validate_frame(self, frame: pd.DataFrame) -> None:
        """Raise :class:`SchemaError` unless ``frame`` has the schema's columns, clean and typed.

        Checked, in order: missing target, missing columns, unknown columns (not in the schema
        nor in ``drop``), missing values (NaN/None), and dtypes (numeric columns must be
        numeric, integer columns integral, categorical values of the categories' type).
        Constant columns are fine. Out-of-bounds values and unknown categories are *not* errors
        here; :meth:`encode` applies the clip/reject rule to them.
        """
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"expected a pandas DataFrame, got {type(frame).__name__}")
        duplicated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
        if duplicated:
            raise SchemaError(f"the data has duplicated column names: {duplicated}")
        if self.label is not None and self.label not in frame.columns:
            raise SchemaError(
                f"the target column '{self.label}' is missing from the data (columns: {list(frame.columns)})"
                + header_hint(frame, [self.label])
            )
        missing = [n for n in self.names if n not in frame.columns]
        unknown = [str(c) for c in frame.columns if c not in self.names and c not in self.drop]
        if missing:
            # a renamed column shows as one missing and one unknown: name both
            also = f" (and the data has columns the schema does not name: {unknown})" if unknown else ""
            raise SchemaError(f"columns missing from the data: {missing}{also}; the schema names every column the "
                              "data must hold: add them to the data, or remove them from the schema"
                              + header_hint(frame, missing))
        if unknown:
            raise SchemaError(
                f"unknown columns in the data: {unknown}; add them to the schema or list them in its 'drop' list"
            )
        counts = missing_value_counts(frame[self.names])
        if counts:
            raise SchemaError(f"missing values (NaN) in columns: {counts}; "
                              f"{missing_values_remedy(frame[self.names], self.label)}")
        for column in self.columns:
            _check_dtype(column, frame[column.name])

    # --- encoding ----------------------------------------------------------------------------

    def encode(self, frame: pd.DataFrame, unknown: str = "drop") -> tuple[torch.Tensor, EncodingReport]:
        """Encode ``frame`` into a float32 tensor of shape ``(rows kept, encoded_dim)`` in [0, 1].

        Numeric: ``(clip(x, low, high) - low) / (high - low)``; categorical: one-hot in the
        schema's category order. The map depends on the schema alone: each row's encoding is a
        function of that row, and no statistic of ``frame`` is read.

        Args:
            unknown: ``"drop"`` rejects rows holding a category outside the schema (counted in
                the report); ``"blank"`` keeps them, that column's block all zeros (counted in
                the report's ``rejected`` too); ``"error"`` raises instead.
        """
        keep, report, codes = self._checked_rows(frame, unknown)
        # float32 from the start (each float64 value rounded once, as astype would): one copy of
        # the table's width, not a float64 one and its float32 copy
        encoded = np.zeros((int(keep.sum()), self.encoded_dim), dtype=np.float32)
        for column in self.columns:
            block = self.column_slices[column.name]
            if column.is_numeric:
                values = frame[column.name].to_numpy(dtype=np.float64)[keep]
                low, high = column.bounds
                encoded[:, block.start] = (np.clip(values, low, high) - low) / (high - low)
            else:
                code = codes[column.name][keep]
                listed = np.flatnonzero(code >= 0)  # every row, unless unknown="blank" kept some
                encoded[listed, block.start + code[listed]] = 1.0
        return torch.from_numpy(encoded), report

    def kept_rows_report(self, frame: pd.DataFrame, unknown: str = "drop") -> tuple[np.ndarray, EncodingReport]:
        """What :meth:`encode` checks, keeps (a boolean mask) and reports, without the encoding:
        the mode-specific encoding and the DP histograms need the rows, not a dense copy of them
        (at a million rows of 868 encoded columns, 8 GB built and thrown away)."""
        keep, report, _ = self._checked_rows(frame, unknown)
        return keep, report

    def _checked_rows(self, frame: pd.DataFrame, unknown: str) -> tuple[np.ndarray, EncodingReport, dict[str, np.ndarray]]:
        """:meth:`encode`'s checks and rule: the kept-rows mask, the report, each categorical
        column's codes."""
        if unknown not in UNKNOWN_RULES:
            raise ValueError(f"unknown must be one of {UNKNOWN_RULES}, got {unknown!r}")
        self.validate_frame(frame)
        codes = {c.name: _category_codes(c, frame[c.name]) for c in self.columns if not c.is_numeric}
        rejected = {name: int((code < 0).sum()) for name, code in codes.items()}
        self._check_label_codes(codes, frame)
        if unknown == "error" and any(rejected.values()):
            bad = {name: count for name, count in rejected.items() if count}
            raise SchemaError(f"values outside the schema's categories (rows per column): {bad}")
        keep, known = _kept_rows(codes, len(frame), unknown)
        clipped = {}
        for column in self.columns:
            if column.is_numeric:
                values = frame[column.name].to_numpy(dtype=np.float64)[keep]
                low, high = column.bounds
                clipped[column.name] = {"below": int((values < low).sum()), "above": int((values > high).sum())}
        report = EncodingReport(len(frame), int(keep.sum()), clipped, rejected, int((keep & ~known).sum()))
        return keep, report, codes

    def label_values_outside_classes(self, frame: pd.DataFrame) -> pd.Series:
        """The values of a binary label in ``frame`` that are neither of its two classes, with
        their index (empty for another kind of label, or without one)."""
        if self.label_kind != "binary" or self.label not in frame:
            return pd.Series([], dtype=object)
        codes = _category_codes(self.label_column, frame[self.label])
        return frame[self.label][codes < 0]

    def label_class_counts(self, frame: pd.DataFrame) -> dict[Any, int]:
        """Rows of ``frame`` per class of a categorical label, matched as encoding matches them (a
        float 1.0 is the class 1), every class in the schema's order (0 for one it lacks)."""
        codes = _category_codes(self.label_column, frame[self.label])
        counts = np.bincount(codes[codes >= 0], minlength=len(self.label_column.categories))
        return {category: int(count) for category, count in zip(self.label_column.categories, counts)}

    def label_classes_held(self, frame: pd.DataFrame) -> list[Any]:
        """The classes of a categorical label that ``frame`` holds (see :meth:`label_class_counts`)."""
        return [category for category, count in self.label_class_counts(frame).items() if count]

    def _check_label_codes(self, codes: dict[str, np.ndarray], frame: pd.DataFrame) -> None:
        """Refuse a binary label holding a third value, naming the first such values and their rows
        (a trailing space, 'Yes ', reads like a class in the refusal's list otherwise)."""
        if self.label_kind != "binary":
            return
        outside = codes[self.label] < 0
        if outside.any():
            raise self.labels_outside_classes_error(f"{int(outside.sum())} rows", row_examples(frame[self.label][outside]))

    def boolean_category_columns(self) -> list[str]:
        """Categorical columns whose categories are all booleans: in a schema file, most likely
        unquoted yes/no that YAML read as True/False (see :data:`YAML_BOOLEANS`)."""
        return [column.name for column in self.columns
                if not column.is_numeric and all(isinstance(c, bool) for c in column.categories)]

    def labels_outside_classes_error(self, rows: str, examples: str = "", note: str = "") -> SchemaError:
        """The refusal of a binary label holding values outside its two classes in ``rows`` (e.g.
        "3 test rows"), with ``examples`` of them and a ``note`` on when the rows were checked."""
        classes = list(self.label_column.categories)
        yaml_booleans = f"; {YAML_BOOLEANS}" if self.label in self.boolean_category_columns() else ""
        return _refusal(
            f"the label '{self.label}' must be binary with classes {classes}, but {rows} hold other values"
            f"{f' ({examples})' if examples else ''}",
            f"fix or drop those rows{f' ({note})' if note else ''}, or, with a "
            f"schema file, declare the label categorical with all its classes there{yaml_booleans}"
        )

    def decode(self, data: torch.Tensor | np.ndarray) -> pd.DataFrame:
        """Map encoded records (e.g. generator output) back to a frame like the original.

        Columns come back with their names and in schema order. Numeric values are clipped to
        [0, 1] then rescaled into the bounds; integer columns are rounded and cast to int64;
        categorical columns take the argmax of their one-hot block and come back as a pandas
        ``Categorical`` with the schema's categories.
        """
        if isinstance(data, torch.Tensor):
            data = data.detach().cpu().double().numpy()
        array = np.asarray(data, dtype=np.float64)
        if array.ndim != 2 or array.shape[1] != self.encoded_dim:
            raise ValueError(f"expected an array of shape (n, {self.encoded_dim}), got {tuple(array.shape)}")
        if not np.isfinite(array).all():
            raise ValueError("cannot decode non-finite values (NaN/inf); the generator may have diverged")
        out = {}
        for column in self.columns:
            block = array[:, self.column_slices[column.name]]
            out[column.name] = _decode_column(column, block)
        return pd.DataFrame(out, columns=self.names)


def missing_value_counts(frame: pd.DataFrame) -> str:
    """``"age (1 rows: data row 7), color (2 rows: data rows 3, 9)"``: the columns of ``frame``
    with missing values (NaN/None), how many, and the first few by their place in the file (the
    frame's index, as read); empty when there are none."""
    gaps = frame.isna()
    counts = gaps.sum()
    return ", ".join(f"{name} ({count} rows{_data_rows(frame.index[gaps[name].to_numpy()])})"
                     for name, count in counts[counts > 0].items())


def _data_rows(index: pd.Index, shown: int = 3) -> str:
    """``": data rows 3, 9, ..."``: rows of the file by their 1-based place (the frame's integer
    index), the first ``shown``; nothing where the index is not the rows' places."""
    if not pd.api.types.is_integer_dtype(index.dtype):
        return ""
    rows = [str(int(place) + 1) for place in sorted(index)[:shown]]
    more = ", ..." if len(index) > shown else ""
    return f": data row{'s' if len(index) > 1 else ''} {', '.join(rows)}{more}"


def missing_values_remedy(frame: pd.DataFrame, target: Any = None) -> str:
    """What to do about the missing values of ``frame``: drop or impute those rows, or, for a
    column holding no value at all (where dropping its rows would drop them all), the column --
    unless it is the ``target``, which cannot be dropped: then another label column."""
    empty = [str(name) for name in frame.columns if len(frame) and frame[name].isna().all()]
    remedy = "drop or impute those rows first"
    features = [name for name in empty if target is None or name != str(target)]
    if features:
        remedy += (f"; {', '.join(repr(name) for name in features)} {'holds' if len(features) == 1 else 'hold'} no "
                   "value at all: drop the column instead (--data.drop, or the schema file's 'drop' list)")
    if len(features) < len(empty):
        remedy += (f"; the label column {str(target)!r} holds no value at all: it has nothing to learn from (a label "
                   "cannot be dropped): check the file (a CSV's label is the column --data.target names)")
    return remedy


def as_schema_categories(frame: pd.DataFrame, schema: TableSchema) -> pd.DataFrame:
    """Categorical columns read as text (``"1"``) turned into the schema's categories (``1`` where
    it lists numbers), one value at a time; a value the schema does not list stays text, an
    unknown category. CSV files do not say whether ``1`` is a number or a category."""
    frame = frame.copy()
    for column in schema.columns:
        if column.is_numeric or column.name not in frame.columns:
            continue
        by_text = {str(category): category for category in column.categories}
        frame[column.name] = frame[column.name].map(lambda value: by_text.get(value, value))
    return frame


def header_hint(frame: pd.DataFrame, wanted: Sequence[str] = ()) -> str:
    """A hint for a column the data seems to lack (``wanted``): the header read as one column (the
    file is likely not comma-separated), names with spaces around them (``age, label``), or a name
    written with other Unicode code points for the same letters (``é`` as one, or as e and an accent)."""
    if len(frame.columns) == 1 and any(mark in str(frame.columns[0]) for mark in ";\t|"):
        return "; the header read as a single column: the file must be comma-separated (convert it first)"
    spaced = [str(name) for name in frame.columns if str(name) != str(name).strip()]
    if spaced:
        return (f"; the header's names {spaced} have spaces around them, which are part of a name: remove them "
                "from the header")
    normal = {unicodedata.normalize("NFC", str(name)): str(name) for name in frame.columns}
    alike = [str(name) for name in wanted if name not in frame.columns and unicodedata.normalize("NFC", str(name)) in normal]
    if alike:
        return (f"; {alike} and the header's {[normal[unicodedata.normalize('NFC', name)] for name in alike]} look alike "
                "but are written with other Unicode code points (an accent as a letter of its own, or combined): "
                "write both the same way (NFC)")
    return ""


def row_examples(values: pd.Series, most: int = 3) -> str:
    """``"'abc' (data row 5)"``: the first of ``values`` with their row (the frame's index,
    counted from 1 after the header), for an error the data holder reads; '' when there are none."""
    return ", ".join(f"{value!r} (data row {index + 1 if isinstance(index, int) else index})"
                     for index, value in values.head(most).items())


def non_numeric_values(series: pd.Series) -> pd.Series:
    """The values of ``series`` that are not numbers (missing values aside), with their index."""
    return series[pd.to_numeric(series, errors="coerce").isna() & series.notna()]


#: a number written with a comma: thousands separators (11,858; 1,234,567.25) or a decimal comma
#: (0,125; 3,5), which a comma-separated file holds quoted; "2,500" may be either
_COMMA_NUMBER = re.compile(r"[+-]?(\d{1,3}(,\d{3})+(\.\d+)?|\d+,\d+)")


def comma_numbers(values: pd.Series) -> bool:
    """Whether every one of ``values`` (a numeric column's non-numbers) is a number written with a
    comma, as thousands separator or decimal mark: the fix is then the file's number format, not
    to call the column categorical."""
    return not values.empty and all(isinstance(value, str) and _COMMA_NUMBER.fullmatch(value.strip())
                                    for value in values)


def _beyond_64_bits(value: Any) -> bool:
    """A whole number (as a Python int, or text as pandas keeps it) no 64-bit integer holds."""
    try:
        number = int(value) if isinstance(value, (int, str)) else None
    except ValueError:
        return False
    return number is not None and not -(2**63) <= number < 2**64


def non_numeric_examples(series: pd.Series, most: int = 3) -> str:
    """The first values of ``series`` that are not numbers (:func:`row_examples`). A column read
    as text for a value in another split (the held-out rows) shows none here."""
    examples = row_examples(non_numeric_values(series), most)
    if examples:
        return examples
    huge = series[series.map(_beyond_64_bits)]
    if not huge.empty:  # pandas keeps them as Python objects: numbers, but no numeric column
        return f"whole numbers too large for 64 bits: {row_examples(huge, most)}"
    if series.map(lambda value: isinstance(value, str)).any():  # a frame built in Python, not read from a file
        return (f"read as {series.dtype}, though these rows' values are all numbers: the text is in other rows of the "
                "file, or the frame holds numbers as strings (pandas.to_numeric converts them)")
    return f"read as {series.dtype}: the text is in other rows of the file"


def check_numeric_values(name: str, kind: str, series: pd.Series, estimated: bool) -> None:
    """Refuse the values of a numeric column (``kind``: continuous or integer) that no encoding
    takes: booleans, text, ±inf, a fraction in an integer column, each named with its row.
    ``estimated``: no schema file, so the remedy is an option (a CSV checks its whole file so,
    before the split and any DP estimate; encoding checks the rows it encodes)."""
    if holds_booleans(series):
        raise booleans_refusal(name, kind, estimated)
    if not _holds_numbers(series):
        remedy = ("list the column with --data.categorical if it is categorical" if estimated
                  else "with a schema file, declare the column categorical there if it is")
        raise _refusal(f"column '{name}' is {kind} but holds non-numeric values ({non_numeric_examples(series)})",
                       f"fix those values in the data, or {remedy}")
    values = series.to_numpy(dtype=np.float64)
    infinite = np.isinf(values)  # missing values (NaN) have their own refusal
    if infinite.any():  # clipped to a bound, an infinity would pass for the bound itself
        count = int(infinite.sum())
        raise _refusal(f"column '{name}' holds infinite values ({count} row{'s' if count > 1 else ''}: "
                       f"{row_examples(series[infinite])})", "fix or drop those rows first")
    if kind == "integer":
        fractional = np.isfinite(values) & (values != np.round(values))
        if fractional.any():
            remedy = "leave it out of --data.integer" if estimated else "declare the column continuous in the schema"
            raise _refusal(f"column '{name}' is integer but {int(fractional.sum())} rows hold fractional values "
                           f"({row_examples(series[fractional])})", f"round them in the data, or {remedy}")


def _check_dtype(column: Column, series: pd.Series) -> None:
    """Refuse values of the wrong type, which would otherwise be silently clipped or rejected."""
    numeric = _holds_numbers(series)
    if column.is_numeric:
        check_numeric_values(column.name, column.kind, series, estimated=column.from_dp_estimate)
        return
    if all(isinstance(c, str) for c in column.categories) and numeric:
        raise SchemaError(f"column '{column.name}' has string categories but holds numbers (dtype {series.dtype})")
    numeric_categories = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in column.categories)
    if numeric_categories and not numeric:
        written = {str(category) for category in column.categories}
        unwritten = series[series.notna() & ~series.astype(str).isin(written)]
        if unwritten.empty and not series.map(lambda value: isinstance(value, str)).any():
            return  # numbers in an object column (a frame built by hand, a slice), each one of the categories
        as_numbers = pd.to_numeric(unwritten, errors="coerce")
        if len(unwritten) and not as_numbers.isin([float(c) for c in column.categories]).any():
            # "2" where the schema lists 0 and 1: a category outside the list, as unknown as a text
            # one (left blank, or refused by the rules for a label), not a category misspelt
            return
        examples = row_examples(unwritten)
        raise SchemaError(
            f"column '{column.name}' has numeric categories {list(column.categories)} but holds values not written as "
            f"one of them ({examples or f'read as {series.dtype}'}): a category is matched as the schema writes it "
            f"({', '.join(sorted(written))}), so write the values that way, or list them in the schema as they are written"
        )


def holds_booleans(series: pd.Series) -> bool:
    """pandas reads a column of True/False as booleans, which count as numbers (and one with a
    gap as objects holding them)."""
    return pd.api.types.is_bool_dtype(series) or (series.dtype == object and series.map(type).eq(bool).any())


def booleans_refusal(name: str, kind: str, estimated: bool, label: bool = False) -> SchemaError:
    """Why a numeric column of True/False is refused, and the remedy: with a schema file
    (``estimated`` False) it is declared there, else named with a flag (the ``label``'s kind, or
    the categorical columns)."""
    if estimated:
        remedy = "pass --data.label_kind binary" if label else f"list it with --data.categorical {as_flag_value(name)}"
    else:
        remedy = "declare it categorical in the schema file, its categories quoted as the file writes them ('True')"
    return _refusal(f"column '{name}' is {kind} but holds True/False, which would train as the numbers 1 and 0 and "
                    "come out as fractions", remedy)


def _holds_numbers(series: pd.Series) -> bool:
    dtype = series.cat.categories.dtype if isinstance(series.dtype, pd.CategoricalDtype) else series.dtype
    return pd.api.types.is_numeric_dtype(dtype)


def _kept_rows(codes: dict[str, np.ndarray], rows: int, unknown: str) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, known)`` masks: the rows whose every category is in the schema (``known``), and
    those the rule ``unknown`` keeps: all of them with ``"blank"``, else the known ones."""
    known = np.ones(rows, dtype=bool)
    for code in codes.values():
        known &= code >= 0
    return (np.ones(rows, dtype=bool) if unknown == "blank" else known), known


def _category_codes(column: Column, series: pd.Series) -> np.ndarray:
    """Index of each value in the schema's category list; -1 for values outside it."""
    values = series.astype(object) if isinstance(series.dtype, pd.CategoricalDtype) else series
    return pd.Categorical(values, categories=list(column.categories)).codes.astype(np.int64)


def _decode_column(column: Column, block: np.ndarray) -> np.ndarray | pd.Categorical:
    if not column.is_numeric:
        return pd.Categorical.from_codes(block.argmax(axis=1), categories=list(column.categories))
    low, high = column.bounds
    return column.typed(np.clip(block[:, 0], 0.0, 1.0) * (high - low) + low)
