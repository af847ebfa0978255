"""The membership-inference attack, and ``evaluate`` / ``train --evaluate`` on finished runs."""
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from run_helpers import read_json, tiny_run_args

from lightning_dpgan.cli import main
from lightning_dpgan.evaluation.membership import closest_record_distances, membership_inference
from lightning_dpgan.sampling import read_run_info

FIXTURES = Path(__file__).parent / "fixtures"


def train_table_run(run: Path, dataset: str = "adult", fixture: str = "adult_tiny", *extra: str,
                    model: str = "gan") -> None:
    """Two steps of ``model`` on a tiny table fixture, written to ``run``."""
    assert main(["train", "--model", model, "--dataset", dataset, "--data-dir", str(FIXTURES / fixture),
                 "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8", *extra,
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0


def test_closest_record_distances_match_a_brute_force_search():
    torch.manual_seed(0)
    records, reference = torch.randn(7, 2, 3), torch.randn(11, 6)
    expected = torch.tensor([min(torch.dist(r.flatten(), s).item() for s in reference) for r in records])
    torch.testing.assert_close(closest_record_distances(records, reference), expected)
    with pytest.raises(ValueError, match="features"):
        closest_record_distances(torch.randn(2, 5), torch.randn(3, 4))


def test_closest_record_distances_hold_in_chunks_sized_to_the_reference(monkeypatch):
    """The distance matrix of one call is kept to a budget of entries: a large synthetic table
    is met a few query rows at a time, with the same answers."""
    from lightning_dpgan.evaluation import membership

    torch.manual_seed(3)
    records, reference = torch.randn(9, 4), torch.randn(7, 4)
    whole = closest_record_distances(records, reference)
    calls = []
    real_cdist = torch.cdist
    monkeypatch.setattr(torch, "cdist", lambda a, b: calls.append(a.shape[0]) or real_cdist(a, b))
    monkeypatch.setattr(membership, "CHUNK_ENTRIES", 15)  # 2 query rows against 7 references
    torch.testing.assert_close(closest_record_distances(records, reference), whole)
    assert calls == [2, 2, 2, 2, 1]


def test_a_copied_record_is_at_distance_zero_and_a_near_copy_is_not():
    """Past 25 rows ``torch.cdist`` works through a matrix product, whose float32 error (about
    1e-3 on encoded rows) put exact copies of training records at up to 0.001 and near-copies 1e-3
    away at 0: the median distance of a copying generator's members did not read 0."""
    torch.manual_seed(2)
    members = torch.rand(600, 108)
    copies = members[:300].clone()
    near = members[300:400].clone()
    near[:, 0] += 1e-3
    synthetic = torch.cat([torch.rand(2000, 108), copies, near])
    distances = closest_record_distances(members[:400], synthetic)
    assert torch.equal(distances[:300], torch.zeros(300))
    torch.testing.assert_close(distances[300:], torch.full((100,), 1e-3), rtol=1e-4, atol=0)
    # a near-copy 1e-4 away listed before each exact copy: float32's matrix product could not tell
    # them apart, and took the first
    wider = members[:400] * 4
    beside = wider.clone()
    beside[:, 0] += 1e-4
    distances = closest_record_distances(wider, torch.cat([torch.rand(2000, 108) * 4, beside, wider]))
    assert torch.equal(distances, torch.zeros(400))


def test_attack_is_at_chance_when_the_generator_saw_nobody():
    torch.manual_seed(1)
    members, non_members, synthetic = torch.randn(800, 5), torch.randn(800, 5), torch.randn(800, 5)
    attack = membership_inference(synthetic, members, non_members)
    assert attack["auc"] == pytest.approx(0.5, abs=0.05)  # ~3.5 standard errors of the AUC at n = 800
    assert attack["records_per_group"] == 800


def test_attack_wins_against_a_generator_that_copies_its_training_records():
    torch.manual_seed(2)
    members, non_members = torch.randn(300, 5), torch.randn(300, 5)
    attack = membership_inference(members[:150] + 1e-3, members, non_members)
    assert attack["auc"] > 0.7  # half the members are copied: they score far above every non-member
    assert attack["median_dcr_members"] < attack["median_dcr_non_members"]
    assert membership_inference(members.clone(), members, non_members)["auc"] == 1.0


def assert_stages_said(err: str, stages: list[str]) -> None:
    """Each stage is said once, in this order: a long evaluation tells where it is."""
    places = [err.find(stage) for stage in stages]
    assert -1 not in places and places == sorted(places), err
    assert all(err.count(stage) == 1 for stage in stages), err


def test_train_with_evaluate_writes_image_utility_and_risk(tiny_image_data_dir, tmp_path, capsys):
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=3) + ["--evaluate"]) == 0
    assert_stages_said(capsys.readouterr().err, ["evaluate: drawing 160 synthetic images", "evaluate: utility: the CNN, 10 epochs",
                                                 "evaluate: risk: the membership attack"])
    evaluation = read_json(tmp_path / "run" / "evaluation.json")
    assert 0.0 <= evaluation["utility/cnn_accuracy"] <= 1.0 and evaluation["utility/cnn_epochs"] == 10
    assert 0.0 <= evaluation["privacy_risk/mia_auc"] <= 1.0
    assert evaluation["synthetic_records"] == 160  # as many as training images
    assert evaluation["epsilon"] is None  # a non-private baseline: no guarantee to show
    assert "![Samples (one row per class)](samples.png)" in (tmp_path / "run" / "report.md").read_text()
    # --evaluate is the evaluate command on the finished run: run afresh, it gives the same figures.
    assert main(["evaluate", "--run", str(tmp_path / "run"), "--data-dir", str(tiny_image_data_dir)]) == 0
    again = read_json(tmp_path / "run" / "evaluation.json")
    for key in ("utility/cnn_accuracy", "privacy_risk/mia_auc", "privacy_risk/median_dcr_members"):
        assert again[key] == evaluation[key], key


def test_an_image_run_is_not_scored_against_other_images_than_it_trained_on(tiny_image_data_dir, tmp_path, capsys):
    """Another dataset's files under --data-dir (custom files are read unchecked) were scored as if
    the run had trained on them: its membership attack and CNN accuracy of other images. The
    checkpoint keeps a digest of the training images, as it does of a table's rows."""
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2)) == 0
    other = tiny_image_data_dir / "fashion-mnist"  # the same file names, other images
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--data-dir", str(other)]) == 2
    assert "the training records of mnist are not those this run trained on" in capsys.readouterr().err
    assert not (run / "evaluation.json").exists()
    assert main(["evaluate", "--run", str(run), "--data-dir", str(tiny_image_data_dir), "-n", "20",
                 "--cnn-epochs", "1"]) == 0


def test_an_image_run_whose_files_are_downloaded_as_it_starts_trains_and_keeps_their_digest(
        tiny_image_data_dir, tmp_path, monkeypatch):
    """The digest was read as the module was built, before Lightning's prepare_data downloaded
    the files: a first run with an empty cache stopped at "files not found"."""
    from lightning_dpgan.datamodules import images

    def download(remote, cache):  # a download, from the tiny files
        Path(cache).mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(tiny_image_data_dir / "mnist" / remote.name, Path(cache) / remote.name))

    monkeypatch.setattr(images, "fetch", download)
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR", raising=False)
    monkeypatch.setenv("LIGHTNING_DPGAN_CACHE_DIR", str(tmp_path / "cache"))
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=1)
    del args[args.index("--data-dir"):args.index("--data-dir") + 2]
    assert main(args) == 0
    digest = read_run_info(tmp_path / "run" / "checkpoints" / "last.ckpt")["train_rows_digest"]
    from lightning_dpgan.datamodules.mnist import MNISTDataModule  # the same files, where the download came from
    assert digest == MNISTDataModule(data_dir=tiny_image_data_dir, verify_checksums=False).train_rows_digest()


def test_an_unconditional_image_run_says_why_it_has_no_cnn_accuracy(tiny_image_data_dir, tmp_path, capsys):
    """Its generator draws no labels, so there is nothing to train the CNN on: evaluation.json
    simply lacked the figure, and a --cnn-epochs given went unused without a word."""
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2) + ["--model.conditional", "false"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--cnn-epochs", "3"]) == 0
    assert "draws unlabelled images (--model.conditional false): no CNN accuracy" in capsys.readouterr().err
    assert "utility/cnn_accuracy" not in read_json(run / "evaluation.json")
    report = (run / "report.md").read_text()
    assert "no CNN accuracy" in report
    assert "## Samples\n" in report and "one row per class" not in report  # its grid has no class rows


def test_fewer_images_than_classes_and_pixels_past_the_range_are_said_and_scored_as_published(
        tiny_image_data_dir, tmp_path, monkeypatch, capsys):
    """-n 3 trained the CNN on three classes in silence (its accuracy is then those classes'
    share); a generator without tanh drawing past [-1, 1] failed the CNN's input check with
    advice about uint8 pixels, while sample and samples.png clamp."""
    from lightning_dpgan.modules.base import GANModule

    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2)) == 0
    sample = GANModule.sample
    monkeypatch.setattr(GANModule, "sample", lambda self, n, labels=None: 3 * sample(self, n, labels))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "-n", "3", "--cnn-epochs", "1"]) == 0
    err = capsys.readouterr().err
    assert "the 3 synthetic images hold 3 of the 10 classes: the CNN never predicts the others" in err
    assert "of the generated pixels lie outside [-1, 1]" in err and "scored clamped" in err
    assert 0 <= read_json(run / "evaluation.json")["utility/cnn_accuracy"] <= 1


@pytest.fixture(scope="module")
def image_run(tiny_image_data_dir, tmp_path_factory):
    """Two steps of the conditional GAN on the tiny MNIST files (a test that changes the folder copies it)."""
    run = tmp_path_factory.mktemp("image") / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, steps=2)) == 0
    return run


def test_evaluate_trains_the_cnn_on_its_schedule_and_tests_it_on_the_test_images_and_labels(
        image_run, tiny_image_data_dir, monkeypatch):
    """--cnn-epochs and --seed reach the CNN, which is scored on the test split's own images and
    labels, in order, after training on the synthetic images clamped to [-1, 1] (not rescaled)."""
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.evaluation import images
    from lightning_dpgan.modules.base import GANModule

    seen = {}

    def spy_cnn(synthetic, labels, test_images, test_labels, **kwargs):
        seen.update(synthetic=synthetic, test_images=test_images, test_labels=test_labels, **kwargs)
        return {"accuracy": 0.5}

    def drawn(n):
        return torch.linspace(-3, 3, n * 28 * 28).reshape(n, 1, 28, 28)

    monkeypatch.setattr(GANModule, "sample", lambda self, n, labels=None: drawn(n))
    monkeypatch.setattr(images, "cnn_accuracy", spy_cnn)
    run = image_run.parent / "scheduled"
    shutil.copytree(image_run, run)
    assert main(["evaluate", "--run", str(run), "--data-dir", str(tiny_image_data_dir), "-n", "20",
                 "--cnn-epochs", "2", "--seed", "7"]) == 0
    assert seen["epochs"] == 2 and seen["seed"] == 7
    evaluation = read_json(run / "evaluation.json")
    assert evaluation["utility/cnn_epochs"] == 2 and (evaluation["seed"], evaluation["device"]) == (7, "cpu")
    real = MNISTDataModule(data_dir=tiny_image_data_dir, verify_checksums=False)
    real.prepare_data()
    real.setup()
    test_images, test_labels = real.test_dataset.tensors
    assert torch.equal(seen["test_images"], test_images) and torch.equal(seen["test_labels"], test_labels)
    assert torch.equal(seen["synthetic"], drawn(20).clamp(-1, 1))


def test_the_real_baseline_trains_the_same_cnn_on_as_many_real_training_images(image_run, tiny_image_data_dir,
                                                                                monkeypatch):
    """--real-baseline: the CNN of the synthetic images, on their schedule and seed, trained on n
    real training images (a seeded draw of distinct ones) and tested on the same test images; the
    gap is the real accuracy less the synthetic one. Without the flag, no second CNN is trained."""
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.evaluation import images

    trained = []

    def spy_cnn(train_images, train_labels, test_images, test_labels, **kwargs):
        trained.append((train_images, train_labels, test_images, kwargs))
        return {"accuracy": 0.75 if len(trained) == 2 else 0.5}  # the synthetic CNN first, then the real one

    monkeypatch.setattr(images, "cnn_accuracy", spy_cnn)
    run = image_run.parent / "baseline"
    shutil.copytree(image_run, run)
    common = ["evaluate", "--run", str(run), "--data-dir", str(tiny_image_data_dir), "-n", "20", "--cnn-epochs", "2",
              "--seed", "3"]
    assert main(common) == 0
    assert len(trained) == 1 and "utility/cnn_accuracy_real" not in read_json(run / "evaluation.json")
    trained.clear()
    assert main([*common, "--real-baseline"]) == 0
    (_, _, synthetic_test, synthetic_kwargs), (real_images, real_labels, real_test, real_kwargs) = trained
    real = MNISTDataModule(data_dir=tiny_image_data_dir, verify_checksums=False)
    real.prepare_data()
    real.setup()
    train_images, train_labels = real.train_dataset.tensors
    assert len(real_images) == 20 < len(train_images)
    rows = [int(torch.nonzero((train_images == image).flatten(1).all(1))[0]) for image in real_images]
    assert len(set(rows)) == 20 and torch.equal(real_labels, train_labels[rows])  # distinct real images, their labels
    assert torch.equal(real_test, synthetic_test) and real_kwargs == synthetic_kwargs == {"epochs": 2, "seed": 3,
                                                                                           "device": "cpu"}
    evaluation = read_json(run / "evaluation.json")
    assert evaluation["utility/cnn_accuracy"] == 0.5 and evaluation["utility/cnn_accuracy_real"] == 0.75
    assert evaluation["utility/cnn_real_records"] == 20
    assert evaluation["utility/difference_cnn_accuracy"] == pytest.approx(0.25)
    assert "utility/difference_cnn_accuracy" in (run / "report.md").read_text()


def test_a_draw_of_every_class_warns_of_none_nor_repeats_an_earlier_evaluations_warnings(
        image_run, tiny_image_data_dir, capsys):
    """-n 3 warns that 7 classes are missing; the next evaluation in the same process, of every
    class, warns of nothing and its report carries no stale warning."""
    run = image_run.parent / "warned"
    shutil.copytree(image_run, run)
    common = ["evaluate", "--run", str(run), "--data-dir", str(tiny_image_data_dir), "--cnn-epochs", "1"]
    assert main([*common, "-n", "3"]) == 0
    assert "## Warnings" in (run / "report.md").read_text()
    capsys.readouterr()
    assert main([*common, "-n", "20"]) == 0
    assert "synthetic images hold" not in capsys.readouterr().err
    assert "## Warnings" not in (run / "report.md").read_text()


def test_a_run_without_its_sample_grid_gets_no_link_to_one(image_run, tiny_image_data_dir):
    run = image_run.parent / "no-grid"
    shutil.copytree(image_run, run)
    (run / "samples.png").unlink()
    assert main(["evaluate", "--run", str(run), "--data-dir", str(tiny_image_data_dir), "-n", "20",
                 "--cnn-epochs", "1"]) == 0
    assert "samples.png" not in (run / "report.md").read_text()


def test_a_dev_evaluation_leaves_the_test_evaluations_report_and_figures_as_they_were(tiny_image_data_dir, tmp_path):
    run = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, run, model="wgan", steps=2) + [
        "--privacy", "dp-sgd", "--epsilon", "5", "--data.dev_fraction", "0.25", "--trainer.log_every_n_steps", "1"]) == 0
    assert main(["evaluate", "--run", str(run), "-n", "20", "--cnn-epochs", "1"]) == 0
    assert (run / "report" / "epsilon.png").is_file()
    names = ["evaluation.json", "report.md", *(f"report/{p.name}" for p in (run / "report").iterdir())]
    before = {name: (run / name).read_bytes() for name in names}
    assert main(["evaluate", "--run", str(run), "--split", "dev", "-n", "20", "--cnn-epochs", "1"]) == 0
    assert (run / "evaluation-dev.json").is_file()
    assert {name: (run / name).read_bytes() for name in names} == before
    assert sorted(f"report/{p.name}" for p in (run / "report").iterdir()) == sorted(n for n in names if "/" in n)


def test_the_epsilon_figure_plots_epsilon_against_the_logged_step(tmp_path):
    """Lightning's CSV log interleaves rows of other metrics (no epsilon): the curve is epsilon
    over the 'step' column of the rows that hold one, not over row numbers or epochs."""
    from lightning_dpgan.evaluation.report import epsilon_figure

    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,loss,privacy/epsilon\n0,9,0.5,\n0,9,,0.25\n1,19,,0.5\n1,29,0.4,\n2,49,,1.0\n")
    line = epsilon_figure(csv).axes[0].lines[0]
    assert list(line.get_xdata()) == [9, 19, 49] and list(line.get_ydata()) == [0.25, 0.5, 1.0]


def test_evaluation_draws_its_images_a_chunk_at_a_time_with_every_class_balanced(tiny_image_data_dir, tmp_path,
                                                                                 monkeypatch):
    """The generator is called a chunk at a time (160 images in chunks of 64: 64, 64, 32) and the
    CNN gets every image, on the CPU, with the balanced labels 0, 1, ..., 9, 0, ... in order."""
    from lightning_dpgan import sampling
    from lightning_dpgan.evaluation import images
    from lightning_dpgan.modules.base import GANModule

    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=2)) == 0
    calls, seen = [], {}
    sample = GANModule.sample

    def spy_sample(self, n, labels=None):
        calls.append((n, None if labels is None else labels.tolist()))
        return sample(self, n, labels)

    def spy_cnn(synthetic, labels, *args, **kwargs):
        seen.update(images=synthetic, labels=labels)
        return {"accuracy": 0.5}

    monkeypatch.setattr(sampling, "IMAGE_CHUNK", 64)
    monkeypatch.setattr(GANModule, "sample", spy_sample)
    monkeypatch.setattr(images, "cnn_accuracy", spy_cnn)
    assert main(["evaluate", "--run", str(tmp_path / "run"), "--data-dir", str(tiny_image_data_dir)]) == 0
    assert [n for n, _ in calls] == [64, 64, 32]
    assert [label for _, chunk in calls for label in chunk] == [i % 10 for i in range(160)]
    assert seen["images"].shape == (160, 1, 28, 28) and seen["images"].device.type == "cpu"
    assert seen["labels"].tolist() == [i % 10 for i in range(160)]
    assert read_json(tmp_path / "run" / "evaluation.json")["utility/cnn_accuracy"] == 0.5


@pytest.mark.parametrize(
    "dataset,fixture,keys",
    [
        ("adult", "adult_tiny", ["utility/A_auroc", "utility/B_auroc", "utility/C_auroc", "utility/sra", "fidelity/jsd_mean",
                                 "utility/A_auroc/logistic_regression", "utility/difference_auroc", "fidelity/jsd/workclass"]),
        ("king", "king_tiny", ["utility/real_r2", "utility/synthetic_r2", "utility/difference_r2", "fidelity/wasserstein_mean",
                               "utility/synthetic_r2/ridge", "fidelity/wasserstein/sqft_living"]),
    ],
)
def test_evaluate_a_table_run(tmp_path, dataset, fixture, keys, capsys):
    run = tmp_path / "run"
    args = ["train", "--model", "gan", "--dataset", dataset, "--data-dir", str(FIXTURES / fixture), "--output-dir", str(run),
            "--max-steps", "3", "--batch-size", "8", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    assert_stages_said(capsys.readouterr().err, ["evaluate: utility: the", "evaluate: fidelity:",
                                                 "evaluate: risk: the membership attack"])
    evaluation = read_json(run / "evaluation.json")
    for key in [*keys, "fidelity/correlation_difference", "fidelity/pmse", "fidelity/pmse_cart_ratio",
                "utility/feature_agreement", "privacy_risk/mia_auc"]:
        assert key in evaluation, key
    assert 0.0 <= evaluation["privacy_risk/mia_auc"] <= 1.0
    files = real_and_synthetic(run)
    assert evaluation["fidelity/jsd_mean"] == pytest.approx(jsd_mean_by_hand(*files), rel=1e-6)  # ours averages float32 one-hots
    assert evaluation["fidelity/wasserstein_mean"] == pytest.approx(wasserstein_mean_by_hand(*files), rel=1e-6)
    tv, invented = few_valued_by_hand(*files)
    assert evaluation["fidelity/tv_mean"] == pytest.approx(tv, rel=1e-9)
    assert evaluation["fidelity/invented_share_mean"] == pytest.approx(invented, rel=1e-9)
    report = (run / "report.md").read_text()
    figures = ["report/marginals.png", "report/correlations.png"] + (["report/auroc.png"] if dataset == "adult" else [])
    for figure in figures:
        assert f"]({figure})" in report and (run / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
    assert "report/epsilon.png" not in report  # a non-private run has no privacy curve to draw
    assert "| `utility/" in report and "epsilon: none (not private)" in report
    measured = report.split("## Measured")[1].split("\n## ")[0]  # the summaries; the rest in tables per model / column
    detail = next(key for key in keys if key.startswith("utility/") and key.count("/") == 2)
    assert f"| `{keys[0]}` |" in measured and f"`{detail}`" not in measured
    per_model = report.split("## Per model")[1].split("\n## ")[0]
    _, measure, model = detail.split("/")
    assert f"`{measure}`" in per_model and f"| {model} |" in per_model
    assert "| sqft_living |" in report or "| workclass |" in report
    assert "- steps: 3 (stopped by: max-steps)" in report


def test_an_evaluation_that_fails_midway_leaves_the_earlier_one_whole(tmp_path, monkeypatch, capsys):
    """Its figures were written before evaluation.json, so a failure (here in the membership
    attack, the last measure) left new figures beside the old report; they are staged now and
    published only with the evaluation. A second evaluation says it replaced the first."""
    from lightning_dpgan.evaluation import membership

    run = tmp_path / "run"
    train_table_run(run)
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "replaced" not in capsys.readouterr().err
    names = ["evaluation.json", "report.md", *(f"report/{p.name}" for p in (run / "report").iterdir())]
    before = {name: (run / name).read_bytes() for name in names}

    def out_of_memory(*args, **kwargs):
        raise MemoryError("the attack ran out of memory")

    monkeypatch.setattr(membership, "membership_inference", out_of_memory)
    with pytest.raises(MemoryError):
        main(["evaluate", "--run", str(run), "--seed", "7"])
    assert {name: (run / name).read_bytes() for name in names} == before
    assert sorted(p.name for p in (run / "report").iterdir()) == sorted(n.split("/")[1] for n in names if "/" in n)
    assert not [p for p in run.iterdir() if p.name.startswith(".report")]
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--seed", "7"]) == 0
    assert "replaced the earlier evaluation.json and report.md" in capsys.readouterr().err
    assert read_json(run / "evaluation.json")["seed"] == 7 and "device" not in read_json(run / "evaluation.json")
    assert (run / "evaluation.json").read_bytes() != before["evaluation.json"]


def real_and_synthetic(run: Path):
    """The run's real training split and the synthetic.csv train wrote, read with pandas."""
    import pandas as pd

    from lightning_dpgan.evaluate import load_run_datamodule

    datamodule = load_run_datamodule(run)
    return datamodule.schema, datamodule.train_frame, pd.read_csv(run / "synthetic.csv")


def few_valued_by_hand(schema, real, synthetic) -> tuple[float, float]:
    """Means over the categorical columns, and the integer and stepped ones with at most 1,000
    values within their bounds, of the total variation of their value frequencies, and of the
    share of synthetic rows on a value absent from the real rows; values compared as they are
    (decoding puts them on their grid)."""
    import numpy as np

    def values_within_bounds(column) -> float:
        low, high = column.bounds
        return (high - low) / (column.step or 1) + 1

    columns = [c.name for c in schema.columns if c.kind == "categorical"
               or (c.kind == "integer" or c.step is not None) and values_within_bounds(c) <= 1000]
    tv, invented = [], []
    for name in columns:
        real_values, synthetic_values = real[name].astype(str), synthetic[name].astype(str)
        p, q = real_values.value_counts(normalize=True), synthetic_values.value_counts(normalize=True)
        tv.append(0.5 * p.sub(q, fill_value=0.0).abs().sum())
        invented.append((~synthetic_values.isin(set(real_values))).mean())
    return float(np.mean(tv)), float(np.mean(invented))


def jsd_mean_by_hand(schema, real, synthetic) -> float | None:
    """Mean over categorical columns of the squared base-2 Jensen-Shannon distance between the
    real and synthetic category frequencies (over the schema's category list)."""
    import numpy as np
    from scipy.spatial.distance import jensenshannon

    values = []
    for column in schema.columns:
        if column.is_numeric:
            continue
        categories = [str(c) for c in column.categories]
        p = real[column.name].astype(str).value_counts(normalize=True).reindex(categories, fill_value=0.0)
        q = synthetic[column.name].astype(str).value_counts(normalize=True).reindex(categories, fill_value=0.0)
        values.append(jensenshannon(p.to_numpy(), q.to_numpy(), base=2) ** 2)
    return float(np.mean(values)) if values else None


def wasserstein_mean_by_hand(schema, real, synthetic) -> float | None:
    """Mean over numeric columns of scipy's 1-D Wasserstein distance on values scaled to [0, 1]
    by the column's public bounds."""
    import numpy as np
    from scipy.stats import wasserstein_distance

    values = []
    for column in schema.columns:
        if not column.is_numeric:
            continue
        low, high = column.bounds
        scale = lambda x: np.clip((x.to_numpy(dtype=float) - low) / (high - low), 0.0, 1.0)  # noqa: E731
        values.append(wasserstein_distance(scale(real[column.name]), scale(synthetic[column.name])))
    return float(np.mean(values)) if values else None


def test_evaluate_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["evaluate", "--run", str(tmp_path)]) == 2
    assert "config.yaml" in capsys.readouterr().err


def test_an_edited_synthetic_table_with_a_category_outside_the_schema_is_refused(tmp_path, capsys):
    """Most measures encode rows by the schema and would drop those rows; the counting ones would
    keep them: two different tables in one report. Refused instead, and nothing is written."""
    import pandas as pd

    run = tmp_path / "run"
    train_table_run(run)
    table = pd.read_csv(run / "synthetic.csv", dtype=str, keep_default_na=False)
    table.loc[table.index[:5], "workclass"] = "Astronaut"
    table.to_csv(run / "synthetic.csv", index=False)
    assert main(["evaluate", "--run", str(run)]) == 2
    error = capsys.readouterr().err
    assert "the synthetic table cannot be scored" in error and "'workclass': 5" in error
    assert not (run / "evaluation.json").exists()


def test_an_image_option_for_a_table_run_is_refused_and_a_run_without_its_table_is_told_how_to_get_one(tmp_path, capsys):
    """-n, --cnn-epochs and --device were ignored in silence for a table run, which is scored on
    its synthetic.csv as written; a run killed before writing synthetic.csv is told the commands
    that continue it or draw the table from its checkpoint."""
    run = tmp_path / "run"
    train_table_run(run)
    capsys.readouterr()
    for flags, named in ((["-n", "100"], "-n is for image runs"), (["--cnn-epochs", "3", "--device", "cpu"],
                                                                  "--cnn-epochs, --device are for image runs"),
                         (["--real-baseline"], "--real-baseline is for image runs")):
        assert main(["evaluate", "--run", str(run), *flags]) == 2
        error = capsys.readouterr().err
        assert named in error and "scored on its synthetic.csv as written" in error
        rows = "-n" in flags  # only a number of rows is told how to score another: the CNN's options have no such remedy
        assert ("move its synthetic.csv aside" in error) == ("sample --checkpoint" in error) == rows
        assert "--overwrite" not in error  # the run's own table is not replaced
        assert not (run / "evaluation.json").exists()
    (run / "synthetic.csv").unlink()
    assert main(["evaluate", "--run", str(run)]) == 2
    error = capsys.readouterr().err
    assert "has no synthetic.csv (the run did not finish)" in error
    assert f"--resume {run / 'checkpoints' / 'last.ckpt'} --output-dir {run})" in error and f"--out {run / 'synthetic.csv'}" in error
    assert main(["sample", "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "-n", "40", "--out",
                 str(run / "synthetic.csv")]) == 0  # the remedy, followed
    assert main(["evaluate", "--run", str(run)]) == 0 and read_json(run / "evaluation.json")["synthetic_records"] == 40


def test_a_built_in_dataset_whose_schema_changed_since_training_is_refused_with_its_remedy(tmp_path, capsys,
                                                                                          monkeypatch):
    """A built-in dataset has no schema file to put back: its schema is this version's code, and a
    run trained under other bounds is evaluated with the version that trained it."""
    import dataclasses

    from lightning_dpgan.datamodules import adult

    run = tmp_path / "run"
    train_table_run(run)
    capsys.readouterr()
    wider = tuple(dataclasses.replace(column, bounds=(17, 100)) if column.name == "age" else column
                  for column in adult.SCHEMA.columns)
    monkeypatch.setattr(adult, "SCHEMA", dataclasses.replace(adult.SCHEMA, columns=wider))
    assert main(["evaluate", "--run", str(run)]) == 2
    refusal = capsys.readouterr().err
    assert "trained on another schema (differing: age)" in refusal
    assert "a built-in dataset's schema is this version's: evaluate the run with the version that trained it" in refusal
    assert not (run / "evaluation.json").exists()


def test_options_a_run_cannot_take_are_refused_before_its_data_is_read(tmp_path, capsys, monkeypatch):
    """An image option for a table run and ``--split dev`` for a run that held no dev records out
    are refused from the run's settings alone: reading the data first would only print the data's
    own warnings (a train flag's advice among them) above the refusal, and take its time."""
    from lightning_dpgan.datamodules.tabular import TabularDataModule

    run = tmp_path / "run"
    train_table_run(run)
    capsys.readouterr()
    reads, prepare = [], TabularDataModule.prepare_data
    monkeypatch.setattr(TabularDataModule, "prepare_data", lambda self: (reads.append(self.name), prepare(self)))
    for flags, named in ((["-n", "100"], "-n is for image runs"), (["--split", "dev"], "held no dev records out of training")):
        assert main(["evaluate", "--run", str(run), *flags]) == 2
        assert named in capsys.readouterr().err
    assert reads == []
    assert main(["evaluate", "--run", str(run)]) == 0 and reads == ["adult"]  # what the count sees of a read


def test_evaluating_a_csv_run_reuses_its_released_schema(tmp_path, monkeypatch, capsys):
    """A csv run without a schema file paid for one DP estimate of its schema; evaluate must use
    the released one, never estimate again on the private rows."""
    import numpy as np
    import pandas as pd

    import lightning_dpgan.datamodules.csv as csv_module

    rng = np.random.default_rng(0)
    pd.DataFrame({"amount": rng.gamma(2.0, 50.0, 300).round(2), "kind": rng.choice(["a", "b"], 300),
                  "label": rng.choice(["no", "yes"], 300)}).to_csv(tmp_path / "t.csv", index=False)
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "csv", "--data.csv", str(tmp_path / "t.csv"),
                 "--data.target", "label", "--data.categorical", "kind,label", "--data.label_kind", "binary",
                 "--data.bounds_epsilon", "3", "--data.bounds_delta", "1e-6", "--output-dir", str(run), "--max-steps", "2", "--batch-size", "8",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0

    def no_second_estimate(*args, **kwargs):
        raise AssertionError("the schema was estimated again from the private rows")

    monkeypatch.setattr(csv_module, "infer_schema_dp", no_second_estimate)
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "utility/B_auroc" in read_json(run / "evaluation.json")
    # without its checkpoint the released schema is gone: asked for by name, not a warning that the run
    # goes on and then a bare "checkpoint not found"
    (run / "checkpoints" / "last.ckpt").rename(tmp_path / "kept.ckpt")
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoints/last.ckpt, which keeps the run's schema, released under DP" in err
    assert "spend budget a second time" in err and "not checked against" not in err


@pytest.mark.parametrize("source,target", [
    (("gan", "adult"), ("dpgan", "adult")),  # a non-private checkpoint scored under a DP run's epsilon
    (("gan", "adult"), ("gan", "king")),  # the same model on another dataset
], ids=["another-model", "another-dataset"])
def test_a_checkpoint_of_another_run_is_refused_not_scored_under_this_runs_epsilon(tmp_path, capsys, source, target):
    """A checkpoint copied into another run's folder was evaluated and reported with that run's
    epsilon and mechanism; refused, naming both runs, with the evaluation untouched. The model
    alone does not make a checkpoint the run's: its dataset must be the run's too."""
    private = {"dpgan": ["--epsilon", "8", "--delta", "1e-3"]}
    runs = {}
    for name, (model, dataset) in (("source", source), ("target", target)):
        runs[name] = tmp_path / name
        train_table_run(runs[name], dataset, f"{dataset}_tiny", *private.get(model, []), model=model)
    shutil.copy(runs["source"] / "checkpoints" / "last.ckpt", runs["target"] / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    assert main(["evaluate", "--run", str(runs["target"])]) == 2
    err = capsys.readouterr().err
    assert f"is a checkpoint of --model {source[0]} --dataset {source[1]}" in err
    assert f"a run of --model {target[0]} --dataset {target[1]}" in err
    assert not (runs["target"] / "evaluation.json").exists()


def test_a_privacy_report_or_checkpoint_of_another_run_of_the_same_kind_is_refused(tmp_path, capsys):
    """Two runs of one model on one dataset: another run's privacy.json copied in was scored and
    reported with its epsilon, and another run's checkpoint with this run's; their lineages (the
    random run ids) differ, and the evaluation is refused untouched."""
    first, second = tmp_path / "first", tmp_path / "second"
    for run in (first, second):
        train_table_run(run)
    for name in ("privacy.json", "checkpoints/last.ckpt"):
        mixed = Path(shutil.copytree(first, tmp_path / f"mixed-{Path(name).stem}"))
        shutil.copy(second / name, mixed / name)
        capsys.readouterr()
        assert main(["evaluate", "--run", str(mixed)]) == 2
        assert "are of different runs (their lineage" in capsys.readouterr().err
        assert not (mixed / "evaluation.json").exists()
    assert main(["evaluate", "--run", str(first)]) == 0  # its own files: scored


def test_a_privacy_report_edited_to_state_another_epsilon_or_delta_is_refused(tmp_path, capsys):
    """A privacy.json edited by hand (a smaller epsilon, a smaller delta) was copied into
    evaluation.json and report.md as the synthetic data's guarantee. The checkpoint keeps what
    the strategy spent: the run's own report passes, an edited one is refused untouched."""
    import json

    from lightning_dpgan.sampling import read_spent_privacy

    run = tmp_path / "run"
    train_table_run(run, "adult", "adult_tiny", "--epsilon", "8", "--delta", "1e-3", model="dpgan")
    privacy = read_json(run / "privacy.json")
    assert read_spent_privacy(run / "checkpoints" / "last.ckpt") == {"epsilon": privacy["epsilon"], "delta": 1e-3}
    assert main(["evaluate", "--run", str(run)]) == 0
    before = (run / "evaluation.json").read_bytes()
    for edit in ({"epsilon": privacy["epsilon"] / 2}, {"delta": 1e-6}, {"epsilon": None}):
        (run / "privacy.json").write_text(json.dumps({**privacy, **edit}))
        capsys.readouterr()
        assert main(["evaluate", "--run", str(run)]) == 2
        err = capsys.readouterr().err
        assert "the report was edited since training" in err and f"epsilon {privacy['epsilon']:.6g}, delta 0.001" in err
        assert (run / "evaluation.json").read_bytes() == before
    (run / "privacy.json").write_text(json.dumps(privacy))
    assert main(["evaluate", "--run", str(run)]) == 0


def test_a_teacher_runs_privacy_report_edited_in_its_data_independent_bound_or_accounting_is_refused(tmp_path, capsys):
    """Under data-dependent accounting the figure to publish is epsilon_data_independent, and
    evaluate copies it into evaluation.json and report.md. Only epsilon and delta were checked
    against the checkpoint: a smaller bound, or the accounting said to be data-independent
    (which drops report.md's warning that epsilon is not private), was reported as the run's."""
    import json

    run = tmp_path / "run"
    train_table_run(run, "adult", "adult_tiny", "--epsilon", "8", "--delta", "1e-3", "--privacy.num_teachers", "3",
                    "--privacy.teacher_batch_size", "8", "--privacy.lap_inverse_scale", "0.05", model="pategan")
    privacy = read_json(run / "privacy.json")
    assert privacy["accounting"] == "data-dependent" and privacy["epsilon_data_independent"] > 0
    assert main(["evaluate", "--run", str(run)]) == 0
    before = (run / "evaluation.json").read_bytes()
    for edit, said in (({"epsilon_data_independent": privacy["epsilon_data_independent"] / 10},
                        f"epsilon_data_independent {privacy['epsilon_data_independent']:.6g} ("),
                       ({"accounting": "data-independent"}, "but the run spent epsilon"),
                       ({"epsilon_data_independent": None}, "epsilon_data_independent none, but")):
        (run / "privacy.json").write_text(json.dumps({**privacy, **edit}))
        capsys.readouterr()
        assert main(["evaluate", "--run", str(run)]) == 2
        err = capsys.readouterr().err
        assert "the report was edited since training" in err and said in err
        assert f"{next(iter(edit))} " in err.split("but the run spent")[1]  # the edited figure named on both sides
        assert (run / "evaluation.json").read_bytes() == before
    (run / "privacy.json").write_text(json.dumps(privacy))
    assert main(["evaluate", "--run", str(run)]) == 0


def test_a_privacy_report_claiming_an_epsilon_for_a_run_without_privacy_is_refused(tmp_path, capsys):
    """A non-private run's checkpoint keeps no spend: its report must state no epsilon or delta."""
    import json

    run = tmp_path / "run"
    train_table_run(run)
    privacy = read_json(run / "privacy.json")
    assert privacy["epsilon"] is None and privacy["delta"] is None
    (run / "privacy.json").write_text(json.dumps({**privacy, "epsilon": 1.0, "delta": 1e-5}))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 2
    assert "states epsilon 1, delta 1e-05, but the run spent epsilon none, delta none" in capsys.readouterr().err
    assert not (run / "evaluation.json").exists()


def test_a_privacy_report_edited_to_hold_text_is_refused_before_any_work(tmp_path, capsys):
    """"epsilon": "4.99" was copied into evaluation.json and only failed at report.md, after
    evaluation.json and report/ were replaced: the earlier evaluation was left half-replaced."""
    import json

    run = tmp_path / "run"
    train_table_run(run)
    assert main(["evaluate", "--run", str(run)]) == 0
    before = (run / "evaluation.json").read_bytes()
    privacy = read_json(run / "privacy.json")
    (run / "privacy.json").write_text(json.dumps({**privacy, "target_epsilon": "1"}))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 2
    assert f"{run / 'privacy.json'} is damaged (target_epsilon is '1', not a number)" in capsys.readouterr().err
    assert (run / "evaluation.json").read_bytes() == before


def test_a_report_that_cannot_be_made_leaves_the_earlier_evaluation_whole(tmp_path, monkeypatch, capsys):
    """report.md's text is made before evaluation.json is written: a failure there (a value it
    cannot format) used to leave a new evaluation.json and report/ beside the old report.md."""
    from lightning_dpgan.evaluation import report

    run = tmp_path / "run"
    train_table_run(run)
    assert main(["evaluate", "--run", str(run)]) == 0
    names = ["evaluation.json", "report.md", *(f"report/{p.name}" for p in (run / "report").iterdir())]
    before = {name: (run / name).read_bytes() for name in names}

    def cannot_format(*args, **kwargs):
        raise ValueError("Unknown format code 'g' for object of type 'str'")

    monkeypatch.setattr(report, "render_report", cannot_format)
    assert main(["evaluate", "--run", str(run), "--seed", "7"]) == 2
    assert "Unknown format code" in capsys.readouterr().err
    assert {name: (run / name).read_bytes() for name in names} == before


def test_a_second_evaluate_of_a_folder_is_refused_while_one_runs(tmp_path, capsys):
    """Two at once shared the staging folder, each clearing it: both said "wrote", and report.md
    linked figures that report/ did not hold. The first holds an OS lock on the folder."""
    import fcntl

    from lightning_dpgan.evaluate import EVALUATION_LOCK

    run = tmp_path / "run"
    train_table_run(run)
    with open(run / EVALUATION_LOCK, "a") as running:  # as the first evaluate holds it
        fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
        capsys.readouterr()
        assert main(["evaluate", "--run", str(run)]) == 2
        assert f"another evaluate of {run} is running" in capsys.readouterr().err
        assert not (run / "evaluation.json").exists()
    assert main(["evaluate", "--run", str(run)]) == 0  # released when it ends
    (tmp_path / "not-a-run").mkdir()
    assert main(["evaluate", "--run", str(tmp_path / "not-a-run")]) == 2
    assert not list((tmp_path / "not-a-run").iterdir())  # refused by name, no lock file left


def test_a_run_without_its_checkpoint_is_evaluated_with_a_warning_that_nothing_was_checked(tmp_path, capsys):
    """The checkpoint keeps the schema, split and digest of the training rows that evaluate
    checks; a run whose checkpoint was deleted (they are large) was scored on whatever config.yaml
    names now, in silence."""
    run = tmp_path / "run"
    train_table_run(run)
    (run / "checkpoints" / "last.ckpt").unlink()
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"{run} has no checkpoints/last.ckpt" in err and "not checked against those the run trained on" in err
    assert "privacy.json's epsilon and delta, copied into the evaluation, are not checked against what the run spent" in err


def test_a_synthetic_table_other_than_the_one_train_wrote_is_scored_with_a_warning(tmp_path, capsys):
    """privacy.json names the synthetic.csv it was written for by its SHA-256: a table copied in
    from another run was scored beside this run's epsilon without a word."""
    import hashlib

    run = tmp_path / "run"
    train_table_run(run)
    table = run / "synthetic.csv"
    assert read_json(run / "privacy.json")["synthetic_sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "is not the table privacy.json was written for" not in capsys.readouterr().err
    lines = table.read_text().splitlines(keepends=True)
    table.write_text("".join(lines[:-1]))  # one row fewer: still a valid table
    assert main(["evaluate", "--run", str(run)]) == 0
    warning = f"{table} is not the table privacy.json was written for (its SHA-256 differs from privacy.json's"
    assert warning in capsys.readouterr().err
    assert "is not the table privacy.json was written for" in (run / "report.md").read_text()
    evaluation = read_json(run / "evaluation.json")
    assert evaluation["synthetic_records"] == len(lines) - 2
    assert evaluation["privacy_note"].startswith("synthetic.csv is not the table privacy.json was written for")
    # drawn again from the run's checkpoint (evaluate's own remedy for a damaged table): the same
    # guarantee, and sample keeps privacy.json's digest in step, so nothing is warned of
    assert main(["sample", "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "-n", "30", "--out", str(table),
                 "--overwrite"]) == 0
    assert read_json(run / "privacy.json")["synthetic_sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert "privacy.json's synthetic_sha256 now names the table drawn" in capsys.readouterr().err
    report = (run / "privacy.json").read_bytes()
    assert main(["sample", "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "-n", "30", "--out",
                 str(tmp_path / "elsewhere.csv")]) == 0
    assert (run / "privacy.json").read_bytes() == report  # a table outside the run folder names nothing there
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "is not the table privacy.json was written for" not in capsys.readouterr().err
    assert not read_json(run / "evaluation.json")["privacy_note"].startswith("synthetic.csv is not")


def test_split_settings_edited_since_training_are_named_not_blamed_on_the_data(tmp_path, capsys):
    """config.yaml's test_fraction edited: evaluate said "the data changed after training" (the
    rows' digest differed); the checkpoint keeps the split, which is compared first."""
    import yaml

    run = tmp_path / "run"
    train_table_run(run, "king", "king_tiny")  # no official test split: test_fraction draws it
    config = yaml.safe_load((run / "config.yaml").read_text())
    trained_with = config["data"].get("test_fraction")
    config["data"]["test_fraction"] = 0.5
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "trained on other records: it had --data.test_fraction" in err and "(this run: 0.5)" in err
    assert "put back the split settings the run trained with" in err and trained_with != 0.5
    assert not (run / "evaluation.json").exists()


def test_a_dev_fraction_edited_out_of_the_config_is_named_for_a_dev_split(tmp_path, capsys):
    """--split dev of a run whose config.yaml lost its dev_fraction said "train it with
    --data.dev_fraction F", though the checkpoint says it held one out: the edit is named first."""
    import yaml

    run = tmp_path / "run"
    train_table_run(run, "adult", "adult_tiny", "--data.dev_fraction", "0.2")
    config = yaml.safe_load((run / "config.yaml").read_text())
    del config["data"]["dev_fraction"]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--split", "dev"]) == 2
    err = capsys.readouterr().err
    assert "it had --data.dev_fraction 0.2" in err and "put back the split settings the run trained with" in err
    assert "train it with --data.dev_fraction" not in err and not (run / "evaluation-dev.json").exists()


def test_a_test_fraction_edited_for_adults_official_split_is_not_refused(tmp_path, capsys):
    """Adult's official split ignores test_fraction, so editing it in config.yaml chooses no other
    records: refusing it (as for King above, where it draws the split) sent the user to undo a
    setting that changed nothing. Its held-out rows are still adult.test's."""
    import yaml

    run = tmp_path / "run"
    train_table_run(run)
    assert read_run_info(run / "checkpoints" / "last.ckpt")["split"] == {"dev_fraction": 0.0}
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["test_fraction"] = 0.5
    config["data"]["split_seed"] = 7  # draws no dev rows without a dev_fraction: chooses nothing either
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["evaluate", "--run", str(run)]) == 0
    lines = [line for line in (FIXTURES / "adult_tiny" / "adult.test").read_text().splitlines()[1:]  # a note first
             if "?" not in line]  # rows with a missing value are dropped
    held_out = read_json(run / "evaluation.json")
    assert (held_out["utility/held_out_rows_>50K"], held_out["utility/held_out_rows_<=50K"]) == (
        sum(line.endswith(">50K.") for line in lines), sum(line.endswith("<=50K.") for line in lines))


def test_a_missing_path_or_a_file_given_as_the_run_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    train_table_run(run)
    capsys.readouterr()
    assert main(["evaluate", "--run", str(tmp_path / "elsewhere")]) == 2
    assert f"{tmp_path / 'elsewhere'} does not exist: give the output folder" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(run / "checkpoints" / "last.ckpt")]) == 2
    assert f"is a file: give the output folder of the train run ({run}, it seems)" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(run / "checkpoints")]) == 2  # a folder inside the run's
    assert f"has no config.yaml: is it the output folder of a train run ({run}, it seems)?" in capsys.readouterr().err


def test_an_emptied_step_log_costs_the_report_its_epsilon_figure_not_the_evaluation(tmp_path, capsys):
    """logs/metrics.csv emptied: evaluate failed after every measure with "No columns to parse
    from file", naming no file."""
    run = tmp_path / "run"
    train_table_run(run, "adult", "adult_tiny", "--epsilon", "8", "--delta", "1e-3", model="dpgan")
    (run / "logs" / "metrics.csv").write_text("")
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    assert f"{run / 'logs' / 'metrics.csv'} cannot be read" in capsys.readouterr().err
    assert "Privacy spent over training" not in (run / "report.md").read_text()


def test_a_csv_run_whose_categories_look_like_numbers_is_evaluated(tmp_path):
    """Categories 1/2/3 and a 0/1 label: the csv datamodule reads them as text, and plain
    read_csv read the synthetic table's as numbers, so evaluate failed on a dtype mismatch."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    pd.DataFrame({"amount": rng.gamma(2.0, 50.0, 300).round(2), "kind": rng.choice([1, 2, 3], 300),
                  "label": rng.choice([0, 1], 300)}).to_csv(tmp_path / "t.csv", index=False)
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "csv", "--data.csv", str(tmp_path / "t.csv"),
                 "--data.target", "label", "--data.categorical", "kind,label", "--data.label_kind", "binary",
                 "--data.bounds_epsilon", "3", "--data.bounds_delta", "1e-6", "--output-dir", str(run), "--max-steps", "2",
                 "--batch-size", "8", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    assert main(["evaluate", "--run", str(run)]) == 0
    evaluation = read_json(run / "evaluation.json")
    assert 0.0 <= evaluation["utility/B_auroc"] <= 1.0 and evaluation["fidelity/jsd_mean"] is not None


def test_the_report_of_a_private_run_draws_epsilon_over_steps(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--output-dir", str(run), "--max-steps", "4", "--epsilon", "8", "--delta", "1e-3",
                 "--privacy.num_teachers", "3", "--privacy.teacher_batch_size", "8", "--privacy.lap_inverse_scale", "0.05",
                 "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false", "--evaluate"]) == 0
    report = (run / "report.md").read_text()
    assert "](report/epsilon.png)" in report and (run / "report/epsilon.png").is_file()
    privacy = read_json(run / "privacy.json")
    assert f"epsilon: {privacy['epsilon']:.4g} (target 8)" in report
    assert privacy["accounting"] == "data-dependent" and "not itself differentially private" in report
    evaluation = read_json(run / "evaluation.json")  # the formal guarantee beside the attack's AUC
    assert evaluation["epsilon"] == privacy["epsilon"] > 0 and evaluation["delta"] == privacy["delta"] == 1e-3
    assert "privacy_risk/mia_auc" in evaluation
    # the epsilon copied beside the measures is the synthetic data's: the file says its own figures are not covered
    assert "not covered by epsilon" in evaluation["privacy_note"] and "privacy_note" not in report


def test_a_private_run_logged_to_tensorboard_says_why_its_report_has_no_epsilon_figure(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(FIXTURES / "adult_tiny"),
                 "--output-dir", str(run), "--max-steps", "2", "--epsilon", "8", "--delta", "1e-3", "--logger", "tensorboard",
                 "--privacy.num_teachers", "3", "--privacy.teacher_batch_size", "8", "--privacy.lap_inverse_scale", "0.05",
                 "--trainer.enable_progress_bar", "false", "--evaluate"]) == 0
    assert not (run / "report" / "epsilon.png").exists()
    assert "no epsilon-over-steps figure" in capsys.readouterr().err


def test_a_synthetic_label_left_with_one_class_is_counted_and_named_in_a_warning(tmp_path, capsys):
    """DPGAN at epsilon 0.1 and PATE-GAN's collapsed runs release tables whose label holds one
    class: setting B's 0.500 then says nothing of the model's skill, and the evaluation says so."""
    import pandas as pd

    from lightning_dpgan.evaluation import CLASSIFIERS

    run = tmp_path / "run"
    train_table_run(run)
    synthetic = pd.read_csv(run / "synthetic.csv")
    synthetic["income"] = ["<=50K", ">50K"] * (len(synthetic) // 2) + ["<=50K"] * (len(synthetic) % 2)
    synthetic.to_csv(run / "synthetic.csv", index=False)
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    both = read_json(run / "evaluation.json")
    assert both["utility/synthetic_label_classes"] == 2
    assert "synthetic label" not in capsys.readouterr().err
    assert "synthetic label" not in (run / "report.md").read_text()

    synthetic.assign(income="<=50K").to_csv(run / "synthetic.csv", index=False)
    assert main(["evaluate", "--run", str(run)]) == 0
    one = read_json(run / "evaluation.json")
    assert one["utility/synthetic_label_classes"] == 1
    assert len(CLASSIFIERS) == 12 and one["utility/B_auroc"] == 0.5
    assert all(one[f"utility/B_auroc/{name}"] == 0.5 for name in CLASSIFIERS)
    err = capsys.readouterr().err
    assert "the synthetic label 'income' holds 1 of its 2 classes" in err and "is degenerate" in err
    report = (run / "report.md").read_text()
    assert "| `utility/synthetic_label_classes` | 1 |" in report
    # where the 0.5 is read: the warning is in the report too, before the figures it explains
    warnings = report.split("## Warnings\n\n")[1].split("## Measured")[0]
    assert "- the synthetic label 'income' holds 1 of its 2 classes" in warnings
    assert main(["evaluate", "--run", str(run)]) == 0  # a second evaluation's report has its own warnings alone
    assert (run / "report.md").read_text().count("holds 1 of its 2 classes") == 1


def test_a_collapsed_table_of_one_repeated_row_is_scored_not_a_crash(tmp_path, capsys):
    """A collapsed generator repeats one row (both label classes): Gaussian NB's probabilities
    are NaN and LDA refuses it. The evaluation scores them as a constant (AUROC 0.5) and names
    them, where it used to end with "Input contains NaN" and no evaluation.json."""
    import pandas as pd

    run = tmp_path / "run"
    train_table_run(run)
    synthetic = pd.read_csv(run / "synthetic.csv")
    collapsed = pd.concat([synthetic.iloc[:1]] * 40, ignore_index=True).assign(income=["<=50K", ">50K"] * 20)
    collapsed.to_csv(run / "synthetic.csv", index=False)
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    scores = read_json(run / "evaluation.json")
    assert scores["utility/B_auroc/gaussian_nb"] == 0.5 and scores["utility/B_auroc/lda"] == 0.5
    assert scores["utility/positive_class"] == ">50K"  # the schema's second class: what AUPRC and F1 score
    warning = [line for line in capsys.readouterr().err.splitlines() if "setting B:" in line]
    assert len(warning) == 1 and "gaussian_nb gave non-finite probabilities" in warning[0]
    assert "lda could not be fitted" in warning[0] and "scored as a constant prediction" in warning[0]


def test_a_held_out_split_without_a_rare_class_says_why_its_aurocs_are_undefined(tmp_path, capsys):
    """A small credit file's test split can hold no fraud (the split is not stratified): every
    AUROC of settings A and B was n/a, beside an accuracy near 1, without a word."""
    import pandas as pd

    from lightning_dpgan.datamodules.kaggle_credit import KaggleCreditDataModule

    source = FIXTURES / "credit_tiny" / "creditcard.csv"
    probe = KaggleCreditDataModule(data_dir=source.parent)
    probe.setup()
    test_rows = list(probe.held_out("test").index)
    frame = pd.read_csv(source)
    frame.loc[test_rows, "Class"] = 0
    data = tmp_path / "credit"
    data.mkdir()
    frame.to_csv(data / "creditcard.csv", index=False)
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "kaggle-credit", "--data-dir", str(data), "--output-dir",
                 str(run), "--max-steps", "2", "--batch-size", "8", "--trainer.enable_progress_bar", "false"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0
    scores = read_json(run / "evaluation.json")
    assert scores["utility/held_out_rows_0"] == len(test_rows) and scores["utility/held_out_rows_1"] == 0
    assert scores["utility/A_auroc"] is None and scores["utility/B_auroc"] is None
    err = capsys.readouterr().err
    assert f"the {len(test_rows)} held-out rows hold no row of class '1' of the label 'Class'" in err
    assert "AUROC and AUPRC of settings A and B are undefined" in err
    assert "held_out_rows" not in (run / "report.md").read_text().split("Per model")[-1]  # not a classifier's measure
    frame.loc[test_rows[0], "Class"] = 1  # one fraud held out: an AUROC resting on one row
    frame.to_csv(data / "creditcard.csv", index=False)
    assert main(["evaluate", "--run", str(run)]) == 0
    assert read_json(run / "evaluation.json")["utility/held_out_rows_1"] == 1
    assert f"the {len(test_rows)} held-out rows hold only 1 of class '1'" in capsys.readouterr().err


def test_the_reports_per_column_table_keeps_a_column_whose_name_holds_a_slash(tmp_path):
    """``fidelity/wasserstein/speed km/h`` split at every slash had four parts and was dropped
    from report.md's per-column table."""
    from lightning_dpgan.evaluation.report import write_report

    evaluation = {"fidelity/wasserstein/speed km/h": 0.25, "fidelity/wasserstein/age": 0.5,
                  "fidelity/jsd/speed km/h": 0.125}
    report = write_report(tmp_path, evaluation, None, {}).read_text()
    per_column = report.split("## Per column")[1]
    assert "| speed km/h | 0.25 | 0.125 |" in per_column and "| age | 0.5 | n/a |" in per_column


def test_the_report_says_how_its_epsilon_was_spent_and_that_it_is_not_for_publishing(tmp_path, monkeypatch):
    """report.md showed the total epsilon alone: not that 2.1 of 2.975 went to a DP schema
    estimate, nor the neighbouring relation, nor that the report itself reads the real rows
    without noise (the README said so; the file a holder might forward did not)."""
    from lightning_dpgan.evaluation.report import write_report

    privacy = {"mechanism": "dp-sgd", "epsilon": 2.975, "delta": 1e-5, "neighbours": "add-remove",
               "epsilon_training": 0.875, "preprocessing": {"epsilon": 2.1, "delta": 1e-6, "parts": {
                   "schema": {"epsilon": 2.0}, "modes": {"epsilon": 0.1}}}}
    report = write_report(tmp_path, {}, privacy, {}).read_text()
    banner = report.split("## Privacy")[0]
    assert "not covered by any privacy guarantee" in banner and "Publish the synthetic data and `privacy.json`" in banner
    assert "- delta: 1e-05 (add-remove neighbours)" in report
    assert "- of which training: epsilon 0.875; preprocessing: epsilon 2.1 (schema 2; modes 0.1, as each was spent)" in report
    # PATE's default figure is computed from the votes (docs/privacy.md): privacy.json is not for publishing either
    voted = write_report(tmp_path, {}, {**privacy, "accounting": "data-dependent"}, {}).read_text()
    assert "is not itself private either" in voted and "Publish the synthetic data and `privacy.json`" not in voted
    assert "their number was decided on the votes too" in voted
    # a fixed noise seed: nothing of the run is for publishing
    seeded = write_report(tmp_path, {}, {**privacy, "noise_source": "FIXED SEED 1 (--privacy.noise_seed, for tests "
                                         "only: anyone with the seed can replay the noise)"}, {}).read_text()
    assert "The run is not private: its secret draws came from a fixed seed" in seeded.split("## Privacy")[0]
    assert "Publish the synthetic data and `privacy.json`" not in seeded
    # Lightning's fast_dev_run: a check of the code, not a run to publish
    debugging = write_report(tmp_path, {}, {**privacy, "stopped_by": "fast-dev-run"}, {}).read_text()
    assert "The run was Lightning's fast_dev_run, a check of the code" in debugging
    assert "Publish the synthetic data and `privacy.json`" not in debugging
    resumed = {**privacy, "segments": [{"from_step": 0, "noise_source": "own generator seeded from OS entropy"},
                                       {"from_step": 4, "selection_source": "FIXED SEED 2 (--privacy.selection_seed)"}]}
    assert "from step 4: FIXED SEED 2" in write_report(tmp_path, {}, resumed, {}).read_text()
    none = write_report(tmp_path, {}, {"mechanism": "none", "epsilon": None, "delta": None}, {}).read_text()
    assert "states no privacy guarantee" in none and "- delta: none\n" in none
    monkeypatch.chdir(tmp_path)  # evaluate --run . titled its report "# Run report: "
    assert f"# Run report: {tmp_path.name}\n" in write_report(Path("."), {}, None, {}).read_text()
    edited = {**privacy, "epsilon_training": None}  # a hand edit the figures' check lets through: shown, not a crash
    assert "training: epsilon n/a" in write_report(tmp_path, {}, edited, {}).read_text()
    # PATE's replace-one neighbours: preprocessing spent under add/remove counts twice, said as such, its parts
    # restated too (they add up to the total), whether the total or only the parts record what was spent
    parts = {name: {**part, "epsilon": 2 * part["epsilon"], "as_spent": {"epsilon": part["epsilon"]}}
             for name, part in privacy["preprocessing"]["parts"].items()}
    restated = {**privacy, "neighbours": "replace-one", "preprocessing": {
        "epsilon": 4.2, "delta": 1e-6, "neighbours": "replace-one", "parts": parts,
        "as_spent": {"epsilon": 2.1, "delta": 1e-6, "neighbours": "add-remove"}}}
    assert ("preprocessing: epsilon 4.2 (schema 4; modes 0.2; restated for replace-one neighbours from epsilon 2.1 "
            "spent for add-remove neighbours)") in write_report(tmp_path, {}, restated, {}).read_text()
    composed = {**restated, "preprocessing": {key: value for key, value in restated["preprocessing"].items()
                                              if key != "as_spent"}}  # a composition of releases: parts restated
    assert ("preprocessing: epsilon 4.2 (schema 4; modes 0.2; restated for replace-one neighbours from what each "
            "spent for add/remove neighbours)") in write_report(tmp_path, {}, composed, {}).read_text()
    unspent = write_report(tmp_path, {}, {**privacy, "preprocessing": {"epsilon": 0.0, "delta": 0.0}}, {}).read_text()
    assert "of which training" not in unspent  # nothing spent before training: the total is training's


def test_the_report_states_both_pate_epsilons_its_target_and_its_warnings_before_the_measures(tmp_path):
    """A PATE run's report gives its epsilon to four figures with the target, both the
    data-dependent and the data-independent figure (and, under data-dependent accounting, that
    the first is not private), the evaluation's warnings before the measured table, and no
    privacy figure or note inside that table."""
    from lightning_dpgan.evaluation.report import render_report

    privacy = {"mechanism": "pate", "epsilon": 2.975, "delta": 1e-5, "target_epsilon": 3.0, "steps": 7,
               "accounting": "data-dependent", "epsilon_data_dependent": 2.975, "epsilon_data_independent": 8.125}
    evaluation = {"epsilon": 2.975, "delta": 1e-5, "privacy_note": "not covered by epsilon", "utility/cnn_accuracy": 0.5}
    text = render_report(tmp_path, evaluation, privacy, {}, ["the synthetic label holds 1 of its 2 classes"])
    before, measured = text.split("## Measured")
    assert "- epsilon: 2.975 (target 3)\n" in before
    assert "- epsilon data dependent: 2.975\n" in before and "- epsilon data independent: 8.125\n" in before
    assert "the epsilon above is the data-dependent figure" in before
    assert "how many queries it asked was decided on the votes too" in before  # the bound is of the queries asked
    assert "## Warnings\n\n- the synthetic label holds 1 of its 2 classes\n" in before
    assert "`utility/cnn_accuracy`" in measured
    assert "privacy_note" not in measured and "`epsilon`" not in measured and "`delta`" not in measured
    independent = render_report(tmp_path, {}, {**privacy, "accounting": "data-independent", "target_epsilon": None}, {})
    assert "the epsilon above is the data-dependent figure" not in independent and "- epsilon: 2.975\n" in independent
    assert "## Warnings" not in independent


def test_publishing_an_evaluations_figures_replaces_the_earlier_ones_whole(tmp_path):
    from lightning_dpgan.evaluate import STAGED_FIGURES, _publish_figures
    from lightning_dpgan.evaluation.report import FIGURES

    (tmp_path / FIGURES).mkdir()
    (tmp_path / FIGURES / "old.png").write_bytes(b"old")
    (tmp_path / STAGED_FIGURES).mkdir()
    (tmp_path / STAGED_FIGURES / "epsilon.png").write_bytes(b"new")
    _publish_figures(tmp_path)
    assert sorted(p.name for p in (tmp_path / FIGURES).iterdir()) == ["epsilon.png"]
    assert not (tmp_path / STAGED_FIGURES).exists()
    _publish_figures(tmp_path)  # an evaluation that drew no figure leaves none of the earlier one's
    assert not (tmp_path / FIGURES).exists()


def test_the_reports_figures_show_setting_b_shares_and_feature_correlations():
    """The AUROC bars are A (train real) and B (train synthetic), both tested on real rows; the
    marginals are shares, comparable between tables of different sizes; the heatmaps are the
    features' correlations, not the rows'."""
    import numpy as np
    import pandas as pd

    from lightning_dpgan.data.schema import Column, TableSchema
    from lightning_dpgan.evaluation.report import auroc_figure, correlation_figure, marginals_figure

    scores = {setting: {"lr": {"auroc": a}, "dt": {"auroc": b}}
              for setting, a, b in (("A", 0.9, 0.8), ("B", 0.7, 0.6), ("C", 0.3, 0.2))}
    bars = auroc_figure(scores).axes[0].containers
    assert [[round(patch.get_height(), 6) for patch in bar] for bar in bars] == [[0.9, 0.8], [0.7, 0.6]]
    schema = TableSchema(columns=(Column("kind", "categorical", categories=("a", "b"), source="test"),), label=None)
    real, synthetic = pd.DataFrame({"kind": ["a"] * 3 + ["b"]}), pd.DataFrame({"kind": ["a"] * 2 + ["b"] * 6})
    shares = [[patch.get_height() for patch in bar] for bar in marginals_figure(real, synthetic, schema).axes[0].containers]
    assert shares == [[0.75, 0.25], [0.25, 0.75]]
    # a DP estimate's bounds may hold none of a tiny table's values: they count in the outermost bin,
    # where training clipped them (a histogram of nothing inside had divided by zero)
    amounts = TableSchema(columns=(Column("amount", "continuous", bounds=(-8.0, -4.0), source="test"),), label=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        figure = marginals_figure(pd.DataFrame({"amount": [5.0, 7.0]}), pd.DataFrame({"amount": [-6.0, 9.0]}), amounts)
    real_bins, synthetic_bins = ([patch.get_height() * patch.get_width() for patch in bar] for bar in figure.axes[0].containers)
    assert np.isclose(real_bins[-1], 1.0) and np.isclose(sum(synthetic_bins), 1.0) and np.isclose(synthetic_bins[-1], 0.5)
    features = np.random.default_rng(0).random((20, 3))
    heatmap = correlation_figure(features, features).axes[0].images[0].get_array()
    assert np.allclose(heatmap, np.corrcoef(features, rowvar=False))


@pytest.mark.parametrize("dataset,fixture", [("adult", "adult_tiny"), ("king", "king_tiny")])
def test_a_dev_evaluation_of_a_table_never_reads_the_test_split(tmp_path, monkeypatch, dataset, fixture):
    """Settings are chosen on the dev score: any measure that read the test rows there (the
    classifiers or regressors, the held-out class counts, the membership attack's non-members)
    would leak the test split into the choice. The test split is taken away from the datamodule:
    the dev evaluation completes without it, and the attack's non-members are the dev rows."""
    from lightning_dpgan import evaluate
    from lightning_dpgan.evaluation import membership

    run = tmp_path / "run"
    train_table_run(run, dataset, fixture, "--data.dev_fraction", "0.3")
    loaded, load = [], evaluate.load_run_datamodule

    def without_the_test_split(*args, **kwargs):
        datamodule = load(*args, **kwargs)
        datamodule.test_frame = None
        loaded.append(datamodule)
        return datamodule

    attacked, attack = [], membership.membership_inference
    monkeypatch.setattr(evaluate, "load_run_datamodule", without_the_test_split)
    monkeypatch.setattr(membership, "membership_inference",
                        lambda *args, **kwargs: attacked.append(args) or attack(*args, **kwargs))
    assert main(["evaluate", "--run", str(run), "--split", "dev"]) == 0
    (datamodule,), ((_, members, non_members),) = loaded, attacked
    dev, _ = datamodule.schema.encode(datamodule.held_out("dev"), unknown="blank")
    train, _ = datamodule.schema.encode(datamodule.train_frame, unknown="blank")
    assert torch.equal(non_members, dev) and torch.equal(members, train)
    assert read_json(run / "evaluation-dev.json")["held_out_split"] == "dev"


def test_figures_left_staged_by_a_killed_evaluation_are_not_published_with_the_next(tmp_path):
    """An evaluation killed outright (kill -9, the out-of-memory killer) leaves its staged figures;
    the next one must not publish them in report/ beside its own as if they were this run's."""
    run = tmp_path / "run"
    train_table_run(run)
    staged = run / ".report-staged"
    staged.mkdir()
    (staged / "auroc.png").write_bytes(b"a killed evaluation's figure")
    (staged / "stale.png").write_bytes(b"a killed evaluation's figure")
    assert main(["evaluate", "--run", str(run)]) == 0
    figures = sorted(path.name for path in (run / "report").iterdir())
    assert "stale.png" not in figures and (run / "report" / "auroc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not staged.exists()


def test_a_csv_run_neither_reads_nor_records_a_data_folder(tmp_path, monkeypatch, caplog):
    """A csv run reads the file --data.csv names, never a data folder: one named by
    $LIGHTNING_DPGAN_DATA_DIR is not recorded in its config.yaml (nor refused when it is gone),
    one given by --data-dir is said to be unused, and evaluate does not ask for a folder that an
    earlier version recorded and that is gone since."""
    import numpy as np
    import pandas as pd
    import yaml

    from lightning_dpgan.datamodules.csv import CSVDataModule

    rng = np.random.default_rng(0)
    pd.DataFrame({"amount": rng.gamma(2.0, 50.0, 200).round(2), "label": rng.choice(["no", "yes"], 200)}).to_csv(
        tmp_path / "t.csv", index=False)
    (tmp_path / "folder").mkdir()
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(tmp_path / "folder"))
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "csv", "--data.csv", str(tmp_path / "t.csv"),
                 "--data.target", "label", "--data.label_kind", "binary", "--data.bounds_epsilon", "3", "--output-dir", str(run),
                 "--max-steps", "2", "--batch-size", "8", "--trainer.enable_progress_bar", "false",
                 "--trainer.enable_model_summary", "false"]) == 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"].get("data_dir") is None

    (tmp_path / "folder").rmdir()  # a stale variable does not stop a csv run
    settings = {"csv": str(tmp_path / "t.csv"), "target": "label", "label_kind": "binary"}
    assert CSVDataModule(**settings).data_dir is None
    with caplog.at_level("WARNING"):
        CSVDataModule(**settings, data_dir=str(tmp_path))
    assert f"--data-dir {tmp_path} is not read" in caplog.text and str(tmp_path / "t.csv") in caplog.text

    config["data"]["data_dir"] = str(tmp_path / "folder")  # as earlier versions recorded it
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR")
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "utility/B_auroc" in read_json(run / "evaluation.json")


def test_a_null_pate_epsilon_in_privacy_json_is_shown_not_a_crash_after_the_evaluation(tmp_path):
    """check_privacy_figures lets null figures through (a figure the run could not compute), so
    report.md must show them: a null epsilon_data_dependent stopped evaluate with a raw TypeError
    after every measure had been computed."""
    from lightning_dpgan.evaluation.report import render_report

    privacy = {"epsilon": 1.0, "delta": 1e-5, "epsilon_data_dependent": None, "epsilon_data_independent": 2.5}
    text = render_report(tmp_path, {}, privacy, {})
    assert "- epsilon data dependent: n/a" in text and "- epsilon data independent: 2.5" in text
