"""Confident-GNMax RDP (Papernot et al. 2018, "Scalable Private Learning with PATE") against values
worked out by hand in the test with plain ``math``, and the accountant that composes it."""
import json
import math

import numpy as np
import pytest

from lightning_dpgan.privacy.accountants.base import AccountantStateError
from lightning_dpgan.privacy.accountants.gnmax import ConfidentGNMaxAccountant
from lightning_dpgan.privacy.analysis.gnmax import (
    gnmax_data_dependent_rdp,
    gnmax_data_independent_rdp,
    gnmax_log_q,
    round_log_q_up,
    threshold_rdp,
)
from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, rdp_to_epsilon

SMALL_ORDERS = [2.0, 5.0, 10.0, 20.0]
DELTA = 1e-5


def hand_log_q(counts, sigma):
    """Proposition 7 by hand: Pr[N(0, 2 sigma^2) >= g] = erfc(g / (2 sigma)) / 2, summed over the
    bins other than the (first) plurality, capped at 1 - 1/C."""
    top = counts.index(max(counts))
    q = sum(0.5 * math.erfc((counts[top] - n) / (2 * sigma)) for i, n in enumerate(counts) if i != top)
    return min(math.log(q), math.log(1 - 1 / len(counts)))


def theorem6_applies(log_q, sigma):
    q = math.exp(log_q)
    mu2 = sigma * math.sqrt(-log_q)
    mu1 = mu2 + 1
    eps2 = mu2 / sigma**2
    if mu2 <= 1:
        return False
    limit = math.exp((mu2 - 1) * eps2) / ((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1))) ** mu2
    return q <= limit and -log_q > eps2


def hand_theorem6(log_q, sigma, lam):
    """Theorem 6 with Proposition 10's orders, written out directly (no log-space tricks)."""
    q = math.exp(log_q)
    mu2 = sigma * math.sqrt(-log_q)
    mu1 = mu2 + 1
    eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
    assert theorem6_applies(log_q, sigma) and lam < mu1
    a = (1 - q) / (1 - (q * math.exp(eps2)) ** ((mu2 - 1) / mu2))
    b = math.exp(eps1) / q ** (1 / (mu1 - 1))
    return math.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)


def hand_gnmax_rdp(log_q, sigma, lam):
    independent = lam / sigma**2
    if theorem6_applies(log_q, sigma) and lam < sigma * math.sqrt(-log_q) + 1:
        return min(independent, hand_theorem6(log_q, sigma, lam))
    return independent


def hand_round_up(log_q):
    return max(math.ceil(round(log_q / 0.01, 6)) * 0.01, -1000.0)


# ------------------------------------------------------------------ closed forms
@pytest.mark.parametrize("sigma", [0.7, 5.0, 40.0, 150.0])
def test_threshold_and_data_independent_curves_are_the_gaussian_closed_forms(sigma):
    for lam, thr, ind in zip(SMALL_ORDERS, threshold_rdp(sigma, SMALL_ORDERS), gnmax_data_independent_rdp(sigma, SMALL_ORDERS)):
        assert thr == pytest.approx(lam / (2 * sigma * sigma), rel=1e-14)
        assert ind == pytest.approx(lam / (sigma * sigma), rel=1e-14)
    with pytest.raises(ValueError):
        threshold_rdp(0.0, SMALL_ORDERS)
    with pytest.raises(ValueError):
        gnmax_data_independent_rdp(float("inf"), SMALL_ORDERS)


# ------------------------------------------------------------------ Proposition 7
@pytest.mark.parametrize(
    "counts, sigma",
    [([250, 10, 5, 0, 0], 40.0), ([90, 5, 3, 2], 10.0), ([200, 150, 10, 0], 40.0), ([60, 40], 20.0), ([3, 1, 0], 1.0)],
)
def test_log_q_is_the_union_bound_by_hand(counts, sigma):
    assert gnmax_log_q(np.array(counts), sigma)[0] == pytest.approx(hand_log_q(counts, sigma), rel=1e-9)


def test_log_q_is_capped_at_one_minus_one_over_c_and_vectorised():
    # three-way tie: union bound 1/2 + 1/2 = 1 > 2/3, so the cap applies
    assert gnmax_log_q(np.array([50, 50, 50]), 10.0)[0] == pytest.approx(math.log(2 / 3), rel=1e-12)
    assert gnmax_log_q(np.array([50, 50]), 10.0)[0] == pytest.approx(math.log(1 / 2), rel=1e-12)
    votes = np.array([[250, 10, 5, 0, 0], [40, 40, 40, 40, 40], [0, 0, 0, 300, 0]])
    expected = [hand_log_q(row.tolist(), 40.0) for row in votes]
    assert expected[1] == pytest.approx(math.log(4 / 5))
    assert gnmax_log_q(votes, 40.0) == pytest.approx(expected, rel=1e-9)
    for bad in (np.array([5]), np.array([3, -1, 0]), np.array([[[1, 2]]]), np.array([1.0, np.nan])):
        with pytest.raises(ValueError):
            gnmax_log_q(bad, 10.0)


# ------------------------------------------------------------------ Theorem 6
@pytest.mark.parametrize("counts, sigma", [([250, 10, 5, 0, 0], 40.0), ([90, 5, 3, 2], 10.0), ([300, 20, 0, 0], 50.0)])
def test_data_dependent_rdp_is_theorem6_by_hand_and_beats_the_data_independent_bound(counts, sigma):
    log_q = hand_log_q(counts, sigma)
    got = gnmax_data_dependent_rdp(gnmax_log_q(np.array(counts), sigma), sigma, SMALL_ORDERS)[0]
    for lam, value in zip(SMALL_ORDERS, got):
        by_hand = hand_theorem6(log_q, sigma, lam)
        assert by_hand < lam / sigma**2  # the case is one where the bound really is used
        assert value == pytest.approx(by_hand, rel=1e-7)


def test_data_dependent_rdp_falls_back_where_theorem6_does_not_apply():
    sigma = 40.0
    tie = hand_log_q([100, 100, 0, 0, 0], sigma)
    assert not theorem6_applies(tie, sigma)  # q~ too large for Theorem 6
    got = gnmax_data_dependent_rdp(tie, sigma, SMALL_ORDERS)[0]
    assert got == pytest.approx([lam / sigma**2 for lam in SMALL_ORDERS], rel=1e-14)
    # mu2 = sigma * sqrt(-log q~) = 0.7 <= 1: no valid higher order
    assert gnmax_data_dependent_rdp(-0.49, 1.0, SMALL_ORDERS)[0] == pytest.approx(SMALL_ORDERS, rel=1e-14)
    # orders at or above mu1 keep the data-independent value: log q~ = -4, sigma = 2 gives mu1 = 5
    assert theorem6_applies(-4.0, 2.0)
    below, at, above = gnmax_data_dependent_rdp(-4.0, 2.0, [3.0, 5.0, 10.0])[0]
    assert below == pytest.approx(hand_theorem6(-4.0, 2.0, 3.0), rel=1e-9) and below < 3 / 4
    assert (at, above) == pytest.approx((5 / 4, 10 / 4), rel=1e-14)
    assert gnmax_data_dependent_rdp(-np.inf, 3.0, SMALL_ORDERS)[0] == pytest.approx([0.0] * 4, abs=0)


def test_data_dependent_rdp_matches_the_hand_bound_on_a_grid_and_is_never_worse():
    sigmas = [0.5, 1.0, 5.0, 40.0, 200.0]
    log_qs = np.concatenate([-np.logspace(-3, 3, 40), [-np.inf, 0.0]])
    orders = np.array(DEFAULT_ORDERS)
    for sigma in sigmas:
        dependent = gnmax_data_dependent_rdp(log_qs, sigma, orders)
        independent = gnmax_data_independent_rdp(sigma, orders)
        assert dependent.shape == (log_qs.size, orders.size)
        assert (dependent <= independent[None, :]).all() and (dependent >= 0).all()
        for lq in log_qs[:-2:7]:  # spot-check against the hand formula where floats allow it
            if lq > -200:
                row = gnmax_data_dependent_rdp(lq, sigma, SMALL_ORDERS)[0]
                expected = [hand_gnmax_rdp(lq, sigma, lam) for lam in SMALL_ORDERS]
                assert row == pytest.approx(expected, rel=1e-6, abs=1e-300)


def test_strong_consensus_costs_far_less_than_a_tie():
    sigma = 40.0
    consensus = gnmax_data_dependent_rdp(gnmax_log_q(np.array([500, 0, 0, 0, 0]), sigma), sigma, SMALL_ORDERS)[0]
    tie = gnmax_data_dependent_rdp(gnmax_log_q(np.array([250, 250, 0, 0, 0]), sigma), sigma, SMALL_ORDERS)[0]
    assert tie == pytest.approx(gnmax_data_independent_rdp(sigma, SMALL_ORDERS))
    assert (consensus < tie / 100).all() and (consensus >= 0).all()


def test_data_dependent_rdp_refuses_bad_inputs():
    for bad in (0.1, np.nan, [[-1.0]]):
        with pytest.raises(ValueError):
            gnmax_data_dependent_rdp(bad, 10.0, SMALL_ORDERS)
    with pytest.raises(ValueError):
        gnmax_data_dependent_rdp(-3.0, -1.0, SMALL_ORDERS)
    with pytest.raises(ValueError):
        gnmax_data_dependent_rdp(-3.0, 1.0, [1.0, 2.0])


# ------------------------------------------------------------------ rounding
def test_round_log_q_up_never_lowers_and_stays_within_the_resolution():
    rng = np.random.default_rng(0)
    values = np.concatenate([-rng.exponential(20.0, 5000), -np.arange(2000) * 0.01, [0.0, -1e-12, -0.3, -11.371]])
    rounded = round_log_q_up(values)
    assert (rounded >= values).all() and (rounded - values < 0.01 + 1e-9).all() and (rounded <= 0).all()
    steps = rounded / 0.01
    assert np.abs(steps - np.round(steps)).max() < 1e-6  # multiples of the resolution
    assert (round_log_q_up(rounded) == rounded).all()  # idempotent: saved keys reload unchanged
    assert round_log_q_up([-11.371, -0.3, -0.001]) == pytest.approx([-11.37, -0.3, 0.0], abs=1e-12)
    assert [hand_round_up(v) for v in (-11.371, -0.3, -0.001)] == pytest.approx(round_log_q_up([-11.371, -0.3, -0.001]).tolist())
    assert round_log_q_up([-np.inf, -5000.0, -999.999]).tolist() == [-1000.0, -1000.0, -999.99]
    assert round_log_q_up(-7.0, resolution=0.5, floor=-3.2).tolist() == [-3.0]
    for bad in (0.5, np.nan):
        with pytest.raises(ValueError):
            round_log_q_up(bad)
    with pytest.raises(ValueError):
        round_log_q_up(-1.0, resolution=0.0)


# ------------------------------------------------------------------ accountant
def hand_curve(checks, sigma1, sigma2, answered_log_q, orders=SMALL_ORDERS, dependent=True):
    """Composed curve by hand: every check pays lam/(2 sigma1^2), every answer Theorem 6 at its
    log q~ rounded up (or lam/sigma2^2)."""
    curve = []
    for lam in orders:
        total = checks * lam / (2 * sigma1**2)
        for lq in answered_log_q:
            total += hand_gnmax_rdp(hand_round_up(lq), sigma2, lam) if dependent else lam / sigma2**2
        curve.append(total)
    return np.array(curve)


@pytest.mark.filterwarnings("ignore:Optimal order is the:UserWarning")  # small grid / 10**9 queries
def test_accountant_composes_by_hand_computed_curves_over_noise_pairs():
    votes = np.array([[250, 10, 5, 0, 0], [90, 60, 0, 0, 0], [400, 0, 0, 0, 0], [120, 5, 5, 0, 0]])
    lq40 = gnmax_log_q(votes, 40.0)
    lq30 = gnmax_log_q(votes[:2], 30.0)
    accountant = ConfidentGNMaxAccountant(orders=SMALL_ORDERS)
    assert accountant.get_epsilon(DELTA) == 0.0 and accountant.epsilon_data_independent(DELTA) == 0.0
    accountant.step(200.0, 40.0, 10, lq40[:3])
    accountant.step(200.0, 40.0, 5, lq40[3:])
    accountant.step(150.0, 30.0, 7, lq30)
    assert len(accountant) == 22 and accountant.answered == 6
    dependent = hand_curve(15, 200.0, 40.0, lq40.tolist()) + hand_curve(7, 150.0, 30.0, lq30.tolist())
    independent = hand_curve(15, 200.0, 40.0, lq40.tolist(), dependent=False) + hand_curve(
        7, 150.0, 30.0, lq30.tolist(), dependent=False
    )
    assert accountant.epsilon_data_dependent(DELTA) == pytest.approx(rdp_to_epsilon(SMALL_ORDERS, dependent, DELTA)[0], rel=1e-7)
    assert accountant.epsilon_data_independent(DELTA) == pytest.approx(rdp_to_epsilon(SMALL_ORDERS, independent, DELTA)[0], rel=1e-12)
    assert accountant.get_epsilon(DELTA) == accountant.epsilon_data_dependent(DELTA)
    assert accountant.epsilon_data_dependent(DELTA) < accountant.epsilon_data_independent(DELTA)
    # rounding up only loosens: never below the curve at the exact log q~
    exact = sum(gnmax_data_dependent_rdp(lq40, 40.0, SMALL_ORDERS)) + sum(gnmax_data_dependent_rdp(lq30, 30.0, SMALL_ORDERS))
    exact = exact + threshold_rdp(200.0, SMALL_ORDERS) * 15 + threshold_rdp(150.0, SMALL_ORDERS) * 7
    assert accountant.epsilon_data_dependent(DELTA) >= rdp_to_epsilon(SMALL_ORDERS, exact, DELTA)[0]


def test_unanswered_queries_cost_only_the_threshold_check():
    accountant = ConfidentGNMaxAccountant()
    accountant.step(150.0, 40.0, 1000, [])
    orders = np.array(DEFAULT_ORDERS)
    expected = rdp_to_epsilon(orders, 1000 * orders / (2 * 150.0**2), DELTA)[0]
    assert len(accountant) == 1000 and accountant.answered == 0
    assert accountant.epsilon_data_dependent(DELTA) == pytest.approx(expected, rel=1e-12)
    assert accountant.epsilon_data_independent(DELTA) == pytest.approx(expected, rel=1e-12)


def test_data_independent_mode_charges_every_answer_lambda_over_sigma2_squared_and_still_records_log_q():
    accountant = ConfidentGNMaxAccountant(accounting="data-independent")
    log_q = gnmax_log_q(np.tile([300, 2, 0, 0], (50, 1)), 40.0)
    accountant.step(200.0, 40.0, 50, log_q)
    orders = np.array(DEFAULT_ORDERS)
    expected = rdp_to_epsilon(orders, 50 * (orders / (2 * 200.0**2) + orders / 40.0**2), DELTA)[0]
    assert accountant.get_epsilon(DELTA) == pytest.approx(expected, rel=1e-12)
    assert accountant.epsilon_data_dependent(DELTA) < accountant.get_epsilon(DELTA) / 2  # recorded anyway
    with pytest.raises(ValueError):
        ConfidentGNMaxAccountant(accounting="optimistic")


def test_step_refuses_impossible_records():
    accountant = ConfidentGNMaxAccountant()
    for args in ((1.0, 1.0, 2, [-1.0, -2.0, -3.0]), (1.0, 1.0, -1, []), (1.0, 1.0, 2.5, []), (0.0, 1.0, 1, []),
                 (1.0, 1.0, 3, [0.2]), (1.0, 1.0, 3, [np.nan])):
        with pytest.raises(ValueError):
            accountant.step(*args)
    assert len(accountant) == 0 and accountant.get_epsilon(DELTA) == 0.0


@pytest.mark.filterwarnings("ignore:Optimal order is the:UserWarning")  # small grid / 10**9 queries
def test_look_ahead_changes_nothing_and_agrees_with_stepping():
    accountant = ConfidentGNMaxAccountant()
    accountant.step(200.0, 40.0, 30, [-12.0, -3.0, -40.0])
    before, queries = accountant.get_epsilon(DELTA), len(accountant)
    answered = [-20.0] * 25
    ahead = accountant.epsilon_if_answered(DELTA, 200.0, 40.0, 100, answered)
    planned = accountant.epsilon_if_queries(DELTA, 100, 200.0, 40.0, answered_fraction=0.25, log_q=-20.0)
    worst = accountant.epsilon_if_queries(DELTA, 100, 200.0, 40.0, answered_fraction=0.25)
    assert accountant.get_epsilon(DELTA) == before and len(accountant) == queries and accountant.answered == 3
    accountant.step(200.0, 40.0, 100, answered)
    assert ahead == accountant.get_epsilon(DELTA)
    assert planned == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-12)
    stepped_worst = ConfidentGNMaxAccountant()
    stepped_worst.step(200.0, 40.0, 30, [-12.0, -3.0, -40.0])
    stepped_worst.step(200.0, 40.0, 100, [0.0] * 25)  # log q~ = 0: Theorem 6 gives nothing
    assert worst == pytest.approx(stepped_worst.get_epsilon(DELTA), rel=1e-12) and worst > planned
    # budget planning asks about millions of queries: one curve times the count
    assert math.isfinite(accountant.epsilon_if_queries(DELTA, 10**9, 200.0, 40.0, answered_fraction=0.01))
    assert ConfidentGNMaxAccountant().epsilon_if_queries(DELTA, 0, 1.0, 1.0) == 0.0
    fresh = ConfidentGNMaxAccountant()
    orders = np.array(DEFAULT_ORDERS)
    expected = rdp_to_epsilon(orders, 10 * orders / (2 * 100.0**2), DELTA)[0]
    assert fresh.epsilon_if_queries(DELTA, 10, 100.0, 40.0, answered_fraction=0.0) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError):
        fresh.epsilon_if_queries(DELTA, 10, 100.0, 40.0, answered_fraction=1.5)
    # data-independent accounting plans each answer at lambda / sigma2^2 whatever log q~ is given,
    # as stepping would: a plan that took Theorem 6's discount would start steps it cannot afford
    independent = ConfidentGNMaxAccountant("data-independent")
    by_hand = rdp_to_epsilon(orders, 100 * orders / (2 * 200.0**2) + 25 * orders / 40.0**2, DELTA)[0]
    for log_q in (None, -20.0):
        assert independent.epsilon_if_queries(DELTA, 100, 200.0, 40.0, answered_fraction=0.25, log_q=log_q) == (
            pytest.approx(by_hand, rel=1e-12))


def test_state_round_trip_gives_identical_epsilons():
    accountant = ConfidentGNMaxAccountant()
    rng = np.random.default_rng(1)
    votes = rng.multinomial(250, [0.7, 0.1, 0.1, 0.05, 0.05], size=40)
    accountant.step(200.0, 40.0, 60, gnmax_log_q(votes[:30], 40.0))
    accountant.step(150.0, 30.0, 20, gnmax_log_q(votes[30:], 30.0))
    accountant.step(200.0, 40.0, 5, [-np.inf])
    state = json.loads(json.dumps(accountant.state_dict()))
    assert state["accountant"] == "confident-gnmax-rdp" and state["mechanism"] == "confident-gnmax"
    restored = ConfidentGNMaxAccountant()
    restored.load_state_dict(state)
    assert len(restored) == 85 and restored.answered == 41
    assert restored.epsilon_data_dependent(DELTA) == accountant.epsilon_data_dependent(DELTA)
    assert restored.epsilon_data_independent(DELTA) == accountant.epsilon_data_independent(DELTA)
    assert restored.state_dict() == accountant.state_dict()


def test_malformed_or_foreign_states_are_refused_and_leave_the_accountant_unchanged():
    accountant = ConfidentGNMaxAccountant()
    accountant.step(200.0, 40.0, 10, [-12.0, -12.001, -3.0])
    good = accountant.state_dict()
    key = next(iter(good["noise_pairs"][0]["answered"]))

    def edited(change):
        state = json.loads(json.dumps(good))
        change(state)
        return state

    def set_count(value):
        return lambda s: s["noise_pairs"][0]["answered"].__setitem__(key, value)

    def set_key(new_key):
        return lambda s: s["noise_pairs"][0].__setitem__("answered", {new_key: 1})

    bad_states = [
        None, {}, [], {**good, "accountant": "pate-moments"}, {**good, "mechanism": "gnmax"},
        {**good, "format_version": 2}, {**good, "orders": [2.0, 3.0]}, {**good, "orders": "abc"},
        {**good, "accounting": "optimistic"}, {**good, "noise_pairs": {"a": 1}},
        edited(set_count(-1)), edited(set_count(1.5)), edited(set_count(True)), edited(set_count(100)),
        edited(set_key("abc")), edited(set_key("0.5")), edited(set_key("nan")), edited(set_key("-inf")),
        edited(lambda s: s["noise_pairs"][0].__setitem__("queries", 1)),
        edited(lambda s: s["noise_pairs"][0].__setitem__("sigma1", -1.0)),
        edited(lambda s: s["noise_pairs"][0].pop("sigma2")),
        edited(lambda s: s["noise_pairs"].append(s["noise_pairs"][0] | {"queries": -3})),
    ]
    restored = ConfidentGNMaxAccountant()
    restored.load_state_dict(good)
    before = (len(restored), restored.answered, restored.get_epsilon(DELTA), restored.state_dict())
    for state in bad_states:
        with pytest.raises(AccountantStateError):
            restored.load_state_dict(state)
        assert (len(restored), restored.answered, restored.get_epsilon(DELTA), restored.state_dict()) == before
    # two entries of one noise pair in a hand-written state add up, and must not exceed its checks
    doubled = edited(lambda s: s["noise_pairs"].append(s["noise_pairs"][0]))
    restored.load_state_dict(doubled)
    assert len(restored) == 20 and restored.answered == 6


def test_the_accountant_lists_the_noise_settings_it_charged():
    """What a resume from a checkpoint written before the strategy kept its last noise reads: the
    one (sigma1, sigma2) charged, or several (then the last is not known from the accountant)."""
    accountant = ConfidentGNMaxAccountant()
    assert accountant.noise_settings() == []
    accountant.step(600.0, 100.0, 30, np.array([-5.0, -3.0]))
    accountant.step(600.0, 100.0, 30)
    assert accountant.noise_settings() == [{"sigma1": 600.0, "sigma2": 100.0}]
    accountant.step(700.0, 100.0, 30)
    assert sorted(setting["sigma1"] for setting in accountant.noise_settings()) == [600.0, 700.0]


def test_loading_a_state_replaces_the_epsilon_already_computed():
    """An accountant that already reported an epsilon, then loads another state, reports the
    loaded state's spend (as a fresh accountant loading it does), not its own cached one."""
    saved = ConfidentGNMaxAccountant()
    saved.step(50.0, 10.0, 400, [-30.0] * 100)
    fresh = ConfidentGNMaxAccountant()
    fresh.load_state_dict(saved.state_dict())
    used = ConfidentGNMaxAccountant()
    used.step(500.0, 100.0, 3, [])
    small = used.get_epsilon(DELTA)
    used.load_state_dict(saved.state_dict())
    assert used.get_epsilon(DELTA) == fresh.get_epsilon(DELTA) == saved.get_epsilon(DELTA) > small
    assert used.epsilon_data_independent(DELTA) == saved.epsilon_data_independent(DELTA)


def test_the_public_state_withholds_the_log_q_of_the_private_votes():
    """privacy.json shows the public state: how many queries each noise pair answered, never the
    rounded log q~ of each answer, which is a function of the teachers' votes on private data."""
    accountant = ConfidentGNMaxAccountant()
    log_q = gnmax_log_q(np.array([[25, 3, 2], [20, 10, 0]]), 5.0)
    accountant.step(50.0, 5.0, 6, log_q)
    public = accountant.public_state_dict()
    assert [pair["answered"] for pair in public["noise_pairs"]] == [2] and public["withheld"]
    assert not any(repr(float(key)) in repr(public) for key in round_log_q_up(log_q))


def test_one_log_q_answered_under_two_sigma2_is_charged_at_each_ones_bound():
    """Theorem 6's bound depends on sigma2 as well as on log q~: two noise pairs answering the
    same rounded log q~ compose to the sum of their own curves, in either order."""
    orders = np.array(DEFAULT_ORDERS)
    expected = (threshold_rdp(30.0, orders) + threshold_rdp(300.0, orders)
                + gnmax_data_dependent_rdp(-30.0, 5.0, orders)[0] + gnmax_data_dependent_rdp(-30.0, 50.0, orders)[0])
    for pairs in (((30.0, 5.0), (300.0, 50.0)), ((300.0, 50.0), (30.0, 5.0))):
        accountant = ConfidentGNMaxAccountant()
        for sigma1, sigma2 in pairs:
            accountant.step(sigma1, sigma2, 1, [-30.0])
        assert accountant.get_epsilon(DELTA) == pytest.approx(rdp_to_epsilon(orders, expected, DELTA)[0], rel=1e-9)


def test_budget_planning_at_a_log_q_charges_it_rounded_up_as_stepping_does():
    """epsilon_if_queries(log_q=x) equals stepping those queries with log q~ = x, rounded up to
    the 0.01 grid: planning at the raw x would understate what the step is charged."""
    log_q = -10.00999  # rounds up to -10.00, where Theorem 6 beats the data-independent bound
    planned = ConfidentGNMaxAccountant("data-dependent").epsilon_if_queries(DELTA, 50, 40.0, 3.0, 1.0, log_q=log_q)
    stepped = ConfidentGNMaxAccountant("data-dependent")
    stepped.step(40.0, 3.0, 50, np.full(50, log_q))
    assert planned == pytest.approx(stepped.get_epsilon(DELTA), rel=1e-12)
