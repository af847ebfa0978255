"""PATE-GAN's moments accountant against values worked out by hand in the test, and the noisy
argmax's Laplace noise scale (1/lambda, not lambda: a bug found in public PATE-GAN code)."""
import math
import warnings

import numpy as np
import pytest
import torch

from lightning_dpgan.callbacks.pate import PATEAggregation
from lightning_dpgan.config import resolve
from lightning_dpgan.privacy.accountants import AccountantStateError, PATEMomentsAccountant
from lightning_dpgan.privacy.analysis.pate import (
    DEFAULT_MOMENT_ORDERS,
    data_dependent_moments,
    data_independent_moments,
    moments_to_epsilon,
)
from lightning_dpgan.privacy.mechanisms import laplace_noisy_argmax
from preset_helpers import modes_epsilon

ORDERS = np.arange(1, 101, dtype=float)


def hand_independent(lam, l):
    """PATE-GAN's data-independent bound, capped by the privacy loss of a 2 lambda-DP mechanism."""
    return min(2 * lam * lam * l * (l + 1), 2 * lam * l)


def hand_moment(lam, gap, l):
    """The per-query bound written out from PATE-GAN Algorithm 1, lines 17-19, for one order."""
    independent = hand_independent(lam, l)
    q = (2 + lam * abs(gap)) / (4 * math.exp(lam * abs(gap)))
    if q >= (math.exp(2 * lam) - 1) / (math.exp(4 * lam) - 1):
        return independent
    dependent = math.log((1 - q) * ((1 - q) / (1 - math.exp(2 * lam) * q)) ** l + q * math.exp(2 * lam * l))
    return min(independent, dependent)


@pytest.mark.parametrize("lam", [0.01, 0.05, 0.1, 0.5])
@pytest.mark.parametrize("gap", [0, 3, 40, 300])
@pytest.mark.parametrize("l", [1, 2, 7, 30, 128, 512])
def test_per_query_moment_equals_the_hand_computed_bound(lam, gap, l):
    column = list(DEFAULT_MOMENT_ORDERS).index(l)
    got = data_dependent_moments(lam, np.array([gap]), DEFAULT_MOMENT_ORDERS)[0, column]
    assert got == pytest.approx(hand_moment(lam, gap, l), rel=1e-9)


def test_high_orders_let_confident_queries_fit_in_epsilon_a_tenth():
    """With orders up to 100 the tail bound alone is log(1/delta)/100 = 0.115 at delta = 1e-5, so
    not one query fits in epsilon = 0.1; the default grid goes on to order 1024."""
    lam, delta, gaps = 0.05, 1e-5, np.array([1000] * 5)
    assert moments_to_epsilon(np.zeros_like(ORDERS), delta, ORDERS) > 0.1

    accountant = PATEMomentsAccountant()
    accountant.step(lam, gaps)

    moments = {l: sum(hand_moment(lam, g, l) for g in gaps) for l in DEFAULT_MOMENT_ORDERS}
    by_hand = min((moments[l] + math.log(1 / delta)) / l for l in DEFAULT_MOMENT_ORDERS)
    assert accountant.get_epsilon(delta) == pytest.approx(by_hand, rel=1e-9)
    assert accountant.get_epsilon(delta) < 0.1


@pytest.mark.parametrize("lam", [0.5, 1.0, 2.0])
def test_one_query_never_costs_more_than_its_pure_dp_epsilon(lam):
    """The noisy argmax is 2 lambda-DP: with any votes, one query's log-moment is at most
    2 lambda l, so its epsilon is at most 2 lambda plus the tail's log(1/delta)/l at the top order.
    PATE-GAN's 2 lambda^2 l (l + 1) alone gave 11.76 for one query at lambda = 1, delta = 1e-5."""
    delta = 1e-5
    accountant = PATEMomentsAccountant()
    accountant.step(lam, [0])
    top = DEFAULT_MOMENT_ORDERS[-1]
    assert accountant.epsilon_data_independent(delta) == pytest.approx(2 * lam + math.log(1 / delta) / top, rel=1e-9)
    uncapped = min((2 * lam**2 * l * (l + 1) + math.log(1 / delta)) / l for l in DEFAULT_MOMENT_ORDERS)
    assert accountant.epsilon_data_independent(delta) < uncapped


def test_a_big_vote_gap_costs_much_less_than_a_tie():
    lam = 0.1
    tie = data_dependent_moments(lam, np.array([0]), ORDERS)[0]
    consensus = data_dependent_moments(lam, np.array([500]), ORDERS)[0]
    assert np.allclose(tie, data_independent_moments(lam, ORDERS))  # a tie gets no discount
    assert (consensus[:20] < tie[:20] / 10).all()


def test_epsilon_from_moments_is_the_tail_bound_minimised_over_orders():
    lam, queries, delta = 0.02, 1000, 1e-5
    alpha = data_independent_moments(lam, ORDERS) * queries
    by_hand = min((hand_independent(lam, l) * queries + math.log(1 / delta)) / l for l in range(1, 101))
    assert moments_to_epsilon(alpha, delta, ORDERS) == pytest.approx(by_hand, rel=1e-12)


def test_accountant_sums_queries_and_reports_both_figures():
    lam, delta = 0.05, 1e-5
    gaps = np.array([0, 10, 10, 200, 37])
    accountant = PATEMomentsAccountant()
    accountant.step(lam, gaps[:1])
    accountant.step(lam, gaps[1:])  # two queries of one gap: each is charged, not each distinct gap
    assert len(accountant) == 5
    orders = DEFAULT_MOMENT_ORDERS
    dependent = sum(np.array([hand_moment(lam, g, l) for l in orders]) for g in gaps)
    by_hand = min((moment + math.log(1 / delta)) / l for moment, l in zip(dependent, orders))
    assert accountant.epsilon_data_dependent(delta) == pytest.approx(by_hand, rel=1e-9)
    independent = min((5 * hand_independent(lam, l) + math.log(1 / delta)) / l for l in orders)
    assert accountant.epsilon_data_independent(delta) == pytest.approx(independent, rel=1e-9)
    assert accountant.epsilon_data_dependent(delta) <= accountant.epsilon_data_independent(delta)


def test_every_query_is_charged_even_when_all_teachers_agree():
    accountant = PATEMomentsAccountant()
    accountant.step(0.1, [1000])  # unanimous: still a query, still a cost
    by_hand = min((hand_moment(0.1, 1000, l) + math.log(1e5)) / l for l in DEFAULT_MOMENT_ORDERS)
    assert len(accountant) == 1 and accountant.get_epsilon(1e-5) == pytest.approx(by_hand, rel=1e-9)
    assert by_hand > 0


def test_look_ahead_charges_the_data_independent_bound_and_changes_nothing():
    accountant = PATEMomentsAccountant()
    accountant.step(0.05, [100] * 10)
    before = accountant.get_epsilon(1e-5)
    ahead = accountant.epsilon_if_queries(1e-5, 64, 0.05)
    stepped_worst = PATEMomentsAccountant()
    stepped_worst.step(0.05, [100] * 10)
    stepped_worst.step(0.05, [0] * 64)  # a tie costs the data-independent bound
    assert ahead == pytest.approx(stepped_worst.get_epsilon(1e-5), rel=1e-12)
    assert accountant.get_epsilon(1e-5) == before and len(accountant) == 10
    # under data-independent accounting the queries already answered count at that bound too,
    # whatever their vote gaps: 74 queries at the bound, by hand
    independent = PATEMomentsAccountant("data-independent")
    independent.step(0.05, [100] * 10)
    by_hand = min((74 * hand_independent(0.05, l) + math.log(1e5)) / l for l in DEFAULT_MOMENT_ORDERS)
    assert independent.epsilon_if_queries(1e-5, 64, 0.05) == pytest.approx(by_hand, rel=1e-9)


def test_look_ahead_at_a_vote_gap_equals_answering_such_queries_and_scales_to_huge_counts():
    accountant = PATEMomentsAccountant()
    accountant.step(0.5, [80, 90])
    answered = accountant.epsilon_if_answered(1e-5, 0.5, np.full(500, 100))
    assert accountant.epsilon_if_queries(1e-5, 500, 0.5, vote_gap=100) == pytest.approx(answered, rel=1e-12)
    # budget planning asks about billions of queries: one curve times the count, no per-query array
    assert math.isfinite(accountant.epsilon_if_queries(1e-5, 10**9, 0.5, vote_gap=100))


def test_state_round_trip_and_refusals():
    accountant = PATEMomentsAccountant()
    accountant.step(0.05, [0, 5, 5, 90])
    accountant.step(0.02, [7])
    restored = PATEMomentsAccountant()
    restored.load_state_dict(accountant.state_dict())
    assert restored.get_epsilon(1e-5) == accountant.get_epsilon(1e-5) and len(restored) == 5
    bad = accountant.state_dict()
    bad["queries"][0]["gap_counts"]["5"] = -2
    for state in (None, {}, {**accountant.state_dict(), "accountant": "rdp"}, bad):
        with pytest.raises(AccountantStateError):
            restored.load_state_dict(state)
    assert len(restored) == 5  # a refused state leaves the accountant as it was


@pytest.mark.parametrize("accounting", ["data-dependent", "data-independent"])
def test_a_run_resumed_from_its_saved_state_reports_the_uninterrupted_runs_epsilon_bit_for_bit(accounting):
    """The curves were summed batch by batch in a live run and gap by gap on a load: 400 batches
    of 64 votes resumed at batch 200 reported 358.72612951152496 against 358.726129511525."""
    import json

    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 500, size=64) for _ in range(400)]
    uninterrupted, resumed = PATEMomentsAccountant(accounting), None
    for index, gaps in enumerate(batches):
        if index == 200:  # the checkpoint's state, through JSON as a checkpoint keeps it
            resumed = PATEMomentsAccountant(accounting)
            resumed.load_state_dict(json.loads(json.dumps(uninterrupted.state_dict())))
        uninterrupted.step(1.0, gaps)
        if resumed is not None:
            resumed.step(1.0, gaps)
    for delta in (1e-5, 1e-6):
        assert resumed.epsilon_data_dependent(delta) == uninterrupted.epsilon_data_dependent(delta)
        assert resumed.epsilon_data_independent(delta) == uninterrupted.epsilon_data_independent(delta)


def test_noisy_argmax_uses_laplace_scale_one_over_lambda():
    """P(noisy argmax flips a gap g) for two counts with Laplace(b) each is
    0.5 * exp(-g/b) * (1 + g/(2b)) (difference of two Laplace variables): check it at b = 1/lambda."""
    torch.manual_seed(0)
    lam, gap, n = 0.5, 2.0, 200_000
    votes = torch.tensor([[gap, 0.0]]).repeat(n, 1)
    flipped = (laplace_noisy_argmax(votes, lam) == 1).double().mean().item()
    b = 1 / lam
    expected = 0.5 * math.exp(-gap / b) * (1 + gap / (2 * b))
    assert flipped == pytest.approx(expected, abs=0.005)
    wrong_scale = 0.5 * math.exp(-gap / lam) * (1 + gap / (2 * lam))  # scale lambda instead of 1/lambda
    assert abs(flipped - wrong_scale) > 0.05


def test_noisy_argmax_is_exact_without_noise_in_the_limit():
    votes = torch.tensor([[3.0, 9.0], [12.0, 0.0]])
    assert laplace_noisy_argmax(votes, 1e6).tolist() == [1, 0]
    with pytest.raises(ValueError):
        laplace_noisy_argmax(votes, 0.0)


def test_wide_vote_gaps_at_a_large_lambda_compute_without_overflow():
    """lambda * gap in the thousands (lambda = 2, 1000 teachers): q in floats underflowed to 0,
    which made the query free at every order. From log q the bound keeps its term
    log q + 2 lambda l, which dominates at high orders, and nothing warns."""
    lam, gap = 2.0, 1000.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moments = data_dependent_moments(lam, np.array([gap]))[0]
    log_q = math.log((2 + lam * gap) / 4) - lam * gap
    high = list(DEFAULT_MOMENT_ORDERS).index(1024)
    assert moments[high] == pytest.approx(log_q + 2 * lam * 1024, rel=1e-9)
    assert np.isfinite(moments).all() and moments[0] < 1e-300


#: training rows of the datasets with PATE presets (the seeded 80/20 split for king and credit),
#: which set the default number of teachers, N / 1000
TRAIN_ROWS = {"adult": 30_162, "king": 17_290, "kaggle-credit": 227_846}


def step_cost_and_budget(model: str, dataset: str, epsilon: float, num_teachers: int | None = None) -> tuple[float, float]:
    """What one training step of unanimous votes costs with a preset's teachers (or
    ``num_teachers`` of them) at the preset's delta, and the budget its training has: epsilon
    less the modes' histogram, restated for the teachers' replace-one neighbours as the run does."""
    config = resolve({"model": model, "dataset": dataset, "epsilon": epsilon}, {})
    privacy = config["privacy"]
    teachers = num_teachers or privacy.get("num_teachers") or TRAIN_ROWS[dataset] // PATEAggregation.records_per_teacher
    queries = config["model"]["student_steps"] * privacy["teacher_batch_size"]
    cost = PATEMomentsAccountant().epsilon_if_queries(
        config["delta"], queries, privacy["lap_inverse_scale"], vote_gap=teachers)
    modes = {"epsilon": modes_epsilon(config), "delta": 0.0, "mechanism": "modes", "neighbours": "add-remove"}
    return cost, epsilon - PATEAggregation().composed_preprocessing(modes, {})["epsilon"]


@pytest.mark.parametrize("dataset", list(TRAIN_ROWS))
@pytest.mark.parametrize("model", ["pategan", "patectgan"])
def test_pate_presets_at_epsilon_a_tenth_have_teachers_enough_for_a_step(model, dataset):
    """A unanimous query of K teachers costs about 2 log(1/delta) / K: the epsilon-1 presets'
    teachers cannot pay for one step out of 0.1, the epsilon-0.1 presets' can, one and a half
    times over (else the run is refused before its first step)."""
    config = resolve({"model": model, "dataset": dataset, "epsilon": 0.1}, {})
    cost, budget = step_cost_and_budget(model, dataset, 0.1)
    assert cost < budget / 1.5
    floor = 2 * math.log(1 / config["delta"]) / config["privacy"]["num_teachers"]
    assert 0.8 * floor < cost < 1.2 * floor

    at_one = (resolve({"model": model, "dataset": dataset, "epsilon": 1.0}, {})["privacy"].get("num_teachers")
              or TRAIN_ROWS[dataset] // PATEAggregation.records_per_teacher)
    too_few, _ = step_cost_and_budget(model, dataset, 0.1, num_teachers=at_one)
    assert too_few > budget
