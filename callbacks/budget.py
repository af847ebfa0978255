"""``PrivacyBudgetStopping``: stop *before* the step that would push epsilon past the target.

After every training batch it checks whether one more step keeps epsilon within the target;
if not, training stops, so the reported epsilon never exceeds it. Before the first step it
refuses a budget too small for even one step. The accountant's state (and so the budget
spent) is saved in checkpoints by the strategy and survives a resume.

Asking the accountant after every batch is slow (a PRV epsilon takes ~0.3 s), so the callback
plans: for the strategy's current ``plan_key()`` (its step parameters, plus the spend so far
when that spend depends on the data) it finds, by bisection over the strategy's own look-ahead
``epsilon_if(k)``, the largest number of further steps that fits, and re-plans only when the
key changes. ``privacy/epsilon`` is logged at Lightning's
logging cadence (``log_every_n_steps``) and for the last step, whatever ends training (the
budget, ``--max-steps``, ``--max-epochs``, ``--trainer.max_time``).
"""
from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lightning_dpgan.callbacks.strategy import PrivacyStrategy, epsilon_to_loggers
from lightning_dpgan.callbacks.teachers import TeacherStrategy
from lightning_dpgan.distributed import decided_by_rank_zero
from lightning_dpgan.privacy.validation import validate_epsilon

#: Planning horizon: more steps than any run takes; a budget lasting longer is "unlimited".
MAX_PLANNED_STEPS = 10**8


class BudgetTooSmallError(ValueError):
    """Not even one training step fits in the privacy budget."""


class PrivacyBudgetStopping(L.Callback):
    """Stop training before epsilon (at the strategy's delta) would exceed ``target_epsilon``."""

    #: it logs ``privacy/epsilon`` itself (the strategy logs it where no budget callback does)
    logs_epsilon = True

    def __init__(self, target_epsilon: float) -> None:
        self.target_epsilon = validate_epsilon(target_epsilon)
        self.strategy: PrivacyStrategy | None = None
        self.stopped_by_budget = False
        self._plan: tuple[tuple, int] | None = None  # (plan key, total steps allowed)
        self._first_step, self._written_at = 0, None  # train_steps at the start; at the last epsilon written

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        strategies = [c for c in trainer.callbacks if isinstance(c, PrivacyStrategy)]
        if len(strategies) != 1:
            raise ValueError(f"PrivacyBudgetStopping needs exactly one privacy strategy callback, found {len(strategies)}")
        self.strategy = strategies[0]
        own = getattr(self.strategy, "target_epsilon", None)
        if own is None:  # the vote strategies refuse an answer past the target only when they hold it
            name = type(self.strategy).__name__
            votes = ("; and a vote strategy refuses the answers that would pass the target only when it holds it, "
                     "since the look-ahead prices the cheapest next step (G-PATE ended at epsilon 0.60 for 0.5)"
                     if isinstance(self.strategy, TeacherStrategy) else "")
            raise ValueError(
                f"PrivacyBudgetStopping({self.target_epsilon:g}) needs the same target on its strategy, and {name} has "
                f"none: its privacy report would state no target{votes}. Give "
                f"{name}(target_epsilon={self.target_epsilon:g}, ...)")
        if own != self.target_epsilon:
            raise ValueError(
                f"PrivacyBudgetStopping({self.target_epsilon:g}) and {type(self.strategy).__name__}(target_epsilon={own:g}) "
                f"disagree: training would stop at one while the privacy report states the other as the target. "
                "Give both the same target epsilon"
            )

    def next_step_fits(self) -> bool:
        """Whether one more step keeps the strategy's epsilon within the target: the question
        asked before every batch, so that a step that would pass the target is never taken."""
        return self.strategy.steps_taken() + 1 <= self.allowed_total_steps()

    def allowed_total_steps(self) -> int:
        """Total steps (spent + future) within budget, re-planned when the strategy's
        ``plan_key`` changes (new step parameters, or a data-dependent spend)."""
        key = self.strategy.plan_key()
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, self.strategy.steps_taken() + self._max_more_steps())
        return self._plan[1]

    def _fits(self, more_steps: int) -> bool:
        return self.strategy.epsilon_if(more_steps) <= self.target_epsilon

    def _max_more_steps(self) -> int:
        """Largest k with epsilon_if(k) <= target (epsilon grows with k): doubling, then bisection."""
        if not self._fits(1):
            return 0
        low, high = 1, 2
        while high < MAX_PLANNED_STEPS and self._fits(high):
            low, high = high, high * 2
        if high >= MAX_PLANNED_STEPS:  # the doubling stopped at the cap without checking it
            if self._fits(MAX_PLANNED_STEPS):
                return MAX_PLANNED_STEPS
            high = MAX_PLANNED_STEPS
        while high - low > 1:  # invariant: low fits, high does not
            middle = (low + high) // 2
            low, high = (middle, high) if self._fits(middle) else (low, middle)
        return low

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_step, self._written_at = pl_module.train_steps, None
        spent = self.strategy.epsilon()
        if spent > self.target_epsilon:  # a resumed run's checkpoint, under a lower --epsilon
            delta, earlier = getattr(self.strategy, "delta", None), getattr(self.strategy, "resumed_delta", None)
            lowered = delta is not None and isinstance(earlier, (int, float)) and delta < earlier
            at_delta = (f" (at --delta {delta:g}, below the checkpoint's {earlier:g}: a lower delta states a larger "
                        f"epsilon for the same steps; --delta {earlier:g} keeps its figure)") if lowered else ""
            raise BudgetTooSmallError(
                f"the checkpoint already spent epsilon = {spent:.4g}, more than --epsilon {self.target_epsilon:g}"
                f"{at_delta}: its privacy report would exceed the target. Resume with --epsilon of at least what it "
                "spent.")
        if decided_by_rank_zero(self.next_step_fits()):
            return
        if self.strategy.steps_taken() == 0:
            raise BudgetTooSmallError(self.strategy.first_step_refusal(self.target_epsilon)
                                      + self.strategy.spent_before_training_note())
        self._stop(trainer)  # resumed with the budget already spent

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # rank 0's accountant is the source of truth: under DDP every rank stops at its word
        stop = decided_by_rank_zero(not self.next_step_fits())
        if stop or trainer.should_stop or pl_module.train_steps % max(trainer.log_every_n_steps, 1) == 0:
            epsilon = self.strategy.epsilon()
            # for the progress bar only (a float64 tensor: Lightning stores a float as float32, which
            # can show 0.29999999 as 0.30000001). Given to Lightning's loggers, the figure was cached,
            # and a stop decided after this callback (max_time's Timer) wrote the stale one again at
            # the last step; so the loggers get it directly, as the accountant's float64
            pl_module.log("privacy/epsilon", torch.tensor(epsilon, dtype=torch.float64), prog_bar=True, logger=False)
            self._to_loggers(trainer, epsilon, pl_module.train_steps)
        if stop:
            self._stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The last step's epsilon, where it was not written at its batch: the last batch of the
        last epoch off the cadence (``--max-epochs``), or a stop decided after this callback ran
        (Lightning's ``Timer``, ``--trainer.max_time``)."""
        steps = pl_module.train_steps
        if steps > self._first_step and self._written_at != steps:
            self._to_loggers(trainer, self.strategy.epsilon(), steps)

    def _to_loggers(self, trainer: L.Trainer, epsilon: float, steps: int) -> None:
        epsilon_to_loggers(trainer, epsilon, steps)
        self._written_at = steps

    def _stop(self, trainer: L.Trainer) -> None:
        self.stopped_by_budget = True
        trainer.should_stop = True
