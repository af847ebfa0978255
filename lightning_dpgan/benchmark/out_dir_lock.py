"""One harness at a time in an --out-dir.

Two invocations in one folder would train the same cells side by side: a ``--resume`` started
while the first still runs finds its cells half done, continues their checkpoints beside the
processes writing them, and both record the runs. The lock is an advisory ``flock`` on a file
in the folder, so the operating system releases it however the holder ends (a crash or SIGKILL
included): no stale lock to clear by hand. Where the system has no ``flock`` (Windows), or the
folder's file system refuses it (a warning says so), the folder is not locked.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; the folder is not locked there
    fcntl = None  # type: ignore[assignment]

#: the lock's file, in the --out-dir; it names the holder, for the refusal to say
LOCK_FILE = ".benchmark.lock"
#: the descriptors of the locks this process holds: passed on to the train and evaluate processes
#: it starts (:func:`held_lock_descriptors`)
_held: list[int] = []


class OutDirBusyError(RuntimeError):
    """Another harness holds the --out-dir."""


@contextmanager
def out_dir_locked(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` (created if missing) for this invocation, or raise
    :class:`OutDirBusyError` naming the process that holds it."""
    if fcntl is None:
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK_FILE, "a+") as handle:
        refused = None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that did not say which"
            raise OutDirBusyError(f"another benchmark is running in --out-dir {out_dir} ({holder})") from None
        except OSError as error:  # a file system without flock (Lustre without -o flock, some NFS): run unlocked
            refused = error.strerror or str(error)
        if refused is not None:  # outside the except: the suite's own errors are not chained to this one
            print(f"benchmark: warning: --out-dir {out_dir} cannot be locked on its file system ({refused}): "
                  "nothing stops a second benchmark from running in it beside this one", file=sys.stderr)
            yield
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}, started {datetime.now():%Y-%m-%d %H:%M:%S}, or the processes it "
                     "started\n")
        handle.flush()
        _held.append(handle.fileno())
        try:
            yield
        finally:
            _held.remove(handle.fileno())
            fcntl.flock(handle, fcntl.LOCK_UN)


def held_lock_descriptors() -> tuple[int, ...]:
    """The lock descriptors a process the harness starts inherits (``Popen``'s ``pass_fds``): the
    lock is the open file's, so it stays while any of them runs. A harness killed outright
    (SIGKILL) leaves its train or evaluate running, and a --resume must not train beside it."""
    return tuple(_held)


__all__ = ["LOCK_FILE", "OutDirBusyError", "held_lock_descriptors", "out_dir_locked"]
