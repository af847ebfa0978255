"""Seeded draws that leave the caller's random streams as they were.

``torch.manual_seed`` reseeds the CPU's generator and every CUDA device's. Forking the CPU's
alone (``fork_rng(devices=[])``) therefore left a training run's GPU stream restarted from the
seed after each sample grid, so its generator's latents and labels repeated the same sequence.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def devices_reseeded(device: torch.device | str) -> tuple[list, str]:
    """What ``fork_rng`` must save and put back around a ``manual_seed`` for work on ``device``:
    ``(devices, device_type)``. On a process that has started CUDA, its current device and
    ``device`` (``manual_seed`` reseeds every device's generator, but a process draws on its own:
    saving the others' would open a context on each GPU, in every DDP process); ``device`` itself
    on another accelerator; none on a CPU-only process."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        return [device], device.type
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        used = {torch.cuda.current_device()}
        if device.type == "cuda":
            used.add(device.index if device.index is not None else torch.cuda.current_device())
        return sorted(used), "cuda"
    return [], "cuda"


@contextmanager
def seeded_stream(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Draws inside come from ``seed``; afterwards every stream goes on as if they had not happened."""
    devices, device_type = devices_reseeded(device)
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        torch.manual_seed(seed)
        yield


__all__ = ["devices_reseeded", "seeded_stream"]
