"""Poisson-sampled batches at the cost of a batch, not of the whole table.

DP-SGD's accountant (the subsampled Gaussian's RDP) assumes that each record joins each batch
independently with probability ``q``. Opacus' ``UniformWithReplacementSampler`` draws that by
one uniform number per record per batch: ``1/q`` batches an epoch of ``N`` draws each, so an
epoch costs ``N²/B``. QUAIL's label model, a linear layer whose steps cost almost nothing,
spent 118 s of its training in that sampler alone at 800,000 rows (1.1 s at 80,000).

:class:`PoissonBatches` draws the same law another way: the batch size is
``Binomial(N, q)`` -- the number of records a Poisson sample holds -- and given its size, a
Poisson sample is equally likely to be any set of that many records, so that many distinct
records are drawn uniformly. Distinct records come from uniform draws with repeats set aside
(a batch is a small share of the table: few repeats), so a batch costs about its size. Every
draw comes from the mechanism's own generator (:mod:`lightning_dpgan.privacy.noise_source`):
the batches' secrecy is what the amplification by subsampling rests on.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class PoissonBatches(Sampler[list[int]]):
    """``steps`` batches (default ``int(1 / sample_rate)``, an epoch as Opacus counts it), each
    holding each of ``num_samples`` records independently with probability ``sample_rate``;
    indices ascending, as Opacus' sampler gives them."""

    def __init__(self, num_samples: int, sample_rate: float, generator: torch.Generator | None = None,
                 steps: int | None = None) -> None:
        if num_samples < 1:
            raise ValueError(f"Poisson batches need at least one record, got {num_samples}")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"the Poisson rate is a probability in (0, 1], got {sample_rate}")
        self.num_samples = num_samples
        self.sample_rate = sample_rate
        self.generator = generator
        self.steps = int(1 / sample_rate) if steps is None else steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield self.draw()

    def draw(self) -> list[int]:
        """One batch: its size from ``Binomial(N, q)``, then that many distinct records uniformly."""
        size = int(torch.binomial(torch.tensor(float(self.num_samples)), torch.tensor(float(self.sample_rate)),
                                  generator=self.generator))
        return sorted(distinct_uniform(self.num_samples, size, self.generator))


def distinct_uniform(population: int, size: int, generator: torch.Generator | None = None) -> set[int]:
    """``size`` distinct integers of ``range(population)``, every such set equally likely.

    Uniform draws, each one kept unless it repeats an earlier one, until ``size`` are kept. The
    set this ends with is equally likely to be any set of ``size`` (the draws do not favour any
    label), and each round draws only the numbers still missing, so it never overshoots: it is
    that process, its draws taken a round at a time."""
    if not 0 <= size <= population:
        raise ValueError(f"cannot draw {size} distinct records of {population}")
    if size > population // 2:  # repeats would be common: shuffle the whole range instead
        return set(torch.randperm(population, generator=generator)[:size].tolist())
    kept: set[int] = set()
    while len(kept) < size:
        kept.update(torch.randint(population, (size - len(kept),), generator=generator).tolist())
    return kept


__all__ = ["PoissonBatches", "distinct_uniform"]
