"""``benchmarks/RESULTS.md``'s generated section and its plots: for each suite its full and
full-subset runs merged (each cell from the newest file that measured it on all its seeds), else
its newest run of any size.

Only the part between ``<!-- benchmark:begin -->`` and ``<!-- benchmark:end -->`` is rewritten;
the hand-written analysis around it stays. Every figure printed comes from a results file, and
the papers' figures come from ``benchmarks/reference.yaml`` (never copied here): drawn on a plot
only where they were measured the same way (same dataset, measure and epsilon).
"""
from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import yaml

from lightning_dpgan.benchmark.paths import REPO
from lightning_dpgan.benchmark.suites import DELTA, delta_for
from lightning_dpgan.benchmark.results import cell_key, finished_summary, latest_results, protocol_results
from lightning_dpgan.outputs import atomic_write

BEGIN, END = "<!-- benchmark:begin -->", "<!-- benchmark:end -->"
#: sizes whose runs follow the full protocol (the goals read only these)
PROTOCOL_SIZES = ("full", "full-subset")

#: the measures a suite's table shows, in order (a column is left out when no row has it)
COLUMNS: dict[str, tuple[str, ...]] = {
    "tables": ("utility/B_auroc", "utility/B_auroc_four", "utility/B_auprc", "utility/sra", "utility/difference_r2",
               "utility/difference_r2/ridge", "utility/synthetic_r2", "fidelity/wasserstein_mean", "fidelity/jsd_mean",
               "fidelity/correlation_difference", "fidelity/pmse", "privacy_risk/mia_auc"),
    "images": ("utility/cnn_accuracy", "privacy_risk/mia_auc"),
    "speed": (),
    "peers": ("utility/B_auroc", "utility/B_auroc_four", "fidelity/pmse", "fidelity/jsd_mean"),
}

#: the measure plotted against epsilon for a dataset: the first of these that the results hold
HEADLINE = ("utility/cnn_accuracy", "utility/B_auroc", "utility/difference_r2")


class ReferenceFileError(ValueError):
    """A ``--reference`` file that cannot be read as the papers' figures: RESULTS.md would lose its
    goals and paper markers in silence."""


#: what each marker of reference.yaml gives: where it is drawn, and where its figure is
MARKER_KEYS = ("dataset", "measure", "epsilon", "label", "at")


def load_reference(path: Path) -> dict[str, Any]:
    """The papers' figures and the goals (``benchmarks/reference.yaml``), refused when the file is
    missing or not a mapping rather than read as none."""
    if not path.is_file():
        raise ReferenceFileError(f"--reference {path} is not a file (the papers' figures and the goals)")
    try:
        reference = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ReferenceFileError(f"--reference {path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(reference, dict):
        raise ReferenceFileError(f"--reference {path} holds no mapping of figures")
    markers = reference.get("markers") or []
    if not isinstance(markers, list):
        raise ReferenceFileError(f"--reference {path}: markers is not a list")
    for index, marker in enumerate(markers, start=1):  # found now, not when the report is drawn after every cell
        missing = [key for key in MARKER_KEYS if not isinstance(marker, dict) or key not in marker]
        if missing:
            raise ReferenceFileError(f"--reference {path}: marker {index} lacks {', '.join(missing)}")
        figure_at(reference, marker["at"], path)
        delta = reference.get(marker["at"][0], {}).get("delta") if isinstance(marker["at"], list) else None
        if delta is not None and (isinstance(delta, bool) or not isinstance(delta, (int, float))):
            raise ReferenceFileError(f"--reference {path}: {marker['at'][0]}'s delta is {delta!r}, not a number "
                                     "(YAML reads 1e-5 as text: write 1.0e-5)")
    return {**reference, "markers": markers}


def fmt(summary: dict[str, Any] | None, digits: int = 3) -> str:
    """``mean ± std (n)``; a single seed shows its value and ``(1)``: no spread was measured."""
    if not summary or summary.get("mean") is None:
        return "–"
    text = f"{summary['mean']:.{digits}f}"
    if summary.get("std") is not None:
        text += f" ± {summary['std']:.{digits}f}"
    return f"{text} ({summary['n']})"


def _spent(row: dict[str, Any]) -> str:
    """The spent epsilon; a data-dependent one (PATE's, G-PATE's: a function of the teachers'
    votes, not itself private) says so, with the data-independent bound of the queries asked."""
    independent, spent, target = row.get("epsilon_data_independent"), row["epsilon"], row["target_epsilon"]
    text = fmt(spent)
    if spent and spent.get("mean") is not None and target is not None and spent["mean"] > target:
        # a peer's own accounting (ours never passes it), with the digits that show it above
        text = f"{fmt(spent, separating_digits(spent['mean'], target))} (above the target)"
    if row.get("peer_spend_unreported") and (not spent or spent.get("mean") is None):
        return f"{text} (not reported by the peer: its target only)"
    if not independent or independent.get("mean") is None:
        return f"{text} data-dependent (no data-independent bound recorded)" if row.get("data_dependent_unrecorded") else text
    return f"{text} data-dependent; data-independent {fmt(independent, _digits_of(independent))}"


def _digits_of(summary: dict[str, Any]) -> int:
    """3 decimals, none for a bound in the thousands (PATE's data-independent 6,400)."""
    return 0 if abs(summary["mean"]) >= 1000 else 3


def _epsilon(value: float | None) -> str:
    return "∞" if value is None else f"{value:g}"


def _delta(value: float) -> str:
    """A δ as the text writes it: 1e-5, not Python's 1e-05."""
    mantissa, _, exponent = f"{value:g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def _resumed_provenance(resumed: list[dict[str, Any]], commit: dict[str, Any] | None) -> str:
    """What commit the resumed runs started at, and whose wall times are shown: those of runs
    that trained whole before the interruption, read back, where the conditions were the same."""
    def named(record: dict[str, Any]) -> str:
        return f"`{(record.get('sha') or 'unknown')[:10]}`" + (" with uncommitted changes" if record.get("dirty") else "")

    if any(not isinstance(run.get("started_at_commit"), dict) for run in resumed):  # recorded before runs kept it
        said = ("The commit above is this invocation's; what ran before it ran the interrupted one's code, "
                "which is not recorded for every run.")
    elif all(run["started_at_commit"] == commit for run in resumed):
        said = "They started at the commit above as well."
    else:
        started = Counter(named(run["started_at_commit"]) for run in resumed)
        said = "They started at commit " + ", ".join(
            f"{name} ({count} run{'s' if count > 1 else ''})" for name, count in sorted(started.items())) + "."
    untimed = sum(run.get("train_seconds") is None for run in resumed)
    if untimed == 0:
        return said + " Their wall times are those of their runs, each trained whole before the interruption."
    return said + (f" The wall times of {untimed} of them are not shown: a run continued from a checkpoint would "
                   "show part of itself, and one trained whole before is shown only where it was timed under this "
                   "file's conditions (machine, device, --jobs, thread settings).")


def _header(result: dict[str, Any], list_cells: bool = True) -> list[str]:
    machine, sha = result.get("machine", {}), result.get("commit", {})  # an older or edited file may lack them
    cores = f"{machine.get('cpu_count', 'unknown')} CPU cores ({machine.get('cpu_model') or machine.get('processor') or 'unknown'})"
    where = machine.get("gpu") or cores
    if isinstance(threads := machine.get("thread_settings"), dict) and threads:
        where += " with " + ", ".join(f"{name}={value}" for name, value in threads.items())
    dirty = {True: " with uncommitted changes", None: " (whether the tree had uncommitted changes is unknown)"}.get(
        sha.get("dirty"), "")
    lines = [f"- `{result['file']}`: size **{result['size']}**, {result.get('started', 'start unknown')}, {where}, torch "
             f"{machine.get('torch', 'unknown')}, commit `{(sha.get('sha') or 'unknown')[:10]}`{dirty}.",
             f"- Command: `{result.get('command', 'unknown')}`; seeds {', '.join(map(str, result.get('seeds', [])))}."]
    if result["size"] == "full-subset":
        lines.append("- Size full-subset: part of the full grid, each cell on the full protocol.")
    elif result["size"].startswith("dev"):
        lines.append(f"- Size {result['size']}: scored on records held out of the training split (`--dev-fraction`), "
                     "not on the test split: figures to choose settings by, not the protocol's.")
    if result["size"] in ("quick", "dev-quick"):
        lines.append(f"- Size {result['size']}: a smoke test of the harness (few steps, one seed), not the full "
                     "protocol; its figures say nothing of the models.")
    elif result["size"] not in ("full", "full-subset", "dev"):
        lines.append(f"- Size {result['size']}: not the full protocol (settings changed, or fewer than three seeds, "
                     "or a cell outside the grid); its figures count for no goal.")
    ended = result.get("commit_at_end")
    if ended:
        lines.append(f"- **The code changed while the suite ran**: commit `{(ended.get('sha') or 'unknown')[:10]}`"
                     f"{' with uncommitted changes' if ended.get('dirty') else ''} at its end; each cell ran the tree "
                     "as it was when the cell started.")
    if result.get("jobs", 1) > 1:
        threads = f", OMP_NUM_THREADS={result['threads_per_job']} in each" if "threads_per_job" in result else ""
        lines.append(f"- {result['jobs']} cells ran at a time (`--jobs`{threads}): their wall times shared the machine.")
    if not result.get("complete", True):
        lines.append("- This suite stopped before it finished: the file holds the runs done by then, and only "
                     "the cells that ran every seed are shown from it.")
    merged = "cells" in result  # a part of a merged result: it speaks for its own cells only
    cells = {tuple(cell) for cell in result.get("cells", [])}
    since = {tuple(cell) for cell in result.get("failed_since", [])}
    shown_failures = cells | since | {tuple(cell) for cell in result.get("failed_cells", [])}
    if cells and list_cells:
        lines.append("- Cells from this file: " + ", ".join(
            f"{model} / {dataset} / ε={_epsilon(epsilon)}" for model, dataset, epsilon in sorted(cells, key=str)) + ".")
    if result.get("failed_cells"):
        lines.append("- Cells no file measured, whose newest attempt is this file's: " + ", ".join(
            f"{model} / {dataset} / ε={_epsilon(epsilon)}" for model, dataset, epsilon in result["failed_cells"]) + ".")
    if since:
        lines.append("- **Cells whose newest attempt is this file's and failed** on some seed (below); the figure "
                     "shown for them is an older file's, measured at its commit: " + ", ".join(
                         f"{model} / {dataset} / ε={_epsilon(epsilon)}" for model, dataset, epsilon in sorted(since, key=str)) + ".")
    resumed = [run for run in result["runs"] if run.get("resumed") and (not merged or cell_key(run) in cells)]
    if resumed:
        lines.append(f"- {len(resumed)} of its runs were taken up after an interruption (`--resume`): "
                     + "; ".join(f"{why}: {count}" for why, count in sorted(Counter(run["resumed"] for run in resumed).items()))
                     + ". A checkpoint holds the accountant's state, so ε is that of an uninterrupted run. "
                     + _resumed_provenance(resumed, result.get("commit")))
    if result.get("skipped"):
        lines += [f"- Skipped: {name}: {' '.join(why.split())}" for name, why in result["skipped"].items()]
    failed = [run for run in result["runs"]
              if run.get("status") == "failed" and (not merged or cell_key(run) in shown_failures)]
    lines += [f"- Failed: {run['model']} / {run['dataset']} / ε={_epsilon(run['target_epsilon'])} / seed {run['seed']}: "
              f"`{_last_line(run['error'])}`" for run in failed]
    return lines


def _last_line(text: str) -> str:
    """The line that says why: a failed command's log ends with its error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def measure_table(result: dict[str, Any], goals: list[dict[str, Any]] = ()) -> list[str]:
    """The suite's rows; a figure that a goal of ``goals`` reads shows the digits that keep it on
    its side of the goal (:func:`separating_digits`), as the Goals table does."""
    rows = result["summary"]
    columns = [c for c in COLUMNS.get(result["suite"], ()) if any(c in row["measures"] for row in rows)]
    head = ["model", "dataset", "target ε", "spent ε", "steps", "train s", "fit s", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sorted(rows, key=lambda r: (r["dataset"], r["model"], r["target_epsilon"] or math.inf)):
        model = row["model"] + (" (a newer attempt failed)" if row.get("newest_attempt_failed") else "")
        cells = [model, row["dataset"], _epsilon(row["target_epsilon"]), _spent(row),
                 fmt(row["steps"], 0), fmt(row["train_seconds"], 0), fmt(row["fit_seconds"], 0),
                 *(fmt(row["measures"].get(c), goal_digits(goals, row, c)) for c in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def goal_bound(goal: dict[str, Any]) -> float:
    """The figure a goal of ``reference.yaml`` asks for (``at_least`` or ``at_most``)."""
    return goal.get("at_least", goal.get("at_most"))


def goal_reads(goal: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether ``goal`` is measured by ``row``: its dataset and epsilon, and a mean of its measure."""
    return (row["dataset"] == goal["dataset"] and row["target_epsilon"] == goal["epsilon"]
            and row["measures"].get(goal["measure"], {}).get("mean") is not None)


def goal_digits(goals: list[dict[str, Any]], row: dict[str, Any], measure: str) -> int:
    """3 decimals, or more for a figure that rounds onto a goal it is measured against."""
    return max([3, *(separating_digits(row["measures"][measure]["mean"], goal_bound(goal))
                     for goal in goals if goal["measure"] == measure and goal_reads(goal, row))])


#: seeds a cell needs before it may stand for a goal (the issue's "mean ± std over >= 3 runs")
GOAL_SEEDS = 3


def goal_lines(results: list[dict[str, Any]], reference: dict[str, Any]) -> list[str]:
    """Where each goal of ``reference.yaml`` stands: the best model's mean in the newest results,
    over cells measured with at least :data:`GOAL_SEEDS` seeds (a fewer-seed cell is named, never met)."""
    lines = ["| goal | best measured | model | seeds | met |", "|---|---|---|---|---|"]
    for goal in reference.get("goals", []):
        target = goal_bound(goal)
        better = max if "at_least" in goal else min
        found = [(row["measures"][goal["measure"]], row["model"], row.get("newest_attempt_failed", False))
                 for result in results if result["size"] in PROTOCOL_SIZES and result["suite"] != "peers"  # ours alone
                 for row in result["summary"] if goal_reads(goal, row)]
        sign = "≥" if "at_least" in goal else "≤"
        name = f"{goal['dataset']} ε={goal['epsilon']:g} {goal['measure']} {sign} {target}"
        if goal.get("reading"):  # how this goal reads an issue's figure, where another reading exists
            name += f" ({goal['reading']})"
        enough = [item for item in found if item[0]["n"] >= GOAL_SEEDS]
        if not enough:
            few = max(found, key=lambda item: item[0]["n"], default=None)
            lines.append(f"| {name} | not measured on the full protocol | | | |" if few is None else
                         f"| {name} | measured with {few[0]['n']} seed(s) only, fewer than {GOAL_SEEDS} | {few[1]} | "
                         f"{few[0]['n']} | no |")
            continue
        summary, model, failed_since = better(enough, key=lambda item: item[0]["mean"])
        met = summary["mean"] >= target if "at_least" in goal else summary["mean"] <= target
        digits = separating_digits(summary["mean"], target)
        verdict = ("yes" if met else "no") + ("; a newer attempt of this cell failed (see its suite)" if failed_since else "")
        lines.append(f"| {name} | {fmt(summary, digits)} | {model} | {summary['n']} | {verdict} |")
    return lines


def separating_digits(mean: float, bound: float, digits: int = 3, most: int = 15) -> int:
    """Decimals that show ``mean`` on its side of a goal's ``bound``: 3, or more where 3 would
    round it onto the bound (a mean of 0.86999 against 0.87 reads "0.870 ... no" at 3)."""
    while digits < most and mean != bound and round(mean, digits) == round(bound, digits):
        digits += 1
    return digits


def timed_sharing(result: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether ``row``'s wall times were measured with other cells running (``--jobs`` above 1):
    the file it came from, or for a merged result the part that gave its cell."""
    parts = [part for part in result.get("parts", []) if cell_key(row) in part["cells"]]
    return any(part.get("jobs", 1) > 1 for part in parts or [result])


def unshared_time(speed: dict[str, Any] | None, mine: dict[str, Any]) -> dict[str, Any] | None:
    """Our wall time for ``mine`` (a tables row) from the speed suite, which runs one cell at a
    time: its row of the same model, dataset and epsilon, if it ran the same schedule (the same
    mean number of steps: a preset changed since would not) alone on the machine; else None."""
    if speed is None:
        return None
    for row in speed["summary"]:
        same_cell = (row["model"], row["dataset"], row["target_epsilon"]) == (mine["model"], mine["dataset"], mine["target_epsilon"])
        if (same_cell and row["train_seconds"]["mean"] and row["steps"]["mean"] == mine["steps"]["mean"]
                and not timed_sharing(speed, row)):
            return row["train_seconds"]
    return None


def peer_comparison(peers: dict[str, Any], tables: dict[str, Any] | None, speed: dict[str, Any] | None = None) -> list[str]:
    """Each peer next to our model of the same name, else our best model, at the same dataset
    and epsilon in our tables results on the same protocol: utility as ours / peer, wall time as
    peer / ours (above 1: ours is faster). Where our tables cell shared the machine (``--jobs``),
    its wall time is not compared; the speed suite's, taken alone on the same schedule, is
    (:func:`unshared_time`), and the row says so."""
    if tables is None:
        return [f"No tables results on the {peers['size']} protocol to compare the peers with.", ""]
    measure = "utility/B_auroc"
    ours: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in tables["summary"]:
        if row["measures"].get(measure, {}).get("mean") is not None:
            ours[(row["dataset"], row["target_epsilon"])].append(row)
    files = ", ".join(f"`{part['file']}`" for part in tables.get("parts", [tables]))
    lines = [f"Against ours ({files}, same protocol): the peers train on all of ε at {_peers_delta(peers)}; our "
             "CTGAN-family models spend part of the same ε on their DP mode histogram.", "",
             "| synthesizer | dataset | target ε | peer AUROC | our model | our AUROC | ours / peer | peer s | our s | "
             "peer / ours (time) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in peers["summary"]:
        candidates = ours.get((row["dataset"], row["target_epsilon"]), [])
        same = [r for r in candidates if r["model"] == row["model"]]
        # our best: among cells of enough seeds first (one lucky seed is no model's figure), as for the goals
        mine = (same or sorted(candidates, key=lambda r: (r["measures"][measure]["n"] < GOAL_SEEDS,
                                                          -r["measures"][measure]["mean"])) or [None])[0]
        if mine is None:
            lines.append(f"| {row['model']} | {row['dataset']} | {_epsilon(row['target_epsilon'])} | "
                         f"{fmt(row['measures'].get(measure))} | none measured | | | | | |")
            continue
        peer_value, our_value = row["measures"].get(measure, {}).get("mean"), mine["measures"][measure]["mean"]
        our_seconds, timed_by, comparable = mine["train_seconds"], "", True
        if timed_sharing(tables, mine):
            alone = unshared_time(speed, mine)
            comparable = alone is not None
            if comparable:
                our_seconds, timed_by = alone, " (speed suite)"
        peer_time, our_time = row["train_seconds"]["mean"], our_seconds["mean"]
        utility = f"{our_value / peer_value:.2f}" if peer_value else "–"
        ratio = f"{peer_time / our_time:.2f}" if peer_time and our_time else "–"
        if not comparable:
            ratio = "– (ours shared the machine)"
        label = mine["model"] if same else f"{mine['model']} (best)"
        lines.append(f"| {row['model']} | {row['dataset']} | {_epsilon(row['target_epsilon'])} | "
                     f"{fmt(row['measures'].get(measure))} | {label} | {fmt(mine['measures'].get(measure))} | {utility} | "
                     f"{fmt(row['train_seconds'], 0)} | {fmt(our_seconds, 0)}{timed_by} | {ratio} |")
    return [*lines, ""]


def _peers_delta(peers: dict[str, Any]) -> str:
    """The δ the peers trained at: ours for each dataset (:func:`delta_for`; credit's is 1e-6)."""
    deltas = {dataset: delta_for(dataset) for dataset in sorted({row["dataset"] for row in peers["summary"]})}
    if len(set(deltas.values())) <= 1:
        return f"δ = {_delta(next(iter(deltas.values()), DELTA))}"
    return "each dataset's δ (" + ", ".join(f"{name} {_delta(delta)}" for name, delta in deltas.items()) + ")"


def markers_for(reference: dict[str, Any], dataset: str, measure: str) -> list[dict[str, Any]]:
    """The papers' figures measured like ours on ``dataset`` (drawn as stars on its plot), each
    with its ``value`` looked up where ``reference.yaml`` keeps it (``at``)."""
    return [{**m, "value": figure_at(reference, m["at"]), "delta": reference[m["at"][0]].get("delta")}
            for m in reference.get("markers", []) if m["dataset"] == dataset and m["measure"] == measure]


def figure_at(reference: dict[str, Any], path: list[str], source: Path | str = "reference.yaml") -> float:
    """The number at ``path`` in the reference entries (a wrong path raises, naming it)."""
    value: Any = reference
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise ReferenceFileError(f"{source} has no figure at {'.'.join(map(str, path))}")
        value = value[key]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ReferenceFileError(f"{source} holds {value!r} at {'.'.join(map(str, path))}, not a number") from None


def plot_suite(result: dict[str, Any], reference: dict[str, Any], plots_dir: Path) -> list[Path]:
    """Utility vs epsilon per dataset (papers' figures as markers); for speed, training time bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(result["file"]).stem
    paths = []
    if result["suite"] == "speed":
        rows = [row for row in result["summary"] if row["fit_seconds"]["mean"] is not None]
        if rows:
            figure, axes = plt.subplots(figsize=(6, 3))
            axes.barh([f"{r['model']} ({r['dataset']})" for r in rows], [r["fit_seconds"]["mean"] for r in rows])
            axes.set_xlabel("fit s: training's wall time, mean over the seeds")
            paths.append(_save(figure, plots_dir / f"{stem}.png"))
        return paths
    by_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in result["summary"]:
        if row["target_epsilon"] is not None:
            by_dataset[row["dataset"]].append(row)
    for dataset, rows in sorted(by_dataset.items()):
        measure = next((m for m in HEADLINE if any(m in row["measures"] for row in rows)), None)
        if measure is None:
            continue
        figure, axes = plt.subplots(figsize=(5, 3.5))
        for model in sorted({row["model"] for row in rows}):
            own = [row for row in rows if row["model"] == model]
            points = sorted((row["target_epsilon"], row["measures"].get(measure, {})) for row in own)
            points = [(eps, s) for eps, s in points if s.get("mean") is not None]
            dependent = any(spent_is_data_dependent(row) for row in own)  # hollow and dashed, and said in the legend
            axes.errorbar([eps for eps, _ in points], [s["mean"] for _, s in points],
                          yerr=[s["std"] or 0 for _, s in points], marker="o", capsize=3,
                          label=f"{model} (ε data-dependent)" if dependent else model,
                          **({"markerfacecolor": "none", "linestyle": "--"} if dependent else {}))
        stars: dict[str, list[tuple[float, float]]] = defaultdict(list)
        # the papers' figures are of their full protocols: beside a quick or custom run's they compare nothing
        for marker in markers_for(reference, dataset, measure) if result["size"] in PROTOCOL_SIZES else []:
            # a paper's delta other than the axis's (credit's cells train at 1e-6, its papers at 1e-5) is said
            other_delta = marker["delta"] is not None and marker["delta"] != delta_for(dataset)
            label = f"{marker['label']}, δ = {_delta(marker['delta'])}" if other_delta else marker["label"]
            stars[label].append((marker["epsilon"], marker["value"]))
        # one legend entry per source, at every ε, in a colour after the models' (scatter keeps a
        # colour cycle of its own, which would repeat theirs)
        for index, (label, points) in enumerate(stars.items(), start=len(axes.containers)):
            axes.scatter([eps for eps, _ in points], [value for _, value in points], marker="*", s=90,
                         label=label, zorder=3, color=f"C{index % 10}")
        axes.set_xscale("log")
        if wide_range([value for line in axes.lines for value in line.get_ydata()]):
            # one seed's table can make a regression extrapolate (R² gaps of hundreds): on a linear
            # axis the other models' gaps of 0.2-3 would lie flat on zero
            axes.set_yscale("symlog", linthresh=1.0)
        axes.set_xlabel(f"target ε (δ = {_delta(delta_for(dataset))})")
        axes.set_ylabel(measure)
        axes.set_title(f"{result['suite']}: {dataset}")
        axes.legend(fontsize=7)
        paths.append(_save(figure, plots_dir / f"{stem}-{dataset}.png"))
    return paths


def spent_is_data_dependent(row: dict[str, Any]) -> bool:
    """Whether a cell's spent epsilon is PATE's or G-PATE's data-dependent figure (a function of
    the votes, not itself private): drawn at its target ε beside the others, it would read as a
    guarantee like theirs."""
    independent = row.get("epsilon_data_independent")
    return bool(row.get("data_dependent_unrecorded")) or (isinstance(independent, dict) and independent.get("mean") is not None)


def wide_range(values: list[float], limit: float = 10.0) -> bool:
    """Whether a plot's values (error bar ends included) reach past ``limit`` in magnitude, where
    a linear axis would hide the differences between values of order 1."""
    return any(abs(float(value)) > limit for value in values)


def _save(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


#: what a mechanism script's columns measure, filled from its results file's own fields
SPEED_CAPTIONS = {
    "dpsgd_overhead": "Milliseconds per discriminator step (`ms_per_step`), the median of {steps} steps at batch "
                      "{batch} on {device}; `ratio`: that over the same critic's non-private step (the median of the "
                      "rounds' ratios).",
    "teacher_ensemble": "Milliseconds per call, the median of {reps} runs on {device}: `batched_ms` the K teachers as one "
                        "batched ensemble, `loop_ms` a Python loop of K teacher modules (`loop_extrapolated`: timed on "
                        "fewer and scaled to K); `speedup`: loop over batched.",
    "gpate_speed": "Milliseconds per G-PATE training iteration on {device}, the median of {steps}: K teachers as one "
                   "batched ensemble (`batched_ms`, and `iterations_per_s`), and as a Python loop of K teacher modules "
                   "(`loop_ms`); `speedup`: loop over batched.",
}
#: the caption of a results file written before its script's figures were measured as they are now
OLDER_SPEED_CAPTIONS = {
    "gpate_speed": "Milliseconds per G-PATE training iteration with K batched teachers on {device} (`batched_ms`, "
                   "and `iterations_per_s`); `loop_scaled_ms`: a loop over {loop_k} teacher modules, scaled in "
                   "proportion to K, an estimate (an iteration's fixed part is counted K/{loop_k} times, while a "
                   "teacher's share grows with K); files written since 2026-11-30 time the loop at K. `speedup`: "
                   "loop over batched.",
}


def _extra_lines(extra: dict[str, Any], name: str = "") -> list[str]:
    """A mechanism script's table, what its columns measure, then the command that produced it
    (its settings, e.g. the teachers' size, are only there)."""
    lines = list(extra.get("markdown", []))
    older = name in OLDER_SPEED_CAPTIONS and any("loop_scaled_ms" in row for row in extra.get("rows", []))
    caption = (OLDER_SPEED_CAPTIONS if older else SPEED_CAPTIONS).get(name)
    if lines and extra.get("rows") and caption:
        try:
            lines += [caption.format(**extra), ""]
        except (KeyError, IndexError):  # an older file without a field the caption names: the table alone
            pass
    if "command" in extra and lines:
        lines += [f"Command: `{extra['command']}`", ""]
    return lines


def generated_section(results_dir: Path, reference: dict[str, Any], suites: list[str], relative_to: Path,
                      reference_file: Path | None = None) -> str:
    """The Markdown of the generated section (plots written under ``results_dir/plots``);
    ``reference_file``: where the paper figures were read (default: the checkout's)."""
    source = f"{shown_folder(reference_file.parent)}/{reference_file.name}" if reference_file else "benchmarks/reference.yaml"
    lines = [BEGIN, "## Benchmark harness results", "",
             f"Generated by `python -m lightning_dpgan benchmark` from `{shown_folder(results_dir)}/`: for each suite its full "
             "and full-subset runs merged, each cell from the newest file that measured it on all its seeds (else the "
             "newest that measured it at all), or without such runs its newest run; a newer attempt's failures are listed "
             "beside an older figure; mean ± sample std over seeds, the "
             f"number of seeds in brackets. A goal counts only cells of {GOAL_SEEDS} seeds or more. "
             f"Paper figures come from `{source}`. `train s` is the wall time of the whole train "
             "command (data, preprocessing, outputs), `fit s` that of its training alone.", ""]
    found = []
    for suite in suites:
        # the full and full-subset runs merged; a quick or custom one only while there are none
        result = protocol_results(results_dir, suite) or latest_results(results_dir, suite)
        if result is None:
            continue
        result = with_finished_cells(result)
        found.append(result)
        parts = result.get("parts", [result])
        header = [line for part in parts for line in _header(part, list_cells=len(parts) > 1)]
        lines += [f"### {suite}", "", *header, "", *measure_table(result, reference.get("goals", [])), ""]
        lines += [line for name, extra in result.get("extras", {}).items() for line in _extra_lines(extra, name)]
        if suite == "peers":  # against ours on the same protocol (full or full-subset), else of the same size
            same_protocol = result["size"] in PROTOCOL_SIZES
            tables = (protocol_results(results_dir, "tables") if same_protocol
                      else with_finished_cells(latest_results(results_dir, "tables", size=result["size"])))
            speed = protocol_results(results_dir, "speed") if same_protocol else None
            lines += peer_comparison(result, tables, speed)
        for path in plot_suite(result, reference, results_dir / "plots"):
            lines += [f"![{path.stem}]({Path(os.path.relpath(path, relative_to)).as_posix()})", ""]
    if not found:
        lines += ["No results yet.", ""]
    lines += ["### Goals", "", *goal_lines(found, reference), "", END]
    return "\n".join(lines)


def with_finished_cells(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """``result`` showing only the cells it finished: a single file of a stopped suite keeps its
    cells cut short out of the tables (merged parts hold only finished cells already)."""
    if result is None or "parts" in result:
        return result
    return {**result, "summary": finished_summary(result)}


def shown_folder(folder: Path) -> str:
    """``folder`` as the generated text names it: relative to the checkout when inside it (no path
    of this machine), else by its name alone."""
    resolved = folder.resolve()
    return resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else folder.name


def update_results_markdown(markdown: Path, section: str) -> None:
    """Replace the generated section of ``markdown`` (or add it after the title), through a
    temporary file: the hand-written analysis around it is never left half written. A file
    holding one of the two markers without the other is refused: what lies between is unknown."""
    text = markdown.read_text() if markdown.is_file() else "# Results\n"
    if (BEGIN in text) != (END in text):
        raise ValueError(f"{markdown} holds one of the generated section's markers ({BEGIN} ... {END}) without the "
                         "other: put the missing one back around the generated section, then regenerate")
    if BEGIN in text and END not in text.split(BEGIN, 1)[1]:  # the end marker above the begin one
        raise ValueError(f"{markdown} holds the generated section's end marker ({END}) before its begin marker "
                         f"({BEGIN}): put them in order around the generated section, then regenerate")
    if BEGIN in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        text = before + section + after
    else:
        title, _, body = text.partition("\n")
        text = f"{title}\n\n{section}\n{body}"
    atomic_write(markdown, lambda handle: handle.write(text.encode()))


__all__ = ["BEGIN", "END", "ReferenceFileError", "figure_at", "generated_section", "goal_lines", "load_reference", "markers_for", "measure_table", "peer_comparison", "plot_suite",
           "update_results_markdown"]
