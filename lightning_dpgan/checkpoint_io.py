"""``ShareReadingCheckpointIO``: Lightning's checkpoint reader for ``--resume``, reading of a
checkpoint only the share this process holds.

A PATE run's checkpoint holds all K teachers and their Adam state (tens of GB for the G-PATE
presets). Lightning's own reader loads the whole file into every DDP rank's memory before the
module keeps its shard of the teachers, so N ranks on one machine needed N copies of all K. This
reader maps the file into memory instead, lets the module cut its tensors to its share
(:meth:`~lightning_dpgan.modules.base.GANModule.keep_own_share`) and copies out only what is
left: a rank reads its shard's pages and the (small) rest. (A checkpoint given as a stream or a
remote URL is read whole, by Lightning.)

Everything is copied out of the mapping before the checkpoint is handed to Lightning: tensors
still mapped would change (or fault) if the file were rewritten in place while training runs.

It also writes a local checkpoint straight to its file. Lightning's writer serializes the whole
checkpoint into an in-memory buffer, then copies that buffer whole to write it: two copies of the
checkpoint beside the training state. For the G-PATE MNIST preset (821M teacher parameters and
their Adam moments, ~10 GB) that was the end of the run on a 24 GB host, which trained it fine.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class ShareReadingCheckpointIO(TorchCheckpointIO):
    """Reads a local checkpoint memory-mapped and keeps the share of it ``module`` holds, when it
    holds only a share (``module.holds_a_share()``); otherwise reads as Lightning does (mapping
    a file that is then copied whole would only add the mapped pages to the peak). Writes a local
    checkpoint streamed to its file, through a temporary file renamed into place."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if not _is_local(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        try:
            torch.save(checkpoint, partial)  # tensors written from their own memory, one at a time
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return None

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not (_is_local(path) and self.module.holds_a_share()):
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if not Path(path).is_file():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        checkpoint = torch.load(path, map_location=map_location, weights_only=weights_only, mmap=True)
        self.module.keep_own_share(checkpoint)
        return copied_out(checkpoint)


def _is_local(path: Any) -> bool:
    """A path on this machine (not a stream, not a remote URL)."""
    return isinstance(path, (str, Path)) and "://" not in str(path)


def copied_out(value: Any) -> Any:
    """``value`` with every tensor in it (in dicts, lists and tuples) copied into fresh memory;
    dicts and lists are filled in place."""
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(value.detach().clone(), requires_grad=value.requires_grad)
    if torch.is_tensor(value):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = copied_out(item)
    elif isinstance(value, list):
        value[:] = [copied_out(item) for item in value]
    elif isinstance(value, tuple):
        items = [copied_out(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value
