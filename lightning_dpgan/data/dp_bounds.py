"""Differentially private estimates of a table's schema, for data without a public one.

A schema's bounds and category lists must not be read off the private rows: the maximum of a
column *is* one record's value, and the set of categories seen reveals every rare value. When
the data holder has no public schema, these mechanisms estimate one with a stated privacy cost
that is added to the run's total.

Neighbouring datasets differ by adding or removing one record (the notion DP-SGD's accounting
uses too). Every mechanism draws its noise from ``rng``; leave it ``None`` in real use so the
noise comes from fresh OS entropy -- noise from a published seed can be subtracted again.

Mechanisms:

- :func:`dp_numeric_bounds` -- Laplace histogram over a fixed geometric grid, pure ε-DP: L1
  sensitivity 1 (one record moves one bin count by 1), Laplace(1/ε) on every bin.
- :func:`dp_categories` -- stability-based histogram, (ε, δ)-DP: Laplace(1/ε) on each observed
  value's count (sensitivity 1), released above a threshold a count of 1 passes with
  probability ≤ δ (Korolova, Kenthapadi, Mishra
  & Ntoulas, "Releasing search queries and clicks privately", WWW 2009; Bun, Nissim & Stemmer,
  "Simultaneous private learning of multiple concepts", ITCS 2016; Vadhan, "The complexity of
  differential privacy", 2017, sec. 3.3).
- :func:`infer_schema_dp` -- one of the two per column, ε split evenly (basic composition): each
  of the m columns spends ε/m, so its noise scale is m/ε.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpgan.data.schema import (DP_ESTIMATE_SOURCE, LABEL_KINDS, Column, SchemaError, TableSchema, as_flag_value,
                                         missing_value_counts, missing_values_remedy,
                                         non_numeric_examples, header_hint)
from lightning_dpgan.privacy.composition import ADD_REMOVE
from lightning_dpgan.privacy.validation import validate_delta, validate_positive

log = logging.getLogger(__name__)

#: the schema estimate's mechanism (add-remove neighbours, as every mechanism here: see the module docstring), as its cost names it
SCHEMA_MECHANISM = "DP schema estimation (basic composition over columns)"

#: Candidate magnitudes 2**k of the bounds grid: from about 0.001 to about 1.1e12.
GRID_EXPONENTS = range(-10, 41)
#: Default fraction of the (noisy) mass that the estimated bounds may leave out (to be clipped).
DEFAULT_ALPHA = 0.01
#: The way out of a DP estimate that released too little (the budget is split evenly over the
#: columns; an attempt spends its budget whether or not the run goes on, see docs/privacy.md)
RAISE_BUDGET = "raise --data.bounds_epsilon (split evenly over the columns) or pass --data.schema, a schema file"
#: Said with a refusal read off the estimate's own noisy releases: they were drawn from the rows,
#: and the refusal itself is their output, so the budget is spent though nothing was trained.
SPENT_ON_A_REFUSED_ESTIMATE = (". This refusal is read off the estimate's noisy releases, drawn from the rows: count "
                               "--data.bounds_epsilon and --data.bounds_delta as spent on this data (no run records "
                               "them), and a rerun's estimate as spent again")
#: Probability that any empty bin of the grid survives the noise threshold. Such a bin may lie
#: anywhere on the grid, and in a small table its noisy count passes ``alpha`` of the kept mass,
#: so the bounds stretch across the grid to cover it: at 0.05, bounds of an 18-89 column of 300
#: rows reached about -2e6 in 3 % of estimates (thousands of draws, epsilon 0.25 and 1 per
#: column); at 0.01 in about 0.5 %. The price: thin real tail bins are dropped more often (a
#: gamma-distributed column of 300 rows at epsilon 0.25 keeps 89 % of its values inside on
#: average, against 92 %; at epsilon 1, 97 % either way). Weighing bins by their count above the
#: threshold instead clipped far more of such a column.
_FALSE_BIN_PROBABILITY = 0.01


def geometric_grid() -> np.ndarray:
    """Bin edges ``-2^K, ..., -2^k0, 0, 2^k0, ..., 2^K`` over :data:`GRID_EXPONENTS`.

    The grid is fixed before any data is seen (that is what keeps the histogram's sensitivity
    at 1): magnitudes double from bin to bin, so one grid serves columns in cents and in
    millions, at the price of bounds that are accurate to a factor of two.
    """
    magnitudes = np.array([2.0**k for k in GRID_EXPONENTS])
    return np.concatenate([-magnitudes[::-1], [0.0], magnitudes])


def dp_numeric_bounds(
    values: Sequence[float] | np.ndarray | pd.Series,
    epsilon: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    rng: np.random.Generator | None = None,
) -> tuple[tuple[float, float], dict[str, Any]]:
    """ε-DP bounds ``(low, high)`` of a numeric column, and the privacy cost spent.

    Mechanism: count the values per bin of the fixed :func:`geometric_grid` (values beyond the
    outermost edges count in the outermost bins), add Laplace(1/ε) noise to every bin count --
    under add/remove-one the count vector changes by 1 in one bin, so L1 sensitivity is 1 and
    the noisy histogram is ε-DP -- then, as post-processing, zero the bins whose noisy count is
    below the threshold ``ln(B / (2·0.01)) / ε`` (B bins: an empty bin survives with
    probability ≤ 0.01 in all), and return the narrowest run of consecutive bins holding at
    least ``1 - alpha`` of the remaining noisy mass. If no bin survives, the bin with the
    largest noisy count is returned. Values outside the result are clipped at encoding.
    """
    validate_positive("epsilon", epsilon)
    if not 0 <= alpha < 1:
        raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
    rng = rng if rng is not None else np.random.default_rng()
    edges = geometric_grid()
    n_bins = len(edges) - 1
    data = np.asarray(values, dtype=np.float64)
    bins = np.clip(np.searchsorted(edges, data, side="right") - 1, 0, n_bins - 1)
    noisy = np.bincount(bins, minlength=n_bins) + rng.laplace(0.0, 1.0 / epsilon, size=n_bins)
    threshold = math.log(n_bins / (2 * _FALSE_BIN_PROBABILITY)) / epsilon
    kept = np.where(noisy >= threshold, noisy, 0.0)
    first, last = _narrowest_covering_run(edges, kept, 1.0 - alpha) if kept.sum() > 0 else (noisy.argmax(),) * 2
    cost = {"epsilon": float(epsilon), "delta": 0.0, "mechanism": "laplace histogram on a geometric grid"}
    return (float(edges[first]), float(edges[last + 1])), cost


def _narrowest_covering_run(edges: np.ndarray, mass: np.ndarray, coverage: float) -> tuple[int, int]:
    """Bins ``first..last`` of smallest total width whose mass is ≥ ``coverage`` of the total."""
    cumulative = np.concatenate([[0.0], np.cumsum(mass)])
    target = coverage * cumulative[-1]
    best = (0, len(mass) - 1)
    for first in range(len(mass)):
        reach = np.nonzero(cumulative[first + 1 :] - cumulative[first] >= target * (1 - 1e-12))[0]
        if len(reach):
            last = first + int(reach[0])
            if edges[last + 1] - edges[first] < edges[best[1] + 1] - edges[best[0]]:
                best = (first, last)
    return best


def stability_threshold(epsilon: float, delta: float) -> float:
    """Noisy-count threshold τ = 1 + ln(1/(2δ))/ε of the stability-based histogram.

    A value held by a single record has true count 1; it is released only if its
    Laplace(1/ε) noise exceeds τ - 1, which happens with probability ½·exp(-ε(τ - 1)) = δ.
    """
    return 1.0 + math.log(1.0 / (2.0 * delta)) / epsilon


def dp_categories(
    values: Sequence[Any] | np.ndarray | pd.Series,
    epsilon: float,
    delta: float,
    *,
    rng: np.random.Generator | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """(ε, δ)-DP category list of a categorical column, and the privacy cost spent.

    Mechanism (stability-based histogram): count each value *observed* in the data, add
    Laplace(1/ε) noise to each count, and release the values whose noisy count exceeds
    :func:`stability_threshold`. Counts of values present in both neighbours differ by at most
    1 in one place (ε-DP by the Laplace mechanism); a value present in only one neighbour has
    count 1 there and is released with probability ≤ δ -- hence (ε, δ)-DP. The noisy counts
    themselves are not released. Values come back sorted (a data-independent order).
    """
    validate_positive("epsilon", epsilon)
    validate_delta(delta, flag="delta")
    rng = rng if rng is not None else np.random.default_rng()
    counts = pd.Series(values).value_counts(sort=False)
    noisy = counts.to_numpy(dtype=np.float64) + rng.laplace(0.0, 1.0 / epsilon, size=len(counts))
    kept = counts.index[noisy > stability_threshold(epsilon, delta)]
    released = [value.item() if isinstance(value, np.generic) else value for value in kept]
    cost = {"epsilon": float(epsilon), "delta": float(delta), "mechanism": "stability-based histogram"}
    return _sorted(released), cost


def _sorted(values: list[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types: order by type, then text
        return sorted(values, key=lambda v: (type(v).__name__, str(v)))


def infer_schema_dp(
    frame: pd.DataFrame,
    target: str,
    categorical: Sequence[str],
    epsilon: float,
    delta: float,
    label_kind: str,
    *,
    integer: Sequence[str] = (),
    drop: Sequence[str] = (),
    alpha: float = DEFAULT_ALPHA,
    rng: np.random.Generator | None = None,
) -> tuple[TableSchema, dict[str, Any]]:
    """Estimate a :class:`TableSchema` for ``frame`` under (ε, δ)-DP; return it and its cost.

    Every column of ``frame`` except ``drop`` gets a schema entry: ``categorical`` columns (and
    a ``binary``/``categorical`` target) through :func:`dp_categories`, the others through
    :func:`dp_numeric_bounds` as ``"continuous"`` -- or ``"integer"`` when listed in
    ``integer``; whether a column is integral is not read from the data (one fractional value
    would change it). By basic composition the budget is split evenly: each of the m columns
    spends ε/m, each of the c categorical columns δ/c, so the total is exactly ε and δ (δ is 0
    without categorical columns). Which columns are categorical is the caller's public choice.

    Raises:
        SchemaError: missing target or listed columns, NaNs, a non-numeric column not listed
            as categorical, or a label that does not come out as the requested kind (e.g. a
            binary label whose DP category list does not have exactly two classes).
    """
    validate_positive("epsilon", epsilon)
    if label_kind not in LABEL_KINDS:
        raise SchemaError(f"label_kind must be one of {LABEL_KINDS}, got {label_kind!r}")
    names = _schema_columns(frame, target, categorical, integer, drop)
    if label_kind == "continuous" and target in categorical:
        raise SchemaError(f"the target '{target}' is continuous but listed as categorical")
    categorical = set(categorical) | ({target} if label_kind != "continuous" else set())
    n_categorical = sum(name in categorical for name in names)
    if n_categorical:
        validate_delta(delta, flag="delta")
    rng = rng if rng is not None else np.random.default_rng()
    eps_column = epsilon / len(names)
    delta_column = delta / n_categorical if n_categorical else 0.0
    columns, costs = [], {}
    for name in names:
        column, costs[name] = _infer_column(
            frame[name], name in categorical, name in integer, eps_column, delta_column, alpha, rng, name == target
        )
        columns.append(column)
    schema = _labelled_schema(columns, target, label_kind, drop)
    cost = {
        "epsilon": float(epsilon),
        "delta": float(delta) if n_categorical else 0.0,
        "mechanism": SCHEMA_MECHANISM,
        "neighbours": ADD_REMOVE,
        "columns": costs,
    }
    return schema, cost


def check_listed_columns(
    frame: pd.DataFrame, target: str, categorical: Sequence[str], integer: Sequence[str], drop: Sequence[str]
) -> None:
    """Refuse a target that is dropped or absent, and a listed column the file does not have (a
    typo), before any check of the columns' values, whose messages would mislead."""
    if target in drop:
        raise SchemaError(f"the target '{target}' cannot be dropped")
    if target not in frame.columns:
        raise SchemaError(f"the target column '{target}' is missing from the data (columns: {list(frame.columns)})"
                          + header_hint(frame, [target]))
    for role, listed in (("categorical", categorical), ("integer", integer), ("drop", drop)):
        missing = [name for name in listed if name not in frame.columns]
        if missing:
            raise SchemaError(f"{role} columns {missing} are not in the data (columns: {list(frame.columns)})"
                              + header_hint(frame, missing))
    both = sorted(set(categorical) & set(integer))
    if both:
        raise SchemaError(f"columns {both} are listed both as categorical and as integer")
    for role, listed in (("categorical", categorical), ("integer", integer)):
        dropped = sorted(set(listed) & set(drop))
        if dropped:
            raise SchemaError(f"columns {dropped} are listed both as {role} and in --data.drop: keep them, or drop them")


def _schema_columns(
    frame: pd.DataFrame, target: str, categorical: Sequence[str], integer: Sequence[str], drop: Sequence[str]
) -> list[str]:
    """The columns to describe, after checks that need no statistic beyond clean-data errors."""
    check_listed_columns(frame, target, categorical, integer, drop)
    names = [str(name) for name in frame.columns if name not in drop]
    if counts := missing_value_counts(frame[names]):
        raise SchemaError(f"missing values (NaN) in columns: {counts}; {missing_values_remedy(frame[names], target)}")
    return names


def _infer_column(
    series: pd.Series,
    is_categorical: bool,
    is_integer: bool,
    epsilon: float,
    delta: float,
    alpha: float,
    rng: np.random.Generator,
    is_label: bool = False,
) -> tuple[Column, dict[str, Any]]:
    name = str(series.name)
    if is_categorical:
        categories, cost = dp_categories(series, epsilon, delta, rng=rng)
        if not categories:
            rest = ("the label's classes listed, or check --data.target and --data.label_kind (a numeric label "
                    "is --data.label_kind continuous)" if is_label else
                    "the public category list. No budget releases the values of an ID or free-text column (each held "
                    f"by a row or a few): leave such a column out with --data.drop {as_flag_value(name)}")
            raise SchemaError(
                f"no category of {'the label ' if is_label else ''}column '{name}' passed the DP threshold "
                f"(ε={epsilon:.3g}, δ={delta:.3g} for this column: a category needs about "
                f"{stability_threshold(epsilon, delta):.0f} training rows to pass): {RAISE_BUDGET} with {rest}"
                f"{SPENT_ON_A_REFUSED_ESTIMATE}"
            )
        if twins := spelling_twins(categories):  # read off the release alone: post-processing, no cost
            log.warning("column '%s': the DP estimate released categories that differ only in spaces or case (%s): "
                        "each is a category of its own; clean the file if they are one", name,
                        "; ".join(" / ".join(repr(c) for c in group) for group in twins))
        return Column(name, "categorical", categories=categories, source=f"{DP_ESTIMATE_SOURCE}: {cost['mechanism']}"), cost
    if not pd.api.types.is_numeric_dtype(series.dtype):
        raise SchemaError(f"column '{name}' holds non-numeric values ({non_numeric_examples(series)}): fix those "
                          "values in the data, or list the column with --data.categorical if it is categorical")
    (low, high), cost = dp_numeric_bounds(series, epsilon, alpha=alpha, rng=rng)
    kind = "integer" if is_integer else "continuous"
    if is_integer:
        low, high = float(math.floor(low)), float(math.ceil(high))
    return Column(name, kind, bounds=(low, high), source=f"{DP_ESTIMATE_SOURCE}: {cost['mechanism']}"), cost


def spelling_twins(categories: Sequence[Any]) -> list[list[Any]]:
    """Groups of text categories that are equal once stripped and case-folded (``"F"``, ``"F "``)."""
    groups: dict[str, list[Any]] = {}
    for category in categories:
        if isinstance(category, str):
            groups.setdefault(category.strip().casefold(), []).append(category)
    return [group for group in groups.values() if len(group) > 1]


def _labelled_schema(columns: list[Column], target: str, label_kind: str, drop: Sequence[str]) -> TableSchema:
    try:
        return TableSchema(columns, label=target, label_kind=label_kind, drop=tuple(drop))
    except SchemaError as err:
        label = next((column for column in columns if column.name == target), None)
        if label_kind == "binary" and label is not None and len(label.categories or ()) > 2:  # no budget removes a class
            raise SchemaError(f"{err} (DP estimate: the file's label holds more than two classes; declare it "
                              "--data.label_kind categorical, or give a schema file with its "
                              f"classes){SPENT_ON_A_REFUSED_ESTIMATE}") from err
        raise SchemaError(f"{err} (DP estimate; classes rarer than the threshold are not released: if the file "
                          f"holds more classes, {RAISE_BUDGET} with the public classes; a label the file gives one "
                          f"class only cannot be learnt){SPENT_ON_A_REFUSED_ESTIMATE}") from err
