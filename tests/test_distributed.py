"""The collective helpers of ``lightning_dpgan.distributed`` and ``PrivateDDPStrategy``, in one
process: the arithmetic of shares and batches, the launcher's environment, and each collective's
rank logic against a stand-in for ``torch.distributed`` (tests/test_ddp.py runs the real
collectives on two processes, slowly; these say which rank keeps what, quickly)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_dpgan import ddp, distributed
from lightning_dpgan.distributed import (average_gradients, batches_per_process, decided_by_rank_zero,
                                         drawn_by_rank_zero, gather_shards_on_rank_zero, launched_as_follower,
                                         launched_as_machine_follower, launched_process_name, own_share_of_draw,
                                         rows_per_process, shard, sum_across_ranks)


# ------------------------------------------------------------------ shares and batches
@pytest.mark.parametrize("rows,processes,batch_size", [(100, 3, 10), (101, 4, 8), (20, 2, 10), (5, 2, 10), (7, 1, 3),
                                                       (9, 4, 2)])
def test_batches_per_process_are_those_of_a_distributed_sampler_and_a_loader_dropping_the_short_batch(
        rows, processes, batch_size):
    """The sanitizer plans its steps from this count: it must be what each process's loader
    yields (the distributed sampler's padded share, full batches only), or one batch of the
    whole share where the share is smaller than a batch (the table loader's case)."""
    for rank in range(processes):
        sampler = DistributedSampler(range(rows), num_replicas=processes, rank=rank, shuffle=False)
        share = len(sampler)
        assert rows_per_process(rows, processes) == share
        loader_batches = len(DataLoader(range(rows), batch_size=batch_size, sampler=sampler, drop_last=True))
        expected = loader_batches if share >= batch_size else 1
        assert batches_per_process(rows, processes, batch_size) == expected
    assert batches_per_process(5, 2, 10) == 1  # a share of 3 rows: one batch, not none


def test_a_rank_without_arguments_takes_its_own_shard_as_tensor_split_cuts_the_teachers(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    for rank, part in enumerate(torch.tensor_split(torch.arange(7), 3)):
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        assert list(range(7))[shard(7)] == part.tolist()


# ------------------------------------------------------------- the launcher's environment
LAUNCHER = ("LOCAL_RANK", "NODE_RANK", "RANK")


@pytest.mark.parametrize("environment,follower,machine_follower,name", [
    ({}, False, False, "node 0, local rank 0"),
    ({"LOCAL_RANK": "0", "NODE_RANK": "0", "RANK": ""}, False, False, "node 0, local rank 0"),  # empty reads as 0
    ({"LOCAL_RANK": "1"}, True, True, "node 0, local rank 1"),
    ({"NODE_RANK": "1", "LOCAL_RANK": "0"}, True, False, "node 1, local rank 0"),  # first process of machine 1
    ({"RANK": "1"}, True, False, "rank 1"),  # torchrun numbers the processes globally
    ({"RANK": "3", "LOCAL_RANK": "1", "NODE_RANK": "1"}, True, True, "rank 3"),
])
def test_the_launchers_environment_says_which_process_this_is(monkeypatch, environment, follower, machine_follower,
                                                              name):
    """Only global rank 0 writes the run's files; only a machine's first process prints what
    every process of that machine would print alike."""
    for variable in LAUNCHER:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert launched_as_follower() is follower
    assert launched_as_machine_follower() is machine_follower
    assert launched_process_name() == name


# ---------------------------------------------------- collectives, against a stand-in
class FakeDist:
    """``torch.distributed`` as seen by ``rank`` of ``world``: the other ranks' tensors are given
    (``others``: rank -> what that rank contributes or sends), the collectives apply them."""
    ReduceOp = SimpleNamespace(SUM="sum")

    def __init__(self, rank: int, world: int, others: dict[int, object] | None = None):
        self.rank, self.world, self.others, self.calls, self.sent = rank, world, others or {}, [], []

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_world_size(self):
        return self.world

    def get_rank(self):
        return self.rank

    def all_reduce(self, tensor, op):
        assert op == "sum"
        self.calls.append(("all_reduce", tensor.clone()))
        for other in self.others.values():
            tensor += other

    def broadcast(self, tensor, src):
        self.calls.append(("broadcast", src))
        if src != self.rank:
            tensor.copy_(self.others[src])
        else:
            self.sent.append(tensor.clone())

    def broadcast_object_list(self, objects, src):
        self.calls.append(("broadcast_object_list", src))
        if src != self.rank:
            objects[:] = self.others[src]


def test_one_process_draws_its_own_batch_and_each_rank_its_own_rows_of_one_draw_for_all(monkeypatch):
    """``--seed`` seeds every rank alike: each draws the rows of all W and keeps its own, so the
    shares are distinct and together the single draw of W * n."""
    asked = []

    def draw(count):
        asked.append(count)
        return torch.arange(count), None, torch.arange(count) * 10

    assert [part if part is None else part.tolist() for part in own_share_of_draw(draw, 3)] == [
        [0, 1, 2], None, [0, 10, 20]]
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    shares = []
    for rank in (0, 1):
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        labels, nothing, latent = own_share_of_draw(draw, 3)
        assert nothing is None and torch.equal(latent, labels * 10)
        shares.append(labels.tolist())
    assert shares == [[0, 1, 2], [3, 4, 5]]
    assert asked == [3, 6, 6]
    assert own_share_of_draw(lambda count: torch.arange(count) + 100, 2).tolist() == [102, 103]  # a single tensor
    assert own_share_of_draw(lambda count: None, 2) is None


@pytest.mark.parametrize("total,world", [(5, 2), (7, 3), (6, 3)])
def test_rank_zero_gathers_every_ranks_shard_and_the_others_keep_their_own(monkeypatch, total, world):
    """A checkpoint written by rank 0 holds all the teachers, in order: each shard comes through
    the padded buffer and only its own rows are kept (shards differ in size by one)."""
    whole = torch.arange(total * 2, dtype=torch.float32).reshape(total, 2)
    parts = [shard(total, index, world) for index in range(world)]
    longest = max(part.stop - part.start for part in parts)

    def padded(part):
        buffer = torch.full((longest, 2), -1.0)  # what a padding row holds is never kept
        buffer[: part.stop - part.start] = whole[part]
        return buffer

    for rank in range(world):
        fake = FakeDist(rank, world, {index: padded(part) for index, part in enumerate(parts) if index != rank})
        monkeypatch.setattr(distributed, "dist", fake)
        own = whole[parts[rank]].clone()
        gathered = gather_shards_on_rank_zero(own, total)
        if rank == 0:
            assert torch.equal(gathered, whole)
        else:
            assert gathered is own and torch.equal(own, whole[parts[rank]])
        assert [src for name, src in fake.calls if name == "broadcast"] == list(range(world))  # every rank, in turn
        (sent,) = fake.sent  # what this rank sent the others: its own shard, whatever its length
        assert torch.equal(sent[: len(own)], whole[parts[rank]])


def test_gradients_are_averaged_over_ranks_in_place_leaving_parameters_without_one_alone(monkeypatch):
    first, second, unused = (torch.nn.Parameter(torch.zeros(shape)) for shape in [(2, 2), (3,), (4,)])
    first.grad, second.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([5.0, 6.0, 7.0])
    other_rank = torch.tensor([3.0, 2.0, 1.0, 0.0, 1.0, 2.0, 3.0])  # the other rank's gradients, flattened in order
    fake = FakeDist(0, 2, {1: other_rank})
    monkeypatch.setattr(distributed, "dist", fake)
    average_gradients([first, unused, second])
    assert torch.equal(first.grad, torch.tensor([[2.0, 2.0], [2.0, 2.0]]))
    assert torch.equal(second.grad, torch.tensor([3.0, 4.0, 5.0]))
    assert unused.grad is None
    assert len(fake.calls) == 1  # one collective for all the gradients
    average_gradients([unused])  # no gradient at all: no collective
    assert len(fake.calls) == 1


def test_noise_and_decisions_are_rank_zeros_on_every_rank(monkeypatch):
    """The other ranks draw nothing (their random streams must not move) and take rank 0's."""
    drawn = []

    def draw():
        drawn.append(1)
        return torch.ones(3)

    monkeypatch.setattr(distributed, "dist", FakeDist(1, 2, {0: torch.full((3,), 7.0)}))
    assert drawn_by_rank_zero(draw, (3,), torch.float32, torch.device("cpu")).tolist() == [7.0, 7.0, 7.0]
    assert drawn == []
    monkeypatch.setattr(distributed, "dist", FakeDist(0, 2))
    assert drawn_by_rank_zero(draw, (3,), torch.float32, torch.device("cpu")).tolist() == [1.0, 1.0, 1.0]
    assert drawn == [1]
    monkeypatch.setattr(distributed, "dist", FakeDist(1, 2, {0: [True]}))
    assert decided_by_rank_zero(False) is True  # rank 0 stops: so does rank 1, whatever it would decide
    monkeypatch.setattr(distributed, "dist", FakeDist(1, 2, {0: [False]}))
    assert decided_by_rank_zero(True) is False


# ------------------------------------------------------------------ PrivateDDPStrategy
class Teachers(torch.nn.Module):
    """A public generator beside a shard of teachers that this rank alone owns."""

    def __init__(self):
        super().__init__()
        self.generator = torch.nn.Linear(2, 2)
        self.teacher = torch.nn.Linear(2, 1)
        self.register_buffer("steps", torch.zeros(1))

    def process_local_parameters(self):
        return list(self.teacher.parameters())


def private_ddp(module):
    strategy = ddp.PrivateDDPStrategy()
    strategy._lightning_module = module
    return strategy


def test_rank_zeros_start_reaches_every_parameter_and_buffer_but_the_teachers_shard(monkeypatch):
    module = Teachers()
    sent = []
    monkeypatch.setattr(ddp, "is_distributed", lambda: True)
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: sent.append((tensor.data_ptr(), src)))
    private_ddp(module).configure_ddp()
    public = [*module.generator.parameters(), module.steps]
    # by storage: ``tensor.data`` is a new object at each access, whose id CPython may reuse
    assert sorted(sent) == sorted((tensor.data_ptr(), 0) for tensor in public)


@pytest.mark.parametrize("reduces", [False, True])
def test_each_step_averages_the_public_gradients_unless_the_optimizer_reduces_its_own(monkeypatch, reduces):
    """Opacus' distributed DP optimizers add up the clipped sums and noise them once: averaged
    before, they would be mixed and noised on every rank. The teachers' shard is never averaged."""
    from lightning.pytorch.core.optimizer import LightningOptimizer

    module = Teachers()
    averaged, stepped = [], []
    monkeypatch.setattr(ddp, "average_gradients", lambda params: averaged.append([id(p) for p in params]))
    monkeypatch.setattr(ddp.DDPStrategy, "optimizer_step", lambda self, optimizer, closure, model=None, **kw: stepped.append(1))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    optimizer.reduces_gradients = reduces
    private_ddp(module).optimizer_step(LightningOptimizer(optimizer), lambda: None)
    assert stepped == [1]
    assert averaged == ([] if reduces else [[id(p) for p in module.generator.parameters()]])


def test_a_module_without_a_shard_has_no_process_local_parameters():
    assert ddp.process_local_parameters(torch.nn.Linear(2, 2)) == set()
    module = Teachers()
    assert ddp.process_local_parameters(module) == {id(p) for p in module.teacher.parameters()}


def test_as_many_teachers_as_processes_gives_each_process_one():
    """K equal to the world size is allowed: each rank holds exactly one teacher; one fewer is refused."""
    assert [shard(3, index, 3) for index in range(3)] == [slice(0, 1), slice(1, 2), slice(2, 3)]
    with pytest.raises(ValueError, match="each needs at least one"):
        shard(2, 0, 3)


class SummingDist:
    """``torch.distributed`` seen from one rank of two, the other contributing ``other``."""
    ReduceOp = SimpleNamespace(SUM="sum")

    def __init__(self, other: torch.Tensor) -> None:
        self.other, self.calls = other, []

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_world_size(self):
        return 2

    def get_rank(self):
        return 0

    def all_reduce(self, tensor, op):
        self.calls.append(op)
        if op == "sum":
            tensor += self.other


def test_vote_histograms_are_summed_over_ranks_in_place_and_left_alone_in_one_process(monkeypatch):
    """The aggregators add every rank's private counts before the noise: the sum, in place."""
    mine = torch.tensor([1.0, 0.0, 2.0])
    assert sum_across_ranks(mine.clone()).tolist() == [1.0, 0.0, 2.0]  # one process: unchanged
    fake = SummingDist(torch.tensor([3.0, 4.0, 5.0]))
    monkeypatch.setattr(distributed, "dist", fake)
    result = sum_across_ranks(mine)
    assert result is mine and mine.tolist() == [4.0, 4.0, 7.0]
    assert fake.calls == ["sum"]
