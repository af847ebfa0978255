"""What a checkpoint written by a Trainer built in Python records, so that ``sample`` reads it.

``train`` gives its module the run's information before fitting (``run.py``): the model and
dataset names, and for a table the schema and DP encoding its records decode with. A module fitted
on a Trainer built by hand had none, and ``sample`` refused its checkpoints. So at ``setup`` a
module without run information takes what ``sample`` needs from the parts it trains with
(:func:`python_run_info`), for the models and kinds of data ``train`` knows. What it records is
what ``train``'s checkpoints hold on it: public, or a DP release already paid for (the datamodule's
``privacy_cost``, which the strategy composed into the report).

Marked ``"trained_by": "python"``: ``train --resume`` and ``evaluate`` refuse such a checkpoint by
name (:func:`refuse_outside_python`), since it lacks the run folder, split and release settings
they check a run against; from Python it resumes with ``trainer.fit(..., ckpt_path=...)``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_dpgan import registry
from lightning_dpgan.run_folder import data_files

#: ``run_info["trained_by"]`` of a checkpoint a Trainer built in Python wrote
TRAINED_BY_PYTHON = "python"


def python_run_info(module: Any, datamodule: Any, strategy: Any) -> dict[str, Any]:
    """The run information ``sample`` reads, or ``{}`` where it could not rebuild or decode the
    records: a model class ``train`` does not name (a subclass of one), a datamodule of no kind it
    knows or a table datamodule without a schema (one's own), or QUAIL's synthesizer alone (``exclude_label``: its rows need the label model, which
    the module does not know)."""
    model = registry.name_of("model", type(module))
    kind = getattr(datamodule, "kind", None)
    hparams = getattr(datamodule, "hparams", None) or {}
    if model is None or kind not in ("image", "table") or hparams.get("exclude_label"):
        return {}
    if kind == "table" and not (hasattr(datamodule, "schema") and hasattr(datamodule, "privacy_cost")):
        return {}  # a table datamodule of one's own: no schema to decode its records with
    info: dict[str, Any] = {"model": model, "dataset": registry.name_of("dataset", type(datamodule)),
                            "privacy": getattr(strategy, "name", "none"), "trained_by": TRAINED_BY_PYTHON,
                            # a CSV's files and a built-in dataset's in its data folder, which sample --out refuses
                            "data_files": data_files(hparams, datamodule)}
    if kind == "table":
        info.update(table_decoding_info(datamodule))
    return info


def table_decoding_info(datamodule: Any) -> dict[str, Any]:
    """What a table run's checkpoint records for ``sample`` to decode its records, ``train``'s and
    a Python fit's alike: the schema (public, or paid for with the DP-bounds budget), the
    preprocessing's cost, and the DP modes and frequencies of a mode-specific encoding."""
    info = {"schema": datamodule.schema.to_dict(), "preprocessing_cost": datamodule.privacy_cost()}
    if getattr(datamodule, "table_transformer", None) is not None:
        info["table_transformer"] = datamodule.table_transformer.to_dict()
    return info


def trained_in_python(info: dict[str, Any]) -> bool:
    """Whether run information is :func:`python_run_info`'s (a Trainer built in Python wrote it)."""
    return info.get("trained_by") == TRAINED_BY_PYTHON


#: What to do instead, from Python, of what refuse_outside_python refuses
PYTHON_REMEDIES = {
    "--resume": "resume it from Python (a fresh module and strategy, trainer.fit(..., ckpt_path=...))",
    "evaluate": ("evaluate from Python: lightning_dpgan.evaluate.evaluate_table(data, data.decode(model.sample(n))) "
                 "with the module loaded from it and the datamodule it trained on"),
}


def refuse_outside_python(info: dict[str, Any], path: str | Path, use: str) -> None:
    """Refuse ``use`` (``--resume``, ``evaluate``) of a checkpoint a Trainer built in Python wrote."""
    if trained_in_python(info):
        raise ValueError(f"{path} was written by a Trainer built in Python, not by train: {use} needs train's run "
                         f"folder and settings. Instead, {PYTHON_REMEDIES[use]}; sample draws from it as from "
                         "train's checkpoints")
