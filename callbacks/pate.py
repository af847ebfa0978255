"""``PATEAggregation``: the PATE privacy strategy (PATE-GAN, later PATE-CTGAN).

Its base (:class:`~lightning_dpgan.callbacks.teachers.TeacherStrategy`) asks the datamodule for
K disjoint partitions of the *training* split, gives the module K teachers and a loader that
hands each teacher minibatches from its own partition only (fixed for the whole run and saved
in checkpoints). This class installs the Laplace noisy-argmax label
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

from typing import Any, ClassVar

import lightning as L
import numpy as np

from lightning_dpgan.callbacks.teachers import TeacherStrategy
from lightning_dpgan.privacy.accountants import PATEMomentsAccountant
from lightning_dpgan.privacy.pate import PATELabelAggregator
from lightning_dpgan.privacy.slots import LabelAggregator
from lightning_dpgan.privacy.validation import validate_positive

#: PATE-GAN's default number of teachers: N / 1000 (the paper's appendix; at least 1).
RECORDS_PER_TEACHER = 1000


class PATEAggregation(TeacherStrategy):
    """PATE: K teachers on disjoint partitions, Laplace noisy-argmax votes (PATE-GAN)."""

    name: ClassVar[str] = "pate"
    slot: ClassVar[type] = LabelAggregator
    mechanism_name: ClassVar[str] = "pate (Laplace noisy argmax of teacher votes)"
    records_per_teacher = RECORDS_PER_TEACHER

    def __init__(
        self,
        num_teachers: int | None = None,
        lap_inverse_scale: float = 1.0,
        teacher_batch_size: int = 64,
        accounting: str = "data-dependent",
        partition_seed: int = 0,
        target_epsilon: float | None = None,
        delta: float | None = None,
        noise_seed: int | None = None,
    ) -> None:
        """``noise_seed`` fixes the Laplace noise's generator: for tests only (the default draws
        from OS entropy; see :mod:`lightning_dpgan.privacy.noise_source`)."""
        super().__init__(num_teachers, teacher_batch_size, partition_seed, target_epsilon, delta, noise_seed)
        self.lap_inverse_scale = validate_positive("--privacy.lap_inverse_scale", lap_inverse_scale)
        self.accountant = PATEMomentsAccountant(accounting)  # validates the mode early
        self.accounting = accounting
        self.queries_per_step: int | None = None

    def install_aggregator(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.privacy = PATELabelAggregator(self.lap_inverse_scale, self._charge, self.noise)
        self.queries_per_step = pl_module.hparams.student_steps * self.teacher_batch_size

    # -------------------------------------------------------------- accounting
    def _charge(self, lap_inverse_scale: float, vote_gaps: np.ndarray) -> None:
        """Charge these queries, or refuse them if they would pass the target."""
        if self.training_target is not None:
            after = self.accountant.epsilon_if_answered(self.training_delta, lap_inverse_scale, vote_gaps)
            if after > self.training_target:
                self.refuse(f"answering would spend epsilon {after:.4g} > {self.training_target:g} left")
        self.accountant.step(lap_inverse_scale, vote_gaps)

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

    def report_parameters(self) -> dict[str, Any]:
        return {
            **self.accounting_report(),
            "lap_inverse_scale": self.lap_inverse_scale,
            "laplace_scale": 1.0 / self.lap_inverse_scale,
            "queries": len(self.accountant),
            **self.partition_report(),
        }
