"""The ``Accountant`` contract shared by every privacy strategy.

Modelled on Opacus' ``IAccountant``: an accountant records each use of one mechanism
(``step``), answers the ε spent so far for a δ (``get_epsilon``), and saves / restores
that record (``state_dict`` / ``load_state_dict``) so a resumed run keeps its budget.

Two things go beyond Opacus, because the budget callback and checkpoints rely on them:
``epsilon_if`` looks ahead without touching the record, and ``load_state_dict`` refuses
any state it cannot vouch for instead of restarting the budget at zero.
"""

from __future__ import annotations

import abc
import copy
import math
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar

Params = dict[str, float]

STATE_FORMAT_VERSION = 1


class AccountantStateError(ValueError):
    """A saved accountant state is missing, malformed, or from another accountant.

    Raised instead of loading a fresh accountant: silently restarting the record would
    under-report the privacy actually spent.
    """


class Accountant(abc.ABC):
    """Records uses of one privacy mechanism and reports the ε they spend.

    Subclasses set ``name`` (the accounting method: ``"rdp"``, ``"prv"``, ...),
    ``mechanism`` (what is accounted, e.g. ``"gaussian-subsampled"``) and
    ``param_names`` (the keyword arguments of ``step``), and implement
    ``_validate_params`` and ``_compute_epsilon``; those that keep derived state (a
    running RDP curve) also override ``_record`` and ``_restore``.

    ``history`` is a list of ``(params, num_steps)`` with consecutive identical steps
    merged, as in Opacus; it is what ``state_dict`` saves (RDP-curve accountants add
    their composed curve, which loading checks against the history).
    """

    name: str  # a class attribute, or set per instance (OpacusAccountant picks rdp / prv)
    mechanism: ClassVar[str]
    param_names: ClassVar[tuple[str, ...]]

    def __init__(self) -> None:
        self._history: list[tuple[Params, int]] = []

    # ------------------------------------------------------------------ recording
    def step(self, **mechanism_params: float) -> None:
        """Record one use of the mechanism with these parameters."""
        self._add(self._check_params(mechanism_params), 1)

    @property
    def history(self) -> list[tuple[Params, int]]:
        """``(params, num_steps)`` pairs, consecutive identical steps merged (a copy)."""
        return [(dict(params), num_steps) for params, num_steps in self._history]

    def __len__(self) -> int:
        """Total number of recorded steps (Opacus counts history entries instead)."""
        return sum(num_steps for _, num_steps in self._history)

    # ------------------------------------------------------------------ reporting
    def get_epsilon(self, delta: float) -> float:
        """ε spent by everything recorded so far, at this δ; 0.0 before any step."""
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if not self._history:
            return 0.0
        return float(self._compute_epsilon(delta))

    def epsilon_if(self, delta: float, steps: int = 1, **mechanism_params: float) -> float:
        """ε after ``steps`` more steps, without changing this accountant.

        Uses the last step's parameters when none are given. The budget callback asks
        this before each step, to stop *before* the step that would pass its target.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        if mechanism_params:
            params = self._check_params(mechanism_params)
        elif self._history:
            params = dict(self._history[-1][0])
        else:
            raise ValueError(
                "epsilon_if() needs the mechanism parameters: no step has been recorded yet "
                f"to reuse them from (expected {', '.join(self.param_names)})"
            )
        future = copy.deepcopy(self)
        if steps:
            future._add(params, steps)
        return future.get_epsilon(delta)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: accountant identity, format version and history."""
        return {
            "accountant": self.name,
            "mechanism": self.mechanism,
            "format_version": STATE_FORMAT_VERSION,
            "history": [
                {"params": dict(params), "steps": num_steps} for params, num_steps in self._history
            ],
        }

    def public_state_dict(self) -> dict[str, Any]:
        """What the privacy report shows: here the whole state, since it holds only the
        mechanism's public parameters (noise, sampling rate, steps)."""
        return self.state_dict()

    def resume_setting(self, saved_accountant: str) -> str:
        """The setting that selects ``saved_accountant`` for this mechanism, as `` (--flag value)``,
        for the refusal of a state another accountant wrote; '' where no setting chooses it."""
        return ""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace this accountant's record with a saved one.

        Raises ``AccountantStateError`` — and leaves this accountant unchanged — when the
        state is missing, malformed, of another format version, or was written by a
        different accountant or for a different mechanism.
        """
        self._check_identity(state)
        history = self._parse_history(state.get("history"))
        self._restore(state, history)
        self._history = history

    # ------------------------------------------------------------------ subclass hooks
    @abc.abstractmethod
    def _validate_params(self, params: Params) -> None:
        """Raise ``ValueError`` if these (finite, complete) parameters are out of range."""

    @abc.abstractmethod
    def _compute_epsilon(self, delta: float) -> float:
        """ε of the (non-empty) history at this δ."""

    def _record(self, params: Params, num_steps: int) -> None:
        """Update derived state for ``num_steps`` more steps; the history is handled.

        Nothing to do for accountants whose ε is computed from the history alone.
        """

    def _restore(self, state: Mapping[str, Any], history: list[tuple[Params, int]]) -> None:
        """Validate and load derived state saved next to ``history``.

        Must raise ``AccountantStateError`` before changing anything, so that a refused
        state leaves the accountant as it was. Nothing to do for accountants whose ε is
        computed from the history alone.
        """

    # ------------------------------------------------------------------ internals
    def _add(self, params: Params, num_steps: int) -> None:
        self._record(params, num_steps)
        if self._history and self._history[-1][0] == params:
            self._history[-1] = (self._history[-1][0], self._history[-1][1] + num_steps)
        else:
            self._history.append((params, num_steps))

    def _check_params(self, params: Mapping[str, Any]) -> Params:
        missing = set(self.param_names) - set(params)
        unexpected = set(params) - set(self.param_names)
        if missing or unexpected:
            raise ValueError(
                f"{type(self).__name__}.step() takes exactly {', '.join(self.param_names)}; "
                f"missing {sorted(missing)}, unexpected {sorted(unexpected)}"
            )
        checked: Params = {}
        for key in self.param_names:
            value = params[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{key} must be a real number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{key} must be finite, got {value}")
            checked[key] = float(value)
        self._validate_params(checked)
        return checked

    def _check_identity(self, state: Any) -> None:
        if not isinstance(state, Mapping) or not state:
            raise AccountantStateError(
                f"no saved {self.name!r} accountant state to load (got {state!r}); "
                "refusing to restart the privacy budget at zero"
            )
        for key in ("accountant", "mechanism", "format_version", "history"):
            if key not in state:
                raise AccountantStateError(
                    f"saved accountant state has no {key!r} entry; it is not a state written "
                    f"by {type(self).__name__}.state_dict()"
                )
        if state["accountant"] != self.name or state["mechanism"] != self.mechanism:
            raise AccountantStateError(
                f"saved privacy budget was recorded by the {state['accountant']!r} accountant "
                f"for the {state['mechanism']!r} mechanism, but this run uses {self.name!r} "
                f"for {self.mechanism!r}; resume with the accountant that wrote it"
                f"{self.resume_setting(state['accountant']) if state['mechanism'] == self.mechanism else ''}"
            )
        if state["format_version"] != STATE_FORMAT_VERSION:
            raise AccountantStateError(
                f"saved accountant state has format version {state['format_version']!r}; "
                f"this version of lightning-dpgan reads version {STATE_FORMAT_VERSION}"
            )

    def _parse_history(self, raw: Any) -> list[tuple[Params, int]]:
        if not isinstance(raw, list):
            raise AccountantStateError(f"saved history must be a list, got {type(raw).__name__}")
        history: list[tuple[Params, int]] = []
        for index, entry in enumerate(raw):
            if not isinstance(entry, Mapping) or set(entry) != {"params", "steps"}:
                raise AccountantStateError(
                    f"history entry {index} must be {{'params': ..., 'steps': ...}}, got {entry!r}"
                )
            steps = entry["steps"]
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                raise AccountantStateError(
                    f"history entry {index} has steps={steps!r}; expected an integer >= 1"
                )
            if not isinstance(entry["params"], Mapping):
                raise AccountantStateError(f"history entry {index} has no params mapping")
            try:
                params = self._check_params(entry["params"])
            except ValueError as error:
                raise AccountantStateError(f"history entry {index}: {error}") from error
            history.append((params, steps))
        return history
