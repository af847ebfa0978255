"""Accountants against values computed independently of the code under test.

References used for the expected values:
- RDP of the subsampled Gaussian: Opacus' ``compute_rdp`` called directly (what the adapter
  wraps: this checks the wrapping), and Google's dp_accounting (a separate implementation);
- full-batch Gaussian: Mironov 2017 closed form α/(2σ²) and the Balle et al. 2020
  RDP -> (ε, δ) conversion, both written out here;
- exact ε of the full-batch Gaussian: Balle & Wang 2018 analytic Gaussian mechanism.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from scipy.optimize import brentq
from scipy.stats import norm

from lightning_dpgan.privacy import (
    DEFAULT_ORDERS,
    AccountantStateError,
    GaussianAccountant,
    OpacusAccountant,
    RDPCurveAccountant,
    calibrate_noise_multiplier,
    gaussian_rdp,
    rdp_to_epsilon,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Optimal order is the:UserWarning", "ignore:divide by zero:RuntimeWarning"
)

DELTA = 1e-5
OPACUS_ORDERS = np.asarray(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
GRID = np.asarray(DEFAULT_ORDERS, dtype=float)  # Opacus' orders extended up to 1024
# (noise_multiplier, sample_rate, steps) phases, deliberately heterogeneous.
PHASES = [(1.1, 0.01, 40), (0.8, 0.02, 15), (1.1, 0.01, 5)]


def balle_conversion(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """Balle et al. 2020, Theorem 21, written out independently of the code under test."""
    eps = rdp + np.log((orders - 1) / orders) - (np.log(delta) + np.log(orders)) / (orders - 1)
    return float(np.min(eps))


def analytic_gaussian_epsilon(sigma: float, steps: int, delta: float) -> float:
    """Exact ε of `steps` full-batch Gaussian releases (Balle & Wang 2018, Theorem 8).

    k compositions of N(0, σ²) at sensitivity 1 equal one release at sensitivity √k.
    """
    mu = math.sqrt(steps) / sigma

    def delta_of(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return brentq(delta_of, 0.0, 100.0)


def run(accountant, phases=PHASES):
    for sigma, q, steps in phases:
        for _ in range(steps):
            accountant.step(noise_multiplier=sigma, sample_rate=q)
    return accountant


def run_gaussian(accountant: GaussianAccountant, sigmas=(2.0, 2.0, 3.0, 2.0)):
    for sigma in sigmas:
        accountant.step(noise_multiplier=sigma)
    return accountant


# --------------------------------------------------------------------------- Opacus adapter
def test_rdp_matches_subsampled_gaussian_rdp_computed_directly():
    rdp = sum(
        compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=GRID)
        for sigma, q, steps in PHASES
    )
    expected, _ = get_privacy_spent(orders=GRID, rdp=rdp, delta=DELTA)

    accountant = run(OpacusAccountant("rdp"))

    assert accountant.get_epsilon(DELTA) == pytest.approx(float(expected), rel=1e-12)
    assert 0.5 < expected < 20  # a meaningful, finite budget, not a degenerate case


def test_rdp_matches_google_dp_accounting_a_separate_implementation():
    """Opacus (which the adapter calls) against dp_accounting's RDP analysis of the Poisson
    subsampled Gaussian, written independently (Mironov, Talwar & Zhang 2019), on the same
    orders: the same epsilon to within 1e-4 (2.41960 against 2.41960)."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant as GoogleRdpAccountant

    google = GoogleRdpAccountant(orders=list(GRID))
    for sigma, q, steps in PHASES:
        google.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    ours = run(OpacusAccountant("rdp")).get_epsilon(DELTA)
    assert ours == pytest.approx(google.get_epsilon(DELTA), rel=1e-4)


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_rdp_full_batch_equals_closed_form(sigma, steps):
    expected = balle_conversion(GRID, steps * GRID / (2 * sigma**2), DELTA)

    accountant = run(OpacusAccountant("rdp"), [(sigma, 1.0, steps)])

    assert accountant.get_epsilon(DELTA) == pytest.approx(expected, rel=1e-12)


def test_rdp_reaches_small_targets_below_the_floor_of_opacus_own_orders():
    """QUAIL's classifier at total ε = 0.1 gets ε = 0.05, δ = 5e-6: Opacus' orders (up to 63)
    cannot certify less than 0.114 there, whatever the noise, and calibration used to refuse."""
    delta, sample_rate, steps = 5e-6, 0.0085, 1170
    assert balle_conversion(OPACUS_ORDERS, np.zeros_like(OPACUS_ORDERS), delta) > 0.11

    sigma = calibrate_noise_multiplier(0.05, delta, sample_rate, steps)
    epsilon = run(OpacusAccountant("rdp"), [(sigma, sample_rate, steps)]).get_epsilon(delta)

    rdp = compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=steps, orders=GRID)
    assert epsilon == pytest.approx(balle_conversion(GRID, rdp, delta), rel=1e-9)
    assert 0.04 <= epsilon <= 0.05
    # PRV composes the same history numerically, independently of the order grid; it reports
    # an upper bound within 2 * eps_error (0.01) of its lower one. A valid upper bound such as
    # RDP's cannot sit below that lower bound.
    prv = run(OpacusAccountant("prv"), [(sigma, sample_rate, steps)]).get_epsilon(delta)
    assert prv - 0.02 <= epsilon


def test_prv_matches_opacus_prv_and_is_tighter_than_rdp():
    reference = PRVAccountant()
    for sigma, q, steps in PHASES:
        for _ in range(steps):
            reference.step(noise_multiplier=sigma, sample_rate=q)

    prv = run(OpacusAccountant("prv")).get_epsilon(DELTA)
    rdp = run(OpacusAccountant("rdp")).get_epsilon(DELTA)

    assert prv == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    assert prv <= rdp + 0.01


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 10)])
def test_prv_full_batch_bounds_the_exact_analytic_gaussian(sigma, steps):
    exact = analytic_gaussian_epsilon(sigma, steps, DELTA)

    prv = run(OpacusAccountant("prv"), [(sigma, 1.0, steps)]).get_epsilon(DELTA)

    # Opacus reports an upper bound, within its eps_error (0.01) of the truth.
    assert exact <= prv <= exact + 0.02


def test_history_merges_consecutive_identical_steps_and_len_counts_steps():
    accountant = OpacusAccountant()
    for sigma in (1.0, 1.0, 2.0, 1.0):
        accountant.step(noise_multiplier=sigma, sample_rate=0.1)

    assert accountant.history == [
        ({"noise_multiplier": 1.0, "sample_rate": 0.1}, 2),
        ({"noise_multiplier": 2.0, "sample_rate": 0.1}, 1),
        ({"noise_multiplier": 1.0, "sample_rate": 0.1}, 1),
    ]
    assert len(accountant) == 4


def test_history_is_a_copy():
    accountant = run(OpacusAccountant(), [(1.0, 0.1, 3)])
    accountant.history[0][0]["noise_multiplier"] = 100.0

    assert accountant.history[0][0]["noise_multiplier"] == 1.0


def test_epsilon_is_zero_before_any_step():
    for accountant in (OpacusAccountant("rdp"), OpacusAccountant("prv"), GaussianAccountant()):
        assert accountant.get_epsilon(DELTA) == 0.0
        assert len(accountant) == 0


@pytest.mark.parametrize(
    "params",
    [
        {"noise_multiplier": 0.0, "sample_rate": 0.1},
        {"noise_multiplier": -1.0, "sample_rate": 0.1},
        {"noise_multiplier": float("nan"), "sample_rate": 0.1},
        {"noise_multiplier": 1.0, "sample_rate": 0.0},
        {"noise_multiplier": 1.0, "sample_rate": 1.5},
        {"noise_multiplier": 1.0},
        {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 3},
        {"noise_multiplier": "1.0", "sample_rate": 0.1},
    ],
)
def test_step_rejects_invalid_params_without_recording(params):
    accountant = run(OpacusAccountant(), [(1.0, 0.1, 2)])

    # a missing / unexpected keyword is Python's own TypeError from the typed signature
    with pytest.raises((TypeError, ValueError)):
        accountant.step(**params)

    assert len(accountant) == 2


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5])
def test_get_epsilon_rejects_invalid_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        run(OpacusAccountant(), [(1.0, 0.1, 1)]).get_epsilon(delta)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="gdp"):
        OpacusAccountant("gdp")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Gaussian
def test_gaussian_curve_composes_to_k_alpha_over_two_sigma_squared():
    sigma, steps = 1.5, 7
    accountant = GaussianAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma)

    orders = np.asarray(DEFAULT_ORDERS)
    np.testing.assert_allclose(accountant.rdp, steps * orders / (2 * sigma**2), rtol=1e-12)
    assert accountant.get_epsilon(DELTA) == pytest.approx(
        balle_conversion(orders, steps * orders / (2 * sigma**2), DELTA), rel=1e-12
    )


def test_gaussian_heterogeneous_steps_add_their_curves():
    accountant = run_gaussian(GaussianAccountant(), sigmas=(1.0, 2.0, 2.0))

    orders = np.asarray(DEFAULT_ORDERS)
    np.testing.assert_allclose(accountant.rdp, orders / 2 + 2 * orders / 8, rtol=1e-12)


def test_gaussian_agrees_with_opacus_full_batch_on_the_same_orders():
    gaussian = run_gaussian(GaussianAccountant(orders=RDPAccountant.DEFAULT_ALPHAS))
    opacus = run(OpacusAccountant("rdp"), [(2.0, 1.0, 2), (3.0, 1.0, 1), (2.0, 1.0, 1)])

    assert gaussian.get_epsilon(DELTA) == pytest.approx(opacus.get_epsilon(DELTA), rel=1e-12)


def test_gaussian_epsilon_upper_bounds_the_exact_analytic_gaussian():
    sigma, steps = 4.0, 25
    accountant = GaussianAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma)

    exact = analytic_gaussian_epsilon(sigma, steps, DELTA)
    assert exact <= accountant.get_epsilon(DELTA) <= 1.2 * exact


def test_rdp_curve_subclass_with_wrong_shape_is_refused():
    class Broken(RDPCurveAccountant):
        mechanism = "broken"
        param_names = ("scale",)

        def step_rdp(self, *, scale):
            return np.ones(3) * scale

        def _validate_params(self, params):
            pass

    accountant = Broken()
    with pytest.raises(ValueError, match="one value per order"):
        accountant.step(scale=1.0)
    assert len(accountant) == 0


# --------------------------------------------------------------------------- analysis
def test_rdp_to_epsilon_is_opacus_conversion():
    orders = np.asarray(DEFAULT_ORDERS)
    rdp = compute_rdp(q=0.05, noise_multiplier=1.3, steps=200, orders=orders)

    eps, order = rdp_to_epsilon(orders, rdp, DELTA)

    expected_eps, expected_order = get_privacy_spent(orders=orders, rdp=rdp, delta=DELTA)
    assert (eps, order) == (pytest.approx(float(expected_eps)), float(expected_order))
    assert eps == pytest.approx(balle_conversion(orders, rdp, DELTA), rel=1e-12)


def test_gaussian_rdp_closed_form():
    np.testing.assert_allclose(gaussian_rdp([2.0, 10.0], 2.0), [2 / 8, 10 / 8])


@pytest.mark.parametrize(
    ("orders", "rdp", "delta"),
    [([2.0, 3.0], [0.1], 1e-5), ([1.0, 3.0], [0.1, 0.2], 1e-5), ([2.0], [0.1], 0.0)],
)
def test_rdp_to_epsilon_rejects_bad_input(orders, rdp, delta):
    with pytest.raises(ValueError):
        rdp_to_epsilon(orders, rdp, delta)


# --------------------------------------------------------------------------- epsilon_if
ACCOUNTANT_FACTORIES = {
    "rdp": lambda: run(OpacusAccountant("rdp")),
    "prv": lambda: run(OpacusAccountant("prv"), [(1.1, 0.01, 20)]),
    "gaussian": lambda: run_gaussian(GaussianAccountant()),
}


@pytest.mark.parametrize("kind", sorted(ACCOUNTANT_FACTORIES))
def test_epsilon_if_equals_stepping_a_copy_and_does_not_mutate(kind):
    accountant = ACCOUNTANT_FACTORIES[kind]()
    before = (accountant.get_epsilon(DELTA), accountant.history, len(accountant))
    last_params = accountant.history[-1][0]

    looked_ahead = accountant.epsilon_if(DELTA, steps=5)

    stepped = copy.deepcopy(accountant)
    for _ in range(5):
        stepped.step(**last_params)
    assert looked_ahead == pytest.approx(stepped.get_epsilon(DELTA), rel=1e-9)
    assert looked_ahead > before[0]
    assert (accountant.get_epsilon(DELTA), accountant.history, len(accountant)) == before


def test_epsilon_if_with_new_params_and_zero_steps():
    accountant = run(OpacusAccountant(), [(1.0, 0.01, 10)])

    stepped = copy.deepcopy(accountant)
    stepped.step(noise_multiplier=0.5, sample_rate=0.02)
    assert accountant.epsilon_if(DELTA, noise_multiplier=0.5, sample_rate=0.02) == pytest.approx(
        stepped.get_epsilon(DELTA), rel=1e-12
    )
    assert accountant.epsilon_if(DELTA, steps=0) == accountant.get_epsilon(DELTA)


def test_epsilon_if_without_params_repeats_the_last_steps_noise_not_the_first():
    """A run whose noise changed (a resume with another sigma) looks ahead at the noise it now
    adds: the first step's larger sigma would under-predict what the next steps spend."""
    accountant = run(OpacusAccountant(), [(2.0, 0.01, 1), (0.7, 0.01, 1)])
    stepped = copy.deepcopy(accountant)
    for _ in range(100):
        stepped.step(noise_multiplier=0.7, sample_rate=0.01)
    assert accountant.epsilon_if(DELTA, 100) == pytest.approx(stepped.get_epsilon(DELTA), rel=1e-9)


def test_epsilon_if_needs_params_before_the_first_step():
    with pytest.raises(ValueError, match="noise_multiplier"):
        OpacusAccountant().epsilon_if(DELTA)
    assert OpacusAccountant().epsilon_if(DELTA, noise_multiplier=1.0, sample_rate=1.0) > 0


@pytest.mark.parametrize("steps", [-1, 1.5, True])
def test_epsilon_if_rejects_bad_steps(steps):
    with pytest.raises(ValueError, match="steps"):
        run(OpacusAccountant(), [(1.0, 0.1, 1)]).epsilon_if(DELTA, steps=steps)


# Opacus' RDP of the sampled Gaussian gets slow for 0.1 < q < 1 at fractional orders;
# small rates and the full batch keep the property test fast.
@settings(max_examples=15, deadline=None)
@given(
    sigma=st.floats(0.5, 5.0),
    sample_rate=st.one_of(st.floats(1e-3, 0.05), st.just(1.0)),
    chunks=st.lists(st.integers(1, 50), min_size=1, max_size=3),
)
def test_epsilon_is_monotone_in_steps(sigma, sample_rate, chunks):
    accountant = OpacusAccountant("rdp")
    gaussian = GaussianAccountant()
    epsilons, gaussian_epsilons = [0.0], [0.0]
    for chunk in chunks:
        for _ in range(chunk):
            accountant.step(noise_multiplier=sigma, sample_rate=sample_rate)
            gaussian.step(noise_multiplier=sigma)
        epsilons.append(accountant.get_epsilon(DELTA))
        gaussian_epsilons.append(gaussian.get_epsilon(DELTA))

    assert epsilons == sorted(epsilons)
    assert gaussian_epsilons == sorted(gaussian_epsilons)
    assert accountant.epsilon_if(DELTA, steps=10) >= epsilons[-1]


# --------------------------------------------------------------------------- state
FRESH = {
    "rdp": lambda: OpacusAccountant("rdp"),
    "prv": lambda: OpacusAccountant("prv"),
    "gaussian": GaussianAccountant,
}


@pytest.mark.parametrize("kind", sorted(ACCOUNTANT_FACTORIES))
def test_state_round_trips_through_json_with_identical_epsilon(kind):
    accountant = ACCOUNTANT_FACTORIES[kind]()
    state = json.loads(json.dumps(accountant.state_dict(), allow_nan=False))

    restored = FRESH[kind]()
    restored.load_state_dict(state)

    assert restored.get_epsilon(DELTA) == accountant.get_epsilon(DELTA)
    assert restored.history == accountant.history
    assert len(restored) == len(accountant)
    assert restored.epsilon_if(DELTA, steps=3) == accountant.epsilon_if(DELTA, steps=3)
    assert state["accountant"] == restored.name and "format_version" in state


def _state(kind="rdp"):
    return json.loads(json.dumps(ACCOUNTANT_FACTORIES[kind]().state_dict()))


def _with(state, **changes):
    return {**state, **changes}


def _without(state, key):
    return {k: v for k, v in state.items() if k != key}


def _entry(state, **changes):
    return _with(state, history=[{**state["history"][0], **changes}] + state["history"][1:])


BAD_OPACUS_STATES = {
    "none": None,
    "empty": {},
    "not a mapping": [1, 2],
    "no history": _without(_state(), "history"),
    "no name": _without(_state(), "accountant"),
    "no version": _without(_state(), "format_version"),
    "foreign prv": _state("prv"),
    "foreign mechanism": _with(_state(), mechanism="gaussian"),
    "future version": _with(_state(), format_version=2),
    "history not a list": _with(_state(), history={"a": 1}),
    "zero steps": _entry(_state(), steps=0),
    "bool steps": _entry(_state(), steps=True),
    "float steps": _entry(_state(), steps=1.5),
    "missing param": _entry(_state(), params={"noise_multiplier": 1.0}),
    "nan param": _entry(_state(), params={"noise_multiplier": float("nan"), "sample_rate": 0.1}),
    "negative sigma": _entry(_state(), params={"noise_multiplier": -1.0, "sample_rate": 0.1}),
    "extra entry key": _entry(_state(), extra=1),
}


@pytest.mark.parametrize("case", sorted(BAD_OPACUS_STATES))
def test_bad_state_is_refused_and_leaves_the_budget_untouched(case):
    accountant = run(OpacusAccountant("rdp"), [(2.0, 1.0, 3)])
    before = accountant.get_epsilon(DELTA)

    with pytest.raises(AccountantStateError):
        accountant.load_state_dict(BAD_OPACUS_STATES[case])

    assert accountant.get_epsilon(DELTA) == before
    assert len(accountant) == 3


def test_a_state_of_the_other_opacus_accountant_is_refused_naming_the_setting_that_reads_it():
    """Every other resume mismatch named its fix; this one said only "the accountant that wrote it"."""
    saved = run(OpacusAccountant("rdp"), [(2.0, 1.0, 3)]).state_dict()
    with pytest.raises(AccountantStateError, match=r"resume with the accountant that wrote it \(--privacy.accountant rdp\)$"):
        OpacusAccountant("prv").load_state_dict(saved)


def test_rdp_state_refused_by_gaussian_accountant():
    with pytest.raises(AccountantStateError, match="gaussian-subsampled"):
        GaussianAccountant().load_state_dict(_state("rdp"))


BAD_GAUSSIAN_STATES = {
    "lowered curve": lambda s: _with(s, rdp=[v / 2 for v in s["rdp"]]),
    "dropped history": lambda s: _with(s, history=s["history"][:1]),
    "short curve": lambda s: _with(s, rdp=s["rdp"][:-1]),
    "negative curve": lambda s: _with(s, rdp=[-v for v in s["rdp"]]),
    "text curve": lambda s: _with(s, rdp=["x"] * len(s["rdp"])),
    "no curve": lambda s: _without(s, "rdp"),
    "other orders": lambda s: _with(s, orders=[o + 1 for o in s["orders"]]),
}


@pytest.mark.parametrize("case", sorted(BAD_GAUSSIAN_STATES))
def test_inconsistent_rdp_curve_state_is_refused(case):
    state = BAD_GAUSSIAN_STATES[case](_state("gaussian"))
    accountant = GaussianAccountant()

    with pytest.raises(AccountantStateError):
        accountant.load_state_dict(state)

    assert len(accountant) == 0 and accountant.get_epsilon(DELTA) == 0.0
    assert not accountant.rdp.any()


def test_a_curve_saved_a_rounding_below_its_history_loads_as_the_history():
    """Within the rounding tolerance the state is accepted, but the larger curve is kept: a
    saved curve nudged down cannot lower the spent epsilon even by a rounding."""
    state = _state("gaussian")
    accountant = GaussianAccountant()
    accountant.load_state_dict(state)
    honest = accountant.get_epsilon(DELTA)
    lowered = GaussianAccountant()
    lowered.load_state_dict(_with(state, rdp=[v * (1 - 1e-7) for v in state["rdp"]]))
    assert lowered.get_epsilon(DELTA) == honest


# --------------------------------------------------------------------------- calibration
@pytest.mark.parametrize(
    ("kind", "target", "sample_rate", "steps"),
    [("rdp", 2.0, 0.01, 300), ("rdp", 8.0, 0.01, 300), ("prv", 3.0, 1.0, 10)],
)
def test_calibrated_noise_reaches_target_and_is_tight(kind, target, sample_rate, steps):

    sigma = calibrate_noise_multiplier(target, DELTA, sample_rate, steps, kind=kind)

    def eps(noise):
        return run(OpacusAccountant(kind), [(noise, sample_rate, steps)]).get_epsilon(DELTA)

    assert target - 0.01 <= eps(sigma) <= target
    assert eps(0.97 * sigma) > target


def test_calibration_stops_within_a_hundredth_of_a_small_target():
    """An absolute tolerance of 0.01 let a target of 0.05 (q = 0.1, 1,000 steps) spend 0.042:
    17 % of the budget paid for in noise and never used."""
    sigma = calibrate_noise_multiplier(0.05, DELTA, 0.1, 1000)
    assert 0.05 * 0.99 <= run(OpacusAccountant(), [(sigma, 0.1, 1000)]).get_epsilon(DELTA) <= 0.05


def test_a_target_below_what_the_prv_accountant_can_certify_names_that_floor_and_rdp():
    """Opacus' PRV accountant reports no less than about its error margin (0.01) whatever the
    noise: one step at q = 1e-6 was told to take fewer steps or a smaller sample rate."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # the floor is a probe: Opacus' words on it confuse
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"the PRV accountant \(within its error margin\) certifies no less than "
                                             r"epsilon 0.00999.*or use --privacy.accountant rdp"):
            calibrate_noise_multiplier(0.005, DELTA, 0.01, 1, kind="prv")
    assert not caught
    with pytest.raises(ValueError, match="certifies no less") as refused:  # below RDP's floor (0.0035) too
        calibrate_noise_multiplier(0.003, DELTA, 0.01, 1000, kind="prv")
    assert "rdp" not in str(refused.value)


def test_calibration_does_not_warn_about_its_own_probes():
    """Opacus' search for sigma evaluates noise levels far from the answer, where the best order
    is the grid's last; its "Optimal order is the largest alpha" then speaks of a probe, not of
    the sigma returned, and only confused each run's log. The sigma's own report still warns."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sigma = calibrate_noise_multiplier(1.0, DELTA, 0.01, 10)
    assert not [w for w in caught if "Optimal order" in str(w.message)]
    assert 0.99 <= run(OpacusAccountant(), [(sigma, 0.01, 10)]).get_epsilon(DELTA) <= 1.0


def test_calibration_reports_an_unreachable_target():
    with pytest.raises(ValueError, match="cannot reach epsilon=0.0001"):
        calibrate_noise_multiplier(1e-4, DELTA, sample_rate=1.0, steps=100)


def test_a_target_below_what_the_rdp_orders_can_certify_names_that_floor_not_fewer_steps():
    """However much noise, zero Renyi divergence converts (Balle et al. 2020, as Opacus does) to
    min over orders of -(log delta + log a)/(a - 1) + log((a - 1)/a): about 0.0035 at 1e-5 with
    orders up to 1024. One step at q = 1e-4 cannot go below it either, so 'train for fewer steps
    or with a smaller sample rate' was advice that could not help."""
    from lightning_dpgan.privacy.accountants.opacus_adapter import rdp_epsilon_floor
    from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS

    orders = np.asarray(DEFAULT_ORDERS, dtype=float)
    expected = np.min(-(np.log(DELTA) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders))
    assert rdp_epsilon_floor(DELTA) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError) as refused:
        calibrate_noise_multiplier(0.001, DELTA, sample_rate=1e-4, steps=1)
    assert f"certifies no less than epsilon {expected:.3g}" in str(refused.value)
    assert "fewer steps" not in str(refused.value)


def test_the_selected_critic_calibration_probes_warn_of_no_order():
    """Its bisection's small-noise probes reach their best epsilon at the grid's smallest order:
    Opacus' "Optimal order is the smallest alpha" spoke of a probe in every N-critic run's log."""
    import warnings

    from lightning_dpgan.privacy.accountants.subsampled_without_replacement import calibrate_selected_critic_noise

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noise = calibrate_selected_critic_noise(10, 1e-5, 8, 10)
    assert not [w for w in caught if "Optimal order" in str(w.message)]
    from lightning_dpgan.privacy.analysis.subsampling import selected_critic_gaussian_rdp

    spend = lambda sigma: rdp_to_epsilon(GRID, 8 * selected_critic_gaussian_rdp(GRID, sigma, 10), 1e-5)[0]  # noqa: E731
    assert spend(noise) <= 10 < spend(noise * 0.999)  # the quiet calibration still calibrates


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_epsilon": 0.0},
        {"delta": 1.0},
        {"sample_rate": 0.0},
        {"steps": 0},
        {"kind": "gdp"},
    ],
)
def test_calibration_rejects_bad_input(kwargs):
    args = {"target_epsilon": 1.0, "delta": DELTA, "sample_rate": 0.01, "steps": 10, **kwargs}
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(**args)


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_a_target_the_least_noise_meets_is_calibrated_at_once(kind):
    """Opacus' search bisects towards sigma 0 until it is within tolerance of the target: a target
    no noise comes near (1e300, as a user may type) never ended. The least noise calibration
    returns is taken, and its epsilon is within the target."""
    from lightning_dpgan.privacy.accountants.opacus_adapter import LEAST_CALIBRATED_SIGMA

    sigma = calibrate_noise_multiplier(1e300, 1e-5, sample_rate=0.01, steps=100, kind=kind)
    assert sigma == LEAST_CALIBRATED_SIGMA
    accountant = OpacusAccountant("rdp")  # PRV's grid at this little noise takes tens of GB; RDP bounds it
    for _ in range(100):
        accountant.step(noise_multiplier=sigma, sample_rate=0.01)
    assert accountant.get_epsilon(1e-5) <= 1e300
    assert calibrate_noise_multiplier(1.0, 1e-5, sample_rate=0.01, steps=100, kind=kind) > LEAST_CALIBRATED_SIGMA


@pytest.mark.parametrize("steps, share", [(1, 0.75), (10, 2.0)])
def test_a_target_just_below_what_the_least_noise_spends_gets_more_noise(steps, share):
    """The shortcut for targets the least noise meets must compare with the target itself, over
    every planned step: at sample rate 1 one step at sigma 0.01 spends about 5,600 (Opacus' own
    RDP, on this package's orders). Three quarters of that for one step, or twice it for ten
    steps (which one step meets and ten do not), needs more noise, which is returned and keeps
    epsilon within the target."""
    from lightning_dpgan.privacy.accountants.opacus_adapter import LEAST_CALIBRATED_SIGMA

    def spent(sigma, steps):
        accountant = RDPAccountant()
        accountant.history = [(sigma, 1.0, steps)]
        return accountant.get_epsilon(DELTA, alphas=list(GRID))

    target = share * spent(LEAST_CALIBRATED_SIGMA, 1)
    assert spent(LEAST_CALIBRATED_SIGMA, steps) > target
    sigma = calibrate_noise_multiplier(target, DELTA, sample_rate=1.0, steps=steps)
    assert sigma > LEAST_CALIBRATED_SIGMA and spent(sigma, steps) <= target
