"""``PrivacyStrategy``: the base of every privacy strategy callback.

A strategy plugs one privacy mechanism into any module that offers its slot (see
:mod:`lightning_dpgan.privacy.slots`), owns the accountant that charges for it, and answers
the two questions the rest of the framework asks: how much has been spent
(:meth:`epsilon`) and how much would be after more steps (:meth:`epsilon_if`, used by
``PrivacyBudgetStopping``). The accountant's state travels in Lightning checkpoints; a
resumed run whose checkpoint lacks it is refused, never silently restarted at zero.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn

import lightning as L
from lightning.pytorch.strategies import ParallelStrategy

from lightning_dpgan.callbacks.same_release import datamodule_release_digest
from lightning_dpgan.callbacks.step_limit import StepLimit, stop_floor_refusal
from lightning_dpgan.ddp import PrivateDDPStrategy
from lightning_dpgan.distributed import differs_from_rank_zero
from lightning_dpgan.error_text import SET_BY
from lightning_dpgan.privacy.accountants import Accountant, AccountantStateError
from lightning_dpgan.privacy.accountants.opacus_adapter import rdp_epsilon_floor
from lightning_dpgan.privacy.composition import compose_costs, release_fields
from lightning_dpgan.privacy.noise_source import NoiseSource, fixed_seed_sources, not_for_release
from lightning_dpgan.privacy.slots import PrivacyBudgetExhausted
from lightning_dpgan.privacy.validation import validate_delta, validate_epsilon, validate_noise_scale, validate_positive
from lightning_dpgan.versions import software_versions

DEFAULT_DELTA = 1e-5
#: the name QUAIL's label model's release is composed under (see ``add_prior_release``)
QUAIL_LABEL_MODEL = "quail_label_model"
#: Lightning's 16-bit mixed precision, whose GradScaler skips a whole optimizer step (every
#: teacher of an ensemble, every parameter of a DP-SGD step) when one gradient overflows
LOSS_SCALED_PRECISIONS = ("16", "16-mixed")
#: The precisions a strategy that clips gradients (DP-SGD, the sanitizer) trains under: under a
#: mixed precision autocast computes the per-record norms and the clipped sum in bfloat16 or
#: float16, whose rounding scales with the whole batch's sum, so removing one record moved the
#: clipped sum of DP-CTGAN's critic (batch 500) by 1.2 C where the accountant assumes C
#: ("None": the setting left out)
FLOAT32_PRECISIONS = ("None", "32", "32-true")
#: Lightning precisions that hold the networks' weights in another type than float32, refused for
#: every model (``train``) and by every strategy (a Trainer built by hand): sampling's float32
#: latents met bf16 or float64 weights only as synthetic.csv was written, after training ("mat1 and
#: mat2 must have the same dtype"), and 16-true's weights turned NaN at the first step
NON_FLOAT32_WEIGHT_PRECISIONS = ("16-true", "bf16-true", "64-true", "64", "transformer-engine",
                                 "transformer-engine-float16")


def overfit_refusal(overfit_batches: Any) -> str | None:
    """Why a Trainer's ``overfit_batches`` cannot train a private model, or None. Lightning then
    swaps a shuffling loader's sampler for a sequential one and trains on the same first batches
    again and again, where the accountant charges each step for a fresh random batch: a DP-SGD
    run with secret-shuffle batches reported epsilon 10 and spent about 27 (q = 1)."""
    if not overfit_batches:
        return None
    return (f"trainer.overfit_batches {overfit_batches} cannot train a private model: Lightning then trains on the "
            "same first batches over and over, and the accountant charges each step for a freshly drawn batch, so the "
            "reported epsilon would understate the cost. Leave it out")


def epoch_batches_within_limit(trainer: Any, batches_per_epoch: int) -> int:
    """The batches an epoch takes under the Trainer's ``limit_train_batches`` (a count, or a
    fraction of the epoch, as Lightning reads it): noise calibrated for whole epochs that the
    limit cuts short was far more than the steps taken needed (942 steps planned, 6 taken)."""
    limit = getattr(trainer, "limit_train_batches", None)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        return batches_per_epoch
    if isinstance(limit, int):
        return max(1, min(limit, batches_per_epoch))
    return max(1, min(int(batches_per_epoch * limit), batches_per_epoch))


def _has_path(owner: Any, path: str) -> bool:
    """Whether ``owner.a.b`` (for ``path`` ``"a.b"``) exists and is not None."""
    for name in path.split("."):
        owner = getattr(owner, name, None)
        if owner is None:
            return False
    return True


def delta_origin(delta: float | None) -> str:
    """Where a strategy's δ came from, for a refusal: none given (``None``) is the default, else
    the user typed it or a config file or preset set it (the private models' presets do)."""
    return "the strategies' default" if delta is None else SET_BY


class IncompatibleModelError(ValueError):
    """The model has no slot for this privacy strategy."""


class ChargeMismatchError(RuntimeError):
    """A training batch did not charge the accountant for what the mechanism released: a module
    that went round it, or used one sampled batch in several private steps."""


#: How to spend less on each release made before training, by its part's name in ``preprocessing``.
SPEND_LESS = {
    "schema": "a schema file (--data.schema) instead of a CSV's DP bounds (--data.bounds_epsilon, --data.bounds_delta)",
    "modes": "a smaller --data.modes_epsilon, or --data.modes bounds for modes from the public bounds",
    QUAIL_LABEL_MODEL: "a smaller --quail-split for QUAIL's label model",
}


def epsilon_parts(cost: dict[str, Any]) -> str:
    """Each part of a preprocessing cost with its epsilon and mechanism, for a refusal."""
    parts = cost.get("parts") or {"preprocessing": cost}
    return ", ".join(f"{name} {part.get('epsilon', 0):g} ({part.get('mechanism', '?')})" for name, part in parts.items())


def spend_less(cost: dict[str, Any], budget: str) -> str:
    """The remedy for preprocessing that spent all of ``budget`` ("epsilon" or "delta"): for each
    part that spent some, how to spend less, and that a resumed run's releases are spent already."""
    def spending(parts: dict[str, Any]) -> list[str]:
        found = []
        for name, part in parts.items():
            if part.get("parts"):
                found += spending(part["parts"])
            elif float(part.get(budget, 0.0)) > 0:
                # a min-max table's data cost is its schema's alone (QUAIL calls it "data")
                found.append(SPEND_LESS["schema" if name == "data" else name])
        return found

    ways = spending(cost.get("parts") or {"schema": cost})
    return (f"spend less before training ({'; '.join(ways)}). A resumed run's preprocessing is its checkpoint's, spent "
            f"already: there only a larger --{budget} helps")


def budget_callback_logs_epsilon(trainer: L.Trainer) -> bool:
    """Whether a callback of ``trainer`` (:class:`~lightning_dpgan.callbacks.PrivacyBudgetStopping`)
    logs ``privacy/epsilon`` itself, so that the strategy does not log it a second time."""
    return any(getattr(callback, "logs_epsilon", False) for callback in trainer.callbacks)


def epsilon_to_loggers(trainer: L.Trainer, epsilon: float, steps: int) -> None:
    """Batch ``steps``' ``privacy/epsilon``, to the loggers directly and numbered as Lightning
    numbers that batch's scalars (rank zero only, as Lightning's loggers are). Through
    ``pl_module.log`` Lightning cached the figure, and a stop decided after the callback that
    logged it (``max_time``'s Timer) wrote the stale one again at the last step."""
    for logger in trainer.loggers:
        logger.log_metrics({"privacy/epsilon": epsilon}, step=steps - 1)


class PrivacyStrategy(L.Callback):
    """Base class: slot check, delta, accountant state in checkpoints, the privacy report."""

    #: the ``--privacy`` name
    name: ClassVar[str] = ""
    #: the Protocol (privacy slot) a module must declare in ``privacy_slot``
    slot: ClassVar[type]
    #: human-readable mechanism name for privacy.json
    mechanism_name: ClassVar[str] = ""
    #: the neighbouring datasets the guarantee is for: ``add-remove`` one record, or
    #: ``replace-one`` (same size; PATE's fixed partitions of the N records need it)
    neighbours: ClassVar[str] = "add-remove"
    #: whether the sensitivity is a bound that clipping float gradients enforces, which only float32
    #: arithmetic keeps (a vote count is a count in any precision): see ``FLOAT32_PRECISIONS``
    clips_gradients: ClassVar[bool] = False
    #: what the strategy reads from its datamodule (dotted attribute paths), checked at setup so
    #: that a user's own datamodule is told what it lacks: the records it counts and draws from
    #: (a strategy whose needs depend on its settings makes it a property)
    datamodule_needs: tuple[str, ...] = ("train_dataset",)

    def __init__(self, target_epsilon: float | None = None, delta: float | None = None,
                 noise_seed: int | None = None) -> None:
        self.target_epsilon = None if target_epsilon is None else validate_epsilon(target_epsilon)
        self.delta = None if delta is None else validate_delta(delta)
        self.accountant: Accountant | None = None
        self.train_records: int | None = None
        #: privacy spent before training (e.g. DP estimates of a table's bounds); composed in
        self.preprocessing: dict[str, Any] = {"epsilon": 0.0, "delta": 0.0}
        #: DP releases from the training rows made before training by others than the
        #: datamodule (QUAIL's label model), by name; composed with the datamodule's cost
        self.prior_releases: dict[str, dict[str, Any]] = {}
        #: the mechanism's random draws: its own generators, OS entropy unless ``noise_seed``
        self.noise = NoiseSource(noise_seed)
        #: why the strategy last refused to answer (per-query budgets: PATE, G-PATE), else None
        self.refusal: str | None = None
        #: the training segments before a resume (:meth:`segment`), from the checkpoint
        self.earlier_segments: list[dict[str, Any]] = []
        self.resumed_delta: float | None = None  # the delta a resumed checkpoint's spend was stated at
        #: the training step this process started from (0, or the resumed checkpoint's), and the
        #: steps charged by then
        self.segment_start = 0
        self.charged_at_start = 0
        #: training batches this process took since ``on_train_start`` (:meth:`charge_problem`)
        self.batches_this_segment = 0
        #: the step whose epsilon this strategy logged last (:meth:`_log_epsilon`)
        self.epsilon_logged_at: int | None = None
        #: whether ``on_train_end`` warns of a refusal or an untrained generator (``train`` says it)
        self.warn_at_end = True

    def training_warnings(self) -> list[str]:
        """What a user must know about the finished training beyond its privacy figures (e.g. that
        the mechanism's answers taught the generator nothing); empty when there is nothing."""
        return []

    def fixed_seed_warning(self) -> str | None:
        """That a segment's secret draws came from a fixed seed (``--privacy.noise_seed``, GS-WGAN's
        ``--privacy.selection_seed``), where one did: the run's epsilon does not hold against anyone
        with the seed. privacy.json named it in ``noise_source``, while the console stated the
        epsilon as the run's guarantee. None otherwise."""
        sources = fixed_seed_sources(self.segments())
        return f"this run is not private: {not_for_release(sources)}" if sources else None

    def refuse(self, reason: str) -> NoReturn:
        """Refuse this query batch (nothing is released), remembering why for the run's report."""
        self.refusal = reason
        raise PrivacyBudgetExhausted(reason)

    # -------------------------------------------------------------- checks
    def check_batch_size(self, batch_size: int, train_records: int) -> None:
        """Refuse a batch this strategy cannot draw from ``train_records`` records. Every batch
        size is fine by default (a batch above the records takes them all); QUAIL asks before its
        label model spends budget, the strategy itself again when it is installed."""

    @classmethod
    def check_compatible(cls, module: Any) -> None:
        """Refuse a module (or a module class: ``train`` checks before building either, and
        before reading the strategy's settings, whose keys a preset wrote for the model's own
        strategy) that lacks this strategy's slot, naming the models that have it."""
        model = module if isinstance(module, type) else type(module)
        if getattr(model, "privacy_slot", None) is cls.slot:
            return
        from lightning_dpgan import registry

        compatible = registry.models_with_slot(cls.slot)
        raise IncompatibleModelError(
            f"--privacy {cls.name} needs a model with a {cls.slot.__name__} slot, and "
            f"{model.__name__} has {getattr(getattr(model, 'privacy_slot', None), '__name__', 'none')}. "
            f"Models that take --privacy {cls.name}: {', '.join(compatible) or 'none yet'}."
        )

    # ---------------------------------------------------------- Lightning
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.check_compatible(pl_module)
        self.check_not_fitted_before(pl_module)
        self.check_not_used_before()
        self.check_target_enforced(trainer)
        self.check_trainer(trainer)
        self.check_same_releases(trainer)
        self.check_label_model_composed(trainer.datamodule)
        self.train_records = len(trainer.datamodule.train_dataset)
        self.delta = self._checked_delta(trainer.datamodule)
        self._compose_preprocessing(trainer.datamodule)
        self.install(trainer, pl_module)
        if self.accountant is None:
            raise RuntimeError(f"{type(self).__name__}.install() must create the accountant")

    def check_not_fitted_before(self, pl_module: Any) -> None:
        """Refuse a module object that an earlier ``fit()`` trained or made private, or that
        ``load_from_checkpoint`` gave its trained steps. A new fit
        starts a new accountant (or a new strategy's), which would charge only its own steps
        while the networks carry what the earlier ones learned from the private records: PATE-GAN
        fitted twice reported the epsilon of its second fit alone. A resume from a checkpoint
        restores the accountant, but only into a module built afresh (its state is restored
        after this setup, and the earlier mechanism stays attached to the old object)."""
        steps = getattr(pl_module, "train_steps", 0)
        if steps == 0 and getattr(pl_module, "privacy", None) is None:
            return
        done = (f"already trained {steps} steps (in an earlier fit(), or in the checkpoint it was loaded from)" if steps
                else "was made private by an earlier fit()")
        raise ValueError(
            f"this {type(pl_module).__name__} object {done}, and fitting it again "
            "is refused: a new accountant would charge only its own steps, and the reported "
            "epsilon would leave out what the earlier ones spent. To train on, build a new module with the same "
            "settings and resume it from the earlier run's checkpoint (trainer.fit(new_module, datamodule=..., "
            "ckpt_path=...)), which carries the accountant on; to train afresh, build a new module"
        )

    def check_not_used_before(self) -> None:
        """Refuse a strategy instance whose accountant already charged an earlier fit's steps: a
        PATE strategy keeps its accountant from construction, so a second module's report
        added the first one's queries and answers. (A resume restores the accountant after this
        setup, into an instance built afresh.)"""
        if self.accountant is not None and self.steps_taken() > 0:
            name = type(self).__name__
            raise ValueError(f"this {name} already charged {self.steps_taken()} steps in an earlier fit(): a strategy "
                             "holds the accountant of one training, and this fit's privacy report would add the earlier "
                             f"one's. Build a new {name} for each fit (a resume from a checkpoint restores its accountant)")

    def check_trainer(self, trainer: L.Trainer) -> None:
        """Refuse a Trainer this strategy cannot keep its guarantee under. ``train`` refuses the
        same settings before anything is written; these checks hold for a Trainer built by hand."""
        strategies = [type(c).__name__ for c in getattr(trainer, "callbacks", []) if isinstance(c, PrivacyStrategy)]
        if len(strategies) > 1:  # the second would install over the first, whose accountant then charges nothing
            raise ValueError(f"a Trainer takes one privacy strategy callback, and this one has {len(strategies)}: "
                             f"{', '.join(strategies)}. Keep one")
        if refusal := self.precision_refusal(str(getattr(trainer, "precision", "32-true"))):
            raise ValueError(refusal)
        if refusal := stop_floor_refusal(getattr(trainer, "min_steps", None), getattr(trainer, "min_epochs", None)):
            raise ValueError(refusal)
        if refusal := overfit_refusal(getattr(trainer, "overfit_batches", 0)):
            raise ValueError(refusal)
        parallel = isinstance(trainer.strategy, ParallelStrategy)
        if (parallel or trainer.world_size > 1) and not isinstance(trainer.strategy, PrivateDDPStrategy):
            # Lightning's own DDP averages gradients in backward, before a mechanism could clip
            # and noise them once for the global batch: not the single-process guarantee. Even in
            # one process it swaps a secret shuffle for its publicly seeded DistributedSampler.
            raise ValueError(f"--privacy {self.name} trains in several processes only with --strategy ddp "
                             f"(got {type(trainer.strategy).__name__}): as a library, "
                             "Trainer(strategy=lightning_dpgan.ddp.PrivateDDPStrategy()), or no strategy for one process")
        if parallel and trainer.world_size == 1:  # train swaps it for one process's strategy itself
            raise ValueError("PrivateDDPStrategy in one process would still put Lightning's distributed sampler, which "
                             "anyone can replay, in place of the private batches: use it with devices > 1, or leave the "
                             "strategy out for one process")
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None:
            raise ValueError(
                f"--privacy {self.name} needs the records as one of this package's datamodules, passed as "
                "trainer.fit(module, datamodule=...): it counts the training records, and draws the batches (or the "
                "teachers' partitions) its accounting assumes. A DataLoader given as train_dataloaders cannot be "
                "re-sampled")
        missing = [need for need in self.datamodule_needs if not _has_path(datamodule, need)]
        if missing:
            raise ValueError(
                f"--privacy {self.name} reads {', '.join(self.datamodule_needs)} from its datamodule, and "
                f"{type(datamodule).__name__} lacks {', '.join(missing)} (after its setup('fit')). This package's "
                "datamodules have them: CSVDataModule takes any table, and docs/architecture.md (\"Data\") says what "
                "each part is")

    def check_same_releases(self, trainer: L.Trainer) -> None:
        """Under DDP every process must train on one DP preprocessing release. ``train`` has rank
        0 draw it and the others read it. A script is run once per process (Lightning's launcher
        starts it again for each), so each process's datamodule drew its own: releases the report
        would charge once, and records encoded differently in each process. Refused in every
        process alike (their ``state_dict()`` digests are compared)."""
        if trainer.world_size > 1 and differs_from_rank_zero(datamodule_release_digest(trainer.datamodule)):
            raise ValueError(
                "the processes of this run drew different DP preprocessing releases from the rows (a CSV's estimated "
                "schema, DP modes): a script run in several processes runs once in each, and each datamodule drew its "
                "own, which the report would charge once. Draw them once: in one process, data.setup('fit') and "
                "torch.save(data.state_dict(), 'releases.pt'); in the script, data.restore_releases('releases.pt') "
                "before anything reads data_shape, table_layout or setup. (train --strategy ddp does this itself; a "
                "schema file, or modes='bounds', draws nothing)")

    def add_prior_release(self, name: str, release: dict[str, Any]) -> None:
        """Compose a DP release drawn from the training rows before training by another part than
        the datamodule (QUAIL's label model: ``labeler.release``) into this strategy's budget and
        report. Call it before ``fit``: the training target is what is left."""
        self.prior_releases[name] = release_fields(release)

    def check_label_model_composed(self, datamodule: Any) -> None:
        """Refuse a datamodule that leaves the label to QUAIL's label model (``exclude_label``)
        when that model's release was not composed: from Python, a QUAIL synthesizer's report
        left out the label model's epsilon (0.50 of a target of 1, reported 1.0 in all)."""
        hparams = getattr(datamodule, "hparams", {})
        if hparams.get("exclude_label") and QUAIL_LABEL_MODEL not in self.prior_releases:
            raise ValueError(
                "the datamodule leaves the label out (exclude_label=True) for QUAIL's label model, whose release this "
                f"strategy has not composed: call {type(self).__name__}.add_prior_release('{QUAIL_LABEL_MODEL}', "
                "labeler.release) with the labeler QUAIL.fit_labeler returned, before fit")

    def precision_refusal(self, precision: str) -> str | None:
        """Why this strategy cannot train under a Trainer's ``precision``, or None, with every
        reason that applies (``16-mixed`` under clipping has two). ``train`` asks before anything
        is written; ``setup`` again, for a Trainer built by hand."""
        if precision in NON_FLOAT32_WEIGHT_PRECISIONS:  # torch's "mat1 and mat2 must have the same dtype" at the first step
            use = "32-true" if self.clips_gradients else "bf16-mixed (float32 weights, bf16 arithmetic)"
            return (f"trainer.precision {precision} keeps the networks' weights in another type than float32, which "
                    f"sampling and the privacy mechanisms do not support: use --trainer.precision {use} or leave it out "
                    "(Trainer(precision=...) as a library)")
        reasons = []
        if self.clips_gradients and precision not in FLOAT32_PRECISIONS:
            reasons.append("its per-record clipping bounds each record's effect only in float32 arithmetic (in "
                           "bfloat16, rounding that scales with the whole batch moved a clipped sum by 1.2 times the "
                           "bound when one record was removed), so the reported epsilon would understate the cost")
        if precision in LOSS_SCALED_PRECISIONS:
            reasons.append("its loss scaler skips the update of every network when one gradient overflows, so one "
                           "record could decide whether a step happens (and, for teachers, change the others' "
                           "training), which no accountant counts")
        if not reasons:
            return None
        if self.clips_gradients:
            return (f"trainer.precision {precision} cannot train under --privacy {self.name}: {'; and '.join(reasons)}. "
                    "Pass --trainer.precision 32-true (or drop the setting from the command line and the config "
                    "file; Trainer(precision='32-true') as a library)")
        return (f"trainer.precision {precision} cannot train a private model: {reasons[0]}. "
                "Use --trainer.precision bf16-mixed (no loss scaler) or leave it out")

    def _checked_delta(self, datamodule: Any, train_records: int | None = None) -> float:
        """The δ given, else the dataset's own default where it has one (Kaggle credit's 1e-6,
        below its 1/n where 1e-5 is not; ``train`` passes it on as given, a library user's
        strategy reads it here), else the strategies' 1e-5: refused unless below 1/n, for
        ``train_records`` records (by default the set-up strategy's)."""
        records = self.train_records if train_records is None else train_records
        if self.delta is not None:
            return validate_delta(self.delta, records, origin=delta_origin(self.delta))
        dataset_default = getattr(datamodule, "default_delta", None)
        if dataset_default is None:
            return validate_delta(DEFAULT_DELTA, records, origin=delta_origin(None))
        return validate_delta(dataset_default, records, origin="the dataset's default")

    def check_model_class(self, model: type) -> None:
        """Refuse a model class these settings cannot train (beyond :meth:`check_compatible`'s
        slot): none by default. ``train`` asks before any DP release reads the rows."""

    def check_fits_records(self, train_records: int, datamodule: Any) -> None:
        """Refuse the settings that ``train_records`` training records rule out (δ ≥ 1/n; a
        subclass adds its batch or its partitions), as :meth:`setup` does. ``train`` asks before
        any DP release reads a value: setup comes after the releases made before training (a
        CSV's schema estimate, DP modes, QUAIL's label model), so its refusal came after they had
        spent their budget. The count is public (privacy.json's ``train_records``)."""
        self._checked_delta(datamodule, train_records)

    def check_processes(self, processes: int, batch_size: Any, train_records: int | None) -> None:
        """Refuse, before any DP release reads the data, a number of processes (``--devices`` ×
        ``--num-nodes``) this strategy cannot share a step among: its setup refuses the same in
        every process, but only once they have started, after the releases had spent their
        budget. ``train_records`` is None where not counted before the releases (images).
        Nothing to refuse by default."""

    #: how to train without a target, said when no PrivacyBudgetStopping holds it
    without_target: ClassVar[str] = "give no target_epsilon"

    def check_target_enforced(self, trainer: L.Trainer) -> None:
        """Refuse a target epsilon nothing on this Trainer would hold training to: the target
        stops training only through :class:`PrivacyBudgetStopping`, and without it training
        passes the target while ``privacy_report()`` still states it as the target. The safe
        default, a strategy of one's own included; the vote-based strategies override it, as
        they refuse an answer that would pass the target themselves."""
        from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping

        if self.target_epsilon is None:
            return
        if not any(isinstance(c, PrivacyBudgetStopping) for c in getattr(trainer, "callbacks", [])):
            raise ValueError(
                f"{type(self).__name__}(target_epsilon={self.target_epsilon:g}) is held by the PrivacyBudgetStopping "
                f"callback, which this Trainer lacks: training would not stop at epsilon {self.target_epsilon:g}. "
                f"Add PrivacyBudgetStopping({self.target_epsilon:g}) to the Trainer's callbacks, or "
                f"{self.without_target}"
            )

    def _compose_preprocessing(self, datamodule: Any) -> None:
        """Basic composition with what preprocessing spent: training gets what is left of
        the target epsilon and of delta, and reports include both parts."""
        self.preprocessing = self.composed_preprocessing(dict(getattr(datamodule, "privacy_cost", lambda: {})()))
        if self.preprocessing["delta"] >= self.delta:
            raise ValueError(f"preprocessing already spent delta {self.preprocessing['delta']:g} of --delta {self.delta:g}, "
                             f"leaving training nothing: raise --delta, or {spend_less(self.preprocessing, 'delta')}")
        if self.target_epsilon is not None and self.preprocessing["epsilon"] >= self.target_epsilon:
            raise ValueError(
                f"preprocessing already spent epsilon {self.preprocessing['epsilon']:g} of --epsilon "
                f"{self.target_epsilon:g}, leaving training nothing ({epsilon_parts(self.preprocessing)}): raise "
                f"--epsilon, or {spend_less(self.preprocessing, 'epsilon')}"
            )

    def composed_preprocessing(self, data_cost: dict[str, Any], releases: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The data's preprocessing cost and the releases made before training (default:
        ``prior_releases``) in this strategy's neighbouring relation: each part restated on its
        own, then added up (basic composition holds under one relation; restating the sum would
        over-charge)."""
        releases = self.prior_releases if releases is None else releases
        if not releases:
            return {**data_cost, **self._in_own_neighbours(data_cost)}
        parts = {"data": data_cost or {"epsilon": 0.0, "delta": 0.0, "mechanism": "none"}, **releases}
        return compose_costs({name: {**part, **self._in_own_neighbours(part)} for name, part in parts.items()})

    def _in_own_neighbours(self, cost: dict[str, Any]) -> dict[str, Any]:
        """A preprocessing cost restated for this strategy's neighbouring relation.

        An (ε, δ) guarantee for add/remove neighbours gives (2ε, (1 + e^ε) δ) for replace-one
        neighbours (a replacement is a removal then an addition: group privacy for two records),
        so costs compose with training's under one and the same relation.
        """
        epsilon, delta = float(cost.get("epsilon", 0.0)), float(cost.get("delta", 0.0))
        relation = cost.get("neighbours", "add-remove")
        if epsilon == 0.0 and delta == 0.0 or relation == self.neighbours:
            return {"epsilon": epsilon, "delta": delta, "neighbours": self.neighbours}
        # a composition (the data's schema and modes; a DP schema's columns, each estimated on its own
        # share): each part restated, then added up -- a sum of (1 + e^eps_c) delta_c, not (1 + e^eps) delta.
        # The parts are recorded restated too, so that they add up to the header, each with its as_spent
        key = "parts" if cost.get("parts") else "columns"
        if composite := cost.get(key):
            restated = {name: {**part, **self._in_own_neighbours({"neighbours": relation, **part})}
                        for name, part in composite.items()}
            return {"epsilon": sum(part["epsilon"] for part in restated.values()),
                    "delta": sum(part["delta"] for part in restated.values()), "neighbours": self.neighbours,
                    "as_spent": {"epsilon": epsilon, "delta": delta, "neighbours": relation}, key: restated}
        if (relation, self.neighbours) != ("add-remove", "replace-one"):
            raise ValueError(f"cannot restate a {relation} preprocessing cost for {self.neighbours} neighbours")
        # (1 + e^eps) delta, which passes any delta (and overflows a float) for eps above ~709
        restated_delta = 0.0 if delta == 0.0 else math.inf if epsilon > 700 else (1.0 + math.exp(epsilon)) * delta
        return {"epsilon": 2.0 * epsilon, "delta": restated_delta, "neighbours": self.neighbours,
                "as_spent": {"epsilon": epsilon, "delta": delta, "neighbours": relation}}

    @property
    def training_delta(self) -> float:
        """The delta training may use: the target's, less what preprocessing spent."""
        return self.delta - self.preprocessing["delta"]

    @property
    def training_target(self) -> float | None:
        """The epsilon training may spend: the target's, less what preprocessing spent."""
        return None if self.target_epsilon is None else self.target_epsilon - self.preprocessing["epsilon"]

    def install(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Put the mechanism in ``pl_module``'s slot and create ``self.accountant``."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        # `is not None`: an accountant with no steps yet has length 0, and is still a state to keep
        state = {"strategy": self.name, "accountant": self.accountant.state_dict() if self.accountant is not None else None,
                 "segments": self.segments()}
        if self.accountant is not None and self.delta is not None:  # set up: what privacy.json says, for evaluate
            state["spent"] = self.spent_figures()
        return state

    def spent_figures(self) -> dict[str, float | None]:
        """The (epsilon, delta) spent so far as ``privacy.json`` states them (a spend no accountant
        bounds, epsilon infinite, as None). The checkpoint keeps them too, so that ``evaluate``
        reports the epsilon the run spent, not a figure edited into ``privacy.json`` since."""
        epsilon = self.epsilon()
        return {"epsilon": epsilon if math.isfinite(epsilon) else None, "delta": self.delta}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or state_dict.get("strategy") != self.name or self.accountant is None:
            raise AccountantStateError(f"the checkpoint's privacy state is not a {self.name} state")
        self.accountant.load_state_dict(state_dict.get("accountant"))
        segments = state_dict.get("segments")
        if segments is None and self.steps_taken() > 0:  # a checkpoint from before segments were kept
            segments = [{"from_step": 0, "noise_source": "not recorded (a checkpoint from before segments were kept)"}]
        self.earlier_segments = [dict(segment) for segment in segments or []]
        spent = state_dict.get("spent")
        self.resumed_delta = spent.get("delta") if isinstance(spent, dict) else None
        self.charged_at_start = self.steps_taken()  # again at on_train_start; known here for a refusal before it

    def charged_nothing_since_resume(self) -> bool:
        """Whether this process resumed a checkpoint and has charged no step since (its first
        step refused, or its limit already reached): its settings then describe no step taken."""
        return bool(self.earlier_segments) and self.steps_taken() <= self.charged_at_start

    def segment(self) -> dict[str, Any]:
        """What this process's training segment ran with that the accountant's history does not
        hold but the guarantee depends on (subclasses add theirs): after a resume the report
        must describe every segment, not only the settings of the last (a target, or a delta,
        changed on resume shows here too)."""
        return {"from_step": self.segment_start, "noise_source": self.noise.describe(), "target_epsilon": self.target_epsilon,
                "delta": self.delta}

    def last_charged_segment(self) -> dict[str, Any]:
        """The settings of the last segment that charged steps, which the report's top level
        states (a resume that charged none adds no segment, and its own settings took no step);
        this segment's where an older checkpoint's segment lacks a key."""
        return {**self.segment(), **self.segments()[-1]}

    def segments(self) -> list[dict[str, Any]]:
        """The earlier segments (from the checkpoint) and this one, unless it charged nothing
        after a resume (a resume that took no step adds no segment)."""
        if self.charged_nothing_since_resume():
            return list(self.earlier_segments)
        return [*self.earlier_segments, self.segment()]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.state_key not in checkpoint.get("callbacks", {}):
            raise AccountantStateError(
                f"the checkpoint holds no {self.name} accountant state: it was trained without this privacy "
                "strategy, or the file is damaged. The budget it already spent cannot be known, so resuming "
                "from it is refused; start a new run instead."
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start this process's segment at the module's step (0, or a resume's), before any draw:
        a fixed noise seed moves on to a stream of its own. Refuse a resumed accountant that
        charged fewer steps than the checkpoint's networks took (a damaged or edited state): its
        epsilon would leave those steps out."""
        self.segment_start, self.charged_at_start = getattr(pl_module, "train_steps", 0), self.steps_taken()
        self.batches_this_segment, self.epsilon_logged_at = 0, None
        self.noise.continue_after(self.segment_start)  # a fixed seed must not replay the first segment's draws
        expected = self.charges_for(self.segment_start)
        if expected is not None and self.steps_taken() < expected:
            raise AccountantStateError(
                f"the checkpoint's {self.name} accountant charged {self.steps_taken()} steps, but its networks took "
                f"{pl_module.train_steps} training steps, which need {expected}: the state is damaged, and the budget "
                "those steps spent cannot be known. Resuming from it is refused; start a new run instead.")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """Stop at the first batch whose charges do not match what the mechanism released
        (:meth:`charge_problem`). The shipped modules always match; a module written against
        the slot that skipped the mechanism trained on unclipped or unnoised gradients while
        the accountant reported an epsilon for steps it never charged."""
        self.batches_this_segment += 1
        problem = self.charge_problem(pl_module, self.steps_taken() - self.charged_at_start, self.batches_this_segment)
        if problem is not None:
            raise ChargeMismatchError(f"{type(self).__name__}: {problem}. Training is stopped: the epsilon the accountant "
                                      "reports would not bound what was released")
        self._log_epsilon(trainer)

    def _log_epsilon(self, trainer: L.Trainer) -> None:
        """``privacy/epsilon`` at the loggers' cadence, where no :class:`PrivacyBudgetStopping` logs
        it (a run with a given noise and no target): the spend is the run's first figure."""
        if budget_callback_logs_epsilon(trainer):
            return
        step = self.segment_start + self.batches_this_segment
        if step % max(trainer.log_every_n_steps, 1) == 0 or trainer.should_stop:
            self._write_epsilon(trainer, step)

    def _write_epsilon(self, trainer: L.Trainer, step: int) -> None:
        epsilon_to_loggers(trainer, self.epsilon(), step)
        self.epsilon_logged_at = step

    def _log_last_epsilon(self, trainer: L.Trainer) -> None:
        """The last step's epsilon where :meth:`_log_epsilon` logged it and missed the last step
        (``--max-epochs`` off the cadence, ``--trainer.max_time``), as the budget callback does."""
        if budget_callback_logs_epsilon(trainer):
            return
        step = self.segment_start + self.batches_this_segment
        if self.batches_this_segment and self.epsilon_logged_at != step:
            self._write_epsilon(trainer, step)

    def charge_problem(self, pl_module: L.LightningModule, charged: int, batches: int) -> str | None:
        """What is wrong when ``batches`` training batches since training started charged
        ``charged`` accountant steps, where a strategy knows what they must charge (``None``:
        nothing wrong, or not checked)."""
        return None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Tell a library user what ``train`` prints at the end (it sets ``warn_at_end`` off, as it
        says so itself): a refused query batch that ended training, an untrained generator, and
        ``training_warnings()``. From Python a refusal at the first step returned from ``fit()``
        in silence, leaving the generator's random initialisation to be sampled. First, the last
        step's epsilon where nothing logged it (:meth:`_log_last_epsilon`)."""
        self._log_last_epsilon(trainer)
        if not self.warn_at_end or not getattr(trainer, "is_global_zero", True):
            return
        name, steps = type(self).__name__, getattr(pl_module, "train_steps", 0)
        if self.refusal is not None:
            warnings.warn(f"{name} refused a query batch that would have passed the target ({self.refusal}); nothing "
                          f"of it was released, and training stopped after {steps} steps", UserWarning, stacklevel=2)
        if getattr(pl_module, "generator_updates", 1) == 0:
            warnings.warn("no generator update was taken: the generator and its samples are its random "
                          "initialisation", UserWarning, stacklevel=2)
        for warning in [*filter(None, [self.fixed_seed_warning()]), *self.training_warnings()]:
            warnings.warn(warning, UserWarning, stacklevel=2)

    def charges_for(self, train_steps: int) -> int | None:
        """The accountant steps ``train_steps`` training steps charge at least, where a strategy
        knows it (``None``: not checked)."""
        return None

    @staticmethod
    def planned_batches(trainer: L.Trainer, batches_per_epoch: int) -> int:
        """Training batches the run will take at most (``--max-steps``, ``--max-epochs``), for
        calibrating noise to a target epsilon before training."""
        limits = [c.max_steps for c in trainer.callbacks if isinstance(c, StepLimit)]
        if trainer.max_epochs and trainer.max_epochs > 0:
            limits.append(trainer.max_epochs * epoch_batches_within_limit(trainer, batches_per_epoch))
        if not limits:
            raise ValueError("to calibrate the noise from --epsilon, give --max-steps or --max-epochs (as a library: a "
                             "StepLimit(n) callback or Trainer(max_epochs=n); Trainer(max_steps=n) counts optimizer "
                             "steps, several a training batch, and is not read)")
        return min(limits)

    # -------------------------------------------------------- accounting
    def next_step_params(self) -> dict[str, float]:
        """The mechanism parameters of the next step (for look-ahead before any step)."""
        raise NotImplementedError

    def last_step_params(self) -> dict[str, float]:
        """The parameters of the last charged step, else of the next one: what the report's top
        level states. After a resume that changed them (another batch size) and took no step,
        the next step's would describe no step taken."""
        history = getattr(self.accountant, "history", None)
        return dict(history[-1][0]) if history else self.next_step_params()

    def steps_taken(self) -> int:
        """Training steps charged so far (the unit of ``epsilon_if``)."""
        return len(self.accountant)

    def plan_key(self) -> tuple:
        """What budget planning depends on besides the step count: while it is unchanged,
        each further step costs what ``epsilon_if`` predicted."""
        return tuple(sorted(self.next_step_params().items()))

    def epsilon(self) -> float:
        """Total epsilon spent so far (preprocessing + training), at ``self.delta`` in all."""
        return self.preprocessing["epsilon"] + self.training_epsilon()

    def epsilon_if(self, steps: int = 1) -> float:
        """Total epsilon after ``steps`` more training steps; the state is not changed."""
        return self.preprocessing["epsilon"] + self.training_epsilon_if(steps)

    def first_step_refusal(self, target_epsilon: float, priced: float | None = None, exact: bool = True) -> str:
        """Why a run cannot take its first step under ``target_epsilon``, and what makes a step
        cheaper (a strategy whose ``epsilon_if`` is a best case says so, with its own remedy).
        ``priced``: the step's total priced before setup (:meth:`first_step_epsilon`), ``exact``
        or a lower bound; by default ``epsilon_if(1)``."""
        if priced is None:
            priced = self.epsilon_if(1)
        figure = f"{'' if exact else 'at least '}epsilon = {priced:.4g}"
        return (f"a single training step would spend {figure}, more than --epsilon "
                f"{target_epsilon:g}: raise --epsilon, or make each step cheaper (more noise, smaller batches: the "
                "strategy's --privacy.* settings, listed by --help).")

    def first_step_epsilon(self, train_records: int, batch_size: Any, model_settings: Mapping[str, Any],
                           training_delta: float) -> float | None:
        """What the first training step alone would spend, at ``training_delta``, from the settings
        and the record count alone, before :meth:`setup`: ``train`` prices it before the releases
        made before training, whose budget a first step too dear to take spent for nothing (the
        budget's own refusal comes at the start of training). As :meth:`training_epsilon_if` prices
        it (a best case where that is one); None where the settings do not decide it."""
        return None

    def spent_before_training_note(self, planned: dict[str, Any] | None = None) -> str:
        """For a refusal of the first step: how much of its figure the releases before training
        (DP modes, a DP schema, QUAIL's label model) spent, and how to spend less there; a step's
        price alone, which the refusal's remedies address, is the rest. ``planned``: their cost
        before they are made (``train``'s refusal before any DP release reads the rows), else what they spent."""
        cost = self.preprocessing if planned is None else planned
        if not cost["epsilon"]:
            return ""
        restated = (f"; restated for {self.neighbours} by group privacy from what each "
                    f"{'would spend' if planned else 'spent'} for add/remove neighbours" if "as_spent" in cost else "")
        return (f" Of that, {cost['epsilon']:.4g} {'would be' if planned else 'was'} spent before training "
                f"({epsilon_parts(cost)}{restated}): or {spend_less(cost, 'epsilon')}.")

    def training_epsilon(self) -> float:
        """What training alone has spent, at training's share of delta: the figure the budget
        compares with the target less preprocessing's spend (``epsilon()`` adds that spend back)."""
        return self.accountant.get_epsilon(self.training_delta)

    def training_epsilon_if(self, steps: int) -> float:
        return self.accountant.epsilon_if(self.training_delta, steps, **self.next_step_params())

    def report_parameters(self) -> dict[str, Any]:
        """Everything needed to recompute epsilon independently (subclasses add theirs)."""
        return {}

    @staticmethod
    def noise_source_report(segments: list[dict[str, Any]], key: str = "noise_source") -> str:
        """Where the noise (or another secret draw, ``key``) came from, in every segment: a fixed
        seed in an earlier one must not be hidden behind this one's OS entropy."""
        sources = [(segment["from_step"], segment.get(key, "not recorded")) for segment in segments]
        if len({source for _, source in sources}) == 1:
            return sources[0][1]
        return "; then ".join(f"from step {start}: {source}" for start, source in sources)

    def privacy_report(self) -> dict[str, Any]:
        """What the strategy spent and how it was accounted: the part of ``train``'s
        ``privacy.json`` that is the strategy's (``train`` adds how the run stopped and its
        lineage). A strategy a Trainer has not set up yet knows no records to report on."""
        if self.train_records is None:
            raise RuntimeError(f"{type(self).__name__}.privacy_report(): the strategy has not been set up by a Trainer "
                               "yet, so it has no records, mechanism or spend to report: call it after trainer.fit(...)")
        segments = self.segments()
        return {
            "mechanism": self.mechanism_name,
            **self.spent_figures(),
            "neighbours": self.neighbours,
            "target_epsilon": self.target_epsilon,
            "epsilon_training": self.training_epsilon(),
            "delta_training": self.training_delta,
            "preprocessing": self.preprocessing,
            "steps": self.steps_taken(),
            "accountant": self.accountant.name,
            "noise_source": self.noise_source_report(segments),
            "train_records": self.train_records,
            **self.report_parameters(),
            **({"segments": segments} if len(segments) > 1 else {}),
            "accountant_state": self.accountant.public_state_dict(),
            "software": software_versions(),
        }


class CalibratedNoiseStrategy(PrivacyStrategy):
    """A strategy with a Gaussian noise multiplier that is either given or calibrated to the
    target epsilon before training (``calibrated_for_steps``), and kept from the checkpoint on
    resume unless given again: a resumed run must add the noise its budget was planned for.

    Subclasses create ``self.mechanism`` (with a ``noise_multiplier`` attribute) in ``install``.
    """

    clips_gradients: ClassVar[bool] = True
    #: a given noise multiplier (or one calibrated in an earlier fit of this instance) would
    #: train past the target without PrivacyBudgetStopping
    without_target: ClassVar[str] = "give noise_multiplier and no target_epsilon"

    def __init__(self, noise_multiplier: float | None, target_epsilon: float | None, delta: float | None,
                 noise_seed: int | None = None) -> None:
        super().__init__(target_epsilon, delta, noise_seed)
        if noise_multiplier is None and target_epsilon is None:
            raise ValueError(f"{self.name} needs --epsilon (to calibrate the noise) or --privacy.noise_multiplier")
        if noise_multiplier is not None:
            validate_noise_scale("--privacy.noise_multiplier", noise_multiplier)
        self.noise_multiplier = noise_multiplier
        self.noise_multiplier_given = noise_multiplier is not None
        self.calibrated_for_steps: int | None = None
        #: (floor, delta) where the first step was priced at the accountant's floor (first_step_epsilon)
        self.floor_priced: tuple[float, float] | None = None
        #: the checkpoint's noise multiplier and calibration, on resume
        self.resumed_noise: dict[str, Any] | None = None
        self.mechanism: Any = None

    def first_step_epsilon(self, train_records: int, batch_size: Any, model_settings: Mapping[str, Any],
                           training_delta: float) -> float | None:
        """With a noise multiplier given, one step of it (:meth:`given_noise_step_epsilon`); to be
        calibrated, the least epsilon a step certifies at ``training_delta`` however much noise is
        added (:meth:`epsilon_floor`): a training budget at or below it is refused by the
        calibration, which comes after the releases made before training."""
        self.floor_priced = None
        if self.noise_multiplier is not None:
            return self.given_noise_step_epsilon(train_records, batch_size, training_delta)
        self.floor_priced = (self.epsilon_floor(train_records, batch_size, training_delta), training_delta)
        return self.floor_priced[0]

    def given_noise_step_epsilon(self, train_records: int, batch_size: Any, training_delta: float) -> float | None:
        """One step at the given noise multiplier, before setup; None where the settings do not decide it."""
        return None

    def epsilon_floor(self, train_records: int, batch_size: Any, delta: float) -> float:
        """The least epsilon the calibration's accountant reports at ``delta`` for any step,
        however much noise: the RDP accountant's (zero divergence on its order grid)."""
        return rdp_epsilon_floor(delta)

    def first_step_refusal(self, target_epsilon: float, priced: float | None = None, exact: bool = True) -> str:
        """A budget no noise can fit (priced at :meth:`epsilon_floor`) says so: more noise does not help."""
        floor = self.floor_priced
        if floor is None or priced is None:
            return super().first_step_refusal(target_epsilon, priced, exact)
        return (f"however much noise is added, a training step spends at least epsilon {floor[0]:.3g} at delta "
                f"{floor[1]:g} (the least the accountant reports), so this run would spend at least epsilon = "
                f"{priced:.4g}, more than --epsilon {target_epsilon:g}: raise --epsilon (or --delta).")

    def noise_state(self) -> dict[str, Any]:
        """The noise multiplier and the steps it was calibrated for, as the checkpoint keeps them:
        the resumed checkpoint's while this process has charged nothing. A resume refused at its
        first step, with another --privacy.noise_multiplier, rewrote the checkpoint with a σ that
        noised no step, and the σ the budget was calibrated for was lost to later resumes."""
        if self.resumed_noise is not None and self.charged_nothing_since_resume():
            return dict(self.resumed_noise)
        return {"noise_multiplier": self.noise_multiplier, "calibrated_for_steps": self.calibrated_for_steps}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.noise_state()}

    def last_charged_segment(self) -> dict[str, Any]:
        # an older checkpoint's segments lack sigma: the kept one, not a sigma given to a resume that took no step
        return {**self.segment(), "noise_multiplier": self.noise_state()["noise_multiplier"], **self.segments()[-1]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume with the checkpoint's noise multiplier, unless the user set one now.

        Runs before the optimizers are built, so the restored value is the one used."""
        super().load_state_dict(state_dict)
        self.resumed_noise = {"noise_multiplier": state_dict.get("noise_multiplier"),
                              "calibrated_for_steps": state_dict.get("calibrated_for_steps")}
        if not self.noise_multiplier_given:
            self.noise_multiplier = validate_positive("noise_multiplier in the checkpoint", state_dict.get("noise_multiplier"))
            self.calibrated_for_steps = state_dict.get("calibrated_for_steps")
            self.mechanism.noise_multiplier = self.noise_multiplier
