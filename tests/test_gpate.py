"""G-PATE: Confident-GNMax, projected gradient voting (DPGradAgg), the ProjectedVoting strategy
and the ``gpate`` model end to end."""
import math
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from run_helpers import checkpoint_accountant_state, read_json, train_outside_a_trainer

from lightning_dpgan import distributed
from lightning_dpgan.callbacks.gpate import ProjectedVoting
from lightning_dpgan.cli import main
from lightning_dpgan.nets.ensemble import ConvTeacher, MLPTeacher, MLPTeacherEnsemble, VmapTeacherEnsemble
from lightning_dpgan.privacy.accountants import ConfidentGNMaxAccountant
from lightning_dpgan.privacy.analysis.gnmax import gnmax_log_q
from lightning_dpgan.privacy.gradient_voting import (
    ProjectedGradientAggregator,
    bin_midpoints,
    discretize,
    random_projections,
    vote_histograms,
)
from lightning_dpgan.privacy.mechanisms import NO_ANSWER, confident_gnmax
from lightning_dpgan.privacy.noise_source import NoiseSource
from lightning_dpgan.privacy.slots import PrivacyBudgetExhausted
from thread_world import ThreadWorld

REPO = Path(__file__).resolve().parents[1]


def normal_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2))


# ------------------------------------------------------------------ Confident-GNMax
def test_no_answer_below_the_threshold_and_the_plurality_when_teachers_agree():
    votes = torch.tensor([[3, 90, 7], [40, 30, 30]])
    answers = confident_gnmax(votes, threshold=50, sigma1=1e-6, sigma2=1e-6)
    assert answers.tolist() == [1, NO_ANSWER]


def test_threshold_noise_has_scale_sigma1():
    """With the max count one sigma1 below T, Pr[answered] = P(N(0,1) >= 1) = 0.159; a wrong
    scale (sigma1^2, or sigma2) would give a very different rate."""
    torch.manual_seed(0)
    sigma1, threshold = 40.0, 500.0
    votes = torch.tensor([[int(threshold - sigma1), 0]]).repeat(20000, 1)
    rate = (confident_gnmax(votes, threshold, sigma1, sigma2=1.0) != NO_ANSWER).float().mean().item()
    assert rate == pytest.approx(normal_sf(1.0), abs=0.01)


def test_answer_noise_has_scale_sigma2():
    """Two bins with gap g: the runner-up wins with probability P(N(0, 2 sigma2^2) > g)."""
    torch.manual_seed(1)
    sigma2 = 30.0
    gap = sigma2 * math.sqrt(2)  # one standard deviation of the noise difference
    votes = torch.tensor([[100.0 + gap, 100.0]]).repeat(20000, 1)
    wrong = (confident_gnmax(votes, threshold=0, sigma1=1e-6, sigma2=sigma2) == 1).float().mean().item()
    assert wrong == pytest.approx(normal_sf(1.0), abs=0.01)


# ---------------------------------------------------------- discretization, projection
def test_discretize_clips_and_bins_and_midpoints_invert_it():
    clip, bins = 1.0, 4  # bins [-1,-.5), [-.5,0), [0,.5), [.5,1]
    values = torch.tensor([-5.0, -0.75, -0.1, 0.2, 0.99, 1.0, 7.0])
    index = discretize(values, clip, bins)
    assert index.tolist() == [0, 0, 1, 2, 3, 3, 3]
    assert bin_midpoints(index, clip, bins).tolist() == [-0.75, -0.75, -0.25, 0.25, 0.75, 0.75, 0.75]
    assert bin_midpoints(torch.tensor([NO_ANSWER]), clip, bins).tolist() == [0.0]


def test_vote_histograms_count_every_teacher_once_per_query():
    bin_index = torch.tensor([[0, 2], [0, 1], [3, 1]])  # 3 teachers, 2 queries
    counts = vote_histograms(bin_index, bins=4)
    assert counts.tolist() == [[2, 0, 0, 1], [0, 2, 1, 0]]


def test_random_projection_round_trip_is_unbiased_and_preserves_norms():
    """Entries N(0, 1/k): E[R R^T] = I, so x R R^T is x on average, and |x R|^2 concentrates
    around |x|^2 (Johnson-Lindenstrauss): the bound below is 4 standard deviations of chi2_k / k."""
    torch.manual_seed(2)
    d, k, draws = 50, 10, 4000
    x = torch.randn(d)
    projections = random_projections(draws, d, k, torch.device("cpu"))
    round_trips = torch.einsum("d,ndj,nej->ne", x, projections, projections)
    assert torch.linalg.norm(round_trips.mean(0) - x) / torch.linalg.norm(x) < 0.1
    ratios = (torch.einsum("d,ndj->nj", x, projections) ** 2).sum(1) / (x**2).sum()
    assert ratios.mean().item() == pytest.approx(1.0, abs=4 * math.sqrt(2 / k) / math.sqrt(draws))
    assert ratios.std().item() == pytest.approx(math.sqrt(2 / k), rel=0.1)


def make_aggregator(k=5, bins=10, clip=1.0, sigma1=1e-6, sigma2=1e-6, threshold=1.0, log=None):
    log = [] if log is None else log
    return ProjectedGradientAggregator(
        k, bins, clip, sigma1, sigma2, threshold,
        check=lambda votes: log.append(("check", votes.clone())),
        charge=lambda votes, answered: log.append(("charge", answered.clone())),
    ), log


def test_when_all_teachers_agree_the_aggregate_is_the_discretized_common_gradient():
    teachers, records, shape = 7, 3, (2, 4, 4)
    common = torch.randn(records, *shape) * 0.3
    aggregator, log = make_aggregator(k=6, bins=20, threshold=teachers - 0.5)  # all must agree
    torch.manual_seed(3)
    out = aggregator.aggregate(common.expand(teachers, *common.shape))
    torch.manual_seed(3)  # the aggregator draws its projection first: redraw it
    projection = random_projections(records, common[0].numel(), 6, torch.device("cpu"))
    projected = torch.einsum("bd,bdj->bj", common.reshape(records, -1), projection)
    expected = torch.einsum("bj,bdj->bd", bin_midpoints(discretize(projected, 1.0, 20), 1.0, 20), projection)
    torch.testing.assert_close(out, expected.reshape(records, *shape))
    assert [entry[0] for entry in log] == ["check", "charge"]
    assert log[0][1].shape == (records * 6, 20) and (log[0][1].sum(1) == teachers).all()
    assert log[1][1].all()  # unanimous and no noise: every query answered


def test_unanswered_dimensions_contribute_nothing():
    aggregator, log = make_aggregator(threshold=1e9)  # nobody reaches the threshold
    out = aggregator.aggregate(torch.randn(4, 3, 8))
    assert torch.count_nonzero(out) == 0
    assert not log[1][1].any()


def test_a_refused_check_releases_nothing_and_draws_no_noise():
    """The votes are checked before anything noisy is drawn: a refused batch is charged nothing
    and leaves Confident-GNMax's noise stream where it was."""
    def refuse(votes):
        raise PrivacyBudgetExhausted("no budget left")

    charged, noise = [], NoiseSource(seed=3)
    before = noise.generator("cpu").get_state().clone()
    aggregator = ProjectedGradientAggregator(3, 4, 1.0, 1.0, 1.0, 1.0, check=refuse,
                                             charge=lambda *args: charged.append(args), noise=noise)
    with pytest.raises(PrivacyBudgetExhausted):
        aggregator.aggregate(torch.randn(5, 2, 6))
    assert charged == []
    assert torch.equal(noise.generator("cpu").get_state(), before)


def test_under_ddp_every_ranks_teacher_votes_are_counted_and_rank_zeros_release_is_everyones(monkeypatch):
    """Six teachers sharded 2-2-2 over three ranks (threads), agreeing on every record; T = 5.5
    votes. Only the summed histogram (6 votes a query) passes the threshold, never one rank's
    shard (2). Every rank checks and charges the summed votes and releases what one process
    holding all six teachers releases (rank 0's projection and noise)."""
    world = ThreadWorld(3)
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: world.rank())
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: world.size)
    monkeypatch.setattr(torch.distributed, "broadcast", world.broadcast)
    monkeypatch.setattr(torch.distributed, "all_reduce", world.all_reduce)
    teachers = 6
    common = torch.randn(3, 12, generator=torch.Generator().manual_seed(0)) * 0.3
    gradients = common.expand(teachers, 3, 12).contiguous()

    def aggregator(log: list, seed: int) -> ProjectedGradientAggregator:
        return ProjectedGradientAggregator(4, 10, 1.0, 1e-6, 1e-6, teachers - 0.5,
                                           check=lambda votes: log.append(votes.clone()),
                                           charge=lambda votes, answered: log.append((votes.clone(), answered)),
                                           noise=NoiseSource(seed=seed))

    logs = [[] for _ in range(3)]
    torch.manual_seed(7)  # the threads share torch's stream: a rank drawing its own projection takes other numbers
    released = world.each_rank(lambda r: aggregator(logs[r], r + 1).aggregate(gradients[2 * r:2 * r + 2]))
    for r, (checked, (charged, answered)) in enumerate(logs):
        assert (checked.sum(1) == teachers).all(), f"rank {r} checked only its own shard's votes"
        assert torch.equal(checked, charged) and answered.all()
        torch.testing.assert_close(released[r], released[0])
    assert torch.count_nonzero(released[0]) > 0
    monkeypatch.setattr(distributed, "is_distributed", lambda: False)
    torch.manual_seed(7)
    torch.testing.assert_close(aggregator([], 1).aggregate(gradients), released[0])


# ------------------------------------------------------- batched input-gradients
@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_batched_loss_gradients_equal_a_loop_over_teachers(kind):
    torch.manual_seed(4)
    if kind == "mlp":
        teachers = [MLPTeacher(12, hidden=(6,), num_classes=3) for _ in range(4)]
        ensemble, x = MLPTeacherEnsemble.from_teachers(teachers), torch.randn(5, 12)
    else:
        teachers = [ConvTeacher((1, 8, 8), num_classes=3, channels=2, hidden=5) for _ in range(4)]
        ensemble, x = VmapTeacherEnsemble.from_teachers(teachers), torch.randn(5, 1, 8, 8)
    labels = torch.tensor([0, 1, 2, 1, 0])
    batched = ensemble.input_gradients(x, labels, transform=torch.nn.functional.softplus)
    for k, teacher in enumerate(teachers):
        inputs = x.clone().requires_grad_()
        (expected,) = torch.autograd.grad(torch.nn.functional.softplus(teacher(inputs, labels)).sum(), inputs)
        torch.testing.assert_close(batched[k], expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- strategy accounting
def test_strategy_charges_every_check_and_only_answered_answers():
    strategy = ProjectedVoting(num_teachers=10, sigma1=5.0, sigma2=3.0, target_epsilon=50.0, delta=1e-5)
    strategy.num_teachers = 10
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    votes = torch.tensor([[10, 0, 0], [5, 5, 0], [4, 3, 3]])
    strategy._check(votes)
    strategy._charge(votes, torch.tensor([True, False, True]))
    assert len(strategy.accountant) == 3 and strategy.accountant.answered == 2
    log_q = gnmax_log_q(votes.numpy(), 3.0)
    fresh = ProjectedVoting(sigma1=5.0, sigma2=3.0).accountant
    fresh.step(5.0, 3.0, 3, log_q[[0, 2]])
    assert strategy.accountant.epsilon_data_dependent(1e-5) == pytest.approx(fresh.epsilon_data_dependent(1e-5))
    with pytest.raises(RuntimeError, match="check"):
        strategy._charge(votes, torch.tensor([True, True, True]))  # no matching check


def test_the_report_names_the_sigma1_and_sigma2_its_batches_were_charged_at():
    """sigma1 (threshold check) != sigma2 (answer), before and after a charge: the end-to-end
    runs use sigma1 == sigma2, where a swap cannot show."""
    strategy = ProjectedVoting(num_teachers=10, sigma1=5.0, sigma2=3.0, target_epsilon=50.0, delta=1e-5)
    strategy.num_teachers = 10
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    assert (strategy.report_parameters()["sigma1"], strategy.report_parameters()["sigma2"]) == (5.0, 3.0)
    votes = torch.tensor([[10, 0, 0], [5, 5, 0]])
    strategy._check(votes)
    strategy._charge(votes, torch.tensor([True, False]))
    assert (strategy.report_parameters()["sigma1"], strategy.report_parameters()["sigma2"]) == (5.0, 3.0)


def test_each_answer_is_charged_at_its_votes_tail_bound_under_the_strategys_sigma2():
    """Proposition 7 by hand (scipy's erfc): q~ = sum over the other bins of
    Pr[N(0, 2 sigma2^2) >= gap] = erfc(gap / (2 sigma2)) / 2, for the log q~ the data-dependent
    epsilon is charged with. Computed at another sigma2, every charge would be wrong."""
    from scipy.special import erfc

    strategy = ProjectedVoting(num_teachers=100, sigma1=5.0, sigma2=3.0, target_epsilon=50.0, delta=1e-5)
    strategy.num_teachers = 100
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    votes = torch.tensor([[90, 6, 4], [70, 20, 10]])
    strategy._check(votes)
    by_hand = [math.log(sum(erfc(gap / (2 * 3.0)) / 2 for gap in gaps)) for gaps in ([84, 86], [50, 60])]
    np.testing.assert_allclose(strategy._pending_log_q, by_hand, rtol=1e-9)


def test_the_budget_stop_prices_each_step_at_its_threshold_checks_every_one_unanswered():
    """The cheapest case of ``steps`` more steps: batch x projected dimensions threshold checks a
    step, each the Gaussian sigma1 check (RDP lambda / (2 sigma1^2)), and no answer. Pricing one
    check a step would let the budget stop start steps that cannot fit."""
    from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, rdp_to_epsilon

    strategy = ProjectedVoting(num_teachers=10, projection_dim=4, sigma1=50.0, sigma2=3.0, teacher_batch_size=6,
                               target_epsilon=5.0, delta=1e-5)
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    orders = np.array(DEFAULT_ORDERS)
    checks = 3 * 6 * 4
    by_hand = rdp_to_epsilon(orders, checks * orders / (2 * 50.0**2), strategy.training_delta)[0]
    assert strategy.training_epsilon_if(3) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("records, teachers, given, batch", [
    (70, 8, None, 8),     # partitions of 8 and 9 records: install's default is the smallest's 8
    (1000, 4, None, 64),  # partitions of 250: the default stops at 64
    (70, 8, 5, 5),        # a given batch is the batch
])
def test_the_first_step_is_priced_before_install_at_the_batch_install_would_choose(records, teachers, given, batch):
    """``train`` prices the first step from the row count before the DP releases made before
    training (whose budget a step too dear to take would waste): its batch x projected
    dimensions threshold checks, each the Gaussian sigma1 check, no answer."""
    from lightning_dpgan.data.partition import teacher_partitions
    from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, rdp_to_epsilon

    assert min(len(part) for part in teacher_partitions(records, teachers, 0)) == records // teachers
    strategy = ProjectedVoting(num_teachers=teachers, projection_dim=3, sigma1=40.0, teacher_batch_size=given,
                               target_epsilon=5.0, delta=1e-5)
    orders = np.array(DEFAULT_ORDERS)
    by_hand = rdp_to_epsilon(orders, batch * 3 * orders / (2 * 40.0**2), 1e-5)[0]
    assert strategy.first_step_epsilon(records, 32, {}, 1e-5) == pytest.approx(by_hand, rel=1e-12)
    assert f"its {batch * 3} threshold checks alone" in strategy.first_step_refusal(5.0, by_hand, exact=False)
    assert strategy.teacher_batch_size == given  # install still chooses it, from the partitions it draws


def test_the_budget_stop_plans_again_after_each_step_from_what_its_answers_spent():
    """A step's cost depends on the votes: the steps the budget allows are planned again after
    every step, so answered queries (costlier than the all-unanswered case planned for) shorten
    the run there and then rather than leaving the hard stop to refuse a batch later."""
    from types import SimpleNamespace

    from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping

    strategy = ProjectedVoting(num_teachers=10, projection_dim=2, sigma1=50.0, sigma2=10.0, teacher_batch_size=3,
                               target_epsilon=5.0, delta=1e-5)
    strategy.num_teachers = 10
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    strategy._module = module = SimpleNamespace(train_steps=0)
    budget = PrivacyBudgetStopping(5.0)
    budget.strategy = strategy
    planned = budget.allowed_total_steps()
    votes = torch.tensor([[5, 5, 0]] * strategy.queries_per_step)  # split votes: answering them costs most
    strategy._check(votes)
    strategy._charge(votes, torch.ones(len(votes), dtype=torch.bool))
    module.train_steps = 1
    assert budget.allowed_total_steps() == 1 + budget._max_more_steps() < planned


@pytest.mark.parametrize("answered, warned", [(0, True), (1, False)])
def test_a_run_with_almost_no_answered_query_says_its_generator_got_no_signal(answered, warned):
    """An unanswered dimension contributes 0: with under 1 % of the queries answered the student
    generator learned (almost) nothing from the teachers, and ``train`` prints the warning."""
    strategy = ProjectedVoting(num_teachers=10, sigma1=5.0, sigma2=3.0)
    assert strategy.answer_warnings() == []  # nothing asked yet
    strategy.accountant.step(5.0, 3.0, 100, np.full(answered, -5.0))  # 100 checks, `answered` answers
    warnings = strategy.answer_warnings()
    assert bool(warnings) == warned
    if warned:
        assert "only 0 of the 100 projected-gradient queries were answered" in warnings[0]


@pytest.mark.parametrize("clip, bins, said", [
    (1e30, 10, "160 of the 160 answers (100.00%) fell in the two bins around 0"),
    (1e30, 5, "fell in the middle bin, whose midpoint is 0"),
    (1e-12, 10, "160 of the 160 answers (100.00%) fell in the two outermost bins"),
    (5e-3, 10, None),  # 2.5 of the projected gradients' standard deviations: they spread over the bins
])
def test_answers_crowded_around_zero_or_at_the_clip_say_the_clip_is_off_the_gradients_scale(clip, bins, said):
    """--privacy.clip 1e30 was accepted and every answer landed beside 0: the generator was told
    the gradients' sign at most, in silence. The answers are released, so counting them is free."""
    from types import SimpleNamespace

    torch.manual_seed(0)
    strategy = ProjectedVoting(num_teachers=10, projection_dim=4, bins=bins, clip=clip, sigma1=1e-3, sigma2=1e-3,
                               delta=1e-5, noise_seed=0)
    strategy.num_teachers = 10
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    module = SimpleNamespace()
    strategy.install_aggregator(None, module)
    common = torch.randn(40, 16) * 1e-3  # projected, about N(0, 2e-3): every teacher agrees on each record
    module.privacy.aggregate(common.expand(10, 40, 16).contiguous())
    assert strategy.answers_per_bin.sum() == strategy.accountant.answered == 40 * 4
    assert strategy.report_parameters()["answers_per_bin"] == strategy.answers_per_bin.tolist()
    warnings = strategy.answer_warnings()
    if said is None:
        assert warnings == []
    else:
        [warning] = warnings
        assert said in warning and f"--privacy.clip {clip:g}" in warning


def test_the_answers_by_bin_survive_a_checkpoint_and_one_without_them_leaves_them_uncounted():
    from types import SimpleNamespace

    def voting(bins=4):
        strategy = ProjectedVoting(num_teachers=10, bins=bins, sigma1=5.0, sigma2=3.0, delta=1e-5)
        strategy.sampler = SimpleNamespace(state_dict=lambda: None, load_state_dict=lambda state: None,
                                           partitions=[])  # set at fit
        return strategy

    strategy = voting()
    strategy.accountant.step(5.0, 3.0, 100, np.full(7, -5.0))
    strategy.answers_per_bin[:] = [1, 2, 3, 1]
    state = strategy.state_dict()
    resumed = voting()
    resumed.load_state_dict(state)
    assert resumed.answers_per_bin.tolist() == [1, 2, 3, 1] and resumed.uncounted_answers == 0
    older = voting()
    older.load_state_dict({key: value for key, value in state.items() if key != "answers_per_bin"})
    assert older.answers_per_bin.tolist() == [0] * 4 and older.report_parameters()["answers_uncounted"] == 7
    rebinned = voting(bins=5)  # resumed with another --privacy.bins: the counts are of other bins
    rebinned.load_state_dict(state)
    assert rebinned.answers_per_bin.tolist() == [0] * 5 and rebinned.uncounted_answers == 7


def test_strategy_refuses_a_batch_that_could_pass_the_target():
    strategy = ProjectedVoting(num_teachers=10, sigma1=1.0, sigma2=1.0, target_epsilon=0.5, delta=1e-5)
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    assert strategy.refusal is None
    with pytest.raises(PrivacyBudgetExhausted):
        strategy._check(torch.tensor([[5, 5]] * 50))
    assert len(strategy.accountant) == 0
    assert "past its share 0.5 " in strategy.refusal  # kept, for the run's warning if no step was taken


@pytest.mark.parametrize("accounting", ["data-dependent", "data-independent"])
def test_the_refusal_prices_every_query_answered_checks_at_sigma1_answers_at_sigma2(accounting):
    """sigma1 != sigma2: a batch is priced as a step that answered all its queries would be
    charged (each check at sigma1, each answer at sigma2 with its log q~ under sigma2); a hair
    above that figure fits, a hair below is refused."""
    votes = torch.tensor([[9, 1, 0], [6, 4, 0], [5, 3, 2], [10, 0, 0]] * 5)
    answered_all = ConfidentGNMaxAccountant(accounting)
    answered_all.step(2.0, 6.0, len(votes), gnmax_log_q(votes.numpy(), 6.0))
    worst = answered_all.get_epsilon(1e-5)
    for target, refused in ((worst * 1.001, False), (worst * 0.999, True)):
        strategy = ProjectedVoting(num_teachers=10, sigma1=2.0, sigma2=6.0, accounting=accounting,
                                   target_epsilon=target, delta=1e-5)
        strategy.num_teachers = 10
        strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
        if refused:
            with pytest.raises(PrivacyBudgetExhausted):
                strategy._check(votes)
        else:
            strategy._check(votes)
            assert strategy.refusal is None


def installed_voting(monkeypatch, sigma1: float, sigma2: float) -> tuple:
    """The strategy's own aggregator (10 teachers, threshold 0.5, 4 bins on [-1, 1]) with an
    identity projection, so that each teacher's value is its vote; and the answered masks it charges."""
    from types import SimpleNamespace

    from lightning_dpgan.privacy import gradient_voting

    monkeypatch.setattr(gradient_voting, "random_projections", lambda b, d, k, device: torch.ones(b, d, k))
    charged = []
    monkeypatch.setattr(ProjectedVoting, "_charge", lambda self, votes, mask: charged.append(mask.clone()))
    strategy = ProjectedVoting(num_teachers=10, projection_dim=1, bins=4, clip=1.0, sigma1=sigma1, sigma2=sigma2,
                               threshold=0.5, noise_seed=0)
    strategy.num_teachers = 10
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    module = SimpleNamespace()
    strategy.install_aggregator(None, module)
    return module.privacy, charged


@pytest.mark.parametrize("agreeing, answered", [(4, False), (6, True)])
def test_the_threshold_is_its_fraction_of_the_teachers_in_votes(agreeing, answered, monkeypatch):
    """--privacy.threshold 0.5 of 10 teachers is T = 5 votes: with (almost) no threshold noise,
    a query whose plurality holds 4 teachers goes unanswered, one of 6 is answered."""
    aggregator, charged = installed_voting(monkeypatch, sigma1=1e-3, sigma2=1e-3)
    rest = {4: [0.25] * 2 + [-0.25] * 2 + [-0.75] * 2, 6: [0.25] * 2 + [-0.25, -0.75]}[agreeing]
    released = aggregator.aggregate(torch.tensor([0.75] * agreeing + rest).reshape(10, 1, 1))
    assert [mask.tolist() for mask in charged] == [[answered]]
    assert released.item() == (0.75 if answered else 0.0)


def test_the_strategys_aggregator_draws_the_check_at_sigma1_and_the_answer_at_sigma2(monkeypatch):
    """sigma1 = 1e-3, sigma2 = 1e3, 200 queries with 6 of 10 teachers in one bin (T = 5): every
    check passes (its noise is tiny) and the answers are all but random (theirs is huge).
    Swapped, about half the checks would fail and every answer would be the plurality."""
    aggregator, charged = installed_voting(monkeypatch, sigma1=1e-3, sigma2=1e3)
    votes = torch.tensor([0.75] * 6 + [0.25] * 2 + [-0.25, -0.75])
    released = aggregator.aggregate(votes.reshape(10, 1, 1).expand(10, 200, 1).contiguous())
    assert charged[0].all()
    assert (released == 0.75).float().mean().item() < 0.5  # about 1/4 under answer noise of 1e3


@pytest.mark.parametrize("preprocessing, refused", [(0.0, False), (1.0, True)])
def test_the_refusal_counts_what_preprocessing_spent(preprocessing, refused):
    """G-PATE trains on tables too, whose DP bounds spend part of --epsilon before training: a
    batch is refused when it would pass what is left (target less preprocessing), not the target."""
    votes = torch.tensor([[5, 5]] * 50)
    worst = ProjectedVoting(sigma1=1.0, sigma2=1.0).accountant.epsilon_if_answered(
        1e-5, 1.0, 1.0, 50, gnmax_log_q(votes.numpy(), 1.0))
    strategy = ProjectedVoting(num_teachers=10, sigma1=1.0, sigma2=1.0, target_epsilon=worst + 0.5, delta=1e-5)
    strategy.preprocessing = {"epsilon": preprocessing, "delta": 0.0}
    if refused:
        with pytest.raises(PrivacyBudgetExhausted):
            strategy._check(votes)
        assert f"past its share {worst - 0.5:g} " in strategy.refusal
    else:
        strategy._check(votes)  # fits the whole target
        assert strategy.refusal is None


# ------------------------------------------------------------------------ end to end
def gpate_args(data_dir, output_dir, *extra):
    return [
        "--model", "gpate", "--dataset", "mnist", "--data-dir", str(data_dir), "--output-dir", str(output_dir),
        "--accelerator", "cpu", "--data.verify_checksums", "false", "--max-steps", "6",
        "--model.latent_dim", "8", "--model.generator_kwargs.hidden", "16", "--model.generator_kwargs.channels", "4",
        "--model.teacher_kwargs.channels", "2", "--model.teacher_kwargs.hidden", "8",
        "--privacy.num_teachers", "8", "--privacy.teacher_batch_size", "10",
        "--privacy.sigma1", "20", "--privacy.sigma2", "20", "--privacy.clip", "1e-3", "--privacy.projection_dim", "4",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--sample_columns", "2",
        *extra,
    ]


def test_gpate_on_images_refuses_a_teacher_minibatch_of_one_as_it_installs_and_ignores_batch_size(
        tiny_image_data_dir, tmp_path, capsys):
    """Images have no row count before the Trainer sets them up: G-PATE with a teacher minibatch
    of one record failed inside BatchNorm at its first step; refused as the strategy installs,
    before any vote. --batch-size, which a teacher model does not use, was refused at 1 instead."""
    out = tmp_path / "out"
    assert main(["train", *gpate_args(tiny_image_data_dir, out, "--epsilon", "50", "--privacy.teacher_batch_size", "1")]) == 2
    said = capsys.readouterr().err
    assert "BatchNorm" in said and "per record of a teacher's minibatch, here 1" in said
    assert "--privacy.teacher_batch_size 2 or more" in said and "fewer teachers" not in said
    assert not (out / "privacy.json").exists() and not (out / "checkpoints").exists()
    trained = tmp_path / "trained"
    assert main(["train", *gpate_args(tiny_image_data_dir, trained, "--epsilon", "50", "--batch-size", "1",
                                      "--max-steps", "2")]) == 0
    assert read_json(trained / "privacy.json")["steps"] == 2


@pytest.fixture(scope="module")
def gpate_run(tiny_image_data_dir, tmp_path_factory):
    """``python train.py --model gpate --dataset mnist`` (the command users run first), tiny settings."""
    output = tmp_path_factory.mktemp("gpate") / "run"
    result = subprocess.run([sys.executable, str(REPO / "train.py"), *gpate_args(tiny_image_data_dir, output)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def test_gpate_trains_from_train_py_and_writes_its_outputs(gpate_run):
    for name in ("checkpoints/last.ckpt", "privacy.json", "metrics.json", "config.yaml", "samples.png"):
        assert (gpate_run / name).is_file(), name
    report = read_json(gpate_run / "privacy.json")
    assert report["mechanism"].startswith("gpate")
    assert report["steps"] == 6
    assert report["queries"] == 6 * 10 * 4  # steps x generated records x projected dimensions
    assert 0 < report["answered"] <= report["queries"]
    assert len(report["answers_per_bin"]) == 10 and sum(report["answers_per_bin"]) == report["answered"]
    assert report["epsilon_data_dependent"] <= report["epsilon_data_independent"]
    assert report["epsilon"] == pytest.approx(report["epsilon_data_dependent"])
    assert report["epsilon"] <= report["target_epsilon"] == 10.0  # the preset's
    assert report["num_teachers"] == 8 and report["partition_sizes"] == [20, 20]
    # the report counts answers; the log q~ of each (exact statistics of private votes) stays in the checkpoint
    [pair] = report["accountant_state"]["noise_pairs"]
    assert pair["queries"] == report["queries"] and pair["answered"] == report["answered"]
    full = ConfidentGNMaxAccountant()
    full.load_state_dict(checkpoint_accountant_state(gpate_run))
    assert full.answered == report["answered"] and full.get_epsilon(report["delta"]) == pytest.approx(report["epsilon"])


class ZeroAggregator(L.Callback):
    """Replaces the installed aggregator with one that releases nothing (all perturbations 0)
    but records what it was given."""

    def __init__(self):
        self.seen = []

    def on_fit_start(self, trainer, pl_module):
        def aggregate(teacher_gradients):
            self.seen.append(teacher_gradients.shape)
            return torch.zeros_like(teacher_gradients[0])

        pl_module.privacy.aggregate = aggregate


def test_the_generator_learns_only_through_the_aggregator(tiny_image_data_dir):
    """With an aggregator that releases nothing the generator's MSE target is its own output,
    so its weights never move, while every teacher still trains on its own partition."""
    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.gpate import GPATE

    torch.manual_seed(0)
    datamodule = MNISTDataModule(data_dir=tiny_image_data_dir, verify_checksums=False)
    module = GPATE((1, 28, 28), 10, latent_dim=8, generator_kwargs={"hidden": 16, "channels": 4},
                   teacher_kwargs={"channels": 2, "hidden": 8})
    strategy = ProjectedVoting(num_teachers=4, teacher_batch_size=10, sigma1=2.0, sigma2=2.0, delta=1e-3)
    spy = ZeroAggregator()
    generator_before = [p.detach().clone() for p in module.generator.parameters()]
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(3), strategy, spy], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    teachers_at_start = []
    strategy.on_fit_start = lambda trainer, pl_module: teachers_at_start.extend(
        p.detach().clone() for p in pl_module.teachers.parameters())
    trainer.fit(module, datamodule=datamodule)
    assert spy.seen == [torch.Size([4, 10, 1, 28, 28])] * 3  # K teachers' gradients on 10 generated records
    assert all(torch.equal(a, b) for a, b in zip(generator_before, module.generator.parameters()))
    assert not any(torch.equal(a, b) for a, b in zip(teachers_at_start, module.teachers.parameters()))
    assert module.train_steps == 3


def test_data_independent_accounting_stops_before_the_target(tiny_image_data_dir, tmp_path, capsys):
    args = ["train", *gpate_args(tiny_image_data_dir, tmp_path / "run", "--max-steps", "500", "--epsilon", "3",
                                 "--privacy.accounting", "data-independent", "--privacy.sigma1", "30",
                                 "--privacy.sigma2", "30")]
    assert main(args) == 0
    report = read_json(tmp_path / "run/privacy.json")
    assert 0 < report["steps"] < 500
    assert report["epsilon"] == pytest.approx(report["epsilon_data_independent"])
    assert report["accounting"] == "data-independent"
    assert "epsilon_data_dependent" not in report  # a function of the votes: printed, not written
    assert "data-dependent epsilon of this run is" in capsys.readouterr().err
    # Papernot et al. 2018 written out: every query's threshold check costs lambda / (2 sigma1^2),
    # every answered one's GNMax lambda / sigma2^2, composed by addition; Opacus' conversion
    from opacus.accountants.analysis.rdp import get_privacy_spent

    from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS

    def independent(queries, answered):
        orders = np.array(DEFAULT_ORDERS)
        rdp = queries * orders / (2 * 30.0**2) + answered * orders / 30.0**2
        return get_privacy_spent(orders=orders, rdp=rdp, delta=report["delta"])[0]

    assert report["epsilon"] == pytest.approx(independent(report["queries"], report["answered"]), rel=1e-9)
    assert report["epsilon"] <= 3.0
    per_step = 10 * 4  # generated records x projected dimensions
    assert independent(report["queries"] + per_step, report["answered"] + per_step) > 3.0  # a next step could pass it


def test_epsilon_presets_pick_the_papers_settings():
    from lightning_dpgan.config import resolve

    ten = resolve({"model": "gpate", "dataset": "mnist"}, {})
    one = resolve({"model": "gpate", "dataset": "mnist", "epsilon": 1.0}, {})
    assert (ten["privacy"]["num_teachers"], ten["privacy"]["sigma1"], ten["privacy"]["sigma2"]) == (2000, 600.0, 100.0)
    assert (one["privacy"]["num_teachers"], one["privacy"]["sigma1"], one["privacy"]["sigma2"]) == (4000, 3000.0, 1000.0)
    assert one["model"]["latent_dim"] == 50 and ten["model"]["latent_dim"] == 100
    assert one["presets"][-1] == "gpate_mnist_eps1.yaml"


def test_gpate_clip_and_bins_bounds_are_inclusive():
    from lightning_dpgan.callbacks.gpate import ProjectedVoting

    for accepted in ({"bins": 10_000}, {"clip": 1e30}, {"clip": 1e-30}):
        ProjectedVoting(num_teachers=10, **accepted)
    for refused, option in (({"bins": 10_001}, "--privacy.bins"), ({"clip": 1e31}, "--privacy.clip"),
                            ({"clip": 1e-31}, "--privacy.clip")):
        with pytest.raises(ValueError, match=option):
            ProjectedVoting(num_teachers=10, **refused)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--privacy.threshold", "2"], "fraction of the teachers"),
        (["--privacy.sigma2", "0"], "--privacy.sigma2"),
        (["--privacy.accounting", "magic"], "--privacy.accounting must be one of"),
        (["--privacy.clip", "1e300"], "--privacy.clip must be between"),
        (["--privacy.clip", "1e-300"], "--privacy.clip must be between"),
        (["--privacy.bins", "100000000000"], "--privacy.bins must be at most"),
        (["--privacy", "none"], "no privacy guarantee"),
    ],
)
def test_bad_gpate_settings_are_refused(tiny_image_data_dir, tmp_path, capsys, extra, message):
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "bad", *extra)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "privacy.json").exists()


def test_a_first_step_past_the_budget_is_priced_by_its_threshold_checks_alone(tiny_image_data_dir, tmp_path, capsys):
    """Before the votes a step is priced as if no query were answered (its threshold checks only):
    the refusal says "at least" and names the settings that make the checks cheaper."""
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "small", "--epsilon", "0.001")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "a single training step would spend at least epsilon" in line and "threshold checks alone" in line
    assert "--privacy.sigma1" in line and "--privacy.projection_dim" in line
    assert not (tmp_path / "small" / "privacy.json").exists()


def test_a_model_without_the_gradient_aggregator_slot_lists_gpate(tiny_image_data_dir, tmp_path, capsys):
    from run_helpers import tiny_run_args

    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "x") + ["--privacy", "gpate", "--epsilon", "1"]) == 2
    assert "Models that take --privacy gpate: gpate" in capsys.readouterr().err


def test_a_run_whose_next_batch_could_pass_the_budget_stops_and_says_it_was_refused(tiny_image_data_dir, tmp_path, capsys):
    """G-PATE charges a batch's worst case before answering: it refuses the batch, the run ends,
    and both the report and the user hear that the budget (not the 60 steps) ended it. The noise
    is seeded: with OS-entropy noise some runs spend so much in one step that not even an
    unanswered next step fits, and the budget callback stops them before any batch is refused."""
    args = gpate_args(tiny_image_data_dir, tmp_path / "refused", "--epsilon", "6", "--privacy.noise_seed", "0")
    args[args.index("--max-steps") + 1] = "60"
    assert main(["train", *args]) == 0
    report = read_json(tmp_path / "refused" / "privacy.json")
    assert report["stopped_by"] == "refused" and report["steps"] < 60 and report["epsilon"] <= 6
    assert "that query batch was refused and nothing of it released" in capsys.readouterr().out


def test_a_resume_that_answers_nothing_reports_the_noise_the_answers_had(gpate_run, tmp_path, tiny_image_data_dir):
    """Other sigmas given to a resume that takes no step (its --max-steps already reached): the
    report keeps those of the last batch charged."""
    first = read_json(gpate_run / "privacy.json")
    args = gpate_args(tiny_image_data_dir, tmp_path / "idle", "--resume", str(gpate_run / "checkpoints/last.ckpt"))
    args[args.index("--privacy.sigma1") + 1], args[args.index("--privacy.sigma2") + 1] = "30", "40"
    assert main(["train", *args]) == 0
    idle = read_json(tmp_path / "idle" / "privacy.json")
    assert idle["steps"] == first["steps"] and (idle["sigma1"], idle["sigma2"]) == (first["sigma1"], first["sigma2"]) == (20, 20)


def test_resume_continues_the_spend(gpate_run, tmp_path, tiny_image_data_dir):
    first = read_json(gpate_run / "privacy.json")
    args = ["train", *gpate_args(tiny_image_data_dir, tmp_path / "resumed", "--max-steps", "9",
                                 "--resume", str(gpate_run / "checkpoints/last.ckpt"))]
    assert main(args) == 0
    resumed = read_json(tmp_path / "resumed" / "privacy.json")
    assert resumed["steps"] == 9 and resumed["queries"] == 9 * 10 * 4
    assert resumed["epsilon_data_independent"] > first["epsilon_data_independent"]
    assert np.isfinite(resumed["epsilon"])
    # the first run's answers are counted by bin with the resumed run's, not restarted from zero
    assert sum(resumed["answers_per_bin"]) == resumed["answered"] > first["answered"]
    assert all(after >= before for after, before in zip(resumed["answers_per_bin"], first["answers_per_bin"]))


def test_perturbations_point_where_each_teacher_finds_the_record_more_real():
    """generator-loss: (1 - D) grad(logit) / B (the authors' code); discriminator-loss (Eq. 1):
    D grad(logit). Checked against a hand computation on one linear teacher."""
    from lightning_dpgan.modules.gpate import GPATE

    torch.manual_seed(5)
    module = GPATE((6,), None, num_teachers=3, teacher_kwargs={"hidden": ()})
    x = torch.rand(4, 6)
    teacher = module.teachers.teacher(1)
    weight = teacher.linears[0].weight.detach()[0]  # d logit / d x of a linear teacher
    d = torch.sigmoid(teacher(x)).detach()
    torch.testing.assert_close(module.adversarial_perturbations(x, None)[1], (1 - d)[:, None] * weight / 4)
    module.hparams.perturbation = "discriminator-loss"
    torch.testing.assert_close(module.adversarial_perturbations(x, None)[1], d[:, None] * weight)
    with pytest.raises(ValueError, match="perturbation"):
        GPATE((6,), None, perturbation="sideways")


def test_a_training_step_fits_the_generator_to_its_records_moved_by_the_released_perturbation(monkeypatch):
    """Algorithm 1 / Eq. 2: the target is x + dx (towards where the teachers find records real),
    and the teachers judge each generated record as the class it was generated for."""
    from types import SimpleNamespace

    from lightning_dpgan.modules import gpate

    torch.manual_seed(0)
    module = gpate.GPATE((6,), 3, num_teachers=2, teacher_kwargs={"hidden": ()})
    train_outside_a_trainer(module)
    module.privacy = SimpleNamespace(aggregate=lambda perturbations: torch.full_like(perturbations[0], 1e-2))
    fitted, judged, generated = [], [], []
    monkeypatch.setattr(gpate, "student_loss", lambda fake, target: fitted.append((fake.detach(), target)) or
                        ((fake - target) ** 2).sum())
    asked = module.teachers.input_gradients
    module.teachers.input_gradients = lambda x, labels=None, **kw: judged.append(labels) or asked(x, labels, **kw)
    forward = module.generator.forward
    module.generator.forward = lambda z, labels=None: generated.append(labels) or forward(z, labels)
    module.training_step(([torch.rand(2, 4, 6)], [torch.randint(0, 3, (2, 4))]), 0)
    (fake, target), = fitted
    torch.testing.assert_close(target - fake, torch.full_like(fake, 1e-2))
    assert len(generated) == len(judged) == 1 and torch.equal(judged[0], generated[0])


def test_a_refused_step_stops_the_run_and_leaves_the_generator_and_step_count_alone():
    """The aggregator refusing (nothing released) ends training there: the trainer is told to
    stop, the generator does not move and the step is not counted."""
    from types import SimpleNamespace

    from lightning_dpgan.modules import gpate

    torch.manual_seed(0)
    module = gpate.GPATE((6,), 3, num_teachers=2, teacher_kwargs={"hidden": ()})
    train_outside_a_trainer(module)
    module.trainer = trainer = SimpleNamespace(should_stop=False)

    def refuse(perturbations):
        raise PrivacyBudgetExhausted("no budget left")

    module.privacy = SimpleNamespace(aggregate=refuse)
    before, steps = [p.detach().clone() for p in module.generator.parameters()], int(module.train_steps)
    module.training_step(([torch.rand(2, 4, 6)], [torch.randint(0, 3, (2, 4))]), 0)
    assert trainer.should_stop is True and int(module.train_steps) == steps
    assert all(torch.equal(a, b) for a, b in zip(before, module.generator.parameters()))


def test_student_loss_is_eq_2_the_records_squared_distances_averaged():
    from lightning_dpgan.modules.gpate import student_loss

    fake = torch.tensor([[[0.0, 1.0], [2.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])  # 2 records, 2x2
    target = torch.tensor([[[1.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [1.0, 1.0]]])
    # record 0: 1 + 0 + 4 + 0 = 5; record 1: 0 + 1 + 0 + 0 = 1; mean over records 3
    assert student_loss(fake, target).item() == pytest.approx(3.0)


def test_a_bin_sized_perturbation_moves_the_generator_by_adams_full_step():
    """Perturbations are ~1e-4 (clipped, binned, projected back). The student's gradients must
    stay well above Adam's eps = 1e-8, else Adam shrinks the steps of the weights below it: a
    per-pixel mean left 41 % of an MNIST generator's weights there."""
    from lightning_dpgan.modules.gpate import student_loss
    from lightning_dpgan.nets.gpate import GPATEGenerator

    torch.manual_seed(0)
    generator = GPATEGenerator(16, (1, 28, 28), 10)
    fake = generator(torch.randn(30, 16), torch.randint(0, 10, (30,)))
    perturbation = 1e-4 * torch.randn_like(fake)
    student_loss(fake, (fake + perturbation).detach()).backward()
    grads = torch.cat([p.grad.flatten().abs() for p in generator.parameters() if p.grad is not None])
    first_step = grads / (grads + 1e-8)  # Adam's first step over lr, per weight
    assert (grads[grads > 0] > 1e-8).float().mean() > 0.99
    assert first_step.mean() > 0.95


def test_a_module_loaded_to_sample_has_no_teachers_and_draws_what_the_full_module_draws(gpate_run):
    """Sampling and evaluation load the generator without the K teachers (which the G-PATE
    presets make 1.6G parameters)."""
    from lightning_dpgan.modules.gpate import GPATE
    from lightning_dpgan.sampling import load_module

    checkpoint = gpate_run / "checkpoints/last.ckpt"
    full = GPATE.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    assert full.teachers is not None and full.teachers.num_teachers == 8
    light = load_module(checkpoint)
    assert light.teachers is None
    assert light.train_steps == full.train_steps > 0
    labels = full.balanced_labels(12)
    torch.manual_seed(5)
    expected = full.sample(12, labels)
    torch.manual_seed(5)
    assert torch.equal(light.sample(12, labels), expected)


def test_a_rank_resuming_reads_its_shard_of_the_teachers_copied_out_of_the_checkpoint(gpate_run, tmp_path):
    """A DDP rank's ``--resume`` (the trainer's checkpoint reader): of the K teachers and their
    Adam state it holds only its shard, in memory of the shard's size, and nothing it holds is
    still mapped from the file (a file rewritten in place must not change the training state)."""
    import shutil

    from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO
    from lightning_dpgan.sampling import load_module

    path = tmp_path / "last.ckpt"
    shutil.copy(gpate_run / "checkpoints/last.ckpt", path)
    full = torch.load(path, weights_only=False)
    rank = load_module(path)  # the generator, then this rank's shard as the strategy builds it
    rank.build_teachers(8, keep=slice(2, 5))
    checkpoint = ShareReadingCheckpointIO(rank).load_checkpoint(path)
    with open(path, "r+b") as file:  # in place, as `cp` over it would
        file.write(bytes(path.stat().st_size))

    teacher_keys = [key for key in full["state_dict"] if key.startswith("teachers.")]
    teacher_state = checkpoint["optimizer_states"][-1]["state"]
    assert teacher_keys and teacher_state
    shards = [(checkpoint["state_dict"][key], full["state_dict"][key]) for key in teacher_keys]
    shards += [(state[moment], full["optimizer_states"][-1]["state"][index][moment])
               for index, state in teacher_state.items() for moment in ("exp_avg", "exp_avg_sq")]
    for kept, whole in shards:
        assert whole.shape[0] == 8 and torch.equal(kept, whole[2:5])
        assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()
    for key, value in full["state_dict"].items():
        if key not in teacher_keys:
            assert torch.equal(checkpoint["state_dict"][key], value), key
    rank.on_load_checkpoint(checkpoint)  # what Lightning calls next: already cut, nothing changes
    rank.load_state_dict(checkpoint["state_dict"])
    assert torch.equal(rank.state_dict()[teacher_keys[0]], full["state_dict"][teacher_keys[0]][2:5])


def test_a_process_holding_all_teachers_reads_a_checkpoint_as_lightning_does(gpate_run, monkeypatch):
    """Without a shard the reader maps nothing: mapping a file that is then copied whole would
    only add the mapped pages to the peak memory."""
    from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO
    from lightning_dpgan.modules.gpate import GPATE

    path = gpate_run / "checkpoints/last.ckpt"
    whole = GPATE.load_from_checkpoint(path, map_location="cpu")
    assert not whole.holds_a_share()
    mapped, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *given, **options: mapped.append(options.get("mmap")) or load(*given, **options))
    checkpoint = ShareReadingCheckpointIO(whole).load_checkpoint(path)
    teachers = [value for key, value in checkpoint["state_dict"].items() if key.startswith("teachers.")]
    assert mapped == [None] and teachers and all(value.shape[0] == 8 for value in teachers)


def test_a_checkpoint_is_written_streamed_to_its_file_not_through_a_buffer(gpate_run, tmp_path, monkeypatch):
    """Lightning's writer serializes the whole checkpoint into memory and copies that buffer to
    write it (twice a G-PATE preset's ~10 GB of teachers and Adam moments): ours streams it to a
    temporary file renamed into place, and a failed write leaves the previous file as it was."""
    import io

    from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO
    from lightning_dpgan.modules.gpate import GPATE

    checkpoint = torch.load(gpate_run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    writer = ShareReadingCheckpointIO(GPATE.load_from_checkpoint(gpate_run / "checkpoints/last.ckpt", map_location="cpu"))
    targets, save = [], torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: targets.append(f) or save(obj, f, *a, **k))
    path = tmp_path / "ckpt" / "last.ckpt"
    writer.save_checkpoint(checkpoint, path)
    assert len(targets) == 1 and not isinstance(targets[0], io.BytesIO) and targets[0] != path
    written = torch.load(path, map_location="cpu", weights_only=False)
    assert all(torch.equal(written["state_dict"][key], value) for key, value in checkpoint["state_dict"].items())

    def full_disk(obj, f, *a, **k):
        Path(f).write_bytes(b"half")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space"):
        writer.save_checkpoint(checkpoint, path)
    assert torch.load(path, map_location="cpu", weights_only=False)["state_dict"].keys() == checkpoint["state_dict"].keys()
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no half-written file left


def test_sample_exports_labelled_images_from_a_gpate_checkpoint(gpate_run, tmp_path):
    from lightning_dpgan.evaluation import load_synthetic_npz

    out = tmp_path / "synthetic.npz"
    assert main(["sample", "--checkpoint", str(gpate_run / "checkpoints/last.ckpt"), "-n", "30", "--out", str(out)]) == 0
    images, labels = load_synthetic_npz(out)
    assert images.shape == (30, 1, 28, 28) and labels.tolist() == [i % 10 for i in range(30)]


def test_gpate_on_a_table_writes_decoded_synthetic_rows(tmp_path):
    """The tabular path (MLP generator and teachers) on the Kaggle Credit fixture, preset included."""
    import pandas as pd

    fixture = REPO / "tests" / "fixtures" / "credit_tiny"
    args = ["train", "--model", "gpate", "--dataset", "kaggle-credit", "--data-dir", str(fixture),
            "--output-dir", str(tmp_path / "run"), "--max-steps", "3", "--epsilon", "5", "--delta", "1e-3",
            "--privacy.num_teachers", "4", "--privacy.teacher_batch_size", "8",
            "--privacy.sigma1", "20", "--privacy.sigma2", "20",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main(args) == 0
    report = read_json(tmp_path / "run/privacy.json")
    assert report["projection_dim"] == 5 and report["queries"] == 3 * 8 * 5  # the credit preset's 5 dimensions
    synthetic = pd.read_csv(tmp_path / "run/synthetic.csv")
    assert list(synthetic.columns)[:2] == ["Time", "V1"] and "Class" in synthetic.columns
    assert set(synthetic["Class"].unique()) <= {0, 1}


def test_teachers_that_cannot_fit_in_memory_are_refused_up_front(tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    import lightning_dpgan.callbacks.teachers as teachers

    from lightning_dpgan.modules.gpate import GPATE

    built = []
    monkeypatch.setattr(GPATE, "build_teachers", lambda self, k, keep=None: built.append(k))
    monkeypatch.setattr(teachers, "available_memory", lambda device: 10_000)  # bytes
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "run")]) == 2
    message = capsys.readouterr().err
    assert "8 teachers" in message and "--privacy.num_teachers" in message
    assert built == []  # refused before building them: building alone can exhaust the memory
    assert not (tmp_path / "run" / "privacy.json").exists()


def test_under_ddp_the_memory_check_counts_the_shards_of_this_machines_ranks(tiny_image_data_dir, tmp_path, monkeypatch):
    """Memory for 6 of the 8 teachers: one process is refused; so are two CPU ranks on this
    machine (4 teachers each, built at once in the same memory); a rank whose machine runs it
    alone goes on to build just its shard. (Their slices would hold them all: no slicing.)"""
    import lightning_dpgan.callbacks.teachers as teachers

    from lightning_dpgan.modules.gpate import GPATE

    per_teacher = GPATE((1, 28, 28), 10, teacher_kwargs={"channels": 2, "hidden": 8}).parameters_per_teacher()
    monkeypatch.setattr(teachers, "available_memory", lambda device: 6 * per_teacher * 4 * teachers.HOST_TEACHER_MEMORY_FACTOR)
    built = []

    class Built(Exception):
        """Stops the run once the teachers are built: the rest of a DDP run needs a process group."""

    def record_and_stop(self, k, keep=None):
        built.append((k, keep))
        raise Built

    monkeypatch.setattr(GPATE, "build_teachers", record_and_stop)
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "one")]) == 2  # 8 teachers: refused
    monkeypatch.setattr(teachers, "world_size", lambda: 2)
    monkeypatch.setattr(teachers, "shard", lambda total: slice(0, total // 2))  # rank 0 of 2
    monkeypatch.setattr(L.Trainer, "num_devices", property(lambda trainer: 2))  # both ranks on this machine
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "two_here")]) == 2
    assert built == []
    monkeypatch.setattr(L.Trainer, "num_devices", property(lambda trainer: 1))  # one rank per machine
    with pytest.raises(Built):
        main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "one_here")])
    assert built == [(8, slice(0, 4))]


@pytest.mark.parametrize(("shape", "teacher_kwargs"), [((1, 28, 28), {"channels": 4, "hidden": 8}), ((12,), {"hidden": (16,)})])
def test_the_memory_check_counts_the_parameters_k_teachers_will_have(shape, teacher_kwargs):
    """The check multiplies one teacher's parameters by K before building: exact for the conv
    (vmap) and the MLP (batched matmul) forms."""
    from lightning_dpgan.modules.gpate import GPATE

    per_teacher = GPATE(shape, 10, teacher_kwargs=teacher_kwargs).parameters_per_teacher()
    built = GPATE(shape, 10, teacher_kwargs=teacher_kwargs, num_teachers=7).teachers
    assert 7 * per_teacher == sum(p.numel() for p in built.parameters())


def test_several_teacher_updates_per_step_are_all_taken(tiny_image_data_dir, tmp_path, monkeypatch):
    from lightning_dpgan.modules.gpate import GPATE

    calls = []
    original = GPATE.update_teachers

    def counting(self, *args):
        calls.append(args[1].shape)
        return original(self, *args)

    monkeypatch.setattr(GPATE, "update_teachers", counting)
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "run", "--max-steps", "2",
                                      "--model.teacher_steps", "3")]) == 0
    assert calls == [torch.Size([8, 10, 1, 28, 28])] * 6  # 3 updates x 2 steps, each on every teacher's own batch


def test_teachers_too_many_for_one_graph_train_a_slice_at_a_time(monkeypatch):
    """Memory for one graph over all K: trained as usual. Memory for the teachers' state and one
    slice's temporaries (4x + 6x * 10/50 + 1.7x on the host): a slice at a time, if their ensemble
    can. A "slice" of all K, or not even that memory: refused, saying so."""
    import torch

    import lightning_dpgan.callbacks.teachers as teachers

    per_teacher, k = 1000, 50
    parameter_bytes = k * per_teacher * 4
    memory = {"free": teachers.HOST_TEACHER_MEMORY_FACTOR * parameter_bytes}
    monkeypatch.setattr(teachers, "available_memory", lambda device: memory["free"])
    cpu = torch.device("cpu")
    assert teachers.check_teacher_memory(k, per_teacher, cpu, slice_size=10) is False
    memory["free"] = 6.9 * parameter_bytes
    assert teachers.check_teacher_memory(k, per_teacher, cpu, slice_size=10) is True
    with pytest.raises(teachers.TeacherMemoryError, match=r"10x their parameters"):
        teachers.check_teacher_memory(k, per_teacher, cpu, slice_size=None)
    with pytest.raises(teachers.TeacherMemoryError, match=r"10x their parameters"):
        teachers.check_teacher_memory(k, per_teacher, cpu, slice_size=k)  # one slice of all: the whole graph
    memory["free"] -= 4
    with pytest.raises(teachers.TeacherMemoryError, match=r"trained 10 at a time \(6.9x their parameters"):
        teachers.check_teacher_memory(k, per_teacher, cpu, slice_size=10)


def test_gpate_trains_teachers_a_slice_at_a_time_when_one_graph_would_not_fit(tiny_image_data_dir, tmp_path, monkeypatch):
    """The MNIST preset's 2000 paper-size teachers on a 24 GB host: the same command trains
    them a slice at a time (here: memory for 8 teachers in slices, not in one graph)."""
    import lightning_dpgan.callbacks.teachers as teachers

    from lightning_dpgan.modules.gpate import GPATE
    from lightning_dpgan.nets.ensemble import VmapTeacherEnsemble

    per_teacher = GPATE((1, 28, 28), 10, teacher_kwargs={"channels": 2, "hidden": 8}).parameters_per_teacher()
    # slices of 3: 4x + 6x * 3/8 + 1.7x = 7.95x their parameters fit, one graph's 10x does not
    monkeypatch.setattr(teachers, "available_memory", lambda device: 8 * per_teacher * 4 * 8)
    monkeypatch.setattr(teachers, "TRAIN_CHUNK_RECORDS", 30)  # batch 10: 3 teachers a slice
    slices = []
    original = VmapTeacherEnsemble.backward_in_chunks

    def recorded(self, *args, **options):
        slices.append((self.num_teachers, self.train_chunk, options))
        return original(self, *args, **options)

    monkeypatch.setattr(VmapTeacherEnsemble, "backward_in_chunks", recorded)
    assert main(["train", *gpate_args(tiny_image_data_dir, tmp_path / "run", "--max-steps", "2")]) == 0
    assert slices == [(8, 3, {"loss_scale": 1.0})] * 2  # one teacher update per step, in slices of 3, full precision
    assert read_json(tmp_path / "run" / "privacy.json")["steps"] == 2


def test_the_memory_check_reserves_more_on_the_host_than_on_a_gpu(monkeypatch):
    """The host keeps freed memory for reuse (lightning_dpgan.host_memory), which a GPU's
    caching allocator does not need: memory for 9x the teachers' parameters trains them on a
    GPU and is refused on the host."""
    import torch

    import lightning_dpgan.callbacks.teachers as teachers

    per_teacher, k = 1000, 50
    parameter_bytes = k * per_teacher * 4
    monkeypatch.setattr(teachers, "available_memory", lambda device: 9 * parameter_bytes)
    teachers.check_teacher_memory(k, per_teacher, torch.device("cuda"))  # 8x needed: fits
    with pytest.raises(teachers.TeacherMemoryError, match=r"10x their parameters"):
        teachers.check_teacher_memory(k, per_teacher, torch.device("cpu"))


def test_the_host_memory_to_build_the_teachers_counts_every_process_of_the_machine(monkeypatch):
    """Under DDP each rank of a machine builds its shard in host memory at the same time, even
    when they then train on GPUs: the build check multiplies by them."""
    import torch

    import lightning_dpgan.callbacks.teachers as teachers

    per_teacher, k = 1000, 50
    build_bytes = teachers.TEACHER_BUILD_FACTOR * k * per_teacher * 4
    monkeypatch.setattr(teachers, "available_memory",
                        lambda device: 3 * build_bytes if device.type == "cpu" else 10**15)
    assert teachers.check_teacher_memory(k, per_teacher, torch.device("cuda"), processes_on_host=3) is False
    with pytest.raises(teachers.TeacherMemoryError, match="in each of 4 processes on this machine need about .* of "
                                                          "host memory to build"):
        teachers.check_teacher_memory(k, per_teacher, torch.device("cuda"), processes_on_host=4)


def test_a_batch_size_the_teachers_never_read_and_minibatches_larger_than_a_partition_are_said(
        tiny_image_data_dir, tmp_path, capsys, caplog):
    """--batch-size does not reach G-PATE's teachers (their loader draws teacher_batch_size records
    from each partition), and 30 records from partitions of 20 repeat some: both were silent."""
    args = gpate_args(tiny_image_data_dir, tmp_path / "run", "--batch-size", "1000", "--max-steps", "1",
                      "--epsilon", "50")
    args[args.index("--privacy.teacher_batch_size") + 1] = "30"
    with caplog.at_level("WARNING"):
        assert main(["train", *args]) == 0
    assert ("data.batch_size 1000 (--batch-size, a config file or a preset) is not used by --privacy gpate: each "
            "teacher trains on --privacy.teacher_batch_size records a step (30)") in capsys.readouterr().err
    assert "each teacher's minibatch of 30 records is drawn with replacement" in caplog.text
    assert "smallest of which holds 20" in caplog.text


@pytest.mark.parametrize("sigma2,drowned", [("20", True), ("4", False)])
def test_answers_whose_noise_outweighs_every_teachers_vote_are_said_to_teach_little(
        tiny_image_data_dir, tmp_path, caplog, sigma2, drowned):
    """A preset's sigmas kept while --privacy.num_teachers is lowered (sigma2 1000 against 20
    teachers) trained on answers that were mostly noise, without a word."""
    args = gpate_args(tiny_image_data_dir, tmp_path / "run", "--max-steps", "1", "--epsilon", "50")
    args[args.index("--privacy.sigma2") + 1] = sigma2
    with caplog.at_level("WARNING"):
        assert main(["train", *args]) == 0
    assert (f"--privacy.sigma2 {sigma2} is at least the 8 teachers' whole vote" in caplog.text) is drowned
