"""``DPSGD``: the DP-SGD privacy strategy (Opacus), for any module with a GradientPrivatizer slot.

The mechanism itself (clipping, noise, sensitivity) is stated in
:mod:`lightning_dpgan.privacy.dp_sgd`. This callback decides its parameters (the noise
multiplier, calibrated from ``--epsilon`` and the planned steps when not given), draws the
training batches by Poisson sampling at rate ``q = batch_size / N`` (what the subsampled
Gaussian accountant assumes), and charges the accountant once per noisy step.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import lightning as L
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, Subset

from lightning_dpgan.callbacks.strategy import CalibratedNoiseStrategy
from lightning_dpgan.distributed import is_distributed, rank, world_size
from lightning_dpgan.error_text import SET_BY
from lightning_dpgan.privacy.accountants import OpacusAccountant, calibrate_noise_multiplier
from lightning_dpgan.privacy.accountants.opacus_adapter import prv_epsilon_floor, rdp_epsilon_floor
from lightning_dpgan.privacy.dp_sgd import MODES as GRAD_SAMPLE_MODES, DPSGDMechanism
from lightning_dpgan.privacy.slots import GradientPrivatizer
from lightning_dpgan.privacy.validation import validate_positive


class LoaderBatches(IterableDataset):
    """The batches of a data loader that samples for itself (a rank's Poisson loader)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


#: the refusal of a gradient penalty under DP-SGD (the strategy's at install, and train's up front)
GRADIENT_PENALTY_UNDER_DP_SGD = ("dp-sgd cannot clip per-record gradients of a gradient penalty: set "
                                 "--model.gradient_penalty 0")


#: why --privacy.poisson_sampling false is refused under DDP (see ``_use_shuffled_batches``)
SHUFFLED_IN_ONE_PROCESS = ("--privacy.poisson_sampling false trains in one process only: under --strategy ddp each "
                           "step must be one Poisson sample of all the records (the default)")


class DPSGD(CalibratedNoiseStrategy):
    """DP-SGD (Opacus): clip each real record's gradient, add Gaussian noise, Poisson-sample batches."""

    name: ClassVar[str] = "dp-sgd"
    slot: ClassVar[type] = GradientPrivatizer
    mechanism_name: ClassVar[str] = "dp-sgd (subsampled Gaussian)"
    datamodule_needs = ("train_dataset", "hparams.batch_size", "hparams.num_workers")

    def __init__(
        self,
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        max_grad_norm: float = 1.0,
        delta: float | None = None,
        accountant: str = "rdp",
        poisson_sampling: bool = True,
        grad_sample_mode: str = "auto",
        noise_seed: int | None = None,
    ) -> None:
        """``noise_seed`` fixes the generator of the Gaussian noise and of the Poisson batches:
        for tests only (the default draws from OS entropy; see
        :mod:`lightning_dpgan.privacy.noise_source`)."""
        super().__init__(noise_multiplier, target_epsilon, delta, noise_seed)
        self.max_grad_norm = validate_positive("--privacy.max_grad_norm", max_grad_norm)
        if accountant not in ("rdp", "prv"):
            raise ValueError(f"--privacy.accountant must be 'rdp' or 'prv', got {accountant!r}")
        self.accountant_kind = accountant
        self.poisson_sampling = poisson_sampling
        if grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise ValueError(f"--privacy.grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {grad_sample_mode!r}")
        self.grad_sample_mode = grad_sample_mode
        self.sample_rate: float | None = None

    def check_fits_records(self, train_records: int, datamodule: Any) -> None:
        super().check_fits_records(train_records, datamodule)
        self.check_batch_size(datamodule.hparams.batch_size, train_records)

    def given_noise_step_epsilon(self, train_records: int, batch_size: Any, training_delta: float) -> float | None:
        """One step of the given σ at rate batch / records."""
        if not isinstance(batch_size, int):
            return None
        return OpacusAccountant(self.accountant_kind).epsilon_if(
            training_delta, 1, noise_multiplier=self.noise_multiplier, sample_rate=batch_size / train_records)

    def epsilon_floor(self, train_records: int, batch_size: Any, delta: float) -> float:
        """The RDP accountant's floor, or the PRV accountant's at rate batch / records, a millionth
        lower: its probe (one step at σ 1e6) and the calibration's largest σ over many steps differ
        by 1e-9 at most (0 where the batch is not known: no floor to price)."""
        if self.accountant_kind == "rdp":
            return super().epsilon_floor(train_records, batch_size, delta)
        return (1 - 1e-6) * prv_epsilon_floor(delta, batch_size / train_records) if isinstance(batch_size, int) else 0.0

    def first_step_refusal(self, target_epsilon: float, priced: float | None = None, exact: bool = True) -> str:
        """The PRV accountant's floor (about its error margin, 0.01) is above the RDP one's."""
        refusal = super().first_step_refusal(target_epsilon, priced, exact)
        if self.floor_priced is not None and priced is not None and self.accountant_kind == "prv":
            return f"{refusal[:-1]}, or use --privacy.accountant rdp, whose least is {rdp_epsilon_floor(self.floor_priced[1]):.3g}."
        return refusal

    def check_batch_size(self, batch_size: int, train_records: int) -> None:
        """The sample rate batch / records is a probability: a batch above the records has none."""
        if batch_size > train_records:
            raise ValueError(f"--batch-size {batch_size} exceeds the {train_records} training records (the batch size "
                             f"{SET_BY}): pass --batch-size {train_records} or less")

    # ----------------------------------------------------------------- install
    def install(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if getattr(pl_module.hparams, "gradient_penalty", 0):
            raise ValueError(GRADIENT_PENALTY_UNDER_DP_SGD)
        datamodule = trainer.datamodule
        batch_size = datamodule.hparams.batch_size
        self.check_batch_size(batch_size, self.train_records)
        self.sample_rate = batch_size / self.train_records
        self.accountant = OpacusAccountant(self.accountant_kind)
        if self.noise_multiplier is None:
            self.noise_multiplier = self._calibrate(trainer)
        networks = pl_module.private_networks()
        if len(networks) != 1:
            raise NotImplementedError("dp-sgd supports modules with exactly one private network")
        self.mechanism = DPSGDMechanism(
            self.noise_multiplier, self.max_grad_norm, batch_size, on_noisy_step=self._charge, noise=self.noise,
            mode=self.grad_sample_mode,
        )
        self.mechanism.attach(next(iter(networks.values())))
        pl_module.privacy = self.mechanism
        # generated records are public: each rank makes its share of the global batch
        pl_module.generated_batch_size = math.ceil(batch_size / world_size())
        if self.poisson_sampling:
            self._use_poisson_sampling(datamodule)
        else:
            self._use_secret_shuffle(datamodule)

    def check_processes(self, processes: int, batch_size: Any, train_records: int | None) -> None:
        if not self.poisson_sampling:
            raise ValueError(f"{SHUFFLED_IN_ONE_PROCESS}; this run asks for {processes} processes. Drop "
                             "--privacy.poisson_sampling false, or train on one device")

    def _use_poisson_sampling(self, datamodule: L.LightningDataModule) -> None:
        """Each record joins each batch independently with probability q (Opacus' DPDataLoader).

        Under DDP each rank Poisson-samples its own shard of the records (every ``world``-th one)
        at the same rate q: together one Poisson sample of all N. Every rank yields the same
        number of batches, empty ones included, so the ranks step together (Opacus' distributed
        sampler drops empty batches, which leaves a rank one step behind the others and hangs
        the next collective). The draws come from the strategy's :class:`NoiseSource`, never from
        the run's ``--seed``: the amplification by subsampling assumes nobody knows which records
        a batch holds, and the ranks' draws must be independent (a seeded source adds the rank)."""
        dataset, workers, rate = datamodule.train_dataset, datamodule.hparams.num_workers, self.sample_rate
        generator = self.noise.generator("cpu")
        if not is_distributed():
            datamodule.train_dataloader = lambda: DPDataLoader(dataset, sample_rate=rate, num_workers=workers,
                                                               generator=generator)
            return
        records = Subset(dataset, range(rank(), len(dataset), world_size()))
        loader = DPDataLoader(records, sample_rate=rate, num_workers=workers, generator=generator)
        # an iterable dataset, so Lightning does not put its own DistributedSampler in
        datamodule.train_dataloader = lambda: DataLoader(LoaderBatches(loader), batch_size=None)

    def _use_secret_shuffle(self, datamodule: L.LightningDataModule) -> None:
        """Fixed-size batches (``--privacy.poisson_sampling false``) in an order drawn from the
        strategy's :class:`NoiseSource`. The datamodule's own shuffle draws from torch's global
        generator, which ``--seed`` fixes and ``config.yaml`` records: anyone could replay which
        records each batch held, and a batch known in advance gets no amplification at all.

        One process only: under DDP each rank would take a full batch from its shard, so a step
        would hold ``world`` times the records the rate q charges for."""
        if is_distributed():
            raise ValueError(SHUFFLED_IN_ONE_PROCESS)
        # the datamodule class's own loader: an earlier fit's strategy may have replaced the
        # instance's (a datamodule reused in a notebook), and Opacus' Poisson loader has no batch size
        loader = type(datamodule).train_dataloader(datamodule)
        dataset, generator = loader.dataset, self.noise.generator("cpu")
        datamodule.train_dataloader = lambda: DataLoader(
            dataset, batch_size=loader.batch_size, sampler=RandomSampler(dataset, generator=generator),
            drop_last=loader.drop_last, num_workers=loader.num_workers, persistent_workers=loader.persistent_workers)

    def planned_steps(self, trainer: L.Trainer) -> int:
        """Steps the run takes: an epoch of Opacus' Poisson loader is ``int(1 / q)`` batches (as a
        shuffled one of N // B); planning ``ceil`` calibrated sigma for a step never taken."""
        return self.planned_batches(trainer, max(1, int(1 / self.sample_rate)))

    def _calibrate(self, trainer: L.Trainer) -> float:
        steps = self.planned_steps(trainer)
        self.calibrated_for_steps = steps
        return calibrate_noise_multiplier(self.training_target, self.training_delta, self.sample_rate, steps, kind=self.accountant_kind)

    # -------------------------------------------------------------- accounting
    def _charge(self) -> None:
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)

    def segment(self) -> dict[str, Any]:
        return {**super().segment(), "sampling": "poisson" if self.poisson_sampling else "shuffle",
                "max_grad_norm": self.max_grad_norm, "train_records": self.train_records,
                "grad_sample_mode": self.mechanism.mode}

    def charges_for(self, train_steps: int) -> int:
        """Every training step takes one private critic step: one subsampled Gaussian charge."""
        return train_steps

    def charge_problem(self, pl_module: L.LightningModule, charged: int, batches: int) -> str | None:
        """One sampled batch, one private step: fewer charges and a critic step went round the
        mechanism; more, and one batch was used in several steps, which the accountant counts as
        independently sampled batches (the same records noised again at the same sampling)."""
        if charged == batches:
            return None
        said = f"{batches} training batch{'es' if batches > 1 else ''} charged {charged} private step{'s' if charged != 1 else ''}"
        if charged < batches:
            return (f"{said}: a critic step went round the mechanism (an optimizer other than the one wrap_optimizer "
                    "returned), so its gradient was not clipped or not noised")
        return (f"{said}: each sampled batch must be used in one private critic step. Used in several, the accountant "
                "counts them as independently sampled batches and under-states epsilon: take one critic step a batch "
                "(several critic steps a generator step: the module's discriminator_steps)")

    def next_step_params(self) -> dict[str, float]:
        return {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate}

    def report_parameters(self) -> dict[str, Any]:
        last = self.last_step_params()
        taken = self.last_charged_segment()
        report = {
            "noise_multiplier": last["noise_multiplier"],
            "sample_rate": last["sample_rate"],
            "max_grad_norm": taken["max_grad_norm"],
            "sampling": taken["sampling"],
            "grad_sample_mode": taken["grad_sample_mode"],
            "calibrated_for_steps": self.noise_state()["calibrated_for_steps"],
        }
        if (note := self.shuffled_batches_note()) is not None:
            report["note"] = note
        return report

    def shuffled_batches_note(self) -> str | None:
        """That epsilon is not a proven bound, where any segment took shuffled batches
        (``--privacy.poisson_sampling false``, now or before a resume: the guarantee is that of
        its weakest part); None where every one was Poisson-sampled."""
        segments = self.segments()
        shuffled = [str(segment["from_step"]) for segment in segments if segment.get("sampling") == "shuffle"]
        if not shuffled:
            return None
        where = "" if len(segments) == 1 else f" in the segment(s) from step {', '.join(shuffled)}"
        return (f"batches were shuffled{where} (in an order drawn from the strategy's noise source, not from --seed), "
                "not Poisson-sampled: epsilon is computed as if Poisson-subsampled, "
                "which is the common practice but not a proven bound for shuffled batches")

    def training_warnings(self) -> list[str]:
        """On the console too, not only in privacy.json: a run continued with Poisson batches
        from shuffled ones said nothing of its weaker first part."""
        note = self.shuffled_batches_note()
        return [] if note is None else [note]
