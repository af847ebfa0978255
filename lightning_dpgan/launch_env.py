"""Which process of a launched DDP run this is, from the launcher's environment variables alone.

Known before any process group exists, and without importing torch: the command line asks it
before it parses its options, and a command's ``--help`` should not wait for torch to load.
The collective operations are in :mod:`lightning_dpgan.distributed`, which re-exports these.
"""
from __future__ import annotations

import logging
import os
import sys


def launched_as_follower() -> bool:
    """True in a DDP process other than global rank 0 (``LOCAL_RANK`` set by Lightning's launcher
    for the processes it starts on a node, ``NODE_RANK`` on the other nodes, ``RANK`` by
    torchrun), known before any process group exists."""
    return any(int(os.environ.get(name, "0") or 0) > 0 for name in ("LOCAL_RANK", "NODE_RANK", "RANK"))


def launched_as_machine_follower() -> bool:
    """True in a DDP process other than its machine's first (``LOCAL_RANK`` above 0): the
    processes of one machine share its terminal, those of another machine do not."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0) > 0


def say_once_per_machine(line: str) -> None:
    """Print a note or warning that every process of a DDP run reaches alike (it reads the same
    command line and rows) from each machine's first process only: the others share its terminal."""
    if not launched_as_machine_follower():
        print(line, file=sys.stderr)


def quiet_machine_followers() -> None:
    """Log the library's warnings from each machine's first process only, as
    :func:`say_once_per_machine` prints notes and ``cli.report_error`` refusals: every process
    reads the same rows and settings, so a machine's other processes would repeat its first one's
    warnings word for word (the data's clipped bounds, a teacher batch drawn with replacement).
    Their errors still print."""
    from lightning_dpgan.console_log import LIBRARY_LOGGER

    if launched_as_machine_follower():
        logging.getLogger(LIBRARY_LOGGER).setLevel(logging.ERROR)


def launched_process_name() -> str:
    """This DDP process as its launcher numbered it (``rank 3`` under torchrun, else ``node 1,
    local rank 2``), for messages that only some processes may print."""
    if os.environ.get("RANK"):
        return f"rank {os.environ['RANK']}"
    return f"node {os.environ.get('NODE_RANK') or 0}, local rank {os.environ.get('LOCAL_RANK') or 0}"
