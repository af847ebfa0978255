"""An output folder that already holds a run: refused unless continued or replaced on purpose,
and never left with one run's checkpoint beside another's privacy report.

A run folder's files describe one training: ``privacy.json`` is the guarantee of the generator
in ``checkpoints/last.ckpt``. Training into a folder that holds a run would replace the
checkpoint while the old report stays until the new one is written -- after training, so an
interrupted or failing run would leave a report that under-states what the checkpoint spent --
and Lightning's CSV logger starts ``logs/metrics.csv`` afresh. So:

- a folder holding a run is refused, unless ``--resume`` continues a checkpoint inside it or
  ``--overwrite`` replaces it;
- when it is continued or replaced, its outputs (report, metrics, synthetic data, evaluation,
  logs, config; when replaced, its checkpoints and sample grids too) are first moved to
  ``previous/`` (``previous-2/`` ... if that exists): nothing is deleted, and nothing at the top
  of the folder describes a checkpoint it does not hold;
- a run refused before training starts (its settings, its data, its budget) moves them back:
  the folder is as it was, but for the refused run's logger files;
- a continued run's step log is the earlier one's steps followed by its own.

An audit (``python -m lightning_dpgan audit``) follows the same rule for what it writes: a folder
holding one is refused unless ``--overwrite``, which moves the old audit to ``previous/``.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lightning_dpgan.command_name import command_line
from lightning_dpgan.config import ConfigError
from lightning_dpgan.outputs import write_json

#: What ``evaluate`` writes for each held-out split it scores (``--split``).
EVALUATION_FILES = {"test": "evaluation.json", "dev": "evaluation-dev.json"}
#: ``evaluate``'s options that only an image run takes, by argument name (each flag takes a value);
#: refused for a table run, which is scored on its synthetic.csv as written (the harness reads them too)
IMAGE_EVALUATE_OPTIONS = {"n_synthetic": "-n", "cnn_epochs": "--cnn-epochs", "device": "--device"}
#: ``evaluate``'s switches (no value) that only an image run takes, refused alike
IMAGE_EVALUATE_SWITCHES = {"real_baseline": "--real-baseline"}
#: What a run writes besides its checkpoints (moved aside when the folder is reused).
#: A CSV run's DP-estimated schema (no schema file given): a DP release, written for the user to
#: read, and to give as --data.schema to later runs on the same data (its cost stays spent).
RELEASED_SCHEMA = "released_schema.yaml"
OUTPUTS = ("privacy.json", "metrics.json", "synthetic.csv", "samples.png", RELEASED_SCHEMA, *EVALUATION_FILES.values(),
           "report.md", "report", "epsilon.png", "config.yaml", "logs")
#: What a replaced run (not a continued one, which reads its checkpoint) also leaves.
TRAINING_STATE = ("checkpoints", "samples")
#: Any of these makes a folder a run's: what a run writes once training has started (``logs/``
#: alone is what a run refused before training leaves; it is set aside, not a reason to refuse).
MARKERS = ("checkpoints", "privacy.json", "config.yaml", "metrics.json", "synthetic.csv", "samples.png")
STEP_LOG = Path("logs") / "metrics.csv"
#: The checkpoint a run writes and keeps up to date while it trains (``callbacks/checkpoint.py``).
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
#: What ``python -m lightning_dpgan audit`` writes: its report and one run folder per trial.
AUDIT_REPORT = "audit.json"
AUDIT_TRIALS = ("trials", "calibration")
AUDIT_OUTPUTS = (AUDIT_REPORT,) + AUDIT_TRIALS
#: What an audit trial's checkpoints (run information) and privacy.json say of it, and ``sample``
#: warns of: half the trials train on the data plus a canary built from the train split (its
#: rarest categories, the side of its mean), so one real record may change two training records.
AUDIT_TRIAL_NOTE = ("an audit trial (python -m lightning_dpgan audit): half the trials train with a canary record built "
                    "from the train split, so this trial's privacy figures are the claim the audit tests, not a "
                    "guarantee for releasing what it generates")


#: The options naming a file a run reads its records or its schema from (``--data-dir`` names a folder).
DATA_FILE_FLAGS = ("--data.csv", "--data.schema")


def data_inputs(data: Mapping[str, Any]) -> dict[str, str]:
    """What a run's ``data`` settings read records from, by the option that named it: the files
    ``--data.csv`` and ``--data.schema`` (a value of another kind is refused as a setting, later)
    and a built-in dataset's folder (``--data-dir``, else ``$LIGHTNING_DPGAN_DATA_DIR``; a CSV
    run, which has ``csv`` set, reads no such folder), as given: for :func:`check_output_dir`."""
    from lightning_dpgan.data.download import DATA_DIR_ENV

    inputs = {f"--data.{key}": data[key] for key in ("csv", "schema") if isinstance(data.get(key), (str, os.PathLike))}
    given = data.get("data_dir")
    if isinstance(given, (str, os.PathLike)) and str(given).strip():
        inputs["--data-dir"] = str(given)
    elif given is None and "csv" not in data and os.environ.get(DATA_DIR_ENV, "").strip():
        inputs[f"${DATA_DIR_ENV}"] = os.environ[DATA_DIR_ENV]
    return inputs


def data_files(settings: Mapping[str, Any], datamodule: Any) -> list[str]:
    """The files a run read its records and schema from (a CSV run's ``csv`` and ``schema``
    settings, a built-in dataset's :func:`located_data_files`), absolute: kept in its
    checkpoint, so that ``sample --out`` refuses to write over them."""
    return [str(Path(settings[key]).expanduser().resolve()) for key in ("csv", "schema")
            if isinstance(settings.get(key), (str, os.PathLike))] + located_data_files(datamodule)


def located_data_files(datamodule: Any) -> list[str]:
    """A built-in dataset's raw files as found in its data folder (``--data-dir``, or
    ``$LIGHTNING_DPGAN_DATA_DIR``), absolute; not its downloads, which are checksummed and
    fetched again. Kept in the checkpoint with :func:`data_files`, so that ``sample --out``
    refuses them: a user's only copy of King's Kaggle file was replaced by five synthetic rows."""
    from lightning_dpgan.data.download import locate

    folder = getattr(datamodule, "data_dir", None)
    if folder is None or not hasattr(datamodule, "raw_file_names"):
        return []
    found = [locate(name, folder, datamodule.subdirs) for name in datamodule.raw_file_names()]
    return [str(path.resolve()) for path in found if path is not None]


def refuse_holding_the_data_files(folder: Path, datamodule: Any) -> None:
    """:func:`refuse_the_data_folder` for the folders a built-in dataset's files are read from:
    the subfolder of its data folder they were found in (``mnist/`` under ``--data-dir``, which
    :func:`check_output_dir` cannot know before the datamodule looks), and its download cache.
    The files are located, not read."""
    located = located_data_files(datamodule)  # one file here, another in a subfolder: each folder counts
    parents = list(dict.fromkeys(Path(path).parent for path in located))
    folders = {"--data-dir's files" + (f" ({number} of {len(parents)})" if len(parents) > 1 else ""): parent
               for number, parent in enumerate(parents, 1)}
    cache = getattr(datamodule, "_cache_folder", None)
    names = datamodule.raw_file_names() if hasattr(datamodule, "raw_file_names") else []
    if callable(cache) and len(located) < len(names):  # some are read from the cache, or downloaded into it
        folders["the download cache"] = cache()
    refuse_the_data_folder(folder, folders)


def held_run_files(folder: Path) -> list[str]:
    """The run files ``folder`` holds (none if it does not exist)."""
    return [name for name in MARKERS if (folder / name).exists()] if folder.is_dir() else []


def continues_run_in(folder: Path, resume: str | None) -> bool:
    """Whether ``resume`` is the checkpoint the run in ``folder`` keeps up to date: continuing it
    writes over that file. Another checkpoint in the folder (an earlier run's in ``previous/``, a
    copy) starts another run there, which would write over the folder's own."""
    if not resume:
        return False
    return Path(resume).resolve() == (folder / LAST_CHECKPOINT).resolve()


def refuse_a_file(folder: Path) -> None:
    """An output folder that names an existing file, a link to nothing (``mkdir`` would answer
    "File exists"), or a folder this process cannot write in (found after Lightning's banner,
    with the raw OS error, when the first file was written)."""
    if folder.is_symlink() and not folder.exists():
        raise ConfigError(f"--output-dir {folder} is a link to {os.readlink(folder)}, which does not exist: make that "
                          "folder, or give another --output-dir")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--output-dir {folder} is a file: give a folder (it is created if missing)")
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--output-dir {folder} is a folder you cannot write in: give a folder in a place you can "
                          "write to")


def refuse_the_data_folder(folder: Path, data_folders: Mapping[str, Any]) -> None:
    """An output folder that holds the folder the private records are read from (``data_folders``:
    flag -> folder), as it is or in a subfolder: a run folder is what is published (synthetic
    data, its privacy report), and one holding the raw records beside them is one copy command
    away from publishing those. The data folder may hold the run folder: that publishes nothing."""
    for flag, data_folder in data_folders.items():
        if data_folder is None:
            continue
        # as written and as resolved: a link inside the run folder to the data is copied with it
        # by the tools that follow links (zip -r, rsync -L)
        given, read_from = Path(os.path.abspath(Path(data_folder).expanduser())), Path(data_folder).expanduser().resolve()
        run_folders = (Path(os.path.abspath(folder)), folder.resolve())
        if any(path.is_relative_to(run) for path in (given, read_from) for run in run_folders):
            where = "is" if read_from == folder.resolve() else "holds"
            raise ConfigError(f"--output-dir {folder} {where} the folder the private records are read from ({flag} "
                              f"{read_from}): a run folder is what gets published, so keep the raw data out of it and "
                              "give another --output-dir (a new folder is made)")


def continue_command(folder: Path) -> str:
    """The ``train`` options that continue the run in ``folder`` there: its settings (a checkpoint
    holds the networks and the accountant, not the run's flags), its last checkpoint, and the
    folder itself (config.yaml records no output folder for the default one, which would be a
    new timestamped folder)."""
    settings = f"--config {folder / 'config.yaml'} " if (folder / "config.yaml").is_file() else ""
    return f"{command_line('train')} {settings}--resume {folder / LAST_CHECKPOINT} --output-dir {folder}"


def own_folder_hint(resume: str | None) -> str:
    """For a ``--resume`` of another run folder's own checkpoint: how to continue that run in its
    folder. A copied run's config.yaml names the folder it was copied from, so ``--config COPY/config.yaml
    --resume COPY/checkpoints/last.ckpt`` aims at the original."""
    if not resume:
        return ""
    checkpoint = Path(resume)
    run = checkpoint.parent.parent
    if checkpoint.parent.name != LAST_CHECKPOINT.parent.name or checkpoint.name != LAST_CHECKPOINT.name \
            or not (run / "config.yaml").is_file():
        return ""
    return f". To continue the run of --resume {resume} in its own folder, give --output-dir {run}"


def check_output_dir(folder: Path, resume: str | None, overwrite: bool, inputs: dict[str, str] | None = None) -> None:
    """Refuse a file, or a folder holding a run that is neither continued nor to be replaced; a
    run that would move away a file it reads: the checkpoint it resumes, or one of ``inputs``
    (flag -> path: the data files, which would be read from previous/'s place); and a folder that
    is or holds the one the records are read from (``inputs``' ``--data-dir``, or the CSV's). Any existing folder has its outputs set aside, run or not (``logs/`` of a run refused
    before training)."""
    refuse_a_file(folder)
    held = held_run_files(folder)
    continued = continues_run_in(folder, resume)
    if held and not overwrite and not continued:
        continue_it = f", continue it with {continue_command(folder)}" if (folder / LAST_CHECKPOINT).is_file() else ""
        raise ConfigError(
            f"--output-dir {folder} already holds a run's files ({', '.join(held)}): choose another folder{continue_it}, "
            f"or replace them with --overwrite (they are then moved to previous/){own_folder_hint(resume)}")
    read = {**({"--resume": resume} if resume and not continued else {}), **(inputs or {})}
    mover = "--overwrite moves" if held and overwrite and not continued else "the run moves"
    for flag, path in read.items():
        read_from = Path(path).expanduser().resolve()
        moved = [name for name in (OUTPUTS if continued else OUTPUTS + TRAINING_STATE)
                 if (folder / name).exists() and (folder / name).resolve() in (read_from, *read_from.parents)]
        if moved:
            where = "" if (folder / moved[0]).resolve() == read_from else "in "
            raise ConfigError(f"{flag} {path} is {where}{folder / moved[0]}, which {mover} to previous/ with the rest of "
                              f"the run's outputs: copy it out of {folder} first, or give another --output-dir")
    refuse_holding_the_data(folder, inputs or {})


def refuse_holding_the_data(folder: Path, inputs: Mapping[str, Any]) -> None:
    """:func:`refuse_the_data_folder` for ``inputs`` as :func:`data_inputs` gives them: the CSV's
    folder, or the data folder (a schema file is public knowledge: it may sit in a run folder);
    those that do not exist are the datamodule's to name."""
    refuse_the_data_folder(folder, {flag: Path(path).expanduser().parent if flag in DATA_FILE_FLAGS else path
                                    for flag, path in inputs.items()
                                    if flag != "--data.schema" and Path(path).expanduser().exists()})


def set_aside_outputs(folder: Path, continued: bool) -> Path | None:
    """Move the outputs of the run ``folder`` holds into a fresh ``previous*/`` folder; return it
    (None if there was nothing to move). A ``continued`` run's checkpoints stay: it reads them."""
    return set_aside(folder, OUTPUTS if continued else OUTPUTS + TRAINING_STATE)


def check_audit_dir(folder: Path, overwrite: bool) -> None:
    """Refuse a file, a training run's folder, or a folder holding an audit that is not to be
    replaced (a new audit would write its trials over the old ones' and leave the old
    ``audit.json`` until it finishes)."""
    refuse_a_file(folder)
    run = held_run_files(folder)
    if run:  # its trials and audit.json would mix with a run that --overwrite does not set aside
        raise ConfigError(f"--output-dir {folder} holds a training run ({', '.join(run)}): give the audit a folder "
                          f"of its own (by default the run's name with -audit)")
    held = [name for name in AUDIT_OUTPUTS if (folder / name).exists()] if folder.is_dir() else []
    if held and not overwrite:
        raise ConfigError(f"--output-dir {folder} already holds an audit ({', '.join(held)}): choose another folder, "
                          "or replace it with --overwrite (its files are then moved to previous/)")


def audit_started(folder: Path) -> bool:
    """Whether an audit in ``folder`` got a trial past its checks (see :func:`training_started`)."""
    return any(training_started(trial) for name in AUDIT_TRIALS if (folder / name).is_dir()
               for trial in (folder / name).iterdir())


def remove_audit_trials(folder: Path) -> None:
    """Remove the trial folders of an audit refused before any trial trained (a refused trial
    leaves its logger's files): the next audit in ``folder`` would be refused for them."""
    for name in AUDIT_TRIALS:
        shutil.rmtree(folder / name, ignore_errors=True)


def set_aside(folder: Path, names: tuple[str, ...]) -> Path | None:
    """Move those of ``names`` that ``folder`` holds into a fresh ``previous*/`` folder; return
    it (None if there was nothing to move)."""
    present = [name for name in names if (folder / name).exists()]
    if not present:
        return None
    previous, number = folder / "previous", 1
    while previous.exists():
        number += 1
        previous = folder / f"previous-{number}"
    previous.mkdir()
    for name in present:
        shutil.move(str(folder / name), str(previous / name))
    return previous


def training_started(folder: Path) -> bool:
    """Whether the run in ``folder`` got past every check: it writes ``config.yaml`` then."""
    return (folder / "config.yaml").is_file()


def restore_outputs(folder: Path, previous: Path) -> None:
    """Undo :func:`set_aside_outputs` for a run refused before training: what the refused run
    created in the earlier files' places (its logger's files) gives way to them."""
    for entry in list(previous.iterdir()):
        target = folder / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        shutil.move(str(entry), str(target))
    previous.rmdir()


def prepend_earlier_steps(folder: Path, previous: Path | None, took_steps: bool = True) -> None:
    """A continued run's step log: the earlier run's rows before the first step this one logged;
    the earlier log alone when this run took no step (its budget allowed none)."""
    earlier_path, current_path = (None if previous is None else previous / STEP_LOG), folder / STEP_LOG
    if earlier_path is None or not earlier_path.is_file():
        return
    if not took_steps and not current_path.is_file():  # nothing logged, nothing to log: the earlier log stays
        current_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(earlier_path, current_path)
        return
    if not current_path.is_file():  # another logger, or one that wrote no step: no CSV log to continue
        return
    # round_trip: pandas' default parser is off by a float step now and then, so rewriting would alter the values
    earlier, current = (pd.read_csv(path, float_precision="round_trip") for path in (earlier_path, current_path))
    if "step" in earlier and "step" in current and len(current):
        earlier = earlier[earlier["step"] < current["step"].min()]
    pd.concat([earlier, current], ignore_index=True).to_csv(current_path, index=False)


def carry_earlier_losses(folder: Path, previous: Path | None) -> None:
    """A continued run that took no step (its budget allowed none) logged no loss: its
    ``metrics.json`` takes the earlier run's final losses and other logged figures, which
    describe the generator it saved, for any key it lacks itself."""
    earlier_path, current_path = (None if previous is None else previous / "metrics.json"), folder / "metrics.json"
    if earlier_path is None or not earlier_path.is_file() or not current_path.is_file():
        return
    try:
        earlier, current = (json.loads(path.read_text()) for path in (earlier_path, current_path))
    except ValueError:  # a damaged earlier file: nothing to carry
        return
    if isinstance(earlier, dict) and isinstance(current, dict):
        carried = {key: value for key, value in earlier.items() if key not in current}
        if carried:
            write_json(current_path, {**current, **carried})
