"""GS-WGAN's amplified mode (``--privacy sanitizer --privacy.num_critics N``): the without-replacement
RDP bound (Wang, Balle & Kasiviswanathan 2019, Theorem 9) against dp_accounting and against the
theorem written out by hand, critics confined to their partitions, trained on the public round-robin
schedule (also across a resume) while a secret, uniform, independent draw picks the critic that
answers, and the mode end to end (report, budget, resume)."""
import math
from types import SimpleNamespace

import dp_accounting
import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from dp_accounting.rdp import rdp_privacy_accountant
from run_helpers import (assert_resume_restores_sampler_draws, grid_tiles, read_json, tiny_run_args,
                         train_outside_a_trainer)
from torch.utils.data import DataLoader, TensorDataset

from lightning_dpgan.callbacks.gradient_sanitizer import CriticIterations, CriticSampler, GradientSanitizer
from lightning_dpgan.callbacks.step_limit import StepLimit
from lightning_dpgan.cli import main
from lightning_dpgan.data.partition import disjoint_partitions, teacher_partitions
from lightning_dpgan.modules.gswgan import GSWGAN, CriticBank
from lightning_dpgan.privacy.accountants import (
    GaussianAccountant,
    SelectedCriticGaussianAccountant,
    calibrate_selected_critic_noise,
)
from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS, gaussian_rdp, rdp_to_epsilon
from lightning_dpgan.privacy.analysis.subsampling import selected_critic_gaussian_rdp
from lightning_dpgan.sampling import sample_to_file
from scipy import stats

ORDERS = np.array(DEFAULT_ORDERS)


# ------------------------------------------------------------------ the bound
def dp_accounting_wor_rdp(noise, num_critics):
    """dp_accounting's RDP of one Gaussian on one of N sampled without replacement (its Theorem 27)."""
    accountant = rdp_privacy_accountant.RdpAccountant(
        list(ORDERS), neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        source_dataset_size=num_critics, sample_size=1, event=dp_accounting.GaussianDpEvent(noise)))
    return np.asarray(accountant._rdp)


@pytest.mark.parametrize("noise, num_critics", [(0.5, 4), (1.0, 10), (0.3, 1000)])
def test_theorem9_equals_dp_accounting_where_the_gaussian_refinement_does_not_bite(noise, num_critics):
    """dp_accounting computes Theorem 27, which takes for every j >= 3 the smaller of Theorem 9's
    term and a forward-difference term; at these noise levels Theorem 9's term is the smaller
    one at every order, so the two computations must agree to rounding."""
    np.testing.assert_allclose(selected_critic_gaussian_rdp(ORDERS, noise, num_critics),
                               dp_accounting_wor_rdp(noise, num_critics), rtol=1e-9)


@pytest.mark.parametrize("noise, num_critics", [(0.0946, 1000), (2.0, 1000), (5.0, 100), (0.8, 2), (1.5, 50)])
def test_theorem9_is_never_below_dp_accounting_except_where_the_plain_gaussian_is_lower(noise, num_critics):
    """Theorem 9 is the general bound, Theorem 27 its Gaussian refinement: ours may only be lower
    where it is capped by the un-amplified Gaussian, itself a valid bound."""
    ours = selected_critic_gaussian_rdp(ORDERS, noise, num_critics)
    theirs = dp_accounting_wor_rdp(noise, num_critics)
    plain = gaussian_rdp(ORDERS, noise)
    assert np.all(ours >= np.minimum(theirs, plain) * (1 - 1e-9))
    assert np.all(ours <= plain)


def test_theorem9_written_out_by_hand_at_orders_3_and_between():
    s, n = 1.5, 10
    gamma, eps = 1.0 / n, (lambda a: a / (2 * s**2))
    second = min(4 * math.expm1(eps(2)), 2 * math.exp(eps(2)))
    moment2 = math.log1p(gamma**2 * math.comb(2, 2) * second)
    moment3 = math.log1p(gamma**2 * math.comb(3, 2) * second + gamma**3 * math.comb(3, 3) * 2 * math.exp(2 * eps(3)))
    orders = [1.5, 2.0, 2.5, 3.0]
    curve = selected_critic_gaussian_rdp(orders, s, n)
    assert curve[3] == pytest.approx(moment3 / 2, rel=1e-12)
    assert curve[1] == pytest.approx(moment2 / 1, rel=1e-12)
    assert curve[2] == pytest.approx((0.5 * moment2 + 0.5 * moment3) / 1.5, rel=1e-12)  # convex log-moment
    assert curve[0] == pytest.approx(min(moment2, eps(1.5)), rel=1e-12)  # eps(alpha) <= eps(2) below 2


def test_one_critic_is_the_plain_gaussian_and_more_critics_never_cost_more():
    np.testing.assert_array_equal(selected_critic_gaussian_rdp(ORDERS, 0.7, 1), gaussian_rdp(ORDERS, 0.7))
    for noise in (0.2, 0.7, 3.0):
        curves = [selected_critic_gaussian_rdp(ORDERS, noise, n) for n in (1, 2, 3, 4, 10, 100, 1000)]
        for fewer, more in zip(curves, curves[1:]):
            assert np.all(more <= fewer)
    one, plain = SelectedCriticGaussianAccountant(), GaussianAccountant()
    for _ in range(5):
        one.step(noise_multiplier=0.7, num_critics=1)
        plain.step(noise_multiplier=0.7)
    assert one.get_epsilon(1e-5) == plain.get_epsilon(1e-5)


def test_the_accountant_composes_steps_and_survives_a_state_round_trip():
    accountant = SelectedCriticGaussianAccountant()
    for _ in range(7):
        accountant.step(noise_multiplier=0.9, num_critics=8)
    expected, _ = rdp_to_epsilon(ORDERS, 7 * selected_critic_gaussian_rdp(ORDERS, 0.9, 8), 1e-5)
    assert accountant.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-12)
    restored = SelectedCriticGaussianAccountant()
    restored.load_state_dict(accountant.state_dict())
    assert restored.get_epsilon(1e-5) == accountant.get_epsilon(1e-5) and len(restored) == 7
    with pytest.raises(ValueError, match="num_critics"):
        accountant.step(noise_multiplier=0.9, num_critics=0)


def test_calibration_spends_the_target_under_the_same_accountant():
    noise = calibrate_selected_critic_noise(3.0, 1e-5, 2000, 250)
    spend = lambda s: rdp_to_epsilon(ORDERS, 2000 * selected_critic_gaussian_rdp(ORDERS, s, 250), 1e-5)[0]  # noqa: E731
    assert spend(noise) <= 3.0 < spend(noise * 0.999)


def test_calibration_tries_its_cap_and_names_the_order_grids_floor():
    """The doubling went 1, 2, ..., 524288 and refused past 1e6 without trying it, where 6e5
    spends 0.0049 of a 0.005 target; a target under the grid's floor (0.0035 at 1e-5, whatever
    the noise) was told no noise up to 1e6 reaches it."""
    noise = calibrate_selected_critic_noise(0.005, 1e-5, 10**6, 1)
    spend = lambda s: rdp_to_epsilon(ORDERS, 10**6 * selected_critic_gaussian_rdp(ORDERS, s, 1), 1e-5)[0]  # noqa: E731
    assert 524288 < noise <= 1e6 and spend(noise) <= 0.005
    with pytest.raises(ValueError, match=r"certify no less than epsilon 0.0035 at that delta"):
        calibrate_selected_critic_noise(0.001, 1e-5, 1, 1000)
    with pytest.raises(ValueError, match="steps"):  # calibrated for no step, any noise would do
        calibrate_selected_critic_noise(1.0, 1e-5, 0, 4)


# ------------------------------------------------------- critics and partitions
N_RECORDS, N_CRITICS, WIDTH = 48, 4, 5


class IndexedTable(L.LightningDataModule):
    """Records that carry their own index in column 0, so a spy can tell which ones a critic read."""

    def __init__(self, batch_size=4):
        super().__init__()
        self.save_hyperparameters()
        generator = torch.Generator().manual_seed(0)
        records = torch.rand(N_RECORDS, WIDTH, generator=generator)
        records[:, 0] = torch.arange(N_RECORDS, dtype=torch.float32)
        self.train_dataset = TensorDataset(records)

    def partitions(self, num_parts, seed=0):
        return teacher_partitions(N_RECORDS, num_parts, seed)

    def train_dataloader(self):
        return DataLoader(self.train_dataset, batch_size=self.hparams.batch_size, shuffle=True)


def parameters_of(critic):
    """The critic's whole state: parameters and buffers."""
    return [p.detach().clone() for p in critic.state_dict().values()]


class Spy:
    """Records, per iteration, the module's training step, the trained and the answering critic,
    the records each critic step read, every critic's parameters before and after, and which
    critics the generator step called."""

    def __init__(self, module):
        self.iterations, self.critic_reads, self.generator_calls = [], [], []
        self.called = []
        for index, critic in enumerate(module.critics):
            critic.register_forward_hook(lambda _m, _i, _o, index=index: self.called.append(index))
        iteration, critic_step, generator_step = (module.selected_critic_iteration, module.discriminator_step,
                                                  module.generator_step)

        def spy_iteration(trained, answer, records, labels):
            step, before = module.train_steps, [parameters_of(c) for c in module.critics]
            iteration(trained, answer, records, labels)
            self.iterations.append(SimpleNamespace(step=step, trained=trained, answer=answer, before=before,
                                                   after=[parameters_of(c) for c in module.critics]))

        def spy_critic_step(real, labels, n):
            self.critic_reads.append((module.discriminator.selected, real[:, 0].round().long().tolist()))
            return critic_step(real, labels, n)

        def spy_generator_step(n):
            self.called.clear()
            loss = generator_step(n)
            self.generator_calls.append((module.discriminator.selected, list(self.called)))
            return loss

        module.selected_critic_iteration, module.discriminator_step = spy_iteration, spy_critic_step
        module.generator_step = spy_generator_step


def fit_critics(steps, checkpoint=None, save_to=None, selection_seed=1):
    """``steps`` training steps (in all, counting those of ``checkpoint``) of N_CRITICS critics on
    IndexedTable, spied on; 6 steps per epoch."""
    torch.manual_seed(0)
    datamodule = IndexedTable()
    module = GSWGAN((WIDTH,), latent_dim=4, discriminator_steps=2, generator_kwargs={"hidden": (8,)},
                    discriminator_kwargs={"hidden": (8,)})
    strategy = GradientSanitizer(noise_multiplier=5.0, num_critics=N_CRITICS, selection_seed=selection_seed, delta=1e-3)
    spy = None

    class AttachSpy(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            nonlocal spy
            spy = Spy(pl_module)

    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(steps), strategy, AttachSpy()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    trainer.fit(module, datamodule=datamodule, ckpt_path=checkpoint)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return datamodule, module, strategy, spy


@pytest.fixture(scope="module")
def fitted():
    return fit_critics(12)  # two epochs of 6 steps: the second starts at critic 6 mod 4 = 2


def test_the_strategy_builds_n_independent_critics(fitted):
    _, module, strategy, _ = fitted
    assert isinstance(module.discriminator, CriticBank) and module.num_critics == N_CRITICS
    assert module.hparams.num_critics == N_CRITICS
    first_layers = [critic.body[0].weight for critic in module.critics]
    assert all(not torch.equal(a, b) for i, a in enumerate(first_layers) for b in first_layers[i + 1:])
    assert strategy.neighbours == "replace-one" and GradientSanitizer.neighbours == "add-remove"


def test_each_critic_reads_only_its_own_fixed_partition(fitted):
    datamodule, _, strategy, spy = fitted
    partitions = [set(p.tolist()) for p in datamodule.partitions(N_CRITICS, 0)]
    assert [set(p.tolist()) for p in strategy.sampler.partitions] == partitions
    assert len(spy.critic_reads) == 12 * 2  # two critic steps per iteration
    for critic, indices in spy.critic_reads:
        assert set(indices) <= partitions[critic], f"critic {critic} read records outside its partition"
        assert len(set(indices)) == len(indices) == 4  # distinct records of a partition of 12
    assert {critic for critic, _ in spy.critic_reads} == set(range(N_CRITICS))


def test_the_training_schedule_is_round_robin_over_the_run(fitted):
    _, module, _, spy = fitted
    assert [it.step for it in spy.iterations] == list(range(12)) and module.train_steps == 12
    assert [it.trained for it in spy.iterations] == [t % N_CRITICS for t in range(12)]
    assert [critic for critic, _ in spy.critic_reads] == [t % N_CRITICS for t in range(12) for _ in range(2)]


def test_an_iteration_changes_only_the_round_robin_critic_and_queries_only_the_answering_one(fitted):
    _, _, _, spy = fitted
    assert len(spy.iterations) == len(spy.generator_calls) == 12
    assert any(it.answer != it.trained for it in spy.iterations)  # the case where the two must be told apart
    for it in spy.iterations:
        for index in range(N_CRITICS):
            same = all(torch.equal(a, b) for a, b in zip(it.before[index], it.after[index]))
            assert same == (index != it.trained), \
                f"step {it.step} trains critic {it.trained}, answered by {it.answer}: critic {index} changed={not same}"
    for (selected, called), it in zip(spy.generator_calls, spy.iterations):
        assert selected == it.answer and set(called) == {it.answer}


def test_each_critics_adam_state_advances_on_its_own_steps_and_the_group_stays_whole(fitted):
    """12 iterations over 4 critics of 2 steps each: every critic took 6 Adam steps; the
    optimizer's one group holds every critic again and no critic keeps a gradient."""
    _, module, _, _ = fitted
    adam = module.trainer.optimizers[1]
    everything = [p for critic in module.critics for p in critic.parameters()]
    assert len(adam.param_groups) == 1 and [id(p) for p in adam.param_groups[0]["params"]] == [id(p) for p in everything]
    for critic in module.critics:
        assert {float(adam.state[p]["step"]) for p in critic.parameters()} == {12 / N_CRITICS * 2}
        assert all(p.grad is None for p in critic.parameters())


class TinyCritic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))

    def forward(self, x, labels=None):
        return self.body(x)


def tiny_bank(seed):
    torch.manual_seed(seed)
    return CriticBank([TinyCritic() for _ in range(3)])


def test_stepping_the_selected_critic_alone_computes_what_a_step_over_every_critic_does():
    """The same Adam steps on critic 1, once through ``stepping_selected`` and once over the
    whole group (the other critics frozen and gradient-free): identical parameters and state;
    critics 0 and 2 untouched; the selected critic's gradient dropped on leaving."""
    x = torch.randn(8, 3)
    banks = [tiny_bank(0), tiny_bank(0)]
    adams = [torch.optim.Adam(bank.parameters(), lr=0.1, betas=(0.0, 0.9)) for bank in banks]
    untouched = [p.detach().clone() for i in (0, 2) for p in banks[0].critics[i].parameters()]
    for bank in banks:
        bank.select(1)
    for _ in range(3):
        with banks[0].stepping_selected(adams[0]):
            assert [id(p) for p in adams[0].param_groups[0]["params"]] == [id(p) for p in banks[0].critics[1].parameters()]
            adams[0].zero_grad()
            banks[0](x).square().mean().backward()
            adams[0].step()
        adams[1].zero_grad()
        banks[1](x).square().mean().backward()
        adams[1].step()
    for a, b in zip(banks[0].parameters(), banks[1].parameters()):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in
               zip(untouched, [p for i in (0, 2) for p in banks[0].critics[i].parameters()]))
    assert all(p.grad is None for p in banks[0].parameters())
    assert len(adams[0].state) == len(adams[1].state) == 4  # critic 1's four tensors
    for a, b in zip(adams[0].state_dict()["state"].values(), adams[1].state_dict()["state"].values()):
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_stepping_the_selected_critic_needs_one_parameter_group():
    bank = tiny_bank(0)
    adam = torch.optim.Adam([{"params": c.parameters()} for c in bank.critics])
    with pytest.raises(ValueError, match="one parameter group"):
        with bank.stepping_selected(adam):
            pass


def test_a_resumed_run_continues_the_round_robin_where_it_stopped(tmp_path):
    """Stopped mid-epoch at step 5 (6 steps per epoch), resumed to 11: critics 1, 2, 3, 0, 1, 2."""
    checkpoint = tmp_path / "five.ckpt"
    *_, first = fit_critics(5, save_to=checkpoint)
    assert [it.trained for it in first.iterations] == [0, 1, 2, 3, 0]
    _, module, _, resumed = fit_critics(11, checkpoint=checkpoint)
    assert [it.step for it in resumed.iterations] == list(range(5, 11)) and module.train_steps == 11
    assert [it.trained for it in resumed.iterations] == [t % N_CRITICS for t in range(5, 11)]


def test_a_resumed_fixed_selection_goes_on_where_it_stopped(tmp_path):
    """With --privacy.selection_seed given again, the checkpoint's selector state goes on: the
    answering critics of steps 5-10 are those of a run never stopped (not steps 0-5's again)."""
    checkpoint = tmp_path / "five.ckpt"
    fit_critics(5, save_to=checkpoint)
    *_, resumed_strategy, resumed = fit_critics(11, checkpoint=checkpoint)
    *_, whole_strategy, whole = fit_critics(11)
    assert [it.answer for it in resumed.iterations] == [it.answer for it in whole.iterations[5:]]
    assert torch.equal(resumed_strategy.selector.get_state(), whole_strategy.selector.get_state())


def test_a_resume_without_the_selection_seed_draws_afresh_and_reports_the_seeded_segment(tmp_path):
    """The checkpoint holds the selector's state: a run seeded by --privacy.selection_seed (whose
    config.yaml publishes it) and resumed without went on with that seed's stream while its report
    said "OS entropy", claiming the secrecy the 1/N amplification assumes."""
    checkpoint = tmp_path / "five.ckpt"
    fit_critics(5, save_to=checkpoint)
    *_, seeded, _ = fit_critics(11, checkpoint=checkpoint)
    *_, fresh, _ = fit_critics(11, checkpoint=checkpoint, selection_seed=None)
    assert not torch.equal(fresh.selector.get_state(), seeded.selector.get_state())
    source = fresh.report_parameters()["selection_source"]
    assert source.startswith("from step 0: FIXED SEED 1") and "then from step 5: own generator seeded from OS entropy" in source
    assert [segment["selection_source"][:12] for segment in fresh.segments()] == ["FIXED SEED 1", "own generato"]


def test_a_batch_off_the_round_robin_is_refused():
    module = GSWGAN((WIDTH,), num_critics=3, discriminator_kwargs={"hidden": (8,)})
    module.train_steps = 4
    batch = {"critic": 0, "answer": 1, "records": torch.zeros(1, 2, WIDTH), "labels": None}
    with pytest.raises(RuntimeError, match="belongs to critic 1"):
        module.training_step(batch, 0)


def test_the_schedule_is_round_robin_and_the_answer_uniform_and_independent_of_it():
    sampler = CriticSampler(torch.zeros(40, 1), teacher_partitions(40, 4, 0), 2)
    step = {"now": 7}
    iterations = CriticIterations(sampler, torch.Generator().manual_seed(3), 1, 4000, first_step=lambda: step["now"])
    batches = list(iterations)
    assert [batch["critic"] for batch in batches] == [(7 + i) % 4 for i in range(4000)]
    table = np.zeros((4, 4))
    for batch in batches:
        table[batch["critic"], batch["answer"]] += 1
    # each trained critic's 1000 answers uniform over the 4 critics: chi-square, 4 x 3 degrees of freedom
    chi_square = ((table - 250.0) ** 2 / 250.0).sum()
    assert chi_square < stats.chi2.ppf(0.999, 12)
    counts, same = table.sum(axis=0), np.trace(table)
    sd = math.sqrt(4000 * 0.25 * 0.75)
    assert np.all(np.abs(counts - 1000) < 4 * sd)
    assert abs(same - 1000) < 4 * sd  # the answering critic is the trained one about 1 time in N
    step["now"] = 2  # the counter is read again when an epoch starts (e.g. after a resume)
    assert [batch["critic"] for _, batch in zip(range(3), iterations)] == [2, 3, 0]


def test_the_minibatches_do_not_depend_on_the_selection():
    draws = []
    for selection_seed in (3, 4):
        sampler = CriticSampler(torch.arange(40.0)[:, None], teacher_partitions(40, 4, 0), 2, seed=5)
        iterations = CriticIterations(sampler, torch.Generator().manual_seed(selection_seed), 2, 50, first_step=lambda: 0)
        draws.append(list(iterations))
    assert [b["answer"] for b in draws[0]] != [b["answer"] for b in draws[1]]
    for one, other in zip(*draws):
        assert one["critic"] == other["critic"] and torch.equal(one["records"], other["records"])


def test_several_critics_need_the_sanitizers_partitions():
    module = GSWGAN((WIDTH,), num_critics=3, discriminator_kwargs={"hidden": (8,)})
    with pytest.raises(ValueError, match="--privacy.num_critics 3"):
        module.setup("fit")
    with pytest.raises(ValueError, match=r"already has 3 critics, not 2: give the strategy as many \(--privacy.num_critics "
                                         r"3; from Python GradientSanitizer\(num_critics=3, ...\)\)"):
        module.build_critics(2)
    with_batchnorm = GSWGAN((WIDTH,), discriminator_kwargs={"hidden": (8,)})
    with_batchnorm.discriminator.body.append(torch.nn.BatchNorm1d(8))
    with pytest.raises(ValueError, match="BatchNorm"):
        with_batchnorm.build_critics(2)
    with pytest.raises(ValueError, match="single discriminator"):
        GradientSanitizer(noise_multiplier=1.0, num_critics=2)._install_critics(None, object(), 4)
    with pytest.raises(ValueError, match="num_critics"):
        GradientSanitizer(noise_multiplier=1.0, num_critics=0)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(hparams=SimpleNamespace(batch_size=4)))
    with pytest.raises(ValueError, match="--privacy.num_critics 3"):  # one-critic accounting for three critics
        GradientSanitizer(noise_multiplier=1.0).install(trainer, module)


# ------------------------------------------------------------------ end to end
def critic_args(data_dir, output_dir, steps, *extra, epsilon=8):
    return tiny_run_args(data_dir, output_dir, model="gswgan", steps=steps, batch_size=16) + [
        "--epsilon", str(epsilon), "--delta", "1e-4", "--privacy.num_critics", "4", *extra]


@pytest.fixture(scope="module")
def critics_run(tiny_image_data_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("gswgan_critics") / "run"
    assert main(critic_args(tiny_image_data_dir, output, 6)) == 0
    return output


def expected_epsilon(report):
    curve = selected_critic_gaussian_rdp(ORDERS, report["effective_noise_multiplier"], report["num_critics"])
    return rdp_to_epsilon(ORDERS, report["generator_steps"] * curve, report["delta_training"])[0]


def test_the_report_names_the_mode_and_the_budget_holds(critics_run):
    report = read_json(critics_run / "privacy.json")
    assert report["num_critics"] == 4 and report["sampling_rate"] == 0.25
    assert "Theorem 9" in report["rdp_per_step"] and "amplified" in report["mode"]
    # the count, not the words "num_critics critics" the report printed
    assert "GS-WGAN amplified: 4 critics" in report["mode"] and "GS-WGAN amplified: 4 critics" in report["mechanism"]
    assert report["neighbours"] == "replace-one"
    assert report["accountant_state"]["mechanism"] == "gaussian-selected-critic-wor"
    assert report["generator_steps"] == report["calibrated_for_steps"] == 6  # one generator step per iteration
    assert report["effective_noise_multiplier"] == pytest.approx(report["noise_multiplier"] / (2 * math.sqrt(16)))
    assert 7.0 < report["epsilon"] <= 8.0
    assert report["epsilon"] == pytest.approx(expected_epsilon(report), rel=1e-9)
    assert report["partition_sizes"] == [40, 40]
    assert "NOT a guarantee" in report["epsilon_gswgan_code_accounting_note"]
    assert report["critic_schedule"] == "round-robin (public); answering critic uniform (secret)"
    assert "round-robin" in report["composition"] and "amplification_caveat" not in report
    assert report["selection_source"].startswith("own generator seeded from OS entropy")
    assert (critics_run / "samples.png").is_file()


def test_a_fixed_selection_seed_is_flagged_in_the_report(fitted):
    _, _, strategy, _ = fitted  # selection_seed=1
    assert strategy.report_parameters()["selection_source"].startswith("FIXED SEED 1 (--privacy.selection_seed")


def test_the_logs_hold_nothing_the_answering_critic_computed(critics_run):
    """The generator's loss is computed by the secretly selected critic: its level could tell the
    critics apart, so only the trained critic's loss and the public round-robin index are logged."""
    logged = set(pd.read_csv(critics_run / "logs" / "metrics.csv").columns) | set(read_json(critics_run / "metrics.json"))
    assert {"loss/discriminator", "critic/trained"} <= logged
    assert not any("generator" in name or "answer" in name for name in logged)


def test_a_resumed_run_keeps_partitions_noise_and_spend(critics_run, tiny_image_data_dir, tmp_path):
    checkpoint = critics_run / "checkpoints" / "last.ckpt"
    first = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert main(critic_args(tiny_image_data_dir, tmp_path / "resumed", 9, "--resume", str(checkpoint), epsilon=12)) == 0
    resumed = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (key,) = [k for k in first["callbacks"] if "GradientSanitizer" in k]
    before, after = first["callbacks"][key], resumed["callbacks"][key]
    assert torch.equal(before["sampler"]["indices"], after["sampler"]["indices"])
    assert torch.equal(before["sampler"]["sizes"], after["sampler"]["sizes"])
    assert before["accountant"]["history"][0]["steps"] == 6 and after["accountant"]["history"][0]["steps"] == 9
    report = read_json(tmp_path / "resumed" / "privacy.json")
    assert report["noise_multiplier"] == read_json(critics_run / "privacy.json")["noise_multiplier"]
    assert 8.0 < report["epsilon"] <= 12.0 and report["epsilon"] == pytest.approx(expected_epsilon(report), rel=1e-9)


def test_resuming_with_another_number_of_critics_is_refused(critics_run, tiny_image_data_dir, tmp_path, capsys):
    checkpoint = critics_run / "checkpoints" / "last.ckpt"
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "bad", model="gswgan", steps=9, batch_size=16) + [
        "--epsilon", "12", "--delta", "1e-4", "--privacy.num_critics", "2", "--resume", str(checkpoint)]
    assert main(args) == 2
    assert "--privacy.num_critics 4" in capsys.readouterr().err


def test_resuming_under_another_partition_seed_is_refused(critics_run, tiny_image_data_dir, tmp_path, capsys):
    checkpoint = critics_run / "checkpoints" / "last.ckpt"
    args = critic_args(tiny_image_data_dir, tmp_path / "bad", 9, "--privacy.partition_seed", "3", "--resume",
                       str(checkpoint), epsilon=12)
    assert main(args) == 2
    assert "critics' partitions were drawn with --privacy.partition_seed 0" in capsys.readouterr().err


def test_samples_can_be_drawn_from_a_checkpoint_with_n_critics(critics_run, tmp_path):
    import numpy as np
    from PIL import Image

    checkpoint = critics_run / "checkpoints" / "last.ckpt"
    picture = np.asarray(Image.open(sample_to_file(checkpoint, 6, tmp_path / "samples.png", columns=3)))
    assert picture.shape == (2 * 30 + 2, 3 * 30 + 2)  # 6 images in rows of 3
    drawn = np.load(sample_to_file(checkpoint, 6, tmp_path / "samples.npz"))["images"][:, 0]
    np.testing.assert_array_equal(grid_tiles(picture, 6, columns=3), drawn)
    assert len({image.tobytes() for image in drawn}) == 6


def test_a_module_loaded_to_sample_has_one_critic_and_draws_what_the_full_module_draws(critics_run):
    """Sampling loads the generator with critic 0 alone (the MNIST preset has 1000 critics)."""
    from lightning_dpgan.sampling import load_module

    checkpoint = critics_run / "checkpoints" / "last.ckpt"
    full = GSWGAN.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    assert full.num_critics == 4
    light = load_module(checkpoint)
    assert light.num_critics == 1 and light.train_steps == full.train_steps > 0
    kept, critic_zero = light.discriminator.state_dict(), full.critics[0].state_dict()
    assert kept.keys() == critic_zero.keys() and all(torch.equal(kept[key], critic_zero[key]) for key in kept)
    labels = full.balanced_labels(12)
    torch.manual_seed(5)
    expected = full.sample(12, labels)
    torch.manual_seed(5)
    assert torch.equal(light.sample(12, labels), expected)


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist"])
def test_the_image_presets_are_gswgans_setting_and_the_comment_holds(dataset):
    """configs/gswgan_mnist.yaml (and the Fashion-MNIST preset, GS-WGAN's same defaults): 1000
    critics, batch 32, latent 10, C = 1, 20000 iterations, sigma calibrated; the MNIST comment's
    figures: sigma ~5.7 for epsilon 10, and at GS-WGAN's noise (2 x 1.07 here) our accountant's
    ~3e5 against the ~9 of GS-WGAN's per-record accounting."""
    from lightning_dpgan.config import resolve

    config = resolve({"model": "gswgan", "dataset": dataset}, {})
    assert (config["model"]["latent_dim"], config["model"]["discriminator_steps"]) == (10, 5)
    privacy = config["privacy"]
    assert (privacy["name"], privacy["num_critics"], privacy["max_norm"]) == ("sanitizer", 1000, 1.0)
    assert "noise_multiplier" not in privacy  # calibrated from --epsilon
    assert (config["data"]["batch_size"], config["max_steps"], config["epsilon"], config["delta"]) == (32, 20000, 10.0, 1e-5)
    calibrated = calibrate_selected_critic_noise(10.0, 1e-5, 20000, 1000) * 2 * math.sqrt(32)
    assert calibrated == pytest.approx(5.7, abs=0.1)
    ours = rdp_to_epsilon(ORDERS, 20000 * selected_critic_gaussian_rdp(ORDERS, 2.14 / (2 * math.sqrt(32)), 1000), 1e-5)[0]
    paper_code = rdp_to_epsilon(ORDERS, 32 * 20000 * selected_critic_gaussian_rdp(ORDERS, 1.07, 1000), 1e-5)[0]
    assert 2e5 < ours < 4e5 and 8.0 < paper_code < 11.0


@pytest.mark.parametrize("replacement", [False, True])
def test_unequal_critic_partitions_draw_only_from_their_own_part(replacement):
    """As for the teachers: a critic's padded partition never hands it another critic's record."""
    n, k, batch = 103, 10, 10
    parts = disjoint_partitions(n, k, seed=0)
    sampler = CriticSampler(torch.arange(n).unsqueeze(1), parts, batch, replacement=replacement, seed=1)
    for _ in range(20):
        for j in range(k):
            records, _ = sampler.draw_from(j, 3)
            assert set(records.flatten().tolist()) <= set(parts[j].tolist())


def test_a_critic_draws_every_record_of_its_own_part_equally_with_replacement():
    """Each of a 3-record part's records is drawn about a third of the time (1,000 of 3,000
    draws; binomial sd about 26): a slot scaled one short never drew the part's last record."""
    from collections import Counter

    sampler = CriticSampler(torch.arange(10.0).unsqueeze(1), [torch.tensor([0, 1, 2]), torch.arange(3, 10)],
                            batch_size=5, replacement=True, seed=0)
    records, _ = sampler.draw_from(0, 600)
    counts = Counter(records.flatten().long().tolist())
    assert set(counts) == {0, 1, 2} and all(abs(count - 1000) < 150 for count in counts.values()), counts


def test_the_critics_start_from_independent_initialisations():
    """GS-WGAN's N critics are independently initialised copies: before any step, no two share
    a weight (after training, their partitions alone would make them differ)."""
    from lightning_dpgan.modules.gswgan import fresh_copy

    network = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LeakyReLU(), torch.nn.Linear(8, 1))
    twin = fresh_copy(network)
    assert all(not torch.equal(a, b) for a, b in zip(network.parameters(), twin.parameters()))
    assert [p.shape for p in network.parameters()] == [p.shape for p in twin.parameters()]


def test_the_critic_strategy_restores_its_samplers_draws_and_refuses_other_records():
    """As the PATE strategy's (test_pategan): GS-WGAN's N critics go on with their draws."""
    def strategy_over(data):
        strategy = GradientSanitizer(noise_multiplier=1.0, num_critics=3)
        strategy.sampler = CriticSampler(data, disjoint_partitions(len(data), 3, seed=0), 4, seed=0)
        strategy.selector = strategy.critic_selector()
        return strategy

    assert_resume_restores_sampler_draws(strategy_over)


def test_critic_minibatches_larger_than_a_partition_are_said_to_repeat_records(tiny_image_data_dir, tmp_path, caplog):
    """160 records among the critics leave each fewer than a --batch-size of 64: their minibatches
    are drawn with replacement, which used to happen without a word."""
    args = critic_args(tiny_image_data_dir, tmp_path / "run", 1)
    args[args.index("--batch-size") + 1] = "64"
    with caplog.at_level("WARNING"):
        assert main(args) == 0
    assert "each critic's minibatch of 64 records is drawn with replacement" in caplog.text


def test_selecting_a_critic_freezes_the_one_it_leaves_and_counts_one_generator_step_per_iteration():
    """Only the selected critic is ever trainable (the others stay out of every graph and every
    freeze/unfreeze); with N critics each training step is one GS-WGAN iteration, so it holds one
    generator step whatever ``discriminator_steps`` says (what the run's "no generator update"
    warning reads)."""
    bank = tiny_bank(0)
    assert [c.body[0].weight.requires_grad for c in bank.critics] == [True, False, False]
    bank.select(2)
    assert [c.body[0].weight.requires_grad for c in bank.critics] == [False, False, True]
    bank.requires_grad_(False)
    bank.select(1)
    assert not any(p.requires_grad for p in bank.parameters())
    bank.requires_grad_(True)
    assert [c.body[0].weight.requires_grad for c in bank.critics] == [False, True, False]

    module = GSWGAN((WIDTH,), latent_dim=4, discriminator_steps=5, generator_kwargs={"hidden": (8,)},
                    discriminator_kwargs={"hidden": (8,)}, num_critics=3)
    module.train_steps = 2
    assert module.generator_updates == 2
    single = GSWGAN((WIDTH,), latent_dim=4, discriminator_steps=5, generator_kwargs={"hidden": (8,)},
                    discriminator_kwargs={"hidden": (8,)})
    single.train_steps = 7
    assert single.generator_updates == 1


@pytest.mark.parametrize("generated, expected", [(6, 6), (None, 4)])
def test_an_iteration_generates_the_strategys_batch_size_for_every_step(generated, expected):
    """With N critics, every critic step and the generator step generate the strategy's fixed
    ``generated_batch_size`` (the B the sanitizer's noise is calibrated for), not the size of
    the critic's minibatches (4 here), which is what they fall back to when none is fixed."""
    torch.manual_seed(0)
    module = GSWGAN((WIDTH,), latent_dim=4, discriminator_steps=2, generator_kwargs={"hidden": (8,)},
                    discriminator_kwargs={"hidden": (8,)}, num_critics=3)
    train_outside_a_trainer(module)
    module.generated_batch_size = generated
    seen, critic_step, generator_step = [], module.discriminator_step, module.generator_step
    module.discriminator_step = lambda real, labels, n: seen.append(("critic", n)) or critic_step(real, labels, n)
    module.generator_step = lambda n: seen.append(("generator", n)) or generator_step(n)
    module.selected_critic_iteration(0, 1, torch.rand(2, 4, WIDTH), None)
    assert seen == [("critic", expected), ("critic", expected), ("generator", expected)]


@pytest.mark.parametrize("critics, warned", [(4, False), (1, True)])
def test_a_run_shorter_than_discriminator_steps_is_warned_of_only_where_the_generator_would_not_step(
        tiny_image_data_dir, tmp_path, capsys, critics, warned):
    """GS-WGAN's N critics step the generator at every training step whatever the preset's
    discriminator_steps 5: the warning that "the generator will take none" was false there."""
    args = critic_args(tiny_image_data_dir, tmp_path / "run", 2, "--privacy.num_critics", str(critics), epsilon=1000)
    assert main(args) == 0
    said = capsys.readouterr().err
    assert ("--max-steps 2 ends before the first generator update" in said) is warned
    assert ("no generator update was taken" in said) is warned  # the end of the run agrees
