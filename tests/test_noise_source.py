"""Every mechanism draws its noise from its own generator (``NoiseSource``), seeded from OS
entropy: the run's ``--seed`` (recorded in config.yaml) must not let anyone replay the noise."""
import json
from unittest.mock import patch

import pytest
import torch
from torch import nn

from lightning_dpgan.callbacks.dp_sgd import DPSGD
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism
from lightning_dpgan.privacy.gradient_sanitizer import GradientSanitizerMechanism
from lightning_dpgan.privacy.gradient_voting import ProjectedGradientAggregator
from lightning_dpgan.privacy.noise_source import NoiseSource
from lightning_dpgan.privacy.pate import PATELabelAggregator


def pate_release(noise: NoiseSource) -> torch.Tensor:
    """Answers to 200 tied votes: each is decided by the Laplace noise alone."""
    aggregator = PATELabelAggregator(1.0, on_answer=lambda *args: None, noise=noise)
    return aggregator.aggregate(torch.full((200, 2), 5.0))


def gpate_release(noise: NoiseSource) -> torch.Tensor:
    gradients = torch.randn(9, 6, 20, generator=torch.Generator().manual_seed(4)) * 1e-3
    aggregator = ProjectedGradientAggregator(4, 5, 2e-3, 1.0, 1.0, 3.0, check=lambda votes: None,
                                             charge=lambda *args: None, noise=noise)
    return aggregator.aggregate(gradients)


def dp_sgd_release(noise: NoiseSource) -> torch.Tensor:
    """One DP-SGD step whose real gradient is zero: the applied gradient is the noise."""
    network = nn.Linear(3, 1)
    mechanism = DPSGDMechanism(1.0, 1.0, 4, noise=noise, mode="hooks")
    mechanism.attach(network)
    optimizer = mechanism.wrap_optimizer(torch.optim.SGD(network.parameters(), lr=1.0))
    optimizer.zero_grad()
    mechanism.backward_real((network(torch.ones(4, 3)) * 0.0).sum(1))
    optimizer.step()
    return network.weight.grad.detach().clone()  # the noisy gradient the step applied


def sanitizer_release(noise: NoiseSource) -> torch.Tensor:
    generated = torch.zeros(8, 5, requires_grad=True)
    mechanism = GradientSanitizerMechanism(1.0, 1.0, noise=noise)
    (mechanism.sanitize(generated) * 0.0).sum().backward()
    return generated.grad


RELEASES = [pate_release, gpate_release, dp_sgd_release, sanitizer_release]


@pytest.mark.parametrize("release", RELEASES, ids=lambda f: f.__name__)
def test_the_global_seed_does_not_fix_a_mechanisms_noise(release):
    torch.manual_seed(0)
    first = release(NoiseSource())
    torch.manual_seed(0)
    second = release(NoiseSource())
    assert not torch.equal(first, second)


@pytest.mark.parametrize("release", RELEASES, ids=lambda f: f.__name__)
def test_a_noise_seed_makes_the_draws_reproducible(release):
    torch.manual_seed(0)
    first = release(NoiseSource(7))
    torch.manual_seed(1)  # a different global stream: only public draws (G-PATE's projections) may follow it
    second = release(NoiseSource(7))
    torch.manual_seed(0)
    third = release(NoiseSource(8))
    if release is not gpate_release:
        assert torch.equal(first, second)
    assert not torch.equal(first, third)


def test_generators_are_made_once_per_device_and_seeded_apart():
    source = NoiseSource()
    assert source.generator("cpu") is source.generator(torch.device("cpu"))
    assert NoiseSource().generator().initial_seed() != source.generator().initial_seed()
    assert not source.seeded and "OS entropy" in source.describe()
    assert "FIXED SEED 3" in NoiseSource(3).describe()


@pytest.mark.parametrize("seed", [-1, 1.5, True, "7", 2**63, 10**20])
def test_a_bad_noise_seed_is_refused(seed):
    """2**63 and above: the seed plus a DDP rank must fit torch's 64-bit seed (10**20 ended in
    torch's "Overflow when unpacking long long", naming no option)."""
    with pytest.raises(ValueError, match="noise_seed"):
        NoiseSource(seed)


def test_the_largest_noise_seed_seeds_every_rank():
    with patch("lightning_dpgan.privacy.noise_source.rank", return_value=7):
        assert NoiseSource(2**63 - 1).generator().initial_seed() == 2**63 + 6


def poisson_batches(strategy: DPSGD) -> list[list[int]]:
    from types import SimpleNamespace

    from torch.utils.data import TensorDataset

    strategy.sample_rate = 0.25
    datamodule = SimpleNamespace(train_dataset=TensorDataset(torch.arange(40)), hparams=SimpleNamespace(num_workers=0))
    strategy._use_poisson_sampling(datamodule)
    return [batch[0].tolist() for batch in datamodule.train_dataloader()]


def test_dp_sgd_poisson_batches_do_not_follow_the_run_seed():
    """Amplification by subsampling assumes nobody knows which records a batch holds."""
    torch.manual_seed(0)
    first = poisson_batches(DPSGD(noise_multiplier=1.0))
    torch.manual_seed(0)
    second = poisson_batches(DPSGD(noise_multiplier=1.0))
    assert first != second
    assert poisson_batches(DPSGD(noise_multiplier=1.0, noise_seed=3)) == poisson_batches(DPSGD(noise_multiplier=1.0, noise_seed=3))


@pytest.mark.parametrize("strategy", ["pate", "gpate", "sanitizer", "dp-sgd"])
def test_every_strategy_takes_a_noise_seed(strategy):
    from lightning_dpgan import registry

    cls = registry.lookup("privacy", strategy).load()
    kwargs = {"noise_multiplier": 1.0} if strategy in ("sanitizer", "dp-sgd") else {}
    assert cls(noise_seed=5, **kwargs).noise.seed == 5
    assert cls(**kwargs).noise.seed is None


@pytest.mark.parametrize("release", RELEASES, ids=lambda f: f.__name__)
def test_a_resumed_fixed_seed_does_not_replay_the_first_segments_draws(release):
    """With --privacy.noise_seed and no saved generator state, a resume seeded the same way would
    add the first segment's noise again (and draw its batches again)."""
    torch.manual_seed(0)  # the same public draws (G-PATE's projections) each time: only the noise differs
    first = release(NoiseSource(3))
    torch.manual_seed(0)
    resumed = release(_continued(3, 5))
    torch.manual_seed(0)
    again = release(_continued(3, 5))
    assert not torch.equal(resumed, first)
    assert torch.equal(resumed, again)  # still reproducible


def _continued(seed: int, steps: int) -> NoiseSource:
    source = NoiseSource(seed)
    source.continue_after(steps)
    return source


def test_a_second_resume_does_not_replay_the_first_resumes_draws():
    """Each continuation's stream is its own: resumed after 5 steps, then after 9."""
    after_five, after_nine = (torch.rand(4, generator=_continued(3, steps).generator("cpu")) for steps in (5, 9))
    assert not torch.equal(after_five, after_nine)


@pytest.mark.parametrize("steps", [0, 5])
def test_processes_of_a_fixed_seed_run_draw_apart(monkeypatch, steps):
    """Under DDP each rank draws its own noise share and batch sample: one stream for all would
    add the same noise on every rank (and sample the same records)."""
    from lightning_dpgan.privacy import noise_source

    draws = []
    for process in (0, 1):
        monkeypatch.setattr(noise_source, "rank", lambda process=process: process)
        draws.append(torch.rand(4, generator=_continued(3, steps).generator("cpu")))
    assert not torch.equal(*draws)


def test_continuing_re_seeds_a_generator_already_handed_out():
    """DP-SGD's batch sampler takes its generator before the checkpoint is read."""
    source = NoiseSource(3)
    held = source.generator("cpu")
    source.continue_after(7)
    assert torch.equal(torch.rand(4, generator=held), torch.rand(4, generator=_continued(3, 7).generator("cpu")))
    first_segment = torch.rand(4, generator=NoiseSource(3).generator("cpu"))
    assert not torch.equal(torch.rand(4, generator=_continued(3, 7).generator("cpu")), first_segment)


def test_a_run_with_a_fixed_noise_seed_is_flagged_not_for_release_by_train_sample_and_evaluate(
        tiny_image_data_dir, tmp_path, capsys):
    """privacy.json named the seed in noise_source, but train, sample and evaluate stated the
    epsilon as the run's guarantee: anyone with the seed (config.yaml records it) replays the noise."""
    from run_helpers import read_json, tiny_run_args

    from lightning_dpgan.cli import main

    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, model="dpgan", steps=2) + ["--privacy.noise_seed", "1"]) == 0
    said = capsys.readouterr().err
    assert "train: warning: this run is not private: its secret draws came from a fixed seed (from step 0: FIXED SEED 1" \
           in said and "release neither its synthetic data nor its checkpoint" in said
    assert main(["sample", "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "-n", "4",
                 "--out", str(tmp_path / "drawn.png")]) == 0
    assert "these records are not for release: the checkpoint's run is not private" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(run), "--cnn-epochs", "1", "-n", "20"]) == 0
    assert "This run is not private: its secret draws came from a fixed seed" in capsys.readouterr().err
    note = read_json(run / "evaluation.json")["privacy_note"]
    assert note.startswith("This run is not private: its secret draws") and "release. These measures are read" in note
    assert "The run is not private" in (run / "report.md").read_text().split("## Privacy")[0]
    # privacy.json's noise_source edited away: the checkpoint's segments still name the seed
    privacy = read_json(run / "privacy.json")
    (run / "privacy.json").write_text(json.dumps({**privacy, "noise_source": "own generator seeded from OS entropy"}))
    assert main(["evaluate", "--run", str(run), "--cnn-epochs", "1", "-n", "20"]) == 0
    assert read_json(run / "evaluation.json")["privacy_note"].startswith("This run is not private: its secret draws")
    assert "This run is not private" in capsys.readouterr().err
    # without the seed, none of it
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "private", model="dpgan", steps=2)) == 0
    assert "not private" not in capsys.readouterr().err
