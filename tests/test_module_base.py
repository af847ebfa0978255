"""``GANModule``'s own behaviour, below the models: the latent and label draws, ``sample``'s
checks and modes, the settings a resume must match, and what a training step logs."""
import copy
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_dpgan.modules import GAN, WGAN
from lightning_dpgan.modules.base import check_fits_datamodule, check_same_model_settings
from lightning_dpgan.modules.gpate import GPATE
from lightning_dpgan.modules.gswgan import GSWGAN
from lightning_dpgan.privacy.slots import PrivacyBudgetExhausted
from run_helpers import train_outside_a_trainer

TABLE = {"latent_dim": 3, "generator_kwargs": {"hidden": (8,)}, "discriminator_kwargs": {"hidden": (8,)}}


@pytest.mark.parametrize("setting", [{"latent_dim": 0}, {"discriminator_steps": 0}])
def test_a_zero_latent_size_or_critic_schedule_is_refused_up_front(setting):
    """A generator without noise draws one record over and over; 0 discriminator steps would
    divide by zero in the schedule. Both are refused when the module is built."""
    (name, value), = setting.items()
    with pytest.raises(ValueError, match=f"^--model.{name} must be at least 1, got {value}$"):  # the flag, alone
        GAN((4,), None, **{**TABLE, **setting})


def test_the_normal_latent_is_standard_normal():
    """``normal`` is N(0, 1) (the uniform one is checked in test_modules): centred, unit spread,
    negative half the time -- not U[0, 1], which has mean 1/2 and no negative values."""
    torch.manual_seed(0)
    z = GAN((4,), None, **TABLE).sample_latent(20000)
    assert z.shape == (20000, 3)
    assert abs(z.mean().item()) < 0.03 and abs(z.std().item() - 1) < 0.03
    assert abs((z < 0).float().mean().item() - 0.5) < 0.02


def test_generated_labels_are_uniform_over_every_class():
    """The generator's labels read no data: every class, the last included, equally often."""
    torch.manual_seed(0)
    labels = GAN((4,), 5, **TABLE).sample_labels(20000)
    shares = torch.bincount(labels, minlength=5).float() / 20000
    assert labels.min() == 0 and labels.max() == 4
    torch.testing.assert_close(shares, torch.full((5,), 0.2), atol=0.015, rtol=0)


@pytest.mark.parametrize("labels", [[-1, 0], [0, 1, 2], [0.5, 1.0], [True, False]])
def test_sample_refuses_negative_fractional_or_boolean_labels_and_a_count_other_than_n(labels):
    """A label below 0 would index the embedding from its end (or fail deep in torch), and 0.5
    was drawn as class 0; the caller is told what labels ``sample`` takes."""
    module = GAN((4,), 3, **TABLE)
    with pytest.raises(ValueError, match=r"labels must be 2 class indices \(whole numbers\) in \[0, 3\)"):
        module.sample(2, torch.tensor(labels))
    assert module.sample(2, [2.0, 1]).shape == (2, 4)  # whole numbers written as floats are classes


def test_sampling_runs_the_generator_in_eval_mode_and_leaves_its_statistics_alone():
    """The MLP generator has BatchNorm. ``sample`` (what the sample callbacks call during
    training) must use its running statistics, not the drawn batch's: a record must not depend
    on the others drawn with it, one record must be drawable, and drawing must not move the
    statistics the model trains with."""
    torch.manual_seed(0)
    module = GAN((4,), None, **TABLE)
    assert module.generator_normalizes_batches
    buffers = {name: b.clone() for name, b in module.generator.named_buffers()}
    evaluated = copy.deepcopy(module.generator).eval()
    assert module.sample(1).shape == (1, 4)  # BatchNorm in training mode refuses a batch of 1
    torch.manual_seed(1)
    many = module.sample(50)
    torch.manual_seed(1)
    latent = module.sample_latent(50)
    with torch.no_grad():
        torch.testing.assert_close(many, evaluated(latent, None))
        torch.testing.assert_close(many[:1], evaluated(latent[:1], None))  # each record on its own
    for name, buffer in module.generator.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    assert module.generator.training


def test_sampling_leaves_an_evaluated_generator_in_eval_mode():
    module = GAN((4,), None, **TABLE)
    module.generator.eval()
    module.sample(4)
    assert not module.generator.training


def test_a_setting_the_checkpoint_does_not_have_is_a_difference_too():
    """The comparison covers the keys of both sides: a setting this run has and the checkpoint's
    model lacks is refused like one with another value; tuples and lists of the same values are
    the same setting (YAML gives lists, Python tuples)."""
    check_same_model_settings({"betas": (0.5, 0.9)}, {"betas": [0.5, 0.9]})  # no error
    with pytest.raises(ValueError, match=r"pac None \(this run: 2\)"):
        check_same_model_settings({"latent_dim": 8}, {"latent_dim": 8, "pac": 2})
    with pytest.raises(ValueError, match=r"latent_dim 8 \(this run: 12\).*--model.latent_dim"):
        check_same_model_settings({"latent_dim": 8}, {"latent_dim": 12})


def test_the_logged_discriminator_loss_is_the_real_and_the_generated_parts():
    """``loss/discriminator`` is the loss the critic took its step on: real records' mean loss
    plus the generated records' (for a WGAN critic, E[D(fake)] - E[D(real)]), as computed
    independently here with the step's own draws."""
    torch.manual_seed(0)
    module = WGAN((4,), None, weight_clip=0.0, **TABLE)
    logged = train_outside_a_trainer(module)
    real = torch.randn(6, 4)
    critic = [p.detach().clone() for p in module.discriminator.parameters()]
    generator = {k: v.clone() for k, v in module.generator.state_dict().items()}
    torch.manual_seed(5)
    module.training_step(real, 0)

    torch.manual_seed(5)
    torch.randint(0, 2**62, (1,))  # the draw that seeds the real records' stream in training_step
    latent = module.sample_latent(6)
    reference = WGAN((4,), None, weight_clip=0.0, **TABLE)
    reference.generator.load_state_dict(generator)
    with torch.no_grad():
        for p, q in zip(reference.discriminator.parameters(), critic):
            p.copy_(q)
        fake = reference.generator(latent, None)
        expected = reference.discriminator(fake, None).mean() - reference.discriminator(real, None).mean()
    assert "loss/generator" not in logged  # 5 critic steps to a generator step
    torch.testing.assert_close(logged["loss/discriminator"], expected)


def test_a_gpate_step_whose_release_is_refused_takes_no_generator_step():
    """When the aggregator refuses a release (the budget would be passed), the step ends there:
    the run is told to stop, the generator is not updated (not even by Adam's momentum from the
    steps before, on a zero loss) and the step is not counted as one taken."""
    torch.manual_seed(0)
    module = GPATE((6,), None, num_teachers=2, latent_dim=4, teacher_kwargs={"hidden": ()})
    train_outside_a_trainer(module)
    module._trainer = SimpleNamespace(should_stop=False)
    released = SimpleNamespace(aggregate=lambda perturbations: torch.full_like(perturbations[0], 1e-2))
    module.privacy = released
    batch = ([torch.rand(2, 4, 6)], None)
    module.training_step(batch, 0)  # one answered step: Adam now has momentum
    assert module.train_steps == 1 and not module._trainer.should_stop

    def refuse(perturbations):
        raise PrivacyBudgetExhausted("no budget left")

    module.privacy = SimpleNamespace(aggregate=refuse)
    generator = [p.detach().clone() for p in module.generator.parameters()]
    module.training_step(batch, 1)
    assert module._trainer.should_stop and module.train_steps == 1
    assert all(torch.equal(a, p) for a, p in zip(generator, module.generator.parameters()))


def test_a_setting_the_strategy_decides_reaches_the_loggers_copy_too():
    """``num_critics`` is set by the sanitizer strategy after the module is built: the saved
    settings and the copy Lightning hands the loggers (``hparams_initial``) must both say 3,
    not the constructor's 1."""
    module = GSWGAN((4,), None, **TABLE)
    assert module.hparams_initial["num_critics"] == 1
    module.build_critics(3)
    assert module.hparams["num_critics"] == module.hparams_initial["num_critics"] == 3


@pytest.mark.parametrize("module, said", [
    (lambda: GAN((1, 28, 28), 20, latent_dim=4), "built for 20 classes, and the datamodule has 10"),
    (lambda: GAN((1, 32, 32), 10, latent_dim=4), "built for records of shape (1, 32, 32), and the datamodule's are (1, 28, 28)"),
], ids=["classes", "shape"])
def test_a_module_built_by_hand_for_other_data_is_refused_before_its_first_step(tiny_image_data_dir, tmp_path,
                                                                               module, said):
    """Twenty classes on MNIST trained and then drew classes 10-19, which do not exist; another
    image size failed in torch's matmul at the first step."""
    import lightning as L

    from lightning_dpgan.datamodules.mnist import MNISTDataModule

    built = module()
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=16, verify_checksums=False)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=re.escape(said)):
        trainer.fit(built, datamodule=data)
    assert built.train_steps == 0


def test_a_table_module_built_for_another_width_is_refused_once_the_data_is_set_up(tmp_path):
    """DPGAN((7,), 2) on Adult failed in torch ("mat1 and mat2 shapes cannot be multiplied") at the
    first step; the width is known, at no cost, once the datamodule is set up, before the module's
    setup. Asked before, a mode-specific datamodule would draw its DP release to answer."""
    import lightning as L

    from lightning_dpgan.datamodules import AdultDataModule

    data = AdultDataModule(data_dir=Path(__file__).parent / "fixtures" / "adult_tiny", batch_size=8)
    built = GAN((7,), data.num_classes, arch="mlp", latent_dim=4)
    check_fits_datamodule(built, data)  # not set up: its width is not asked for
    assert data.train_dataset is None
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"built for records of shape (7,), and the datamodule's are "
                                                   f"{tuple(data.data_shape)}: build it with data_shape=datamodule.data_shape")):
        trainer.fit(built, datamodule=data)
    assert built.train_steps == 0


def test_fewer_classes_unconditional_and_unset_datamodules_are_judged_as_they_should_be():
    mnist = SimpleNamespace(kind="image", data_shape=(1, 28, 28), num_classes=10)
    with pytest.raises(ValueError, match="built for 5 classes"):
        check_fits_datamodule(GAN((1, 28, 28), 5, latent_dim=4), mnist)
    check_fits_datamodule(GAN((1, 28, 28), 10, conditional=False, latent_dim=4), mnist)  # ignores the labels: fine
    check_fits_datamodule(GAN((1, 28, 28), 10, latent_dim=4), None)  # fitted on dataloaders: nothing to compare
    check_fits_datamodule(GAN((1, 28, 28), 10, latent_dim=4), SimpleNamespace())  # a user's own: classes not declared
    with pytest.raises(ValueError, match="built for 10 classes, and the datamodule has none"):
        check_fits_datamodule(GAN((1, 28, 28), 10, latent_dim=4), SimpleNamespace(num_classes=None))  # a table's
    with pytest.raises(ValueError, match="num_classes must be an integer >= 0, got 2.5"):
        GAN((1, 28, 28), 2.5)


def test_a_resume_under_another_table_layout_names_the_python_remedy():
    """From Python a fresh table datamodule drew its own DP encoding, and the refusal spoke only of
    --model flags and --resume."""
    with pytest.raises(ValueError, match=r"from Python, build the module with the checkpoint's hyper_parameters; from "
                                         r"Python, a table datamodule built afresh draws its own DP encoding: call its "
                                         r"restore_releases\(checkpoint\) before reading its table_layout\), or drop "
                                         r"--resume \(ckpt_path\)"):
        check_same_model_settings({"table_layout": {"spans": [[1, "tanh"]]}}, {"table_layout": {"spans": [[2, "tanh"]]}})
    with pytest.raises(ValueError) as refused:
        check_same_model_settings({"latent_dim": 4}, {"latent_dim": 8})
    assert "restore_releases" not in str(refused.value)  # only where the table's encoding differs
