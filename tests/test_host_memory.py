"""The command line keeps freed host memory for reuse: a large CPU tensor allocated again after
being freed costs no new page faults (glibc would otherwise map and fault it in every time)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lightning_dpgan import cli, host_memory

# In a fresh process (the setting is process-wide): allocate, fill and free a 128 MiB tensor
# WARMUP times (until the heap has settled), then ROUNDS more, and print the minor page faults of
# those ROUNDS, and the call's result.
WARMUP, ROUNDS = 12, 4
PROBE = f"""
import json, resource, sys, torch
from lightning_dpgan.host_memory import reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "reuse" else None
def one_round():
    block = torch.empty(32 * 2**20)
    block.fill_(1.0)
    del block
for _ in range({WARMUP}):
    one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({ROUNDS}):
    one_round()
print(json.dumps({{"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "applied": applied}}))
"""
PAGES_PER_ROUND = 128 * 2**20 // os.sysconf("SC_PAGE_SIZE")


def _probe(mode: str, **env: str) -> dict:
    environment = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=environment)
    return json.loads(out.stdout.strip().splitlines()[-1])


needs_glibc = pytest.mark.skipif(host_memory._glibc() is None, reason="the setting is glibc's (Linux); elsewhere it is a no-op")


@needs_glibc
def test_a_freed_block_is_reused_without_faulting_its_pages_in_again() -> None:
    default = _probe("default")
    reused = _probe("reuse")
    assert reused["applied"] is True
    # glibc's default maps each round afresh: every round faults its pages in
    assert default["faults"] >= (ROUNDS - 0.5) * PAGES_PER_ROUND
    # kept in the heap: once it has settled, no round faults its pages in again
    assert reused["faults"] <= 0.1 * PAGES_PER_ROUND


@needs_glibc
def test_the_opt_out_variable_keeps_glibcs_behaviour() -> None:
    opted_out = _probe("reuse", **{host_memory.OPT_OUT_VARIABLE: "1"})
    assert opted_out["applied"] is False
    assert opted_out["faults"] >= (ROUNDS - 0.5) * PAGES_PER_ROUND


def test_every_command_line_run_applies_it_first(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "reuse_freed_memory", lambda: calls.append("called"))
    assert cli.main(["no-such-command"]) == 2
    assert calls == ["called"]
