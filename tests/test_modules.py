"""GAN and WGAN modules: training changes what it should, sampling is well formed."""
import lightning as L
import pytest
import torch

from lightning_dpgan.callbacks.step_limit import StepLimit
from lightning_dpgan.datamodules.mnist import MNISTDataModule
from lightning_dpgan.modules import GAN, WGAN

TINY_NETS = {
    "generator_kwargs": {"base_channels": 8},
    "discriminator_kwargs": {"base_channels": 8},
    "latent_dim": 16,
}


def _fit(module, data_dir, steps):
    datamodule = MNISTDataModule(data_dir=data_dir, batch_size=32, verify_checksums=False)
    trainer = L.Trainer(
        max_steps=-1,
        max_epochs=-1,
        callbacks=[StepLimit(steps)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, datamodule=datamodule)
    datamodule.setup("fit")
    return trainer, datamodule


def _copy_params(net):
    return [p.detach().clone() for p in net.parameters()]


def _changed(before, net):
    return any(not torch.equal(b, p) for b, p in zip(before, net.parameters()))


def test_gan_training_updates_both_nets_and_discriminator_learns(tiny_image_data_dir):
    torch.manual_seed(0)
    module = GAN((1, 28, 28), 10, **TINY_NETS)
    g_before, d_before = _copy_params(module.generator), _copy_params(module.discriminator)
    datamodule = MNISTDataModule(data_dir=tiny_image_data_dir, verify_checksums=False)
    datamodule.setup("fit")
    real, labels = datamodule.train_dataset.tensors
    real, labels = real[:64], labels[:64]

    def discriminator_loss():
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(1)
            fake_labels = module.sample_labels(64)
            fake = module.generator(module.sample_latent(64), fake_labels)
            return module.discriminator_loss(module.discriminator(real, labels), module.discriminator(fake, fake_labels)).item()

    def separation():
        """How much more real the discriminator finds real records than generated ones, in
        probability: measured outside the loss it trains on."""
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(1)
            fake_labels = module.sample_labels(64)
            fake = module.generator(module.sample_latent(64), fake_labels)
            real_p = torch.sigmoid(module.discriminator(real, labels)).mean()
            return (real_p - torch.sigmoid(module.discriminator(fake, fake_labels)).mean()).item()

    loss_before, separation_before = discriminator_loss(), separation()
    trainer, _ = _fit(module, tiny_image_data_dir, steps=15)
    assert module.train_steps == 15
    assert _changed(g_before, module.generator) and _changed(d_before, module.discriminator)
    assert {"loss/discriminator", "loss/generator"} <= set(trainer.callback_metrics)
    assert discriminator_loss() < loss_before and separation() > separation_before


@pytest.mark.parametrize("cls", [GAN, WGAN])
def test_each_loss_moves_its_network_the_way_a_gan_needs(cls):
    """A few plain gradient steps on each loss alone, the other network fixed: the
    discriminator's raises its scores of real records over generated ones, the generator's raises
    the scores of its records. A swapped target or sign passes every "parameters changed" check."""
    torch.manual_seed(0)
    module = cls((6,), None, latent_dim=4)
    real, latent = torch.randn(64, 6) + 2.0, module.sample_latent(64)
    generator, discriminator = module.generator, module.discriminator

    def gap():
        with torch.no_grad():
            return (discriminator(real, None).mean() - discriminator(generator(latent, None), None).mean()).item()

    def fake_score():
        with torch.no_grad():
            return discriminator(generator(latent, None), None).mean().item()

    before = gap()
    optimizer = torch.optim.SGD(discriminator.parameters(), lr=0.01)
    for _ in range(5):
        optimizer.zero_grad()
        fake = generator(latent, None).detach()
        loss = module.discriminator_real_loss(discriminator(real, None)).mean() + \
            module.discriminator_fake_loss(discriminator(fake, None)).mean()
        loss.backward()
        optimizer.step()
    assert gap() > before
    before = fake_score()
    optimizer = torch.optim.SGD(generator.parameters(), lr=0.01)
    for _ in range(5):
        optimizer.zero_grad()
        module.generator_loss(discriminator(generator(latent, None), None)).backward()
        optimizer.step()
    assert fake_score() > before


def test_wgan_critic_separates_real_from_fake_and_weights_stay_clipped(tiny_image_data_dir):
    torch.manual_seed(0)
    module = WGAN((1, 28, 28), 10, weight_clip=0.05, lr_discriminator=5e-4, **TINY_NETS)
    datamodule = MNISTDataModule(data_dir=tiny_image_data_dir, verify_checksums=False)
    datamodule.setup("fit")
    real, labels = datamodule.train_dataset.tensors[0][:64], datamodule.train_dataset.tensors[1][:64]

    def critic_gap():
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(1)
            fake = module.generator(module.sample_latent(64), labels)
            return (module.discriminator(real, labels).mean() - module.discriminator(fake, labels).mean()).item()

    gap_before = critic_gap()
    g_before = _copy_params(module.generator)
    changed_at = []

    class GeneratorSteps(L.Callback):
        """The batches after which the generator's weights had moved."""

        def __init__(self):
            self.last = _copy_params(module.generator)

        def on_train_batch_end(self, trainer, pl_module, *args):
            if _changed(self.last, module.generator):
                changed_at.append(pl_module.train_steps)
            self.last = _copy_params(module.generator)

    trainer = L.Trainer(max_steps=-1, max_epochs=-1, callbacks=[StepLimit(10), GeneratorSteps()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    trainer.fit(module, datamodule=MNISTDataModule(data_dir=tiny_image_data_dir, batch_size=32, verify_checksums=False))
    assert critic_gap() > gap_before
    assert _changed(g_before, module.generator)
    assert changed_at == [5, 10]  # 10 batches, 5 critic steps to each generator step
    assert max(p.abs().max().item() for p in module.discriminator.parameters()) <= 0.05 + 1e-7


class LinearCritic(torch.nn.Module):
    """D(x) = w . x (gradient w everywhere) or, ``quadratic``, |x|^2 / 2 (gradient x)."""

    def __init__(self, w, quadratic=False):
        super().__init__()
        self.w, self.quadratic = torch.nn.Parameter(w), quadratic

    def forward(self, x, labels=None):
        return 0.5 * (x * x).sum(1) if self.quadratic else x @ self.w


def test_wgan_gradient_penalty_has_its_closed_form_at_the_interpolated_records():
    """WGAN-GP's lambda (|grad D(x_mix)| - 1)^2, x_mix = a real + (1 - a) fake: for a linear
    critic lambda (|w| - 1)^2 for every record; for |x|^2 / 2, whose gradient is x_mix itself,
    real = v and fake = -v give lambda (|2a - 1| |v| - 1)^2 with the penalty's own draws of a."""
    from lightning_dpgan.modules.wgan import gradient_penalty

    w = torch.tensor([3.0, 4.0, 0.0])  # |w| = 5
    real, fake = torch.randn(8, 3), torch.randn(8, 3)
    linear = gradient_penalty(LinearCritic(w), real, None, fake, 10.0)
    assert torch.allclose(linear, torch.full((8,), 10.0 * 16.0))
    v = torch.tensor([[1.0, 2.0, 2.0]]).repeat(8, 1)  # |v| = 3
    torch.manual_seed(3)
    alpha = torch.rand(8, 1)
    torch.manual_seed(3)
    quadratic = gradient_penalty(LinearCritic(w, quadratic=True), v, None, -v, 10.0)
    expected = 10.0 * ((2 * alpha[:, 0] - 1).abs() * 3.0 - 1) ** 2
    assert torch.allclose(quadratic, expected, atol=1e-5)


def test_wgan_gradient_penalty_is_positive_and_differentiable():
    torch.manual_seed(0)
    module = WGAN((6,), None, gradient_penalty=10.0, latent_dim=4)
    real, fake = torch.randn(8, 6), torch.randn(8, 6)
    penalty = module.discriminator_penalty(real, None, fake, None)
    assert penalty.shape == (8,)  # one term per real record: DP-SGD clips per record
    penalty = penalty.mean()
    assert penalty.item() > 0
    penalty.backward()
    first_layer = module.discriminator.body[0]
    assert first_layer.weight.grad is not None and first_layer.weight.grad.abs().sum() > 0


def test_a_gradient_penaltys_weights_leave_the_runs_stream_where_a_batch_of_any_size_would():
    """WGAN-GP draws one interpolation weight per real record: under Poisson sampling a private
    count. After a discriminator step on 0, 5 or 9 real records the run's stream is at the same
    place (as test_ctgan_models checks for CTGAN's conditions and dropout)."""
    from run_helpers import stream_after_training_steps

    module = WGAN((6,), None, gradient_penalty=10.0, latent_dim=4)
    empty, five, nine = stream_after_training_steps(module, torch.randn(9, 6))
    assert torch.equal(five, nine) and torch.equal(empty, nine)


def test_generator_step_leaves_discriminator_without_gradients(tiny_image_data_dir):
    """``generator_step`` must not deposit gradients on the discriminator: under DP-SGD such
    gradients would bypass clipping and noise. It must also hand the discriminator back trainable."""
    torch.manual_seed(0)
    module = GAN((1, 28, 28), 10, **TINY_NETS)
    _fit(module, tiny_image_data_dir, steps=2)
    for p in module.discriminator.parameters():
        p.grad = None
    opt_g = torch.optim.SGD(module.generator.parameters(), lr=0.0)
    module.optimizers = lambda: [opt_g, None]  # the step as Lightning would run it, without a Trainer
    module.manual_backward = lambda loss: loss.backward()
    module.generator_step(4)
    assert all(p.grad is None for p in module.discriminator.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.generator.parameters())
    assert all(p.requires_grad for p in module.discriminator.parameters())


def test_sample_shapes_ranges_and_labels():
    torch.manual_seed(0)
    module = GAN((1, 28, 28), 10, **TINY_NETS)
    images = module.sample(25)
    assert images.shape == (25, 1, 28, 28)
    assert images.min() >= -1 and images.max() <= 1
    assert module.generator.training  # sampling restores the mode it found
    assert torch.equal(module.balanced_labels(12), torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]))
    with pytest.raises(ValueError, match="class indices"):
        module.sample(2, torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="at least 1"):
        module.sample(0)


def test_unconditional_model_ignores_labels_and_refuses_them():
    module = GAN((1, 28, 28), 10, conditional=False, **TINY_NETS)
    assert module.num_classes is None
    records, labels = module.unpack_batch((torch.zeros(2, 1, 28, 28), torch.tensor([1, 2])))
    assert labels is None
    with pytest.raises(ValueError, match="unconditional"):
        module.sample(2, torch.tensor([0, 1]))


def test_uniform_latent_lies_in_unit_cube():
    module = GAN((4,), None, latent_distribution="uniform", latent_dim=3)
    z = module.sample_latent(1000)
    assert z.min() >= 0 and z.max() <= 1 and abs(z.mean().item() - 0.5) < 0.05
    with pytest.raises(ValueError, match="latent_distribution"):
        GAN((4,), None, latent_distribution="cauchy")


def test_draws_on_real_records_come_from_a_stream_of_their_own_and_the_runs_goes_on_unshifted():
    """Inside, a stream seeded by one draw from the run's; after it, the run's stream as if one
    number had been drawn: never the same numbers as the run's next draws (the generator's
    latents), which a private number of draws on real records would otherwise shift."""
    module = WGAN((6,), None, latent_dim=4)
    torch.manual_seed(3)
    with module.real_records_stream():
        inside = torch.rand(5)
    after = torch.rand(5)
    torch.manual_seed(3)
    torch.randint(0, 2**62, (1,))  # the one draw that seeds the stream
    assert torch.equal(after, torch.rand(5)) and not torch.equal(inside, after)


TABLE_NETS = {"latent_dim": 3, "generator_kwargs": {"hidden": (8,)}, "discriminator_kwargs": {"hidden": (8,)}}


def test_weight_clipping_is_symmetric_and_only_without_a_gradient_penalty():
    """WGAN's clipping keeps every critic weight in [-c, c] (a negative weight stays negative,
    at -c); with a gradient penalty the penalty is the Lipschitz constraint and weights are not
    clipped. A negative clip, which would silently turn clipping off, is refused."""
    clipped = WGAN((4,), None, weight_clip=0.01, **TABLE_NETS)
    penalised = WGAN((4,), None, weight_clip=0.01, gradient_penalty=10.0, **TABLE_NETS)
    for module in (clipped, penalised):
        with torch.no_grad():
            for p in module.discriminator.parameters():
                p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape))
        module.after_discriminator_step()
    for p in clipped.discriminator.parameters():
        expected = torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape).clamp(-0.01, 0.01)
        assert torch.equal(p.detach(), expected)
    for p in penalised.discriminator.parameters():
        assert torch.equal(p.detach(), torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape))
    with pytest.raises(ValueError, match="non-negative"):
        WGAN((4,), None, weight_clip=-0.01, **TABLE_NETS)


def test_the_generators_gan_loss_is_the_non_saturating_one():
    """-log D(G(z)) averaged, D = sigmoid(score), written out independently: not the saturating
    log(1 - D(G(z))), whose gradient vanishes where the discriminator rejects the records."""
    module = GAN((4,), None, **TABLE_NETS)
    scores = torch.tensor([-8.0, -1.0, 0.0, 2.0])
    expected = -torch.log(torch.sigmoid(scores)).mean()
    torch.testing.assert_close(module.generator_loss(scores), expected)


def test_each_network_gets_its_own_optimizer_settings():
    """GAN: Adam with each network's own learning rate and the given betas. WGAN: RMSProp with
    weight clipping (DPGAN's setting), WGAN-GP's Adam betas (0, 0.9) with a gradient penalty."""
    gan = GAN((4,), None, lr_generator=1e-3, lr_discriminator=3e-4, betas=(0.3, 0.8), **TABLE_NETS)
    opt_g, opt_d = gan.build_optimizers()
    assert isinstance(opt_g, torch.optim.Adam) and isinstance(opt_d, torch.optim.Adam)
    assert (opt_g.defaults["lr"], opt_d.defaults["lr"]) == (1e-3, 3e-4)
    assert opt_g.defaults["betas"] == opt_d.defaults["betas"] == (0.3, 0.8)
    assert opt_g.param_groups[0]["params"] == list(gan.generator.parameters())
    assert opt_d.param_groups[0]["params"] == list(gan.discriminator.parameters())
    clipped = WGAN((4,), None, lr_generator=1e-3, lr_discriminator=3e-4, **TABLE_NETS).build_optimizers()
    assert all(isinstance(o, torch.optim.RMSprop) for o in clipped)
    assert [o.defaults["lr"] for o in clipped] == [1e-3, 3e-4]
    penalised = WGAN((4,), None, lr_generator=1e-3, lr_discriminator=3e-4, gradient_penalty=10.0,
                     **TABLE_NETS).build_optimizers()
    assert all(isinstance(o, torch.optim.Adam) and o.defaults["betas"] == (0.0, 0.9) for o in penalised)
    assert [o.defaults["lr"] for o in penalised] == [1e-3, 3e-4]
