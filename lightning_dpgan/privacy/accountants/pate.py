"""``PATEMomentsAccountant``: PATE-GAN's moments accountant over Laplace noisy-argmax queries.

The bounds are in :mod:`lightning_dpgan.privacy.analysis.pate`. The state is exact and compact:
for each inverse noise scale lambda, a histogram of the vote gaps ``|n_0 - n_1|`` of the queries
answered (at most K + 1 distinct gaps for K teachers). Loading recomputes both log-moment curves
from that histogram, so a saved state cannot understate the spend.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from lightning_dpgan.privacy.accountants.base import AccountantStateError
from lightning_dpgan.privacy.analysis.pate import (
    DEFAULT_MOMENT_ORDERS,
    data_dependent_moments,
    data_independent_moments,
    moments_to_epsilon,
)

STATE_FORMAT_VERSION = 1


#: Each gap's data-dependent moment row, per (orders, noise scale), computed alone (the same bits
#: whichever batch met the gap first); and the rows of the last histogram asked about, stacked.
_GAP_ROWS: dict[tuple[bytes, float], dict[int, np.ndarray]] = {}
_STACKED_ROWS: dict[tuple[bytes, float], tuple[tuple[int, ...], np.ndarray]] = {}


def _stacked_gap_moments(lap_inverse_scale: float, gaps: tuple[int, ...], orders: np.ndarray) -> np.ndarray:
    """The moment rows of ``gaps`` (sorted), one per gap: a run meets at most K + 1 gaps per
    noise scale, and its curves are summed again from every gap of the histogram after each
    batch, mostly over the gaps of the batch before."""
    key = (orders.tobytes(), lap_inverse_scale)
    stacked = _STACKED_ROWS.get(key)
    if stacked is not None and stacked[0] == gaps:
        return stacked[1]
    rows = _GAP_ROWS.setdefault(key, {})
    for gap in gaps:
        if gap not in rows:
            rows[gap] = data_dependent_moments(lap_inverse_scale, np.array([gap]), orders)[0]
    matrix = np.stack([rows[gap] for gap in gaps])
    matrix.setflags(write=False)
    _STACKED_ROWS[key] = (gaps, matrix)
    return matrix


ACCOUNTING_MODES = ("data-dependent", "data-independent")


class PATEMomentsAccountant:
    """Sums per-query log-moments, data-dependent and data-independent side by side.

    ``get_epsilon(delta)`` reports the figure of ``accounting`` (the one that stops training);
    both are available through ``epsilon_data_dependent`` / ``epsilon_data_independent``.
    Look-ahead (:meth:`epsilon_if_queries`) charges future queries, whose votes are unknown,
    the data-independent bound by default (an upper bound whatever the votes turn out to be) or
    the bound of a given vote gap. Under data-dependent accounting the strategy plans with the
    unanimous gap, the cheapest case, so its plan can be optimistic; what keeps the spend
    within the target is :meth:`epsilon_if_answered`, which the strategy checks on the actual
    votes before releasing a query batch (refused if it would pass).
    """

    name = "pate-moments"
    mechanism = "pate-laplace-noisy-argmax"

    def __init__(self, accounting: str = "data-dependent", orders: np.ndarray = DEFAULT_MOMENT_ORDERS) -> None:
        if accounting not in ACCOUNTING_MODES:
            raise ValueError(f"--privacy.accounting must be one of {ACCOUNTING_MODES}, got {accounting!r}")
        self.accounting = accounting
        self.orders = np.asarray(orders, dtype=float)
        self._gap_counts: dict[float, dict[int, int]] = {}
        self._dependent = np.zeros_like(self.orders)
        self._independent = np.zeros_like(self.orders)

    # ---------------------------------------------------------------- recording
    def step(self, lap_inverse_scale: float, vote_gaps: Any) -> None:
        """Charge one query per entry of ``vote_gaps`` (``|n_0 - n_1|`` of each answered query)."""
        lam = float(lap_inverse_scale)
        if not lam > 0 or not np.isfinite(lam):
            raise ValueError(f"lap_inverse_scale must be a finite number > 0, got {lap_inverse_scale}")
        gaps = np.atleast_1d(np.asarray(vote_gaps)).astype(np.int64)
        if gaps.size == 0:
            return
        if gaps.min() < 0:
            raise ValueError("vote gaps are absolute differences: they cannot be negative")
        values, counts = np.unique(gaps, return_counts=True)
        histogram = self._gap_counts.setdefault(lam, {})
        for gap, count in zip(values.tolist(), counts.tolist()):
            histogram[gap] = histogram.get(gap, 0) + count
        self._sum_moments()

    def _sum_moments(self) -> None:
        """Both log-moment curves from the whole histogram, gaps in sorted order: summed batch by
        batch, a run resumed from the saved histogram reported a figure rounded otherwise (one
        ulp lower) than the run uninterrupted; a function of the histogram alone is the same
        bit for bit. At most K + 1 distinct gaps per noise scale, each gap's moments cached."""
        dependent, independent = np.zeros_like(self.orders), np.zeros_like(self.orders)
        for lam, histogram in self._gap_counts.items():
            gaps = tuple(sorted(histogram))
            counts = np.array([histogram[gap] for gap in gaps], dtype=np.int64)
            rows = _stacked_gap_moments(lam, gaps, self.orders)
            dependent = dependent + (rows * counts[:, None]).sum(axis=0)
            independent = independent + data_independent_moments(lam, self.orders) * counts.sum()
        self._dependent, self._independent = dependent, independent

    def noise_settings(self) -> list[dict[str, float]]:
        """Each ``lap_inverse_scale`` queries were charged at, in no particular order."""
        return [{"lap_inverse_scale": float(lam)} for lam in self._gap_counts]

    def __len__(self) -> int:
        """Queries answered so far."""
        return sum(sum(histogram.values()) for histogram in self._gap_counts.values())

    # ---------------------------------------------------------------- reporting
    def epsilon_data_dependent(self, delta: float) -> float:
        return 0.0 if len(self) == 0 else moments_to_epsilon(self._dependent, delta, self.orders)

    def epsilon_data_independent(self, delta: float) -> float:
        return 0.0 if len(self) == 0 else moments_to_epsilon(self._independent, delta, self.orders)

    def get_epsilon(self, delta: float) -> float:
        if self.accounting == "data-dependent":
            return self.epsilon_data_dependent(delta)
        return self.epsilon_data_independent(delta)

    def epsilon_if_answered(self, delta: float, lap_inverse_scale: float, vote_gaps: Any) -> float:
        """Epsilon (of ``accounting``) if these queries were answered; the state is not changed."""
        future = copy.deepcopy(self)
        future.step(lap_inverse_scale, vote_gaps)
        return future.get_epsilon(delta)

    def epsilon_if_queries(self, delta: float, queries: int, lap_inverse_scale: float, vote_gap: int | None = None) -> float:
        """Epsilon after ``queries`` more queries, each charged the data-independent bound, or, with
        ``vote_gap``, the bound of a query with that gap. One moment curve times the count: budget
        planning asks about millions of queries."""
        if vote_gap is None:
            extra = data_independent_moments(lap_inverse_scale, self.orders) * queries
        else:
            extra = data_dependent_moments(lap_inverse_scale, np.array([vote_gap]), self.orders)[0] * queries
        base = self._dependent if self.accounting == "data-dependent" else self._independent
        if queries == 0 and len(self) == 0:
            return 0.0
        return moments_to_epsilon(base + extra, delta, self.orders)

    # -------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.name,
            "mechanism": self.mechanism,
            "format_version": STATE_FORMAT_VERSION,
            "accounting": self.accounting,
            "orders": self.orders.tolist(),
            "queries": [
                {"lap_inverse_scale": lam, "gap_counts": {str(gap): count for gap, count in sorted(histogram.items())}}
                for lam, histogram in self._gap_counts.items()
            ],
        }

    def public_state_dict(self) -> dict[str, Any]:
        """What the privacy report shows: the state without its vote-gap histograms. Those are
        exact statistics of the teachers' votes on private data, not differentially private;
        they stay in the checkpoint, which a resumed run needs and which is never published."""
        state = self.state_dict()
        state["queries"] = [{"lap_inverse_scale": lam, "count": sum(histogram.values())}
                            for lam, histogram in self._gap_counts.items()]
        state["withheld"] = "the vote-gap histograms (statistics of the private votes): in the checkpoint only"
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Rebuild from the saved gap histograms; refuse (unchanged) anything malformed or foreign."""
        if not isinstance(state, Mapping) or state.get("accountant") != self.name or state.get("mechanism") != self.mechanism:
            raise AccountantStateError(f"not a {self.name} accountant state")
        if state.get("format_version") != STATE_FORMAT_VERSION:
            raise AccountantStateError(f"unsupported {self.name} state format {state.get('format_version')!r}")
        if list(map(float, state.get("orders", []))) != self.orders.tolist():
            raise AccountantStateError("the saved moment orders differ from this accountant's")
        fresh = copy.deepcopy(self)
        fresh._gap_counts, fresh._dependent, fresh._independent = {}, np.zeros_like(self.orders), np.zeros_like(self.orders)
        try:
            for entry in state["queries"]:
                lam = float(entry["lap_inverse_scale"])
                gaps = np.array([int(gap) for gap in entry["gap_counts"]], dtype=np.int64)
                counts = np.array([int(count) for count in entry["gap_counts"].values()], dtype=np.int64)
                if (counts < 1).any():
                    raise ValueError("query counts must be positive")
                fresh.step(lam, np.repeat(gaps, counts))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise AccountantStateError(f"malformed {self.name} state: {error}") from error
        self._gap_counts, self._dependent, self._independent = fresh._gap_counts, fresh._dependent, fresh._independent
