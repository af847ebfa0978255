"""User-facing checks on the privacy budget: each error names the flag to change."""

from __future__ import annotations

import pytest

from lightning_dpgan.privacy import validate_delta, validate_epsilon, validate_positive


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("inf"), float("nan"), "1.0", None, True])
def test_invalid_epsilon_names_the_flag(epsilon):
    with pytest.raises(ValueError, match="--epsilon"):
        validate_epsilon(epsilon)


def test_valid_epsilon_is_returned_as_float():
    assert validate_epsilon(3) == 3.0
    assert isinstance(validate_epsilon(3), float)


@pytest.mark.parametrize("delta", [0.0, -1e-5, 1.0, 1.5, float("nan"), float("inf"), "1e-5"])
def test_invalid_delta_names_the_flag(delta):
    with pytest.raises(ValueError, match="--delta"):
        validate_delta(delta)


@pytest.mark.parametrize(("delta", "n_records"), [(1e-3, 1000), (2e-3, 1000), (0.5, 3)])
def test_delta_not_below_one_over_n_is_an_error(delta, n_records):
    with pytest.raises(ValueError) as error:
        validate_delta(delta, n_records=n_records)

    message = str(error.value)
    assert "--delta" in message
    assert f"{delta:g}" in message
    assert f"1/n = {1 / n_records:g}" in message
    assert "e.g. --delta 1e-05" in message


def test_delta_suggestion_stays_below_one_over_n_for_large_datasets():
    with pytest.raises(ValueError, match=r"e\.g\. --delta 1e-06"):
        validate_delta(1e-5, n_records=100_000)


def test_valid_delta_passes_with_and_without_n():
    assert validate_delta(1e-5) == 1e-5
    assert validate_delta(1e-5, n_records=1000) == 1e-5
    assert validate_delta(9.9e-4, n_records=1000) == 9.9e-4


@pytest.mark.parametrize("n_records", [0, -5, 2.5, True])
def test_delta_rejects_a_bad_record_count(n_records):
    with pytest.raises(ValueError, match="n_records"):
        validate_delta(1e-5, n_records=n_records)


@pytest.mark.parametrize("value", [0, -0.5, float("inf"), float("nan"), "2"])
def test_invalid_positive_names_the_given_flag(value):
    with pytest.raises(ValueError, match="--noise-multiplier"):
        validate_positive("--noise-multiplier", value)


def test_valid_positive_is_returned_as_float():
    assert validate_positive("--lr", 2) == 2.0


@pytest.mark.parametrize("world_size", [2, 1])
@pytest.mark.parametrize("strategy", ["dp-sgd", "pate", "gpate", "sanitizer"])
def test_every_privacy_strategy_refuses_lightnings_own_multi_process_strategies(strategy, world_size):
    """Lightning's DistributedDataParallel averages gradients in backward and each rank would
    draw its own noise: only ``--strategy ddp`` (PrivateDDPStrategy) is accepted. In one process
    too: a library user's Trainer(strategy="ddp_find_unused_parameters_true", devices=1) swapped
    DP-SGD's secret shuffle for Lightning's publicly seeded DistributedSampler."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    from lightning_dpgan import registry

    cls = registry.lookup("privacy", strategy).load()
    model = {"dp-sgd": "dpgan", "pate": "pategan", "gpate": "gpate", "sanitizer": "gswgan"}[strategy]
    shape = (4,) if model == "pategan" else (1, 8, 8)
    module = registry.lookup("model", model).load()(shape, None)
    from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping

    instance = cls(target_epsilon=1.0) if strategy in ("dp-sgd", "sanitizer") else cls()
    trainer = SimpleNamespace(world_size=world_size, strategy=DDPStrategy(), callbacks=[instance, PrivacyBudgetStopping(1.0)])
    with pytest.raises(ValueError, match=r"only with --strategy ddp \(got DDPStrategy\).*PrivateDDPStrategy\(\)"):
        instance.setup(trainer, module, "fit")


def test_validate_int_refuses_what_it_would_otherwise_truncate_and_the_values_below_the_minimum():
    import numpy as np

    from lightning_dpgan.privacy.validation import validate_int

    assert validate_int("count", np.int64(3), 1) == 3 and type(validate_int("count", np.int64(3), 1)) is int
    assert validate_int("queries", 0, 0) == 0
    for bad in (2.5, True, "3", None, 0):
        with pytest.raises(ValueError, match="count must be an integer >= 1"):
            validate_int("count", bad, 1)


@pytest.mark.parametrize(("strategy", "option"), [("dp-sgd", "noise_multiplier"), ("sanitizer", "noise_multiplier"),
                                                  ("pate", "lap_inverse_scale"), ("gpate", "sigma1"), ("gpate", "sigma2")])
@pytest.mark.parametrize("value", [1e300, 1e-300])
def test_a_noise_scale_the_accountants_cannot_square_is_refused_naming_it(strategy, option, value):
    """1e300 overflowed and 1e-300 divided by zero inside an accountant, as a traceback after the
    data was read; the strategy refuses them when it is built, naming the option and its range."""
    from lightning_dpgan import registry

    cls = registry.lookup("privacy", strategy).load()
    with pytest.raises(ValueError, match=f"--privacy.{option} must be between 1e-100 and 1e\\+100"):
        cls(target_epsilon=1.0, delta=1e-5, **{option: value})
    cls(target_epsilon=1.0, delta=1e-5, **{option: 1e-100 if value < 1 else 1e100})  # the range's ends are taken


@pytest.mark.parametrize("build, option, value", [
    ("pate", "num_teachers", float("nan")), ("pate", "num_teachers", 2.5), ("pate", "teacher_batch_size", True),
    ("gpate", "projection_dim", "3"), ("gpate", "bins", 1), ("gpate", "num_teachers", float("inf")),
    ("sanitizer", "num_critics", float("inf")), ("sanitizer", "generated_batch_size", 2.5),
])
def test_a_strategys_counts_are_whole_numbers_refused_by_their_flag(build, option, value):
    """NaN, 2.5, True or a string passed a "< 1" check (or raised a bare TypeError or an
    OverflowError) and failed deep in the first training step, under another name."""
    from lightning_dpgan import registry

    strategy = registry.lookup("privacy", build).load()
    noise = {"noise_multiplier": 1.0} if build == "sanitizer" else {}
    with pytest.raises(ValueError, match=rf"^--privacy\.{option} must be an integer >= \d, got "):
        strategy(**noise, **{option: value})


def _own_datamodule_case(strategy):
    """A strategy and a module it fits, built as a library user would."""
    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.callbacks.gradient_sanitizer import GradientSanitizer
    from lightning_dpgan.callbacks.pate import PATEAggregation
    from lightning_dpgan.modules.dpgan import DPGAN
    from lightning_dpgan.modules.gswgan import GSWGAN
    from lightning_dpgan.modules.pategan import PATEGAN

    return {"dp-sgd": lambda: (DPSGD(noise_multiplier=1.0), DPGAN((6,), None, arch="mlp")),
            "pate": lambda: (PATEAggregation(), PATEGAN((6,))),
            "sanitizer": lambda: (GradientSanitizer(noise_multiplier=1.0), GSWGAN((6,), None, arch="mlp")),
            "critics": lambda: (GradientSanitizer(noise_multiplier=1.0, num_critics=3),
                                GSWGAN((6,), None, arch="mlp", num_critics=3))}[strategy]()


@pytest.mark.parametrize("strategy, lacks", [("dp-sgd", "lacks hparams.batch_size, hparams.num_workers"),
                                             ("pate", "lacks partitions"),
                                             ("sanitizer", "lacks hparams.batch_size"),  # one critic: no partitions
                                             ("critics", "lacks hparams.batch_size, partitions")])
def test_a_users_own_datamodule_is_told_what_the_strategy_reads_from_it(strategy, lacks):
    """A plain LightningDataModule was told to pass a datamodule instead of train_dataloaders (it
    had), then, given a train_dataset, met raw AttributeErrors for batch_size or partitions."""
    from types import SimpleNamespace

    import lightning as L
    import torch
    from torch.utils.data import TensorDataset

    class OwnData(L.LightningDataModule):
        def __init__(self):
            super().__init__()
            self.train_dataset = TensorDataset(torch.rand(32, 6))

    instance, module = _own_datamodule_case(strategy)
    trainer = SimpleNamespace(world_size=1, strategy=None, callbacks=[instance], datamodule=OwnData())
    name = "sanitizer" if strategy == "critics" else strategy
    with pytest.raises(ValueError, match=rf"--privacy {name} reads .* from its datamodule, and OwnData {lacks} "
                                         r"\(after its setup\('fit'\)\)"):
        instance.setup(trainer, module, "fit")
    assert module.privacy is None


def test_private_ddp_in_one_process_is_refused_for_a_trainer_built_by_hand():
    """In one process Lightning's DDP still puts its distributed sampler, which anyone can replay,
    in place of DP-SGD's secret shuffle (train swaps the strategy out itself)."""
    from types import SimpleNamespace

    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.ddp import PrivateDDPStrategy
    from lightning_dpgan.modules.dpgan import DPGAN

    strategy = DPSGD(noise_multiplier=1.0, poisson_sampling=False)
    trainer = SimpleNamespace(world_size=1, strategy=PrivateDDPStrategy(), callbacks=[strategy])
    with pytest.raises(ValueError, match="PrivateDDPStrategy in one process .* use it with devices > 1"):
        strategy.setup(trainer, DPGAN((6,), None, arch="mlp"), "fit")
