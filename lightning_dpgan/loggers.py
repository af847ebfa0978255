"""The ``--logger`` choices, built on Lightning's own loggers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from lightning_dpgan.config import ConfigError


def build_logger(name: str, output_dir: Path, options: dict[str, Any], run_name: str) -> Logger:
    """Create the logger ``name`` writing under ``output_dir/logs`` (W&B: its own run dir)."""
    save_dir = output_dir / "logs"
    if name == "csv":
        return CSVLogger(save_dir=str(save_dir), name="", version="", **options)
    if name == "tensorboard":
        return TensorBoardLogger(save_dir=str(save_dir), name="", version="", **options)
    if name == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError as error:
            raise ConfigError("--logger wandb needs the wandb package: pip install 'lightning-dpgan[wandb]'") from error
        from lightning.pytorch.loggers import WandbLogger

        options = {"project": "lightning-dpgan", "name": run_name, **options}
        save_dir.mkdir(parents=True, exist_ok=True)
        return WandbLogger(save_dir=str(save_dir), **options)
    raise ConfigError(f"unknown logger {name!r}")
