"""The end-to-end audit (``python -m lightning_dpgan audit``): whole training runs with and
without a canary record, a membership test on the released generator, and a Clopper-Pearson
lower bound on epsilon. A sound DP-SGD GAN stays within its claim; the same GAN with its noise
switched off (only here, through the test hook) is caught."""

import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from lightning_dpgan import canary_audit
from lightning_dpgan.canary_audit import (
    AUDIT_FILE,
    Canary,
    TrialRun,
    audit_parser,
    balanced_assignment,
    build_canary,
    canary_score,
    choose_threshold,
    default_calibration_trials,
    insert_canary,
    one_process,
    run_audit,
    set_up,
)
from lightning_dpgan.cli import build_config, main
from lightning_dpgan.evaluate import NOT_COVERED_AUDIT_TRIAL
from lightning_dpgan.privacy.audit import epsilon_lower_bound
from lightning_dpgan.run import Run
from lightning_dpgan.run_folder import AUDIT_TRIAL_NOTE
from run_helpers import read_json, record_calls, tiny_run_args

CLAIMED = 0.25
TRIALS = 24  # 12 per side: a perfect test would show epsilon >= 0.82 at 95%, three times the claim
CALIBRATION = 8
TRAIN_RECORDS = 6  # the csv datamodule holds 2 of the 8 rows out as its test split


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny nets gain nothing from intra-op threads, and on a busy machine the thread pool's
    waiting costs seconds per run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    """Eight records of two numeric columns, all in [0, 0.2] of their public bounds [0, 1] (the
    second is a continuous label): the canary, (1, 1), is far from every record."""
    root = tmp_path_factory.mktemp("tiny_table")
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.uniform(0, 0.2, 8).round(3), "y": rng.uniform(0, 0.2, 8).round(3)}).to_csv(root / "t.csv", index=False)
    schema = {"label": "y", "label_kind": "continuous", "columns": [
        {"name": "x", "kind": "continuous", "bounds": [0, 1]}, {"name": "y", "kind": "continuous", "bounds": [0, 1]}]}
    (root / "schema.yaml").write_text(yaml.safe_dump(schema))
    return root


def table_args(root, *extra, model="gan", privacy="dp-sgd", epsilon=CLAIMED):
    """A DP-SGD GAN with tiny nets that learns the six training records in 40 batches (batch =
    all records). The clipping norm is large so that, without noise, nothing stops the critic
    from learning the canary; the noise scales with it, so the sound version is as private."""
    return [
        "--model", model, "--privacy", privacy, "--dataset", "csv", "--data.csv", str(root / "t.csv"),
        "--data.schema", str(root / "schema.yaml"), "--epsilon", str(epsilon), "--max-steps", "40",
        "--batch-size", str(TRAIN_RECORDS), "--accelerator", "cpu", "--model.latent_dim", "8",
        "--model.generator_kwargs.hidden", "[32,32]", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", *extra,
    ]


def dp_sgd_args(root, *extra):
    return table_args(root, "--privacy.max_grad_norm", "100", "--model.discriminator_kwargs.hidden", "[32,32]",
                      "--model.lr_generator", "5e-3", "--model.lr_discriminator", "5e-3", *extra)


def without_noise(run):
    """Test-only break: DP-SGD adds no noise, while the accountant still charges for the
    calibrated noise (so privacy.json claims the same epsilon)."""
    install = run.strategy.install

    def broken_install(trainer, module):
        install(trainer, module)
        run.strategy.mechanism.noise_multiplier = 0.0

    run.strategy.install = broken_install


# ------------------------------------------------------------------ the audit's verdicts
def test_a_sound_dp_sgd_gan_stays_within_its_claim(tiny_table, tmp_path):
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, TRIALS, calibration_trials=CALIBRATION, samples=1000)
    assert 0.2 < audit.claimed_epsilon <= CLAIMED
    assert epsilon_lower_bound(TRIALS // 2, 0, TRIALS // 2, audit.delta) > 3 * CLAIMED  # so this audit could fail
    assert audit.consistent and audit.epsilon_lower <= audit.claimed_epsilon
    report = read_json(tmp_path / AUDIT_FILE)
    assert report["consistent"] is True and report["epsilon_lower"] == audit.epsilon_lower


def test_dp_sgd_without_noise_is_caught(tiny_table, tmp_path):
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, TRIALS, calibration_trials=CALIBRATION, samples=1000,
                      prepare_run=without_noise)
    scores = audit.to_dict()["scores"]
    # without noise the canary is learnt: generated records move towards it in runs that saw it
    assert np.median(scores["with_canary"]) < min(scores["without_canary"])
    assert audit.claimed_epsilon <= CLAIMED  # the accountant did not notice
    assert audit.epsilon_lower > audit.claimed_epsilon and not audit.consistent
    assert read_json(tmp_path / AUDIT_FILE)["consistent"] is False


# ------------------------------------------------------------------------ command line
def test_audit_command_writes_audit_json(tiny_table, tmp_path, capsys):
    out = tmp_path / "audit"
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "4", "--calibration-trials", "2", "--samples", "200",
                 "--output-dir", str(out), "--seed", "3", "--confidence", "0.9"]) == 0
    said = capsys.readouterr().out
    assert "audit: epsilon_lower" in said
    # each trial's own line on what it spent says the figure is the claim under test, not a release's
    assert said.count("train: privacy: epsilon") == said.count("-- an audit trial's claim under test, not for release") == 6
    report = read_json(out / AUDIT_FILE)
    for key in ("claimed_epsilon", "delta", "epsilon_lower", "confidence", "true_positives", "false_positives",
                "trials", "trials_per_side", "threshold", "canary", "scores", "per_trial", "calibration", "consistent"):
        assert key in report, key
    assert report["model"] == "gan" and report["privacy"] == "dp-sgd" and report["neighbours"] == "add-remove"
    assert report["canary"]["record"] == {"x": 1.0, "y": 1.0}
    assert report["trials"] == 4 and [t["canary"] for t in report["per_trial"]].count(True) == 2
    assert report["consistent"] == (report["epsilon_lower"] <= report["claimed_epsilon"])
    # the threshold comes from the calibration runs alone, which are separate runs
    calibration = report["calibration"]
    assert report["threshold"] == choose_threshold([t["score"] for t in calibration if t["canary"]],
                                                   [t["score"] for t in calibration if not t["canary"]])
    seeds = [t["seed"] for t in calibration + report["per_trial"]]
    assert len(set(seeds)) == len(seeds) == 6
    privacies = []
    for trial in report["per_trial"]:
        privacy = read_json(f"{trial['output_dir']}/privacy.json")
        privacies.append(privacy)
        assert privacy["epsilon"] == trial["epsilon"] and privacy["epsilon_training"] == trial["epsilon_training"]
        assert privacy["train_records"] == TRAIN_RECORDS + trial["canary"]
        assert trial["generator_updates"] > 0 and trial["accounting"] is None
        assert trial["guess"] == (trial["score"] <= report["threshold"])
        assert privacy["audit_trial"] == AUDIT_TRIAL_NOTE  # its figures are the claim under test, not a release's
    # the bound, recomputed from the trials' own guesses, at the --confidence given and training's delta
    guesses = [(t["canary"], t["guess"]) for t in report["per_trial"]]
    assert report["true_positives"] == guesses.count((True, True))
    assert report["false_positives"] == guesses.count((False, True))
    assert report["confidence"] == 0.9 and report["delta"] == max(p["delta_training"] for p in privacies)
    assert report["epsilon_lower"] == epsilon_lower_bound(report["true_positives"], report["false_positives"], 2,
                                                          report["delta"], 0.9)
    assert report["claimed_epsilon"] == max(p["epsilon_training"] for p in privacies)
    assert report["largest_detectable_epsilon"] == epsilon_lower_bound(2, 0, 2, report["delta"], 0.9)
    # a trial's generator, trained with a canary chosen from the data, is not for release: sample says so
    trial_checkpoint = Path(report["per_trial"][0]["output_dir"]) / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(trial_checkpoint), "-n", "5", "--out", str(tmp_path / "s.csv")]) == 0
    said = capsys.readouterr().err
    assert (f"sample: warning: these records are not for release: the checkpoint is of {AUDIT_TRIAL_NOTE}. Release "
            "records drawn from a generator trained by train") in said
    assert "released under" not in said
    # train does not continue it: resumed, a canary trial trained on without its canary (the mark
    # is in the checkpoint, not in config.yaml)
    trial_dir = trial_checkpoint.parent.parent
    resumed = tmp_path / "resumed"
    capsys.readouterr()
    assert main(["train", "--config", str(trial_dir / "config.yaml"), "--resume", str(trial_checkpoint),
                 "--max-steps", "42", "--output-dir", str(resumed)]) == 2
    said = capsys.readouterr().err
    assert f"--resume {trial_checkpoint} is the checkpoint of {AUDIT_TRIAL_NOTE}. A trial is not continued" in said
    assert not resumed.exists()
    # its evaluation's report and evaluation.json say not to publish it
    assert main(["evaluate", "--run", str(trial_dir)]) == 0
    assert f"The run is {AUDIT_TRIAL_NOTE}: publish neither this run's synthetic data" in (trial_dir / "report.md").read_text()
    assert "Publish the synthetic data" not in (trial_dir / "report.md").read_text()
    assert read_json(trial_dir / "evaluation.json")["privacy_note"] == NOT_COVERED_AUDIT_TRIAL


def test_a_folder_holding_an_audit_is_refused_unless_overwritten(tiny_table, tmp_path, capsys):
    out = tmp_path / "audit"
    short = [*dp_sgd_args(tiny_table), "--trials", "2", "--threshold", "0.5", "--samples", "50", "--max-steps", "2",
             "--output-dir", str(out)]
    assert main(["audit", *short]) == 0
    first = read_json(out / AUDIT_FILE)
    assert main(["audit", *short]) == 2  # a second audit would write its trials over the first's
    assert "already holds an audit (audit.json, trials)" in capsys.readouterr().err
    assert read_json(out / AUDIT_FILE) == first
    # refused before its first trial (a bad setting): the old audit stays where it was
    assert main(["audit", *short, "--overwrite", "--samples", "0"]) == 2
    assert read_json(out / AUDIT_FILE) == first and not (out / "previous").exists()
    # refused inside its first trial, before it trained (a batch larger than the six records and
    # the canary): the old audit is put back, and the refused trial's logger files are gone
    capsys.readouterr()
    assert main(["audit", *short, "--overwrite", "--batch-size", "100"]) == 2
    assert "audit: trial trials/000 (with" in capsys.readouterr().err
    assert read_json(out / AUDIT_FILE) == first and not (out / "previous").exists()
    assert sorted(p.name for p in (out / "trials").iterdir()) == ["000", "001"]
    fresh = tmp_path / "fresh"
    assert main(["audit", *short[:-1], str(fresh), "--batch-size", "100"]) == 2
    assert not (fresh / "trials").exists()  # else the corrected rerun would be refused for it
    assert main(["audit", *short, "--overwrite", "--seed", "5"]) == 0
    assert read_json(out / "previous" / AUDIT_FILE) == first  # set aside, not lost
    assert sorted(p.name for p in (out / "previous" / "trials").iterdir()) == ["000", "001"]
    assert read_json(out / AUDIT_FILE)["per_trial"][0]["seed"] != first["per_trial"][0]["seed"]
    # a training run's folder, overwritten or not: the audit's files would mix with the run's
    trial = out / "trials" / "000"
    held = sorted(p.name for p in trial.iterdir())
    for overwrite in ([], ["--overwrite"]):
        assert main(["audit", *short[:-1], str(trial), *overwrite]) == 2
        assert f"--output-dir {trial} holds a training run (checkpoints, privacy.json" in capsys.readouterr().err
        assert sorted(p.name for p in trial.iterdir()) == held
    capsys.readouterr()
    assert main(["audit", *short[:-1], str(out / AUDIT_FILE)]) == 2  # an --output-dir that is a file
    assert "is a file" in capsys.readouterr().err


def test_an_audit_that_fails_after_a_trial_trained_keeps_that_trial(tiny_table, tmp_path, monkeypatch, capsys):
    """Only an audit refused before any trial trained is cleared away; one that fails later keeps
    the trials it trained (minutes each at full size), for the data holder to look at."""
    real, calls = canary_audit.run_trial, []

    def failing_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(canary_audit, "run_trial", failing_second)
    out = tmp_path / "audit"
    args = [*dp_sgd_args(tiny_table), "--trials", "2", "--threshold", "0.5", "--samples", "50", "--max-steps", "2"]
    assert main(["audit", *args, "--output-dir", str(out)]) == 2
    said = capsys.readouterr().err
    assert "disk full" in said and re.search(r"audit: trial trials/001 \((with|without) the canary\) stopped:", said)
    assert (out / "trials" / "000" / "config.yaml").is_file() and not (out / AUDIT_FILE).exists()


def test_audit_refuses_a_model_without_privacy(tiny_table, tmp_path, capsys):
    args = table_args(tiny_table, privacy="none")
    args.remove("--epsilon")
    args.remove(str(CLAIMED))
    assert main(["audit", *args, "--output-dir", str(tmp_path), "--trials", "4", "--trials", "6"]) == 2
    err = capsys.readouterr().err
    assert "--privacy none" in err
    assert err.count("--trials given twice (4, then 6)") == 1  # the options were parsed twice, and noted twice
    assert not (tmp_path / AUDIT_FILE).exists()


def test_audit_refuses_quail_whose_label_model_it_does_not_cover(tmp_path, capsys):
    args = ["audit", "--model", "quail", "--quail-synthesizer", "dpgan", "--dataset", "adult", "--epsilon", "1",
            "--output-dir", str(tmp_path)]
    assert main(args) == 2
    assert "audit its synthesizer (--model dpgan)" in capsys.readouterr().err
    assert not (tmp_path / AUDIT_FILE).exists()


@pytest.mark.parametrize("extra,message", [
    (["--devices", "2"], "the audit trains each trial in this one process: drop --devices 2."),
    (["--strategy", "ddp"], "drop --strategy ddp."),
    (["--num-nodes", "2", "--strategy", "ddp"], "drop --strategy ddp and --num-nodes 2."),
    (["--evaluate"], "the audit scores each trial by its canary test, not by evaluate"),
    (["--threshold", "nan"], "--threshold is a distance to the canary: a finite number from 0, got nan"),
    (["--threshold", "-1"], "--threshold is a distance to the canary: a finite number from 0, got -1.0"),
    (["--trials", "3"], "--trials must be even and at least 2 (half the trials hold the canary), got 3"),
    (["--calibration-trials", "1"], "--calibration-trials must be even and at least 2 (half the trials hold the canary), got 1"),
    (["--confidence", "0.5"], "--confidence must be in [0.9, 1), got 0.5: below 0.9 a sound mechanism is often reported"),
    (["--confidence", "1"], "--confidence must be in [0.9, 1), got 1.0: a bound held with certainty"),
    (["--confidence", "nan"], "--confidence must be in [0.9, 1), got nan: it is not a number"),
    (["--confidence", "1.5"], "--confidence must be in [0.9, 1), got 1.5: a confidence is a probability, below 1"),
    (["--samples", "0"], "--samples must be at least 1, got 0"),
    (["--trials", str(10**12)], "--trials 1000000000000: each trial is a whole training run; give at most 100000"),
    (["--calibration-trials", str(10**12)], "--calibration-trials 1000000000000: each trial is a whole training run"),
    (["--privacy.noise_seed", "3"], "--privacy.noise_seed fixes the mechanism's random draws: every trial would draw"),
    (["--threshold", "0.5", "--calibration-trials", "2"], "--calibration-trials choose the threshold, and --threshold gives it"),
], ids=["devices", "ddp", "nodes", "evaluate", "nan-threshold", "negative-threshold", "odd-trials", "odd-calibration",
        "low-confidence", "certain-confidence", "nan-confidence", "above-one-confidence", "no-samples", "huge-trials", "huge-calibration", "fixed-noise",
        "threshold-and-calibration"])
def test_an_audit_setting_it_cannot_honour_is_refused_by_its_flag_before_any_trial(tiny_table, tmp_path, capsys, extra, message):
    """Each refused before a trial runs, naming the flag: several processes (each would restart the
    audit, and rank 1 found rank 0's first trial folder and died without a word), --evaluate (it
    was dropped in silence), a threshold that makes every guess "no canary", an odd trial count."""
    out = tmp_path / "audit"
    args = [*dp_sgd_args(tiny_table), "--trials", "2", "--samples", "50", "--max-steps", "2", "--output-dir", str(out),
            "--accelerator", "cpu", *extra]
    assert main(["audit", *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_an_audit_stopped_during_a_trial_says_which_and_to_run_it_again_not_to_resume_the_trial(
        tiny_table, tmp_path, capsys, monkeypatch, stop):
    """A SIGTERM in a trial printed only the trial's own line, whose 'Continue it with: train
    --resume' trained a canary trial on without its canary; an audit is run again instead."""
    import signal

    from run_helpers import act_after_training_step, press_ctrl_c, sigint_restored

    act_after_training_step(monkeypatch, 3, press_ctrl_c if stop == "ctrl-c" else
                            lambda: os.kill(os.getpid(), signal.SIGTERM))
    out = tmp_path / "audit"
    with sigint_restored():
        status = main(["audit", *dp_sgd_args(tiny_table), "--trials", "2", "--threshold", "0.5", "--samples", "50",
                       "--output-dir", str(out)])
    assert status == (130 if stop == "ctrl-c" else 128 + signal.SIGTERM)
    said = capsys.readouterr().err
    assert re.search(r"audit: stopped during trial trials/000 \((with|without) the canary\): no audit.json is written, "
                     r"and an audit is not continued: run it again with --overwrite", said)
    stopped = "interrupted after 3 steps" if stop == "ctrl-c" else "stopped by SIGTERM after 3 steps"
    assert f"{stopped} of an audit's trial, which is not continued" in said
    assert "Continue it with" not in said and "--resume" not in said
    assert not (out / AUDIT_FILE).exists() and (out / "trials" / "000").is_dir()


def test_an_audit_refused_before_its_first_trial_leaves_no_folder_it_made(tiny_table, tmp_path, capsys):
    out = tmp_path / "audit"
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "2", "--threshold", "0.5", "--delta", "0.3",
                 "--output-dir", str(out)]) == 2
    assert "--delta 0.3" in capsys.readouterr().err
    assert not out.exists()


def test_an_audit_folder_holding_the_private_records_is_refused(tiny_table, tmp_path, capsys):
    """As train's --output-dir: the audit's trials are not for release, but its folder is still
    something one copies around, and it must not carry the raw data along."""
    project = tmp_path / "project"
    data = Path(shutil.copytree(tiny_table, project / "data"))
    assert main(["audit", *dp_sgd_args(data), "--trials", "2", "--output-dir", str(project)]) == 2
    assert (f"--output-dir {project} holds the folder the private records are read from (--data.csv "
            f"{data})") in capsys.readouterr().err
    assert sorted(str(path.relative_to(project)) for path in project.rglob("*")) == [
        "data", *sorted(f"data/{path.name}" for path in tiny_table.iterdir())]


def test_an_audit_folder_that_is_the_datasets_subfolder_is_refused(tiny_image_data_dir, tmp_path, capsys):
    """--data-dir DIR reads MNIST from DIR/mnist/: train refused --output-dir DIR/mnist, the audit
    did not (its trials' own folders cannot hold the data), and wrote its trials beside it."""
    data = Path(shutil.copytree(tiny_image_data_dir, tmp_path / "data"))
    before = sorted(path.name for path in (data / "mnist").iterdir())
    args = tiny_run_args(data, data / "mnist", model="dpgan")[1:]
    assert main(["audit", *args, "--trials", "2", "--epsilon", "5"]) == 2
    assert (f"--output-dir {data / 'mnist'} is the folder the private records are read from (--data-dir's files "
            f"{data / 'mnist'})") in capsys.readouterr().err
    assert sorted(path.name for path in (data / "mnist").iterdir()) == before


def test_both_fixed_draw_seeds_are_named_and_refused(tiny_table, tmp_path, capsys):
    """GS-WGAN's sanitizer takes both a noise seed and a critic-selection seed: each fixes draws
    the trials must make afresh, and the refusal names both."""
    out = tmp_path / "audit"
    args = [*table_args(tiny_table, model="gswgan", privacy="sanitizer"), "--trials", "2", "--samples", "50",
            "--output-dir", str(out), "--privacy.noise_seed", "1", "--privacy.selection_seed", "2"]
    assert main(["audit", *args]) == 2
    said = capsys.readouterr().err
    assert "--privacy.noise_seed and --privacy.selection_seed fix the mechanism's random draws" in said
    assert said.rstrip().endswith("Drop them")
    assert not out.exists() or not any(out.iterdir())


def test_samples_the_memory_cannot_hold_are_refused_before_the_first_trial_trains(tiny_table, tmp_path, capsys,
                                                                                 monkeypatch):
    """A trillion --samples trained the first trial, then ended in torch's allocation traceback."""
    fitted = record_calls(monkeypatch, Run, "fit")
    monkeypatch.setattr("lightning_dpgan.sampling.free_memory", lambda: 10**9)
    args = [*dp_sgd_args(tiny_table), "--trials", "2", "--threshold", "0.5", "--samples", str(10**12),
            "--max-steps", "2", "--output-dir", str(tmp_path / "audit")]
    assert main(["audit", *args]) == 2
    said = capsys.readouterr().err
    assert "--samples 1000000000000 records would take about" in said and "953.7 MiB free" in said
    assert fitted == [] and not (tmp_path / "audit" / AUDIT_FILE).exists()
    monkeypatch.setattr("lightning_dpgan.sampling.free_memory", lambda: None)  # a system that does not say: no check
    canary_audit.check_memory_for_samples(10**12, canary_audit.Canary("table", (), torch.zeros(5), {}))


@pytest.mark.parametrize("budget, said", [(["--epsilon", "0"], "--epsilon must be a finite number > 0"),
                                         (["--delta", "1"], "--delta must be strictly between 0 and 1")])
def test_a_meaningless_budget_is_refused_before_any_trial(tiny_table, tmp_path, capsys, monkeypatch, budget, said):
    """It was refused inside the first trial, after "audit: trial ... stopped:", as if a trial had failed."""
    trials = record_calls(monkeypatch, canary_audit, "run_trial")
    args = [*table_args(tiny_table, epsilon=budget[1] if budget[0] == "--epsilon" else CLAIMED),
            *([] if budget[0] == "--epsilon" else budget), "--trials", "2", "--threshold", "0.5",
            "--output-dir", str(tmp_path / "audit")]
    assert main(["audit", *args]) == 2
    err = capsys.readouterr().err
    assert said in err and "stopped" not in err and trials == []


def test_the_trials_train_in_one_process_whatever_devices_auto_would_pick():
    config = {"trainer": {"devices": "auto", "strategy": "auto", "accelerator": "gpu"}, "evaluate": False}
    assert one_process(config)["trainer"]["devices"] == 1 and config["trainer"]["devices"] == "auto"
    assert default_calibration_trials(20) == 10 and default_calibration_trials(6) == 2 and default_calibration_trials(2) == 2


# ---------------------------------------------------------------- canaries and their paths
def test_dp_sgd_samples_batches_from_the_split_with_the_canary(tiny_table, tmp_path):
    run = Run(build_config(dp_sgd_args(tiny_table, "--max-steps", "1")), tmp_path)
    set_up(run.datamodule)
    canary = build_canary(run.datamodule)
    assert insert_canary(run.datamodule, canary, run.strategy.neighbours) == TRAIN_RECORDS
    run.fit()
    assert run.strategy.train_records == TRAIN_RECORDS + 1
    assert run.strategy.sample_rate == pytest.approx(TRAIN_RECORDS / (TRAIN_RECORDS + 1))
    (records,) = run.datamodule.train_dataloader().dataset.tensors  # the Poisson-sampled loader
    assert torch.equal(records[-1], canary.row[0][0]) and len(records) == TRAIN_RECORDS + 1


def test_pate_teachers_get_the_canary_in_exactly_one_partition(tiny_table, tmp_path):
    """PATE's guarantee is for replacing a record: the canary replaces the last one, the
    partitions stay a permutation of the same N indices, and one teacher trains on it."""
    args = table_args(tiny_table, "--max-steps", "1", "--delta", "1e-3", "--privacy.num_teachers", "3",
                      "--privacy.teacher_batch_size", "2", "--privacy.lap_inverse_scale", "0.05", model="pategan", privacy="pate",
                      epsilon=8)
    run = Run(build_config(args), tmp_path)
    set_up(run.datamodule)
    canary = build_canary(run.datamodule)
    assert run.strategy.neighbours == "replace-one"
    index = insert_canary(run.datamodule, canary, run.strategy.neighbours)
    assert index == TRAIN_RECORDS - 1 and len(run.datamodule.train_dataset) == TRAIN_RECORDS
    run.fit()
    sampler = run.strategy.sampler
    assert torch.equal(sampler.data[index], canary.row[0][0])
    assert sum(int((part == index).sum()) for part in sampler.partitions) == 1


def test_image_canary_is_a_full_contrast_checkerboard(tiny_image_data_dir, tmp_path):
    args = tiny_run_args(tiny_image_data_dir, tmp_path, model="dpgan")[1:]
    run = Run(build_config(args + ["--epsilon", "5"]), tmp_path)
    set_up(run.datamodule)
    canary = build_canary(run.datamodule)
    image, label = canary.row
    assert image.shape == (1, 1, 28, 28) and set(image.unique().tolist()) == {-1.0, 1.0}
    assert torch.equal(image[0, 0, 0, :2], torch.tensor([1.0, -1.0])) and label.tolist() == [9]
    size = len(run.datamodule.train_dataset)
    insert_canary(run.datamodule, canary, "add-remove")
    images, labels = run.datamodule.train_dataset.tensors
    assert len(images) == size + 1 and torch.equal(images[-1], image[0]) and labels[-1] == 9
    # the score: RMS pixel distance to the nearest generated image of the canary's class
    asked = []
    run.module.sample = lambda n, labels=None: asked.append(labels) or torch.zeros(n, 1, 28, 28)
    assert canary_score(run.module, run.datamodule, canary, 5, seed=0) == pytest.approx(1.0)
    assert asked[0].tolist() == [9] * 5
    run.module.sample = lambda n, labels=None: torch.cat([torch.zeros(n - 1, 1, 28, 28), image])
    assert canary_score(run.module, run.datamodule, canary, 5, seed=0) == 0.0


# ---------------------------------------------------------------------------- the rules
def test_the_assignment_is_balanced_and_seeded():
    first = balanced_assignment(20, np.random.default_rng(1))
    assert first.count(True) == 10 and first == balanced_assignment(20, np.random.default_rng(1))
    assert first != balanced_assignment(20, np.random.default_rng(2))
    with pytest.raises(ValueError, match="even"):
        balanced_assignment(5, np.random.default_rng(0))


def test_threshold_separates_calibration_scores():
    assert choose_threshold([0.1, 0.2, 0.3], [0.9, 1.0, 1.1]) == pytest.approx(0.6)
    # one outlier on each side: the threshold still maximises TPR - FPR
    threshold = choose_threshold([0.1, 0.2, 0.3, 1.5], [0.25, 0.9, 1.0, 1.1])
    assert 0.3 <= threshold < 0.9
    # three candidates tie at TPR - FPR = 1/3 (0.15, 0.55, 0.95): the middle one, where float
    # rounding (1 - 2/3 > 1/3) used to pick the last
    assert choose_threshold([0.1, 0.5, 0.9], [0.2, 0.6, 1.0]) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="not a number"):
        choose_threshold([float("nan"), 0.1], [0.2, 0.3])


# ------------------------------------------------- the audit's record, with stand-in trials
def stand_in_trials(monkeypatch, score, record=lambda seed: {"x": 1.0}, training=(1.0, 1e-6), total=(2.0, 2e-6),
                    more=None, updates=None):
    """``run_trial`` replaced: ``score(with_canary)`` and a privacy report whose training claim is
    below its total, as when preprocessing (DP bounds, DP modes) read the rows first."""
    def run_trial(config, output_dir, with_canary, seed, samples, prepare_run=None, audit_dir=None):
        canary = Canary("table", (torch.zeros(1, 2),), torch.zeros(2), {"kind": "table", "rule": "test", "record": record(seed)})
        privacy = {"epsilon": total[0], "delta": total[1], "epsilon_training": training[0], "delta_training": training[1],
                   **(more or {})}
        return TrialRun(score(with_canary), privacy, canary, "add-remove", updates)

    monkeypatch.setattr(canary_audit, "run_trial", run_trial)


def test_the_claim_audited_is_trainings_own_not_the_total_with_preprocessing(tiny_table, tmp_path, monkeypatch):
    """The canary is inserted after preprocessing: a training leaking between its own epsilon
    (1.0) and the total (2.0) was reported consistent against the total."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0)  # a perfect test
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 40, confidence=0.97, calibration_trials=2)
    report = read_json(tmp_path / AUDIT_FILE)
    assert report["claimed_epsilon"] == 1.0 and report["claimed_epsilon_total"] == 2.0 and report["delta"] == 1e-6
    assert report["epsilon_lower"] == epsilon_lower_bound(20, 0, 20, 1e-6, 0.97) == audit.largest_detectable_epsilon
    assert 1.0 < report["epsilon_lower"] < 2.0
    assert report["consistent"] is False and "VIOLATION" in audit.summary()
    assert report["could_detect_a_violation"] is True and audit.undetectable_warning() is None


def test_under_data_dependent_accounting_the_claim_is_the_data_independent_bound(tiny_table, tmp_path, monkeypatch):
    """PATE's and G-PATE's default report an epsilon computed from the votes, which is no DP
    guarantee: the audit tested its inequalities against it, so a "VIOLATION" could come from the
    figure's nature. The claim is the data-independent bound of the queries asked, less
    preprocessing's share; audit.json names the accounting."""
    votes = {"accounting": "data-dependent", "epsilon_data_independent": 3.0, "epsilon_data_dependent": 2.0,
             "preprocessing": {"epsilon": 1.0}}
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, more=votes)  # a perfect test
    run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 40, confidence=0.97, calibration_trials=2)
    report = read_json(tmp_path / AUDIT_FILE)
    assert 1.0 < report["epsilon_lower"] < 2.0  # a violation of the data-dependent training figure, 1.0
    assert report["claimed_epsilon"] == 2.0 and report["claimed_epsilon_total"] == 3.0
    assert report["consistent"] is True and report["accounting"] == "data-dependent"
    assert "data-independent bound of the queries asked" in report["claimed"]
    assert [t["accounting"] for t in report["per_trial"]] == ["data-dependent"] * 40
    assert canary_audit.audited_claim({**votes, "epsilon_data_independent": None}) == (None, None)  # unbounded
    plain = {"epsilon": 2.0, "epsilon_training": 1.0, "accounting": "data-independent", "epsilon_data_independent": 2.0}
    assert canary_audit.audited_claim(plain) == (2.0, 1.0)
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0)  # DP-SGD's report: no accounting
    audit_without = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path / "dp-sgd", 4, confidence=0.97,
                              calibration_trials=2)
    assert audit_without.to_dict()["accounting"] is None
    assert "data-independent" not in audit_without.to_dict()["claimed"]


def test_the_table_canary_takes_each_columns_rarest_category_and_farther_bound():
    """Rarest category, the last in schema order on ties (blue, not green); a numeric column's
    bound farther from the mean (x's mean is near 0: the canary takes 10). A frequent category
    would make a weak canary, and an audit that reads "consistent" for it."""
    from types import SimpleNamespace

    from lightning_dpgan.canary_audit import table_canary
    from lightning_dpgan.data.schema import Column, TableSchema

    schema = TableSchema((Column("x", "continuous", bounds=(0.0, 10.0), source="test"),
                          Column("color", "categorical", categories=("red", "green", "blue", "grey"), source="test")))
    frame = pd.DataFrame({"x": [0.5, 1.0, 2.0, 1.5, 0.0, 1.0],
                          "color": ["red", "red", "green", "blue", "grey", "grey"]})
    datamodule = SimpleNamespace(schema=schema, train_frame=frame, encode=schema.encode)
    assert table_canary(datamodule).description["record"] == {"x": 10.0, "color": "blue"}


def test_a_generator_that_reproduces_the_canary_exactly_is_guessed_at_a_threshold_of_zero(tiny_table, tmp_path,
                                                                                        monkeypatch):
    """Decoding clips to the bounds where the canary sits, so a leaking generator can score
    exactly 0: --threshold 0 guesses "canary" there (a distance at most the threshold)."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0)
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 4, threshold=0.0)
    assert (audit.true_positives, audit.false_positives) == (2, 0)


@pytest.mark.parametrize("share, detectable", [(0.9, True), (1.5, False)])
def test_a_claim_above_the_largest_detectable_epsilon_could_not_have_been_contradicted(
        tiny_table, tmp_path, monkeypatch, share, detectable):
    """20 trials per side bound epsilon by L at most: a claim of 1.5 L passes any outcome, and
    the audit says so; one of 0.9 L could have been caught."""
    largest = epsilon_lower_bound(20, 0, 20, 1e-6, 0.97)
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, training=(share * largest, 1e-6),
                    total=(2 * share * largest, 2e-6))
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 40, confidence=0.97, calibration_trials=2)
    report = read_json(tmp_path / AUDIT_FILE)
    assert report["largest_detectable_epsilon"] == largest
    assert report["could_detect_a_violation"] is detectable
    assert (audit.undetectable_warning() is None) is detectable


def test_trials_whose_canaries_differ_record_each_one(tiny_table, tmp_path, monkeypatch):
    """A CSV without schema file estimates each trial's bounds under DP, so each trial's canary
    is its own: audit.json described the first calibration trial's for all of them."""
    stand_in_trials(monkeypatch, lambda canary: 0.5, record=lambda seed: {"x": float(seed)})
    run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 4, calibration_trials=2)
    report = read_json(tmp_path / AUDIT_FILE)
    assert report["canary"]["record"] is None and "differs between trials" in report["canary"]["note"]
    assert [t["canary_record"] for t in report["per_trial"]] == [{"x": float(t["seed"])} for t in report["per_trial"]]
    stand_in_trials(monkeypatch, lambda canary: 0.5)
    run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path / "same", 4, calibration_trials=2)
    assert read_json(tmp_path / "same" / AUDIT_FILE)["canary"]["record"] == {"x": 1.0}


def test_an_audit_too_small_to_contradict_its_claim_says_so(tiny_table, tmp_path, monkeypatch, capsys):
    """2 trials per side can show at most 0 at 95%: "consistent" there was true by construction."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, training=(0.25, 1e-6))
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "4", "--output-dir", str(tmp_path / "small")]) == 0
    assert "could not have found a violation. Use more --trials" in capsys.readouterr().err
    report = read_json(tmp_path / "small" / AUDIT_FILE)
    assert report["largest_detectable_epsilon"] == 0.0 and report["could_detect_a_violation"] is False
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "40", "--output-dir", str(tmp_path / "large")]) == 0
    assert "could not have found" not in capsys.readouterr().err


def test_an_audit_whose_trials_took_no_generator_update_says_they_test_nothing(tiny_table, tmp_path, monkeypatch,
                                                                              capsys):
    """A trial shorter than the critic steps of one generator update scores the initial
    generator: "consistent" then said nothing of the mechanism, and only the trial's own train
    line said so, among many."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, updates=0)
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "40", "--output-dir", str(tmp_path / "none")]) == 0
    assert ("audit: warning: 40 of the 40 counted trials took no generator update, so their scores are an untrained "
            "generator's and test nothing of the mechanism") in capsys.readouterr().err
    assert read_json(tmp_path / "none" / AUDIT_FILE)["untrained_trials"] == 40
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, updates=3)
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "40", "--output-dir", str(tmp_path / "some")]) == 0
    assert "took no generator update" not in capsys.readouterr().err
    assert read_json(tmp_path / "some" / AUDIT_FILE)["untrained_trials"] == 0


def test_a_trial_whose_generator_drew_nan_is_refused(tiny_table, tmp_path, monkeypatch, capsys):
    stand_in_trials(monkeypatch, lambda canary: float("nan"))
    assert main(["audit", *dp_sgd_args(tiny_table), "--trials", "2", "--threshold", "0.5",
                 "--output-dir", str(tmp_path / "nan")]) == 2
    assert "the canary score is nan (its generator drew NaN or inf records)" in capsys.readouterr().err
    assert not (tmp_path / "nan" / AUDIT_FILE).exists()


def test_an_audits_wandb_trials_are_named_by_their_kind_and_number(tiny_table, tmp_path, monkeypatch):
    """Under --logger wandb every trial was a run named after its folder, '000', '001', ..., the
    counted trials and the calibration ones alike. Each is now named audit/kind/number, and tagged
    as an audit's trial (beside the user's own tags)."""
    from lightning_dpgan.canary_audit import run_trial

    monkeypatch.setenv("WANDB_MODE", "offline")
    names, tags = [], []

    class Stop(Exception):
        pass

    def capture(run):
        names.append(run.config["logger"]["run_name"])
        tags.append(run.config["logger"]["tags"])
        raise Stop

    for given, folder in ((None, "calibration"), ("nightly", "trials")):
        extra = ["--logger", "wandb"] + ([] if given is None else ["--wandb-name", given, "--logger.tags", "[nightly]"])
        with pytest.raises(Stop):
            run_trial(build_config(dp_sgd_args(tiny_table, *extra)), tmp_path / "my-audit" / folder / "003", True, 1, 1,
                      prepare_run=capture)
    assert names == ["my-audit/calibration/003", "nightly/trials/003"]
    assert tags == [["audit-trial"], ["nightly", "audit-trial"]]


def test_the_full_size_benchmark_refuses_an_out_dir_holding_an_audit_before_any_trial(tmp_path, monkeypatch, capsys):
    """Its trials were written over an earlier audit's."""
    from test_dev_split import load_benchmark_script

    script = load_benchmark_script("canary_audit")
    (tmp_path / "eps1_no_noise" / "trials").mkdir(parents=True)
    trained = record_calls(monkeypatch, script, "run_audit")
    monkeypatch.setattr("sys.argv", ["canary_audit.py", "--trials", "2", "--epsilons", "1", "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        script.main()
    assert stop.value.code == 2 and trained == []
    assert f"{tmp_path / 'eps1_no_noise'} holds an audit already: choose another --out-dir" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--trials", "2", "--epsilons", "1", "1.0"], "--epsilons repeats 1: give each epsilon once"),
    (["--trials", "0", "--epsilons", "1"], "--trials must be even and at least 2"),
    (["--trials", "3", "--epsilons", "1"], "--trials must be even and at least 2"),
], ids=["repeated-epsilon", "no-trials", "odd-trials"])
def test_the_full_size_benchmark_refuses_a_repeated_epsilon_or_odd_trials_before_any_output(
        tmp_path, monkeypatch, capsys, argv, message):
    """1 and 1.0 share one folder: the second audit wrote its trials over the first's while the
    table printed both. An odd --trials stopped the first audit with a traceback, after the data."""
    from test_dev_split import load_benchmark_script

    script = load_benchmark_script("canary_audit")
    trained = record_calls(monkeypatch, script, "run_audit")
    monkeypatch.setattr("sys.argv", ["canary_audit.py", *argv, "--out-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as stop:
        script.main()
    assert stop.value.code == 2 and trained == [] and not (tmp_path / "out").exists()
    assert message in capsys.readouterr().err


# ------------------------------------------------ the statistics, recomputed independently
def binomial_tail_at_least(k, n, p):
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def solve_increasing(f, target):
    """The p in [0, 1] where the increasing function f reaches target (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) < target else (low, middle)
    return (low + high) / 2


def exact_epsilon_lower(tp, fp, n, delta, confidence):
    """Clopper-Pearson bounds from the binomial tails themselves (not scipy's beta quantiles),
    each end at one-sided error (1 - confidence) / 4 so that all four ends hold together, then the four (epsilon, delta)-DP inequalities TPR <= e^eps FPR + delta, TNR <= e^eps FNR + delta
    and their swapped forms (FPR <= e^eps TPR + delta, FNR <= e^eps TNR + delta) solved for epsilon."""
    tail = (1 - confidence) / 4
    tpr_low = 0.0 if tp == 0 else solve_increasing(lambda p: binomial_tail_at_least(tp, n, p), tail)
    tpr_high = 1.0 if tp == n else solve_increasing(lambda p: binomial_tail_at_least(tp + 1, n, p), 1 - tail)
    fpr_low = 0.0 if fp == 0 else solve_increasing(lambda p: binomial_tail_at_least(fp, n, p), tail)
    fpr_high = 1.0 if fp == n else solve_increasing(lambda p: binomial_tail_at_least(fp + 1, n, p), 1 - tail)
    candidates = [0.0]
    for larger_low, smaller_high in ((tpr_low, fpr_high), (1 - fpr_high, 1 - tpr_low),
                                     (fpr_low, tpr_high), (1 - tpr_high, 1 - fpr_low)):
        if larger_low - delta > 0 and smaller_high > 0:
            candidates.append(math.log((larger_low - delta) / smaller_high))
    return max(candidates)


def test_an_imperfect_tests_bound_matches_an_independent_clopper_pearson_computation(tiny_table, tmp_path, monkeypatch):
    """20 counted trials per side, 15 of those with the canary and 3 of those without guessed
    "canary": the bound, at training's largest delta among the counted trials, is recomputed from
    binomial tails; the claim is the largest training epsilon among the counted trials alone
    (the calibration trials' claims, made larger here, must not count)."""
    seen = {"with": 0, "without": 0, "counted": 0}

    def run_trial(config, output_dir, with_canary, seed, samples, prepare_run=None, audit_dir=None):
        calibration = output_dir.parent.name == "calibration"
        if calibration:
            score, claim = (0.0 if with_canary else 1.0), (50.0, 0.5)
        else:
            side = "with" if with_canary else "without"
            seen[side] += 1
            seen["counted"] += 1
            score = 0.0 if seen[side] <= (15 if with_canary else 3) else 1.0
            claim = (1.0 + 0.01 * seen["counted"], 1e-6 * (1 + seen["counted"] % 3))
        canary = Canary("table", (torch.zeros(1, 2),), torch.zeros(2), {"kind": "table", "rule": "test", "record": {}})
        privacy = {"epsilon": 2 * claim[0], "delta": 2 * claim[1], "epsilon_training": claim[0], "delta_training": claim[1]}
        return TrialRun(score, privacy, canary, "add-remove")

    monkeypatch.setattr(canary_audit, "run_trial", run_trial)
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 40, confidence=0.95, calibration_trials=2)
    report = read_json(tmp_path / AUDIT_FILE)
    assert report["threshold"] == 0.5 and len(report["calibration"]) == 2
    assert (report["true_positives"], report["false_positives"], report["trials_per_side"]) == (15, 3, 20)
    assert report["delta"] == 3e-6 and report["claimed_epsilon"] == pytest.approx(1.40)
    assert report["claimed_epsilon_total"] == pytest.approx(2.80)
    expected = exact_epsilon_lower(15, 3, 20, 3e-6, 0.95)
    assert 0.1 < expected < 1.40  # a real bound (not the floor 0), below the claim
    assert report["epsilon_lower"] == pytest.approx(expected, rel=1e-6) and report["consistent"] is True
    assert report["largest_detectable_epsilon"] == pytest.approx(exact_epsilon_lower(20, 0, 20, 3e-6, 0.95), rel=1e-6)
    backwards = exact_epsilon_lower(3, 15, 20, 3e-6, 0.95)  # the wrong-way forms, recomputed the same way
    assert backwards == pytest.approx(expected) and epsilon_lower_bound(3, 15, 20, 3e-6, 0.95) == pytest.approx(backwards)
    assert audit.epsilon_lower == report["epsilon_lower"]


@pytest.mark.parametrize("confidence", [0.89, 1.0])
def test_a_confidence_outside_the_sound_range_is_refused(tiny_table, tmp_path, monkeypatch, confidence):
    stand_in_trials(monkeypatch, lambda canary: 0.0)
    with pytest.raises(ValueError, match="--confidence must be in"):
        run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 4, confidence=confidence, threshold=0.5)


def test_inserting_the_canary_keeps_every_other_record():
    """add-remove: the N records then the canary; replace-one: the first N - 1 records then the
    canary (converted to each tensor's dtype)."""
    from types import SimpleNamespace
    from torch.utils.data import TensorDataset

    records, labels = torch.arange(8, dtype=torch.float32).view(4, 2), torch.tensor([0, 1, 2, 3])
    canary = Canary("image", (torch.tensor([[9.0, 9.0]], dtype=torch.float64), torch.tensor([7])), torch.zeros(2), {})
    for neighbours, kept in (("add-remove", 4), ("replace-one", 3)):
        datamodule = SimpleNamespace(train_dataset=TensorDataset(records, labels))
        index = insert_canary(datamodule, canary, neighbours)
        new_records, new_labels = datamodule.train_dataset.tensors
        assert index == kept and len(new_records) == kept + 1 and new_records.dtype == torch.float32
        assert torch.equal(new_records[:kept], records[:kept]) and torch.equal(new_labels[:kept], labels[:kept])
        assert new_records[index].tolist() == [9.0, 9.0] and new_labels[index] == 7
    with pytest.raises(ValueError, match="unknown neighbouring relation"):
        insert_canary(SimpleNamespace(train_dataset=TensorDataset(records, labels)), canary, "add-one")
    with pytest.raises(ValueError, match="the canary has 2 tensors, the training split 1"):
        insert_canary(SimpleNamespace(train_dataset=TensorDataset(records)), canary, "add-remove")


def test_a_table_canary_is_scored_in_min_max_space_and_takes_whole_integer_bounds():
    """The integer column's public bounds (0.5, 9.7) hold the whole numbers 1..9: the canary takes
    9, a value the column can hold. Its score is the Euclidean distance, in the schema's min-max /
    one-hot space, to the nearest decoded record, recomputed here by hand."""
    from types import SimpleNamespace

    from lightning_dpgan.canary_audit import canary_distances, table_canary
    from lightning_dpgan.data.schema import Column, TableSchema

    schema = TableSchema((Column("n", "integer", bounds=(0.5, 9.7), source="test"),
                          Column("x", "continuous", bounds=(0.0, 10.0), source="test"),
                          Column("c", "categorical", categories=("a", "b"), source="test")))
    frame = pd.DataFrame({"n": [1, 2, 1], "x": [9.0, 8.0, 9.0], "c": ["a", "a", "b"]})
    datamodule = SimpleNamespace(schema=schema, train_frame=frame, encode=schema.encode, decode=schema.decode)
    canary = table_canary(datamodule)
    assert canary.description["record"] == {"n": 9, "x": 0.0, "c": "b"}
    rows = pd.DataFrame({"n": [9, 1], "x": [4.0, 0.0], "c": ["b", "a"]})
    encoded, _ = schema.encode(rows)
    module = SimpleNamespace(eval=lambda: None, sample=lambda n: encoded[:n])
    distances = canary_distances(module, datamodule, canary, 2, seed=0)
    # n in (0.5, 9.7): 9 and 1 sit at (9 - 0.5) / 9.2 and (1 - 0.5) / 9.2; x at x / 10; c one-hot
    expected = [0.4, math.sqrt((8 / 9.2) ** 2 + 1 + 1)]
    assert distances.tolist() == pytest.approx(expected)


@pytest.mark.parametrize("trials, calibration", [(12, 6), (4, 2), (10, 4)])
def test_by_default_half_as_many_calibration_trials_choose_the_threshold(tiny_table, tmp_path, monkeypatch, trials,
                                                                         calibration):
    """Half the counted trials rounded down to an even number, at least 2 (--calibration-trials'
    help), and run as well as counted: none of them counted."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0)
    run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, trials)
    report = read_json(tmp_path / AUDIT_FILE)
    assert len(report["calibration"]) == calibration and report["trials"] == len(report["per_trial"]) == trials
    assert [t["canary"] for t in report["calibration"]].count(True) == calibration // 2
    assert "chosen on %d separate calibration trials" % calibration in report["threshold_rule"]


def test_a_violation_never_reads_as_two_equal_figures():
    """The lower bound was printed to 3 decimals and the claim to 4 significant digits: a bound of
    1.02190 above a claim of 1.0219 read "1.022 vs 1.022: VIOLATION"."""
    from types import SimpleNamespace

    from lightning_dpgan.canary_audit import CanaryAudit

    def summary(lower, claimed, confidence=0.95):
        audit = SimpleNamespace(claimed_epsilon=claimed, epsilon_lower=lower, consistent=lower <= claimed, delta=1e-5,
                                confidence=confidence, true_positives=12, false_positives=0, trials_per_side=12,
                                largest_detectable_epsilon=1.022)
        return CanaryAudit.summary(audit)

    assert "epsilon_lower 1.021904 vs training's claimed 1.0219 " in summary(1.021904, 1.0219)
    assert "epsilon_lower 0.844 vs training's claimed 0.25 " in summary(0.844, 0.25)
    assert "epsilon_lower 0.2 vs training's claimed 0.25 " in summary(0.2, 0.25) and "consistent" in summary(0.2, 0.25)
    assert "(delta 1e-05, 95% confidence;" in summary(0.2, 0.25)
    assert "(delta 1e-05, 99.9% confidence;" in summary(0.2, 0.25, confidence=0.999)  # it read "100%"
    assert "(delta 1e-05, 99.995% confidence;" in summary(0.2, 0.25, confidence=0.99995)


def test_an_unbounded_training_claim_reads_unbounded_not_infinity(tiny_table, tmp_path, monkeypatch):
    """A trial whose training epsilon is infinite claims nothing: the claim is None (null in
    audit.json, "unbounded" in the summary), never contradicted, and no warning about the trial
    count is printed for it."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, training=(math.inf, 1e-6))
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 4, threshold=0.5)
    assert audit.claimed_epsilon is None and audit.consistent and not audit.could_detect_a_violation
    assert "vs training's claimed unbounded" in audit.summary() and audit.undetectable_warning() is None
    assert read_json(tmp_path / AUDIT_FILE)["claimed_epsilon"] is None


def test_run_audit_defaults_to_20_trials_at_95_percent_confidence(tiny_table, tmp_path, monkeypatch):
    """The documented defaults (module docstring, --help): 20 counted trials, 95 % confidence."""
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0)
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, threshold=0.5)
    assert audit.confidence == 0.95 and len(audit.trials) == 20 and audit.trials_per_side == 10
    assert audit.to_dict()["confidence"] == 0.95
    args = audit_parser().parse_args([])
    assert (args.trials, args.confidence, args.samples, args.threshold) == (20, 0.95, 2000, None)


def test_a_claim_exactly_at_the_largest_detectable_epsilon_is_consistent_and_undetectable(tiny_table, tmp_path,
                                                                                            monkeypatch):
    """A perfect test shows epsilon_lower = L; a claim of exactly L is met (epsilon_lower <= claim),
    and no outcome of these trials could have contradicted it."""
    largest = epsilon_lower_bound(20, 0, 20, 1e-6, 0.97)
    stand_in_trials(monkeypatch, lambda canary: 0.0 if canary else 1.0, training=(largest, 1e-6), total=(2 * largest, 2e-6))
    audit = run_audit(build_config(dp_sgd_args(tiny_table)), tmp_path, 40, confidence=0.97, calibration_trials=2)
    assert audit.epsilon_lower == audit.claimed_epsilon == largest
    assert audit.consistent is True and "VIOLATION" not in audit.summary()
    assert audit.could_detect_a_violation is False and audit.undetectable_warning() is not None


class _Stop(Exception):
    """Raised by the prepare_run hook: what is checked is set before training."""


def _trial_start(config, output_dir, with_canary, seed):
    """What a trial's run holds just before it would train: its training records and the
    generator's initial weights."""
    seen = {}

    def capture(run):
        seen["records"] = len(run.datamodule.train_dataset)
        seen["weights"] = torch.cat([p.detach().flatten().clone() for p in run.module.parameters()])
        raise _Stop

    with pytest.raises(_Stop):
        canary_audit.run_trial(config, output_dir, with_canary, seed, 1, prepare_run=capture)
    return seen


def test_each_trial_trains_from_its_own_seed(tiny_table, tmp_path):
    """Every trial is a fresh draw (run_audit gives each a distinct seed): a trial's networks start
    from its seed, not from the audit's --seed, or all trials would be copies of one run and the
    Clopper-Pearson bound, which assumes independent trials, would not hold."""
    config = build_config(dp_sgd_args(tiny_table, "--seed", "0"))
    a = _trial_start(config, tmp_path / "a", False, 11)
    b = _trial_start(config, tmp_path / "b", False, 12)
    again = _trial_start(config, tmp_path / "c", False, 11)
    assert torch.equal(a["weights"], again["weights"])
    assert not torch.equal(a["weights"], b["weights"])


def test_a_trial_holds_the_canary_exactly_when_asked(tiny_table, tmp_path):
    config = build_config(dp_sgd_args(tiny_table))
    assert _trial_start(config, tmp_path / "in", True, 3)["records"] == TRAIN_RECORDS + 1  # dp-sgd: add/remove
    assert _trial_start(config, tmp_path / "out", False, 3)["records"] == TRAIN_RECORDS


def test_the_canary_score_depends_on_its_seed_alone_not_on_the_global_random_state():
    """The membership score draws its samples from ``seed``: the same trial scored twice, whatever
    ran in between, gives the same score."""
    class Sampler(torch.nn.Module):
        num_classes = None

        def sample(self, n, labels=None):
            return torch.randn(n, 1, 2, 2)

    canary = canary_audit.Canary("image", (torch.zeros(1, 1, 2, 2),), torch.zeros(4), {})
    module = Sampler()
    first = canary_score(module, None, canary, 5, seed=3)
    torch.rand(7)  # anything else drawing from torch's generator in between
    assert canary_score(module, None, canary, 5, seed=3) == first
    assert canary_score(module, None, canary, 5, seed=4) != first


def test_on_tied_calibration_scores_the_middle_of_all_best_candidates_is_taken_the_lowest_included():
    """The candidates run from below every score (guess nothing) to above every one (guess all).
    Canary scores above the others give TPR - FPR = 0 at best, at -1 (below all), 2.5 and 5
    (above all): the middle one, 2.5, is the threshold."""
    assert choose_threshold([2.0, 4.0], [1.0, 3.0]) == pytest.approx(2.5)


def test_an_infinite_threshold_is_refused_before_any_trial(tiny_table, tmp_path, monkeypatch):
    """--threshold inf would guess "canary" for every trial: a test that decides nothing (TP = FP),
    reported as an audit. It is refused like NaN and negative distances."""
    stand_in_trials(monkeypatch, lambda with_canary: 0.0)
    config = build_config(dp_sgd_args(tiny_table))
    with pytest.raises(ValueError, match="a finite number from 0, got inf"):
        canary_audit.run_audit(config, tmp_path / "audit", trials=2, threshold=float("inf"))
    assert not (tmp_path / "audit").exists()


def test_an_audit_refuses_resume_before_any_trial(tiny_table, tmp_path, monkeypatch):
    """Every trial must train from scratch on its own seed: resuming each from one checkpoint
    would make the trials dependent and their networks not trained on the trial's data alone."""
    from lightning_dpgan.config import ConfigError

    stand_in_trials(monkeypatch, lambda with_canary: 0.0)
    config = build_config(dp_sgd_args(tiny_table))
    config["resume"] = str(tmp_path / "last.ckpt")
    with pytest.raises(ConfigError, match="--resume makes no sense in an audit"):
        canary_audit.run_audit(config, tmp_path / "audit", trials=2, threshold=0.5)
