"""``TeacherStrategy``: what every PATE-style strategy does with the private data.

PATE-GAN's label voting (:mod:`lightning_dpgan.callbacks.pate`) and G-PATE's projected gradient
voting (:mod:`lightning_dpgan.callbacks.gpate`) share their first half: split the *training*
split into K disjoint partitions, give the module K teachers, and hand each teacher minibatches
from its own partition only (:class:`~lightning_dpgan.data.partition.PartitionedSampler`, fixed
for the whole run and saved in checkpoints). Only the teachers read real records; what the
subclass's aggregator releases from them is the single place privacy is spent.

Under DDP (``--strategy ddp``) the teachers are sharded: rank r builds only its contiguous slice
of the K teachers (:func:`~lightning_dpgan.distributed.shard`), with the initial values one
process gives them (both restart the stream from ``--seed`` first, :func:`reseed_for_the_teachers`),
and trains them on their partitions; the sampler draws the indices of
all K and keeps the slice's, so every teacher sees the minibatches a single process would give it.
The aggregator adds up the ranks' vote histograms and draws the noise on rank 0
(:mod:`lightning_dpgan.privacy.pate`, :mod:`lightning_dpgan.privacy.gradient_voting`).
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lightning_dpgan.callbacks.strategy import PrivacyStrategy
from lightning_dpgan.data.partition import PartitionedSampler
from lightning_dpgan.distributed import shard, world_size
from lightning_dpgan.error_text import SET_BY, byte_size
from lightning_dpgan.nets.ensemble import kept_range
from lightning_dpgan.privacy.validation import validate_int


log = logging.getLogger(__name__)

#: Peak memory of training K batched teachers, in multiples of their parameters' bytes: the
#: parameters, their gradients, Adam's two moments and the batched backward's temporaries.
#: On a GPU: the paper's FC 256 teachers did not fit an 80 GB GPU at K = 2000 (> 6.2x) while
#: FC 64 at K = 4000 did. On the host (G-PATE, conv + FC 64, batch 30, whole process): 7.4x at
#: K = 2000, 8.3x at K = 1000, and 9.3x there with freed memory kept for reuse, as the command
#: line runs (lightning_dpgan.host_memory).
TEACHER_MEMORY_FACTOR = 8
HOST_TEACHER_MEMORY_FACTOR = 10
#: Of those multiples, what training a slice of teachers at a time (``train_chunk``) keeps for
#: all K: the parameters, their gradients and Adam's two moments. The rest (the temporaries of
#: one graph) shrinks to a slice's share, and SLICE_MARGIN covers the process around them.
#: Measured on the host, whole process, freed memory kept for reuse: 6.0x for G-PATE's MNIST
#: preset (2000 teachers, 821M parameters, slices of 136; 19.7 GB resident from about step 80 of
#: a full run, 16.6 GB over its first 6 steps), where this estimate is 6.1x.
TEACHER_STATE_FACTOR = 4
SLICE_MARGIN = 1.7
#: Records per slice when teachers train a slice at a time: teachers per slice = this / batch.
TRAIN_CHUNK_RECORDS = 4096
#: the teachers' random stream, drawn from --seed and this id (:func:`reseed_for_the_teachers`)
TEACHERS_STREAM = 2


def reseed_for_the_teachers() -> None:
    """Restart torch's global stream at a seed derived from the run's ``--seed`` before the
    teachers are built. Lightning re-seeds each DDP process with ``--seed`` as it sets them up,
    after the generator is built, and does not re-seed a single process: without a common restart
    here, the teachers' initial values, and every draw after them (query records, the student's
    steps), differed between one process and several, so that one ``--seed`` gave two runs.
    Derived rather than ``--seed`` itself, so that the teachers do not start from the very numbers
    the generator was initialised with. Nothing to do where no seed was set (``seed_everything``):
    the run is not reproducible anyway."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is not None:
        torch.manual_seed(int(np.random.SeedSequence([int(seed), TEACHERS_STREAM]).generate_state(1)[0]))


class TeacherMemoryError(ValueError):
    """The teachers would not fit in the training device's memory."""


def available_memory(device: torch.device) -> int | None:
    """Free bytes on ``device`` (GPU: the driver's figure; CPU: MemAvailable), None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: Peak host memory of building teachers, in multiples of their parameters' bytes: the batched
#: forms build them one by one and then stack them, so both copies are alive at once.
TEACHER_BUILD_FACTOR = 2


def check_teacher_memory(teachers: int, per_teacher: int, device: torch.device, processes_on_host: int = 1,
                         slice_size: int | None = None) -> bool:
    """Refuse, before a single teacher is built, teachers that would exhaust memory: building the
    ``teachers`` each process holds (all K, or a DDP rank's shard) in host memory, which the
    ``processes_on_host`` ranks of this machine do at the same time, or training them on
    ``device`` (shared by those ranks too when it is the CPU). (An out-of-memory kill loses the
    run and says nothing: the G-PATE preset's 2000 paper-size teachers were killed while being
    built on a 24 GB machine.)

    Returns whether they must train a slice at a time: when one graph over all of them would not
    fit but slices of ``slice_size`` teachers would (None: this ensemble cannot train in slices).
    A slice as large as all of them is no slice: the whole graph's memory is then needed."""
    ways_out = ("Use a GPU (or several: --strategy ddp splits the teachers), fewer teachers "
                "(--privacy.num_teachers) or smaller ones (--model.teacher_kwargs.*, e.g. hidden or channels).")
    parameters = teachers * per_teacher
    size = f"{teachers} teachers ({parameters / 1e6:.0f}M parameters)"
    if processes_on_host > 1:
        size += f" in each of {processes_on_host} processes on this machine"
    needed = TEACHER_BUILD_FACTOR * parameters * 4 * processes_on_host
    free = available_memory(torch.device("cpu"))
    if free is not None and needed > free:
        raise TeacherMemoryError(
            f"{size} need about {byte_size(needed)} of host memory to build (each built, then stacked), "
            f"and the host has {byte_size(free)} available. {ways_out}")
    on_cpu = device.type == "cpu"
    sharing = processes_on_host if on_cpu else 1
    factor = HOST_TEACHER_MEMORY_FACTOR if on_cpu else TEACHER_MEMORY_FACTOR
    free = available_memory(device)
    if free is None or factor * parameters * 4 * sharing <= free:
        return False
    sliced = slice_size is not None and slice_size < teachers
    if sliced:
        factor = TEACHER_STATE_FACTOR + (factor - TEACHER_STATE_FACTOR) * slice_size / teachers + SLICE_MARGIN
        if factor * parameters * 4 * sharing <= free:
            return True
    needed = factor * parameters * 4 * sharing
    in_slices = f", trained {slice_size} at a time" if sliced else ""
    raise TeacherMemoryError(
        f"{size} need about {byte_size(needed)} to train{in_slices} ({factor:.3g}x their parameters: "
        f"gradients, Adam's moments, temporaries), and {device.type} has {byte_size(free)} available. "
        f"{ways_out}")


def check_same_partition_seed(state: dict[str, Any], given: int, whose: str) -> None:
    """Refuse a resume under another ``--privacy.partition_seed``: the checkpoint's partitions go
    on (another seed would put records under other teachers or critics), and the report and
    config.yaml would name a seed that drew none of them. Checkpoints from before the seed was
    kept say nothing, and are not checked."""
    saved = state.get("partition_seed")
    if saved is not None and saved != given:
        raise ValueError(f"the checkpoint's {whose} partitions were drawn with --privacy.partition_seed {saved}, and "
                         f"they go on: resume with --privacy.partition_seed {saved}, not {given} (from Python, the "
                         f"strategy's partition_seed={saved})")


#: Under data-dependent accounting a run stops, and refuses answers, on the figure read off the
#: votes: the data-independent bound of the queries it asked holds whatever their votes, but how
#: many it asked was decided on the votes too (``train``'s warning, privacy.json's note, ``sample``).
QUERY_COUNT_CAVEAT = ("as the run stops, and refuses answers, on the data-dependent figure, how many queries it asked "
                      "was decided on the votes too: --privacy.accounting data-independent stops on the bound, one "
                      "figure that holds whatever the votes")
#: A segment's accounting in a checkpoint from before segments recorded it.
ACCOUNTING_NOT_RECORDED = "not recorded (a checkpoint from before segments recorded it)"


def votes_decided_note(steps: list[Any], unrecorded: bool = False) -> str:
    """That the segments from ``steps`` stopped, and refused answers, on the data-dependent
    figure, so the number of queries they asked was decided on the votes (privacy.json's note,
    ``train``'s warning, ``sample``)."""
    how = ("data-dependent accounting, or under one an older checkpoint did not record" if unrecorded
           else "data-dependent accounting")
    return (f"the segment(s) from step {', '.join(str(step) for step in steps)} ran under {how}, which stops, and "
            "refuses answers, on the data-dependent figure: how many queries they asked was decided on the votes too. "
            "Only data-independent accounting from a run's first step gives one figure that holds whatever the votes")


def drawn_with_replacement(member: str, batch_size: int, smallest: int, flag: str) -> str:
    """The warning for minibatches larger than a partition (teachers', GS-WGAN's critics'):
    each is drawn from its own records with replacement, so it repeats some of them."""
    return (f"each {member}'s minibatch of {batch_size} records is drawn with replacement from its partition, the "
            f"smallest of which holds {smallest}: records repeat within a minibatch. A {flag} of at most "
            f"{smallest} draws without")


def train_chunk(batch_size: int) -> int:
    """Teachers per slice when they train a slice at a time (:data:`TRAIN_CHUNK_RECORDS` records)."""
    return max(1, TRAIN_CHUNK_RECORDS // max(1, batch_size))


class TeacherBatches(IterableDataset):
    """``steps`` batches per epoch; each is one training step's ``teacher_steps`` draws, a list of
    nT ``[K, b, ...]`` record tensors and a list of nT ``[K, b]`` labels (or None)
    (:meth:`PartitionedSampler.draw_steps`)."""

    def __init__(self, sampler: PartitionedSampler, teacher_steps: int, steps: int) -> None:
        self.sampler, self.teacher_steps, self.steps = sampler, teacher_steps, steps

    def __iter__(self) -> Iterator[tuple[list[Tensor], list[Tensor] | None]]:
        for _ in range(self.steps):
            yield self.sampler.draw_steps(self.teacher_steps)

    def __len__(self) -> int:
        return self.steps


class TeacherStrategy(PrivacyStrategy):
    """Base of the PATE-style strategies: disjoint partitions, K teachers, per-teacher batches.

    Subclasses set ``records_per_teacher`` (the default K is N / that) and implement
    :meth:`install_aggregator`. ``teacher_batch_size=None`` lets the subclass choose
    (:meth:`default_teacher_batch_size`).
    """

    #: default number of teachers: one per this many training records (at least 1)
    records_per_teacher: int = 1000
    #: The partitions are a seeded permutation of the N records: with N fixed, replacing one
    #: record changes exactly one teacher's partition, which is what the vote sensitivity needs.
    neighbours = "replace-one"
    datamodule_needs = ("train_dataset.tensors", "partitions")

    def __init__(
        self,
        num_teachers: int | None = None,
        teacher_batch_size: int | None = None,
        partition_seed: int = 0,
        target_epsilon: float | None = None,
        delta: float | None = None,
        noise_seed: int | None = None,
    ) -> None:
        super().__init__(target_epsilon, delta, noise_seed)
        # whole numbers: NaN, 2.5 or True passed a "< 1" check and failed deep in the first step
        self.num_teachers = None if num_teachers is None else validate_int("--privacy.num_teachers", num_teachers, 1)
        self.teacher_batch_size = (None if teacher_batch_size is None
                                   else validate_int("--privacy.teacher_batch_size", teacher_batch_size, 1))
        self.partition_seed = partition_seed
        self.sampler: PartitionedSampler | None = None
        self._steps = 0  # before install, or restored from a checkpoint before the module is
        self._module: Any = None
        #: the noise settings of the last query batch charged (None before the first): a resume
        #: may change them, and the report's top level states the last ones that were used
        self._last_charged: dict[str, float] | None = None

    def teacher_count(self, train_records: int) -> int:
        """``--privacy.num_teachers``, else one teacher per ``records_per_teacher`` records;
        refused above the records: each teacher needs a partition of its own."""
        k = self.num_teachers or max(1, train_records // self.records_per_teacher)
        if k > train_records:
            raise ValueError(f"--privacy.num_teachers {k} ({SET_BY}) exceeds the {train_records} training records: "
                             f"pass --privacy.num_teachers {train_records} or less")
        return k

    def check_fits_records(self, train_records: int, datamodule: Any) -> None:
        super().check_fits_records(train_records, datamodule)
        self.teacher_count(train_records)

    def generated_per_step(self, train_records: int) -> int:
        """Records the generator makes a step: one per record of a teacher's minibatch, the
        given --privacy.teacher_batch_size or the default for the smallest of the K partitions
        (their sizes differ by at most one)."""
        smallest = train_records // self.teacher_count(train_records)
        return self.teacher_batch_size or self.default_teacher_batch_size(smallest)

    def check_generated_batch(self, normalizes_batches: bool, train_records: int) -> None:
        """Refuse one generated record a step for a generator with BatchNorm (G-PATE's; PyTorch's
        "Expected more than 1 value per channel" at the first step), before any vote: a minibatch
        of one record given, or the default for partitions of one record (20 teachers over 36
        records). Fewer teachers help only the default."""
        generated = self.generated_per_step(train_records)
        if not normalizes_batches or generated >= 2:
            return
        teachers = self.teacher_count(train_records)
        fewer = ("" if self.teacher_batch_size is not None else
                 f", or fewer teachers ({train_records} training records over {teachers} teachers leave the smallest "
                 f"partition {train_records // teachers}, the default minibatch)")
        raise ValueError(f"the generator normalizes each batch (BatchNorm), which needs at least 2 generated records a "
                         f"step, and it generates one per record of a teacher's minibatch, here {generated}: use "
                         f"--privacy.teacher_batch_size 2 or more (drawn with replacement from a smaller partition)"
                         f"{fewer}")

    def install(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._module = pl_module
        reseed_for_the_teachers()  # one --seed, one run, on one process or several
        datamodule = trainer.datamodule
        k = self.teacher_count(self.train_records)
        self.check_generated_batch(pl_module.generator_normalizes_batches, self.train_records)  # images: first here
        self.num_teachers = k
        partitions = datamodule.partitions(k, self.partition_seed)
        smallest = min(len(part) for part in partitions)
        if self.teacher_batch_size is None:
            self.teacher_batch_size = self.default_teacher_batch_size(smallest)
        if self.teacher_batch_size > smallest:
            log.warning(drawn_with_replacement("teacher", self.teacher_batch_size, smallest, "--privacy.teacher_batch_size"))
        records, *rest = datamodule.train_dataset.tensors
        labels = rest[0] if rest and getattr(pl_module, "num_classes", None) else None
        self.sampler = PartitionedSampler(records, partitions, self.teacher_batch_size, labels=labels,
                                          replacement=self.teacher_batch_size > smallest, seed=self.partition_seed)
        own = shard(k) if world_size() > 1 else None  # DDP: each rank builds and trains its own slice of the K
        kept = len(kept_range(k, own))
        on_host = trainer.num_devices if own is not None else 1  # this machine's ranks build at once
        per_slice = train_chunk(self.teacher_batch_size) if pl_module.teachers_train_in_chunks() else None
        in_slices = check_teacher_memory(kept, pl_module.parameters_per_teacher(), trainer.strategy.root_device, on_host,
                                         slice_size=per_slice)
        pl_module.build_teachers(k, own)
        if in_slices:
            pl_module.teachers.train_chunk = per_slice
            log.info("%d teachers train %d at a time: one pass over all of them would not fit in memory",
                     kept, pl_module.teachers.train_chunk)
        if own is not None:
            self.sampler.shard = own
        teacher_steps = pl_module.hparams.teacher_steps
        steps_per_epoch = max(1, math.ceil(smallest / (self.teacher_batch_size * teacher_steps)))
        loader_data = TeacherBatches(self.sampler, teacher_steps, steps_per_epoch)
        datamodule.train_dataloader = lambda: DataLoader(loader_data, batch_size=None)
        self.install_aggregator(trainer, pl_module)

    def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Keep the records where the teachers are (a GPU): a step then gathers K minibatches
        there instead of copying them from host memory."""
        self.sampler.data = self.sampler.data.to(pl_module.device)
        if self.sampler.labels is not None:
            self.sampler.labels = self.sampler.labels.to(pl_module.device)

    def check_processes(self, processes: int, batch_size: Any, train_records: int | None) -> None:
        """Each process builds and trains a slice of the teachers, at least one."""
        teachers = self.num_teachers if train_records is None else self.teacher_count(train_records)
        if teachers is not None:
            shard(teachers, 0, processes)

    def check_target_enforced(self, trainer: L.Trainer) -> None:
        """Nothing to refuse: the aggregator refuses, before answering, a batch of queries that
        would pass the target (:meth:`~PrivacyStrategy.refuse`), budget callback or not."""

    def default_teacher_batch_size(self, smallest_partition: int) -> int:
        """Records per teacher minibatch when none is given."""
        return 64

    def install_aggregator(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Put the noisy aggregator in the module's slot and create ``self.accountant``."""
        raise NotImplementedError

    @property
    def steps(self) -> int:
        """Training steps taken, the module's own count once installed (a step refused for the
        budget does not count): read when it is needed, a checkpoint saved by a callback that runs
        before this one holds the step its accountant has already charged."""
        return self._module.train_steps if self._module is not None else self._steps

    def steps_taken(self) -> int:
        return self.steps

    def remember_charged(self, params: dict[str, float]) -> None:
        """Record the noise settings of the query batch just charged (see :meth:`last_step_params`)."""
        self._last_charged = dict(params)

    def last_step_params(self) -> dict[str, float]:
        """The noise settings of the last query batch charged, else the next step's: after a resume
        that changed them and answered nothing, the report still states those that were used."""
        return dict(self._last_charged) if self._last_charged is not None else self.next_step_params()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "steps": self.steps, "sampler": self.sampler.state_dict() if self.sampler else None,
                "last_charged": self._last_charged, "partition_seed": self.partition_seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_same_partition_seed(state_dict, self.partition_seed, "teachers'")
        super().load_state_dict(state_dict)
        self._steps = int(state_dict["steps"])
        self.sampler.load_state_dict(state_dict["sampler"])  # same partitions, same draws
        # segments from before each recorded its accounting: the checkpoint's accountant ran the last
        # one where it was data-dependent; else it stays unrecorded (counted as possibly so)
        saved = state_dict.get("accountant") if isinstance(state_dict.get("accountant"), dict) else {}
        for segment in self.earlier_segments:
            segment.setdefault("accounting", ACCOUNTING_NOT_RECORDED)
        if self.earlier_segments and saved.get("accounting") == "data-dependent":
            if self.earlier_segments[-1]["accounting"] == ACCOUNTING_NOT_RECORDED:
                self.earlier_segments[-1]["accounting"] = "data-dependent"
        self._last_charged = state_dict.get("last_charged")
        if self._last_charged is None:  # a checkpoint written before it was kept: known if one setting was ever used
            used = self.accountant.noise_settings()
            self._last_charged = used[0] if len(used) == 1 else None

    def training_warnings(self) -> list[str]:
        """What the data-dependent figure is, when it is the one reported, then what the answers
        say about the training (:meth:`answer_warnings`)."""
        return [*self.accounting_warnings(), *self.answer_warnings()]

    def answer_warnings(self) -> list[str]:
        """Warnings about what the aggregated answers taught the generator; none by default."""
        return []

    def accounting_warnings(self) -> list[str]:
        """For the data holder, on the console: under data-dependent accounting, that the reported
        epsilon is the papers' figure, a function of the private votes and not a proven guarantee,
        with the bound that is one; under data-independent accounting, the data-dependent figure
        that :meth:`accounting_report` leaves out of ``privacy.json``."""
        if self.accountant is None or len(self.accountant) == 0:
            return []
        dependent = self.preprocessing["epsilon"] + self.accountant.epsilon_data_dependent(self.training_delta)
        independent = self.preprocessing["epsilon"] + self.accountant.epsilon_data_independent(self.training_delta)
        if self.accountant.accounting == "data-independent":
            return [f"the data-dependent epsilon of this run is {dependent:.4g}, for the data holder only: it is "
                    "computed from the teachers' votes, so it is left out of privacy.json, whose epsilon "
                    f"{independent:.4g} {self._independent_bound_holds()}"]
        if f"{dependent:.4g}" == f"{independent:.4g}":  # the votes saved nothing: the figure is the bound
            return [f"epsilon {dependent:.4g}, the data-dependent figure the PATE papers report, is also the "
                    "data-independent bound of the queries this run asked, which holds whatever their votes "
                    "(epsilon_data_independent in privacy.json): the votes were not unanimous enough to price any "
                    f"lower. But {QUERY_COUNT_CAVEAT}"]
        return [f"epsilon {dependent:.4g} is the data-dependent figure the PATE papers report: it is computed from the "
                "teachers' votes, so it is not itself differentially private. The data-independent bound of the queries "
                f"this run asked, which holds whatever their votes, is {independent:.4g} (epsilon_data_independent in "
                f"privacy.json); {QUERY_COUNT_CAVEAT}"]

    def segment(self) -> dict[str, Any]:
        """Also the accounting the segment stopped, and refused answers, on: a resume may change it."""
        return {**super().segment(), "accounting": self.accountant.accounting}

    def segments_stopped_on_the_votes(self) -> list[int]:
        """Under data-independent accounting, the first steps of the earlier segments that ran
        under data-dependent accounting (a resume changed it), or under one an older checkpoint did
        not record: how many queries they asked may have been decided on the votes, so the bound
        of the queries asked does not hold whatever the votes for them."""
        if self.accountant.accounting != "data-independent":
            return []
        return [segment.get("from_step") for segment in self.earlier_segments
                if segment.get("accounting", ACCOUNTING_NOT_RECORDED) != "data-independent"]

    def _independent_bound_holds(self) -> str:
        """What the data-independent epsilon holds, under data-independent accounting."""
        voted = self.segments_stopped_on_the_votes()
        if not voted:
            return "holds whatever the votes"
        return f"bounds the queries the run asked, whatever their votes; but {votes_decided_note(voted, self._unrecorded())}"

    def _unrecorded(self) -> bool:
        """Whether an earlier segment's accounting was not recorded (an older checkpoint)."""
        return any(segment.get("accounting", ACCOUNTING_NOT_RECORDED) == ACCOUNTING_NOT_RECORDED
                   for segment in self.earlier_segments)

    def spent_figures(self) -> dict[str, Any]:
        """Also which figure ``epsilon`` is (``accounting``) and the data-independent bound of the
        queries asked: ``sample`` and ``evaluate`` read the checkpoint's, and under data-dependent
        accounting ``epsilon`` is the papers' figure, a function of the private votes, not a
        guarantee the records it releases carry; nor, under data-independent accounting, is it one
        that holds whatever the votes where an earlier segment stopped on them."""
        figures = super().spent_figures()
        independent = self.preprocessing["epsilon"] + self.accountant.epsilon_data_independent(self.training_delta)
        voted = {"segments_stopped_on_the_votes": voted} if (voted := self.segments_stopped_on_the_votes()) else {}
        if voted and self._unrecorded():
            voted["segments_accounting_not_recorded"] = True
        return {**figures, "accounting": self.accountant.accounting,
                "epsilon_data_independent": independent if math.isfinite(independent) else None, **voted}

    def accounting_report(self) -> dict[str, Any]:
        """The accountant's epsilons, labelled, and which one stops training. Under data-independent
        accounting the data-dependent figure is left out: it is a function of the private votes, and
        without it every figure of the report holds whatever the votes (the answers it counts are
        released outputs; the stop is decided on the data-independent bound)."""
        independent = self.preprocessing["epsilon"] + self.accountant.epsilon_data_independent(self.training_delta)
        if self.accountant.accounting == "data-independent":
            return {
                "accounting": self.accountant.accounting,
                "epsilon_data_independent": independent,
                "note": f"epsilon_data_independent {self._independent_bound_holds()}. The data-dependent figure, "
                        "a function of the votes, is left out of this report (train prints it for the data holder).",
            }
        return {
            "accounting": self.accountant.accounting,
            "epsilon_data_dependent": self.preprocessing["epsilon"] + self.accountant.epsilon_data_dependent(self.training_delta),
            "epsilon_data_independent": independent,
            "note": "epsilon_data_dependent depends on the teachers' votes, hence on the private data; it is not "
                    "itself differentially private. epsilon_data_independent bounds the queries this run asked, "
                    f"whatever their votes; {QUERY_COUNT_CAVEAT}.{self._bound_above_target(independent)}",
        }

    def _bound_above_target(self, independent: float) -> str:
        """Said where the bound that holds whatever the votes passed the target: a reader who quotes
        ``epsilon`` (the data-dependent figure, within the target) would state a guarantee no
        figure of this run gives."""
        if self.target_epsilon is None or not independent > self.target_epsilon:
            return ""
        return (f" The data-independent bound, {independent:.4g}, is above --epsilon {self.target_epsilon:g}: the "
                "target holds only as the PATE papers' data-dependent accounting states it, not whatever the votes.")

    def partition_report(self) -> dict[str, Any]:
        sizes = [len(part) for part in self.sampler.partitions] if self.sampler else []
        return {
            "num_teachers": self.num_teachers,
            "partition_sizes": [min(sizes), max(sizes)] if sizes else None,
            "teacher_batch_size": self.teacher_batch_size,
            "steps_taken": self.steps,
        }
