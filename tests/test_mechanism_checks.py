"""Mechanism unit checks, one block per mechanism (issue "Privacy auditing and reliability").

For every mechanism that adds noise:

- **noise law**: the noise drawn through the real code path, with a zero or known signal, is
  tested against the intended law and scale with a Kolmogorov-Smirnov test (p > 0.01), and
  the same test rejects half the scale (p < 1e-6) so that it has power. Where a mechanism
  only returns an argmax, the noise is recovered exactly by bisection: with the random seed
  reset before each call the noise is the same, and the vote gap at which the answer flips
  *is* the noise (difference);
- **sensitivity**: the pre-noise quantity is computed by the real code on a dataset D and a
  neighbour D' (the relation the mechanism claims, with an extreme record), with the noise
  switched off, and its change stays within the stated bound -- reached for a worst-case record.

Then every accountant class is checked monotone (in steps, look-ahead, δ and the noise), and
preprocessing is checked to read private rows only through its DP mechanisms.
Existing checks elsewhere: test_dp_sgd_mechanism, test_gradient_sanitizer, test_gpate,
test_pate_analysis (noise standard deviations and rates), test_ctgan_encoding (KS test of the
column histograms), test_accountants (Opacus accountant monotone in steps), test_audit.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from lightning_dpgan.data import dp_bounds, table_transformer
from lightning_dpgan.data.dp_histogram import dp_column_histograms
from lightning_dpgan.data.partition import PartitionedSampler, teacher_partitions
from lightning_dpgan.data.schema import Column, SchemaError, TableSchema
from lightning_dpgan.datamodules import csv as csv_module
from lightning_dpgan.datamodules.csv import CSVDataModule
from lightning_dpgan.datamodules.king import KingDataModule
from lightning_dpgan.nets import build_networks
from lightning_dpgan.nets.ensemble import build_teacher_ensemble
from lightning_dpgan.privacy import dp_label_model, gradient_voting
from lightning_dpgan.privacy.accountants import (
    ConfidentGNMaxAccountant,
    GaussianAccountant,
    OpacusAccountant,
    PATEMomentsAccountant,
    SelectedCriticGaussianAccountant,
)
from lightning_dpgan.privacy.analysis.gnmax import gnmax_log_q
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism
from lightning_dpgan.privacy.noise_source import NoiseSource
from lightning_dpgan.privacy.poisson_batches import PoissonBatches, distinct_uniform
from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism, effective_noise_multiplier
from lightning_dpgan.privacy.gradient_voting import ProjectedGradientAggregator
from lightning_dpgan.privacy.mechanisms import NO_ANSWER, confident_gnmax
from lightning_dpgan.privacy.pate import PATELabelAggregator

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning"),  # inputs that need no gradient
    pytest.mark.filterwarnings("ignore:Optimal order is the:UserWarning"),  # Opacus, at the grid edge
]


@pytest.fixture(autouse=True)
def _one_thread():
    """The machine's cores are shared: oversubscribed threads make these tests very slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------ helpers
def assert_law(samples, law, wrong_law) -> None:
    """KS: the samples fit ``law`` (p > 0.01) and the test has the power to reject ``wrong_law``."""
    samples = np.asarray(samples, dtype=np.float64)
    assert samples.size >= 2000
    assert stats.kstest(samples, law).pvalue > 0.01
    assert stats.kstest(samples, wrong_law).pvalue < 1e-6


def normal_cdf(scale: float):
    return stats.norm(scale=scale).cdf


def laplace_difference_cdf(scale: float):
    """CDF of L0 - L1 for independent L0, L1 ~ Laplace(scale): its tail is
    ``0.5 exp(-z/b) (1 + z/(2b))`` (density ``(1 + |z|/b) exp(-|z|/b) / (4b)``)."""

    def cdf(z):
        z = np.asarray(z, dtype=np.float64)
        tail = 0.5 * np.exp(-np.abs(z) / scale) * (1.0 + np.abs(z) / (2.0 * scale))
        return np.where(z >= 0, 1.0 - tail, tail)

    return cdf


def flip_points(below, rows: int, reach: float, seed: int, iterations: int = 64) -> np.ndarray:
    """Per row, the value ``t`` at which ``below(t)`` turns from True to False, by bisection.

    ``below(t)`` runs a mechanism on inputs built from ``t`` (one entry per row) and says, per
    row, whether ``t`` is still below the row's noise; the global seed is reset before each call,
    so the noise, drawn in the same shapes every time, is the same at every probe."""
    low = torch.full((rows,), -reach, dtype=torch.float64)
    high = torch.full((rows,), reach, dtype=torch.float64)
    for _ in range(iterations):
        middle = (low + high) / 2
        torch.manual_seed(seed)
        is_below = below(middle)
        low, high = torch.where(is_below, middle, low), torch.where(is_below, high, middle)
    assert (low > -reach).all() and (high < reach).all(), "a noise draw fell outside the bisection range"
    return ((low + high) / 2).numpy()


# ======================================================================================
# DP-SGD (privacy/dp_sgd.py): per-record clip to C, N(0, sigma^2 C^2) on the sum, divided by
# the expected batch size. QUAIL's label model runs the same mechanism (hooks mode).
# ======================================================================================
DPSGD_ARCH = {"hooks": ("dcgan", {"base_channels": 8}), "ghost": ("mlp", {"hidden": (48, 24)})}


def dpsgd_critic(mode: str, seed: int = 0):
    torch.manual_seed(seed)
    arch, kwargs = DPSGD_ARCH[mode]
    _, critic = build_networks(arch, (1, 8, 8), latent_dim=2, num_classes=3, discriminator_kwargs=kwargs)
    return critic


def records(n: int, seed: int, scale: float = 1.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=generator) * scale, torch.randint(0, 3, (n,), generator=generator)


def dpsgd_update(mode, real, fake=None, sigma=0.0, clip=1.0, expected_batch=4, seed=0, zero_loss=False):
    """One discriminator step as GANModule takes it (SGD, lr 1): returns the applied update
    times the expected batch size, i.e. the noisy clipped sum plus the public part."""
    critic = dpsgd_critic(mode)
    mechanism = DPSGDMechanism(sigma, clip, expected_batch, noise=NoiseSource(seed), mode=mode)
    mechanism.attach(critic)
    optimizer = mechanism.wrap_optimizer(torch.optim.SGD(critic.parameters(), lr=1.0))
    before = [p.detach().clone() for p in critic.parameters()]
    optimizer.zero_grad()
    if real is not None:
        scores = critic(*real)
        mechanism.backward_real(-(scores * 0.0 if zero_loss else scores))
    if fake is not None:
        mechanism.backward_public(critic(*fake))
    optimizer.step()
    update = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, critic.parameters())])
    return update.double() * expected_batch


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_dp_sgd_noise_is_gaussian_with_std_sigma_c_per_coordinate(mode):
    """Protects against a wrong noise law or scale (e.g. sigma instead of sigma*C, or noise
    divided by the actual instead of the expected batch size): KS against N(0, (sigma C)^2)."""
    sigma, clip, expected = 1.3, 0.5, 10
    real = records(6, 1, scale=50.0)  # a Poisson batch of 6 (10 expected); every gradient far above C: all clipped
    clean = dpsgd_update(mode, real, sigma=0.0, clip=clip, expected_batch=expected)
    noise = np.concatenate([(dpsgd_update(mode, real, sigma=sigma, clip=clip, expected_batch=expected, seed=s) - clean)
                            .numpy() for s in range(2)])
    assert_law(noise, normal_cdf(sigma * clip), normal_cdf(sigma * clip / 2))
    # zero per-record gradients, and an empty Poisson batch: the same law
    zero = dpsgd_update(mode, real, sigma=sigma, clip=clip, expected_batch=expected, seed=5, zero_loss=True).numpy()
    empty = dpsgd_update(mode, None, sigma=sigma, clip=clip, expected_batch=expected, seed=6).numpy()
    assert stats.kstest(np.concatenate([zero, empty]), normal_cdf(sigma * clip)).pvalue > 0.01


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_dp_sgd_one_added_record_moves_the_clipped_sum_by_at_most_c(mode):
    """Protects the add/remove sensitivity C: an added record (typical or an extreme outlier)
    moves the clipped sum by at most C, exactly C for an outlier (tight), also from an empty
    batch, and the generated records' public gradient does not count towards it."""
    clip, batch = 0.05, 4
    base, fake = records(batch, 2), records(3, 3)
    outlier = records(1, 4, scale=1e4)
    typical = records(1, 5)
    without = dpsgd_update(mode, base, fake, clip=clip, expected_batch=batch)
    for added, tight in ((outlier, True), (typical, False)):
        neighbour = (torch.cat([base[0], added[0]]), torch.cat([base[1], added[1]]))
        change = (dpsgd_update(mode, neighbour, fake, clip=clip, expected_batch=batch) - without).norm().item()
        assert change <= clip * (1 + 1e-4)
        if tight:
            assert change >= clip * (1 - 1e-4)
    from_empty = dpsgd_update(mode, outlier, clip=clip, expected_batch=batch) - dpsgd_update(mode, None, clip=clip,
                                                                                               expected_batch=batch)
    assert from_empty.norm().item() == pytest.approx(clip, rel=1e-4)


def test_quail_label_model_runs_the_dp_sgd_mechanism_with_its_stated_parameters(monkeypatch):
    """Protects QUAIL's label model from drifting away from the DP-SGD mechanism tested above:
    it must build it in hooks mode with the calibrated sigma, its C and the *expected* batch
    size, and charge the accountant once for every batch Poisson sampling drew."""
    built, steps = [], []

    class Spy(DPSGDMechanism):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)
            callback = self.on_noisy_step
            self.on_noisy_step = lambda: (steps.append(1), callback())

    monkeypatch.setattr(dp_label_model, "DPSGDMechanism", Spy)
    generator = torch.Generator().manual_seed(0)
    features = torch.rand(200, 3, generator=generator)
    targets = torch.nn.functional.one_hot((features[:, 0] > 0.5).long(), 2).float()
    settings_ = dp_label_model.DPSGDSettings(epochs=2, batch_size=20, max_grad_norm=0.7)
    network = dp_label_model.label_network("logistic", 3, 2, [])
    cost = dp_label_model.train_dp_label_model(network, features, targets, 3.0, 1e-4, settings_)
    (mechanism,) = built
    assert mechanism.mode == "hooks" and mechanism.expected_batch_size == 20 and mechanism.max_grad_norm == 0.7
    assert mechanism.noise_multiplier == cost["noise_multiplier"] > 0
    assert len(steps) == cost["steps"] == 2 * 10  # every step of every epoch is noisy and charged


def _chi_square_p(observed: dict, expected: dict) -> float:
    keys = sorted(expected)
    return stats.chisquare([observed.get(key, 0) for key in keys], [expected[key] for key in keys]).pvalue


def test_poisson_batches_draw_each_set_of_records_with_the_poisson_law():
    """The accountant charges for Poisson sampling: each record in each batch independently with
    probability q, so a set S of the n records is a batch with probability q^|S| (1-q)^(n-|S|).
    Checked over every one of the 32 sets of 5 records (both of distinct_uniform's paths run:
    sizes 0-2 draw with repeats set aside, 3-5 shuffle); a fixed batch size, or a draw that
    favoured some records, fails it."""
    n, q, draws = 5, 0.3, 40_000
    batches = PoissonBatches(n, q, torch.Generator().manual_seed(0), steps=draws)
    observed: dict = {}
    for batch in batches:
        assert batch == sorted(set(batch))
        observed[tuple(batch)] = observed.get(tuple(batch), 0) + 1
    subsets = [tuple(i for i in range(n) if mask >> i & 1) for mask in range(2 ** n)]
    expected = {s: draws * q ** len(s) * (1 - q) ** (n - len(s)) for s in subsets}
    assert set(observed) <= set(expected) and _chi_square_p(observed, expected) > 1e-3


def test_distinct_uniform_draws_every_set_of_its_size_alike_and_a_large_table_at_a_batchs_cost():
    """The set-aside-repeats path (a batch a small share of the table) against the uniform law
    over the 15 pairs of 6 records; and on 10^8 records it draws 64 distinct ones (a draw of
    one number a record could not)."""
    generator, draws = torch.Generator().manual_seed(1), 30_000
    observed: dict = {}
    for _ in range(draws):
        pair = tuple(sorted(distinct_uniform(6, 2, generator)))
        observed[pair] = observed.get(pair, 0) + 1
    expected = {(i, j): draws / 15 for i in range(6) for j in range(i + 1, 6)}
    assert set(observed) == set(expected) and _chi_square_p(observed, expected) > 1e-3
    large = distinct_uniform(10 ** 8, 64, generator)
    assert len(large) == 64 and all(0 <= index < 10 ** 8 for index in large)
    with pytest.raises(ValueError, match="cannot draw 7 distinct records of 6"):
        distinct_uniform(6, 7)


def test_poisson_batches_come_from_the_generator_they_are_given():
    """The batches' secrecy is what subsampling amplification rests on: they come from the
    mechanism's generator, not torch's global one (which --seed seeds)."""
    def batches(seed):
        torch.manual_seed(123)  # the global generator the same each time
        return list(PoissonBatches(1000, 0.01, torch.Generator().manual_seed(seed), steps=20))

    assert batches(0) == batches(0) != batches(1)
    assert len(PoissonBatches(1000, 0.01)) == 100  # an epoch as Opacus counts it: int(1 / q)


# ======================================================================================
# PATE (privacy/pate.py, mechanisms.laplace_noisy_argmax): argmax of votes + Lap(1/lambda);
# a replaced record changes one teacher, so one vote moves (replace-one neighbours).
# ======================================================================================
def test_pate_noisy_argmax_noise_is_laplace_with_scale_one_over_lambda():
    """Protects the Laplace law and its scale 1/lambda (not lambda, not Gaussian): the noise
    difference recovered from PATELabelAggregator's answers is the difference of two
    independent Laplace(1/lambda) draws."""
    lam, rows = 0.25, 4000
    zeros = torch.zeros(rows, dtype=torch.float64)

    def answers_zero(gap):  # a fresh aggregator with the same noise seed: the same draws at every probe
        aggregator = PATELabelAggregator(lam, on_answer=lambda *args: None, noise=NoiseSource(11))
        return aggregator.aggregate(torch.stack([zeros, gap], 1)) == 0

    # answer 0 iff 0 + L0 > gap + L1, i.e. while the gap is below L0 - L1
    noise = flip_points(answers_zero, rows, 200 / lam, seed=11)
    assert_law(noise, laplace_difference_cdf(1 / lam), laplace_difference_cdf(0.5 / lam))
    assert stats.kstest(noise, laplace_difference_cdf(lam)).pvalue < 1e-6  # scale lambda instead of 1/lambda
    assert stats.kstest(noise, normal_cdf(math.sqrt(2) * 2 / lam)).pvalue < 1e-6  # Gaussian of the same variance


TABLE_WIDTH, NUM_RECORDS, NUM_TEACHERS = 5, 240, 8


def train_teachers(data: torch.Tensor, steps: int = 20):
    """K teachers trained as PATE-GAN and G-PATE train them: each on minibatches of its own
    fixed partition (PartitionedSampler), all at once (the ensemble's summed loss, one Adam),
    against a shared batch of generated records."""
    torch.manual_seed(0)
    teachers = build_teacher_ensemble(NUM_TEACHERS, (TABLE_WIDTH,), None, arch="mlp", hidden=(8,))
    partitions = teacher_partitions(len(data), NUM_TEACHERS, seed=1)
    sampler = PartitionedSampler(data, partitions, batch_size=10, seed=2)
    optimizer = teachers.make_optimizer(0.05, betas=(0.9, 0.999))
    fakes = torch.Generator().manual_seed(3)
    for _ in range(steps):
        real, _ = sampler.draw()
        loss = teachers.discriminator_loss(real, None, torch.rand(10, TABLE_WIDTH, generator=fakes), None)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return teachers, partitions


@pytest.fixture(scope="module")
def neighbouring_teachers():
    """Teachers trained on D and on D' = D with one record replaced by an extreme outlier;
    returns both ensembles and the index of the teacher whose partition holds that record."""
    data = torch.rand(NUM_RECORDS, TABLE_WIDTH, generator=torch.Generator().manual_seed(4))
    replaced = 17
    neighbour = data.clone()
    neighbour[replaced] = 1e6
    teachers, partitions = train_teachers(data)
    changed, same_partitions = train_teachers(neighbour)
    assert all(torch.equal(a, b) for a, b in zip(partitions, same_partitions))  # fixed by n and the seed alone
    owner = next(k for k, part in enumerate(partitions) if replaced in part.tolist())
    return teachers, changed, owner


def test_pate_a_replaced_record_changes_one_teacher_and_moves_at_most_one_vote(neighbouring_teachers):
    """Protects PATE's sensitivity: a replaced record (an outlier) reaches one teacher only --
    every other teacher is bit-identical -- so in each query's histogram (n0, n1) one vote moves
    at most: each count by <= 1, L1 <= 2 (tight: some vote does move)."""
    teachers, changed, owner = neighbouring_teachers
    for k in range(NUM_TEACHERS):
        same = [torch.equal(a[k], b[k]) for a, b in zip(teachers.parameters(), changed.parameters())]
        assert all(same) if k != owner else not any(same), k
    queries = torch.rand(500, TABLE_WIDTH, generator=torch.Generator().manual_seed(5))
    n1, predictions = teachers.votes(queries, return_predictions=True)
    n1_changed, predictions_changed = changed.votes(queries, return_predictions=True)
    moved = predictions != predictions_changed
    assert not torch.cat([moved[:owner], moved[owner + 1:]]).any()
    histogram = torch.stack([NUM_TEACHERS - n1, n1], 1)
    histogram_changed = torch.stack([NUM_TEACHERS - n1_changed, n1_changed], 1)
    l1 = (histogram - histogram_changed).abs().sum(1)
    assert l1.max() == 2 and set(l1.tolist()) <= {0, 2}


# ======================================================================================
# Confident-GNMax (mechanisms.confident_gnmax) and G-PATE's projected voting
# (gradient_voting.py): threshold noise N(0, sigma1^2) on the max count, answer noise
# N(0, sigma2^2) on every count; one record moves one teacher's vote in each query.
# ======================================================================================
def test_gnmax_threshold_noise_is_gaussian_with_std_sigma1():
    """Protects the threshold step's law and scale: the noise recovered at which a query flips
    between unanswered and answered is N(0, sigma1^2)."""
    sigma1, rows = 7.0, 4000
    # unanswered iff m + sigma1 z < T = 0, i.e. while m is below -sigma1 z
    noise = flip_points(lambda m: confident_gnmax(torch.stack([m, m], 1), 0.0, sigma1, 1.0) == NO_ANSWER,
                        rows, 20 * sigma1, seed=12)
    assert_law(noise, normal_cdf(sigma1), normal_cdf(sigma1 / 2))


def test_gnmax_answer_noise_is_gaussian_with_std_sigma2_on_each_count():
    """Protects the answer step's law and scale: the recovered noise difference of two counts
    is N(0, 2 sigma2^2) (independent N(0, sigma2^2) per count)."""
    sigma2, rows = 3.0, 4000
    zeros = torch.zeros(rows, dtype=torch.float64)
    noise = flip_points(lambda gap: confident_gnmax(torch.stack([zeros, gap], 1), -1e12, 1.0, sigma2) == 0,
                        rows, 30 * sigma2, seed=13)
    assert_law(noise, normal_cdf(math.sqrt(2) * sigma2), normal_cdf(math.sqrt(2) * sigma2 / 2))


def test_gnmax_threshold_noise_is_independent_of_the_answer_noise():
    """Two tied bins at threshold 0: a query is answered when its threshold noise is >= 0 and
    then answers either bin with probability 1/2, whatever that noise was (the analysis charges
    the two steps as independent Gaussians; a draw shared between them would favour one bin)."""
    answers = confident_gnmax(torch.zeros(8000, 2), 0.0, 1.0, 1.0, torch.Generator().manual_seed(0))
    answered = answers[answers != NO_ANSWER]
    assert abs(len(answered) / 8000 - 0.5) < 0.03
    assert abs((answered == 0).double().mean().item() - 0.5) < 0.03


@pytest.mark.parametrize("sigmas", [(1.0, 0.0), (0.0, 1.0), (1.0, -1.0)])
def test_gnmax_refuses_a_missing_noise(sigmas):
    """sigma2 = 0 would answer with the exact argmax of the votes, sigma1 = 0 check them exactly."""
    with pytest.raises(ValueError, match="sigma"):
        confident_gnmax(torch.tensor([[3.0, 1.0]]), 1.0, *sigmas)


def test_pate_refuses_a_laplace_inverse_scale_of_zero():
    """lambda = 0 is infinite noise (scale 1/lambda): refused, not drawn as inf or NaN."""
    from lightning_dpgan.privacy.mechanisms import laplace_noisy_argmax

    with pytest.raises(ValueError, match="lap_inverse_scale"):
        laplace_noisy_argmax(torch.tensor([[3.0, 1.0]]), 0.0)


def test_gpate_aggregator_draws_gnmax_noise_with_its_own_parameters_on_the_checked_votes(monkeypatch):
    """Protects the plumbing from G-PATE's aggregator to the tested noise: Confident-GNMax gets
    exactly the vote histograms that were checked (and charged), the threshold and both sigmas."""
    calls = []

    def spy(votes, threshold, sigma1, sigma2, generator):
        calls.append((votes, threshold, sigma1, sigma2, generator))
        return confident_gnmax(votes, threshold, sigma1, sigma2, generator)

    monkeypatch.setattr(gradient_voting, "confident_gnmax", spy)
    checked, charged = [], []
    noise = NoiseSource()
    aggregator = ProjectedGradientAggregator(4, 6, 1.0, 11.0, 5.0, 7.5, check=checked.append,
                                             charge=lambda votes, answered: charged.append(votes), noise=noise)
    aggregator.aggregate(torch.randn(9, 5, 12))
    ((votes, threshold, sigma1, sigma2, generator),) = calls
    assert votes is checked[0] is charged[0] and (threshold, sigma1, sigma2) == (7.5, 11.0, 5.0)
    assert generator is noise.generator("cpu")  # the aggregator's own noise, not torch's global stream
    assert votes.shape == (5 * 4, 6) and (votes.sum(1) == 9).all()  # one vote per teacher and query


def query_histograms(aggregator_args, teacher_gradients, seed=0):
    """The vote histograms G-PATE's aggregator hands to its check (before any noise)."""
    seen = []
    aggregator = ProjectedGradientAggregator(*aggregator_args, check=seen.append, charge=lambda *args: None)
    torch.manual_seed(seed)  # the same random projections for D and D'
    aggregator.aggregate(teacher_gradients)
    return seen[0].long()


def assert_one_vote_moved_at_most(votes, votes_changed):
    difference = (votes - votes_changed).abs()
    assert difference.sum(1).max() <= 2  # L1 <= 2: the answer step's L2 sensitivity sqrt(2)
    assert (votes.max(1).values - votes_changed.max(1).values).abs().max() <= 1  # the threshold step's 1
    return difference.sum(1)


def test_gpate_one_changed_teacher_moves_at_most_one_vote_per_query(neighbouring_teachers):
    """Protects G-PATE's sensitivity: teachers trained on neighbours (one record replaced by an
    outlier) give projected-gradient vote histograms that differ by one vote per query at most;
    and so does any gradient of one teacher, extreme or non-finite (+-inf, 1e30, NaN)."""
    teachers, changed, _ = neighbouring_teachers
    fake = torch.rand(16, TABLE_WIDTH, generator=torch.Generator().manual_seed(6))
    args = (5, 10, 0.05, 1.0, 1.0, 1.0)  # k, bins, clip, sigma1, sigma2, threshold
    votes = query_histograms(args, teachers.input_gradients(fake))
    moved = assert_one_vote_moved_at_most(votes, query_histograms(args, changed.input_gradients(fake)))
    assert moved.max() == 2  # tight: the changed teacher's vote did move somewhere
    gradients = torch.randn(NUM_TEACHERS, 16, 3, 4, generator=torch.Generator().manual_seed(7)) * 0.05
    votes = query_histograms(args, gradients)
    for extreme in (1e30, -math.inf, math.inf, math.nan):
        neighbour = gradients.clone()
        neighbour[3] = extreme
        assert_one_vote_moved_at_most(votes, query_histograms(args, neighbour))


# ======================================================================================
# Gradient sanitizer / DP-HOOK (privacy/gradient_sanitizer.py): each generated record's
# gradient row clipped to C/B, N(0, (sigma C/B)^2) per entry; one real record may change the
# critic arbitrarily, so each row moves by <= 2C/B (the tensor by 2C/sqrt(B)).
# ======================================================================================
def sanitized(mechanism, generated, loss):
    x = generated.clone().requires_grad_()
    loss(mechanism.sanitize(x)).backward()
    return x.grad.double()


def test_sanitizer_noise_is_gaussian_with_std_sigma_c_over_b():
    """Protects the released gradient's noise law and scale sigma*C/B (with all rows clipped,
    the noise is the release minus its noise-free value)."""
    batch, clip, sigma = 8, 2.0, 1.5
    weights = torch.randn(batch, 3, 10, generator=torch.Generator().manual_seed(8)) * 100
    loss = lambda g: (g * weights).sum()  # noqa: E731
    generated = torch.randn(batch, 3, 10)
    clean = sanitized(GradientSanitizerMechanism(clip, 0.0), generated, loss)
    noisy = torch.cat([sanitized(GradientSanitizerMechanism(clip, sigma, noise=NoiseSource(s)),
                                 generated, loss) - clean for s in range(10)])
    assert_law(noisy.flatten().numpy(), normal_cdf(sigma * clip / batch), normal_cdf(sigma * clip / batch / 2))


def test_sanitizer_rows_move_by_at_most_2c_over_b_whatever_the_critic():
    """Protects DP-HOOK's sensitivity: two critics (as different as one real record can make
    them, extreme or opposite) give released rows within 2C/B of each other, the whole tensor
    within 2C/sqrt(B), with equality for opposite huge gradients; the accountant's noise
    multiplier is then noise std / sensitivity."""
    batch, clip = 6, 0.3
    generated = torch.randn(batch, 4, 5, generator=torch.Generator().manual_seed(9))
    direction = torch.randn(4, 5, generator=torch.Generator().manual_seed(10))
    critics = [lambda g: (g * direction).sum() * 1e6, lambda g: -(g * direction).sum() * 1e6,  # opposite, huge
               lambda g: (g**2).mean(), lambda g: (g * 0).sum(), lambda g: torch.tanh(g).sum() * 1e-3]
    mechanism = GradientSanitizerMechanism(clip, 0.0)
    released = [sanitized(mechanism, generated, critic).reshape(batch, -1) for critic in critics]
    bound = 2 * clip / batch
    for i, a in enumerate(released):
        for b in released[i + 1:]:
            assert (a - b).norm(dim=1).max() <= bound * (1 + 1e-6)
            assert (a - b).norm() <= bound * math.sqrt(batch) * (1 + 1e-6)
    worst = (released[0] - released[1]).norm().item()
    assert worst == pytest.approx(2 * clip / math.sqrt(batch), rel=1e-5)
    assert (clip / batch) / worst == pytest.approx(effective_noise_multiplier(1.0, batch), rel=1e-5)


# ======================================================================================
# Preprocessing: Laplace column histograms (data/dp_histogram.py, L1 sensitivity d over d
# columns, scale d/epsilon), DP bounds and category sets (data/dp_bounds.py, sensitivity 1
# per column's histogram, scale 1/epsilon_column).
# ======================================================================================
class _Addend(np.ndarray):
    """Noise that remembers the array it is added to: the mechanism's pre-noise counts."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [x.view(np.ndarray) if isinstance(x, _Addend) else x for x in inputs]
        if ufunc is np.add and method == "__call__":
            self.call["counts"] = np.asarray(next(x for x in inputs if not isinstance(x, _Addend)), dtype=float).copy()
        return getattr(ufunc, method)(*plain, **kwargs)


class NoiseProbe:
    """An ``rng`` for the preprocessing mechanisms: records each Laplace draw's scale, the noise
    (from ``rng``, or zeros: noise switched off) and the counts it is added to."""

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng, self.calls = rng, []

    def laplace(self, loc, scale, size):
        noise = self.rng.laplace(loc, scale, size) if self.rng is not None else np.zeros(size)
        addend = np.asarray(noise, dtype=float).view(_Addend)
        addend.call = {"loc": loc, "scale": scale, "noise": np.asarray(noise, dtype=float)}
        self.calls.append(addend.call)
        return addend

    def counts(self) -> list[np.ndarray]:
        return [call["counts"] for call in self.calls]


HIST_SCHEMA = TableSchema(
    columns=(
        Column("x", "continuous", bounds=(-10.0, 10.0)),
        Column("gain", "integer", bounds=(0, 10_000)),
        Column("lot", "continuous", bounds=(0.0, 2_000_000.0)),
        Column("rooms", "integer", bounds=(0, 12)),
        Column("colour", "categorical", categories=("red", "green", "blue")),
        Column("y", "categorical", categories=("no", "yes")),
    ),
    label="y",
    label_kind="binary",
)
HIST_ROLES = {"special_values": {"gain": [0.0]}, "log_columns": ["lot"], "discrete": ["rooms"]}


def table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "x": rng.normal(0.0, 4.0, n),
        "gain": np.where(rng.random(n) < 0.6, 0, rng.integers(1, 9000, n)),
        "lot": np.exp(rng.normal(9.0, 1.0, n)),
        "rooms": rng.integers(1, 9, n),
        "colour": rng.choice(["red", "green", "blue"], n),
        "y": rng.choice(["no", "yes"], n),
    })


def odd_table(n: int) -> pd.DataFrame:
    """Rows unlike :func:`table`'s in every respect a leak could read: whole numbers nearly all far
    outside the bounds (a tenth inside: a column wholly outside its declared bounds is refused),
    near-constant and one-category columns, a skewed label."""
    rng = np.random.default_rng(5)
    inside = np.arange(n) % 10 == 0
    return pd.DataFrame({
        "x": rng.integers(-1000, 1000, n).astype(float),
        "gain": np.zeros(n, dtype=int),
        "lot": np.where(inside, 0.5, 1e9),
        "rooms": np.where(inside, 0, 40),
        "colour": ["red"] * n,
        "y": np.where(rng.random(n) < 0.95, "yes", "no"),
    })


def test_dp_histogram_extreme_records_move_each_of_the_d_column_histograms_by_one():
    """Protects the histograms' L1 sensitivity d: an added record -- typical, far outside the
    bounds (a discrete column's too), on a special value -- moves the concatenated true counts by
    exactly d (one bin per column); a record the schema drops (unknown category) moves nothing;
    a record at +-inf is refused before any count is taken."""
    base = table(300, 0)

    def counts(frame):
        histograms, _ = dp_column_histograms(frame, HIST_SCHEMA, 1.0, bins=16, rng=NoiseProbe(), **HIST_ROLES)
        return np.concatenate([np.concatenate([h.counts, h.special_counts]) for h in histograms.values()])

    without, d = counts(base), len(HIST_SCHEMA.columns)
    extremes = [
        {"x": 1.0, "gain": 5, "lot": 5000.0, "rooms": 3, "colour": "red", "y": "no"},
        {"x": 1e300, "gain": 10**15, "lot": 1e300, "rooms": 10**15, "colour": "blue", "y": "yes"},
        {"x": -1e300, "gain": -(10**15), "lot": -1e300, "rooms": -(10**15), "colour": "green", "y": "no"},
    ]
    for row in extremes:
        change = np.abs(counts(pd.concat([base, pd.DataFrame([row])], ignore_index=True)) - without).sum()
        assert change == d, row
    infinite = {"x": math.inf, "gain": 0, "lot": -math.inf, "rooms": 12, "colour": "red", "y": "yes"}
    with pytest.raises(SchemaError, match="holds infinite values"):
        counts(pd.concat([base, pd.DataFrame([infinite])], ignore_index=True))
    dropped = {"x": 1e300, "gain": 7, "lot": 1.0, "rooms": 2, "colour": "purple", "y": "no"}
    assert np.abs(counts(pd.concat([base, pd.DataFrame([dropped])], ignore_index=True)) - without).sum() == 0


class MarkerNoise:
    """Laplace draws replaced by a marker 1e6, so that a count released without noise shows."""

    def __init__(self):
        self.scales = []

    def laplace(self, loc, scale, size):
        self.scales.append(scale)
        return np.full(size, 1e6)


def test_dp_histogram_every_released_count_carries_its_own_laplace_draw():
    """Protects the noise on every bin the histograms release, the special values' counts of a
    mixed column included: each released count is its true count plus one draw of scale d/epsilon
    (here a marker draw of 1e6, so that a count released without noise would show)."""
    frame, epsilon, d = table(300, 0), 2.0, len(HIST_SCHEMA.columns)
    exact, _ = dp_column_histograms(frame, HIST_SCHEMA, epsilon, bins=16, rng=NoiseProbe(), **HIST_ROLES)
    marker = MarkerNoise()
    noisy, _ = dp_column_histograms(frame, HIST_SCHEMA, epsilon, bins=16, rng=marker, **HIST_ROLES)
    for name, histogram in noisy.items():
        np.testing.assert_allclose(histogram.counts, exact[name].counts + 1e6)
        np.testing.assert_allclose(histogram.special_counts, exact[name].special_counts + 1e6)
    assert len(noisy["gain"].special_counts) == 1  # the mixed column's special value 0 is released
    assert set(marker.scales) == {d / epsilon}


def test_dp_histogram_a_category_or_bin_no_record_holds_carries_its_laplace_draw_too():
    """Protects the noise on empty bins: a category absent from the rows (or an empty numeric
    bin) released as an exact 0 would tell that no record holds it."""
    schema = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 1.0), source="test"),
                                  Column("colour", "categorical", categories=("red", "green", "blue"), source="test")))
    frame = pd.DataFrame({"x": [0.1, 0.2, 0.6, 0.9], "colour": ["red", "green", "red", "green"]})
    histograms, _ = dp_column_histograms(frame, schema, 1.0, bins=4, rng=MarkerNoise())
    assert histograms["colour"].counts.tolist() == [2 + 1e6, 2 + 1e6, 1e6]
    assert histograms["x"].counts.tolist() == [2 + 1e6, 1e6, 1 + 1e6, 1 + 1e6]


def test_dp_bounds_counts_move_by_one_for_any_added_value():
    """Protects the sensitivity 1 of the bounds histogram (a fixed grid, outermost bins catch
    everything beyond it) and of the category counts (a new value is a new count of 1, the
    case the stability threshold's delta covers)."""
    values = np.random.default_rng(1).lognormal(3.0, 2.0, 400) * np.where(np.arange(400) % 3, 1, -1)

    def grid_counts(column):
        probe = NoiseProbe()
        dp_bounds.dp_numeric_bounds(column, 1.0, rng=probe)
        return probe.counts()[0]

    without = grid_counts(values)
    for added in (0.0, 3.5, -1e-300, 1e300, -1e300, math.inf, -math.inf, 2.0**40, 2.0**41):
        assert np.abs(grid_counts(np.append(values, added)) - without).sum() == 1, added

    categories = np.random.default_rng(2).choice(["a", "b", "c"], 300)

    def category_counts(column):
        probe = NoiseProbe()
        dp_bounds.dp_categories(column, 1.0, 1e-6, rng=probe)
        return probe.counts()[0]  # in order of first appearance: an appended value keeps the order

    without = category_counts(categories)
    change = category_counts(np.append(categories, "b")) - without
    assert np.abs(change).sum() == 1 and change.max() == 1
    assert category_counts(np.append(categories, "new")).tolist() == without.tolist() + [1.0]


def test_dp_schema_estimate_noise_is_laplace_with_scale_m_over_epsilon_per_column():
    """Protects the DP schema estimate's budget split: with m columns sharing epsilon, every
    count (bounds grid and category lists) gets Laplace noise of scale m/epsilon (KS)."""
    epsilon, frame = 3.0, table(200, 3)
    m = len(frame.columns)
    noise = []
    for seed in range(8):
        probe = NoiseProbe(np.random.default_rng(seed))
        dp_bounds.infer_schema_dp(frame, "y", ["colour"], epsilon, 1e-6, "binary", rng=probe)
        assert len(probe.calls) == m and all(call["scale"] == pytest.approx(m / epsilon) for call in probe.calls)
        noise.extend(np.concatenate([call["noise"] for call in probe.calls]))
    assert_law(noise, stats.laplace(scale=m / epsilon).cdf, stats.laplace(scale=m / epsilon / 2).cdf)


# ======================================================================================
# Accountants: epsilon never falls when a step is added (nor as look-ahead looks further),
# never rises when delta grows, and never rises with more noise (data-independent figures:
# a data-dependent bound may legitimately fall with less noise, when the votes are clear).
# ======================================================================================
DELTAS = (1e-10, 1e-7, 1e-5, 1e-3, 1e-1, 0.5)
VOTES = np.array([[9, 1, 0], [5, 4, 1], [10, 0, 0], [4, 3, 3]])


def gnmax_step(accountant, sigma1, sigma2):
    """Four threshold checks, three answered (their log q~ from the votes at sigma2)."""
    accountant.step(sigma1, sigma2, 4, gnmax_log_q(VOTES, sigma2)[:3])


#: name -> (fresh accountant, one step at noise scale s, look-ahead of k steps at s,
#: whether epsilon must fall as s grows). ``s`` is each mechanism's noise in its own units.
ACCOUNTANTS = {
    "opacus-rdp": (lambda: OpacusAccountant("rdp"),
                   lambda a, s: a.step(noise_multiplier=s, sample_rate=0.02),
                   lambda a, d, k, s: a.epsilon_if(d, steps=k, noise_multiplier=s, sample_rate=0.02), True),
    "gaussian": (GaussianAccountant, lambda a, s: a.step(noise_multiplier=s),
                 lambda a, d, k, s: a.epsilon_if(d, steps=k, noise_multiplier=s), True),
    "selected-critic": (SelectedCriticGaussianAccountant, lambda a, s: a.step(noise_multiplier=s, num_critics=20),
                        lambda a, d, k, s: a.epsilon_if(d, steps=k, noise_multiplier=s, num_critics=20), True),
    "pate-data-independent": (lambda: PATEMomentsAccountant("data-independent"), lambda a, s: a.step(1 / s, [0, 3, 8]),
                              lambda a, d, k, s: a.epsilon_if_queries(d, 3 * k, 1 / s), True),
    "pate-data-dependent": (lambda: PATEMomentsAccountant("data-dependent"), lambda a, s: a.step(1 / s, [0, 3, 8]),
                            lambda a, d, k, s: a.epsilon_if_queries(d, 3 * k, 1 / s, vote_gap=3), False),
    "gnmax-data-independent": (lambda: ConfidentGNMaxAccountant("data-independent"),
                               lambda a, s: gnmax_step(a, 2 * s, s),
                               lambda a, d, k, s: a.epsilon_if_queries(d, 4 * k, 2 * s, s, answered_fraction=0.75),
                               True),
    "gnmax-data-dependent": (lambda: ConfidentGNMaxAccountant("data-dependent"),
                             lambda a, s: gnmax_step(a, 2 * s, s),
                             lambda a, d, k, s: a.epsilon_if_queries(d, 4 * k, 2 * s, s, answered_fraction=0.75,
                                                                     log_q=float(gnmax_log_q(VOTES, s)[0])), False),
}
NOISE_RANGE = {"opacus-rdp": (0.7, 4.0), "gaussian": (0.7, 30.0), "selected-critic": (0.7, 10.0),
               "pate-data-independent": (0.5, 20.0), "pate-data-dependent": (0.5, 20.0),
               "gnmax-data-independent": (0.5, 10.0), "gnmax-data-dependent": (0.5, 10.0)}
MONOTONE = settings(max_examples=6, deadline=None, derandomize=True, database=None)


def assert_non_decreasing(values) -> None:
    assert all(b >= a * (1 - 1e-12) for a, b in zip(values, values[1:])), values


def assert_non_increasing(values) -> None:
    assert_non_decreasing(values[::-1])


def stepped(name: str, noise: float, steps: int):
    make, step, _, _ = ACCOUNTANTS[name]
    accountant = make()
    for _ in range(steps):
        step(accountant, noise)
    return accountant


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
@MONOTONE
@given(data=st.data())
def test_accountant_epsilon_never_falls_with_more_steps_or_a_longer_look_ahead(name, data):
    """Protects against an accountant that forgets spending (a step that lowers epsilon) or a
    look-ahead that under-plans: epsilon after k+1 steps >= after k, epsilon_if(k) non-decreasing
    in k, epsilon_if(0) = epsilon now, and epsilon >= 0."""
    noise = data.draw(st.floats(*NOISE_RANGE[name]), label="noise")
    chunks = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=3), label="chunks")
    delta = data.draw(st.sampled_from(DELTAS[1:4]), label="delta")
    make, step, look, _ = ACCOUNTANTS[name]
    accountant, epsilons = make(), [0.0]
    for chunk in chunks:
        for _ in range(chunk):
            step(accountant, noise)
            epsilons.append(accountant.get_epsilon(delta))
        ahead = [look(accountant, delta, k, noise) for k in (0, 1, 2, 5, 40)]
        assert ahead[0] == pytest.approx(epsilons[-1], rel=1e-9)
        assert_non_decreasing(ahead)
        assert ahead[-1] > ahead[0]  # and it does look ahead
    assert epsilons[1] > 0
    assert_non_decreasing(epsilons)
    if len(epsilons) > 2:
        assert epsilons[-1] > epsilons[1]  # and later steps are charged too


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
@MONOTONE
@given(noise=st.floats(0.7, 4.0), steps=st.integers(1, 30))
def test_accountant_epsilon_never_rises_with_delta_and_is_never_negative(name, noise, steps):
    """Protects the (epsilon, delta) conversion: a larger delta never costs a larger epsilon,
    and epsilon is never reported below 0 (even for a delta so large it is meaningless)."""
    accountant = stepped(name, noise, steps)
    epsilons = [accountant.get_epsilon(delta) for delta in DELTAS]
    assert_non_increasing(epsilons)
    assert epsilons[0] > epsilons[2] > 0  # delta is used
    assert min(epsilons) >= 0.0


@pytest.mark.parametrize("name", sorted(name for name, spec in ACCOUNTANTS.items() if spec[3]))
@MONOTONE
@given(steps=st.integers(1, 30), delta=st.sampled_from(DELTAS[:4]))
def test_accountant_epsilon_never_rises_with_more_noise(name, steps, delta):
    """Protects the accounting formulas' direction: more noise never costs more epsilon (for the
    same steps), whether charged by stepping or planned by look-ahead."""
    low, high = NOISE_RANGE[name]
    noises = np.geomspace(low, high, 6).tolist()
    _, _, look, _ = ACCOUNTANTS[name]
    for epsilons in ([stepped(name, s, steps).get_epsilon(delta) for s in noises],
                     [look(ACCOUNTANTS[name][0](), delta, steps, s) for s in noises]):
        assert_non_increasing(epsilons)
        assert epsilons[0] > epsilons[-1]  # the noise is used


def test_gnmax_data_dependent_epsilon_never_rises_with_more_threshold_noise():
    """The threshold step is charged data-independently: with the answers' noise sigma2 (hence
    their log q~) fixed, more threshold noise sigma1 never costs more."""
    epsilons = []
    for sigma1 in np.geomspace(0.5, 50, 8):
        accountant = ConfidentGNMaxAccountant("data-dependent")
        for _ in range(5):
            accountant.step(sigma1, 2.0, 4, gnmax_log_q(VOTES, 2.0)[:3])
        epsilons.append(accountant.get_epsilon(1e-5))
    assert_non_increasing(epsilons)


def test_subsampled_and_selected_critic_epsilon_follow_the_sampling_rate():
    """More sampling costs more: Opacus' epsilon never falls as the Poisson rate q grows, and
    GS-WGAN's never rises with the number of critics one is drawn from (gamma = 1/N)."""
    opacus = []
    for rate in (0.001, 0.01, 0.05, 0.2, 1.0):
        accountant = OpacusAccountant("rdp")
        for _ in range(20):
            accountant.step(noise_multiplier=1.2, sample_rate=rate)
        opacus.append(accountant.get_epsilon(1e-5))
    assert_non_decreasing(opacus)
    critics = []
    for num_critics in (1, 2, 5, 50, 1000):
        accountant = SelectedCriticGaussianAccountant()
        for _ in range(20):
            accountant.step(noise_multiplier=1.2, num_critics=num_critics)
        critics.append(accountant.get_epsilon(1e-5))
    assert_non_increasing(critics)


def test_prv_accountant_is_monotone_in_steps_delta_and_noise():
    """The PRV accountant (numerical composition, slower: a small fixed grid): the same three
    properties as above."""
    accountant, epsilons = OpacusAccountant("prv"), []
    for _ in range(4):
        accountant.step(noise_multiplier=1.1, sample_rate=0.02)
        epsilons.append(accountant.get_epsilon(1e-5))
    assert_non_decreasing(epsilons)
    assert_non_decreasing([accountant.epsilon_if(1e-5, steps=k) for k in (0, 1, 10)])
    deltas = [accountant.get_epsilon(delta) for delta in DELTAS]
    assert_non_increasing(deltas)
    assert min(deltas) >= 0.0
    noisier = []
    for sigma in (0.8, 1.6, 3.2):
        accountant = OpacusAccountant("prv")
        for _ in range(10):
            accountant.step(noise_multiplier=sigma, sample_rate=0.02)
        noisier.append(accountant.get_epsilon(1e-5))
    assert_non_increasing(noisier)


# ======================================================================================
# No private read outside a mechanism (preprocessing): with a public schema and min-max or
# bounds modes nothing released depends on the rows; otherwise the rows reach what is
# released only through the DP mechanisms (infer_schema_dp, dp_column_histograms), and
# only the train split does.
# ======================================================================================
def other_king_rows(tmp_path: Path) -> Path:
    """King's fixture with every row changed: rows resampled, prices and areas rewritten."""
    raw = pd.read_csv(FIXTURES / "king_tiny" / "kc_house_data.csv", dtype=str)
    other = raw.iloc[np.random.default_rng(0).integers(0, len(raw), len(raw))].reset_index(drop=True)
    other["price"] = (other["price"].astype(float) * 3.7 + 1234).round().astype(int).astype(str)
    other["sqft_living"] = other["sqft_living"].iloc[::-1].to_numpy()
    other["sqft_lot"] = (other["sqft_lot"].astype(float) * 50).astype(str)  # far beyond its bound: clipped
    folder = tmp_path / "king_other"
    folder.mkdir()
    other.to_csv(folder / "kc_house_data.csv", index=False)
    return folder


def released(datamodule) -> dict:
    """Everything a datamodule releases or hands to training besides the encoded rows."""
    return {"schema": datamodule.schema.to_dict(), "shape": datamodule.data_shape, "cost": datamodule.privacy_cost(),
            "transformer": datamodule.released_transformer(), "layout": datamodule.table_layout}


def encoded(datamodule, frame: pd.DataFrame) -> torch.Tensor:
    if datamodule.mode_specific:
        return datamodule.table_transformer.encode(frame, seed=0)[0]
    return datamodule.encoded_schema.encode(frame)[0]


@pytest.mark.parametrize("config", [{"encoding": "minmax"}, {"encoding": "mode-specific", "modes": "bounds"}],
                         ids=["minmax", "bounds-modes"])
def test_a_public_schema_datamodule_reads_no_statistic_of_the_rows(config, tmp_path):
    """Protects against a leak such as fitting bounds, modes or frequencies on the rows: a
    built-in table on two datasets that differ in every row releases the same schema, encoder,
    layout and cost 0 -- also after setup() has read the rows -- and encodes a record the same."""
    modules = [KingDataModule(data_dir=folder, download=False, batch_size=8, **config)
               for folder in (FIXTURES / "king_tiny", other_king_rows(tmp_path))]
    before = [released(m) for m in modules]
    for module in modules:
        module.setup("fit")
    a, b = modules
    assert not torch.equal(a.train_dataset.tensors[0], b.train_dataset.tensors[0])  # the rows did differ
    assert released(a) == released(b) == before[0] == before[1]
    assert a.privacy_cost()["epsilon"] == 0.0 and a.privacy_cost()["delta"] == 0.0
    probe = a.train_frame.head(6)
    assert torch.equal(encoded(a, probe), encoded(b, probe))


def stand_in(original, frames: list, public: pd.DataFrame, seed: list):
    """A stand-in for a DP mechanism that records the frame it was given, then releases what the
    real mechanism releases on ``public`` rows (noise from ``seed[0]``): whatever the private rows,
    the same release, so anything that still differs between datasets leaked around it."""

    def mechanism(frame, *args, rng=None, **kwargs):
        frames.append(frame)
        return original(public, *args, rng=np.random.default_rng(seed[0]), **kwargs)

    return mechanism


def test_dp_modes_reach_the_rows_only_through_the_dp_histogram(tmp_path, monkeypatch):
    """Protects modes="dp" against a read of the rows besides the DP histogram (e.g. modes or
    frequencies refitted on the rows): with the histogram's release fixed, two datasets differing
    in every row give the same transformer, layout and cost; the histogram saw the train split
    only; and a different release does change the transformer (the check is not vacuous)."""
    frames, seed = [], [0]
    monkeypatch.setattr(table_transformer, "dp_column_histograms",
                        stand_in(table_transformer.dp_column_histograms, frames, table(300, 99), seed))
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(HIST_SCHEMA.to_dict()))
    roles = {"mixed": HIST_ROLES["special_values"], "log_columns": HIST_ROLES["log_columns"],
             "discrete_columns": HIST_ROLES["discrete"]}

    def module(rows_seed):
        path = tmp_path / f"rows{rows_seed}.csv"
        (table(300, rows_seed) if rows_seed >= 0 else odd_table(300)).to_csv(path, index=False)
        datamodule = CSVDataModule(csv=path, schema=schema_file, encoding="mode-specific", modes="dp",
                                   modes_epsilon=1.0, max_modes=1, batch_size=8, **roles)
        datamodule.setup("fit")
        return datamodule

    a, b = module(0), module(-1)  # rows of table() and of odd_table()
    assert released(a) == released(b) and a.privacy_cost()["epsilon"] == 1.0
    assert len(frames) == 2 and frames[0] is a.train_frame and frames[1] is b.train_frame
    probe = a.train_frame.head(6)
    assert torch.equal(encoded(a, probe), encoded(b, probe))
    seed[0] = 1
    assert released(module(0))["transformer"] != released(a)["transformer"]


def test_a_csv_without_schema_reaches_the_rows_only_through_its_dp_mechanisms(tmp_path, monkeypatch):
    """Protects the schema-less CSV path: with both DP releases fixed (the schema estimate and
    the modes' histogram), two CSVs differing in every row give the same schema, transformer,
    layout and composed cost; each mechanism saw the train split only, never the test split."""
    schema_frames, histogram_frames, seed = [], [], [0]
    public = table(300, 99)
    monkeypatch.setattr(csv_module, "infer_schema_dp",
                        stand_in(csv_module.infer_schema_dp, schema_frames, public, seed))
    monkeypatch.setattr(table_transformer, "dp_column_histograms",
                        stand_in(table_transformer.dp_column_histograms, histogram_frames, public, seed))

    def module(rows_seed):
        path = tmp_path / f"rows{rows_seed}.csv"
        (table(300, rows_seed) if rows_seed >= 0 else odd_table(300)).to_csv(path, index=False)
        datamodule = CSVDataModule(csv=path, target="y", categorical="colour", label_kind="binary", integer=["gain"],
                                   bounds_epsilon=5.0, encoding="mode-specific", modes_epsilon=1.0, max_modes=1,
                                   batch_size=8)
        datamodule.setup("fit")
        return datamodule

    a, b = module(0), module(-1)  # rows of table() and of odd_table()
    assert released(a) == released(b)
    assert a.privacy_cost()["epsilon"] == pytest.approx(6.0) and a.privacy_cost()["delta"] == 1e-6
    for frames in (schema_frames, histogram_frames):
        assert len(frames) == 2 and frames[0] is a.train_frame and frames[1] is b.train_frame
    assert not set(a.train_frame.index) & set(a.test_frame.index)
    probe = a.train_frame.head(6)
    assert torch.equal(encoded(a, probe), encoded(b, probe))


def test_dp_modes_noise_from_a_datamodule_is_laplace_with_scale_d_over_epsilon(monkeypatch):
    """Protects the budget of a built-in's DP modes: the datamodule's histogram release adds
    Laplace(d / modes_epsilon) to every bin of the d histogrammed columns (King: 19, its
    continuous label is a min-max scalar and needs none) -- KS on the noise actually added."""
    probes = []
    original = table_transformer.dp_column_histograms

    def probed(*args, rng=None, **kwargs):
        probes.append(NoiseProbe(np.random.default_rng(3)))
        return original(*args, rng=probes[-1], **kwargs)

    monkeypatch.setattr(table_transformer, "dp_column_histograms", probed)
    datamodule = KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, encoding="mode-specific",
                                modes_epsilon=2.0, max_modes=1, histogram_bins=128)
    assert datamodule.privacy_cost()["epsilon"] == 2.0
    (probe,) = probes
    d = len(datamodule.schema.columns) - 1
    assert d == 19 and {call["scale"] for call in probe.calls} == {d / 2.0}
    noise = np.concatenate([call["noise"] for call in probe.calls])
    assert_law(noise, stats.laplace(scale=d / 2.0).cdf, stats.laplace(scale=d / 4.0).cdf)


def test_a_value_on_an_interior_edge_is_counted_in_the_bin_it_opens():
    """H10: bins are [e_i, e_i+1) (the top one closed): an integer on an edge belongs to the bin
    above it. Counting it in the bin below shifts an integer column's modes and marginal down."""
    schema = TableSchema(columns=(Column("n", "integer", bounds=(0, 4), source="test"),))
    frame = pd.DataFrame({"n": [0, 1, 2, 2, 3, 4]})
    histograms, _ = dp_column_histograms(frame, schema, 1.0, bins=4, rng=NoiseProbe())
    assert histograms["n"].counts.tolist() == [1.0, 1.0, 2.0, 2.0]
