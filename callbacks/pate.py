"""``PATEAggregation``: the PATE privacy strategy (PATE-GAN, later PATE-CTGAN).

It asks the datamodule for K disjoint partitions of the *training* split, gives the module K
teachers and a loader that hands each teacher minibatches from its own partition only (fixed
for the whole run and saved in checkpoints), installs the Laplace noisy-argmax label
aggregator (:mod:`lightning_dpgan.privacy.pate`), and owns the PATE moments accountant.

Sensitivity and noise are stated in :func:`lightning_dpgan.privacy.mechanisms.laplace_noisy_argmax`;
the bounds in :mod:`lightning_dpgan.privacy.analysis.pate`. Both the data-dependent epsilon and
the data-independent bound are reported; ``accounting`` picks which one stops training.

Stopping. With ``data-independent`` accounting every query costs the same and
``PrivacyBudgetStopping`` plans exactly. With ``data-dependent`` accounting a query's cost is
known only once the teachers have voted, so the look-ahead (:meth:`epsilon_if`) is the cheapest
case (unanimous votes), and the hard stop is at query time: before any noisy answer is drawn,
the strategy computes epsilon with these queries' vote gaps and refuses to answer (the module
stops) if it would pass the target. The reported epsilon therefore never exceeds the target.
As in PATE-GAN, the stopping time then depends on the data, like the data-dependent epsilon.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lightning_dpgan.callbacks.strategy import PrivacyStrategy
from lightning_dpgan.data.partition import PartitionedSampler
from lightning_dpgan.privacy.accountants import PATEMomentsAccountant
from lightning_dpgan.privacy.pate import PATELabelAggregator
from lightning_dpgan.privacy.slots import LabelAggregator, PrivacyBudgetExhausted
from lightning_dpgan.privacy.validation import validate_positive

#: PATE-GAN's default number of teachers: N / 1000 (the paper's appendix; at least 1).
RECORDS_PER_TEACHER = 1000


class TeacherBatches(IterableDataset):
    """``steps`` draws per epoch; each is ``teacher_steps`` stacked draws ``[nT, K, b, ...]``."""

    def __init__(self, sampler: PartitionedSampler, teacher_steps: int, steps: int) -> None:
        self.sampler, self.teacher_steps, self.steps = sampler, teacher_steps, steps

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor | None]]:
        for _ in range(self.steps):
            draws = [self.sampler.draw() for _ in range(self.teacher_steps)]
            records = torch.stack([records for records, _ in draws])
            labels = None if draws[0][1] is None else torch.stack([labels for _, labels in draws])
            yield records, labels

    def __len__(self) -> int:
        return self.steps


class PATEAggregation(PrivacyStrategy):
    """PATE: K teachers on disjoint partitions, Laplace noisy-argmax votes (PATE-GAN)."""

    name: ClassVar[str] = "pate"
    slot: ClassVar[type] = LabelAggregator
    mechanism_name: ClassVar[str] = "pate (Laplace noisy argmax of teacher votes)"

    def __init__(
        self,
        num_teachers: int | None = None,
        lap_inverse_scale: float = 1.0,
        teacher_batch_size: int = 64,
        accounting: str = "data-dependent",
        partition_seed: int = 0,
        target_epsilon: float | None = None,
        delta: float | None = None,
    ) -> None:
        super().__init__(target_epsilon, delta)
        if num_teachers is not None and num_teachers < 1:
            raise ValueError(f"--privacy.num_teachers must be at least 1, got {num_teachers}")
        self.num_teachers = num_teachers
        self.lap_inverse_scale = validate_positive("--privacy.lap_inverse_scale", lap_inverse_scale)
        if teacher_batch_size < 1:
            raise ValueError(f"--privacy.teacher_batch_size must be at least 1, got {teacher_batch_size}")
        self.teacher_batch_size = teacher_batch_size
        self.accountant = PATEMomentsAccountant(accounting)  # validates the mode early
        self.accounting = accounting
        self.partition_seed = partition_seed
        self.sampler: PartitionedSampler | None = None
        self.queries_per_step: int | None = None
        self.steps = 0

    # ----------------------------------------------------------------- install
    def install(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.world_size > 1:
            raise NotImplementedError("pate under multi-process training (DDP) is not supported yet; use --devices 1")
        datamodule = trainer.datamodule
        records = datamodule.train_dataset.tensors[0]
        k = self.num_teachers or max(1, self.train_records // RECORDS_PER_TEACHER)
        if k > self.train_records:
            raise ValueError(f"--privacy.num_teachers {k} exceeds the {self.train_records} training records")
        self.num_teachers = k
        partitions = datamodule.partitions(k, self.partition_seed)
        smallest = min(len(part) for part in partitions)
        self.sampler = PartitionedSampler(records, partitions, self.teacher_batch_size,
                                          replacement=self.teacher_batch_size > smallest, seed=self.partition_seed)
        pl_module.build_teachers(k)
        pl_module.privacy = PATELabelAggregator(self.lap_inverse_scale, self._charge)
        teacher_steps = pl_module.hparams.teacher_steps
        self.queries_per_step = pl_module.hparams.student_steps * self.teacher_batch_size
        steps_per_epoch = max(1, math.ceil(smallest / (self.teacher_batch_size * teacher_steps)))
        loader_data = TeacherBatches(self.sampler, teacher_steps, steps_per_epoch)
        datamodule.train_dataloader = lambda: DataLoader(loader_data, batch_size=None)

    # -------------------------------------------------------------- accounting
    def _charge(self, lap_inverse_scale: float, vote_gaps: np.ndarray) -> None:
        """Charge these queries, or refuse them if they would pass the target."""
        if self.training_target is not None:
            after = self.accountant.epsilon_if_answered(self.training_delta, lap_inverse_scale, vote_gaps)
            if after > self.training_target:
                raise PrivacyBudgetExhausted(f"answering would spend epsilon {after:.4g} > {self.training_target:g} left")
        self.accountant.step(lap_inverse_scale, vote_gaps)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        self.steps = pl_module.train_steps  # a step refused for the budget does not count

    def steps_taken(self) -> int:
        return self.steps

    def next_step_params(self) -> dict[str, float]:
        return {"lap_inverse_scale": self.lap_inverse_scale}

    def plan_key(self) -> tuple:
        # Data-dependent spend depends on the votes: re-plan after every step.
        return (self.lap_inverse_scale, self.steps if self.accounting == "data-dependent" else 0)

    def training_epsilon_if(self, steps: int) -> float:
        """Epsilon after ``steps`` more steps: exact for data-independent accounting; for
        data-dependent accounting the cheapest case (all teachers agree), since the hard stop
        happens at query time (see the module docstring)."""
        queries = steps * self.queries_per_step
        unanimous = None if self.accounting == "data-independent" else self.num_teachers
        return self.accountant.epsilon_if_queries(self.training_delta, queries, self.lap_inverse_scale, unanimous)

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "steps": self.steps,
                "sampler": self.sampler.state_dict() if self.sampler else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.steps = int(state_dict["steps"])
        self.sampler.load_state_dict(state_dict["sampler"])  # same partitions, same draws

    def report_parameters(self) -> dict[str, Any]:
        sizes = [len(part) for part in self.sampler.partitions] if self.sampler else []
        return {
            "accounting": self.accounting,
            "epsilon_data_dependent": self.preprocessing["epsilon"] + self.accountant.epsilon_data_dependent(self.training_delta),
            "epsilon_data_independent": self.preprocessing["epsilon"] + self.accountant.epsilon_data_independent(self.training_delta),
            "note": "epsilon_data_dependent depends on the teachers' votes, hence on the private data; "
                    "it is not itself differentially private. epsilon_data_independent is a bound that holds "
                    "whatever the votes.",
            "lap_inverse_scale": self.lap_inverse_scale,
            "laplace_scale": 1.0 / self.lap_inverse_scale,
            "num_teachers": self.num_teachers,
            "partition_sizes": [min(sizes), max(sizes)] if sizes else None,
            "teacher_batch_size": self.teacher_batch_size,
            "queries": len(self.accountant),
            "steps_taken": self.steps,
        }
