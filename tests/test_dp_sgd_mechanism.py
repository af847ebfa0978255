"""The DP-SGD mechanism itself: clipping bound, noise scale, the public (generated-data)
gradient, empty Poisson batches. Each test would fail if that part of the mechanism broke."""
import copy

import pytest
import torch

from lightning_dpgan.nets import build_networks
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism
from lightning_dpgan.privacy.noise_source import NoiseSource


MODES = {"hooks": "dcgan", "ghost": "mlp"}  # ghost clipping needs Linear layers only


@pytest.fixture(params=sorted(MODES))
def mode(request):
    return request.param


def _critic(mode="hooks", seed=0):
    torch.manual_seed(seed)
    kwargs = {"base_channels": 4} if MODES[mode] == "dcgan" else {"hidden": (16, 8)}
    _, critic = build_networks(MODES[mode], (1, 8, 8), latent_dim=2, num_classes=3, discriminator_kwargs=kwargs)
    return critic


def _batch(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _attached(critic, sigma, clip, expected_batch, seed=0, calls=None, mode="auto"):
    """The mechanism attached to ``critic`` and its SGD optimizer (rate 1: a step applies the gradient)."""
    mechanism = DPSGDMechanism(sigma, clip, expected_batch, on_noisy_step=(lambda: calls.append(1)) if calls is not None else None,
                               noise=NoiseSource(seed), mode=mode)
    mechanism.attach(critic)
    return mechanism, mechanism.wrap_optimizer(torch.optim.SGD(critic.parameters(), lr=1.0))


def _applied(critic, before):
    """The update a step applied: the weights before it less those after."""
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, critic.parameters())])


def _private_update(critic, real, fake, sigma, clip, expected_batch, seed=0, calls=None, mode="auto"):
    """One discriminator update the way GANModule does it; returns the gradient applied."""
    mechanism, optimizer = _attached(critic, sigma, clip, expected_batch, seed, calls, mode)
    before = [p.detach().clone() for p in critic.parameters()]
    optimizer.zero_grad()
    if real is not None:
        mechanism.backward_real(-critic(*real))
    if fake is not None:
        mechanism.backward_public(critic(*fake))
    optimizer.step()
    return _applied(critic, before)


def _plain_gradient(critic, real, fake):
    critic.zero_grad()
    loss = critic(*fake).mean() - critic(*real).mean()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in critic.parameters()])


def test_no_noise_and_huge_clip_bound_give_the_non_private_gradient(mode):
    critic = _critic(mode)
    real, fake = _batch(6, 1), _batch(6, 2)
    expected = _plain_gradient(copy.deepcopy(critic), real, fake)
    applied = _private_update(critic, real, fake, sigma=0.0, clip=1e6, expected_batch=6, mode=mode)
    assert torch.allclose(applied, expected, atol=1e-6)


def test_auto_mode_picks_ghost_for_linear_critics_and_hooks_for_convolutions():
    for mode, arch in MODES.items():
        mechanism = DPSGDMechanism(1.0, 1.0, 4)
        mechanism.attach(_critic(mode))
        assert mechanism.mode == mode, arch
    with pytest.raises(ValueError, match="ghost"):
        DPSGDMechanism(1.0, 1.0, 4, mode="ghost").attach(_critic("hooks"))


def test_each_real_records_gradient_is_clipped_to_the_bound(mode):
    """With one record per batch and no noise, the update is that record's clipped gradient."""
    clip = 1e-3
    norms = []
    for seed in range(5):
        critic = _critic(mode)
        real = _batch(1, seed)
        raw = _plain_gradient(copy.deepcopy(critic), real, (real[0][:0], real[1][:0]))
        applied = _private_update(critic, real, None, sigma=0.0, clip=clip, expected_batch=1, mode=mode)
        assert raw.norm() > clip  # the test only means something if clipping had to act
        norms.append(applied.norm().item())
        cosine = torch.dot(applied, raw) / (applied.norm() * raw.norm())
        assert cosine > 1 - 1e-4, cosine  # the direction is kept
    assert max(norms) <= clip * (1 + 1e-4) and min(norms) >= clip * 0.999


def _record_gradients(critic, records, sign):
    """Each record's gradient of ``sign * critic(record)``, one plain backward pass per record."""
    rows = []
    for i in range(records[0].shape[0]):
        critic.zero_grad()
        (sign * critic(records[0][i:i + 1], records[1][i:i + 1]).sum()).backward()
        rows.append(torch.cat([p.grad.flatten() for p in critic.parameters()]))
    critic.zero_grad()
    return torch.stack(rows)


def _clipped(rows, clip):
    return rows * (clip / rows.norm(dim=1, keepdim=True)).clamp(max=1.0)


def test_each_generated_records_gradient_is_clipped_to_the_bound_too(mode):
    """One generated record, no real one, no noise: the update is its gradient clipped to C,
    direction kept (clipped for utility: see the next test; it costs no privacy)."""
    clip = 1e-3
    critic = _critic(mode)
    fake = _batch(1, 3)
    raw = _plain_gradient(copy.deepcopy(critic), (fake[0][:0], fake[1][:0]), fake)
    applied = _private_update(critic, None, fake, sigma=0.0, clip=clip, expected_batch=1, mode=mode)
    assert raw.norm() > 10 * clip
    assert applied.norm().item() == pytest.approx(clip, rel=1e-3)
    assert torch.dot(applied, raw) / (applied.norm() * raw.norm()) > 1 - 1e-4


def test_a_generator_that_copies_the_real_batch_moves_the_critic_nowhere(mode):
    """Generated records equal to the real ones: each generated record's gradient is exactly
    minus a real record's, and both are clipped alike, so the update is zero. With only the
    real half clipped, the input-independent parts (biases, normalisation) would not cancel
    and the critic would drift to a constant: DPGAN's failure on MNIST."""
    clip = 0.05
    critic = _critic(mode)
    real = _batch(6, 4)
    assert _record_gradients(critic, real, 1.0).norm(dim=1).min() > 10 * clip  # clipping acts on every record
    applied = _private_update(critic, real, real, sigma=0.0, clip=clip, expected_batch=6, mode=mode)
    assert applied.abs().max() < 1e-6


def test_real_and_generated_parts_are_clipped_record_by_record_and_combined(mode):
    """The update is (sum of real records' clipped gradients) / expected batch size plus the
    mean of generated records' clipped gradients, each record's gradient computed on its own
    here: no real record shares a clipped row with a generated one."""
    clip, expected = 0.3, 5
    critic = _critic(mode)
    real, fake = _batch(4, 8), _batch(6, 9)
    real_rows = _clipped(_record_gradients(critic, real, -1.0), clip)
    fake_rows = _clipped(_record_gradients(critic, fake, 1.0), clip)
    expected_update = real_rows.sum(0) / expected + fake_rows.mean(0)
    applied = _private_update(critic, real, fake, sigma=0.0, clip=clip, expected_batch=expected, mode=mode)
    assert torch.cat([real_rows, fake_rows]).norm(dim=1).max() == pytest.approx(clip, rel=1e-4)  # clipping acted
    assert torch.allclose(applied, expected_update, atol=1e-6)


def test_noise_standard_deviation_is_sigma_times_clip_over_expected_batch(mode):
    sigma, clip, batch, draws = 1.5, 0.2, 4, 20
    real = _batch(batch, 4)
    clean = _private_update(_critic(mode), real, None, sigma=0.0, clip=clip, expected_batch=batch, mode=mode)
    noisy = torch.cat([_private_update(_critic(mode), real, None, sigma=sigma, clip=clip, expected_batch=batch, seed=s, mode=mode)
                       for s in range(draws)])
    noise = (noisy.view(draws, -1) - clean).flatten() * batch  # undo the division by the expected batch size
    assert noise.numel() > 4000
    assert abs(noise.std().item() / (sigma * clip) - 1) < 0.05
    assert abs(noise.mean().item()) < 0.05 * sigma * clip


def test_empty_batch_still_releases_noise_and_is_charged(mode):
    """Poisson sampling can draw no record; the step must still be noisy (Opacus' optimizer
    would skip the noise there) and the accountant must still be charged."""
    calls = []
    applied = _private_update(_critic(mode), None, None, sigma=2.0, clip=1.0, expected_batch=4, calls=calls, mode=mode)
    assert calls == [1]
    assert abs(applied.std().item() / (2.0 * 1.0 / 4) - 1) < 0.15


def test_accountant_hook_fires_once_per_noisy_step(mode):
    calls = []
    _private_update(_critic(mode), _batch(3, 5), _batch(3, 6), sigma=1.0, clip=1.0, expected_batch=3, calls=calls, mode=mode)
    assert calls == [1]


def test_generator_pass_through_a_frozen_critic_leaves_no_per_sample_gradient(mode):
    critic = _critic(mode)
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
    mechanism.backward_real(critic(*real))
    critic.head.weight.grad_sample = None  # as if one layer had escaped the per-sample hooks
    with pytest.raises(RuntimeError, match="no per-sample gradient"):
        optimizer.step()


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError):
        DPSGDMechanism(-1.0, 1.0, 4)
    with pytest.raises(ValueError):
        DPSGDMechanism(1.0, 0.0, 4)
    with pytest.raises(ValueError, match="expected_batch_size"):  # the noisy sum is divided by it
        DPSGDMechanism(1.0, 1.0, 0)


def test_zero_grad_drops_a_public_gradient_set_aside_before_it(mode):
    """A generated batch back-propagated, then zero_grad: its public gradient must not reach the
    next step, as a plain optimizer's zeroed .grad would not."""
    real = _batch(4, 1)
    only_real = _private_update(_critic(mode), real, None, sigma=0.0, clip=1e6, expected_batch=4, mode=mode)
    critic = _critic(mode)
    mechanism, optimizer = _attached(critic, 0.0, 1e6, 4, mode=mode)
    before = [p.detach().clone() for p in critic.parameters()]
    mechanism.backward_public(critic(*_batch(5, 2)))  # abandoned
    optimizer.zero_grad()
    mechanism.backward_real(-critic(*real))
    optimizer.step()
    assert torch.allclose(_applied(critic, before), only_real, atol=1e-7)


def test_a_public_gradient_is_applied_at_one_step_only(mode):
    """Step 1 takes a real and a generated batch, step 2 a real batch only: step 2 applies the
    real part alone, as the same step of a critic that never saw the generated batch."""
    real = _batch(4, 1)
    critic = _critic(mode)
    mechanism, optimizer = _attached(critic, 0.0, 1e6, 4, mode=mode)
    optimizer.zero_grad()
    mechanism.backward_real(-critic(*real))
    mechanism.backward_public(critic(*_batch(5, 2)))
    optimizer.step()
    twin = _critic(mode)
    twin.load_state_dict(critic.state_dict())
    before = [p.detach().clone() for p in critic.parameters()]
    optimizer.zero_grad()
    mechanism.backward_real(-critic(*real))
    optimizer.step()
    alone = _private_update(twin, real, None, sigma=0.0, clip=1e6, expected_batch=4, mode=mode)
    assert torch.allclose(_applied(critic, before), alone, atol=1e-6)


def test_two_generated_batches_in_one_step_both_count(mode):
    """Two generated batches before a step: the public gradient is the sum of both clipped
    parts, neither overwrites the other."""
    fake_a, fake_b = _batch(3, 3), _batch(5, 4)

    def update(*batches):
        critic = _critic(mode)
        mechanism, optimizer = _attached(critic, 0.0, 1e6, 4, mode=mode)
        before = [p.detach().clone() for p in critic.parameters()]
        optimizer.zero_grad()
        for batch in batches:
            mechanism.backward_public(critic(*batch))
        optimizer.step()
        return _applied(critic, before)

    assert torch.allclose(update(fake_a, fake_b), update(fake_a) + update(fake_b), atol=1e-6)


def test_an_empty_generated_batch_adds_nothing_to_the_real_update(mode):
    """A rank whose share of the generated batch is empty: its public part is zero, not the NaN
    of a mean over no record."""
    real = _batch(4, 1)
    with_empty = _private_update(_critic(mode), real, _batch(0, 2), sigma=0.0, clip=1.0, expected_batch=4, mode=mode)
    assert torch.isfinite(with_empty).all()
    alone = _private_update(_critic(mode), real, None, sigma=0.0, clip=1.0, expected_batch=4, mode=mode)
    assert torch.allclose(with_empty, alone, atol=1e-7)


def test_a_second_real_pass_before_the_step_is_refused_in_hooks_mode():
    """Opacus would add the two passes' per-record gradients row by row (record i of each batch
    clipped as one row), which breaks the per-record bound."""
    critic = _critic("hooks")
    mechanism, optimizer = _attached(critic, 0.0, 1.0, 4, mode="hooks")
    optimizer.zero_grad()
    mechanism.backward_real(-critic(*_batch(4, 1)))
    with pytest.raises(ValueError):
        mechanism.backward_real(-critic(*_batch(4, 2)))


def test_a_private_update_on_records_leaves_no_backward_hook_warning_in_the_log(mode):
    """PyTorch's "Full backward hook is firing ... no inputs require gradients" fires on every
    first layer fed records; it says nothing about Opacus' hooks, which read the output's
    gradient, and buried each run's log. Other warnings still get through."""
    import warnings

    real, fake = _batch(4, 0), _batch(4, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # shown once per place, as outside the tests
        _private_update(_critic(mode), real, fake, sigma=1.0, clip=1.0, expected_batch=4, mode=mode)
        warnings.warn("a warning of ours", UserWarning)
    messages = [str(warning.message) for warning in caught]
    assert not [message for message in messages if "Full backward hook is firing" in message], messages
    assert "a warning of ours" in messages
