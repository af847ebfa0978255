"""PATE-GAN end to end, and regression tests for the privacy bugs an audit of public PATE-GAN
code found (Ganev, Annamalai & De Cristofaro, 2024): shared or re-drawn teacher partitions,
re-initialised teachers, uncharged unanimous queries, an ignored delta, epsilon past the target."""
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpgan.callbacks.pate import PATEAggregation
from lightning_dpgan.callbacks.step_limit import StepLimit
from lightning_dpgan.cli import main
from lightning_dpgan.data.partition import PartitionedSampler, disjoint_partitions
from lightning_dpgan.datamodules.adult import AdultDataModule
from lightning_dpgan.modules.pategan import PATEGAN
from lightning_dpgan.privacy.accountants import PATEMomentsAccountant
from lightning_dpgan.run import rounded_up
from run_helpers import assert_resume_restores_sampler_draws, checkpoint_accountant_state, read_json

ADULT = Path(__file__).parent / "fixtures" / "adult_tiny"
TEACHERS, TEACHER_BATCH, LAMBDA = 3, 8, 0.05


def base_args(output_dir, steps=50):
    """A tiny pategan run on the Adult fixture, without privacy settings."""
    return ["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(ADULT), "--output-dir", str(output_dir),
            "--max-steps", str(steps), "--batch-size", "8", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]


def pategan_args(output_dir, steps=50, epsilon=8.0, *extra, teachers=TEACHERS, batch=TEACHER_BATCH, lam=LAMBDA):
    return base_args(output_dir, steps) + [
        "--epsilon", str(epsilon), "--delta", "1e-3", "--privacy.num_teachers", str(teachers),
        "--privacy.teacher_batch_size", str(batch), "--privacy.lap_inverse_scale", str(lam), *extra]


@pytest.fixture(scope="module")
def pategan_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("pategan") / "run"
    assert main(pategan_args(output_dir)) == 0
    return output_dir


def test_writes_synthetic_csv_with_the_schema_columns(pategan_run):
    synthetic = pd.read_csv(pategan_run / "synthetic.csv")
    real = AdultDataModule(data_dir=ADULT)
    assert list(synthetic.columns) == real.schema.names
    assert len(synthetic) == 36  # as many rows as training records
    assert set(synthetic["income"]) <= {"<=50K", ">50K"}
    assert synthetic["age"].between(17, 90).all()


def test_budget_is_respected_and_both_figures_are_reported(pategan_run):
    report = read_json(pategan_run / "privacy.json")
    assert report["mechanism"].startswith("pate") and report["accountant"] == "pate-moments"
    assert report["epsilon"] <= report["target_epsilon"] == 8.0
    assert report["epsilon"] == report["epsilon_data_dependent"] <= report["epsilon_data_independent"]
    assert "not itself differentially private" in report["note"]
    assert "how many queries it asked was decided on the votes too" in report["note"]  # stopped on the votes' figure
    assert "is above --epsilon" not in report["note"]  # its bound, 7.65, is within the target
    # the votes' figure is not stated as a guarantee; the bound that holds whatever the votes is
    assert report["guarantee"].startswith(f"epsilon {report['epsilon']:.4g} is the PATE papers' data-dependent figure, "
                                          "itself computed from the private votes: no (epsilon, delta) guarantee at "
                                          "that figure. What holds whatever the votes is "
                                          f"({rounded_up(report['epsilon_data_independent'], 4)}, 0.001)-differential privacy")
    assert "against one record of the training records replaced by another" in report["guarantee"]
    assert "A record is one row of the file" in report["guarantee"] and "Not for release" not in report["guarantee"]
    assert 0 < report["steps"] < 50  # stopped by the budget, not by --max-steps
    assert report["laplace_scale"] == pytest.approx(1 / LAMBDA)
    # the data-independent figure written out (PATE-GAN's moments accountant; the pure-DP cap
    # 2 lambda l of a (2 lambda)-DP answer): Q queries, any votes, tail bound over the orders
    from lightning_dpgan.privacy.analysis.pate import DEFAULT_MOMENT_ORDERS as orders

    per_query = np.minimum(2 * LAMBDA**2 * orders * (orders + 1), 2 * LAMBDA * orders)
    independent = np.min((report["queries"] * per_query + math.log(1 / report["delta"])) / orders)
    assert report["epsilon_data_independent"] == pytest.approx(independent, rel=1e-9)


def test_every_query_is_charged_and_the_users_delta_is_used(pategan_run):
    report = read_json(pategan_run / "privacy.json")
    assert report["delta"] == 1e-3
    # every completed step charged student_steps x batch queries; a step refused for the budget
    # part-way keeps the charge of the batches it had answered
    per_step = 5 * TEACHER_BATCH
    assert report["steps"] * per_step <= report["queries"] < (report["steps"] + 1) * per_step
    accountant = PATEMomentsAccountant()
    accountant.load_state_dict(checkpoint_accountant_state(pategan_run))
    assert accountant.get_epsilon(1e-3) == pytest.approx(report["epsilon"])
    # the report counts the queries but keeps the vote gaps (exact statistics of private votes) out
    assert [entry["count"] for entry in report["accountant_state"]["queries"]] == [report["queries"]]
    assert "gap_counts" not in json.dumps(report) and "vote-gap histograms" in report["accountant_state"]["withheld"]
    assert accountant.get_epsilon(1e-5) > report["epsilon"]  # so delta really entered the figure
    # every charged query was answered, and its released label counted by class
    assert set(report["answers"]) == {"generated", "real"} and sum(report["answers"].values()) == report["queries"]


def test_a_budget_spent_within_the_first_step_says_the_generator_is_untrained(tmp_path, capsys, monkeypatch, recwarn):
    """Data-dependent PATE charges batch by batch: teachers that split on the first step can
    spend the budget before any generator update (PATE-GAN on Adult at epsilon 0.1, seed 1, did).
    The run still writes what it released, and says the generator is its initialisation."""
    from lightning_dpgan.privacy.pate import PATELabelAggregator

    teachers, batch, lam = 9, 4, 1.0  # 9 teachers of 4 rows; 5 batches of 4 queries a step
    original, calls = PATELabelAggregator.aggregate, []

    def unanimous_then_split(self, votes):
        calls.append(len(votes))
        counts = [teachers, 0] if len(calls) == 1 else [5, 4]  # gap 9, then gap 1: ~15x dearer
        return original(self, torch.tensor([counts] * len(votes), dtype=votes.dtype, device=votes.device))

    monkeypatch.setattr(PATELabelAggregator, "aggregate", unanimous_then_split)
    unanimous_step = PATEMomentsAccountant().epsilon_if_queries(1e-3, 5 * batch, lam, vote_gap=teachers)
    target = 1.01 * unanimous_step  # the look-ahead lets the first step start
    assert main(pategan_args(tmp_path / "split", 50, target, teachers=teachers, batch=batch, lam=lam)) == 0
    report = read_json(tmp_path / "split" / "privacy.json")
    assert len(calls) == 2 and report["steps"] == 0 and report["queries"] == batch
    assert 0 < report["epsilon"] <= target
    assert (tmp_path / "split" / "synthetic.csv").exists()
    captured = capsys.readouterr()
    warning = captured.err
    assert "no generator update was taken" in warning and "ran out within the first step" in warning
    assert "answering would spend epsilon" in warning  # the strategy's own reason for refusing
    # how it ended, in the report (no refused figure there: it is a function of the votes) and to the user
    stop_line = "training stopped after 0 of 50 steps: the privacy budget (answering would spend epsilon "
    assert report["stopped_by"] == "refused" and stop_line in captured.out
    refused_figure = captured.out.split(stop_line)[1].split()[0]
    assert float(refused_figure) > target and refused_figure not in (tmp_path / "split" / "privacy.json").read_text()
    assert not [w for w in recwarn if "refused a query batch" in str(w.message)]  # train said it: the strategy keeps quiet

    monkeypatch.setattr(PATELabelAggregator, "aggregate", original)
    assert main(pategan_args(tmp_path / "trained", 2, 8.0)) == 0
    captured = capsys.readouterr()
    assert "no generator update" not in captured.err
    assert read_json(tmp_path / "trained" / "privacy.json")["stopped_by"] == "max-steps"
    assert "training stopped after 2 of 2 steps: --max-steps reached" in captured.out


def votes_saying(real_share_of_queries):
    """An ``aggregate`` that replaces the teachers' votes: unanimous "real" on the first
    ``real_share_of_queries`` of each batch, unanimous "generated" on the rest."""
    from lightning_dpgan.privacy.pate import PATELabelAggregator

    original = PATELabelAggregator.aggregate

    def aggregate(self, votes):
        real = torch.arange(len(votes), device=votes.device) < real_share_of_queries * len(votes)
        forced = torch.stack([torch.where(real, 0, TEACHERS), torch.where(real, TEACHERS, 0)], dim=1)
        return original(self, forced.to(votes.dtype))
    return aggregate


@pytest.mark.parametrize("real_share, warned", [(0.0, True), (0.5, False)])
def test_a_run_whose_answers_were_all_one_class_says_its_generator_learned_nothing(
        tmp_path, capsys, monkeypatch, real_share, warned):
    """PATE-GAN on Adult: teachers that tell every generated record apart answer "generated" to
    every query, and the student (and so the generator) learns nothing. The released labels are
    counted by class in privacy.json and logged per step, and such a run warns."""
    from lightning_dpgan.privacy.pate import PATELabelAggregator

    monkeypatch.setattr(PATELabelAggregator, "aggregate", votes_saying(real_share))
    # lambda 5 (Laplace scale 0.2) against unanimous gaps of 3: the noisy answer is the vote
    # almost always, so the counts follow the forced votes; a budget for the 4 steps
    queries = 4 * 5 * TEACHER_BATCH
    target = 1.5 * PATEMomentsAccountant().epsilon_if_queries(1e-3, queries, 5.0, vote_gap=TEACHERS)
    assert main(pategan_args(tmp_path / "run", 4, target, "--trainer.log_every_n_steps", "1", "--model.teacher_steps", "1",
                             lam=5.0)) == 0
    report = read_json(tmp_path / "run" / "privacy.json")
    answers = report["answers"]
    assert report["steps"] == 4 and sum(answers.values()) == report["queries"] == queries
    assert answers["real"] == pytest.approx(real_share * queries, abs=0.1 * queries)
    logged = pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")["pate/real_label_share"].dropna()
    assert len(logged) == 4 and logged.mean() == pytest.approx(answers["real"] / queries)
    warning = capsys.readouterr().err
    assert ("said 'generated'" in warning and "no better than an untrained generator" in warning) == warned
    # the default data-dependent figure is named for what it is, with the bound that holds
    assert "is the data-dependent figure the PATE papers report" in warning
    assert f"{report['epsilon_data_independent']:.4g} (epsilon_data_independent" in warning
    # and it is PATE-GAN's data-dependent moments of these votes, written out: every query's gap is
    # the forced unanimous one, so Q times one query's moment at each order, then the tail bound
    from lightning_dpgan.privacy.analysis.pate import DEFAULT_MOMENT_ORDERS as orders
    from test_pate_analysis import hand_moment

    low = orders[orders <= 60]  # exp(2 lambda l) in plain floats; the minimum lies below
    moments = np.array([queries * hand_moment(5.0, TEACHERS, l) for l in low])
    by_hand = np.min((moments + math.log(1 / report["delta_training"])) / low)
    assert report["epsilon_training"] == pytest.approx(by_hand, rel=1e-9)


def test_the_strategy_counts_the_noisy_labels_it_released_not_the_votes():
    """Split votes under heavy noise: the counted labels are the released ones, which differ
    from the votes' majority on some queries."""
    from lightning_dpgan.privacy.noise_source import NoiseSource
    from lightning_dpgan.privacy.pate import PATELabelAggregator

    strategy, released = PATEAggregation(), []
    aggregator = PATELabelAggregator(0.05, lambda lam, gaps: None, NoiseSource(0),
                                     on_released=lambda labels: (released.append(labels), strategy._count_answers(labels)))
    votes = torch.tensor([[6, 4]] * 200)  # the majority says "generated" on every query
    labels = aggregator.aggregate(votes)
    assert len(released) == 1 and torch.equal(released[0], labels)
    assert 0 < int(labels.sum()) < 200  # Laplace scale 20 against a gap of 2: some answers say "real"
    assert strategy.answer_counts.tolist() == [200 - int(labels.sum()), int(labels.sum())]


def test_each_query_is_charged_at_the_gap_between_its_two_vote_counts_before_its_answer():
    """The accountant's discount grows with |n_0 - n_1|: charging at the larger count (6 for votes
    of 6 to 4, where the gap is 2) would report a split vote as a confident one."""
    from lightning_dpgan.privacy.noise_source import NoiseSource
    from lightning_dpgan.privacy.pate import PATELabelAggregator

    events = []
    aggregator = PATELabelAggregator(0.5, lambda lam, gaps: events.append(("charged", lam, gaps.tolist())),
                                     NoiseSource(0), on_released=lambda labels: events.append(("released",)))
    aggregator.aggregate(torch.tensor([[6, 4], [1, 9], [5, 5], [0, 10]]))
    assert events == [("charged", 0.5, [2, 8, 0, 10]), ("released",)]


def test_the_installed_aggregator_flips_a_vote_as_often_as_its_laplace_scale_says():
    """The noise as drawn, through the strategy's own aggregator: with Laplace noise of inverse
    scale lambda on each count, the released label differs from a plurality of gap g with
    probability (2 + lambda g) / (4 e^{lambda g}) (the difference of two Laplace draws; PATE-GAN's
    q, which the accountant charges). A noise scale off by a factor of 2 either way moves it by
    far more than four standard errors of 4,000 queries."""
    lam, gap = 0.5, 2
    strategy, module, charged = PATEAggregation(lap_inverse_scale=lam, noise_seed=0), SimpleNamespace(), []
    strategy._charge = lambda lam_, gaps: charged.append(len(gaps))
    strategy.teacher_batch_size = 1
    module.hparams = SimpleNamespace(student_steps=1)
    strategy.install_aggregator(None, module)
    labels = module.privacy.aggregate(torch.tensor([[6, 4]] * 4000))  # the plurality says "generated"
    q = (2 + lam * gap) / (4 * math.exp(lam * gap))
    assert charged == [4000] and float(labels.float().mean()) == pytest.approx(q, abs=4 * math.sqrt(q * (1 - q) / 4000))


@pytest.mark.parametrize("counts, warned", [([990, 10], True), ([989, 11], False), ([0, 5], True), ([0, 0], False)])
def test_the_one_class_warning_starts_at_99_percent(counts, warned):
    strategy = PATEAggregation()
    strategy.accountant.step(1.0, np.full(sum(counts), TEACHERS))  # every answer was charged
    strategy.answer_counts = np.array(counts)
    warnings = strategy.answer_warnings()
    assert bool(warnings) == warned
    if warned:
        said = "generated" if counts[0] > counts[1] else "real"
        assert f"said '{said}'" in warnings[0]
        # the remedy concerns teachers that call everything generated
        assert ("Teachers that tell every generated record apart" in warnings[0]) == (said == "generated")
        assert "not counted" not in warnings[0]


def test_a_resume_from_a_checkpoint_without_answer_counts_reports_its_answers_uncounted(pategan_run, tmp_path):
    checkpoint = torch.load(pategan_run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if "PATEAggregation" in k]
    del checkpoint["callbacks"][key]["answer_counts"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    before = read_json(pategan_run / "privacy.json")["queries"]
    assert main(pategan_args(tmp_path / "resumed", 60, 9.0, "--resume", str(tmp_path / "old.ckpt"))) == 0
    report = read_json(tmp_path / "resumed" / "privacy.json")
    assert report["answers_uncounted"] == before
    assert sum(report["answers"].values()) + before == report["queries"] > before


def test_sample_command_writes_a_decoded_table(pategan_run, tmp_path):
    out = tmp_path / "published.csv"
    assert main(["sample", "--checkpoint", str(pategan_run / "checkpoints/last.ckpt"), "-n", "25", "--out", str(out)]) == 0
    published = pd.read_csv(out)
    assert len(published) == 25 and "income" in published.columns
    assert main(["sample", "--checkpoint", str(pategan_run / "checkpoints/last.ckpt"), "-n", "5", "--out", str(tmp_path / "x.png")]) == 2


def test_sample_and_evaluate_say_the_data_dependent_epsilon_is_not_the_guarantee(pategan_run, tmp_path, capsys):
    """The papers' figure is computed from the private votes: ``sample`` stated it as the records'
    guarantee, and evaluation.json as the run's epsilon, without the bound that holds whatever the
    votes (train, privacy.json and report.md said so)."""
    from lightning_dpgan.evaluate import evaluate_run

    from lightning_dpgan.sampling import data_dependent_note

    report = read_json(pategan_run / "privacy.json")
    assert report["accounting"] == "data-dependent"
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(pategan_run / "checkpoints/last.ckpt"), "-n", "5",
                 "--out", str(tmp_path / "drawn.csv")]) == 0
    said = capsys.readouterr().err
    # three teachers' split votes price no lower than the bound: the figure is the guarantee, said so
    assert f"{report['epsilon_data_dependent']:.6g}" == f"{report['epsilon_data_independent']:.6g}"
    assert (f"epsilon {report['epsilon']:.6g} and delta 0.001: both the data-dependent figure the PATE papers report "
            "and the data-independent bound of the queries the run asked") in said
    # which the run asked because their votes' figure let it: the count is the votes' too
    assert "how many queries it asked was decided on the votes too" in said
    # unanimous votes price lower: the checkpoint's epsilon is then not what the records carry
    note = data_dependent_note("0.8", {"delta": 1e-5, "accounting": "data-dependent", "epsilon_data_independent": 1600.0},
                               "its run's privacy.json")
    assert note.startswith("the checkpoint's epsilon 0.8 (delta 1e-05) is the data-dependent figure the PATE papers "
                           "report: computed from the teachers' votes, it is not itself differentially private")
    assert "The data-independent bound of the queries the run asked is epsilon 1600 at that delta" in note
    assert "how many queries it asked was decided on the votes too" in note
    older = data_dependent_note("0.8", {"delta": 1e-5, "accounting": "data-dependent"}, "its run's privacy.json")
    assert "bound of the queries the run asked is privacy.json's epsilon_data_independent at that delta" in older
    copy = tmp_path / "run"
    shutil.copytree(pategan_run, copy)
    evaluate_run(copy, seed=0)
    evaluation = read_json(copy / "evaluation.json")
    assert evaluation["epsilon"] == report["epsilon"]
    assert evaluation["epsilon_accounting"] == "data-dependent"
    assert evaluation["epsilon_data_independent"] == pytest.approx(report["epsilon_data_independent"])


def test_a_teacher_checkpoint_keeps_which_epsilon_it_spent_and_older_ones_are_read_for_it():
    """``spent`` says which figure epsilon is and the data-independent bound (None where no
    accountant bounds it); a checkpoint from before kept only epsilon and delta, and its accountant
    state still says the accounting."""
    from lightning_dpgan.sampling import spent_privacy

    strategy = PATEAggregation(lap_inverse_scale=0.05)
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    strategy.delta = 1e-5
    strategy.accountant.step(0.05, np.full(8, TEACHERS))
    spent = strategy.spent_figures()
    assert spent["accounting"] == "data-dependent"
    assert spent["epsilon_data_independent"] == pytest.approx(strategy.accountant.epsilon_data_independent(1e-5))
    strategy.preprocessing = {"epsilon": math.inf, "delta": 0.0}
    assert strategy.spent_figures()["epsilon_data_independent"] is None
    older = {"callbacks": {"PATEAggregation": {"strategy": "pate", "spent": {"epsilon": 0.8, "delta": 1e-5},
                                               "accountant": {"accounting": "data-dependent"}}}}
    assert spent_privacy(older) == {"epsilon": 0.8, "delta": 1e-5, "accounting": "data-dependent"}


def test_sample_writes_a_large_table_a_chunk_at_a_time(pategan_run, tmp_path, monkeypatch):
    from lightning_dpgan import sampling

    calls = []
    original = sampling.synthetic_rows
    monkeypatch.setattr(sampling, "SAMPLE_CHUNK_ROWS", 7)
    monkeypatch.setattr(sampling, "synthetic_rows", lambda *args: calls.append(args[-1]) or original(*args))
    out = tmp_path / "big.csv"
    assert main(["sample", "--checkpoint", str(pategan_run / "checkpoints/last.ckpt"), "-n", "25", "--out", str(out)]) == 0
    assert calls == [7, 7, 7, 7, 4]  # the size probe (drawn aside, a chunk at most), then the table: never more than a chunk in memory
    published = pd.read_csv(out)
    assert len(published) == 25 and list(published.columns) == list(pd.read_csv(pategan_run / "synthetic.csv").columns)


def test_data_independent_accounting_stops_before_the_target(tmp_path):
    assert main(pategan_args(tmp_path / "di", 50, 6.0, "--privacy.accounting", "data-independent")) == 0
    report = read_json(tmp_path / "di" / "privacy.json")
    assert report["accounting"] == "data-independent" and report["epsilon"] <= 6.0
    one_more = PATEMomentsAccountant("data-independent")
    one_more.load_state_dict(checkpoint_accountant_state(tmp_path / "di"))
    assert "gap_counts" not in json.dumps(report)  # not even when it is not what stops training
    assert "epsilon_data_dependent" not in report  # a function of the votes: printed, not written
    assert one_more.epsilon_if_queries(1e-3, 5 * TEACHER_BATCH, LAMBDA) > 6.0


class TeacherSpy(L.Callback):
    """Snapshots of the teachers' parameters when each teacher update starts and ends."""

    def __init__(self):
        self.calls = []

    def wrap(self, module):
        original = module.teacher_step

        def spy(optimizer, real, labels, n):
            before = [p.detach().clone() for p in module.teachers.parameters()]
            loss = original(optimizer, real, labels, n)
            after = [p.detach().clone() for p in module.teachers.parameters()]
            self.calls.append((real.detach().clone(), before, after))
            return loss

        module.teacher_step = spy


def fit_directly(steps=2, batches=None, strategy_kwargs=(), max_epochs=-1, **module_kwargs):
    """Fit a PATE-GAN module on tiny Adult with a spy on its teacher updates; ``batches``, a
    list, gets each training step's teachers' minibatches; ``strategy_kwargs`` replace the
    strategy's test settings; ``steps=None`` with ``max_epochs``: the epochs end training."""
    torch.manual_seed(0)
    datamodule = AdultDataModule(data_dir=ADULT, batch_size=8)
    module = PATEGAN(datamodule.data_shape, **module_kwargs)
    settings = {"num_teachers": TEACHERS, "lap_inverse_scale": LAMBDA, "teacher_batch_size": TEACHER_BATCH,
                "delta": 1e-3, **dict(strategy_kwargs)}
    strategy = PATEAggregation(**settings)
    spy = TeacherSpy()
    spy.wrap(module)
    if batches is not None:
        step = module.training_step

        def recorded_step(batch, batch_idx):
            batches.append([records.clone() for records in batch[0]])
            return step(batch, batch_idx)

        module.training_step = recorded_step
    limits = [] if steps is None else [StepLimit(steps)]
    trainer = L.Trainer(max_epochs=max_epochs, callbacks=[*limits, strategy], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, datamodule=datamodule)
    return datamodule, module, strategy, spy


def test_each_teacher_sees_only_its_own_fixed_partition():
    datamodule, module, strategy, spy = fit_directly()
    records = datamodule.train_dataset.tensors[0]
    partitions = datamodule.partitions(TEACHERS, 0)
    assert [p.tolist() for p in strategy.sampler.partitions] == [p.sort().values.tolist() for p in partitions]
    row_index = {tuple(row.tolist()): i for i, row in enumerate(records)}
    seen = [set() for _ in range(TEACHERS)]
    for real, _, _ in spy.calls:
        for k in range(TEACHERS):
            seen[k] |= {row_index[tuple(row.tolist())] for row in real[k]}
    for k in range(TEACHERS):
        assert seen[k] <= set(partitions[k].tolist()), f"teacher {k} saw records outside its partition"
    assert all(seen[a].isdisjoint(seen[b]) for a in range(TEACHERS) for b in range(a + 1, TEACHERS))
    assert len(spy.calls) == 2 * module.hparams.teacher_steps


def test_teachers_continue_training_and_are_never_reinitialised():
    _, module, _, spy = fit_directly()
    for (_, _, after), (_, before_next, _) in zip(spy.calls, spy.calls[1:]):
        assert all(torch.equal(a, b) for a, b in zip(after, before_next))
    assert not all(torch.equal(a, b) for a, b in zip(spy.calls[0][1], spy.calls[-1][2]))


def test_each_teacher_update_of_a_step_takes_its_own_minibatch():
    """Algorithm 1 draws fresh records for each of the nT teacher updates of a step."""
    batches = []
    _, module, _, spy = fit_directly(batches=batches, teacher_steps=3)
    updates = module.hparams.teacher_steps
    assert len(batches) == 2 and len(spy.calls) == 2 * updates
    for step, minibatches in enumerate(batches):
        assert len(minibatches) == updates
        for update, records in enumerate(minibatches):
            assert torch.equal(spy.calls[step * updates + update][0], records)
        assert not torch.equal(minibatches[0], minibatches[1])


def test_teachers_learn_at_their_own_rate_and_nothing_else_does():
    _, module, _, _ = fit_directly(teacher_lr=0.05)
    generator_opt, student_opt, teacher_opt = module.optimizers()
    assert {group["lr"] for group in teacher_opt.param_groups} == {0.05}
    assert generator_opt.param_groups[0]["lr"] == student_opt.param_groups[0]["lr"] == module.hparams.lr != 0.05
    with pytest.raises(ValueError, match="teacher_lr"):
        PATEGAN((10,), teacher_lr=0.0)
    # each optimizer stepped its own network: the generator's once a training step, the student's student_steps times
    for optimizer, network in ((generator_opt, module.generator), (student_opt, module.student)):
        steps = {int(optimizer.state[parameter]["step"]) for parameter in network.parameters()}
        assert steps == {2 * (module.hparams.student_steps if network is module.student else 1)}


def test_the_partition_seed_chooses_the_teachers_partitions_and_their_draws():
    """--privacy.partition_seed reaches the partitions and the sampler: ignored, every run would
    have seed 0's partitions, and no test used another seed."""
    datamodule, _, strategy, _ = fit_directly(strategy_kwargs={"partition_seed": 1})
    seeded = [p.sort().values.tolist() for p in datamodule.partitions(TEACHERS, 1)]
    assert [p.tolist() for p in strategy.sampler.partitions] == seeded
    assert seeded != [p.sort().values.tolist() for p in datamodule.partitions(TEACHERS, 0)]
    assert strategy.sampler.generator.initial_seed() == 1


@pytest.mark.parametrize("over", [-1, 0, 1])
def test_teachers_draw_without_replacement_unless_their_batch_outgrows_a_partition(over, caplog):
    """A minibatch that repeats records teaches a teacher nothing new: replacement only when the
    batch is larger than the smallest partition, and a warning then (not at equal sizes)."""
    datamodule = AdultDataModule(data_dir=ADULT, batch_size=8)
    datamodule.setup("fit")
    smallest = min(len(part) for part in datamodule.partitions(TEACHERS, 0))
    _, _, strategy, spy = fit_directly(strategy_kwargs={"teacher_batch_size": smallest + over})
    assert strategy.sampler.replacement is (over > 0)
    assert ("with replacement" in caplog.text) is (over > 0)
    if over <= 0:
        for real, _, _ in spy.calls:
            for minibatch in real:
                assert len({tuple(row.tolist()) for row in minibatch}) == len(minibatch)


def test_the_report_states_the_smallest_and_largest_partition_and_the_default_teacher_count():
    """Five teachers on the fixture's records: partitions of two sizes, reported as [min, max];
    without --privacy.num_teachers, K is the records over records_per_teacher."""
    datamodule, module, strategy, _ = fit_directly(steps=1, strategy_kwargs={"num_teachers": 5})
    sizes = sorted(len(part) for part in datamodule.partitions(5, 0))
    assert sizes[0] < sizes[-1] and strategy.partition_report()["partition_sizes"] == [sizes[0], sizes[-1]]
    default = PATEAggregation(lap_inverse_scale=LAMBDA, teacher_batch_size=4, delta=1e-3)
    default.records_per_teacher = 7
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(1), default], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    fresh = PATEGAN(datamodule.data_shape)
    trainer.fit(fresh, datamodule=AdultDataModule(data_dir=ADULT, batch_size=8))
    assert default.num_teachers == fresh.teachers.num_teachers == sum(sizes) // 7 > 1


def test_an_epoch_is_the_smallest_partition_once_over_all_of_a_steps_teacher_updates():
    """With --max-epochs, a step draws teacher_steps minibatches from each partition: an epoch
    counted in single minibatches ran teacher_steps times as many steps."""
    datamodule, module, _, spy = fit_directly(steps=None, max_epochs=1, teacher_steps=2,
                                              strategy_kwargs={"teacher_batch_size": 3})
    smallest = min(len(part) for part in datamodule.partitions(TEACHERS, 0))
    assert module.train_steps == math.ceil(smallest / (3 * 2)) and len(spy.calls) == 2 * module.train_steps


def test_a_teacher_update_starts_from_zero_gradients_and_returns_the_mean_loss_per_teacher():
    """Each update's gradient is its own minibatch's, not the sum of every update so far."""
    torch.manual_seed(0)
    module = PATEGAN((6,), num_teachers=3)
    module.manual_backward = lambda loss: loss.backward()
    optimizer = torch.optim.SGD(module.teachers.parameters(), lr=0.1)
    gradients = []
    optimizer.step = lambda: gradients.append([p.grad.clone() for p in module.teachers.parameters()])
    real, fake = torch.rand(3, 4, 6), torch.rand(5, 6)
    losses = [module.update_teachers(optimizer, real, None, fake, None) for _ in range(2)]
    assert all(torch.equal(first, second) for first, second in zip(*gradients))
    whole = module.teachers.discriminator_loss(real, None, fake, None).item()
    assert losses[0].item() == pytest.approx(whole / 3)


def test_a_pate_model_fitted_without_its_teachers_or_its_strategy_is_refused():
    """A model built in Python with its teachers but no strategy in its slot would otherwise
    train the teachers on private records and fail only at its first aggregation."""
    with_teachers = PATEGAN((6,), num_teachers=3)
    with pytest.raises(ValueError, match="trains only through its teachers' private votes"):
        with_teachers.setup("fit")
    with_strategy = PATEGAN((6,))
    with_strategy.privacy = object()
    with pytest.raises(ValueError, match="trains only through its teachers' private votes"):
        with_strategy.setup("fit")
    with_teachers.privacy = object()
    with_teachers.setup("fit")
    with pytest.raises(ValueError, match="already has 3 teachers, not 4"):
        with_teachers.build_teachers(4)
    for setting in ("num_teachers", "teacher_batch_size"):
        with pytest.raises(ValueError, match=f"--privacy.{setting} must be an integer >= 1, got 0"):
            PATEAggregation(**{setting: 0})


def student_harness(real_votes: int):
    """A PATE-GAN module of 3 teachers that all vote ``real_votes`` "real", its aggregator
    recording the (queries, 2) counts it is given and answering their plain argmax."""
    from types import SimpleNamespace

    torch.manual_seed(0)
    module = PATEGAN((6,), num_teachers=3)
    module.teachers.votes = lambda records, labels=None: torch.full((records.shape[0],), real_votes)
    seen = []
    module.privacy = SimpleNamespace(aggregate=lambda votes: seen.append(votes) or votes.argmax(1))
    module.manual_backward = lambda loss: loss.backward()
    return module, seen


@pytest.mark.parametrize("real_votes", [0, 3])
def test_the_student_is_taught_the_answer_to_the_teachers_votes_as_counts_of_generated_then_real(real_votes):
    """Column 0 counts the teachers calling a record generated, column 1 real (label 1 = real):
    swapped, the student would learn the opposite of what the teachers said."""
    module, seen = student_harness(real_votes)
    optimizer = torch.optim.SGD(module.student.parameters(), lr=0.5)
    _, real_share = module.student_step(optimizer, 8)
    assert seen[0].tolist() == [[3 - real_votes, real_votes]] * 8 and real_share.item() == real_votes / 3
    for _ in range(20):
        module.student_step(optimizer, 64)
    with torch.no_grad():
        said_real = torch.sigmoid(module.student(module.generator(module.sample_latent(64)), None)).mean().item()
    assert said_real > 0.8 if real_votes else said_real < 0.2


class SumStudent(torch.nn.Module):
    """A fixed student whose score is the sum of a record's values: "real" means large values."""

    def forward(self, records, labels=None):
        return records.sum(dim=1)


def test_the_generator_step_moves_its_records_towards_what_the_student_calls_real():
    module, _ = student_harness(0)
    module.discriminator = SumStudent()  # the student (PATE-GAN names its discriminator so)
    latent = module.sample_latent(64)
    with torch.no_grad():
        before = module.student(module.generator(latent), None).mean().item()
    optimizer = torch.optim.Adam(module.generator.parameters(), lr=5e-2)
    for _ in range(30):
        module.generator_step_pate(optimizer, 32)
    with torch.no_grad():
        assert module.student(module.generator(latent), None).mean().item() > before + 1.0


def test_pategan_draws_its_latent_codes_uniformly_from_the_unit_cube():
    """Z ~ Unif([0, 1]^d) in the paper's Algorithm 1."""
    module = PATEGAN((6,))
    z = module.sample_latent(2000)
    assert module.hparams.latent_distribution == "uniform" and 0 <= z.min() and z.max() <= 1
    assert z.mean().item() == pytest.approx(0.5, abs=0.02)


def test_resume_keeps_partitions_and_spend(pategan_run, tmp_path):
    first = torch.load(pategan_run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    (key,) = [k for k in first["callbacks"] if "PATEAggregation" in k]
    assert main(pategan_args(tmp_path / "resumed", 60, 9.0, "--resume", str(pategan_run / "checkpoints/last.ckpt"))) == 0
    resumed = torch.load(tmp_path / "resumed" / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert torch.equal(first["callbacks"][key]["sampler"]["indices"], resumed["callbacks"][key]["sampler"]["indices"])
    report = read_json(tmp_path / "resumed" / "privacy.json")
    assert report["queries"] > read_json(pategan_run / "privacy.json")["queries"]
    assert sum(report["answers"].values()) == report["queries"]  # the count went on from the checkpoint's
    assert report["epsilon"] <= 9.0


def test_a_resume_that_turns_to_data_independent_accounting_says_the_first_segment_stopped_on_the_votes(
        pategan_run, tmp_path, capsys):
    """The first run stopped on its data-dependent figure: how many queries it asked was read off
    the votes. Resumed under data-independent accounting, the report said its bound "holds
    whatever the teachers' votes" and its segments did not say which accounting each ran under."""
    first = read_json(pategan_run / "privacy.json")
    assert first["stopped_by"] in ("budget", "refused") and first["accounting"] == "data-dependent"
    resume = ["--privacy.accounting", "data-independent", "--resume", str(pategan_run / "checkpoints/last.ckpt")]
    capsys.readouterr()
    assert main(pategan_args(tmp_path / "resumed", first["steps"] + 1, 2 * first["epsilon_data_independent"], *resume)) == 0
    report, warned = read_json(tmp_path / "resumed" / "privacy.json"), capsys.readouterr().err
    assert [segment["accounting"] for segment in report["segments"]] == ["data-dependent", "data-independent"]
    caveat = ("but the segment(s) from step 0 ran under data-dependent accounting, which stops, and refuses answers, on "
              "the data-dependent figure: how many queries they asked was decided on the votes too")
    assert caveat in report["note"] and caveat in warned
    assert not report["note"].startswith("epsilon_data_independent holds whatever the votes")
    assert main(["sample", "--checkpoint", str(tmp_path / "resumed" / "checkpoints/last.ckpt"), "-n", "5",
                 "--out", str(tmp_path / "drawn.csv")]) == 0
    assert "the segment(s) from step 0 ran under data-dependent accounting" in capsys.readouterr().err
    # a checkpoint from before segments recorded their accounting: its accountant's says the last ran data-dependent
    older = torch.load(pategan_run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    (state,) = [state for state in older["callbacks"].values() if isinstance(state, dict) and "segments" in state]
    for segment in state["segments"]:
        del segment["accounting"]
    torch.save(older, tmp_path / "older.ckpt")
    resume[-1] = str(tmp_path / "older.ckpt")
    assert main(pategan_args(tmp_path / "from-older", first["steps"] + 1, 2 * first["epsilon_data_independent"],
                             *resume)) == 0
    assert caveat in read_json(tmp_path / "from-older" / "privacy.json")["note"]
    # ... and where it does not say so, the segment is counted as possibly stopped on the votes
    state["accountant"]["accounting"] = "data-independent"
    torch.save(older, tmp_path / "older.ckpt")
    assert main(pategan_args(tmp_path / "unrecorded", first["steps"] + 1, 2 * first["epsilon_data_independent"],
                             *resume)) == 0
    unrecorded = read_json(tmp_path / "unrecorded" / "privacy.json")
    assert "ran under data-dependent accounting, or under one an older checkpoint did not record" in unrecorded["note"]
    assert unrecorded["segments"][0]["accounting"].startswith("not recorded")
    # a run under data-independent accounting from its start: its bound holds whatever the votes
    assert main(pategan_args(tmp_path / "independent", 2, 2 * first["epsilon_data_independent"],
                             "--privacy.accounting", "data-independent")) == 0
    independent = read_json(tmp_path / "independent" / "privacy.json")
    assert independent["note"].startswith("epsilon_data_independent holds whatever the votes.")


def test_a_resume_under_another_partition_seed_is_refused(pategan_run, tmp_path, capsys):
    """The checkpoint's partitions go on: config.yaml and privacy.json named a seed that drew none."""
    args = pategan_args(tmp_path / "resumed", 60, 9.0, "--resume", str(pategan_run / "checkpoints/last.ckpt"),
                        "--privacy.partition_seed", "7")
    assert main(args) == 2
    assert "resume with --privacy.partition_seed 0, not 7" in capsys.readouterr().err
    assert not (tmp_path / "resumed" / "privacy.json").exists()


def test_a_checkpoint_from_before_the_partition_seed_was_kept_is_not_checked():
    from lightning_dpgan.callbacks.teachers import check_same_partition_seed

    assert check_same_partition_seed({}, 3, "teachers'") is None
    assert check_same_partition_seed({"partition_seed": 3}, 3, "teachers'") is None


def test_a_segment_without_a_source_reads_not_recorded():
    """An N-critic checkpoint from before segments named their selection (a KeyError otherwise,
    as the report was written after training)."""
    from lightning_dpgan.callbacks.strategy import PrivacyStrategy

    segments = [{"from_step": 0}, {"from_step": 5, "selection_source": "x"}]
    assert PrivacyStrategy.noise_source_report(segments, "selection_source") == "from step 0: not recorded; then from step 5: x"


def test_a_checkpoint_saved_mid_training_counts_the_step_its_accountant_charged(tmp_path, monkeypatch):
    """A checkpoint is saved in on_train_batch_end before the strategy's turn: its step count
    must still be the module's, or a resumed run's budget plan would start one step behind."""
    from lightning_dpgan.callbacks import checkpoint as checkpoint_callback

    saved, save = [], checkpoint_callback.save_checkpoint_atomically

    def save_and_read(trainer, path):
        written = save(trainer, path)
        state = torch.load(written, map_location="cpu", weights_only=False)
        (key,) = [k for k in state["callbacks"] if "PATEAggregation" in k]
        saved.append((state["lightning_dpgan"]["train_steps"], state["callbacks"][key]["steps"]))
        return written

    monkeypatch.setattr(checkpoint_callback, "save_checkpoint_atomically", save_and_read)
    assert main(pategan_args(tmp_path / "run", 3, 8.0, "--checkpoint_every_n_steps", "1")) == 0
    assert saved[:3] == [(1, 1), (2, 2), (3, 3)]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--privacy", "dp-sgd", "--epsilon", "1"], "needs a model with a GradientPrivatizer slot"),
        (["--privacy", "none"], "no privacy guarantee"),  # the preset sets --epsilon
        (["--epsilon", "1", "--privacy.lap_inverse_scale", "0"], "--privacy.lap_inverse_scale"),
        (["--epsilon", "1", "--privacy.accounting", "magic"], "--privacy.accounting must be one of"),
        (["--epsilon", "1", "--delta", "0.05"], "1/n"),  # 36 training records
    ],
)
def test_bad_pate_settings_are_refused(tmp_path, capsys, argv, message):
    assert main(base_args(tmp_path / "bad") + argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "synthetic.csv").exists()


def test_a_model_without_the_label_slot_lists_pategan(tmp_path, capsys, tiny_image_data_dir):
    from run_helpers import tiny_run_args

    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "x") + ["--privacy", "pate", "--epsilon", "1"]) == 2
    assert "Models that take --privacy pate: pategan" in capsys.readouterr().err


def test_dp_bounds_of_a_csv_are_composed_into_the_reported_epsilon(tmp_path):
    """A CSV without a schema file pays for its bounds and categories with a DP estimate; that
    epsilon and delta are added to training's, and the total still stays within --epsilon."""
    rng = np.random.default_rng(0)
    rows = 300
    frame = pd.DataFrame({
        "amount": rng.gamma(2.0, 50.0, rows).round(2),
        "channel": rng.choice(["web", "shop"], rows),
        "fraud": rng.choice(["no", "yes"], rows, p=[0.7, 0.3]),
    })
    frame.to_csv(tmp_path / "table.csv", index=False)
    args = ["train", "--model", "pategan", "--dataset", "csv", "--data.csv", str(tmp_path / "table.csv"),
            "--data.target", "fraud", "--data.categorical", "channel,fraud", "--data.label_kind", "binary",
            "--data.bounds_epsilon", "3", "--data.bounds_delta", "1e-6", "--output-dir", str(tmp_path / "run"),
            "--max-steps", "50", "--batch-size", "8", "--epsilon", "9", "--delta", "1e-4",
            "--privacy.num_teachers", "3", "--privacy.teacher_batch_size", "8", "--privacy.lap_inverse_scale", "0.05",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main(args) == 0
    report = read_json(tmp_path / "run" / "privacy.json")
    # the estimate is (3, 1e-6)-DP for add/remove neighbours: three columns at epsilon 1 each, the two
    # categorical ones at delta 5e-7 each. PATE's guarantee is for replacing one record, under which
    # each column is (2, (1 + e^1) 5e-7)-DP (group privacy of two records), the estimate their sum
    spent_delta = 2 * (1 + math.exp(1.0)) * 5e-7
    assert report["neighbours"] == "replace-one"
    assert report["preprocessing"]["as_spent"] == {"epsilon": 3.0, "delta": 1e-6, "neighbours": "add-remove"}
    assert report["preprocessing"]["epsilon"] == pytest.approx(6.0)
    assert report["preprocessing"]["delta"] == pytest.approx(spent_delta)
    assert report["epsilon"] == pytest.approx(6.0 + report["epsilon_training"])
    assert report["delta_training"] == pytest.approx(1e-4 - spent_delta)
    assert report["epsilon"] <= 9.0
    synthetic = pd.read_csv(tmp_path / "run" / "synthetic.csv")
    assert list(synthetic.columns) == ["amount", "channel", "fraud"]
    # a budget the preprocessing alone exhausts is refused
    assert main(args[:args.index("--epsilon")] + ["--epsilon", "5.5"] + args[args.index("--epsilon") + 2:]) == 2


def test_a_resumed_csv_run_reuses_its_released_schema_and_pays_for_it_once(tmp_path, capsys):
    """The DP schema estimate is released with the first run; a resume must reuse it (same
    encoding, no second estimate on the private rows), and report its cost once."""
    from lightning_dpgan.sampling import read_run_info

    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"amount": rng.gamma(2.0, 50.0, 200).round(2), "fraud": rng.choice(["no", "yes"], 200)})
    frame.to_csv(tmp_path / "table.csv", index=False)

    def args(output, steps, *extra):
        return ["train", "--model", "pategan", "--dataset", "csv", "--data.csv", str(tmp_path / "table.csv"),
                "--data.target", "fraud", "--data.categorical", "fraud", "--data.label_kind", "binary",
                "--data.bounds_epsilon", "2", "--output-dir", str(tmp_path / output), "--max-steps", str(steps),
                "--batch-size", "8", "--epsilon", "9", "--delta", "1e-3", "--privacy.num_teachers", "2",
                "--privacy.teacher_batch_size", "8", "--privacy.lap_inverse_scale", "0.05",
                "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *extra]

    assert main(args("first", 3)) == 0
    first_ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert main(args("resumed", 6, "--resume", str(first_ckpt), "--seed", "7")) == 0
    first, resumed = read_run_info(first_ckpt), read_run_info(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed["schema"] == first["schema"]  # a second estimate (seed 7) would have other noisy bounds
    report = read_json(tmp_path / "resumed" / "privacy.json")
    assert report["preprocessing"]["epsilon"] == pytest.approx(4.0)  # 2 for add/remove, 4 for replace-one
    assert report["epsilon"] == pytest.approx(4.0 + report["epsilon_training"]) and report["epsilon"] <= 9.0

    # the released schema given back as a schema file costs nothing now, but the checkpoint's
    # networks were trained on the estimate: resuming so would leave its epsilon out of the total
    (tmp_path / "released.json").write_text(json.dumps(first["schema"]))
    from_file = args("from_file", 6, "--resume", str(first_ckpt), "--data.schema", str(tmp_path / "released.json"))
    for option in ("--data.target", "--data.categorical", "--data.label_kind", "--data.bounds_epsilon"):
        del from_file[from_file.index(option):from_file.index(option) + 2]
    assert main(from_file) == 2
    assert "spent epsilon 2, delta 1e-06 on preprocessing (DP schema estimation" in capsys.readouterr().err
    assert not (tmp_path / "from_file").exists()

    # a checkpoint that does not record the estimate's cost cannot be resumed honestly
    checkpoint = torch.load(first_ckpt, map_location="cpu", weights_only=False)
    del checkpoint["lightning_dpgan"]["run"]["preprocessing_cost"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    assert main(args("refused", 6, "--resume", str(tmp_path / "old.ckpt"))) == 2


def test_generated_records_are_on_the_datas_scale_tables_in_0_1_and_images_in_minus_1_1():
    """Images are scaled to [-1, 1]: a sigmoid generator (PATE-GAN's table head) could never
    produce a dark pixel, and its teachers would tell every generated image apart by that."""
    torch.manual_seed(0)
    image = PATEGAN((1, 8, 8), num_classes=10)
    pixels = image.generator(image.sample_latent(256), image.sample_labels(256))
    assert pixels.min() < 0.0 and pixels.max() <= 1.0 and pixels.min() >= -1.0
    table = PATEGAN((12,), num_classes=None)
    records = table.generator(table.sample_latent(256), None)
    assert records.min() >= 0.0 and records.max() <= 1.0


@pytest.mark.parametrize("accounting", ["data-dependent", "data-independent"])
def test_train_warns_that_a_data_dependent_epsilon_is_not_a_proven_guarantee(accounting):
    """The PATE papers' figure depends on the private votes: a user reading privacy.json's
    epsilon alone would take it for a guarantee. The warning names the bound that is one."""
    strategy = PATEAggregation(accounting=accounting)
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    strategy.delta = 1e-5
    assert strategy.accounting_warnings() == []  # nothing answered yet
    strategy.accountant.step(0.5, np.full(64, TEACHERS))  # unanimous: cheap under the data-dependent bound
    strategy.answer_counts = np.array([32, 32])
    warnings = strategy.training_warnings()
    independent = strategy.accountant.epsilon_data_independent(1e-5)
    dependent = strategy.accountant.epsilon_data_dependent(1e-5)
    assert dependent < independent  # unanimous votes: the two figures differ, so each can be told apart
    assert len(warnings) == 1
    assert f"{independent:.4g}" in warnings[0] and f"{dependent:.4g}" in warnings[0]
    report = strategy.accounting_report()
    assert report["epsilon_data_independent"] == pytest.approx(independent)
    if accounting == "data-independent":
        # the data holder sees the vote-dependent figure on the console; the report leaves it out
        assert "left out of privacy.json" in warnings[0]
        assert "epsilon_data_dependent" not in report
        assert f"{dependent:.4g}" not in json.dumps(report)
        return
    assert "not itself differentially private" in warnings[0]
    assert report["epsilon_data_dependent"] == pytest.approx(dependent)


def test_an_accountant_that_charged_nothing_yet_is_saved_as_a_state_not_as_missing():
    """A PATE run refused on its first queries has an empty accountant (length 0): saving it as
    no state made its checkpoint unresumable, with a message blaming another strategy."""
    from lightning_dpgan.callbacks.strategy import PrivacyStrategy

    strategy = PATEAggregation()
    strategy.accountant = PATEMomentsAccountant()
    assert len(strategy.accountant) == 0
    saved = PrivacyStrategy.state_dict(strategy)
    assert saved["accountant"] == PATEMomentsAccountant().state_dict()
    restored = PATEAggregation()
    restored.accountant = PATEMomentsAccountant()
    PrivacyStrategy.load_state_dict(restored, saved)  # accepted: the same strategy's state
    assert len(restored.accountant) == 0


@pytest.mark.parametrize("preprocessing, refused", [(0.0, False), (1.0, True)])
def test_the_refusal_counts_what_preprocessing_spent(preprocessing, refused):
    """A CSV run's DP bounds spend part of --epsilon before training: a query batch is refused
    when it would pass what is left (target less preprocessing), not the whole target."""
    from lightning_dpgan.privacy.slots import PrivacyBudgetExhausted

    gaps = np.ones(60)  # split votes: each answer costs much more than a unanimous one
    cost = PATEMomentsAccountant().epsilon_if_answered(1e-5, 0.05, gaps)
    strategy = PATEAggregation(lap_inverse_scale=0.05, target_epsilon=cost + 0.5, delta=1e-5)
    strategy.preprocessing = {"epsilon": preprocessing, "delta": 0.0}
    if refused:
        with pytest.raises(PrivacyBudgetExhausted):
            strategy._charge(0.05, gaps)
        assert len(strategy.accountant) == 0 and f"past its share {cost - 0.5:g} " in strategy.refusal
    else:
        strategy._charge(0.05, gaps)
        assert len(strategy.accountant) == 60 and strategy.epsilon() == pytest.approx(cost)


def test_the_refusal_converts_at_trainings_share_of_delta():
    """Preprocessing that spent part of delta leaves training a smaller one, at which the same
    votes cost more epsilon: a batch that fits at the whole delta but not at training's share is
    refused (the check is the only stop under data-dependent accounting)."""
    from lightning_dpgan.privacy.slots import PrivacyBudgetExhausted

    gaps = np.ones(60)
    at_whole = PATEMomentsAccountant().epsilon_if_answered(1e-5, 0.05, gaps)
    at_share = PATEMomentsAccountant().epsilon_if_answered(1e-6, 0.05, gaps)
    assert at_whole < at_share
    strategy = PATEAggregation(lap_inverse_scale=0.05, target_epsilon=(at_whole + at_share) / 2, delta=1e-5)
    strategy.preprocessing = {"epsilon": 0.0, "delta": 9e-6}
    assert strategy.training_delta == pytest.approx(1e-6)
    with pytest.raises(PrivacyBudgetExhausted):
        strategy._charge(0.05, gaps)
    assert len(strategy.accountant) == 0


def pate_strategy_over(data):
    """A PATE strategy with the sampler its install builds, over ``data``."""
    strategy = PATEAggregation(num_teachers=3)
    strategy.accountant = PATEMomentsAccountant()
    strategy.sampler = PartitionedSampler(data, disjoint_partitions(len(data), 3, seed=0), 4, seed=0)  # as install builds it
    return strategy


def test_the_teacher_strategy_restores_its_samplers_draws_and_refuses_other_records():
    """A resumed run goes on with the sampler's next draws (not the first segment's again) and
    refuses a checkpoint of other records of the same count."""
    assert_resume_restores_sampler_draws(pate_strategy_over)


def test_a_first_step_past_the_budget_is_priced_as_the_cheapest_case_and_more_noise_may_not_help(tmp_path, capsys):
    """Under data-dependent accounting a step is priced before the votes as if every one were
    unanimous: the refusal says "at least", and does not advise more Laplace noise, which raises
    that figure here (four teachers: lap_inverse_scale 1 -> 0.5) before it lowers it (0.01).
    Under data-independent accounting the figure is exact and more noise lowers it."""
    import re

    def refusal(scale: float, *extra: str) -> tuple[float, str]:
        argv = ["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(ADULT), "--epsilon", "0.01",
                "--max-steps", "2", "--privacy.num_teachers", "4", "--privacy.teacher_batch_size", "8",
                "--privacy.lap_inverse_scale", str(scale), "--output-dir", str(tmp_path / f"run{scale}"), *extra]
        assert main(argv) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        return float(re.search(r"epsilon = ([0-9.]+)", line).group(1)), line

    (low_noise, line), (more_noise, _), (much_more_noise, _) = refusal(1.0), refusal(0.5), refusal(0.01)
    assert "at least epsilon" in line and "40 queries all answered unanimously, the cheapest case" in line
    assert "fewer --model.student_steps" in line and "can raise this figure" in line
    assert more_noise > low_noise and much_more_noise < 1.0
    exact, line = refusal(0.5, "--privacy.accounting", "data-independent")
    assert "at least" not in line and "more noise" in line and exact > more_noise


def test_the_report_states_the_noise_of_the_last_answers_after_a_resume_that_answered_nothing(tmp_path):
    """A resume may change --privacy.lap_inverse_scale. One that then answers nothing (its
    --max-steps already reached) reports the Laplace noise its answers were drawn with, not the
    flag it was given; one that answers reports the new one."""
    def run(output, steps, scale, *extra):
        assert main(["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(ADULT), "--epsilon", "50",
                     "--max-steps", str(steps), "--privacy.num_teachers", "4", "--privacy.teacher_batch_size", "8",
                     "--privacy.lap_inverse_scale", str(scale), "--output-dir", str(tmp_path / output),
                     "--trainer.enable_progress_bar", "false", *extra]) == 0
        return read_json(tmp_path / output / "privacy.json")

    first = run("first", 2, 0.1)
    checkpoint = str(tmp_path / "first" / "checkpoints" / "last.ckpt")
    idle = run("idle", 2, 0.05, "--resume", checkpoint)
    assert idle["steps"] == first["steps"] == 2 and idle["epsilon"] == first["epsilon"]
    assert (idle["lap_inverse_scale"], idle["laplace_scale"]) == (0.1, 10.0)
    moved = run("moved", 3, 0.05, "--resume", checkpoint)
    assert moved["steps"] == 3 and (moved["lap_inverse_scale"], moved["laplace_scale"]) == (0.05, 20.0)
    # a checkpoint written before the last noise was kept: its accountant knows the one scale it used
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    (state,) = [value for value in saved["callbacks"].values() if isinstance(value, dict) and "last_charged" in value]
    del state["last_charged"]
    torch.save(saved, tmp_path / "older.ckpt")
    older = run("older", 2, 0.05, "--resume", str(tmp_path / "older.ckpt"))
    assert older["steps"] == 2 and older["lap_inverse_scale"] == 0.1
    # ... unless it used two: which was last is not known, and the report states the flag given
    saved = torch.load(tmp_path / "moved" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (state,) = [value for value in saved["callbacks"].values() if isinstance(value, dict) and "last_charged" in value]
    del state["last_charged"]
    torch.save(saved, tmp_path / "older-two.ckpt")
    older_two = run("older-two", 3, 0.2, "--resume", str(tmp_path / "older-two.ckpt"))
    assert older_two["steps"] == 3 and older_two["lap_inverse_scale"] == 0.2


def test_a_second_fit_of_a_trained_module_is_refused_before_a_new_accountant_undercounts_it():
    """A PATE-GAN module fitted for 2 steps, then for 2 more with a new strategy, reported the
    epsilon of the last 2 alone; its generator and teachers had trained on all 4."""
    datamodule, module, _, _ = fit_directly(steps=2)
    teachers = [p.detach().clone() for p in module.teachers.parameters()]
    fresh = PATEAggregation(num_teachers=TEACHERS, lap_inverse_scale=LAMBDA, teacher_batch_size=TEACHER_BATCH,
                            delta=1e-3)
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(4), fresh], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with pytest.raises(ValueError, match=r"this PATEGAN object already trained 2 steps \(in an earlier fit\(\).*"
                                         r"epsilon would leave out"):
        trainer.fit(module, datamodule=datamodule)
    assert module.train_steps == 2 and len(fresh.accountant) == 0
    assert all(torch.equal(before, after) for before, after in zip(teachers, module.teachers.parameters()))


def test_a_module_a_strategy_made_private_is_refused_even_before_its_first_step():
    """A first fit that failed after install leaves the mechanism in the slot (DP-SGD's hooks)."""
    module = PATEGAN((6,), num_teachers=3)
    module.privacy = object()
    with pytest.raises(ValueError, match=r"this PATEGAN object was made private by an earlier fit\(\), and fitting it again is refused"):
        PATEAggregation().setup(SimpleNamespace(world_size=1), module, "fit")


def test_a_strategy_that_charged_an_earlier_fit_is_refused_for_a_new_module():
    """PATE's accountant lives from construction: a second module fitted with the same instance
    reported the first one's queries and answers as its own."""
    datamodule, _, used, _ = fit_directly(steps=2)
    charged = used.steps_taken()
    fresh = PATEGAN(datamodule.data_shape)
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(2), used], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with pytest.raises(ValueError, match=rf"this PATEAggregation already charged {charged} steps in an earlier fit\(\).*"
                                         r"Build a new PATEAggregation for each fit"):
        trainer.fit(fresh, datamodule=datamodule)
    assert fresh.train_steps == 0 and used.steps_taken() == charged > 0


def test_a_refusal_that_ends_a_fit_from_python_is_told_not_returned_in_silence():
    """``train`` prints a refusal and an untrained generator; from Python fit() returned quietly,
    and the generator's random initialisation was there to be sampled."""
    with pytest.warns(UserWarning) as warned:
        _, module, strategy, _ = fit_directly(steps=3, strategy_kwargs={"target_epsilon": 0.01})
    said = [str(w.message) for w in warned]
    assert strategy.refusal is not None and module.generator_updates == 0
    assert any(f"PATEAggregation refused a query batch that would have passed the target ({strategy.refusal})" in text
               for text in said)
    assert any(text.startswith("no generator update was taken") for text in said)



class VotesPricedAt:
    """An accountant whose data-dependent and data-independent figures are given."""

    def __init__(self, dependent: float, independent: float):
        self.accounting, self.dependent, self.independent = "data-dependent", dependent, independent

    def __len__(self) -> int:
        return 8

    def epsilon_data_dependent(self, delta: float) -> float:
        return self.dependent

    def epsilon_data_independent(self, delta: float) -> float:
        return self.independent


@pytest.mark.parametrize("dependent,independent,saved", [(0.4, 0.9, True), (0.9, 0.9, False)])
def test_the_data_dependent_figure_is_set_against_the_bound_only_where_the_votes_priced_lower(dependent, independent,
                                                                                              saved):
    """Where the votes saved nothing the figure is the bound itself: "not differentially
    private ... the bound is 0.9" of an epsilon of 0.9 would contradict itself."""
    strategy = PATEAggregation(num_teachers=5, target_epsilon=1.0, delta=1e-5)
    strategy.accountant = VotesPricedAt(dependent, independent)
    (warning,) = strategy.accounting_warnings()
    assert ("not itself differentially private" in warning) is saved
    assert (f"epsilon {dependent:.4g}, the data-dependent figure the PATE papers report, is also the data-independent "
            "bound of the queries this run asked" in warning) is not saved
    # either way the figure decided how many queries were asked
    assert "how many queries it asked was decided on the votes too" in warning


@pytest.mark.parametrize("independent", [0.9, 3200.0])
def test_a_data_independent_bound_above_the_target_is_said_in_the_reports_note(independent):
    """A PATE-GAN run reported epsilon 0.80 (the votes' figure, within a target of 3) beside a
    bound of 3200 that holds whatever the votes; nothing said that no figure but the votes' meets
    the target, and the headline read as the guarantee."""
    strategy = PATEAggregation(num_teachers=5, target_epsilon=1.0, delta=1e-5)
    strategy.accountant = VotesPricedAt(0.4, independent)
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    note = strategy.accounting_report()["note"]
    above = (f"The data-independent bound, {independent:.4g}, is above --epsilon 1: the target holds only as the PATE "
             "papers' data-dependent accounting states it, not whatever the votes.")
    assert (above in note) is (independent > 1.0) and note.endswith(".")


def test_the_preset_gives_no_batch_size_for_the_teachers_loader_to_leave_unread(tmp_path, capsys):
    """pategan.yaml listed data.batch_size 64, which the teachers' own loader never reads: every run
    that changed --privacy.teacher_batch_size was warned of a --batch-size nobody typed."""
    args = pategan_args(tmp_path / "run", 1)  # a teacher batch of 8, not the preset's 64
    at = args.index("--batch-size")
    del args[at:at + 2]
    assert main(args) == 0
    assert "is not used by --privacy pate" not in capsys.readouterr().err
    assert main(pategan_args(tmp_path / "given", 1, 8.0, "--batch-size", "4")) == 0  # typed, and unread: said
    assert "data.batch_size 4 (--batch-size, a config file or a preset) is not used by --privacy pate" in \
        capsys.readouterr().err
