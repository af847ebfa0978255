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

What the answers said. The strategy counts the released labels by class (``answers`` in
privacy.json; counting released answers is post-processing, free). A student taught by answers
that are (almost) all one class learns nothing but that class, and the generator trained
against it gets no signal towards the data: on Adult, teachers that separate real from
generated records perfectly answer "generated" to every query. The run then warns
(:meth:`PATEAggregation.answer_warnings`), so a table that is no better than an untrained
generator's is not mistaken for a trained one.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import lightning as L
import numpy as np

from lightning_dpgan.callbacks.teachers import TeacherStrategy
from lightning_dpgan.distributed import is_rank_zero
from lightning_dpgan.privacy.accountants import PATEMomentsAccountant
from lightning_dpgan.privacy.pate import PATELabelAggregator
from lightning_dpgan.privacy.slots import LabelAggregator
from lightning_dpgan.privacy.validation import validate_noise_scale

#: PATE-GAN's default number of teachers: N / 1000 (the paper's appendix; at least 1).
RECORDS_PER_TEACHER = 1000
#: The student's labels, by class index: the teachers vote on "is this record real?".
ANSWER_CLASSES = ("generated", "real")
#: At or below this percentage of the answers, the minority class taught the student (almost)
#: nothing: the run warns.
MINORITY_PERCENT = 1


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
        self.lap_inverse_scale = validate_noise_scale("--privacy.lap_inverse_scale", lap_inverse_scale)
        self.accountant = PATEMomentsAccountant(accounting)  # validates the mode early
        self.accounting = accounting
        self.queries_per_step: int | None = None
        #: released noisy labels so far, by class (ANSWER_CLASSES); rank 0's count under DDP
        self.answer_counts = np.zeros(len(ANSWER_CLASSES), dtype=np.int64)

    def install_aggregator(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.privacy = PATELabelAggregator(self.lap_inverse_scale, self._charge, self.noise,
                                                on_released=self._count_answers)
        self.queries_per_step = pl_module.hparams.student_steps * self.teacher_batch_size

    def _count_answers(self, labels: Any) -> None:
        """Rank 0 counts (under DDP every rank holds its labels; its report and checkpoint are
        the run's)."""
        if is_rank_zero():
            self.answer_counts += np.bincount(labels.cpu().numpy(), minlength=len(ANSWER_CLASSES))

    @property
    def uncounted_answers(self) -> int:
        """Answers released before a resume from a checkpoint that did not count them: every
        charged query is answered and counted, so the accountant's queries less the counts."""
        return len(self.accountant) - int(self.answer_counts.sum())

    def answer_warnings(self) -> list[str]:
        """A warning when (almost) every released label was one class: the student then learned
        that class alone, and the generator trained against it learned nothing from the data."""
        total = int(self.answer_counts.sum())
        majority = int(self.answer_counts.argmax())
        if total == 0 or 100 * (total - int(self.answer_counts[majority])) > MINORITY_PERCENT * total:
            return []
        said = ANSWER_CLASSES[majority]
        message = (f"{self.answer_counts[majority]} of the {total} labels the teachers released "
                   f"({self.answer_counts[majority] / total:.2%}) said '{said}': the student learned (almost) "
                   "nothing else, so the generator trained against it got no signal from the data, and the records "
                   "it generates are no better than an untrained generator's")
        if said == "generated":
            message += (". Teachers that tell every generated record apart (many --model.teacher_steps, a high "
                        "--model.teacher_lr) answer 'generated' to every query; weaker teachers split their votes, "
                        "and a split vote costs far more privacy per answer")
        if self.uncounted_answers:
            message += f" ({self.uncounted_answers} answers from before a resume were not counted)"
        return [message]

    # -------------------------------------------------------------- accounting
    def _charge(self, lap_inverse_scale: float, vote_gaps: np.ndarray) -> None:
        """Charge these queries, or refuse them if they would pass the target."""
        if self.training_target is not None:
            after = self.accountant.epsilon_if_answered(self.training_delta, lap_inverse_scale, vote_gaps)
            if after > self.training_target:
                self.refuse(f"answering would spend epsilon {after:.4g} on training in all, past its share "
                            f"{self.training_target:g} (--epsilon less preprocessing)")
        self.accountant.step(lap_inverse_scale, vote_gaps)
        self.remember_charged({"lap_inverse_scale": float(lap_inverse_scale)})

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

    def first_step_epsilon(self, train_records: int, batch_size: Any, model_settings: Mapping[str, Any],
                           training_delta: float) -> float | None:
        """``student_steps`` x ``teacher_batch_size`` queries, priced as :meth:`training_epsilon_if`
        prices them, for the teachers the records give (the step's query count is kept for
        :meth:`first_step_refusal`; install sets the same)."""
        student_steps = model_settings.get("student_steps")
        if not isinstance(student_steps, int) or student_steps < 1:
            return None
        self.queries_per_step = student_steps * self.teacher_batch_size
        unanimous = None if self.accounting == "data-independent" else self.teacher_count(train_records)
        return self.accountant.epsilon_if_queries(training_delta, self.queries_per_step, self.lap_inverse_scale, unanimous)

    def first_step_refusal(self, target_epsilon: float, priced: float | None = None, exact: bool = True) -> str:
        """Under data-dependent accounting ``epsilon_if`` prices every vote unanimous, the cheapest
        case, and more Laplace noise can make that case dearer: a unanimous vote's bound grows as
        the noise does, until the data-independent bound, which falls with it, is below it."""
        if self.accounting == "data-independent":
            return super().first_step_refusal(target_epsilon, priced, exact)
        if priced is None:
            priced = self.epsilon_if(1)
        return (f"a single training step would spend at least epsilon = {priced:.4g} (its "
                f"{self.queries_per_step} queries all answered unanimously, the cheapest case), more than --epsilon "
                f"{target_epsilon:g}: raise --epsilon, or ask fewer queries a step (a smaller "
                "--privacy.teacher_batch_size, fewer --model.student_steps). More Laplace noise (a smaller "
                "--privacy.lap_inverse_scale) can raise this figure: a unanimous vote costs more as the noise grows, "
                "until the noise is large enough for the data-independent bound to be the smaller.")

    def report_parameters(self) -> dict[str, Any]:
        return {
            **self.accounting_report(),
            "lap_inverse_scale": (used := self.last_step_params()["lap_inverse_scale"]),
            "laplace_scale": 1.0 / used,
            "queries": len(self.accountant),
            "answers": dict(zip(ANSWER_CLASSES, (int(count) for count in self.answer_counts))),
            **({"answers_uncounted": self.uncounted_answers} if self.uncounted_answers else {}),
            **self.partition_report(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "answer_counts": self.answer_counts.tolist()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # a checkpoint written before the answers were counted: they become uncounted_answers
        counts = state_dict.get("answer_counts", [0] * len(ANSWER_CLASSES))
        self.answer_counts = np.asarray(counts, dtype=np.int64)
