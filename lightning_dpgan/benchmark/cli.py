"""``python -m lightning_dpgan benchmark --suite {tables,images,speed,peers} [--quick]``.

Runs a suite's grid (:mod:`lightning_dpgan.benchmark.suites`), writes
``benchmarks/results/<suite>-<date>.json`` and regenerates the generated section of
``benchmarks/RESULTS.md`` with its plots, in the checkout the package is installed from
(``pip install -e``), whatever the current folder; runs go to ``runs/`` under the current folder. The results file is rewritten after every run, so a suite stopped
midway keeps what it measured (``complete: false``); ``--resume --out-dir DIR`` continues it
(each cell from its last checkpoint, in a new results file). A cell that fails is recorded with its error and the suite goes on;
the command then exits with status 1. A dataset whose files are neither local nor downloadable
(Kaggle Credit without network, say) is skipped and named in the results.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from lightning_dpgan.benchmark.out_dir_lock import OutDirBusyError, out_dir_locked
from lightning_dpgan.benchmark.paths import BENCHMARKS, check_benchmarks_folder
from lightning_dpgan.benchmark.results import ResultsFile, ResultsFileError, commit, machine
from lightning_dpgan.benchmark.stopping import SuiteTerminated, children_stopped_on_sigterm, stop_running_children
from lightning_dpgan.benchmark.runner import (THREAD_VARIABLES, Settings, failed_run, is_image_dataset, portable,
                                              resume_mismatch, run_cell, skip_reason, train_command)
from lightning_dpgan.benchmark.suites import SUITES, Cell, Size, epsilon_text, suite_size
from lightning_dpgan.data.dev_split import check_dev_fraction
from lightning_dpgan.data.download import default_data_dir


#: The registry's dataset of any CSV file: no suite runs it (it has no fixed schema or split).
ANY_CSV = "csv"
#: what picks or runs a grid, by option: each is ignored by --report-only (a value here is its default;
#: --suite is not here: "not needed with --report-only", it is allowed there)
RUNNING_OPTIONS = {"quick": False, "models": None, "datasets": None, "epsilons": None, "seeds": None,
                   "max_steps": None, "n_synthetic": None, "cnn_epochs": None, "data_dir": None, "accelerator": None,
                   "jobs": 1, "out_dir": None, "peers_venv": None, "resume": False, "overwrite": False, "dev_fraction": 0.0,
                   "train_args": []}


def options_a_report_ignores(args: argparse.Namespace) -> list[str]:
    """The grid options given beside --report-only, as flags (``--out-dir``; the train options after ``--``)."""
    given = [name for name, default in RUNNING_OPTIONS.items() if getattr(args, name) != default]
    return [("options after --" if name == "train_args" else "--" + name.replace("_", "-")) for name in given]


def parse_args(argv: list[str]) -> argparse.Namespace:
    from lightning_dpgan.cli import command_parser

    parser = command_parser("benchmark", "Run a suite's grid of train and evaluate commands, write its results file "
                                         "and regenerate RESULTS.md (see README, Results).")
    add = parser.add_argument
    add("--suite", choices=list(SUITES), help="the suite to run (not needed with --report-only)")
    add("--quick", action="store_true", help="the small size: a smoke test that finishes in minutes on 2 CPU cores "
                                                 "(about 15 for the tables suite, most of it scoring Adult's rows; "
                                                 "kaggle-credit's 227,846 rows take tens of minutes to score)")
    add("--models", nargs="+", help="replace the suite's models (peers: smartnoise synthesizers)")
    add("--datasets", nargs="+", help="replace the suite's datasets")
    add("--epsilons", nargs="+", type=float, help="replace the suite's target epsilons")
    add("--seeds", nargs="+", type=int, help="replace the suite's seeds")
    add("--max-steps", type=int, help="training batches per run (default: the size's); the peers suite "
                                         "passes it as epochs to smartnoise's dpgan and dpctgan (its PATE "
                                         "peers train until their budget is spent)")
    add("--n-synthetic", type=int, help="images: synthetic records for the CNN")
    add("--cnn-epochs", type=int, help="images: epochs of the evaluation CNN")
    add("--data-dir", help="folder with the raw data (default: LIGHTNING_DPGAN_DATA_DIR, else download)")
    add("--accelerator", help="passed to train (cpu, gpu, auto)")
    add("--jobs", type=int, default=1, help="cells run at the same time (default 1). Seeds are the innermost "
                                            "loop of the grid, so with N a multiple of the seeds a cell's seeds run "
                                            "together; each job needs its "
                                            "own memory (a G-PATE preset tens of GB), and its processes get the CPUs/N "
                                            "compute threads (OMP_NUM_THREADS etc., unless set). Not for the speed "
                                            "and peers suites, whose wall times are compared")
    add("--out-dir", type=Path, help="where the runs go (default runs/benchmark/<suite>-<time>)")
    add("--results-dir", type=Path, default=BENCHMARKS / "results", help="default: the checkout's benchmarks/results")
    add("--results-md", type=Path, help="default: the checkout's benchmarks/RESULTS.md with the default --results-dir, "
                                        "else RESULTS.md in the --results-dir given (a scratch folder never rewrites "
                                        "the published one)")
    add("--reference", type=Path, default=BENCHMARKS / "reference.yaml",
        help="default: the checkout's benchmarks/reference.yaml")
    add("--peers-venv", type=Path, help="peers: the smartnoise-synth virtualenv (made when missing; "
                                        "default ~/.cache/lightning-dpgan/peers-venv)")
    add("--resume", action="store_true", help="continue the suite an interrupted invocation left in --out-dir: "
                                               "cells with a checkpoint continue from it, trained ones are only "
                                               "evaluated, evaluated ones are read back (their wall times are not "
                                               "recorded); the others run afresh")
    add("--overwrite", action="store_true", help="redo the cells whose runs an earlier invocation left in --out-dir "
                                                  "(else refused): each cell's earlier run is moved to its previous/ "
                                                  "folder, a peer's is replaced")
    add("--dev-fraction", type=float, default=0.0,
        help="hold this share of the training records out of training and score the runs on them instead of on "
             "the test split (evaluate --split dev): for choosing settings without reading the test split; a 'dev' "
             "run, never counted toward the goals")
    add("--report-only", action="store_true", help="only regenerate RESULTS.md from the newest results files")
    add("train_args", nargs="*", help="after --: options added to every train command")
    args = parser.parse_args(argv)
    if args.suite is None and not args.report_only:
        parser.error("the following arguments are required: --suite (or --report-only)")
    if args.report_only and (ignored := options_a_report_ignores(args)):
        parser.error(f"--report-only regenerates RESULTS.md from the results files and runs nothing: "
                     f"{', '.join(ignored)} would be ignored; drop {'it' if len(ignored) == 1 else 'them'}")
    if args.results_md is None:
        default_results = args.results_dir.resolve() == (BENCHMARKS / "results").resolve()
        args.results_md = BENCHMARKS / "RESULTS.md" if default_results else args.results_dir / "RESULTS.md"
    if args.peers_venv is not None:  # absolute: its text is replaced by PEERS_VENV in what is recorded, and a
        args.peers_venv = args.peers_venv.expanduser().absolute()  # relative "peers" would match the suite's name
    return args


def check_grid(args: argparse.Namespace, size: Size) -> None:
    """Before any cell runs: no name, seed or epsilon twice (a repeated seed would be averaged as
    another run), every model known (peers: smartnoise's names, checked by its venv), and a
    results folder that can be written."""
    from lightning_dpgan import registry

    for option in GRID_OPTIONS:
        values = list(getattr(size, option))
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise SystemExit(f"benchmark: --{option} repeats {', '.join(repeated)}: each value once")
    bad_epsilons = [e for e in size.epsilons if not (isinstance(e, (int, float)) and math.isfinite(e) and e > 0)]
    if bad_epsilons:
        raise SystemExit(f"benchmark: --epsilons {' '.join(map(str, bad_epsilons))}: each target epsilon must be a "
                         "finite number above 0")
    bad_seeds = [seed for seed in size.seeds if not isinstance(seed, int) or seed < 0]
    if bad_seeds:
        raise SystemExit(f"benchmark: --seeds {' '.join(map(str, bad_seeds))}: seeds are whole numbers from 0")
    for name in size.datasets:
        if name == ANY_CSV:
            raise SystemExit("benchmark: --datasets csv: the suites run the named datasets, whose public schemas and "
                             "splits make their figures comparable; train a CSV of your own with train --dataset csv "
                             "and score it with evaluate")
        if name not in registry.DATASETS:
            named = [dataset for dataset in registry.DATASETS if dataset != ANY_CSV]
            raise SystemExit(f"benchmark: --datasets: unknown dataset '{name}'.{registry.did_you_mean(name, named)} "
                             f"Valid dataset names: {', '.join(named)}.")
    images = {"tables": False, "peers": False, "images": True}.get(args.suite)  # the kind a suite scores
    other_kind = [name for name in size.datasets if images is not None and is_image_dataset(name) != images]
    if other_kind:  # a tables run of MNIST scored a full-size CNN where the quick size promised minutes
        raise SystemExit(f"benchmark: --datasets {' '.join(other_kind)}: the {args.suite} suite measures "
                         f"{'image' if images else 'table'} datasets; run {'them' if len(other_kind) > 1 else 'it'} "
                         f"in the {'tables' if images else 'images'} suite")
    for flag, value in (("--max-steps", args.max_steps), ("--n-synthetic", args.n_synthetic),
                        ("--cnn-epochs", args.cnn_epochs)):
        if value is not None and value < 1:  # 0 would read as "not given": the preset's whole length
            raise SystemExit(f"benchmark: {flag} must be 1 or more, not {value}")
    if args.data_dir is not None and not Path(args.data_dir).expanduser().is_dir():
        raise SystemExit(f"benchmark: --data-dir {args.data_dir} is not a folder")
    if args.suite == "peers":
        from lightning_dpgan.benchmark.suites import PEERS

        if args.train_args:
            raise SystemExit(f"benchmark: the peers suite runs smartnoise-synth, not train: the options after -- "
                             f"({' '.join(args.train_args)}) would change nothing; drop them")

        unknown = [name for name in size.models if name not in PEERS]
        if unknown:
            raise SystemExit(f"benchmark: --models {' '.join(unknown)}: the peers suite runs smartnoise-synth's "
                             f"{', '.join(PEERS)}")
    else:
        for name in size.models:
            try:
                registry.lookup("model", name)
            except (KeyError, ValueError) as error:
                raise SystemExit(f"benchmark: --models: {error}") from None
        check_train_args(size.train_args)
        refuse_non_private_models(size)
        image_options = [flag for flag, value in (("--n-synthetic", args.n_synthetic), ("--cnn-epochs", args.cnn_epochs))
                         if value is not None]
        if image_options and not any(is_image_dataset(dataset) for dataset in size.datasets):
            raise SystemExit(f"benchmark: {' and '.join(image_options)} set how image runs are scored, and the grid has no "
                             "image dataset (a table run is scored on its synthetic.csv as written): drop them")
    if (refusal := unwritable_folder("--results-dir", args.results_dir)) is not None:
        raise SystemExit(f"benchmark: {refusal}; nothing ran")


def unwritable_folder(flag: str, folder: Path) -> str | None:
    """Why the suite could not write in ``folder`` (made if missing), or None. Asked before any
    cell: the first results file is saved after the first cell has trained, and a folder under a
    file stopped the suite there with a bare "Not a directory"."""
    existing = folder
    try:
        if folder.exists() and not folder.is_dir():
            return f"{flag} {folder} is a file, not a folder"
        while not existing.exists():
            if existing.is_symlink():
                return f"{flag} {folder}: {existing} is a link to {os.readlink(existing)}, which leads to no folder"
            existing = existing.parent
    except OSError as error:  # a folder on the way that cannot be searched, a loop of links
        return f"{flag} {folder} cannot be reached: {error.strerror or error} ({error.filename or existing})"
    if not existing.is_dir():
        return f"{flag} {folder} cannot be made: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == folder else f"{existing}, where it would be made,"
        return f"{flag} {folder}: {where} is a folder you cannot write in"
    return None


#: train settings every cell's command sets itself (:func:`~lightning_dpgan.benchmark.runner.train_command`),
#: with the benchmark option that chooses each: given again after --, train would take the later value
#: and the results would file the run under the grid's
CELL_SETTINGS = {
    "model.name": "--models", "data.name": "--datasets", "epsilon": "--epsilons", "seed": "--seeds",
    "delta": "the suite's (1e-5, or the dataset's own default below 1/n)", "output_dir": "--out-dir",
    "data.data_dir": "--data-dir", "max_steps": "--max-steps", "trainer.accelerator": "--accelerator",
    "data.dev_fraction": "--dev-fraction", "resume": "--resume", "overwrite": "--overwrite",
}


def train_settings_given(train_args: tuple[str, ...] | list[str]) -> set[str]:
    """The settings (dotted keys of train's configuration) that ``train_args`` give, read as train
    reads them; a typo or a bad value raises ``ArgumentError`` or ``ConfigError``."""
    from lightning_dpgan.cli import _train_parser, parse_overrides, settings_given_twice, train_argv
    from lightning_dpgan.config import FLAG_KEYS

    parser = _train_parser()
    parser.exit_on_error = False  # a bad value raises, for the caller to report
    train_args = train_argv(list(train_args))
    settings_given_twice(train_args)  # refuses a strategy given twice, or a setting under two names
    flags, extra = parser.parse_known_args(train_args)
    given = {FLAG_KEYS[name] for name, value in vars(flags).items() if value is not None and name != "config"}
    return given | set(parse_overrides(extra))


def check_train_args(train_args: tuple[str, ...] | list[str]) -> None:
    """Before any cell runs: the options after ``--`` are ones train reads (a typo would fail every
    cell, hours later), and none sets what the grid sets for each cell."""
    from lightning_dpgan.config import ConfigError

    try:
        given = train_settings_given(train_args)
    except (argparse.ArgumentError, ConfigError) as error:
        raise SystemExit(f"benchmark: the train options after --: {error}") from None
    owned = sorted(given & set(CELL_SETTINGS))
    if owned:
        raise SystemExit("benchmark: the train options after -- set what each cell's command sets itself, so the "
                         "results would file the runs under values they did not run at: "
                         + "; ".join(f"{key} (set by {CELL_SETTINGS[key]})" for key in owned))


def check_cell_settings(size: Size, settings: Settings, skipped: dict[str, str]) -> None:
    """Before any cell runs: each cell's train settings (the presets, with the options after
    ``--``) resolved as train resolves them, and their keys checked against the model, dataset,
    strategy and Trainer that take them (:func:`~lightning_dpgan.run.check_section_keys`): a key
    that one model lacks, or a misspelt one, would fail each of its cells, hours apart."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.run import check_section_keys, refuse_settings_of_the_other_kind

    checked = set()
    for cell in size.cells():
        if cell.dataset in skipped or (cell.model, cell.dataset, cell.epsilon) in checked:
            continue
        checked.add((cell.model, cell.dataset, cell.epsilon))
        command = train_command(cell, size, settings)
        try:
            config = build_config(command[command.index("train") + 1:])
            check_section_keys(config)
            try:
                refuse_settings_of_the_other_kind(config, is_image_dataset(cell.dataset))
            except ConfigError as error:
                raise ConfigError(f"{error}. The images suite's --n-synthetic sets how many images each cell "
                                  "is scored on") from None
        except (ConfigError, argparse.ArgumentError, ValueError) as error:  # ValueError: a model without the strategy's slot
            at = f" / ε={epsilon_text(cell.epsilon)}" if cell.epsilon is not None else ""
            raise SystemExit(f"benchmark: the cells {cell.model} / {cell.dataset}{at} would be refused by train, "
                             f"before any of them runs: {error}") from None


def refuse_non_private_models(size: Size) -> None:
    """A model that trains with ``--privacy none`` has no epsilon to be run at: each of its cells
    would be refused by train, one after the other. Say so once, before any cell, unless the
    train options after ``--`` give it a privacy strategy."""
    from lightning_dpgan import registry
    from lightning_dpgan.cli import settings_in

    if any(key == "config" for key, _, _ in settings_in(size.train_args)):
        return  # a config file may name a strategy: train decides, cell by cell
    given = privacy_given(size.train_args)
    if given not in (None, "none"):
        return
    public = [name for name in size.models if given == "none"
              or getattr(registry.lookup("model", name).load(), "default_privacy", None) == "none"]
    if public:
        raise SystemExit(f"benchmark: --models {' '.join(public)} {'trains' if len(public) == 1 else 'train'} without "
                         "privacy (--privacy none), so no cell of it has an epsilon to run at: choose private models, "
                         "or give a privacy strategy to every train command after -- (-- --privacy dp-sgd)")


def privacy_given(train_args: list[str]) -> str | None:
    """The privacy strategy the train options name (``--privacy X``, ``--privacy=X``,
    ``--privacy.name X`` or ``--privacy.name=X``; the last one given), else None."""
    from lightning_dpgan.cli import settings_in

    named = [text for key, _, text in settings_in(train_args) if key == "privacy.name"]
    return named[-1] if named else None


def chosen_size(args: argparse.Namespace) -> Size:
    size = suite_size(args.suite, args.quick).with_overrides(
        models=args.models, datasets=args.datasets, epsilons=args.epsilons, seeds=args.seeds,
        max_steps=args.max_steps, n_synthetic=args.n_synthetic, cnn_epochs=args.cnn_epochs)
    return size.with_overrides(train_args=[*size.train_args, *args.train_args])


#: options that change how a cell runs: a run given any is "custom", not the protocol
RUN_OPTIONS = ("max_steps", "n_synthetic", "cnn_epochs", "train_args")
#: options that only pick cells of the grid
GRID_OPTIONS = ("models", "datasets", "epsilons", "seeds")


def size_label(args: argparse.Namespace) -> str:
    """``dev`` (``dev-quick``) when scored on a dev split; ``quick``; ``full``; ``full-subset`` when cells were
    picked from the full grid but each still runs the full protocol (presets unchanged, three
    seeds or more, no model, dataset or epsilon outside the full grid); else ``custom``. Only full
    and full-subset runs count toward the goals."""
    if args.dev_fraction:
        return "dev-quick" if args.quick else "dev"
    if any(getattr(args, option) for option in RUN_OPTIONS) or (args.quick and any(getattr(args, o) for o in GRID_OPTIONS)):
        return "custom"
    if args.quick:
        return "quick"
    if any(getattr(args, option) for option in GRID_OPTIONS):
        full = suite_size(args.suite, False)
        outside = any(not set(getattr(args, option) or ()) <= set(getattr(full, option))
                      for option in GRID_OPTIONS if option != "seeds")  # any seeds repeat the protocol
        return "full-subset" if len(args.seeds or full.seeds) >= 3 and not outside else "custom"
    return "full"


def unavailable_datasets(datasets: tuple[str, ...], data_dir: str | None) -> dict[str, str]:
    """Datasets whose raw files can be neither found nor downloaded, with the reason."""
    from lightning_dpgan import registry

    skipped = {}
    for name in datasets:
        cls = registry.lookup("dataset", name).load()
        try:
            cls(data_dir=data_dir).prepare_data()
        except Exception as error:  # noqa: BLE001 - any failure to get the data skips the dataset, with its reason
            skipped[name] = skip_reason(error, data_dir)
    return skipped


def with_data_dir(argv: list[str], data_dir: str | None) -> list[str]:
    """``argv`` naming the data folder even when it came from ``LIGHTNING_DPGAN_DATA_DIR`` (before
    any ``--``, whose options go to train), so the recorded command reruns from any shell."""
    if not data_dir or any(word == "--data-dir" or word.startswith("--data-dir=") for word in argv):
        return list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    return [*argv[:end], "--data-dir", data_dir, *argv[end:]]


def check_resumable(size: Size, settings: Settings) -> None:
    """Before any cell runs: ``--resume`` takes up only folders left by an invocation with this
    one's settings (:func:`~lightning_dpgan.benchmark.runner.resume_mismatch`); else nothing runs."""
    mismatched = [why for cell in size.cells() if (why := resume_mismatch(cell, size, settings))]
    if mismatched:
        raise SystemExit("benchmark: --resume would take up runs made with other settings, so nothing ran:\n  "
                         + "\n  ".join(mismatched)
                         + "\nResume with the interrupted invocation's options, or give another --out-dir")


def cells_run_before(size: Size, settings: Settings, suite: str) -> list[str]:
    """The cells of ``size`` whose folders in ``settings.out_dir`` hold a run already."""
    from lightning_dpgan.benchmark.peers import peer_folder
    from lightning_dpgan.run_folder import held_run_files

    if suite == "peers":
        return [cell.name for cell in size.cells() if (peer_folder(settings.out_dir, cell) / "peer.json").exists()]
    return [cell.name for cell in size.cells() if held_run_files(settings.out_dir / cell.name)]


def check_out_dir_free(size: Size, settings: Settings, suite: str, overwrite: bool) -> None:
    """Before any cell runs: an --out-dir holding this grid's runs is continued (--resume) or
    redone (--overwrite), not redone unasked -- hours of finished cells."""
    if settings.resume or overwrite:
        return
    if earlier := cells_run_before(size, settings, suite):
        shown = ", ".join(earlier[:3]) + (f" and {len(earlier) - 3} more" if len(earlier) > 3 else "")
        resume = "" if suite in ("speed", "peers") else "continue them with --resume, "
        raise SystemExit(f"benchmark: --out-dir {settings.out_dir} holds runs of {len(earlier)} of this grid's cells "
                         f"({shown}), so nothing ran: {resume}redo them with --overwrite, or give another --out-dir")


def run_grid(size: Size, settings: Settings, skipped: dict[str, str],
             on_run: Callable[[list[dict[str, Any]]], Any] = lambda runs: None) -> list[dict[str, Any]]:
    """Every cell of ``size`` not on a skipped dataset, ``settings.jobs`` at a time; ``on_run``
    gets the runs finished so far, in grid order, after each one finishes."""
    cells = [cell for cell in size.cells() if cell.dataset not in skipped]

    def run_one(index: int, cell: Cell) -> dict[str, Any]:
        print(f"benchmark: [{index}/{len(cells)}] {cell.name}", flush=True)
        try:
            return {"status": "ok", **run_cell(cell, size, settings)}
        except Exception as error:  # noqa: BLE001 - a failed cell is recorded and the suite goes on
            print(f"benchmark: {cell.name} failed:\n{error}", file=sys.stderr, flush=True)
            return failed_run(cell, error, settings)

    if settings.jobs == 1:  # in this thread: Ctrl-C stops the running cell's process and the suite
        runs = []
        for index, cell in enumerate(cells, 1):
            runs.append(run_one(index, cell))
            on_run(runs)
        return runs
    finished: dict[int, dict[str, Any]] = {}
    pool = ThreadPoolExecutor(max_workers=settings.jobs)  # threads: each cell waits on its own processes
    try:
        futures = {pool.submit(run_one, index, cell): index for index, cell in enumerate(cells, 1)}
        for future in as_completed(futures):
            finished[futures[future]] = future.result()
            on_run([finished[index] for index in sorted(finished)])
    except BaseException:  # Ctrl-C or SIGTERM: no queued cell starts, and the running cells' processes are stopped
        # (SIGTERM: passed on already) and waited for, so none starts its next process (an evaluate after its train)
        # once the suite has said it stopped. A SIGINT sent to the suite alone reaches only this thread: its
        # children trained on, and a --resume then trained the same folders beside them
        stop_running_children()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return [finished[index] for index in sorted(finished)]


def provenance(settings: Settings, code: dict[str, Any]) -> dict[str, Any]:
    """What each fresh cell of this invocation runs under (:attr:`Settings.provenance`): the
    commit, the machine and device its wall times are measured on, and how many cells share it
    with which thread settings."""
    hardware = {key: value for key, value in machine().items() if key in ("cpu_count", "cpu_model", "gpu", "memory_gib")}
    environment = settings.child_environment() or os.environ
    return {"commit": code, "machine": hardware, "accelerator": settings.accelerator, "jobs": settings.jobs,
            "threads": {name: environment[name] for name in THREAD_VARIABLES if environment.get(name)}}


def check_reference(path: Path) -> None:
    """Refuse a ``--reference`` that the report, written after every cell ran, could not read."""
    from lightning_dpgan.benchmark.report import ReferenceFileError, load_reference

    try:
        load_reference(path)
    except ReferenceFileError as error:
        raise SystemExit(f"benchmark: {error}; nothing ran") from None


def regenerate(args: argparse.Namespace) -> None:
    from lightning_dpgan.benchmark.report import (ReferenceFileError, generated_section, load_reference,
                                                  update_results_markdown)

    if not args.results_dir.is_dir():  # a typo would otherwise replace every table with "no results yet"
        raise SystemExit(f"benchmark: --results-dir {args.results_dir} is not a folder of results files; "
                         f"RESULTS.md ({args.results_md}) was left as it is")

    try:
        section = generated_section(args.results_dir, load_reference(args.reference), list(SUITES),
                                    relative_to=args.results_md.parent, reference_file=args.reference)
    except ReferenceFileError as error:
        raise SystemExit(f"benchmark: {error}; RESULTS.md ({args.results_md}) was left as it is") from None
    except ResultsFileError as error:  # one bad file would otherwise drop its figures or stop with a traceback
        raise SystemExit(f"benchmark: {error}; RESULTS.md ({args.results_md}) was left as it is: repair the file "
                         "or move it out of the results folder") from None
    update_results_markdown(args.results_md, section)
    print(f"benchmark: updated {args.results_md}")
    stale = remove_unreferenced_plots(args.results_dir / "plots", "\n".join(
        path.read_text() for path in dict.fromkeys(_markdown_that_may_show_the_plots(args)) if path.is_file()))
    if stale:
        print(f"benchmark: removed {len(stale)} plot(s) RESULTS.md no longer shows: {', '.join(stale)}")


def _markdown_that_may_show_the_plots(args: argparse.Namespace) -> list[Path]:
    """The file just written, and the results folder's own RESULTS.md files (its own and the
    checkout's beside it): a preview written elsewhere (--results-md) names none of the plots
    their hand-written parts link, and those must stay."""
    return [args.results_md, args.results_dir / "RESULTS.md", args.results_dir.parent / "RESULTS.md"]


#: the names the harness gives its plots: ``<suite>-<date>[-N][-<dataset>].png`` (report.plot_suite)
HARNESS_PLOT = re.compile(r"(tables|images|speed|peers)-\d{4}-\d{2}-\d{2}(-\d+)?(-[\w.+-]+)?\.png")


def remove_unreferenced_plots(plots: Path, markdown: str) -> list[str]:
    """The harness's plots that ``markdown`` (generated and hand-written parts alike) names
    nowhere: drawn for results a newer file has replaced, they would pile up in the checkout.
    Any other picture in the folder is the user's, and stays."""
    stale = sorted(path.name for path in plots.glob("*.png")
                   if HARNESS_PLOT.fullmatch(path.name) and path.name not in markdown) if plots.is_dir() else []
    for name in stale:
        (plots / name).unlink()
    return stale


def run_suite(args: argparse.Namespace, size: Size, settings: Settings, skipped: dict[str, str],
              on_run: Callable[[list[dict[str, Any]]], Any]) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """The suite's runs, its extras (the speed suite's micro benchmarks) and the datasets skipped."""
    if args.suite == "peers":
        from lightning_dpgan.benchmark.peers import run_peers

        runs, also_skipped = run_peers(size, settings, args.peers_venv, on_run=on_run)
        return runs, {}, {**skipped, **also_skipped}
    runs = run_grid(size, settings, skipped, on_run=on_run)
    if args.suite != "speed":
        return runs, {}, skipped
    from lightning_dpgan.benchmark.speed import micro_benchmarks

    return runs, micro_benchmarks(args.quick, args.data_dir, args.accelerator, settings.out_dir), skipped


def benchmark(argv: list[str]) -> Path:
    args = parse_args(argv)
    check_benchmarks_folder()
    made_with_the_results = args.results_md.parent == args.results_dir and not args.report_only
    if args.report_only and not args.results_dir.is_dir():  # the folder read first: named before RESULTS.md's
        raise SystemExit(f"benchmark: --results-dir {args.results_dir} is not a folder of results files; nothing "
                         "was regenerated")
    if not args.results_md.parent.is_dir() and not made_with_the_results:  # found at the end, after hours of cells
        raise SystemExit(f"benchmark: the folder of --results-md {args.results_md} does not exist: create it, or give "
                         "another file")
    if args.results_md.is_dir():  # found at the end too, after every cell, by a bare "Is a directory"
        raise SystemExit(f"benchmark: --results-md {args.results_md} is a folder: give the file to write, e.g. "
                         f"{args.results_md / 'RESULTS.md'}")
    if args.results_md.parent.is_dir() and not os.access(args.results_md.parent, os.W_OK | os.X_OK):
        raise SystemExit(f"benchmark: --results-md {args.results_md} is in a folder you cannot write in: give "
                         "another file")
    if args.report_only:
        regenerate(args)
        return args.results_md
    check_reference(args.reference)
    size = chosen_size(args)
    check_grid(args, size)
    if args.data_dir is None and (found := default_data_dir()) is not None:
        # the folder LIGHTNING_DPGAN_DATA_DIR names: passed on, so every recorded command says --data-dir DATA_DIR
        args.data_dir = str(found)
    if args.jobs < 1:
        raise SystemExit(f"benchmark: --jobs must be 1 or more, not {args.jobs}")
    if args.resume and (args.out_dir is None or args.suite in ("speed", "peers")):
        raise SystemExit("benchmark: --resume continues the runs of an earlier invocation: give its --out-dir "
                         "(not for the speed and peers suites, whose runs are timed whole)")
    if args.out_dir is not None and (refusal := unwritable_folder("--out-dir", args.out_dir)) is not None:
        raise SystemExit(f"benchmark: {refusal}: give a folder for the runs (it is created if missing); nothing ran")
    if args.resume and not args.out_dir.is_dir():  # a typo would run the whole suite afresh under --resume
        raise SystemExit(f"benchmark: --resume --out-dir {args.out_dir}: no such folder, so there is nothing to "
                         "continue: give the --out-dir of the interrupted invocation, or drop --resume to run the "
                         "suite afresh")
    try:
        check_dev_fraction(args.dev_fraction, flag="--dev-fraction")
    except ValueError as error:
        raise SystemExit(f"benchmark: {error}") from None
    if args.dev_fraction and args.suite in ("speed", "peers"):
        raise SystemExit(f"benchmark: --dev-fraction scores runs on a dev split; the {args.suite} suite "
                         + ("times runs and scores none" if args.suite == "speed" else "scores the peers on the test split"))
    if args.jobs > 1 and args.suite in ("speed", "peers"):
        raise SystemExit(f"benchmark: the {args.suite} suite compares wall times, each run alone; "
                         "--jobs would have them share the machine")
    started = datetime.now()
    out_dir = args.out_dir or Path("runs") / "benchmark" / f"{args.suite}-{started:%Y%m%d-%H%M%S}"
    if args.out_dir is None and (refusal := unwritable_folder("the runs' folder", out_dir)) is not None:
        raise SystemExit(f"benchmark: {refusal}: give --out-dir; nothing ran")
    # the harness's own outputs are no change of code (the runs too, were they inside the checkout)
    own = {"own_output": args.results_md, "own_folders": (args.results_dir, out_dir)}
    code = commit(**own)  # the code that runs: taken now
    skipped = unavailable_datasets(size.datasets, args.data_dir)
    cells = sum(cell.dataset not in skipped for cell in size.cells())
    # no more at a time than there are cells: each cell's share of the cores is the machine's over these
    settings = Settings(out_dir=out_dir, data_dir=args.data_dir, accelerator=args.accelerator,
                        evaluate=args.suite != "speed", jobs=max(1, min(args.jobs, cells)), resume=args.resume,
                        dev_fraction=args.dev_fraction)
    settings = replace(settings, provenance=provenance(settings, code))
    if args.suite != "peers":
        check_cell_settings(size, settings, skipped)
    if skipped and set(skipped) >= set(size.datasets):  # nothing to run: no file that would read as a finished suite
        reasons = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
        remedy = (f"Put the files in the data folder, {args.data_dir}" if args.data_dir else
                  "Give --data-dir, or set LIGHTNING_DPGAN_DATA_DIR")  # a folder given already: not "give one"
        raise SystemExit(f"benchmark: no dataset of the {args.suite} suite is at hand, so nothing ran and nothing "
                         f"was written ({reasons}). {remedy}")
    if args.resume and args.overwrite:
        raise SystemExit("benchmark: --resume continues the runs in --out-dir and --overwrite redoes them: give one")
    try:
        with out_dir_locked(out_dir):
            return run_in_out_dir(args, argv, size, settings, skipped, started, code, own)
    except OutDirBusyError as busy:  # before check_out_dir_free: its --resume advice would train its cells beside it
        raise SystemExit(f"benchmark: {busy}, so nothing ran: wait for it to finish, or give another --out-dir") from None


def run_in_out_dir(args: argparse.Namespace, argv: list[str], size: Size, settings: Settings, skipped: dict[str, str],
                   started: datetime, code: dict[str, Any], own: dict[str, Any]) -> Path:
    """The suite proper, once :func:`benchmark` has checked its options and holds ``--out-dir``:
    run the cells not yet run, save the results file after each, and regenerate RESULTS.md."""
    out_dir = settings.out_dir
    check_out_dir_free(size, settings, args.suite, args.overwrite)
    if args.resume:
        check_resumable(size, settings)
    results_file = ResultsFile(args.results_dir, args.suite, {
        "suite": args.suite, "size": size_label(args), "started": started.isoformat(timespec="seconds"),
        "command": portable(["python", "-m", "lightning_dpgan", "benchmark", *with_data_dir(argv, args.data_dir)], args.data_dir,
                            str(args.peers_venv) if args.peers_venv else None, args.out_dir,
                            {str(path): name for path, name in [(args.results_dir, "RESULTS_DIR"),
                             (args.results_md, "RESULTS_MD"), (args.reference, "REFERENCE")] if path.is_absolute()}),
        "machine": machine(), "commit": code, "seeds": list(size.seeds), "jobs": settings.jobs,
        **({"threads_per_job": environment["OMP_NUM_THREADS"]}
           if (environment := settings.child_environment()) else {}),
    })

    def save(runs: list[dict[str, Any]], **fields: Any) -> Path:
        try:
            return results_file.save(runs, **fields)
        except OSError as error:  # a full disk, say: the suite stops (with its running cells), saying where its runs are
            stop_running_children()
            raise SystemExit(f"benchmark: the results file could not be written in {args.results_dir} ({error}); the "
                             f"suite stopped, with the processes it was running. Its runs are in {out_dir}: "
                             f"{again_command()}") from None

    def save_partial(runs: list[dict[str, Any]]) -> None:
        save(runs, skipped=skipped)

    def again_command() -> str:
        return (f"run it again: its runs are timed whole (--overwrite redoes them in {out_dir})"
                if args.suite in ("speed", "peers") else
                f"continue with the same command and --resume --out-dir {out_dir}: each cell takes up where it stopped")

    try:
        with children_stopped_on_sigterm():
            runs, extras, skipped = run_suite(args, size, settings, skipped, save_partial)
    except (SuiteTerminated, KeyboardInterrupt) as stop:
        kept = f"the runs it finished are in {results_file.path}" if results_file.path else "it finished no run"
        if isinstance(stop, KeyboardInterrupt):  # cli.main prints it after "benchmark: ", exit status 130
            raise KeyboardInterrupt(f"interrupted, with the processes it was running; {kept}. To finish the suite, "
                                    f"{again_command()}") from None
        print(f"benchmark: stopped by SIGTERM, with the processes it was running; {kept}. To finish the suite, "
              f"{again_command()}", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from None
    ended = commit(**own)
    changed = {} if ended == code else {"commit_at_end": ended}  # each cell ran the tree as it was when it started
    path = save(runs, complete=True, skipped=skipped, extras=extras, **changed)
    try:
        regenerate(args)  # "benchmark: wrote PATH" is the command's last line (cli.main)
    except SystemExit as error:  # RESULTS.md left as it was: the measured results are still there
        raise SystemExit(f"{error.code}. The suite's results were written to {path}") from None
    failed = ["some runs"] if any(run.get("status") == "failed" for run in runs) else []
    failed += [f"the {name} script" for name, extra in extras.items() if "failed" in extra]  # the speed suite's
    if failed:
        print(f"benchmark: wrote {path}; {' and '.join(failed)} failed (listed in it and in RESULTS.md)", file=sys.stderr)
        raise SystemExit(1)
    return path


__all__ = ["benchmark", "chosen_size", "parse_args", "run_grid", "unavailable_datasets"]
