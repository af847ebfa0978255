"""The DP-SGD mechanism itself: clipping bound, noise scale, the public (generated-data)
gradient, empty Poisson batches. Each test would fail if that part of the mechanism broke."""
import copy

import pytest
import torch

from lightning_dpgan.nets import build_networks
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism


def _critic(seed=0):
    torch.manual_seed(seed)
    _, critic = build_networks("dcgan", (1, 8, 8), latent_dim=2, num_classes=3, discriminator_kwargs={"base_channels": 4})
    return critic


def _batch(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _private_update(critic, real, fake, sigma, clip, expected_batch, seed=0, calls=None):
    """One discriminator update the way GANModule does it; returns the gradient applied."""
    mechanism = DPSGDMechanism(sigma, clip, expected_batch, on_noisy_step=(lambda: calls.append(1)) if calls is not None else None,
                               generator=torch.Generator().manual_seed(seed))
    mechanism.attach(critic)
    optimizer = mechanism.wrap_optimizer(torch.optim.SGD(critic.parameters(), lr=1.0))
    before = [p.detach().clone() for p in critic.parameters()]
    optimizer.zero_grad()
    if fake is not None:
        with mechanism.public_pass():
            critic(*fake).mean().backward()
    if real is not None:
        (-critic(*real)).mean().backward()
    optimizer.step()
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, critic.parameters())])


def _plain_gradient(critic, real, fake):
    critic.zero_grad()
    loss = critic(*fake).mean() - critic(*real).mean()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in critic.parameters()])


def test_no_noise_and_huge_clip_bound_give_the_non_private_gradient():
    critic = _critic()
    real, fake = _batch(6, 1), _batch(6, 2)
    expected = _plain_gradient(copy.deepcopy(critic), real, fake)
    applied = _private_update(critic, real, fake, sigma=0.0, clip=1e6, expected_batch=6)
    assert torch.allclose(applied, expected, atol=1e-6)


def test_each_real_records_gradient_is_clipped_to_the_bound():
    """With one record per batch and no noise, the update is that record's clipped gradient."""
    clip = 1e-3
    norms = []
    for seed in range(5):
        critic = _critic()
        real = _batch(1, seed)
        raw = _plain_gradient(copy.deepcopy(critic), real, (real[0][:0], real[1][:0]))
        applied = _private_update(critic, real, None, sigma=0.0, clip=clip, expected_batch=1)
        assert raw.norm() > clip  # the test only means something if clipping had to act
        norms.append(applied.norm().item())
        cosine = torch.dot(applied, raw) / (applied.norm() * raw.norm())
        assert cosine > 1 - 1e-4, cosine  # the direction is kept
    assert max(norms) <= clip * (1 + 1e-4) and min(norms) >= clip * 0.999


def test_generated_data_gradient_is_not_clipped():
    """The public part is added after the noise, whole: clipping it would waste utility, and
    pairing it with a real record's row would break the sensitivity bound."""
    critic = _critic()
    fake = _batch(5, 3)
    expected = _plain_gradient(copy.deepcopy(critic), (fake[0][:0], fake[1][:0]), fake)
    applied = _private_update(critic, None, fake, sigma=0.0, clip=1e-8, expected_batch=5)
    assert torch.allclose(applied, expected, atol=1e-6)


def test_noise_standard_deviation_is_sigma_times_clip_over_expected_batch():
    sigma, clip, batch = 1.5, 0.2, 4
    real = _batch(batch, 4)
    clean = _private_update(_critic(), real, None, sigma=0.0, clip=clip, expected_batch=batch)
    noisy = torch.cat([_private_update(_critic(), real, None, sigma=sigma, clip=clip, expected_batch=batch, seed=s) for s in range(5)])
    noise = (noisy.view(5, -1) - clean).flatten() * batch  # undo the division by the expected batch size
    assert noise.numel() > 4000
    assert abs(noise.std().item() / (sigma * clip) - 1) < 0.05
    assert abs(noise.mean().item()) < 0.05 * sigma * clip


def test_empty_batch_still_releases_noise_and_is_charged():
    """Poisson sampling can draw no record; the step must still be noisy (Opacus' optimizer
    would skip the noise there) and the accountant must still be charged."""
    calls = []
    applied = _private_update(_critic(), None, None, sigma=2.0, clip=1.0, expected_batch=4, calls=calls)
    assert calls == [1]
    assert abs(applied.std().item() / (2.0 * 1.0 / 4) - 1) < 0.15


def test_accountant_hook_fires_once_per_noisy_step():
    calls = []
    _private_update(_critic(), _batch(3, 5), _batch(3, 6), sigma=1.0, clip=1.0, expected_batch=3, calls=calls)
    assert calls == [1]


def test_generator_pass_through_a_frozen_critic_leaves_no_per_sample_gradient():
    critic = _critic()
    mechanism = DPSGDMechanism(1.0, 1.0, 4)
    mechanism.attach(critic)
    fake = torch.randn(4, 1, 8, 8, requires_grad=True)
    critic.requires_grad_(False)
    with mechanism.public_pass():
        critic(fake, torch.zeros(4, dtype=torch.long)).mean().backward()
    critic.requires_grad_(True)
    assert fake.grad is not None
    assert all(p.grad is None and getattr(p, "grad_sample", None) is None for p in critic.parameters())


def test_a_real_pass_that_bypasses_the_hooks_is_an_error():
    critic = _critic()
    mechanism = DPSGDMechanism(1.0, 1.0, 2)
    mechanism.attach(critic)
    optimizer = mechanism.wrap_optimizer(torch.optim.SGD(critic.parameters(), lr=0.1))
    real = _batch(2, 7)
    critic(*real).mean().backward()
    critic.head.weight.grad_sample = None  # as if one layer had escaped the per-sample hooks
    with pytest.raises(RuntimeError, match="no per-sample gradient"):
        optimizer.step()


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError):
        DPSGDMechanism(-1.0, 1.0, 4)
    with pytest.raises(ValueError):
        DPSGDMechanism(1.0, 0.0, 4)
