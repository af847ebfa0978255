"""The gradient sanitizer (DP-HOOK / GS-WGAN hook): clipping bound, noise scale, accounting,
and ``gswgan`` end to end."""
import math

import numpy as np
import pytest
import torch
from opacus.accountants.analysis.rdp import get_privacy_spent
from run_helpers import read_json, sanitizer_epsilon, tiny_run_args

from lightning_dpgan.callbacks.gradient_sanitizer import GradientSanitizer, check_generated_batch_memory
from lightning_dpgan.cli import main
from lightning_dpgan.privacy.accountants import GaussianAccountant
from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS
from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism
from lightning_dpgan.privacy.noise_source import NoiseSource


def released_gradient(mechanism, x, loss_fn):
    x = x.clone().requires_grad_()
    loss_fn(mechanism.sanitize(x) if mechanism else x).backward()
    return x.grad


def test_a_non_finite_gradient_row_is_released_as_noise_within_the_bound():
    """A diverged critic's NaN or inf rows came out NaN (clipping multiplied them), unbounded:
    each such row is zeroed, so it is released as the noise alone; finite rows keep their clip."""
    mechanism = GradientSanitizerMechanism(1.0, 1.0, noise=NoiseSource(3))
    gradient = torch.tensor([[1e3, 0.0], [math.inf, 0.0], [math.nan, 1.0]])
    released = mechanism._sanitize_gradient(gradient)
    noise = torch.randn((3, 2), generator=NoiseSource(3).generator()) * (1.0 / 3)  # sigma * C / B, B = 3
    assert torch.isfinite(released).all()
    torch.testing.assert_close(released[1:], noise[1:])
    torch.testing.assert_close(released[0], torch.tensor([1.0 / 3, 0.0]) + noise[0])


def test_no_noise_and_a_huge_bound_give_the_unsanitized_gradient():
    torch.manual_seed(0)
    x, weights = torch.randn(5, 3, 4), torch.randn(3, 4)
    loss = lambda g: ((g * weights).sum(dim=(1, 2)) ** 2).mean()  # noqa: E731
    torch.testing.assert_close(released_gradient(GradientSanitizerMechanism(1e9, 0.0), x, loss), released_gradient(None, x, loss))


def test_each_generated_records_gradient_is_clipped_to_c_over_b():
    torch.manual_seed(1)
    batch, clip = 8, 0.5
    x = torch.randn(batch, 10) * 100
    grad = released_gradient(GradientSanitizerMechanism(clip, 0.0), x, lambda g: (g**2).mean())
    norms = grad.norm(dim=1)
    assert (norms <= clip / batch * (1 + 1e-5)).all()
    assert norms.min() > 0.99 * clip / batch  # every row was far above the bound: all clipped to it


def test_noise_standard_deviation_is_sigma_c_over_b():
    torch.manual_seed(2)
    batch, clip, sigma = 16, 2.0, 3.0
    mechanism = GradientSanitizerMechanism(clip, sigma, noise=NoiseSource(2))  # the noise's own seed: a fixed draw
    grad = released_gradient(mechanism, torch.zeros(batch, 5000), lambda g: (0 * g).sum())
    assert grad.std().item() == pytest.approx(sigma * clip / batch, rel=0.02)
    assert abs(grad.mean().item()) < 0.02 * sigma * clip / batch
    # each row's noise is its own: one draw shared by every row would release the rows'
    # differences without any noise (the pooled spread above cannot tell)
    assert (grad[0] - grad[1]).std().item() == pytest.approx(math.sqrt(2) * sigma * clip / batch, rel=0.05)


def test_each_sanitized_batch_is_charged_once_for_its_size_even_of_one_record():
    releases = []
    mechanism = GradientSanitizerMechanism(1.0, 1.0, on_release=releases.append)
    for batch in (1, 4):
        released_gradient(mechanism, torch.randn(batch, 3), lambda g: g.sum())
    assert releases == [1, 4]


def test_one_step_costs_two_b_lambda_over_sigma_squared():
    """DP-SACTGAN's Theorem 1, converted with Opacus' own RDP-to-(epsilon, delta) function."""
    strategy = GradientSanitizer(noise_multiplier=40.0, target_epsilon=None, delta=1e-5)
    strategy.generated_batch_size = 32
    strategy.preprocessing = {"epsilon": 0.0, "delta": 0.0}
    strategy.train_records = 1000
    for _ in range(3):
        strategy._charge(32)
    orders = np.array(DEFAULT_ORDERS)
    expected, _ = get_privacy_spent(orders=orders, rdp=3 * 2 * 32 * orders / 40.0**2, delta=1e-5)
    assert strategy.epsilon() == pytest.approx(expected, rel=1e-9)
    with pytest.raises(RuntimeError, match="charges batches of 32"):
        strategy._charge(31)


def gswgan_args(data_dir, output_dir, steps=10, *extra, epsilon=8):
    """One critic: the MNIST preset's 1000 critics (GS-WGAN's amplified mode) are tested in test_gswgan_critics."""
    return tiny_run_args(data_dir, output_dir, model="gswgan", steps=steps, batch_size=16) + [
        "--epsilon", str(epsilon), "--delta", "1e-4", "--privacy.num_critics", "1", *extra]


@pytest.fixture(scope="module")
def gswgan_run(tiny_image_data_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("gswgan") / "run"
    assert main(gswgan_args(tiny_image_data_dir, output)) == 0
    return output


def test_gswgan_trains_with_calibrated_noise_and_spends_at_most_the_target(gswgan_run):
    report = read_json(gswgan_run / "privacy.json")
    assert report["generator_steps"] == 2 and report["calibrated_for_steps"] == 2  # 10 batches, 5 critic steps each
    assert report["effective_noise_multiplier"] == pytest.approx(report["noise_multiplier"] / (2 * math.sqrt(16)))
    assert report["epsilon"] == pytest.approx(sanitizer_epsilon(report), rel=1e-9)
    assert 7.9 < report["epsilon"] <= 8.0  # the noise is calibrated to the target, not far above it
    assert (gswgan_run / "samples.png").is_file()
    # one critic (the default): no amplification, the plain Gaussian accountant, add/remove neighbours
    assert report["num_critics"] == 1 and report["sampling_rate"] == 1.0 and "no amplification" in report["mode"]
    assert report["accountant_state"]["mechanism"] == "gaussian" and report["neighbours"] == "add-remove"


def test_one_critic_keeps_the_unamplified_accounting():
    strategy = GradientSanitizer(noise_multiplier=3.0, num_critics=1)
    strategy.generated_batch_size = 8
    assert type(strategy.accountant) is GaussianAccountant and strategy.neighbours == "add-remove"
    assert strategy.next_step_params() == {"noise_multiplier": 3.0 / (2 * math.sqrt(8))}


def gswgan_module():
    from lightning_dpgan.modules.gswgan import GSWGAN

    return GSWGAN((1, 28, 28), 10, latent_dim=8, generator_kwargs={"base_channels": 4},
                  discriminator_kwargs={"base_channels": 4})


@pytest.mark.parametrize("generated,ranks,share", [(8, 2, 4), (4, 2, 2), (4, 1, 4)])
def test_each_process_sanitizes_an_equal_share_of_the_generated_batch(monkeypatch, generated, ranks, share):
    monkeypatch.setattr("lightning_dpgan.callbacks.gradient_sanitizer.world_size", lambda: ranks)
    strategy = GradientSanitizer(noise_multiplier=3.0, generated_batch_size=generated)
    assert strategy._records_per_rank(gswgan_module()) == share


@pytest.mark.parametrize("generated,ranks,message", [
    (6, 4, "must be a multiple of the 4 processes"),
    # GS-WGAN's DCGAN generator normalizes each batch: one record a process could not train
    (2, 2, "gives 1: use --privacy.generated_batch_size 4 or more"),
])
def test_a_generated_batch_the_processes_cannot_share_is_refused(monkeypatch, generated, ranks, message):
    monkeypatch.setattr("lightning_dpgan.callbacks.gradient_sanitizer.world_size", lambda: ranks)
    strategy = GradientSanitizer(noise_multiplier=3.0, generated_batch_size=generated)
    with pytest.raises(ValueError, match=message):
        strategy._records_per_rank(gswgan_module())


def test_a_generated_batch_beyond_the_free_memory_is_refused_before_the_first_step(tiny_image_data_dir, tmp_path, capsys,
                                                                                    monkeypatch):
    """10**11 MNIST-sized records need hundreds of TB: refused by name as the strategy installs
    (it failed mid-step), against the memory of the device training runs on."""
    assert main(gswgan_args(tiny_image_data_dir, tmp_path / "run", 2, "--privacy.generated_batch_size", "100000000000")) == 2
    assert "--privacy.generated_batch_size: 100,000,000,000 generated records" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()
    asked = []
    monkeypatch.setattr("lightning_dpgan.callbacks.gradient_sanitizer.available_memory",
                        lambda device: asked.append(device) or 2**30)
    with pytest.raises(ValueError, match="cuda has 1.0 GiB available"):
        check_generated_batch_memory(10**6, (1, 28, 28), torch.device("cuda", 0))
    assert asked == [torch.device("cuda", 0)]


def test_the_generated_batch_check_measures_the_training_device_and_four_copies(monkeypatch):
    """The module is still on the CPU as the strategy installs: the check must ask the device
    training runs on (a GPU run compared the GPU batch with the host's memory)."""
    from types import SimpleNamespace

    asked = []
    monkeypatch.setattr("lightning_dpgan.callbacks.gradient_sanitizer.available_memory",
                        lambda device: asked.append(device) or 2**30)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(hparams=SimpleNamespace(batch_size=8)),
                              strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    GradientSanitizer(noise_multiplier=3.0, generated_batch_size=16).install(trainer, gswgan_module())
    assert asked == [torch.device("cuda", 0)]
    check_generated_batch_memory(80_000, (1, 28, 28), torch.device("cuda", 0))  # 4 x 80,000 x 784 x 4 bytes: 0.93 GiB
    with pytest.raises(ValueError, match="need at least 11.7 GiB"):
        check_generated_batch_memory(10**6, (1, 28, 28), torch.device("cuda", 0))


def test_the_answering_critic_is_drawn_from_os_entropy_not_from_the_runs_seed():
    """GS-WGAN's amplification needs the answering critic to stay secret; the run's --seed is
    in its config.yaml, so two runs of the same seed must draw different selections."""
    selectors = []
    for _ in range(2):
        torch.manual_seed(0)
        selectors.append(GradientSanitizer(noise_multiplier=3.0, num_critics=1000).critic_selector())
    draws = [torch.randint(1000, (20,), generator=selector) for selector in selectors]
    assert not torch.equal(draws[0], draws[1])
    assert torch.initial_seed() not in {selector.initial_seed() for selector in selectors}
    fixed = GradientSanitizer(noise_multiplier=3.0, num_critics=1000, selection_seed=7).critic_selector()
    assert fixed.initial_seed() == 7  # tests may fix it


def critic_and_generator_gradients(privacy):
    """One GS-WGAN critic step and one generator step, as Lightning would run them, with
    ``privacy`` in the slot; returns the critic's and the generator's gradients and the releases."""
    from lightning_dpgan.modules.gswgan import GSWGAN

    torch.manual_seed(0)
    gswgan = GSWGAN((1, 28, 28), 10, latent_dim=8, generator_kwargs={"base_channels": 4},
                    discriminator_kwargs={"base_channels": 4})
    releases = []
    if privacy is not None:
        gswgan.privacy = GradientSanitizerMechanism(*privacy, on_release=releases.append)
    opt_g = torch.optim.SGD(gswgan.generator.parameters(), lr=0.0)
    opt_d = torch.optim.SGD(gswgan.discriminator.parameters(), lr=0.0)
    gswgan.optimizers = lambda: [opt_g, opt_d]
    gswgan.manual_backward = lambda loss: loss.backward()
    torch.manual_seed(1)
    real, labels = torch.rand(6, 1, 28, 28) * 2 - 1, torch.arange(6) % 10
    gswgan.discriminator_step(real, labels, 6)
    critic = [p.grad.clone() for p in gswgan.discriminator.parameters()]
    critic_releases = list(releases)
    gswgan.generator_step(6)
    generator = [p.grad.clone() for p in gswgan.generator.parameters()]
    return critic, generator, critic_releases, releases


def test_the_critic_trains_without_dp_sgd_and_only_the_generator_side_is_sanitized():
    """GS-WGAN's critics are never released: they train on their partitions unclipped and
    unnoised. What reaches the generator must pass the sanitizer: clipped to (almost) nothing,
    the generator's gradient vanishes, once released per generator step."""
    plain_critic, plain_generator, _, _ = critic_and_generator_gradients(None)
    critic, generator, critic_releases, releases = critic_and_generator_gradients((1e-12, 0.0))
    assert critic_releases == []  # the critic step released nothing through the sanitizer
    for sanitized, plain in zip(critic, plain_critic):
        torch.testing.assert_close(sanitized, plain)  # and its gradient is the plain WGAN-GP one
    assert releases == [6]
    assert sum(g.abs().sum() for g in plain_generator) > 0
    assert all(g.abs().max() < 1e-9 for g in generator)


def test_resume_keeps_the_calibrated_noise(gswgan_run, tiny_image_data_dir, tmp_path, monkeypatch):
    first = read_json(gswgan_run / "privacy.json")
    used = []  # the sigma the mechanism draws its noise with, at each release
    sanitize = GradientSanitizerMechanism._sanitize_gradient
    monkeypatch.setattr(GradientSanitizerMechanism, "_sanitize_gradient",
                        lambda self, gradient: used.append(self.noise_multiplier) or sanitize(self, gradient))
    # the noise was calibrated for 2 generator steps at epsilon 8: a larger target lets a third run
    assert main(gswgan_args(tiny_image_data_dir, tmp_path / "resumed", 15, "--resume",
                            str(gswgan_run / "checkpoints" / "last.ckpt"), epsilon=20)) == 0
    resumed = read_json(tmp_path / "resumed" / "privacy.json")
    assert resumed["noise_multiplier"] == first["noise_multiplier"]
    # the restored sigma reached the mechanism, not only the report: a larger target would
    # otherwise recalibrate the noise down while the accountant charges the checkpoint's
    assert used and set(used) == {first["noise_multiplier"]}
    assert resumed["generator_steps"] == 3 and 8.0 < resumed["epsilon"] <= 20.0
    assert resumed["epsilon"] == pytest.approx(sanitizer_epsilon(resumed), rel=1e-9)  # all 3 steps charged


def test_a_zero_noise_multiplier_is_refused(tiny_image_data_dir, tmp_path, capsys):
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "bad", model="gswgan") + ["--privacy", "sanitizer"]
    for target in ([], ["--epsilon", "1"]):  # 0 is refused as it is, not read as "not given"
        assert main(args + target + ["--privacy.noise_multiplier", "0"]) == 2
        assert "--privacy.noise_multiplier must be a finite number > 0, got 0" in capsys.readouterr().err


def test_a_generated_batch_other_than_the_real_one_trains(tiny_image_data_dir, tmp_path):
    """The gradient penalty mixes real and generated records of different counts."""
    assert main(gswgan_args(tiny_image_data_dir, tmp_path / "run", 5, "--privacy.generated_batch_size", "6")) == 0
    report = read_json(tmp_path / "run" / "privacy.json")
    # the step was charged for 6 sanitized records (the charge refuses any other count), not the 16 real ones
    assert report["generated_batch_size"] == 6 and report["generator_steps"] == 1
    assert report["effective_noise_multiplier"] == pytest.approx(report["noise_multiplier"] / (2 * math.sqrt(6)))


def test_the_reports_effective_noise_is_the_last_charged_steps_after_a_resume_that_changed_the_batch():
    from lightning_dpgan.callbacks.gradient_sanitizer import GradientSanitizer

    strategy = GradientSanitizer(noise_multiplier=2.0, generated_batch_size=16)
    for _ in range(3):
        strategy._charge(16)
    strategy.generated_batch_size = 64  # the resumed run's batch, no step taken at it
    # sigma / (2 sqrt(B)) at the charged steps' B = 16 (GS-WGAN's mean of B records, sensitivity 2C / B)
    assert strategy.report_parameters()["effective_noise_multiplier"] == pytest.approx(2.0 / (2 * math.sqrt(16)))


def test_a_resume_that_takes_no_step_reports_the_noise_its_steps_had(gswgan_run, tiny_image_data_dir, tmp_path,
                                                                     capsys):
    """Another --privacy.noise_multiplier and clip norm given to a resume that takes no step: the
    report said the new sigma beside the effective multiplier of the checkpoint's steps (0.75,
    from its sigma), and the new clip norm; the checkpoint kept the new sigma for the next resume;
    and a note called the new sigma "set, not calibrated", of steps it never noised."""
    first = read_json(gswgan_run / "privacy.json")
    capsys.readouterr()
    assert main(gswgan_args(tiny_image_data_dir, tmp_path / "idle", 10, "--resume",  # the run's 10 batches: no more
                            str(gswgan_run / "checkpoints" / "last.ckpt"), "--privacy.noise_multiplier", "1",
                            "--privacy.max_norm", "3")) == 0
    assert "was set" not in capsys.readouterr().err
    idle = read_json(tmp_path / "idle" / "privacy.json")
    assert idle["generator_steps"] == first["generator_steps"]
    assert idle["noise_multiplier"] == first["noise_multiplier"] != 1
    assert idle["max_norm"] == first["max_norm"] != 3
    assert idle["calibrated_for_steps"] == first["calibrated_for_steps"] == 2
    checkpoint = torch.load(tmp_path / "idle" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (state,) = [value for key, value in checkpoint["callbacks"].items() if "GradientSanitizer" in key]
    assert (state["noise_multiplier"], state["calibrated_for_steps"]) == (first["noise_multiplier"], 2)
    assert idle["effective_noise_multiplier"] == pytest.approx(
        idle["noise_multiplier"] / (2 * idle["generated_batch_size"] ** 0.5), rel=1e-12)


def test_a_one_critic_run_ended_by_its_calibrated_budget_says_so_as_planned(tiny_image_data_dir, tmp_path, capsys):
    """--max-epochs 1 of 8 batches plans 1 generator step (the critic takes 5 a step): after it the
    3 remaining batches would train the critic alone, so the budget ends the run there. The line
    said 'one more step would spend more', as if the run had been cut short."""
    args = gswgan_args(tiny_image_data_dir, tmp_path / "run", 1, "--max-epochs", "1", "--batch-size", "20")
    del args[args.index("--max-steps"):args.index("--max-steps") + 2]
    assert main(args) == 0
    report = read_json(tmp_path / "run" / "privacy.json")
    assert report["stopped_by"] == "budget" and report["calibrated_for_steps"] == report["generator_steps"] == 1
    assert ("training stopped after 5 steps: the privacy budget, as planned: the noise was calibrated for the 1 "
            "generator step taken") in capsys.readouterr().out
