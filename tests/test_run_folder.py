"""A folder that holds a run (``lightning_dpgan.run_folder``): refused unless continued or
replaced on purpose, its files set aside into ``previous*/`` and never deleted, put back when
the new run is refused before training, and a continued run's step log kept whole."""
import re
from pathlib import Path

import pandas as pd
import pytest

from lightning_dpgan import run_folder
from lightning_dpgan.config import ConfigError
from lightning_dpgan.run_folder import (
    LAST_CHECKPOINT,
    STEP_LOG,
    audit_started,
    check_audit_dir,
    check_output_dir,
    continues_run_in,
    held_run_files,
    prepend_earlier_steps,
    remove_audit_trials,
    restore_outputs,
    set_aside_outputs,
)


def plant_run(folder, tag="first"):
    """A finished run's files, each holding ``tag``."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / LAST_CHECKPOINT).write_text(f"{tag} checkpoint")
    for name in ("privacy.json", "config.yaml", "synthetic.csv"):
        (folder / name).write_text(f"{tag} {name}")
    (folder / "logs").mkdir()
    (folder / STEP_LOG).write_text("step,loss\n0,1.0\n")
    return folder


def test_each_file_a_run_writes_marks_its_folder_but_logs_alone_do_not(tmp_path):
    for name in ("checkpoints", "privacy.json", "config.yaml", "metrics.json", "synthetic.csv", "samples.png"):
        folder = tmp_path / name.replace(".", "-")
        folder.mkdir()
        (folder / name).write_text("x")
        assert held_run_files(folder) == [name]
        with pytest.raises(ConfigError, match=f"already holds a run's files \\({name}\\)"):
            check_output_dir(folder, None, False)
    refused_before_training = tmp_path / "logs-only"
    (refused_before_training / "logs").mkdir(parents=True)
    check_output_dir(refused_before_training, None, False)  # not a run: nothing to refuse
    check_output_dir(tmp_path / "missing", None, False)


def test_resuming_a_copied_run_whose_settings_name_the_original_says_how_to_continue_the_copy(tmp_path):
    """``--config COPY/config.yaml --resume COPY/checkpoints/last.ckpt``: the copied settings name
    the original folder, whose own continuation the refusal offered, not the copy's."""
    original, copy = plant_run(tmp_path / "original"), plant_run(tmp_path / "copy", tag="copied")
    with pytest.raises(ConfigError) as refused:
        check_output_dir(original, str(copy / LAST_CHECKPOINT), False)
    assert str(refused.value).endswith(f"To continue the run of --resume {copy / LAST_CHECKPOINT} in its own folder, "
                                       f"give --output-dir {copy}")
    stray = tmp_path / "stray.ckpt"  # a checkpoint outside a run folder: no folder to offer
    stray.write_text("weights")
    with pytest.raises(ConfigError) as refused:
        check_output_dir(original, str(stray), False)
    assert "in its own folder" not in str(refused.value)


def test_a_link_to_nothing_and_a_folder_that_cannot_be_written_are_named_before_training(tmp_path, monkeypatch):
    """A dangling link read "cannot be made (File exists)"; a read-only folder failed after
    Lightning's banner with the raw OS error of the first file written."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=rf"--output-dir {link} is a link to {tmp_path / 'gone'}, which does not exist"):
        check_output_dir(link, None, False)
    (tmp_path / "gone").mkdir()
    check_output_dir(link, None, False)  # the folder it points to exists now
    locked = tmp_path / "locked"
    locked.mkdir()
    # root writes anywhere, so the permission is not chmod's here: the check asks os.access
    monkeypatch.setattr(run_folder.os, "access", lambda path, mode: Path(path) != locked)
    with pytest.raises(ConfigError, match=f"--output-dir {locked} is a folder you cannot write in"):
        check_output_dir(locked, None, False)
    check_output_dir(tmp_path / "writable", None, False)


def test_the_folder_the_private_records_are_read_from_is_refused_as_output(tmp_path, monkeypatch):
    """A run folder is what gets published; the raw data beside its synthetic.csv, or in a
    subfolder of it, is one copy away from being published with it. A run folder inside the
    data folder publishes nothing of it."""
    data = tmp_path / "data"
    (data / "raw").mkdir(parents=True)
    for name in ("records.csv", "schema.yaml", "raw/records.csv"):
        (data / name).write_text("x\n")
    for flag, path in (("--data-dir", str(data)), ("--data.csv", str(data / "records.csv")),
                       ("$LIGHTNING_DPGAN_DATA_DIR", f"{data}/")):
        with pytest.raises(ConfigError, match=rf"--output-dir {data} is the folder the private records are read "
                                              rf"from \({re.escape(flag)} {data}\)"):
            check_output_dir(data, None, False, {flag: path})
    for flag, path in (("--data.csv", str(data / "raw" / "records.csv")), ("--data-dir", str(data / "raw"))):
        with pytest.raises(ConfigError, match=rf"--output-dir {data} holds the folder the private records are read "
                                              rf"from \({flag} {data / 'raw'}\)"):
            check_output_dir(data, None, False, {flag: path})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="is the folder the private records are read from"):
        check_output_dir(Path("data"), None, False, {"--data.csv": "data/records.csv"})  # relative, same folder
    with pytest.raises(ConfigError, match="holds the folder the private records are read from"):
        check_output_dir(Path("."), None, False, {"--data-dir": "data"})
    check_output_dir(data / "runs", None, False, {"--data-dir": str(data)})
    check_output_dir(tmp_path / "elsewhere", None, False, {"--data.csv": str(data / "records.csv")})
    check_output_dir(data, None, False, {"--data.schema": str(data / "schema.yaml")})  # public: may sit there
    # a link in the run folder to data kept elsewhere: copied along by zip -r or rsync -L
    (tmp_path / "secure").mkdir()
    (tmp_path / "secure" / "records.csv").write_text("x\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "data").symlink_to(tmp_path / "secure")
    with pytest.raises(ConfigError, match=f"--output-dir {project} holds the folder the private records are read"):
        check_output_dir(project, None, False, {"--data.csv": str(project / "data" / "records.csv")})


def test_the_data_read_is_named_by_its_option(monkeypatch):
    """The CSV's files; --data-dir, else the environment's folder for a built-in dataset (a CSV run reads none)."""
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", "/srv/data")
    assert run_folder.data_inputs({"name": "mnist", "data_dir": "/mine"}) == {"--data-dir": "/mine"}
    assert run_folder.data_inputs({"name": "mnist"}) == {"$LIGHTNING_DPGAN_DATA_DIR": "/srv/data"}
    assert run_folder.data_inputs({"name": "csv", "csv": "/srv/data/x.csv", "schema": "s.yaml"}) == {
        "--data.csv": "/srv/data/x.csv", "--data.schema": "s.yaml"}
    assert run_folder.data_inputs({"name": "csv", "csv": 2020}) == {}  # refused as a setting, later
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR")
    assert run_folder.data_inputs({"name": "mnist"}) == {}


def test_a_run_is_continued_only_from_its_own_last_checkpoint(tmp_path, monkeypatch):
    run = plant_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    assert continues_run_in(run, "run/checkpoints/last.ckpt")  # a relative path to the same file
    check_output_dir(run, "run/checkpoints/last.ckpt", False)
    (run / "previous" / "checkpoints").mkdir(parents=True)
    for other in (str(run / "previous" / LAST_CHECKPOINT), None, ""):
        assert not continues_run_in(run, other)
        with pytest.raises(ConfigError, match=r"continue it with python -m lightning_dpgan train --config .*config.yaml --resume"):
            check_output_dir(run, other, False)


def test_overwrite_refuses_to_move_away_the_checkpoint_it_resumes(tmp_path):
    run = plant_run(tmp_path / "run")
    (run / "checkpoints" / "epoch-1.ckpt").write_text("older")
    with pytest.raises(ConfigError, match="which --overwrite moves to previous/"):
        check_output_dir(run, str(run / "checkpoints" / "epoch-1.ckpt"), True)
    check_output_dir(run, str(tmp_path / "elsewhere.ckpt"), True)  # outside the folder: fine
    (run / "previous").mkdir()
    check_output_dir(run, str(run / "previous" / "last.ckpt"), True)  # previous/ is not moved


def test_overwrite_refuses_to_move_away_the_data_a_run_would_read(tmp_path, monkeypatch):
    """Training on a replaced run's own synthetic.csv (or a schema file kept in its report/):
    --overwrite moved the file to previous/ first, and the run then said the file was not found."""
    run = plant_run(tmp_path / "run")
    (run / "report").mkdir()
    for flag, path, where in (("--data.csv", run / "synthetic.csv", f"is {run / 'synthetic.csv'}"),
                              ("--data.schema", run / "report" / "schema.yaml", f"is in {run / 'report'}")):
        with pytest.raises(ConfigError, match=rf"{flag} {path} {where}, which --overwrite moves to previous/"):
            check_output_dir(run, None, True, {flag: str(path)})
    monkeypatch.setenv("HOME", str(tmp_path))  # a path the shell did not expand, as the datamodule does
    with pytest.raises(ConfigError, match="which --overwrite moves to previous/"):
        check_output_dir(run, None, True, {"--data.csv": "~/run/synthetic.csv"})
    check_output_dir(run, None, True, {"--data.csv": str(tmp_path / "data.csv")})  # outside the folder: fine
    # continuing the run moves its outputs, not its checkpoints: a file among those stays where it is
    continued = str(run / LAST_CHECKPOINT)
    check_output_dir(run, continued, True, {"--data.schema": str(run / "checkpoints" / "schema.yaml")})
    with pytest.raises(ConfigError, match="--data.csv .* which the run moves"):  # a continuation, --overwrite or not
        check_output_dir(run, continued, True, {"--data.csv": str(run / "synthetic.csv")})


def test_a_folder_set_aside_without_overwrite_keeps_the_data_a_run_would_read(tmp_path):
    """Outputs are set aside in any existing folder, not only a replaced run's: a CSV kept in the
    logs/ of a run refused before training, or a continued run's own synthetic.csv, was moved to
    previous/ and then reported 'not found' (the check ran with --overwrite only)."""
    refused_before_training = tmp_path / "logs-only"
    (refused_before_training / "logs").mkdir(parents=True)
    data = refused_before_training / "logs" / "data.csv"
    with pytest.raises(ConfigError, match=rf"--data.csv {data} is in {refused_before_training / 'logs'}, which the run moves"):
        check_output_dir(refused_before_training, None, False, {"--data.csv": str(data)})
    new = tmp_path / "new"  # nothing there to move: a missing file is the datamodule's to name
    check_output_dir(new, None, False, {"--data.csv": str(new / "logs" / "data.csv")})
    run = plant_run(tmp_path / "run")
    with pytest.raises(ConfigError, match="--data.csv .* which the run moves to previous/"):
        check_output_dir(run, str(run / LAST_CHECKPOINT), False, {"--data.csv": str(run / "synthetic.csv")})


def test_a_data_file_setting_of_the_wrong_kind_reaches_its_own_refusal_past_the_overwrite_check(tmp_path, capsys):
    """--data.csv 2020 arrives as a number: the check of the files --overwrite would move must not
    stop on it with a traceback, but leave it to the settings' check, which says how to quote it."""
    from lightning_dpgan.cli import main

    run = plant_run(tmp_path / "run")
    assert main(["train", "--model", "gan", "--dataset", "csv", "--data.csv", "2020", "--data.target", "y",
                 "--data.label_kind", "binary", "--output-dir", str(run), "--overwrite"]) == 2
    assert "data.csv must be" in capsys.readouterr().err
    assert (run / "privacy.json").read_text() == "first privacy.json"  # nothing moved


def test_reused_folders_set_aside_into_fresh_previous_folders_and_lose_nothing(tmp_path):
    run = plant_run(tmp_path / "run", "first")
    first = set_aside_outputs(run, continued=False)
    assert first == run / "previous"
    assert (first / "privacy.json").read_text() == "first privacy.json" and (first / LAST_CHECKPOINT).is_file()
    assert held_run_files(run) == []
    plant_run(run, "second")
    second = set_aside_outputs(run, continued=True)  # a continued run keeps its checkpoints
    assert second == run / "previous-2" and (run / LAST_CHECKPOINT).read_text() == "second checkpoint"
    assert (second / "synthetic.csv").read_text() == "second synthetic.csv" and not (second / "checkpoints").exists()
    (run / "privacy.json").write_text("third")
    assert set_aside_outputs(run, continued=True) == run / "previous-3"
    assert (run / "previous-3" / "privacy.json").read_text() == "third"
    assert (first / "privacy.json").read_text() == "first privacy.json"  # earlier ones untouched
    assert set_aside_outputs(run, continued=True) is None and not (run / "previous-4").exists()


def test_a_refused_run_puts_the_earlier_files_back(tmp_path):
    run = plant_run(tmp_path / "run")
    previous = set_aside_outputs(run, continued=False)
    (run / "logs").mkdir()  # what the refused run's logger created in the earlier files' places
    (run / STEP_LOG).write_text("step\n")
    (run / "privacy.json").write_text("refused")
    restore_outputs(run, previous)
    assert not previous.exists()
    assert (run / "privacy.json").read_text() == "first privacy.json"
    assert (run / STEP_LOG).read_text() == "step,loss\n0,1.0\n" and (run / LAST_CHECKPOINT).read_text() == "first checkpoint"


def write_log(path, steps):
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"step": steps, "loss": [float(s) for s in steps]}).to_csv(path, index=False)


def test_a_continued_runs_step_log_is_the_earlier_steps_before_its_own(tmp_path):
    """The earlier run logged steps 0-4 after its last checkpoint at 2: the continued run logs
    from 3, and its log is 0, 1, 2 then its own 3, 4, 5 -- no step twice, none lost."""
    folder, previous = tmp_path / "run", tmp_path / "run" / "previous"
    write_log(previous / STEP_LOG, [0, 1, 2, 3, 4])
    write_log(folder / STEP_LOG, [3, 4, 5])
    prepend_earlier_steps(folder, previous)
    assert pd.read_csv(folder / STEP_LOG)["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert pd.read_csv(previous / STEP_LOG)["step"].tolist() == [0, 1, 2, 3, 4]  # the earlier log kept


def test_a_continued_runs_step_log_keeps_the_earlier_values_to_the_last_digit(tmp_path):
    """Read with pandas' default float parser and written back, 1.4039816856384277 became
    1.4039816856384275: the earlier run's logged epsilon and losses changed in the rewrite."""
    folder, previous = tmp_path / "run", tmp_path / "run" / "previous"
    previous.mkdir(parents=True)
    (previous / STEP_LOG).parent.mkdir(parents=True, exist_ok=True)
    (previous / STEP_LOG).write_text("step,loss\n0,1.4039816856384277\n1,0.33967218453082565\n")
    write_log(folder / STEP_LOG, [1, 2])
    prepend_earlier_steps(folder, previous)
    assert (folder / STEP_LOG).read_text().splitlines()[1:3] == ["0,1.4039816856384277", "1,1.0"]


def test_a_continued_run_that_took_no_step_keeps_the_earlier_log(tmp_path):
    folder, previous = tmp_path / "run", tmp_path / "run" / "previous"
    write_log(previous / STEP_LOG, [0, 1])
    prepend_earlier_steps(folder, previous, took_steps=False)
    assert pd.read_csv(folder / STEP_LOG)["step"].tolist() == [0, 1]
    prepend_earlier_steps(tmp_path / "other", previous, took_steps=True)  # no log of its own: none made
    assert not (tmp_path / "other" / STEP_LOG).exists()


def test_a_continuation_that_took_no_step_takes_the_earlier_losses_it_lacks_and_keeps_its_own_figures(tmp_path):
    """The earlier run's losses describe the generator the continuation saved; its wall time and
    steps are the continuation's own, not the earlier run's."""
    import json

    from lightning_dpgan.run_folder import carry_earlier_losses

    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "metrics.json").write_text(json.dumps({"loss/generator": 1.5, "wall_time_s": 50.0, "steps": 40}))
    (tmp_path / "metrics.json").write_text(json.dumps({"wall_time_s": 2.0, "steps": 40}))
    carry_earlier_losses(tmp_path, previous)
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"wall_time_s": 2.0, "steps": 40, "loss/generator": 1.5}


def test_an_audit_folder_is_refused_when_it_holds_a_run_or_an_audit(tmp_path):
    run = plant_run(tmp_path / "run")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="holds a training run"):
            check_audit_dir(run, overwrite)
    audit = tmp_path / "audit"
    (audit / "calibration").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"already holds an audit \(calibration\)"):
        check_audit_dir(audit, False)
    check_audit_dir(audit, True)


def test_an_audit_started_once_a_trial_wrote_its_config(tmp_path):
    audit = tmp_path / "audit"
    (audit / "trials" / "000" / "logs").mkdir(parents=True)  # a trial refused before training
    (audit / "calibration" / "000").mkdir(parents=True)
    assert not audit_started(audit)
    (audit / "calibration" / "000" / "config.yaml").write_text("seed: 1\n")
    assert audit_started(audit)
    (audit / "audit.json").write_text("{}")
    remove_audit_trials(audit)
    assert [p.name for p in audit.iterdir()] == ["audit.json"]


def test_outputs_and_markers_name_what_a_run_writes():
    """Every marker of a run is moved aside when the folder is replaced: a marker left behind
    would make the replaced folder still look like the old run's."""
    assert set(run_folder.MARKERS) <= set(run_folder.OUTPUTS + run_folder.TRAINING_STATE)


def test_the_data_files_folders_count_each_and_the_cache_before_its_download(tmp_path, monkeypatch):
    """A dataset's files may lie in two folders (adult.data in DIR/adult/, adult.test in DIR):
    only the last one's folder was checked. A cache not yet made, that the download would make
    inside the run folder, was not checked at all."""
    from lightning_dpgan.datamodules.adult import AdultDataModule
    from lightning_dpgan.run_folder import refuse_holding_the_data_files

    (tmp_path / "data" / "adult").mkdir(parents=True)
    (tmp_path / "data" / "adult" / "adult.data").write_text("")
    (tmp_path / "data" / "adult.test").write_text("")
    split = AdultDataModule(data_dir=tmp_path / "data")
    for folder in (tmp_path / "data" / "adult", tmp_path / "data"):
        with pytest.raises(ConfigError, match="the folder the private records are read from \\(--data-dir's files"):
            refuse_holding_the_data_files(folder, split)
    refuse_holding_the_data_files(tmp_path / "elsewhere", split)  # a folder away from the files is fine
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("LIGHTNING_DPGAN_CACHE_DIR", str(tmp_path / "out" / "cache"))
    with pytest.raises(ConfigError, match="holds the folder the private records are read from \\(the download cache"):
        refuse_holding_the_data_files(tmp_path / "out", AdultDataModule(data_dir=tmp_path / "empty"))
