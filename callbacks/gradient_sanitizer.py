"""``GradientSanitizer``: the gradient-sanitizing strategy (DP-HOOK of DP-SACTGAN; GS-WGAN's hook).

It puts :class:`~lightning_dpgan.privacy.gradient_sanitizer.GradientSanitizerMechanism` in the
module's GradientSanitizer slot: the critic trains on real records without noise and is never
released, and every gradient that flows from it into the generator is clipped per generated
record to ``C / B`` and noised with ``N(0, (sigma C / B)^2)`` (sensitivity and noise are stated
in that module). In units of the sensitivity the noise multiplier is ``s = sigma / (2 sqrt(B))``.
Two modes, chosen by ``num_critics`` (``--privacy.num_critics N``):

**One critic (N = 1, the default): no amplification.** Each generator step is charged to a
:class:`~lightning_dpgan.privacy.accountants.GaussianAccountant` as a Gaussian of multiplier
``s``: ``(lambda, 2 B lambda / sigma^2)``-RDP, DP-SACTGAN's Theorem 1, for B generated records
per step (fixed by this strategy, so the charge does not depend on the data). One real record
may change the critic and so every released gradient; the bound holds for add/remove and
replace-one neighbours alike, and the strategy reports add/remove.

**N critics (GS-WGAN, Chen, Orekondy & Fritz, NeurIPS 2020): subsampling without replacement.**
The training records are split once into N disjoint partitions (a seeded permutation of the
indices, fixed for the run and saved in checkpoints, as for PATE's teachers); critic j trains
only on partition j. Every training step t (the module's ``train_steps``, restored on resume) is
one iteration of two independent parts:

- **Training, on a public schedule: round-robin.** Critic ``t mod N`` takes
  ``discriminator_steps`` steps on minibatches of its own partition. Which critic trains never
  depends on the selection below.
- **Answering, by a secret draw.** A critic is drawn uniformly from ``selector``, afresh and
  independently of everything else, and the generator step queries it alone through the
  sanitizer; it is not trained in this step. Its state is whatever its round-robin turns made it
  -- up to N - 1 generator steps stale, and untrained before its first turn (t < N). That is the
  price of a sound guarantee: GS-WGAN trains the selected critic right before it answers, which
  ties every critic's state to its own secret selection history (see the last point).
  Fine-tuning a throw-away copy of the selected critic before it answers would keep the
  guarantee; it is not implemented.

The analysis, which is the contract of this mode:

- Treat the N partitions as N "super-records"; the per-step release is the sanitized gradient of
  the answering critic. Neighbouring datasets replace one record (N is public and fixed, so the
  partitions of the other records do not move): one partition changes, and with it one critic,
  arbitrarily.
- Every row is clipped to ``C / B`` whatever critic produced it, so the released means of ANY two
  critics differ by at most the sensitivity (``2C / B`` per row, ``sqrt(B) 2C / B`` overall): the
  base mechanism is ``(alpha, alpha / (2 s^2))``-RDP between any two critics.
- Drawing one critic of N uniformly is sampling ONE super-record out of N without replacement. Each
  step is charged Wang, Balle & Kasiviswanathan (AISTATS 2019), Theorem 9, with ``gamma = 1 / N``
  (:class:`~lightning_dpgan.privacy.accountants.SelectedCriticGaussianAccountant`): the general
  bound for integer orders >= 2, interpolated between integers by convexity of the log-moment,
  ``eps(2)`` below 2, and never above the un-amplified ``alpha / (2 s^2)``. GS-WGAN's own code
  uses the same theorem (autodp's ``compose_subsampled_mechanism``).
- NOT the Poisson subsampled Gaussian (Mironov, Talwar & Zhang 2019): the critic is not chosen by
  Poisson sampling (exactly one answers every step, never none), and the critics without the
  changed record do not answer with "the unchanged mechanism" a Poisson analysis assumes -- their
  answers differ from the changed critic's by up to the full sensitivity. Stopping never uses it.
- The selection must be unknown to whoever sees the generator (like the noise): it is drawn
  from its own ``torch.Generator``, seeded from OS entropy unless ``selection_seed`` is given
  (for reproducible tests), and saved in checkpoints, which are not a release.
- The critics read real records in their partition's minibatches only; each critic's parameters
  and Adam state move only on its own (round-robin) steps. The minibatch draw takes as many
  random numbers whatever the critic, so no stream depends on which critic trains or answers.
- Why the per-step bounds compose (adaptive RDP composition): at step t, given the releases of
  steps < t (which fix the generator the critics train against), every critic's state is a
  function of its own partition, those released generator states, the public round-robin
  schedule and randomness independent of the selections (initial weights, latents, minibatch
  draws) -- never of a selection, since a critic trains on its turn whether or not it ever
  answered, answering changes nothing in it (critics with BatchNorm running statistics are
  refused), and the generator moves only through the released gradients (and its own latents).
  The answering critic is drawn afresh and secretly at each step. So step t is, given the past
  releases, exactly one super-record of N sampled without replacement and passed through a
  mechanism that is ``(alpha, alpha / (2 s^2))``-RDP between any two of them: Theorem 9 with
  ``gamma = 1 / N``, and RDP composes adaptively over the steps.

A training step (``--max-steps``) is one GS-WGAN iteration in this mode (``discriminator_steps``
critic steps + one generator step); with one critic it stays one critic step.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lightning_dpgan.callbacks.strategy import CalibratedNoiseStrategy
from lightning_dpgan.callbacks.teachers import available_memory, check_same_partition_seed, drawn_with_replacement
from lightning_dpgan.data.partition import PartitionedSampler
from lightning_dpgan.distributed import batches_per_process, world_size
from lightning_dpgan.error_text import SET_BY, byte_size
from lightning_dpgan.privacy.accountants import (
    GaussianAccountant,
    SelectedCriticGaussianAccountant,
    calibrate_noise_multiplier,
    calibrate_selected_critic_noise,
)
from lightning_dpgan.privacy.analysis.rdp import rdp_to_epsilon
from lightning_dpgan.privacy.analysis.subsampling import selected_critic_gaussian_rdp
from lightning_dpgan.privacy.gradient_sanitizer import (GradientSanitizerMechanism, effective_noise_multiplier,
                                                        noise_multiplier_for)
from lightning_dpgan.privacy.noise_source import FIXED_SEED
from lightning_dpgan.privacy.slots import GradientSanitizer as GradientSanitizerSlot
from lightning_dpgan.privacy.validation import validate_int, validate_positive

log = logging.getLogger(__name__)

#: Peak memory of N critics in multiples of their parameters' bytes: the parameters and Adam's two
#: moments (gradients exist for the critic in training only).
CRITIC_MEMORY_FACTOR = 3
#: float32 copies of a generated batch the sanitizer holds at once: the records, their gradient,
#: the noise and the clipped gradient
GENERATED_BATCH_MEMORY_FACTOR = 4


class CriticSampler(PartitionedSampler):
    """:class:`PartitionedSampler`'s fixed, checkpointed partitions and random state, drawing the
    minibatches of ONE critic at a time (the round-robin one; the others are not trained in that
    iteration)."""

    def draw_from(self, part: int, count: int) -> tuple[Tensor, Tensor | None]:
        """``count`` minibatches ``[count, b, ...]`` of partition ``part`` (labels ``[count, b]``);
        each minibatch holds distinct records unless the sampler draws with replacement."""
        # as many random numbers whatever the partition, so the stream does not depend on which critic trains
        size = int(self.sizes[part])
        if self.replacement:
            uniform = torch.rand(count, self.batch_size, generator=self.generator)
            slots = (uniform * size).long().clamp_max(size - 1)
        else:
            keys = torch.rand(count, self.index.shape[1], generator=self.generator)
            keys[:, size:] = float("inf")  # padding of the shorter partitions
            slots = keys.topk(self.batch_size, dim=1, largest=False, sorted=False).indices
        indices = self.index[part][slots].to(self.data.device)
        labels = None if self.labels is None else self.labels[indices.to(self.labels.device)]
        return self.data[indices], labels


class CriticIterations(IterableDataset):
    """``steps`` GS-WGAN iterations per epoch, each ``{"critic": trained, "answer": answering,
    "records": [critic_steps, b, ...], "labels": [critic_steps, b] or None}``.

    ``trained`` follows the public round-robin schedule: ``t mod N`` at training step t, counting
    up from ``first_step()``, read once per epoch when iteration starts (after a checkpoint is
    restored; not per batch, since Lightning fetches one batch ahead). ``records`` are its
    ``critic_steps`` minibatches, from its own partition. ``answering`` is drawn uniformly by
    ``selector``, independently of the schedule and of the minibatches."""

    def __init__(self, sampler: CriticSampler, selector: torch.Generator, critic_steps: int, steps: int,
                 first_step: Callable[[], int]) -> None:
        """``first_step``: the training step the next batch is for (the module's ``train_steps``)."""
        self.sampler, self.selector, self.critic_steps, self.steps = sampler, selector, critic_steps, steps
        self.first_step = first_step

    def __iter__(self) -> Iterator[dict[str, Any]]:
        num_critics = self.sampler.num_teachers
        start = int(self.first_step())
        for step in range(start, start + self.steps):
            trained = step % num_critics
            answer = int(torch.randint(num_critics, (1,), generator=self.selector))
            records, labels = self.sampler.draw_from(trained, self.critic_steps)
            yield {"critic": trained, "answer": answer, "records": records, "labels": labels}

    def __len__(self) -> int:
        return self.steps


class GradientSanitizer(CalibratedNoiseStrategy):
    """Clip and noise the gradient the generator receives from the critic (DP-HOOK; GS-WGAN)."""

    name: ClassVar[str] = "sanitizer"
    slot: ClassVar[type] = GradientSanitizerSlot
    mechanism_name: ClassVar[str] = "gradient sanitizer (per-record clipping and Gaussian noise on dL/dG(z))"

    def __init__(
        self,
        noise_multiplier: float | None = None,
        max_norm: float = 1.0,
        generated_batch_size: int | None = None,
        num_critics: int = 1,
        partition_seed: int = 0,
        selection_seed: int | None = None,
        target_epsilon: float | None = None,
        delta: float | None = None,
        noise_seed: int | None = None,
    ) -> None:
        """
        Args:
            noise_multiplier: sigma; the noise on each gradient entry is ``sigma * C / B``.
                Default: calibrated so that the planned generator steps spend ``--epsilon``.
            max_norm: C, each generated record's gradient is clipped to ``C / B``.
            generated_batch_size: B, generated records per generator step (default: the
                datamodule's batch size). It sets the privacy cost of a step.
            num_critics: N. 1: one critic, no amplification. N > 1: GS-WGAN's N critics on
                disjoint partitions, trained round-robin, one drawn per step to answer the
                generator (sampling without replacement, 1/N).
            partition_seed: seeds the partition of the records into N (public, like PATE's).
            selection_seed: seeds which critic answers each step. Leave it unset for a private
                run (OS entropy): the amplification assumes the selection is secret.
            noise_seed: fixes the sanitizer noise's generator, for tests only (default: OS entropy).
        """
        super().__init__(noise_multiplier, target_epsilon, delta, noise_seed)
        self.max_norm = validate_positive("--privacy.max_norm", max_norm)
        #: whether B was given (else --batch-size's, which a refusal then names)
        self.generated_batch_size_given = generated_batch_size is not None
        self.generated_batch_size = (None if generated_batch_size is None
                                     else validate_int("--privacy.generated_batch_size", generated_batch_size, 1))
        self.num_critics = validate_int("--privacy.num_critics", num_critics, 1)  # inf: an OverflowError before
        self.partition_seed, self.selection_seed = partition_seed, selection_seed
        self.sampler: CriticSampler | None = None
        self.selector: torch.Generator | None = None
        self.steps_per_epoch: int | None = None
        self.updates_at_start: int | None = None  # the module's generator updates at on_train_start
        if self.amplified:
            # the partitions are a seeded permutation of the N record indices: only replacing a
            # record keeps every other record in its partition (see the module docstring)
            self.neighbours = "replace-one"
            self.mechanism_name = (f"gradient sanitizer, GS-WGAN amplified: {self.num_critics} critics on disjoint "
                                   "partitions, trained round-robin; the one answering each generator step drawn "
                                   "uniformly (sampling without replacement)")
            self.accountant = SelectedCriticGaussianAccountant()
        else:
            self.accountant = GaussianAccountant()

    @property
    def amplified(self) -> bool:
        """Whether this is GS-WGAN's N-critic mode."""
        return self.num_critics > 1

    @property
    def datamodule_needs(self) -> tuple[str, ...]:
        """The batch size, and in the N-critic mode the critics' partitions of the records."""
        return (("train_dataset.tensors", "hparams.batch_size", "partitions") if self.amplified
                else ("train_dataset", "hparams.batch_size"))

    # -------------------------------------------------------------- install
    def install(self, trainer: L.Trainer, pl_module: Any) -> None:
        batch_size = trainer.datamodule.hparams.batch_size
        self.generated_batch_size = self.generated_batch_size or batch_size
        pl_module.generated_batch_size = self._records_per_rank(pl_module)
        if not self.amplified and getattr(pl_module, "num_critics", 1) > 1:
            raise ValueError(f"the model has {pl_module.num_critics} critics: train them with "
                             f"--privacy.num_critics {pl_module.num_critics} (from Python: "
                             f"GradientSanitizer(num_critics={pl_module.num_critics}, ...))")
        # the training device: the module is moved there only after the callbacks' setup
        check_generated_batch_memory(pl_module.generated_batch_size, pl_module.data_shape, trainer.strategy.root_device)
        if self.amplified:
            self._install_critics(trainer, pl_module, batch_size)
        if self.noise_multiplier is None:
            self.noise_multiplier = self._calibrate(trainer, pl_module, batch_size)
        self.mechanism = GradientSanitizerMechanism(self.max_norm, self.noise_multiplier, on_release=self._charge,
                                                    noise=self.noise)
        pl_module.privacy = self.mechanism

    def check_model_class(self, model: type) -> None:
        """N critics need a model that builds one per partition (``train`` asks before any DP
        release reads the rows, install again)."""
        if self.amplified and not callable(getattr(model, "build_critics", None)):
            raise ValueError(f"--privacy.num_critics {self.num_critics} needs a model that trains one critic per "
                             f"partition (gswgan); {model.__name__} has a single discriminator")

    def check_critic_count(self, train_records: int) -> None:
        """N critics need N disjoint partitions, so at most one critic per record."""
        if self.num_critics > train_records:
            raise ValueError(f"--privacy.num_critics {self.num_critics} ({SET_BY}) exceeds the {train_records} "
                             f"training records: pass --privacy.num_critics {train_records} or less")

    def check_fits_records(self, train_records: int, datamodule: Any) -> None:
        super().check_fits_records(train_records, datamodule)
        self.check_critic_count(train_records)

    def _install_critics(self, trainer: L.Trainer, pl_module: Any, batch_size: int) -> None:
        """N critics on N fixed disjoint partitions, and a loader of GS-WGAN iterations in place
        of the datamodule's (as :class:`~lightning_dpgan.callbacks.teachers.TeacherStrategy` does)."""
        self.check_model_class(type(pl_module))
        self.check_critic_count(self.train_records)
        datamodule = trainer.datamodule
        partitions = datamodule.partitions(self.num_critics, self.partition_seed)
        smallest = min(len(part) for part in partitions)
        if batch_size > smallest:
            log.warning(drawn_with_replacement("critic", batch_size, smallest, "--batch-size"))
        records, *rest = datamodule.train_dataset.tensors
        labels = rest[0] if rest and getattr(pl_module, "num_classes", None) else None
        self.sampler = CriticSampler(records, partitions, batch_size, labels=labels,
                                     replacement=batch_size > smallest, seed=self.partition_seed)
        check_critic_memory(pl_module.build_critics(self.num_critics), trainer.strategy.root_device)
        self.selector = self.critic_selector()
        critic_steps = pl_module.hparams.discriminator_steps
        # an epoch reads as many real records as the training split holds (round-robin: each partition about once)
        self.steps_per_epoch = max(1, math.ceil(self.train_records / (batch_size * critic_steps)))
        iterations = CriticIterations(self.sampler, self.selector, critic_steps, self.steps_per_epoch,
                                      first_step=lambda: pl_module.train_steps)
        datamodule.train_dataloader = lambda: DataLoader(iterations, batch_size=None)

    def critic_selector(self) -> torch.Generator:
        """The generator that draws which critic answers each generator step. The amplification
        holds only while that choice stays secret, so it is seeded from OS entropy, never from
        the run's ``--seed`` (which a config file publishes); ``selection_seed`` is for tests."""
        selector = torch.Generator()
        if self.selection_seed is None:
            selector.seed()
        else:
            selector.manual_seed(self.selection_seed)
        return selector

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        self.updates_at_start = getattr(pl_module, "generator_updates", None)

    def charge_problem(self, pl_module: Any, charged: int, batches: int) -> str | None:
        """Each generator update is one sanitized release: fewer charges than updates, and an
        update went round the mechanism, the critic's gradient on the real records reaching the
        generator unclipped and unnoised. (More is not a leak: each release is charged.)"""
        updates = getattr(pl_module, "generator_updates", None)
        start = self.updates_at_start
        if not isinstance(updates, int) or not isinstance(start, int) or charged >= updates - start:
            return None
        return (f"{updates - start} generator update{'s' if updates - start > 1 else ''} charged {charged} sanitized "
                f"release{'s' if charged != 1 else ''}: a generator update went round the mechanism (its generated batch "
                "not passed through the slot's sanitize before the critic), so the critic's gradient on the real "
                "records reached the generator unclipped and unnoised")

    def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Keep the records where the critics are (a GPU), so a step gathers its minibatches there."""
        if self.sampler is not None:
            self.sampler.data = self.sampler.data.to(pl_module.device)
            if self.sampler.labels is not None:
                self.sampler.labels = self.sampler.labels.to(pl_module.device)

    def _calibrate(self, trainer: L.Trainer, pl_module: Any, batch_size: int) -> float:
        """The smallest sigma whose planned generator steps stay within the target.

        One critic: each step is a Gaussian (no subsampling), so Opacus' calibration at sampling
        rate 1 gives the multiplier in sensitivity units. N critics: bisection on the
        :class:`SelectedCriticGaussianAccountant`'s own curve, one step per training step.
        Either way ``sigma = s * 2 sqrt(B)``."""
        if self.amplified:
            steps = self.planned_batches(trainer, self.steps_per_epoch)
            effective = calibrate_selected_critic_noise(self.training_target, self.training_delta, steps,
                                                        self.num_critics, tuple(self.accountant.orders.tolist()))
        else:
            # each of W processes reads its own share of the records, --batch-size of them a batch,
            # a short last batch dropped: planning N / batch batches an epoch calibrated sigma for
            # W times the steps a DDP run takes, and rounding up for a step never taken
            batches = self.planned_batches(trainer, batches_per_process(self.train_records, world_size(), batch_size))
            steps = max(1, batches // getattr(pl_module.hparams, "discriminator_steps", 1))
            effective = calibrate_noise_multiplier(self.training_target, self.training_delta, 1.0, steps)
        self.calibrated_for_steps = steps
        return noise_multiplier_for(effective, self.generated_batch_size)

    def check_processes(self, processes: int, batch_size: Any, train_records: int | None) -> None:
        """Every process sanitizes an equal share of the B generated records."""
        records = self.generated_batch_size or batch_size
        if isinstance(records, int) and records % processes:
            given = (f"--privacy.generated_batch_size {records}" if self.generated_batch_size_given else
                     f"--batch-size {records} (the generated records a step, B, unless --privacy.generated_batch_size "
                     "is given)")
            raise ValueError(f"{given} must be a multiple of the {processes} processes, so that every rank sanitizes an "
                             "equal share")

    def _records_per_rank(self, pl_module: Any) -> int:
        """Generated records each process sanitizes per generator step: B / W under DDP.

        Each rank's hook clips its rows to C / (B / W) and noises each entry by sigma C / (B / W)
        -- W times the single-process rows, each row noised once -- and the generator's gradients
        are averaged over the W ranks, which divides by W again: the single-process release of
        B rows (see :mod:`lightning_dpgan.privacy.gradient_sanitizer`)."""
        ranks = world_size()
        self.check_processes(ranks, self.generated_batch_size, None)
        share = self.generated_batch_size // ranks
        # a BatchNorm generator's first step would fail on one record ("more than 1 value per channel")
        if pl_module.generator_normalizes_batches and share < 2:
            raise ValueError(f"the generator normalizes each batch (BatchNorm), which needs at least 2 generated records "
                             f"a step in each process, and --privacy.generated_batch_size {self.generated_batch_size} over "
                             f"{ranks} processes gives {share}: use --privacy.generated_batch_size {2 * ranks} or more")
        return share

    # ----------------------------------------------------------- accounting
    def _charge(self, batch: int) -> None:
        if batch * world_size() != self.generated_batch_size:
            raise RuntimeError(f"a sanitized batch of {batch} records per process, but the strategy charges batches of "
                               f"{self.generated_batch_size} over {world_size()} process(es)")
        self.accountant.step(**self.next_step_params())

    def next_step_params(self) -> dict[str, float]:
        params = {"noise_multiplier": effective_noise_multiplier(self.noise_multiplier, self.generated_batch_size)}
        if self.amplified:
            params["num_critics"] = self.num_critics
        return params

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "num_critics": self.num_critics}
        if self.amplified:
            state["sampler"] = self.sampler.state_dict() if self.sampler else None
            state["selector"] = self.selector.get_state() if self.selector is not None else None
            state["partition_seed"] = self.partition_seed
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also the partitions, the minibatch draws and the critic selection: a resumed run goes on
        with the same N critics on the same records (and the round-robin at the module's restored
        ``train_steps``)."""
        saved = int(state_dict.get("num_critics", 1)) if isinstance(state_dict, dict) else 1
        if saved != self.num_critics:
            raise ValueError(f"the checkpoint trained {saved} critic(s): resume with --privacy.num_critics {saved}")
        if self.amplified:
            check_same_partition_seed(state_dict, self.partition_seed, "critics'")
        super().load_state_dict(state_dict)
        if self.amplified:
            self.sampler.load_state_dict(state_dict["sampler"])
            if self.selection_seed is not None:  # a test's fixed selection goes on from where it was
                self.selector.set_state(state_dict["selector"])
            # else this run's selector, drawn from OS entropy, stays: the checkpoint's may be a fixed
            # seed's stream (an earlier segment's --privacy.selection_seed), which anyone holding
            # that segment's config.yaml could replay

    # --------------------------------------------------------------- report
    def segment(self) -> dict[str, Any]:
        """Also the noise multiplier and B this segment's generator steps were sanitized with,
        and, with N critics, where the answering critics were drawn from."""
        segment = {**super().segment(), "noise_multiplier": self.noise_multiplier, "max_norm": self.max_norm,
                   "generated_batch_size": self.generated_batch_size}
        return {**segment, "selection_source": self.selection_source()} if self.amplified else segment

    def selection_source(self) -> str:
        """Where this segment's answering critics were drawn from."""
        if self.selection_seed is None:
            return "own generator seeded from OS entropy (not the run's --seed)"
        return (f"{FIXED_SEED} {self.selection_seed} (--privacy.selection_seed, for tests only: anyone with the seed "
                "knows which critic answered, which the amplified bound assumes secret)")

    def report_parameters(self) -> dict[str, Any]:
        effective = self.last_step_params()["noise_multiplier"] if self.generated_batch_size else None
        # the last segment that took steps: its sigma, C and B are those of the effective multiplier
        # beside them, not the settings of a resume that took none
        last = self.last_charged_segment()
        report = {
            "noise_multiplier": last["noise_multiplier"],
            "max_norm": last["max_norm"],
            "generated_batch_size": last["generated_batch_size"],
            "effective_noise_multiplier": effective,
            "calibrated_for_steps": self.noise_state()["calibrated_for_steps"],
            "generator_steps": len(self.accountant),
            "num_critics": self.num_critics,
        }
        if not self.amplified:
            return {**report, "mode": "one critic, no amplification", "sampling_rate": 1.0,
                    "rdp_per_step": "2 B lambda / sigma^2 (DP-SACTGAN, Theorem 1)"}
        sizes = [len(part) for part in self.sampler.partitions] if self.sampler else []
        return {
            **report,
            "mode": f"GS-WGAN amplified: {self.num_critics} critics trained round-robin, one drawn uniformly per "
                    "generator step",
            "critic_schedule": "round-robin (public); answering critic uniform (secret)",
            "sampling_rate": 1.0 / self.num_critics,
            "rdp_per_step": "Wang, Balle & Kasiviswanathan 2019, Theorem 9 (sampling without replacement, "
                            "gamma = 1 / num_critics, replace-one neighbours) of the Gaussian (lambda, 2 B lambda / sigma^2)",
            "partition_sizes": [min(sizes), max(sizes)] if sizes else None,
            "partition_seed": self.partition_seed,
            "selection_source": self.noise_source_report(self.segments(), "selection_source"),
            "composition": "adaptive RDP composition of the per-step bound: every critic's state is a function of its "
                           "own partition, the released generator states and the public round-robin schedule, and the "
                           "answering critic is drawn afresh and secretly each step; see docs/privacy.md, Gradient sanitizer",
            **self._paper_code_figure(),
        }

    def _paper_code_figure(self) -> dict[str, Any]:
        """What GS-WGAN's released ``privacy_analysis.py`` would print for this run, for comparison
        only: Theorem 9 at gamma = 1/N for a Gaussian of multiplier sigma/2 per generated record
        (its noise is 2 sigma' C / B per entry on rows of sensitivity 2C/B), composed steps x B
        times, as if each row were subsampled on its own."""
        steps = len(self.accountant)
        if not steps or self.noise_multiplier is None:
            return {}
        orders = self.accountant.orders
        per_row = selected_critic_gaussian_rdp(orders, self.noise_multiplier / 2.0, self.num_critics)
        epsilon, _ = rdp_to_epsilon(orders, steps * self.generated_batch_size * per_row, self.training_delta)
        return {
            "epsilon_gswgan_code_accounting": self.preprocessing["epsilon"] + epsilon,
            "epsilon_gswgan_code_accounting_note": (
                "NOT a guarantee and never used for stopping: the figure GS-WGAN's released accounting would give "
                "(the 1/N subsampling applied to each of the B generated records of a step separately, B x steps "
                "times); all B rows of a step come from the same answering critic, so only one subsampling per step "
                "is sound, which is what 'epsilon' charges."),
        }


def check_generated_batch_memory(records: int, data_shape: tuple[int, ...], device: torch.device) -> None:
    """Refuse, before the first step, a generated batch whose sanitized records alone would not fit:
    ``--privacy.generated_batch_size 1e11`` asked for terabytes in the middle of the first step,
    with the run folder already made. A lower bound (the generator's activations come on top)."""
    needed = GENERATED_BATCH_MEMORY_FACTOR * records * math.prod(data_shape) * 4
    free = available_memory(device)
    if free is not None and needed > free:
        raise ValueError(
            f"--privacy.generated_batch_size: {records:,} generated records a step per process need at least "
            f"{byte_size(needed)} (the records, their gradients, the noise and the clipped copy), and "
            f"{device.type} has {byte_size(free)} available: generate fewer records a step")


def check_critic_memory(critics: list[torch.nn.Module], device: torch.device) -> None:
    """Refuse, with the numbers and the ways out, N critics that would not fit in memory."""
    parameters = sum(p.numel() for critic in critics for p in critic.parameters())
    needed = CRITIC_MEMORY_FACTOR * parameters * 4
    free = available_memory(device)
    if free is not None and next(critics[0].parameters()).device.type == device.type:
        free += parameters * 4  # already allocated where they will train
    if free is not None and needed > free:
        raise ValueError(
            f"{len(critics)} critics ({parameters / 1e6:.0f}M parameters) need about {byte_size(needed)} with "
            f"Adam's moments, and {device.type} has {byte_size(free)} available: use fewer critics "
            "(--privacy.num_critics) or smaller ones (--model.discriminator_kwargs.*)."
        )
