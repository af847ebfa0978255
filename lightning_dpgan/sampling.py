"""Drawing synthetic records from a checkpoint: what a data holder publishes."""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_dpgan import registry
from lightning_dpgan.modules.base import CHECKPOINT_KEY
from lightning_dpgan.data.schema import TableSchema
from lightning_dpgan.data.table_transformer import TableTransformer
from lightning_dpgan.outputs import atomic_write, image_grid, images_to_uint8, write_csv, write_png


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or not from lightning-dpgan."""


def read_run_info(path: str | Path) -> dict[str, Any]:
    """The run information stored by ``GANModule.on_save_checkpoint``; refuses foreign files."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): {error}") from error
    info = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(info, dict) or "model" not in info.get("run", {}):
        raise CheckpointError(f"{path} was not written by lightning-dpgan's train (no run information in it)")
    return info["run"]


def table_decoder(info: dict[str, Any]) -> Any:
    """What turns a table run's generated records into rows: its mode-specific transformer when
    it trained on one, else its schema's min-max / one-hot encoding."""
    if "table_transformer" in info:
        return TableTransformer.from_dict(info["table_transformer"])
    return TableSchema.from_dict(info["schema"])


def load_module(path: str | Path) -> Any:
    """Rebuild the trained module from a checkpoint written by ``train``."""
    info = read_run_info(path)
    cls = registry.lookup("model", info["model"]).load()
    module = cls.load_from_checkpoint(path, map_location="cpu")
    module.eval()
    return module


def sample_to_file(checkpoint: str | Path, n: int, out: str | Path, seed: int = 0, columns: int = 10) -> Path:
    """Draw ``n`` records and write them: ``.csv`` table (decoded with the run's schema),
    ``.png`` image grid or ``.npz`` image arrays."""
    out = Path(out)
    info = read_run_info(checkpoint)
    schema = info.get("schema")
    allowed = (".csv",) if schema else (".png", ".npz")
    if out.suffix not in allowed:
        kind = "a table model" if schema else "an image model"
        raise ValueError(f"--out for {kind} must end in {' or '.join(allowed)}, got {out.name}")
    module = load_module(checkpoint)
    torch.manual_seed(seed)
    if schema:
        return write_csv(out, table_decoder(info).decode(module.sample(n)))
    labels = module.balanced_labels(n)
    images = images_to_uint8(module.sample(n, labels))
    if out.suffix == ".png":
        return write_png(out, image_grid(images, columns))
    arrays = {"images": images}
    if labels is not None:
        arrays["labels"] = labels.cpu().numpy()
    return atomic_write(out, lambda f: np.savez_compressed(f, **arrays))
