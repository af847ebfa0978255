"""Marginal calibration: generated numeric values moved onto the column's DP marginal, ranks kept.

Why. A GAN trained in a few thousand noisy DP-SGD steps often collapses a numeric column onto
a narrow band (measured on King with DP-CTGAN at ε = 1: synthetic living areas whose
interquartile range was 8 % of the real one, every house of grade 7). The DP histogram the
column's modes were fitted on already says how the column is spread. Calibration keeps what the
generator knows about how records relate -- which generated record has more living area than
which -- and takes each column's spread from that histogram: the generated record of rank ``r``
among ``n`` gets the histogram's ``(r + 1/2) / n`` quantile.

Privacy: nothing here reads a record. The marginal is the same noisy histogram the encoding was
fitted on (:func:`~lightning_dpgan.data.dp_histogram.dp_column_histograms`, thresholded as the
modes saw it), already paid for by ``--data.modes_epsilon``; ranking generated records and
reading quantiles is post-processing of two DP releases (the histogram and the generator), so
it costs nothing.

The mapping is applied to each batch of generated records as a whole (ranks are within the
batch), so every batch -- and any union of batches -- has the calibrated marginal. Ties (a
special value, a value clipped at a bound, a discrete column's repeated values) are broken at
random, from the caller's generator.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_dpgan.data.dp_histogram import NoisyHistogram, log_inverse, log_transform


@dataclass(frozen=True, eq=False)
class Marginal:
    """A column's distribution as ordered pieces of probability: atoms (``start == end``: a
    special value, or a grid value of a discrete column) and intervals over which the mass is
    uniform (a histogram bin), in the space the histogram was counted in (``log(x - low + 1)``
    for a long-tail column, ``log=True``). Pieces of no mass are dropped; an atom is placed
    before an interval that starts where it sits (a special value at a column's lower bound,
    as declared mixed columns have them)."""

    starts: np.ndarray
    ends: np.ndarray
    weights: np.ndarray
    log: bool = False
    low: float = 0.0

    def __post_init__(self) -> None:
        starts, ends, weights = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (self.starts, self.ends, self.weights))
        if not (len(starts) == len(ends) == len(weights)) or not len(weights):
            raise ValueError("a marginal needs as many starts, ends and weights, at least one of each")
        if not (np.isfinite(starts).all() and np.isfinite(ends).all() and (ends >= starts).all()):
            raise ValueError("a marginal's pieces need finite starts and ends, each end at or after its start")
        if not (np.isfinite(weights).all() and (weights > 0).all()):
            raise ValueError("a marginal's pieces need positive weights")
        order = np.lexsort((ends > starts, starts))  # by position, an atom before the interval it opens
        object.__setattr__(self, "starts", starts[order])
        object.__setattr__(self, "ends", ends[order])
        total = weights.sum()  # normalised once: a stored (normalised) marginal reads back bit for bit
        object.__setattr__(self, "weights", weights[order] if abs(total - 1.0) < 1e-12 else weights[order] / total)

    @classmethod
    def from_histogram(cls, histogram: NoisyHistogram, low: float) -> Marginal | None:
        """A numeric column's released histogram (noisy counts clipped at 0, as the modes
        read them) as a marginal; ``None`` if the noise left no positive count."""
        specials = np.asarray(histogram.special_values, dtype=np.float64)
        special_positions = log_transform(specials, low) if histogram.log else specials
        edges = np.asarray(histogram.edges, dtype=np.float64)
        starts = np.concatenate([special_positions, edges[:-1]])
        ends = np.concatenate([special_positions, edges[1:]])
        weights = np.clip(np.concatenate([histogram.special_counts, histogram.counts]), 0.0, None)
        return cls._of_positive(starts, ends, weights, histogram.log, low)

    @classmethod
    def from_grid(cls, values: Sequence[float], frequencies: Sequence[float]) -> Marginal | None:
        """A discrete column's grid values with their (released) frequencies, as atoms."""
        values = np.asarray(values, dtype=np.float64)
        return cls._of_positive(values, values, np.asarray(frequencies, dtype=np.float64), False, 0.0)

    @classmethod
    def _of_positive(cls, starts: np.ndarray, ends: np.ndarray, weights: np.ndarray, log: bool, low: float) -> Marginal | None:
        keep = weights > 0
        return cls(starts[keep], ends[keep], weights[keep], log, low) if keep.any() else None

    def quantile(self, probabilities: np.ndarray) -> np.ndarray:
        """The marginal's quantile function at ``probabilities`` in [0, 1], in the column's own
        units (back from log space for a long-tail column)."""
        probabilities = np.clip(np.asarray(probabilities, dtype=np.float64), 0.0, 1.0)
        cumulative = np.cumsum(self.weights)
        piece = np.minimum(np.searchsorted(cumulative, probabilities, side="right"), len(cumulative) - 1)
        within = np.clip((probabilities - (cumulative[piece] - self.weights[piece])) / self.weights[piece], 0.0, 1.0)
        positions = self.starts[piece] + within * (self.ends[piece] - self.starts[piece])
        return log_inverse(positions, self.low) if self.log else positions

    def calibrate(self, values: np.ndarray, tie_breaks: np.ndarray) -> np.ndarray:
        """``values`` (one column of a batch of generated records) replaced by this marginal's
        quantiles, in the same order: the record of rank ``r`` of ``n`` gets the ``(r + 1/2) / n``
        quantile. Equal values are ranked by ``tie_breaks`` (uniform draws, one per record)."""
        values = np.asarray(values, dtype=np.float64)
        if len(tie_breaks) != len(values):
            raise ValueError(f"{len(values)} values need as many tie breaks, got {len(tie_breaks)}")
        order = np.lexsort((tie_breaks, values))
        calibrated = np.empty(len(values))
        calibrated[order] = self.quantile((np.arange(len(values)) + 0.5) / max(len(values), 1))
        return calibrated

    def to_dict(self) -> dict[str, Any]:
        return {"starts": self.starts.tolist(), "ends": self.ends.tolist(), "weights": self.weights.tolist(),
                "log": self.log, "low": self.low}

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> Marginal:
        missing = [key for key in ("starts", "ends", "weights") if key not in entry]
        if missing:
            raise ValueError(f"a marginal's description lacks {missing}")
        return cls(entry["starts"], entry["ends"], entry["weights"], bool(entry.get("log", False)), float(entry.get("low", 0.0)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Marginal):
            return NotImplemented
        return self.to_dict() == other.to_dict()


__all__ = ["Marginal"]
