"""SIGTERM to a running suite stops it as Ctrl-C does, with its train/evaluate processes: they get
the signal (train keeps what it can resume from), no further cell starts, the finished runs stay in
the results file; and an --out-dir already holding the grid's runs is continued or redone only
when asked (--resume, --overwrite), never redone unasked."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lightning_dpgan.benchmark import cli
from lightning_dpgan.benchmark.runner import Settings, run_logged
from lightning_dpgan.benchmark.stopping import SuiteTerminated, children_stopped_on_sigterm, waited_on
from lightning_dpgan.benchmark.suites import suite_size

#: a child that says when it started, and what ended it
CHILD = """
import pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    (folder / "stopped_by").write_text(signal.Signals(signum).name)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
(folder / "started").write_text("yes")
time.sleep(60)
(folder / "finished").write_text("yes")  # only a child nothing stopped gets here
"""


def sigterm_once_started(folder) -> threading.Thread:
    """SIGTERM to this (the suite's) process alone, once the child has started."""
    def send():
        deadline = time.monotonic() + 30
        while not (folder / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_sigterm_to_the_suite_alone_reaches_its_child_which_stops_as_its_own_sigterm_makes_it(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    log = tmp_path / "cell.log"
    with children_stopped_on_sigterm():
        sender = sigterm_once_started(tmp_path)
        with pytest.raises(SuiteTerminated):
            run_logged([sys.executable, "-c", CHILD, str(tmp_path)], log)
        sender.join()
        assert (tmp_path / "stopped_by").read_text() == "SIGTERM"  # its own handler ran: not killed outright
        # nothing starts after it, not even a process that would be quick
        with pytest.raises(SuiteTerminated):
            waited_on([sys.executable, "-c", f"open({str(tmp_path / 'late')!r}, 'w')"])
    assert not (tmp_path / "late").exists()
    assert not (tmp_path / "finished").exists()  # it did not sleep out its minute
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the suite's only while it runs


def test_a_failed_child_is_still_a_failure_and_not_a_stop(tmp_path):
    with children_stopped_on_sigterm(), pytest.raises(RuntimeError, match="exit 3"):
        run_logged([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "cell.log")


def tiny_grid():
    return suite_size("tables", quick=False).with_overrides(models=["quail", "dpctgan"], datasets=["adult"],
                                                          epsilons=[1.0], seeds=[0])


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_stopped_cell_is_not_recorded_as_failed_and_the_grid_goes_no_further(tmp_path, monkeypatch, jobs):
    started, ended, recorded = [], [], []

    beside = threading.Event()

    def stopped_cell(cell, size, settings):
        started.append(cell.name)
        if len(started) == 1:
            if jobs > 1:  # the signal comes while a cell runs beside this one
                assert beside.wait(10)
            raise SuiteTerminated
        beside.set()
        time.sleep(0.5)  # whose process the signal also reached
        ended.append(cell.name)
        return {**cell.record, "measures": {}}

    monkeypatch.setattr(cli, "run_cell", stopped_cell)
    with pytest.raises(SuiteTerminated):
        cli.run_grid(tiny_grid(), Settings(out_dir=tmp_path, jobs=jobs), {}, on_run=recorded.append)
    assert not any(run.get("status") == "failed" for runs in recorded for run in runs)
    assert len(started) <= jobs
    assert ended == started[1:]  # the cells beside it were waited for: none starts a process after the suite ended


def benchmark_args(tmp_path, *extra):
    return ["--suite", "tables", "--models", "quail", "dpctgan", "--datasets", "adult", "--epsilons", "1", "--seeds",
            "0", "--results-dir", str(tmp_path / "results"), "--out-dir", str(tmp_path / "runs"), *extra]


@pytest.fixture
def no_data_or_git(monkeypatch):
    monkeypatch.setattr(cli, "commit", lambda **kwargs: {"sha": "abc", "dirty": False})
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    monkeypatch.setattr(cli, "check_cell_settings", lambda size, settings, skipped: None)


def stopped_after_one_run(stop: type[BaseException]):
    """A grid that finishes one run, then is stopped by ``stop`` (SIGTERM's or Ctrl-C's)."""
    def grid(size, settings, skipped, on_run):
        on_run([{"status": "ok", **size.cells()[0].record, "measures": {"utility/B_auroc": 0.8}}])
        raise stop

    return grid


def test_a_suite_stopped_by_sigterm_keeps_its_finished_runs_and_says_how_to_continue(tmp_path, monkeypatch, capsys,
                                                                                   no_data_or_git):
    monkeypatch.setattr(cli, "run_grid", stopped_after_one_run(SuiteTerminated))
    with pytest.raises(SystemExit) as stop:
        cli.benchmark(benchmark_args(tmp_path))
    assert stop.value.code == 128 + signal.SIGTERM
    (kept,) = (tmp_path / "results").glob("tables-*.json")
    content = json.loads(kept.read_text())
    assert content["complete"] is False and len(content["runs"]) == 1
    said = capsys.readouterr().err
    assert "stopped by SIGTERM" in said and str(kept) in said and f"--resume --out-dir {tmp_path / 'runs'}" in said


def test_a_suite_stopped_by_ctrl_c_says_where_its_runs_are_and_how_to_continue(tmp_path, monkeypatch, capsys,
                                                                                no_data_or_git):
    """It said only "benchmark: interrupted", its runs in a timestamped folder the user had to find."""
    from lightning_dpgan.cli import main

    monkeypatch.setattr(cli, "run_grid", stopped_after_one_run(KeyboardInterrupt))
    assert main(["benchmark", *benchmark_args(tmp_path)]) == 130
    (kept,) = (tmp_path / "results").glob("tables-*.json")
    assert json.loads(kept.read_text())["complete"] is False
    said = capsys.readouterr().err
    assert said.startswith("benchmark: interrupted, with the processes it was running; the runs it finished are in "
                           f"{kept}"), said
    assert f"--resume --out-dir {tmp_path / 'runs'}" in said


def test_a_results_file_that_cannot_be_saved_stops_the_suite_naming_the_runs_folder(tmp_path, monkeypatch,
                                                                                   no_data_or_git):
    """A full disk at the first save (after the first cell had trained) ended the suite with a bare
    OS error, which said nothing of the run it had just made; under --jobs the cells running beside
    it trained on to their end, unrecorded. They are stopped as SIGTERM stops them."""
    from lightning_dpgan.benchmark.results import ResultsFile

    def disk_full(self, runs, complete=False, **fields):
        raise OSError(28, "No space left on device")

    def grid_with_a_cell_running_beside(size, settings, skipped, on_run):
        def cell():
            with contextlib.suppress(SuiteTerminated):
                waited_on([sys.executable, "-c", CHILD, str(tmp_path)])

        beside = threading.Thread(target=cell)
        beside.start()
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            on_run([{"status": "ok"}])
        finally:
            beside.join(30)

    monkeypatch.setattr(ResultsFile, "save", disk_full)
    monkeypatch.setattr(cli, "run_grid", grid_with_a_cell_running_beside)
    with pytest.raises(SystemExit) as stop:
        cli.benchmark(benchmark_args(tmp_path))
    assert "results file could not be written" in stop.value.code and "No space left on device" in stop.value.code
    assert f"in {tmp_path / 'runs'}: continue with the same command and --resume --out-dir" in stop.value.code
    assert (tmp_path / "stopped_by").read_text() == "SIGTERM"


def test_a_sigterm_while_a_peer_is_scored_here_keeps_that_run_and_starts_no_other(tmp_path, monkeypatch):
    """The peers suite scores each table in its own process, which the signal does not stop: the
    scoring ended, and the next peer was then announced and its folder made (it did not start)."""
    from lightning_dpgan import evaluate as evaluate_module
    from lightning_dpgan.benchmark import peers, stopping

    adult = Path(__file__).parent / "fixtures" / "adult_tiny"
    started = []

    def fake_peer(command, log):
        started.append(log.parent.name)
        log.parent.mkdir(parents=True, exist_ok=True)
        option = lambda name: Path(command[command.index(name) + 1])
        pd.read_csv(option("--train")).to_csv(option("--out"), index=False)
        option("--report").write_text(json.dumps({"delta": 1e-5}))
        return 1.0

    def scored_as_sigterm_arrives(*args, **kwargs):
        stopping._pass_on(signal.SIGTERM, None)  # what the suite's SIGTERM handler runs
        return {"utility/B_auroc": 0.7}

    monkeypatch.setattr(peers, "ensure_venv", lambda venv, log: Path("python"))
    monkeypatch.setattr(peers, "run_logged", fake_peer)
    monkeypatch.setattr(evaluate_module, "evaluate_table", scored_as_sigterm_arrives)
    size = suite_size("peers", quick=True).with_overrides(models=["mst", "mwem"], datasets=["adult"], seeds=[0],
                                                          epsilons=[1.0])
    recorded = []
    with children_stopped_on_sigterm(), pytest.raises(SuiteTerminated):
        peers.run_peers(size, Settings(out_dir=tmp_path, data_dir=str(adult)), venv=tmp_path / "venv",
                        on_run=lambda runs: recorded.append([run["model"] for run in runs]))
    assert recorded == [["mst"]] and len(started) == 1
    assert sorted(path.name for path in tmp_path.iterdir() if "mwem" in path.name) == []


@pytest.mark.parametrize("marker", ["privacy.json", "checkpoints"])
def test_an_out_dir_holding_the_grids_runs_is_continued_or_redone_only_when_asked(tmp_path, monkeypatch, no_data_or_git,
                                                                                 marker):
    ran = []
    monkeypatch.setattr(cli, "run_grid", lambda size, settings, skipped, on_run: ran.append(settings) or [])
    monkeypatch.setattr(cli, "regenerate", lambda args: None)
    cell = tmp_path / "runs" / tiny_grid().cells()[1].name
    cell.mkdir(parents=True)
    (cell / marker).mkdir() if marker == "checkpoints" else (cell / marker).write_text("{}")
    with pytest.raises(SystemExit, match=r"holds runs of 1 of this grid's cells \(dpctgan.*nothing ran: continue them "
                                         r"with --resume, redo them with --overwrite"):
        cli.benchmark(benchmark_args(tmp_path))
    assert not ran and not (tmp_path / "results").exists()
    with pytest.raises(SystemExit, match="give one"):
        cli.benchmark(benchmark_args(tmp_path, "--resume", "--overwrite"))
    cli.benchmark(benchmark_args(tmp_path, "--overwrite"))
    assert len(ran) == 1 and not ran[0].resume


def test_a_speed_script_that_failed_makes_the_suite_fail_with_its_name(tmp_path, monkeypatch, capsys, no_data_or_git):
    from lightning_dpgan.benchmark import speed

    def one_script_fails(command, log, env=None):
        if "teacher_ensemble.py" in command[1]:
            raise RuntimeError("teacher_ensemble.py failed (exit 1)")
        Path(command[command.index("--json") + 1]).write_text(json.dumps({"rows": [{"k": 1}]}))
        return 0.1

    monkeypatch.setattr(speed, "run_logged", one_script_fails)
    monkeypatch.setattr(cli, "run_grid", lambda size, settings, skipped, on_run: [])
    monkeypatch.setattr(cli, "regenerate", lambda args: None)
    with pytest.raises(SystemExit) as failed:
        cli.benchmark(["--suite", "speed", "--quick", "--results-dir", str(tmp_path / "results"),
                       "--out-dir", str(tmp_path / "runs")])
    assert failed.value.code == 1
    assert "the teacher_ensemble script failed" in capsys.readouterr().err
    (written,) = (tmp_path / "results").glob("speed-*.json")
    assert "failed" in json.loads(written.read_text())["extras"]["teacher_ensemble"]


def test_sigint_to_the_suite_alone_stops_the_cells_running_beside_each_other_before_it_says_so(tmp_path, monkeypatch):
    """With --jobs 2 a SIGINT sent to the suite's process alone (not a terminal's Ctrl-C, which
    reaches its children too) only interrupted the main thread: it said it had stopped while both
    cells trained on and then started their evaluate, and the --resume it advised trained the
    same folders beside them. Now their processes are stopped and waited for first."""
    def cell_of_two_processes(cell, size, settings):
        folder = tmp_path / cell.name
        folder.mkdir()
        run_logged([sys.executable, "-c", CHILD, str(folder)], folder / "train.log")  # train
        waited_on([sys.executable, "-c", f"open({str(folder / 'evaluated')!r}, 'w')"])  # then evaluate
        return {**cell.record, "measures": {}}

    def sigint_once_both_started():
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("*/started"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cli, "run_cell", cell_of_two_processes)
    grid = suite_size("tables", quick=False).with_overrides(models=["quail", "dpctgan"], datasets=["adult"],
                                                          epsilons=[1.0], seeds=[0, 1])
    sender = threading.Thread(target=sigint_once_both_started, daemon=True)
    with children_stopped_on_sigterm():
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            cli.run_grid(grid, Settings(out_dir=tmp_path, jobs=2), {}, on_run=lambda runs: None)
    sender.join()
    folders = [path.parent for path in tmp_path.glob("*/started")]
    assert len(folders) == 2
    for folder in folders:  # both trains stopped as their own SIGTERM makes them, before the suite returned
        assert (folder / "stopped_by").read_text() == "SIGTERM"
        assert not (folder / "evaluated").exists() and not (folder / "finished").exists()
    assert len(list(tmp_path.iterdir())) == 2  # no third cell started
