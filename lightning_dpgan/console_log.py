"""How the library's log records read on a command's console.

The library logs its warnings (the data's clipped bounds, a teacher batch drawn with replacement,
G-PATE's drowned answers) through :mod:`logging`. Opacus configures the root logger as it is
imported, so on the console they came out date-stamped (``12/01/2026 11:11:11:WARNING:...``)
between the command's own ``train: warning: ...`` lines. A command run as a program routes them
through :func:`route_library_log_to_console` so that they read like the rest.
"""
from __future__ import annotations

import logging
import sys

#: the logger every module of the package logs under (``logging.getLogger(__name__)``)
LIBRARY_LOGGER = "lightning_dpgan"


class CommandFormatter(logging.Formatter):
    """``train: warning: <message>`` (``train: <message>`` below warnings), as the command writes
    its own lines."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"{self.command}: {level}{record.getMessage()}"


def route_library_log_to_console(command: str) -> None:
    """Write the library's log records to stderr in the command's own format, and only there.

    For a program started from the command line (``train.py``, ``python -m lightning_dpgan``):
    a script or a test that calls :func:`lightning_dpgan.cli.main` keeps its own logging setup
    (pytest's capture among them)."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(CommandFormatter(command))
    logger.addHandler(handler)
    logger.propagate = False  # the root logger's handler (Opacus') would print each record again
