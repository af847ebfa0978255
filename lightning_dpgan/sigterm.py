"""SIGTERM (``kill``, a scheduler's end of job) handled by a command for the length of a block."""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def on_sigterm(handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """Within the block SIGTERM calls ``handler(signum, frame)``; the handler before it is back
    afterwards. Outside the main thread, where Python sets no handler, the default stays."""
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
