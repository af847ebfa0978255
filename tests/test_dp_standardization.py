"""The DP location and scale that standardize a continuous label before DP-SGD."""
import math

import pytest
import torch

from lightning_dpgan.privacy.dp_standardization import dp_location_scale, scale_noise_std


def test_with_negligible_noise_the_release_is_the_mean_and_the_mean_absolute_deviation():
    values = torch.tensor([0.1, 0.2, 0.2, 0.5, 0.9])
    released = dp_location_scale(values, 1e9, torch.Generator().manual_seed(0))
    mean = 0.38
    assert released.location == pytest.approx(mean, abs=1e-6)
    assert released.scale == pytest.approx(sum(abs(v - mean) for v in values.tolist()) / 5, abs=1e-6)
    assert released.records == 5 and released.epsilon == 1e9


def test_each_release_carries_laplace_noise_of_scale_2_over_epsilon_on_its_sum():
    """Sensitivity 1 per sum and epsilon / 2 per release: Lap(2 / eps) on each sum, so the
    location and the scale deviate by Lap(2 / (eps n)). Half the values at 0.3 and half at 0.7
    make the absolute deviation about any location in [0.3, 0.7] exactly 0.2 n."""
    n, epsilon, draws = 100, 1.0, 4000
    values = torch.tensor([0.3, 0.7] * (n // 2))
    generator = torch.Generator().manual_seed(1)
    releases = [dp_location_scale(values, epsilon, generator) for _ in range(draws)]
    location_noise = torch.tensor([r.location - 0.5 for r in releases], dtype=torch.float64)
    scale_noise = torch.tensor([r.scale - 0.2 for r in releases], dtype=torch.float64)
    b = 2.0 / (epsilon * n)  # the Laplace scale of each released mean
    for noise in (location_noise, scale_noise):
        # E|Lap(b)| = b and sd = sqrt(2) b, each within 5 standard errors of 4000 draws
        assert noise.abs().mean().item() == pytest.approx(b, abs=5 * b / math.sqrt(draws))
        assert noise.std().item() == pytest.approx(math.sqrt(2) * b, rel=0.06)
        assert abs(noise.mean().item()) < 5 * math.sqrt(2) * b / math.sqrt(draws)
    # the two noises are independent draws
    assert abs(torch.corrcoef(torch.stack([location_noise, scale_noise]))[0, 1].item()) < 0.1


def test_the_scale_is_never_below_its_own_noise_nor_above_the_range_and_the_location_stays_in_it():
    constant = torch.full((50,), 0.0)
    generator = torch.Generator().manual_seed(2)
    for _ in range(200):
        released = dp_location_scale(constant, 0.5, generator)
        assert 0.0 <= released.location <= 1.0
        assert scale_noise_std(0.5, 50) <= released.scale <= 1.0
    assert scale_noise_std(0.5, 50) == pytest.approx(math.sqrt(2) * 4 / 50)
    assert scale_noise_std(0.05, 2) > 1  # a noise floor above the range: the scale is still clipped to it
    for _ in range(20):
        released = dp_location_scale(torch.tensor([1.0, 0.0]), 0.05, generator)
        assert released.scale == 1.0 and 0.0 <= released.location <= 1.0


@pytest.mark.parametrize("values,epsilon,message", [
    (torch.tensor([0.2, 1.5]), 1.0, "must lie in \\[0, 1\\]"),
    (torch.tensor([0.2, -0.1]), 1.0, "must lie in \\[0, 1\\]"),
    (torch.tensor([0.2, float("nan")]), 1.0, "must lie in \\[0, 1\\]"),
    (torch.tensor([]), 1.0, "no values"),
    (torch.tensor([0.2]), 0.0, "epsilon"),
])
def test_values_outside_the_encoding_and_a_non_positive_epsilon_are_refused(values, epsilon, message):
    with pytest.raises(ValueError, match=message):
        dp_location_scale(values, epsilon)


def fixed_laplace(monkeypatch, unit_draws):
    """Replace the mechanism's Laplace draws by ``scale * u`` for the test's ``u``s, in order;
    returns the list of scales asked for."""
    from lightning_dpgan.privacy import dp_standardization

    draws, scales = iter(unit_draws), []

    def draw(scale, generator):
        scales.append(scale)
        return scale * next(draws)

    monkeypatch.setattr(dp_standardization, "_laplace", draw)
    return scales


def test_the_deviation_is_taken_about_the_released_location_not_the_rows_own_mean(monkeypatch):
    """The second sum has sensitivity 1 only about a *public* centre, the released location:
    about the rows' own mean, one added record moves the centre and with it every term. Noise
    +10 scales on the first sum moves the location from the mean 0.38 to 0.58; the scale is
    then the mean absolute deviation about 0.58 (0.328), not about 0.38 (0.256)."""
    values = [0.1, 0.2, 0.2, 0.5, 0.9] * 20
    n, epsilon = len(values), 1.0
    scales = fixed_laplace(monkeypatch, [10.0, 0.0])
    released = dp_location_scale(torch.tensor(values), epsilon)
    assert scales == [2.0 / epsilon, 2.0 / epsilon]  # sensitivity 1 at epsilon / 2, each
    location = (sum(values) + 2.0 / epsilon * 10.0) / n
    assert released.location == pytest.approx(location) and location == pytest.approx(0.58)
    assert released.scale == pytest.approx(sum(abs(v - location) for v in values) / n)
    assert released.scale != pytest.approx(sum(abs(v - 0.38) for v in values) / n)


def test_the_deviation_is_taken_about_the_location_after_its_clipping(monkeypatch):
    """Noise that pushes the location past 1 is clipped to 1 *before* the deviations are taken:
    about an unclipped centre outside [0, 1], |t - m| is no longer in [0, 1] and the sum's
    sensitivity no longer 1. Second draw +3 scales: the scale is (sum |t - 1| + 6) / n."""
    values = [0.1, 0.2, 0.2, 0.5, 0.9] * 20
    n = len(values)
    fixed_laplace(monkeypatch, [1000.0, 3.0])
    released = dp_location_scale(torch.tensor(values), 1.0)
    assert released.location == 1.0
    assert released.scale == pytest.approx((sum(1.0 - v for v in values) + 6.0) / n)


def test_values_at_the_ends_of_the_encoding_are_accepted():
    """A label at its public bounds encodes to exactly 0 or 1: in [0, 1], so accepted."""
    released = dp_location_scale(torch.tensor([0.0, 1.0, 1.0, 0.0]), 1e9, torch.Generator().manual_seed(0))
    assert released.location == pytest.approx(0.5, abs=1e-6) and released.scale == pytest.approx(0.5, abs=1e-6)


def test_the_reported_cost_is_the_epsilon_spent_pure_and_add_remove():
    """What the privacy report composes: the whole epsilon (both halves), delta 0, add/remove."""
    released = dp_location_scale(torch.tensor([0.2, 0.4]), 0.7, torch.Generator().manual_seed(0))
    described = released.describe()
    assert (described["epsilon"], described["delta"], described["neighbours"]) == (0.7, 0.0, "add-remove")
    assert described["records"] == 2 and described["location"] == released.location
    assert described["scale"] == released.scale
