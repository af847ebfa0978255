"""PrivacyBudgetStopping never lets epsilon pass the target, and stops no earlier than needed."""
import re
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_dpgan.callbacks.budget import BudgetTooSmallError, PrivacyBudgetStopping
from lightning_dpgan.callbacks.strategy import PrivacyStrategy
from lightning_dpgan.privacy.accountants import OpacusAccountant


class StubStrategy(PrivacyStrategy):
    """A strategy with a real Opacus accountant and fixed (sigma, q), no Lightning needed."""

    name = "stub"

    def __init__(self, sigma, rate, delta=1e-5):
        super().__init__(delta=delta)
        self.accountant = OpacusAccountant("rdp")
        self.params = {"noise_multiplier": sigma, "sample_rate": rate}

    def next_step_params(self):
        return dict(self.params)

    def take_step(self):
        self.accountant.step(**self.params)

    def epsilon_if(self, steps=1):
        return self.accountant.epsilon_if(self.delta, steps, **self.params)


def run_until_stopped(strategy, target, max_steps=5000):
    """Drive the callback the way Lightning's loop does; returns (callback, trainer)."""
    budget, strategy.target_epsilon = PrivacyBudgetStopping(target), target
    trainer = SimpleNamespace(should_stop=False, callbacks=[strategy, budget], log_every_n_steps=50, loggers=[])
    module = SimpleNamespace(train_steps=0, log=lambda *args, **kwargs: None)
    budget.setup(trainer, module, "fit")
    budget.on_train_start(trainer, module)
    while not trainer.should_stop and module.train_steps < max_steps:
        strategy.take_step()
        module.train_steps += 1
        budget.on_train_batch_end(trainer, module)
    return budget, trainer


@settings(max_examples=25, deadline=None)
@given(
    sigma=st.floats(0.6, 3.0),
    rate=st.floats(0.005, 0.3),
    target=st.floats(0.3, 8.0),
)
def test_epsilon_never_exceeds_the_target_and_the_budget_is_used(sigma, rate, target):
    strategy = StubStrategy(sigma, rate)
    if strategy.epsilon_if(1) > target:
        with pytest.raises(BudgetTooSmallError):
            run_until_stopped(strategy, target)
        return
    budget, trainer = run_until_stopped(strategy, target)
    spent = strategy.epsilon()
    assert spent <= target
    if budget.stopped_by_budget:
        assert strategy.epsilon_if(1) > target  # stopping earlier would have wasted budget
    else:
        assert len(strategy.accountant) == 5000


def test_planned_limit_equals_stepping_one_by_one():
    strategy = StubStrategy(1.0, 0.05)
    budget, _ = run_until_stopped(strategy, 3.0)
    brute = StubStrategy(1.0, 0.05)
    while brute.epsilon_if(1) <= 3.0:
        brute.take_step()
    assert len(strategy.accountant) == len(brute.accountant) > 0
    assert budget.stopped_by_budget


class PreprocessedStubStrategy(StubStrategy):
    """The stub with a preprocessing cost and the base class's own ``epsilon``/``epsilon_if``
    (which the plain stub overrides), so that the stop sees what the product composes."""

    def __init__(self, sigma, rate, preprocessing_epsilon, delta=1e-5):
        super().__init__(sigma, rate, delta)
        self.preprocessing = {"epsilon": preprocessing_epsilon, "delta": 0.0}

    epsilon_if = PrivacyStrategy.epsilon_if


def test_the_stop_counts_what_preprocessing_spent():
    strategy = PreprocessedStubStrategy(1.0, 0.05, preprocessing_epsilon=1.0)
    budget, _ = run_until_stopped(strategy, 3.0)
    assert budget.stopped_by_budget
    assert strategy.epsilon() == pytest.approx(1.0 + strategy.accountant.get_epsilon(1e-5))
    assert strategy.epsilon() <= 3.0 < strategy.epsilon_if(1)
    # training alone got the 2.0 left, no more: the plain stub (no preprocessing) takes more steps
    alone = StubStrategy(1.0, 0.05)
    while alone.accountant.epsilon_if(1e-5, 1, **alone.params) <= 2.0:
        alone.take_step()
    assert len(strategy.accountant) == len(alone.accountant)


def test_a_resume_under_a_target_below_training_plus_preprocessing_is_refused():
    """A checkpoint whose training spend alone fits the new --epsilon, but not with what its
    preprocessing spent: its report would pass the target, so the resume is refused."""
    strategy = PreprocessedStubStrategy(1.0, 0.05, preprocessing_epsilon=1.0)
    run_until_stopped(strategy, 3.0)
    training, total = strategy.training_epsilon(), strategy.epsilon()
    between = (training + total) / 2
    assert training < between < total
    with pytest.raises(BudgetTooSmallError, match=f"already spent epsilon = {total:.4g}, more than --epsilon {between:g}"):
        run_until_stopped(strategy, between)


def test_changed_step_parameters_trigger_a_new_plan():
    strategy = StubStrategy(2.0, 0.05)
    budget = PrivacyBudgetStopping(2.0)
    budget.strategy = strategy
    generous = budget.allowed_total_steps()
    strategy.params["noise_multiplier"] = 0.8  # less noise: fewer steps fit
    assert budget.allowed_total_steps() < generous


def test_resumed_run_with_budget_spent_stops_without_error():
    strategy = StubStrategy(1.0, 0.05)
    run_until_stopped(strategy, 2.0)
    steps = len(strategy.accountant)
    _, trainer = run_until_stopped(strategy, 2.0)  # "resume": the accountant already holds the spend
    assert trainer.should_stop and len(strategy.accountant) == steps


class LinearStrategy(PrivacyStrategy):
    """epsilon_if(k) = k / steps_in_budget: exactly that many steps fit in epsilon 1."""

    name = "linear"

    def __init__(self, steps_in_budget):
        super().__init__(delta=1e-5)
        self.steps_in_budget = steps_in_budget

    def steps_taken(self):
        return 0

    def plan_key(self):
        return ()

    def epsilon_if(self, steps=1):
        return steps / self.steps_in_budget


@pytest.mark.parametrize("fitting", [3, 1000, 67_108_865, 99_999_999, 10**8])
def test_the_plan_is_the_largest_number_of_steps_that_fits_up_to_the_cap(fitting):
    """Near the cap the doubling stops at 2^27 > 10^8 without checking it: what it returns must
    still fit (it returned the cap whenever 2^26 steps fitted)."""
    budget = PrivacyBudgetStopping(1.0)
    budget.strategy = LinearStrategy(fitting)
    assert budget.allowed_total_steps() == fitting


@pytest.mark.parametrize("max_steps,max_epochs,planned", [(5, 3, 5), (50, 3, 30), (None, 3, 30), (7, -1, 7)])
def test_noise_is_calibrated_for_the_shorter_of_the_step_and_epoch_limits(max_steps, max_epochs, planned):
    """Calibrating for the longer one adds noise for steps the run never takes."""
    from lightning_dpgan.callbacks.step_limit import StepLimit

    limits = [] if max_steps is None else [StepLimit(max_steps)]
    trainer = SimpleNamespace(callbacks=limits, max_epochs=max_epochs)
    assert PrivacyStrategy.planned_batches(trainer, batches_per_epoch=10) == planned


def test_a_strategy_refuses_lightnings_own_multi_process_strategies_and_another_strategys_state():
    """Lightning's DDP averages gradients in backward, before a mechanism could clip and noise
    them: only the project's own DDP strategy keeps the single-process guarantee. The command
    line refuses it first; a strategy used from Python must refuse it too."""
    from lightning_dpgan.callbacks.pate import PATEAggregation
    from lightning_dpgan.modules.pategan import PATEGAN
    from lightning_dpgan.privacy.accountants import AccountantStateError, PATEMomentsAccountant

    strategy = PATEAggregation(num_teachers=3)
    trainer = SimpleNamespace(world_size=2, strategy=object(), datamodule=None)
    with pytest.raises(ValueError, match="trains in several processes only with --strategy ddp"):
        strategy.setup(trainer, PATEGAN((6,)), "fit")
    strategy.accountant = PATEMomentsAccountant()
    state = strategy.state_dict()
    with pytest.raises(AccountantStateError, match="not a pate state"):
        strategy.load_state_dict({**state, "strategy": "dp-sgd"})


class QuarterStrategy(PrivacyStrategy):
    """Each step costs exactly epsilon 0.25 (exact in binary): the stopping step is known in advance."""

    name = "quarter"

    def __init__(self, steps=0):
        super().__init__(delta=1e-5)
        self.steps = steps

    def steps_taken(self):
        return self.steps

    def plan_key(self):
        return ()

    def epsilon(self):
        return self.steps * 0.25

    def epsilon_if(self, steps=1):
        return (self.steps + steps) * 0.25


class RecordingLogger:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((metrics, step))


def drive(strategy, target, steps, log_every_n_steps=50):
    """Lightning's loop for at most ``steps`` batches; returns what the module and the loggers got."""
    budget, logger = PrivacyBudgetStopping(target), RecordingLogger()
    strategy.target_epsilon = target
    trainer = SimpleNamespace(should_stop=False, callbacks=[strategy, budget], log_every_n_steps=log_every_n_steps,
                              loggers=[logger])
    logged = []
    module = SimpleNamespace(train_steps=strategy.steps,
                             log=lambda name, value, **kwargs: logged.append((module.train_steps, name, value, kwargs)))
    budget.setup(trainer, module, "fit")
    budget.on_train_start(trainer, module)
    for _ in range(steps):
        if trainer.should_stop:
            break
        strategy.steps += 1
        module.train_steps += 1
        budget.on_train_batch_end(trainer, module)
    budget.on_train_end(trainer, module)
    return budget, trainer, logged, logger.logged


def test_the_stopping_steps_epsilon_is_logged_as_the_budget_stops_the_run_off_the_cadence():
    """Stopped at step 4 (a fifth would pass 1.0), far from the cadence of 50: the figure logged
    there is the one the report states, as float64, so that metrics.json is not an older one.
    The loggers get it directly, once, numbered as its batch; Lightning's logging shows it on the
    progress bar only, so that it has no cached figure to write again at a later stop."""
    budget, trainer, logged, to_loggers = drive(QuarterStrategy(), 1.0, 100)
    assert budget.stopped_by_budget and trainer.should_stop
    assert [(step, name) for step, name, _, _ in logged] == [(4, "privacy/epsilon")]
    _, _, value, flags = logged[0]
    assert value.dtype == torch.float64 and value.item() == 1.0 <= budget.target_epsilon
    assert flags == {"prog_bar": True, "logger": False}
    assert to_loggers == [({"privacy/epsilon": 1.0}, 3)]



def test_the_last_steps_epsilon_goes_to_the_loggers_once_numbered_as_its_batch_and_not_again_on_resume():
    """Three steps, ended by another limit off the cadence: the loggers number batch n's scalars
    n - 1. A resume that trains no step writes no second figure for step 3."""
    strategy = QuarterStrategy()
    _, _, logged, to_loggers = drive(strategy, 8.0, 3)
    assert logged == [] and to_loggers == [({"privacy/epsilon": 0.75}, 2)]
    _, _, logged, to_loggers = drive(strategy, 8.0, 0)
    assert logged == [] and to_loggers == []


def test_a_resume_whose_checkpoint_spent_exactly_the_target_stops_without_error():
    """epsilon spent == --epsilon is within the target: the run stops before a step, not refused."""
    strategy = QuarterStrategy(steps=4)
    budget, trainer, _, _ = drive(strategy, 1.0, 10)
    assert trainer.should_stop and budget.stopped_by_budget and strategy.steps == 4


def test_a_resume_whose_checkpoint_spent_just_above_the_target_is_refused():
    """ε 1.0 spent against --epsilon 0.9999: continuing would report more than the target."""
    with pytest.raises(BudgetTooSmallError):
        drive(QuarterStrategy(steps=4), 0.9999, 10)


def test_a_resume_with_budget_left_trains_until_the_budget_stops_it():
    """Two steps (ε 0.5) in the checkpoint, --epsilon 1: two more fit. The plan counts the steps
    taken before, or the run stops early, reported as stopped by the budget with half of it unspent."""
    strategy = QuarterStrategy(steps=2)
    budget, _, _, _ = drive(strategy, 1.0, 10)
    assert strategy.steps == 4 and budget.stopped_by_budget


def test_two_privacy_strategies_are_refused():
    """Two accountants, and the budget would watch only one of them."""
    budget = PrivacyBudgetStopping(1.0)
    trainer = SimpleNamespace(callbacks=[QuarterStrategy(), QuarterStrategy(), budget])
    with pytest.raises(ValueError, match="exactly one privacy strategy callback, found 2"):
        budget.setup(trainer, None, "fit")


@pytest.mark.parametrize("strategy_name", ["dp-sgd", "sanitizer"])
def test_a_target_epsilon_nothing_would_stop_training_at_is_refused_at_setup(strategy_name):
    """Given as a library, DPSGD(noise_multiplier=0.8, target_epsilon=1) trained 30 steps to
    epsilon 5.1 (GradientSanitizer: 59.9 after one step) with no PrivacyBudgetStopping, or with one
    of another target, and its privacy report still stated the target 1."""
    from lightning_dpgan import registry

    strategy = registry.lookup("privacy", strategy_name).load()(noise_multiplier=0.8, target_epsilon=1.0, delta=1e-5)
    trainer = SimpleNamespace(world_size=1, strategy=object(), callbacks=[strategy])
    with pytest.raises(ValueError, match=r"PrivacyBudgetStopping\(1\) to the Trainer's callbacks"):
        strategy.setup(trainer, registry.lookup("model", "dpgan" if strategy_name == "dp-sgd" else "gswgan").load()
                       ((1, 8, 8), None), "fit")
    budget = PrivacyBudgetStopping(50.0)
    with pytest.raises(ValueError, match=r"PrivacyBudgetStopping\(50\) and .*\(target_epsilon=1\) disagree"):
        budget.setup(SimpleNamespace(callbacks=[strategy, budget]), None, "fit")
    matching = PrivacyBudgetStopping(1.0)
    trainer.callbacks.append(matching)
    strategy.check_target_enforced(trainer)  # a matching budget: accepted
    matching.setup(trainer, None, "fit")
    assert matching.strategy is strategy


def test_a_strategy_of_ones_own_is_refused_a_target_nothing_holds_and_the_vote_strategies_are_not():
    """A strategy written by a user trained 12 steps to epsilon 4.09 for a target of 3 with no
    PrivacyBudgetStopping, its report stating the target: the base class accepted it. The vote
    strategies refuse an answer past the target themselves, so they need no budget callback."""
    from lightning_dpgan.callbacks.pate import PATEAggregation

    own = QuarterStrategy()
    own.target_epsilon = 3.0
    trainer = SimpleNamespace(callbacks=[own])
    with pytest.raises(ValueError, match=r"QuarterStrategy\(target_epsilon=3\) is held by the PrivacyBudgetStopping "
                                         r"callback, .* Add PrivacyBudgetStopping\(3\) to the Trainer's callbacks, "
                                         "or give no target_epsilon"):
        own.check_target_enforced(trainer)
    own.check_target_enforced(SimpleNamespace(callbacks=[own, PrivacyBudgetStopping(3.0)]))
    own.target_epsilon = None
    own.check_target_enforced(trainer)  # no target: nothing to hold
    votes = PATEAggregation(num_teachers=3, target_epsilon=3.0, delta=1e-5)
    votes.check_target_enforced(SimpleNamespace(callbacks=[votes]))


def test_calibrating_without_a_run_length_names_what_a_library_user_gives():
    """A Trainer(max_steps=...) is not read (Lightning counts optimizer steps): the refusal names
    StepLimit, not only the command line's flags."""
    trainer = SimpleNamespace(callbacks=[], max_epochs=-1)
    with pytest.raises(ValueError, match=r"StepLimit\(n\) callback or Trainer\(max_epochs=n\)"):
        PrivacyStrategy.planned_batches(trainer, 10)


@pytest.mark.parametrize("floors, said", [({"min_steps": 0}, "trainer.min_steps 0 (even 0"),
                                          ({"min_epochs": 1}, "trainer.min_epochs 1 would make")])
def test_a_trainer_built_by_hand_with_a_step_floor_is_refused_before_training_passes_its_target(
        tiny_image_data_dir, tmp_path, floors, said):
    """Lightning ignores a stop request until min_steps/min_epochs are met, and any min_steps makes
    it finish the first epoch: a budget stop due after 8 of 10 batches trained all 10 and the
    report gave epsilon 2.11 for a target of 2."""
    import lightning as L

    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.dpgan import DPGAN

    module = DPGAN((1, 28, 28), 10, latent_dim=4, generator_kwargs={"base_channels": 4},
                   discriminator_kwargs={"base_channels": 4})
    strategy = DPSGD(noise_multiplier=1.0, target_epsilon=2.0, delta=1e-3)
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(50), strategy, PrivacyBudgetStopping(2.0)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, **floors)
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=16, verify_checksums=False)
    with pytest.raises(ValueError, match=re.escape(said)):
        trainer.fit(module, datamodule=data)
    assert module.train_steps == 0


def test_a_trainer_with_two_privacy_strategies_is_refused_at_setup():
    """The second would install its mechanism over the first's; the message must not blame an
    earlier fit the module never had."""
    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.modules.dpgan import DPGAN

    first, second = DPSGD(noise_multiplier=1.0), DPSGD(noise_multiplier=2.0)
    trainer = SimpleNamespace(world_size=1, callbacks=[first, second])
    with pytest.raises(ValueError, match="a Trainer takes one privacy strategy callback, and this one has 2: DPSGD, DPSGD"):
        first.setup(trainer, DPGAN((1, 28, 28), 10, latent_dim=4), "fit")


def test_a_budget_stop_over_a_strategy_without_the_target_is_refused():
    """A vote strategy refuses an answer past the target only when it holds the target, and the
    budget's look-ahead prices the cheapest next step: G-PATE with PrivacyBudgetStopping(0.5) and
    no target of its own ended at epsilon 0.60."""
    from lightning_dpgan.callbacks.gpate import ProjectedVoting

    strategy = ProjectedVoting(num_teachers=4)
    budget = PrivacyBudgetStopping(0.5)
    with pytest.raises(ValueError, match=r"PrivacyBudgetStopping\(0.5\) needs the same target on its strategy, and "
                                         r"ProjectedVoting has none.*vote strategy refuses the answers.*"
                                         r"Give ProjectedVoting\(target_epsilon=0.5, ...\)"):
        budget.setup(SimpleNamespace(callbacks=[strategy, budget]), None, "fit")
    gradients = QuarterStrategy()  # a gradient strategy is not told about vote strategies
    with pytest.raises(ValueError, match=r"QuarterStrategy has none: its privacy report would state no target\. "
                                         r"Give QuarterStrategy\(target_epsilon=0.5, ...\)$"):
        budget.setup(SimpleNamespace(callbacks=[gradients, budget]), None, "fit")
