"""Code run inside two gloo processes by tests/test_ddp.py (module level, so spawn can import it).

``run_on_ranks(worker, *args)`` starts ``world`` processes joined in a gloo process group, calls
``worker(rank, *args)`` in each, and returns their results in rank order.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from lightning_dpgan.distributed import leave_process_group


def _entry(rank: int, world: int, directory: str, worker, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{directory}/group", rank=rank, world_size=world)
    try:
        torch.save(worker(rank, *args), f"{directory}/rank{rank}.tmp")
        os.replace(f"{directory}/rank{rank}.tmp", f"{directory}/rank{rank}.pt")  # present means complete
        # every rank is done with its collectives before any tears the group down: a rank that
        # destroys gloo's pairs while a peer still talks to them aborts ("terminate called
        # without an active exception", SIGABRT), a flaky failure seen once in ~5 suite runs
        leave_process_group()
        if dist.is_initialized():  # a non-zero exit, which fails the test (a SIGABRT after saving does not)
            raise SystemExit(f"rank {rank}: the process group outlived leave_process_group")
    finally:
        if dist.is_initialized():  # a worker that failed: no barrier, which could wait forever
            dist.destroy_process_group()


def run_on_ranks(worker, *args, world: int = 2) -> list:
    with tempfile.TemporaryDirectory() as directory:
        results = [Path(directory) / f"rank{rank}.pt" for rank in range(world)]
        try:
            torch.multiprocessing.spawn(_entry, args=(world, directory, worker, args), nprocs=world, join=True)
        except torch.multiprocessing.ProcessExitedException as error:
            # gloo's teardown still aborts now and then (SIGABRT, "terminate called without an
            # active exception") after every rank has saved its results: those are complete and
            # are what the tests check. A rank that died before saving is a real failure.
            if error.signal_name != "SIGABRT" or not all(path.is_file() for path in results):
                raise
        return [torch.load(path, weights_only=False) for path in results]


# ------------------------------------------------------------------------ DP-SGD
def seeded_linear(inputs: int, outputs: int, seed: int, bias: bool = True) -> nn.Module:
    """The same initial parameters in every process and in the reference (without touching the
    global random stream, which is each rank's own)."""
    layer = nn.Linear(inputs, outputs, bias=bias)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) - 0.5)
    return layer


def dp_sgd_net() -> nn.Module:
    return seeded_linear(6, 3, seed=0)


def dp_sgd_records(count: int = 8) -> torch.Tensor:
    return torch.randn(count, 6, generator=torch.Generator().manual_seed(5)) * 3


def dp_sgd_steps(records: torch.Tensor, noise_multiplier: float, steps: int, mode: str, expected_batch: int,
                 zero_loss: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``steps`` DP-SGD steps (SGD, lr 1) of :func:`dp_sgd_net` on ``records``; returns each
    step's parameter change (flattened) and the final parameters."""
    from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism

    net = dp_sgd_net()
    mechanism = DPSGDMechanism(noise_multiplier, 0.5, expected_batch, mode=mode)
    mechanism.attach(net)
    optimizer = mechanism.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=1.0))
    changes = []
    for _ in range(steps):
        before = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
        optimizer.zero_grad()
        per_record = (net(records) ** 2).sum(1)
        mechanism.backward_real(per_record * 0.0 if zero_loss else per_record)
        optimizer.step()
        changes.append(torch.cat([p.detach().flatten() for p in net.parameters()]) - before)
    return changes, torch.cat([p.detach().flatten() for p in net.parameters()])


def dp_sgd_worker(rank: int, noise_multiplier: float, steps: int, mode: str, zero_loss: bool) -> tuple:
    """Rank r trains on its half of the records; the expected batch is the global one (8)."""
    torch.manual_seed(100 + rank)  # each rank's own random stream: only rank 0's may noise
    records = dp_sgd_records().chunk(2)[rank]
    return dp_sgd_steps(records, noise_multiplier, steps, mode, expected_batch=8, zero_loss=zero_loss)


# ------------------------------------------------------------------ PATE, G-PATE
def pate_votes() -> torch.Tensor:
    """Binary predictions of K = 7 teachers on Q = 50 queries, ``[K, Q]``."""
    return (torch.rand(7, 50, generator=torch.Generator().manual_seed(3)) < 0.6).long()


def pate_answers(predictions: torch.Tensor, seed: int) -> tuple[torch.Tensor, list]:
    """The PATE aggregator's answers to ``predictions`` (a shard of the teachers), and what it charged."""
    from lightning_dpgan.privacy.noise_source import NoiseSource
    from lightning_dpgan.privacy.pate import PATELabelAggregator

    charged = []
    aggregator = PATELabelAggregator(0.3, on_answer=lambda lam, gaps: charged.append(gaps.tolist()),
                                     noise=NoiseSource(seed))
    ones = predictions.sum(0)
    votes = torch.stack([predictions.shape[0] - ones, ones], dim=1)
    return aggregator.aggregate(votes), charged


def pate_worker(rank: int, seed: int) -> tuple:
    from lightning_dpgan.distributed import shard

    return pate_answers(pate_votes()[shard(7)], seed + rank * 1000)  # only rank 0's stream may matter


def teacher_gradients() -> torch.Tensor:
    """Input gradients of K = 9 teachers on B = 6 records of 20 features, ``[K, B, 20]``."""
    return torch.randn(9, 6, 20, generator=torch.Generator().manual_seed(4)) * 1e-3


def gpate_answers(gradients: torch.Tensor, seed: int, total_teachers: int = 9) -> tuple[torch.Tensor, list]:
    from lightning_dpgan.privacy.gradient_voting import ProjectedGradientAggregator
    from lightning_dpgan.privacy.noise_source import NoiseSource

    checked, charged = [], []
    aggregator = ProjectedGradientAggregator(
        projection_dim=4, bins=5, clip=2e-3, sigma1=1.0, sigma2=0.5, threshold=0.4 * total_teachers,
        check=lambda votes: checked.append(votes.clone()), charge=lambda votes, answered: charged.append(answered.clone()),
        noise=NoiseSource(seed))
    torch.manual_seed(seed)  # the projections (public) come from the global stream
    return aggregator.aggregate(gradients), [checked, charged]


def gpate_worker(rank: int, seed: int) -> tuple:
    from lightning_dpgan.distributed import shard

    return gpate_answers(teacher_gradients()[shard(9)], seed + rank * 1000)


def gather_worker(rank: int, total: int) -> torch.Tensor:
    from lightning_dpgan.distributed import gather_shards_on_rank_zero, shard

    full = torch.arange(total * 3, dtype=torch.float32).reshape(total, 3)
    return gather_shards_on_rank_zero(full[shard(total)].clone(), total)


def joined_worker(rank: int) -> tuple[int, bool]:
    """This rank and whether it is in a group of 2: ``_entry`` then has it leave the group."""
    return dist.get_rank(), dist.is_initialized() and dist.get_world_size() == 2


def teacher_models() -> list:
    """G-PATE (conv teachers, vmap) and PATE-GAN (MLP teachers, batched matmul) modules, unbuilt."""
    from lightning_dpgan.modules.gpate import GPATE
    from lightning_dpgan.modules.pategan import PATEGAN

    return [GPATE((1, 12, 12), 3, teacher_kwargs={"channels": 2, "hidden": 4}), PATEGAN((6,), teacher_hidden=(5,))]


def teacher_build_worker(rank: int, num_teachers: int) -> list[dict[str, torch.Tensor]]:
    """Each rank builds only its shard of the teachers (from the same seed); rank 0 returns them
    gathered, rank 1 its own shard."""
    from lightning_dpgan.distributed import gather_shards_on_rank_zero, shard

    built = []
    for model in teacher_models():
        torch.manual_seed(0)
        model.build_teachers(num_teachers, shard(num_teachers))
        assert model.teacher_shard == shard(num_teachers)
        built.append({name: gather_shards_on_rank_zero(value.detach(), num_teachers)
                      for name, value in model.teachers.named_parameters()})
    return built


# ------------------------------------------------------------------- sanitizer
def sanitizer_generator() -> nn.Module:
    return seeded_linear(5, 4, seed=1, bias=False)


def sanitizer_latents(count: int = 8) -> torch.Tensor:
    return torch.randn(count, 5, generator=torch.Generator().manual_seed(6))


def sanitized_gradient(latents: torch.Tensor, noise_multiplier: float, critic_scale: float) -> torch.Tensor:
    """The generator's gradient after one sanitized pass of ``latents`` (averaged over ranks
    under DDP, as :class:`~lightning_dpgan.ddp.PrivateDDPStrategy` does for the generator)."""
    from lightning_dpgan.distributed import average_gradients
    from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism

    generator = sanitizer_generator()
    mechanism = GradientSanitizerMechanism(max_norm=0.05, noise_multiplier=noise_multiplier)
    generated = mechanism.sanitize(generator(latents))
    critic = torch.linspace(-1.0, 2.0, 4) * critic_scale
    (generated ** 2 @ critic).mean().backward()  # a batch-mean loss, as the modules' are
    average_gradients(list(generator.parameters()))
    return generator.weight.grad.detach().flatten().clone()


def sanitizer_worker(rank: int, noise_multiplier: float, critic_scale: float, draws: int) -> list[torch.Tensor]:
    torch.manual_seed(200 + rank)
    latents = sanitizer_latents().chunk(2)[rank]
    return [sanitized_gradient(latents, noise_multiplier, critic_scale) for _ in range(draws)]


def poisson_worker(rank: int, records: int, batch_size: int, epochs: int) -> list[list[int]]:
    """The record indices of every batch DP-SGD's distributed Poisson loader gives this rank."""
    from types import SimpleNamespace

    from torch.utils.data import TensorDataset

    from lightning_dpgan.callbacks.dp_sgd import DPSGD

    strategy = DPSGD(noise_multiplier=1.0)
    strategy.sample_rate = batch_size / records
    datamodule = SimpleNamespace(train_dataset=TensorDataset(torch.arange(records)), hparams=SimpleNamespace(num_workers=0))
    strategy._use_poisson_sampling(datamodule)
    return [batch[0].tolist() for _ in range(epochs) for batch in datamodule.train_dataloader()]


def same_release_worker(rank: int, digests: list[int]) -> str:
    """Rank r checks the release it read (``digests[r]``) against rank 0's: 'ok' or the error."""
    from lightning_dpgan.callbacks.same_release import SameRelease, StaleReleaseError

    module = nn.Linear(1, 1)
    module.device = torch.device("cpu")
    try:
        SameRelease(digests[rank], ".released_preprocessing.pt").setup(None, module, "fit")
    except StaleReleaseError as error:
        return str(error)
    return "ok"


def query_worker(rank: int) -> list:
    """Each teacher model's query inputs on this rank, its global random stream its own."""
    results = []
    for model in teacher_models():  # G-PATE (labelled) and PATE-GAN
        torch.manual_seed(100 + rank)  # each rank's global stream its own
        latent, labels = model.query_inputs(6)
        results.append((latent, labels))
    return results


def answer_worker(rank: int) -> list[int]:
    """Each rank's loader drew its own secret answering critic (here: its rank)."""
    from lightning_dpgan.modules.gswgan import GSWGAN

    module = GSWGAN((6,), num_critics=3, discriminator_kwargs={"hidden": (8,)})
    seen = []
    module.selected_critic_iteration = lambda trained, answer, records, labels: seen.append(answer)
    module.training_step({"critic": 0, "answer": rank + 1, "records": torch.zeros(1, 2, 6), "labels": None}, 0)
    return seen


def generated_share_worker(rank: int, n: int) -> tuple:
    """A training step's generated labels and latent codes on this rank, every rank seeded alike
    (as --seed seeds them), and the state of the random stream afterwards."""
    from lightning_dpgan.modules.gan import GAN

    torch.manual_seed(7)
    labels, latent = GAN((6,), num_classes=3).generated_share(n)
    return labels, latent, torch.rand(1)
