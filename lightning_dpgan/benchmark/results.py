"""The results file of a suite: ``<results-dir>/<suite>-<date>.json``.

It holds everything needed to trust and rerun a figure: the machine, the commit (and whether the
tree had uncommitted changes), the exact commands, the seeds, every run's measures, and their
summary over seeds (mean, sample standard deviation, number of seeds). A second run on the same
day gets ``-2``, ``-3``, ... rather than replacing the first. The file is rewritten after every run
(:class:`ResultsFile`), so a suite stopped midway keeps what it measured, marked ``complete: false``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import torch

from lightning_dpgan.benchmark.paths import REPO
from lightning_dpgan.benchmark.runner import THREAD_VARIABLES
from lightning_dpgan.outputs import write_json
from lightning_dpgan.versions import git


def machine() -> dict[str, Any]:
    """What the wall times were measured on: the CPU's model name and the memory (Linux's
    ``/proc`` files; left out where they cannot be read), beside the platform and versions."""
    info: dict[str, Any] = {
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
    }
    cpu, memory = _proc_field("/proc/cpuinfo", "model name"), _proc_field("/proc/meminfo", "MemTotal")
    if cpu:
        info["cpu_model"] = cpu
    if memory and memory.split()[0].isdigit():
        info["memory_gib"] = round(int(memory.split()[0]) / 2**20, 1)  # MemTotal is in kB
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    # the cells' processes inherit them: an OMP_NUM_THREADS=1 run's speed figures are not a default run's
    threads = {name: os.environ[name] for name in THREAD_VARIABLES if os.environ.get(name)}
    if threads:
        info["thread_settings"] = threads
    return info


def _proc_field(path: str, field: str) -> str | None:
    """The value of the first ``field: value`` line of a ``/proc`` file, or None."""
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == field:
                return value.strip()
    except OSError:
        return None
    return None


def commit(repo: Path | None = None, own_output: Path | None = None, own_folders: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The checked-out commit and whether the tree differs from it: a changed tracked file, or a
    file git does not ignore and has not seen (an untracked preset in ``configs/`` changes a run
    as much as an edited one). The harness's own outputs -- ``own_output`` (the RESULTS.md it
    rewrites) and ``own_folders`` (its results folder, whose new files wait to be committed) --
    do not count. ``dirty`` is None where git cannot tell (outside a git tree). A dirty tree
    also gets ``changes``, a digest of its differences (the diff against HEAD, and each file git
    has not seen, by content): an edit to a tree already dirty changes it, where sha and dirty
    stay the same (``commit_at_end`` compares the whole record)."""
    repo = repo if repo is not None else REPO
    head = git(repo, "rev-parse", "HEAD")
    top = git(repo, "rev-parse", "--show-toplevel")

    def inside(path: Path) -> bool:  # git refuses a pathspec outside the tree
        return top is not None and path.resolve().is_relative_to(Path(top).resolve())

    own = [path for path in ([own_output] if own_output is not None else []) + list(own_folders) if inside(path)]
    excluded = [f":(exclude){path.resolve()}" for path in own]
    status = git(repo, "status", "--porcelain", "--untracked-files=all", "--", ".", *excluded)
    record: dict[str, Any] = {"sha": head, "dirty": bool(status) if status is not None else None}
    if status:
        diff = git(repo, "diff", "HEAD", "--binary", "--", ".", *excluded)
        unseen = git(repo, "ls-files", "--others", "--exclude-standard", "-z", "--", ".", *excluded)
        if diff is not None and unseen is not None:
            digest = hashlib.sha256("\0".join([diff, unseen]).encode())
            for name in unseen.split("\0")[:-1]:
                digest.update(_content_of(Path(repo) / name))  # names are relative to repo
            record["changes"] = digest.hexdigest()[:16]
    return record


def _content_of(path: Path) -> bytes:
    """What an untracked file holds, for the change digest: a link's target (git tracks a link,
    not what it points to; a link to a folder has no content to read), else the file's bytes."""
    try:
        return b"link:" + os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    except OSError as error:  # unreadable (permissions, removed meanwhile): its name still counts
        return f"unreadable: {error.strerror}".encode()


def summarize(values: list[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation over the seeds that produced a number."""
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    return {
        "mean": statistics.fmean(finite) if finite else None,
        "std": statistics.stdev(finite) if len(finite) > 1 else None,
        "n": len(finite),
    }


SUMMARIZED = ("epsilon", "epsilon_data_independent", "steps", "train_seconds", "fit_seconds")


def cell_key(record: dict[str, Any]) -> tuple[str, str, float | None]:
    """The cell (model, dataset, target epsilon) a run or summary row belongs to: runs that share
    it, differing only in their seed, are repeats of one measurement."""
    return record["model"], record["dataset"], record["target_epsilon"]


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, dataset, target epsilon): every measure summarized over its seeds."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        if run.get("status", "ok") == "ok":
            groups[cell_key(run)].append(run)
    rows = []
    for (model, dataset, target), members in groups.items():
        keys = sorted({key for run in members for key, value in run["measures"].items() if _is_number(value)})
        row = {"model": model, "dataset": dataset, "target_epsilon": target, "seeds": [run["seed"] for run in members]}
        row.update({key: summarize([run.get(key) for run in members]) for key in SUMMARIZED})
        row["measures"] = {key: summarize([run["measures"].get(key) for run in members]) for key in keys}
        rows.append(row)
    return marked_data_dependent(rows, runs)


def marked_data_dependent(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with ``data_dependent_unrecorded`` on the cells one of whose runs
    :func:`data_dependent_unrecorded` finds (a file's stored summary predates the mark too)."""
    flagged = {cell_key(run) for run in runs if run.get("status", "ok") == "ok" and data_dependent_unrecorded(run)}
    # a peer that reports no spend (smartnoise-synth's PATE models, MST, MWEM): its target alone is known
    unreported = {cell_key(run) for run in runs if run.get("status", "ok") == "ok" and "peer" in run
                  and run.get("epsilon") is None}
    return [{**row, **({"data_dependent_unrecorded": True} if cell_key(row) in flagged else {}),
             **({"peer_spend_unreported": True} if cell_key(row) in unreported else {})} for row in rows]


#: Our models whose strategy stops on a data-dependent epsilon unless told otherwise.
DATA_DEPENDENT_BY_DEFAULT = ("pategan", "patectgan", "gpate")


def data_dependent_unrecorded(run: dict[str, Any]) -> bool:
    """A run of ours (not a peer's, whose names are the same) recorded before results kept
    ``epsilon_data_independent``, of a model whose epsilon
    is data-dependent by default (its commands not asking for the data-independent accounting):
    its spent epsilon is a function of the votes, and no bound beside it says so."""
    commands = " ".join(run.get("commands", []))
    return ("peer" not in run and "epsilon_data_independent" not in run and run["model"] in DATA_DEPENDENT_BY_DEFAULT
            and "data-independent" not in commands)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def results_path(results_dir: Path, suite: str, day: date | None = None) -> Path:
    """``<suite>-<date>.json``, or the first free ``-N`` variant: an earlier file is never replaced."""
    stem = f"{suite}-{(day or date.today()).isoformat()}"
    path, number = results_dir / f"{stem}.json", 2
    while path.exists():
        path, number = results_dir / f"{stem}-{number}.json", number + 1
    return path


class ResultsFile:
    """A suite's results file, rewritten after every run. Hours of runs are not lost to a suite
    that is stopped (killed, out of time, the machine taken back): the file holds the runs finished
    so far with ``complete: false`` until the last save. The path is chosen at the first save."""

    def __init__(self, results_dir: Path, suite: str, header: dict[str, Any]):
        self.results_dir, self.suite, self.header = results_dir, suite, header
        self.path: Path | None = None

    def save(self, runs: list[dict[str, Any]], complete: bool = False, **fields: Any) -> Path:
        if self.path is None:
            self.results_dir.mkdir(parents=True, exist_ok=True)
            self.path = results_path(self.results_dir, self.suite)
        write_json(self.path, {**self.header, **fields, "complete": complete, "runs": runs, "summary": aggregate(runs)})
        return self.path


def finished_summary(content: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary rows of the cells ``content`` finished: all of a complete file's; of a file
    whose suite stopped midway, only the cells that ran every planned seed (a cell cut short
    would show a mean over fewer seeds than the protocol asks for)."""
    if content.get("complete", True):  # files written before this flag existed were written whole
        return content["summary"]
    planned = set(content.get("seeds", []))
    attempted: dict[tuple, set] = defaultdict(set)
    for run in content["runs"]:
        attempted[cell_key(run)].add(run["seed"])
    return [row for row in content["summary"] if attempted[cell_key(row)] >= planned]


def _newest_first(results_dir: Path, suite: str) -> list[Path]:
    """The results files of ``suite``, newest first (by the date in the name, then its ``-N``).
    Files not named ``<suite>-<date>[-N].json`` are ignored."""
    def order(path: Path) -> tuple[str, int] | None:
        parts = path.stem[len(suite) + 1:].split("-")
        if len(parts) not in (3, 4) or not all(part.isdigit() for part in parts):
            return None
        return "-".join(parts[:3]), int(parts[3]) if len(parts) == 4 else 1

    dated = sorted((key, path) for path in results_dir.glob(f"{suite}-*.json") if (key := order(path)) is not None)
    return [path for _, path in reversed(dated)]


class ResultsFileError(ValueError):
    """A file named like a results file that cannot be read as one."""


#: what every results file holds (:class:`ResultsFile`)
REQUIRED_FIELDS = ("size", "runs", "summary")


def _load(path: Path, suite: str) -> dict[str, Any]:
    """A results file's content and name; a truncated or foreign file, another suite's (renamed
    or copied), or one edited out of shape raises, naming it."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ResultsFileError(f"{path} is not a readable results file ({error})") from None
    missing = [field for field in REQUIRED_FIELDS if field not in content] if isinstance(content, dict) else ["content"]
    if missing:
        raise ResultsFileError(f"{path} is not a results file: it has no {', '.join(missing)}")
    content.setdefault("suite", suite)  # files from before the suite was recorded: their name's
    if content["suite"] != suite:
        raise ResultsFileError(f"{path} holds the {content['suite']!r} suite's results, not {suite!r}'s: its name says "
                               f"{suite}; move it out of the results folder, or give it its own suite's name")
    problem = _shape_problem(content)
    if problem:
        raise ResultsFileError(f"{path} is not a results file as the harness writes it: {problem}")
    return {**content, "file": path.name, "summary": marked_data_dependent(content["summary"], content["runs"])}


#: a results file's fields the reports' header reads, and their types (an older file may lack one)
HEADER_FIELDS = {"size": str, "started": str, "command": str, "machine": dict, "commit": dict}
#: the figures every summary row holds besides its measures (each a mean, std and n over the seeds)
SUMMARY_FIGURES = ("epsilon", "steps", "train_seconds", "fit_seconds")


def _shape_problem(content: dict[str, Any]) -> str | None:
    """What of a results file's rows the report cannot read (a hand edit), or None."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def summary(value: Any) -> bool:  # a figure over the seeds: its mean and std numbers, or None (unmeasured)
        return isinstance(value, dict) and all(value.get(key) is None or number(value[key]) for key in ("mean", "std"))

    if "seeds" in content and not isinstance(content["seeds"], list):
        return f"its seeds are {content['seeds']!r}, not a list"
    for key, kind in HEADER_FIELDS.items():  # what every report's header reads (a file without one: "unknown")
        if key in content and not isinstance(content[key], kind):
            return f"its {key} is {content[key]!r}, not a {kind.__name__}"
    for part, fields in (("summary", {"seeds": list, "measures": dict}), ("runs", {"status": str, "seed": int})):
        rows = content[part]
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            return f"its {part} is not a list of rows"
        for index, row in enumerate(rows):
            for key, kind in {"model": str, "dataset": str, **fields}.items():
                if not isinstance(row.get(key), kind):
                    return f"{part} row {index + 1} has {key} {row.get(key)!r}, not a {kind.__name__}"
            if not number(row.get("target_epsilon")):
                return f"{part} row {index + 1} has target_epsilon {row.get('target_epsilon')!r}, not a number"
            if part == "summary":  # each figure summarized over the seeds: mean, std, n
                for key in SUMMARY_FIGURES:
                    if not summary(row.get(key)):
                        return f"summary row {index + 1} has {key} {row.get(key)!r}, not a summary of numbers"
                odd = next((name for name, value in row["measures"].items() if not summary(value)), None)
                if odd is not None:
                    return f"summary row {index + 1} has measure {odd} {row['measures'][odd]!r}, not a summary"
    return None


def latest_results(results_dir: Path, suite: str, size: str | None = None) -> dict[str, Any] | None:
    """The newest results file of ``suite``, of the given ``size`` when one is named."""
    for path in _newest_first(results_dir, suite):
        content = _load(path, suite)
        if size is None or content.get("size") == size:
            return content
    return None


def ran_every_seed(content: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether ``row`` (a cell's summary in ``content``) holds a number from every seed the file planned."""
    return set(row.get("seeds", [])) >= set(content.get("seeds", []))


def merge_subsets(newest_first: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Several runs of parts of a suite's grid as one result: each cell (model, dataset, epsilon)
    from the newest file that measured it on every seed it planned, else (no file did) from the
    newest file that measured it at all -- so a newer run whose seeds partly failed does not
    replace a whole measurement with a mean over fewer seeds. ``parts`` lists the files that
    contributed, each with the ``cells`` it gave and its failures that nothing newer replaced:
    ``failed_cells``, cells no file measured whose newest attempt is this file; ``failed_since``,
    cells shown from an older file although this newer attempt failed on some seed. The rows of
    the latter say so (``newest_attempt_failed``), so an older figure never stands for code that
    now fails without a word. Every figure still names the file, command and commit it came from.
    None when no file measured or failed a cell."""
    chosen: dict[tuple, tuple[int, dict[str, Any]]] = {}
    for whole_only in (True, False):
        for index, content in enumerate(newest_first):
            for row in finished_summary(content):
                if cell_key(row) not in chosen and (ran_every_seed(content, row) or not whole_only):
                    chosen[cell_key(row)] = (index, row)
    newest_failure: dict[tuple, int] = {}  # cell -> the newest file whose attempt at it failed on some seed
    for index, content in enumerate(newest_first):
        for run in content["runs"]:
            if run.get("status") == "failed":
                newest_failure.setdefault(cell_key(run), index)
    unshown = {key: index for key, index in newest_failure.items() if key not in chosen or index < chosen[key][0]}
    parts, runs = [], []
    for index, content in enumerate(newest_first):
        cells = {key for key, (taken_from, _) in chosen.items() if taken_from == index}
        failed = {key for key, taken_from in unshown.items() if taken_from == index}
        unmeasured, since = failed - chosen.keys(), failed & chosen.keys()
        if cells or failed:  # of a cell shown from an older file, this file's failures alone
            runs += [run for run in content["runs"] if cell_key(run) in cells | unmeasured
                     or (cell_key(run) in since and run.get("status") == "failed")]
            parts.append({**content, "cells": sorted(cells, key=str), "failed_cells": sorted(unmeasured, key=str),
                          "failed_since": sorted(since, key=str)})
    if not parts:
        return None
    summary = [{**row, "newest_attempt_failed": True} if key in unshown else row for key, (_, row) in chosen.items()]
    return {**parts[0], "parts": parts, "summary": summary, "runs": runs}


def protocol_results(results_dir: Path, suite: str) -> dict[str, Any] | None:
    """What stands for ``suite`` on the full protocol: its full and full-subset runs merged
    (:func:`merge_subsets`; of a stopped run, its finished cells only). A full run is merged like
    the others rather than standing alone: the cells it lacks (a dataset skipped for want of its
    files, a cell that failed) keep their earlier measurements. None when there are none."""
    contents = [_load(path, suite) for path in _newest_first(results_dir, suite)]
    return merge_subsets([c for c in contents if c.get("size") in ("full", "full-subset")])


__all__ = ["ResultsFile", "ResultsFileError", "aggregate", "cell_key", "commit", "finished_summary", "latest_results", "machine", "merge_subsets", "protocol_results", "ran_every_seed", "results_path",
           "summarize"]
