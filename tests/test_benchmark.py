"""The benchmark harness: grids, results files, the generated RESULTS.md section, peers' inputs."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from collections import Counter
from dataclasses import replace
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lightning_dpgan.benchmark import cli, report, results, runner
from lightning_dpgan.benchmark.cli import benchmark, chosen_size, parse_args, size_label, unavailable_datasets
from lightning_dpgan.benchmark.peers import export_split, load_datamodule, peer_command
from lightning_dpgan.benchmark.runner import Settings, failed_run, portable, train_command, with_derived_measures
from lightning_dpgan.benchmark.suites import SUITES, Cell, delta_for, suite_size
from preset_helpers import modes_epsilon
from run_helpers import record_calls

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO / "tests" / "fixtures" / "adult_tiny"
REFERENCE = REPO / "benchmarks" / "reference.yaml"


# ------------------------------------------------------------------------ grids
def test_every_suite_has_a_quick_size_smaller_than_its_full_one():
    for suite, sizes in SUITES.items():
        quick, full = sizes["quick"], sizes["full"]
        assert len(quick.cells()) < len(full.cells()), suite
        assert len(full.seeds) >= 3, suite  # quoted figures are means over at least three seeds


def test_the_full_grids_are_the_protocols_the_published_figures_stand_for():
    """The README quotes the full sizes' cells as the protocol: tables at three privacy levels on
    the three table datasets, images at 1 and 10 on both image sets, speed and peers on Adult at 1."""
    tables, images = suite_size("tables", quick=False), suite_size("images", quick=False)
    assert tables.epsilons == (0.1, 1.0, 10.0) and tables.datasets == ("adult", "king", "kaggle-credit")
    assert set(tables.models) == {"pategan", "dpgan", "dpctgan", "patectgan", "dpsactgan", "quail"}
    assert images.epsilons == (1.0, 10.0) and images.datasets == ("mnist", "fashion-mnist")
    assert set(images.models) == {"gpate", "dpgan", "gswgan"}
    for suite in ("speed", "peers"):
        full = suite_size(suite, quick=False)
        assert (full.datasets, full.epsilons) == (("adult",), (1.0,)), suite
    assert set(suite_size("speed", quick=False).models) == set(tables.models)
    assert set(suite_size("peers", quick=False).models) == {"pategan", "dpgan", "dpctgan", "patectgan", "mwem", "mst"}


def test_every_peer_gan_has_its_namesake_in_the_tables_grid_on_the_peers_data():
    """The peers table sets each smartnoise-synth synthesizer against our model of the same name
    and falls back to our best model only where we have none (MST and MWEM, which are not GANs):
    a GAN left out of the tables grid is compared with another model without anyone noticing."""
    from lightning_dpgan.benchmark.suites import PEERS

    tables, peers = suite_size("tables", quick=False), suite_size("peers", quick=False)
    gans = [peer for peer in PEERS if peer not in ("mst", "mwem")]
    assert gans and all(gan in tables.models for gan in gans), (gans, tables.models)
    assert set(peers.datasets) <= set(tables.datasets) and set(peers.epsilons) <= set(tables.epsilons)


@pytest.mark.parametrize("suite", ["tables", "images"])
def test_every_full_cell_on_a_dataset_here_runs_a_preset_written_for_that_dataset(suite):
    """A cell without its dataset's preset silently runs the model's generic one: GS-WGAN on
    Fashion-MNIST ran one un-amplified critic instead of MNIST's 1000, PATE-GAN on King 17
    teachers, whose votes no budget can pay for. QUAIL takes its synthesizer's presets, and
    kaggle-credit (no data here) runs the generic ones, which are the papers' credit settings."""
    from lightning_dpgan.config import preset_files

    full = suite_size(suite, quick=False)
    for cell in full.cells():
        if cell.model == "quail" or cell.dataset == "kaggle-credit":
            continue
        assert f"{cell.model}_{cell.dataset}.yaml" in preset_files(cell.model, cell.dataset, cell.epsilon), cell.name


#: Kaggle credit's training rows: the published 284,807 less the seeded 20 % test split
CREDIT_TRAIN_ROWS = 284_807 - round(284_807 * 0.2)


@pytest.mark.parametrize("model", ["pategan", "dpgan", "dpctgan", "patectgan", "dpsactgan", "quail", "gpate", "gswgan"])
def test_a_private_model_on_kaggle_credit_runs_at_a_delta_below_one_over_its_rows(model):
    """delta >= 1/n is refused, and the papers' 1e-5 is not below 1/n for credit's 227,846
    training rows: every cell of the credit column, and a plain ``train --dataset kaggle-credit``,
    would have been refused before training. The presets and the harness agree on 1e-6."""
    from lightning_dpgan.config import resolve
    from lightning_dpgan.privacy.validation import validate_delta

    assert CREDIT_TRAIN_ROWS == 227_846
    with pytest.raises(ValueError, match="not below 1/n"):
        validate_delta(1e-5, CREDIT_TRAIN_ROWS)
    for epsilon in (0.1, 1.0, 10.0):
        delta = resolve({"model": model, "dataset": "kaggle-credit", "epsilon": epsilon}, {})["delta"]
        assert delta == delta_for("kaggle-credit") == validate_delta(delta, CREDIT_TRAIN_ROWS), (model, epsilon)
    cell = Cell(model, "kaggle-credit", 1.0, 0)
    command = " ".join(train_command(cell, suite_size("tables", quick=False), Settings(out_dir=Path("out"))))
    assert "--delta 1e-06" in command
    assert delta_for("adult") == delta_for("king") == 1e-5  # the issue's delta where it is below 1/n


def test_command_line_overrides_replace_the_grid_and_reach_train():
    args = parse_args(["--suite", "tables", "--quick", "--models", "dpctgan", "--seeds", "3", "4",
                       "--epsilons", "0.5", "--", "--batch-size", "8"])
    size = chosen_size(args)
    assert [c.name for c in size.cells()] == ["dpctgan_adult_eps0.5_seed3", "dpctgan_adult_eps0.5_seed4"]
    command = train_command(size.cells()[1], size, Settings(out_dir=Path("out"), data_dir="DATA"))
    joined = " ".join(command)
    assert "--seed 4" in joined and "--epsilon 0.5 --delta 1e-05" in joined and "--data-dir DATA" in joined
    assert f"--max-steps {suite_size('tables', True).max_steps}" in joined
    assert command[-2:] == ["--batch-size", "8"]
    # the cell's evaluation draws with the cell's seed too (the classifiers, the held-out samples)
    evaluate = runner.evaluate_command(size.cells()[1], size, Settings(out_dir=Path("out"), data_dir="DATA"))
    assert evaluate[evaluate.index("--seed") + 1] == "4" and evaluate[evaluate.index("--run") + 1] == str(
        Path("out") / "dpctgan_adult_eps0.5_seed4")


def test_a_non_private_cell_gets_no_budget():
    size = suite_size("tables", quick=True)
    command = train_command(Cell("gan", "adult", None, 0), size, Settings(out_dir=Path("out")))
    assert "--epsilon" not in command and Cell("gan", "adult", None, 0).name == "gan_adult_epsinf_seed0"


def test_the_four_classifier_average_of_the_adult_goal():
    measures = {f"utility/B_auroc/{name}": value for name, value in
                [("logistic_regression", 0.9), ("random_forest", 0.8), ("gradient_boosting", 0.7), ("mlp", 0.6),
                 ("gaussian_nb", 0.0)]}
    assert with_derived_measures(measures)["utility/B_auroc_four"] == pytest.approx(0.75)
    assert "utility/B_auroc_four" not in with_derived_measures({"utility/B_auroc/mlp": 0.6})
    # how the evaluation was made, or what it read of the run, is not a measure averaged over a cell's seeds
    assert with_derived_measures({"utility/B_auroc/mlp": 0.6, "seed": 2, "device": "cpu"}) == {"utility/B_auroc/mlp": 0.6}
    recorded = {"epsilon": 0.99, "delta": 1e-5, "synthetic_records": 17290, "privacy_risk/mia_records_per_group": 2000,
                "privacy_risk/mia_auc": 0.5}
    assert with_derived_measures(recorded) == {"privacy_risk/mia_auc": 0.5}


# ---------------------------------------------------------------------- results
def run(model: str, seed: int, auroc: float | None, epsilon: float = 1.0, status: str = "ok") -> dict:
    return {"status": status, "model": model, "dataset": "adult", "target_epsilon": epsilon, "seed": seed,
            "epsilon": 0.9, "steps": 10, "train_seconds": 5.0 + seed, "fit_seconds": 4.0,
            "measures": {"utility/B_auroc": auroc, "note": "text"}}


def test_summaries_are_mean_and_sample_std_over_the_seeds_that_produced_a_number():
    summary = results.summarize([0.6, 0.7, 0.9, None, float("nan")])
    assert summary["mean"] == pytest.approx(statistics.fmean([0.6, 0.7, 0.9]))
    assert summary["std"] == pytest.approx(statistics.stdev([0.6, 0.7, 0.9]))
    assert summary["n"] == 3
    assert results.summarize([0.5]) == {"mean": 0.5, "std": None, "n": 1}


def test_aggregate_groups_repeats_and_leaves_failed_runs_out():
    runs = [run("a", 0, 0.6), run("a", 1, 0.8), run("a", 2, 0.1, status="failed"), run("b", 0, 0.5, epsilon=10.0)]
    rows = {(r["model"], r["target_epsilon"]): r for r in results.aggregate(runs)}
    assert rows[("a", 1.0)]["seeds"] == [0, 1]
    assert rows[("a", 1.0)]["measures"]["utility/B_auroc"]["mean"] == pytest.approx(0.7)
    assert rows[("a", 1.0)]["train_seconds"]["mean"] == pytest.approx(5.5)
    assert "note" not in rows[("a", 1.0)]["measures"]
    assert rows[("b", 10.0)]["measures"]["utility/B_auroc"] == {"mean": 0.5, "std": None, "n": 1}


def test_a_second_run_on_the_same_day_never_replaces_the_first(tmp_path):
    first_file, second_file = (results.ResultsFile(tmp_path, "tables", {"n": n, "size": "full"}) for n in (1, 2))
    first = first_file.save([run("gan", 0, 0.5)])
    second = second_file.save([], complete=True)
    assert first_file.save([run("gan", 0, 0.5), run("gan", 1, 0.6)], complete=True) == first  # its own file, rewritten
    assert first != second and json.loads(first.read_text())["n"] == 1 and len(json.loads(first.read_text())["runs"]) == 2
    assert results.latest_results(tmp_path, "tables")["n"] == 2
    older = results.results_path(tmp_path, "tables", date(2020, 1, 1))
    older.write_text(json.dumps({"n": 0, "size": "full", "runs": [], "summary": []}))
    assert results.latest_results(tmp_path, "tables")["n"] == 2  # the date orders, not the file's age
    assert results.latest_results(tmp_path, "images") is None
    # ten more that day: each a file of its own, and -11 is newer than -9 (a number, not text)
    paths = {first, second} | {results.ResultsFile(tmp_path, "tables", {"n": n, "size": "full"}).save([], complete=True)
                                for n in range(3, 13)}
    assert len(paths) == 12 and results.latest_results(tmp_path, "tables")["n"] == 12


# ----------------------------------------------------------------------- report
def result_file(suite: str, size: str, runs: list[dict]) -> dict:
    return {"suite": suite, "size": size, "file": f"{suite}-2026-01-01.json", "started": "2026-01-01T00:00:00",
            "command": "python -m lightning_dpgan benchmark", "machine": results.machine(),
            "commit": {"sha": "abc", "dirty": False}, "runs": runs, "summary": results.aggregate(runs), "skipped": {}}


def test_a_data_dependent_epsilon_is_shown_as_such_with_its_data_independent_bound():
    """PATE-GAN's 'spent' epsilon was the data-dependent figure (a function of the teachers'
    votes) beside DP-SGD's, with nothing to tell them apart: 0.557 against PATE's 6,400."""
    pate = [{**run("pategan", seed, 0.5), "epsilon": 0.4 + seed / 10, "epsilon_data_independent": 6400.01}
            for seed in range(3)]
    dpgan = [run("dpgan", seed, 0.7) for seed in range(3)]
    table = report.measure_table(result_file("tables", "full", pate + dpgan))
    pate_row = next(line for line in table if line.startswith("| pategan"))
    dpgan_row = next(line for line in table if line.startswith("| dpgan"))
    assert "| 0.500 ± 0.100 (3) data-dependent; data-independent 6400 ± 0 (3) |" in pate_row
    assert "| 0.900 ± 0.000 (3) |" in dpgan_row and "data-" not in dpgan_row
    # runs recorded before the bound was kept (no such key at all): their epsilon is still said
    # to be data-dependent, unless their command chose the data-independent accounting
    older = [{**run("patectgan", seed, 0.5), "commands": ["python -m lightning_dpgan train --model patectgan"]}
             for seed in range(2)]
    chosen = [{**run("gpate", seed, 0.5), "commands": ["train --model gpate --privacy.accounting data-independent"]}
              for seed in range(2)]
    current = [{**run("pategan", seed, 0.5), "epsilon_data_independent": None} for seed in range(2)]  # data-independent
    rows = {line.split("|")[1].strip(): line for line in report.measure_table(result_file("tables", "full",
                                                                                           older + chosen + current))
            if line.startswith("| ")}
    assert "| 0.900 ± 0.000 (2) data-dependent (no data-independent bound recorded) |" in rows["patectgan"]
    assert "data-" not in rows["gpate"] and "data-" not in rows["pategan"]


def test_a_results_file_written_before_the_mark_gets_it_when_read(tmp_path):
    """Its stored summary predates data_dependent_unrecorded: RESULTS.md's published PATE rows
    stood beside DP-SGD's epsilon unmarked."""
    older = [{**run("pategan", seed, 0.5), "commands": ["train --model pategan"]} for seed in range(2)]
    summary = [{key: value for key, value in row.items() if key != "data_dependent_unrecorded"}
               for row in results.aggregate(older)]
    path = results.results_path(tmp_path, "tables")
    path.write_text(json.dumps({"size": "full", "runs": older, "summary": summary}))
    (row,) = results.latest_results(tmp_path, "tables")["summary"]
    assert row["data_dependent_unrecorded"] is True
    # a peer's accounting that passed its target (smartnoise's DP-CTGAN: 1.001 of 1) is marked
    peer = [{**run("dpctgan", seed, 0.6), "epsilon": 1.0004} for seed in range(3)]
    peer_row = next(line for line in report.measure_table(result_file("peers", "full", peer)) if line.startswith("| dpctgan"))
    assert "| 1.0004 ± 0.0000 (3) (above the target) |" in peer_row  # not "1.000": the digits that show it
    # a peer that spent exactly its target kept to it
    exact = [{**run("dpctgan", seed, 0.6), "epsilon": 1.0} for seed in range(3)]
    exact_row = next(line for line in report.measure_table(result_file("peers", "full", exact)) if line.startswith("| dpctgan"))
    assert "| 1.000 ± 0.000 (3) |" in exact_row and "above" not in exact_row


def test_the_generated_section_replaces_only_itself(tmp_path):
    markdown = tmp_path / "RESULTS.md"
    markdown.write_text(f"# Results\n\nHand-written analysis.\n\n{report.BEGIN}\nold figures\n{report.END}\n\nMore prose.\n")
    report.update_results_markdown(markdown, f"{report.BEGIN}\nnew figures\n{report.END}")
    text = markdown.read_text()
    assert "Hand-written analysis." in text and "More prose." in text
    assert "new figures" in text and "old figures" not in text
    fresh = tmp_path / "NEW.md"
    fresh.write_text("# Title\nbody\n")
    report.update_results_markdown(fresh, f"{report.BEGIN}\nx\n{report.END}")
    assert fresh.read_text().startswith("# Title\n") and "body" in fresh.read_text()
    # one marker lost: a second section went after the title, the orphan and old text stayed for good
    damaged = tmp_path / "DAMAGED.md"
    damaged.write_text(f"# Results\n\nIntro.\n\n{report.BEGIN}\nold figures\n\nMore prose.\n")
    before = damaged.read_bytes()
    with pytest.raises(ValueError, match="without the other"):
        report.update_results_markdown(damaged, f"{report.BEGIN}\nnew\n{report.END}")
    assert damaged.read_bytes() == before
    # both markers, the end one first: an IndexError, not a refusal naming the file
    damaged.write_text(f"# Results\n\n{report.END}\nprose\n{report.BEGIN}\nold\n")
    before = damaged.read_bytes()
    with pytest.raises(ValueError, match="end marker .* before its begin marker"):
        report.update_results_markdown(damaged, f"{report.BEGIN}\nnew\n{report.END}")
    assert damaged.read_bytes() == before


def test_goals_count_only_full_size_results_and_say_whether_they_are_met():
    reference = {"goals": [{"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1.0, "at_least": 0.75},
                           {"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1.0, "at_least": 0.9}]}
    runs = [run("a", s, v) for s, v in enumerate([0.7, 0.8, 0.9])] + [run("b", 0, 0.5)]
    lines = report.goal_lines([result_file("tables", "full", runs)], reference)
    assert "| 0.800 ± 0.100 (3) | a | 3 | yes |" in lines[2]
    assert lines[3].endswith("| no |")
    quick = report.goal_lines([result_file("tables", "quick", runs)], reference)
    assert "not measured on the full protocol" in quick[2]
    subset = report.goal_lines([result_file("tables", "full-subset", runs)], reference)
    assert subset[2] == lines[2]  # part of the full grid, each cell on the full protocol, counts


def test_a_mean_that_rounds_onto_the_goal_shows_the_digits_that_decide_it():
    reference = {"goals": [{"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1.0, "at_least": 0.87}]}
    short = [run("a", s, v) for s, v in enumerate([0.86998, 0.87, 0.86999])]
    assert report.goal_lines([result_file("tables", "full", short)], reference)[2].endswith(
        "| 0.86999 ± 0.00001 (3) | a | 3 | no |")
    # the suite's own table shows the same digits for that figure, and 3 for the others
    table = "\n".join(report.measure_table(result_file("tables", "full", short), reference["goals"]))
    assert "| 0.86999 ± 0.00001 (3) |" in table
    assert "| 0.870 ± 0.000 (3) |" in "\n".join(report.measure_table(result_file("tables", "full", short)))
    clear = [run("a", s, v) for s, v in enumerate([0.86, 0.88, 0.87])]
    assert "| 0.870 ± 0.010 (3) | a | 3 | yes |" in report.goal_lines([result_file("tables", "full", clear)], reference)[2]
    assert report.separating_digits(0.5, 0.87) == 3 and report.separating_digits(0.87, 0.87) == 3
    assert report.separating_digits(0.8699999996, 0.87) == 10  # beyond six decimals too


def test_a_goal_is_never_met_by_a_cell_of_fewer_than_three_seeds():
    """One good seed (the others failed, or a stopped suite) does not meet a goal, and is not
    preferred to a whole measurement of another model."""
    reference = {"goals": [{"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1.0, "at_least": 0.87}]}
    lone = [run("a", 0, 0.95), run("a", 1, None, status="failed"), run("a", 2, None, status="failed")]
    line = report.goal_lines([result_file("tables", "full", lone)], reference)[2]
    assert "measured with 1 seed(s) only, fewer than 3" in line and line.endswith("| no |")
    whole = [run("b", s, 0.80) for s in range(3)]
    assert "| 0.800 ± 0.000 (3) | b | 3 | no |" in report.goal_lines([result_file("tables", "full", lone + whole)], reference)[2]
    # a goal reads its own epsilon: three good seeds at ε = 10 do not meet the ε = 1 goal
    elsewhere = [run("c", s, 0.95, epsilon=10.0) for s in range(3)]
    assert report.goal_lines([result_file("tables", "full", elsewhere)], reference)[2].endswith(
        "| not measured on the full protocol | | | |")


def test_a_goal_met_by_an_older_figure_says_that_the_cells_newest_attempt_failed(tmp_path):
    """A suite run today whose cell fails on every seed leaves the older figure in the tables
    (the newest measurement there is), but the goal it meets must not read as a plain "yes"
    for code that now fails."""
    reference = {"goals": [{"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1.0, "at_least": 0.87}]}
    for day, runs in ((date(2026, 1, 1), [run("a", s, 0.9) for s in range(3)]),
                      (date(2026, 1, 2), [run("a", s, None, status="failed") | {"error": "broke"} for s in range(3)])):
        content = {**result_file("tables", "full-subset", runs), "seeds": [0, 1, 2]}
        content.pop("file")
        results.results_path(tmp_path, "tables", day).write_text(json.dumps(content))
    merged = results.protocol_results(tmp_path, "tables")
    assert report.goal_lines([merged], reference)[2].endswith(
        "| 0.900 ± 0.000 (3) | a | 3 | yes; a newer attempt of this cell failed (see its suite) |")
    assert report.goal_lines([result_file("tables", "full", [run("a", s, 0.9) for s in range(3)])], reference)[2].endswith(
        "| a | 3 | yes |")  # no newer attempt: a plain verdict


def test_plots_carry_the_papers_figures_measured_the_same_way(tmp_path):
    reference = report.load_reference(REFERENCE)
    stars = report.markers_for(reference, "mnist", "utility/cnn_accuracy")
    assert {(m["epsilon"], m["value"]) for m in stars} >= {(10, 0.8092), (1, 0.5631)}  # G-PATE Table 2
    assert report.markers_for(reference, "adult", "utility/B_auroc") == []  # no paper measured Adult this way
    runs = [{**run("gpate", s, None), "dataset": "mnist", "measures": {"utility/cnn_accuracy": 0.5 + s / 10}}
            for s in range(2)]
    (path,) = report.plot_suite(result_file("images", "full", runs), reference, tmp_path)
    assert path.name == "images-2026-01-01-mnist.png" and path.read_bytes()[:4] == b"\x89PNG"


def test_each_papers_source_is_one_legend_entry_over_its_epsilons(tmp_path, monkeypatch):
    """G-PATE's paper gives MNIST figures at ε = 1 and 10: one "G-PATE (paper)" entry holding both
    stars, not one entry (and one colour) per star, in colours no model's line has."""
    from matplotlib.collections import PathCollection
    from matplotlib.colors import to_hex

    legends, colours = [], []

    def keep_legend(figure, path):
        axes = figure.axes[0]
        handles, labels = axes.get_legend_handles_labels()
        legends.append({label: handle.get_offsets().shape[0] for handle, label in zip(handles, labels)
                        if not label.startswith("gpate")})  # the model's line (its ε data-dependent)
        colours.append(({to_hex(line.get_color()) for line in axes.lines},
                        {to_hex(star.get_facecolor()[0]) for star in axes.collections if isinstance(star, PathCollection)}))
        return path

    monkeypatch.setattr(report, "_save", keep_legend)
    reference = report.load_reference(REFERENCE)
    runs = [{**run("gpate", s, None), "dataset": "mnist", "measures": {"utility/cnn_accuracy": 0.5}} for s in range(2)]
    report.plot_suite(result_file("images", "full", runs), reference, tmp_path)
    expected = Counter(marker["label"] for marker in report.markers_for(reference, "mnist", "utility/cnn_accuracy"))
    assert legends == [expected] and expected["G-PATE (paper)"] == 2
    (line_colours, star_colours), = colours
    assert len(star_colours) == len(expected) and not line_colours & star_colours


def test_a_quick_runs_plot_draws_no_paper_figure_and_each_plot_names_its_datasets_delta(tmp_path, monkeypatch):
    """A quick run's 2,000 images and one CNN epoch compare nothing with a paper's protocol, and
    kaggle-credit runs at delta 1e-6: its axis said 1e-5."""
    from matplotlib.collections import PathCollection

    drawn, legends = [], []  # (x label, stars drawn); the legend's labels
    monkeypatch.setattr(report, "_save", lambda figure, path: drawn.append(
        (figure.axes[0].get_xlabel(), sum(isinstance(c, PathCollection) for c in figure.axes[0].collections)))
        or legends.append(figure.axes[0].get_legend_handles_labels()[1]) or path)
    reference = report.load_reference(REFERENCE)
    mnist = [{**run("gpate", s, None), "dataset": "mnist", "measures": {"utility/cnn_accuracy": 0.5}} for s in range(2)]
    credit = [{**run("pategan", s, 0.6), "dataset": "kaggle-credit"} for s in range(2)]
    report.plot_suite(result_file("images", "quick", mnist), reference, tmp_path)
    report.plot_suite(result_file("images", "full", mnist), reference, tmp_path)
    report.plot_suite(result_file("tables", "full", credit), reference, tmp_path)
    assert drawn[0] == ("target ε (δ = 1e-5)", 0) and drawn[1][1] > 0  # the full run's stars
    assert drawn[2][0] == "target ε (δ = 1e-6)"
    # the papers' credit figures are at delta 1e-5: their stars say so, under an axis of 1e-6
    assert "PATE-GAN (paper), δ = 1e-5" in legends[2] and "PATE-GAN, SmartNoise (Ganev), δ = 1e-5" in legends[2]
    assert "G-PATE (paper)" in legends[1]  # MNIST's axis is the paper's delta: nothing to say


def test_a_plot_whose_values_reach_the_hundreds_keeps_the_small_ones_readable(tmp_path, monkeypatch):
    """King's R² gaps: 0.2-3 for most models and ~160 for one whose tables make a regression
    extrapolate; a linear axis would flatten the others onto zero."""
    scales = {}

    def keep_scale(figure, path):
        scales[path.name] = figure.axes[0].get_yscale()
        return path

    monkeypatch.setattr(report, "_save", keep_scale)

    def gaps(model, values):
        return [{**run(model, s, None), "dataset": "king", "measures": {"utility/difference_r2": v}}
                for s, v in enumerate(values)]

    report.plot_suite(result_file("tables", "full", gaps("quail", [0.2, 0.3]) + gaps("pategan", [2.5, 320.0])), {}, tmp_path)
    report.plot_suite({**result_file("tables", "full", gaps("quail", [0.2, 0.3])), "file": "calm.json"}, {}, tmp_path)
    assert scales == {"tables-2026-01-01-king.png": "symlog", "calm-king.png": "linear"}


def test_peers_are_compared_with_our_model_of_the_same_name_else_our_best():
    ours = result_file("tables", "full", [run("pategan", 0, 0.8), run("dpctgan", 0, 0.85)])
    peers = result_file("peers", "full", [{**run("pategan", 0, 0.4), "train_seconds": 20.0}, run("mst", 0, 0.7),
                                          {**run("mwem", 0, 0.6), "target_epsilon": 10.0}])
    lines = report.peer_comparison(peers, ours)
    (pategan,) = [line for line in lines if line.startswith("| pategan")]
    assert "| pategan | 0.800 (1) | 2.00 |" in pategan  # utility: ours 0.8 / peer 0.4
    assert pategan.endswith("| 4.00 |")  # time: peer 20 s / ours 5 s
    (mst,) = [line for line in lines if line.startswith("| mst")]
    assert "| dpctgan (best) | 0.850 (1) | 1.21 |" in mst  # no mst of ours: against our best at that epsilon
    (mwem,) = [line for line in lines if line.startswith("| mwem")]
    assert "none measured" in mwem
    assert "No tables results" in report.peer_comparison(peers, None)[0]
    assert "the peers train on all of ε at δ = 1e-5;" in lines[0]


def test_our_best_against_a_peer_is_a_cell_of_enough_seeds_and_the_peers_delta_is_each_datasets():
    """One lucky seed (0.95) was picked over three seeds' 0.85; and the peers' δ was said to be
    1e-5 whatever the dataset, though credit's cells train at 1e-6."""
    ours = result_file("tables", "full", [run("quail", 0, 0.95), *(run("dpgan", seed, 0.85) for seed in range(3)),
                                          {**run("dpgan", 0, 0.9), "dataset": "kaggle-credit"}])
    peers = result_file("peers", "full", [run("mst", 0, 0.7), {**run("mst", 0, 0.6), "dataset": "kaggle-credit"}])
    lines = report.peer_comparison(peers, ours)
    (adult,) = [line for line in lines if line.startswith("| mst | adult")]
    assert "| dpgan (best) | 0.850 ± 0.000 (3) |" in adult
    (credit,) = [line for line in lines if line.startswith("| mst | kaggle-credit")]
    assert "| dpgan (best) | 0.900 (1) |" in credit  # the only cell there: taken, its one seed shown
    assert "at each dataset's δ (adult 1e-5, kaggle-credit 1e-6);" in lines[0]


def test_goals_are_ours_alone():
    reference = {"goals": [{"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1.0, "at_least": 0.75}]}
    peers = result_file("peers", "full", [run("mst", 0, 0.9)])
    assert "not measured" in report.goal_lines([peers], reference)[2]


def test_the_newest_full_results_stand_for_a_suite_until_a_newer_full_run(tmp_path):
    empty = {"runs": [], "summary": []}
    results.results_path(tmp_path, "tables", date(2026, 1, 1)).write_text(json.dumps({"size": "full", "n": 1, **empty}))
    results.results_path(tmp_path, "tables", date(2026, 2, 1)).write_text(json.dumps({"size": "quick", "n": 2, **empty}))
    (tmp_path / "tables-notes.json").write_text("{}")  # not a results file: ignored
    (tmp_path / "tables-notes-on-the-run.json").write_text("{}")  # three words, not a date: ignored too
    (tmp_path / "tables-2026-03-01-old.json").write_text("{}")  # a date and a word, not a -N: ignored
    assert results.latest_results(tmp_path, "tables", size="full")["n"] == 1
    assert results.latest_results(tmp_path, "tables")["n"] == 2


def test_runs_of_parts_of_the_grid_are_merged_cell_by_cell_newest_first(tmp_path):
    """Two full-subset runs (QUAIL and DP-CTGAN, then DP-CTGAN again with PATE-GAN): the table
    holds all three models, DP-CTGAN from the newer file, and names both files."""
    def write(day, runs, command):
        content = {**result_file("tables", "full-subset", runs), "command": command}
        content.pop("file")
        results.results_path(tmp_path, "tables", day).write_text(json.dumps(content))

    write(date(2026, 1, 1), [run("quail", s, 0.85) for s in range(3)] + [run("dpctgan", s, 0.80) for s in range(3)]
          + [run("dpctgan", 3, None, status="failed") | {"error": "old failure"}], "first")
    write(date(2026, 1, 2), [run("dpctgan", s, 0.70) for s in range(3)] + [run("pategan", s, 0.60) for s in range(3)], "second")
    results.results_path(tmp_path, "tables", date(2026, 1, 3)).write_text(json.dumps({"size": "quick", "summary": [], "runs": []}))
    custom = {**result_file("tables", "custom", [run("quail", s, 0.99) for s in range(3)]), "command": "custom"}
    custom.pop("file")  # a newer run off the protocol (--max-steps, options after --) stands for nothing
    results.results_path(tmp_path, "tables", date(2026, 1, 4)).write_text(json.dumps(custom))
    merged = results.protocol_results(tmp_path, "tables")
    means = {row["model"]: row["measures"]["utility/B_auroc"]["mean"] for row in merged["summary"]}
    assert means == pytest.approx({"quail": 0.85, "dpctgan": 0.70, "pategan": 0.60})
    assert [part["command"] for part in merged["parts"]] == ["second", "first"]
    assert {(r["model"], r["seed"]) for r in merged["runs"]} == {(m, s) for m in ("quail", "dpctgan", "pategan") for s in range(3)}
    section = report.generated_section(tmp_path, {}, ["tables"], tmp_path)
    assert "`tables-2026-01-02.json`" in section and "`tables-2026-01-01.json`" in section
    assert "Paper figures come from `benchmarks/reference.yaml`" in section
    # a --reference of one's own is the one named (by its folder's name: no path of this machine)
    named = report.generated_section(tmp_path, {}, ["tables"], tmp_path, reference_file=tmp_path / "mine.yaml")
    assert f"Paper figures come from `{tmp_path.name}/mine.yaml`" in named
    assert "Cells from this file: quail / adult / ε=1." in section
    assert "old failure" not in section  # that cell's newer measurement stands
    assert "| quail | adult | 1 |" in section and "| dpctgan | adult | 1 |" in section
    # a full run is merged like the others: the cells it lacks (a skipped dataset) keep theirs
    results.results_path(tmp_path, "tables", date(2026, 1, 4)).write_text(json.dumps(
        {**result_file("tables", "full", [run("gan", s, 0.5) for s in range(3)]), "seeds": [0, 1, 2]}))
    merged = results.protocol_results(tmp_path, "tables")
    assert {row["model"] for row in merged["summary"]} == {"gan", "quail", "dpctgan", "pategan"}
    assert merged["parts"][0]["size"] == "full"


def test_a_newer_run_whose_seeds_partly_failed_does_not_replace_a_whole_measurement(tmp_path):
    """Newest first, each cell from a file that measured it on every seed it planned: a newer
    file whose cell lost two of three seeds leaves the older three-seed figure standing, and its
    failures are shown beside it (the code of the newer attempt fails, which the older figure
    must not hide). A cell that no file measured shows its newest failures, under the file that
    attempted it, even when that file gave no other cell."""
    def write(day, runs):
        content = {**result_file("tables", "full-subset", runs), "seeds": [0, 1, 2]}
        content.pop("file")
        results.results_path(tmp_path, "tables", day).write_text(json.dumps(content))

    write(date(2026, 1, 1), [run("quail", s, 0.85) for s in range(3)]
          + [run("pategan", s, None, status="failed") | {"error": "old pategan failure"} for s in range(3)])
    write(date(2026, 1, 2), [run("quail", 0, 0.95)] + [run("quail", s, None, status="failed") | {"error": "quail broke"}
                                                       for s in (1, 2)])
    write(date(2026, 1, 3), [run("pategan", s, None, status="failed") | {"error": "new pategan failure"} for s in range(3)])
    merged = results.protocol_results(tmp_path, "tables")
    (quail,) = [row for row in merged["summary"] if row["model"] == "quail"]
    assert quail["measures"]["utility/B_auroc"] == {"mean": pytest.approx(0.85), "std": pytest.approx(0.0), "n": 3}
    assert [row["model"] for row in merged["summary"]] == ["quail"]
    section = report.generated_section(tmp_path, {}, ["tables"], tmp_path)
    assert "new pategan failure" in section and "old pategan failure" not in section
    assert "`tables-2026-01-03.json`" in section and "Cells no file measured" in section
    assert "quail broke" in section and "`tables-2026-01-02.json`" in section
    assert "Cells whose newest attempt is this file's and failed** on some seed (below); the figure shown for them " \
           "is an older file's, measured at its commit: quail / adult / ε=1." in section
    assert "| quail (a newer attempt failed) | adult | 1 |" in section
    assert sorted((r["seed"], r["status"]) for r in merged["runs"] if r["model"] == "quail") == [
        (0, "ok"), (1, "failed"), (1, "ok"), (2, "failed"), (2, "ok")]  # the newer file's lone good seed is not mixed in
    # with no whole measurement anywhere, the newest partial one stands (its n says so)
    (tmp_path / "tables-2026-01-01.json").unlink()
    merged = results.protocol_results(tmp_path, "tables")
    (quail,) = [row for row in merged["summary"] if row["model"] == "quail"]
    assert quail["measures"]["utility/B_auroc"]["n"] == 1
    # its failures are that file's own, beside its own figure: not a newer attempt's
    assert "newest_attempt_failed" not in quail and all(part["failed_since"] == [] for part in merged["parts"])


def edited(**changes) -> str:
    """A whole tables results file with ``changes`` made by hand (``row_<key>``: its first summary row's)."""
    content = result_file("tables", "full", [run("a", 0, 0.5)])
    for key, value in changes.items():
        if key.startswith("row_"):
            content["summary"][0] = {k: v for k, v in {**content["summary"][0], key[4:]: value}.items() if v != "drop"}
        elif value == "drop":
            content.pop(key)
        else:
            content[key] = value
    return json.dumps(content)


@pytest.mark.parametrize("text,why", [
    ('{"size": "full", "runs": [', "not a readable results file"),
    ('{"size": "full", "runs": []}', "it has no summary"), ("[]", "it has no content"),
    # another suite's file under this suite's name: its cells were reported as tables' cells
    (edited(suite="images"), "holds the 'images' suite's results, not 'tables''s"),
    # hand edits the report cannot read: each ended in a traceback or an error naming no file
    (edited(row_model="drop"), "summary row 1 has model None, not a str"),
    (edited(seeds=None, complete=False), "its seeds are None, not a list"),
    (edited(row_target_epsilon="1"), "summary row 1 has target_epsilon '1', not a number"),
    (edited(row_measures={"utility/B_auroc": 0.5}), "has measure utility/B_auroc 0.5, not a summary"),
    # the header's fields and a row's own figures: a KeyError, or a format error naming no file
    (edited(machine="a laptop"), "its machine is 'a laptop', not a dict"),
    (edited(command=None), "its command is None, not a str"),
    (edited(row_steps="drop"), "summary row 1 has steps None, not a summary of numbers"),
    (edited(row_train_seconds={"mean": "abc", "std": 0.0, "n": 1}), "summary row 1 has train_seconds {'mean': 'abc'"),
    (edited(row_measures={"utility/B_auroc": {"mean": "0.5", "std": None, "n": 1}}), "has measure utility/B_auroc"),
], ids=["cut", "no-summary", "a-list", "another-suite", "no-model", "no-seeds", "text-epsilon", "a-bare-measure",
        "text-machine", "no-command", "no-steps", "text-seconds", "text-measure"])
def test_a_damaged_results_file_is_named_and_results_md_left_as_it_is(tmp_path, text, why):
    results.results_path(tmp_path, "tables", date(2026, 1, 1)).write_text(json.dumps(result_file("tables", "full", [run("a", 0, 0.5)])))
    results.results_path(tmp_path, "tables", date(2026, 1, 2)).write_text(text)
    markdown = tmp_path / "RESULTS.md"
    markdown.write_text("# Results\nkept\n")
    with pytest.raises(SystemExit) as refused:
        benchmark(["--suite", "tables", "--report-only", "--results-dir", str(tmp_path), "--results-md", str(markdown)])
    assert "tables-2026-01-02.json" in str(refused.value) and why in str(refused.value)
    assert markdown.read_text() == "# Results\nkept\n"


@pytest.mark.parametrize(("reference", "why"), [
    (None, "typo.yaml is not a file"),
    ("goals: [\n", "is not valid YAML"),
    ("- a list\n", "holds no mapping of figures"),
    ("markers:\n- {dataset: adult, measure: m, epsilon: 1, label: x, at: [paper, nope]}\npaper: {}\n",
     "no figure at paper.nope"),
    ("markers:\n- {dataset: adult, measure: m, epsilon: 1, label: x}\n", "marker 1 lacks at"),
    ("markers:\n- {dataset: adult, measure: m, epsilon: 1, label: x, at: [paper, f]}\npaper: {f: 0.5, delta: 1e-5}\n",
     "paper's delta is '1e-5', not a number"),
], ids=["missing", "bad-yaml", "a-list", "a-marker-pointing-nowhere", "a-marker-without-at", "a-text-delta"])
def test_a_reference_file_that_cannot_be_read_is_refused_and_results_md_left_as_it_is(tmp_path, reference, why):
    """A missing --reference was read as no figures: RESULTS.md was rewritten without its goals
    and paper markers, exit 0. A YAML error or a marker pointing nowhere ended in a traceback,
    after every cell of a suite had run."""
    results.results_path(tmp_path, "tables", date(2026, 1, 1)).write_text(json.dumps(result_file("tables", "full", [run("a", 0, 0.5)])))
    path = tmp_path / "typo.yaml"
    if reference is not None:
        path.write_text(reference)
    markdown = tmp_path / "RESULTS.md"
    markdown.write_text("# Results\nkept\n")
    with pytest.raises(SystemExit) as refused:
        benchmark(["--suite", "tables", "--report-only", "--results-dir", str(tmp_path), "--results-md", str(markdown),
                   "--reference", str(path)])
    assert why in str(refused.value) and "left as it is" in str(refused.value)
    assert markdown.read_text() == "# Results\nkept\n"
    with pytest.raises(SystemExit, match=f"{why}.*nothing ran"):  # before any cell, not after them all
        benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path), "--out-dir", str(tmp_path / "runs"),
                   "--reference", str(path)])
    assert not (tmp_path / "runs").exists()


def test_a_results_file_without_its_header_fields_is_reported_with_them_unknown(tmp_path):
    """Deleting "machine" (or "started", "command", "commit") by hand ended in a KeyError; an older
    harness's file may lack one too. The header says unknown, and the figures are reported."""
    results.results_path(tmp_path, "tables", date(2026, 1, 1)).write_text(
        edited(machine="drop", started="drop", command="drop", commit="drop"))
    markdown = tmp_path / "RESULTS.md"
    benchmark(["--suite", "tables", "--report-only", "--results-dir", str(tmp_path), "--results-md", str(markdown)])
    text = markdown.read_text()
    assert "size **full**, start unknown, unknown CPU cores (unknown), torch unknown, commit `unknown`" in text
    assert "- Command: `unknown`" in text and "| a | adult |" in text


def test_a_peers_virtualenv_that_cannot_be_made_says_how_to_go_on(tmp_path, monkeypatch):
    """Offline, pip cannot install smartnoise-synth: the suite stops with the way out
    (--peers-venv) and where pip's output is, not a traceback."""
    from lightning_dpgan.benchmark import peers

    def offline_pip(command, log, env=None):
        if "pip" in command:
            raise RuntimeError("pip failed (exit 1); end of log:\nERROR: No matching distribution found for torch")
        return 0.0

    monkeypatch.setattr(peers, "run_logged", offline_pip)
    with pytest.raises(SystemExit) as refused:
        peers.ensure_venv(tmp_path / "venv", tmp_path / "venv.log")
    message = str(refused.value)
    assert "--peers-venv" in message and str(tmp_path / "venv.log") in message and "No matching distribution" in message


def test_plots_no_results_md_names_are_removed_and_the_others_kept(tmp_path):
    """The harness's own plots that RESULTS.md no longer names go; a picture the harness did not
    draw stays, named or not (a user's figure in the folder was deleted)."""
    plots = tmp_path / "plots"
    plots.mkdir()
    for name in ("tables-2026-01-02-adult.png", "tables-2026-01-01-3-adult.png", "hand-drawn.png", "my-own-figure.png"):
        (plots / name).write_bytes(b"png")
    markdown = "![a](results/plots/tables-2026-01-02-adult.png)\nprose: see plots/hand-drawn.png\n"
    assert cli.remove_unreferenced_plots(plots, markdown) == ["tables-2026-01-01-3-adult.png"]
    assert sorted(p.name for p in plots.iterdir()) == ["hand-drawn.png", "my-own-figure.png", "tables-2026-01-02-adult.png"]
    assert cli.remove_unreferenced_plots(tmp_path / "none", markdown) == []


def test_a_preview_written_elsewhere_keeps_the_plots_the_results_folders_own_markdown_links(tmp_path):
    """--results-md in a scratch folder removed the plots that the results folder's RESULTS.md
    (hand-written part) still linked: only the file just written was read for their names."""
    results_dir, scratch = tmp_path / "results", tmp_path / "scratch"
    (results_dir / "plots").mkdir(parents=True)
    scratch.mkdir()
    results.results_path(results_dir, "tables", date(2026, 1, 1)).write_text(
        json.dumps(result_file("tables", "full", [run("a", 0, 0.5)])))
    for name in ("speed-2026-11-01.png", "speed-2026-10-01.png"):
        (results_dir / "plots" / name).write_bytes(b"png")
    (results_dir / "RESULTS.md").write_text("# Results\n\nHand analysis ![old](plots/speed-2026-11-01.png)\n")
    benchmark(["--suite", "tables", "--report-only", "--results-dir", str(results_dir), "--results-md",
               str(scratch / "R.md")])
    kept = sorted(path.name for path in (results_dir / "plots").glob("speed-*.png"))
    assert kept == ["speed-2026-11-01.png"]  # the one no markdown names goes, as before


def test_a_tree_that_git_cannot_read_is_said_to_be_unknown_not_clean():
    header = report._header({**result_file("tables", "full", [run("a", 0, 0.5)]), "commit": {"sha": "abc", "dirty": None}})
    assert "uncommitted changes is unknown" in header[0]
    assert "uncommitted" not in report._header(result_file("tables", "full", [run("a", 0, 0.5)]))[0]
    dirty = {**result_file("tables", "full", [run("a", 0, 0.5)]), "commit": {"sha": "abc", "dirty": True}}
    assert "commit `abc` with uncommitted changes." in report._header(dirty)[0]
    # a quick file's figures are said to be no measurement of the models
    assert any("not the full protocol" in line for line in report._header(result_file("tables", "quick", [run("a", 0, 0.5)])))


def test_a_stopped_suite_keeps_the_cells_it_finished_and_only_those(tmp_path, monkeypatch):
    """The file is rewritten after every run: a suite killed midway keeps its finished runs,
    marked incomplete. Its cells with every seed count toward the protocol; a cell cut short does
    not (its mean would be over fewer seeds); a stopped full run does not hide the earlier
    full-subset files as a complete one would."""
    from lightning_dpgan.benchmark import cli

    def write(day, size, runs):
        content = result_file("tables", size, runs)
        content.pop("file")
        results.results_path(tmp_path, "tables", day).write_text(json.dumps(content))

    write(date(2026, 1, 1), "full-subset", [run("dpctgan", s, 0.80) for s in range(3)])
    grid = [run("quail", s, 0.85) for s in range(3)] + [run("pategan", s, 0.60) for s in range(3)]

    def killed_midway(size, settings, skipped, on_run):
        for done in range(1, 5):  # three quail seeds, one pategan seed, then the machine is gone
            on_run(grid[:done])
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "commit", lambda **kwargs: {"sha": "abc", "dirty": False})
    monkeypatch.setattr(cli, "run_grid", killed_midway)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    with pytest.raises(KeyboardInterrupt):
        cli.benchmark(["--suite", "tables", "--seeds", "0", "1", "2", "--results-dir", str(tmp_path),
                       "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    (stopped,) = [p for p in tmp_path.glob("tables-*.json") if p.name != "tables-2026-01-01.json"]
    content = json.loads(stopped.read_text())
    assert content["complete"] is False and content["size"] == "full-subset" and len(content["runs"]) == 4
    assert {row["model"] for row in results.finished_summary(content)} == {"quail"}
    merged = results.protocol_results(tmp_path, "tables")
    assert {row["model"] for row in merged["summary"]} == {"quail", "dpctgan"}
    assert not any(r["model"] == "pategan" for r in merged["runs"])
    section = report.generated_section(tmp_path, {}, ["tables"], tmp_path)
    assert "| pategan |" not in section and "stopped before it finished" in section
    content.update(size="full")  # a stopped full run stands for the grid's finished cells alone, merged as a part
    stopped.write_text(json.dumps(content))
    assert {row["model"] for row in results.protocol_results(tmp_path, "tables")["summary"]} == {"quail", "dpctgan"}


def test_peers_on_the_full_protocol_meet_all_our_full_subset_runs(tmp_path):
    def write(suite, size, day, runs):
        content = result_file(suite, size, runs)
        results.results_path(tmp_path, suite, day).write_text(json.dumps(content))

    write("tables", "full-subset", date(2026, 1, 1), [run("pategan", s, 0.6) for s in range(3)])
    write("tables", "full-subset", date(2026, 1, 2), [run("dpctgan", s, 0.8) for s in range(3)])
    write("tables", "quick", date(2026, 1, 3), [run("pategan", 0, 0.1)])
    write("peers", "full-subset", date(2026, 1, 3), [run("pategan", s, 0.5) for s in range(3)])
    section = report.generated_section(tmp_path, {}, ["tables", "peers"], tmp_path)
    (line,) = [line for line in section.splitlines() if line.startswith("| pategan | adult | 1 | 0.500")]
    assert "| pategan | 0.600 ± 0.000 (3) | 1.20 |" in line  # our full-subset pategan, not the quick run
    assert "`tables-2026-01-02.json`, `tables-2026-01-01.json`, same protocol" in section


def test_a_stopped_quick_file_shows_only_the_cells_that_ran_every_seed(tmp_path):
    """Without a protocol run, the newest quick file stands alone; stopped midway, a cell with
    one of its two seeds would show a mean over fewer seeds than the size asks for."""
    content = {**result_file("tables", "quick", [run("quail", s, 0.8) for s in (0, 1)] + [run("pategan", 0, 0.6)]),
               "seeds": [0, 1], "complete": False}
    results.results_path(tmp_path, "tables", date(2026, 1, 1)).write_text(json.dumps(content))
    section = report.generated_section(tmp_path, {}, ["tables"], tmp_path)
    assert "| quail | adult | 1 |" in section and "| pategan |" not in section
    assert "stopped before it finished" in section


def test_generated_peers_are_timed_against_the_speed_suites_run_where_our_tables_cell_shared_the_machine(tmp_path):
    def write(suite, size, day, runs, **extra):
        results.results_path(tmp_path, suite, day).write_text(json.dumps({**result_file(suite, size, runs), **extra}))

    write("tables", "full-subset", date(2026, 1, 1), [run("pategan", s, 0.6) for s in range(3)], jobs=2)
    write("speed", "full", date(2026, 1, 1), [{**run("pategan", s, None), "train_seconds": 10.0} for s in range(3)])
    write("peers", "full", date(2026, 1, 2), [{**run("pategan", s, 0.5), "train_seconds": 30.0} for s in range(3)])
    section = report.generated_section(tmp_path, {}, ["tables", "speed", "peers"], tmp_path)
    (line,) = [line for line in section.splitlines() if line.startswith("| pategan | adult | 1 | 0.500")]
    assert line.endswith("| 30 ± 0 (3) | 10 ± 0 (3) (speed suite) | 3.00 |")


def test_the_measure_table_gives_training_and_fit_time_their_own_columns_in_whole_seconds():
    runs = [{**run("dpgan", s, 0.7), "train_seconds": 10.0 + 2 * s, "fit_seconds": 7.4 + s} for s in range(3)]
    head, _, row = report.measure_table(result_file("tables", "full", runs))
    cells = dict(zip([c.strip() for c in head.split("|")[1:-1]], [c.strip() for c in row.split("|")[1:-1]]))
    assert cells["train s"] == "12 ± 2 (3)" and cells["fit s"] == "8 ± 1 (3)" and cells["steps"] == "10 ± 0 (3)"


def test_the_measure_table_lists_a_models_epsilons_in_increasing_order_non_private_last():
    """Whatever order the cells ran in (the file keeps it), a model's rows read from the smallest
    budget up, and a cell without a budget (ε = ∞) comes after its model's budgeted ones."""
    runs = [run("gan", 0, 0.9, epsilon=None), run("gan", 0, 0.8, epsilon=1.0), run("dpgan", 0, 0.7, epsilon=10.0),
            run("dpgan", 0, 0.6, epsilon=1.0), run("dpgan", 0, 0.5, epsilon=0.1)]
    cells = [line.split("|") for line in report.measure_table(result_file("tables", "full", runs))[2:]]
    assert [(row[1].strip(), row[3].strip()) for row in cells] == [
        ("dpgan", "0.1"), ("dpgan", "1"), ("dpgan", "10"), ("gan", "1"), ("gan", "∞")]


def test_a_data_independent_bound_below_a_thousand_keeps_its_decimals():
    def spent(bound):
        runs = [{**run("pategan", s, 0.5), "epsilon_data_independent": bound} for s in range(3)]
        (_, _, row) = report.measure_table(result_file("tables", "full", runs))
        return row.split("|")[4].strip()

    assert spent(999.25) == "0.900 ± 0.000 (3) data-dependent; data-independent 999.250 ± 0.000 (3)"
    assert spent(1000.25) == "0.900 ± 0.000 (3) data-dependent; data-independent 1000 ± 0 (3)"
    assert spent(1000.0) == "0.900 ± 0.000 (3) data-dependent; data-independent 1000 ± 0 (3)"  # a thousand is in the thousands


@pytest.mark.parametrize("size,says,not_says", [
    ("full", [], ["Size full-subset", "Size dev", "not the full protocol"]),
    ("full-subset", ["Size full-subset: part of the full grid, each cell on the full protocol."],
     ["not the full protocol", "Size dev"]),
    ("dev", ["Size dev: scored on records held out of the training split"], ["not the full protocol"]),
    ("quick", ["Size quick: a smoke test of the harness", "not the full protocol"], ["Size full-subset", "Size dev"]),
    ("dev-quick", ["Size dev-quick: scored on records held out", "Size dev-quick: a smoke test"], ["Size full-subset"]),
    ("custom", ["Size custom: not the full protocol", "count for no goal"], ["smoke test", "Size dev"]),
])
def test_each_size_says_in_the_header_what_its_figures_stand_for(size, says, not_says):
    header = "\n".join(report._header(result_file("tables", size, [run("gan", 0, 0.5)])))
    assert all(text in header for text in says) and not any(text in header for text in not_says)


def test_the_utility_plot_draws_each_cells_spread_as_its_error_bar(tmp_path, monkeypatch):
    bars = {}

    def keep_bars(figure, path):
        for container in figure.axes[0].containers:
            (segments,) = [collection.get_segments() for collection in container.lines[2]]
            bars[container.get_label()] = [value for (x, low), (_, high) in sorted(segments, key=lambda seg: seg[0][0])
                                           for value in (float(x), float(low), float(high))]
        return path

    monkeypatch.setattr(report, "_save", keep_bars)
    runs = ([run("dpgan", s, v) for s, v in enumerate([0.6, 0.8])]  # mean 0.7, std 0.1414
            + [run("dpgan", s, v, epsilon=10.0) for s, v in enumerate([0.9, 0.9])] + [run("quail", 0, 0.5)])
    report.plot_suite(result_file("tables", "full", runs), {}, tmp_path)
    spread = statistics.stdev([0.6, 0.8])
    assert bars["dpgan"] == pytest.approx([1.0, 0.7 - spread, 0.7 + spread, 10.0, 0.9, 0.9])  # (ε, low, high) each
    assert bars["quail"] == pytest.approx([1.0, 0.5, 0.5])  # one seed: no spread measured, no bar
    # PATE's data-dependent epsilon, drawn at its target beside the others, read as a guarantee like theirs
    bars.clear()
    dependent = [{**run("pategan", s, 0.6), "epsilon_data_independent": 6400.0} for s in range(2)]
    report.plot_suite(result_file("tables", "full", dependent + [run("quail", 0, 0.5)]), {}, tmp_path)
    assert set(bars) == {"pategan (ε data-dependent)", "quail"}


def test_a_recorded_peer_command_names_the_venv_and_folders_not_their_paths(tmp_path):
    venv = tmp_path / "peers-venv"
    command = peer_command(venv / "bin" / "python", Cell("mst", "adult", 1.0, 0), tmp_path / "split" / "train.csv",
                           tmp_path / "split" / "spec.json", 10, suite_size("peers", quick=True), tmp_path / "mst")
    recorded = portable(command, None, str(venv), out_dir=tmp_path)
    assert recorded.startswith("PEERS_VENV/bin/python ") and "OUT_DIR/split/train.csv" in recorded
    assert str(tmp_path) not in recorded
    # the peers run at our delta for the dataset: 1e-6 on kaggle-credit, whose 1/n is below 1e-5
    credit = peer_command(venv / "bin" / "python", Cell("mst", "kaggle-credit", 1.0, 0), tmp_path / "train.csv",
                          tmp_path / "spec.json", 10, suite_size("peers", quick=True), tmp_path / "mst")
    assert command[command.index("--delta") + 1] == "1e-05" and credit[credit.index("--delta") + 1] == "1e-06"


def test_the_recorded_commit_is_the_one_the_runs_started_from(tmp_path, monkeypatch):
    """A suite runs for hours: a commit made meanwhile must not be recorded as the code that ran."""
    from lightning_dpgan.benchmark import cli

    state = {"ran": False}

    def runs(size, settings, skipped, on_run):
        state["ran"] = True  # someone commits while the suite runs
        return [run("gan", 0, 0.5)]

    monkeypatch.setattr(cli, "commit", lambda **kwargs: {"sha": "after" if state["ran"] else "before", "dirty": False})
    monkeypatch.setattr(cli, "run_grid", runs)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    path = cli.benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path), "--results-md",
                          str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    content = json.loads(path.read_text())
    assert content["commit"] == {"sha": "before", "dirty": False}
    # each cell imports the tree as it is when it starts: a change meanwhile is recorded and said
    assert content["commit_at_end"] == {"sha": "after", "dirty": False}
    assert "**The code changed while the suite ran**: commit `after`" in "\n".join(report._header({**content,
                                                                                                 "file": path.name}))
    state["ran"] = False
    monkeypatch.setattr(cli, "run_grid", lambda size, settings, skipped, on_run: [run("gan", 0, 0.5)])  # no commit
    steady = cli.benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path), "--results-md",
                            str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs2")])
    assert "commit_at_end" not in json.loads(steady.read_text())


def test_the_results_file_records_the_thread_count_of_cells_run_together(tmp_path, monkeypatch):
    from lightning_dpgan.benchmark import cli

    monkeypatch.setattr(cli, "run_grid", lambda size, settings, skipped, on_run: [run("gan", 0, 0.5)])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    monkeypatch.setattr(runner, "usable_cpus", lambda: 4)
    assert len(suite_size("tables", quick=True).cells()) == 2
    # --jobs past the grid's cells: as many at a time as there are cells, each its share of the cores (one
    # thread each for --jobs 16 on the 2-cell grid: two cells ran on one core each of four)
    for jobs, threads, recorded in (("1", None, 1), ("2", "2", 2), ("16", "2", 2)):
        path = cli.benchmark(["--suite", "tables", "--quick", "--jobs", jobs, "--results-dir", str(tmp_path / jobs),
                              "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
        content = json.loads(path.read_text())
        assert content.get("threads_per_job") == threads and content["jobs"] == recorded  # what each cell's processes got


def test_a_suite_whose_results_md_cannot_be_regenerated_still_says_where_its_results_are(tmp_path, monkeypatch):
    """The results file is written before RESULTS.md is regenerated: when that fails (a damaged
    older file in the folder), the refusal names the new file, which holds every measured run."""
    from lightning_dpgan.benchmark import cli

    monkeypatch.setattr(cli, "run_grid", lambda size, settings, skipped, on_run: [run("gan", 0, 0.5)])
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    (tmp_path / "tables-2020-01-01.json").write_text("{not json")
    with pytest.raises(SystemExit) as refused:
        cli.benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path), "--results-md",
                       str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    (written,) = [path for path in tmp_path.glob("tables-*.json") if path.name != "tables-2020-01-01.json"]
    assert "tables-2020-01-01.json" in str(refused.value.code) and "was left as it is" in str(refused.value.code)
    assert str(refused.value.code).endswith(f"The suite's results were written to {written}")
    assert json.loads(written.read_text())["runs"][0]["model"] == "gan"


def test_a_changed_grid_is_not_the_full_protocol():
    from lightning_dpgan.benchmark.cli import size_label

    assert size_label(parse_args(["--suite", "tables"])) == "full"
    assert size_label(parse_args(["--suite", "tables", "--quick"])) == "quick"
    assert size_label(parse_args(["--suite", "tables", "--seeds", "0"])) == "custom"  # fewer than 3 seeds
    assert size_label(parse_args(["--suite", "tables", "--", "--batch-size", "8"])) == "custom"
    assert size_label(parse_args(["--suite", "tables", "--max-steps", "5", "--models", "quail"])) == "custom"
    assert size_label(parse_args(["--suite", "tables", "--quick", "--models", "quail"])) == "custom"
    assert size_label(parse_args(["--suite", "tables", "--models", "quail", "--datasets", "adult"])) == "full-subset"
    assert size_label(parse_args(["--suite", "tables", "--models", "quail", "--epsilons", "5"])) == "custom"  # not a grid ε
    assert size_label(parse_args(["--suite", "tables", "--models", "gan"])) == "custom"  # not a model of the suite
    assert size_label(parse_args(["--suite", "tables", "--seeds", "3", "4", "5"])) == "full-subset"  # more seeds: fine


def test_a_scratch_results_folder_gets_its_own_results_md():
    scratch = parse_args(["--report-only", "--results-dir", "/tmp/scratch-results"])
    assert scratch.results_md == Path("/tmp/scratch-results/RESULTS.md")
    assert parse_args(["--suite", "tables"]).results_md == REPO / "benchmarks" / "RESULTS.md"
    with pytest.raises(SystemExit):
        parse_args(["--quick"])  # a suite to run is needed unless only the report is made


def test_jobs_run_a_cells_seeds_at_the_same_time_and_keep_the_grid_order(tmp_path, monkeypatch):
    """With --jobs 3 the three seeds of a cell run together (each waits at a barrier that only
    three running cells pass) and never more than three at once; the runs are saved in grid
    order although the later seeds finish first, a failure is still recorded, and the results
    file and its report say the times were shared."""
    import threading
    import time

    from lightning_dpgan.benchmark import cli

    together, lock = threading.Barrier(3, timeout=10), threading.Lock()
    running, most = [0], [0]

    def fake_cell(cell, size, settings):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        together.wait()  # a BrokenBarrierError (a failed run) unless three cells run at once
        time.sleep(0.05 * (2 - cell.seed))  # seed 2 finishes first, seed 0 last
        with lock:
            running[0] -= 1
        if cell.model == "dpctgan" and cell.seed == 1:
            raise RuntimeError("this seed failed")
        return {**cell.record, "epsilon": 0.9, "steps": 3, "train_seconds": 1.0, "fit_seconds": 1.0,
                "measures": {"utility/B_auroc": 0.5 + cell.seed / 10}}

    saved = []
    monkeypatch.setattr(cli, "run_cell", fake_cell)
    size = suite_size("tables", quick=False).with_overrides(models=["quail", "dpctgan"], datasets=["adult"],
                                                          epsilons=[1.0])
    runs = cli.run_grid(size, Settings(out_dir=tmp_path, jobs=3), {}, on_run=lambda done: saved.append(list(done)))
    assert most[0] == 3
    assert [(r["model"], r["seed"]) for r in runs] == [(m, s) for m in ("quail", "dpctgan") for s in (0, 1, 2)]
    assert [r["status"] for r in runs] == ["ok"] * 4 + ["failed", "ok"]
    assert "this seed failed" in runs[4]["error"]
    assert [[(r["model"], r["seed"]) for r in done] for done in saved[:3]] == [
        [("quail", 2)], [("quail", 1), ("quail", 2)], [("quail", 0), ("quail", 1), ("quail", 2)]]
    assert len(saved) == 6 and saved[-1] == runs

    content = {**result_file("tables", "full-subset", runs), "jobs": 3}
    assert "3 cells ran at a time (`--jobs`)" in "\n".join(report._header(content))
    assert "(`--jobs`, OMP_NUM_THREADS=1 in each)" in "\n".join(report._header({**content, "threads_per_job": "1"}))
    with pytest.raises(SystemExit, match="wall times"):
        cli.benchmark(["--suite", "speed", "--jobs", "2", "--results-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="1 or more"):
        cli.benchmark(["--suite", "images", "--jobs", "0", "--results-dir", str(tmp_path)])


def test_cells_run_together_share_the_cpus_between_their_compute_threads(monkeypatch):
    """Alone a cell keeps its environment; N at a time each gets cpus // N threads (at least
    one), in every thread variable the user has not set himself."""
    for name in runner.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runner, "usable_cpus", lambda: 8)
    assert Settings(out_dir=Path("o")).child_environment() is None
    environment = Settings(out_dir=Path("o"), jobs=3).child_environment()
    assert {name: environment[name] for name in runner.THREAD_VARIABLES} == dict.fromkeys(runner.THREAD_VARIABLES, "2")
    assert environment["PATH"] == os.environ["PATH"]
    monkeypatch.setattr(runner, "usable_cpus", lambda: 2)
    assert Settings(out_dir=Path("o"), jobs=3).threads_per_job == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    environment = Settings(out_dir=Path("o"), jobs=2).child_environment()
    assert environment["OMP_NUM_THREADS"] == "5" and environment["MKL_NUM_THREADS"] == "1"


def test_a_cell_run_beside_others_computes_with_its_share_of_threads(tmp_path, monkeypatch):
    """The limit reaches the processes: torch in a child started by run_logged with a cell's
    environment has one compute thread when two cells share two CPUs, and run_cell hands that
    environment to both its train and its evaluate command."""
    for name in runner.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runner, "usable_cpus", lambda: 2)
    settings = Settings(out_dir=tmp_path, jobs=2)
    log = tmp_path / "threads.log"
    runner.run_logged([sys.executable, "-c", "import torch; print('threads', torch.get_num_threads())"], log,
                      settings.child_environment())
    assert "threads 1" in log.read_text().splitlines()

    given = []
    monkeypatch.setattr(runner, "run_logged", lambda command, log, env=None: given.append(env) or 1.0)
    size = suite_size("tables", quick=True)
    runner.run_cell(size.cells()[0], size, settings)
    assert len(given) == 2 and all(env["OMP_NUM_THREADS"] == "1" for env in given)
    given.clear()
    runner.run_cell(size.cells()[0], size, Settings(out_dir=tmp_path))
    assert given == [None, None]


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_interrupted_suite_starts_no_further_cell(tmp_path, monkeypatch, jobs):
    """Ctrl-C in a cell stops the suite: the queued cells never start, with or without --jobs."""
    import time

    from lightning_dpgan.benchmark import cli

    started = []

    def fake_cell(cell, size, settings):
        started.append(cell.name)
        if len(started) == 1:
            raise KeyboardInterrupt
        time.sleep(0.2)
        return {**cell.record, "measures": {}}

    monkeypatch.setattr(cli, "run_cell", fake_cell)
    size = suite_size("tables", quick=False).with_overrides(models=["quail", "dpctgan"], datasets=["adult"],
                                                          epsilons=[1.0])
    with pytest.raises(KeyboardInterrupt):
        cli.run_grid(size, Settings(out_dir=tmp_path, jobs=jobs), {})
    # the first cell and those running beside it; with a pool, the first cell's freed worker may
    # already have taken one more before the interrupt reached the suite
    assert len(started) <= (jobs + 1 if jobs > 1 else 1) < 6


def test_peers_are_not_timed_against_our_runs_that_shared_the_machine():
    tables = {**result_file("tables", "full-subset", [run("pategan", s, 0.6) for s in range(3)]), "jobs": 2}
    peers = result_file("peers", "full", [run("pategan", s, 0.5) for s in range(3)])
    (line,) = [line for line in report.peer_comparison(peers, tables) if line.startswith("| pategan")]
    assert line.endswith("| – (ours shared the machine) |")
    tables["jobs"] = 1
    (line,) = [line for line in report.peer_comparison(peers, tables) if line.startswith("| pategan")]
    assert line.endswith("| 1.00 |")


def test_a_shared_tables_time_gives_way_to_the_speed_suites_on_the_same_schedule():
    """The speed suite times each cell alone: where our tables cell shared the machine, its time
    is the one compared with the peer's, if it ran the same number of steps."""
    tables = {**result_file("tables", "full-subset", [run("pategan", s, 0.6) for s in range(3)]), "jobs": 2}
    peers = result_file("peers", "full", [{**run("pategan", s, 0.5), "train_seconds": 30.0} for s in range(3)])
    alone = [{**run("pategan", s, None), "train_seconds": 10.0} for s in range(3)]
    speed = result_file("speed", "full", alone)
    (line,) = [line for line in report.peer_comparison(peers, tables, speed) if line.startswith("| pategan")]
    assert line.endswith("| 30 ± 0 (3) | 10 ± 0 (3) (speed suite) | 3.00 |")  # peer 30 s / ours alone 10 s
    other_schedule = result_file("speed", "full", [{**r, "steps": 20} for r in alone])  # a preset changed since
    (line,) = [line for line in report.peer_comparison(peers, tables, other_schedule) if line.startswith("| pategan")]
    assert line.endswith("| 6 ± 1 (3) | – (ours shared the machine) |")  # the tables time, shown, not compared


def test_a_speed_suite_time_is_not_compared_where_the_speed_suite_itself_shared_the_machine():
    """The speed suite's time stands in for a shared tables time only because it was taken alone:
    a speed run given --jobs above 1 (or a merged part of one) timed its cells side by side too."""
    tables = {**result_file("tables", "full-subset", [run("pategan", s, 0.6) for s in range(3)]), "jobs": 2}
    peers = result_file("peers", "full", [{**run("pategan", s, 0.5), "train_seconds": 30.0} for s in range(3)])
    alone = [{**run("pategan", s, None), "train_seconds": 10.0} for s in range(3)]
    shared_speed = {**result_file("speed", "full", alone), "jobs": 2}
    (line,) = [line for line in report.peer_comparison(peers, tables, shared_speed) if line.startswith("| pategan")]
    assert line.endswith("| 6 ± 1 (3) | – (ours shared the machine) |")  # the tables time, shown, not compared
    speed_part = {**result_file("speed", "full", alone), "jobs": 2, "cells": [("pategan", "adult", 1.0)]}
    merged_speed = {**speed_part, "jobs": 1, "parts": [speed_part]}  # the file that gave the cell ran --jobs 2
    (line,) = [line for line in report.peer_comparison(peers, tables, merged_speed) if line.startswith("| pategan")]
    assert line.endswith("| – (ours shared the machine) |")


def test_every_full_tables_cell_leaves_budget_to_train():
    """The modes' DP histogram must cost less than the epsilon it shares with training (and,
    for QUAIL, less than the synthesizer's half): epsilon 0.1 has its own presets."""
    from lightning_dpgan.cli import build_config

    for cell in suite_size("tables", quick=False).cells():
        config = build_config(["--model", cell.model, "--dataset", cell.dataset, "--epsilon", f"{cell.epsilon:g}"])
        assert modes_epsilon(config) < 0.5 * cell.epsilon, (cell.name, modes_epsilon(config))


# ------------------------------------------------------------------------ peers
def test_peers_get_the_public_schema_and_the_train_split_alone(tmp_path):
    datamodule = load_datamodule("adult", str(ADULT))
    train, spec_path = export_split(datamodule, tmp_path)
    spec = json.loads(spec_path.read_text())
    schema = datamodule.schema
    assert spec["preprocessor_epsilon"] == 0.0
    assert spec["label"] == schema.label
    for column in schema.columns:
        if column.is_numeric:
            assert spec["continuous"][column.name] == list(column.bounds)
        else:
            assert spec["categorical"][column.name] == list(column.categories)
    # the whole-number columns, which a peer would otherwise write with decimals
    assert spec["integer"] == [column.name for column in schema.columns if column.kind == "integer"]
    assert "age" in spec["integer"] and not set(spec["integer"]) & set(spec["categorical"])
    exported = train.read_text().splitlines()
    assert exported[0].split(",") == schema.names
    assert len(exported) - 1 == len(datamodule.train_frame) < len(datamodule.train_frame) + len(datamodule.test_frame)
    cell = Cell("mst", "adult", 1.0, 2)
    command = peer_command(Path("python"), cell, train, spec_path, 36, suite_size("peers", True), tmp_path)
    assert command[command.index("--seed") + 1] == "2" and command[command.index("--epochs") + 1] == "2"
    # the cell's own budget, and as many rows as ours train on
    assert command[command.index("--epsilon") + 1] == "1" and command[command.index("--delta") + 1] == "1e-05"
    assert command[command.index("--n") + 1] == "36"


def test_only_integer_columns_are_handed_to_a_peer_as_whole_numbers():
    """A peer rounds the columns the spec calls integer: a continuous column (a rate, a price)
    rounded so would lose its decimals. Adult has no such column, so a schema of three kinds."""
    from lightning_dpgan.benchmark.peers import table_spec
    from lightning_dpgan.data.schema import Column, TableSchema

    schema = TableSchema((Column("age", "integer", bounds=(17, 90)), Column("rate", "continuous", bounds=(0.0, 1.5)),
                          Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")
    spec = table_spec(schema)
    assert spec["integer"] == ["age"]
    assert spec["continuous"] == {"age": [17.0, 90.0], "rate": [0.0, 1.5]}
    assert spec["categorical"] == {"y": ["no", "yes"]} and spec["label"] == "y" and spec["preprocessor_epsilon"] == 0.0


def test_the_peers_refuse_images_and_a_table_whose_schema_would_be_estimated_from_its_rows(tmp_path, monkeypatch):
    """A csv without a schema file has its bounds and categories estimated under DP: handed to a
    peer for free, that estimate would break the shared preprocessing budget rule."""
    from lightning_dpgan import registry
    from lightning_dpgan.datamodules.csv import CSVDataModule

    with pytest.raises(ValueError, match="the peers run on tables; mnist holds images"):
        load_datamodule("mnist", None)
    rows = tmp_path / "rows.csv"
    rows.write_text("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))
    def without_schema(data_dir):
        return CSVDataModule(csv=rows, target="y", label_kind="binary")

    csv_file_without_schema = SimpleNamespace(load=lambda: without_schema)
    monkeypatch.setitem(registry.TABLES["dataset"], "csv", csv_file_without_schema)
    with pytest.raises(ValueError, match="csv has no declared schema .* give the peers a schema file"):
        load_datamodule("csv", None)


def test_a_dataset_that_cannot_be_fetched_is_named_with_its_reason(tmp_path, monkeypatch):
    from lightning_dpgan.datamodules import kaggle_credit

    cache = tmp_path / "cache"
    monkeypatch.setenv("LIGHTNING_DPGAN_CACHE_DIR", str(cache))

    def offline(*args, **kwargs):  # the whole of a not-found message: what was tried, where, what to do
        raise OSError(f"could not download creditcard.csv. Tried:\n  https://x/creditcard.csv: no network\n"
                      f"Searched: {ADULT}, {cache / 'kaggle'}\nGive --data-dir")

    monkeypatch.setattr(kaggle_credit.KaggleCreditDataModule, "prepare_data", offline)
    skipped = unavailable_datasets(("adult", "kaggle-credit"), str(ADULT))
    assert list(skipped) == ["kaggle-credit"]
    reason = skipped["kaggle-credit"]
    assert "no network" in reason and "Give --data-dir" in reason  # every line, not the first alone
    assert "Searched: DATA_DIR, CACHE_DIR/kaggle" in reason and str(tmp_path) not in reason
    header = report._header({**result_file("tables", "full", [run("a", 0, 0.5)]), "skipped": skipped})
    (line,) = [line for line in header if line.startswith("- Skipped")]
    assert "no network" in line and "Give --data-dir" in line  # one Markdown line


# ------------------------------------------------------------------ end to end
def test_a_failed_cell_keeps_the_reason_without_this_machine_paths(tmp_path):
    """A refused run's log ends with library warnings naming files under the interpreter's
    site-packages, then the command's own message: the record keeps the message, not the paths."""
    site_packages = Path(sys.prefix) / "lib" / "site-packages" / "lightning" / "fit_loop.py"
    error = RuntimeError(f"{sys.executable} -m lightning_dpgan train failed (exit 1); end of {tmp_path}/x.log:\n"
                         f"{site_packages}:321: The number of training batches (1) is smaller\n"
                         "error: a single training step would spend epsilon = 0.1391, more than --epsilon 0.1")
    record = failed_run(Cell("patectgan", "adult", 0.1, 0), error, Settings(out_dir=tmp_path))
    assert record["error"].endswith("more than --epsilon 0.1") and "PYTHON_PREFIX" in record["error"]
    assert sys.prefix not in record["error"] and str(tmp_path) not in record["error"]
    assert record["status"] == "failed" and record["target_epsilon"] == 0.1


def test_a_suite_records_every_run_keeps_going_past_a_failure_and_regenerates_results(tmp_path, capsys):
    """Two seeds of a model that trains on the tiny table, and a model that fails: the failure
    is recorded with its reason, the rest is summarized, RESULTS.md gets the table and the
    plot, and the command exits with status 1."""
    markdown = tmp_path / "RESULTS.md"
    markdown.write_text("# Results\n\nKept.\n")
    argv = ["--suite", "tables", "--quick", "--models", "dpctgan", "quail", "--seeds", "0", "1",
            "--max-steps", "2", "--data-dir", str(ADULT), "--out-dir", str(tmp_path / "runs"),
            "--results-dir", str(tmp_path / "results"), "--results-md", str(markdown), "--", "--batch-size", "8"]
    with pytest.raises(SystemExit) as exit_info:
        benchmark(argv)
    assert exit_info.value.code == 1
    (path,) = (tmp_path / "results").glob("tables-*.json")
    content = json.loads(path.read_text())
    ok = [r for r in content["runs"] if r["status"] == "ok"]
    failed = [r for r in content["runs"] if r["status"] == "failed"]
    assert [r["seed"] for r in ok] == [0, 1] and {r["model"] for r in ok} == {"dpctgan"}
    # QUAIL's label model draws batches of 256 records: more than the tiny table's 36
    assert len(failed) == 2 and all("batch_size 256 exceeds the 36 training records: give QUAIL a smaller "
                                    "--quail.batch_size" in r["error"] for r in failed)
    assert all(0 < r["epsilon"] <= 1 and r["steps"] == 2 and r["stopped_by"] == "max-steps" for r in ok)
    assert "--seed 1" in ok[1]["commands"][0] and "evaluate" in ok[1]["commands"][1]
    # commands name no path of this machine: the interpreter is `python`, the data folder DATA_DIR
    assert ok[1]["commands"][0].startswith("python -m lightning_dpgan train") and "--data-dir DATA_DIR" in ok[1]["commands"][0]
    assert str(ADULT) not in json.dumps(content["command"]) and "--data-dir DATA_DIR" in content["command"]
    (row,) = content["summary"]
    assert row["measures"]["utility/B_auroc"]["n"] == 2
    assert row["measures"]["utility/B_auroc"]["mean"] == pytest.approx(
        statistics.fmean(r["measures"]["utility/B_auroc"] for r in ok))
    assert content["commit"]["sha"] == results.commit()["sha"]  # None only outside a git checkout
    assert content["seeds"] == [0, 1] and content["machine"]["cpu_count"]
    text = markdown.read_text()
    assert "Kept." in text and "| dpctgan | adult | 1 |" in text and "exceeds the 36 training records" in text
    for written in (path.read_text(), text):  # no path of this machine in what is committed
        assert str(tmp_path) not in written and str(ADULT) not in written and sys.executable not in written
    assert (tmp_path / "results" / "plots" / f"{path.stem}-adult.png").is_file()


@pytest.mark.parametrize("change, message", [
    (lambda frame: frame.assign(workclass="Never-declared"), "Never-declared"),
    (lambda frame: frame.assign(age=float("nan")), "NaN"),
    (lambda frame: frame.drop(columns=["age"]), "age"),
], ids=["undeclared-category", "nan", "missing-column"])
def test_the_peer_script_refuses_bad_input_before_fitting(tmp_path, change, message):
    """Checked before smartnoise is imported (this environment has none): the train split must
    match the declared schema, with no value outside it."""
    import subprocess


    import pandas as pd

    datamodule = load_datamodule("adult", str(ADULT))
    train, spec = export_split(datamodule, tmp_path)
    change(pd.read_csv(train)).to_csv(train, index=False)
    command = [sys.executable, str(REPO / "benchmarks" / "peers" / "smartnoise_synth.py"), "--synthesizer", "mst",
               "--train", str(train), "--spec", str(spec), "--epsilon", "1", "--n", "5", "--seed", "0",
               "--out", str(tmp_path / "out.csv")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "out.csv").exists()


def test_the_harness_own_markdown_does_not_make_the_tree_dirty(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "RESULTS.md").write_text("a\n")
    (tmp_path / "code.py").write_text("a\n")
    git("add", ".")
    git("commit", "-qm", "x")
    (tmp_path / "RESULTS.md").write_text("b\n")  # what a suite rewrites
    assert results.commit(tmp_path, own_output=tmp_path / "RESULTS.md")["dirty"] is False
    assert results.commit(tmp_path)["dirty"] is True
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "tables-x.json").write_text("{}")  # an earlier suite's results, not committed yet
    assert results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",))["dirty"] is False
    (tmp_path / "preset.yaml").write_text("lr: 1\n")  # a file git has not seen changes a run too
    assert results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",))["dirty"] is True
    with_preset = results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",))
    (tmp_path / "preset.yaml").write_text("lr: 2\n")  # the same unseen file, edited
    assert results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",)) != with_preset
    (tmp_path / "preset.yaml").unlink()
    (tmp_path / "vendored").mkdir()  # an untracked link to a folder (git sees a link, with no content to hash)
    (tmp_path / "link").symlink_to(tmp_path / "vendored", target_is_directory=True)
    linked = results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",))
    assert linked["dirty"] is True and "changes" in linked
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "results", target_is_directory=True)  # pointed elsewhere: another tree
    assert results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",)) != linked
    (tmp_path / "link").unlink()
    (tmp_path / "code.py").write_text("b\n")
    edited = results.commit(tmp_path, own_output=tmp_path / "RESULTS.md")
    assert edited["dirty"] is True and "changes" in edited
    (tmp_path / "code.py").write_text("c\n")  # a tree dirty already, edited again: same sha, same dirty
    again = results.commit(tmp_path, own_output=tmp_path / "RESULTS.md")
    assert again["sha"] == edited["sha"] and again["dirty"] is True and again != edited
    (tmp_path / "RESULTS.md").write_text("c\n")  # the harness's own file does not count
    assert results.commit(tmp_path, own_output=tmp_path / "RESULTS.md") == again
    (tmp_path / "code.py").write_text("a\n")
    clean = results.commit(tmp_path, own_output=tmp_path / "RESULTS.md", own_folders=(tmp_path / "results",))
    assert clean["dirty"] is False and "changes" not in clean
    # a RESULTS.md outside the tree: git refuses it as a pathspec, which read as "unknown" (None)
    assert results.commit(tmp_path, own_output=tmp_path.parent / "elsewhere" / "RESULTS.md")["dirty"] is True


def never_run(*args, **kwargs):
    raise AssertionError("a cell ran")


@pytest.mark.parametrize("extra,message", [
    (["--seeds", "0", "0", "1"], "--seeds repeats 0"),
    (["--epsilons", "1", "1"], "--epsilons repeats 1.0"),
    (["--models", "quail", "pategn"], "unknown model 'pategn'"),
    (["--epsilons", "1", "0"], r"--epsilons 0.0: each target epsilon must be a finite number above 0"),
    (["--epsilons", "nan"], r"--epsilons nan: each target epsilon"),
    (["--epsilons", "-1"], r"--epsilons -1.0: each target epsilon"),
    (["--seeds", "0", "-1"], r"--seeds -1: seeds are whole numbers from 0"),
    (["--models", "quail", "gan"], r"--models gan trains without privacy \(--privacy none\)"),
    (["--models", "wgan", "dpgan", "ctgan"], r"--models wgan ctgan train without privacy.*-- --privacy dp-sgd"),
    (["--datasets", "adult", "adlut"], "--datasets: .*adlut.*Did you mean 'adult'"),
    # any CSV has no schema or split of its own to compare on: not offered, and refused as such
    (["--datasets", "nosuch"], r"Valid dataset names: mnist, fashion-mnist, adult, king, kaggle-credit\.$"),
    (["--datasets", "csv", "--", "--data.csv", "my.csv"], "--datasets csv: the suites run the named datasets.*train --dataset csv"),
    (["--cnn-epochs", "3"], "--cnn-epochs set how image runs are scored, and the grid has no image dataset"),
    (["--n-synthetic", "50", "--cnn-epochs", "3"], "--n-synthetic and --cnn-epochs set how image runs are scored"),
    (["--max-steps", "0"], "--max-steps must be 1 or more, not 0"),  # 0 passed on nothing: the presets' whole length
    (["--datasets", "adult", "--cnn-epochs", "0"], "--cnn-epochs must be 1 or more, not 0"),  # before "no image dataset"
    (["--data-dir", "/nonexistent/lightning-dpgan-data"], "--data-dir /nonexistent/lightning-dpgan-data is not a folder"),
])
def test_a_grid_with_repeats_or_unknown_models_is_refused_before_any_cell(tmp_path, monkeypatch, extra, message):
    monkeypatch.setattr(cli, "run_grid", never_run)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    with pytest.raises(SystemExit, match=message):
        cli.benchmark(["--suite", "tables", *extra, "--results-dir", str(tmp_path), "--results-md",
                       str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    assert not list(tmp_path.glob("tables-*.json"))


@pytest.mark.parametrize("suite,train_args,message", [
    ("tables", ["--dataset", "king"], r"data.name \(set by --datasets\)"),  # King's figures filed under adult
    ("tables", ["--epsilon=3", "--seed", "2"], r"epsilon \(set by --epsilons\); seed \(set by --seeds\)"),
    ("tables", ["--output_dir", "shared"], r"output_dir \(set by --out-dir\)"),  # every cell in one folder
    ("tables", ["--data.data_dir", "elsewhere", "--max_steps", "3"], r"data.data_dir .*; max_steps \(set by --max-steps\)"),
    ("tables", ["--max-stepz", "3"], "train options after --: unrecognized argument '--max-stepz'"),  # every cell failing
    ("tables", ["--batch-size", "many"], "train options after --: argument --batch-size: invalid int value"),
    ("tables", ["--batch-size", "32", "--data.batch_size", "64"], "--batch-size 32 and --data.batch_size 64 both set"),
    ("tables", ["--privacy", "dp-sgd", "--privacy", "none"], "--privacy dp-sgd and --privacy none both set privacy.name"),
    ("peers", ["--privacy.noise_multiplier", "2"], "the peers suite runs smartnoise-synth, not train"),
    # read by train's parser, refused by the model, strategy or Trainer each cell builds: checked on each cell's
    # resolved settings (the presets' included) before the first runs
    ("tables", ["--model.latnt_dim", "64"], r"the cells pategan / adult / ε=1 would be refused by train, before any "
                                            r"of them runs: unknown key\(s\) model.latnt_dim for model 'pategan'"),
    ("tables", ["--model.pac", "2"], r"cells pategan / adult / ε=1 .*unknown key\(s\) model.pac"),  # dpctgan's, not pategan's
    ("tables", ["--privacy.noise_multiplier", "2"], r"cells pategan .*unknown key\(s\) privacy.noise_multiplier for privacy"),
    ("tables", ["--model.latent_dim", "many"], r"cells pategan .*model.latent_dim"),
    ("tables", ["--trainer.max_epochz", "2"], r"cells pategan .*unknown Lightning Trainer argument\(s\): trainer.max_epochz"),
    ("tables", ["--privacy", "dp-sgd"], r"cells pategan .*--privacy dp-sgd needs a model with a GradientPrivatizer slot"),
    # a table run's rows: train refused it in each image cell, one after the other
    ("images", ["--num_synthetic", "50"], r"cells dpgan / mnist / ε=10 .*--num_synthetic 50 sets the rows of a table "
                                          r"run's synthetic.csv.*The images suite's --n-synthetic sets how many images"),
])
def test_train_options_after_the_double_dash_that_the_grid_sets_or_train_does_not_read_are_refused(
        tmp_path, monkeypatch, suite, train_args, message):
    """They ran: a cell's later ``--dataset`` won over the grid's, and its figures were filed under
    the grid's dataset; a typo failed every cell, one after the other."""
    monkeypatch.setattr(cli, "run_grid", never_run)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    with pytest.raises(SystemExit, match=message):
        cli.benchmark(["--suite", suite, "--quick", "--results-dir", str(tmp_path), "--results-md",
                       str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs"), "--", *train_args])
    assert not list(tmp_path.glob(f"{suite}-*.json"))
    cli.check_train_args(["--privacy.noise_multiplier", "2", "--quail-split", "0.3", "--batch-size=64",
                          "--checkpoint_every_n_steps", "100", "--max-epochs", "3"])  # settings the grid leaves alone


def test_every_cell_of_every_suite_passes_the_settings_check_with_its_presets_and_valid_options():
    """The check before the grid must refuse only what train refuses: each suite's cells, full
    and quick, on a dev split too, and with options every model of the grid takes."""
    settings = Settings(out_dir=Path("out"), data_dir=None, accelerator=None, dev_fraction=0.2)
    for suite in ("tables", "images", "speed"):
        for quick in (False, True):
            size = suite_size(suite, quick)
            cli.check_cell_settings(size, settings, {})
    quail = suite_size("tables", False).with_overrides(models=("quail", "dpctgan"), datasets=("king",))
    cli.check_cell_settings(quail.with_overrides(train_args=["--batch-size", "64", "--model.lr_generator", "1e-4",
                                                             "--trainer.log_every_n_steps", "5"]), settings, {})


def test_the_settings_refused_after_the_double_dash_are_those_a_cells_train_command_sets():
    """``CELL_SETTINGS`` lists what :func:`runner.train_command` sets: a setting it gains must be
    refused after -- too, or a later value would win over the grid's unseen."""
    size = suite_size("tables", True)
    (cell, *_) = size.cells()
    settings = Settings(out_dir=Path("out"), data_dir="DATA", accelerator="cpu", dev_fraction=0.2)
    fresh, resumed = (train_command(cell, size, replace(settings, resume=resume), resume=resume)[4:]
                      for resume in (False, True))  # the words after "python -m lightning_dpgan train"
    display_only = {"trainer.enable_progress_bar"}
    assert cli.train_settings_given(fresh) | cli.train_settings_given(resumed) == set(cli.CELL_SETTINGS) | display_only


def test_a_non_private_model_given_a_strategy_after_the_double_dash_is_not_refused():
    """``-- --privacy dp-sgd`` makes a GAN private in every cell: the grid check lets it through."""
    size = suite_size("tables", True).with_overrides(models=("gan", "dpgan"))
    with pytest.raises(SystemExit, match="--models gan trains without privacy"):
        cli.refuse_non_private_models(size)
    for privacy in (["--privacy", "dp-sgd"], ["--privacy=dp-sgd"], ["--privacy.name", "dp-sgd"], ["--privacy.name=dp-sgd"],
                    ["--config", "settings.yaml"]):  # a config file may name one: train decides
        cli.refuse_non_private_models(size.with_overrides(train_args=[*size.train_args, *privacy]))
    with pytest.raises(SystemExit, match="--models gan dpgan train without privacy"):  # --privacy none: every model
        cli.refuse_non_private_models(size.with_overrides(train_args=[*size.train_args, "--privacy", "none"]))


def test_a_results_dir_that_is_a_file_is_refused_before_any_cell(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "run_grid", never_run)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit, match="is a file, not a folder"):
        cli.benchmark(["--suite", "images", "--quick", "--results-dir", str(tmp_path / "afile"),
                       "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])


@pytest.mark.parametrize("flag", ["--results-dir", "--out-dir"])
def test_a_results_or_runs_folder_that_cannot_be_made_or_written_is_refused_before_any_cell(tmp_path, monkeypatch, flag):
    """A --results-dir under a file passed the checks: the first cell trained for a minute, then
    the suite stopped at its first save with "[Errno 20] Not a directory", nothing recorded."""
    monkeypatch.setattr(cli, "run_grid", never_run)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # exists() cannot answer: a loop of links
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    shut, real_exists = tmp_path / "shut", Path.exists  # a folder this user may not search (root may search any)

    def exists(path):
        if path.parent == shut:
            raise PermissionError(13, "Permission denied", str(path))
        return real_exists(path)

    monkeypatch.setattr(Path, "exists", exists)
    folders = {"results": tmp_path / "results", "runs": tmp_path / "runs"}
    for given, message in [(tmp_path / "afile" / "sub", f"cannot be made: {tmp_path / 'afile'} is a file"),
                           (tmp_path / "dangling" / "sub", f"{tmp_path / 'dangling'} is a link to {tmp_path / 'gone'}, which leads"),
                           (locked / "new", f"{locked}, where it would be made, is a folder you cannot write in"),
                           (locked, "it is a folder you cannot write in"),
                           (tmp_path / "loop" / "sub", f"{tmp_path / 'loop'} is a link to {tmp_path / 'loop'}, which "
                                                       "leads to no folder"),
                           (shut / "sub", f"cannot be reached: Permission denied ({shut / 'sub'})")]:
        chosen = {**folders, "results" if flag == "--results-dir" else "runs": given}
        with pytest.raises(SystemExit) as refused:
            cli.benchmark(["--suite", "images", "--quick", "--results-dir", str(chosen["results"]),
                           "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(chosen["runs"])])
        assert f"{flag} {given}" in refused.value.code and message in refused.value.code, refused.value.code
        assert "nothing ran" in refused.value.code
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


def test_the_default_runs_folder_is_checked_before_any_cell_too(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "run_grid", never_run)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    monkeypatch.chdir(tmp_path)
    Path("runs").write_text("a file where runs/benchmark/ would go")
    with pytest.raises(SystemExit, match=r"the runs' folder runs/benchmark/images-\S+ cannot be made: runs is a file: "
                                         "give --out-dir; nothing ran"):
        cli.benchmark(["--suite", "images", "--quick", "--results-dir", str(tmp_path / "results"),
                       "--results-md", str(tmp_path / "RESULTS.md")])
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("report_only", [False, True])
def test_a_results_md_in_a_folder_that_does_not_exist_is_refused_before_any_work(tmp_path, monkeypatch, report_only):
    """It failed at the very end, after every cell (or the plots) had been written."""
    monkeypatch.setattr(cli, "run_grid", never_run)
    extra = ["--report-only"] if report_only else ["--quick", "--out-dir", str(tmp_path / "runs")]
    results_dir = tmp_path / "results"
    if report_only:  # the folder it reads is there (one that is not is named first: below)
        results_dir.mkdir()
    with pytest.raises(SystemExit, match="the folder of --results-md .* does not exist"):
        cli.benchmark(["--suite", "images", "--results-dir", str(results_dir),
                       "--results-md", str(tmp_path / "nodir" / "RESULTS.md"), *extra])
    assert report_only or not results_dir.exists()


def test_a_results_md_that_is_a_folder_is_refused_before_any_work(tmp_path, monkeypatch):
    """It failed after every cell with "could not write X: Is a directory", advising a writable folder."""
    monkeypatch.setattr(cli, "run_grid", never_run)
    (tmp_path / "md").mkdir()
    with pytest.raises(SystemExit, match=f"--results-md {tmp_path / 'md'} is a folder: give the file to write, e.g. "
                                         f"{tmp_path / 'md' / 'RESULTS.md'}"):
        cli.benchmark(["--suite", "images", "--quick", "--out-dir", str(tmp_path / "runs"), "--results-dir",
                       str(tmp_path / "results"), "--results-md", str(tmp_path / "md")])
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_report_only_names_a_results_dir_that_is_not_a_folder_not_the_results_md_it_implies(tmp_path, kind):
    """--report-only --results-dir X (a file, or no such folder) was refused as "the folder of
    --results-md X/RESULTS.md does not exist", a flag the user had not given."""
    results_dir = tmp_path / "results"
    if kind == "file":
        results_dir.write_text("x")
    with pytest.raises(SystemExit) as refused:
        cli.benchmark(["--report-only", "--results-dir", str(results_dir)])
    assert f"--results-dir {results_dir} is not a folder of results files" in str(refused.value)
    assert "--results-md" not in str(refused.value)


def test_a_new_results_dir_holds_its_results_md_and_is_not_refused_for_it(tmp_path, monkeypatch):
    """--results-dir NEW without --results-md: its RESULTS.md goes in NEW, made with the results
    file; it was refused as "the folder of --results-md NEW/RESULTS.md does not exist", a flag
    the user had not given."""
    monkeypatch.setattr(cli, "run_grid", never_run)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    with pytest.raises(AssertionError, match="a cell ran"):  # past every check
        cli.benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path / "new"), "--out-dir",
                       str(tmp_path / "runs")])


def test_a_benchmark_refusal_reaches_the_user_as_every_commands_do(tmp_path, capsys):
    """error: ..., exit 2 (docs/architecture.md, "Bad input"): it was "benchmark: ...", exit 1."""
    from lightning_dpgan.cli import main

    assert main(["benchmark", "--suite", "tables", "--models", "dpgn", "--results-dir", str(tmp_path),
                 "--out-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --models: unknown model 'dpgn'") and "dpgan" in err


@pytest.mark.parametrize("suite", ["tables", "peers"])
def test_a_suite_with_no_dataset_at_hand_writes_nothing(tmp_path, monkeypatch, suite):
    """Every dataset skipped: before, an empty file marked complete replaced the suite's newest
    full run and emptied its tables in RESULTS.md, and the command exited 0 (the peers suite did
    so still, after building its virtualenv)."""
    from lightning_dpgan.benchmark import peers

    monkeypatch.setattr(cli, "run_grid", never_run)
    monkeypatch.setattr(peers, "run_peers", never_run)
    monkeypatch.setattr(cli, "unavailable_datasets",
                        lambda datasets, data_dir: {name: "FileNotFoundError: not here" for name in datasets})
    markdown = tmp_path / "RESULTS.md"
    markdown.write_text("kept\n")
    with pytest.raises(SystemExit, match="nothing ran and nothing was written"):
        cli.benchmark(["--suite", suite, "--results-dir", str(tmp_path), "--results-md", str(markdown),
                       "--out-dir", str(tmp_path / "runs")])
    assert not list(tmp_path.glob(f"{suite}-*.json")) and markdown.read_text() == "kept\n"


def test_the_suite_records_its_commit_leaving_out_its_own_markdown_results_and_runs(tmp_path, monkeypatch):
    """RESULTS.md, the results folder and the runs folder are the harness's own outputs: were
    they counted, every suite after the first would say "with uncommitted changes"."""
    asked = []
    monkeypatch.setattr(cli, "commit", lambda **own: asked.append(own) or {"sha": "abc", "dirty": False})
    monkeypatch.setattr(cli, "unavailable_datasets",
                        lambda datasets, data_dir: {name: "FileNotFoundError: not here" for name in datasets})
    markdown, results_dir, runs = tmp_path / "RESULTS.md", tmp_path / "results", tmp_path / "runs"
    with pytest.raises(SystemExit, match="nothing ran"):
        cli.benchmark(["--suite", "tables", "--results-dir", str(results_dir), "--results-md", str(markdown),
                       "--out-dir", str(runs)])
    assert asked == [{"own_output": markdown, "own_folders": (results_dir, runs)}]


@pytest.mark.parametrize("flag,value,said", [("--models", "nosuch", "--models nosuch: the peers suite runs"),
                                             ("--datasets", "nosuch", "--datasets:")])
def test_the_peers_suite_refuses_an_unknown_model_or_dataset_before_any_work(tmp_path, monkeypatch, flag, value, said):
    """They went through to the virtualenv: a failed cell, or a results file marked complete with no run."""
    from lightning_dpgan.benchmark import peers

    monkeypatch.setattr(peers, "run_peers", never_run)
    with pytest.raises(SystemExit, match=said):
        cli.benchmark(["--suite", "peers", "--quick", flag, value, "--results-dir", str(tmp_path),
                       "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    assert not list(tmp_path.glob("peers-*.json"))


@pytest.mark.parametrize("extra, named", [
    (["--quick"], "--quick would be ignored; drop it"),
    (["--models", "dpgan", "--out-dir", "runs", "--jobs", "2"], "--models, --jobs, --out-dir would be ignored; drop them"),
    (["--", "--max-steps", "5"], "options after -- would be ignored"),
], ids=["quick", "grid", "train-options"])
def test_report_only_refuses_the_options_it_would_ignore(tmp_path, capsys, extra, named):
    """--report-only --quick (or --models, --out-dir, ...) regenerated the whole RESULTS.md, in silence."""
    with pytest.raises(SystemExit):
        parse_args(["--suite", "tables", "--report-only", "--results-dir", str(tmp_path), *extra])
    assert named in capsys.readouterr().err
    assert parse_args(["--suite", "tables", "--report-only", "--results-dir", str(tmp_path)]).report_only


def test_report_only_with_a_missing_results_dir_leaves_results_md_alone(tmp_path):
    markdown = tmp_path / "RESULTS.md"
    markdown.write_text("kept\n")
    with pytest.raises(SystemExit, match="is not a folder of results files"):
        cli.benchmark(["--suite", "tables", "--report-only", "--results-dir", str(tmp_path / "typo"),
                       "--results-md", str(markdown)])
    assert markdown.read_text() == "kept\n"


def test_a_command_killed_by_a_signal_fails_with_the_signal_as_its_last_line(tmp_path):
    """An out-of-memory kill leaves nothing in the log: the reason the speed suite records (the
    failure's last line) must name the signal, not the log's last chatter."""
    from lightning_dpgan.benchmark.runner import run_logged

    command = [sys.executable, "-c", "import os, signal; print('a tip from a library'); os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(RuntimeError) as failure:
        run_logged(command, tmp_path / "killed.log")
    assert str(failure.value).splitlines()[-1] == "killed by SIGKILL, most likely the out-of-memory killer"
    with pytest.raises(RuntimeError) as failure:
        run_logged([sys.executable, "-c", "raise SystemExit('no such file')"], tmp_path / "exit.log")
    assert str(failure.value).splitlines()[-1] == "no such file"


def test_the_speed_suite_times_gpate_at_2000_and_4000_teachers_of_a_size_the_device_holds(tmp_path):
    """The presets' teachers need ~31 GiB of host memory at K = 2000: on a CPU the full suite
    times teachers small enough to fit (conv 8 + FC 32), on a GPU the script's preset size."""
    from lightning_dpgan.benchmark.speed import CPU_SIZED_TEACHERS, _arguments

    (tmp_path / "mnist").mkdir()
    on_cpu = _arguments(False, str(tmp_path), "cpu")["gpate_speed"]
    on_gpu = _arguments(False, str(tmp_path), "cuda")["gpate_speed"]
    assert on_cpu[on_cpu.index("--ks") + 1:on_cpu.index("--ks") + 3] == ["2000", "4000"]
    assert " ".join(CPU_SIZED_TEACHERS) in " ".join(on_cpu)
    assert "--ks" not in on_gpu and "--teacher-hidden" not in on_gpu  # the script's defaults: 2000, 4000, FC 64
    assert _arguments(False, str(tmp_path / "elsewhere"), "cpu")["gpate_speed"] is None  # no MNIST files
    # every script runs on the device asked for (a GPU machine's figures measured on its CPU otherwise)
    for arguments in _arguments(False, str(tmp_path), "cuda").values():
        assert arguments[arguments.index("--device") + 1] == "cuda"


def test_the_speed_scripts_find_mnist_through_the_environment_and_tabulate_every_value(tmp_path, monkeypatch):
    from lightning_dpgan.benchmark.speed import _arguments, _markdown

    (tmp_path / "mnist").mkdir()
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(tmp_path))
    assert _arguments(True, None, "cpu")["gpate_speed"][:2] == ["--data-dir", str(tmp_path)]  # not "skipped"
    table = _markdown("dpsgd_overhead", [{"batch": 64, "plain_s": 0.5, "opacus_s": 1.25}])
    assert table[2:] == ["| batch | plain_s | opacus_s |", "|---|---|---|", "| 64 | 0.50 | 1.25 |", ""]


def test_a_mechanism_scripts_table_is_followed_by_the_command_with_its_settings():
    """The teachers' size of the G-PATE speed rows is only in the command: the report prints it."""
    command = "python benchmarks/gpate_speed.py --ks 2000 --teacher-channels 8 --teacher-hidden 32"
    extra = {"command": command, "markdown": ["`gpate_speed`:", "", "| k |", "|---|", "| 2000 |", ""]}
    lines = report._extra_lines(extra)
    assert lines[:6] == extra["markdown"] and lines[6] == f"Command: `{command}`"
    failed = {"failed": "out of memory", "markdown": ["`gpate_speed`: failed (`out of memory`).", ""]}
    assert report._extra_lines(failed) == failed["markdown"]
    # what the columns measure, from the file's own settings (the keys alone said no unit, median or batch)
    timed = {"batch": 64, "device": "cpu", "steps": 30, "rows": [{"ms_per_step": 35.4, "ratio": 1.0}], **extra}
    caption = report._extra_lines(timed, "dpsgd_overhead")[6]
    assert caption.startswith("Milliseconds per discriminator step (`ms_per_step`), the median of 30 steps at batch 64 on cpu")
    older = {key: value for key, value in timed.items() if key != "batch"}  # a field the caption names is missing
    assert report._extra_lines(older, "dpsgd_overhead")[6] == f"Command: `{command}`"


def test_the_gpate_loop_reference_is_timed_at_each_k_not_scaled_from_a_small_one(tmp_path, monkeypatch):
    """Part of a G-PATE iteration does not grow with K (the generator update, the aggregation)
    and a teacher's share grows with K: the loop reference scaled in proportion from 10 teachers
    is an estimate no line makes good. It is timed at each K, as the batched form."""
    from test_dev_split import load_benchmark_script

    script = load_benchmark_script("gpate_speed")
    timed = []

    def seconds(cls, k, args):
        timed.append((cls.__name__, k))
        return {"LoopGPATE": 0.040 + 0.005 * k, "GPATE": 0.5 + 0.0001 * k}[cls.__name__]

    monkeypatch.setattr(script, "seconds_per_iteration", seconds)
    out = tmp_path / "gpate.json"
    import torch

    threads = str(torch.get_num_threads())  # the script sets torch's threads for the whole process
    script.main(["--data-dir", str(tmp_path), "--ks", "2000", "4000", "--steps", "4", "--threads", threads,
                 "--json", str(out)])
    assert sorted(timed) == [("GPATE", 2000), ("GPATE", 4000), ("LoopGPATE", 2000), ("LoopGPATE", 4000)]
    written = json.loads(out.read_text())
    assert [row["k"] for row in written["rows"]] == [2000, 4000] and written["steps"] == 4
    for row, loop, batched in zip(written["rows"], (10.04, 20.04), (0.7, 0.9)):
        assert row["loop_ms"] == pytest.approx(loop * 1000) and row["batched_ms"] == pytest.approx(batched * 1000)
        assert row["speedup"] == pytest.approx(loop / batched)
    # the report says what the columns are, and of an older file scaled in proportion that its loop is an estimate
    extra = {**written, "markdown": ["`gpate_speed`:", ""]}
    assert "as a Python loop of K teacher modules (`loop_ms`)" in report._extra_lines(extra, "gpate_speed")[2]
    older = {"device": "cpu", "loop_k": 10, "loop_ms": 46.8, "markdown": ["`gpate_speed`:", ""],
             "rows": [{"k": 2000, "batched_ms": 1585.7, "loop_scaled_ms": 9356.0, "speedup": 5.9}]}
    assert "scaled in proportion to K, an estimate" in report._extra_lines(older, "gpate_speed")[2]


def test_the_dpsgd_overhead_timer_waits_for_the_gpu_on_any_cuda_device(monkeypatch):
    """GPU kernels run asynchronously: a step timed without synchronising measures their launch
    only. ``--device cuda:1`` is a GPU as much as ``cuda`` is; the CPU needs no wait."""
    import torch
    from test_dev_split import load_benchmark_script

    script = load_benchmark_script("dpsgd_overhead")
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: waits.append(args))
    for device, expected in (("cuda", 2), ("cuda:1", 2), ("cpu", 0)):
        waits.clear()
        script.timed(lambda: None, device)
        assert len(waits) == expected, device


def test_resume_continues_a_cell_cut_off_after_its_checkpoint_with_its_accountant(tmp_path):
    """A cell whose training was cut off (a machine restart) after its checkpoint, and before
    it wrote anything else, continues from that checkpoint under --resume: the accountant's state
    comes back with it, so the ε reported is the uninterrupted run's, not that of the steps after
    the restart; its record says it was resumed and has no wall time (it would be a part's)."""
    from lightning_dpgan.run_folder import OUTPUTS

    size = suite_size("tables", quick=True).with_overrides(
        models=["dpctgan"], seeds=[0], max_steps=2, train_args=["--batch-size", "8"])
    (cell,) = size.cells()
    settings = Settings(out_dir=tmp_path, data_dir=str(ADULT), evaluate=False)
    whole = runner.run_cell(cell, size, settings)
    assert whole["epsilon"] > 0 and whole["train_seconds"] > 0 and "resumed" not in whole
    folder = tmp_path / cell.name
    for name in OUTPUTS:  # cut off after the checkpoint: nothing else written yet
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    assert runner.resume_state(folder, evaluate=False) == runner.CHECKPOINTED

    resumed = runner.run_cell(cell, size, replace(settings, resume=True))
    assert resumed["epsilon"] == pytest.approx(whole["epsilon"]) and resumed["steps"] == whole["steps"] == 2
    assert resumed["resumed"] == runner.RESUMED[runner.CHECKPOINTED]
    assert resumed["train_seconds"] is None and resumed["fit_seconds"] is None
    assert "--overwrite" in resumed["commands"][0]  # the command of the run, then how it was continued
    assert str(tmp_path) not in resumed["commands"][1]  # no path of this machine
    assert "--resume OUT_DIR/" in resumed["commands"][1] and "--overwrite" not in resumed["commands"][1]


def test_resume_runs_only_what_each_cell_still_needs(tmp_path, monkeypatch):
    """Cells left evaluated, trained, checkpointed and untouched by an interrupted suite: read
    back; evaluated only; continued then evaluated; trained afresh then evaluated. Without
    --resume every cell is trained afresh (the harness replaces its folders)."""
    size = suite_size("images", quick=True).with_overrides(models=["dpgan"], seeds=[0, 1, 2, 3])
    cells = size.cells()
    for cell, files in zip(cells, (["privacy.json", "evaluation.json"], ["privacy.json"], ["checkpoints/last.ckpt"], [])):
        for name in files:
            (tmp_path / cell.name / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / cell.name / name).write_text("{}")
        started = Settings(out_dir=tmp_path, accelerator="gpu")  # the device it ran on is no setting of the run
        runner.settings_file(cell, started).write_text(json.dumps(runner.settings_record(cell, size, started)))
    ran: list[tuple[str, str]] = []

    def fake_run(command, log, env=None):
        kind = "continue" if "--resume" in command else command[3]
        ran.append((Path(command[command.index("--output-dir" if "--output-dir" in command else "--run") + 1]).name, kind))
        return 1.0

    monkeypatch.setattr(runner, "run_logged", fake_run)
    records = [runner.run_cell(cell, size, Settings(out_dir=tmp_path, resume=True)) for cell in cells]
    names = [cell.name for cell in cells]
    assert ran == [(names[1], "evaluate"), (names[2], "continue"), (names[2], "evaluate"),
                   (names[3], "train"), (names[3], "evaluate")]
    assert [r.get("resumed") for r in records] == [runner.RESUMED[runner.EVALUATED], runner.RESUMED[runner.TRAINED],
                                                  runner.RESUMED[runner.CHECKPOINTED], None]
    assert [r["train_seconds"] for r in records] == [None, None, None, 1.0]
    ran.clear()
    for cell in cells:
        runner.run_cell(cell, size, Settings(out_dir=tmp_path))
    assert [kind for _, kind in ran] == ["train", "evaluate"] * 4


def test_resume_refuses_folders_left_with_other_settings_before_any_cell_runs(tmp_path, monkeypatch):
    """A quick invocation's 20-step runs, taken up by a --resume of the full protocol, would be
    read back and recorded as full-subset figures (and count toward the goals): refused, naming
    the cell and both commands, before anything runs. So is a folder with no record of its
    settings, and a resume that changes the evaluation; the matching resume is not refused."""
    quick = suite_size("tables", quick=True).with_overrides(models=["pategan"], seeds=[0])
    (cell,) = quick.cells()
    settings = Settings(out_dir=tmp_path)
    (tmp_path / cell.name).mkdir()
    (tmp_path / cell.name / "privacy.json").write_text("{}")
    (tmp_path / cell.name / "evaluation.json").write_text("{}")
    assert "no record of the settings" in runner.resume_mismatch(cell, quick, settings)
    runner.settings_file(cell, settings).write_text(json.dumps(runner.settings_record(cell, quick, settings)))
    assert runner.resume_mismatch(cell, quick, settings) is None
    full = quick.with_overrides(max_steps=0)  # the full size: the presets' own schedule
    why = runner.resume_mismatch(cell, full, settings)
    assert cell.name in why and "--max-steps 20" in why and "train command" in why
    # a table's evaluation takes no image option; an image cell's does, and a change is refused
    assert runner.evaluate_command(cell, quick.with_overrides(cnn_epochs=3), settings) == runner.evaluate_command(cell, quick, settings)
    older = runner.settings_record(cell, quick, settings)  # as recorded before: the table's evaluate with --cnn-epochs
    older["evaluate"] = [*older["evaluate"], "--cnn-epochs", "10"]
    runner.settings_file(cell, settings).write_text(json.dumps(older))
    assert runner.resume_mismatch(cell, quick, settings) is None
    images = suite_size("images", quick=True)
    (image_cell,) = images.cells()
    (tmp_path / image_cell.name).mkdir()
    (tmp_path / image_cell.name / "privacy.json").write_text("{}")
    (tmp_path / image_cell.name / "evaluation.json").write_text("{}")
    runner.settings_file(image_cell, settings).write_text(json.dumps(runner.settings_record(image_cell, images, settings)))
    assert "evaluate command" in runner.resume_mismatch(image_cell, images.with_overrides(cnn_epochs=3), settings)
    with pytest.raises(RuntimeError, match="cannot take up"):
        runner.run_cell(cell, full, replace(settings, resume=True))

    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    monkeypatch.setattr(runner, "run_logged", lambda *args, **kwargs: pytest.fail("a cell ran"))
    with pytest.raises(SystemExit, match="other settings, so nothing ran") as refused:
        benchmark(["--suite", "tables", "--models", "pategan", "--datasets", "adult", "--epsilons", "1", "--seeds", "0",
                   "1", "2", "--resume", "--out-dir", str(tmp_path), "--results-dir", str(tmp_path / "results"),
                   "--results-md", str(tmp_path / "RESULTS.md")])
    assert cell.name in str(refused.value) and not (tmp_path / "results").exists()


def test_the_report_says_which_runs_were_taken_up_after_an_interruption():
    runs = [run("a", 0, 0.5), {**run("a", 1, 0.6), "resumed": runner.RESUMED[runner.CHECKPOINTED]},
            {**run("a", 2, 0.7), "resumed": runner.RESUMED[runner.EVALUATED]}]
    header = "\n".join(report._header({**result_file("tables", "full-subset", runs), "file": "tables-x.json"}))
    assert "2 of its runs were taken up after an interruption" in header
    assert f"{runner.RESUMED[runner.CHECKPOINTED]}: 1" in header and f"{runner.RESUMED[runner.EVALUATED]}: 1" in header
    assert "taken up" not in "\n".join(report._header({**result_file("tables", "full", runs[:1]), "file": "t.json"}))


def test_a_merged_part_counts_the_resumed_runs_of_the_cells_it_gives_only():
    """A part of a merged result speaks for its own cells: a resumed run of a cell that a newer
    file measured again is not in the table, and must not be said to be."""
    resumed = runner.RESUMED[runner.CHECKPOINTED]
    runs = [{**run("a", 0, 0.5), "resumed": resumed}, {**run("b", 0, 0.6), "resumed": resumed},
            {**run("b", 1, 0.6), "resumed": resumed}]
    part = {**result_file("tables", "full-subset", runs), "cells": [("a", "adult", 1.0)], "failed_cells": []}
    header = "\n".join(report._header(part))
    assert f"1 of its runs were taken up after an interruption (`--resume`): {resumed}: 1." in header


def test_resume_needs_the_interrupted_suites_folder_and_runs_that_are_not_timed_whole(tmp_path):
    for extra in ([], ["--suite", "speed", "--out-dir", str(tmp_path)]):
        argv = ["--suite", "tables", "--resume", "--results-dir", str(tmp_path), *extra]
        with pytest.raises(SystemExit, match="--resume continues the runs of an earlier invocation"):
            benchmark(argv)


def test_a_peers_table_is_scored_here_on_the_test_split_with_our_evaluation(tmp_path, monkeypatch):
    """run_peers with the smartnoise process faked (it would need the peers' venv): the peer gets
    the train split alone, and what it returns is scored by evaluate_table against the test split."""
    from lightning_dpgan.benchmark import peers
    from lightning_dpgan.evaluation import utility

    def fake_peer(command, log):
        option = lambda name: Path(command[command.index(name) + 1])
        train = pd.read_csv(option("--train"))
        log.parent.mkdir(parents=True, exist_ok=True)  # as the real run_logged does
        train.sample(frac=1.0, random_state=0).to_csv(option("--out"), index=False)  # a "synthesizer" that copies
        option("--report").write_text(json.dumps({"delta": 1e-5, "fit_seconds": 0.5,
                                                  "options": {"epsilon_spent_opacus_rdp": 0.97}}))
        given.append(train)
        return 1.5

    given = []
    monkeypatch.setattr(peers, "ensure_venv", lambda venv, log: Path("python"))
    monkeypatch.setattr(peers, "run_logged", fake_peer)
    scored_on = record_calls(monkeypatch, utility, "settings_abc")
    from lightning_dpgan import evaluate as evaluate_module

    scored_with_seeds, evaluate_table = [], evaluate_module.evaluate_table

    def evaluate_recording_the_seed(*args, seed=0, **kwargs):
        scored_with_seeds.append(seed)
        return evaluate_table(*args, seed=seed, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate_table", evaluate_recording_the_seed)
    size = replace(suite_size("peers", quick=True), models=("mst",), datasets=("adult",), seeds=(3,), epsilons=(1.0,))
    runs, skipped = peers.run_peers(size, Settings(out_dir=tmp_path, data_dir=str(ADULT)), venv=tmp_path / "venv")
    datamodule = load_datamodule("adult", str(ADULT))
    (run,) = runs
    assert skipped == {} and run["status"] == "ok" and run["model"] == "mst", run.get("error")
    assert len(given[0]) == len(datamodule.train_frame)
    (_, _, real_test, _), = scored_on
    assert real_test.equals(datamodule.test_frame)
    assert run["measures"]["held_out_split"] == "test" and 0 <= run["measures"]["utility/B_auroc"] <= 1
    assert run["train_seconds"] == 1.5 and run["delta"] == 1e-5
    # what the peer says it spent (Opacus' accounting), not the target; scored with the cell's seed
    assert run["epsilon"] == 0.97 and run["target_epsilon"] == 1.0 and scored_with_seeds == [3]


def test_a_relative_peers_venv_is_taken_absolute_so_recording_it_touches_no_other_word(tmp_path, monkeypatch):
    """--peers-venv peers: replacing its text by PEERS_VENV in a recorded command or error turned
    "--suite peers" and "benchmarks/peers/" into "--suite PEERS_VENV" and "benchmarks/PEERS_VENV/"."""
    from lightning_dpgan.benchmark.cli import parse_args
    from lightning_dpgan.benchmark.runner import portable_text

    monkeypatch.chdir(tmp_path)
    args = parse_args(["--suite", "peers", "--peers-venv", "peers"])
    assert args.peers_venv == tmp_path / "peers"
    text = f"python benchmarks/peers/smartnoise_synth.py --suite peers failed in {tmp_path / 'peers'}/lib"
    assert portable_text(text, peers_venv=str(args.peers_venv)) == (
        "python benchmarks/peers/smartnoise_synth.py --suite peers failed in PEERS_VENV/lib")


def test_a_peer_that_crashes_or_writes_a_damaged_report_is_recorded_failed_without_the_venvs_path(tmp_path, monkeypatch):
    """A peer's traceback names files in its virtualenv: the record said this machine's path
    where its command says PEERS_VENV. A peer.json cut short stopped the whole suite."""
    from lightning_dpgan.benchmark import peers

    venv = tmp_path / "peers-venv"

    def failing_peer(command, log):
        log.parent.mkdir(parents=True, exist_ok=True)
        if "mst" in command:
            raise RuntimeError(f"peer failed (exit 1); end of log:\n  File \"{venv}/lib/snsynth/mst.py\", line 9\n"
                               "ValueError: no marginals")
        option = lambda name: Path(command[command.index(name) + 1])
        option("--report").write_text('{"delta": 1e-5, "fit_')
        return 1.0

    monkeypatch.setattr(peers, "ensure_venv", lambda venv, log: venv / "bin" / "python")
    monkeypatch.setattr(peers, "run_logged", failing_peer)
    size = replace(suite_size("peers", quick=True), models=("mst", "mwem"), datasets=("adult",), seeds=(0,), epsilons=(1.0,))
    runs, _ = peers.run_peers(size, Settings(out_dir=tmp_path / "out", data_dir=str(ADULT)), venv=venv)
    assert [(run["model"], run["status"]) for run in runs] == [("mst", "failed"), ("mwem", "failed")]
    assert "PEERS_VENV/lib/snsynth/mst.py" in runs[0]["error"] and str(tmp_path) not in runs[0]["error"]
    assert "Expecting" in runs[1]["error"] or "Unterminated" in runs[1]["error"]


def test_the_machine_record_reads_the_cpu_model_and_memory_from_proc(tmp_path, monkeypatch):
    cpuinfo, meminfo = tmp_path / "cpuinfo", tmp_path / "meminfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\n")
    meminfo.write_text("MemTotal:       24641536 kB\nMemFree:         1000 kB\n")
    files, read = {"/proc/cpuinfo": cpuinfo, "/proc/meminfo": meminfo}, results._proc_field
    assert read(tmp_path / "absent", "MemTotal") is None
    monkeypatch.setattr(results, "_proc_field", lambda path, field: read(files[path], field))
    for name in runner.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    record = results.machine()
    assert record["cpu_model"] == "AMD EPYC 7B13" and record["memory_gib"] == 23.5
    assert "thread_settings" not in record
    # the threads the cells ran with, which --jobs 1 did not record: 188 ms a step under OMP_NUM_THREADS=1, 3.9 without
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    record = results.machine()
    assert record["thread_settings"] == {"OMP_NUM_THREADS": "1"}
    header = "\n".join(report._header({"file": "speed-x.json", "size": "full", "machine": record, "commit": {},
                                        "runs": []}))
    assert "CPU cores (AMD EPYC 7B13) with OMP_NUM_THREADS=1, torch" in header


def test_a_data_folder_named_by_the_environment_is_passed_on_as_data_dir(tmp_path, monkeypatch):
    """Each recorded train command then says --data-dir DATA_DIR, as with --data-dir."""
    seen = {}

    def runs(size, settings, skipped, on_run):
        seen["settings"] = settings
        return [run("gan", 0, 0.5)]

    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(cli, "run_grid", runs)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: seen.setdefault("data_dir", data_dir) and {})
    cli.benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path), "--results-md",
                   str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    assert seen["data_dir"] == seen["settings"].data_dir == str(tmp_path / "data")
    command = train_command(Cell("gan", "adult", 1.0, 0), chosen_size(parse_args(["--suite", "tables", "--quick"])),
                            seen["settings"])
    assert "--data-dir DATA_DIR" in portable(command, seen["settings"].data_dir)
    (saved,) = tmp_path.glob("tables-*.json")
    assert json.loads(saved.read_text())["command"].endswith("--out-dir OUT_DIR --data-dir DATA_DIR")
    assert cli.with_data_dir(["--suite", "x", "--", "--lr", "1"], "/d") == ["--suite", "x", "--data-dir", "/d", "--", "--lr", "1"]
    assert cli.with_data_dir(["--data-dir=/e"], "/d") == ["--data-dir=/e"]


def test_the_speed_scripts_are_found_from_any_folder_and_recorded_relative_to_the_checkout(tmp_path, monkeypatch):
    """Run from another folder, the speed suite used to look for ``benchmarks/*.py`` there and
    recorded each script as failed; now it runs the checkout's scripts and names them as
    ``benchmarks/<script>.py`` in the results, without this machine's path."""
    from lightning_dpgan.benchmark import speed

    ran = []

    def fake_run(command, log, env=None):
        ran.append(command)
        log.parent.mkdir(parents=True, exist_ok=True)
        Path(command[command.index("--json") + 1]).write_text(json.dumps({"rows": [{"k": 1}]}))
        return 0.1

    monkeypatch.setattr(speed, "run_logged", fake_run)
    monkeypatch.chdir(tmp_path)
    extras = speed.micro_benchmarks(True, None, None, tmp_path / "out")
    assert [Path(command[1]).name for command in ran] == ["dpsgd_overhead.py", "teacher_ensemble.py"]
    assert all(Path(command[1]).is_file() for command in ran)
    assert extras["dpsgd_overhead"]["command"].startswith("python benchmarks/dpsgd_overhead.py ")
    assert str(REPO) not in json.dumps({name: extra.get("command") for name, extra in extras.items()})


def test_the_results_defaults_are_the_checkouts_whatever_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = cli.parse_args(["--suite", "tables"])
    assert args.results_dir == REPO / "benchmarks" / "results" and args.results_md == REPO / "benchmarks" / "RESULTS.md"
    assert args.reference.samefile(REFERENCE)
    assert peer_command(Path("python"), Cell("mst", "adult", 1.0, 0), tmp_path / "t.csv", tmp_path / "s.json", 10,
                        suite_size("peers", quick=True), tmp_path)[1] == str(REPO / "benchmarks" / "peers" / "smartnoise_synth.py")


def test_an_installation_without_the_benchmarks_folder_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from lightning_dpgan.benchmark import paths

    monkeypatch.setattr(paths, "BENCHMARKS", tmp_path / "absent")
    monkeypatch.setattr(cli, "run_grid", never_run)
    with pytest.raises(SystemExit, match="needs the repository's benchmarks/ folder"):
        cli.benchmark(["--suite", "tables", "--quick", "--results-dir", str(tmp_path / "results"),
                       "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


AT_MOST_GOAL = {"dataset": "king", "measure": "utility/difference_r2", "epsilon": 1.0, "at_most": 0.15}


def king_gap_row(model, mean):
    return {"model": model, "dataset": "king", "target_epsilon": 1.0,
            "measures": {"utility/difference_r2": {"mean": mean, "std": 0.01, "n": 3}}}


def at_most_goal_lines(*rows):
    result = {"suite": "tables", "size": "full", "summary": list(rows)}
    return report.goal_lines([result], {"goals": [AT_MOST_GOAL]})


def test_an_at_most_goal_takes_the_smallest_gap_and_is_met_below_its_bound():
    """King's R² gap goal is met at or below its bound, by the lowest model mean."""
    line = at_most_goal_lines(king_gap_row("worse", 0.40), king_gap_row("better", 0.10))[2]
    assert "≤ 0.15" in line
    assert "| 0.100 ± 0.010 (3) | better | 3 | yes |" in line


def test_a_goal_names_its_reading_and_king_is_read_as_the_three_regressor_average():
    """A goal may say how it reads an issue's figure; King's gap is the average over linear, ridge
    and random forest (the ridge-alone gap is a column, not a second goal)."""
    reference = report.load_reference(REFERENCE)
    (king,) = [goal for goal in reference["goals"] if goal["dataset"] == "king"]
    assert king["measure"] == "utility/difference_r2" and king["reading"] == "average of LR, ridge and random forest"
    row = {"model": "quail", "dataset": "king", "target_epsilon": 1.0,
           "measures": {"utility/difference_r2": {"mean": 0.18, "std": 0.01, "n": 3},
                        "utility/difference_r2/ridge": {"mean": 0.06, "std": 0.01, "n": 3}}}
    (line,) = report.goal_lines([{"suite": "tables", "size": "full", "summary": [row]}], {"goals": [king]})[2:]
    assert "≤ 0.15 (average of LR, ridge and random forest) | 0.180 ± 0.010 (3) | quail | 3 | no |" in line
    assert "utility/difference_r2/ridge" in report.COLUMNS["tables"]


def test_an_at_most_goal_above_its_bound_is_not_met():
    line = at_most_goal_lines(king_gap_row("only", 0.30))[2]
    assert "| 0.300 ± 0.010 (3) | only | 3 | no |" in line


@pytest.mark.parametrize("accounting,kept", [("data-dependent", 6400.01), ("data-independent", None)])
def test_a_cell_keeps_the_data_independent_bound_beside_a_data_dependent_epsilon(tmp_path, accounting, kept):
    """A PATE cell read back from its run folder: under data-dependent accounting the bound that
    holds whatever the votes is recorded beside the epsilon; under data-independent accounting
    the epsilon is that bound, and nothing is added."""
    size = suite_size("tables", quick=True).with_overrides(models=["pategan"], seeds=[0])
    (cell,) = size.cells()
    settings = Settings(out_dir=tmp_path, resume=True, evaluate=False)
    folder = tmp_path / cell.name
    folder.mkdir()
    (folder / "privacy.json").write_text(json.dumps({"epsilon": 0.48, "accounting": accounting,
                                                     "epsilon_data_independent": 6400.01}))
    (folder / "metrics.json").write_text(json.dumps({"steps": 10}))
    runner.settings_file(cell, settings).write_text(json.dumps(runner.settings_record(cell, size, settings)))
    record = runner.run_cell(cell, size, settings)
    assert record["epsilon"] == 0.48 and record["epsilon_data_independent"] == kept


@pytest.mark.parametrize("data_dir", [None, "given"])
def test_a_suite_with_no_dataset_at_hand_says_where_to_put_the_files(tmp_path, monkeypatch, data_dir):
    """With a data folder already given (or LIGHTNING_DPGAN_DATA_DIR set) the advice was still to
    give one: it names the folder instead. Nothing is run or written either way."""
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR", raising=False)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, where: dict.fromkeys(datasets, "not found"))
    (tmp_path / "data").mkdir()
    folder = ["--data-dir", str(tmp_path / "data")] if data_dir else []
    with pytest.raises(SystemExit) as refused:
        benchmark(["--suite", "tables", "--quick", "--datasets", "kaggle-credit", *folder, "--out-dir",
                   str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")])
    message = str(refused.value)
    assert "nothing ran and nothing was written (kaggle-credit: not found)" in message
    if data_dir:
        assert message.endswith(f"Put the files in the data folder, {tmp_path / 'data'}")
    else:
        assert message.endswith("Give --data-dir, or set LIGHTNING_DPGAN_DATA_DIR")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize(("suite", "dataset", "instead"), [("tables", "mnist", "images"), ("images", "adult", "tables"),
                                                          ("peers", "fashion-mnist", "images")])
def test_a_dataset_of_the_other_kind_is_refused_by_the_suite_that_does_not_measure_it(tmp_path, suite, dataset, instead):
    """--suite tables --datasets mnist was taken as a custom grid and ran a full-size CNN
    evaluation under the quick size's promise of minutes."""
    with pytest.raises(SystemExit, match=f"--datasets {dataset}: the {suite} suite measures .* run it in the {instead} suite"):
        benchmark(["--suite", suite, "--quick", "--datasets", dataset, "--out-dir", str(tmp_path / "runs"),
                   "--results-dir", str(tmp_path / "results")])
    assert not (tmp_path / "runs").exists()


def test_a_plot_marker_is_drawn_only_on_the_measure_its_paper_figure_measures():
    """A dataset with papers' figures of two measures: each plot (one measure) gets only its own."""
    reference = {"paper": {"auroc": 0.87, "r2": 0.25},
                 "markers": [{"dataset": "adult", "measure": "utility/B_auroc", "epsilon": 1, "at": ["paper", "auroc"],
                              "label": "AUROC (paper)"},
                             {"dataset": "adult", "measure": "utility/difference_r2", "epsilon": 1, "at": ["paper", "r2"],
                              "label": "R2 gap (paper)"}]}
    auroc = report.markers_for(reference, "adult", "utility/B_auroc")
    assert [(m["label"], m["value"]) for m in auroc] == [("AUROC (paper)", 0.87)]
    assert [m["value"] for m in report.markers_for(reference, "adult", "utility/difference_r2")] == [0.25]
    assert report.markers_for(reference, "adult", "utility/cnn_accuracy") == []


def test_quick_peers_are_compared_with_our_quick_tables_run_not_a_newer_run_of_another_size(tmp_path, monkeypatch):
    """Off the protocol, the peers are compared with our tables run of their own size: a newer
    custom run (other steps, other presets) is not the same protocol."""
    def write(suite, size, day, runs):
        written = {key: value for key, value in result_file(suite, size, runs).items() if key != "file"}
        results.results_path(tmp_path, suite, day).write_text(json.dumps(written))

    monkeypatch.setattr(report, "plot_suite", lambda *args: [])  # the plots are not what is tested
    monkeypatch.setattr(report, "delta_for", lambda dataset: 1e-5)  # spares importing the datamodules
    write("tables", "quick", date(2026, 1, 1), [run("pategan", 0, 0.6)])
    write("tables", "custom", date(2026, 1, 2), [run("pategan", 0, 0.9)])
    write("peers", "quick", date(2026, 1, 3), [run("pategan", 0, 0.5)])
    section = report.generated_section(tmp_path, {}, ["peers"], tmp_path)
    (line,) = [line for line in section.splitlines() if line.startswith("| pategan | adult | 1 | 0.500")]
    assert "| pategan | 0.600 (1) | 1.20 |" in line  # our quick run's 0.6 over the peer's 0.5
    assert "`tables-2026-01-01.json`" in section and "tables-2026-01-02" not in section


def test_an_image_cells_evaluate_command_draws_the_sizes_number_of_synthetic_images(tmp_path):
    """The quick images size evaluates on 2000 synthetic images: evaluate must be told so, else it
    draws as many as there are training images (60,000, the full protocol's)."""
    from lightning_dpgan.benchmark.runner import evaluate_command
    from lightning_dpgan.run_folder import IMAGE_EVALUATE_OPTIONS

    size = suite_size("images", quick=True)
    command = evaluate_command(Cell("dpgan", "mnist", 10.0, 0), size, Settings(out_dir=tmp_path))
    flag = IMAGE_EVALUATE_OPTIONS["n_synthetic"]
    assert flag in command and command[command.index(flag) + 1] == str(size.n_synthetic) == "2000"
    full = evaluate_command(Cell("dpgan", "mnist", 10.0, 0), suite_size("images", quick=False), Settings(out_dir=tmp_path))
    assert flag not in full  # the full size: as many as the training images, evaluate's default


def test_a_failed_cells_reason_is_the_end_of_its_log_where_the_error_is(tmp_path):
    """run_logged's error is the command, then the last 15 lines of its log: the reason recorded
    (and shown in RESULTS.md) must be the log's end, the command's own error."""
    log = "\n".join(f"log line {i}" for i in range(12))
    error = RuntimeError(f"python -m lightning_dpgan train ... failed (exit 1); end of x.log:\n{log}\n"
                         "ValueError: the budget is spent before the first step")
    record = failed_run(Cell("pategan", "adult", 1.0, 0), error, Settings(out_dir=tmp_path))
    assert record["status"] == "failed"
    assert record["error"].splitlines()[-1] == "ValueError: the budget is spent before the first step"
    assert "failed (exit 1)" not in record["error"]
    assert report._last_line(record["error"]) == "ValueError: the budget is spent before the first step"


def evaluated_cell(out_dir: Path):
    """A three-step PATE-GAN cell whose folder in ``out_dir`` holds a trained and evaluated run
    (``metrics.json``'s wall time 2.5 s, AUROC 0.7); returns its size and cell."""
    from lightning_dpgan.benchmark.suites import Size

    size = Size(("pategan",), ("adult",), (1.0,), (0,), max_steps=3)
    cell = Cell("pategan", "adult", 1.0, 0)
    folder = out_dir / cell.name
    folder.mkdir()
    (folder / "privacy.json").write_text(json.dumps({"epsilon": 0.9, "delta": 1e-5, "steps": 3}))
    (folder / "metrics.json").write_text(json.dumps({"steps": 3, "wall_time_s": 2.5}))
    (folder / "evaluation.json").write_text(json.dumps({"utility/B_auroc": 0.7}))
    return size, cell


def test_a_resumed_cell_records_no_fit_time_though_its_run_folder_has_one(tmp_path, monkeypatch):
    """A cell read back or continued under --resume timed only part of its run: neither wall time
    is recorded, though the folder's metrics.json holds the last process's wall_time_s."""
    size, cell = evaluated_cell(tmp_path)
    runner.settings_file(cell, Settings(out_dir=tmp_path)).write_text(
        json.dumps(runner.settings_record(cell, size, Settings(out_dir=tmp_path))))
    monkeypatch.setattr(runner, "run_logged", lambda *args, **kwargs: 1.0)
    resumed = runner.run_cell(cell, size, Settings(out_dir=tmp_path, resume=True))
    assert resumed["resumed"] == runner.RESUMED[runner.EVALUATED]
    assert resumed["train_seconds"] is None and resumed["fit_seconds"] is None
    assert resumed["measures"]["utility/B_auroc"] == 0.7
    fresh = runner.run_cell(cell, size, Settings(out_dir=tmp_path))  # a fresh run is timed whole
    assert fresh["train_seconds"] == 1.0 and fresh["fit_seconds"] == 2.5


def test_a_resume_keeps_the_wall_times_and_start_commit_of_cells_trained_whole_under_the_same_conditions(
        tmp_path, monkeypatch):
    """A suite interrupted after nine of twelve cells lost the nine finished cells' wall times on
    --resume, and recorded them under the resuming invocation's commit. A cell trained whole now
    keeps its train time (beside its settings) and the commit it started at; read back under the
    same machine, device, --jobs and thread settings it keeps its times, under others it has none."""
    size, cell = evaluated_cell(tmp_path)
    then = {"commit": {"sha": "a" * 40, "dirty": False}, "machine": {"cpu_count": 2, "cpu_model": "x"},
            "accelerator": None, "jobs": 1, "threads": {}}
    monkeypatch.setattr(runner, "run_logged", lambda *args, **kwargs: 7.0)
    fresh = runner.run_cell(cell, size, Settings(out_dir=tmp_path, provenance=then))
    assert fresh["train_seconds"] == 7.0 and "started_at_commit" not in fresh and "resumed" not in fresh
    assert json.loads(runner.settings_file(cell, Settings(out_dir=tmp_path)).read_text())["train_seconds"] == 7.0

    monkeypatch.setattr(runner, "run_logged", lambda *args, **kwargs: pytest.fail("a cell read back ran"))
    now = {**then, "commit": {"sha": "b" * 40, "dirty": False}}
    back = runner.run_cell(cell, size, Settings(out_dir=tmp_path, resume=True, provenance=now))
    assert back["resumed"] == runner.RESUMED[runner.EVALUATED]
    assert (back["train_seconds"], back["fit_seconds"], back["started_at_commit"]) == (7.0, 2.5, then["commit"])
    for other in ({"jobs": 2}, {"threads": {"OMP_NUM_THREADS": "1"}}, {"machine": {"cpu_count": 16}},
                  {"accelerator": "gpu"}):
        elsewhere = runner.run_cell(cell, size, Settings(out_dir=tmp_path, resume=True, provenance={**now, **other}))
        assert elsewhere["train_seconds"] is None and elsewhere["fit_seconds"] is None, other
        assert elsewhere["started_at_commit"] == then["commit"]

    def cut_off(command, log, env=None):  # the machine restarted during training
        raise RuntimeError("killed")

    monkeypatch.setattr(runner, "run_logged", cut_off)
    with pytest.raises(RuntimeError):
        runner.run_cell(cell, size, Settings(out_dir=tmp_path, provenance=then))
    monkeypatch.setattr(runner, "run_logged", lambda *args, **kwargs: pytest.fail("a cell read back ran"))
    untimed = runner.run_cell(cell, size, Settings(out_dir=tmp_path, resume=True, provenance=then))
    assert untimed["train_seconds"] is None and untimed["started_at_commit"] == then["commit"]


def test_the_report_names_the_commit_resumed_runs_started_at_and_which_are_untimed():
    resumed = runner.RESUMED[runner.EVALUATED]
    this, earlier = {"sha": "abc", "dirty": False}, {"sha": "0123456789abcdef", "dirty": True}
    runs = [{**run("a", 0, 0.5), "resumed": resumed, "started_at_commit": earlier},
            {**run("a", 1, 0.5), "resumed": resumed, "started_at_commit": this},
            {**run("a", 2, 0.5), "resumed": resumed, "started_at_commit": this, "train_seconds": None}]
    header = "\n".join(report._header({**result_file("tables", "full-subset", runs), "file": "t.json"}))
    assert "They started at commit `0123456789` with uncommitted changes (1 run), `abc` (2 runs)." in header
    assert "The wall times of 1 of them are not shown" in header
    same = [{**run, "started_at_commit": this, "train_seconds": 3.0} for run in runs]
    header = "\n".join(report._header({**result_file("tables", "full-subset", same), "file": "t.json"}))
    assert "They started at the commit above as well." in header and "each trained whole before" in header
    older = [{key: value for key, value in run.items() if key != "started_at_commit"} for run in runs]
    header = "\n".join(report._header({**result_file("tables", "full-subset", older), "file": "t.json"}))
    assert "not recorded for every run" in header


def test_each_cell_of_an_invocation_runs_under_its_commit_machine_and_thread_settings(tmp_path, monkeypatch):
    """The conditions a resume compares come from the invocation itself: its commit, --jobs, and
    the thread settings its cells' processes get."""
    seen = []
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    monkeypatch.setattr(cli, "run_cell", lambda cell, size, settings: seen.append(settings) or {**cell.record,
                                                                                              "measures": {}})
    monkeypatch.setattr(runner, "usable_cpus", lambda: 2)
    for name in runner.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    benchmark(["--suite", "tables", "--models", "pategan", "--datasets", "adult", "--epsilons", "1", "--seeds", "0", "1",
               "--jobs", "2", "--out-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results"),
               "--results-md", str(tmp_path / "RESULTS.md")])
    provenance = seen[0].provenance
    assert provenance["jobs"] == 2 and provenance["threads"] == dict.fromkeys(runner.THREAD_VARIABLES, "1")
    assert provenance["commit"] == results.commit(own_output=tmp_path / "RESULTS.md",
                                                  own_folders=(tmp_path / "results", tmp_path / "runs"))
    assert provenance["machine"]["cpu_count"] == os.cpu_count()


def test_a_second_harness_in_a_busy_out_dir_is_refused_before_it_reads_or_runs_a_cell(tmp_path, monkeypatch):
    """Two invocations in one --out-dir trained the same cells side by side: the second, told by
    the first's folders to --resume, continued checkpoints a running cell was still writing. While
    a harness (here: another process) holds the folder, a second is refused naming it; once the
    holder is gone, however it ended, the folder is free again."""
    import subprocess
    import textwrap

    out_dir = tmp_path / "runs"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from lightning_dpgan.benchmark.out_dir_lock import out_dir_locked
        with out_dir_locked(Path({str(out_dir)!r})):
            print("held", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
        monkeypatch.setattr(cli, "run_cell", lambda *args: pytest.fail("a cell ran"))
        argv = ["--suite", "tables", "--models", "pategan", "--datasets", "adult", "--epsilons", "1", "--seeds", "0",
                "--out-dir", str(out_dir), "--results-dir", str(tmp_path / "results"),
                "--results-md", str(tmp_path / "RESULTS.md")]
        with pytest.raises(SystemExit, match="another benchmark is running in --out-dir") as refused:
            benchmark(argv)
        assert f"process {holder.pid}" in str(refused.value) and "nothing ran" in str(refused.value)
        assert not (tmp_path / "results").exists()
    finally:
        holder.kill()  # SIGKILL: no chance to release it itself
        holder.wait()
    monkeypatch.setattr(cli, "run_cell", lambda cell, size, settings: {**cell.record, "measures": {}})
    assert benchmark(argv).parent == tmp_path / "results"


def test_a_cell_process_outliving_a_killed_harness_keeps_its_out_dir_locked(tmp_path, monkeypatch):
    """The lock was the harness's alone: killed outright (SIGKILL), it left its train running, and
    a --resume could train the same cell beside it. The processes it starts inherit the lock."""
    import signal
    import subprocess
    import textwrap
    import time

    out_dir, pid_file = tmp_path / "runs", tmp_path / "child.pid"
    harness = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from pathlib import Path
        from lightning_dpgan.benchmark.out_dir_lock import out_dir_locked
        from lightning_dpgan.benchmark.stopping import waited_on
        with out_dir_locked(Path({str(out_dir)!r})):
            child = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
            threading.Thread(target=waited_on, args=([sys.executable, "-c", child],), daemon=True).start()
            while not Path({str(pid_file)!r}).exists():
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        """)])
    assert harness.wait(timeout=60) == -signal.SIGKILL
    child = int(pid_file.read_text())
    try:
        from lightning_dpgan.benchmark import out_dir_lock

        with pytest.raises(out_dir_lock.OutDirBusyError, match="another benchmark is running"):
            with out_dir_lock.out_dir_locked(out_dir):
                pass
    finally:
        os.kill(child, signal.SIGKILL)
    for _ in range(100):  # reaped by init once killed: the lock goes with it
        try:
            with out_dir_lock.out_dir_locked(out_dir):
                break
        except out_dir_lock.OutDirBusyError:
            time.sleep(0.05)
    else:
        pytest.fail("the folder stayed locked after the last process holding it ended")


def test_an_out_dir_whose_file_system_refuses_flock_runs_unlocked_with_a_warning(tmp_path, monkeypatch, capsys):
    """Lustre without -o flock, some NFS mounts: flock fails with ENOSYS or ENOLCK. The lock then
    stopped every benchmark there with "Function not implemented"; it runs unlocked, saying so."""
    import errno

    from lightning_dpgan.benchmark import out_dir_lock

    def refused(handle, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(out_dir_lock.fcntl, "flock", refused)
    ran = []
    with out_dir_lock.out_dir_locked(tmp_path / "runs"):
        ran.append(True)
    assert ran == [True]
    assert "cannot be locked on its file system (Function not implemented)" in capsys.readouterr().err
    with pytest.raises(RuntimeError) as failed:  # the suite's own failure, not "during handling of" flock's
        with out_dir_lock.out_dir_locked(tmp_path / "runs"):
            raise RuntimeError("a cell failed")
    assert failed.value.__context__ is None


def test_quick_peers_are_not_compared_with_a_cell_our_stopped_quick_tables_run_cut_short(tmp_path, monkeypatch):
    """A quick tables run stopped after one of its two seeds of PATE-GAN: that cell, a mean of
    fewer seeds than planned, is not ours to compare the peer with (a finished cell is)."""
    def write(suite, day, runs, **fields):
        written = {key: value for key, value in result_file(suite, "quick", runs).items() if key != "file"}
        results.results_path(tmp_path, suite, day).write_text(json.dumps({**written, **fields}))

    monkeypatch.setattr(report, "plot_suite", lambda *args: [])
    monkeypatch.setattr(report, "delta_for", lambda dataset: 1e-5)
    write("tables", date(2026, 1, 1), [run("dpgan", 0, 0.7), run("dpgan", 1, 0.7), run("pategan", 0, 0.9)],
          seeds=[0, 1], complete=False)
    write("peers", date(2026, 1, 3), [run("pategan", 0, 0.5), run("dpgan", 0, 0.5)])
    section = report.generated_section(tmp_path, {}, ["peers"], tmp_path)
    peer_rows = {line.split(" | ")[0]: line for line in section.splitlines() if line.startswith("| ") and "| adult | 1 | 0.500" in line}
    assert "| dpgan | 0.700 ± 0.000 (2) | 1.40 |" in peer_rows["| dpgan"]
    assert "0.900" not in peer_rows["| pategan"]


def test_two_seeds_of_the_full_grid_are_a_custom_run_not_the_protocols_three():
    """Only cells of three seeds or more stand for the full protocol (and count toward goals)."""
    assert size_label(parse_args(["--suite", "tables", "--seeds", "0", "1"])) == "custom"
    assert size_label(parse_args(["--suite", "peers", "--seeds", "0", "1"])) == "custom"
    assert size_label(parse_args(["--suite", "peers", "--seeds", "0", "1", "2"])) == "full-subset"


def test_a_suite_with_one_dataset_missing_runs_the_rest_and_records_the_seeds_it_was_given(tmp_path, monkeypatch):
    """--datasets adult king with King's files absent: Adult's cells still run (King is listed as
    skipped), and the results file names the seeds this run was given, which decide whether a
    cell of it is a whole measurement, not the suite's default seeds."""
    grids = []

    def fake_grid(size, settings, skipped, on_run):
        grids.append((size, dict(skipped)))
        return [{"status": "ok", "model": "pategan", "dataset": "adult", "target_epsilon": 1.0, "seed": seed,
                 "epsilon": 0.9, "steps": 10, "train_seconds": 5.0, "fit_seconds": 4.0,
                 "measures": {"utility/B_auroc": 0.7}} for seed in size.seeds]

    monkeypatch.setattr(cli, "run_grid", fake_grid)
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {"king": "no king files"})
    path = cli.benchmark(["--suite", "tables", "--models", "pategan", "--datasets", "adult", "king", "--epsilons", "1",
                          "--seeds", "5", "6", "7", "--results-dir", str(tmp_path / "results"),
                          "--results-md", str(tmp_path / "RESULTS.md"), "--out-dir", str(tmp_path / "runs")])
    (size, skipped), = grids
    assert skipped == {"king": "no king files"} and size.seeds == (5, 6, 7)
    content = json.loads(path.read_text())
    assert content["seeds"] == [5, 6, 7]


def test_the_speed_suites_scripts_run_on_the_gpu_for_either_name_of_it(tmp_path, monkeypatch):
    """--accelerator cuda trains the cells on the GPU (Lightning's name for it as good as gpu): the
    mechanism benchmarks must time the same device, not fall back to the CPU."""
    from lightning_dpgan.benchmark import speed

    devices = []

    def fake_script(command, log):
        devices.append(command[command.index("--device") + 1])
        Path(command[command.index("--json") + 1]).write_text(json.dumps({"rows": []}))
        return 1.0

    monkeypatch.setattr(speed, "run_logged", fake_script)
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR", raising=False)
    for accelerator in ("gpu", "cuda"):
        devices.clear()
        speed.micro_benchmarks(True, None, accelerator, tmp_path)
        assert devices and set(devices) == {"cuda"}, accelerator
    devices.clear()
    speed.micro_benchmarks(True, None, "cpu", tmp_path)
    assert set(devices) == {"cpu"}


def test_the_peers_suite_refuses_jobs_and_resume_whose_runs_are_timed_whole(tmp_path):
    """A peer's wall time is compared with ours: the peers suite runs each peer alone and whole, so
    --jobs 2 (sharing the machine) and --resume (a run cut in two) are refused before any work."""
    common = ["--suite", "peers", "--results-dir", str(tmp_path), "--out-dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match="--jobs would have them share the machine"):
        benchmark([*common, "--jobs", "2"])
    with pytest.raises(SystemExit, match="--resume continues the runs of an earlier invocation"):
        benchmark([*common, "--resume"])


def test_a_cell_trains_to_exactly_its_target_epsilon_however_many_figures_it_has(tmp_path):
    """The train command and the cell's folder write the target short where that is exact (1,
    0.1) and in full otherwise: six figures (0.123457 for 0.1234567) trained to a larger budget
    than the cell's row says."""
    from lightning_dpgan.benchmark.suites import epsilon_text

    assert [epsilon_text(e) for e in (1.0, 10.0, 0.1, 1e-5, 0.1234567)] == ["1", "10", "0.1", "1e-05", "0.1234567"]
    size = suite_size("tables", quick=True)
    cell = Cell("dpgan", "adult", 0.1234567, 0)
    command = train_command(cell, size, Settings(out_dir=tmp_path))
    assert float(command[command.index("--epsilon") + 1]) == 0.1234567
    assert cell.name == "dpgan_adult_eps0.1234567_seed0"
    assert Cell("dpgan", "adult", 1.0000001, 0).name != Cell("dpgan", "adult", 1.0, 0).name  # two folders, two targets


def test_an_out_dir_that_is_a_file_or_a_resume_of_no_folder_is_refused_before_any_cell(tmp_path, monkeypatch):
    """--out-dir naming a file failed every cell ("File exists") and filed a results file of failed
    runs; --resume of a folder that does not exist (a typo) ran the whole suite afresh."""
    monkeypatch.setattr(cli, "unavailable_datasets", lambda datasets, data_dir: {})
    monkeypatch.setattr(runner, "run_logged", lambda *args, **kwargs: pytest.fail("a cell ran"))
    afile = tmp_path / "runs.txt"
    afile.write_text("mine")
    common = ["--suite", "tables", "--models", "dpctgan", "--datasets", "adult", "--epsilons", "1", "--seeds", "0",
              "--results-dir", str(tmp_path / "results"), "--results-md", str(tmp_path / "RESULTS.md")]
    with pytest.raises(SystemExit, match="is a file, not a folder: give a folder for the runs"):
        benchmark([*common, "--out-dir", str(afile)])
    with pytest.raises(SystemExit, match="no such folder, so there is nothing to continue"):
        benchmark([*common, "--resume", "--out-dir", str(tmp_path / "typo")])
    assert afile.read_text() == "mine" and not (tmp_path / "results").exists() and not (tmp_path / "typo").exists()


def test_an_installation_that_is_not_a_checkout_is_refused_though_site_packages_holds_a_benchmarks_folder(tmp_path):
    """Installed from a wheel, the package's checkout is site-packages, where Opacus installs a
    ``benchmarks`` package of its own: the harness took it for the checkout's and failed on a
    missing reference.yaml, or would have written results there."""
    from lightning_dpgan.benchmark.paths import REPO, check_benchmarks_folder

    site_packages = tmp_path / "site-packages"
    (site_packages / "benchmarks").mkdir(parents=True)
    (site_packages / "benchmarks" / "__init__.py").write_text("")  # opacus' own
    with pytest.raises(SystemExit, match="this installation is not a checkout .* run it from a clone installed with "
                                         "pip install -e"):
        check_benchmarks_folder(site_packages)
    check_benchmarks_folder(REPO)  # this checkout: accepted
