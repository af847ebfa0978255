"""SIGTERM under DDP without a collective inside the signal handler.

Lightning 2.6's SIGTERM handler (``_SignalConnector._sigterm_notifier_fn``) broadcasts rank 0's
flag from within the handler, on every process and for every SIGTERM it receives. A handler runs
wherever the process's main thread happens to be, so that broadcast is one more collective at an
arbitrary place in each process's sequence of collectives; and a SIGTERM sent to the whole
process group (a scheduler ending a job, ``kill -TERM -- -PGID``) reaches rank 1 twice, once
directly and once forwarded by rank 0, so rank 1 broadcast twice where rank 0 broadcast once.
Measured on two CPU processes: one stop in three hung both for good.

The training loop already broadcasts rank 0's flag before every batch, and every rank raises
``SIGTERMException`` together from there, so the handler needs no collective at all: here rank
0's handler forwards the first SIGTERM to the processes it launched, as Lightning's does, and
sets the flag. The other processes' handlers set nothing: a flag of their own also stops them
alone at a batch's end (Lightning checks it there without asking rank 0), and rank 0 then
failed in its next collective (exit status 1, no word of the SIGTERM). So rank 0 decides when
all stop: a SIGTERM sent to another process alone is ignored.
"""
from __future__ import annotations

import logging
from types import FrameType
from typing import Any

from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.rank_zero import rank_prefixed_message

log = logging.getLogger(__name__)


class CollectiveFreeSignalConnector(_SignalConnector):
    """Lightning's signal connector whose SIGTERM handler, on rank 0 only, sets the flag and
    forwards the signal once."""

    def _sigterm_notifier_fn(self, signum: Any, _: FrameType | None) -> None:
        log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", self.trainer.local_rank))
        if self.trainer.global_rank != 0:  # rank 0's flag, broadcast before each batch, stops this one
            return
        if not self.received_sigterm:
            launcher = self.trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        self.received_sigterm = True


def use_collective_free_sigterm(trainer: Any) -> None:
    """Give ``trainer`` the connector above (before ``fit``, which registers its handlers)."""
    trainer._signal_connector = CollectiveFreeSignalConnector(trainer)


__all__ = ["CollectiveFreeSignalConnector", "use_collective_free_sigterm"]
