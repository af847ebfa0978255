"""``ProjectedVoting``: G-PATE's privacy strategy (Long et al. 2021).

Its base (:class:`~lightning_dpgan.callbacks.teachers.TeacherStrategy`) gives the module K
teachers, each trained only on its own disjoint partition of the training split. This class
installs the projected gradient aggregator (DPGradAgg, :mod:`lightning_dpgan.privacy.gradient_voting`)
in the module's GradientAggregator slot and owns the Confident-GNMax RDP accountant
(:mod:`lightning_dpgan.privacy.accountants.gnmax`). What leaves the teachers is the aggregated
gradient, and only that reaches the generator: the teachers themselves are never released.

Every (generated record, projected dimension) pair is one Confident-GNMax query: per step,
``batch x projection_dim`` threshold checks (always charged) and a GNMax answer for each check
that passes (charged only then). Both the data-dependent epsilon (Papernot et al. 2018,
Theorem 6) and the data-independent bound are reported; ``accounting`` picks which one stops
training.

Stopping. How many queries pass the threshold, and what a data-dependent answer costs, are
known only once the teachers have voted. So the look-ahead (:meth:`training_epsilon_if`, used
by ``PrivacyBudgetStopping``) is the cheapest case -- every query unanswered -- and the hard
stop is at query time: before any noise is drawn, the strategy computes epsilon as if *every*
query of the batch were answered (at its data-dependent cost, or the data-independent one) and
refuses (the module stops) if that would pass the target. The reported epsilon therefore
never exceeds the target.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning as L
import numpy as np
from torch import Tensor

from lightning_dpgan.callbacks.teachers import TeacherStrategy
from lightning_dpgan.privacy.accountants import ConfidentGNMaxAccountant
from lightning_dpgan.privacy.analysis.gnmax import gnmax_log_q
from lightning_dpgan.privacy.gradient_voting import ProjectedGradientAggregator
from lightning_dpgan.privacy.mechanisms import NO_ANSWER
from lightning_dpgan.privacy.slots import GradientAggregator
from lightning_dpgan.privacy.validation import validate_int, validate_noise_scale, validate_within

log = logging.getLogger(__name__)

#: Default number of teachers: one per 30 training records (G-PATE's MNIST setup at epsilon 10).
RECORDS_PER_TEACHER = 30
#: Below this percentage of answered queries the student generator got (almost) no gradient: an
#: unanswered dimension contributes 0 to the aggregated gradient.
ANSWERED_PERCENT = 1
#: Largest default teacher minibatch (the paper uses each teacher's whole 15-30 record partition).
MAX_DEFAULT_BATCH = 64
#: --privacy.bins' ceiling: a step holds (records x projection_dim) x bins vote counts (1e11 bins
#: asked for 120 TB at the first step); past the teachers' number, bins only spread the votes
MAX_BINS = 10_000
#: --privacy.clip's range: the bound is applied to float32 gradients (1e300 overflowed it at the first
#: step) and divided into bins (a width below float32's smallest normal is 0)
CLIP_RANGE = (1e-30, 1e30)
#: When this percentage of the answers or more fall in the bins around 0 (or in the two outermost
#: ones), the bins resolved little more than the gradients' sign: --privacy.clip is far above (or
#: below) their scale, and the run warns. At least MIN_ANSWERS_TO_JUDGE answers are needed.
ONE_SIDED_PERCENT = 90
MIN_ANSWERS_TO_JUDGE = 100


def answers_drowned(sigma2: float, teachers: int) -> str:
    """Why answers whose noise is at least every teacher's vote together teach nothing (a
    preset's sigmas kept while --privacy.num_teachers is lowered)."""
    return (f"--privacy.sigma2 {sigma2:g} is at least the {teachers} teachers' whole vote on a dimension: even a "
            "unanimous vote stands less than one noise scale above an empty bin, so the answers are mostly noise and "
            "the generator learns little from them. The presets pair their sigmas with their teachers (2000 teachers "
            "at sigma2 100, 4000 at 1000): use more teachers, or lower --privacy.sigma1 and --privacy.sigma2 "
            "(each query then costs more of the budget)")


class ProjectedVoting(TeacherStrategy):
    """G-PATE: teachers vote on randomly projected, discretized gradients (Confident-GNMax)."""

    name: ClassVar[str] = "gpate"
    slot: ClassVar[type] = GradientAggregator
    mechanism_name: ClassVar[str] = "gpate (random projection + Confident-GNMax of teacher gradient votes)"
    records_per_teacher = RECORDS_PER_TEACHER

    def __init__(
        self,
        num_teachers: int | None = None,
        projection_dim: int = 10,
        bins: int = 10,
        clip: float = 1e-4,
        sigma1: float = 600.0,
        sigma2: float = 100.0,
        threshold: float = 0.5,
        teacher_batch_size: int | None = None,
        accounting: str = "data-dependent",
        partition_seed: int = 0,
        target_epsilon: float | None = None,
        delta: float | None = None,
        noise_seed: int | None = None,
    ) -> None:
        """
        Args:
            num_teachers: K (default: one per 30 training records).
            projection_dim: k, the dimensions each gradient is projected to (one query each).
            bins: B, bins per dimension; clip: c, projected values are clipped to (-c, c).
            sigma1: noise of the threshold check; sigma2: noise of the answer (Confident-GNMax).
            threshold: T as a fraction of the teachers (the paper's 0.5: half must agree).
            teacher_batch_size: real records per teacher and step, also the number of generated
                records per step (default: a teacher's whole partition, at most 64).
            accounting: ``data-dependent`` or ``data-independent``: which epsilon stops training.
            noise_seed: fixes Confident-GNMax's generator, for tests only (default: OS entropy).
        """
        super().__init__(num_teachers, teacher_batch_size, partition_seed, target_epsilon, delta, noise_seed)
        projection_dim = validate_int("--privacy.projection_dim", projection_dim, 1)
        bins = validate_int("--privacy.bins", bins, 2)
        if bins > MAX_BINS:
            raise ValueError(f"--privacy.bins must be at most {MAX_BINS:,} (each query holds a vote count per bin; "
                             f"the paper uses 5 to 10), got {bins}")
        self.projection_dim, self.bins = projection_dim, bins
        self.clip = validate_within("--privacy.clip", clip, CLIP_RANGE, "projected gradients are float32")
        self.sigma1 = validate_noise_scale("--privacy.sigma1", sigma1)
        self.sigma2 = validate_noise_scale("--privacy.sigma2", sigma2)
        if not 0 < threshold <= 1:
            raise ValueError(f"--privacy.threshold is a fraction of the teachers in (0, 1], got {threshold}")
        self.threshold = threshold
        self.accountant = ConfidentGNMaxAccountant(accounting)  # validates the mode early
        self.accounting = accounting
        self._pending_log_q: np.ndarray | None = None
        self._priced_queries = 0  # the first step's, priced before install (first_step_epsilon)
        #: answers released so far, by bin (identical on every DDP rank: rank 0 draws them)
        self.answers_per_bin = np.zeros(bins, dtype=np.int64)

    def default_teacher_batch_size(self, smallest_partition: int) -> int:
        return min(smallest_partition, MAX_DEFAULT_BATCH)

    @property
    def queries_per_step(self) -> int:
        return self.teacher_batch_size * self.projection_dim

    def install_aggregator(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.sigma2 >= self.num_teachers:
            log.warning(answers_drowned(self.sigma2, self.num_teachers))
        pl_module.privacy = ProjectedGradientAggregator(
            self.projection_dim, self.bins, self.clip, self.sigma1, self.sigma2,
            self.threshold * self.num_teachers, check=self._check, charge=self._charge, noise=self.noise,
            on_answered=self._count_answers,
        )

    def _count_answers(self, answers: Tensor) -> None:
        given = answers[answers != NO_ANSWER].cpu().numpy()
        self.answers_per_bin += np.bincount(given, minlength=self.bins)

    @property
    def uncounted_answers(self) -> int:
        """Answers given before a resume from a checkpoint that did not count them by bin."""
        return self.accountant.answered - int(self.answers_per_bin.sum())

    # -------------------------------------------------------------- accounting
    def _check(self, votes: Tensor) -> None:
        """Refuse the batch (nothing drawn) unless answering every query would fit the target."""
        log_q = gnmax_log_q(votes.cpu().numpy(), self.sigma2)
        if self.training_target is not None:
            worst = self.accountant.epsilon_if_answered(self.training_delta, self.sigma1, self.sigma2, len(log_q), log_q)
            if worst > self.training_target:
                self.refuse(f"answering would spend epsilon up to {worst:.4g} on training in all, past its share "
                            f"{self.training_target:g} (--epsilon less preprocessing)")
        self._pending_log_q = log_q

    def _charge(self, votes: Tensor, answered: Tensor) -> None:
        """Charge every threshold check, and the GNMax step of the answered queries."""
        log_q, self._pending_log_q = self._pending_log_q, None
        if log_q is None or len(log_q) != votes.shape[0]:
            raise RuntimeError("charge() without a matching check(): the aggregator must check before it answers")
        self.accountant.step(self.sigma1, self.sigma2, len(log_q), log_q[answered.cpu().numpy()])
        self.remember_charged(self.next_step_params())

    def next_step_params(self) -> dict[str, float]:
        return {"sigma1": self.sigma1, "sigma2": self.sigma2}

    def plan_key(self) -> tuple:
        # What a step costs depends on the votes: re-plan after every step.
        return (self.sigma1, self.sigma2, self.steps)

    def training_epsilon_if(self, steps: int) -> float:
        """The cheapest case: ``steps`` more steps whose queries all go unanswered (threshold
        checks only). The hard stop at query time covers the rest (module docstring)."""
        return self.accountant.epsilon_if_queries(
            self.training_delta, steps * self.queries_per_step, self.sigma1, self.sigma2, answered_fraction=0.0
        )

    def first_step_epsilon(self, train_records: int, batch_size: Any, model_settings: Mapping[str, Any],
                           training_delta: float) -> float | None:
        """The step's ``teacher_batch_size x projection_dim`` threshold checks, every query
        unanswered, as :meth:`training_epsilon_if` prices them. Without a given batch size, the
        one install chooses from the smallest partition: the K partitions' sizes differ by at
        most one, so it holds ``n // K`` records (the step's query count is kept for
        :meth:`first_step_refusal`)."""
        batch = self.teacher_batch_size or self.default_teacher_batch_size(
            train_records // self.teacher_count(train_records))
        self._priced_queries = batch * self.projection_dim
        return self.accountant.epsilon_if_queries(training_delta, self._priced_queries, self.sigma1, self.sigma2,
                                                  answered_fraction=0.0)

    def first_step_refusal(self, target_epsilon: float, priced: float | None = None, exact: bool = True) -> str:
        """``epsilon_if`` prices the threshold checks alone (every query unanswered): a best case."""
        if priced is None:
            priced = self.epsilon_if(1)
        queries = self.queries_per_step if self.teacher_batch_size is not None else self._priced_queries
        return (f"a single training step would spend at least epsilon = {priced:.4g} (its "
                f"{queries} threshold checks alone, every query unanswered, the cheapest case), more "
                f"than --epsilon {target_epsilon:g}: raise --epsilon, or make the checks cheaper: more threshold noise "
                "(a larger --privacy.sigma1) or fewer queries a step (a smaller --privacy.teacher_batch_size or "
                "--privacy.projection_dim).")

    def answer_warnings(self) -> list[str]:
        """Warnings when (almost) no query was answered, or when the answers crowd into the bins
        around 0 or the outermost ones: the student generator then moved by (almost) nothing the
        teachers said, or by little more than the gradients' sign."""
        queries, answered = len(self.accountant), self.accountant.answered
        if queries == 0 or 100 * answered >= ANSWERED_PERCENT * queries:
            return self.clip_scale_warnings()
        return [f"only {answered} of the {queries} projected-gradient queries were answered ({answered / queries:.2%}): "
                "an unanswered dimension contributes nothing, so the student generator got (almost) no signal from "
                "the teachers. Fewer answers pass the threshold check when the teachers' votes spread over the bins; "
                "a lower --privacy.threshold or --privacy.sigma1 answers more, at more privacy per query"]

    def report_parameters(self) -> dict[str, Any]:
        queries = len(self.accountant)
        return {
            **self.accounting_report(),
            "projection_dim": self.projection_dim,
            "bins": self.bins,
            "clip": self.clip,
            **self.last_step_params(),  # sigma1, sigma2 of the last batch charged
            "threshold_fraction": self.threshold,
            "threshold_votes": self.threshold * self.num_teachers if self.num_teachers else None,
            "queries": queries,
            "answered": self.accountant.answered,
            "answered_fraction": self.accountant.answered / queries if queries else None,
            "answers_per_bin": self.answers_per_bin.tolist(),
            **({"answers_uncounted": self.uncounted_answers} if self.uncounted_answers else {}),
            **self.partition_report(),
        }

    def clip_scale_warnings(self) -> list[str]:
        """A warning when the answers say --privacy.clip is far from the projected gradients'
        scale. The answers are released values, so reading them costs no privacy."""
        counts, total = self.answers_per_bin, int(self.answers_per_bin.sum())
        if self.bins < 3 or total < MIN_ANSWERS_TO_JUDGE:  # with 2 bins every answer is a sign by design
            return []
        middle = counts[(self.bins - 1) // 2: self.bins // 2 + 1].sum()
        outermost = counts[0] + counts[-1]
        share = f"of the {total} answers"
        fix = ("The clip sets no sensitivity or noise (the votes, not the gradients, are what the privacy is "
               "computed on), though votes spread over more bins pass the threshold check less often")
        if 100 * middle >= ONE_SIDED_PERCENT * total:
            where = "the two bins around 0" if self.bins % 2 == 0 else (
                "the middle bin, whose midpoint is 0: those answers moved the generator by nothing")
            return [f"{middle} {share} ({middle / total:.2%}) fell in {where}. The projected gradients are small "
                    f"against --privacy.clip {self.clip:g}, so the answers carried little more than their sign: a "
                    f"smaller --privacy.clip, near the gradients' scale, resolves them. {fix}"]
        if 100 * outermost >= ONE_SIDED_PERCENT * total:
            edge = (1 - 2 / self.bins) * self.clip
            return [f"{outermost} {share} ({outermost / total:.2%}) fell in the two outermost bins, which hold the "
                    f"projected gradients at or past {edge:g} in size. They mostly reach --privacy.clip {self.clip:g} "
                    f"(or were clipped to it), so the answers carried little more than their sign: a larger "
                    f"--privacy.clip resolves them. {fix}"]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "answers_per_bin": self.answers_per_bin.tolist()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # a checkpoint written before the answers were counted by bin (or with other --privacy.bins):
        # its answers become answers_uncounted
        counts = state_dict.get("answers_per_bin")
        if counts is not None and len(counts) == self.bins:
            self.answers_per_bin = np.asarray(counts, dtype=np.int64)

