"""Empirical audits of each mechanism as implemented: a sound one never shows more epsilon
than it claims; a deliberately broken variant (built only here) is caught."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_dpgan.privacy.accountants import ConfidentGNMaxAccountant, GaussianAccountant
from lightning_dpgan.privacy.audit import audit, clopper_pearson, epsilon_lower_bound
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism
from lightning_dpgan.privacy.noise_source import NoiseSource
from lightning_dpgan.privacy.gradient_voting import ProjectedGradientAggregator
from lightning_dpgan.privacy.mechanisms import NO_ANSWER, confident_gnmax, laplace_noisy_argmax

DELTA = 1e-5


def test_clopper_pearson_matches_its_closed_form_at_the_ends():
    n, alpha = 50, 0.05
    assert clopper_pearson(0, n, 0.95) == (0.0, pytest.approx(1 - (alpha / 2) ** (1 / n)))
    assert clopper_pearson(n, n, 0.95) == (pytest.approx((alpha / 2) ** (1 / n)), 1.0)
    # in between: R's binom.test(20, 50) prints the 95 % interval 0.2640784 0.5482060
    assert clopper_pearson(20, n, 0.95) == (pytest.approx(0.2640784, abs=1e-7), pytest.approx(0.5482060, abs=1e-7))


def test_the_epsilon_bound_of_an_imperfect_test_with_delta_matches_scipys_exact_intervals():
    """40 of 50 canary runs flagged, 10 of 50 clean ones: each direction's bound worked out from
    scipy's own exact binomial intervals, with delta subtracted as (epsilon, delta)-DP allows.
    The intervals are 97.5 % ones: four interval ends are read, each may miss with 1.25 %, so
    all four hold together at 95 % (union bound)."""
    from scipy.stats import binomtest

    n, delta = 50, 1e-3
    tpr = binomtest(40, n).proportion_ci(0.975, method="exact")
    fpr = binomtest(10, n).proportion_ci(0.975, method="exact")
    positive = math.log((tpr.low - delta) / fpr.high)  # TPR <= e^eps FPR + delta
    negative = math.log((1 - fpr.high - delta) / (1 - tpr.low))  # TNR <= e^eps FNR + delta
    assert epsilon_lower_bound(40, 10, n, delta=delta) == pytest.approx(max(positive, negative), rel=1e-9)
    assert epsilon_lower_bound(40, 10, n, delta=delta) < epsilon_lower_bound(40, 10, n)  # delta forgives some


@pytest.mark.parametrize("true_positives, false_positives", [(50, 25), (25, 0)])
def test_each_direction_of_the_bound_counts_where_it_is_the_larger(true_positives, false_positives):
    """Every canary run flagged and half the clean ones: only the second direction (the clean
    runs' true negatives against the canary runs' misses) concludes; and the mirror case."""
    from scipy.stats import binomtest

    n = 50
    tpr = binomtest(true_positives, n).proportion_ci(0.975, method="exact")
    fpr = binomtest(false_positives, n).proportion_ci(0.975, method="exact")
    positive = math.log(tpr.low / fpr.high)  # TPR <= e^eps FPR
    negative = math.log((1 - fpr.high) / (1 - tpr.low))  # TNR <= e^eps FNR
    assert abs(positive - negative) > 0.3  # one direction is clearly the larger
    assert epsilon_lower_bound(true_positives, false_positives, n) == pytest.approx(max(positive, negative, 0.0), rel=1e-9)


def test_a_test_whose_guesses_run_the_wrong_way_is_bounded_by_the_swapped_inequalities():
    """10 of 50 canary runs flagged and 40 of 50 clean ones: the canary makes "canary" rarer, which
    (epsilon, delta)-DP limits as much (FPR <= e^eps TPR + delta, FNR <= e^eps TNR + delta). Worked
    out from scipy's exact intervals; the two unswapped directions conclude nothing here."""
    from scipy.stats import binomtest

    n, delta = 50, 1e-3
    tpr = binomtest(10, n).proportion_ci(0.975, method="exact")
    fpr = binomtest(40, n).proportion_ci(0.975, method="exact")
    swapped_positive = math.log((fpr.low - delta) / tpr.high)  # FPR <= e^eps TPR + delta
    swapped_negative = math.log((1 - tpr.high - delta) / (1 - fpr.low))  # FNR <= e^eps TNR + delta
    assert tpr.low < fpr.high and 1 - fpr.high < 1 - tpr.low  # the unswapped directions give nothing
    bound = epsilon_lower_bound(10, 40, n, delta=delta)
    assert bound == pytest.approx(max(swapped_positive, swapped_negative), rel=1e-9) and bound > 0.5
    assert bound == pytest.approx(epsilon_lower_bound(40, 10, n, delta=delta), rel=1e-9)  # the mirror image
    assert epsilon_lower_bound(0, n, n) == pytest.approx(epsilon_lower_bound(n, 0, n))  # always wrong: as telling


def test_a_perfect_test_bounds_epsilon_by_the_trial_count_only():
    n, alpha = 1000, 0.05
    tpr_low = (alpha / 4) ** (1 / n)  # one-sided error alpha / 4: four interval ends are read
    expected = math.log(tpr_low / (1 - tpr_low))
    assert epsilon_lower_bound(n, 0, n) == pytest.approx(expected)
    assert epsilon_lower_bound(500, 500, n) == 0.0  # a coin flip proves nothing


@pytest.mark.parametrize("epsilon", [0.0, 1.0])
def test_the_bound_exceeds_the_true_epsilon_at_most_one_time_in_twenty(epsilon):
    """Randomized response at exactly epsilon (TPR = e^eps / (1 + e^eps), FPR = 1 - TPR) is the
    mechanism every form of the inequality is tight for: over every outcome of 20 trials per
    side, weighted by its binomial probability, the bound passes epsilon with probability at
    most 5 % at 95 % confidence -- in either direction, as the wrong-way forms are read too."""
    from scipy.stats import binom

    n = 20
    tpr = math.exp(epsilon) / (1 + math.exp(epsilon))
    above = [(tp, fp) for tp in range(n + 1) for fp in range(n + 1)
             if epsilon_lower_bound(tp, fp, n) > epsilon + 1e-12]
    assert above  # some outcomes do overstate epsilon ...
    chance = sum(binom.pmf(tp, n, tpr) * binom.pmf(fp, n, 1 - tpr) for tp, fp in above)
    assert chance <= 0.05  # ... but, together, rarely


# ---------------------------------------------------------------- PATE (Laplace)
def laplace_audit(lap_inverse_scale_used: float, trials: int = 4000) -> float:
    """Canary: one teacher moves its vote, (m+1, m-1) -> (m, m); guess "canary" on label 1."""
    torch.manual_seed(0)
    without = laplace_noisy_argmax(torch.tensor([[11, 9]]).repeat(trials, 1), lap_inverse_scale_used)
    with_canary = laplace_noisy_argmax(torch.tensor([[10, 10]]).repeat(trials, 1), lap_inverse_scale_used)
    return epsilon_lower_bound(int((with_canary == 1).sum()), int((without == 1).sum()), trials)


def test_audit_of_the_laplace_noisy_argmax():
    lam = 0.5  # claimed: each answer is (2 lambda, 0)-DP = (1, 0)
    assert laplace_audit(lam) <= 2 * lam
    # broken: the scale lambda used where 1/lambda belongs (a bug an audit found in public code)
    assert laplace_audit(1 / lam) > 2 * lam


# ------------------------------------------------------- Confident-GNMax threshold
def threshold_audit(noise_scale: float, trials: int = 4000) -> float:
    """Canary: the top count rises by one (50 -> 51, threshold 50.5); guess "canary" when answered."""
    torch.manual_seed(1)
    threshold = 50.0
    answered = {}
    for canary, top in ((False, 50), (True, 51)):
        votes = torch.tensor([[top, 0]]).repeat(trials, 1)
        answers = confident_gnmax(votes, threshold + 0.5, noise_scale, 1.0)
        answered[canary] = int((answers != NO_ANSWER).sum())
    return epsilon_lower_bound(answered[True], answered[False], trials, DELTA)


def test_audit_of_the_confident_gnmax_threshold():
    sigma1 = 1.0
    accountant = ConfidentGNMaxAccountant("data-independent")
    accountant.step(sigma1, 1e6, 1)  # one threshold check, no answer
    claimed = accountant.epsilon_data_independent(DELTA)
    assert threshold_audit(sigma1) <= claimed
    assert threshold_audit(sigma1 / 20) > claimed  # broken: noise scale off by a factor


# --------------------------------------------------- G-PATE gradient aggregation
def aggregation_audit(canary_reaches_all_teachers: bool, trials: int = 600) -> tuple[float, float]:
    """Canary: a record whose teacher's gradient points the other way. Sound: it changes one
    teacher. Broken: it reaches every teacher (as if partitions overlapped completely)."""
    teachers, dim, sigma = 20, 8, 8.0
    gradient = torch.ones(dim) / math.sqrt(dim) * 1e-3

    def run(canary: bool, rng: np.random.Generator) -> float:
        grads = gradient.expand(teachers, 1, dim).clone()
        if canary:
            flipped = slice(None) if canary_reaches_all_teachers else slice(0, 1)
            grads[flipped] = -grads[flipped]
        aggregator = ProjectedGradientAggregator(4, 10, 1e-3, sigma, sigma, teachers / 2, check=lambda votes: None,
                                                 charge=lambda votes, answered: None)
        return -float(aggregator.aggregate(grads)[0] @ gradient)

    torch.manual_seed(2)
    accountant = ConfidentGNMaxAccountant("data-independent")
    accountant.step(sigma, sigma, 4, np.zeros(4))  # 4 queries, all answered: the worst case
    return audit(run, threshold=0.0, trials=trials).epsilon_lower, accountant.epsilon_data_independent(DELTA)


def test_audit_of_projected_gradient_voting():
    measured, claimed = aggregation_audit(canary_reaches_all_teachers=False)
    assert measured <= claimed
    measured, claimed = aggregation_audit(canary_reaches_all_teachers=True)
    assert measured > claimed


# ----------------------------------------------------------------------- DP-SGD
def dpsgd_audit(noise_multiplier: float, trials: int = 1500) -> float:
    """One full-batch DP-SGD step with and without a canary record (add/remove neighbours);
    the score is the update along the canary's (clipped) gradient."""
    canary = torch.tensor([[3.0, 4.0, 0.0, 0.0]])  # gradient norm 5, clipped to 1
    direction = canary[0] / canary[0].norm()

    def run(with_canary: bool, rng: np.random.Generator) -> float:
        critic = nn.Linear(4, 1, bias=False)
        nn.init.zeros_(critic.weight)
        mechanism = DPSGDMechanism(noise_multiplier, 1.0, 1, noise=NoiseSource(int(rng.integers(1 << 62))),
                                   mode="hooks")
        mechanism.attach(critic)
        optimizer = mechanism.wrap_optimizer(torch.optim.SGD(critic.parameters(), lr=1.0))
        optimizer.zero_grad()
        if with_canary:
            mechanism.backward_real(critic(canary).squeeze(1))  # d/dW = canary
        optimizer.step()
        return float(-critic.weight.detach()[0] @ direction)  # SGD moved against the gradient

    return audit(run, threshold=0.5, trials=trials).epsilon_lower


def test_audit_of_a_dp_sgd_step():
    sigma = 1.0
    accountant = GaussianAccountant()
    accountant.step(noise_multiplier=sigma)
    claimed = accountant.get_epsilon(DELTA)
    assert dpsgd_audit(sigma) <= claimed
    assert dpsgd_audit(0.0) > claimed  # broken: no noise


# ---------------------------------------------------------------- gradient sanitizer
def sanitizer_audit(noise_used: float, trials: int = 1500) -> float:
    """Canary: a real record that turns the critic around, so every generated record's gradient
    flips. The score is the released gradient along the no-canary direction, negated."""
    from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism

    batch = 4
    direction = torch.ones(batch, 6) / math.sqrt(6)
    mechanism = GradientSanitizerMechanism(1.0, noise_used)

    def run(canary: bool, rng: np.random.Generator) -> float:
        x = torch.zeros(batch, 6, requires_grad=True)
        sign = -1.0 if canary else 1.0
        (sign * (mechanism.sanitize(x) * direction).sum()).backward()
        return -float((x.grad * direction).sum())

    torch.manual_seed(3)
    # scores: -1 or +1 (one clipped unit along the direction) plus noise of sd sigma / 2
    return audit(run, threshold=1.5, trials=trials).epsilon_lower


def test_audit_of_the_gradient_sanitizer():
    from lightning_dpgan.privacy.gradient_sanitizer import effective_noise_multiplier

    sigma, batch = 6.4, 4
    accountant = GaussianAccountant()
    accountant.step(noise_multiplier=effective_noise_multiplier(sigma, batch))  # 2 B lambda / sigma^2
    claimed = accountant.get_epsilon(DELTA)
    assert sanitizer_audit(sigma) <= claimed
    assert sanitizer_audit(sigma / batch) > claimed  # broken: the noise divided by B once too often


def test_audit_guesses_canary_only_when_the_score_exceeds_the_threshold():
    """A score exactly at the threshold is "no canary" (the docstring's "exceeds"): counting it
    as a guess would turn ties into true/false positives."""
    result = audit(lambda canary, rng: 1.0 if canary else 0.0, threshold=1.0, trials=10)
    assert (result.true_positives, result.false_positives) == (0, 0)
    result = audit(lambda canary, rng: 1.0 if canary else 0.0, threshold=0.0, trials=10)
    assert (result.true_positives, result.false_positives) == (10, 0)


def test_audit_passes_its_delta_to_the_bound():
    """(epsilon, delta)-DP forgives delta of the true-positive rate: audit(delta=...) must use it."""
    run = lambda canary, rng: 1.0 if canary else float(rng.random() < 0.2)  # noqa: E731
    with_delta = audit(run, threshold=0.5, trials=30, delta=0.2, seed=3)
    without = audit(run, threshold=0.5, trials=30, seed=3)
    assert (with_delta.true_positives, with_delta.false_positives) == (without.true_positives, without.false_positives)
    assert with_delta.epsilon_lower == pytest.approx(
        epsilon_lower_bound(with_delta.true_positives, with_delta.false_positives, 30, delta=0.2))
    assert with_delta.epsilon_lower < without.epsilon_lower


@pytest.mark.parametrize("successes, trials", [(5, 3), (-1, 3), (0, 0)])
def test_clopper_pearson_refuses_impossible_counts(successes, trials):
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(successes, trials, 0.95)
