"""The Markdown report of an evaluated run, with the plots people look at first.

``evaluate`` writes ``report.md`` beside ``evaluation.json`` and its figures under
``report/``: epsilon over training steps (from the CSV log), the sample grid (images),
per-classifier AUROC trained on real vs on synthetic data, real-vs-synthetic marginals and the
two correlation matrices (tables). Every figure is drawn from the run's own files; nothing is
made up when a piece is missing -- the section is left out.
"""
from __future__ import annotations

import io
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from lightning_dpgan.data.schema import TableSchema  # noqa: E402
from lightning_dpgan.error_text import first_line  # noqa: E402
from lightning_dpgan.outputs import atomic_write  # noqa: E402
from lightning_dpgan.privacy.noise_source import fixed_seed_sources_in_report, not_for_release  # noqa: E402

REPORT_FILE = "report.md"
FIGURES = "report"
#: At most this many columns get a marginal plot (the first ones of the schema).
MAX_MARGINALS = 6


def save_figure(figure: plt.Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG atomically and close it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return atomic_write(path, lambda handle: handle.write(buffer.getvalue()))


def epsilon_figure(metrics_csv: Path) -> plt.Figure | None:
    """Epsilon against training steps from Lightning's CSV log (None without such a column)."""
    if not metrics_csv.is_file():
        return None
    try:
        log = pd.read_csv(metrics_csv)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:  # cut or emptied
        print(f"evaluate: warning: {metrics_csv} cannot be read ({first_line(error)}): the report has no "
              "epsilon-over-steps figure", file=sys.stderr)
        return None
    if "privacy/epsilon" not in log or log["privacy/epsilon"].dropna().empty:
        return None
    points = log[["step", "privacy/epsilon"]].dropna()
    figure, axes = plt.subplots(figsize=(5, 3))
    axes.plot(points["step"], points["privacy/epsilon"], marker=".")
    axes.set(xlabel="log step", ylabel="epsilon spent", title="Privacy spent")
    return figure


def auroc_figure(per_classifier: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> plt.Figure:
    """Bars of each classifier's AUROC in settings A (train real) and B (train synthetic)."""
    names = list(per_classifier["A"])
    x = np.arange(len(names))
    figure, axes = plt.subplots(figsize=(max(6, len(names) * 0.6), 3))
    for offset, setting, label in ((-0.2, "A", "train real"), (0.2, "B", "train synthetic")):
        axes.bar(x + offset, [per_classifier[setting][n]["auroc"] for n in names], width=0.4, label=label)
    axes.set_xticks(x, names, rotation=45, ha="right")
    axes.set(ylim=(0, 1), ylabel="AUROC on the real test split", title="Classifiers")
    axes.legend()
    return figure


def marginals_figure(real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema) -> plt.Figure:
    """Real vs synthetic distribution of the first columns: histograms over the public bounds (values
    past them in the outermost bins, where training clipped them: a histogram of none inside was
    divided by zero), or category frequencies over the public category list."""
    columns = [column for column in schema.columns if column.name in synthetic][:MAX_MARGINALS]
    figure, axes = plt.subplots(1, len(columns), figsize=(3 * len(columns), 2.6), squeeze=False)
    for axis, column in zip(axes[0], columns):
        if column.kind == "categorical":
            categories = [str(c) for c in column.categories]
            for offset, frame, label in ((-0.2, real, "real"), (0.2, synthetic, "synthetic")):
                share = frame[column.name].astype(str).value_counts(normalize=True).reindex(categories, fill_value=0)
                axis.bar(np.arange(len(categories)) + offset, share.values, width=0.4, label=label)
            axis.set_xticks(np.arange(len(categories)), categories, rotation=45, ha="right", fontsize=7)
        else:
            low, high = column.bounds
            bins = np.linspace(low, high, 30)
            for frame, label in ((real, "real"), (synthetic, "synthetic")):  # clipped to the bounds, as trained on
                values = pd.to_numeric(frame[column.name], errors="coerce").dropna().clip(low, high)
                axis.hist(values, bins=bins, density=True, alpha=0.5, label=label)
        axis.set_title(column.name, fontsize=9)
    axes[0][0].legend(fontsize=7)
    return figure


def correlation_figure(real_features: np.ndarray, synthetic_features: np.ndarray) -> plt.Figure:
    """The Pearson correlation matrices of the encoded features, real and synthetic."""
    figure, axes = plt.subplots(1, 2, figsize=(8, 3.8))
    for axis, features, title in ((axes[0], real_features, "real"), (axes[1], synthetic_features, "synthetic")):
        with np.errstate(invalid="ignore", divide="ignore"):
            matrix = np.nan_to_num(np.corrcoef(features, rowvar=False))
        image = axis.imshow(matrix, vmin=-1, vmax=1, cmap="coolwarm")
        axis.set_title(f"correlations, {title}")
        axis.set_xticks([])
        axis.set_yticks([])
    figure.colorbar(image, ax=list(axes), shrink=0.8)
    return figure


def write_report(run_dir: Path, evaluation: Mapping[str, Any], privacy: Mapping[str, Any] | None,
                 figures: Mapping[str, str]) -> Path:
    """``report.md``: what was run, the privacy guarantee, the measured figures and the plots."""
    return write_report_text(run_dir, render_report(run_dir, evaluation, privacy, figures))


def write_report_text(run_dir: Path, text: str) -> Path:
    """``report.md`` of :func:`render_report`'s text, written whole or not at all."""
    path = run_dir / REPORT_FILE
    atomic_write(path, lambda handle: handle.write(text.encode()))
    return path


def render_report(run_dir: Path, evaluation: Mapping[str, Any], privacy: Mapping[str, Any] | None,
                  figures: Mapping[str, str], warnings: Sequence[str] = ()) -> str:
    """The text of ``report.md``, made before any of the evaluation's files is written: a report
    that cannot be made must leave the earlier evaluation's files as they were. ``warnings`` are
    the evaluation's own (a label class the synthetic table lacks, a thin held-out class), put
    before the figures they qualify."""
    config_path = run_dir / "config.yaml"
    lines = [f"# Run report: {run_dir.resolve().name}", "", f"> {_not_for_publishing(privacy)}", ""]  # '.' has no name
    if privacy:
        epsilon = privacy.get("epsilon")
        lines += [
            "## Privacy", "",
            f"- mechanism: {privacy.get('mechanism')}",
            f"- epsilon: {'none (not private)' if epsilon is None else f'{epsilon:.4g}'}"
            + (f" (target {privacy['target_epsilon']:g})" if privacy.get("target_epsilon") else ""),
            f"- delta: {'none' if privacy.get('delta') is None else privacy['delta']}"
            + (f" ({privacy['neighbours']} neighbours)" if privacy.get("neighbours") else ""),
            *_spent_parts(privacy),
            f"- steps: {privacy.get('steps')}" + (f" (stopped by: {privacy['stopped_by']})" if privacy.get("stopped_by") else ""),
        ]
        for key in ("epsilon_data_dependent", "epsilon_data_independent"):
            if key in privacy:
                lines.append(f"- {key.replace('_', ' ')}: {_shown(privacy[key])}")  # null: n/a, not a TypeError
        if privacy.get("accounting") == "data-dependent":
            from lightning_dpgan.callbacks.teachers import QUERY_COUNT_CAVEAT

            lines.append("- the epsilon above is the data-dependent figure: computed from the teachers' votes, it is "
                         "not itself differentially private; the epsilon data independent bounds the queries the run "
                         f"asked, whatever their votes; {QUERY_COUNT_CAVEAT}")
        lines.append("")
    if warnings:
        lines += ["## Warnings", "", *(f"- {warning}" for warning in warnings), ""]
    lines += ["## Measured", "", "| measure | value |", "|---|---|"]
    for key, value in evaluation.items():
        if key not in ("epsilon", "delta", "epsilon_accounting", "epsilon_data_independent", "privacy_note") \
                and key.count("/") <= 1:
            lines.append(f"| `{key}` | {_shown(value)} |")
    lines.append("")
    for section, title in (("utility", "Per model"), ("fidelity", "Per column")):
        lines += _detail_table(evaluation, section, title)
    for title, name in figures.items():
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    if config_path.is_file():
        lines += ["The run's configuration is in `config.yaml`; the privacy report in `privacy.json`.", ""]
    return "\n".join(lines)


def _not_for_publishing(privacy: Mapping[str, Any] | None) -> str:
    """What of a run may be published: never this report, which reads the real rows without noise;
    privacy.json too unless its epsilon was computed from the teachers' votes (data-dependent), and
    nothing of an audit's trial (its figures are the claim under test)."""
    report = ("For the data holder: this report and the figures it shows are computed from the real rows without noise and "
              "are not covered by any privacy guarantee.")
    if not privacy or privacy.get("epsilon") is None:
        return f"{report} The run states no privacy guarantee: do not publish its synthetic data as private."
    if privacy.get("stopped_by") == "fast-dev-run":
        return (f"{report} The run was Lightning's fast_dev_run, a check of the code: publish neither its synthetic "
                "data nor its `privacy.json`; train without --trainer.fast_dev_run to release.")
    if privacy.get("audit_trial"):
        return (f"{report} The run is {privacy['audit_trial']}: publish neither this run's synthetic data nor its "
                "`privacy.json`; release a generator trained by `train` instead.")
    if sources := fixed_seed_sources_in_report(dict(privacy)):
        return (f"{report} The run is not private: {not_for_release(sources)}. Publish neither its synthetic data nor "
                "its `privacy.json`.")
    if privacy.get("accounting") == "data-dependent":
        return (f"{report} Its `privacy.json`'s epsilon is computed from the teachers' votes and is not itself private "
                "either: publish the synthetic data with the data-independent bound of the queries asked, saying that "
                "their number was decided on the votes too.")
    if privacy.get("segments_stopped_on_the_votes"):
        return (f"{report} Publish the synthetic data and `privacy.json` (its epsilon bounds the queries asked; its note "
                "says which segments stopped on the votes), not these.")
    return f"{report} Publish the synthetic data and `privacy.json`, not these."


def _spent_parts(privacy: Mapping[str, Any]) -> list[str]:
    """Training's share and preprocessing's (a DP schema, DP modes, QUAIL's label model), where
    preprocessing spent any: how the total above was spent."""
    preprocessing = privacy.get("preprocessing")
    if not isinstance(preprocessing, Mapping) or not preprocessing.get("epsilon"):
        return []
    parts = preprocessing.get("parts") or {}
    named = "; ".join(f"{name} {_shown(part.get('epsilon'))}" for name, part in parts.items() if isinstance(part, Mapping))
    as_spent = preprocessing.get("as_spent")
    # spent under add/remove, restated for PATE's replace-one (2 epsilon): the total and each part
    if isinstance(as_spent, Mapping) or any(isinstance(part, Mapping) and "as_spent" in part for part in parts.values()):
        origin = (f"epsilon {_shown(as_spent.get('epsilon'))} spent for {as_spent.get('neighbours')} neighbours"
                  if isinstance(as_spent, Mapping) else "what each spent for add/remove neighbours")
        named = (f"{named}; " if named else "") + f"restated for {preprocessing.get('neighbours')} neighbours from {origin}"
    elif named:
        named = f"{named}, as each was spent"
    return [f"- of which training: epsilon {_shown(privacy.get('epsilon_training'))}; preprocessing: epsilon "
            f"{_shown(preprocessing['epsilon'])}" + (f" ({named})" if named else "")]


def _shown(value: Any) -> Any:
    return "n/a" if value is None else (f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else value)


def _detail_table(evaluation: Mapping[str, Any], section: str, title: str) -> list[str]:
    """The ``<section>/<measure>/<name>`` keys (a classifier's, a regressor's or a column's
    figure) as one table, a row per name and a column per measure, so that the measures table
    above keeps to the summaries."""
    table: dict[str, dict[str, Any]] = {}
    for key, value in evaluation.items():
        parts = key.split("/", 2)  # a column's name may hold a slash itself ("speed km/h")
        if len(parts) == 3 and parts[0] == section:
            table.setdefault(parts[1], {})[parts[2]] = value
    if not table:
        return []
    names = list(dict.fromkeys(name for values in table.values() for name in values))
    lines = [f"## {title}", "", "| | " + " | ".join(f"`{measure}`" for measure in table) + " |",
             "|---" * (len(table) + 1) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(str(_shown(table[m].get(name))) for m in table) + " |")
    return [*lines, ""]


__all__ = ["auroc_figure", "correlation_figure", "epsilon_figure", "marginals_figure", "render_report", "save_figure", "write_report", "write_report_text"]
