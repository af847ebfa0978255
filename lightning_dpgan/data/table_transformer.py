"""CTGAN / CTAB-GAN+ encoding of a table, with every data-dependent part released under DP.

A :class:`TableTransformer` encodes the rows of a :class:`TableSchema` the way CTGAN (Xu et al.
2019) and CTAB-GAN+ (Zhao et al. 2022; the encoding DP-SACTGAN adopts) do:

- **categorical** column -> one-hot in the schema's category order (a softmax span);
- **discrete** numeric column (declared, as CTGAN's ``discrete_columns``: an integer column or a
  continuous one with a step, whose values are few, e.g. King's grade 1-13) -> one-hot over its
  public grid (:attr:`Column.grid`), like a categorical column, conditions included; decoded
  back to the number. A mixture of modes spreads such a column's mass between its values;
  one slot per value keeps each value's share;
- **continuous / integer** column -> ``[alpha, mode one-hot]``: mode-specific normalization
  (:class:`~lightning_dpgan.data.modes.ModeSpecificNormalizer`), alpha a tanh span of width 1,
  the mode a softmax span;
- **mixed** column (CTAB-GAN+: declared special values, e.g. 0 of capital-gain, which are
  categories inside a numeric column) -> ``[alpha, one-hot over special values + modes]``, with
  alpha = 0 for a special value;
- **long-tail** column (CTAB-GAN+'s log columns) -> ``log(x - low + 1)`` before the mode-specific
  normalization, inverted on decoding and clipped to the bounds;
- the **label of a continuous-label task** (``schema.label_kind == "continuous"``) -> by default
  a single min-max scalar in [-1, 1] (a tanh span; in log space if it is a long-tail column), so
  an auxiliary regressor (DP-SACTGAN) has exactly one number to predict and one to read back;
  with ``label_scalar=False`` it is encoded like any numeric column (mode-specific). A generator
  then places the label by a softmax over its modes, not by one precise tanh value: a scalar
  over King's log-price bounds must sit near 0.6 of a range that holds no data below 0.4, and
  under DP noise the generators measured here did not get it there.

Privacy. CTGAN fits its modes and its conditional sampler's category frequencies to the private
rows; both would leak outside the training accountant. Here the only read of the rows is
:func:`~lightning_dpgan.data.dp_histogram.dp_column_histograms` -- one Laplace histogram per
column, ε-DP as a whole -- and the modes and frequencies are post-processing of it
(:meth:`TableTransformer.fit_dp` returns its cost). :meth:`TableTransformer.from_bounds` reads no
row: one mode per column spanning the public bounds (a min-max encoding), uniform frequencies.
Encoding a record is then a function of that record alone (its mode draws hash its own values), so
training on the encoded rows is as private as training on the rows themselves. Values outside a
numeric column's bounds are clipped and rows with unknown categories follow the schema's rule
(:func:`~lightning_dpgan.data.dp_histogram.rows_in_schema`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import torch

from lightning_dpgan.data.dp_histogram import (
    NoisyHistogram,
    check_column_roles,
    dp_column_histograms,
    log_inverse,
    log_transform,
    rows_in_schema,
)
from lightning_dpgan.data.marginal_calibration import Marginal
from lightning_dpgan.data.modes import MAX_MODES, ModeSpecificNormalizer
from lightning_dpgan.data.schema import Column, EncodingReport, SchemaError, TableSchema, _category_codes

log = logging.getLogger(__name__)

FORMAT = "lightning_dpgan.table_transformer/1"
MODES = ("dp", "bounds")
TANH, SOFTMAX = "tanh", "softmax"
CATEGORICAL, MODE_SPECIFIC, LABEL_SCALAR, DISCRETE = "categorical", "mode-specific", "label-scalar", "discrete"
#: Encodings held as a one-hot block: the columns CTGAN's conditional vector chooses from.
ONE_HOT = (CATEGORICAL, DISCRETE)
ENCODINGS = (CATEGORICAL, MODE_SPECIFIC, LABEL_SCALAR, DISCRETE)


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijective scramble of 64-bit integers (wrapping arithmetic)."""
    z = (values + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
    return z ^ (z >> np.uint64(31))


def record_uniforms(frame: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """``(rows, columns)`` pseudo-uniform draws in [0, 1), each a function of its own row's
    values, the column's position and ``seed`` alone.

    Why not one seeded generator over the rows: then a row's draw depends on how many rows came
    before it, so adding or removing one record would change the encoding of every later one,
    and the encoded tables of two neighbouring datasets would differ in thousands of records --
    DP-SGD's guarantee on the encoded rows would no longer be one about the records. A hash of
    the row keeps the encoding a function of each record alone (identical records get identical
    draws), and a fixed public seed is fine: the draw is not privacy noise. The values are hashed
    as numbers (float64) or text, never in the dtype pandas inferred for their column: that
    depends on the other rows (one 30.5 makes a column of whole numbers float, whose 5 hashes
    apart from the integer 5).
    """
    values = pd.DataFrame({index: (column.astype(np.float64) + 0.0 if pd.api.types.is_numeric_dtype(column)  # -0 as 0
                                   and not isinstance(column.dtype, pd.CategoricalDtype) else column.astype(str))
                           for index, (_, column) in enumerate(frame.items())})
    with np.errstate(over="ignore"):
        rows = pd.util.hash_pandas_object(values, index=False).to_numpy(dtype=np.uint64)
        columns = _splitmix64(np.arange(frame.shape[1], dtype=np.uint64) + np.uint64(seed) * np.uint64(frame.shape[1] + 1))
        mixed = _splitmix64(rows[:, None] ^ columns[None, :])
    return (mixed >> np.uint64(11)).astype(np.float64) / float(2 ** 53)


def schema_values(schema: TableSchema, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s schema columns as the schema reads them, what :func:`record_uniforms` hashes: a
    categorical value as its index in the schema's list (-1 outside it), a numeric one as a float.
    Hashing the values as read made a record's draws depend on the other rows: a schema file's
    categories [0, 1] are numbers, so one row holding an unlisted "2" turned the column's dtype
    from int64 to object, its 1s hashed as text rather than as 1.0, and that one record re-drew the
    modes of about half the others."""
    return pd.DataFrame({column.name: (_category_codes(column, frame[column.name]) if not column.is_numeric
                                       else frame[column.name].to_numpy(dtype=np.float64))
                         for column in schema.columns}, index=frame.index)


@dataclass(frozen=True)
class ColumnEncoder:
    """How one column is encoded: its encoding kind and what was fitted for it.

    ``normalizer``, ``special_values`` and ``log`` serve mode-specific columns; ``frequencies``
    (the DP category or grid-value frequencies, or uniform) serve categorical and discrete ones.
    ``marginal`` is a numeric column's released distribution (the DP histogram it was fitted
    on), which :meth:`TableTransformer.decode` calibrates generated values to when asked.
    """

    column: Column
    encoding: str
    normalizer: ModeSpecificNormalizer | None = None
    special_values: tuple[float, ...] = ()
    log: bool = False
    frequencies: tuple[float, ...] | None = None
    marginal: Marginal | None = None

    @property
    def spans(self) -> list[tuple[int, str]]:
        """``(width, activation)`` of this column's slots, in order."""
        if self.encoding == CATEGORICAL:
            return [(self.column.width, SOFTMAX)]
        if self.encoding == DISCRETE:
            return [(self.column.grid_size, SOFTMAX)]
        if self.encoding == LABEL_SCALAR:
            return [(1, TANH)]
        return [(1, TANH), (len(self.special_values) + self.normalizer.n_modes, SOFTMAX)]

    @property
    def width(self) -> int:
        return sum(width for width, _ in self.spans)

    # --- numeric helpers ---------------------------------------------------------------------

    def _to_space(self, values: np.ndarray) -> np.ndarray:
        """Clipped values in the space the modes live in (log space for long-tail columns)."""
        low, high = self.column.bounds
        clipped = np.clip(values, low, high)
        return log_transform(clipped, low) if self.log else clipped

    def _from_space(self, values: np.ndarray) -> np.ndarray:
        low, high = self.column.bounds
        return np.clip(log_inverse(values, low) if self.log else values, low, high)

    def _space_bounds(self) -> tuple[float, float]:
        low, high = self.column.bounds
        return (0.0, float(log_transform(np.array([high]), low)[0])) if self.log else (low, high)

    # --- encode / decode ---------------------------------------------------------------------

    def encode(self, series: pd.Series, uniforms: np.ndarray) -> np.ndarray:
        """This column's block, shape ``(rows, width)``; rows already cleaned by the schema.
        ``uniforms``: each row's draw in [0, 1) for the mode of a mode-specific value."""
        if self.encoding == CATEGORICAL:
            codes = pd.Categorical(_plain(series), categories=list(self.column.categories)).codes
            block = np.zeros((len(series), self.width))
            known = np.flatnonzero(codes >= 0)  # an unknown category (kept with unknown="blank") stays all zeros
            block[known, codes[known]] = 1.0
            return block
        values = series.to_numpy(dtype=np.float64)
        if self.encoding == DISCRETE:
            block = np.zeros((len(values), self.width))
            block[np.arange(len(values)), self.column.grid_codes(values)] = 1.0
            return block
        if self.encoding == LABEL_SCALAR:
            low, high = self._space_bounds()
            return (2.0 * (self._to_space(values) - low) / (high - low) - 1.0).reshape(-1, 1)
        return self._encode_mode_specific(np.clip(values, *self.column.bounds), uniforms)

    def _encode_mode_specific(self, values: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        n_special = len(self.special_values)
        block = np.zeros((len(values), self.width))
        special = np.full(len(values), -1)
        for index, value in enumerate(self.special_values):
            special[values == value] = index
        regular = special < 0
        alpha, modes = self.normalizer.transform(self._to_space(values[regular]), uniforms[regular])
        block[regular, 0] = alpha
        block[np.flatnonzero(regular), 1 + n_special + modes] = 1.0
        block[np.flatnonzero(~regular), 1 + special[~regular]] = 1.0
        return block

    def decode(self, block: np.ndarray, tie_breaks: np.ndarray | None = None) -> np.ndarray | pd.Categorical:
        """Values from this column's block (argmax for softmax spans), clipped to the bounds.
        With ``tie_breaks`` (one uniform draw per row) a numeric column with a :attr:`marginal`
        is calibrated to it (:meth:`Marginal.calibrate`) before it is rounded or put on its grid."""
        if self.encoding == CATEGORICAL:
            return pd.Categorical.from_codes(block.argmax(axis=1), categories=list(self.column.categories))
        if self.encoding == DISCRETE:
            values = self.column.grid[block.argmax(axis=1)]
        elif self.encoding == LABEL_SCALAR:
            low, high = self._space_bounds()
            values = self._from_space((np.clip(block[:, 0], -1.0, 1.0) + 1.0) / 2.0 * (high - low) + low)
        else:
            values = self._decode_mode_specific(block)
        if tie_breaks is not None and self.marginal is not None:
            values = self.marginal.calibrate(values, tie_breaks)
        typed = self.column.typed(values)
        if typed.dtype.kind == "f":  # as declared: not rounded, nor moved onto a step's grid
            for special in self.special_values:  # close, not equal: calibration maps it through log space and back
                typed = np.where(np.isclose(values, special, rtol=1e-12, atol=0.0), special, typed)
        return typed

    def _decode_mode_specific(self, block: np.ndarray) -> np.ndarray:
        n_special = len(self.special_values)
        choice = block[:, 1:].argmax(axis=1)
        regular = choice >= n_special
        values = np.empty(len(block))
        values[regular] = self._from_space(self.normalizer.inverse(block[regular, 0], choice[regular] - n_special))
        values[~regular] = np.asarray(self.special_values, dtype=np.float64)[choice[~regular]] if n_special else 0.0
        return values

    # --- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.column.name, "encoding": self.encoding}
        if self.normalizer is not None:
            entry["normalizer"] = self.normalizer.to_dict()
        if self.special_values:
            entry["special_values"] = list(self.special_values)
        if self.log:
            entry["log"] = True
        if self.frequencies is not None:
            entry["frequencies"] = list(self.frequencies)
        if self.marginal is not None:
            entry["marginal"] = self.marginal.to_dict()
        return entry

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], column: Column) -> ColumnEncoder:
        normalizer = entry.get("normalizer")
        frequencies = entry.get("frequencies")
        encoding = entry.get("encoding")
        if encoding not in ENCODINGS:
            raise ValueError(f"column '{column.name}': unknown encoding {encoding!r} (this version reads {ENCODINGS})")
        slots = {CATEGORICAL: column.width if not column.is_numeric else None,
                 DISCRETE: column.grid_size}.get(encoding)
        if encoding in ONE_HOT and (slots is None or frequencies is None or len(frequencies) != slots):
            raise ValueError(f"column '{column.name}': a {encoding} encoding needs one frequency per value of the "
                             f"column ({slots}), got {None if frequencies is None else len(frequencies)}")
        if encoding == MODE_SPECIFIC and normalizer is None:
            raise ValueError(f"column '{column.name}': a mode-specific encoding needs its fitted normalizer")
        return cls(
            column=column,
            encoding=encoding,
            normalizer=ModeSpecificNormalizer.from_dict(normalizer) if normalizer is not None else None,
            special_values=tuple(float(v) for v in entry.get("special_values", ())),
            log=bool(entry.get("log", False)),
            frequencies=tuple(float(f) for f in frequencies) if frequencies is not None else None,
            marginal=Marginal.from_dict(entry["marginal"]) if "marginal" in entry else None,
        )


#: Below this share of the training records left in a numeric column's thresholded histogram,
#: its modes (and calibration marginal) describe a sliver of the column, and ``fit_dp`` says so.
THIN_HISTOGRAM_SHARE = 0.5


def warn_thin_histograms(histograms: Mapping[str, NoisyHistogram], records: int, threshold: float, calibrated: bool) -> None:
    """Warn, for the data holder, about each numeric column whose counts cut at ``threshold``
    noise scales keep under :data:`THIN_HISTOGRAM_SHARE` of the ``records`` (a public count).

    Why: the cut drops real bins too, every bin with fewer records than ``threshold`` scales. A
    column spread thinly over many bins (King's sale dates and construction years at 20 columns
    and ε = 0.1: about 270 records a bin against a cut of 800) then keeps one or two bins, its
    modes cover a few days or one year, and a calibrated decode puts every generated value there.
    What is counted is the released histogram and the public record count: post-processing,
    free to print."""
    for name, histogram in histograms.items():
        if not histogram.is_numeric or records <= 0:
            continue
        share = histogram.kept_mass / records
        if share < THIN_HISTOGRAM_SHARE:
            total_bins = len(histogram.counts) + len(histogram.special_counts)
            log.warning(
                "the DP histogram of %s, its counts cut at %g noise scales (--data.histogram_threshold), keeps %.0f%% of "
                "the %d training records (%d of %d bins): its modes%s describe a sliver of the column. Lower the cut or "
                "raise --data.modes_epsilon", name, threshold, 100 * share, records, histogram.kept_bins, total_bins,
                " and the calibrated values (--data.calibrate_marginals)" if calibrated else "")


class TableTransformer:
    """A schema plus one fitted :class:`ColumnEncoder` per column: encode, decode and layout.

    Build it with :meth:`fit_dp` (modes and frequencies from a DP histogram; returns the cost)
    or :meth:`from_bounds` (no data read), or restore it with :meth:`from_dict`.
    ``calibrated``: :meth:`decode` moves each numeric column with a released marginal onto it
    (:mod:`lightning_dpgan.data.marginal_calibration`); it needs DP modes, whose histogram is
    that marginal.
    """

    def __init__(self, schema: TableSchema, encoders: Sequence[ColumnEncoder], modes: str, calibrated: bool = False) -> None:
        encoders = tuple(encoders)
        if [e.column.name for e in encoders] != schema.names:
            raise SchemaError(f"encoders {[e.column.name for e in encoders]} do not match the schema's columns {schema.names}")
        if modes not in MODES:
            raise ValueError(f"modes must be one of {MODES}, got {modes!r}")
        if not isinstance(calibrated, bool):
            raise ValueError(f"calibrated must be true or false, got {calibrated!r}")
        if calibrated and not any(e.marginal is not None for e in encoders):
            raise ValueError("calibrating the generated columns needs their released marginals: the DP histogram of "
                             "--data.modes dp (a transformer from bounds has none, and one written before marginals "
                             "were kept has none either: train again to calibrate)")
        self.schema, self.encoders, self.modes, self.calibrated = schema, encoders, modes, calibrated

    def with_calibration(self, calibrated: bool) -> TableTransformer:
        """The same encoding, decoding with or without calibration (post-processing only: the
        encoded records, the layout and the privacy cost do not change)."""
        return TableTransformer(self.schema, self.encoders, self.modes, calibrated)

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def fit_dp(
        cls,
        frame: pd.DataFrame,
        schema: TableSchema,
        epsilon: float,
        *,
        max_modes: int = MAX_MODES,
        bins: int = 64,
        mixed: Mapping[str, Sequence[float]] | None = None,
        log_columns: Iterable[str] = (),
        rng: np.random.Generator | None = None,
        seed: int = 0,
        unknown: str = "drop",
        label_scalar: bool = True,
        threshold: float = 0.0,
        discrete: Iterable[str] = (),
        calibrated: bool = False,
    ) -> tuple[TableTransformer, dict[str, Any]]:
        """Fit on an ε-DP histogram of ``frame`` (the train split only); return it and the cost.

        Every column but a scalar continuous label (min-max, needs no statistic) gets a
        histogram, all under one ``epsilon`` (:func:`dp_column_histograms`: Laplace of scale
        d/ε). ``rng`` is the privacy noise (``None``: fresh OS entropy); ``seed`` only drives
        the mixture fits, which are post-processing. ``label_scalar=False`` encodes a continuous
        label mode-specific, so it gets a histogram too (one more column in ``d``). ``discrete``
        columns are counted value by value over their public grid (one bin per value, the same
        L1 sensitivity: a record still moves one bin of each column). ``calibrated``: see the class.
        ``threshold`` zeroes the numeric columns' noisy counts below that many Laplace scales
        before their modes are fitted (:meth:`NoisyHistogram.thresholded`; free post-processing).
        Category frequencies keep every count: a category below the cut is common (King's ZIP
        codes hold ~250 training records each, against a cut of 800 at 4 scales of 200), and a
        category whose frequency is 0 would never be asked of the generator.
        """
        discrete = list(discrete)  # read three times below: an iterator would be used up by the first
        mixed, log_columns = checked_roles(schema, mixed, log_columns, label_scalar, discrete)
        names = [c.name for c in schema.columns if not _is_label_scalar(schema, c, label_scalar)]
        histograms, cost = dp_column_histograms(
            frame, schema, epsilon, bins, log_columns, mixed, rng=rng, columns=names, unknown=unknown,
            discrete=discrete,
        )
        histograms = {name: histogram.thresholded(threshold) if histogram.is_numeric else histogram
                      for name, histogram in histograms.items()}
        if threshold > 0:
            warn_thin_histograms(histograms, len(frame), threshold, calibrated)
        transformer = cls.from_histograms(schema, histograms, max_modes=max_modes, mixed=mixed,
                                          log_columns=log_columns, seed=seed, label_scalar=label_scalar,
                                          discrete=discrete, calibrated=calibrated)
        return transformer, cost

    @classmethod
    def from_histograms(
        cls,
        schema: TableSchema,
        histograms: Mapping[str, NoisyHistogram],
        *,
        max_modes: int = MAX_MODES,
        mixed: Mapping[str, Sequence[float]] | None = None,
        log_columns: Iterable[str] = (),
        seed: int = 0,
        label_scalar: bool = True,
        discrete: Iterable[str] = (),
        calibrated: bool = False,
    ) -> TableTransformer:
        """Modes, frequencies and each numeric column's marginal computed from released
        histograms alone (post-processing)."""
        discrete = set(discrete)
        mixed, log_columns = checked_roles(schema, mixed, log_columns, label_scalar, discrete)
        encoders = []
        for column in schema.columns:
            if _is_label_scalar(schema, column, label_scalar):
                encoders.append(ColumnEncoder(column, LABEL_SCALAR, log=column.name in log_columns))
            elif column.name in discrete:
                frequencies = _grid_frequencies(column, histograms[column.name])
                encoders.append(ColumnEncoder(column, DISCRETE, frequencies=frequencies,
                                              marginal=Marginal.from_grid(column.grid, frequencies)))
            elif not column.is_numeric:
                encoders.append(ColumnEncoder(column, CATEGORICAL, frequencies=_frequencies(histograms[column.name].counts)))
            else:
                histogram = histograms[column.name]
                normalizer = ModeSpecificNormalizer.fit_histogram(histogram.edges, histogram.counts, max_modes, seed)
                encoders.append(ColumnEncoder(column, MODE_SPECIFIC, normalizer, tuple(mixed.get(column.name, ())),
                                              column.name in log_columns, marginal=Marginal.from_histogram(histogram, column.bounds[0])))
        if calibrated and not any(encoder.marginal is not None for encoder in encoders):
            raise ValueError("--data.calibrate_marginals has nothing to calibrate to: no numeric column's released "
                             "histogram kept a positive count (its noise, or --data.histogram_threshold cutting "
                             "every bin; the warnings above say how much each kept). Lower "
                             "--data.histogram_threshold, or leave calibration off")
        return cls(schema, encoders, "dp", calibrated)

    @classmethod
    def from_bounds(
        cls,
        schema: TableSchema,
        *,
        mixed: Mapping[str, Sequence[float]] | None = None,
        log_columns: Iterable[str] = (),
        label_scalar: bool = True,
        discrete: Iterable[str] = (),
    ) -> TableTransformer:
        """No row read: one mode per numeric column spanning its public bounds (log bounds for a
        long-tail column), uniform category and grid-value frequencies. Costs no privacy."""
        discrete = set(discrete)
        mixed, log_columns = checked_roles(schema, mixed, log_columns, label_scalar, discrete)
        encoders = []
        for column in schema.columns:
            log = column.name in log_columns
            if _is_label_scalar(schema, column, label_scalar):
                encoders.append(ColumnEncoder(column, LABEL_SCALAR, log=log))
            elif column.name in discrete:
                encoders.append(ColumnEncoder(column, DISCRETE, frequencies=_frequencies(np.ones(column.grid_size))))
            elif not column.is_numeric:
                encoders.append(ColumnEncoder(column, CATEGORICAL, frequencies=_frequencies(np.ones(column.width))))
            else:
                probe = ColumnEncoder(column, MODE_SPECIFIC, log=log)
                normalizer = ModeSpecificNormalizer.from_bounds(*probe._space_bounds())
                encoders.append(ColumnEncoder(column, MODE_SPECIFIC, normalizer, tuple(mixed.get(column.name, ())), log))
        return cls(schema, encoders, "bounds")

    # --- layout ------------------------------------------------------------------------------

    @cached_property
    def column_slices(self) -> dict[str, slice]:
        """Column name -> its slice of the encoded vector."""
        slices, start = {}, 0
        for encoder in self.encoders:
            slices[encoder.column.name] = slice(start, start + encoder.width)
            start += encoder.width
        return slices

    @property
    def encoded_dim(self) -> int:
        return sum(e.width for e in self.encoders)

    @property
    def output_spans(self) -> list[tuple[int, str]]:
        """``(width, activation)`` for every slot group in order: ``"tanh"`` or ``"softmax"``."""
        return [span for encoder in self.encoders for span in encoder.spans]

    @property
    def condition_spans(self) -> list[tuple[int, int]]:
        """``(start, width)`` of each categorical or discrete column's one-hot block (label
        included): the columns CTGAN's conditional vector chooses from."""
        return [(self.column_slices[e.column.name].start, e.width) for e in self.encoders if e.encoding in ONE_HOT]

    @property
    def condition_frequencies(self) -> list[list[float]]:
        """Per condition column, its category (or grid value) frequencies: from the DP histogram
        (clipped at 0, renormalised; public as post-processing of a DP release), or uniform with
        modes="bounds"."""
        return [list(e.frequencies) for e in self.encoders if e.encoding in ONE_HOT]

    @property
    def label_span(self) -> tuple[int, int, str] | None:
        """``(start, width, kind)`` of the label's block, kind the schema's ``label_kind``."""
        if self.schema.label is None:
            return None
        block = self.column_slices[self.schema.label]
        return block.start, block.stop - block.start, self.schema.label_kind

    def layout(self) -> dict[str, Any]:
        """What a model needs to shape its output and conditions, as plain JSON-able values
        (for its hyper-parameters): spans, condition spans and frequencies, the label."""
        label = self.label_span
        return {
            "spans": [[width, activation] for width, activation in self.output_spans],
            "condition_spans": [[start, width] for start, width in self.condition_spans],
            "condition_frequencies": self.condition_frequencies,
            "label": None if label is None else {"start": label[0], "width": label[1], "kind": label[2]},
        }

    # --- encode / decode ---------------------------------------------------------------------

    def encode(self, frame: pd.DataFrame, seed: int = 0, unknown: str = "drop") -> tuple[torch.Tensor, EncodingReport]:
        """Encode ``frame`` into a float32 tensor ``(rows kept, encoded_dim)``, and the schema's
        clip/reject report. Each value's mode is drawn from its posterior, as CTGAN does, with
        :func:`record_uniforms` of the row and ``seed`` (public: it is not privacy noise)."""
        kept, report = rows_in_schema(self.schema, frame, unknown)
        uniforms = record_uniforms(schema_values(self.schema, kept), seed)
        # filled column by column into one float32 table: the float64 blocks, their concatenation and
        # its float32 copy were three tables alive at once (a large file's peak memory)
        encoded = np.zeros((len(kept), self.encoded_dim), dtype=np.float32)
        start = 0
        for index, encoder in enumerate(self.encoders if len(kept) else ()):  # no row: the empty table as it is
            block = encoder.encode(kept[encoder.column.name], uniforms[:, index])
            encoded[:, start:start + block.shape[1]] = block
            start += block.shape[1]
        return torch.from_numpy(encoded), report

    def decode(self, data: torch.Tensor | np.ndarray, generator: torch.Generator | None = None) -> pd.DataFrame:
        """Encoded (e.g. generated) records back to a frame with the schema's columns, in order.

        Softmax spans are read by argmax, so raw logits, probabilities or one-hots all decode;
        numeric values are clipped to their bounds, integers rounded, categorical columns come
        back as a ``Categorical`` with the schema's categories (as :meth:`TableSchema.decode`).
        A :attr:`calibrated` transformer calibrates the numeric columns of the whole batch to
        their marginals, ties broken by draws from ``generator`` (torch's global one if None).
        """
        if isinstance(data, torch.Tensor):
            data = data.detach().cpu().double().numpy()
        array = np.asarray(data, dtype=np.float64)
        if array.ndim != 2 or array.shape[1] != self.encoded_dim:
            raise ValueError(f"expected an array of shape (n, {self.encoded_dim}), got {tuple(array.shape)}")
        if not np.isfinite(array).all():
            raise ValueError("cannot decode non-finite values (NaN/inf); the generator may have diverged")
        tie_breaks = (torch.rand((len(array), len(self.encoders)), generator=generator, dtype=torch.float64).numpy()
                      if self.calibrated else None)
        out = {e.column.name: e.decode(array[:, self.column_slices[e.column.name]],
                                       None if tie_breaks is None else tie_breaks[:, index])
               for index, e in enumerate(self.encoders)}
        return pd.DataFrame(out, columns=self.schema.names)

    # --- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to encode and decode later (e.g. from a checkpoint), JSON-able."""
        return {
            "format": FORMAT,
            "modes": self.modes,
            "calibrated": self.calibrated,
            "schema": self.schema.to_dict(),
            "columns": [encoder.to_dict() for encoder in self.encoders],
        }

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> TableTransformer:
        if not isinstance(spec, Mapping) or spec.get("format") != FORMAT:
            raise ValueError(f"not a table transformer description (format {FORMAT!r} expected)")
        schema = TableSchema.from_dict(spec["schema"])
        entries = {entry["name"]: entry for entry in spec["columns"]}
        missing = [name for name in schema.names if name not in entries]
        if missing or len(entries) != len(schema.names):
            raise ValueError(f"the transformer's columns {list(entries)} do not match its schema {schema.names}")
        encoders = [ColumnEncoder.from_dict(entries[c.name], c) for c in schema.columns]
        return cls(schema, encoders, spec["modes"], spec.get("calibrated", False))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TableTransformer):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"TableTransformer(columns={len(self.encoders)}, encoded_dim={self.encoded_dim}, modes={self.modes!r})"


def _is_label_scalar(schema: TableSchema, column: Column, label_scalar: bool = True) -> bool:
    return label_scalar and column.name == schema.label and schema.label_kind == "continuous"


def checked_roles(
    schema: TableSchema, mixed: Mapping[str, Sequence[float]] | None, log_columns: Iterable[str],
    label_scalar: bool = True, discrete: Iterable[str] = (),
) -> tuple[dict[str, tuple[float, ...]], set[str]]:
    """Checked mixed/long-tail declarations: columns in the schema and numeric, special values
    within bounds, and no special values on a continuous label encoded as a single scalar.
    ``discrete`` columns are checked too (a public grid of at most
    :data:`~lightning_dpgan.data.dp_histogram.MAX_DISCRETE_VALUES` values, no other role, not
    the scalar label); the caller keeps its own set of them."""
    if not isinstance(label_scalar, bool):
        raise ValueError(f"label_scalar must be true or false, got {label_scalar!r}")
    mixed = {name: tuple(values) if isinstance(values, (list, tuple)) else values for name, values in (mixed or {}).items()}
    log_columns, discrete = set(log_columns), list(discrete)
    check_column_roles(schema, mixed, log_columns, discrete)
    if label_scalar and schema.label_kind == "continuous" and schema.label in mixed:
        raise SchemaError(f"the continuous label '{schema.label}' is encoded as one min-max scalar; it cannot be mixed")
    if label_scalar and schema.label_kind == "continuous" and schema.label in discrete:
        raise SchemaError(f"the continuous label '{schema.label}' is encoded as one min-max scalar; it cannot be "
                          "discrete (pass label_encoding='mode-specific' to encode it like a feature)")
    return {name: tuple(float(v) for v in values) for name, values in mixed.items()}, log_columns


def _frequencies(noisy_counts: np.ndarray) -> tuple[float, ...]:
    """Noisy counts clipped at 0 and normalised; uniform if noise left nothing positive."""
    counts = np.clip(np.asarray(noisy_counts, dtype=np.float64), 0.0, None)
    if counts.sum() <= 0:
        counts = np.ones_like(counts)
    return tuple((counts / counts.sum()).tolist())


def _grid_frequencies(column: Column, histogram: NoisyHistogram) -> tuple[float, ...]:
    """A discrete column's value frequencies, from a histogram counted over its grid."""
    if histogram.is_numeric or histogram.categories != tuple(column.grid.tolist()):
        raise SchemaError(f"the histogram of discrete column '{column.name}' is not counted over its grid of values "
                          "(dp_column_histograms(..., discrete=[...]) counts it so)")
    return _frequencies(histogram.counts)


def _plain(series: pd.Series) -> pd.Series:
    return series.astype(object) if isinstance(series.dtype, pd.CategoricalDtype) else series
