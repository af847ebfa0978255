"""``SameRelease`` in one process: ranks are threads, the collective it uses is a stand-in.

``tests/test_ddp.py`` runs it in real process groups (slow); here each simulated rank calls
``setup`` in its own thread, and ``all_gather_object`` exchanges the digests the threads
actually pass, so what the callback guarantees can be checked in milliseconds: every rank stops
when any rank read another release than rank 0, and none stops when all read rank 0's.
"""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import lightning_dpgan.distributed as distributed
from lightning_dpgan.callbacks.same_release import SameRelease, StaleReleaseError, release_digest
from thread_world import ThreadWorld

RELEASE = ".released_preprocessing.pt"


class ReleaseWorld(ThreadWorld):
    def run(self, digests: list[int], stage: str = "fit") -> list[str]:
        """Each rank r's ``SameRelease(digests[r]).setup``: 'ok' or its error's type name."""
        def rank(r: int) -> str:
            module = SimpleNamespace(device=torch.device("cpu"))
            try:
                SameRelease(digests[r], RELEASE).setup(None, module, stage)
                return "ok"
            except StaleReleaseError as error:
                assert RELEASE in str(error)  # the message names the file to delete
                return "stale"

        return self.each_rank(rank)


@pytest.fixture
def world(monkeypatch):
    """Three ranks, with the process-group functions the callback calls routed to a ThreadWorld."""
    world = ReleaseWorld(3)
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)  # differs_from_rank_zero gathers
    monkeypatch.setattr(dist, "get_world_size", lambda: world.size)
    monkeypatch.setattr(dist, "all_gather_object", world.all_gather_object)
    return world


def test_every_rank_runs_when_all_read_rank_zeros_release(world):
    digest = release_digest(b"the released schema")
    assert world.run([digest] * 3) == ["ok", "ok", "ok"]


@pytest.mark.parametrize("stale_rank", [1, 2])
def test_every_rank_stops_when_one_rank_read_another_release(world, stale_rank):
    """Rank 0 (and the other rank that read the right file) must stop too: a run going on
    without the stale rank's peer would hang, or train on two releases."""
    digests = [release_digest(b"new release")] * 3
    digests[stale_rank] = release_digest(b"left by a killed run")
    assert world.run(digests) == ["stale", "stale", "stale"]


def test_only_the_fit_stage_is_checked(world):
    """Other stages (a validation or predict run) build no release: nothing to compare, no collective."""
    assert world.run([1, 2, 3], stage="validate") == ["ok", "ok", "ok"]
    assert world.gathers == 0


def test_one_process_makes_no_collective_call(monkeypatch):
    """Without a process group there is no peer: no broadcast or reduction may be attempted."""
    def refuse(*args, **kwargs):
        raise AssertionError("a collective call in a single process")

    monkeypatch.setattr(dist, "broadcast", refuse)
    monkeypatch.setattr(dist, "all_reduce", refuse)
    monkeypatch.setattr(dist, "all_gather_object", refuse)
    SameRelease(release_digest(b"x"), RELEASE).setup(None, SimpleNamespace(device=torch.device("cpu")), "fit")


def test_the_digest_is_the_first_eight_bytes_of_the_sha256_as_a_signed_int64():
    """It must fit the int64 tensor the ranks exchange, and carry 64 bits of the hash: 32 bits
    would let two releases collide after ~2^16 of them."""
    for content in (b"", b"release", bytes(range(256))):
        head = hashlib.sha256(content).digest()[:8]
        digest = release_digest(content)
        assert digest.to_bytes(8, "big", signed=True) == head
        assert torch.tensor([digest], dtype=torch.int64).item() == digest
    assert release_digest(b"release") != release_digest(b"releasf")
