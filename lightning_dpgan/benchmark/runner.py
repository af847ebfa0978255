"""Run one cell of a suite: ``train`` then ``evaluate``, each in its own process, and read back
what they wrote (``privacy.json``, ``metrics.json``, ``evaluation.json`` or, scored on a dev split,
``evaluation-dev.json``).

Separate processes keep every run's random state, threads and memory its own, and the commands
recorded with the results are exactly the ones a reader can paste to rerun a figure.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dpgan.benchmark.paths import REPO
from lightning_dpgan.benchmark.stopping import waited_on
from lightning_dpgan.benchmark.suites import Cell, Size, delta_for, epsilon_text
from lightning_dpgan.data.download import DATA_DIR_ENV, default_cache_dir
from lightning_dpgan.data.dev_split import scored_split
from lightning_dpgan.outputs import write_json
from lightning_dpgan.run_folder import EVALUATION_FILES, IMAGE_EVALUATE_OPTIONS, LAST_CHECKPOINT

#: the thread counts of the libraries a cell's processes compute with: torch's OpenMP pool, and
#: MKL and OpenBLAS under numpy and scikit-learn
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows
        return os.cpu_count() or 1


@dataclass
class Settings:
    """Where and how the cells run (the same for every cell of one invocation)."""

    out_dir: Path
    data_dir: str | None = None
    accelerator: str | None = None
    evaluate: bool = True
    jobs: int = 1  # cells run at the same time (each is its own processes): for a GPU or many-core host
    resume: bool = False  # continue the cells an interrupted invocation left in out_dir (see resume_state)
    dev_fraction: float = 0.0  # > 0: train without that share of the training records, score on them
    #: the commit, machine and concurrency (``jobs``, the cells' thread settings) a fresh cell runs
    #: under: kept beside its settings, so that a later --resume reading the cell back can say what
    #: code ran it, and keep its wall times where they were taken under the same conditions
    provenance: dict[str, Any] | None = None

    @property
    def threads_per_job(self) -> int | None:
        """With ``jobs`` above 1, each cell's share of the CPUs (at least one thread); None alone.

        Left alone, every process starts one compute thread per core, so ``jobs`` cells run
        ``jobs`` times as many threads as there are cores, and OpenMP threads that spin while they
        wait for each other slow the whole grid far below one cell at a time."""
        return max(1, usable_cpus() // self.jobs) if self.jobs > 1 else None

    def child_environment(self) -> dict[str, str] | None:
        """The environment of a cell's processes: this one's, with each thread count of
        :data:`THREAD_VARIABLES` the user did not set limited to :attr:`threads_per_job`; None
        (inherit it unchanged) for one cell at a time."""
        threads = self.threads_per_job
        if threads is None:
            return None
        return {**dict.fromkeys(THREAD_VARIABLES, str(threads)), **os.environ}

    @property
    def split(self) -> str:
        """The held-out split the cells are scored on (``evaluate --split``)."""
        return scored_split(self.dev_fraction)


def train_command(cell: Cell, size: Size, settings: Settings, resume: bool = False) -> list[str]:
    """The cell's train command. It replaces the cell's folder (a rerun of the suite replaces its
    cells); with ``resume`` it continues the checkpoint there instead, which holds the
    accountant's state, so the run stops and reports the ε of an uninterrupted one."""
    run_dir = settings.out_dir / cell.name
    command = [sys.executable, "-m", "lightning_dpgan", "train", "--model", cell.model, "--dataset", cell.dataset,
               "--seed", str(cell.seed), "--output-dir", str(run_dir), "--trainer.enable_progress_bar", "false",
               *(["--resume", str(run_dir / LAST_CHECKPOINT)] if resume else ["--overwrite"])]
    if cell.epsilon is not None:
        command += ["--epsilon", epsilon_text(cell.epsilon), "--delta", f"{delta_for(cell.dataset):g}"]
    if settings.data_dir:
        command += ["--data-dir", settings.data_dir]
    if size.max_steps:
        command += ["--max-steps", str(size.max_steps)]
    if settings.accelerator:
        command += ["--accelerator", settings.accelerator]
    if settings.dev_fraction:
        command += ["--data.dev_fraction", f"{settings.dev_fraction:g}"]
    return command + list(size.train_args)


#: what a cell's folder holds when a suite is rerun with ``--resume`` (:func:`resume_state`)
FRESH, CHECKPOINTED, TRAINED, EVALUATED = "fresh", "checkpointed", "trained", "evaluated"
#: what ``--resume`` did with a cell in each state, as its record's ``resumed`` says
RESUMED = {CHECKPOINTED: "training continued from its checkpoint", TRAINED: "trained before, evaluated now",
           EVALUATED: "trained and evaluated before, read back"}


def resume_state(run_dir: Path, evaluate: bool, split: str = "test") -> str:
    """How far the cell in ``run_dir`` got. A run writes ``privacy.json`` only once training is
    over, and a continued or replaced run first moves the earlier outputs aside
    (:mod:`lightning_dpgan.run_folder`), so ``privacy.json`` at the top means the checkpoint beside
    it finished training, and an ``evaluation.json`` beside that evaluated this very run."""
    if (run_dir / "privacy.json").is_file():
        return EVALUATED if not evaluate or (run_dir / EVALUATION_FILES[split]).is_file() else TRAINED
    return CHECKPOINTED if (run_dir / LAST_CHECKPOINT).is_file() else FRESH


#: options left out when a resumed cell's settings are compared (:func:`resume_mismatch`): the
#: device a run continues on changes no setting of the protocol
DEVICE_OPTIONS = ("--accelerator", "--device")


def settings_record(cell: Cell, size: Size, settings: Settings) -> dict[str, Any]:
    """What the cell's run is, as :func:`resume_mismatch` compares it: its train command (a fresh
    one) and its evaluate command, without this machine's paths or the device."""
    def comparable(command: list[str]) -> list[str]:
        words = shlex.split(portable(command, settings.data_dir, out_dir=settings.out_dir))[1:]  # not the interpreter
        return without_options(words, DEVICE_OPTIONS)

    return {"train": comparable(train_command(cell, size, settings)),
            "evaluate": comparable(evaluate_command(cell, size, settings)) if settings.evaluate else None}


def settings_file(cell: Cell, settings: Settings) -> Path:
    """Beside the cell's log: the settings its run was started with (:func:`settings_record`)."""
    return settings.out_dir / f"{cell.name}.settings.json"


def resume_mismatch(cell: Cell, size: Size, settings: Settings) -> str | None:
    """Why ``--resume`` must not take up what this cell's folder holds, or None when it may.

    A folder left by an invocation with other settings (a quick size's 20 steps, another
    ``--max-steps``, a dev split, other evaluation settings) would otherwise be read back or
    continued and recorded under this invocation's size and commands: a 20-step smoke test
    counted as a protocol figure. A fresh cell has nothing to take up."""
    if resume_state(settings.out_dir / cell.name, settings.evaluate, settings.split) == FRESH:
        return None
    path = settings_file(cell, settings)
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{cell.name}: no record of the settings it ran with ({path.name} is missing or unreadable)"
    expected = settings_record(cell, size, settings)
    if recorded.get("evaluate") and not is_image_dataset(cell.dataset):
        # recorded before evaluate refused image options for a table run (they changed nothing)
        recorded = {**recorded, "evaluate": without_options(recorded["evaluate"], tuple(IMAGE_EVALUATE_OPTIONS.values()))}
    for part in ("train", "evaluate"):
        if expected[part] is not None and recorded.get(part) != expected[part]:
            return (f"{cell.name}: its {part} command was `{shlex.join(recorded.get(part) or [])}`, "
                    f"this invocation's is `{shlex.join(expected[part])}`")
    return None


def is_image_dataset(dataset: str) -> bool:
    from lightning_dpgan import registry

    return getattr(registry.lookup("dataset", dataset).load(), "kind", "image") == "image"


def without_options(words: list[str], options: tuple[str, ...]) -> list[str]:
    """``words`` without each of ``options`` and the value after it."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in options:
            skip = True
        else:
            kept.append(word)
    return kept


def evaluate_command(cell: Cell, size: Size, settings: Settings) -> list[str]:
    """The cell's ``evaluate``: the image options (images drawn, the CNN's epochs and device) for
    an image dataset only, which evaluate refuses for a table run."""
    command = [sys.executable, "-m", "lightning_dpgan", "evaluate", "--run", str(settings.out_dir / cell.name),
               "--seed", str(cell.seed)]
    if is_image_dataset(cell.dataset):
        flag = IMAGE_EVALUATE_OPTIONS
        command += [flag["cnn_epochs"], str(size.cnn_epochs)]
        if size.n_synthetic:
            command += [flag["n_synthetic"], str(size.n_synthetic)]
        if settings.accelerator in ("gpu", "cuda"):
            command += [flag["device"], "cuda"]
    if settings.split != "test":
        command += ["--split", settings.split]
    return command


def portable(command: list[str], data_dir: str | None = None, peers_venv: str | None = None,
             out_dir: str | Path | None = None, others: dict[str, str] | None = None) -> str:
    """``command`` as recorded in results: ``python`` for this interpreter, ``DATA_DIR`` for the
    data folder (given or from ``LIGHTNING_DPGAN_DATA_DIR``), ``PEERS_VENV`` for the peers'
    virtualenv and ``OUT_DIR`` for an absolute output folder (``others``: more path -> name), so
    that a results file names no path of the machine it ran on."""
    return shlex.join(portable_text(word, data_dir, peers_venv, out_dir, others) for word in command)


def portable_text(text: str, data_dir: str | None = None, peers_venv: str | None = None,
                  out_dir: str | Path | None = None, others: dict[str, str] | None = None) -> str:
    """``text`` with this machine's paths replaced by the names :func:`portable` uses (the download
    cache: ``CACHE_DIR``); the interpreter's prefix (warnings name files under its site-packages) becomes ``PYTHON_PREFIX``, and
    a path in the checkout is named relative to it (``benchmarks/peers/...``)."""
    names = {sys.executable: "python", sys.prefix: "PYTHON_PREFIX", f"{REPO}{os.sep}": "", data_dir: "DATA_DIR",
             os.environ.get(DATA_DIR_ENV): "DATA_DIR", str(default_cache_dir()): "CACHE_DIR", peers_venv: "PEERS_VENV",
             **(others or {})}
    if out_dir is not None and Path(out_dir).is_absolute():
        names[str(out_dir)] = "OUT_DIR"
    for path, name in sorted(((str(p), n) for p, n in names.items() if p), key=lambda item: -len(item[0])):
        text = text.replace(path, name)
    return text


def skip_reason(error: BaseException, data_dir: str | None = None, out_dir: str | Path | None = None) -> str:
    """Why a dataset was skipped, whole (the files tried, the folders searched, the advice), without
    this machine's paths."""
    return portable_text(f"{type(error).__name__}: {error}".strip(), data_dir, out_dir=out_dir)


def run_logged(command: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run ``command`` with its output in ``log`` (in ``env``, else this process's environment);
    return its wall time. A failure raises with the end of the log, so the reason is on screen
    and the whole of it is kept. SIGTERM to the suite is passed on to it (:mod:`.stopping`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("a") as handle:
        handle.write(f"$ {shlex.join(command)}\n")
        handle.flush()
        returncode = waited_on(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - started
    if returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"{shlex.join(command)} failed (exit {returncode}); end of {log}:\n{tail}"
                           + killed_by(returncode))
    return seconds


def killed_by(returncode: int) -> str:
    """A last line naming the signal that ended a process (its log says nothing then), else ''."""
    if returncode >= 0:
        return ""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = ", most likely the out-of-memory killer" if name == "SIGKILL" else ""
    return f"\nkilled by {name}{hint}"


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


#: the four classifiers of the Adult goal (average AUROC trained on synthetic, tested on real)
FOUR_CLASSIFIERS = ("logistic_regression", "random_forest", "gradient_boosting", "mlp")


#: what evaluation.json records of how it was made or of the run it read, not a measure to average
#: over seeds (the cell's seed is the run's own, in its record; its spent epsilon and delta are
#: summarized from privacy.json beside the measures)
EVALUATION_SETTINGS = ("seed", "device", "epsilon", "delta", "epsilon_accounting", "epsilon_data_independent",
                       "synthetic_records", "privacy_risk/mia_records_per_group", "utility/cnn_epochs")


def with_derived_measures(measures: dict[str, Any]) -> dict[str, Any]:
    """``utility/B_auroc_four``: the setting-B AUROC averaged over :data:`FOUR_CLASSIFIERS`;
    without :data:`EVALUATION_SETTINGS`."""
    measures = {key: value for key, value in measures.items() if key not in EVALUATION_SETTINGS}
    four = [measures.get(f"utility/B_auroc/{name}") for name in FOUR_CLASSIFIERS]
    if all(isinstance(value, (int, float)) for value in four):
        return {**measures, "utility/B_auroc_four": sum(four) / len(four)}
    return measures


def failed_run(cell: Cell, error: BaseException, settings: Settings, peers_venv: str | None = None) -> dict[str, Any]:
    """The record of a cell that failed: its reason (the last lines of the error, which end with
    the command's own message), without this machine's paths (a peer's virtualenv's among them);
    the whole log stays in the output folder."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    reason = "\n".join(lines[-3:]) if lines else type(error).__name__
    return {"status": "failed", **cell.record,
            "error": portable_text(reason, settings.data_dir, peers_venv, out_dir=settings.out_dir)}


def run_cell(cell: Cell, size: Size, settings: Settings) -> dict[str, Any]:
    """Train and evaluate ``cell``; return its record for the results file.

    With ``settings.resume`` a cell takes up where an interrupted invocation left it: a
    checkpointed one continues training, a trained one is only evaluated, an evaluated one is read
    back. Its record then says so (``resumed``) and, where its settings file records one, the
    commit its run started at (``started_at_commit``). A continued run has no wall times (they
    would cover part of it); one trained whole before keeps its own where they were measured under
    this invocation's conditions (:func:`times_carry_over`)."""
    run_dir = settings.out_dir / cell.name
    log = settings.out_dir / f"{cell.name}.log"
    state = resume_state(run_dir, settings.evaluate, settings.split) if settings.resume else FRESH
    if state != FRESH and (why := resume_mismatch(cell, size, settings)):
        raise RuntimeError(f"--resume cannot take up {run_dir}: {why}")
    commands, train_seconds, env = [train_command(cell, size, settings)], None, settings.child_environment()
    started = {} if state == FRESH else recorded_start(cell, settings)
    if state == FRESH:
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        record = {**settings_record(cell, size, settings), **({"provenance": settings.provenance} if settings.provenance else {})}
        write_json(settings_file(cell, settings), record)
        train_seconds = run_logged(commands[0], log, env)
        write_json(settings_file(cell, settings), {**record, "train_seconds": train_seconds})  # trained whole
    elif state == CHECKPOINTED:
        commands.append(train_command(cell, size, settings, resume=True))
        run_logged(commands[-1], log, env)
    elif times_carry_over(started, settings):  # trained whole before, under this invocation's conditions
        train_seconds = started["train_seconds"]
    if settings.evaluate:
        commands.append(evaluate_command(cell, size, settings))
        if state != EVALUATED:
            run_logged(commands[-1], log, env)
    privacy, metrics = read_json(run_dir / "privacy.json"), read_json(run_dir / "metrics.json")
    timed = train_seconds is not None  # metrics.json's wall time is then that same whole run's
    earlier_commit = (started.get("provenance") or {}).get("commit")
    return {
        **cell.record,
        "epsilon": privacy.get("epsilon"), "delta": privacy.get("delta"),
        # PATE and G-PATE stop on the data-dependent epsilon by default, a function of the votes:
        # the data-independent bound of the queries asked is kept beside it (under data-independent
        # accounting it is the epsilon itself)
        "epsilon_data_independent": (privacy.get("epsilon_data_independent")
                                     if privacy.get("accounting") == "data-dependent" else None),
        "steps": metrics.get("steps", privacy.get("steps")), "stopped_by": privacy.get("stopped_by"),
        "train_seconds": train_seconds, "fit_seconds": metrics.get("wall_time_s") if timed else None,
        "measures": with_derived_measures(read_json(run_dir / EVALUATION_FILES[settings.split])) if settings.evaluate else {},
        "commands": [portable(command, settings.data_dir, out_dir=settings.out_dir) for command in commands],
        "run_dir": portable_text(str(run_dir), out_dir=settings.out_dir),
        **({} if state == FRESH else {"resumed": RESUMED[state]}),
        **({"started_at_commit": earlier_commit} if state != FRESH and earlier_commit else {}),
    }


def recorded_start(cell: Cell, settings: Settings) -> dict[str, Any]:
    """What the cell's settings file says of the run's start (its ``provenance``) and, once it
    trained whole, its ``train_seconds``; empty where the file is missing or unreadable (a folder
    :func:`resume_mismatch` let through predates the record)."""
    try:
        recorded = json.loads(settings_file(cell, settings).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


#: what a wall time depends on beside the code: read back only where each is as it is now
TIMING_CONDITIONS = ("machine", "accelerator", "jobs", "threads")


def times_carry_over(started: dict[str, Any], settings: Settings) -> bool:
    """Whether a cell that trained whole before this --resume keeps its wall times: measured on
    this machine and device, with as many cells at a time and the same thread settings. Otherwise they would
    be shown as this invocation's measurements while they are another's."""
    earlier, now = started.get("provenance"), settings.provenance
    return (started.get("train_seconds") is not None and isinstance(earlier, dict) and now is not None
            and all(earlier.get(key) == now.get(key) for key in TIMING_CONDITIONS))


__all__ = ["FOUR_CLASSIFIERS", "THREAD_VARIABLES", "Settings", "evaluate_command", "resume_mismatch", "resume_state",
           "settings_record", "failed_run", "portable", "portable_text", "read_json", "run_cell", "run_logged", "skip_reason",
           "train_command", "usable_cpus", "with_derived_measures"]
