"""One training run: assembles datamodule, module, privacy strategy, callbacks and logger
from a resolved configuration, fits them, and writes the run's files."""
from __future__ import annotations

import io
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import Any

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import LambdaCallback
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_dpgan import registry
from lightning_dpgan.argument_types import mismatches
from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping
from lightning_dpgan.callbacks.checkpoint import LastCheckpoint
from lightning_dpgan.callbacks.finite_generator import FiniteGeneratorGuard
from lightning_dpgan.callbacks.same_release import SameRelease, release_digest
from lightning_dpgan.callbacks.samples import SampleGrid, sample_grid
from lightning_dpgan.callbacks.step_limit import StepLimit, stop_floor_refusal
from lightning_dpgan.callbacks.strategy import (DEFAULT_DELTA, NON_FLOAT32_WEIGHT_PRECISIONS, QUAIL_LABEL_MODEL, delta_origin,
                                               overfit_refusal)
from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO
from lightning_dpgan.command_name import command_line
from lightning_dpgan.config import (
    DEFAULT_QUAIL_SYNTHESIZER,
    FLAG_KEYS,
    INVOCATION_ONLY,
    MODEL_PROVIDED,
    PRIVACY_PROVIDED,
    QUAIL,
    ConfigError,
    init_arguments,
    section_arguments,
    with_absolute_paths,
)
from lightning_dpgan.ddp import PRIVATE_TRAINER_STRATEGIES, PrivateDDPStrategy, resolve_strategy
from lightning_dpgan.ddp_sigterm import use_collective_free_sigterm
from lightning_dpgan.distributed import launched_as_follower, leave_process_group, rows_per_process, say_once_per_machine
from lightning_dpgan.error_text import SET_BY, first_line
from lightning_dpgan.lineage import extended_lineage, new_run_id
from lightning_dpgan.loggers import build_logger, check_logger, log_run_config, publish_run
from lightning_dpgan.data.download import default_data_dir
from lightning_dpgan.data.schema import TableSchema, encoding_layout
from lightning_dpgan.data.table_transformer import TableTransformer
from lightning_dpgan.outputs import file_sha256, write_csv_chunks, write_json, write_png, write_torch, write_yaml
from lightning_dpgan.privacy.noise_source import fixed_seed_sources_in_report, not_for_release
from lightning_dpgan.privacy.validation import validate_delta
from lightning_dpgan.python_run_info import table_decoding_info
from lightning_dpgan.run_folder import (AUDIT_TRIAL_NOTE, LAST_CHECKPOINT, RELEASED_SCHEMA, continue_command, data_files,
                                        refuse_holding_the_data_files)
from lightning_dpgan.sampling import read_run_info, resume_checkpoint, synthetic_row_chunks, table_labeler
from lightning_dpgan.sigterm import on_sigterm
from lightning_dpgan.versions import software_versions, source_commit

#: rank 0's released preprocessing, for the other processes of a DDP run (in the run folder)
RANK_ZERO_RELEASE = ".released_preprocessing.pt"
#: Run information about the private rows themselves, kept in the checkpoint only: never in the
#: release file the other ranks read, which a killed run leaves in the run folder.
PRIVATE_RUN_INFO = ("train_rows_digest",)
#: how long a DDP process waits for it (other nodes start on their own)
FOLLOWER_WAIT_S = 600
DEFAULT_MAX_STEPS = 1000
#: Trainer options of automatic optimization, with their off value: every module steps its own
#: optimizers (a GAN's alternating updates), where Lightning refuses them only once fit starts,
#: after a DP schema estimate or histogram has spent its budget
AUTOMATIC_OPTIMIZATION_OPTIONS = {"accumulate_grad_batches": 1, "gradient_clip_val": 0}


def model_name(config: dict[str, Any]) -> str:
    """The registered model the run trains: the one named, or QUAIL's synthesizer."""
    name = config["model"]["name"]
    if name != QUAIL:
        return name
    return config.get(QUAIL, {}).get("synthesizer") or DEFAULT_QUAIL_SYNTHESIZER


def model_class(config: dict[str, Any]) -> type:
    return registry.lookup("model", model_name(config)).load()


def privacy_name(config: dict[str, Any], model_cls: type) -> str:
    """The strategy a run uses: ``--privacy`` if given, else the model's own default."""
    return config["privacy"]["name"] or getattr(model_cls, "default_privacy", "none")


def restore_released_schema(datamodule: Any, checkpoint: str | Path, info: dict[str, Any] | None = None) -> None:
    """Give a datamodule the preprocessing its run released, instead of estimating it again
    from the private rows: a ``csv`` schema estimated without a schema file, and a mode-specific
    encoding's DP modes. A fresh DP estimate would spend its budget a second time, unaccounted,
    and could encode the data differently. ``info``: the checkpoint's run information when
    already read (it is loaded only when needed otherwise)."""
    if not (getattr(datamodule, "estimates_schema", False) or getattr(datamodule, "fits_encoding", False)):
        return
    datamodule.restore_releases(info if info is not None else read_run_info(checkpoint))


#: what a resume under another schema is told to do (check_same_schema's default remedy)
RESUME_SCHEMA_REMEDY = ("resume with the schema it was trained with: the schema file its run's config.yaml names, or "
                        "none where that run estimated its schema under DP (the checkpoint holds it). A built-in "
                        "dataset's schema is this version's: a checkpoint trained under another version's bounds "
                        "cannot continue, train anew")


def check_same_schema(schema: TableSchema, saved: dict[str, Any] | None, checkpoint: str | Path,
                      remedy: str = RESUME_SCHEMA_REMEDY) -> None:
    """Refuse to use a table run's checkpoint under another public schema than it was trained on:
    the same network width would silently encode and decode the columns differently (other
    bounds, categories, order), and its synthetic table would be scored under columns it was
    not decoded with. ``remedy`` says what to do instead (resuming, by default)."""
    if saved is None:
        return
    normal = encoding_layout(json.loads(json.dumps(saved, default=list)))
    current = encoding_layout(json.loads(json.dumps(schema.to_dict(), default=list)))
    if normal == current:  # a column's step only rounds decoded values: it may differ
        return
    columns = {c["name"]: c for c in normal.get("columns", [])}
    differing = [c["name"] for c in current.get("columns", []) if columns.get(c["name"]) != c] or ["label / layout"]
    raise ConfigError(f"the checkpoint {checkpoint} was trained on another schema (differing: {', '.join(differing)}): "
                      f"{remedy}")


def check_same_encoding(datamodule: Any, saved: dict[str, Any] | None, checkpoint: str | Path) -> None:
    """Refuse to resume a mode-specific table run whose encoding came out differently: with DP
    modes the released one is restored, but bounds modes are rebuilt from this run's
    declarations (``--data.mixed``, ``log_columns``, ``discrete_columns``, ...), and other
    declarations give other slots under the same checkpoint's network."""
    current = getattr(datamodule, "table_layout", None)  # None: no mode-specific encoding
    if saved is None or current is None:
        return
    if TableTransformer.from_dict(saved).layout() != current:
        raise ConfigError(f"the checkpoint {checkpoint} was trained on another table encoding: resume with the "
                          "--data encoding settings it was trained with (its run's config.yaml has them)")


def check_same_preprocessing_cost(current: dict[str, Any], saved: dict[str, Any] | None, checkpoint: str | Path) -> None:
    """Refuse to resume a table run whose preprocessing spent budget (a DP-estimated schema, DP
    modes) when this run's data settings report another cost: the checkpoint's networks were
    trained on that preprocessing, so its ε is spent whatever this run reads. A schema file given
    where the checkpoint estimated one would report 0 and train on past the target."""
    spent = (float(saved.get("epsilon", 0.0)), float(saved.get("delta", 0.0))) if saved else (0.0, 0.0)
    if spent == (0.0, 0.0):
        return  # nothing spent before: this run's own preprocessing is composed as usual
    now = (float(current.get("epsilon", 0.0)), float(current.get("delta", 0.0)))
    if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(spent, now)):
        return
    parts = saved.get("parts")
    what = (", ".join(f"{name}: epsilon {part.get('epsilon', 0):g}, {part.get('mechanism', '?')}" for name, part in parts.items())
            if parts else saved.get("mechanism", "?"))
    raise ConfigError(
        f"the checkpoint {checkpoint} spent epsilon {spent[0]:g}, delta {spent[1]:g} on preprocessing ({what}), and this "
        f"run's data settings report epsilon {now[0]:g}, delta {now[1]:g}: its budget would be left out of the total. "
        "Resume with the data settings it was trained with (its run's config.yaml has them; without --data.schema "
        "when it estimated its schema: the released one is reused at no further cost)"
    )


#: datamodule settings that shape what a table's DP preprocessing released: the estimated schema
#: of a CSV without a schema file, and the DP modes. A resume reuses the checkpoint's release, so
#: another value would go unused. (``calibrate_marginals`` post-processes the release on resume
#: too, and is the resuming run's to choose.) The DP modes were fitted to the columns' declared
#: roles as well: another ``log_columns`` leaves the encoding's layout as it was, and went unused
#: while config.yaml recorded it.
SCHEMA_RELEASE_SETTINGS = ("bounds_epsilon", "bounds_delta")
MODES_RELEASE_SETTINGS = ("modes_epsilon", "max_modes", "histogram_bins", "histogram_threshold", "log_columns", "mixed",
                          "discrete_columns")


def release_settings(datamodule: Any, quail: Any) -> dict[str, Any]:
    """The settings behind a table run's released preprocessing and QUAIL's label model, as
    ``{"data.modes_epsilon": 0.1, "quail.epochs": 10, ...}``: the values in effect, defaults
    included, of the releases the run makes (none for a schema file, or modes from the bounds)."""
    hparams = dict(getattr(datamodule, "hparams", None) or {})
    keys = [*(SCHEMA_RELEASE_SETTINGS if getattr(datamodule, "bounds_epsilon", None) is not None else ()),
            *(MODES_RELEASE_SETTINGS if hparams.get("encoding") == "mode-specific" and hparams.get("modes") == "dp" else ())]
    settings = {f"data.{key}": getattr(datamodule, key, hparams.get(key)) for key in keys}
    if quail is not None:
        trained = quail.settings
        settings.update({"quail.label_model": quail.label_model, "quail.hidden": list(quail.hidden),
                         "quail.epochs": trained.epochs, "quail.batch_size": trained.batch_size,
                         "quail.lr": trained.lr, "quail.max_grad_norm": trained.max_grad_norm,
                         # what the stored model is (checkpoints written before these were kept
                         # are resumed only with the same values: _build_labeler's checks)
                         "quail.split": quail.split, "quail.scale_share": trained.scale_share,
                         "quail.labels": quail.labels, "quail.log_features": list(quail.log_features),
                         "quail.log_label": quail.log_label})
    return {key: value for key, value in settings.items() if value is not None}


def flag_for(dotted: str) -> str:
    """The flag that sets a dotted setting: its own flag where it has one (``quail.split``:
    ``--quail-split``), else the dotted override."""
    flags = [flag for flag, key in FLAG_KEYS.items() if key == dotted]
    return f"--{flags[0].replace('_', '-')}" if flags else f"--{dotted}"


def setting_value_text(value: Any) -> str:
    """``value`` as a flag takes it: ``true``, ``a,b`` (``[]`` for none), ``0.1``, ``{a: [0.0]}``."""
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "[]"
    return str(value)


def adopt_release_settings(config: dict[str, Any], current: dict[str, Any], saved: dict[str, Any] | None) -> list[str]:
    """On resume, the checkpoint's settings of the preprocessing and label model it reuses (at no
    further cost) replace this run's in ``config``, so that its config.yaml records what was used
    (a raised --epsilon resolves other presets: DP-CTGAN's modes_epsilon is 0.01 at 0.1, 0.1 at 1).
    Returns a note for each that differed. Checkpoints written before the settings were kept: none."""
    notes = []
    for key, value in sorted((saved or {}).items()):
        if key in current and current[key] != value:
            notes.append(f"{flag_for(key)} {setting_value_text(current[key])} ({SET_BY}) gave way to the checkpoint's "
                         f"{setting_value_text(value)}: its release is reused")
        section, name = key.split(".", 1)
        if section in config and isinstance(config[section], dict):
            config[section][name] = value
    return notes


#: datamodule settings that decide which records are trained on (and which are held out for the
#: test and dev splits): a resumed run must keep them, or records scored as held out were trained on
SPLIT_SETTINGS = ("dev_fraction", "split_seed", "test_fraction")


def split_settings(datamodule: Any) -> dict[str, Any]:
    """The datamodule's :data:`SPLIT_SETTINGS` (those it has and does not ignore: Adult's official
    split takes no ``test_fraction``), kept in the checkpoint's run information."""
    ignored = getattr(datamodule, "ignored_split_settings", ())
    return {key: datamodule.hparams[key] for key in SPLIT_SETTINGS if key in datamodule.hparams and key not in ignored}


#: What to do about a split that differs from the checkpoint's, when resuming (:func:`check_same_split`).
RESUME_SPLIT_REMEDY = "Resume with the same data settings (its run's config.yaml has them), or drop --resume to start anew"


def check_same_split(current: dict[str, Any], saved: dict[str, Any] | None, checkpoint: str | Path,
                     remedy: str = RESUME_SPLIT_REMEDY) -> None:
    """Refuse to use a checkpoint with other training records than it trained on: a changed (or
    dropped) ``--data.dev_fraction`` would train on records a dev score then counts as unseen,
    and an evaluation would count unseen records as members. ``remedy`` says what to do instead."""
    saved = {"dev_fraction": 0.0, **(saved or {})}  # a checkpoint from before dev splits held none out
    differing = [key for key in current if key in saved and saved[key] != current[key]]
    if differing:
        changes = ", ".join(f"--data.{key} {saved[key]} (this run: {current[key]})" for key in differing)
        raise ConfigError(f"the checkpoint {checkpoint} trained on other records: it had {changes}. {remedy}")


def check_accelerator(accelerator: Any, devices: Any) -> None:
    """Refuse, by its flag and before any row is read, an accelerator this machine lacks or more
    GPUs than it has (Lightning says so only when the trainer is built: "No supported gpu backend
    found!")."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    available = {"cuda": CUDAAccelerator.is_available(), "mps": MPSAccelerator.is_available()}
    available["gpu"] = available["cuda"] or available["mps"]
    if isinstance(accelerator, str) and accelerator in available and not available[accelerator]:
        kind = "GPU" if accelerator == "gpu" else accelerator.upper()
        raise ConfigError(f"--accelerator {accelerator}: this machine has no {kind} that torch can use: use "
                          "--accelerator cpu, or auto")
    if accelerator in ("gpu", "cuda") and available["cuda"] and isinstance(devices, int):
        present = CUDAAccelerator.auto_device_count()
        if devices > present:
            raise ConfigError(f"--devices {devices}: this machine has {present} GPU{'s' if present != 1 else ''}")


def check_machines_can_meet(num_nodes: Any) -> None:
    """Refuse ``--num-nodes N`` (N > 1) where no machine could find machine 0: without
    ``MASTER_ADDR`` or a cluster (SLURM, torchrun, ...) that says where it is, Lightning has each
    machine wait for the others at 127.0.0.1 (its own), with no message but "Initializing
    distributed", for as long as the user lets it."""
    from lightning.pytorch.plugins.environments import (LSFEnvironment, MPIEnvironment, SLURMEnvironment,
                                                        TorchElasticEnvironment)

    if not isinstance(num_nodes, int) or num_nodes < 2 or os.environ.get("MASTER_ADDR"):
        return
    clusters = (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment, MPIEnvironment)  # (Kubeflow's sets MASTER_ADDR)
    if not any(cluster.detect() for cluster in clusters):
        raise ConfigError(
            f"--num-nodes {num_nodes} trains on {num_nodes} machines, but MASTER_ADDR is not set: run the same "
            "command on each machine with MASTER_ADDR (machine 0's address), MASTER_PORT and its own NODE_RANK "
            "(0 on machine 0) in the environment, or under a cluster launcher (SLURM, torchrun); for one "
            "machine leave --num-nodes out")


def _as_count(value: Any) -> int | None:
    """A device or node count as Lightning reads it: a number, its text ("2"), a list of device
    indices or their text ("0,1", "1,": one device, index 1); None for ``auto``, -1 (all) and
    anything else Lightning decides."""
    if isinstance(value, str):
        text = value.strip()
        if "," in text:
            value = [part for part in text.split(",") if part.strip()]
        elif text.lstrip("-").isdigit():
            value = int(text)
    if isinstance(value, (list, tuple)):
        return len(value) or None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def resumed_seed(seed: int, steps: int) -> int:
    """The public stream's seed for a run resumed after ``steps`` training steps: reseeded from
    ``--seed`` alone, a resume replayed the first segment's latent draws (and the dropout masks and
    penalty weights seeded from them) step for step. Derived from both, so that resuming one
    checkpoint twice still draws the same. Public: ``--seed`` and the step count are."""
    import numpy as np

    return int(np.random.SeedSequence([seed, steps]).generate_state(1)[0])


def planned_processes(options: dict[str, Any]) -> int | None:
    """The processes ``--devices`` and ``--num-nodes`` ask for, or None where Lightning decides
    (``auto``, -1)."""
    devices = _as_count(options.get("devices"))
    if devices is None:
        return None
    return devices * (_as_count(options.get("num_nodes", 1)) or 1)


def check_model_fits_dataset(model_cls: type, dataset_cls: type, dataset: str) -> None:
    """Refuse a table-only model (one that needs a table encoding) on an image dataset."""
    if getattr(model_cls, "table_encoding", None) and getattr(dataset_cls, "kind", "image") != "table":
        raise ConfigError(f"this model generates tables; dataset '{dataset}' is images. Choose a table dataset "
                          "(adult, king, kaggle-credit, csv)")


def select_table_encoding(model_cls: type, data_args: dict[str, Any]) -> None:
    """Give a model that needs a particular table encoding (CTGAN's mode-specific one) that
    encoding, or refuse a ``--data.encoding`` it cannot train on."""
    needed = getattr(model_cls, "table_encoding", None)
    if needed is None:
        return
    chosen = data_args.setdefault("encoding", needed)
    if chosen != needed:
        raise ConfigError(f"this model needs --data.encoding {needed}, got {chosen}")


def shared_with_other_ranks(run_info: dict[str, Any]) -> dict[str, Any]:
    """What rank 0 writes for the other DDP ranks to read: its run information (the DP
    preprocessing releases, the schema, QUAIL's label model) without :data:`PRIVATE_RUN_INFO`,
    which each rank computes from its own rows and only the checkpoint keeps."""
    return {key: value for key, value in run_info.items() if key not in PRIVATE_RUN_INFO}


#: Trainer arguments a run sets itself, with the setting that chooses each
RUN_OWNED_TRAINER_OPTIONS = {
    "max_steps": "--max-steps", "max_epochs": "--max-epochs", "callbacks": "the privacy strategy and the run's own",
    "logger": "--logger", "default_root_dir": "--output-dir", "enable_checkpointing": "--checkpoint_every_n_steps",
}


#: The least value of a numeric Trainer argument, where it is not 0: counts of devices, machines
#: and accumulated batches start at 1 (as --devices; Lightning's "-1, every device" fails on a CPU
#: with a TypeError, and num_nodes 0 only once the trainer is built, after the data was read), and
#: -1 sanity validation steps means all of them. Lightning takes log_every_n_steps -5 or
#: gradient_clip_val -1 in silence. Run-owned arguments (max_steps -1) are refused before this.
TRAINER_OPTION_FLOORS = {"devices": 1, "num_nodes": 1, "accumulate_grad_batches": 1, "num_sanity_val_steps": -1}


def trainer_options_below_their_floor(options: dict[str, Any]) -> list[str]:
    """One message per numeric Trainer option below the least value it means something at."""
    def floor(key: str) -> int:
        return TRAINER_OPTION_FLOORS.get(key, 0)

    return [f"trainer.{key} must be at least {floor(key)}{' (-1: all)' if floor(key) < 0 else ''}, got {value!r}"
            for key, value in options.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < floor(key)]


def train_batch_limit_refusal(limit: Any) -> str | None:
    """Why ``--trainer.limit_train_batches`` is no limit Lightning trains under, or None: 0 (no
    batch), NaN or infinite, or a fraction above 1 that is no whole count. Lightning refused the
    last two itself, but only as it started, after a table's DP releases had drawn from the rows."""
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        return None
    if limit == 0:
        return ("trainer.limit_train_batches 0 trains no batch: leave it out, or give a count of batches (>= 1) or a "
                "fraction of each epoch in (0, 1]")
    if not math.isfinite(limit) or (isinstance(limit, float) and limit > 1 and not limit.is_integer()):
        return (f"trainer.limit_train_batches {limit!r} is neither a count of batches (a whole number >= 1) nor a "
                "fraction of each epoch in (0, 1]")
    return None


def max_time_refusal(max_time: Any) -> str | None:
    """Why ``--trainer.max_time`` is no duration Lightning's ``Timer`` can keep, or None. Asked of
    the Timer itself, whose own errors name neither the flag nor a form that works (and a
    mapping of text, ``{minutes: x}``, ended in a TypeError's traceback)."""
    if max_time is None:
        return None
    from lightning.pytorch.callbacks import Timer
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    try:
        duration = Timer(duration=max_time).time_remaining()
    except (MisconfigurationException, TypeError, ValueError) as error:
        return (f"trainer.max_time {max_time!r} is not a duration ({first_line(error)}): give DD:HH:MM:SS, e.g. "
                "00:01:30:00, or a mapping such as {hours: 1, minutes: 30}")
    if duration is not None and duration <= 0:
        return f"trainer.max_time {max_time!r} leaves no time to train: give a duration above zero"
    return None


def check_trainer_keys(options: dict[str, Any]) -> None:
    """Every ``trainer.*`` option is an argument of Lightning's Trainer, with a value of its type."""
    unknown = sorted(set(options) - set(init_arguments(L.Trainer)))
    if unknown:
        raise ConfigError(f"unknown Lightning Trainer argument(s): {', '.join('trainer.' + k for k in unknown)}")
    wrong = mismatches("trainer", options, L.Trainer)  # Lightning compares "abc" with 0 deep inside, or keeps "maybe"
    if wrong:
        raise ConfigError("; ".join(wrong))


def check_section_keys(config: dict[str, Any]) -> None:
    """The keys of the model, data, privacy, QUAIL and trainer sections, and their values' types,
    checked against what takes them, as a run checks them, but with nothing built or read: the
    benchmark checks each cell's settings so before its first cell runs (a typo after ``--``
    would otherwise fail every cell, one after the other)."""
    model_cls = model_class(config)
    if config["model"]["name"] == QUAIL:
        from lightning_dpgan.quail import QUAIL as QuailSettings

        section_arguments({**config, QUAIL: config.get(QUAIL) or {}}, QUAIL, QuailSettings)
    section_arguments(config, "model", model_cls, provided=MODEL_PROVIDED)
    section_arguments(config, "data", registry.lookup("dataset", config["data"]["name"]).load())
    strategy_cls = registry.lookup("privacy", privacy_name(config, model_cls)).load()
    if strategy_cls is not None:
        strategy_cls.check_compatible(model_cls)
        section_arguments(config, "privacy", strategy_cls, provided=PRIVACY_PROVIDED)
    check_trainer_keys(config["trainer"])


def steps_saved_in(checkpoint: Path) -> int | None:
    """The training steps a run's checkpoint holds, or None where it has none it can read."""
    from lightning_dpgan.sampling import CheckpointError, checkpoint_steps

    try:
        return checkpoint_steps(checkpoint)
    except CheckpointError:
        return None


def last_periodic_save_sentence(output_dir: Path, config: dict[str, Any], stopped: str, why_unsaved: str) -> str:
    """What a stop that saved nothing keeps (the run's last periodic checkpoint, or nothing), and
    how to go on from it."""
    checkpoint = output_dir / LAST_CHECKPOINT
    saved = steps_saved_in(checkpoint)
    if saved is None:
        settings = f"--config {output_dir / 'config.yaml'} " if (output_dir / "config.yaml").is_file() else ""
        # config.yaml keeps no --resume: without it the rerun would start afresh and spend the budget again
        resumed = f"--resume {config['resume']} " if config.get("resume") else ""
        every = config["checkpoint_every_n_steps"]
        when = (f"before its first periodic checkpoint (every --checkpoint_every_n_steps {every} steps" if every else
                f"with no periodic checkpoint (--checkpoint_every_n_steps {every}")
        return (f"{stopped}, {when}; {why_unsaved}): there is nothing to continue. "
                f"Train again with: {command_line('train')} {settings}{resumed}--output-dir {output_dir} --overwrite")
    return (f"{stopped}: {checkpoint} holds {saved} of them, its last periodic save, with the privacy accountant; "
            f"privacy.json, metrics.json and the synthetic data are written when the run ends. Continue it with: "
            f"{continue_command(output_dir)}")


def refuse_settings_of_the_other_kind(config: dict[str, Any], image: bool) -> None:
    """Settings of the other kind of data: ``--num_synthetic`` sets the rows of a table run's
    synthetic.csv (an image run writes no table: samples.png's grid is ``--sample_columns``, and
    it was recorded in config.yaml unused); ``--model.arch dcgan`` builds convolutions a table's
    records have no shape for. Asked by train once the dataset is known, and by the benchmark
    harness of each cell."""
    if image and config.get("num_synthetic") is not None:
        raise ConfigError(f"--num_synthetic {config['num_synthetic']} sets the rows of a table run's "
                          f"synthetic.csv, and {config['data']['name']} is an image dataset: drop it (given by a --config "
                          "file, --num_synthetic null takes it back; draw "
                          f"images with: {command_line('sample')} --checkpoint RUN/checkpoints/last.ckpt -n N "
                          "--out images.npz)")
    if not image and config["model"].get("arch") == "dcgan":  # the networks are built after a table's DP releases
        from lightning_dpgan.nets.factory import resolve_architecture

        resolve_architecture("dcgan", (1,))  # its refusal, before any row is read


#: what one neighbouring relation's guarantee protects, in words
NEIGHBOURS_IN_WORDS = {"add-remove": "one record added to or removed from the training records",
                       "replace-one": "one record of the training records replaced by another"}


def rounded_up(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits, rounded up: a guarantee printed shorter than it
    was proven must not claim less privacy loss (4.99133 as 4.992, not 4.991)."""
    if not value > 0 or not math.isfinite(value):
        return f"{value:.{digits}g}"
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    # a figure at a printed value up to float noise (5e-6 + 5e-6) stays that value
    return f"{math.ceil(value * scale * (1 - 1e-12)) / scale:.{digits}g}"


def guarantee_statement(report: dict[str, Any], image: bool) -> str:
    """privacy.json's figures as the sentence a reader signs off on: what is protected, against
    which change of the data, what the figures take as public, and where the report's own keys
    say the figure is no guarantee (the PATE papers' data-dependent epsilon, a fixed noise seed,
    shuffled batches, an audit's trial). The report's keys say the rest."""
    epsilon, delta = report.get("epsilon"), report.get("delta")
    if not isinstance(epsilon, (int, float)) or not isinstance(delta, (int, float)):
        return "epsilon is unbounded: this run gives no (epsilon, delta) guarantee."
    relation = NEIGHBOURS_IN_WORDS.get(report.get("neighbours"), str(report.get("neighbours")))
    released = "what the run releases (the generator, its checkpoint's released parts and the synthetic data drawn from it)"
    if report.get("accounting") == "data-dependent":
        bound = report.get("epsilon_data_independent")
        held = (f"({rounded_up(bound, 4)}, {rounded_up(delta, 3)})-differential privacy of {released}"
                if isinstance(bound, (int, float))
                else "no figure")
        said = (f"epsilon {epsilon:.4g} is the PATE papers' data-dependent figure, itself computed from the private "
                f"votes: no (epsilon, delta) guarantee at that figure. What holds whatever the votes is {held}, "
                f"against {relation} (epsilon_data_independent; the note says what it leaves out)")
    else:
        said = f"({rounded_up(epsilon, 4)}, {rounded_up(delta, 3)})-differential privacy of {released} against {relation}"
    unit = ("A record is one training image" if image else
            "A record is one row of the file: a person with k rows is protected as a group of k records (about k "
            "times epsilon, by group privacy)")
    public = ("The number of training records (train_records) is taken as public" if image else
              "The number of training rows (train_records) is taken as public, as is a schema given as public (a "
              "DP-estimated one is a release counted in preprocessing)")
    caveats = []
    if sources := fixed_seed_sources_in_report(report):
        caveats.append(f"Not for release: {not_for_release(sources)}")
    if report.get("sampling") == "shuffle":
        caveats.append("Its batches were shuffled, not Poisson-sampled: epsilon is computed as if they were, common "
                       "practice but not a proven bound")
    if report.get("segments_stopped_on_the_votes"):
        caveats.append("Segments of it stopped on the votes: see the note")
    if report.get("audit_trial"):
        caveats.append(f"It is {report['audit_trial']}: not for release")
    if report.get("stopped_by") == "fast-dev-run":
        caveats.append("It is Lightning's fast_dev_run, a check of the code: not a run to publish")
    return ". ".join([said, unit, public, *caveats]) + "."


class Run:
    """Everything ``train`` does, in the order it does it."""

    def __init__(self, config: dict[str, Any], output_dir: Path, published_dir: Path | None = None) -> None:
        """``published_dir``: the folder that gets published and must not hold the data, where it
        is not ``output_dir`` (an audit's, which holds its trials' folders)."""
        self.config = config
        self.output_dir = output_dir
        self.published_dir = output_dir if published_dir is None else published_dir
        # the checkout's commit and state as the run starts (read once, then kept): read as the
        # report is written, a commit made during training was named as the code that trained
        source_commit()
        # first: on machines other than 0 the next lines wait for machine 0's release
        check_machines_can_meet(config["trainer"].get("num_nodes"))
        L.seed_everything(config["seed"], workers=True, verbose=False)
        #: the resume checkpoint's run information and the steps it holds (0 for a new run), read
        #: once; a damaged or foreign checkpoint is refused before anything is built
        self.resume_info, self.resumed_steps = (None, 0) if not config["resume"] else resume_checkpoint(
            config["resume"], model_name(config), config["data"]["name"], quail=config["model"]["name"] == QUAIL)
        if self.resumed_steps:  # the public draws go on from where the checkpoint left off, not from its start
            L.seed_everything(resumed_seed(config["seed"], self.resumed_steps), workers=True, verbose=False)
        self._check_resume_takes_steps()
        #: the runs this run's training went through, this one last (lineage.py): in the
        #: checkpoint and privacy.json, so that two branches resumed from one checkpoint show it
        self.lineage = extended_lineage(self.resume_info, self.resumed_steps, new_run_id())
        #: the preprocessing already released for this run (DP bounds, DP modes, QUAIL's label
        #: model): the checkpoint's on resume, rank 0's in the other processes of a DDP run
        self.released_info = self.resume_info if self.resume_info is not None else self._rank_zero_release()
        #: each process's training steps at the end (filled by ``_count_steps_per_rank``)
        self.steps_per_rank: list[int] | None = None
        #: synthetic.csv's rows per class of a categorical label (filled as it is written)
        self.synthetic_label_counts: dict[Any, int] | None = None
        self.quail = self._build_quail()
        self.datamodule = self._build_datamodule()
        refuse_holding_the_data_files(self.published_dir, self.datamodule)  # found where they lie, not read
        self._refuse_settings_of_the_other_kind()
        # the settings that need no data, checked before the model is built: its width may need a
        # DP release drawn from the rows (a DP-estimated schema, a mode-specific table's histogram)
        self.strategy = self._build_privacy()
        self._check_quail_is_private()
        if self.strategy is not None:
            self.strategy.check_model_class(model_class(self.config))
        self._check_trainer_options()
        self._check_model_settings_fit_dp_sgd()
        self._check_label_encoding_fits_the_model()
        self._check_preprocessing_leaves_a_budget()
        rows = self._check_settings_fit_the_rows()
        self._check_processes_share_the_work(rows)
        self.labeler = None
        try:  # the module's width may draw the DP releases: a refusal from here on says what they spent
            self.module = self._build_module()
            self._warn_of_unused_batch_size()
            self._warn_of_no_generator_update()
            if not config["max_steps"] and not config["max_epochs"]:
                config["max_steps"] = DEFAULT_MAX_STEPS
            self.trainer = self._build_trainer()  # its options are checked before the label model reads a row
            self._check_batch_size()  # after the trainer: a table's rows are shared among its processes
            self.labeler = self._build_labeler()
        except ValueError as error:
            self.note_spend_before_refusal(error)
            raise

    # ------------------------------------------------------------------ parts
    def _warn_of_unused_batch_size(self) -> None:
        """A teacher strategy's loader replaces the datamodule's: each teacher trains on
        ``--privacy.teacher_batch_size`` records a step, whatever ``--batch-size`` says."""
        from lightning_dpgan.callbacks.teachers import TeacherStrategy

        given = self.config["data"].get("batch_size")
        if not isinstance(self.strategy, TeacherStrategy) or given is None or given == self.strategy.teacher_batch_size:
            return
        used = self.strategy.teacher_batch_size or "its default"
        say_once_per_machine(f"train: warning: data.batch_size {given} (--batch-size, a config file or a preset) is "
                             f"not used by --privacy {self.strategy.name}: each teacher trains on "
                             f"--privacy.teacher_batch_size records a step ({used})")

    def _refuse_settings_of_the_other_kind(self) -> None:
        refuse_settings_of_the_other_kind(self.config, getattr(self.datamodule, "kind", "image") == "image")

    def _warn_of_no_generator_update(self) -> None:
        """A --max-steps that ends before the first generator update (one every
        ``--model.discriminator_steps`` training steps): said as training starts, not only at its
        end, after a private run spent its budget on the critic alone."""
        every, steps = self.module.hparams.get("discriminator_steps", 1), self.config["max_steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0 or steps >= every:
            return
        # the teacher models and GS-WGAN's N critics step the generator every training step
        if self.module.generator_updates_every_step(self.config["privacy"].get("num_critics")):
            return
        spend = " (a private run spends its budget on the critic all the same)" if self.strategy is not None else ""
        say_once_per_machine(f"train: warning: --max-steps {steps} ends before the first generator update, which comes "
                             f"after --model.discriminator_steps {every} training steps: the generator will take none, "
                             f"and its samples will be its random initialisation{spend}. Raise --max-steps to {every} "
                             "or more, or lower --model.discriminator_steps")

    def _check_quail_is_private(self) -> None:
        """QUAIL's budget split needs a target and a private synthesizer: refused before the other
        settings checks, whose remedies would not matter."""
        if self.quail is not None and (self.strategy is None or self.strategy.target_epsilon is None):
            raise ConfigError("QUAIL splits --epsilon between its label model and a private synthesizer: "
                              "give --epsilon, and a synthesizer with a privacy strategy")

    def _check_model_settings_fit_dp_sgd(self) -> None:
        """Refuse, before any row is read, model settings DP-SGD cannot bound a record's gradient
        under, all at once: a gradient penalty (per-record clipping cannot see the penalty's
        gradient) and CTGAN's packs (``pac`` > 1: one record in many packs). The strategy and the
        module refuse them too, but only once the DP modes were drawn, and QUAIL's label model
        trained, and one after the other."""
        if self.strategy is None or self.strategy.name != "dp-sgd":
            return
        from lightning_dpgan.callbacks.dp_sgd import GRADIENT_PENALTY_UNDER_DP_SGD
        from lightning_dpgan.modules.ctgan import pac_under_dp_sgd

        defaults = {name: parameter.default for name, parameter in init_arguments(model_class(self.config)).items()}
        settings = {**defaults, **self.config["model"]}
        refusals = []
        if isinstance(penalty := settings.get("gradient_penalty", 0.0), (int, float)) and penalty > 0:
            refusals.append(GRADIENT_PENALTY_UNDER_DP_SGD)
        if isinstance(pac := settings.get("pac", 1), int) and pac > 1:
            refusals.append(pac_under_dp_sgd(pac))
        if refusals:
            raise ConfigError("; ".join(refusals))

    def _check_label_encoding_fits_the_model(self) -> None:
        """Refuse, before any row is read, a continuous label encoded mode-specific (a scalar and
        its modes' one-hot) for dpsactgan, whose regressor predicts one scalar: the module refused
        it when built, after the DP histogram the encoding is fitted on had spent its budget."""
        from lightning_dpgan.modules.dpsactgan import DPSACTGAN, SCALAR_LABEL_ONLY

        hparams = getattr(self.datamodule, "hparams", None) or {}
        if not issubclass(model_class(self.config), DPSACTGAN) or hparams.get("label_encoding") != "mode-specific":
            return
        kind = getattr(self.datamodule, "label_kind", None)  # a CSV's, from its flags or schema file
        if kind is None and not getattr(self.datamodule, "estimates_schema", False):
            kind = self.datamodule.schema.label_kind  # a built-in table's public schema
        if kind == "continuous" and not hparams.get("exclude_label"):
            raise ConfigError(SCALAR_LABEL_ONLY.format(slots="a scalar and its modes' one-hot (mode-specific)"))

    def _check_preprocessing_leaves_a_budget(self) -> None:
        """Refuse, before any row is read, a budget that the releases made before training (a
        CSV's DP schema estimate, DP modes, QUAIL's label model) would use up from their settings
        alone. The strategy refuses it too, but only once they have spent it: a refused attempt
        would have spent privacy that no privacy.json records."""
        planned = getattr(self.datamodule, "planned_privacy_cost", None)
        if self.strategy is None or planned is None or self.released_info:
            return  # a resume's (or rank 0's) releases are made already: the strategy checks them
        from lightning_dpgan.callbacks.strategy import epsilon_parts, spend_less
        from lightning_dpgan.quail import label_model_budget

        delta = self.strategy.delta or DEFAULT_DELTA
        releases = {}
        if self.quail is not None:  # QUAIL needs a target epsilon (_check_quail_is_private)
            self.quail.check_share_certifiable(self.strategy.target_epsilon, delta, self.strategy.neighbours)
            label_epsilon, label_delta = label_model_budget(self.quail.split, self.strategy.target_epsilon, delta,
                                                            self.strategy.neighbours)
            releases[QUAIL_LABEL_MODEL] = {"epsilon": label_epsilon, "delta": label_delta,
                                             "mechanism": "planned label model"}
        spent = self.strategy.composed_preprocessing(planned(), releases)
        for budget, given in (("epsilon", self.strategy.target_epsilon), ("delta", delta)):
            if given is not None and spent[budget] >= given:  # no --epsilon (a noise multiplier given): delta alone
                parts = f" ({epsilon_parts(spent)})" if budget == "epsilon" else ""
                raise ConfigError(
                    f"preprocessing would spend {budget} {spent[budget]:g} of --{budget} {given:g} before training, "
                    f"leaving training nothing{parts}: raise --{budget}, or {spend_less(spent, budget)}. Refused "
                    "before any row was read: nothing was spent")

    def _check_settings_fit_the_rows(self) -> int | None:
        """Refuse, before any DP release reads a value, the settings the number of training rows
        rules out: δ ≥ 1/n, a DP-SGD batch, a teacher or critic count, or QUAIL's label-model batch
        above n. The strategy and the label model refuse them too, but only after a CSV's schema
        estimate, the DP modes or the label model had spent their budget (docs/privacy.md). The
        count is read off the file's split, not its values, and is public (``train_records``)."""
        count = getattr(self.datamodule, "training_row_count", None)
        if self.strategy is None or count is None:
            return None
        from lightning_dpgan.privacy.dp_label_model import check_label_model_batch

        rows = count()
        self.strategy.check_fits_records(rows, self.datamodule)
        if self.quail is not None:
            check_label_model_batch(self.quail.settings.batch_size, rows)
        self._check_first_step_fits(rows)
        return rows

    def _check_processes_share_the_work(self, rows: int | None) -> None:
        """Refuse, before any DP release reads a value, a number of processes the strategy cannot
        share a step among (DP-SGD's shuffled batches, the sanitizer's B, fewer teachers than
        processes): each process's setup refused it, after the releases had spent their budget.
        ``rows``: the training rows :meth:`_check_settings_fit_the_rows` counted (None for images)."""
        processes = planned_processes(self.config["trainer"])
        if self.strategy is None or processes is None or processes < 2:
            return
        self.strategy.check_processes(processes, getattr(self.datamodule.hparams, "batch_size", None), rows)

    def _check_first_step_fits(self, rows: int) -> None:
        """Refuse, before any DP release reads a value, a first training step the budget cannot
        pay for beside the releases' planned cost, where the settings price it
        (``strategy.first_step_epsilon``): the budget's own refusal comes as training starts,
        after the releases spent theirs. Priced low, so that no run refused here could have
        trained: the releases' planned epsilon without QUAIL's label model (which may spend
        less than its share), and the step at the whole delta (it costs more at less)."""
        target = self.strategy.target_epsilon
        planned = getattr(self.datamodule, "planned_privacy_cost", None)
        if target is None or planned is None or self.released_info:
            return
        defaults = {name: parameter.default for name, parameter in init_arguments(model_class(self.config)).items()}
        step = self.strategy.first_step_epsilon(rows, getattr(self.datamodule.hparams, "batch_size", None),
                                                {**defaults, **self.config["model"]},
                                                self.strategy._checked_delta(self.datamodule, rows))
        before = self.strategy.composed_preprocessing(planned())
        if step is None or before["epsilon"] + step <= target:
            return
        exact = self.quail is None and not before["delta"]  # else training's delta is less, and its step dearer
        raise ConfigError(f"{self.strategy.first_step_refusal(target, before['epsilon'] + step, exact)}"
                          f"{self.strategy.spent_before_training_note(before)} Refused before any DP release read "
                          "the rows: nothing was spent")

    def note_spend_before_refusal(self, error: ValueError) -> None:
        """Add to a refusal that came after DP releases had read the rows what they spent: a
        refused run writes no privacy.json, and a rerun draws (and pays for) them again. Not for
        a resume, whose releases are the checkpoint's (paid for once), nor for a first step too
        dear for the budget, whose refusal says it already (``BudgetTooSmallError``)."""
        from lightning_dpgan.callbacks.budget import BudgetTooSmallError
        from lightning_dpgan.callbacks.strategy import epsilon_parts
        from lightning_dpgan.privacy.composition import compose_costs

        if self.strategy is None or self.released_info is not None or isinstance(error, BudgetTooSmallError):
            return  # a run without privacy states no spend
        drawn = getattr(self.datamodule, "releases_drawn", dict)()
        label_model = {QUAIL_LABEL_MODEL: self.labeler.release} if getattr(self, "labeler", None) is not None else {}
        if not (drawn or label_model) or len(error.args) != 1 or not isinstance(error.args[0], str):
            return
        data = compose_costs(drawn) if drawn else {"epsilon": 0.0, "delta": 0.0, "mechanism": "none"}
        # in the strategy's neighbouring relation, as its --epsilon and --delta are (PATE's: replace-one)
        spent = self.strategy.composed_preprocessing(data, label_model)
        restated = (f"; restated for {self.strategy.neighbours} by group privacy from what each spent for add/remove "
                    "neighbours"
                    if "as_spent" in spent or any("as_spent" in part for part in (spent.get("parts") or {}).values())
                    else "")
        error.args = (f"{error.args[0].rstrip('. ')}. This run was refused after DP releases drawn from the training "
                      f"rows had spent epsilon {spent['epsilon']:.4g} and delta {spent['delta']:.3g} "
                      f"({epsilon_parts(spent)}{restated}): no privacy.json records a refused run, so count them as "
                      "spent on this data, and a rerun's as spent again",)

    def _check_batch_size(self) -> None:
        """Refuse, before anything is written, a batch size the networks cannot train on: one
        generated record a step for a generator with BatchNorm (the MLP generators'; PyTorch's
        "Expected more than 1 value per channel"), or a batch CTGAN's discriminator cannot cut
        into packs of ``pac``. Either failed at the first step, leaving a folder without a checkpoint."""
        if hasattr(self.strategy, "check_generated_batch"):  # PATE, G-PATE: one generated record per teacher record
            count = getattr(self.datamodule, "training_row_count", None)
            if count is not None:  # a table; images are checked as the strategy installs, before any vote
                self.strategy.check_generated_batch(self.module.generator_normalizes_batches, count())
        else:
            generated = (self.module.generated_batch_size
                         or getattr(getattr(self.datamodule, "hparams", None), "batch_size", None))
            if self.module.generator_normalizes_batches and isinstance(generated, int) and generated < 2:
                raise ConfigError(f"the {self.config['model']['name']} generator normalizes each batch (BatchNorm), which "
                                  f"needs at least 2 generated records a step, and this run generates {generated}: use "
                                  "--batch-size 2 or more")
        pac = getattr(getattr(self.module, "hparams", None), "pac", 1)  # under DP-SGD 1 (refused before otherwise)
        batch = getattr(getattr(self.datamodule, "hparams", None), "batch_size", None)
        if not (isinstance(pac, int) and pac > 1 and isinstance(batch, int)):
            return
        # CTGAN's discriminator judges packs of pac consecutive records: training would fail at
        # its first step, after the run folder was made
        rows = self._training_rows()
        if rows is not None and rows < batch and rows % pac:
            # the loader then gives every step all the rows (tabular.py's train_dataloader)
            processes = self.trainer.world_size
            table = (f"the training table has {rows} rows" if processes == 1 else
                     f"each of the {processes} processes reads {rows} of the training table's rows")
            raise ConfigError(f"{table}, fewer than --batch-size {batch} ({SET_BY}), so each step trains on all {rows}: not a "
                              f"multiple of the {model_name(self.config)} discriminator's pac = {pac} (it judges packs "
                              f"of {pac} records). Set --model.pac to a divisor of {rows} (1 always is), or train on "
                              "more rows")
        if batch % pac:
            multiple = max(pac, batch - batch % pac)
            raise ConfigError(f"--batch-size {batch} ({SET_BY}) is not a multiple of the {model_name(self.config)} discriminator's "
                              f"pac = {pac} (it judges packs of {pac} records): use --batch-size {multiple}, or set "
                              "--model.pac to a divisor of the batch size")

    def _training_rows(self) -> int | None:
        """The training rows each process reads for a table (every row trains, see ``__init__``),
        or None for images. From a count the run releases anyway, privacy.json's ``train_records``."""
        frame = getattr(self.datamodule, "train_frame", None)
        return None if self.is_image or frame is None else rows_per_process(len(frame), self.trainer.world_size)

    def _rank_zero_release(self) -> dict[str, Any] | None:
        """In a DDP process other than rank 0: what rank 0 released before training (read from
        the run folder). Preprocessing that spends budget must happen once -- a second draw
        would be a second, unaccounted release -- and every rank must encode the data alike."""
        if not launched_as_follower():
            return None
        path = self.output_dir / RANK_ZERO_RELEASE
        deadline = time.monotonic() + FOLLOWER_WAIT_S
        while not path.exists():  # on one node rank 0 wrote it before starting this process
            if time.monotonic() > deadline:
                raise ConfigError(f"rank 0 did not write {path} within {FOLLOWER_WAIT_S} s: with several nodes, "
                                  "--output-dir must be on a file system all of them share")
            time.sleep(1.0)
        content = path.read_bytes()
        self.release_digest = release_digest(content)  # checked against rank 0's once the processes can talk
        return torch.load(io.BytesIO(content), weights_only=False)

    def _build_quail(self) -> Any:
        """QUAIL's settings with ``--model quail``, checked before anything is read; else None."""
        if self.config["model"]["name"] != QUAIL:
            return None
        from lightning_dpgan.quail import QUAIL as QuailSettings

        self.config.setdefault(QUAIL, {})
        synthesizer = self.config[QUAIL].get("synthesizer")
        if synthesizer == QUAIL:
            raise ConfigError("--quail-synthesizer names the model that generates the features; it cannot be quail")
        if synthesizer is not None and synthesizer not in registry.MODELS:
            names = [name for name in registry.MODELS if name != QUAIL]
            private = [name for name in names if getattr(registry.MODELS[name].load(), "default_privacy", "none") != "none"]
            hint = registry.did_you_mean(synthesizer, names)
            raise ConfigError(f"--quail-synthesizer {synthesizer} is not a model.{hint} It takes a table model that "
                              f"trains privately: {', '.join(private)}; or {', '.join(n for n in names if n not in private)} "
                              "with a privacy strategy (--privacy dp-sgd, ...)")
        return QuailSettings(**section_arguments(self.config, QUAIL, QuailSettings))

    def _build_datamodule(self) -> L.LightningDataModule:
        section = self.config["data"]
        cls = registry.lookup("dataset", section["name"]).load()
        model_cls = model_class(self.config)
        check_model_fits_dataset(model_cls, cls, section["name"])
        if self.quail is not None and getattr(cls, "kind", "image") != "table":
            raise ConfigError(f"QUAIL labels table rows; dataset '{section['name']}' is images")
        args = section_arguments(self.config, "data", cls)
        select_table_encoding(model_cls, args)
        if "encoding" in args:
            section["encoding"] = args["encoding"]  # config.yaml then rebuilds the same datamodule
        if self.quail is not None:
            args["exclude_label"] = section["exclude_label"] = True  # the synthesizer never sees the label
        elif args.get("exclude_label"):
            raise ConfigError("--data.exclude_label leaves the label to QUAIL's label model: use it with --model quail")
        datamodule = cls(**args)
        table = getattr(datamodule, "kind", "image") == "table"
        public_schema = table and not getattr(datamodule, "estimates_schema", False)
        if self.resume_info is not None and public_schema:
            # known now: a resume under another schema is told which column and what to do before the
            # checkpoint's encoding is restored onto it (whose own check names neither)
            check_same_schema(datamodule.schema, self.resume_info.get("schema"), self.config["resume"])
        if self.released_info is not None:
            restore_released_schema(datamodule, self.config["resume"], self.released_info)
        if self.resume_info is not None:
            check_same_split(split_settings(datamodule), self.resume_info.get("split"), self.config["resume"])
            if table:
                if not public_schema:  # the schema the checkpoint's release restored
                    check_same_schema(datamodule.schema, self.resume_info.get("schema"), self.config["resume"])
                check_same_encoding(datamodule, self.resume_info.get("table_transformer"), self.config["resume"])
                check_same_preprocessing_cost(datamodule.privacy_cost(), self.resume_info.get("preprocessing_cost"),
                                              self.config["resume"])
                for note in adopt_release_settings(self.config, release_settings(datamodule, self.quail),
                                                   self.resume_info.get("release_settings")):
                    say_once_per_machine(f"train: note: {note}")
                if self.quail is not None:
                    self.quail = self._build_quail()  # with the checkpoint's label model settings
        return datamodule

    def _build_module(self) -> Any:
        cls = model_class(self.config)
        args = section_arguments(self.config, "model", cls, provided=MODEL_PROVIDED)
        if "table_layout" in init_arguments(cls):
            args["table_layout"] = self.datamodule.table_layout
        try:
            module = cls(data_shape=self.datamodule.data_shape, num_classes=self.datamodule.num_classes, **args)
        except TypeError as error:  # a nested setting the annotations cannot see, e.g. --model.generator_kwargs.foo
            raise ConfigError(f"model '{self.config['model']['name']}' refused its settings: {error}") from error
        empty = [name for name, parameter in module.named_parameters() if parameter.numel() == 0]
        if empty:  # torch builds a layer of width 0, and fails at the first batch, deep inside
            raise ConfigError(f"model '{self.config['model']['name']}' refused its settings: its layers "
                              f"{', '.join(empty[:4])} would have no units (a width or channel count of 0 in --model.*)")
        # The checkpoint's module is the synthesizer's: `sample` rebuilds it by this name.
        module.run_info = {"model": model_name(self.config), "dataset": self.config["data"]["name"],
                           "split": split_settings(self.datamodule), "privacy": self.config["privacy"]["name"]}
        if not self.is_image:
            # PRIVATE_RUN_INFO, the checkpoint's only: evaluate checks that the data it reads is what was trained on
            # (an image run's, once its files are downloaded: _record_lineage)
            module.run_info["train_rows_digest"] = self.datamodule.train_rows_digest()
            module.run_info.update(table_decoding_info(self.datamodule))
            module.run_info["release_settings"] = release_settings(self.datamodule, self.quail)
        if (self.resume_info or {}).get("audit_trial"):
            raise ConfigError(
                f"--resume {self.config['resume']} is the checkpoint of {self.resume_info['audit_trial']}. A trial is "
                "not continued: resumed, a trial that held the canary trains on without it, and the audit reads its "
                f"trials only as they end. Run the audit again ({command_line('audit')} ... --overwrite)")
        return module

    def mark_as_audit_trial(self) -> None:
        """Mark this run as an audit trial, in its checkpoints and privacy.json (``AUDIT_TRIAL_NOTE``)."""
        self.module.run_info["audit_trial"] = AUDIT_TRIAL_NOTE

    def default_delta(self) -> float | None:
        """``--delta``, else the dataset's own default where it has one (a built-in table whose
        public size puts 1/n below the strategies' 1e-5), else None: the strategy's default."""
        if self.config["delta"] is not None:
            return self.config["delta"]
        return getattr(self.datamodule, "default_delta", None)

    def _build_privacy(self) -> L.Callback | None:
        section = self.config["privacy"]
        name = privacy_name(self.config, model_class(self.config))
        section["name"] = name
        cls = registry.lookup("privacy", name).load()
        earlier = (self.resume_info or {}).get("privacy", "none")
        if cls is None and earlier != "none":
            raise ConfigError(
                f"the checkpoint {self.config['resume']} was trained with --privacy {earlier}: resumed with --privacy "
                "none, training would go on without privacy, and the model would carry no guarantee. Resume with "
                f"--privacy {earlier} and an --epsilon (its run's config.yaml holds both: pass it with --config)")
        if cls is None:
            if self.config["epsilon"] is not None or self.config["delta"] is not None:
                trained = model_name(self.config)
                subject = (f"QUAIL's synthesizer '{trained}'" if self.quail is not None else f"model '{trained}'")
                remedy = ("give a private --quail-synthesizer (dpctgan, pategan, gpate, ...), or a privacy strategy "
                          "for this one (--privacy dp-sgd, ...; --privacy none turns a private model's off)"
                          if self.quail is not None else
                          "choose a private model or a privacy strategy (see --help), or drop --epsilon/--delta "
                          "(a private model's preset sets them: for a non-private baseline, train the non-private "
                          "model it builds on, gan, wgan or ctgan)")
                targets = ", ".join(f"{key} {self.config[key]:g}" for key in ("epsilon", "delta")
                                    if self.config[key] is not None)
                raise ConfigError(
                    f"an epsilon/delta is set (by a flag, a config file or a preset: {targets}), but {subject} trains "
                    f"with --privacy none, so its output would carry no privacy guarantee: {remedy}.")
            settings = sorted(key for key in section if key != "name")
            if settings:  # e.g. --privacy.noise_multiplier without --privacy dp-sgd: no noise would be added
                raise ConfigError(
                    f"{', '.join('--privacy.' + key for key in settings)} set (by a flag, a config file or a preset), but "
                    f"model '{model_name(self.config)}' trains with --privacy none, which takes no settings: its output "
                    "would carry no privacy guarantee. Choose a privacy strategy (--privacy dp-sgd, ...; see --help) "
                    "or a private model, or drop those settings.")
            return None
        cls.check_compatible(model_class(self.config))  # before its keys: a preset's are for the model's own strategy
        args = section_arguments(self.config, "privacy", cls, provided=PRIVACY_PROVIDED)
        strategy = cls(target_epsilon=self.config["epsilon"], delta=self.default_delta(), **args)
        strategy.warn_at_end = False  # the run says it all when it ends (stop_sentence, untrained_reason)
        return strategy

    def _build_labeler(self) -> Any:
        """QUAIL's DP label model, trained now -- before the synthesizer, whose strategy then
        composes its measured cost -- or, on resume, restored from the checkpoint (it was
        paid for once and is not trained again)."""
        if self.quail is None:
            return None
        if self.released_info is not None:  # a QUAIL run's (resume_checkpoint made sure on resume)
            labeler = table_labeler(self.released_info)
        else:
            if not getattr(self.datamodule, "estimates_schema", False):  # a public schema: checked before any row is read
                from lightning_dpgan.quail import check_log_features, check_log_label

                check_log_features(self.datamodule.schema, self.quail.log_features)
                check_log_label(self.datamodule.schema, self.quail.log_label)
            self.datamodule.prepare_data()
            self.datamodule.setup("fit")
            delta = validate_delta(self.strategy.delta or DEFAULT_DELTA, self.datamodule.train_size,
                                   origin=delta_origin(self.strategy.delta))
            # the synthesizer's own refusal, before the label model spends its share on a run refused anyway
            self.strategy.check_batch_size(self.datamodule.hparams.batch_size, self.datamodule.train_size)
            labeler = self.quail.fit_labeler(
                self.datamodule, self.strategy.target_epsilon, delta, self.strategy.neighbours, seed=self.config["seed"])
        if self.quail.split != labeler.cost["split"]:
            raise ConfigError(f"the checkpoint's label model was trained with --quail-split {labeler.cost['split']}, "
                              f"not {self.quail.split}: resume with the same split")
        trained_share = labeler.cost.get("scale_share", 0.0)  # older checkpoints: the raw target
        if labeler.schema.label_column.is_numeric and self.quail.settings.scale_share != trained_share:
            raise ConfigError(f"the checkpoint's label model was trained with --quail.scale_share {trained_share}, "
                              f"not {self.quail.settings.scale_share}: resume with --quail.scale_share {trained_share}")
        if self.quail.labels != labeler.labels:  # the checkpoint's, which `sample` will use
            raise ConfigError(f"the checkpoint's label model draws its labels as --quail.labels {labeler.labels}, "
                              f"not {self.quail.labels}: resume with --quail.labels {labeler.labels}")
        if self.quail.log_features != labeler.log_features:
            theirs, ours = (",".join(names) or "[]" for names in (labeler.log_features, self.quail.log_features))
            raise ConfigError(f"the checkpoint's label model reads --quail.log_features {theirs} in log space, not "
                              f"{ours}: resume with --quail.log_features {theirs}")
        if self.quail.log_label != labeler.log_label:
            theirs = str(labeler.log_label).lower()
            raise ConfigError(f"the checkpoint's label model learnt the label {'in log space' if labeler.log_label else 'min-max'}, "
                              f"not as --quail.log_label {str(self.quail.log_label).lower()} asks: resume with "
                              f"--quail.log_label {theirs}")
        self.strategy.add_prior_release(QUAIL_LABEL_MODEL, labeler.release)
        self.module.run_info["quail"] = labeler.to_dict()
        return labeler

    def _callbacks(self) -> list[L.Callback]:
        grids_every = self.config["sample_every_n_steps"] if self.is_image else 0
        callbacks: list[L.Callback] = [
            FiniteGeneratorGuard(),  # first: nothing below may run on diverged weights
            # before the sample grids: a grid is a release, saved only once a checkpoint holds its steps
            LastCheckpoint(self.output_dir / LAST_CHECKPOINT, self.config["checkpoint_every_n_steps"] or 0, grids_every or 0)
        ]
        if self.config["max_steps"]:
            callbacks.append(StepLimit(self.config["max_steps"]))
        if grids_every:
            callbacks.append(SampleGrid(self.output_dir, grids_every, self.config["sample_columns"]))
        callbacks.append(LambdaCallback(on_train_start=self._record_lineage, on_train_end=self._count_steps_per_rank))
        if self.strategy is not None:
            callbacks.append(self.strategy)
            if self.strategy.target_epsilon is not None:
                callbacks.append(PrivacyBudgetStopping(self.strategy.target_epsilon))
        # last: after every check that may refuse the run (the data, delta < 1/n, a budget too small
        # for one step), so a refused run leaves the folder's earlier config.yaml as it was
        callbacks.append(LambdaCallback(on_train_start=self._write_config))
        return callbacks

    def _record_lineage(self, trainer: L.Trainer, module: Any) -> None:
        """Into the module's run information, once a resumed checkpoint's has been loaded over it:
        the runs training went through, the files this run read its records and schema from (a CSV's,
        a built-in dataset's in --data-dir: ``sample --out`` refuses them, even where the run's
        config.yaml is gone), and an image
        run's digest of its training images."""
        module.run_info["lineage"] = [dict(segment) for segment in self.lineage]
        if self.is_image:  # read only now: Lightning downloads the files (prepare_data) as fit starts
            module.run_info["train_rows_digest"] = self.datamodule.train_rows_digest()
        module.run_info["data_files"] = data_files(self.config["data"], self.datamodule)

    def _write_config(self, trainer: L.Trainer, module: Any) -> None:
        if trainer.is_global_zero:
            kept = {k: v for k, v in self.config.items() if k not in INVOCATION_ONLY}
            found = default_data_dir()
            if (isinstance(kept.get("data"), dict) and kept["data"].get("data_dir") is None and found is not None
                    and getattr(self.datamodule, "reads_data_dir", True)):
                # found through $LIGHTNING_DPGAN_DATA_DIR: recorded, so that --config reruns from anywhere
                kept = {**kept, "data": {**kept["data"], "data_dir": str(found)}}
            write_yaml(self.output_dir / "config.yaml", with_absolute_paths(kept))

    def _check_trainer_options(self) -> None:
        """Refuse the trainer options that cannot train this run, before any row is read."""
        options = self.config["trainer"]
        check_trainer_keys(options)
        for reserved, own in RUN_OWNED_TRAINER_OPTIONS.items():
            if reserved in options:
                raise ConfigError(f"set trainer.{reserved} through the run's own settings ({own}), not the trainer section")
        if refusal := stop_floor_refusal(options.get("min_steps"), options.get("min_epochs")):
            raise ConfigError(refusal)
        if refusal := max_time_refusal(options.get("max_time")):
            raise ConfigError(refusal)
        if self.strategy is not None and (refusal := overfit_refusal(options.get("overfit_batches"))):
            raise ConfigError(refusal)
        if options.get("fast_dev_run") and self.config["resume"]:  # Lightning refused it once the checkpoint was restored
            raise ConfigError("trainer.fast_dev_run runs a few batches of a fresh run in one epoch, and --resume continues "
                              "the checkpoint's epochs: leave one of them out")
        if options.get("barebones"):  # Lightning's own refusal names a logger the user never gave
            raise ConfigError("trainer.barebones turns off the logger and checkpoints a run writes its metrics, "
                              "privacy report and checkpoints with: leave it out")
        if refusal := train_batch_limit_refusal(options.get("limit_train_batches")):
            raise ConfigError(refusal)
        below = trainer_options_below_their_floor(options)  # Lightning takes -5 steps between logs in silence
        if below:
            raise ConfigError("; ".join(below))
        self._check_precision(str(options.get("precision")))
        for option, off in AUTOMATIC_OPTIMIZATION_OPTIONS.items():
            if options.get(option) not in (None, off):
                raise ConfigError(f"trainer.{option} works under Lightning's automatic optimization only, and every "
                                  "model here steps its own optimizers (a GAN's alternating updates): leave it out"
                                  + ("; DP-SGD clips each record's gradient by --privacy.max_grad_norm"
                                     if option == "gradient_clip_val" else ""))
        check_accelerator(options.get("accelerator"), options.get("devices"))
        check_logger(self.config["logger"]["name"], {k: v for k, v in self.config["logger"].items() if k != "name"})
        chosen = options.get("strategy", "auto")
        if isinstance(chosen, str) and chosen not in PRIVATE_TRAINER_STRATEGIES and chosen not in StrategyRegistry:
            hint = registry.did_you_mean(chosen, PRIVATE_TRAINER_STRATEGIES)
            raise ConfigError(f"--strategy {chosen} is not a Lightning strategy.{hint} "
                              f"Allowed: {', '.join(PRIVATE_TRAINER_STRATEGIES)}")
        if isinstance(chosen, str) and chosen not in PRIVATE_TRAINER_STRATEGIES:
            # Lightning's other strategies average gradients before a mechanism could clip them, wrap
            # the module in DistributedDataParallel, which refuses a GAN's alternating updates
            # ("parameters that were not used"), or fail in their spawned workers: refused here,
            # before anything is written
            what = "a private model" if self.strategy is not None else "a GAN's alternating updates"
            raise ConfigError(f"--strategy {chosen} cannot train {what}: use --strategy ddp for several "
                              f"processes (or leave --strategy out); allowed: {', '.join(PRIVATE_TRAINER_STRATEGIES)}")
        several = {flag: options.get(key) for flag, key in (("--devices", "devices"), ("--num-nodes", "num_nodes"))
                   if (_as_count(options.get(key)) or 1) > 1}
        if chosen == "single_device" and several:  # Lightning trains on one device and keeps the count as given
            asked = " and ".join(f"{flag} {value}" for flag, value in several.items())
            raise ConfigError(f"--strategy single_device trains one process on one device, and {asked} asks for "
                              "several: use --strategy ddp (or leave --strategy out), or one device")

    def _check_precision(self, precision: str) -> None:
        """Refuse a ``--trainer.precision`` the run cannot train or sample under ("None" when unset),
        before anything is written (the strategy's own setup checks its part again)."""
        refusal = self.strategy.precision_refusal(precision) if self.strategy is not None else None
        if refusal:
            raise ConfigError(refusal)
        if precision in NON_FLOAT32_WEIGHT_PRECISIONS:
            raise ConfigError(f"trainer.precision {precision} keeps the networks' weights in another type than float32, "
                              "which sampling and the privacy mechanisms do not support: use --trainer.precision "
                              "bf16-mixed (float32 weights, bf16 arithmetic) or leave it out")

    def _build_trainer(self) -> L.Trainer:
        options = dict(self.config["trainer"])
        several = any((_as_count(options.get(key)) or 1) > 1 for key in ("devices", "num_nodes"))
        if several and options.get("strategy", "auto") == "auto":
            # Lightning's own choice for several devices (its DDP) cannot train a GAN's alternating
            # updates: ours can, private or not
            options["strategy"] = "ddp"
        if "strategy" in options:  # --strategy ddp: combines gradients the way privacy needs (see ddp.py)
            options["strategy"] = resolve_strategy(options["strategy"])
        options["plugins"] = self._plugins(options.get("plugins"), options.get("strategy"))
        logger_options = {k: v for k, v in self.config["logger"].items() if k != "name"}
        logger = build_logger(self.config["logger"]["name"], self.output_dir, logger_options, self.output_dir.name)
        callbacks = self._callbacks()
        settings = dict(
            max_steps=-1,  # counted in batches by StepLimit: see callbacks/step_limit.py
            max_epochs=self.config["max_epochs"] or -1,
            logger=logger,
            default_root_dir=str(self.output_dir),
            enable_checkpointing=False,  # LastCheckpoint saves, in training batches
        )
        trainer = L.Trainer(callbacks=list(callbacks), **settings, **options)  # a copy: Lightning adds its own
        if isinstance(trainer.strategy, PrivateDDPStrategy) and trainer.world_size == 1:
            # --strategy ddp in one process (e.g. a DDP run's config.yaml resumed with --devices 1):
            # Lightning's DDP would still put its distributed sampler, which --seed orders, in place
            # of a private one (DP-SGD's Poisson batches: a TypeError; its secret shuffle: replayable)
            trainer = L.Trainer(callbacks=list(callbacks), **settings, **{**options, "strategy": "auto"})
        use_collective_free_sigterm(trainer)  # Lightning's hung DDP on a SIGTERM to every process: see ddp_sigterm.py
        return trainer

    def _plugins(self, given: Any, strategy: Any) -> list[Any]:
        """The trainer's plugins (``trainer.plugins``, if any) and the checkpoint reader with
        which a ``--resume`` reads of the file only this process's share (a DDP rank's teachers),
        unless a checkpoint reader was given (in the plugins or on a strategy object)."""
        plugins = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        if any(isinstance(plugin, CheckpointIO) for plugin in plugins) or getattr(strategy, "_checkpoint_io", None):
            return plugins
        return plugins + [ShareReadingCheckpointIO(self.module)]

    @property
    def is_image(self) -> bool:
        return getattr(self.datamodule, "kind", "image") == "image"

    # -------------------------------------------------------------- running
    def fit(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # the other ranks read rank 0's release from the run folder unless resuming (then the
        # checkpoint's): checked by all ranks alike, or by none, as a collective must be
        if launched_as_follower():
            if getattr(self, "release_digest", None) is not None:
                self.trainer.callbacks.append(SameRelease(self.release_digest, RANK_ZERO_RELEASE))
            return self._fit_and_write()
        if self.trainer.world_size <= 1:
            return self._fit_and_write()
        release = write_torch(self.output_dir / RANK_ZERO_RELEASE, shared_with_other_ranks(self.module.run_info))
        if self.resume_info is None:
            self.trainer.callbacks.append(SameRelease(release_digest(release.read_bytes()), RANK_ZERO_RELEASE))
        try:
            return self._fit_and_write()
        finally:
            release.unlink(missing_ok=True)

    def _fit_and_write(self) -> None:
        if self.trainer.logger is not None:
            log_run_config(self.trainer.logger, with_absolute_paths(self.config))
        started = time.perf_counter()
        try:
            self.trainer.fit(self.module, datamodule=self.datamodule, ckpt_path=self.config["resume"])
        except SIGTERMException:
            if self.trainer.is_global_zero:
                print(f"train: {self.terminated_sentence()}", file=sys.stderr)
            raise
        except SystemExit as exit_:
            # Lightning turns Ctrl-C into exit status 1 (its sys.exit within the handling of the
            # KeyboardInterrupt): said as an interruption; another exit from training passes on as it is
            if isinstance(exit_.__context__, KeyboardInterrupt):
                raise KeyboardInterrupt(self.interrupted_sentence() if self.trainer.is_global_zero else "") from None
            raise
        except RuntimeError as error:
            if self.config["resume"] and "Error(s) in loading state_dict" in str(error):
                raise ConfigError(
                    f"the checkpoint {self.config['resume']} does not fit the networks this run builds (a setting "
                    "that shapes them differs: sizes, encoding, schema). Resume with the settings it was trained "
                    f"with (its run's config.yaml). {first_line(error)}") from error
            raise
        wall_time = time.perf_counter() - started
        try:
            if self.trainer.is_global_zero:
                self._report(self._outputs_or_how_to_write_them(wall_time))
        finally:  # the other processes wait for rank 0's writes, then all leave together
            leave_process_group()

    def _outputs_or_how_to_write_them(self, wall_time: float) -> dict[str, Any]:
        """The run's outputs, written once training ended. A SIGTERM while they are written
        (Lightning's handler is gone by then) ended the process at once, leaving the temporary copy
        of the file being written in the folder and saying nothing; it now stops as Ctrl-C does,
        removing that copy (``outputs.atomic_write``), and both say how the finished run's
        checkpoint writes them."""
        def stop(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one would cut the removal of the copy short
            raise SIGTERMException

        try:
            with on_sigterm(stop):
                return self._write_outputs(wall_time)
        except SIGTERMException:
            print(f"train: {self.outputs_stopped_sentence('stopped by SIGTERM')}", file=sys.stderr)
            raise
        except KeyboardInterrupt:
            raise KeyboardInterrupt(self.outputs_stopped_sentence("interrupted")) from None

    def outputs_stopped_sentence(self, how: str) -> str:
        """The user's line when a stop came after training, as its outputs were written: the
        checkpoint saved at the end holds the finished run, and resuming it trains no step; or,
        once ``privacy.json`` (the last output) is written, as the loggers publish the run."""
        if self.module.run_info.get("audit_trial"):
            return f"{how} while writing the outputs of an audit's trial, which is not continued"
        if (self.output_dir / "privacy.json").is_file():  # written last (the earlier outputs were set aside first)
            return (f"{how} after its outputs were written in {self.output_dir}, while the run was published to the "
                    "loggers: what they hold of it may be incomplete")
        accountant = ", with the privacy accountant" if self.strategy is not None else ""
        return (f"{how} while writing the outputs of its {self.module.train_steps} training steps, which had "
                f"ended: {self.output_dir / LAST_CHECKPOINT} holds the finished run{accountant}. Write privacy.json, "
                f"metrics.json and the synthetic data (no step is trained again) with: {continue_command(self.output_dir)}")

    def _report(self, report: dict[str, Any]) -> None:
        """What the console says of a finished run (rank 0): how it stopped, its ε, warnings."""
        print(f"train: {self.stop_sentence()}")
        if report.get("epsilon") is not None:
            print(f"train: {self.privacy_sentence(report)}")
            if (note := self.fixed_noise_note(report)) is not None:
                print(f"train: note: {note}", file=sys.stderr)
        if self.module.generator_updates == 0:
            print(f"train: warning: {self.untrained_reason()}", file=sys.stderr)
        if (warning := self.missing_label_classes_warning()) is not None:
            print(f"train: warning: {warning}", file=sys.stderr)
        for warning in [] if self.strategy is None else [*filter(None, [self.strategy.fixed_seed_warning()]),
                                                          *self.strategy.training_warnings()]:
            print(f"train: warning: {warning}", file=sys.stderr)

    def stop_cause(self) -> str:
        """Why training ended (``privacy.json``'s ``stopped_by``): ``refused`` (a query batch that
        would have passed the budget), ``fast-dev-run`` (Lightning's debugging run), ``max-steps``,
        ``max-epochs``, ``budget`` (the budget callback's stop before a step that would pass it) or
        ``other`` (``--trainer.max_time``, a signal). A run that stops at 103 of its 1,000 steps
        with most of its budget left must say what ended it."""
        if self.strategy is not None and self.strategy.refusal is not None:
            return "refused"
        if getattr(self.trainer, "fast_dev_run", False):  # Lightning's debugging run: it ends a run however set
            return "fast-dev-run"
        # the run's length first: noise calibrated to it leaves no room for one more step there too
        if self.config["max_steps"] and self.module.train_steps >= self.config["max_steps"]:
            return "max-steps"
        if self.config["max_epochs"] and self.trainer.current_epoch >= self.config["max_epochs"] and self._epoch_ran_out():
            return "max-epochs"
        if any(isinstance(callback, PrivacyBudgetStopping) and callback.stopped_by_budget
               for callback in self.trainer.callbacks):
            return "budget"
        return "other"

    def _epoch_ran_out(self) -> bool:
        """Whether the last epoch ran to its last batch: Lightning counts an epoch stopped part-way
        (by the budget, ``--trainer.max_time``) as done, so ``current_epoch`` alone would call a
        budget stop in the last epoch ``max-epochs``."""
        return bool(self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)

    def stop_sentence(self) -> str:
        """The user's line on how training ended (a refusal's figures stay out of privacy.json:
        they are a function of the private votes)."""
        cause = self.stop_cause()
        if cause == "refused":
            said = f"the privacy budget ({self.strategy.refusal}): that query batch was refused and nothing of it released"
        elif cause == "budget" and self._budget_ran_out_as_planned():
            planned = self.strategy.noise_state()["calibrated_for_steps"]
            unit = ("generator " if planned != self.module.train_steps else "") + ("step" if planned == 1 else "steps")
            said = (f"the privacy budget, as planned: the noise was calibrated for the {planned} {unit} taken (one more "
                    "would spend more than --epsilon)")
        else:
            said = {"budget": "the privacy budget (one more step would spend more than --epsilon)",
                    "max-steps": "--max-steps reached",
                    "max-epochs": f"--max-epochs {self.config['max_epochs']} reached",
                    "fast-dev-run": "--trainer.fast_dev_run, Lightning's debugging run of a few batches (a check "
                                    "of the code, not a run to publish)",
                    "other": "a trainer limit or a signal (e.g. --trainer.max_time)"}[cause]
        of = f" of {self.config['max_steps']}" if self.config["max_steps"] else ""
        return f"training stopped after {self.module.train_steps}{of} steps: {said}"

    def _budget_ran_out_as_planned(self) -> bool:
        """Whether the noise was calibrated for exactly the steps charged: the one-critic
        sanitizer charges generator steps, and its last batches of a planned epoch would train
        the critic alone, so the budget ends the run there rather than the run's length."""
        if not hasattr(self.strategy, "noise_state"):
            return False
        planned = self.strategy.noise_state()["calibrated_for_steps"]
        return planned is not None and planned == self.strategy.steps_taken()

    #: Below this share of --epsilon spent, a run whose noise was given (not calibrated) is told so.
    UNSPENT_NOTE_SHARE = 0.9

    def fixed_noise_note(self, report: dict[str, Any]) -> str | None:
        """Where σ was given (a flag, a config file or a preset: dpctgan's σ 5 on a CSV), not
        calibrated, and the run ended by its length with much of --epsilon left: that --epsilon
        was only a ceiling, and how to have σ calibrated to spend it. None otherwise."""
        target = report.get("target_epsilon")
        if self.strategy.charged_nothing_since_resume():  # no step took the sigma it was given: nothing to say of it
            return None
        given = getattr(self.strategy, "noise_multiplier_given", False) or (  # or kept from a checkpoint that set it
            self.resume_info is not None and getattr(self.strategy, "calibrated_for_steps", 0) is None)
        if not given or target is None or report.get("stopped_by") not in ("max-steps", "max-epochs"):
            return None
        if report["epsilon"] >= self.UNSPENT_NOTE_SHARE * target:
            return None
        remedy = ("A resume never calibrates the noise (it keeps the checkpoint's, or takes a "
                  "--privacy.noise_multiplier given as it is), so only a new run (without --resume) with "
                  "--privacy.noise_multiplier null calibrates it" if self.resume_info is not None else
                  "--privacy.noise_multiplier null calibrates it")
        return (f"the noise multiplier {self.strategy.noise_multiplier:g} was set (--privacy.noise_multiplier, by a "
                f"flag, a config file or a preset), not calibrated to --epsilon {target:g}, which was only a ceiling: "
                f"the run spent {report['epsilon']:.4g}. {remedy} to spend --epsilon over the run's steps (less noise)")

    def privacy_sentence(self, report: dict[str, Any]) -> str:
        """The user's line on what the run spent (the figure ``privacy.json`` reports, unrounded there)."""
        target = report.get("target_epsilon")
        of = f" of --epsilon {target:g}" if target is not None else ""
        trial = " -- an audit trial's claim under test, not for release" if report.get("audit_trial") else ""
        return (f"privacy: epsilon {report['epsilon']:.6g}{of} at delta {report['delta']:g} "
                f"({self.output_dir / 'privacy.json'}){trial}")

    def terminated_sentence(self) -> str:
        """The user's line when SIGTERM stopped the run: what is kept, what is not written, and
        how to go on."""
        stopped = f"stopped by SIGTERM after {self.module.train_steps} steps"
        if self.module.run_info.get("audit_trial"):
            return f"{stopped} of an audit's trial, which is not continued"
        # several processes save nothing as they stop (a save is a collective a stopping peer may not join)
        if self.trainer.world_size > 1:
            return last_periodic_save_sentence(self.output_dir, self.config, stopped,
                                               "several processes save none as they stop")
        kept = f"{self.output_dir / LAST_CHECKPOINT} holds them, with the privacy accountant"
        return (f"{stopped}: {kept}; privacy.json, metrics.json and "
                f"the synthetic data are written when the run ends. Continue it with: {continue_command(self.output_dir)}")

    def interrupted_sentence(self) -> str:
        """The user's line when Ctrl-C stopped the run: Lightning saves nothing as it stops on
        one, so what is kept is the last periodic checkpoint."""
        if self.module.run_info.get("audit_trial"):
            return f"interrupted after {self.module.train_steps} steps of an audit's trial, which is not continued"
        return last_periodic_save_sentence(self.output_dir, self.config,
                                           f"interrupted after {self.module.train_steps} steps",
                                           "Ctrl-C saves none as it stops")

    def untrained_reason(self) -> str:
        """Why a run took no generator step. Its outputs are still written (they are what was
        released), but a user must not mistake the random initialisation for a trained model."""
        message = "no generator update was taken: the saved generator and its samples are its random initialisation"
        every = self.module.hparams.get("discriminator_steps", 1)
        if self.module.train_steps > 0 and self.module.generator_updates == 0:
            # training's own spend: what preprocessing and QUAIL's label model spent was not for these steps
            epsilon = 0.0 if self.strategy is None else self.strategy.training_epsilon()
            spent = f" (and spent epsilon {epsilon:.4g} of training's budget on them all the same)" if epsilon > 0 else ""
            return (f"{message}. The generator steps once every {every} training steps (--model.discriminator_steps), "
                    f"and the run took {self.module.train_steps}{spent}: train for more steps")
        refusal = None if self.strategy is None else self.strategy.refusal
        if refusal is None:  # stopped for another reason (e.g. --trainer.max_time)
            return message
        spent = self.strategy.training_epsilon()
        share = (f", or leave the synthesizer more of it (a --quail-split below {self.quail.split:g}, the label "
                 "model's share)") if self.quail is not None else ""
        return (f"{message}. The privacy budget ran out within the first step ({refusal}; epsilon {spent:.4g} "
                f"spent on training, of --epsilon {self.strategy.target_epsilon:g}): raise --epsilon{share}, or make "
                "each step cheaper (fewer queries, more noise, or for PATE more teachers; see --privacy.* in --help)")

    def _count_steps_per_rank(self, trainer: L.Trainer, module: Any) -> None:
        """Every process's training steps (under DDP they must all stop at the same one)."""
        steps = torch.tensor([module.train_steps], device=module.device)
        self.steps_per_rank = [int(s) for s in trainer.strategy.all_gather(steps).reshape(-1)]

    def _check_resume_takes_steps(self) -> None:
        """Refuse a resume whose ``--max-steps`` (which counts the checkpoint's steps too) is below
        the checkpoint's steps: it reads as going back, and would only rewrite the run's outputs.
        Equal is allowed: it writes the outputs of a run cut off after its last checkpoint."""
        # the length this run will get: --max-steps, or the default when no limit is given
        limit = self.config["max_steps"] or (None if self.config["max_epochs"] else DEFAULT_MAX_STEPS)
        taken = self.resumed_steps  # 0 for a new run
        if limit is not None and limit < taken:
            raise ConfigError(f"--resume {self.config['resume']} has taken {taken} steps and --max-steps {limit} "
                              f"counts them: it would take none. Raise --max-steps above {taken} to train on "
                              f"({taken} itself takes no step: it only writes the outputs of a run stopped after its "
                              "last checkpoint).")

    def _write_outputs(self, wall_time: float) -> dict[str, Any]:
        """The released data first, ``privacy.json`` last: a run folder holding a fresh
        ``privacy.json`` is complete, even after a failed write (e.g. a full disk). Returns the
        privacy report written."""
        metrics = self.metrics(wall_time)
        synthetic_digest = None
        if self.is_image:
            write_png(self.output_dir / "samples.png", sample_grid(self.module, self.config["sample_columns"]))
        else:
            rows = self.config["num_synthetic"] or len(self.datamodule.train_dataset)
            chunks = synthetic_row_chunks(self.module, self.datamodule, self.labeler, rows)
            write_csv_chunks(self.output_dir / "synthetic.csv", self._counting_label_classes(chunks))
            synthetic_digest = file_sha256(self.output_dir / "synthetic.csv")
            if self.config["data"]["name"] == "csv" and not self.config["data"].get("schema"):
                # the file's columns it did not train on go in the drop list, so the file reads back as a schema file
                dropped = {"drop": list(self.datamodule.drop)} if self.datamodule.drop else {}
                write_yaml(self.output_dir / RELEASED_SCHEMA, {**self.datamodule.schema.to_dict(), **dropped})
        write_json(self.output_dir / "metrics.json", metrics)
        report = self.privacy_report()
        if synthetic_digest is not None:  # the file this guarantee was written for (evaluate checks it)
            report["synthetic_sha256"] = synthetic_digest
        write_json(self.output_dir / "privacy.json", report)
        publish_run(self.trainer.logger, self.output_dir, metrics)
        return report

    def _counting_label_classes(self, chunks: Iterable[Any]) -> Iterator[Any]:
        """``chunks`` passed on as they are, counting the synthetic rows of each class of a
        categorical label on the way into ``self.synthetic_label_counts`` (None without one), for
        :meth:`missing_label_classes_warning`."""
        schema = self.datamodule.schema
        categorical = schema.label_kind in ("binary", "categorical")
        self.synthetic_label_counts = dict.fromkeys(schema.label_column.categories, 0) if categorical else None
        for chunk in chunks:
            if categorical:
                for category, count in schema.label_class_counts(chunk).items():
                    self.synthetic_label_counts[category] += count
            yield chunk

    def missing_label_classes_warning(self) -> str | None:
        """Said when synthetic.csv holds fewer classes of its label than the schema lists: a
        classifier trained on it never predicts the missing ones (with one class left it predicts
        that class alone, the AUROC 0.5 of a collapsed PATE-GAN), known now, not at ``evaluate``."""
        counts = self.synthetic_label_counts
        if not counts or all(counts.values()):
            return None
        label = self.datamodule.schema.label
        held = [str(category) for category, count in counts.items() if count]
        missing = [str(category) for category, count in counts.items() if not count]
        return (f"synthetic.csv's label {label!r} holds {len(held)} of its {len(counts)} classes "
                f"({', '.join(held) or 'none'}; none of {', '.join(missing)}): a classifier trained on it never "
                "predicts the missing ones" + (", so its AUROC is 0.5 by construction" if len(held) == 1 else ""))

    def privacy_report(self) -> dict[str, Any]:
        if self.strategy is None:
            return {
                "mechanism": "none",
                "epsilon": None,
                "delta": None,
                "target_epsilon": None,
                "steps": self.module.train_steps,
                "stopped_by": self.stop_cause(),
                "accountant": None,
                "note": "trained without privacy: no (epsilon, delta) guarantee",
                "lineage": self.lineage,
                "software": software_versions(),
            }
        report = self.strategy.privacy_report()
        report["stopped_by"] = self.stop_cause()
        report["lineage"] = self.lineage
        if self.module.run_info.get("audit_trial"):
            report["audit_trial"] = self.module.run_info["audit_trial"]
        report["guarantee"] = guarantee_statement(report, self.is_image)
        if self.labeler is not None:
            report["quail"] = {
                "synthesizer": self.quail.synthesizer,
                "split": self.labeler.cost["split"],
                # the split is of the target the label model was trained under (a resume may raise it)
                **({"split_of_epsilon": self.labeler.cost["of_epsilon"]} if "of_epsilon" in self.labeler.cost else {}),
                "label_model": {"architecture": self.labeler.architecture, "fits": self.labeler.fits,
                                "hidden": self.labeler.hidden,
                                "log_features": self.labeler.log_features, "log_label": self.labeler.log_label,
                                **self.labeler.cost},
                "composition": "basic: epsilon = preprocessing (its parts: the data's and quail_label_model) "
                               "+ the synthesizer's training epsilon",
            }
        return report

    def metrics(self, wall_time: float) -> dict[str, Any]:
        metrics = {key: float(value) for key, value in self.trainer.callback_metrics.items()}
        if self.strategy is not None:  # the final figure, as privacy.json has it, whatever was logged last
            metrics["privacy/epsilon"] = float(self.strategy.epsilon())
        metrics.update(
            {
                "steps": self.module.train_steps,
                "steps_per_rank": self.steps_per_rank or [self.module.train_steps],
                "train_records": len(self.datamodule.train_dataset),
                "wall_time_s": round(wall_time, 3),
            }
        )
        return metrics
