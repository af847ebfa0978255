"""The dev split: training records held out of training to choose settings on, and ``evaluate
--split dev`` / ``benchmark --dev-fraction``, which score on them instead of on the test split."""
from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from run_helpers import read_json, record_calls, tiny_run_args

from lightning_dpgan.benchmark import report, runner
from lightning_dpgan.benchmark.cli import benchmark, parse_args, size_label
from lightning_dpgan.benchmark.suites import suite_size
from lightning_dpgan.cli import main
from lightning_dpgan.data.dev_split import check_dev_fraction, dev_split
from lightning_dpgan.data.idx import read_idx
from lightning_dpgan.datamodules.adult import AdultDataModule
from lightning_dpgan.datamodules.mnist import MNISTDataModule
from lightning_dpgan.run_folder import EVALUATION_FILES, set_aside_outputs

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_split_is_a_fixed_disjoint_cover_of_the_asked_size():
    kept, dev = dev_split(103, 0.2, seed=5)
    assert len(dev) == 21 and len(kept) == 82  # round(103 * 0.2)
    assert sorted([*kept, *dev]) == list(range(103))
    assert list(kept) == sorted(kept) and list(dev) == sorted(dev)
    again_kept, again_dev = dev_split(103, 0.2, seed=5)
    assert np.array_equal(dev, again_dev) and np.array_equal(kept, again_kept)
    assert not np.array_equal(dev, dev_split(103, 0.2, seed=6)[1])
    assert not np.array_equal(dev, np.arange(21)) and not np.array_equal(dev, np.arange(82, 103))  # drawn, not a block
    kept, dev = dev_split(10, 0.0)
    assert list(kept) == list(range(10)) and len(dev) == 0


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5, True, "0.2", None])
def test_a_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="--data.dev_fraction must be a number in \\[0, 1\\)"):
        check_dev_fraction(fraction)
    with pytest.raises(ValueError, match="--data.dev_fraction"):
        MNISTDataModule(dev_fraction=fraction)


def test_train_refuses_a_dev_fraction_before_training(tmp_path, capsys):
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--output-dir", str(tmp_path / "run"), "--data.dev_fraction", "1"]) == 2
    assert "--data.dev_fraction must be a number in [0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("n,fraction,held,left", [(10, 0.01, 0, 10), (10, 0.99, 10, 0)])
def test_a_fraction_that_leaves_a_part_empty_is_refused(n, fraction, held, left):
    """The message counts both parts (it read "leaves 10 of 10 training records for the dev split"
    when none was left to train on) and gives the fractions that work, which do."""
    with pytest.raises(ValueError, match=rf"^--data.dev_fraction {fraction} of 10 training records holds {held} out for "
                                         rf"the dev split and leaves {left} to train on; each needs at least one record "
                                         r"\(a fraction from 0.1 to 0.9 gives both\)$"):
        dev_split(n, fraction)
    for working in (0.1, 0.9):
        kept, dev = dev_split(n, working)
        assert len(kept) and len(dev)


def test_image_dev_records_leave_training_and_only_they_are_the_dev_split(tiny_image_data_dir, tmp_path):
    datamodule = MNISTDataModule(data_dir=tiny_image_data_dir, cache_dir=tmp_path, download=False,
                                 verify_checksums=False, batch_size=8, dev_fraction=0.25)
    datamodule.setup("fit")
    raw = torch.from_numpy(read_idx(tiny_image_data_dir / "mnist" / "train-images-idx3-ubyte.gz")).float() / 127.5 - 1
    kept, dev = dev_split(160, 0.25)
    train_images, _ = datamodule.train_dataset.tensors
    dev_images, dev_labels = datamodule.held_out("dev").tensors
    assert datamodule.train_size == 120 and len(dev_images) == len(dev_labels) == 40
    assert torch.equal(dev_images[:, 0], raw[dev]) and torch.equal(train_images[:, 0], raw[kept])
    seen = torch.cat([images for images, _ in datamodule.train_dataloader()])
    assert not (seen.flatten(1)[:, None] == dev_images.flatten(1)[None]).all(-1).any()  # no dev image is trained on
    assert datamodule.held_out("test") is datamodule.test_dataset and len(datamodule.test_dataset) == 40
    with pytest.raises(ValueError, match="split must be one of"):
        datamodule.held_out("train")


def test_table_dev_rows_leave_training_and_everything_fitted_on_it(monkeypatch):
    from lightning_dpgan.data import table_transformer

    fitted_on = record_calls(monkeypatch, table_transformer, "dp_column_histograms")
    whole = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8)
    whole.setup()
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8, dev_fraction=0.3,
                                 encoding="mode-specific", modes_epsilon=2.0, max_modes=2)
    datamodule.setup()
    train, dev = set(datamodule.train_frame.index), set(datamodule.held_out("dev").index)
    assert not train & dev and train | dev == set(whole.train_frame.index)
    assert len(dev) == round(0.3 * len(whole.train_frame))
    assert datamodule.held_out("test").equals(whole.test_frame)  # the test split is the same as without
    assert len(fitted_on) == 1 and fitted_on[0][0] is datamodule.train_frame  # the DP modes saw no dev row
    assert datamodule.train_size == len(datamodule.train_frame)
    features, _ = datamodule.labelled_records()  # what a DP label model (QUAIL) trains on
    assert len(features) == len(datamodule.train_frame)


def test_a_dev_split_is_refused_for_a_run_that_held_none_out():
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False)
    with pytest.raises(ValueError, match="held no dev records out of training: train it with --data.dev_fraction"):
        datamodule.held_out("dev")


def test_evaluate_on_the_dev_split_scores_the_held_out_training_images(tiny_image_data_dir, tmp_path, monkeypatch):
    """The CNN is tested on the 40 dev images, never on the test split; the measures go to
    evaluation-dev.json, and neither evaluation.json nor a report is written."""
    from lightning_dpgan.evaluation import images, membership

    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2) + ["--data.dev_fraction", "0.25"]) == 0
    tested_on = []
    attacked = record_calls(monkeypatch, membership, "membership_inference")

    def spy_cnn(synthetic, labels, test_images, test_labels, **kwargs):
        tested_on.append(test_images)
        return {"accuracy": 0.25}

    monkeypatch.setattr(images, "cnn_accuracy", spy_cnn)
    assert main(["evaluate", "--run", str(run), "--split", "dev", "--data-dir", str(tiny_image_data_dir)]) == 0
    raw = torch.from_numpy(read_idx(tiny_image_data_dir / "mnist" / "train-images-idx3-ubyte.gz")).float() / 127.5 - 1
    kept, dev = dev_split(160, 0.25)
    assert torch.equal(tested_on[0][:, 0], raw[dev])
    _, members, non_members = attacked[0]  # the attack tells trained-on records from the dev ones
    assert torch.equal(members[:, 0], raw[kept]) and torch.equal(non_members[:, 0], raw[dev])
    evaluation = read_json(run / "evaluation-dev.json")
    assert evaluation["held_out_split"] == "dev" and evaluation["utility/cnn_accuracy"] == 0.25
    assert evaluation["synthetic_records"] == 120  # as many as the images it trained on
    assert not (run / "evaluation.json").exists() and not (run / "report.md").exists()
    assert main(["evaluate", "--run", str(run), "--data-dir", str(tiny_image_data_dir)]) == 0
    assert read_json(run / "evaluation.json")["held_out_split"] == "test"
    assert len(tested_on[1]) == 40 and not torch.equal(tested_on[1], tested_on[0])


def test_evaluate_on_the_dev_split_scores_tables_against_the_dev_rows(tmp_path, monkeypatch):
    from lightning_dpgan.evaluation import utility

    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8", "--data.dev_fraction", "0.3",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    tested_on = record_calls(monkeypatch, utility, "settings_abc")
    assert main(["evaluate", "--run", str(run), "--split", "dev"]) == 0
    expected = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, dev_fraction=0.3)
    (real_train, _, real_test, _), = tested_on
    assert real_test.equals(expected.held_out("dev")) and not set(real_train.index) & set(real_test.index)
    evaluation = read_json(run / "evaluation-dev.json")
    assert evaluation["held_out_split"] == "dev" and "utility/B_auroc" in evaluation
    assert not (run / "report.md").exists() and not (run / "report").exists()


def test_dp_sgd_accounts_for_the_records_left_after_the_dev_split(tmp_path):
    """The accountant's sampling rate is the batch over the records trained on, not over the
    whole train split: with the dev records counted the rate (and epsilon) would be too small."""
    run = tmp_path / "run"
    assert main(["train", "--model", "dpctgan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8", "--data.dev_fraction", "0.3",
                 "--data.modes", "bounds", "--trainer.enable_progress_bar", "false",
                 "--trainer.enable_model_summary", "false"]) == 0
    kept = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, dev_fraction=0.3)
    kept.setup()
    whole = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False)
    whole.setup()
    privacy = read_json(run / "privacy.json")
    assert kept.train_size < whole.train_size
    assert privacy["train_records"] == kept.train_size
    assert privacy["sample_rate"] == pytest.approx(8 / kept.train_size)


def test_evaluate_refuses_the_dev_split_of_a_run_without_one_and_writes_nothing(tiny_image_data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2)) == 0
    assert main(["evaluate", "--run", str(run), "--split", "dev", "--data-dir", str(tiny_image_data_dir)]) != 0
    assert "--data.dev_fraction" in capsys.readouterr().err
    assert not (run / "evaluation-dev.json").exists() and not (run / "evaluation.json").exists()


def test_a_reused_run_folder_sets_every_evaluation_aside(tmp_path):
    """A continued or replaced run moves its outputs aside: a dev evaluation of the old
    checkpoint must not stay beside the new one (the harness's --resume reads it as done)."""
    for name in (*EVALUATION_FILES.values(), "privacy.json"):
        (tmp_path / name).write_text("{}")
    previous = set_aside_outputs(tmp_path, continued=True)
    assert sorted(path.name for path in previous.iterdir()) == ["evaluation-dev.json", "evaluation.json", "privacy.json"]
    assert not any(tmp_path.glob("evaluation*.json"))


def test_train_with_evaluate_scores_a_run_with_a_dev_split_on_it(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "king", "--data-dir", str(FIXTURES / "king_tiny"),
                 "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8", "--data.dev_fraction", "0.25",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--evaluate"]) == 0
    evaluation = read_json(run / "evaluation-dev.json")
    assert evaluation["held_out_split"] == "dev" and "utility/difference_r2" in evaluation  # regression, on dev rows
    assert not (run / "evaluation.json").exists() and not (run / "report.md").exists()


def test_a_resume_must_keep_the_records_the_run_trained_on(tmp_path, capsys):
    """Resuming without the dev split (or with another one) would train on records a dev score
    then counts as unseen: refused, nothing trained; the same split resumes."""
    def train(output: str, *extra: str) -> int:
        return main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                     "--output-dir", str(tmp_path / output), "--batch-size", "8", "--trainer.enable_progress_bar",
                     "false", "--trainer.enable_model_summary", "false", *extra])

    assert train("run", "--max-steps", "2", "--data.dev_fraction", "0.3") == 0
    checkpoint = str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    for changed in ([], ["--data.dev_fraction", "0.5"], ["--data.dev_fraction", "0.3", "--data.split_seed", "1"]):
        capsys.readouterr()
        assert train("again", "--max-steps", "4", "--resume", checkpoint, *changed) == 2
        assert "trained on other records" in capsys.readouterr().err
        assert not (tmp_path / "again" / "privacy.json").exists()
    assert train("again", "--max-steps", "4", "--resume", checkpoint, "--data.dev_fraction", "0.3") == 0
    assert read_json(tmp_path / "again" / "metrics.json")["steps"] == 4


def test_the_harness_trains_without_the_dev_records_and_scores_on_them(tmp_path):
    args = parse_args(["--suite", "images", "--dev-fraction", "0.2", "--models", "dpgan", "--seeds", "0", "1", "2"])
    assert size_label(args) == "dev"  # never the protocol: no goal counts it
    size = suite_size("images", quick=True)
    cell = size.cells()[0]
    settings = runner.Settings(out_dir=tmp_path, dev_fraction=0.2)
    train = runner.train_command(cell, size, settings)
    assert train[train.index("--data.dev_fraction") + 1] == "0.2"
    evaluate = runner.evaluate_command(cell, size, settings)
    assert evaluate[evaluate.index("--split") + 1] == "dev"
    plain = runner.Settings(out_dir=tmp_path)
    assert "--data.dev_fraction" not in runner.train_command(cell, size, plain)
    assert "--split" not in runner.evaluate_command(cell, size, plain)
    folder = tmp_path / cell.name
    folder.mkdir()
    (folder / "privacy.json").write_text("{}")
    (folder / "evaluation.json").write_text("{}")  # scored on the test split: not the dev score asked for
    runner.settings_file(cell, settings).write_text(json.dumps(runner.settings_record(cell, size, settings)))
    assert "train command" in runner.resume_mismatch(cell, size, plain)  # a test-split resume of a dev run: refused
    assert runner.resume_state(folder, evaluate=True, split="dev") == runner.TRAINED
    (folder / "evaluation-dev.json").write_text("{}")
    assert runner.resume_state(folder, evaluate=True, split="dev") == runner.EVALUATED
    recorded = runner.run_cell(cell, size, replace(settings, resume=True))  # read back: the dev score, not the test one
    assert recorded["measures"] == {}
    (folder / "evaluation-dev.json").write_text('{"utility/cnn_accuracy": 0.5}')
    assert runner.run_cell(cell, size, replace(settings, resume=True))["measures"]["utility/cnn_accuracy"] == 0.5
    header = report._header({"file": "images-x.json", "size": "dev", "machine": {"cpu_count": 2, "processor": "x",
                             "torch": "2"}, "commit": {"sha": "abc"}, "command": "c", "seeds": [0], "started": "t", "runs": []})
    assert any("not on the test split" in line for line in header)


@pytest.mark.parametrize("argv,message", [
    (["--suite", "speed", "--dev-fraction", "0.2"], "times runs and scores none"),
    (["--suite", "peers", "--dev-fraction", "0.2"], "scores the peers on the test split"),
    (["--suite", "images", "--dev-fraction", "1"], "benchmark: --dev-fraction must be a number"),
])
def test_the_harness_refuses_a_dev_split_it_cannot_use(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        benchmark([*argv, "--results-dir", str(tmp_path)])


def load_benchmark_script(name: str):
    """A script under ``benchmarks/`` (not a package) as a module, registered in ``sys.modules``
    as importing it would (a dataclass looks its module up there: teacher_ensemble.py's)."""
    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_scripts_real_baseline_is_the_records_the_run_trained_on(tmp_path):
    """tabular_utility.py's setting A (and ctgan_family.py's, quail.py's scoring, through the same
    loader) trains on the run's records: rows it held out as dev are not real training data."""
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8", "--data.dev_fraction", "0.3",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    script = load_benchmark_script("tabular_utility")
    datamodule = script.run_datamodule(run, "adult", None)
    expected = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, dev_fraction=0.3)
    expected.setup()
    assert datamodule.train_frame.equals(expected.train_frame)
    assert not set(datamodule.train_frame.index) & set(expected.held_out("dev").index)
    with pytest.raises(SystemExit, match="was trained on adult"):
        script.run_datamodule(run, "king", None)


def test_the_image_script_takes_its_real_splits_from_the_run(tmp_path, tiny_image_data_dir):
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2) + ["--data.dev_fraction", "0.25"]) == 0
    (train_images, _), (test_images, _) = load_benchmark_script("utility").real_splits(run, str(tiny_image_data_dir))
    whole = MNISTDataModule(data_dir=tiny_image_data_dir, download=False, verify_checksums=False)
    whole.setup()
    assert len(train_images) == len(whole.train_dataset) - round(0.25 * len(whole.train_dataset))
    assert torch.equal(test_images, whole.test_dataset.tensors[0])


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_dev_permutation_is_not_the_train_test_permutation_of_the_same_seed(seed):
    """DEV_STREAM's contract: the dev draw is not the train/test draw of the same split_seed
    (a table's train/test split is default_rng(split_seed).permutation(n_rows), tabular.py:618)."""
    n, fraction = 1000, 0.2
    _, dev = dev_split(n, fraction, seed)
    same_stream = np.sort(np.random.default_rng(seed).permutation(n)[: len(dev)])
    assert not np.array_equal(dev, same_stream)


def test_a_fraction_just_under_one_is_said_as_given_and_the_upper_bound_not_as_one():
    """0.9999999 of 60000 read "--data.dev_fraction 1 ... (a fraction from 1.67e-05 to 1 gives
    both)": the value rounded to the one refused, and a range ending at it."""
    with pytest.raises(ValueError, match=r"^--data.dev_fraction 0.9999999 of 60000 .* \(a fraction from 1.67e-05 to "
                                         r"0.999983 gives both\)$"):
        dev_split(60000, 0.9999999)
