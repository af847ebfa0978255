"""The few collective operations private training needs across processes (DDP).

A mechanism that runs in several processes must release what the single-process mechanism
releases: the private quantities of every rank are added up (vote histograms, sums of clipped
gradients), the noise is drawn once, on rank 0, and every rank then holds rank 0's answer.
These helpers say that in one word each, and do nothing in a single process, so the same code
path serves both.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# which process of a launched run this is: read from the launcher's environment alone, kept where
# the command line can ask it without importing torch (re-exported here with the collectives)
from lightning_dpgan.launch_env import (
    launched_as_follower,
    launched_as_machine_follower,
    launched_process_name,
    quiet_machine_followers,
    say_once_per_machine,
)


def is_distributed() -> bool:
    """True inside a process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_rank_zero() -> bool:
    return rank() == 0


def rows_per_process(rows: int, processes: int) -> int:
    """The training records each of ``processes`` reads through Lightning's distributed sampler:
    ceil(rows / processes) (it pads the last share with repeats), all of them in one process."""
    return math.ceil(rows / processes)


def batches_per_process(rows: int, processes: int, batch_size: int) -> int:
    """Batches each process takes in an epoch of the datamodules' training loaders: the full
    batches of its share (they drop a short last one), or its whole share as one batch when
    that is smaller than a batch (the table loader; the image loader refuses it)."""
    share = rows_per_process(rows, processes)
    return share // batch_size if share >= batch_size else 1


def own_share_of_draw(draw: Callable[[int], Any], n: int) -> Any:
    """This process's ``n`` rows of a random draw of ``n`` per process (a tensor, a tuple of
    tensors, or None). ``--seed`` seeds every process alike, so ``draw(n)`` in each would give
    them all the same rows: a batch generated in W shares would hold each row W times. Each
    process draws the rows of all W and keeps its own, so the shares are distinct rows, as one
    process's batch is, and the random states stay in step. In one process: ``draw(n)``."""
    processes = world_size()
    if processes == 1:
        return draw(n)
    own = slice(rank() * n, (rank() + 1) * n)
    drawn = draw(n * processes)
    if isinstance(drawn, tuple):
        return tuple(None if part is None else part[own] for part in drawn)
    return None if drawn is None else drawn[own]


def shard(total: int, index: int | None = None, count: int | None = None) -> slice:
    """This rank's contiguous share of ``total`` items (teachers), as ``torch.tensor_split``
    cuts them: the first ``total % count`` ranks hold one more. Every rank holds at least one."""
    index = rank() if index is None else index
    count = world_size() if count is None else count
    if total < count:
        raise ValueError(f"{total} teachers cannot be shared among {count} processes: each needs at least one")
    base, extra = divmod(total, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def leave_process_group() -> None:
    """The end of a run of several processes, once rank 0 has written its outputs: wait until
    every process gets here, then tear this process's group down. The other processes used to
    exit while rank 0 was still writing, and one that aborted in gloo's teardown (SIGABRT,
    "terminate called without an active exception", now and then) had Lightning's launcher kill
    rank 0 mid-write; and Lightning destroys only NCCL groups itself. A peer that is gone (killed)
    costs only a warning: this process's work is done. Nothing to do in one process, nor to a
    group of one that the caller made."""
    if not is_distributed():
        return
    try:
        dist.barrier()
    except RuntimeError as error:  # gloo's and NCCL's errors are RuntimeErrors
        warnings.warn(f"another process of the run ended before this one could leave the process group with it "
                      f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); this process's "
                      "part of the run was complete", stacklevel=2)
    dist.destroy_process_group()


def sum_across_ranks(tensor: Tensor) -> Tensor:
    """``tensor`` summed over all ranks (in place; returned for chaining)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def differs_from_rank_zero(value: Any) -> bool:
    """Whether any process holds another ``value`` (a picklable digest) than rank 0: the same
    answer on every process, so that all stop together or none does (a collective: every process
    must call it). Object collectives, so it holds on any backend and device. False in one process."""
    if not is_distributed():
        return False
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return any(other != values[0] for other in values)


def from_rank_zero(tensor: Tensor) -> Tensor:
    """Rank 0's ``tensor`` on every rank (in place; returned). Other ranks pass a tensor of the
    same shape and dtype, whose content is ignored."""
    if is_distributed():
        dist.broadcast(tensor, src=0)
    return tensor


def drawn_by_rank_zero(draw: Callable[[], Tensor], shape: tuple[int, ...], dtype: torch.dtype,
                       device: torch.device) -> Tensor:
    """``draw()`` on rank 0 and its result on every rank (other ranks draw nothing): noise and
    projections drawn once under DDP. ``shape``/``dtype``/``device`` are the result's. A single
    process just draws."""
    value = draw() if is_rank_zero() else torch.empty(shape, dtype=dtype, device=device)
    return from_rank_zero(value)


def decided_by_rank_zero(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank: decisions that must be taken together (stop training)."""
    if not is_distributed():
        return flag
    decision = [bool(flag)]
    dist.broadcast_object_list(decision, src=0)
    return decision[0]


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replace each gradient by its mean over ranks, in one collective. Parameters without a
    gradient are left alone; every rank must have gradients for the same parameters (the
    modules take the same code path on every rank)."""
    if not is_distributed():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def gather_shards_on_rank_zero(tensor: Tensor, total: int) -> Tensor:
    """On rank 0, every rank's shard (its :func:`shard` of ``total`` rows along dim 0) put back
    together in host memory; on the other ranks, their own shard unchanged.

    This is how a checkpoint gets all K teachers: rank 0 alone writes it, so only rank 0 holds
    them, in host memory. The shards travel one rank at a time through one shard-sized buffer
    per device (an all-gather would put the whole ensemble on every device at once, the memory
    sharding saves). Shards may differ in size by one row: they are padded for the collective."""
    if not is_distributed():
        return tensor
    count = dist.get_world_size()
    parts = [shard(total, index, count) for index in range(count)]
    buffer = tensor.new_zeros((max(part.stop - part.start for part in parts), *tensor.shape[1:]))
    whole = torch.empty((total, *tensor.shape[1:]), dtype=tensor.dtype) if is_rank_zero() else None
    for source, part in enumerate(parts):
        if rank() == source:
            buffer[: tensor.shape[0]] = tensor
        dist.broadcast(buffer, src=source)
        if whole is not None:
            whole[part] = buffer[: part.stop - part.start].cpu()
    return whole if whole is not None else tensor


__all__ = [
    "average_gradients", "batches_per_process", "decided_by_rank_zero", "drawn_by_rank_zero", "from_rank_zero",
    "gather_shards_on_rank_zero", "is_distributed", "is_rank_zero", "launched_as_follower", "leave_process_group",
    "launched_as_machine_follower", "launched_process_name", "own_share_of_draw", "quiet_machine_followers", "rank",
    "rows_per_process", "say_once_per_machine", "shard", "sum_across_ranks", "world_size",
]
