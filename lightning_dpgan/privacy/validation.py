"""Checks on user-supplied privacy parameters, with messages that name the CLI flag.

These run before any training so a meaningless budget fails fast, telling the user which
flag to change and to what.
"""

from __future__ import annotations

import math
import numbers

# δ well below 1/n is the usual guidance (Dwork & Roth 2014, §2.3: δ ≥ 1/n admits
# mechanisms that publish some records in the clear); 1e-5 is the common default.
_RECOMMENDED_DELTA = 1e-5


def _as_real(flag: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{flag} must be a number, got {value!r}")
    return float(value)


def validate_positive(name: str, value: object) -> float:
    """Return ``value`` as a float if finite and > 0; ``name`` is the flag to blame."""
    number = _as_real(name, value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


#: the noise scales (noise multipliers, Laplace inverse scales, G-PATE's sigmas) the accountants can
#: compute with: they square them as floats, which overflows above ~1e154 and divides by zero below
#: ~1e-162; no useful setting is anywhere near either end
NOISE_SCALE_RANGE = (1e-100, 1e100)


def validate_within(name: str, value: object, bounds: tuple[float, float], why: str) -> float:
    """:func:`validate_positive` within ``bounds``; ``why`` says in the message what sets them."""
    number = validate_positive(name, value)
    low, high = bounds
    if not low <= number <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g} ({why}), got {value!r}")
    return number


def validate_noise_scale(name: str, value: object) -> float:
    """Within :data:`NOISE_SCALE_RANGE`: 1e300 or 1e-300 ended in an OverflowError or
    ZeroDivisionError inside an accountant, after the data was read."""
    return validate_within(name, value, NOISE_SCALE_RANGE, "the accountants square it")


def validate_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum``; ``2.5`` or ``True`` are
    refused rather than truncated. ``name`` is the flag or argument to blame."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def validate_epsilon(epsilon: object) -> float:
    """Return the target ε if it is a finite number > 0.

    ε = ∞ is no guarantee at all; a non-private run should use the non-private
    baseline, which reports no ε (``null``) itself, rather than a private model with no budget.
    """
    number = _as_real("--epsilon", epsilon)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(
            f"--epsilon must be a finite number > 0, got {epsilon!r}; pass a privacy "
            "budget such as --epsilon 1.0 (train a non-private baseline for no privacy)"
        )
    return number


def validate_delta(delta: object, n_records: int | None = None, flag: str = "--delta", origin: str = "") -> float:
    """Return δ if 0 < δ < 1 and, when the training set size is known, δ < 1/n.

    δ is the probability the ε guarantee fails; with δ ≥ 1/n a mechanism may release an
    entire record and still qualify (Dwork & Roth 2014, §2.3), so it is refused. ``flag`` is the
    option to blame (a preprocessing δ has its own); ``origin`` says where the value came from
    (a default the user never typed, a preset), so that the refusal does not read as theirs.
    """
    number = _as_real(flag, delta)
    if not 0.0 < number < 1.0:
        raise ValueError(
            f"{flag} must be strictly between 0 and 1, got {delta!r}; "
            f"pass e.g. {flag} {_RECOMMENDED_DELTA:g}"
        )
    if n_records is None:
        return number
    if isinstance(n_records, bool) or not isinstance(n_records, int) or n_records < 1:
        raise ValueError(f"n_records must be a positive integer, got {n_records!r}")
    if number >= 1.0 / n_records:
        raise ValueError(
            f"{flag} {number:g}{f' ({origin})' if origin else ''} is not below 1/n = {1.0 / n_records:g} for the "
            f"n = {n_records} training records; such a δ allows publishing whole records. "
            f"Pass {flag} < 1/n, e.g. {flag} {_suggest_delta(n_records):g}"
        )
    return number


def _suggest_delta(n_records: int) -> float:
    """1e-5, or a power of ten at least 10x below 1/n when 1e-5 is not below it."""
    below = 10.0 ** (math.floor(math.log10(1.0 / n_records)) - 1)
    return min(_RECOMMENDED_DELTA, below)
