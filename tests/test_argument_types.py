"""Configuration values checked against the annotations of the arguments they fill."""
import datetime
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as L
import pytest

from lightning_dpgan.argument_types import annotations_of, describe, matches, mismatches
from lightning_dpgan.cli import main
from lightning_dpgan.modules.pategan import PATEGAN


@pytest.mark.parametrize("value,hint,expected", [
    # a path setting (--data.csv 2020 reached Path(2020), a TypeError): text or a path only
    ("a.csv", str | os.PathLike[str] | None, True), (2020, str | os.PathLike[str] | None, False),
    (Path("a.csv"), os.PathLike, True),
    (True, bool, True), ("maybe", bool, False), (1, bool, False),
    (3, int, True), (True, int, False), (3.5, int, False), ("abc", int, False),
    (3, float, True), (1e-4, float, True), ("abc", float, False), (False, float, False),
    ("x", str, True), (3, str, False),
    (None, int | None, True), ("abc", int | None, False),
    ([0.5, 0.9], tuple[float, float], True), ([0.5], tuple[float, float], False), ("abc", tuple[float, float], False),
    ([16, 16], Sequence[int], True), ([16, "x"], Sequence[int], False), ("16", Sequence[int], False),
    ("a,b", Sequence[str] | str | None, True), ({"k": 1}, dict[str, Any], True), ("abc", dict[str, Any] | None, False),
    ("rdp", Literal["rdp", "prv"], True), ("gdp", Literal["rdp", "prv"], False),
    (object(), Any, True),
    # YAML makes no duration: Lightning's max_time read 5 as one and failed with an AttributeError
    (5, datetime.timedelta, False), ("00:01:00:00", str | datetime.timedelta, True),
])
def test_a_value_matches_its_annotation_as_yaml_gives_it(value, hint, expected):
    assert matches(value, hint) is expected


def test_the_message_says_the_kind_expected():
    assert describe(int | None) == "a whole number or null"
    assert describe(tuple[float, float]) == "a list of 2 (a number, a number)"
    assert describe(Sequence[int]) == "a list (each a whole number)"
    assert describe(bool) == "true or false"


def test_an_argument_that_takes_a_number_or_a_list_takes_both():
    from lightning_dpgan.argument_types import mismatches
    from lightning_dpgan.quail import QUAIL

    assert mismatches("quail", {"hidden": 64}, QUAIL) == mismatches("quail", {"hidden": [64, 32]}, QUAIL) == []
    assert mismatches("quail", {"hidden": "wide"}, QUAIL) == [
        "quail.hidden must be a whole number or a list (each a whole number), got 'wide'"]


def test_annotations_follow_kwargs_up_the_base_classes():
    hints = annotations_of(PATEGAN)
    assert hints["teacher_steps"] is int  # PATEGAN's own
    assert "latent_dim" in hints  # a base class's, reached through **kwargs


class _Base:
    def __init__(self, shared: str = "x", base_only: int = 1) -> None:
        pass


class _Forwarding(_Base):
    def __init__(self, shared: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)


class _Closed(_Base):
    def __init__(self, own: float = 0.5) -> None:
        super().__init__()


def test_a_subclass_annotation_wins_and_the_chain_stops_without_kwargs():
    """A subclass that re-annotates a base's argument is checked by its own annotation (the value
    reaches it first), and a constructor without ``**kwargs`` takes none of its base's arguments:
    ``--model.base_only 3`` on it would be a TypeError deep inside instead of an unknown key."""
    from lightning_dpgan.argument_types import init_arguments

    assert annotations_of(_Forwarding)["shared"] is int  # its own, not the base's str
    assert annotations_of(_Forwarding)["base_only"] is int  # reached through **kwargs
    assert set(init_arguments(_Forwarding)) == {"shared", "base_only"}
    assert set(init_arguments(_Closed)) == {"own"}
    assert set(annotations_of(_Closed)) == {"own"}


@pytest.mark.parametrize("extra,message", [
    (["--model.latent_dim", "abc"], "model.latent_dim must be a whole number, got 'abc'"),
    (["--model.lr", "abc"], "model.lr must be a number, got 'abc'"),
    (["--privacy.num_teachers", "abc"], "privacy.num_teachers must be a whole number or null, got 'abc'"),
    # a network's own arguments, a level down: torch answered "empty(): argument 'size' must be tuple of ints"
    (["--model.generator_kwargs.foo", "1"], "model 'pategan' refused its settings: model.generator_kwargs.foo: not an "
                                            "argument of MLPGenerator (it takes hidden, norm, output_activation)"),
    (["--model.generator_kwargs.hidden", "abc"], "model.generator_kwargs.hidden must be a list (each a whole number), "
                                                 "got 'abc'"),
    (["--model.discriminator_kwargs.hidden", "[16, abc]"], "model.discriminator_kwargs.hidden must be a list (each a "
                                                          "whole number), got [16, 'abc']"),
    # a width of 0: torch built the layer and failed at the first batch, an IndexError from BatchNorm
    (["--model.generator_kwargs.hidden", "[0]"], "model 'pategan' refused its settings: its layers generator.body.0"),
    # Lightning's own arguments: "abc" failed deep inside it (a TypeError), "maybe" was taken and recorded
    (["--trainer.log_every_n_steps", "abc"], "trainer.log_every_n_steps must be a whole number or null, got 'abc'"),
    (["--trainer.enable_model_summary", "maybe"], "trainer.enable_model_summary must be true or false or null, got 'maybe'"),
    (["--trainer.max_time", "5"], "trainer.max_time must be text or a duration or a mapping or null, got 5"),
    # YAML 1.1 reads an unpadded duration in base 60: the number is explained, and how to write it
    (["--trainer.max_time", "1:00:00:00"], "got 216000 (a duration such as 1:00:00:00 is read as a number: write it "
                                          "zero-padded, 01:00:00:00, or quoted)"),
    (["--trainer.max_steps", "-1"], "set trainer.max_steps through the run's own settings (--max-steps)"),  # not "at least 0"
    (["--trainer.num_nodes", "0"], "trainer.num_nodes must be at least 1, got 0"),
    # below what it means something at: Lightning took these in silence (or failed with a TypeError)
    (["--trainer.log_every_n_steps", "-5"], "trainer.log_every_n_steps must be at least 0, got -5"),
    (["--trainer.gradient_clip_val", "-1.0"], "trainer.gradient_clip_val must be at least 0, got -1.0"),
    (["--trainer.num_sanity_val_steps", "-2"], "trainer.num_sanity_val_steps must be at least -1 (-1: all), got -2"),
    (["--trainer.devices", "-1"], "trainer.devices must be at least 1, got -1"),
    # Lightning trained nothing (0) and wrote an untrained generator's table, or refused barebones
    # for a logger the user never gave
    (["--trainer.limit_train_batches", "0"], "trainer.limit_train_batches 0 trains no batch"),
    (["--trainer.limit_train_batches", "0.0"], "trainer.limit_train_batches 0 trains no batch"),
    # Lightning refused these itself, as it started: after a table's DP releases
    (["--trainer.limit_train_batches", "1.5"], "trainer.limit_train_batches 1.5 is neither a count of batches"),
    (["--trainer.limit_train_batches", ".nan"], "trainer.limit_train_batches nan is neither a count of batches"),
    (["--trainer.barebones", "true"], "trainer.barebones turns off the logger and checkpoints a run writes"),
    # no setting means anything at .inf or .nan: a NaN weight clip turned clipping off in silence, and
    # config.yaml wrote either as null, which a rerun from it refused
    (["--model.lr", ".inf"], "model.lr must be a finite number, got inf"),
    (["--model.teacher_lr", ".nan"], "model.teacher_lr must be a finite number, got nan"),
    (["--privacy.lap_inverse_scale", ".inf"], "privacy.lap_inverse_scale must be a finite number, got inf"),
])
def test_a_wrongly_typed_override_is_refused_before_anything_runs(extra, message, tmp_path, capsys):
    data_dir = Path(__file__).parent / "fixtures" / "adult_tiny"
    args = ["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(data_dir),
            "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
            # teachers and a budget the fixture's 36 rows can train with: refused for the override alone
            "--privacy.num_teachers", "3", "--epsilon", "1000", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_name_yaml_reads_as_a_number_or_a_boolean_is_refused_with_how_to_quote_it():
    """A CSV column named 2020 or on, given as --data.target 2020, arrives as a number or True: the
    refusal says how to keep it text, which nothing else would tell a user who typed text."""
    from lightning_dpgan.datamodules.csv import CSVDataModule

    for value in (2020, 1.5, True):
        (refused,) = mismatches("data", {"target": value}, CSVDataModule)
        assert refused == f"data.target must be text or null, got {value!r} (a value is read as YAML, where 2020, 1.5, " \
                          "on or yes are a number or a boolean: quote a name written so, as it is written, e.g. " \
                          "--data.target '\"2020\"')"
    assert mismatches("data", {"target": "2020"}, CSVDataModule) == []
    # where a number is a value the setting takes, quoting is no remedy
    (devices,) = mismatches("trainer", {"devices": 1.5}, L.Trainer)
    assert "quote" not in devices


@pytest.mark.parametrize("model,dataset,extra,message", [
    ("gan", "mnist", ["--model.generator_kwargs.base_channels", "four"],
     "model.generator_kwargs.base_channels must be a whole number, got 'four'"),  # DCGAN
    ("gan", "mnist", ["--model.discriminator_kwargs.width", "4"],
     "model.discriminator_kwargs.width: not an argument of DCGANDiscriminator (it takes base_channels)"),
    ("gpate", "mnist", ["--model.generator_kwargs.channels", "[4]"],
     "model.generator_kwargs.channels must be a whole number, got [4]"),
    # G-PATE's teachers are built once training starts: a misspelt key there was a traceback
    ("gpate", "mnist", ["--model.teacher_kwargs.foo", "1"],
     "model.teacher_kwargs.foo: not an argument of ConvTeacher (it takes channels, hidden, kernel_size)"),
    ("gpate", "adult", ["--model.teacher_kwargs.hidden", "abc"],
     "model.teacher_kwargs.hidden must be a list (each a whole number), got 'abc'"),
    ("dpsactgan", "adult", ["--model.generator_kwargs.heads", "two"],
     "model.generator_kwargs.heads must be a whole number, got 'two'"),
    ("dpsactgan", "adult", ["--model.discriminator_kwargs.tau", "0.2"],
     "model.discriminator_kwargs.tau: not an argument of SACTGANDiscriminator"),
])
def test_each_networks_own_settings_are_checked_by_name(model, dataset, extra, message, tiny_image_data_dir, tmp_path,
                                                        capsys):
    data_dir = tiny_image_data_dir if dataset == "mnist" else Path(__file__).parent / "fixtures" / "adult_tiny"
    checksums = ["--data.verify_checksums", "false"] if dataset == "mnist" else []  # the fixture's files
    args = ["train", "--model", model, "--dataset", dataset, "--data-dir", str(data_dir), "--output-dir",
            str(tmp_path / "run"), "--max-steps", "1", *checksums, *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_trainer_option_is_refused_only_below_the_least_value_it_means_something_at():
    from lightning_dpgan.run import trainer_options_below_their_floor

    assert trainer_options_below_their_floor({"log_every_n_steps": 0, "num_sanity_val_steps": -1, "devices": 1,
                                              "gradient_clip_val": 0.0, "deterministic": True,
                                              "precision": "bf16-mixed"}) == []
    assert trainer_options_below_their_floor({"num_sanity_val_steps": -2, "devices": 0, "max_time": "00:01:00:00",
                                              "limit_train_batches": -0.5, "num_nodes": 0,
                                              "accumulate_grad_batches": 0}) == [
        "trainer.num_sanity_val_steps must be at least -1 (-1: all), got -2",
        "trainer.devices must be at least 1, got 0",
        "trainer.limit_train_batches must be at least 0, got -0.5",
        "trainer.num_nodes must be at least 1, got 0",
        "trainer.accumulate_grad_batches must be at least 1, got 0"]


def test_text_is_not_a_list_even_of_text():
    """YAML gives ``--x abc`` as the text "abc": an argument taking a list (of names, say) must
    refuse it, not take it as the list of its letters."""
    assert not matches("abc", list[str])
    assert not matches("abc", Sequence[str])
    assert not matches("abc", list)
    assert matches(["abc"], list[str])
