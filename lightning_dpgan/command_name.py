"""How the user started the command, for the usage lines and for the commands a message offers
to run next: ``train.py`` exists in a checkout only, so an installed package's user is told
``python -m lightning_dpgan train`` (or ``lightning-dpgan train``, the console script they typed)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path


def command_prog(command: str) -> str:
    """The command the user typed, for ``--help`` and argparse's errors: ``train.py``, the
    ``lightning-dpgan`` script and ``python -m lightning_dpgan`` run the same parsers."""
    typed = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if command == "train" and typed.name == "train.py":
        return "train.py"
    if typed.stem == "lightning-dpgan":  # the console script (lightning-dpgan.exe on Windows)
        return f"lightning-dpgan {command}"
    return f"python -m lightning_dpgan {command}"


def command_line(command: str) -> str:
    """What to type to run ``command`` the way this process was started: ``python train.py`` as
    the user typed it (``python ../train.py``) from a checkout's script, else the package's own way
    (a library user's too)."""
    prog = command_prog(command)
    return f"python {shlex.quote(sys.argv[0])}" if prog == "train.py" else prog
