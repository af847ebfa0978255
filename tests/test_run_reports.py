"""What ``train`` reports and refuses around the run itself (run.py): the privacy report of a
private run, the length a resume given no ``--max-steps`` gets, the figure an untrained
generator's warning gives, what config.yaml and metrics.json keep, and rank 0's release check."""
import csv
import shutil
from pathlib import Path
from types import SimpleNamespace

import json

import pandas as pd
import pytest
import torch
import yaml

from lightning_dpgan.callbacks.same_release import SameRelease, release_digest
from lightning_dpgan.cli import build_config, main
from lightning_dpgan.config import ConfigError
from lightning_dpgan.modules.base import CHECKPOINT_KEY
from lightning_dpgan.run import DEFAULT_MAX_STEPS, RANK_ZERO_RELEASE, Run
from lightning_dpgan.sampling import read_run_info
from run_helpers import read_json, tiny_run_args

ADULT_TINY = Path(__file__).parent / "fixtures" / "adult_tiny"


def test_a_private_runs_report_holds_its_lineage_as_the_checkpoint_does(tiny_image_data_dir, tmp_path):
    """A private run's privacy.json names the runs its training went through, as a non-private
    run's does: two branches resumed from one checkpoint must be told apart by their reports,
    and it is the private reports whose epsilon a reader adds up."""
    out = tmp_path / "private"
    assert main(tiny_run_args(tiny_image_data_dir, out, model="wgan", steps=2) + [
        "--privacy", "dp-sgd", "--epsilon", "5"]) == 0
    report = read_json(out / "privacy.json")
    assert report["mechanism"] != "none" and report["epsilon"] is not None  # a private report indeed
    lineage = report["lineage"]
    assert len(lineage) == 1 and lineage[0]["from_step"] == 0
    assert read_run_info(out / "checkpoints" / "last.ckpt")["lineage"] == lineage


def test_a_run_with_its_noise_set_that_left_most_of_its_budget_says_epsilon_was_a_ceiling(tiny_image_data_dir,
                                                                                          tmp_path, capsys):
    """dpctgan's preset sets sigma 5 on a CSV: --epsilon 3 ended at 1.3 with no word that the
    epsilon was only a ceiling, or that --privacy.noise_multiplier null calibrates sigma to it."""
    base = tiny_run_args(tiny_image_data_dir, tmp_path / "set", model="wgan", steps=2) + [
        "--privacy", "dp-sgd", "--epsilon", "5"]
    assert main(base + ["--privacy.noise_multiplier", "5"]) == 0
    err = capsys.readouterr().err
    spent = read_json(tmp_path / "set" / "privacy.json")["epsilon"]
    assert spent < 0.9 * 5 and f"the run spent {spent:.4g}" in err
    assert "noise multiplier 5 was set" in err and "--privacy.noise_multiplier null calibrates it" in err
    calibrated = [arg if arg != str(tmp_path / "set") else str(tmp_path / "calibrated") for arg in base]
    assert main(calibrated + ["--privacy.noise_multiplier", "null"]) == 0
    assert "was set" not in capsys.readouterr().err  # calibrated: it spends the budget, nothing to say
    assert read_json(tmp_path / "calibrated" / "privacy.json")["epsilon"] >= 0.9 * 5
    # resumed, the checkpoint's sigma is kept whatever the flag says: the remedy is a new run
    resumed = [arg if arg != "2" else "4" for arg in base] + [
        "--resume", str(tmp_path / "set" / "checkpoints" / "last.ckpt"), "--privacy.noise_multiplier", "null"]
    assert main(resumed) == 0
    err = capsys.readouterr().err
    assert (". A resume never calibrates the noise (it keeps the checkpoint's, or takes a --privacy.noise_multiplier "
            "given as it is), so only a new run (without --resume)") in err


def test_a_csv_runs_dp_estimated_schema_is_written_for_the_user_and_reads_back_as_a_schema_file(tmp_path, caplog):
    """The bounds and categories a DP estimate released were kept in the checkpoint alone: the
    user could not see why synthetic ages reached 128 (bounds snap outward), nor reuse the paid
    release as --data.schema. A run given a schema file writes none (nothing was estimated)."""
    import numpy as np

    rng = np.random.default_rng(0)
    csv = tmp_path / "data.csv"
    pd.DataFrame({"id": range(300), "age": rng.integers(20, 90, 300), "kind": rng.choice(["a", "b"], 300),
                  "label": rng.choice(["no", "yes"], 300)}).to_csv(csv, index=False)
    common = ["train", "--model", "gan", "--dataset", "csv", "--data.csv", str(csv), "--max-steps", "2",
              "--batch-size", "8", "--trainer.enable_progress_bar", "false", "--model.latent_dim", "4"]
    estimated = tmp_path / "estimated"
    assert main(common + ["--output-dir", str(estimated), "--data.target", "label", "--data.categorical", "kind",
                          "--data.label_kind", "binary", "--data.integer", "age", "--data.bounds_epsilon", "5",
                          "--data.drop", "id"]) == 0
    released = yaml.safe_load((estimated / "released_schema.yaml").read_text())
    assert released.pop("drop") == ["id"]  # the file's other columns: it reads back on the same file
    assert released == read_run_info(estimated / "checkpoints" / "last.ckpt")["schema"]
    reused = tmp_path / "reused"
    assert main(common + ["--output-dir", str(reused), "--data.schema", str(estimated / "released_schema.yaml")]) == 0
    assert not (reused / "released_schema.yaml").exists()  # a schema file: nothing estimated, nothing released
    assert read_run_info(reused / "checkpoints" / "last.ckpt")["schema"] == {**released, "drop": ["id"]}
    # the reused release costs this run nothing, but it is no "public schema": its estimate read these rows
    private = tmp_path / "private"
    caplog.set_level("WARNING")
    assert main([*(("dpgan" if arg == "gan" else arg) for arg in common), "--output-dir", str(private), "--epsilon", "50",
                 "--delta", "1e-3", "--data.schema", str(estimated / "released_schema.yaml")]) == 0
    schema_part = json.loads((private / "privacy.json").read_text())["preprocessing"]  # the schema alone: no modes
    assert schema_part["epsilon"] == 0 and "earlier run's DP estimate" in schema_part["mechanism"]
    assert "The rows' total is this run's plus that run's" in caplog.text


def test_a_resume_given_no_run_length_is_held_to_the_default_length():
    """With neither --max-steps nor --max-epochs (from a flag, a config file or a preset) a run
    is DEFAULT_MAX_STEPS long, resumed or not: a checkpoint already past that length would take
    no step and only rewrite its run's outputs, as a --max-steps below its steps would. Given
    --max-epochs alone, the epochs set the length and no step count is implied."""
    def check(steps_taken, **length):
        config = {"max_steps": None, "max_epochs": None, "resume": "last.ckpt", **length}
        Run._check_resume_takes_steps(SimpleNamespace(config=config, resumed_steps=steps_taken))

    check(DEFAULT_MAX_STEPS)  # equal: writes the outputs of a run cut off after its last checkpoint
    with pytest.raises(ConfigError, match=f"has taken {DEFAULT_MAX_STEPS + 1} steps and --max-steps {DEFAULT_MAX_STEPS} "):
        check(DEFAULT_MAX_STEPS + 1)
    check(DEFAULT_MAX_STEPS + 1, max_epochs=3)
    check(DEFAULT_MAX_STEPS + 1, max_steps=DEFAULT_MAX_STEPS + 2)


def test_an_untrained_generators_warning_gives_the_epsilon_its_training_spent():
    """A budget that ran out within the first step: the warning's figure is what training spent
    (of --epsilon), not the total with the data's preprocessing (a DP schema, DP modes), which
    would read as training having spent the whole budget and point at the wrong remedy."""
    strategy = SimpleNamespace(refusal="answering would spend epsilon 3.2", target_epsilon=2.0,
                               training_epsilon=lambda: 0.25, epsilon=lambda: 1.25)  # 1.0 of preprocessing
    run = SimpleNamespace(module=SimpleNamespace(hparams={}, train_steps=0, generator_updates=0), strategy=strategy,
                          quail=None)
    reason = Run.untrained_reason(run)
    assert "ran out within the first step (answering would spend epsilon 3.2; epsilon 0.25 spent on training, " \
           "of --epsilon 2)" in reason and "quail" not in reason
    run.quail = SimpleNamespace(split=0.5)  # the label model took half: a smaller share leaves training more
    assert "raise --epsilon, or leave the synthesizer more of it (a --quail-split below 0.5" in Run.untrained_reason(run)


def test_rank_zero_of_a_new_ddp_run_checks_that_every_process_read_its_release(tmp_path, monkeypatch):
    """Rank 0 writes its preprocessing release (the schema, and any DP bounds or modes) for the other
    processes, and checks (SameRelease, at setup) that each read those very bytes, not a file an
    interrupted run left: without rank 0's part in that collective the others wait on it for ever
    (a real two-process run hangs), or two ranks train on two releases. Built in one process."""
    run = Run(build_config(["--model", "gan", "--dataset", "adult", "--data-dir", str(ADULT_TINY), "--accelerator", "cpu",
                            "--devices", "2", "--strategy", "ddp"]), tmp_path)
    written = []
    monkeypatch.setattr(run, "_fit_and_write", lambda: written.append((tmp_path / RANK_ZERO_RELEASE).read_bytes()))
    run.fit()
    (content,) = written
    checks = [callback for callback in run.trainer.callbacks if isinstance(callback, SameRelease)]
    assert len(checks) == 1 and checks[0].digest == release_digest(content)
    assert checks[0].release_file == RANK_ZERO_RELEASE


def test_config_yaml_keeps_the_data_dir_given_over_the_environments(tiny_image_data_dir, tmp_path, monkeypatch):
    """$LIGHTNING_DPGAN_DATA_DIR is recorded only where no --data-dir was given: a run told to read
    one folder must not have its config.yaml name another, which --config and evaluate would read."""
    given = tmp_path / "given"
    shutil.copytree(tiny_image_data_dir, given)
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(tiny_image_data_dir))
    assert main(tiny_run_args(given, tmp_path / "run", steps=1)) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["data_dir"]
    assert saved == str(given.resolve())


def test_a_sigterm_says_what_the_checkpoint_holds_in_one_process_and_in_several(tmp_path):
    """One process saves its last steps, with the accountant, on SIGTERM; under DDP the checkpoint
    holds only its last periodic save, and before the first there is none: the line sent the user
    to --resume a file that did not exist, and said 610 steps of a checkpoint holding 600."""
    def said(world_size, resume=None):
        run = SimpleNamespace(output_dir=tmp_path, trainer=SimpleNamespace(world_size=world_size),
                              module=SimpleNamespace(train_steps=7, run_info={}),
                              config={"checkpoint_every_n_steps": 5, "resume": resume})
        return Run.terminated_sentence(run)

    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert said(1).startswith(f"stopped by SIGTERM after 7 steps: {checkpoint} holds them, with the privacy accountant;")
    (tmp_path / "config.yaml").write_text("model: {name: gan}\n")
    assert said(2) == (f"stopped by SIGTERM after 7 steps, before its first periodic checkpoint (every "
                       f"--checkpoint_every_n_steps 5 steps; several processes save none as they stop): there is nothing "
                       f"to continue. Train again with: python -m lightning_dpgan train --config {tmp_path / 'config.yaml'} --output-dir "
                       f"{tmp_path} --overwrite")
    # a resume into a new folder, stopped before its first save: rerun from the checkpoint it resumed
    # (config.yaml keeps no --resume), or training would start afresh and spend the budget again
    assert said(2, resume="earlier/last.ckpt").endswith(
        f"--config {tmp_path / 'config.yaml'} --resume earlier/last.ckpt --output-dir {tmp_path} --overwrite")
    checkpoint.parent.mkdir()
    torch.save({CHECKPOINT_KEY: {"format": 1, "train_steps": 5, "run": {"model": "gan"}}}, checkpoint)
    assert said(2).startswith(f"stopped by SIGTERM after 7 steps: {checkpoint} holds 5 of them, its last periodic save, "
                              "with the privacy accountant;")
    assert f"--resume {checkpoint}" in said(2)


def test_metrics_hold_every_processs_step_count():
    """Under DDP every process must stop at the same step: metrics.json's steps_per_rank is what
    each rank counted (gathered at the end of training), not rank 0's count repeated, or a rank
    that stopped elsewhere would go unseen. A run that never reached the end (no gather) has its own."""
    gathered = torch.tensor([[5], [4]])  # as all_gather stacks each rank's tensor
    trainer = SimpleNamespace(strategy=SimpleNamespace(all_gather=lambda tensor: gathered))
    run = SimpleNamespace(steps_per_rank=None)
    Run._count_steps_per_rank(run, trainer, SimpleNamespace(train_steps=5, device=torch.device("cpu")))
    assert run.steps_per_rank == [5, 4]

    def metrics(steps_per_rank):
        run = SimpleNamespace(trainer=SimpleNamespace(callback_metrics={}), strategy=None, steps_per_rank=steps_per_rank,
                              module=SimpleNamespace(train_steps=5), datamodule=SimpleNamespace(train_dataset=range(160)))
        return Run.metrics(run, 1.5)

    assert metrics([5, 4])["steps_per_rank"] == [5, 4]
    assert metrics(None)["steps_per_rank"] == [5]
    assert metrics(None)["train_records"] == 160 and metrics(None)["wall_time_s"] == 1.5


def test_a_table_run_writes_no_sample_grids_and_the_rows_asked_for(tmp_path):
    """--sample_every_n_steps draws image grids: a table run (a preset or a config file may carry
    the setting) writes none, and its synthetic.csv holds --num_synthetic rows, not one per
    training record."""
    out = tmp_path / "table"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(ADULT_TINY), "--output-dir", str(out),
                 "--max-steps", "2", "--batch-size", "16", "--accelerator", "cpu", "--trainer.enable_progress_bar", "false",
                 "--sample_every_n_steps", "1", "--num_synthetic", "37"]) == 0
    assert not list(out.rglob("*.png"))
    with open(out / "synthetic.csv", newline="") as table:
        assert len(list(csv.DictReader(table))) == 37
    assert read_json(out / "metrics.json")["train_records"] != 37  # the count asked for, not the records'


def test_a_synthetic_table_missing_a_label_class_is_warned_of_at_train(tmp_path, capsys):
    """One synthetic row holds one of Adult's two income classes: a classifier trained on it
    predicts that class alone. evaluate said so; train, which wrote the table, said nothing."""
    out = tmp_path / "one-row"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(ADULT_TINY), "--output-dir", str(out),
                 "--max-steps", "1", "--batch-size", "16", "--accelerator", "cpu", "--trainer.enable_progress_bar", "false",
                 "--num_synthetic", "1"]) == 0
    held = pd.read_csv(out / "synthetic.csv")["income"].astype(str).tolist()
    missing = ({"<=50K", ">50K"} - set(held)).pop()
    warning = next(line for line in capsys.readouterr().err.splitlines() if "synthetic.csv's label" in line)
    assert f"'income' holds 1 of its 2 classes ({held[0]}; none of {missing})" in warning
    assert "AUROC is 0.5 by construction" in warning


def test_the_missing_label_class_warning_counts_every_chunk_and_needs_a_categorical_label():
    """The classes are counted over every chunk written (a class first seen in the last chunk is
    held), and a continuous label or none has no classes to miss."""
    from lightning_dpgan.data.schema import Column, TableSchema

    label = Column("y", "categorical", categories=("a", "b", "c"))
    schema = TableSchema((Column("x", "continuous", bounds=(0.0, 1.0)), label), label="y", label_kind="categorical")
    chunks = [pd.DataFrame({"x": [0.1, 0.2], "y": ["a", "a"]}), pd.DataFrame({"x": [0.3], "y": ["c"]})]
    run = SimpleNamespace(datamodule=SimpleNamespace(schema=schema), synthetic_label_counts=None)
    assert [len(chunk) for chunk in Run._counting_label_classes(run, iter(chunks))] == [2, 1]
    assert run.synthetic_label_counts == {"a": 2, "b": 0, "c": 1}
    assert "'y' holds 2 of its 3 classes (a, c; none of b)" in Run.missing_label_classes_warning(run)
    assert "by construction" not in Run.missing_label_classes_warning(run)
    list(Run._counting_label_classes(run, iter(chunks + [pd.DataFrame({"x": [0.4], "y": ["b"]})])))
    assert Run.missing_label_classes_warning(run) is None
    continuous = TableSchema((Column("x", "continuous", bounds=(0.0, 1.0)),), label="x", label_kind="continuous")
    run = SimpleNamespace(datamodule=SimpleNamespace(schema=continuous), synthetic_label_counts=None)
    list(Run._counting_label_classes(run, iter([pd.DataFrame({"x": [0.5]})])))
    assert run.synthetic_label_counts is None and Run.missing_label_classes_warning(run) is None


def test_a_resumed_runs_config_yaml_neither_resumes_nor_overwrites_when_reused(tiny_image_data_dir, tmp_path):
    """config.yaml is for rerunning with --config: --resume and --overwrite belong to the command
    that gave them. Kept there, a new run from the file would silently go on from the old
    checkpoint (its steps and budget spent), or replace whatever folder it was pointed at."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(tiny_run_args(tiny_image_data_dir, first, steps=1)) == 0
    assert main(tiny_run_args(tiny_image_data_dir, second, steps=2) + [
        "--resume", str(first / "checkpoints" / "last.ckpt"), "--overwrite"]) == 0
    saved = yaml.safe_load((second / "config.yaml").read_text())
    assert saved["max_steps"] == 2  # the resumed run's own file indeed
    assert "resume" not in saved and "overwrite" not in saved
    again = build_config(["--config", str(second / "config.yaml"), "--output-dir", str(tmp_path / "again")])
    assert again["resume"] is None and again["overwrite"] is False


def test_the_guarantee_sentence_says_where_the_reports_own_keys_take_the_figure_back():
    """Each key that makes epsilon no guarantee (shuffled batches, segments stopped on the votes,
    an audit's trial) adds its caveat; an unbounded epsilon is said as such, not as no figure."""
    from lightning_dpgan.run import guarantee_statement

    base = {"epsilon": 1.5, "delta": 1e-5, "neighbours": "add-remove"}
    plain = guarantee_statement(base, image=False)
    assert plain.startswith("(1.5, 1e-05)-differential privacy of what the run releases")
    assert "against one record added to or removed from the training records" in plain and "Not for release" not in plain
    assert "its batches were shuffled" in guarantee_statement({**base, "sampling": "shuffle"}, image=False).lower()
    assert "Segments of it stopped on the votes" in guarantee_statement({**base, "segments_stopped_on_the_votes": [0]},
                                                                        image=False)
    assert "It is audit trial 3: not for release" in guarantee_statement({**base, "audit_trial": "audit trial 3"},
                                                                         image=False)
    assert "fast_dev_run, a check of the code: not a run to publish" in guarantee_statement(
        {**base, "stopped_by": "fast-dev-run"}, image=False)
    assert guarantee_statement({**base, "epsilon": None}, image=False) == \
        "epsilon is unbounded: this run gives no (epsilon, delta) guarantee."
    # printed shorter than proven, a figure is rounded up: 4.99133 read "(4.991, ...)", less loss than spent
    assert guarantee_statement({**base, "epsilon": 4.99133}, image=False).startswith("(4.992, 1e-05)-differential")
    assert guarantee_statement({**base, "epsilon": 0.1 + 0.2, "delta": 5e-6 + 5e-6},  # float noise: as printed
                               image=False).startswith("(0.3, 1e-05)-differential")
