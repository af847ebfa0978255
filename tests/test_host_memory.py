"""The command line keeps freed host memory for reuse: a large CPU tensor allocated again after
being freed costs no new page faults (glibc would otherwise map and fault it in every time)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from lightning_dpgan import cli, host_memory

# In a fresh process (the setting is process-wide): allocate, fill and free a 128 MiB tensor
# WARMUP times (until the heap has settled), then ROUNDS more; print the minor page faults of
# those ROUNDS, the bytes glibc mapped for the last block (mallinfo's hblkhd, before and while it
# was alive), and the call's result.
WARMUP, ROUNDS = 12, 4
PROBE = f"""
import ctypes, json, resource, sys, torch
from lightning_dpgan.host_memory import reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "reuse" else None
class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo.restype = MallInfo
mapped = 0
def one_round():
    global mapped
    held = libc.mallinfo().hblkhd
    block = torch.empty(32 * 2**20)
    block.fill_(1.0)
    mapped = libc.mallinfo().hblkhd - held
    del block
for _ in range({WARMUP}):
    one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({ROUNDS}):
    one_round()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({{"faults": faults, "mapped": mapped, "applied": applied}}))
"""
BLOCK_BYTES = 128 * 2**20
PAGES_PER_ROUND = BLOCK_BYTES // os.sysconf("SC_PAGE_SIZE")


def _huge_pages_always() -> bool:
    """Transparent huge pages for every mapping: then a fresh mapping faults per 2 MiB."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            return "[always]" in setting.read()
    except OSError:
        return False


def _probe(mode: str, **env: str) -> dict:
    # neither the caller's opt-out nor PyTorch's huge pages (which would change the fault count)
    environment = {k: v for k, v in os.environ.items() if k not in (host_memory.OPT_OUT_VARIABLE, "THP_MEM_ALLOC_ENABLE")}
    environment.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=environment)
    return json.loads(out.stdout.strip().splitlines()[-1])


needs_glibc = pytest.mark.skipif(host_memory._glibc() is None, reason="the setting is glibc's (Linux); elsewhere it is a no-op")


@needs_glibc
def test_a_freed_block_is_reused_without_faulting_its_pages_in_again() -> None:
    default = _probe("default")
    reused = _probe("reuse")
    assert reused["applied"] is True
    # glibc's default maps each block afresh (and unmaps it on free), so every round faults its
    # pages in again (counted in 4 KiB pages unless the kernel backs the mapping with huge pages)
    assert default["mapped"] >= BLOCK_BYTES
    if not _huge_pages_always():
        assert default["faults"] >= (ROUNDS - 0.5) * PAGES_PER_ROUND
    # kept in the heap: no mapping, and once the heap has settled no round faults its pages in
    assert reused["mapped"] == 0
    assert reused["faults"] <= 0.1 * PAGES_PER_ROUND


@needs_glibc
def test_the_opt_out_variable_keeps_glibcs_behaviour() -> None:
    opted_out = _probe("reuse", **{host_memory.OPT_OUT_VARIABLE: "1"})
    assert opted_out["applied"] is False
    assert opted_out["mapped"] >= BLOCK_BYTES


def test_every_command_line_run_applies_it_first(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "reuse_freed_memory", lambda: calls.append("called"))
    assert cli.main(["no-such-command"]) == 2
    assert calls == ["called"]


@pytest.mark.parametrize("value,applied", [(None, True), ("", True), ("0", True), ("1", False), ("yes", False)])
def test_only_a_set_opt_out_variable_keeps_glibcs_behaviour(monkeypatch, value, applied):
    """``LIGHTNING_DPGAN_RETURN_FREED_MEMORY=0`` (or empty) is not an opt-out: freed memory is still kept."""
    from lightning_dpgan import host_memory

    calls = []
    fake_libc = SimpleNamespace(mallopt=lambda option, setting: calls.append((option, setting)) or 1)
    monkeypatch.setattr(host_memory, "_glibc", lambda: fake_libc)
    if value is None:
        monkeypatch.delenv(host_memory.OPT_OUT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(host_memory.OPT_OUT_VARIABLE, value)
    assert host_memory.reuse_freed_memory() is applied
    assert bool(calls) is applied
