"""``ConfidentGNMaxAccountant``: RDP of G-PATE's Confident-GNMax queries, composed by addition.

The bounds are in :mod:`lightning_dpgan.privacy.analysis.gnmax` (Papernot et al. 2018, "Scalable
Private Learning with PATE"; G-PATE, Long et al. 2021, Appendix A.4). Every query pays the
threshold check, ``lambda / (2 sigma1^2)``; an answered one also pays GNMax, data-independently
``lambda / sigma2^2`` or, data-dependently, Theorem 6 at its ``log q~``.

The state is exact and compact: for each noise pair ``(sigma1, sigma2)``, the number of threshold
checks and a histogram of the answered queries' ``log q~`` *rounded up* to a 0.01 grid. Theorem 6
holds for any upper bound on the probability, so the rounded value still bounds each query; the
histogram then has a few thousand keys whatever the number of queries. Both composed curves are
derived from it (in a fixed order, so a reloaded state reports bit-identical epsilons), and
loading recomputes them, so a saved state cannot understate the spend.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_dpgan.privacy.accountants.base import AccountantStateError
from lightning_dpgan.privacy.accountants.pate import ACCOUNTING_MODES
from lightning_dpgan.privacy.analysis.gnmax import (
    gnmax_data_dependent_rdp,
    gnmax_data_independent_rdp,
    round_log_q_up,
    threshold_rdp,
)
from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, check_orders, rdp_to_epsilon
from lightning_dpgan.privacy.validation import validate_delta, validate_int, validate_positive

STATE_FORMAT_VERSION = 1

NoisePair = tuple[float, float]


def _noise_pair(sigma1: Any, sigma2: Any) -> NoisePair:
    return validate_positive("sigma1", sigma1), validate_positive("sigma2", sigma2)


def _count(value: Any, name: str) -> int:
    """A non-negative integer (:func:`validate_int`)."""
    return validate_int(name, value, 0)


class ConfidentGNMaxAccountant:
    """Sums per-query RDP curves of Confident-GNMax, data-dependent and data-independent side by side.

    ``get_epsilon(delta)`` reports the figure of ``accounting`` (the one that stops training); both
    are available through ``epsilon_data_dependent`` / ``epsilon_data_independent``, whatever the
    mode: the ``log q~`` of answered queries are always recorded. The data-dependent figure depends
    on the private votes and is not itself private; label it so when reporting it.
    """

    name = "confident-gnmax-rdp"
    mechanism = "confident-gnmax"

    def __init__(self, accounting: str = "data-dependent", orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        if accounting not in ACCOUNTING_MODES:
            raise ValueError(f"--privacy.accounting must be one of {ACCOUNTING_MODES}, got {accounting!r}")
        self.accounting = accounting
        self.orders = check_orders(orders)
        self._queries: dict[NoisePair, int] = {}
        self._answered: dict[NoisePair, dict[float, int]] = {}
        # derived, never saved: (data-dependent, data-independent) curves, and GNMax's
        # data-dependent curve per (sigma2, rounded log q~), a pure function of its key
        self._curves: tuple[np.ndarray, np.ndarray] | None = None
        self._gnmax_rows: dict[tuple[float, float], np.ndarray] = {}

    # ---------------------------------------------------------------- recording
    def step(self, sigma1: float, sigma2: float, num_queries: int, answered_log_q: Any = ()) -> None:
        """Charge ``num_queries`` threshold checks at ``sigma1``, of which ``len(answered_log_q)``
        passed and were answered by GNMax at ``sigma2``; ``answered_log_q`` holds their
        ``log q~`` (:func:`~lightning_dpgan.privacy.analysis.gnmax.gnmax_log_q`), unrounded."""
        pair = _noise_pair(sigma1, sigma2)
        queries = _count(num_queries, "num_queries")
        keys = round_log_q_up(np.asarray(answered_log_q, dtype=float).reshape(-1))
        if keys.size > queries:
            raise ValueError(f"{keys.size} answered queries but only {queries} threshold checks")
        values, counts = np.unique(keys, return_counts=True)
        self._record(pair, queries, values.tolist(), counts.tolist())

    def _record(self, pair: NoisePair, queries: int, keys: list[float], counts: list[int]) -> None:
        if queries == 0:
            return
        self._queries[pair] = self._queries.get(pair, 0) + queries
        histogram = self._answered.setdefault(pair, {})
        for key, count in zip(keys, counts):
            if count:
                histogram[key] = histogram.get(key, 0) + count
        self._curves = None

    def noise_settings(self) -> list[dict[str, float]]:
        """Each ``(sigma1, sigma2)`` queries were charged at, in no particular order."""
        return [{"sigma1": float(sigma1), "sigma2": float(sigma2)} for sigma1, sigma2 in self._queries]

    def __len__(self) -> int:
        """Threshold checks so far: every query, answered or not."""
        return sum(self._queries.values())

    @property
    def answered(self) -> int:
        """Queries that passed the threshold and were answered by GNMax."""
        return sum(sum(histogram.values()) for histogram in self._answered.values())

    # ---------------------------------------------------------------- curves
    def _gnmax_curves(self, sigma2: float, keys: list[float]) -> np.ndarray:
        """Theorem 6 curves of these rounded ``log q~``, ``[len(keys), len(orders)]``, cached."""
        missing = [key for key in keys if (sigma2, key) not in self._gnmax_rows]
        if missing:
            for key, row in zip(missing, gnmax_data_dependent_rdp(np.array(missing), sigma2, self.orders)):
                self._gnmax_rows[(sigma2, key)] = row
        if not keys:
            return np.zeros((0, self.orders.size))
        return np.stack([self._gnmax_rows[(sigma2, key)] for key in keys])

    def _composed(self) -> tuple[np.ndarray, np.ndarray]:
        """``(data-dependent, data-independent)`` composed curves, summed in sorted order so that
        equal histograms give bit-equal curves however they were recorded."""
        if self._curves is None:
            dependent, independent = np.zeros_like(self.orders), np.zeros_like(self.orders)
            for pair in sorted(self._queries):
                sigma1, sigma2 = pair
                checks = threshold_rdp(sigma1, self.orders) * self._queries[pair]
                histogram = self._answered.get(pair, {})
                keys = sorted(histogram)
                counts = np.array([histogram[key] for key in keys], dtype=float)
                gnmax = (counts[:, None] * self._gnmax_curves(sigma2, keys)).sum(axis=0)
                dependent = dependent + checks + gnmax
                independent = independent + checks + gnmax_data_independent_rdp(sigma2, self.orders) * counts.sum()
            self._curves = (dependent, independent)
        return self._curves

    def _curve(self) -> np.ndarray:
        dependent, independent = self._composed()
        return dependent if self.accounting == "data-dependent" else independent

    def _epsilon(self, curve: np.ndarray, delta: float) -> float:
        validate_delta(delta, flag="delta")
        return 0.0 if len(self) == 0 else rdp_to_epsilon(self.orders, curve, delta)[0]

    # ---------------------------------------------------------------- reporting
    def epsilon_data_dependent(self, delta: float) -> float:
        """ε of Theorem 6 on the answered queries (not itself private: depends on the votes)."""
        return self._epsilon(self._composed()[0], delta)

    def epsilon_data_independent(self, delta: float) -> float:
        """ε of the queries asked, whatever their votes: the guarantee where the number of queries
        does not depend on the votes (data-independent accounting stops on it)."""
        return self._epsilon(self._composed()[1], delta)

    def get_epsilon(self, delta: float) -> float:
        if self.accounting == "data-dependent":
            return self.epsilon_data_dependent(delta)
        return self.epsilon_data_independent(delta)

    def epsilon_if_answered(
        self, delta: float, sigma1: float, sigma2: float, num_queries: int, answered_log_q: Any = ()
    ) -> float:
        """Epsilon (of ``accounting``) if ``step`` were called with these; the state is not changed."""
        future = copy.copy(self)  # shares only the cache of GNMax curves, a pure function of its key
        future._queries = dict(self._queries)
        future._answered = {pair: dict(histogram) for pair, histogram in self._answered.items()}
        future.step(sigma1, sigma2, num_queries, answered_log_q)
        return future.get_epsilon(delta)

    def epsilon_if_queries(
        self,
        delta: float,
        queries: int,
        sigma1: float,
        sigma2: float,
        answered_fraction: float = 1.0,
        log_q: float | None = None,
    ) -> float:
        """Epsilon after ``queries`` more threshold checks, ``answered_fraction * queries`` of them
        answered, for budget planning: one curve times the count, since planning asks about
        millions of queries.

        Answers are charged ``lambda / sigma2^2`` (an upper bound whatever the votes), or, with
        ``log_q`` and data-dependent accounting, Theorem 6 at ``log_q`` rounded up, as ``step``
        would. In data-independent mode ``log_q`` is ignored: stepping would not use it either.
        A fractional number of answers is kept as is (RDP is linear in the count).
        """
        validate_delta(delta, flag="delta")
        sigma1, sigma2 = _noise_pair(sigma1, sigma2)
        count = _count(queries, "queries")
        fraction = float(answered_fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"answered_fraction must be in [0, 1], got {answered_fraction}")
        gnmax = gnmax_data_independent_rdp(sigma2, self.orders)
        if log_q is not None:
            key = round_log_q_up(log_q)
            if key.size != 1:
                raise ValueError("log_q must be a single value: the bound of each future answer")
            if self.accounting == "data-dependent":
                gnmax = gnmax_data_dependent_rdp(key, sigma2, self.orders)[0]
        if count == 0 and len(self) == 0:
            return 0.0
        extra = threshold_rdp(sigma1, self.orders) * count + gnmax * (fraction * count)
        return rdp_to_epsilon(self.orders, self._curve() + extra, delta)[0]

    # -------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.name,
            "mechanism": self.mechanism,
            "format_version": STATE_FORMAT_VERSION,
            "accounting": self.accounting,
            "orders": self.orders.tolist(),
            "noise_pairs": [
                {
                    "sigma1": sigma1,
                    "sigma2": sigma2,
                    "queries": self._queries[(sigma1, sigma2)],
                    "answered": {
                        repr(float(key)): count for key, count in sorted(self._answered.get((sigma1, sigma2), {}).items())
                    },
                }
                for sigma1, sigma2 in sorted(self._queries)
            ],
        }

    def public_state_dict(self) -> dict[str, Any]:
        """What the privacy report shows: the state with the count of answered queries (the
        released answers show it) in place of their ``log q~`` histogram, exact statistics of
        the private votes that stay in the checkpoint, which a resumed run needs."""
        state = self.state_dict()
        for pair in state["noise_pairs"]:
            pair["answered"] = sum(pair["answered"].values())
        state["withheld"] = "the log q~ histograms of answered queries (statistics of the private votes): in the checkpoint only"
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Rebuild from the saved histograms; refuse (unchanged) anything malformed or foreign.

        ``accounting`` stays this accountant's (the run's configuration picks the figure that
        stops training); the saved one is only checked to be a known mode.
        """
        if not isinstance(state, Mapping) or state.get("accountant") != self.name or state.get("mechanism") != self.mechanism:
            raise AccountantStateError(f"not a {self.name} accountant state")
        if state.get("format_version") != STATE_FORMAT_VERSION:
            raise AccountantStateError(f"unsupported {self.name} state format {state.get('format_version')!r}")
        if state.get("accounting") not in ACCOUNTING_MODES:
            raise AccountantStateError(f"unknown accounting mode {state.get('accounting')!r}")
        try:
            same_orders = [float(order) for order in state["orders"]] == self.orders.tolist()
        except (KeyError, TypeError, ValueError) as error:
            raise AccountantStateError(f"malformed {self.name} state orders: {error}") from error
        if not same_orders:
            raise AccountantStateError("the saved RDP orders differ from this accountant's")
        fresh = ConfidentGNMaxAccountant(self.accounting, self.orders)
        fresh._gnmax_rows = self._gnmax_rows  # a cache of a pure function: safe to share
        try:
            entries = state["noise_pairs"]
            if not isinstance(entries, list):
                raise TypeError("noise_pairs must be a list")
            for entry in entries:
                pair = _noise_pair(entry["sigma1"], entry["sigma2"])
                queries = _count(entry["queries"], "queries")
                histogram = entry["answered"]
                if not isinstance(histogram, Mapping):
                    raise TypeError("answered must map log q~ to counts")
                log_q = [float(key) for key in histogram]
                if not all(math.isfinite(value) for value in log_q):
                    raise ValueError("log q~ keys must be finite")
                counts = [_count(count, "answered count") for count in histogram.values()]
                if sum(counts) > queries:
                    raise ValueError(f"{sum(counts)} answered queries but only {queries} threshold checks")
                # re-rounding our own keys changes nothing; a foreign off-grid key only goes up
                fresh._record(pair, queries, round_log_q_up(np.array(log_q)).tolist(), counts)
                if sum(fresh._answered.get(pair, {}).values()) > fresh._queries.get(pair, 0):
                    raise ValueError(f"more answered queries than threshold checks at {pair}")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise AccountantStateError(f"malformed {self.name} state: {error}") from error
        self._queries, self._answered, self._curves = fresh._queries, fresh._answered, None
