"""Differentially private per-column histograms: where the noise of CTGAN-style modes is added.

Mode-specific normalization (CTGAN, CTAB-GAN+) fits a Gaussian mixture to every numeric column,
and training-by-sampling needs every categorical column's category frequencies. Fitted to the
private rows, both leak: a mixture component can sit on one outlier, and a frequency reveals
whether a rare category is present. Here the only thing read from the rows is one noisy count
histogram per column, released under ε-DP by the Laplace mechanism; the modes and the
frequencies are then computed from that release alone (post-processing, no further cost).
Sensitivity and noise (:func:`dp_column_histograms`): one record moves one bin of each of the
``d`` columns by 1, so the d histograms together have L1 sensitivity ``d``, and every bin,
empty or not, gets Laplace noise of scale ``d / ε``.

Neighbouring datasets differ by adding or removing one record, as in
:mod:`lightning_dpgan.data.dp_bounds`. Noise comes from ``rng``; leave it ``None`` in real use
so it is drawn from fresh OS entropy -- noise from a published seed can be subtracted again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpgan.data.schema import (
    UNKNOWN_RULES,
    Column,
    EncodingReport,
    SchemaError,
    TableSchema,
    _category_codes,
)
from lightning_dpgan.privacy.composition import ADD_REMOVE
from lightning_dpgan.privacy.validation import validate_positive

#: Most values a discrete column's grid may hold: each is a slot of the encoding and a bin here.
MAX_DISCRETE_VALUES = 256

#: the release's mechanism (add-remove neighbours: see the module docstring)
MECHANISM = "laplace column histograms"


@dataclass(frozen=True)
class NoisyHistogram:
    """One column's released histogram (noisy, so counts are floats and may be negative).

    Numeric columns: ``edges`` are the ``bins + 1`` equal-width edges over the column's public
    bounds -- in ``log(x - low + 1)`` space for a long-tail column (``log=True``) -- and
    ``counts`` the noisy count per bin of the values that are not special; each declared
    special value has its own noisy count in ``special_counts``. Categorical columns:
    ``counts[i]`` is the noisy count of ``categories[i]``. Discrete numeric columns (counted
    value by value over their public grid, :attr:`Column.grid`) are held like categorical
    ones: ``categories`` are the grid's values, ``edges`` is ``None``.
    """

    name: str
    counts: np.ndarray
    edges: np.ndarray | None = None
    categories: tuple[Any, ...] | None = None
    special_values: tuple[float, ...] = ()
    special_counts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    log: bool = False
    scale: float = 0.0  # the Laplace scale of the noise on every count (0: not known)

    @property
    def is_numeric(self) -> bool:
        return self.edges is not None

    def thresholded(self, scales: float) -> NoisyHistogram:
        """This histogram with every count below ``scales`` Laplace scales set to 0.

        Why: an empty bin's noise is positive half the time, with mean ``scale``, so clipping at
        0 alone leaves about ``scale / 2`` of invented mass in every empty bin. With 200 records
        of noise scale (DP-CTGAN on King: 20 columns at ε = 0.1) and most of 64 bins empty,
        that is a quarter of a column's mass, and mixtures fit modes to it (house prices of $5).
        A count survives ``k`` scales by noise alone with probability ``exp(-k) / 2`` (k = 3: 2.5 %), at
        the price of dropping real bins with fewer records than ``k * scale``. Post-processing
        of the release: it costs nothing. ``scales=0`` returns the histogram unchanged.
        """
        if isinstance(scales, bool) or not isinstance(scales, (int, float)) or not (math.isfinite(scales) and scales >= 0):
            raise ValueError(f"the threshold must be a finite number of scales >= 0, got {scales!r}")
        if scales == 0:
            return self
        if not self.scale > 0:
            raise ValueError(f"histogram '{self.name}' does not record its noise scale: it cannot be thresholded")
        cut = scales * self.scale
        return replace(self, counts=np.where(self.counts < cut, 0.0, self.counts),
                       special_counts=np.where(self.special_counts < cut, 0.0, self.special_counts))

    @property
    def kept_mass(self) -> float:
        """The records its counts (clipped at 0, special values included) still hold: after
        :meth:`thresholded`, compared with the public record count, how much of the column the
        modes and the calibration marginal read."""
        return float(np.clip(self.counts, 0.0, None).sum() + np.clip(self.special_counts, 0.0, None).sum())

    @property
    def kept_bins(self) -> int:
        """Bins and special values with a positive count."""
        return int((self.counts > 0).sum() + (self.special_counts > 0).sum())


def rows_in_schema(
    schema: TableSchema, frame: pd.DataFrame, unknown: str = "drop"
) -> tuple[pd.DataFrame, EncodingReport]:
    """The rows of ``frame`` that the schema encodes, and the schema's report on them.

    :meth:`TableSchema.kept_rows_report` runs all of :meth:`TableSchema.encode`'s checks and
    applies its rule (missing columns, dtypes, NaNs, a binary label's classes, unknown
    categories dropped, blank or an error), so a
    histogram or a mode-specific encoding sees exactly the rows the schema would keep. Whether
    a row is kept depends on that row alone, so histogramming only kept rows keeps each
    record's contribution to at most one bin per column.
    """
    if unknown not in UNKNOWN_RULES:
        raise ValueError(f"unknown must be one of {UNKNOWN_RULES}, got {unknown!r}")
    keep, report = schema.kept_rows_report(frame, unknown)
    return (frame if keep.all() else frame.loc[keep]), report


def log_transform(values: np.ndarray, low: float) -> np.ndarray:
    """``log(x - low + 1)``: the long-tail (CTAB-GAN+) transform, 0 at the lower bound."""
    return np.log1p(np.asarray(values, dtype=np.float64) - low)


def log_inverse(values: np.ndarray, low: float) -> np.ndarray:
    """Inverse of :func:`log_transform`."""
    return np.expm1(np.asarray(values, dtype=np.float64)) + low


def histogram_edges(column: Column, bins: int, log: bool) -> np.ndarray:
    """Equal-width edges over the column's public bounds (in log space for a long-tail column).

    They depend on the schema alone, never on the rows: that is what keeps each column's count
    vector at L1 sensitivity 1.
    """
    low, high = column.bounds
    top = float(log_transform(np.array([high]), low)[0]) if log else high
    return np.linspace(0.0 if log else low, top, bins + 1)


def dp_column_histograms(
    frame: pd.DataFrame,
    schema: TableSchema,
    epsilon: float,
    bins: int = 64,
    log_columns: Iterable[str] = (),
    special_values: Mapping[str, Sequence[float]] | None = None,
    rng: np.random.Generator | None = None,
    columns: Sequence[str] | None = None,
    unknown: str = "drop",
    discrete: Iterable[str] = (),
) -> tuple[dict[str, NoisyHistogram], dict[str, Any]]:
    """ε-DP count histograms of the ``d`` columns ``columns`` (default: all schema columns).

    Counted rows are those the schema keeps (:func:`rows_in_schema`); numeric values are
    clipped to their bounds first, as the schema's encoding does. Per column:

    - numeric: one bin per declared special value (exact match, e.g. 0 of a capital-gain
      column), and ``bins`` equal-width bins over the public bounds for the other values --
      over ``[0, log(high - low + 1)]`` of ``log(x - low + 1)`` for a long-tail column;
    - categorical: one count per schema category, in schema order;
    - discrete (``discrete`` names numeric columns with a public grid, :attr:`Column.grid`:
      whole numbers, or a continuous column's steps): one count per grid value, in order.

    **Sensitivity and noise.** Adding or removing one record changes exactly one bin of each of
    the ``d`` columns by 1, so the concatenation of all histograms has L1 sensitivity ``d``.
    Adding independent Laplace noise of scale ``d / epsilon`` to *every* bin (empty ones too,
    so which bins exist reveals nothing) makes the whole release ε-DP: the ``d`` columns
    share ``epsilon`` rather than each spending it. Nothing else about the rows is released.

    Returns:
        ``{name: NoisyHistogram}`` (noisy float counts, possibly negative: callers clip as
        post-processing) and the cost ``{"epsilon", "delta": 0.0, "mechanism", "neighbours"}``.
    """
    validate_positive("epsilon", epsilon)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
    names = list(schema.names if columns is None else columns)
    if not names:
        raise ValueError("dp_column_histograms needs at least one column")
    log_columns, discrete = set(log_columns), set(discrete)
    special_values = dict(special_values or {})
    check_column_roles(schema, special_values, log_columns, discrete)
    rng = rng if rng is not None else np.random.default_rng()
    # counts only rows with every category known ("blank" keeps the others for training, but a
    # row with no category has no bin): dropping a row depends on that row alone
    kept, _ = rows_in_schema(schema, frame, "drop" if unknown == "blank" else unknown)
    scale = len(names) / epsilon
    histograms = {}
    for name in names:
        column = schema.column(name)
        if name in discrete:
            histograms[name] = _grid_histogram(column, kept[name], scale, rng)
        elif column.is_numeric:
            histograms[name] = _numeric_histogram(
                column, kept[name], bins, name in log_columns, tuple(special_values.get(name, ())), scale, rng
            )
        else:
            histograms[name] = _categorical_histogram(column, kept[name], scale, rng)
    cost = {"epsilon": float(epsilon), "delta": 0.0, "mechanism": f"{MECHANISM} (L1 sensitivity {len(names)})",
            "neighbours": ADD_REMOVE}
    return histograms, cost


def check_column_roles(
    schema: TableSchema, special_values: Mapping[str, Sequence[float]], log_columns: Iterable[str],
    discrete: Iterable[str] = (),
) -> None:
    """Refuse mixed/long-tail/discrete declarations that name unknown or categorical columns,
    special values outside a column's bounds (they could never be encoded), and discrete
    columns without a public grid, with too many values, or declared mixed or long-tail too."""
    log_columns, discrete = list(log_columns), list(discrete)
    for role, names in (("mixed", list(special_values)), ("log_columns", log_columns),
                        ("discrete_columns", discrete)):
        unknown = [n for n in names if n not in schema.names]
        if unknown:
            raise SchemaError(f"{role} names columns {unknown} that are not in the schema {schema.names}")
        categorical = [n for n in names if not schema.column(n).is_numeric]
        if categorical:
            raise SchemaError(f"{role} names categorical columns {categorical}; only numeric columns can be {role}")
    for name, values in special_values.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise SchemaError(f"mixed column '{name}' needs a non-empty list of special values, got {values!r}")
        low, high = schema.column(name).bounds
        bad = [v for v in values if not isinstance(v, (int, float)) or isinstance(v, bool) or not low <= v <= high]
        if bad:
            raise SchemaError(f"mixed column '{name}': special values {bad} are not numbers within its bounds {(low, high)}")
        if len(set(float(v) for v in values)) != len(values):
            raise SchemaError(f"mixed column '{name}': special values must be distinct, got {list(values)}")
    _check_discrete(schema, discrete, set(special_values) | set(log_columns))


def _check_discrete(schema: TableSchema, discrete: Sequence[str], other_roles: set[str]) -> None:
    for name in discrete:
        size = schema.column(name).grid_size  # counted, not built: a wide column is refused at once
        if size is None:
            raise SchemaError(f"discrete column '{name}' has no public grid of values: declare it integer, "
                              "or give the continuous column a step")
        if size > MAX_DISCRETE_VALUES:
            raise SchemaError(f"discrete column '{name}' can hold {size} values; at most "
                              f"{MAX_DISCRETE_VALUES} are encoded one slot each (leave it mode-specific)")
        if name in other_roles:
            raise SchemaError(f"column '{name}' is declared discrete and mixed or long-tail: choose one")


def _numeric_histogram(
    column: Column,
    series: pd.Series,
    bins: int,
    log: bool,
    specials: tuple[float, ...],
    scale: float,
    rng: np.random.Generator,
) -> NoisyHistogram:
    low, high = column.bounds
    values = np.clip(series.to_numpy(dtype=np.float64), low, high)
    special_counts = np.array([np.sum(values == s) for s in specials], dtype=np.float64)
    regular = values[~np.isin(values, specials)] if specials else values
    edges = histogram_edges(column, bins, log)
    points = log_transform(regular, low) if log else regular
    index = np.clip(np.searchsorted(edges, points, side="right") - 1, 0, bins - 1)
    counts = np.bincount(index, minlength=bins).astype(np.float64)
    return NoisyHistogram(
        name=column.name,
        counts=counts + rng.laplace(0.0, scale, size=bins),
        edges=edges,
        special_values=tuple(float(s) for s in specials),
        special_counts=special_counts + rng.laplace(0.0, scale, size=len(specials)),
        log=log,
        scale=scale,
    )


def _grid_histogram(column: Column, series: pd.Series, scale: float, rng: np.random.Generator) -> NoisyHistogram:
    """One count per value of the column's public grid (a value off it counts at the nearest)."""
    grid = column.grid
    counts = np.bincount(column.grid_codes(series.to_numpy(dtype=np.float64)), minlength=len(grid)).astype(np.float64)
    return NoisyHistogram(
        name=column.name,
        counts=counts + rng.laplace(0.0, scale, size=len(grid)),
        categories=tuple(grid.tolist()),
        scale=scale,
    )


def _categorical_histogram(column: Column, series: pd.Series, scale: float, rng: np.random.Generator) -> NoisyHistogram:
    codes = _category_codes(column, series)
    counts = np.bincount(codes[codes >= 0], minlength=column.width).astype(np.float64)
    return NoisyHistogram(
        name=column.name,
        counts=counts + rng.laplace(0.0, scale, size=column.width),
        categories=column.categories,
        scale=scale,
    )
