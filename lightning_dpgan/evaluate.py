"""``evaluate``: the papers' measures on a finished run, written to ``evaluation.json``.

``python -m lightning_dpgan evaluate --run DIR`` (or ``train.py ... --evaluate``) rebuilds the
run's datamodule from ``DIR/config.yaml``, takes the synthetic data (``synthetic.csv`` for a
table; for images, records drawn from ``checkpoints/last.ckpt``) and the real splits, and
computes on a protocol fixed in advance (no setting is chosen by looking at the real test set):

Images
  ``utility/cnn_accuracy``: G-PATE's CNN trained on the synthetic images, tested once on the
  real test split (``utility/cnn_epochs`` epochs).
Tables with a class label
  ``utility/{A,B,C}_auroc``, ``..._auprc``, ``..._accuracy``, ``..._f1``: PATE-GAN's settings
  (A train real / test real, B train synthetic / test real, C train and test synthetic) averaged
  over its 12 classifiers (``utility/{A,B,C}_{auroc,auprc}/<classifier>``: each classifier's);
  ``utility/difference_{auroc,auprc,accuracy,f1}``: A minus B (real-trained minus
  synthetic-trained, as DP-SACTGAN's tables); ``utility/sra``: synthetic ranking agreement of A
  and C (Eq. 8).
Tables with a continuous label
  ``utility/real_{mae,r2,explained_variance}`` and ``utility/synthetic_...`` averaged over the
  regressors, and ``utility/difference_...`` (real minus synthetic, as DP-SACTGAN's tables); each
  also per regressor (``utility/real_r2/<regressor>``, ...).
Tables with a binary or continuous label
  ``utility/feature_agreement``: ranking agreement (Eq. 8) of the features' absolute Pearson
  correlation with the label, real training rows against synthetic rows.
Tables, fidelity
  ``fidelity/wasserstein_mean`` (continuous columns, scaled by the public bounds),
  ``fidelity/jsd_mean`` (categorical columns), each also per column
  (``fidelity/wasserstein/<column>``, ``fidelity/jsd/<column>``), ``fidelity/correlation_difference``,
  ``fidelity/pmse``, ``fidelity/pmse_ratio`` (logistic propensity model, closed-form null),
  ``fidelity/pmse_cart``, ``fidelity/pmse_cart_ratio`` (a classification tree, permutation null);
  over the columns with few values (categorical,
  integer or stepped with at most 1,000 values) ``fidelity/tv_mean`` (total-variation distance of the value frequencies) and
  ``fidelity/invented_share_mean`` (share of synthetic rows on a value no training row holds).
Every run also gets ``report.md`` (with figures under ``report/``: epsilon over steps, samples,
classifier AUROC bars, marginals, correlation matrices; :mod:`lightning_dpgan.evaluation.report`).

Every run
  ``privacy_risk/mia_auc``: a distance-to-closest-record membership-inference attack on training
  records vs held-out test records (0.5 = chance), ``privacy_risk/median_dcr_{members,non_members}``;
  and the run's formal ``epsilon`` and ``delta`` next to it; ``held_out_split``, the split scored on.

``--split dev`` scores a run trained with ``--data.dev_fraction`` on the records it held out of
its train split instead of on the test split (:mod:`lightning_dpgan.data.dev_split`): the same
measures, written to ``evaluation-dev.json`` with no report, so that settings are chosen without
reading the test split and the run's test evaluation, if any, stays as it was.
"""
from __future__ import annotations

import json
import math
import shlex
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

from lightning_dpgan import registry
from lightning_dpgan.command_name import command_line
from lightning_dpgan.config import QUAIL, section_arguments
from lightning_dpgan.data.dev_split import check_held_out_split
from lightning_dpgan.error_text import first_line
from lightning_dpgan.outputs import file_sha256, write_json
from lightning_dpgan.privacy.noise_source import fixed_seed_sources, fixed_seed_sources_in_report, not_for_release
from lightning_dpgan.run import check_same_schema, check_same_split, restore_released_schema, split_settings
from lightning_dpgan.run_folder import (
    EVALUATION_FILES,
    IMAGE_EVALUATE_OPTIONS,
    IMAGE_EVALUATE_SWITCHES,
    LAST_CHECKPOINT,
    continue_command,
)


#: the warnings of the evaluation in progress (:func:`warn`), cleared as :func:`evaluate_run` starts
said_warnings: list[str] = []


def warn(message: str) -> None:
    """Print an evaluation warning and keep it for ``report.md``: a 0.5 AUROC reads as the table's
    failure only beside "the synthetic label holds 1 of its 2 classes", and the one who reads the
    report may never have seen the console."""
    said_warnings.append(message)
    print(f"evaluate: warning: {message}", file=sys.stderr)


def say_stage(text: str) -> None:
    """One line as each stage of an evaluation starts: a table's 36 classifier fits take minutes
    on a small machine, and an evaluation that printed nothing for them read as hung."""
    print(f"evaluate: {text}", file=sys.stderr, flush=True)


def read_run_file(path: Path, parse: Any) -> Any:
    """``parse`` of a run file's text; a damaged file (cut short, edited by hand) is refused by
    name, with the parser's first line, before any evaluation work."""
    try:
        return parse(path.read_text())
    except (ValueError, yaml.YAMLError) as error:  # json.JSONDecodeError is a ValueError
        reason = first_line(error)
        raise ValueError(f"{path} is damaged and cannot be read ({reason}): restore it from the run, or rerun "
                         "train") from error


def _enclosing_run(path: Path) -> str:
    """" (RUN, it seems)" where ``path`` lies inside a run's folder (one holding config.yaml and
    checkpoints/), else "": asked only when ``path`` is not a run's folder itself."""
    run = next((folder for folder in path.parents
                if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir()), None)
    return f" ({run}, it seems)" if run is not None else ""


def load_run_datamodule(run_dir: Path, data_dir: str | None = None,
                        before_reading: Callable[[Any], None] | None = None,
                        privacy: dict[str, Any] | None = None) -> Any:
    """The run's datamodule, from its ``config.yaml`` (``data_dir`` replaces the saved one).
    ``before_reading`` is given the datamodule before any record is read: a refusal there
    reads no data and prints none of the data's warnings first. ``privacy``, the run's
    ``privacy.json``, is checked against the checkpoint: it must be the same run's."""
    config_path = run_dir / "config.yaml"
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir} does not exist: give the output folder of a train run")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is a file: give the output folder of the train run{_enclosing_run(run_dir)}")
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no config.yaml: is it the output folder of a train run"
                                f"{_enclosing_run(run_dir)}? (A "
                                "model trained from Python is scored from Python: "
                                "evaluate_table(data, data.decode(model.sample(n))))")
    config = read_run_file(config_path, yaml.safe_load)
    for section in ("data", "model"):  # each named as train writes it, else a KeyError or TypeError from deep inside
        if not (isinstance(config, dict) and isinstance(config.get(section), dict)
                and isinstance(config[section].get("name"), str)):
            raise ValueError(f"{config_path} is damaged (no {section}.name): restore it from the run, or rerun train")
    cls = registry.lookup("dataset", config["data"]["name"]).load()
    if data_dir is not None:
        config["data"]["data_dir"] = data_dir
    elif not getattr(cls, "reads_data_dir", True):
        config["data"].pop("data_dir", None)  # recorded by earlier versions from the environment, never read
    elif (recorded := config["data"].get("data_dir")) and not Path(recorded).expanduser().is_dir():
        raise FileNotFoundError(f"the data folder recorded for this run, {recorded} ({config_path}, data.data_dir), is not "
                                "there any more: pass evaluate --data-dir with the folder that holds the data now")
    info = checkpoint_of_this_run(run_dir, config)
    if info is not None and privacy is not None:
        check_privacy_report_of_this_run(run_dir, privacy, info)
        check_reported_spend(run_dir, privacy, info)
    arguments = section_arguments(config, "data", cls)
    if arguments.get("schema") is not None:  # earlier runs recorded the unused estimate budget beside a schema file
        arguments = {key: value for key, value in arguments.items() if key not in ("bounds_epsilon", "bounds_delta")}
    datamodule = cls(**arguments)
    if info is None:
        if getattr(datamodule, "kind", "image") == "image":  # else refused after the data is read, as "not found"
            raise FileNotFoundError(f"{run_dir} has no {LAST_CHECKPOINT}: an image run is scored on images drawn from "
                                    "its generator there; put the checkpoint back")
        _refuse_releases_left_without_their_checkpoint(run_dir, datamodule)
        warn(f"{run_dir} has no {LAST_CHECKPOINT}: the data, its schema and the split are read as "
             f"{config_path} names them now, not checked against those the run trained on, and privacy.json's "
             "epsilon and delta, copied into the evaluation, are not checked against what the run spent (its "
             "checkpoint keeps both); put the checkpoint back to have them checked")
    restore_released_schema(datamodule, run_dir / LAST_CHECKPOINT, info)  # never a second DP estimate
    if info is not None and "schema" in info:  # restored by then where it was estimated: reads no row
        remedy = (f"put back the schema file it was trained with ({config_path} names it) as it was"
                  if config["data"].get("schema") else
                  "a built-in dataset's schema is this version's: evaluate the run with the version that trained it")
        check_same_schema(datamodule.schema, info["schema"], run_dir / LAST_CHECKPOINT, remedy=(
            f"{remedy}; its synthetic table was decoded under that schema, and would be scored under other columns"))
    csv_path = getattr(datamodule, "csv_path", None)
    if csv_path is not None and not csv_path.is_file():  # train's remedy (--data.csv) is not evaluate's
        raise FileNotFoundError(f"CSV file not found: {csv_path}, the file this run trained on ({config_path}, "
                                "data.csv): put it back there to evaluate the run")
    if info is not None:  # before the rows' digest, which a changed split changes too, and before a
        # --split dev refused for a dev_fraction edited out of config.yaml ("train it with --data.dev_fraction")
        check_same_split(split_settings(datamodule), info.get("split"), run_dir / LAST_CHECKPOINT, remedy=(
            f"{config_path} was edited since: put back the split settings the run trained with (the held-out rows "
            "would be others, and unseen records scored as members)"))
    if before_reading is not None:
        before_reading(datamodule)
    datamodule.prepare_data()
    datamodule.setup()
    check_same_training_rows(datamodule, info, config_path)
    return datamodule


def check_same_training_rows(datamodule: Any, info: dict[str, Any] | None, config_path: Path) -> None:
    """Refuse to score a run against training records other than those it trained on (the file
    edited or replaced since, another dataset's images under its data folder): its utility and
    membership figures would be of other records. The checkpoint's digest of them is compared
    (runs trained before it was kept, image runs before 2026-11-30, are not)."""
    saved = (info or {}).get("train_rows_digest")
    if saved is None or not hasattr(datamodule, "train_rows_digest") or datamodule.train_rows_digest() == saved:
        return
    raise ValueError(f"the training records of {datamodule.name} are not those this run trained on (its checkpoint keeps "
                     "their digest): the data changed after training, and the utility and membership figures would "
                     f"be of other records. Restore the data the run was trained on (see {config_path})")


def check_privacy_report_of_this_run(run_dir: Path, privacy: dict[str, Any], info: dict[str, Any]) -> None:
    """Refuse a ``privacy.json`` of another run than the checkpoint's (copied in from another
    folder, or the checkpoint replaced): its epsilon would be reported for this run's data. The
    lineage (random run ids, lineage.py) tells them apart; reports from before it was kept are not."""
    from lightning_dpgan.lineage import of_other_runs

    if not of_other_runs(privacy, info):
        return
    raise ValueError(f"{run_dir / 'privacy.json'} and {run_dir / LAST_CHECKPOINT} are of different runs (their lineage, "
                     "the run ids training went through, differ): the epsilon reported would not be the one this "
                     "run's data was released under. Put back the run's own files, or rerun train")


def accounting_figures(privacy: dict[str, Any] | None) -> dict[str, Any]:
    """For a teacher strategy's run: which figure ``epsilon`` is, and the bound that holds whatever
    the votes. Under data-dependent accounting ``epsilon`` is the PATE papers' figure, computed from
    the private votes, and evaluation.json is read without privacy.json's note beside it."""
    if not privacy or "accounting" not in privacy:
        return {}
    return {"epsilon_accounting": privacy["accounting"],
            "epsilon_data_independent": privacy.get("epsilon_data_independent")}


def check_reported_spend(run_dir: Path, privacy: dict[str, Any], info: dict[str, Any]) -> None:
    """Refuse a ``privacy.json`` whose spend is not what the run spent (edited since training):
    evaluate copies it into its report as the synthetic data's guarantee. The checkpoint keeps
    the strategy's own figures (``read_spent_privacy``): epsilon and delta, and for a teacher
    strategy which figure epsilon is, the data-independent bound (the one to publish under
    data-dependent accounting) and the segments that stopped on the votes. A run trained without
    privacy keeps none, and its report must state none. Checkpoints from before the figures were
    kept are not checked, nor the figures they did not keep."""
    from lightning_dpgan.sampling import read_spent_privacy

    checkpoint = run_dir / LAST_CHECKPOINT
    spent = {"epsilon": None, "delta": None} if info.get("privacy") == "none" else read_spent_privacy(checkpoint)
    if spent is None:
        return
    edited = [key for key, value in spent.items() if not _same_figure(privacy.get(key), value)]
    if not edited:
        return

    shown = ["epsilon", "delta", *(key for key in edited if key not in ("epsilon", "delta"))]

    def said(figures: dict[str, Any]) -> str:
        return ", ".join(f"{key} {_figure_text(figures.get(key))}" for key in shown)

    raise ValueError(f"{run_dir / 'privacy.json'} states {said(privacy)}, but the run spent {said(spent)} ({checkpoint} "
                     "keeps what its privacy strategy spent): the report was edited since training, and its figures "
                     "are not this run's guarantee. Put back the run's own privacy.json, or rerun train")


def _figure_text(value: Any) -> str:
    if value is None:
        return "none"
    return format(value, ".6g") if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _same_figure(stated: Any, spent: Any) -> bool:
    numbers = [isinstance(value, (int, float)) and not isinstance(value, bool) for value in (stated, spent)]
    if all(numbers):
        return math.isclose(stated, spent, rel_tol=1e-9, abs_tol=0.0)
    return stated == spent and numbers[0] == numbers[1]  # accounting, the segments' steps; None only as None


def _refuse_releases_left_without_their_checkpoint(run_dir: Path, datamodule: Any) -> None:
    """A run whose schema or modes were released under DP keeps them in its checkpoint alone;
    without it, reading the data would estimate them again from the private rows (a second
    spending), so the checkpoint is asked for by name, with why."""
    released = [name for name, needed in (("schema", getattr(datamodule, "estimates_schema", False)),
                                          ("mode-specific encoding's modes", getattr(datamodule, "fits_encoding", False)))
                if needed]
    if released:
        raise FileNotFoundError(
            f"{run_dir} has no {LAST_CHECKPOINT}, which keeps the run's {' and '.join(released)}, released under DP "
            f"from the private rows: put the checkpoint back. Estimating {'them' if len(released) > 1 else 'it'} "
            "again would spend budget a second time, outside the run's epsilon")


def check_privacy_figures(path: Path, privacy: dict[str, Any]) -> None:
    """Refuse a ``privacy.json`` whose figures are not numbers (edited by hand) before any work:
    they are copied into ``evaluation.json`` and formatted in ``report.md``."""
    for key in ("epsilon", "delta", "target_epsilon", "epsilon_data_dependent", "epsilon_data_independent",
                "epsilon_training"):
        value = privacy.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{path} is damaged ({key} is {value!r}, not a number): restore it from the run, or "
                             "rerun train")


def checkpoint_of_this_run(run_dir: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The run information of ``run_dir``'s checkpoint, refused when it is another run's (another
    model, dataset, or QUAIL against not): its samples would be scored and reported under this
    run's ε, and a table run would estimate a fresh DP schema from the private rows. None when
    the folder has no checkpoint (the callers that need one say so)."""
    from lightning_dpgan.python_run_info import refuse_outside_python
    from lightning_dpgan.run import model_name
    from lightning_dpgan.sampling import read_run_info, verify_checkpoint_bytes

    checkpoint = run_dir / LAST_CHECKPOINT
    if not checkpoint.is_file():
        return None
    info = read_run_info(checkpoint)
    verify_checkpoint_bytes(checkpoint)  # a table run trusts its schema, split, digest and spend, unread otherwise
    refuse_outside_python(info, checkpoint, "evaluate")

    def described(model: Any, dataset: Any, quail: bool) -> str:
        return f"--model {model} --dataset {dataset}" + (" (QUAIL)" if quail else "")

    ours = (model_name(config), config["data"]["name"], config["model"].get("name") == QUAIL)
    theirs = (info.get("model"), info.get("dataset"), "quail" in info)
    if theirs != ours:
        raise ValueError(f"{checkpoint} is a checkpoint of {described(*theirs)}, but {run_dir / 'config.yaml'} is a run "
                         f"of {described(*ours)}: the checkpoint is not this run's. Put back the run's own checkpoint, "
                         "or evaluate the folder the checkpoint came from")
    return info


def evaluate_run(
    run_dir: str | Path,
    data_dir: str | None = None,
    n_synthetic: int | None = None,
    cnn_epochs: int | None = None,
    seed: int = 0,
    device: str | None = None,
    split: str = "test",
    real_baseline: bool = False,
) -> dict[str, Any]:
    """Evaluate the run in ``run_dir`` on its held-out ``split``, write its
    :data:`~lightning_dpgan.run_folder.EVALUATION_FILES` entry there (and, for the test split,
    ``report.md`` and ``report/``) and return its content; an earlier evaluation's files are
    replaced, and the user told so. ``n_synthetic``, ``cnn_epochs`` (default
    :data:`DEFAULT_CNN_EPOCHS`) and ``device`` (default cpu) are an image run's: refused for a
    table run, which is scored on its ``synthetic.csv`` as written. ``real_baseline`` (images) also
    trains the CNN on as many real training images, for the accuracy the synthetic ones fall short of."""
    run_dir = Path(run_dir)
    said_warnings.clear()
    privacy_path = run_dir / "privacy.json"
    privacy = read_run_file(privacy_path, json.loads) if privacy_path.is_file() else None
    if privacy is not None and not isinstance(privacy, dict):
        raise ValueError(f"{privacy_path} is damaged (not a privacy report): restore it from the run, or rerun train")
    if privacy is not None:
        check_privacy_figures(privacy_path, privacy)
    def refuse_options_this_run_cannot_take(datamodule: Any) -> None:
        if getattr(datamodule, "kind", "image") != "image":
            refuse_image_options(run_dir, n_synthetic=n_synthetic, cnn_epochs=cnn_epochs, device=device,
                                 real_baseline=real_baseline or None)
        check_held_out_split(split, datamodule.hparams.dev_fraction, datamodule.name)

    with _sole_evaluation(run_dir):
        datamodule = load_run_datamodule(run_dir, data_dir, refuse_options_this_run_cannot_take, privacy)
        cnn_epochs = DEFAULT_CNN_EPOCHS if cnn_epochs is None else cnn_epochs
        device = "cpu" if device is None else device
        held_out = datamodule.held_out(split)
        shutil.rmtree(run_dir / STAGED_FIGURES, ignore_errors=True)  # a failed evaluation's leftovers
        try:
            return _evaluate_and_write(run_dir, datamodule, held_out, privacy, n_synthetic, cnn_epochs, seed, device,
                                       split, real_baseline)
        finally:  # published by then, or a failure's: either way nothing is left half-way
            shutil.rmtree(run_dir / STAGED_FIGURES, ignore_errors=True)


#: held by the evaluation of a run folder while it runs (:func:`_sole_evaluation`)
EVALUATION_LOCK = ".evaluate.lock"


@contextmanager
def _sole_evaluation(run_dir: Path) -> Iterator[None]:
    """Refuse a second ``evaluate`` of a folder while one runs: both stage their figures in one
    place and write the same files, so each would publish a report beside the other's figures.
    An OS lock (released when the process ends, however it ends); none where the OS has no
    ``fcntl`` or the folder is missing (refused by name later)."""
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None
    if fcntl is None or not (run_dir / "config.yaml").is_file():  # not a run: refused by name, with no lock file left
        yield
        return
    with open(run_dir / EVALUATION_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            raise ValueError(f"another evaluate of {run_dir} is running: wait for it to end (two at once would mix "
                             "their reports)") from error
        yield


#: ``evaluation.json``'s ``privacy_note``: the file sits beside privacy.json and copies its epsilon and
#: delta, which are the synthetic data's, not the file's (report.md says the same in its own words)
NOT_COVERED_BY_EPSILON = ("these measures are read from the real rows without noise: not covered by epsilon (the "
                          "epsilon and delta here are the synthetic data's). Keep this file with the data holder; "
                          "do not publish it")
#: The note of an audit's trial: its epsilon and delta are the claim the audit tests, not a guarantee.
NOT_COVERED_AUDIT_TRIAL = ("these measures are read from the real rows without noise: not covered by epsilon. This run "
                           "is an audit trial: the epsilon and delta here are the claim the audit tests, not a guarantee "
                           "for its synthetic data. Keep this file with the data holder; publish neither it nor this "
                           "run's synthetic data")
def after(sentence: str, note: str) -> str:
    """``note`` as the sentence after ``sentence``: the notes start in lower case, read alone."""
    return f"{sentence} {note[:1].upper()}{note[1:]}"


#: Put before the note where synthetic.csv is not the table privacy.json names (its SHA-256).
NOT_THE_RECORDED_TABLE = ("synthetic.csv is not the table privacy.json was written for (its SHA-256 differs): the "
                          "epsilon and delta here are not its own if it was copied in from another run or edited.")
#: The note of a run without privacy.json (interrupted, or failed): there are no figures to point at.
NOT_COVERED_NO_FIGURES = ("these measures are read from the real rows without noise: not covered by any epsilon "
                          "(this run has no privacy.json, so none is stated here). Keep this file with the data holder; "
                          "do not publish it")


#: epochs of G-PATE's evaluation CNN on an image run's synthetic images (``--cnn-epochs``)
DEFAULT_CNN_EPOCHS = 10


def _fixed_seed_sources(run_dir: Path, privacy: dict[str, Any] | None) -> list[str]:
    """The fixed-seed draws of the run: privacy.json's, else its checkpoint's (a run without
    privacy.json, or one whose noise_source was edited, still drew them)."""
    from lightning_dpgan.sampling import read_checkpoint, strategy_segments

    sources = fixed_seed_sources_in_report(privacy) if privacy is not None else []
    if not sources and (run_dir / LAST_CHECKPOINT).is_file():
        sources = fixed_seed_sources(strategy_segments(read_checkpoint(run_dir / LAST_CHECKPOINT)))
    return sources


def refuse_image_options(run_dir: Path, **given: Any) -> None:
    """An image run's options given for a table run, which would be ignored in silence: its
    synthetic.csv is scored as written (as many rows as it holds), by scikit-learn models."""
    flags = [{**IMAGE_EVALUATE_OPTIONS, **IMAGE_EVALUATE_SWITCHES}[name] for name, value in given.items() if value is not None]
    if flags:
        raise ValueError(
            f"{', '.join(flags)} {'is' if len(flags) == 1 else 'are'} for image runs (the images drawn and the evaluation "
            f"CNN); {run_dir} is a table run, scored on its synthetic.csv as written: drop {' and '.join(flags)}."
            + (f" To score another number of rows, move its synthetic.csv aside and write them in its place: python -m "
               f"lightning_dpgan sample --checkpoint {run_dir / LAST_CHECKPOINT} -n N --out {run_dir / 'synthetic.csv'}"
               if given.get("n_synthetic") is not None else ""))


def _evaluate_and_write(run_dir: Path, datamodule: Any, held_out: Any, privacy: dict[str, Any] | None,
                        n_synthetic: int | None, cnn_epochs: int, seed: int, device: str, split: str,
                        real_baseline: bool = False) -> dict[str, Any]:
    """:func:`evaluate_run`'s work: the figures are drawn into a staging folder and take
    ``report/``'s place only once ``evaluation.json`` is written, so a failure midway leaves the
    earlier evaluation's files as they were, not new figures beside old figures."""
    from lightning_dpgan.evaluation.report import epsilon_figure, render_report, write_report_text

    figures: dict[str, str] = {}
    report = split == "test"  # a dev score is a tuning aid: no report to overwrite the test one's
    other_table = False  # synthetic.csv is not the table privacy.json names
    if getattr(datamodule, "kind", "image") == "image":
        results = _evaluate_images(run_dir, datamodule, held_out, n_synthetic, cnn_epochs, seed, device, real_baseline)
        if (run_dir / "samples.png").is_file():  # a row per class where the generator draws labelled images
            figures["Samples (one row per class)" if "utility/cnn_accuracy" in results else "Samples"] = "samples.png"
    else:
        # said first (scoring takes minutes), and in evaluation.json's note
        other_table = (run_dir / "synthetic.csv").is_file() and _warn_of_a_synthetic_table_train_did_not_write(
            run_dir, privacy)
        results = _evaluate_table(run_dir, datamodule, held_out, seed, figures if report else None)
    results["held_out_split"] = split
    # what the figures were drawn with: another seed moves every one (the CNN, the classifiers, the attack)
    results["seed"] = seed
    if getattr(datamodule, "kind", "image") == "image":
        results["device"] = device
    results["privacy_note"] = (NOT_COVERED_NO_FIGURES if privacy is None else
                               NOT_COVERED_AUDIT_TRIAL if privacy.get("audit_trial") else NOT_COVERED_BY_EPSILON)
    if other_table:
        results["privacy_note"] = after(NOT_THE_RECORDED_TABLE, results["privacy_note"])
    if not (privacy or {}).get("audit_trial") and (sources := _fixed_seed_sources(run_dir, privacy)):
        fixed = f"This run is not private: {not_for_release(sources)}."
        warn(f"{run_dir}: {fixed}")
        results["privacy_note"] = after(fixed, results["privacy_note"])
    # every evaluation.json has both keys (a script reads them alike): null without privacy.json
    results = {"epsilon": None if privacy is None else privacy.get("epsilon"),
               "delta": None if privacy is None else privacy.get("delta"), **accounting_figures(privacy), **results}
    if privacy is None:  # an interrupted or failed run: its report must not read as a finished one's
        warn(f"{run_dir} has no privacy.json (the run did not finish writing its outputs): "
             "the report states no privacy guarantee")
    results = {key: _plain(value) for key, value in results.items()}
    if "utility/synthetic_label_classes" in results:
        _warn_of_missing_label_classes(results, datamodule.schema)
    if report:
        epsilon_plot = epsilon_figure(run_dir / "logs" / "metrics.csv")
        if epsilon_plot is not None:
            figures = {"Privacy spent over training": _save(epsilon_plot, run_dir, "epsilon.png"), **figures}
        elif privacy and privacy.get("epsilon") is not None:
            print("evaluate: note: no epsilon-over-steps figure: it is drawn from the CSV logger's step log "
                  "(logs/metrics.csv), and this run logged elsewhere (--logger tensorboard or wandb: see their "
                  "dashboards) or logged no epsilon", file=sys.stderr)
    replaced = [name for name in (EVALUATION_FILES[split], *(("report.md",) if report else ())) if (run_dir / name).exists()]
    text = render_report(run_dir, results, privacy, figures, said_warnings) if report else None
    write_json(run_dir / EVALUATION_FILES[split], results)
    if text is not None:
        _publish_figures(run_dir)
        write_report_text(run_dir, text)
    if replaced:
        print(f"evaluate: replaced the earlier {' and '.join(replaced)} of {run_dir}", file=sys.stderr)
    return results


def _warn_of_a_synthetic_table_train_did_not_write(run_dir: Path, privacy: dict[str, Any] | None) -> bool:
    """A ``synthetic.csv`` other than the one ``privacy.json`` was written for (its
    ``synthetic_sha256``; reports from before it was kept have none): copied in from another run,
    or edited, its scores would sit beside an epsilon that is not its own. Drawn again from this
    run's checkpoint (``sample --out``), it is covered by the same guarantee, and sample
    records its digest there (:func:`~lightning_dpgan.sampling.record_redrawn_table`). Returns
    whether it warned."""
    recorded = (privacy or {}).get("synthetic_sha256")
    if recorded is None or file_sha256(run_dir / "synthetic.csv") == recorded:
        return False
    warn(f"{run_dir / 'synthetic.csv'} is not the table privacy.json was written for (its SHA-256 differs from "
         "privacy.json's synthetic_sha256; sample, drawing it again from this run's checkpoint, keeps that in step): "
         "copied in from another run or edited, the epsilon beside its scores is not its own")
    return True


def _warn_of_missing_label_classes(results: dict[str, Any], schema: Any) -> None:
    """A synthetic table whose label lost a class scores setting B by construction, not by skill:
    with one class left every classifier predicts it (AUROC 0.5, the figure PATE-GAN's and
    DPGAN's collapsed runs report), so say so where the figure is read."""
    present = results["utility/synthetic_label_classes"]
    if present >= schema.label_column.width:
        return
    consequence = ("every classifier trained on it (setting B) is degenerate: it predicts that class, so its "
                   "AUROC is 0.5 by construction" if present == 1 else
                   "the classifiers trained on it (setting B) never predict the missing ones")
    warn(f"the synthetic label {schema.label!r} holds {present} of its "
         f"{schema.label_column.width} classes: {consequence}")


#: Fewer held-out rows of a class than this, and the AUROCs rest on a handful of rows: said.
THIN_CLASS_ROWS = 10


def _warn_of_a_thin_held_out_class(real_test: pd.DataFrame, schema: Any) -> dict[str, int]:
    """The held-out rows' count per class, with a warning where a class has none (AUROC, AUPRC and
    SRA of settings A and B are then undefined, n/a, and accuracy is that share) or fewer than
    :data:`THIN_CLASS_ROWS` (the AUROCs rest on those few rows): a rare class, as credit's frauds,
    in a small file. The split is not stratified, by design (docs/privacy.md)."""
    counts = {str(category): count for category, count in schema.label_class_counts(real_test).items()}
    absent = [name for name, count in counts.items() if count == 0]
    thin = {name: count for name, count in counts.items() if 0 < count < THIN_CLASS_ROWS}
    if absent:
        warn(f"the {len(real_test)} held-out rows hold no row of class "
             f"{', '.join(map(repr, absent))} of the label {schema.label!r}: the AUROC and AUPRC of settings A "
             "and B are undefined there (n/a), and accuracy is the other classes' share. Hold out more rows "
             "(--data.test_fraction) or train on a larger file")
    elif thin:
        listed = ", ".join(f"{count} of class {name!r}" for name, count in thin.items())
        warn(f"the {len(real_test)} held-out rows hold only {listed} (label {schema.label!r}): "
             "the AUROCs of settings A and B rest on those few rows")
    return counts


def _warn_of_unfitted_classifiers(settings: dict[str, Any]) -> None:
    """Classifiers that could not learn from a table with both classes (a collapsed generator's
    repeated rows), or learned the same prediction for every row, are scored as a constant
    prediction, AUROC 0.5: said, so that a 0.5 is read as what the table did to them. (A table of
    one class has its own warning.)"""
    for setting, result in settings.items():
        unfitted = {name: scores["degenerate_reason"] for name, scores in result["per_classifier"].items()
                    if scores["degenerate"] and scores["degenerate_reason"] != "one label class"}
        if unfitted:
            listed = "; ".join(f"{name} {reason}" for name, reason in unfitted.items())
            warn(f"setting {setting}: {listed}. Each is scored as a constant prediction "
                 "(AUROC 0.5; undefined where the test rows hold one class), kept in the averages")


def _publish_figures(run_dir: Path) -> None:
    """The staged figures become ``report/``, the earlier evaluation's figures going with it."""
    from lightning_dpgan.evaluation.report import FIGURES

    shutil.rmtree(run_dir / FIGURES, ignore_errors=True)
    staged = run_dir / STAGED_FIGURES
    if staged.is_dir():
        staged.rename(run_dir / FIGURES)


#: where an evaluation's figures are drawn before they replace ``report/`` (:func:`_publish_figures`)
STAGED_FIGURES = ".report-staged"


def _save(figure: Any, run_dir: Path, name: str) -> str:
    """Save a report figure (staged until the evaluation is written); return its path relative to
    the run folder once published, under ``report/``."""
    from lightning_dpgan.evaluation.report import FIGURES, save_figure

    save_figure(figure, run_dir / STAGED_FIGURES / name)
    return f"{FIGURES}/{name}"


def _evaluate_images(run_dir: Path, datamodule: Any, held_out: Any, n: int | None, cnn_epochs: int, seed: int,
                     device: str, real_baseline: bool = False) -> dict[str, Any]:
    from lightning_dpgan.evaluation.images import cnn_accuracy
    from lightning_dpgan.evaluation.membership import membership_inference
    from lightning_dpgan.sampling import check_memory_for_images, draw_images, load_module

    module = load_module(run_dir / LAST_CHECKPOINT).to(device)
    train_images, train_labels = datamodule.train_dataset.tensors
    test_images, test_labels = held_out.tensors
    n = n or len(train_images)
    check_memory_for_images(n, module, remedy="give a smaller -n")  # as sample does: it drew on until memory ran out
    torch.manual_seed(seed)
    say_stage(f"drawing {n} synthetic images")
    labels = module.balanced_labels(n)
    # drawn on the evaluation device (G-PATE's 60,000 images took 21 s on 2 CPU threads)
    synthetic = _as_published(draw_images(module, n, labels))
    labels = None if labels is None else labels.cpu()
    results: dict[str, Any] = {"synthetic_records": n}
    if labels is not None:
        _warn_of_classes_not_drawn(labels, module.num_classes)
        say_stage(f"utility: the CNN, {cnn_epochs} epoch{'' if cnn_epochs == 1 else 's'} on the synthetic images, tested on "
                  "the real ones")
        cnn = cnn_accuracy(synthetic, labels, test_images, test_labels, epochs=cnn_epochs, seed=seed, device=device)
        results.update({"utility/cnn_accuracy": cnn["accuracy"], "utility/cnn_epochs": cnn_epochs})
        if real_baseline:
            results.update(_real_baseline(train_images, train_labels, held_out, n, cnn, cnn_epochs, seed, device))
    else:  # said, or a --cnn-epochs given goes unused in silence
        warn("the generator draws unlabelled images (--model.conditional false): no CNN accuracy, which trains on "
             "labelled synthetic images; the membership attack alone is scored"
             + (", and --real-baseline, its real-data counterpart, is not either" if real_baseline else ""))
    say_stage("risk: the membership attack")
    attack = membership_inference(synthetic, train_images, test_images, seed=seed)
    return {**results, **_risk(attack)}


def _real_baseline(train_images: torch.Tensor, train_labels: torch.Tensor, held_out: Any, n: int,
                   synthetic: dict[str, Any], cnn_epochs: int, seed: int, device: str) -> dict[str, Any]:
    """The same CNN, schedule and seed trained on ``n`` real training images instead (all of them
    where ``n`` is more; a seeded draw where fewer), tested on the same held-out ones: the
    accuracy the synthetic images are measured against, and the gap."""
    from lightning_dpgan.evaluation.images import cnn_accuracy

    kept = min(n, len(train_images))
    chosen = torch.randperm(len(train_images), generator=torch.Generator().manual_seed(seed))[:kept]
    say_stage(f"utility: the same CNN on {kept} real training images, for comparison")
    test_images, test_labels = held_out.tensors
    real = cnn_accuracy(train_images[chosen], train_labels[chosen], test_images, test_labels, epochs=cnn_epochs,
                        seed=seed, device=device)
    return {"utility/cnn_accuracy_real": real["accuracy"], "utility/cnn_real_records": kept,
            "utility/difference_cnn_accuracy": real["accuracy"] - synthetic["accuracy"]}


def _as_published(images: torch.Tensor) -> torch.Tensor:
    """The drawn images clamped to [-1, 1], as ``sample`` and samples.png write them: a generator
    whose output activation is not tanh can draw past the pixel range, which the CNN refuses."""
    outside = float((images.abs() > 1).float().mean())
    if outside:
        warn(f"{outside:.2%} of the generated pixels lie outside [-1, 1] (the generator's output activation is not "
             "tanh): scored clamped to the pixel range, as sample and samples.png write them")
    return images.clamp(-1, 1)


def _warn_of_classes_not_drawn(labels: torch.Tensor, num_classes: int) -> None:
    """Fewer images than classes (``evaluate -n``) leave classes out of the CNN's training set:
    it never predicts them, and its accuracy is at most the drawn classes' share of the test set."""
    drawn = int(labels.unique().numel())
    if drawn < num_classes:
        warn(f"the {len(labels)} synthetic images hold {drawn} of the {num_classes} classes: the CNN never predicts "
             f"the others, so its accuracy is at most the drawn classes' share of the test images. Draw "
             f"{num_classes} or more (-n)")


def _evaluate_table(run_dir: Path, datamodule: Any, held_out: pd.DataFrame, seed: int,
                    figures: dict[str, str] | None) -> dict[str, Any]:
    """The table measures against ``held_out``; the report's figures drawn into ``figures``
    unless it is None."""
    synthetic_path = run_dir / "synthetic.csv"
    if not synthetic_path.is_file():  # a run killed before its end writes it
        checkpoint = run_dir / LAST_CHECKPOINT
        remedy = (f": continue the run ({continue_command(run_dir)}), or draw the table "
                  f"from its last checkpoint ({command_line('sample')} --checkpoint {checkpoint} -n N --out "
                  f"{synthetic_path}; without the run's privacy.json its report states no guarantee)") if checkpoint.is_file() else (
                  ": it has no checkpoint either; train the run again")
        raise FileNotFoundError(f"{run_dir} has no synthetic.csv (the run did not finish){remedy}")

    def save(figure: Any, title: str, name: str) -> None:
        figures[title] = _save(figure, run_dir, name)

    synthetic = read_synthetic_table(synthetic_path, datamodule.schema)
    return evaluate_table(datamodule, synthetic, seed, save if figures is not None else None, held_out=held_out,
                          progress=say_stage, source=synthetic_path)


def read_synthetic_table(path: Path, schema: Any) -> pd.DataFrame:
    """The run's synthetic table, its categorical columns as ``schema``'s categories (read as
    text, then matched: a CSV holding ``0``/``1`` categories would otherwise read as numbers),
    refused by its own name when it is not one ``train`` wrote (unreadable, empty, other
    columns, missing values): else the error would read as if the real data were at fault."""
    from lightning_dpgan.data.csv_missing import missing_spellings
    from lightning_dpgan.data.schema import as_schema_categories

    columns = schema.names
    def refuse(problem: str) -> ValueError:
        return ValueError(f"{path} {problem}: it is not a synthetic table as train writes it; write it again "
                          f"with: {rewrite_command(path)}")

    try:
        text = [c.name for c in schema.columns if not c.is_numeric]
        table = pd.read_csv(path, dtype=dict.fromkeys(text, str), keep_default_na=False,
                            na_values=missing_spellings(columns, text))
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise refuse(f"cannot be read as a CSV table ({' '.join(str(error).split())})") from error
    missing, extra = [c for c in columns if c not in table.columns], [c for c in table.columns if c not in columns]
    if missing or extra:
        raise refuse(f"has other columns than the dataset's (missing {missing}, unexpected {extra})")
    if table.empty:
        raise refuse("has no rows")
    if table.isna().any().any():
        gaps = table.isna().any(axis=1)
        if gaps.sum() == 1 and gaps.iloc[-1]:  # a copy or a write cut short within its last line
            raise refuse(f"has its last row cut short (missing values in columns "
                         f"{sorted(table.columns[table.iloc[-1].isna()])}): the file was truncated")
        raise refuse(f"has missing values in columns {sorted(table.columns[table.isna().any()])}")
    return as_schema_categories(table, schema)


def rewrite_command(path: Path) -> str:
    """The command that writes a run's synthetic table ``path`` again from the run's checkpoint."""
    return (f"{command_line('sample')} --checkpoint {shlex.quote(str(path.parent / LAST_CHECKPOINT))} -n N "
            f"--out {shlex.quote(str(path))} --overwrite")


def refuse_unencodable(synthetic: pd.DataFrame, schema: Any, source: Path | None = None) -> None:
    """Refuse a synthetic table the schema cannot encode whole (a table made elsewhere, or
    edited). An infinite value would be clipped to a bound. For a category outside the schema,
    the measures that encode rows (classifiers, WD, JSD, Diff-Corr, pMSE, membership) would
    leave those rows out while the counting ones (TV, invented share) keep them: the figures
    would describe two different tables, and none would say so. ``source``: a run's
    ``synthetic.csv`` the table was read from, named in the remedy (else RUN stands for it)."""
    from lightning_dpgan.data.schema import SchemaError

    # the data's remedies (declare a column otherwise in the schema) would change the run: a
    # synthetic table is written again instead
    again = f"it is not as train writes it: write it again with {rewrite_command(source or Path('RUN/synthetic.csv'))}"
    try:
        schema.validate_frame(synthetic)  # columns, missing and infinite values, types
    except SchemaError as error:
        raise ValueError(f"the synthetic table cannot be scored: {error.problem}; {again}") from error
    try:
        _, report = schema.encode(synthetic, unknown="error")
    except SchemaError as error:
        raise ValueError(f"the synthetic table cannot be scored: {error.problem}. Most measures encode rows by the "
                         f"dataset's schema and would leave those rows out; {again}") from error
    clipped = {name: counts["below"] + counts["above"] for name, counts in report.clipped.items()
               if counts["below"] + counts["above"]}
    if clipped:  # train never writes such values: a table made elsewhere, or edited
        warn(f"the synthetic table holds values outside the schema's bounds (per column: {clipped}); "
             "they are scored clipped to the bounds, as training encodes its rows")


def evaluate_table(datamodule: Any, synthetic: pd.DataFrame, seed: int = 0,
                   save: Callable[[Any, str, str], None] | None = None,
                   held_out: pd.DataFrame | None = None,
                   progress: Callable[[str], None] | None = None, source: Path | None = None) -> dict[str, Any]:
    """The table measures of :func:`evaluate_run` for ``synthetic`` against the datamodule's
    real train split and ``held_out`` (default: its test split) (also used for tables made
    elsewhere: the benchmark's peers). ``save(figure, title, file_name)`` keeps the report
    figures; without it none are drawn. ``progress(stage)`` is told as each stage starts.
    ``source``: the run's ``synthetic.csv`` it was read from, for a refusal's remedy."""
    from lightning_dpgan.evaluation import fidelity
    from lightning_dpgan.evaluation.membership import membership_inference
    from lightning_dpgan.evaluation.ranking import feature_importance_agreement, synthetic_ranking_agreement
    from lightning_dpgan.evaluation.report import auroc_figure, correlation_figure, marginals_figure
    from lightning_dpgan.evaluation.utility import (REGRESSION_METRICS, regression_utility, settings_abc,
                                                    utility_differences)

    schema = datamodule.schema
    refuse_unencodable(synthetic, schema, source)
    real_train = datamodule.train_frame
    real_test = datamodule.test_frame if held_out is None else held_out
    tell = progress or (lambda stage: None)
    results: dict[str, Any] = {"synthetic_records": len(synthetic)}
    if schema.label_kind == "continuous":
        tell(f"utility: the regressors, trained on the real rows, then on the {len(synthetic)} synthetic ones")
        real = regression_utility(real_train, real_test, schema, seed=seed)
        synth = regression_utility(synthetic, real_test, schema, seed=seed)
        difference = utility_differences(real, synth)
        for metric in real["average"]:
            results[f"utility/real_{metric}"] = real["average"][metric]
            results[f"utility/synthetic_{metric}"] = synth["average"][metric]
            results[f"utility/difference_{metric}"] = difference["average"][metric]
        for kind, result in (("real", real), ("synthetic", synth), ("difference", difference)):
            for regressor, scores in result["per_regressor"].items():
                results.update({f"utility/{kind}_{metric}/{regressor}": scores[metric] for metric in REGRESSION_METRICS})
    else:
        tell(f"utility: the classifiers of settings A, B and C (real and {len(synthetic)} synthetic rows)")
        settings = settings_abc(real_train, synthetic, real_test, schema, seed=seed)
        _warn_of_unfitted_classifiers(settings)
        for name, count in _warn_of_a_thin_held_out_class(real_test, schema).items():
            results[f"utility/held_out_rows_{name}"] = count  # one slash: not a per-classifier measure in report.md
        for name, result in settings.items():
            for metric, value in result["average"].items():
                results[f"utility/{name}_{metric}"] = value
            for classifier, scores in result["per_classifier"].items():  # for subsets (Adult's four)
                results.update({f"utility/{name}_{metric}/{classifier}": scores[metric] for metric in ("auroc", "auprc")})
        for metric, value in utility_differences(settings["A"], settings["B"])["average"].items():
            results[f"utility/difference_{metric}"] = value
        # read off the release itself: how many label classes setting B's classifiers could learn
        results["utility/synthetic_label_classes"] = int(synthetic[schema.label].nunique())
        if schema.label_kind == "binary":  # AUPRC and F1 score this class; the schema's order decides it
            results["utility/positive_class"] = str(schema.label_column.categories[1])
        auroc = {setting: {k: v["auroc"] for k, v in settings[setting]["per_classifier"].items()} for setting in "AC"}
        results["utility/sra"] = synthetic_ranking_agreement(auroc["A"], auroc["C"])
        if save is not None:
            save(auroc_figure({name: result["per_classifier"] for name, result in settings.items()}),
                 "Classifiers trained on real vs synthetic data", "auroc.png")
    if schema.label_kind in ("binary", "continuous"):
        results["utility/feature_agreement"] = feature_importance_agreement(real_train, synthetic, schema)["agreement"]
    tell("fidelity: the columns' distances, correlations and pMSE")
    wasserstein = fidelity.wasserstein_per_column(real_train, synthetic, schema)
    jsd = fidelity.jensen_shannon_per_column(real_train, synthetic, schema)
    propensity = fidelity.pmse(real_train, synthetic, schema, seed=seed)
    tree_propensity = fidelity.pmse(real_train, synthetic, schema, model="cart", seed=seed)
    results.update({
        "fidelity/wasserstein_mean": _mean(wasserstein.values()),
        "fidelity/jsd_mean": _mean(jsd.values()),
        **{f"fidelity/wasserstein/{column}": value for column, value in wasserstein.items()},
        **{f"fidelity/jsd/{column}": value for column, value in jsd.items()},
        "fidelity/correlation_difference": fidelity.correlation_difference(real_train, synthetic, schema),
        "fidelity/pmse": propensity.get("pmse"),
        "fidelity/pmse_ratio": propensity.get("pmse_ratio"),
        "fidelity/pmse_cart": tree_propensity.get("pmse"),
        "fidelity/pmse_cart_ratio": tree_propensity.get("pmse_ratio"),
        "fidelity/tv_mean": _mean(fidelity.total_variation_per_column(real_train, synthetic, schema).values()),
        "fidelity/invented_share_mean": _mean(fidelity.invented_share_per_column(real_train, synthetic, schema).values()),
    })
    members, _ = schema.encode(real_train, unknown="blank")  # every row, as training encoded it
    non_members, _ = schema.encode(real_test, unknown="blank")
    released, _ = schema.encode(synthetic)
    if save is not None:
        save(marginals_figure(real_train, synthetic, schema), "Marginals, real vs synthetic", "marginals.png")
        save(correlation_figure(members.numpy(), released.numpy()), "Correlations of the encoded features", "correlations.png")
    tell("risk: the membership attack")
    return {**results, **_risk(membership_inference(released, members, non_members, seed=seed))}


def _risk(attack: dict[str, Any]) -> dict[str, Any]:
    return {
        "privacy_risk/mia_auc": attack["auc"],
        "privacy_risk/mia_records_per_group": attack["records_per_group"],
        "privacy_risk/median_dcr_members": attack["median_dcr_members"],
        "privacy_risk/median_dcr_non_members": attack["median_dcr_non_members"],
    }


def _mean(values: Any) -> float | None:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(finite) / len(finite) if finite else None


def _plain(value: Any) -> Any:
    """JSON-safe: floats stay floats, NaN becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
