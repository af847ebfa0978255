"""End-to-end privacy audit: re-train a model many times, with and without a canary record,
and bound from below the ε its released generator really has.

:mod:`lightning_dpgan.privacy.audit` audits each mechanism in isolation; this audits the whole
training pipeline as ``train`` runs it (datamodule, module, privacy strategy, budget stopping),
the way Jagielski, Ullman & Oprea (2020, "Auditing Differentially Private Machine Learning:
How Private is Private SGD?") and Nasr, Song, Thakurta, Papernot & Carlini (2021, "Adversary
Instantiation: Lower Bounds for Differentially Private Machine Learning") audit DP-SGD:

1. A worst-case **canary** record is built, far from the data so that a model that saw it has
   something to show for it (:func:`table_canary`, :func:`image_canary`).
2. Each **trial** is a full small training run through :class:`~lightning_dpgan.run.Run`. In
   half of the trials (a seeded, balanced random assignment) the canary is in the training
   split: appended for strategies whose guarantee is for add/remove neighbours, written over
   the last record for replace-one strategies (PATE, G-PATE, GS-WGAN's N critics), so that
   every trial pair is a pair of neighbouring datasets *for the guarantee being audited*.
3. A black-box **membership test** on the released generator only: draw ``samples`` records,
   score = distance from the canary to its nearest generated record; guess "canary" when the
   score is at most a threshold.
4. The guesses' true and false positives give, with Clopper-Pearson intervals, an ε that any
   (ε, δ)-DP training must have (:func:`~lightning_dpgan.privacy.audit.epsilon_lower_bound`).

The threshold is fixed before the counted trials are looked at: either given, or chosen on
separate **calibration trials** (their own seeds and canary assignment) that are not counted.
Choosing it on the counted trials would bias the bound upwards.

What it shows: ``epsilon_lower > claimed ε`` proves (at the stated confidence) that the
implementation does not give its claimed guarantee. ``epsilon_lower <= claimed ε`` proves
nothing: it is a lower bound from one canary, one test and few trials (with n trials per side,
even a perfect test shows little: 0.60 at n = 10, 2.39 at n = 50, at 95 % confidence;
``largest_detectable_epsilon`` in ``audit.json``).

The claim audited is training's own (ε, δ), ``privacy.json``'s ``epsilon_training`` and
``delta_training``: the canary is inserted after the preprocessing that reads the rows, so
that preprocessing's share of the total ε is not under test, and comparing with the total
would pass a training that leaks up to that share more than it claims. Under PATE's and G-PATE's
data-dependent accounting (their default) ``epsilon_training`` is a function of the teachers'
votes, not a DP guarantee, and the audit's inequalities assume one that holds for every pair of
neighbouring datasets: the claim is then the data-independent bound of the queries the trial
asked (``epsilon_data_independent``, less preprocessing's ε: :func:`audited_claim`), which holds
whatever the votes for that many queries. How many were asked was itself decided on the votes (the
run stops on the data-dependent figure), so a claim that holds whatever the votes is audited with
``--privacy.accounting data-independent``.
"""
from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import TensorDataset

from lightning_dpgan import registry, run_folder
from lightning_dpgan.audit_options import DEFAULT_SAMPLES, DEFAULT_TRIALS, MIN_CONFIDENCE, audit_parser
from lightning_dpgan.command_name import command_line
from lightning_dpgan.config import ConfigError
from lightning_dpgan.outputs import write_json
from lightning_dpgan.privacy.audit import epsilon_lower_bound

AUDIT_FILE = run_folder.AUDIT_REPORT
#: privacy.json's ``accounting`` under which its ε is a function of the votes (PATE, G-PATE)
DATA_DEPENDENT = "data-dependent"
#: The W&B tag of every trial's run (its privacy figures are the claim under test).
AUDIT_TRIAL_TAG = "audit-trial"
#: How a trial's score becomes a guess (written into audit.json).
DECISION = "canary guessed when score <= threshold (score: distance from the canary to its nearest generated record)"
#: More trials than this (each a whole training run) is a typo, refused before any is drawn (a
#: trillion asked for ended in numpy's MemoryError while the trials' seeds were chosen).
MAX_TRIALS = 100_000
#: Settings that fix a mechanism's random draws (tests only): every trial would draw the same
#: noise or the same selection, so the trials would not be independent runs of the mechanism.
FIXED_DRAW_SETTINGS = ("noise_seed", "selection_seed")


# ------------------------------------------------------------------------------------ canaries
@dataclass(frozen=True)
class Canary:
    """A record to insert into a training split, and what the membership test compares with.

    ``row``: one entry per tensor of the datamodule's ``TensorDataset`` (the encoded record for
    tables; the image and its label for images), each with a leading dimension of 1.
    ``reference``: the canary in the space the score is measured in (flat vector).
    ``label``: the class a conditional generator is asked for (images), else ``None``.
    """

    kind: str
    row: tuple[torch.Tensor, ...]
    reference: torch.Tensor
    description: dict[str, Any]
    label: int | None = None


def table_canary(datamodule: Any) -> Canary:
    """An outlier row built from the schema: every numeric column at the end of its public
    bounds farther from the train split's mean, every categorical column (the label included)
    at its least frequent category in the train split (ties: the last in schema order).

    So the canary sits in a corner of the encoded space where the data has (almost) no mass.
    Reading the private rows to place it is the auditor's choice, not a release: the canary's
    description in ``audit.json`` is for the data holder, like the rest of the audit. The row
    is encoded by the datamodule's own encoder (min-max or mode-specific), so training sees it
    as any other record; it is scored in the schema's min-max space, where every model's
    decoded samples can be compared.
    """
    schema, frame = datamodule.schema, datamodule.train_frame
    values: dict[str, Any] = {}
    for column in schema.columns:
        if column.is_numeric:
            low, high = column.bounds
            if column.kind == "integer":
                low, high = math.ceil(low), math.floor(high)
            mean = float(pd.to_numeric(frame[column.name]).mean())
            values[column.name] = high if abs(high - mean) >= abs(mean - low) else low
        else:
            counts = frame[column.name].astype(object).value_counts()
            counted = [int(counts.get(category, 0)) for category in column.categories]
            rarest = min(counted)
            values[column.name] = [c for c, n in zip(column.categories, counted) if n == rarest][-1]
    row = pd.DataFrame({name: [value] for name, value in values.items()})
    for column in schema.columns:
        if column.kind == "integer":
            row[column.name] = row[column.name].astype(np.int64)
        elif column.kind == "continuous":
            row[column.name] = row[column.name].astype(np.float64)
    encoded, _ = datamodule.encode(row, unknown="error")
    reference, _ = schema.encode(row, unknown="error")
    description = {
        "kind": "table",
        "rule": "numeric columns at the public bound farther from the train mean; categorical columns at "
                "their least frequent category in the train split",
        "record": {name: _plain(value) for name, value in values.items()},
    }
    return Canary("table", (encoded,), reference[0], description)


def image_canary(datamodule: Any) -> Canary:
    """A one-pixel checkerboard at full contrast (pixels -1 and +1 alternating, in the
    datamodules' [-1, 1] scale), labelled with the last class (any fixed class would do): a
    high-frequency pattern no digit or garment has, far (in L2) from every training image."""
    images, labels = datamodule.train_dataset.tensors
    shape = tuple(images.shape[1:])
    grid = torch.arange(shape[-2]).view(-1, 1) + torch.arange(shape[-1]).view(1, -1)
    board = torch.where(grid % 2 == 0, 1.0, -1.0).to(images.dtype).expand(*shape).clone()
    num_classes = datamodule.num_classes or int(labels.max()) + 1
    label = num_classes - 1
    description = {"kind": "image", "rule": "one-pixel checkerboard, pixels -1/+1 (full contrast)",
                   "shape": list(shape), "label": label}
    row = (board.unsqueeze(0), torch.tensor([label], dtype=labels.dtype))
    return Canary("image", row, board.flatten(), description, label=label)


def build_canary(datamodule: Any) -> Canary:
    """The canary for a set-up datamodule: :func:`table_canary` or :func:`image_canary`."""
    if getattr(datamodule, "kind", "image") == "table":
        return table_canary(datamodule)
    return image_canary(datamodule)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def insert_canary(datamodule: Any, canary: Canary, neighbours: str) -> int:
    """Put the canary into a set-up datamodule's training split (see :func:`set_up`) and
    return its index.

    The split is replaced by a ``TensorDataset`` of the same tensors with the canary in, before
    training, so every private path reads it: DP-SGD's Poisson-sampled loader and the
    partitions of PATE teachers and GS-WGAN critics are all built from ``train_dataset`` when
    the strategy is set up, and the datamodules' ``setup`` does not load the split again.
    ``add-remove`` appends the canary (N + 1 records); ``replace-one`` writes it over the last
    record (N records), so the partitions are the same permutation of the same N indices and
    the canary lands in exactly one of them.
    """
    tensors = datamodule.train_dataset.tensors
    if len(tensors) != len(canary.row):
        raise ValueError(f"the canary has {len(canary.row)} tensors, the training split {len(tensors)}")
    if neighbours == "add-remove":
        index = len(tensors[0])
        new = tuple(torch.cat([t, c.to(t.dtype)]) for t, c in zip(tensors, canary.row))
    elif neighbours == "replace-one":
        index = len(tensors[0]) - 1
        new = tuple(torch.cat([t[:index], c.to(t.dtype)]) for t, c in zip(tensors, canary.row))
    else:
        raise ValueError(f"unknown neighbouring relation {neighbours!r}")
    datamodule.train_dataset = TensorDataset(*new)
    return index


def set_up(datamodule: Any) -> None:
    """What Lightning does before fitting: files available, train split loaded and encoded."""
    datamodule.prepare_data()
    datamodule.setup("fit")


# ------------------------------------------------------------------------ membership score
@torch.no_grad()
def canary_distances(module: Any, datamodule: Any, canary: Canary, samples: int, seed: int) -> torch.Tensor:
    """Distance from the canary to each of ``samples`` records drawn from the generator.

    Tables: generated records are decoded (the released rows) and re-encoded with the schema's
    min-max encoding, then compared with the canary in that space (Euclidean). Images: RMS
    pixel distance, among records of the canary's class for a conditional generator.
    """
    torch.manual_seed(seed)
    module.eval()
    if canary.kind == "table":
        rows = datamodule.decode(module.sample(samples).cpu())
        generated, _ = datamodule.schema.encode(rows)
        return torch.linalg.vector_norm(generated - canary.reference, dim=1)
    labels = None
    if getattr(module, "num_classes", None):
        labels = torch.full((samples,), int(canary.label), dtype=torch.long, device=module.device)
    images = module.sample(samples, labels).cpu().flatten(1).to(canary.reference.dtype)
    return torch.linalg.vector_norm(images - canary.reference, dim=1) / math.sqrt(images.shape[1])


#: copies of a drawn record that scoring holds at once (float32 draw, its decoded or flattened form,
#: the re-encoded rows): a rough, generous count, to refuse an absurd --samples, not to budget memory
SCORE_COPIES = 4


def check_memory_for_samples(samples: int, canary: Canary) -> None:
    """Refuse, before a trial trains, a ``--samples`` whose draw the free memory cannot hold (a
    trillion asked for ended, after the first trial's training, in torch's allocation traceback)."""
    from lightning_dpgan.error_text import byte_size
    from lightning_dpgan.sampling import free_memory

    needed = samples * canary.reference.numel() * 4 * SCORE_COPIES
    free = free_memory()
    if free is not None and needed > free:
        raise ValueError(f"--samples {samples} records would take about {byte_size(needed)} of memory to score, and "
                         f"this machine has {byte_size(free)} free: give fewer (default {DEFAULT_SAMPLES})")


def canary_score(module: Any, datamodule: Any, canary: Canary, samples: int, seed: int) -> float:
    """Distance from the canary to its nearest generated record (:func:`canary_distances`)."""
    return float(canary_distances(module, datamodule, canary, samples, seed).min())


def choose_threshold(with_canary: Sequence[float], without_canary: Sequence[float]) -> float:
    """The threshold (guess canary when score <= it) that best separates calibration scores:
    largest TPR - FPR, the middle one of all the best candidates on ties (in order, adjacent or
    not), candidates midway
    between consecutive distinct scores. TPR - FPR is compared in whole counts (scaled by both
    sides' sizes), so that ties are ties and not float rounding."""
    if not with_canary or not without_canary:
        raise ValueError("calibration needs trials with and without the canary")
    if not all(math.isfinite(score) for score in [*with_canary, *without_canary]):
        raise ValueError("a calibration trial's canary score is not a number (its generator drew NaN or inf "
                         "records): no threshold can be chosen from it")
    values = sorted(set(with_canary) | set(without_canary))
    candidates = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1.0]
    with_array, without_array = np.asarray(with_canary), np.asarray(without_canary)

    def advantage(threshold: float) -> int:
        return (int((with_array <= threshold).sum()) * len(without_array)
                - int((without_array <= threshold).sum()) * len(with_array))

    gains = [advantage(t) for t in candidates]
    best = [t for t, g in zip(candidates, gains) if g == max(gains)]
    return best[len(best) // 2]


# ----------------------------------------------------------------------------- the audit
@dataclass
class Trial:
    index: int
    canary: bool
    seed: int
    score: float
    epsilon: float | None
    delta: float | None
    output_dir: str
    #: training's own (epsilon, delta), the claim under test (see the module's docstring)
    epsilon_training: float | None = None
    delta_training: float | None = None
    #: privacy.json's ``accounting`` (PATE, G-PATE), which says which figure is the claim
    accounting: str | None = None
    #: the generator's steps in the trial (None where not known)
    generator_updates: int | None = None
    #: the canary record of this trial, for a table (it depends on the schema, a DP estimate of
    #: its own for a CSV without schema file); None for images, whose canary is fixed
    canary_record: Any = None
    guess: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CanaryAudit:
    """Everything :func:`run_audit` measured; :meth:`to_dict` is ``audit.json``."""

    config: dict[str, Any]
    canary: dict[str, Any]
    neighbours: str
    confidence: float
    threshold: float
    threshold_rule: str
    samples: int
    trials: list[Trial] = field(default_factory=list)
    calibration: list[Trial] = field(default_factory=list)

    @property
    def claimed_epsilon(self) -> float | None:
        """Training's ε, the largest among the counted trials (None: one is unbounded)."""
        values = [t.epsilon_training for t in self.trials]
        return None if any(v is None or not math.isfinite(v) for v in values) else max(values)

    @property
    def accounting(self) -> str | None:
        """The trials' accounting (PATE, G-PATE), one for all: the run's settings decide it."""
        return next((t.accounting for t in self.trials if t.accounting), None)

    @property
    def claimed_epsilon_total(self) -> float | None:
        """``privacy.json``'s ε (preprocessing + training; under data-dependent accounting its
        ``epsilon_data_independent``), the largest among the counted trials."""
        values = [t.epsilon for t in self.trials]
        return None if any(v is None for v in values) else max(values)

    @property
    def delta(self) -> float:
        """Training's δ, the largest among the counted trials."""
        return max(t.delta_training or 0.0 for t in self.trials)

    @property
    def trials_per_side(self) -> int:
        return len(self.trials) // 2

    @property
    def true_positives(self) -> int:
        return sum(t.guess and t.canary for t in self.trials)

    @property
    def false_positives(self) -> int:
        return sum(t.guess and not t.canary for t in self.trials)

    @property
    def epsilon_lower(self) -> float:
        return epsilon_lower_bound(self.true_positives, self.false_positives, self.trials_per_side, self.delta, self.confidence)

    @property
    def largest_detectable_epsilon(self) -> float:
        """The bound a perfect test (every trial right) would give: no claim at or above it could
        be contradicted by these trials."""
        n = self.trials_per_side
        return epsilon_lower_bound(n, 0, n, self.delta, self.confidence)

    @property
    def could_detect_a_violation(self) -> bool:
        claimed = self.claimed_epsilon
        return claimed is not None and claimed < self.largest_detectable_epsilon

    @property
    def consistent(self) -> bool:
        claimed = self.claimed_epsilon
        return claimed is None or self.epsilon_lower <= claimed

    def summary(self) -> str:
        claimed = "unbounded" if self.claimed_epsilon is None else f"{self.claimed_epsilon:.4g}"
        verdict = "consistent" if self.consistent else "VIOLATION: the claimed epsilon is too small"
        lower = f"{self.epsilon_lower:.4g}"  # the claim's precision: a violation never reads as two equal figures
        if claimed == lower and not self.consistent:
            lower, claimed = f"{self.epsilon_lower:.10g}", f"{self.claimed_epsilon:.10g}"
        return (f"audit: epsilon_lower {lower} vs training's claimed {claimed} (delta {self.delta:g}, "
                f"{self.confidence * 100:.12g}% confidence; TP {self.true_positives}/{self.trials_per_side}, "
                f"FP {self.false_positives}/{self.trials_per_side}; a perfect test could show at most "
                f"{self.largest_detectable_epsilon:.3f}): {verdict}")

    @property
    def untrained_trials(self) -> int:
        """Counted trials whose generator took no step: the score is that of the initial
        generator, which never saw the canary, so such a trial tests nothing of the mechanism."""
        return sum(1 for t in self.trials if t.generator_updates == 0)

    def untrained_warning(self) -> str | None:
        """Said when a counted trial's generator took no step (:attr:`untrained_trials`)."""
        if not self.untrained_trials:
            return None
        return (f"audit: warning: {self.untrained_trials} of the {len(self.trials)} counted trials took no generator update, so "
                "their scores are an untrained generator's and test nothing of the mechanism: train longer "
                "(--max-steps at least --model.discriminator_steps) or spend more (--epsilon)")

    def undetectable_warning(self) -> str | None:
        """Said when no outcome of these trials could have contradicted the claim."""
        if self.could_detect_a_violation or self.claimed_epsilon is None:
            return None
        trials = f"{self.trials_per_side} trial{'' if self.trials_per_side == 1 else 's'} per side"
        return (f"audit: warning: with {trials} a perfect test shows at most epsilon "
                f"{self.largest_detectable_epsilon:.3f}, not above the claimed {self.claimed_epsilon:.4g}: this audit "
                "could not have found a violation. Use more --trials")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.config["model"]["name"],
            "dataset": self.config["data"]["name"],
            "privacy": self.config["privacy"]["name"],
            "neighbours": self.neighbours,
            "claimed_epsilon": self.claimed_epsilon,
            "claimed": "training's (epsilon_training, delta_training of privacy.json), the largest among the counted "
                       "trials: the canary is inserted after the preprocessing that reads the rows" + (
                           "; under data-dependent accounting the data-independent bound of the queries asked "
                           "(epsilon_data_independent less preprocessing's epsilon), which holds whatever the votes for "
                           "that many queries: the data-dependent figure is a function of the votes, not a guarantee, "
                           "and how many queries were asked was decided on it (audit with --privacy.accounting "
                           "data-independent for a claim that holds whatever the votes)"
                           if self.accounting == DATA_DEPENDENT else ""),
            "accounting": self.accounting,
            "claimed_epsilon_total": self.claimed_epsilon_total,
            "delta": self.delta,
            "epsilon_lower": self.epsilon_lower,
            "largest_detectable_epsilon": self.largest_detectable_epsilon,
            "could_detect_a_violation": self.could_detect_a_violation,
            "untrained_trials": self.untrained_trials,
            "confidence": self.confidence,
            "consistent": self.consistent,
            "true_positives": self.true_positives,
            "false_positives": self.false_positives,
            "trials": len(self.trials),
            "trials_per_side": self.trials_per_side,
            "threshold": self.threshold,
            "threshold_rule": self.threshold_rule,
            "decision": DECISION,
            "samples": self.samples,
            "canary": self.canary,
            "scores": {"with_canary": [t.score for t in self.trials if t.canary],
                       "without_canary": [t.score for t in self.trials if not t.canary]},
            "per_trial": [t.to_dict() for t in self.trials],
            "calibration": [t.to_dict() for t in self.calibration],
            "note": "epsilon_lower is a statistical lower bound from one canary and one membership test: "
                    "above the claimed epsilon it proves a violation; at or below it proves nothing.",
        }


def balanced_assignment(count: int, rng: np.random.Generator, flag: str = "--trials") -> list[bool]:
    """Which trials get the canary: exactly half of them, in a random order (``flag`` names the
    setting that gave ``count``, for its error)."""
    if count < 2 or count % 2:
        raise ValueError(f"{flag} must be even and at least 2 (half the trials hold the canary), got {count}")
    if count > MAX_TRIALS:
        raise ValueError(f"{flag} {count}: each trial is a whole training run; give at most {MAX_TRIALS}")
    return [bool(x) for x in rng.permutation([True] * (count // 2) + [False] * (count // 2))]


def check_threshold(threshold: float | None) -> None:
    """A threshold given in advance is a distance: a finite number from 0 (NaN or a negative one
    would make every guess "no canary", and the audit meaningless)."""
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"--threshold is a distance to the canary: a finite number from 0, got {threshold}")


def one_process(config: dict[str, Any]) -> dict[str, Any]:
    """The trials' configuration, trained in this one process. Each trial is a whole training run
    started from inside this command, and a multi-process strategy would start the command again
    in every process (each would run the audit). Several devices or nodes are refused;
    ``--devices auto`` becomes 1."""
    trainer = config.get("trainer", {})
    devices, nodes, strategy = trainer.get("devices"), trainer.get("num_nodes"), trainer.get("strategy")
    several = [flag for flag, given in (
        (f"--devices {devices}", isinstance(devices, int) and devices > 1),
        (f"--strategy {strategy}", isinstance(strategy, str) and strategy not in ("auto", "single_device")),
        (f"--num-nodes {nodes}", isinstance(nodes, int) and nodes > 1)) if given]
    if several:
        raise ConfigError(
            f"the audit trains each trial in this one process: drop {' and '.join(several)}. A DDP run spends what "
            "one process does (docs/privacy.md), so the single-process audit covers its guarantee")
    if config.get("evaluate"):
        raise ConfigError("--evaluate: the audit scores each trial by its canary test, not by evaluate. Drop it; "
                          f"evaluate a trial's folder afterwards with `{command_line('evaluate')} --run DIR`")
    return {**config, "trainer": {**trainer, "devices": 1 if devices in (None, "auto") else devices}}


def check_private(config: dict[str, Any]) -> str:
    """The run's privacy strategy name; refuses, before any trial, a model that trains without
    privacy, a setting that fixes the mechanism's draws, and a meaningless --epsilon or --delta."""
    from lightning_dpgan.config import QUAIL
    from lightning_dpgan.run import model_class, privacy_name

    if config["model"]["name"] == QUAIL:
        raise ConfigError("the audit does not cover QUAIL's label model yet: audit its synthesizer "
                          f"(--model {config[QUAIL]['synthesizer']}) and see docs/privacy.md for the label model")
    name = privacy_name(config, model_class(config))
    if registry.lookup("privacy", name).load() is None:
        raise ConfigError(
            f"model '{config['model']['name']}' trains with --privacy none: there is no guarantee to audit. "
            f"Audit a private model, or give --privacy (see {command_line('train')} --help)."
        )
    if config["resume"]:
        raise ConfigError("--resume makes no sense in an audit: every trial trains from scratch")
    fixed = [f"--privacy.{key}" for key in FIXED_DRAW_SETTINGS if config["privacy"].get(key) is not None]
    if fixed:
        raise ConfigError(
            f"{' and '.join(fixed)} {'fixes' if len(fixed) == 1 else 'fix'} the mechanism's random draws: every "
            "trial would draw the same ones, so the trials would not be independent runs of the mechanism and the "
            f"bound would not hold. Drop {'it' if len(fixed) == 1 else 'them'}")
    from lightning_dpgan.privacy.validation import validate_delta, validate_epsilon

    # as train refuses them, but before any trial (else the refusal reads as a trial's failure)
    if config["epsilon"] is not None:
        validate_epsilon(config["epsilon"])
    if config["delta"] is not None:
        validate_delta(config["delta"])
    return name


@dataclass(frozen=True)
class TrialRun:
    """What one trial left: its membership score, privacy report, canary and neighbours."""

    score: float
    privacy: dict[str, Any]
    canary: Canary
    neighbours: str
    #: the generator's steps in the trial: none, and its score is an untrained generator's
    generator_updates: int | None = None


def trial_run_name(given: str | None, trial_dir: Path) -> str:
    """A trial's W&B run name: the audit's (``--wandb-name``, else its folder's name), then the
    trial's kind and number, ``audit/trials/003`` or ``audit/calibration/003``. The folder's name
    alone, a run's default, named a counted and a calibration trial alike (``003``)."""
    trial_dir = Path(trial_dir)
    return f"{given or trial_dir.parent.parent.name}/{trial_dir.parent.name}/{trial_dir.name}"


def run_trial(
    config: dict[str, Any],
    output_dir: Path,
    with_canary: bool,
    seed: int,
    samples: int,
    prepare_run: Callable[[Any], None] | None = None,
    audit_dir: Path | None = None,
) -> TrialRun:
    """One training run (canary in or out) through :class:`~lightning_dpgan.run.Run`, then the
    membership score of its generator.

    ``prepare_run(run)`` is called after the canary is inserted and before training. It is a
    hook for tests (e.g. to break the mechanism on purpose and check that the audit notices),
    not a user option.
    """
    from lightning_dpgan.run import Run

    trial_config = copy.deepcopy(config)
    trial_config["seed"] = seed
    trial_config["output_dir"] = str(output_dir)
    trial_config["evaluate"] = False
    if trial_config.get("logger", {}).get("name") == "wandb":
        logger = trial_config["logger"]
        logger["run_name"] = trial_run_name(logger.get("run_name"), output_dir)
        # tagged, so that a dashboard does not show a trial's figures as a release's guarantee
        logger["tags"] = [*(logger.get("tags") or []), AUDIT_TRIAL_TAG]
    run = Run(trial_config, output_dir, published_dir=audit_dir)  # the audit's folder must not hold the data either
    if run.strategy is None:
        raise ConfigError("this run has no privacy strategy: nothing to audit")
    run.mark_as_audit_trial()
    set_up(run.datamodule)
    canary = build_canary(run.datamodule)
    check_memory_for_samples(samples, canary)
    neighbours = run.strategy.neighbours
    if with_canary:
        insert_canary(run.datamodule, canary, neighbours)
    if prepare_run is not None:
        prepare_run(run)
    run.fit()
    score = canary_score(run.module, run.datamodule, canary, samples, seed)
    return TrialRun(score, run.privacy_report(), canary, neighbours, run.module.generator_updates)


def default_calibration_trials(trials: int) -> int:
    """Half as many as the counted trials, rounded down to an even number, at least 2."""
    return max(2, 2 * (trials // 4))


def run_audit(
    config: dict[str, Any],
    output_dir: str | Path,
    trials: int = DEFAULT_TRIALS,
    confidence: float = 0.95,
    threshold: float | None = None,
    calibration_trials: int | None = None,
    samples: int = DEFAULT_SAMPLES,
    prepare_run: Callable[[Any], None] | None = None,
) -> CanaryAudit:
    """Audit the training that ``config`` (as resolved by ``cli.build_config``) describes.

    ``trials`` counted trials, half of them with the canary. The threshold is ``threshold`` if
    given, else chosen by :func:`choose_threshold` on ``calibration_trials`` separate trials
    (default :func:`default_calibration_trials`) with seeds and a canary assignment of
    their own, which are not counted. Writes ``audit.json`` into ``output_dir``, each counted
    trial's run into ``output_dir/trials/NNN`` and each calibration run into
    ``output_dir/calibration/NNN``. ``prepare_run`` is for tests only (see :func:`run_trial`).
    """
    if not MIN_CONFIDENCE <= confidence < 1:
        why = ("it is not a number" if math.isnan(confidence) else
               f"below {MIN_CONFIDENCE} a sound mechanism is often reported as a violation" if confidence < MIN_CONFIDENCE
               else "a bound held with certainty from finitely many trials is no bound (epsilon 0 at best)"
               if confidence == 1 else "a confidence is a probability, below 1")
        raise ValueError(f"--confidence must be in [{MIN_CONFIDENCE}, 1), got {confidence}: {why}")
    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    check_threshold(threshold)
    if threshold is not None and calibration_trials is not None:
        raise ValueError("--calibration-trials choose the threshold, and --threshold gives it: drop one of them")
    config = one_process(copy.deepcopy(config))
    config["privacy"]["name"] = check_private(config)
    output_dir = Path(output_dir)
    rng = np.random.default_rng(int(config["seed"]))
    assignment = balanced_assignment(trials, rng)
    if threshold is None:
        count = calibration_trials if calibration_trials is not None else default_calibration_trials(trials)
        calibration_assignment = balanced_assignment(count, rng, "--calibration-trials")
    else:
        calibration_assignment = []
    # distinct seeds for every run, calibration and counted alike: each trial is a fresh draw
    seeds = iter(int(s) for s in rng.choice(2**31 - 1, size=trials + len(calibration_assignment), replace=False))
    runs: list[TrialRun] = []

    def trial(index: int, canary: bool, folder: str) -> Trial:
        seed = next(seeds)
        where = output_dir / folder / f"{index:03d}"
        which = f"trial {folder}/{index:03d} ({'with' if canary else 'without'} the canary)"
        try:
            result = run_trial(config, where, canary, seed, samples, prepare_run, audit_dir=output_dir)
        except (SIGTERMException, KeyboardInterrupt):
            print(f"audit: stopped during {which}: no audit.json is written, and an audit is not continued: run it "
                  "again with --overwrite (this one's trials are moved to previous/)", file=sys.stderr)
            raise
        except Exception:
            print(f"audit: {which} stopped:", file=sys.stderr)
            raise
        if not math.isfinite(result.score):
            raise ValueError(f"audit trial {where}: the canary score is {result.score} (its generator drew NaN or "
                             "inf records), so no guess can be made from it")
        runs.append(result)
        privacy = result.privacy
        epsilon, epsilon_training = audited_claim(privacy)
        return Trial(index, canary, seed, result.score, epsilon, privacy.get("delta"), str(where), epsilon_training,
                     privacy.get("delta_training"), privacy.get("accounting"), result.generator_updates,
                     result.canary.description.get("record"))

    calibration = [trial(i, c, "calibration") for i, c in enumerate(calibration_assignment)]
    if threshold is None:
        threshold = choose_threshold([t.score for t in calibration if t.canary], [t.score for t in calibration if not t.canary])
        rule = f"chosen on {len(calibration)} separate calibration trials, not counted (largest TPR - FPR, midpoint)"
    else:
        rule = "given in advance"
    counted = [trial(i, c, "trials") for i, c in enumerate(assignment)]  # threshold fixed before these run
    for t in calibration + counted:
        t.guess = bool(t.score <= threshold)
    audit = CanaryAudit(config, canary_description(runs), runs[0].neighbours, confidence, float(threshold), rule,
                        samples, counted, calibration)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / AUDIT_FILE, audit.to_dict())
    return audit


def audited_claim(privacy: dict[str, Any]) -> tuple[float | None, float | None]:
    """The ε (total, training's) of a trial's ``privacy.json`` that the audit tests. Under
    data-dependent accounting (PATE, G-PATE) its ``epsilon`` is computed from the private votes
    and is no DP guarantee, so the claim is the data-independent bound of the queries asked
    (whatever the votes, for that many queries), less preprocessing's share for training's; None
    where that bound is unbounded."""
    total, training = privacy.get("epsilon"), privacy.get("epsilon_training")
    if privacy.get("accounting") != DATA_DEPENDENT:
        return total, training
    independent = privacy.get("epsilon_data_independent")
    if independent is None or not math.isfinite(independent):
        return None, None
    return independent, independent - float((privacy.get("preprocessing") or {}).get("epsilon", 0.0))


def canary_description(runs: Sequence[TrialRun]) -> dict[str, Any]:
    """``audit.json``'s canary: the trials' one, or, where their canaries differ (each trial's
    schema is a DP estimate of its own for a CSV without schema file), the rule without a
    record, each trial's being in its ``canary_record``."""
    first = runs[0].canary.description
    if all(run.canary.description == first for run in runs):
        return first
    return {**{key: value for key, value in first.items() if key != "record"}, "record": None,
            "note": "the canary differs between trials (each trial's schema bounds are a DP estimate of its own): "
                    "each trial's is its canary_record"}


# ----------------------------------------------------------------------------- command line
def audit_command(argv: list[str], parsed: tuple[Any, list[str]] | None = None) -> Path:
    """``python -m lightning_dpgan audit``: returns the path of ``audit.json``. ``parsed``: the
    audit options already parsed from ``argv`` (the command line does it before torch loads;
    parsed again, an option given twice was noted twice)."""
    from lightning_dpgan.cli import build_config

    args, rest = parsed if parsed is not None else audit_parser().parse_known_args(argv)
    config = build_config(rest)
    if not config["output_dir"]:
        from lightning_dpgan.cli import _output_dir

        config["output_dir"] = str(_output_dir(config)) + "-audit"
    output_dir = Path(config["output_dir"])
    run_folder.check_audit_dir(output_dir, config["overwrite"])
    run_folder.refuse_holding_the_data(output_dir, run_folder.data_inputs(config["data"]))
    created = not output_dir.exists()
    previous = run_folder.set_aside(output_dir, run_folder.AUDIT_OUTPUTS) if output_dir.is_dir() else None
    try:
        audit = run_audit(config, output_dir, args.trials, args.confidence, args.threshold,
                          args.calibration_trials, args.samples)
    except BaseException:
        if not run_folder.audit_started(output_dir):  # refused before a trial trained: the folder as it was
            run_folder.remove_audit_trials(output_dir)
            if previous is not None:
                run_folder.restore_outputs(output_dir, previous)
            if created and output_dir.is_dir() and not any(output_dir.iterdir()):
                output_dir.rmdir()  # as a refused train leaves none
        raise
    print(audit.summary())
    for warning in (audit.untrained_warning(), audit.undetectable_warning()):
        if warning:
            print(warning, file=sys.stderr)
    return output_dir / AUDIT_FILE


__all__ = [
    "AUDIT_FILE",
    "Canary",
    "CanaryAudit",
    "audit_command",
    "balanced_assignment",
    "build_canary",
    "canary_distances",
    "canary_score",
    "choose_threshold",
    "image_canary",
    "insert_canary",
    "run_audit",
    "run_trial",
    "table_canary",
]
