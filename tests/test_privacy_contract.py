"""A module written against a privacy slot that goes round its mechanism is stopped, not reported
as private: the accountant only counts what the mechanism releases, so a gradient that skipped
the clipping, a step that skipped the mechanism, or one sampled batch used in several private
steps would leave the reported epsilon below what was released."""
from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import Logger
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dpgan.callbacks import DPSGD, GradientSanitizer, StepLimit
from lightning_dpgan.callbacks.strategy import ChargeMismatchError
from lightning_dpgan.modules import GAN, WGAN
from lightning_dpgan.privacy.slots import GradientPrivatizer
from lightning_dpgan.privacy.slots import GradientSanitizer as SanitizerSlot


class TinyTable(L.LightningDataModule):
    """A user's own datamodule: 400 records of 4 features."""

    def __init__(self, batch_size: int = 40, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_dataset = TensorDataset(torch.randn(400, 4, generator=torch.Generator().manual_seed(0)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_dataset, batch_size=self.hparams.batch_size, shuffle=True)


def fit(module: L.LightningModule, strategy, steps: int = 3, *callbacks: L.Callback) -> L.Trainer:
    trainer = L.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", log_every_n_steps=1,
                        callbacks=[StepLimit(steps), strategy, *callbacks])
    trainer.fit(module, datamodule=TinyTable())
    return trainer


class OwnCritic(L.LightningModule):
    """A GAN of one's own with the DP-SGD slot, its real pass made one of three ways."""

    privacy_slot = GradientPrivatizer

    def __init__(self, real_pass: str = "backward_real", wrap: bool = True) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.real_pass, self.wrap = real_pass, wrap
        self.generator, self.discriminator = nn.Linear(2, 4), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.privacy = None
        self.train_steps = 0

    def private_networks(self) -> dict[str, nn.Module]:
        return {"discriminator": self.discriminator}

    def configure_optimizers(self):
        critic = torch.optim.SGD(self.discriminator.parameters(), lr=0.1)
        return [torch.optim.SGD(self.generator.parameters(), lr=0.1),
                self.privacy.wrap_optimizer(critic) if self.wrap else critic]

    def training_step(self, batch, batch_index) -> None:
        real = batch[0]
        critic = self.optimizers()[1]
        critic.zero_grad()
        if real.shape[0] and self.real_pass == "twice":  # the mistake: the batch in two halves, each clipped alone
            half = real.shape[0] // 2
            self.privacy.backward_real(-self.discriminator(real[:half]).squeeze(1))
            self.privacy.backward_real(-self.discriminator(real[half:]).squeeze(1))
        elif real.shape[0]:
            losses = -self.discriminator(real).squeeze(1)
            if self.real_pass == "backward_real":
                self.privacy.backward_real(losses)
            elif self.real_pass == "and_plain":  # the mistake: a penalty added by a plain backward beside it
                self.privacy.backward_real(losses)
                self.manual_backward(1e4 * self.discriminator(real).mean())
            elif self.real_pass == "redone":  # a pass thrown away (zero_grad) and made again: allowed
                self.privacy.backward_real(losses)
                critic.zero_grad()
                self.privacy.backward_real(-self.discriminator(real).squeeze(1))
            else:  # the mistake: a plain backward of the real records' loss
                self.manual_backward(losses.mean())
        self.privacy.backward_public(self.discriminator(self.generator(torch.randn(8, 2)).detach()).squeeze(1))
        critic.step()
        self.train_steps += 1


def test_a_plain_backward_of_real_records_in_ghost_mode_is_refused_at_the_step():
    """Opacus' ghost clipping clips each record's gradient in backward_real alone: a plain
    backward left the critic's gradient unclipped, which the step noised and the accountant
    charged as private (a loss scaled by 1e4 moved the critic by 5e6 at C = 1)."""
    strategy = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", delta=1e-5)
    with pytest.raises(RuntimeError, match="did not come through the DP-SGD mechanism's backward_real: in ghost mode"):
        fit(OwnCritic(real_pass="plain"), strategy)
    assert strategy.steps_taken() == 0  # refused before the noise and the charge
    beside = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", delta=1e-5)
    with pytest.raises(RuntimeError, match="did not come through the DP-SGD mechanism's backward_real"):
        fit(OwnCritic(real_pass="and_plain"), beside)  # an unclipped pass beside a clipped one
    for real_pass in ("backward_real", "redone"):
        control = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", delta=1e-5)
        module = OwnCritic(real_pass=real_pass)
        fit(module, control)
        assert module.train_steps == control.steps_taken() == 3


def test_two_real_passes_before_one_step_in_ghost_mode_are_refused():
    """Each pass clips each of its records to C: a record could sit in both, doubling what one
    record can move the critic by (hooks mode: Opacus' own refusal of gradient accumulation)."""
    strategy = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", delta=1e-5)
    with pytest.raises(RuntimeError, match="a second real-data pass before the optimizer step"):
        fit(OwnCritic(real_pass="twice"), strategy)
    assert strategy.steps_taken() == 0


def test_a_critic_optimizer_left_unwrapped_is_stopped_at_the_first_batch():
    """Without wrap_optimizer nothing was clipped, noised or charged: the run reported epsilon 0."""
    strategy = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", delta=1e-5)
    module = OwnCritic(real_pass="plain", wrap=False)
    with pytest.raises(ChargeMismatchError, match="DPSGD: 1 training batch charged 0 private steps: a critic step went "
                                                  "round the mechanism"):
        fit(module, strategy)
    assert module.train_steps == 1


def test_one_sampled_batch_used_in_several_private_steps_is_stopped():
    """The common WGAN loop of several critic steps on one batch: each step was charged as a
    freshly sampled batch, an epsilon about four times too low for five uses."""

    class ReusedBatchWGAN(WGAN):
        def training_step(self, batch, batch_index) -> None:
            real, labels = self.unpack_batch(batch)
            for _ in range(3):
                self.discriminator_step(real, labels, real.shape[0] or 1)
            self.generator_step(8)
            self.train_steps += 1

    strategy = DPSGD(noise_multiplier=1.0, delta=1e-5)
    module = ReusedBatchWGAN((4,), generator_kwargs={"hidden": (8,)}, discriminator_kwargs={"hidden": (8,)})
    with pytest.raises(ChargeMismatchError, match="1 training batch charged 3 private steps: each sampled batch must be "
                                                  "used in one private critic step"):
        fit(module, strategy)


def test_a_generator_update_that_skips_the_sanitizer_is_stopped():
    """A generator step that did not pass its generated batch through the slot's sanitize took
    the critic's gradient on the real records unclipped and unnoised, and charged nothing: the
    run reported epsilon 0 and the budget never stopped it."""

    class UnsanitizedGAN(GAN):
        privacy_slot = SanitizerSlot
        sanitize = False

        def generator_step(self, n: int) -> torch.Tensor:
            labels, latent = self.generated_share(n)
            self.discriminator.requires_grad_(False)
            fake = self.generator(latent, labels)
            if self.sanitize:
                fake = self.privacy.sanitize(fake)
            loss = self.generator_loss(self.discriminator(fake, labels))
            generator = self.optimizers()[0]
            generator.zero_grad()
            self.manual_backward(loss)
            generator.step()
            self.discriminator.requires_grad_(True)
            return loss.detach()

    def module(sanitize: bool) -> GAN:
        built = UnsanitizedGAN((4,), generator_kwargs={"hidden": (8,)}, discriminator_kwargs={"hidden": (8,)})
        built.sanitize = sanitize
        return built

    with pytest.raises(ChargeMismatchError, match="GradientSanitizer: 1 generator update charged 0 sanitized releases: "
                                                  "a generator update went round the mechanism"):
        fit(module(sanitize=False), GradientSanitizer(noise_multiplier=2.0, delta=1e-5))
    strategy = GradientSanitizer(noise_multiplier=2.0, delta=1e-5)
    sanitized = module(sanitize=True)
    fit(sanitized, strategy)
    assert strategy.steps_taken() == sanitized.generator_updates == 3


def test_a_critic_the_mechanism_cannot_clip_or_an_unwrapped_optimizer_is_named_with_the_remedy():
    """Opacus' own errors: a list repr of "a trainable layer with buffers" for BatchNorm, and an
    AttributeError (ghost) or "Poisson sampling is not compatible with grad accumulation" (hooks)
    for a real pass before wrap_optimizer."""
    from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism

    for norm in (nn.BatchNorm1d(8), nn.BatchNorm1d(8, affine=False)):  # without parameters of its own it mixes all the same
        normalized = nn.Sequential(nn.Linear(4, 8), norm, nn.Linear(8, 1))
        with pytest.raises(ValueError, match=r"'1' \(BatchNorm1d\) normalizes with the batch's statistics.*Use GroupNorm"):
            DPSGDMechanism(1.0, 1.0, 8).attach(normalized)
    for mode in ("ghost", "hooks"):
        mechanism = DPSGDMechanism(1.0, 1.0, 8, mode=mode)
        critic = nn.Linear(4, 1)
        mechanism.attach(critic)
        with pytest.raises(RuntimeError, match="backward_real before wrap_optimizer"):
            mechanism.backward_real(critic(torch.randn(8, 4)).squeeze(1))


class KeptLogger(Logger):
    """A logger that keeps what it was given: (step, metrics)."""

    name, version, experiment = "kept", 0, None

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int | None, dict]] = []

    def log_metrics(self, metrics, step=None) -> None:
        self.seen.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def epsilons(self) -> list[tuple[int | None, float]]:
        return [(step, metrics["privacy/epsilon"]) for step, metrics in self.seen if "privacy/epsilon" in metrics]


def logged_epsilons(strategy, steps: int, every: int, *callbacks: L.Callback) -> list[tuple[int | None, float]]:
    kept = KeptLogger()
    trainer = L.Trainer(max_epochs=-1, logger=kept, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", log_every_n_steps=every,
                        callbacks=[strategy, StepLimit(steps), *callbacks])  # the stop decided after the strategy
    trainer.fit(OwnCritic(), datamodule=TinyTable())
    return kept.epsilons()


def test_a_strategy_logs_its_epsilon_where_no_budget_callback_does_and_the_last_steps_once():
    """A run with a given noise and no target has no PrivacyBudgetStopping, which alone logged
    privacy/epsilon: the spend was missing from the logs. Now the strategy logs it at the
    cadence and for the last step, once, with the last step's figure (through pl_module.log a stop
    decided after the strategy wrote the cached, stale figure at the last step first)."""
    from lightning_dpgan.callbacks import PrivacyBudgetStopping

    strategy = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
    logged = logged_epsilons(strategy, 4, 3)
    assert [step for step, _ in logged] == [2, 3]  # step 3 (index 2) on the cadence, then the last (index 3)
    assert logged[-1][1] == pytest.approx(strategy.epsilon()) and 0 < logged[0][1] < logged[-1][1]
    every = logged_epsilons(DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5), 3, 1)
    assert [step for step, _ in every] == [0, 1, 2]
    budgeted = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, target_epsilon=50.0, delta=1e-5)
    both = logged_epsilons(budgeted, 3, 1, PrivacyBudgetStopping(50.0))
    assert [step for step, _ in both] == [0, 1, 2]  # the budget callback's, not twice a step


class StopAfter(L.Callback):
    """Stops the run after ``steps`` batches, deciding after the callbacks before it, as
    Lightning's Timer (``--trainer.max_time``) does."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if pl_module.train_steps >= self.steps:
            trainer.should_stop = True


def test_a_stop_decided_after_the_budget_callback_logs_the_last_steps_figure_once():
    """Through pl_module.log, Lightning cached the budget callback's figure of the last step on
    the cadence and wrote it again, stale, at the last step when a later callback stopped the
    run, before the callback's own figure for that step. Each step's figure reaches the loggers
    once now, the last one the accountant's."""
    from lightning_dpgan.callbacks import PrivacyBudgetStopping

    budgeted = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, target_epsilon=50.0, delta=1e-5)
    logged = logged_epsilons(budgeted, 100, 3, PrivacyBudgetStopping(50.0), StopAfter(5))
    assert [step for step, _ in logged] == [2, 4]  # batch 3 on the cadence, then the last, batch 5
    assert logged[-1][1] == budgeted.epsilon() and logged[0][1] < logged[-1][1]


def test_ghost_mode_keeps_a_public_gradient_set_aside_first_and_does_not_take_a_nan_for_a_broken_contract():
    """Opacus' ghost clipping calls zero_grad between its two passes, which threw away a public
    gradient set aside before the real pass (hooks mode kept it); and a NaN gradient (a diverged
    critic) never equals itself, so the step blamed the module's passes for it."""
    from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism

    def step_after(public_first: bool, weight: float = 0.5) -> torch.Tensor:
        torch.manual_seed(0)
        critic = nn.Linear(4, 1)
        nn.init.constant_(critic.weight, weight)
        mechanism = DPSGDMechanism(0.0, 1.0, 8, mode="ghost")
        mechanism.attach(critic)
        optimizer = mechanism.wrap_optimizer(torch.optim.SGD(critic.parameters(), lr=1.0))
        optimizer.zero_grad()
        real, fake = torch.ones(8, 4), -torch.ones(8, 4)
        passes = [lambda: mechanism.backward_real(-critic(real).squeeze(1)),
                  lambda: mechanism.backward_public(critic(fake).squeeze(1))]
        for make in (passes[::-1] if public_first else passes):
            make()
        optimizer.step()
        return critic.weight.detach().clone()

    assert torch.allclose(step_after(public_first=True), step_after(public_first=False))
    assert step_after(public_first=False, weight=float("nan")).isnan().all()  # stepped, not refused
