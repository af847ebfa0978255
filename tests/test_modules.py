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

    loss_before = discriminator_loss()
    trainer, _ = _fit(module, tiny_image_data_dir, steps=15)
    assert module.train_steps == 15
    assert _changed(g_before, module.generator) and _changed(d_before, module.discriminator)
    assert {"loss/discriminator", "loss/generator"} <= set(trainer.callback_metrics)
    assert discriminator_loss() < loss_before


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
    _fit(module, tiny_image_data_dir, steps=10)
    assert critic_gap() > gap_before
    assert _changed(g_before, module.generator)  # 10 batches, 5 critic steps each: 2 generator steps
    assert max(p.abs().max().item() for p in module.discriminator.parameters()) <= 0.05 + 1e-7


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
