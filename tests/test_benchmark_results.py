"""The results files (summaries, naming, which file stands for a suite) and the peers' inputs
(the spec and split they are handed, the command they run), checked on tiny hand-made records:
no suite runs, no virtualenv is made, no peer process starts."""
from __future__ import annotations

import json
import statistics
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lightning_dpgan.benchmark import peers, results
from lightning_dpgan.benchmark.runner import Settings
from lightning_dpgan.benchmark.suites import Cell, Size, delta_for, suite_size
from lightning_dpgan.data.schema import Column, TableSchema


def run(model: str, seed: int, auroc: float | None, epsilon: float = 1.0, **fields) -> dict:
    return {"status": "ok", "model": model, "dataset": "adult", "target_epsilon": epsilon, "seed": seed,
            "epsilon": 0.9, "steps": 10, "train_seconds": 5.0 + seed, "fit_seconds": 4.0,
            "measures": {"utility/B_auroc": auroc}, **fields}


def write(folder: Path, day: date, size: str, runs: list[dict], **fields) -> Path:
    path = results.results_path(folder, "tables", day)
    path.write_text(json.dumps({"size": size, "runs": runs, "summary": results.aggregate(runs), **fields}))
    return path


# ----------------------------------------------------------------------- summaries
def test_a_measure_no_seed_produced_has_no_mean_rather_than_a_zero():
    """A cell whose every seed gave None/NaN must not show 0.000 (a figure nobody measured)."""
    assert results.summarize([None, float("nan"), float("inf")]) == {"mean": None, "std": None, "n": 0}
    assert results.summarize([]) == {"mean": None, "std": None, "n": 0}
    # two seeds are enough for a sample standard deviation (n - 1 in the denominator)
    two = results.summarize([0.5, None, 0.7])
    assert two["n"] == 2 and two["std"] == pytest.approx(statistics.stdev([0.5, 0.7]))
    assert two["std"] != pytest.approx(statistics.pstdev([0.5, 0.7]))


def test_cells_at_two_epsilons_of_one_model_are_not_averaged_together():
    rows = results.aggregate([run("a", 0, 0.6, epsilon=1.0), run("a", 0, 0.8, epsilon=10.0)])
    means = {row["target_epsilon"]: row["measures"]["utility/B_auroc"]["mean"] for row in rows}
    assert means == pytest.approx({1.0: 0.6, 10.0: 0.8})


def test_a_run_recorded_without_a_status_counts_as_measured_and_a_flag_is_not_a_measure():
    """Older files wrote no status on their runs: their seeds count. A boolean measure (a flag
    such as a check that passed) is no number to average."""
    plain = {key: value for key, value in run("a", 0, 0.6).items() if key != "status"}
    (row,) = results.aggregate([plain, run("a", 1, 0.8)])
    assert row["seeds"] == [0, 1] and row["measures"]["utility/B_auroc"]["mean"] == pytest.approx(0.7)
    flagged = [run("a", seed, 0.6) | {"measures": {"utility/B_auroc": 0.6, "converged": True}} for seed in range(2)]
    (row,) = results.aggregate(flagged)
    assert "converged" not in row["measures"]


def test_a_failed_run_of_a_data_dependent_model_does_not_mark_its_cells_measurement():
    """The mark says the measured epsilon is data-dependent with no bound beside it; a failed
    run measured nothing, so it cannot put the mark on a cell whose ok runs kept the bound."""
    measured = [run("pategan", seed, 0.5, epsilon_data_independent=6400.0) for seed in range(2)]
    failed = {**run("pategan", 2, None), "status": "failed"}
    (row,) = results.aggregate(measured + [failed])
    assert "data_dependent_unrecorded" not in row
    (row,) = results.aggregate([run("pategan", 0, 0.5)])  # no bound, no data-independent command
    assert row["data_dependent_unrecorded"] is True


def test_a_peers_pate_model_that_reports_no_spend_is_said_to_report_none_not_to_be_ours_unrecorded():
    """smartnoise-synth's pategan shares our model's name: its cell read "– data-dependent (no
    data-independent bound recorded)", the mark of our older runs, where the peer reports no spend."""
    from lightning_dpgan.benchmark.report import _spent

    peer = [run("pategan", seed, 0.5, epsilon=1.0) | {"epsilon": None, "peer": {"options": {}}} for seed in range(2)]
    (row,) = results.aggregate(peer)
    assert "data_dependent_unrecorded" not in row and row["peer_spend_unreported"] is True
    assert _spent(row) == "– (not reported by the peer: its target only)"
    reported = [run("dpctgan", 0, 0.5) | {"epsilon": 0.98, "peer": {"options": {"epsilon_spent_opacus_rdp": 0.98}}}]
    (row,) = results.aggregate(reported)
    assert "peer_spend_unreported" not in row and _spent(row) == "0.980 (1)"


# ----------------------------------------------------------------------- file names
def test_a_second_file_of_the_day_is_named_dash_two_and_the_first_is_kept(tmp_path):
    day = date(2026, 3, 4)
    first = results.results_path(tmp_path, "tables", day)
    assert first.name == "tables-2026-03-04.json"
    first.write_text("{}")
    second = results.results_path(tmp_path, "tables", day)
    assert second.name == "tables-2026-03-04-2.json"
    second.write_text("{}")
    assert results.results_path(tmp_path, "tables", day).name == "tables-2026-03-04-3.json"
    assert results.results_path(tmp_path, "images", day).name == "images-2026-03-04.json"  # per suite


def test_files_are_ordered_by_date_then_by_their_number_as_a_number(tmp_path):
    names = ["tables-2026-01-02.json", "tables-2026-01-02-9.json", "tables-2026-01-02-10.json",
             "tables-2026-01-02-2.json", "tables-2025-12-31-11.json", "tables-2026-01-03.json"]
    for name in names:
        (tmp_path / name).write_text("{}")
    (tmp_path / "tables-2026-01-02-3-4.json").write_text("{}")  # five parts: not a results file name
    (tmp_path / "tablesx-2027-01-01.json").write_text("{}")  # another suite's prefix
    ordered = [path.name for path in results._newest_first(tmp_path, "tables")]
    assert ordered == ["tables-2026-01-03.json", "tables-2026-01-02-10.json", "tables-2026-01-02-9.json",
                       "tables-2026-01-02-2.json", "tables-2026-01-02.json", "tables-2025-12-31-11.json"]


def test_a_file_without_a_size_is_refused_by_name(tmp_path):
    path = results.results_path(tmp_path, "tables", date(2026, 1, 1))
    path.write_text(json.dumps({"runs": [], "summary": []}))
    with pytest.raises(results.ResultsFileError, match=r"tables-2026-01-01\.json.*it has no size"):
        results.latest_results(tmp_path, "tables")


# ----------------------------------------------------------------------- which figures stand
def test_a_row_ran_every_seed_only_when_it_holds_each_planned_seed():
    content = {"seeds": [0, 1, 2]}
    assert results.ran_every_seed(content, {"seeds": [2, 0, 1]})
    assert not results.ran_every_seed(content, {"seeds": [0, 1]})
    assert not results.ran_every_seed(content, {"seeds": [0, 1, 3]})
    assert results.ran_every_seed({}, {"seeds": [0]})  # a file that planned no seeds list: any row is whole


def test_a_stopped_file_whose_cell_ran_every_seed_stands_though_one_seed_failed():
    """finished_summary keeps the cells that *attempted* every planned seed: a stopped file whose
    quail cell had one failed seed still gave that cell (merge_subsets then prefers a whole one)."""
    content = {"complete": False, "seeds": [0, 1], "runs": [run("quail", 0, 0.8), {**run("quail", 1, None), "status": "failed"},
                                                           run("pategan", 0, 0.5)]}
    content["summary"] = results.aggregate(content["runs"])
    assert [row["model"] for row in results.finished_summary(content)] == ["quail"]
    # a file written before the flag existed was written whole: every row counts
    del content["complete"]
    assert {row["model"] for row in results.finished_summary(content)} == {"quail", "pategan"}


def test_the_newest_whole_measurement_of_a_cell_wins_and_brings_only_its_runs(tmp_path):
    old = [run("quail", s, 0.80) for s in range(2)]
    new = [run("quail", s, 0.90) for s in range(2)]
    pategan = [run("pategan", s, 0.60) for s in range(2)]  # a cell only the older file measured
    write(tmp_path, date(2026, 1, 1), "full-subset", old + pategan, seeds=[0, 1])
    write(tmp_path, date(2026, 1, 2), "full-subset", new, seeds=[0, 1])
    write(tmp_path, date(2026, 1, 3), "quick", [run("quail", s, 0.10) for s in range(2)], seeds=[0, 1])
    merged = results.protocol_results(tmp_path, "tables")
    means = {row["model"]: row["measures"]["utility/B_auroc"]["mean"] for row in merged["summary"]}
    assert means == pytest.approx({"quail": 0.90, "pategan": 0.60})
    assert sorted((r["model"], r["measures"]["utility/B_auroc"]) for r in merged["runs"]) == sorted(
        [("quail", 0.90)] * 2 + [("pategan", 0.60)] * 2)  # the older quail runs are not carried along
    assert [part["file"] for part in merged["parts"]] == ["tables-2026-01-02.json", "tables-2026-01-01.json"]
    assert merged["file"] == "tables-2026-01-02.json"  # the merged result is headed by its newest part


def test_only_full_and_full_subset_runs_stand_for_the_protocol(tmp_path):
    write(tmp_path, date(2026, 1, 1), "quick", [run("quail", 0, 0.8)])
    write(tmp_path, date(2026, 1, 2), "custom", [run("quail", 0, 0.8)])
    assert results.protocol_results(tmp_path, "tables") is None
    write(tmp_path, date(2026, 1, 3), "full", [run("quail", 0, 0.7)])
    assert results.protocol_results(tmp_path, "tables")["parts"][0]["size"] == "full"


def test_a_cell_that_only_failed_is_shown_from_the_newest_file_that_attempted_it(tmp_path):
    failed = lambda error: [{**run("pategan", s, None), "status": "failed", "error": error} for s in range(2)]
    write(tmp_path, date(2026, 1, 1), "full-subset", failed("old"))
    write(tmp_path, date(2026, 1, 2), "full-subset", failed("new") + [run("quail", 0, 0.8)])
    merged = results.protocol_results(tmp_path, "tables")
    (part,) = merged["parts"]
    assert part["file"] == "tables-2026-01-02.json" and part["failed_cells"] == [("pategan", "adult", 1.0)]
    assert {r["error"] for r in merged["runs"] if r["status"] == "failed"} == {"new"}


def test_a_newer_attempt_that_failed_is_named_beside_the_older_figure_it_did_not_replace(tmp_path):
    """The figure stays the older file's (nothing newer measured the cell), but the newer file
    that failed on it is a part of the result, listing the cell, and the row says so; a failure
    older than the figure is superseded by it and is not listed."""
    failed = lambda error: [{**run("quail", s, None), "status": "failed", "error": error} for s in range(2)]
    write(tmp_path, date(2026, 1, 1), "full-subset", failed("older"), seeds=[0, 1])
    write(tmp_path, date(2026, 1, 2), "full-subset", [run("quail", s, 0.8) for s in range(2)], seeds=[0, 1])
    write(tmp_path, date(2026, 1, 3), "full-subset", failed("newer"), seeds=[0, 1])
    merged = results.protocol_results(tmp_path, "tables")
    newer, measured = merged["parts"]
    assert newer["file"] == "tables-2026-01-03.json" and newer["cells"] == [] and newer["failed_cells"] == []
    assert newer["failed_since"] == [("quail", "adult", 1.0)]
    assert measured["file"] == "tables-2026-01-02.json" and measured["failed_since"] == []
    (row,) = merged["summary"]
    assert row["newest_attempt_failed"] and row["measures"]["utility/B_auroc"]["mean"] == pytest.approx(0.8)
    assert {r["error"] for r in merged["runs"] if r["status"] == "failed"} == {"newer"}
    (tmp_path / "tables-2026-01-03.json").unlink()  # the measurement is the newest attempt again
    (row,) = results.protocol_results(tmp_path, "tables")["summary"]
    assert "newest_attempt_failed" not in row


# ----------------------------------------------------------------------- peers
def categorical_schema():
    return TableSchema((Column("age", "integer", bounds=(17, 90)),
                        Column("grade", "categorical", categories=tuple(np.array([1, 2, 3]))),
                        Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")


def test_the_spec_declares_bounds_as_numbers_and_numpy_categories_as_plain_values():
    """The spec is JSON: a numpy integer category would not serialize, and a peer reading
    "grade" must see the same category values our schema declares."""
    spec = peers.table_spec(categorical_schema())
    text = json.dumps(spec)
    assert json.loads(text)["categorical"]["grade"] == [1, 2, 3]
    assert all(type(c) is int for c in spec["categorical"]["grade"])
    assert all(type(b) is float for b in spec["continuous"]["age"])


def test_the_peers_get_the_train_rows_alone_in_the_schemas_columns(tmp_path):
    """Not the test split, not a column the schema does not declare (an id, a row index)."""
    schema = categorical_schema()
    train = pd.DataFrame({"row_id": [7, 8], "y": ["no", "yes"], "age": [20, 30], "grade": [1, 3]})
    test = pd.DataFrame({"row_id": [9], "y": ["yes"], "age": [99], "grade": [2]})
    datamodule = SimpleNamespace(schema=schema, train_frame=train, test_frame=test)
    train_path, spec_path = peers.export_split(datamodule, tmp_path / "split")
    exported = pd.read_csv(train_path)
    assert list(exported.columns) == ["age", "grade", "y"]
    assert exported.equals(train[["age", "grade", "y"]].reset_index(drop=True))
    assert json.loads(spec_path.read_text()) == json.loads(json.dumps(peers.table_spec(schema)))


def test_the_peer_command_reads_the_split_and_writes_into_the_cells_folder(tmp_path):
    cell = Cell("dpctgan", "adult", 3.0, 1)
    folder = tmp_path / "cell"
    command = peers.peer_command(Path("py"), cell, tmp_path / "train.csv", tmp_path / "spec.json", 50,
                                 suite_size("peers", quick=False), folder)
    option = lambda name: command[command.index(name) + 1]
    assert command[:2] == ["py", str(peers.SCRIPT)] and option("--synthesizer") == "dpctgan"
    assert option("--train") == str(tmp_path / "train.csv") and option("--spec") == str(tmp_path / "spec.json")
    assert option("--out") == str(folder / "synthetic.csv") and option("--report") == str(folder / "peer.json")
    assert option("--epsilon") == "3" and option("--n") == "50" and option("--seed") == "1"
    assert "--epochs" not in command  # the full size: the peer's own schedule


def test_a_venv_without_smartnoise_is_completed_with_torch_held_to_ours(tmp_path, monkeypatch):
    """A python that cannot import snsynth is not taken as the peers' venv; smartnoise is then
    installed under a constraint that pins our torch (else pip would replace it), but only into
    a virtualenv the harness made: smartnoise pins opacus<0.15, so the user's own environment
    (``--peers-venv .venv``) is refused, nothing installed into it or written there."""
    own = tmp_path / "own"
    (own / "bin").mkdir(parents=True)
    (own / "bin" / "python").write_text("")
    checked, installed = [], []
    monkeypatch.setattr(peers.subprocess, "run", lambda command, **kw: checked.append(command) or SimpleNamespace(returncode=1))
    monkeypatch.setattr(peers, "run_logged", lambda command, log, env=None: installed.append(command) or 0.0)
    with pytest.raises(SystemExit, match=r"--peers-venv .*own exists but cannot import snsynth.*nothing ran"):
        peers.ensure_venv(own, tmp_path / "log")
    assert installed == [] and sorted(path.name for path in own.iterdir()) == ["bin"]
    venv = tmp_path / "venv"  # one an interrupted install of the harness left
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / peers.VENV_MARKER).write_text("")
    assert peers.ensure_venv(venv, tmp_path / "log") == venv / "bin" / "python"
    assert checked and checked[0][-1] == "import snsynth"
    smartnoise = next(command for command in installed if peers.SMARTNOISE in command)
    constraints = Path(smartnoise[smartnoise.index("-c") + 1])
    pin = f"torch=={peers.torch.__version__.split('+')[0]}"
    assert constraints.read_text().strip() == pin and any(pin in command for command in installed)
    # one that imports it is used as it is
    installed.clear()
    monkeypatch.setattr(peers.subprocess, "run", lambda command, **kw: SimpleNamespace(returncode=0))
    peers.ensure_venv(venv, tmp_path / "log")
    assert installed == []


def _tiny_table(rows: int, offset: int) -> SimpleNamespace:
    schema = TableSchema((Column("age", "integer", bounds=(17, 90)),
                          Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")
    rng = np.random.default_rng(offset)
    frame = lambda n: pd.DataFrame({"y": rng.choice(["no", "yes"], n), "age": rng.integers(17, 91, n),
                                    "row_id": np.arange(n) + offset})
    return SimpleNamespace(schema=schema, train_frame=frame(rows), test_frame=frame(5), kind="table")


def test_each_datasets_peer_cells_get_that_datasets_split_delta_and_row_count_and_record_what_the_peer_reports(
        tmp_path, monkeypatch):
    """Two datasets (Adult at 1e-5, credit at its own 1e-6): every cell trains on its own dataset's
    train split, at that dataset's delta, draws as many rows as that split holds, and is scored by
    our evaluation with the cell's seed; the record keeps the peer's own delta (a pure-DP peer:
    none), its fit time beside the wall time, no step count, the test split, and what it spent
    (nothing reported: unknown, not the target)."""
    from lightning_dpgan import evaluate as evaluate_module

    tables = {"adult": _tiny_table(12, 0), "kaggle-credit": _tiny_table(20, 100)}
    monkeypatch.setattr(peers, "load_datamodule", lambda dataset, data_dir: tables[dataset])
    monkeypatch.setattr(peers, "ensure_venv", lambda venv, log: Path("python"))
    commands, scored = [], []

    def fake_peer(command, log):
        option = lambda name: command[command.index(name) + 1]
        train = pd.read_csv(option("--train"))
        log.parent.mkdir(parents=True, exist_ok=True)  # as the real run_logged does
        train.sample(n=int(option("--n")), replace=True, random_state=0).to_csv(option("--out"), index=False)
        Path(option("--report")).write_text(json.dumps({"delta": None, "fit_seconds": 0.25, "options": {}}))
        commands.append((option("--train"), int(option("--n")), float(option("--delta")), len(train)))
        return 2.0

    def fake_evaluate(datamodule, synthetic, seed=0, **kwargs):
        scored.append((datamodule, len(synthetic), seed))
        return {"utility/B_auroc": 0.5}

    monkeypatch.setattr(peers, "run_logged", fake_peer)
    monkeypatch.setattr(evaluate_module, "evaluate_table", fake_evaluate)
    size = Size(("mwem",), ("adult", "kaggle-credit"), (1.0,), (4, 7), max_steps=2)
    runs, skipped = peers.run_peers(size, Settings(out_dir=tmp_path), venv=tmp_path / "venv")

    assert skipped == {} and len(runs) == 4 and all(run["status"] == "ok" for run in runs), [r.get("error") for r in runs]
    assert [(run["dataset"], run["seed"]) for run in runs] == [("adult", 4), ("adult", 7),
                                                               ("kaggle-credit", 4), ("kaggle-credit", 7)]
    for run, (train, n, delta, rows), (datamodule, drawn, seed) in zip(runs, commands, scored):
        own = tables[run["dataset"]]
        assert datamodule is own and seed == run["seed"]
        assert rows == len(own.train_frame) and n == drawn == len(own.train_frame)
        assert Path(train).parent.name.startswith(run["dataset"])
        assert delta == delta_for(run["dataset"])
        assert run["delta"] is None and run["epsilon"] is None and run["target_epsilon"] == 1.0
        assert run["train_seconds"] == 2.0 and run["fit_seconds"] == 0.25 and run["steps"] is None
        assert run["measures"]["held_out_split"] == "test"
    assert {delta for _, _, delta, _ in commands} == {1e-5, 1e-6}


def test_a_peer_trains_at_exactly_the_cells_fractional_target_epsilon(tmp_path):
    """--epsilons 0.5 2.5 for the peers: each peer gets that budget as written, not a rounded one
    (0.5 rounded is 0, and 2.5 would train a peer at 2 while its row says 2.5; :g alone kept six
    figures, 0.123457 for 0.1234567, a budget above the cell's)."""
    for epsilon, written in ((0.5, "0.5"), (2.5, "2.5"), (0.1, "0.1"), (1.0, "1"), (0.1234567, "0.1234567")):
        command = peers.peer_command(Path("py"), Cell("mst", "adult", epsilon, 0), tmp_path / "t.csv",
                                     tmp_path / "s.json", 10, suite_size("peers", quick=False), tmp_path)
        assert command[command.index("--epsilon") + 1] == written
