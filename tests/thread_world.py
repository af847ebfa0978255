"""Ranks as threads, for DDP code tested in one process (``tests/test_ddp.py`` runs real process
groups, slowly): ``broadcast``, ``all_reduce`` and ``all_gather_object`` stand in for
``torch.distributed``'s and exchange what the threads actually pass."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class ThreadWorld:
    """Collectives over ``size`` threads: each call waits for every rank's tensor, then fills
    each caller's tensor in place with the result, as ``torch.distributed`` does."""

    REDUCE = {dist.ReduceOp.MAX: torch.amax, dist.ReduceOp.MIN: torch.amin, dist.ReduceOp.SUM: torch.sum}

    def __init__(self, size: int) -> None:
        self.size, self.barrier, self.local = size, threading.Barrier(size, timeout=10), threading.local()
        self.slots: list[torch.Tensor | None] = [None] * size
        self.reduce_ops: list[object] = []
        self.objects: list[Any] = [None] * size
        self.gathers = 0  # all_gather_object calls, counted once per collective

    def _exchange(self, tensor: torch.Tensor) -> torch.Tensor:
        self.slots[self.local.rank] = tensor.clone()
        self.barrier.wait()
        everyone = torch.stack(self.slots)  # type: ignore[arg-type]
        self.barrier.wait()  # all have read before any slot is reused
        return everyone

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        tensor.copy_(self._exchange(tensor)[src])

    def all_reduce(self, tensor: torch.Tensor, op: object = dist.ReduceOp.SUM) -> None:
        self.reduce_ops.append(op)
        tensor.copy_(self.REDUCE[op](self._exchange(tensor), dim=0))

    def all_gather_object(self, object_list: list[Any], obj: Any) -> None:
        self.objects[self.local.rank] = obj
        self.barrier.wait()
        object_list[:] = list(self.objects)
        if self.local.rank == 0:
            self.gathers += 1
        self.barrier.wait()  # all have read before any slot is reused

    def rank(self) -> int:
        return self.local.rank

    def each_rank(self, work: Callable[[int], Any]) -> list[Any]:
        """``work(r)`` in one thread per rank r; their results by rank. An error in any rank
        releases the others from the barrier and is raised here."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def run(r: int) -> None:
            self.local.rank = r
            try:
                results[r] = work(r)
            except BaseException as error:  # noqa: BLE001 - raised below, in the test's thread
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=run, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        if errors:
            raise errors[0]
        return results
