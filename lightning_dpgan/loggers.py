"""The ``--logger`` choices, built on Lightning's own loggers.

Weights & Biases (``--logger wandb``) gets the run's full configuration, the logged losses and
``privacy/epsilon``, and at the end the sample grid as an image, the final metrics in the run
summary and ``privacy.json`` as an artifact (:func:`publish_run`). Without an API key (neither
``WANDB_API_KEY`` nor a ``~/.netrc`` entry) and without ``WANDB_MODE``, it logs offline with a
warning instead of failing: ``wandb sync DIR/logs/wandb/offline-run-*`` uploads the run later.
"""
from __future__ import annotations

import logging
import math
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from lightning_dpgan import registry
from lightning_dpgan.config import ConfigError, init_arguments
from lightning_dpgan.error_text import first_line

log = logging.getLogger(__name__)

#: logger settings the W&B flags set (``--wandb-project`` is ``logger.project``, ...)
WANDB_FLAGS = {"project": "--wandb-project", "entity": "--wandb-entity", "run_name": "--wandb-name"}
#: what :func:`build_logger` (or the logger itself: the tensorboard folders) sets
PROVIDED = ("save_dir", "name", "version", "root_dir", "log_dir")


def check_logger(name: str, options: Mapping[str, Any]) -> None:
    """Refuse a logger the run cannot build (an unknown name, wandb not installed, settings csv or
    tensorboard does not take) before any row is read: the logger itself is built with the
    trainer, after the data's DP releases have drawn from the rows."""
    if name not in registry.LOGGERS:
        names = list(registry.LOGGERS)
        raise ConfigError(f"unknown logger {name!r}: use {names[0]} (the default), {', '.join(names[1:-1])} or {names[-1]}")
    if name == "wandb":
        check_wandb_options(options, _import_wandb())
    else:
        check_logger_options(name, options)


def check_wandb_options(options: Mapping[str, Any], wandb: Any) -> None:
    """Refuse a ``--logger.KEY`` that neither Lightning's ``WandbLogger`` nor ``wandb.init`` (which
    gets the logger's other keywords) takes: it failed with a TypeError from ``wandb.init``, once
    the data had been read and the trainer built."""
    from lightning.pytorch.loggers.wandb import WandbLogger  # the class itself (the tests stand in for the export)

    # name is --logger's own (the logger chosen); save_dir and dir are the run folder's; experiment is a Run object
    valid = sorted({*init_arguments(WandbLogger), *inspect_arguments(wandb.init), "run_name"}
                   - {"name", "save_dir", "dir", "experiment"})
    _refuse_unknown("wandb", options, valid)


def inspect_arguments(function: Any) -> list[str]:
    """The keyword arguments ``function`` names (none of a ``**kwargs``)."""
    import inspect

    return [name for name, parameter in inspect.signature(function).parameters.items()
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)]


def _refuse_unknown(name: str, options: Mapping[str, Any], valid: list[str]) -> None:
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join('logger.' + key for key in unknown)} for logger '{name}'. "
                          f"Valid keys: {', '.join('logger.' + key for key in valid)}.")


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as error:
        raise ConfigError("--logger wandb needs the wandb package: pip install 'lightning-dpgan[wandb]'") from error
    return wandb


def check_logger_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse settings the csv or tensorboard logger does not take, before anything is built: a
    W&B flag (the run did not ask for ``--logger wandb``), an unknown ``--logger.KEY`` (W&B's
    are checked by :func:`check_wandb_options`)."""
    flags = [WANDB_FLAGS[key] for key in options if key in WANDB_FLAGS]
    if flags:
        raise ConfigError(f"{', '.join(flags)} set, but the run logs with --logger {name}: add --logger wandb, or drop them")
    _refuse_unknown(name, options, [key for key in _logger_arguments(name) if key not in PROVIDED])


def _logger_arguments(name: str) -> list[str]:
    if name == "csv":
        return list(init_arguments(CSVLogger))
    keys = list(init_arguments(TensorBoardLogger))
    try:  # its other keyword arguments go to the SummaryWriter
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return keys
    return keys + [key for key in init_arguments(SummaryWriter) if key not in keys]


def build_logger(name: str, output_dir: Path, options: dict[str, Any], run_name: str) -> Logger:
    """Create the logger ``name`` writing under ``output_dir/logs`` (W&B: its own run dir)."""
    check_logger(name, options)
    save_dir = output_dir / "logs"
    if name == "csv":
        return CSVLogger(save_dir=str(save_dir), name="", version="", **options)
    if name == "tensorboard":
        return TensorBoardLogger(save_dir=str(save_dir), name="", version="", **options)
    return _wandb_logger(save_dir, options, run_name)


def _wandb_logger(save_dir: Path, options: dict[str, Any], run_name: str) -> Logger:
    wandb = _import_wandb()
    from lightning.pytorch.loggers import WandbLogger

    options = dict(options)
    options = {"project": "lightning-dpgan", "name": options.pop("run_name", None) or run_name, **options}
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if not mode and not _has_wandb_credentials() and "offline" not in options:
        log.warning("no W&B API key (WANDB_API_KEY or ~/.netrc) and no WANDB_MODE: logging offline; "
                    f"upload later with `wandb sync \"{save_dir / 'wandb'}\"/offline-run-*`")
        options["offline"] = True
    if mode == "disabled":  # W&B then takes every call and keeps nothing: the run logged nowhere, silently
        log.warning("--logger wandb with WANDB_MODE=disabled: W&B keeps nothing of this run (no losses, no ε curve, "
                    "no privacy report). Unset WANDB_MODE (or set it to offline) to log, or log with --logger csv")
    # W&B uploads the console by default, and the console carries what is for the data holder alone:
    # the datamodule's warnings count private rows (blanked categories, clipped values)
    options.setdefault("settings", wandb.Settings(console="off"))
    save_dir.mkdir(parents=True, exist_ok=True)
    return WandbLogger(save_dir=str(save_dir), **options)


def log_run_config(logger: Logger, run_config: dict[str, Any]) -> None:
    """The run's configuration, the first thing a logger is given. W&B starts its run here: a
    server it cannot reach (an API key, no network) took about two minutes to end in wandb's
    traceback; it is said as such, with the offline way out, before any training step."""
    try:
        logger.log_hyperparams({"run_config": run_config})
    except Exception as error:
        if type(error).__module__.startswith("pydantic"):  # W&B's settings, WANDB_MODE=bogus among them
            lines = [line.strip() for line in str(error).splitlines()
                     if line.strip() and not line.strip().startswith("For further information")]
            given = ", ".join(sorted(key for key in os.environ if key.startswith("WANDB_")))  # names: values may hold secrets
            raise ConfigError(f"W&B refused its settings ({' '.join(lines[1:]) or first_line(error)}): check the "
                              f"WANDB_* environment variables{f' ({given})' if given else ''} and the --logger.* "
                              "settings") from error
        if not type(error).__module__.startswith("wandb"):
            raise
        raise ConfigError(f"W&B could not start its run ({first_line(error)}). Without a network, set WANDB_MODE=offline "
                          "to log locally and upload later with `wandb sync`; or log with --logger csv") from error


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def publish_run(logger: Logger | None, output_dir: Path, metrics: Mapping[str, Any]) -> None:
    """End-of-run extras for W&B (nothing for other loggers): the sample grid, the final metrics
    in the run summary, and ``privacy.json`` as an artifact; then the run is finished."""
    from lightning.pytorch.loggers import WandbLogger

    if not isinstance(logger, WandbLogger):
        return
    import wandb

    run = logger.experiment
    samples = output_dir / "samples.png"
    if samples.is_file():
        logger.log_image("samples", [str(samples)])
    run.summary.update({f"final/{key}": value for key, value in metrics.items()
                        if isinstance(value, (int, float)) and math.isfinite(value)})
    privacy = output_dir / "privacy.json"
    if privacy.is_file():
        artifact = wandb.Artifact(f"privacy-report-{run.id}", type="privacy-report")
        artifact.add_file(str(privacy))
        run.log_artifact(artifact)
    run.finish()
