"""Keep freed host memory in the process, so that large CPU tensors do not page-fault every step.

glibc's ``malloc`` serves every request above its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and hands it back to the kernel on ``free``. A CPU training step that allocates its
activations and gradients anew each iteration (K batched teachers: tensors of hundreds of MB)
then has the kernel fault in and zero every page of them, every iteration.

:func:`reuse_freed_memory` turns glibc's mmap path and its heap trimming off (mallopt(3)), so
freed blocks stay in the heap and later steps' tensors reuse them. Measured on 2 CPU cores,
G-PATE with preset-size teachers (conv 32 + FC 64), batch 30 (``benchmarks/gpate_speed.py``):

========  ==========  ================  =====================  ===============
K         iterations  glibc's default   freed memory kept      peak memory
========  ==========  ================  =====================  ===============
500       31          3.77 s/it         2.30 s/it (1.6x)       7.7 -> 8.9 GB
1000      16          10.99 s/it        4.16 s/it (2.6x)       13.7 -> 15.2 GB
========  ==========  ================  =====================  ===============

DP-SGD with per-sample hooks gains as much (its per-sample gradients are such blocks): 65 -> 47 ms
a DCGAN critic step, 102 -> 27 ms an MLP critic's (``benchmarks/dpsgd_overhead.py``).

The price is that memory: blocks freed between differently sized requests are reused only
in part (the heap settles after a few steps, 11-16 % above glibc's peak here), and the process
keeps its peak heap until it exits. Transparent huge pages (PyTorch's ``THP_MEM_ALLOC_ENABLE=1``)
cost no memory but gain less (3.12 s/it at K = 500: the kernel still zeroes every page) and
must be set before torch is imported. PyTorch's CPU tuning guide gets the same effect as this
module by preloading jemalloc or tcmalloc, which this needs no library for.

The command line calls it at start (set ``LIGHTNING_DPGAN_RETURN_FREED_MEMORY=1`` to keep
glibc's behaviour); it does nothing where the C library is not glibc.
"""
from __future__ import annotations

import ctypes
import os

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

#: ``M_TRIM_THRESHOLD`` -1: never hand the heap's free top back to the kernel (mallopt(3))
NEVER_TRIM = -1

#: set to 1 to leave glibc's defaults alone
OPT_OUT_VARIABLE = "LIGHTNING_DPGAN_RETURN_FREED_MEMORY"


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (the one whose mallopt options these are), else None."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # "glibc 2.36"; musl, macOS and Windows have none
            return None
        return ctypes.CDLL(None)  # the symbols already loaded into this process, mallopt among them
    except (ValueError, OSError, AttributeError):
        return None


def reuse_freed_memory() -> bool:
    """Make this process keep what it frees for reuse; True if applied.

    Freed blocks of any size go back to the heap instead of the kernel, so the next allocation
    of the same size costs no page faults. Big allocations made by other threads than the main
    one still go through ``mmap`` (glibc's per-thread heaps are capped at 64 MiB), as before.
    """
    if os.environ.get(OPT_OUT_VARIABLE, "") not in ("", "0"):
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
