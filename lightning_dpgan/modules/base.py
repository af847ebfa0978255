"""``GANModule``: the LightningModule every model in lightning-dpgan builds on.

Manual optimization, because a GAN alternates two optimizers and privacy mechanisms must
see each step on its own. ``training_step`` stays short: one discriminator step on a real
batch, then, every ``discriminator_steps`` batches, one generator step that reads no real
data at all (generated records and uniformly drawn class labels only), so a privacy
mechanism on the discriminator covers everything that touches private records.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor, nn

from lightning_dpgan.config import STRATEGY_OWNED
from lightning_dpgan.distributed import own_share_of_draw
from lightning_dpgan.nets import build_networks
from lightning_dpgan.privacy.slots import GradientPrivatizer, GradientSanitizer
from lightning_dpgan.privacy.validation import validate_int
from lightning_dpgan.python_run_info import TRAINED_BY_PYTHON, python_run_info, trained_in_python
from lightning_dpgan.random_streams import seeded_stream

LATENT_DISTRIBUTIONS = ("normal", "uniform")
CHECKPOINT_KEY = "lightning_dpgan"


#: model settings that the privacy strategy hands the module (``--privacy.<name>``, not ``--model.``)
STRATEGY_SETTINGS = dict.fromkeys(STRATEGY_OWNED, "privacy")


def check_same_model_settings(saved: dict[str, Any] | None, current: dict[str, Any]) -> None:
    """Refuse to go on from a checkpoint whose model was built with other settings (a latent
    distribution, an output activation, a learning rate): networks of the same shapes would
    load its weights and then compute something else, and Adam's restored state would keep the
    checkpoint's learning rates whatever this run says. ``sample`` and ``evaluate`` rebuild the
    model from the checkpoint's own settings, so only a resume can differ."""
    if not isinstance(saved, dict):
        return
    normal = lambda value: json.loads(json.dumps(value, default=str))  # noqa: E731 -- tuples and lists alike
    differing = sorted(key for key in set(saved) | set(current) if normal(saved.get(key)) != normal(current.get(key)))
    if differing:
        said = ", ".join(f"{key} {normal(saved.get(key))!r} (this run: {normal(current.get(key))!r})" for key in differing)
        flags = ", ".join(f"--{STRATEGY_SETTINGS.get(key, 'model')}.{key}" for key in differing)
        table = ("; from Python, a table datamodule built afresh draws its own DP encoding: call its "
                 "restore_releases(checkpoint) before reading its table_layout" if "table_layout" in differing else "")
        raise ValueError(f"the checkpoint's model was built with other settings: {said}. Resume with the settings it was "
                         f"trained with ({flags}; its run's config.yaml lists those set by a flag or a preset, not defaults "
                         f"that changed since; from Python, build the module with the checkpoint's hyper_parameters"
                         f"{table}), or drop --resume (ckpt_path)")


def privacy_strategy_of(trainer: Any) -> Any:
    """The privacy strategy among the Trainer's callbacks, or None (a run without privacy)."""
    from lightning_dpgan.callbacks.strategy import PrivacyStrategy

    return next((callback for callback in trainer.callbacks if isinstance(callback, PrivacyStrategy)), None)


def warn_if_private_model_fits_without_privacy(module: Any, trainer: Any) -> None:
    """A private model (DPGAN, GS-WGAN, DP-CTGAN, ...) fitted on a Trainer built in Python without
    its strategy callback trains without privacy. ``train`` never does this; from Python it is
    allowed (the checkpoint is marked as trained without privacy, and ``sample`` says so), but a
    user who forgot the callback must hear it as training starts, not after publishing."""
    if module.default_privacy == "none" or privacy_strategy_of(trainer) is not None:
        return
    name = type(module).__name__
    warnings.warn(f"{name} is fitted with no privacy strategy among the Trainer's callbacks: it trains WITHOUT "
                  f"privacy, and its checkpoint says so. For a private run, pass its strategy (--privacy "
                  f"{module.default_privacy} in train) with PrivacyBudgetStopping in callbacks=[...]; for a "
                  "non-private baseline, fit the model it builds on (GAN, WGAN or CTGAN)", UserWarning, stacklevel=2)


def check_fits_datamodule(module: Any, datamodule: Any) -> None:
    """``train`` builds a module from its datamodule; built by hand, a module of another image
    shape failed in torch at the first step, and one with more classes than the data trained
    and then drew classes that do not exist. A table's width is checked once its datamodule is
    set up (at fit, before the module's setup): a mode-specific datamodule learns it from a DP
    release, which asking earlier would make."""
    if datamodule is None:
        return
    kind = getattr(datamodule, "kind", None)
    shaped = kind == "image" or (kind == "table" and getattr(datamodule, "train_dataset", None) is not None)
    if shaped and tuple(datamodule.data_shape) != tuple(module.data_shape):
        raise ValueError(f"the module was built for records of shape {tuple(module.data_shape)}, and the datamodule's "
                         f"are {tuple(datamodule.data_shape)}: build it with data_shape=datamodule.data_shape")
    if not hasattr(datamodule, "num_classes"):  # a user's own datamodule: its classes are not declared
        return
    classes = datamodule.num_classes
    if module.num_classes is not None and module.num_classes != classes:
        raise ValueError(f"the module was built for {module.num_classes} classes, and the datamodule has "
                         f"{classes if classes is not None else 'none'}: build it with num_classes=datamodule.num_classes "
                         "(or conditional=False)")


def check_at_least_one(**settings: int) -> None:
    """Refuse a count of the model's (``--model.NAME``) below 1, naming it and its value."""
    for name, value in settings.items():
        if value < 1:
            raise ValueError(f"--model.{name} must be at least 1, got {value}")


def check_learning_rates(settings: Any) -> None:
    """Refuse a learning rate (a ``--model`` setting named ``lr`` or ``*_lr``/``lr_*``) not above 0,
    naming its flag: a negative one reached torch's "Invalid learning rate" once the data was
    read, and 0 trained a network that never moved."""
    for name, value in settings.items():
        if "lr" in name.split("_") and isinstance(value, (int, float)) and not value > 0:
            raise ValueError(f"--model.{name} must be above 0, got {value}")


class GANModule(L.LightningModule):
    """A generator/discriminator pair; subclasses give the losses and optimizers.

    Args:
        data_shape: shape of one record, e.g. ``(1, 28, 28)`` or ``(n_features,)``.
        num_classes: number of classes for class-conditional generation (``None``: unconditional).
        conditional: set ``False`` to ignore labels even when the data has classes.
        latent_dim: size of the generator's input noise ``z``.
        latent_distribution: ``normal`` (N(0, 1)) or ``uniform`` (U[0, 1], as PATE-GAN).
        arch: ``auto``, ``mlp`` or ``dcgan`` (see :mod:`lightning_dpgan.nets`).
        generator_kwargs / discriminator_kwargs: passed to the network constructors.
        discriminator_steps: discriminator updates per generator update.
    """

    #: The kind of privacy mechanism this module can take; ``None``: none fits.
    privacy_slot: ClassVar[type | None] = GradientPrivatizer
    #: The ``--privacy`` strategy used when none is named.
    default_privacy: ClassVar[str] = "none"

    def __init__(
        self,
        data_shape: Sequence[int],
        num_classes: int | None = None,
        conditional: bool = True,
        latent_dim: int = 100,
        latent_distribution: str = "normal",
        arch: str = "auto",
        generator_kwargs: dict[str, Any] | None = None,
        discriminator_kwargs: dict[str, Any] | None = None,
        discriminator_steps: int = 1,
    ) -> None:
        super().__init__()
        check_at_least_one(latent_dim=latent_dim, discriminator_steps=discriminator_steps)
        if latent_distribution not in LATENT_DISTRIBUTIONS:
            raise ValueError(f"latent_distribution must be one of {LATENT_DISTRIBUTIONS}, got {latent_distribution!r}")
        if num_classes is not None:
            validate_int("num_classes", num_classes, minimum=0)  # 2.5 was taken as 2 classes
        self.save_hyperparameters()  # the subclass's settings too: their learning rates are checked here
        check_learning_rates(self.hparams)
        self.automatic_optimization = False
        self.data_shape = tuple(int(s) for s in data_shape)
        self.num_classes = int(num_classes) if (conditional and num_classes) else None
        self.generator, self.discriminator = self.make_networks()
        #: The privacy mechanism a strategy callback installs (``None``: not private).
        self.privacy: Any = None
        #: Training batches seen; the unit of ``--max-steps`` and of privacy accounting.
        self.train_steps = 0
        #: Generated records per discriminator/generator step. ``None``: as many as real
        #: records in the batch. A privacy strategy fixes it, because under Poisson sampling
        #: the real batch size depends on the data while this must not.
        self.generated_batch_size: int | None = None
        #: Names of the run (model, dataset, ...) stored in checkpoints for ``sample``.
        self.run_info: dict[str, Any] = {}
        #: whether the current fit runs on a Trainer built in Python (set at setup)
        self.fit_from_python = False
        #: whether ``run_info`` was read from a checkpoint outside a fit (``load_from_checkpoint``):
        #: it then describes the run that wrote the file, not the fit about to start
        self.run_info_from_a_file = False

    def setup(self, stage: str) -> None:
        """Before fitting, refuse a datamodule whose records or classes are not this module's
        (:func:`check_fits_datamodule`). Subclasses that override it call it, after any refusal
        of their own."""
        if stage == "fit":
            trainer = getattr(self, "_trainer", None)  # set up by hand in some tests: no Trainer then
            datamodule = getattr(trainer, "datamodule", None)
            check_fits_datamodule(self, datamodule)
            # A Trainer built in Python (train sets the run information before fitting): what sample
            # reads, taken again at every fit, whose strategy (or none) is what the module trains under
            # (a module loaded from train's checkpoint and fitted again is too: its record was train's)
            self.fit_from_python = datamodule is not None and (
                not self.run_info or trained_in_python(self.run_info) or self.run_info_from_a_file)
            if self.fit_from_python:
                self.run_info = python_run_info(self, datamodule, privacy_strategy_of(trainer))
                warn_if_private_model_fits_without_privacy(self, trainer)

    def make_networks(self) -> tuple[nn.Module, nn.Module | None]:
        """``(generator, discriminator)`` from the hyper-parameters (see :func:`build_networks`).
        The training step calls them as ``generator(latent, labels)`` and
        ``discriminator(records, labels)``, ``labels`` None for an unconditional model: an
        override returns networks taking both (wrap an ``nn.Sequential`` that ignores them)."""
        h = self.hparams
        return build_networks(h.arch, self.data_shape, h.latent_dim, self.num_classes,
                              h.generator_kwargs, h.discriminator_kwargs)

    @property
    def generator_normalizes_batches(self) -> bool:
        """Whether the generator has BatchNorm, whose training step needs at least 2 generated
        records (PyTorch: "Expected more than 1 value per channel")."""
        return any(isinstance(layer, nn.modules.batchnorm._BatchNorm) for layer in self.generator.modules())

    # ----------------------------------------------------------------- sampling
    def sample_latent(self, n: int) -> Tensor:
        if self.hparams.latent_distribution == "uniform":
            return torch.rand(n, self.hparams.latent_dim, device=self.device)
        return torch.randn(n, self.hparams.latent_dim, device=self.device)

    def set_hparam(self, name: str, value: Any) -> None:
        """Set a hyper-parameter that a privacy strategy decides when it installs (the number of
        teachers or critics): in the saved settings, and in the copy Lightning gives the loggers
        (``hparams_initial``, which would keep the constructor's value: 1 critic for 2)."""
        self.hparams[name] = value
        if hasattr(self, "_hparams_initial"):
            self._hparams_initial[name] = value

    def generated_share(self, n: int) -> tuple[Tensor | None, Tensor]:
        """Labels and latent codes of this process's ``n`` generated records in a training step:
        under DDP, its own share of the step's batch, distinct from the other processes' rows
        (:func:`~lightning_dpgan.distributed.own_share_of_draw`)."""
        return own_share_of_draw(lambda count: (self.sample_labels(count), self.sample_latent(count)), n)

    def sample_labels(self, n: int) -> Tensor | None:
        """Uniform random class labels for generated records; reads no private data."""
        if self.num_classes is None:
            return None
        return torch.randint(0, self.num_classes, (n,), device=self.device)

    def balanced_labels(self, n: int) -> Tensor | None:
        """Labels 0, 1, ..., K-1, 0, 1, ...: an equal share of every class."""
        if self.num_classes is None:
            return None
        return torch.arange(n, device=self.device) % self.num_classes

    @torch.no_grad()
    def sample(self, n: int, labels: Tensor | None = None) -> Tensor:
        """Draw ``n`` synthetic records (in the model's [-1, 1] or [0, 1] scale).

        For a conditional model ``labels`` picks the classes (default: balanced classes).
        This is the public way to draw synthetic data; it never reads training data (and, under
        ``no_grad``, keeps no autograd graph).
        """
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if labels is None:
            labels = self.balanced_labels(n)
        elif self.num_classes is None:
            raise ValueError("this model is unconditional: it takes no labels")
        else:
            given = torch.as_tensor(labels, device=self.device)
            labels = given.long()  # 0.5 would be taken as class 0: refused below, as a fraction
            if (labels.shape != (n,) or labels.min() < 0 or labels.max() >= self.num_classes
                    or given.dtype == torch.bool or not torch.equal(labels.to(given.dtype), given)):
                raise ValueError(f"labels must be {n} class indices (whole numbers) in [0, {self.num_classes})")
        was_training = self.generator.training
        self.generator.eval()
        try:
            return self.generator(self.sample_latent(n), labels)
        finally:
            self.generator.train(was_training)

    @property
    def gradient_privatizer(self) -> GradientPrivatizer | None:
        """The privacy mechanism if it is DP-SGD on the discriminator (else the discriminator
        trains without noise: a sanitizer privatizes the generator's side instead)."""
        return self.privacy if self.privacy_slot is GradientPrivatizer else None

    # ----------------------------------------------------------------- training
    def unpack_batch(self, batch: Any) -> tuple[Tensor, Tensor | None]:
        """A batch is ``records`` or ``(records, labels)``; labels are dropped when unconditional."""
        if isinstance(batch, (list, tuple)):
            records = batch[0]
            labels = batch[1] if len(batch) > 1 and self.num_classes is not None else None
        else:
            records, labels = batch, None
        return records, labels

    @property
    def generator_updates(self) -> int:
        """Generator steps in ``train_steps`` training steps: one every ``discriminator_steps``."""
        return self.train_steps // self.hparams.discriminator_steps

    def generator_updates_every_step(self, num_critics: Any = None) -> bool:
        """Whether the generator steps at every training step, ``discriminator_steps`` aside,
        before training (``num_critics``: the strategy's, for a model whose critics it builds)."""
        return False

    @contextmanager
    def real_records_stream(self) -> Iterator[None]:
        """Random draws on real records (CTGAN's conditions, dropout masks, a gradient penalty's
        weights) number one or more per record, and under Poisson sampling the number of
        records is private. Drawn from the run's stream, which ``--seed`` (public) starts, they
        would shift every later draw -- the generated records, the generator's latents -- by a
        private amount. They come from a stream of their own, seeded by one draw from the run's,
        which then goes on as if they had not happened."""
        with seeded_stream(int(torch.randint(0, 2**62, (1,))), self.device):
            yield

    def training_step(self, batch: Any, batch_idx: int) -> None:
        with self.real_records_stream():
            real, labels = self.unpack_batch(batch)
        n_generated = self.generated_batch_size or real.shape[0]
        losses = {"loss/discriminator": self.discriminator_step(real, labels, n_generated)}
        if (self.train_steps + 1) % self.hparams.discriminator_steps == 0:
            losses["loss/generator"] = self.generator_step(n_generated)
        self.train_steps += 1
        self.log_dict(losses, prog_bar=True, batch_size=max(real.shape[0], 1))

    def public_pass(self) -> Any:
        """Context for passes through the discriminator that involve no real record.

        A privacy mechanism keeps their gradients out of its per-sample clipping and
        noise: they depend only on generated data and on already-private parameters.
        """
        return self.gradient_privatizer.public_pass() if self.gradient_privatizer is not None else nullcontext()

    def discriminator_step(self, real: Tensor, labels: Tensor | None, n_generated: int) -> Tensor:
        """One discriminator update on a real batch against ``n_generated`` generated records.

        The real part is back-propagated first, through the privacy slot's ``backward_real``
        (which clips each record's gradient, then adds noise); the generated part second,
        through ``backward_public`` (each generated record's gradient clipped to the same bound,
        no noise), so that it never shares a clipped row with a real record.
        """
        opt_d = self.optimizers()[1]
        fake_labels, latent = self.generated_share(n_generated)
        with torch.no_grad():
            fake = self.generator(latent, fake_labels)
        opt_d.zero_grad()
        real_loss = real.new_zeros(())
        with self.real_records_stream():  # entered for an empty batch too: whether it was empty is private
            if real.shape[0] > 0:  # Poisson sampling can draw an empty batch; the noise still comes
                per_record = self.discriminator_real_loss(self.discriminator(real, labels))
                per_record = per_record + self.discriminator_penalty(real, labels, fake, fake_labels)
                self.backward_real(per_record)
                real_loss = per_record.detach().mean()
        fake_per_record = self.discriminator_fake_loss(self.discriminator(fake, fake_labels))
        self.backward_generated(fake_per_record)
        fake_loss = fake_per_record.detach().mean()
        opt_d.step()
        self.after_discriminator_step()
        return real_loss + fake_loss.detach()

    def backward_real(self, per_record_losses: Tensor) -> None:
        """Back-propagate the mean of per-record losses on real data (privately when a
        mechanism fills the slot: it clips each record's contribution)."""
        if self.gradient_privatizer is not None:
            self.gradient_privatizer.backward_real(per_record_losses)
        else:
            self.manual_backward(per_record_losses.mean())

    def backward_generated(self, per_record_losses: Tensor) -> None:
        """Back-propagate the mean of per-record discriminator losses on generated data (through
        the slot's ``backward_public`` when a mechanism fills it: clipped like real records',
        but public, so not noised)."""
        if self.gradient_privatizer is not None:
            self.gradient_privatizer.backward_public(per_record_losses)
        else:
            self.manual_backward(per_record_losses.mean())

    def generator_step(self, n: int) -> Tensor:
        """One generator update; the discriminator is frozen so none of its gradients form."""
        opt_g = self.optimizers()[0]
        labels, latent = self.generated_share(n)
        self.discriminator.requires_grad_(False)
        try:
            with self.public_pass():
                fake = self.sanitize_generated(self.generator(latent, labels))
                loss = self.generator_loss(self.discriminator(fake, labels))
                opt_g.zero_grad()
                self.manual_backward(loss)
            opt_g.step()
        finally:
            self.discriminator.requires_grad_(True)
        return loss.detach()

    def sanitize_generated(self, fake: Tensor) -> Tensor:
        """``fake`` with the sanitizer's hook attached when a GradientSanitizer fills the slot.

        Call it on the generated records right before they meet any network trained on real
        data: their gradient is then the only path from those networks to the generator."""
        if self.privacy is not None and self.privacy_slot is GradientSanitizer:
            return self.privacy.sanitize(fake)
        return fake

    def private_networks(self) -> dict[str, nn.Module]:
        """The networks whose parameters are trained on real records."""
        return {"discriminator": self.discriminator}

    # ----------------------------------------------------- what subclasses give
    def discriminator_real_loss(self, real_scores: Tensor) -> Tensor:
        """The discriminator's loss on each real record, shape ``(batch,)``."""
        raise NotImplementedError

    def discriminator_fake_loss(self, fake_scores: Tensor) -> Tensor:
        """The discriminator's loss on each generated record, shape ``(batch,)``."""
        raise NotImplementedError

    def discriminator_loss(self, real_scores: Tensor, fake_scores: Tensor) -> Tensor:
        """The mean loss over both parts (for evaluation; training back-propagates them apart)."""
        return self.discriminator_real_loss(real_scores).mean() + self.discriminator_fake_loss(fake_scores).mean()

    def generator_loss(self, fake_scores: Tensor) -> Tensor:
        """The generator's loss, a scalar (the mean over the generated records): it reads no real
        record, so it is not clipped per record as the discriminator's losses are."""
        raise NotImplementedError

    def discriminator_penalty(self, real: Tensor, labels: Tensor | None, fake: Tensor, fake_labels: Tensor | None) -> Tensor:
        """Extra discriminator loss per real record (e.g. a gradient penalty); none by default."""
        return real.new_zeros(())

    def after_discriminator_step(self) -> None:
        """Hook after each discriminator update (e.g. WGAN weight clipping)."""

    def build_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        """``(generator optimizer, discriminator optimizer)``."""
        raise NotImplementedError

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """The subclass's optimizers, the discriminator's made private by the privacy slot."""
        opt_g, opt_d = self.build_optimizers()
        if self.gradient_privatizer is not None:
            opt_d = self.gradient_privatizer.wrap_optimizer(opt_d)
        return [opt_g, opt_d]

    # -------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # generator_updates: for sample, which warns of a generator that never stepped without building the module
        checkpoint[CHECKPOINT_KEY] = {"format": 1, "train_steps": self.train_steps,
                                      "generator_updates": self.generator_updates, "run": dict(self.run_info)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        info = checkpoint.get(CHECKPOINT_KEY)
        if not isinstance(info, dict) or "train_steps" not in info:
            raise ValueError("this checkpoint was not written by lightning-dpgan (no run information in it)")
        check_same_model_settings(checkpoint.get("hyper_parameters"), dict(self.hparams))
        self.train_steps = int(info["train_steps"])
        restored = dict(info.get("run", {}))
        if self.fit_from_python and restored:
            # trained on from Python, a train run's checkpoint too: what it writes next is a Python
            # run's (train's report and lineage no longer describe it); without a strategy,
            # whatever the checkpoint's run spent, it carries no guarantee, as sample must then say
            restored["trained_by"] = TRAINED_BY_PYTHON
            if self.run_info.get("privacy") == "none":
                restored["privacy"] = "none"
        self.run_info = restored
        self.run_info_from_a_file = getattr(self, "_trainer", None) is None  # load_from_checkpoint, not a fit's resume

    def holds_a_share(self) -> bool:
        """Whether this process holds only a share of the module (a DDP rank's teachers): then a
        checkpoint is read memory-mapped and cut by :meth:`keep_own_share`. Not here."""
        return False

    def keep_own_share(self, checkpoint: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Cut, in place, the tensors of ``checkpoint`` this process holds only a share of (a DDP
        rank's teachers) down to its share, as views; return the ``(key, holder)`` of each cut.
        Nothing here: every process holds the whole module."""
        return []

    @classmethod
    def leave_out_for_sampling(cls, checkpoint: dict[str, Any]) -> None:
        """Drop, in place, what drawing samples from ``checkpoint`` does not need and the module
        would otherwise build: nothing here (the PATE modules leave out their teachers)."""
