"""How a suite stops on SIGTERM (``kill``, a scheduler's end of job): like Ctrl-C, not by dying.

Ctrl-C in a terminal reaches the suite and its ``train``/``evaluate`` processes together. A
SIGTERM sent to the suite alone would end it at once and leave its running children training on,
orphaned, into folders a later ``--resume`` starts again. Within :func:`children_stopped_on_sigterm`
the signal is passed on to every process the suite is waiting on (each stops as its own SIGTERM
makes it: ``train`` keeps what it can resume from), no further process starts, and once they have
ended :class:`SuiteTerminated` is raised, with the runs finished before it kept in the results file.
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

from lightning_dpgan.benchmark.out_dir_lock import held_lock_descriptors
from lightning_dpgan.sigterm import on_sigterm


class SuiteTerminated(BaseException):
    """SIGTERM reached the suite. Not an ``Exception``: a cell's failure is recorded and the suite
    goes on, and this must end the suite instead."""


_running: set[subprocess.Popen] = set()
_lock = threading.RLock()  # re-entrant: the signal handler may run in the thread that holds it
_terminated = threading.Event()


def _pass_on(signum: int, frame: Any) -> None:
    stop_running_children()


def stop_running_children() -> None:
    """What SIGTERM does to the suite: every process it waits on gets SIGTERM, none starts after.
    Also how the suite stops itself (a results file it cannot write)."""
    _terminated.set()
    with _lock:
        for process in list(_running):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)


@contextlib.contextmanager
def children_stopped_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM stops the processes started by :func:`waited_on` (see the module
    docstring). Outside the main thread (a suite run from Python's own threads) the default stays."""
    _terminated.clear()
    try:
        with on_sigterm(_pass_on):
            yield
    finally:
        _terminated.clear()


def stop_if_terminated() -> None:
    """Raise :class:`SuiteTerminated` if SIGTERM has reached the suite. Asked before each piece of
    work: the signal stops the processes the suite waits on, not what it runs itself (a peer's
    table being scored), which ends first; then nothing more starts."""
    if _terminated.is_set():
        raise SuiteTerminated


def waited_on(command: list[str], **popen: Any) -> int:
    """Run ``command`` to its end and return its exit status; raise :class:`SuiteTerminated`, having
    waited for it to stop, if SIGTERM reached the suite meanwhile (or before it could start)."""
    stop_if_terminated()
    # the --out-dir's lock goes with it: a process the suite started outlives a suite killed outright
    popen.setdefault("pass_fds", held_lock_descriptors())
    with subprocess.Popen(command, **popen) as process:
        with _lock:
            _running.add(process)
            if _terminated.is_set():  # the signal came between the check above and now
                process.send_signal(signal.SIGTERM)
        try:
            returncode = process.wait()
        except BaseException:  # Ctrl-C: as subprocess.run does, the process does not outlive the suite
            process.kill()
            raise
        finally:
            with _lock:
                _running.discard(process)
    stop_if_terminated()
    return returncode


__all__ = ["SuiteTerminated", "children_stopped_on_sigterm", "stop_if_terminated", "stop_running_children", "waited_on"]
