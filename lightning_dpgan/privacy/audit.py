"""Empirical privacy auditing: a statistical lower bound on the ε a mechanism really has.

An (ε, δ)-DP mechanism run on neighbouring inputs D (without a canary record) and D' (with it)
limits every test that guesses "canary present": its true-positive rate TPR and false-positive
rate FPR satisfy ``TPR <= e^ε FPR + δ``, and the same with the outcomes' roles swapped (misses
against true negatives) and with the inputs' roles swapped (:func:`epsilon_lower_bound`). So
from ``trials`` runs on each input, ε is at least ``log((TPR - δ) / FPR)`` (and its three
twins) -- read at the ends of Clopper-Pearson intervals of both rates (the lower end of the
larger rate, the upper end of the smaller), each wide enough that all four forms hold together
with the stated confidence (Jagielski, Ullman & Oprea 2020, "Auditing Differentially Private
Machine Learning"; Nasr et al. 2021).

A sound mechanism gives ``epsilon_lower <= epsilon`` (up to the confidence level); a broken one
-- noise at the wrong scale, a record reaching several teachers -- is caught when its
``epsilon_lower`` exceeds the claimed ε. The tests run these audits on each mechanism as
implemented here, and on deliberately broken variants built only inside the tests.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of a binomial proportion at ``confidence``."""
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes}, {trials}")
    alpha = 1.0 - confidence
    low = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return low, high


def epsilon_lower_bound(
    true_positives: int, false_positives: int, trials: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """The ε any (ε, δ)-DP mechanism must have for a test with these counts (``trials`` runs
    with the canary, ``trials`` without), at ``confidence``; 0 when nothing can be concluded.

    (ε, δ)-DP bounds every outcome's probability on one input by e^ε times its probability on
    the other, plus δ, in both directions. So four inequalities hold: ``TPR <= e^ε FPR + δ``,
    ``TNR <= e^ε FNR + δ`` (a test that flags the canary), and, swapped, ``FPR <= e^ε TPR + δ``,
    ``FNR <= e^ε TNR + δ`` (a test whose guesses run the wrong way: the canary makes "canary"
    rarer). The four read the four ends of the two rates' intervals, so each end is taken at
    one-sided error ``(1 - confidence) / 4`` (two-sided intervals at ``1 - (1 - confidence) / 2``):
    by the union bound all four ends hold at once with probability ``confidence``, whichever
    form turns out the largest. (Intervals at ``confidence`` itself would cover only
    ``2 confidence - 1`` jointly: 90 % where 95 % was asked.)"""
    interval_confidence = 1.0 - (1.0 - confidence) / 2
    tpr_low, tpr_high = clopper_pearson(true_positives, trials, interval_confidence)
    fpr_low, fpr_high = clopper_pearson(false_positives, trials, interval_confidence)
    return max(0.0,
               _log_ratio_bound(tpr_low, fpr_high, delta),  # TPR <= e^ε FPR + δ
               _log_ratio_bound(1.0 - fpr_high, 1.0 - tpr_low, delta),  # TNR <= e^ε FNR + δ
               _log_ratio_bound(fpr_low, tpr_high, delta),  # FPR <= e^ε TPR + δ
               _log_ratio_bound(1.0 - tpr_high, 1.0 - fpr_low, delta))  # FNR <= e^ε TNR + δ


def _log_ratio_bound(larger_low: float, smaller_high: float, delta: float) -> float:
    """The ε that ``larger <= e^ε smaller + δ`` needs, at the lower end of ``larger``'s interval
    and the upper end of ``smaller``'s; 0 where that says nothing (a negative value, where the
    rates run the other way, is as uninformative: the caller's floor of 0 takes it)."""
    if larger_low - delta > 0 and smaller_high > 0:
        return math.log((larger_low - delta) / smaller_high)
    return 0.0


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower: float
    true_positives: int
    false_positives: int
    trials: int
    confidence: float


def audit(
    run: Callable[[bool, np.random.Generator], float],
    threshold: float,
    trials: int,
    delta: float = 0.0,
    confidence: float = 0.95,
    seed: int = 0,
) -> AuditResult:
    """Run ``run(canary, rng) -> score`` ``trials`` times with the canary and without; guess
    "canary" when the score exceeds ``threshold``, and bound ε from the guesses.

    The threshold must be fixed before the runs (choosing it on the same runs would bias the
    bound upwards).
    """
    rng = np.random.default_rng(seed)
    true_positives = sum(run(True, rng) > threshold for _ in range(trials))
    false_positives = sum(run(False, rng) > threshold for _ in range(trials))
    bound = epsilon_lower_bound(true_positives, false_positives, trials, delta, confidence)
    return AuditResult(bound, int(true_positives), int(false_positives), trials, confidence)


__all__ = ["AuditResult", "audit", "clopper_pearson", "epsilon_lower_bound"]
