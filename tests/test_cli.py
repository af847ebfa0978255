"""``train.py`` and ``python -m lightning_dpgan sample`` end to end on tiny fixture data."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import lightning_dpgan
from lightning_dpgan.cli import main
from run_helpers import grid_tiles, read_json, tiny_run_args

REPO = Path(__file__).resolve().parents[1]
PRIVACY_KEYS = {"mechanism", "epsilon", "delta", "target_epsilon", "steps", "accountant"}


@pytest.fixture(scope="module")
def gan_run(tiny_image_data_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("run") / "gan"
    assert main(tiny_run_args(tiny_image_data_dir, output_dir, steps=6) + ["--sample_every_n_steps", "3"]) == 0
    return output_dir


def test_train_writes_every_output_file(gan_run):
    for name in ("checkpoints/last.ckpt", "config.yaml", "privacy.json", "metrics.json", "samples.png"):
        assert (gan_run / name).is_file(), name
    assert sorted(p.name for p in (gan_run / "samples").iterdir()) == ["step_0000003.png", "step_0000006.png"]


def test_privacy_report_of_a_non_private_run(gan_run):
    report = json.loads((gan_run / "privacy.json").read_text())
    assert PRIVACY_KEYS <= set(report)
    assert report["mechanism"] == "none" and report["epsilon"] is None and report["steps"] == 6
    assert report["software"]["lightning-dpgan"] == lightning_dpgan.__version__  # what wrote it, for a reader later


def test_metrics_and_resolved_config(gan_run):
    metrics = json.loads((gan_run / "metrics.json").read_text())
    assert metrics["steps"] == 6 and metrics["train_records"] == 160
    assert np.isfinite(metrics["loss/discriminator"]) and np.isfinite(metrics["loss/generator"])
    config = yaml.safe_load((gan_run / "config.yaml").read_text())
    assert config["model"]["name"] == "gan" and config["data"]["name"] == "mnist"
    assert config["model"]["latent_dim"] == 8 and config["privacy"]["name"] == "none"


def test_sample_grid_has_one_row_per_class(gan_run):
    """Row k of samples.png holds the final generator's class-k images, drawn with seed 0."""
    from lightning_dpgan.sampling import load_module
    from lightning_dpgan.outputs import images_to_uint8

    picture = np.asarray(Image.open(gan_run / "samples.png"))
    pad = 2
    assert picture.shape == (10 * (28 + pad) + pad, 3 * (28 + pad) + pad)
    module = load_module(gan_run / "checkpoints" / "last.ckpt")
    labels = torch.tensor([k for k in range(10) for _ in range(3)])  # 0, 0, 0, 1, 1, 1, ...
    torch.manual_seed(0)
    expected = images_to_uint8(module.sample(30, labels))[:, 0]
    np.testing.assert_array_equal(grid_tiles(picture, 30, columns=3), expected)
    assert len({expected[3 * k].tobytes() for k in range(10)}) == 10  # the classes drew different images


def test_sample_command_draws_records_from_the_checkpoint(gan_run, tmp_path):
    out = tmp_path / "synthetic.npz"
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "25", "--out", str(out)]) == 0
    arrays = np.load(out)
    assert arrays["images"].shape == (25, 1, 28, 28) and arrays["images"].dtype == np.uint8
    assert np.bincount(arrays["labels"]).tolist() == [3, 3, 3, 3, 3, 2, 2, 2, 2, 2]
    assert arrays["labels"].tolist() == [i % 10 for i in range(25)]  # 0, 1, ..., 9, 0, ...: balanced, in order
    png, npz = tmp_path / "grid.png", tmp_path / "same.npz"
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "20", "--out", str(png)]) == 0
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "20", "--out", str(npz)]) == 0
    picture = np.asarray(Image.open(png))
    assert picture.shape == (2 * 30 + 2, 10 * 30 + 2)
    # Same seed, same draw: the grid holds the .npz images row-major, so each column is one class.
    np.testing.assert_array_equal(grid_tiles(picture, 20, columns=10), np.load(npz)["images"][:, 0])
    # an existing file is replaced only on purpose
    before = npz.read_bytes()
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "3", "--out", str(npz)]) == 2
    assert npz.read_bytes() == before
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "3", "--out", str(npz),
                 "--overwrite"]) == 0
    assert np.load(npz)["images"].shape[0] == 3


def test_a_sampled_grid_of_chosen_classes_has_one_column_per_class(gan_run, tmp_path):
    """--classes 1 2 3 draws labels 1, 2, 3, 1, ... in turn: laid 10 to a row, the classes ran
    diagonally. One column per class drawn, as a plain draw's grid has one per class."""
    checkpoint = str(gan_run / "checkpoints/last.ckpt")
    png, npz = tmp_path / "three.png", tmp_path / "three.npz"
    for out in (png, npz):
        assert main(["sample", "--checkpoint", checkpoint, "-n", "30", "--out", str(out), "--classes", "1", "2", "3"]) == 0
    picture, drawn = np.asarray(Image.open(png)), np.load(npz)
    assert picture.shape == (10 * 30 + 2, 3 * 30 + 2)
    np.testing.assert_array_equal(grid_tiles(picture, 30, columns=3), drawn["images"][:, 0])
    assert drawn["labels"].reshape(10, 3).tolist() == [[1, 2, 3]] * 10  # each column one class


def test_sample_classes_draws_only_those_classes_in_turn(gan_run, tmp_path):
    """--classes 7 2: labels 7, 2, 7, 2, ... and each image the generator's for its label, drawn
    with the seed's latent codes as a plain draw of those labels would be."""
    from lightning_dpgan.outputs import images_to_uint8
    from lightning_dpgan.sampling import load_module

    checkpoint = gan_run / "checkpoints" / "last.ckpt"
    out = tmp_path / "two.npz"
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "5", "--out", str(out), "--classes", "7", "2",
                 "--seed", "3"]) == 0
    arrays = np.load(out)
    assert arrays["labels"].tolist() == [7, 2, 7, 2, 7]
    module = load_module(checkpoint)
    torch.manual_seed(3)
    expected = images_to_uint8(module.sample(5, torch.tensor([7, 2, 7, 2, 7])))
    np.testing.assert_array_equal(arrays["images"], expected)
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "5", "--out", str(tmp_path / "bad.npz"),
                 "--classes", "10"]) == 2  # MNIST's classes are 0 to 9
    assert not (tmp_path / "bad.npz").exists()


def test_sample_says_what_guarantee_the_records_it_drew_carry(gan_run, tmp_path, capsys):
    """sample is what a data holder publishes with: it states the checkpoint's spend (the
    figures privacy.json states), no guarantee for a run without privacy, and where to look for
    a checkpoint from before the spend was kept in it."""
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "5",
                 "--out", str(tmp_path / "plain.npz")]) == 0
    assert "sample: trained without privacy: these records carry no (epsilon, delta) guarantee" in capsys.readouterr().err
    run = tmp_path / "private"
    assert main(["train", "--model", "dpgan", "--dataset", "adult", "--data-dir", str(REPO / "tests" / "fixtures" / "adult_tiny"),
                 "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8", "--epsilon", "8", "--delta", "1e-3",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    epsilon = read_json(run / "privacy.json")["epsilon"]
    checkpoint = run / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "5", "--out", str(tmp_path / "a.csv")]) == 0
    said = capsys.readouterr().err
    assert f"released under the checkpoint's privacy spend, epsilon {epsilon:.6g} and delta 0.001" in said
    assert "(how it was accounted: its run's privacy.json)" in said
    other = json.loads((run / "privacy.json").read_text())  # another run's report copied in: another lineage
    (run / "privacy.json").write_text(json.dumps({**other, "epsilon": 1.0,
                                                  "lineage": [{"run_id": "elsewhere", "from_step": 0}]}))
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "5", "--out", str(tmp_path / "other.csv")]) == 0
    said = capsys.readouterr().err
    assert f"epsilon {epsilon:.6g}" in said and "its run's privacy.json)" not in said
    assert "the privacy.json beside it is another run's (their lineage" in said
    (run / "privacy.json").write_text(json.dumps(other))
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    for callback in state["callbacks"].values():
        callback.pop("spent", None)  # as a checkpoint written before the spend was kept
    torch.save(state, checkpoint)
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "5", "--out", str(tmp_path / "b.csv")]) == 0
    assert "does not record its privacy spend: its run's privacy.json states the guarantee" in capsys.readouterr().err
    (run / "privacy.json").unlink()  # as a run stopped by SIGTERM leaves it: the pointer names no file it lacks
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "5", "--out", str(tmp_path / "c.csv")]) == 0
    assert "the privacy.json of the run that wrote it, which is not beside it: a run stopped" in capsys.readouterr().err


def test_sample_draws_images_a_chunk_at_a_time_keeping_no_graph(gan_run, tmp_path, monkeypatch):
    """60,000 images drawn at once with autograd on took about 19 GiB: each draw is a chunk,
    without a graph, and the chunks are the balanced labels in order."""
    from lightning_dpgan import sampling
    from lightning_dpgan.modules.base import GANModule

    calls, draw = [], GANModule.sample

    def spy(self, n, labels=None):
        images = draw(self, n, labels)
        calls.append((n, labels.tolist(), images.requires_grad))
        return images

    monkeypatch.setattr(sampling, "IMAGE_CHUNK", 8)
    monkeypatch.setattr(GANModule, "sample", spy)
    out = tmp_path / "chunked.npz"
    assert main(["sample", "--checkpoint", str(gan_run / "checkpoints/last.ckpt"), "-n", "20", "--out", str(out)]) == 0
    assert [n for n, _, _ in calls] == [8, 8, 4] and not any(graph for _, _, graph in calls)
    assert [label for _, chunk, _ in calls for label in chunk] == [i % 10 for i in range(20)]
    assert np.load(out)["images"].shape == (20, 1, 28, 28)


def test_sample_refuses_to_write_over_its_checkpoint_or_into_a_folder_name(gan_run, tmp_path, capsys):
    """A checkpoint saved under a name ending in .npz, and --out naming it with --overwrite:
    the checkpoint was replaced by the images."""
    import shutil

    checkpoint = tmp_path / "model.npz"
    shutil.copy(gan_run / "checkpoints/last.ckpt", checkpoint)
    before = checkpoint.read_bytes()
    args = ["sample", "--checkpoint", str(checkpoint), "-n", "3", "--out", str(checkpoint), "--overwrite"]
    assert main(args) == 2
    assert "is the checkpoint itself" in capsys.readouterr().err and checkpoint.read_bytes() == before
    assert main(["sample", "--checkpoint", str(checkpoint), "-n", "3", "--out", str(tmp_path)]) == 2
    assert f"names a folder: give a file in it (e.g. {tmp_path / 'samples.png'})" in capsys.readouterr().err  # an image model's


def test_sample_refuses_corrupt_and_foreign_checkpoints(gan_run, tmp_path, capsys):
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes((gan_run / "checkpoints/last.ckpt").read_bytes()[:1000])
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    for path, message in [(corrupt, "not a readable checkpoint"), (foreign, "not written by lightning-dpgan"),
                          (tmp_path / "missing.ckpt", "checkpoint not found")]:
        assert main(["sample", "--checkpoint", str(path), "-n", "2", "--out", str(tmp_path / "x.npz")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


def test_resume_continues_the_step_count(gan_run, tiny_image_data_dir, tmp_path):
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "resumed", steps=9)
    assert main(args + ["--resume", str(gan_run / "checkpoints/last.ckpt")]) == 0
    assert json.loads((tmp_path / "resumed" / "metrics.json").read_text())["steps"] == 9


def test_a_resumed_segment_draws_new_public_latents_and_the_same_ones_each_time_it_is_resumed(
        tiny_image_data_dir, tmp_path, monkeypatch):
    """A resume reseeded the public stream from --seed alone, so its steps drew the first
    segment's latent codes again, one for one."""
    from lightning_dpgan.modules.base import GANModule

    drawn = []
    original = GANModule.sample_latent
    monkeypatch.setattr(GANModule, "sample_latent", lambda self, n: drawn.append(original(self, n)) or drawn[-1])

    def latents(output, *extra):
        drawn.clear()
        assert main(tiny_run_args(tiny_image_data_dir, output, steps=6 if extra else 3) + list(extra)) == 0
        return [latent.clone() for latent in drawn[:3]]

    first = latents(tmp_path / "first")
    checkpoint = str(tmp_path / "first" / "checkpoints" / "last.ckpt")
    resumed = latents(tmp_path / "resumed", "--resume", checkpoint)
    again = latents(tmp_path / "again", "--resume", checkpoint)
    assert not any(torch.equal(a, b) for a, b in zip(first, resumed))  # not the first segment's draws again
    assert all(torch.equal(a, b) for a, b in zip(resumed, again)) and len(again) == 3  # a resume is reproducible


def test_a_resume_at_the_checkpoints_own_step_count_writes_its_outputs_without_training(
        gan_run, tiny_image_data_dir, tmp_path, capsys):
    """--max-steps equal to the checkpoint's steps is allowed (it writes the outputs of a run cut
    off after its last checkpoint): only a lower one, which reads as going back, is refused."""
    checkpoint = str(gan_run / "checkpoints" / "last.ckpt")
    taken = json.loads((gan_run / "metrics.json").read_text())["steps"]
    out = tmp_path / "rewritten"
    assert main(tiny_run_args(tiny_image_data_dir, out, steps=taken) + ["--resume", checkpoint]) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == taken
    assert json.loads((out / "privacy.json").read_text())["stopped_by"] == "max-steps"
    assert (out / "samples.png").is_file()
    capsys.readouterr()
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "back", steps=taken - 1) + ["--resume", checkpoint]) == 2
    assert f"has taken {taken} steps and --max-steps {taken - 1} counts them" in capsys.readouterr().err


def test_a_checkpoint_from_before_dev_splits_counts_as_holding_no_records_out():
    """A checkpoint that records no split trained on every record: resuming it with a dev split
    would score on records it trained on, and is refused; without one it resumes."""
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.run import check_same_split

    check_same_split({"dev_fraction": 0.0, "split_seed": 0}, None, "old.ckpt")
    with pytest.raises(ConfigError, match=re.escape("it had --data.dev_fraction 0.0 (this run: 0.3)")):
        check_same_split({"dev_fraction": 0.3, "split_seed": 0}, None, "old.ckpt")


@pytest.mark.parametrize("now", [{"epsilon": 1.0, "delta": 0.0}, {"epsilon": 0.0, "delta": 1e-6},
                                 {"epsilon": 0.0, "delta": 0.0}, {}])
def test_a_resume_whose_preprocessing_cost_differs_in_either_part_is_refused(now):
    """The checkpoint spent (1, 1e-6) on its DP schema: this run's data settings must report that
    cost, epsilon and delta both, or part of it would be left out of the total."""
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.run import check_same_preprocessing_cost

    saved = {"epsilon": 1.0, "delta": 1e-6, "mechanism": "DP schema estimation"}
    check_same_preprocessing_cost({"epsilon": 1.0, "delta": 1e-6}, saved, "c.ckpt")
    check_same_preprocessing_cost(now, None, "c.ckpt")  # nothing spent before: composed as usual
    with pytest.raises(ConfigError, match=re.escape("spent epsilon 1, delta 1e-06 on preprocessing (DP schema estimation)")):
        check_same_preprocessing_cost(now, saved, "c.ckpt")


def test_two_branches_resumed_from_one_checkpoint_show_the_run_they_share(gan_run, tiny_image_data_dir, tmp_path):
    """Each report's lineage: the checkpoint's runs, then this one from the step it resumed at;
    the checkpoint carries it on, and a checkpoint from before lineages starts "unrecorded"."""
    from lightning_dpgan.sampling import read_run_info

    parent = json.loads((gan_run / "privacy.json").read_text())["lineage"]
    assert len(parent) == 1 and parent[0]["from_step"] == 0 and re.fullmatch(r"[0-9a-f]{32}", parent[0]["run_id"])
    assert read_run_info(gan_run / "checkpoints" / "last.ckpt")["lineage"] == parent
    checkpoint = str(gan_run / "checkpoints" / "last.ckpt")
    branches = {}
    for name in ("a", "b"):
        assert main(tiny_run_args(tiny_image_data_dir, tmp_path / name, steps=8) + ["--resume", checkpoint]) == 0
        branches[name] = json.loads((tmp_path / name / "privacy.json").read_text())["lineage"]
        assert branches[name][0] == parent[0] and branches[name][1]["from_step"] == 6
        assert read_run_info(tmp_path / name / "checkpoints" / "last.ckpt")["lineage"] == branches[name]
    assert branches["a"][1]["run_id"] != branches["b"][1]["run_id"]  # same seed, same settings: two runs
    grandchild = tmp_path / "c"
    assert main(tiny_run_args(tiny_image_data_dir, grandchild, steps=9) + ["--resume", str(tmp_path / "a" / "checkpoints" / "last.ckpt")]) == 0
    lineage = json.loads((grandchild / "privacy.json").read_text())["lineage"]
    assert lineage[:2] == branches["a"] and lineage[2]["from_step"] == 8 and len(lineage) == 3

    older = torch.load(checkpoint, weights_only=False)
    del older["lightning_dpgan"]["run"]["lineage"]
    torch.save(older, tmp_path / "older.ckpt")
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "d", steps=8) + ["--resume", str(tmp_path / "older.ckpt")]) == 0
    lineage = json.loads((tmp_path / "d" / "privacy.json").read_text())["lineage"]
    assert lineage[0] == {"run_id": "unrecorded", "from_step": 0} and lineage[1]["from_step"] == 6


def test_wgan_on_fashion_mnist(tiny_image_data_dir, tmp_path):
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "wgan", model="wgan", dataset="fashion-mnist", steps=5)) == 0
    config = yaml.safe_load((tmp_path / "wgan" / "config.yaml").read_text())
    assert config["presets"] == ["wgan.yaml", "wgan_fashion-mnist.yaml"]
    assert json.loads((tmp_path / "wgan" / "metrics.json").read_text())["steps"] == 5


def test_config_yaml_reproduces_the_run_settings(gan_run, tmp_path):
    from lightning_dpgan.cli import build_config

    again = build_config(["--config", str(gan_run / "config.yaml"), "--output-dir", str(tmp_path)])
    original = yaml.safe_load((gan_run / "config.yaml").read_text())
    assert again["model"] == original["model"] and again["data"] == original["data"]
    assert again["max_steps"] == original["max_steps"]


def test_config_yaml_names_a_relative_data_dir_absolutely(tiny_image_data_dir, tmp_path, monkeypatch):
    """The data folder was read relative to where train ran; the saved config must find the same
    folder from anywhere (evaluate and --config read it later, often from another directory)."""
    data_dir = Path(tiny_image_data_dir).resolve()
    monkeypatch.chdir(data_dir.parent)
    args = tiny_run_args(data_dir.name, tmp_path / "run", steps=2)
    assert main(args) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["data_dir"]
    assert Path(saved).is_absolute() and Path(saved) == data_dir
    from lightning_dpgan.evaluate import load_run_datamodule

    monkeypatch.chdir(tmp_path)  # where the relative name means nothing
    assert load_run_datamodule(tmp_path / "run").data_dir == data_dir


def test_a_run_without_an_output_dir_gets_its_own_folder_and_the_logger_absolute_paths(tiny_image_data_dir, tmp_path,
                                                                                      monkeypatch, capsys):
    """No --output-dir: the run goes to outputs/<model>-<dataset>-<timestamp>, and says so. The
    logger's copy of the settings names the relative data folder absolutely, as config.yaml does
    (docs/privacy.md: the loggers receive the run's settings with absolute paths)."""
    import os

    from lightning_dpgan.cli import RUN_DIR_ENV

    monkeypatch.setenv(RUN_DIR_ENV, "x")
    monkeypatch.delenv(RUN_DIR_ENV)  # the run sets it: put back as it was afterwards
    monkeypatch.chdir(tmp_path)
    data_dir = Path(tiny_image_data_dir).resolve()
    args = tiny_run_args(os.path.relpath(data_dir, tmp_path), "unused", steps=2)
    del args[args.index("--output-dir"):args.index("--output-dir") + 2]
    assert main(args) == 0
    (run,) = (tmp_path / "outputs").iterdir()
    assert re.fullmatch(r"gan-mnist-\d{8}-\d{6}", run.name)
    assert f"train: wrote {Path('outputs') / run.name}" in capsys.readouterr().out
    assert (run / "privacy.json").is_file()
    # Lightning writes the module's own hyper-parameters beside it, tuples tagged as Python's
    logged = yaml.load((run / "logs" / "hparams.yaml").read_text(), Loader=yaml.Loader)["run_config"]
    assert Path(logged["data"]["data_dir"]).is_absolute() and Path(logged["data"]["data_dir"]).resolve() == data_dir


def test_config_yaml_records_a_data_dir_found_through_the_environment(tiny_image_data_dir, tmp_path, monkeypatch):
    """No --data-dir, the folder named by LIGHTNING_DPGAN_DATA_DIR (relative): config.yaml holds it,
    absolute, so --config and evaluate find the data from another directory without it."""
    data_dir = Path(tiny_image_data_dir).resolve()
    monkeypatch.chdir(data_dir.parent)
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", data_dir.name)
    args = tiny_run_args(data_dir, tmp_path / "run", steps=2)
    args = args[:args.index("--data-dir")] + args[args.index("--data-dir") + 2:]
    assert main(args) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["data_dir"]
    assert Path(saved) == data_dir
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    from lightning_dpgan.evaluate import load_run_datamodule

    assert load_run_datamodule(tmp_path / "run").data_dir == data_dir


def test_only_path_settings_given_as_text_are_made_absolute(tmp_path, monkeypatch):
    from lightning_dpgan.config import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    config = {"data": {"name": "csv", "csv": "table.csv", "schema": "schema.yaml", "cache_dir": "~/cache",
                       "data_dir": None, "batch_size": 8, "target": "label"}, "model": {"name": "gan"}}
    portable = with_absolute_paths(config)
    assert portable["data"]["csv"] == str(tmp_path / "table.csv")
    assert portable["data"]["schema"] == str(tmp_path / "schema.yaml")
    assert portable["data"]["cache_dir"] == str(Path.home() / "cache")
    assert portable["data"]["data_dir"] is None and portable["data"]["target"] == "label"
    assert portable["data"]["batch_size"] == 8 and config["data"]["csv"] == "table.csv"  # the input is left as it was


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--epsilon", "1.0"], "no privacy guarantee"),
        (["--model", "dpgan", "--privacy", "none"], "a private model's preset sets them: for a non-private baseline, "
                                                     "train the non-private model it builds on"),
        (["--privacy.noise_multiplier", "1.0"], "--privacy.noise_multiplier set (by a flag, a config file or a preset), "
                                                "but model 'gan' trains with --privacy none"),
        (["--privacy.poisson_sampling", "maybe", "--privacy.nonexistent", "3"],
         "--privacy.nonexistent, --privacy.poisson_sampling set"),
        (["--wandb-project", "mine"], "--wandb-project set, but the run logs with --logger csv: add --logger wandb"),
        (["--logger.not_an_arg", "3"], "unknown key(s) logger.not_an_arg for logger 'csv'. Valid keys: logger.prefix"),
        (["--logger", "tensorboard", "--logger.not_an_arg", "3"], "logger.not_an_arg for logger 'tensorboard'"),
        (["--logger", "tensorboard", "--logger.root_dir", "elsewhere"], "logger.root_dir for logger 'tensorboard'"),
        (["--logger", "tensorboard", "--logger.log_dir", "elsewhere"], "logger.log_dir for logger 'tensorboard'"),
        (["--model.not_an_arg", "3"], "unknown key(s) model.not_an_arg for model 'gan'"),
        (["--data.not_an_arg", "3"], "unknown key(s) data.not_an_arg"),
        (["--trainer.not_an_arg", "3"], "unknown Lightning Trainer argument"),
        (["--trainer.min_steps", "5"], "trainer.min_steps 5 would make training go on past a stop"),
        # Lightning finishes the first epoch under any min_steps: a budget stop after 8 of 10 batches went on
        (["--trainer.min_steps", "0"], "trainer.min_steps 0 (even 0: Lightning then finishes the first epoch)"),
        (["--trainer.min_epochs", "2"], "trainer.min_epochs 2 would make training go on past a stop"),
        # Lightning's Timer named neither the flag nor a form that works; a mapping of text was a traceback
        (["--trainer.max_time", "abc"], "trainer.max_time 'abc' is not a duration (`Timer(duration='abc')` is not a "
                                        "valid duration. Expected a string in the format DD:HH:MM:SS): give DD:HH:MM:SS"),
        (["--trainer.max_time", "{minutes: x}"], "trainer.max_time {'minutes': 'x'} is not a duration (unsupported type "
                                                 "for timedelta minutes component: str)"),
        (["--trainer.max_time", "00:00:00:00"], "trainer.max_time '00:00:00:00' leaves no time to train"),
        (["--trainer.max_time", "{minutes: -5}"], "trainer.max_time {'minutes': -5} leaves no time to train"),
        # Lightning trains on the same first batches: a secret-shuffle DP-SGD run reported epsilon 10 for ~27
        (["--model", "dpgan", "--privacy.noise_multiplier", "1", "--trainer.overfit_batches", "1"],
         "trainer.overfit_batches 1 cannot train a private model"),
        # the run's own length, logger and folder: Lightning's would replace the budget stop's bookkeeping
        (["--trainer.max_steps", "5"], "set trainer.max_steps through the run's own settings (--max-steps)"),
        (["--trainer.default_root_dir", "elsewhere"], "set trainer.default_root_dir through the run's own settings "
                                                      "(--output-dir)"),
        (["--trainer.enable_checkpointing", "false"], "(--checkpoint_every_n_steps), not the trainer section"),
        (["--privacy", "dp-sgdd"], "unknown privacy 'dp-sgdd'"),
        (["--max-steps", "0"], "--max-steps must be a whole number >= 1 (or left out), got 0"),
        (["--max-epochs", "0"], "--max-epochs must be a whole number >= 1"),
        (["--num_synthetic", "0"], "error: --num_synthetic must be a whole number >= 1"),
        (["--num_synthetic", "-5"], "error: --num_synthetic must be a whole number >= 1"),
        (["--sample_columns", "abc"], "error: --sample_columns must be a whole number >= 1, got 'abc'"),
        (["--seed", "-1"], "--seed must be a whole number >= 0, got -1"),
        (["--seed", "4294967296"], "--seed must be below 2^32 = 4294967296, got 4294967296"),
        (["--strategy", "dpp"], "--strategy dpp is not a Lightning strategy. Did you mean 'ddp'? Allowed: auto, single_device, ddp"),
        (["--strategy", "zzz"], "--strategy zzz is not a Lightning strategy. Allowed: auto"),
        # Lightning trained one process and the run's config.yaml said devices: 2
        (["--strategy", "single_device", "--devices", "2"], "--strategy single_device trains one process on one "
                                                            "device, and --devices 2 asks for several: use --strategy ddp"),
        (["--overwrite", "maybe"], "unrecognized argument 'maybe'"),
    ],
)
def test_train_refuses_bad_settings_before_training(tiny_image_data_dir, tmp_path, capsys, extra, message):
    output_dir = tmp_path / "refused"
    assert main(tiny_run_args(tiny_image_data_dir, output_dir) + extra) == 2
    assert message in capsys.readouterr().err
    assert not (output_dir / "checkpoints").exists()


@pytest.mark.parametrize("setting,message", [
    ("evaluate: maybe", "evaluate in {file} must be true or false, got 'maybe'"),
    ("max_steps: abc", "max_steps in {file} must be a whole number >= 1 (or left out), got 'abc'"),
    ("max_epochs: true", "max_epochs in {file} must be a whole number"),
    ("seed: 4294967296", "seed in {file} must be below 2^32"),
    ("epsilon: abc", "epsilon in {file} must be a number, got 'abc'"),
    ("delta: [1]", "delta in {file} must be a number, got [1]"),
    # the flags' names and a section given as its name: what a first config file gets wrong
    ("dataset: adult", "config file {file}: unknown key 'dataset'. The --dataset flag's setting is written "
                       "data: {{name: adult}}."),
    ("devices: 2", "unknown key 'devices'. The --devices flag's setting is written trainer: {{devices: 2}}."),
    ("max_step: 5", "config file {file}: unknown key 'max_step'. Did you mean 'max_steps'?"),
    ("1: x\nepsilonn: 2", "config file {file}: unknown key '1'. Valid top-level keys: "),  # YAML reads 1 as a number
    ("dataset:", "The --dataset flag's setting is written data: {{name: null}}."),  # YAML's null, not Python's None
    ("trainer.devices: 2", "unknown key 'trainer.devices'. In a config file, trainer.devices is written "
                           "trainer: {{devices: 2}}."),
    ("trainer: gpu", "config file {file}: 'trainer' must be a section of keys, got 'gpu'"),  # it has no name
    ("quail: mst", "'quail' must be a section of keys (e.g. quail: {{synthesizer: mst}}), got 'mst'"),
    ("privacy: dp-sgd", "config file {file}: 'privacy' must be a section of keys (e.g. privacy: {{name: dp-sgd}}), "
                        "got 'dp-sgd'"),
])
def test_a_config_files_own_values_are_refused_naming_the_file_and_its_key(tmp_path, setting, message):
    """Checked only once merged, a file's ``max_steps: abc`` was blamed on --max-steps, a flag
    the user never typed, and ``dataset: adult`` was just an unknown key."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.config import ConfigError

    file = tmp_path / "config.yaml"
    file.write_text(f"model: {{name: gan}}\ndata: {{name: mnist}}\n{setting}\n")
    with pytest.raises(ConfigError, match=re.escape(message.format(file=file))):
        build_config(["--config", str(file)])


def test_a_continuation_refused_at_its_start_puts_the_earlier_outputs_back_as_they_were(tiny_image_data_dir, tmp_path,
                                                                                       capsys):
    """Refused once its logger had made logs/ (a target below what the checkpoint spent), the
    continuation's own logs/ gives way to the earlier one, which is not nested inside it."""
    run = tmp_path / "run"
    private = ["--trainer.log_every_n_steps", "1", "--epsilon", "5"]
    assert main(tiny_run_args(tiny_image_data_dir, run, model="dpgan", steps=3) + private) == 0
    before = {path.relative_to(run): path.read_bytes() for path in run.rglob("*") if path.is_file()}
    resume = ["--resume", str(run / "checkpoints" / "last.ckpt"), "--epsilon", "1"]
    assert main(tiny_run_args(tiny_image_data_dir, run, model="dpgan", steps=6) + resume) == 2
    assert "already spent epsilon" in capsys.readouterr().err
    assert {path.relative_to(run): path.read_bytes() for path in run.rglob("*") if path.is_file()} == before


def test_a_resume_given_no_target_keeps_the_checkpoints_not_the_presets(tiny_image_data_dir, tmp_path, capsys):
    """Resumed without --epsilon, a dpgan run started at epsilon 5 took its preset's 10 and spent on
    past 5, said only as "of --epsilon 10". It keeps 5, with a note; --epsilon still changes it."""
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, model="dpgan", steps=2) + ["--epsilon", "5"]) == 0
    checkpoint = str(run / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "kept", model="dpgan", steps=3) + ["--resume", checkpoint]) == 0
    assert "--resume keeps the checkpoint's target epsilon 5 (the presets' 10 would change it)" in capsys.readouterr().err
    assert read_json(tmp_path / "kept" / "privacy.json")["target_epsilon"] == 5.0
    raised = tiny_run_args(tiny_image_data_dir, tmp_path / "raised", model="dpgan", steps=3) + ["--resume", checkpoint]
    assert main(raised + ["--epsilon", "6"]) == 0
    assert "keeps the checkpoint's target" not in capsys.readouterr().err
    assert read_json(tmp_path / "raised" / "privacy.json")["target_epsilon"] == 6.0


@pytest.mark.parametrize("left", ["config.yaml", "checkpoints"])
def test_a_folder_a_stopped_run_left_is_refused_too(tiny_image_data_dir, tmp_path, capsys, left):
    """SIGTERM leaves a checkpoint and config.yaml but no report: another run there would write
    over the checkpoint as surely as over a finished run's."""
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2)) == 0
    for entry in run.iterdir():
        if entry.name != left:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert [entry.name for entry in run.iterdir()] == [left]


def test_a_folder_holding_a_run_is_refused_unless_continued_or_replaced(tiny_image_data_dir, tmp_path, capsys):
    """A second run into a run's folder would replace its checkpoint while the old privacy.json
    stays until the end: a failing or interrupted run would leave a report that under-states
    what the checkpoint spent. Continuing or replacing sets the old outputs aside first."""
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=3) + ["--trainer.log_every_n_steps", "1"]) == 0
    first = {name: (run / name).read_bytes() for name in ("privacy.json", "metrics.json", "config.yaml", "logs/metrics.csv")}
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=5)) == 2
    refusal = capsys.readouterr().err
    assert "already holds a run" in refusal and f"--resume {run / 'checkpoints' / 'last.ckpt'}" in refusal
    assert {name: (run / name).read_bytes() for name in first} == first  # untouched
    # what a run refused before training leaves (its logger's files) does not make a folder a run's
    refused = tmp_path / "refused"
    assert main(tiny_run_args(tiny_image_data_dir, refused, steps=2) + ["--max-epochs", "1", "--epsilon", "1"]) == 2
    capsys.readouterr()
    (refused / "logs").mkdir(parents=True, exist_ok=True)
    (refused / "logs" / "hparams.yaml").write_text("{}\n")
    assert main(tiny_run_args(tiny_image_data_dir, refused, steps=2)) == 0
    assert (refused / "previous" / "logs" / "hparams.yaml").is_file()
    assert f"train: the folder's earlier outputs (logs) were moved to {refused / 'previous'}\n" in capsys.readouterr().out
    # a file is not a folder
    (tmp_path / "file").write_text("x")
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "file", steps=2)) == 2
    assert "is a file" in capsys.readouterr().err

    # continued in place: the old outputs move to previous/, the step log keeps the earlier steps
    resume = ["--resume", str(run / "checkpoints" / "last.ckpt"), "--trainer.log_every_n_steps", "1"]
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=6) + resume) == 0
    assert {name: (run / "previous" / name).read_bytes() for name in first} == first
    assert json.loads((run / "metrics.json").read_text())["steps"] == 6
    import pandas as pd

    steps = pd.read_csv(run / "logs" / "metrics.csv")["step"].dropna().astype(int).tolist()
    assert steps[0] < 3 and max(steps) >= 5 and steps == sorted(steps)  # the first run's steps, then the resumed ones

    # a run refused before training (no data) puts everything back: the folder is as it was
    resumed = {name: (run / name).read_bytes() for name in ("privacy.json", "config.yaml", "checkpoints/last.ckpt")}
    assert main(tiny_run_args(tmp_path / "no-data", run, steps=2) + ["--overwrite", "--data.download", "false"]) == 2
    assert {name: (run / name).read_bytes() for name in resumed} == resumed and not (run / "previous-2").exists()
    # replaced: the earlier checkpoint goes aside with its report; the rerun's config.yaml holds neither
    # --overwrite nor --resume, so rerunning it with --config neither replaces nor continues anything
    capsys.readouterr()
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2) + ["--overwrite"]) == 0
    assert json.loads((run / "metrics.json").read_text())["steps"] == 2
    moved = ", ".join(sorted(path.name for path in (run / "previous-2").iterdir()))
    assert "checkpoints, config.yaml" in moved  # a replaced run's checkpoints go aside too
    assert f"the folder's earlier outputs ({moved}) were moved to {run / 'previous-2'}\n" in capsys.readouterr().out
    assert {name: (run / "previous-2" / name).read_bytes() for name in resumed} == resumed
    assert not {"overwrite", "resume"} & set(yaml.safe_load((run / "config.yaml").read_text()))

    # an earlier run's checkpoint, set aside in previous-2/, resumed into the folder: not the folder's
    # run continued, whose checkpoint it wrote over (its report went to previous-3/ without it)
    current = {name: (run / name).read_bytes() for name in ("privacy.json", "checkpoints/last.ckpt")}
    earlier = ["--resume", str(run / "previous-2" / "checkpoints" / "last.ckpt")]
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=8) + earlier) == 2
    assert "already holds a run's files" in capsys.readouterr().err
    assert {name: (run / name).read_bytes() for name in current} == current
    # nor may --overwrite move away the checkpoint it resumes
    (run / "checkpoints" / "copy.ckpt").write_bytes(current["checkpoints/last.ckpt"])
    copy = ["--resume", str(run / "checkpoints" / "copy.ckpt"), "--overwrite"]
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=8) + copy) == 2
    assert "which --overwrite moves to previous/ with the rest of the run's outputs: copy it out" in capsys.readouterr().err
    assert {name: (run / name).read_bytes() for name in current} == current and not (run / "previous-3").exists()
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=8) + earlier + ["--overwrite"]) == 0
    assert {name: (run / "previous-3" / name).read_bytes() for name in current} == current  # kept whole
    assert json.loads((run / "metrics.json").read_text())["steps"] == 8
    # --overwrite beside the folder's own checkpoint: the continuation wins, and the flag is said to do nothing
    capsys.readouterr()
    own = ["--resume", str(run / "checkpoints" / "last.ckpt"), "--overwrite"]
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=9) + own) == 0
    assert "train: note: --overwrite changes nothing here: the run continues its own checkpoint" in capsys.readouterr().err
    assert json.loads((run / "metrics.json").read_text())["steps"] == 9


@pytest.mark.parametrize("devices", ["0", "-1", "two"])
def test_a_device_count_below_one_is_refused_by_the_parser(tiny_image_data_dir, tmp_path, capsys, devices):
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_run_args(tiny_image_data_dir, tmp_path / "run") + ["--devices", devices])
    assert exit_info.value.code == 2
    assert "must be a whole number >= 1 or 'auto'" in capsys.readouterr().err


def test_resume_from_a_run_folder_says_which_file_to_pass(gan_run, tiny_image_data_dir, tmp_path, capsys):
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "run") + ["--resume", str(gan_run)]) == 2
    assert f"is a folder, not a checkpoint: pass the checkpoint file in it, e.g. {gan_run / 'checkpoints' / 'last.ckpt'}" \
        in capsys.readouterr().err


def test_resuming_with_settings_that_reshape_the_networks_is_a_clear_error(gan_run, tiny_image_data_dir, tmp_path, capsys):
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=9) + ["--resume", str(gan_run / "checkpoints/last.ckpt")]
    args[args.index("--model.latent_dim") + 1] = "12"
    assert main(args) == 2
    error = capsys.readouterr().err
    # the checkpoint's saved settings name the difference before Lightning would fail on the shapes
    assert "the checkpoint's model was built with other settings: latent_dim 8 (this run: 12)" in error
    assert "config.yaml" in error
    assert not (tmp_path / "run" / "privacy.json").exists()


@pytest.mark.parametrize("damage,problem", [
    (lambda text: text[: len(text) // 2].rsplit("\n", 1)[0] + "\n1.0,", "has its last row cut short"),
    (lambda text: "\n".join("," + line.split(",", 1)[1] if i == 2 else line for i, line in enumerate(text.split("\n"))),
     "has missing values in columns"),  # a blank field in the second row: not a cut
    (lambda text: text.replace("income", "earnings", 1), "has other columns than the dataset's"),
    (lambda text: text.splitlines()[0] + "\n", "has no rows"),
    (lambda text: "", "cannot be read as a CSV table"),
])
def test_a_damaged_synthetic_table_is_named_as_the_problem(tmp_path, capsys, damage, problem):
    data_dir = Path(__file__).parent / "fixtures" / "adult_tiny"
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(data_dir), "--output-dir", str(run),
                 "--max-steps", "2", "--trainer.enable_progress_bar", "false"]) == 0
    table = run / "synthetic.csv"
    table.write_text(damage(table.read_text()))
    assert main(["evaluate", "--run", str(run)]) == 2
    error = capsys.readouterr().err
    assert f"{table} {problem}" in error
    if problem == "has its last row cut short":  # one message for all: its remedy is run once
        # it works as given: it named a RUN placeholder and lacked --overwrite
        remedy = error.split("write it again with: python -m lightning_dpgan ", 1)[1].split()
        assert main(["40" if word == "N" else word for word in remedy]) == 0
        assert main(["evaluate", "--run", str(run)]) == 0


def test_evaluating_a_run_without_its_privacy_report_warns(tmp_path, capsys):
    data_dir = Path(__file__).parent / "fixtures" / "adult_tiny"
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(data_dir), "--output-dir", str(run),
                 "--max-steps", "2", "--trainer.enable_progress_bar", "false"]) == 0
    (run / "privacy.json").unlink()
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "has no privacy.json" in capsys.readouterr().err
    evaluation = read_json(run / "evaluation.json")  # its note points at no figures it lacks
    assert evaluation["epsilon"] is None and evaluation["delta"] is None  # the keys every evaluation.json has
    assert "epsilon and delta here" not in evaluation["privacy_note"]
    assert "not covered by any epsilon" in evaluation["privacy_note"]


def test_a_budget_preprocessing_uses_up_names_the_parts_and_the_settings_that_spend_them(tmp_path, capsys):
    data_dir = Path(__file__).parent / "fixtures" / "adult_tiny"
    assert main(["train", "--model", "dpctgan", "--dataset", "adult", "--data-dir", str(data_dir), "--output-dir",
                 str(tmp_path / "run"), "--max-steps", "2", "--epsilon", "0.001"]) == 2
    error = capsys.readouterr().err
    # refused before the modes' histogram read a row: the settings alone say it (nothing spent)
    assert "preprocessing would spend epsilon 0.1 of --epsilon 0.001 before training" in error
    assert "modes 0.1 (laplace" in error and "nothing was spent" in error
    assert "--data.modes bounds" in error and not (tmp_path / "run" / "checkpoints").exists()
    assert "--data.schema" not in error  # the remedies of what spent it alone (Adult's schema is public)
    assert "A resumed run's preprocessing is its checkpoint's, spent already: there only a larger --epsilon helps" in error


def test_a_failed_evaluation_after_training_says_the_run_was_written(tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("missing values (NaN) in columns: income")

    monkeypatch.setattr("lightning_dpgan.evaluate.evaluate_run", broken)
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2) + ["--evaluate"]) == 2
    error = capsys.readouterr().err
    assert f"training finished and wrote {run} (privacy.json included); its evaluation failed: missing values" in error
    assert f"python -m lightning_dpgan evaluate --run {run}" in error
    assert (run / "privacy.json").is_file() and (run / "checkpoints" / "last.ckpt").is_file()


def test_missing_data_names_the_files_and_data_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "train-images-idx3-ubyte.gz").write_bytes(b"")  # one of four there
    args = tiny_run_args(tmp_path / "empty", tmp_path / "out") + ["--data.download", "false"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Expected: train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz" in err and "--data-dir" in err
    # a folder that is not there at all: the typo is named, before any download could replace it
    assert main(tiny_run_args(tmp_path / "mnsit", tmp_path / "out")) == 2
    assert f"--data-dir {tmp_path / 'mnsit'} is not a folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # an empty one (an unset shell variable, --data-dir "$DATA"): it read the current folder, then downloaded
    assert main(tiny_run_args("", tmp_path / "out")) == 2
    assert "--data-dir is empty: give a folder, or leave it out" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_help_lists_models_datasets_privacy_and_loggers():
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--help"], capture_output=True, text=True, check=True)
    for name in ("gan", "wgan", "mnist", "fashion-mnist", "none", "csv", "tensorboard", "wandb", "--privacy", "--strategy"):
        assert name in result.stdout
    assert "Wasserstein GAN" in result.stdout  # one-line descriptions, not only names


def test_help_lists_each_privacy_strategys_settings_from_its_constructor():
    """Errors point to "the strategy's --privacy.* settings": --help names them, every argument the
    strategy takes but those --epsilon and --delta set."""
    from lightning_dpgan import registry
    from lightning_dpgan.config import init_arguments

    text = registry.describe_settings("privacy", "privacy", provided=("target_epsilon", "delta"))
    lines = {line.split(":")[0].strip(): line for line in text.replace("\n    ", " ").splitlines()}
    assert set(lines) == {"dp-sgd", "pate", "gpate", "sanitizer"}
    for name, line in lines.items():
        expected = [arg for arg in init_arguments(registry.lookup("privacy", name).load())
                    if arg not in ("target_epsilon", "delta")]
        assert [part.strip().removeprefix("--privacy.") for part in line.split(":", 1)[1].split(",")] == expected
    assert "--privacy.lap_inverse_scale" in lines["pate"] and "--privacy.target_epsilon" not in text


def _settings_listed(capsys, argv):
    """``train ARGV --help``'s section on the chosen model and dataset: {name: [dotted keys]}."""
    with pytest.raises(SystemExit):
        main(["train", *argv, "--help"])
    out = capsys.readouterr().out
    if "settings of the model and dataset given" not in out:
        return None
    section = out.split("settings of the model and dataset given", 1)[1].split("\n\n")[0]
    entries = section.split("\n", 1)[1].replace("\n    ", " ").splitlines()
    return {line.split(":")[0].strip(): [key.strip() for key in line.split(":", 1)[1].split(",")] for line in entries}


def test_help_lists_the_settings_of_the_model_and_dataset_given(capsys):
    """Every model's settings would be a page; --help after --model and --dataset lists theirs: the
    keys a dotted override may set (those the run fills in itself left out), as a run checks them."""
    from lightning_dpgan import registry
    from lightning_dpgan.config import MODEL_PROVIDED, init_arguments

    def keys(kind, name, section, provided=()):
        cls = registry.lookup(kind, name).load()
        return [f"--{section}.{arg}" for arg in init_arguments(cls) if arg not in provided]

    listed = _settings_listed(capsys, ["--model", "dpgan", "--dataset", "adult"])
    assert listed == {"dpgan": keys("model", "dpgan", "model", MODEL_PROVIDED), "adult": keys("dataset", "adult", "data")}
    assert "--model.lr_generator" in listed["dpgan"] and "--model.data_shape" not in listed["dpgan"]
    # QUAIL: its own settings, and the --model.* ones of the synthesizer it trains (dotted or flag)
    for argv in (["--model", "quail", "--quail-synthesizer", "patectgan"], ["--model", "quail", "--quail.synthesizer", "patectgan"]):
        assert _settings_listed(capsys, argv) == {"quail": keys("model", "quail", "quail"),
                                                  "patectgan": keys("model", "patectgan", "model", MODEL_PROVIDED)}
    assert set(_settings_listed(capsys, ["--model", "quail"])) == {"quail", "dpctgan"}
    # nothing chosen, or a name that is not registered: how to have them listed
    for argv in ([], ["--model", "nosuch"]):
        assert _settings_listed(capsys, argv) is None
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "give --model NAME and --dataset NAME with --help" in capsys.readouterr().out


def test_train_help_names_the_command_the_user_typed():
    """train.py and ``python -m lightning_dpgan train`` share one parser; its usage line names each."""
    through_module = subprocess.run([sys.executable, "-m", "lightning_dpgan", "train", "--help"],
                                    capture_output=True, text=True, check=True, cwd=REPO)
    through_script = subprocess.run([sys.executable, str(REPO / "train.py"), "--help"],
                                    capture_output=True, text=True, check=True)
    assert through_module.stdout.startswith("usage: python -m lightning_dpgan train [-h]")
    assert through_script.stdout.startswith("usage: train.py [-h]")


@pytest.mark.parametrize("typed, expected", [
    ("/venv/bin/lightning-dpgan", "lightning-dpgan {command}"),
    ("/venv/Scripts/lightning-dpgan.exe", "lightning-dpgan {command}"),
    ("/usr/lib/python3/site-packages/lightning_dpgan/__main__.py", "python -m lightning_dpgan {command}"),
    ("", "python -m lightning_dpgan {command}"),
])
def test_every_commands_usage_names_the_way_it_was_started(monkeypatch, capsys, typed, expected):
    """The console script's --help says ``lightning-dpgan sample``, not ``python -m ...``."""
    monkeypatch.setattr(sys, "argv", [typed])
    for command in ("train", "sample", "evaluate", "audit", "benchmark"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert capsys.readouterr().out.startswith(f"usage: {expected.format(command=command)} [-h]")
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: {expected.format(command='{train,sample,evaluate,audit,benchmark}')}")


def test_unknown_model_through_train_py(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--model", "nope", "--dataset", "mnist"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "unknown model 'nope'" in result.stderr and "gan, wgan" in result.stderr


def test_a_checkpoint_save_that_fails_keeps_the_previous_checkpoint_and_no_partial_file(tmp_path):
    """A full disk mid-save: the last good checkpoint stays whole, and no temporary file is left."""
    from types import SimpleNamespace

    from lightning_dpgan.callbacks.checkpoint import save_checkpoint_atomically

    def save(path, weights_only):
        Path(path).write_bytes(b"second, partly written")
        if saves.count(1):
            raise OSError("No space left on device")
        saves.append(1)

    saves = []
    trainer = SimpleNamespace(is_global_zero=True, save_checkpoint=save)
    last = tmp_path / "checkpoints" / "last.ckpt"
    save_checkpoint_atomically(trainer, last)
    last.write_bytes(b"first")  # what the first save left, told apart from the second's bytes
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint_atomically(trainer, last)
    assert last.read_bytes() == b"first" and [p.name for p in last.parent.iterdir()] == ["last.ckpt"]


def test_checkpoint_is_refreshed_every_n_batches(tiny_image_data_dir, tmp_path, monkeypatch):
    from lightning_dpgan.callbacks import checkpoint as checkpoint_callback

    saved_at = []
    real_save = checkpoint_callback.save_checkpoint_atomically

    def recording_save(trainer, path):
        saved_at.append(trainer.lightning_module.train_steps)
        return real_save(trainer, path)

    monkeypatch.setattr(checkpoint_callback, "save_checkpoint_atomically", recording_save)
    output_dir = tmp_path / "periodic"
    args = tiny_run_args(tiny_image_data_dir, output_dir, steps=5) + ["--checkpoint_every_n_steps", "2"]
    assert main(args) == 0
    assert saved_at == [2, 4, 5]
    checkpoint = torch.load(output_dir / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["lightning_dpgan"]["train_steps"] == 5
    assert not list((output_dir / "checkpoints").glob(".*.tmp"))


def test_tensorboard_logger_writes_event_files_with_losses(tiny_image_data_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    output_dir = tmp_path / "tb"
    args = tiny_run_args(tiny_image_data_dir, output_dir, steps=4) + ["--logger", "tensorboard",
                                                                      "--trainer.log_every_n_steps", "1"]
    assert main(args) == 0
    (events,) = list((output_dir / "logs").glob("events.out.tfevents.*"))
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert {"loss/discriminator", "loss/generator"} <= set(accumulator.Tags()["scalars"])


def test_wandb_logger_without_the_package_is_a_clear_error(tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "wb") + ["--logger", "wandb"]) == 2
    assert "pip install 'lightning-dpgan[wandb]'" in capsys.readouterr().err


def test_a_diverged_run_stops_with_a_clear_error_and_writes_no_outputs(tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    """A NaN loss from step 3 on: the guard stops the run before anything is written from the
    broken weights; the last checkpoint is the good one of step 2."""
    from lightning_dpgan.modules.gan import GAN

    original = GAN.discriminator_real_loss

    def diverging(self, scores):
        loss = original(self, scores)
        return loss * float("nan") if self.train_steps >= 2 else loss

    monkeypatch.setattr(GAN, "discriminator_real_loss", diverging)
    out = tmp_path / "run"
    args = tiny_run_args(tiny_image_data_dir, out, steps=6) + ["--checkpoint_every_n_steps", "1"]
    assert main(args) == 2
    assert "diverged" in capsys.readouterr().err
    for name in ("samples.png", "metrics.json", "privacy.json"):
        assert not (out / name).exists(), name
    checkpoint = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["lightning_dpgan"]["train_steps"] == 2
    assert all(torch.isfinite(value).all() for value in checkpoint["state_dict"].values() if value.is_floating_point())


def _wandb_record_log(output_dir, expected=b"loss/discriminator", timeout=60.0):
    """The offline run's record log, once W&B's background writer has flushed it (it may lag
    behind ``run.finish()`` on a busy machine)."""
    import time

    (path,) = (output_dir / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout
    while expected not in (record := path.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return record


def test_wandb_offline_run_records_config_losses_epsilon_samples_and_the_privacy_report(
        tiny_image_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    args = tiny_run_args(tiny_image_data_dir, out, model="dpgan", steps=3) + [
        "--logger", "wandb", "--wandb-project", "audit-project", "--wandb-name", "tiny-dpgan", "--epsilon", "5",
        "--trainer.log_every_n_steps", "1"]
    assert main(args) == 0
    record = _wandb_record_log(out, expected=b"privacy-report")
    for key in (b"run_config", b"loss/discriminator", b"privacy/epsilon", b"final/steps", b"privacy-report",
                b"tiny-dpgan", b"audit-project"):
        assert key in record, key
    assert list((out / "logs" / "wandb").glob("offline-run-*/files/media/images/samples_*.png"))
    # the console is not sent: it carries the datamodule's private counts for the data holder
    assert not list((out / "logs" / "wandb").glob("offline-run-*/files/output.log"))
    assert b"training stopped after" not in record


def test_wandb_without_a_key_or_mode_falls_back_to_offline_with_a_warning(tiny_image_data_dir, tmp_path, monkeypatch,
                                                                           caplog):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc
    out = tmp_path / "run"
    # the warning names the folder to sync, not the run's (which wandb sync does not read)
    with caplog.at_level("WARNING", logger="lightning_dpgan"):
        assert main(tiny_run_args(tiny_image_data_dir, out, steps=2) + ["--logger", "wandb"]) == 0
    assert f"logging offline; upload later with `wandb sync \"{out / 'logs' / 'wandb'}\"/offline-run-*`" in caplog.text
    assert b"loss/discriminator" in _wandb_record_log(out)


def test_wandb_that_cannot_reach_its_server_is_a_clear_error_and_leaves_no_run_folder(
        tiny_image_data_dir, tmp_path, monkeypatch, capsys):
    """An API key and no network: wandb.init gave up after about two minutes with its own
    traceback. Said in one line with the offline way out; training never started."""
    import wandb

    def unreachable(self, params):
        raise wandb.errors.CommError("Failed to get resume status\ndial tcp: lookup api.wandb.ai: no such host")

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr("lightning.pytorch.loggers.WandbLogger.log_hyperparams", unreachable)
    out = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, out, steps=2) + ["--logger", "wandb"]) == 2
    error = capsys.readouterr().err
    assert "W&B could not start its run (Failed to get resume status)" in error and "WANDB_MODE=offline" in error
    assert not out.exists()


def test_a_non_private_gan_under_another_lightning_strategy_is_refused_before_anything_is_written(
        tiny_image_data_dir, tmp_path, capsys):
    """ddp_spawn wraps the module in DistributedDataParallel, which refuses a GAN's alternating
    updates: that ended in a traceback and left config.yaml and logs/, blocking a rerun."""
    out = tmp_path / "spawn"
    assert main(tiny_run_args(tiny_image_data_dir, out, steps=2) + ["--devices", "2", "--strategy", "ddp_spawn"]) == 2
    error = capsys.readouterr().err
    assert "--strategy ddp_spawn cannot train a GAN's alternating updates" in error and "--strategy ddp" in error
    assert not out.exists() or not any(out.iterdir())


def test_a_run_says_which_of_its_limits_ended_it(tiny_image_data_dir, tmp_path, capsys):
    """--max-epochs 1 with no step limit: the report and the user both hear it was the epochs."""
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "epochs", steps=None) + ["--max-epochs", "1"]) == 0
    report = json.loads((tmp_path / "epochs" / "privacy.json").read_text())
    assert (report["mechanism"], report["stopped_by"]) == ("none", "max-epochs")
    assert f"training stopped after {report['steps']} steps: --max-epochs 1 reached" in capsys.readouterr().out


def test_an_unknown_key_from_a_preset_names_the_preset(tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    """The user never typed a key an edited preset holds: the error must say where it came from."""
    from lightning_dpgan import config as config_module

    shipped = config_module.load_preset

    def with_typo(name):
        preset = shipped(name)
        return {**preset, "model": {**preset.get("model", {}), "lr_generater": 1e-4}} if name == "gan.yaml" else preset

    monkeypatch.setattr(config_module, "load_preset", with_typo)
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "out")) == 2
    assert "unknown key(s) model.lr_generater for model 'gan' (set by the preset configs/gan.yaml)" in capsys.readouterr().err
    monkeypatch.setattr(config_module, "load_preset", shipped)
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "typed") + ["--model.lr_generater", "1"]) == 2
    assert "for model 'gan'. Valid keys" in capsys.readouterr().err  # typed by the user: no preset named


def test_a_key_the_user_typed_is_not_blamed_on_a_preset(tmp_path, capsys):
    """pategan_adult.yaml sets privacy.num_teachers 100 for its own strategy; under --privacy
    dp-sgd that section is not applied, so nothing is blamed on the preset, even at the same value:
    the refusal is the strategy's, which PATE-GAN cannot take (said before any key is read)."""
    fixtures = Path(__file__).parent / "fixtures" / "adult_tiny"
    args = ["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(fixtures), "--privacy", "dp-sgd",
            "--epsilon", "1", "--privacy.num_teachers", "100", "--output-dir", str(tmp_path / "out")]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "--privacy dp-sgd needs a model with a GradientPrivatizer slot, and PATEGAN has" in error
    assert "set by the preset" not in error


def test_sample_decodes_with_the_released_schema_verbatim():
    """`sample` decodes a table run's records with the schema its checkpoint released, verbatim:
    not the dataset code's current one, nor anything estimated again from the data."""
    from lightning_dpgan.data.schema import TableSchema
    from lightning_dpgan.datamodules.adult import SCHEMA as ADULT_SCHEMA
    from lightning_dpgan.sampling import table_decoder

    released = ADULT_SCHEMA.to_dict()
    age = next(column for column in released["columns"] if column["name"] == "age")
    age["bounds"] = [0.0, 200.0]  # not the code's (17, 90): as released by some earlier run
    decoder = table_decoder({"model": "pategan", "dataset": "adult", "schema": released})
    assert decoder.to_dict() == TableSchema.from_dict(released).to_dict()
    decoded = decoder.decode(torch.ones(3, decoder.encoded_dim))
    assert (decoded["age"] == 200).all()
    quail = table_decoder({"model": "dpgan", "dataset": "adult", "schema": released, "quail": {}})
    assert quail.to_dict() == TableSchema.from_dict(released).without_label().to_dict()


@pytest.mark.parametrize("launcher_env,name,machine_first", [
    ({"LOCAL_RANK": "1"}, "node 0, local rank 1", False),
    ({"NODE_RANK": "2", "LOCAL_RANK": "0"}, "node 2, local rank 0", True),
    ({"RANK": "5", "LOCAL_RANK": "1"}, "rank 5", False),
])
def test_a_ddp_follower_prints_only_the_errors_that_may_be_its_own(monkeypatch, capsys, launcher_env, name,
                                                                   machine_first):
    """Rank 0 prints every refusal. Another process of its machine keeps quiet about a refusal
    drawn from the command line (rank 0 printed the same one to their terminal), and names itself
    on a file error, which may be its own alone. Another machine's first process prints every
    refusal, naming itself: nothing else reaches the terminal that machine was started from."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lightning_dpgan import cli
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.data.download import DataIntegrityError

    for variable in ("LOCAL_RANK", "NODE_RANK", "RANK"):
        monkeypatch.delenv(variable, raising=False)
    errors = [ConfigError("--epsilon must be positive"), ValueError("incompatible model"),
              MisconfigurationException("no GPU"), FileNotFoundError("adult.data is missing"),
              DataIntegrityError("checksum mismatch")]

    def printed(error: Exception) -> str:
        def refuse(argv: list[str]) -> None:
            raise error

        monkeypatch.setitem(cli.COMMANDS, "train", refuse)
        assert cli.main(["train"]) == 2
        return capsys.readouterr().err

    assert [printed(error) for error in errors] == [f"error: {error}\n" for error in errors]  # rank 0
    for variable, value in launcher_env.items():
        monkeypatch.setenv(variable, value)
    own = [f"error ({name}): adult.data is missing\n", f"error ({name}): checksum mismatch\n"]
    refusals = [f"error ({name}): {error}\n" for error in errors[:3]] if machine_first else ["", "", ""]
    assert [printed(error) for error in errors] == refusals + own


def test_a_resume_given_alone_and_a_held_folder_name_the_command_that_continues_the_run(tmp_path, capsys, monkeypatch):
    """A checkpoint holds the networks, not the run's flags: ``--resume CKPT`` alone is refused with
    the command that continues it (its run's config.yaml, the checkpoint and the folder), as is
    training into the run's folder, and that command continues it there, also for a run in the
    default folder (config.yaml records none: it would have started a new timestamped one)."""
    monkeypatch.chdir(tmp_path)
    adult = Path(__file__).parent / "fixtures" / "adult_tiny"
    args = ["train", "--model", "dpgan", "--dataset", "adult", "--data-dir", str(adult), "--epsilon", "5",
            "--max-steps", "2", "--batch-size", "8", "--privacy.noise_multiplier", "2", "--trainer.enable_progress_bar", "false"]
    assert main(args) == 0
    (run,) = (tmp_path / "outputs").iterdir()
    args += ["--output-dir", str(run)]
    checkpoint = run / "checkpoints" / "last.ckpt"
    continue_it = f"--config {run / 'config.yaml'} --resume {checkpoint} --output-dir {run}"
    capsys.readouterr()
    assert main(["train", "--resume", str(checkpoint), "--max-steps", "4"]) == 2
    assert "--model is required with --resume too" in (err := capsys.readouterr().err) and continue_it in err
    assert main(args) == 2
    assert f"continue it with python -m lightning_dpgan train {continue_it}," in capsys.readouterr().err
    assert main(["train", *continue_it.split(), "--max-steps", "4"]) == 0
    assert json.loads((run / "privacy.json").read_text())["steps"] == 4 and [run] == list((tmp_path / "outputs").iterdir())
    # a checkpoint away from its run folder: its model and dataset, read from it, not a RUN placeholder
    lone = tmp_path / "lone.ckpt"
    shutil.copy(checkpoint, lone)
    capsys.readouterr()
    assert main(["train", "--resume", str(lone), "--max-steps", "8"]) == 2
    assert (f"e.g. python -m lightning_dpgan train --model dpgan --dataset adult --resume {lone} and the run's other flags"
            in capsys.readouterr().err)
    lone.write_bytes(b"not a checkpoint")
    assert main(["train", "--resume", str(lone), "--max-steps", "8"]) == 2
    assert f"e.g. python -m lightning_dpgan train --config RUN/config.yaml --resume {lone} --output-dir RUN" in capsys.readouterr().err


@pytest.mark.parametrize("model,setting,value", [
    ("gswgan", "num_critics", 2), ("pategan", "num_teachers", 3),
], ids=["critics", "teachers"])
def test_the_loggers_record_the_teachers_and_critics_the_strategy_built(tmp_path, model, setting, value):
    """Lightning hands the loggers the module's settings as constructed: a 2-critic GS-WGAN run was
    logged with num_critics 1 (W&B, TensorBoard, hparams.yaml), a PATE-GAN run with no teachers."""
    adult = Path(__file__).parent / "fixtures" / "adult_tiny"
    extra = ["--privacy.num_critics", "2"] if setting == "num_critics" else ["--privacy.num_teachers", "3"]
    assert main(["train", "--model", model, "--dataset", "adult", "--data-dir", str(adult), "--output-dir",
                 str(tmp_path / "run"), "--batch-size", "4", "--epsilon", "5000", "--max-steps", "2",
                 "--trainer.enable_progress_bar", "false", *extra]) == 0
    logged = yaml.unsafe_load((tmp_path / "run" / "logs" / "hparams.yaml").read_text())  # Lightning writes tuples
    assert logged[setting] == value


def test_sample_grids_are_logged_at_the_step_of_the_scalars_they_follow(tiny_image_data_dir, tmp_path):
    """The grid drawn after the 2nd batch was logged at step 2 while that batch's scalars are at
    step 1 (the loggers number batches from 0): each picture sat one step after its figures."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=4) + ["--sample_every_n_steps", "2", "--logger", "tensorboard",
                                                                    "--trainer.log_every_n_steps", "1"]) == 0
    (events,) = {path.parent for path in (run / "logs").rglob("events.out.tfevents.*")}
    accumulator = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
    accumulator.Reload()
    assert [event.step for event in accumulator.Images("samples")] == [1, 3]
    assert {1, 3} <= {event.step for event in accumulator.Scalars("loss/discriminator")}
    assert sorted(path.name for path in (run / "samples").iterdir()) == ["step_0000002.png", "step_0000004.png"]


def test_an_interrupted_continuation_keeps_the_earlier_steps_in_its_log(tiny_image_data_dir, tmp_path, monkeypatch):
    """Ctrl-C in a run continued in place left a step log of its own steps only, the earlier
    ones in previous/ alone: the next continuation then carried on from that, and lost them."""
    import pandas as pd

    from run_helpers import act_after_training_step, press_ctrl_c, sigint_restored

    run = tmp_path / "run"
    logged = ["--trainer.log_every_n_steps", "1"]
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=3) + logged) == 0
    act_after_training_step(monkeypatch, 5, press_ctrl_c)
    resume = ["--resume", str(run / "checkpoints" / "last.ckpt"), "--checkpoint_every_n_steps", "1", *logged]
    with sigint_restored():
        assert main(tiny_run_args(tiny_image_data_dir, run, steps=8) + resume) == 130
    steps = pd.read_csv(run / "logs" / "metrics.csv")["step"].dropna().astype(int).tolist()
    assert min(steps) < 3 and 3 in steps and steps == sorted(steps)  # the first run's steps, then this one's


def test_the_package_help_lists_every_command_and_exits_0(capsys):
    """`python -m lightning_dpgan --help` printed the usage line to stderr and exited 2."""
    from lightning_dpgan.cli import COMMANDS

    for flag in ("--help", "-h"):
        assert main([flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: python -m lightning_dpgan")
        commands, options = out.split("commands:")[1].split("\noptions:")
        listed = [line.split()[0] for line in commands.strip().splitlines()]
        assert listed == list(COMMANDS)
        assert [line.split()[0] for line in options.strip().splitlines()] == ["--version"]
    assert main([]) == 2 and "usage:" in capsys.readouterr().err  # no command: still an error


def test_sample_and_evaluate_draw_with_seed_0_unless_told(monkeypatch, tmp_path):
    """Their --help says "default 0": a sample or an evaluation run without --seed is the one a
    --seed 0 run gives, so a result can be reproduced from what the command line showed."""
    from lightning_dpgan import cli, evaluate, sampling

    seen = []
    monkeypatch.setattr(sampling, "sample_to_file",
                        lambda checkpoint, n, out, seed, overwrite, classes: seen.append(seed) or out)
    monkeypatch.setattr(sampling, "guarantee_note", lambda checkpoint: "")  # c.ckpt is never written
    monkeypatch.setattr(sampling, "untrained_warning", lambda checkpoint: None)
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, data_dir, n, epochs, seed, device, split, real_baseline: seen.append(seed))
    cli.sample(["--checkpoint", "c.ckpt", "-n", "3", "--out", str(tmp_path / "s.csv")])
    cli.evaluate(["--run", str(tmp_path)])
    assert seen == [0, 0]


def test_evaluate_reads_its_options_under_either_spelling(monkeypatch, tmp_path):
    """``--data_dir`` and ``--cnn_epochs`` (train's settings take underscores) were refused as
    unrecognized arguments."""
    from lightning_dpgan import cli, evaluate

    seen = []
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, data_dir, n, epochs, seed, device, split, real_baseline:
                        seen.append((data_dir, epochs, real_baseline)))
    cli.evaluate(["--run", str(tmp_path), "--data_dir", "d", "--cnn_epochs", "2", "--real_baseline"])
    cli.evaluate(["--run", str(tmp_path), "--data-dir", "d", "--cnn-epochs=2", "--real-baseline"])
    assert seen == [("d", 2, True)] * 2


def test_an_unknown_command_prints_the_usage_and_exits_2(capsys):
    """It printed the usage alone, not saying that 'trian' was the word at fault."""
    assert main(["trian", "--model", "gan"]) == 2
    usage_line, error = capsys.readouterr().err.strip().splitlines()
    assert usage_line.startswith("usage: ")
    assert error.startswith("error: 'trian' is not a command. Did you mean 'train'? Commands: train, sample, evaluate")
    assert main([]) == 2
    assert capsys.readouterr().err.strip().startswith("usage: ")  # no command at all: the usage says what to give


def test_a_resume_given_no_delta_keeps_the_checkpoints_not_the_presets(tiny_image_data_dir, tmp_path, capsys):
    """Resumed without --delta, a run started at delta 1e-7 took the presets' 1e-5: its epsilon
    after 3 steps read lower than after 2, restated at a hundred times the delta with no word of
    it (and a run started at 1e-3 was refused for a delta nobody typed). It keeps the checkpoint's,
    with a note; --delta still changes it."""
    started = tmp_path / "run"
    noise = ["--epsilon", "50", "--privacy.noise_multiplier", "1.5"]
    assert main(tiny_run_args(tiny_image_data_dir, started, model="dpgan", steps=2) + noise + ["--delta", "1e-7"]) == 0
    checkpoint = str(started / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "kept", model="dpgan", steps=3) + noise
                + ["--resume", checkpoint]) == 0
    assert "--resume keeps the checkpoint's delta 1e-07 (the presets' 1e-05 would restate" in capsys.readouterr().err
    first, kept = read_json(started / "privacy.json"), read_json(tmp_path / "kept" / "privacy.json")
    assert kept["delta"] == 1e-7 and kept["epsilon"] > first["epsilon"]
    loosened = tiny_run_args(tiny_image_data_dir, tmp_path / "loosened", model="dpgan", steps=3)
    assert main(loosened + noise + ["--resume", checkpoint, "--delta", "1e-5"]) == 0
    assert "keeps the checkpoint's delta" not in capsys.readouterr().err
    loosened_report = read_json(tmp_path / "loosened" / "privacy.json")
    assert loosened_report["delta"] == 1e-5
    # each segment says the delta its target was at: the loosening shows
    assert [segment["delta"] for segment in loosened_report["segments"]] == [1e-7, 1e-5]
    assert [segment["delta"] for segment in kept["segments"]] == [1e-7, 1e-7]


@pytest.mark.parametrize("dataset, kept, note", [
    ("kaggle-credit", 1e-6, None),  # the dataset's own default: nothing to say
    ("kaggle-credit", 1e-7, "the dataset's default 1e-06 would restate"),
    ("adult", 1e-7, "the strategies' default 1e-05 would restate"),
])
def test_a_resume_keeps_the_checkpoints_delta_against_the_default_the_run_would_take(monkeypatch, dataset, kept, note):
    """Where no preset sets delta, the run takes the dataset's own default (Kaggle credit's 1e-6),
    else the strategies' 1e-5: the note named 1e-5 for Kaggle credit."""
    from lightning_dpgan import cli

    monkeypatch.setattr(cli, "_checkpoint_strategy_state", lambda path: {"spent": {"epsilon": 1.0, "delta": kept}})
    config, notes = {"resume": "last.ckpt", "delta": None, "data": {"name": dataset}}, []
    cli._keep_the_checkpoints_delta(config, notes)
    assert config["delta"] == kept
    assert (notes == []) if note is None else (len(notes) == 1 and note in notes[0])


@pytest.mark.parametrize("stop, status, said", [("sigterm", 143, "stopped by SIGTERM"), ("ctrl-c", 130, "interrupted")])
def test_a_stop_while_the_outputs_are_written_leaves_no_partial_file_and_says_how_to_write_them(
        tiny_image_data_dir, tmp_path, capsys, monkeypatch, stop, status, said):
    """Lightning's SIGTERM handler is gone once training ends: a SIGTERM while the outputs were
    written ended the process at once, silent, with the temporary copy of the file being written
    left in the folder to be published. It stops as Ctrl-C does now, removing that copy, and both
    say that the finished run's checkpoint writes the outputs, with the command, which trains no
    step."""
    import os
    import signal
    import time

    from lightning_dpgan.outputs import atomic_write
    from lightning_dpgan.run import Run

    def stopped_midway(self, wall_time):
        def write(handle):
            handle.write(b"a,b\n1,")
            if stop == "ctrl-c":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises here
        atomic_write(self.output_dir / "synthetic.csv", write)

    reached_default = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: reached_default.append(signum))  # not pytest's end
    try:
        monkeypatch.setattr(Run, "_write_outputs", stopped_midway)
        run = tmp_path / "run"
        assert main(tiny_run_args(tiny_image_data_dir, run, model="dpgan", steps=2) + ["--epsilon", "10"]) == status
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert reached_default == []
    err = capsys.readouterr().err
    assert (f"train: {said} while writing the outputs of its 2 training steps, which had ended: "
            f"{run / 'checkpoints' / 'last.ckpt'} holds the finished run, with the privacy accountant.") in err
    assert sorted(entry.name for entry in run.iterdir()) == ["checkpoints", "config.yaml", "logs"]
    monkeypatch.undo()
    command = err.split("(no step is trained again) with: python -m lightning_dpgan train ")[1].split()
    assert main(["train", *command]) == 0
    report = read_json(run / "privacy.json")
    assert report["steps"] == 2 and 0 < report["epsilon"] <= 10


def test_a_stop_after_the_outputs_or_in_an_audit_trial_is_not_sent_to_resume(tmp_path):
    """Once privacy.json, the last output, is written, a stop comes as the loggers publish the run
    (W&B's upload): resuming would set the finished outputs aside. An audit's trial is not
    continued at all. Neither is told to resume; a stop before privacy.json is."""
    from types import SimpleNamespace

    from lightning_dpgan.run import Run

    run = SimpleNamespace(module=SimpleNamespace(run_info={}, train_steps=4), output_dir=tmp_path, strategy=object())
    assert "--resume" in Run.outputs_stopped_sentence(run, "stopped by SIGTERM")
    (tmp_path / "privacy.json").write_text("{}")
    published = Run.outputs_stopped_sentence(run, "stopped by SIGTERM")
    assert published.startswith(f"stopped by SIGTERM after its outputs were written in {tmp_path}, while the run was "
                                "published to the loggers") and "--resume" not in published
    run.module.run_info = {"audit_trial": "trial 3"}
    assert Run.outputs_stopped_sentence(run, "interrupted") == ("interrupted while writing the outputs of an audit's "
                                                                 "trial, which is not continued")


def test_evaluate_refuses_more_images_than_free_memory_holds_before_drawing(gan_run, capsys, monkeypatch):
    """sample counted the float32 pixels first; evaluate -n 10000000 drew on until memory ran out."""
    from lightning_dpgan import sampling
    from lightning_dpgan.modules.base import GANModule

    monkeypatch.setattr(sampling, "free_memory", lambda: 10**9)
    monkeypatch.setattr(GANModule, "balanced_labels", lambda self, n: pytest.fail("drew labels"))
    assert main(["evaluate", "--run", str(gan_run), "-n", "10000000"]) == 2
    said = capsys.readouterr().err
    assert "-n 10000000 images would take about 29.2 GiB of memory as they are drawn" in said
    assert "give a smaller -n" in said and not (gan_run / "evaluation.json").exists()


@pytest.mark.parametrize("argv0, train, sample", [
    ("train.py", "python train.py", "python -m lightning_dpgan sample"),
    ("/repo/train.py", "python /repo/train.py", "python -m lightning_dpgan sample"),  # as typed: runnable from anywhere
    ("../my repo/train.py", "python '../my repo/train.py'", "python -m lightning_dpgan sample"),
    ("/venv/bin/lightning-dpgan", "lightning-dpgan train", "lightning-dpgan sample"),
    ("/venv/lib/python3.11/site-packages/lightning_dpgan/__main__.py", "python -m lightning_dpgan train",
     "python -m lightning_dpgan sample"),
])
def test_the_commands_a_message_offers_are_typed_the_way_the_user_started_it(monkeypatch, argv0, train, sample):
    """train.py exists only in a checkout: an installed package's user was told to continue a run
    with python train.py, which they do not have."""
    from lightning_dpgan.command_name import command_line

    from lightning_dpgan.run_folder import continue_command

    monkeypatch.setattr(sys, "argv", [argv0, "--help"])
    assert (command_line("train"), command_line("sample")) == (train, sample)
    assert continue_command(Path("run")).startswith(f"{train} --resume")  # the hints a stopped run prints
