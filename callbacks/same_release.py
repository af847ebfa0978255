"""``SameRelease``: under DDP, every process trains on the one preprocessing release rank 0 made.

Rank 0 writes what it released before training (a DP schema or DP modes, QUAIL's label model;
:meth:`lightning_dpgan.run.Run.fit`) into the run folder, and the other processes read it from
there: on one node they start after it is written, on other nodes they wait for the file. A run
killed before it could remove the file (``kill -9``, the out-of-memory killer) leaves it behind,
and a node that starts before rank 0 rewrites it would read the stale one: two machines training
on two different DP releases while the report charges one. So once the processes can talk (the
process group exists when ``setup`` runs, before the first step), each compares the SHA-256 of
the bytes it read with rank 0's, and every process stops when any differs.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import lightning as L

from lightning_dpgan.distributed import differs_from_rank_zero


def release_digest(content: bytes) -> int:
    """The first 8 bytes of the SHA-256 of a release file's bytes, as a signed 64-bit integer."""
    return int.from_bytes(hashlib.sha256(content).digest()[:8], "big", signed=True)


def datamodule_release_digest(datamodule: Any) -> int:
    """:func:`release_digest` of the DP releases a datamodule drew from the rows (its
    ``state_dict()``: a CSV's estimated schema, DP modes, their cost; empty for the rest)."""
    state = datamodule.state_dict() if hasattr(datamodule, "state_dict") else {}
    return release_digest(json.dumps(state, sort_keys=True, default=str).encode())


class StaleReleaseError(RuntimeError):
    """A DDP process read another preprocessing release than rank 0 wrote."""


class SameRelease(L.Callback):
    """Stop a DDP run whose processes did not read rank 0's release (see the module docstring)."""

    def __init__(self, digest: int, release_file: str) -> None:
        self.digest, self.release_file = digest, release_file

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if differs_from_rank_zero(self.digest):  # every process stops, not the one that differs alone
            raise StaleReleaseError(
                f"a process of this run read another preprocessing release than rank 0 wrote ({self.release_file}): a "
                "file left by an interrupted run was read before rank 0 replaced it. Delete that file from the output "
                "folder and start every node again")
