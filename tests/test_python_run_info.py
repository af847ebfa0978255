"""Checkpoints a Trainer built in Python writes: ``sample`` draws from them as from train's, and
``train --resume`` and ``evaluate``, which need train's run folder and settings, refuse them by name."""
import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pandas as pd
import pytest

from lightning_dpgan.callbacks import DPSGD, PrivacyBudgetStopping, StepLimit
from lightning_dpgan.cli import main
from lightning_dpgan.datamodules import AdultDataModule, MNISTDataModule
from lightning_dpgan.evaluate import checkpoint_of_this_run
from lightning_dpgan.modules import DPCTGAN, GAN
from lightning_dpgan.python_run_info import python_run_info
from lightning_dpgan.sampling import guarantee_note, read_run_info, sample_to_file

ADULT = Path(__file__).parent / "fixtures" / "adult_tiny"


def fit_by_hand(model, data, root, *callbacks, steps=3):
    """A plain Lightning Trainer with its own ModelCheckpoint (no train): the checkpoint it wrote."""
    trainer = L.Trainer(max_epochs=-1, logger=False, default_root_dir=root, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepLimit(steps), *callbacks])
    trainer.fit(model, datamodule=data)
    (checkpoint,) = Path(root, "checkpoints").glob("*.ckpt")
    return checkpoint


@pytest.fixture(scope="module")
def dpctgan_by_hand(tmp_path_factory):
    root = tmp_path_factory.mktemp("by_hand")
    data = AdultDataModule(data_dir=ADULT, batch_size=8, encoding="mode-specific")
    data.prepare_data()
    data.setup("fit")  # the DP mode histogram, a release of its own
    model = DPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout)
    strategy = DPSGD(target_epsilon=8.0, delta=1e-3)
    checkpoint = fit_by_hand(model, data, root, strategy, PrivacyBudgetStopping(8.0))
    return checkpoint, data, strategy


def test_a_table_models_checkpoint_holds_what_sample_decodes_with(dpctgan_by_hand):
    checkpoint, data, strategy = dpctgan_by_hand
    info = read_run_info(checkpoint)
    assert (info["model"], info["dataset"], info["privacy"], info["trained_by"]) == ("dpctgan", "adult", "dp-sgd", "python")
    assert info["schema"] == data.schema.to_dict()
    assert info["table_transformer"] == data.table_transformer.to_dict()  # the DP modes its rows decode with
    assert info["preprocessing_cost"] == data.privacy_cost() and data.privacy_cost()["epsilon"] > 0


def test_sample_draws_decoded_rows_from_it_and_states_the_strategys_spend(dpctgan_by_hand, tmp_path):
    checkpoint, data, strategy = dpctgan_by_hand
    out = sample_to_file(checkpoint, 25, tmp_path / "synthetic.csv")
    rows = pd.read_csv(out)
    assert list(rows.columns) == list(data.train_frame.columns) and len(rows) == 25
    assert set(rows["income"]) <= set(data.schema.column("income").categories)
    note = guarantee_note(checkpoint)
    assert f"epsilon {strategy.epsilon():.6g} and delta {strategy.training_delta:g}" in note
    assert "privacy_report() of the strategy that trained it" in note


def test_train_resume_and_evaluate_refuse_it_by_name(dpctgan_by_hand, tmp_path, capsys):
    checkpoint, _, _ = dpctgan_by_hand
    code = main(["train", "--model", "dpctgan", "--dataset", "adult", "--data-dir", str(ADULT), "--resume",
                 str(checkpoint), "--output-dir", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert "written by a Trainer built in Python, not by train: --resume needs" in err
    assert "note" not in err  # not first told that the resume keeps the checkpoint's target
    assert not (tmp_path / "run" / "privacy.json").exists()
    run = tmp_path / "copied"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(checkpoint.read_bytes())
    with pytest.raises(ValueError, match=r"written by a Trainer built in Python, not by train: evaluate needs .* "
                                         r"Instead, evaluate from Python: lightning_dpgan.evaluate.evaluate_table"):
        checkpoint_of_this_run(run, {"model": {"name": "dpctgan"}, "data": {"name": "adult"}})


def test_an_image_model_without_privacy_samples_and_says_it_carries_no_guarantee(tiny_image_data_dir, tmp_path):
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=16, verify_checksums=False)
    model = GAN(data.data_shape, data.num_classes, latent_dim=8)
    checkpoint = fit_by_hand(model, data, tmp_path / "gan", steps=2)
    assert read_run_info(checkpoint)["privacy"] == "none"
    out = sample_to_file(checkpoint, 20, tmp_path / "samples.npz")
    arrays = np.load(out)
    assert arrays["images"].shape == (20, 1, 28, 28) and sorted(set(arrays["labels"])) == list(range(10))
    assert guarantee_note(checkpoint).startswith("trained without privacy")


def test_nothing_is_recorded_where_sample_could_not_rebuild_or_decode(tmp_path):
    """A subclass of a model (train names its parent, whose class sample would rebuild), and
    QUAIL's synthesizer alone (its rows need the label model, which the module does not know):
    sample then refuses the checkpoint as having no run information."""
    class MyDPCTGAN(DPCTGAN):
        pass

    data = AdultDataModule(data_dir=ADULT, batch_size=8, encoding="mode-specific")
    data.setup("fit")
    own = MyDPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout)
    assert python_run_info(own, data, None) == {}
    assert python_run_info(DPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout), data, None)
    own_table = SimpleNamespace(kind="table", hparams={})  # a table datamodule of one's own: no schema
    assert python_run_info(DPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout), own_table,
                           None) == {}
    data.kind = "video"  # a datamodule of a kind sample has no writer or decoder for
    assert python_run_info(DPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout), data, None) == {}
    unlabelled = AdultDataModule(data_dir=ADULT, batch_size=8, exclude_label=True)
    unlabelled.setup("fit")
    assert python_run_info(GAN(unlabelled.data_shape, None, arch="mlp", latent_dim=4), unlabelled, None) == {}
    model = GAN(unlabelled.data_shape, None, arch="mlp", latent_dim=4)
    checkpoint = fit_by_hand(model, unlabelled, tmp_path / "quail_synthesizer", steps=1)
    with pytest.raises(ValueError, match="no run information in it; a Trainer built in Python records it for the "
                                         "models train names, on an image or table datamodule, but not for QUAIL's"):
        sample_to_file(checkpoint, 5, tmp_path / "rows.csv")


def test_sample_refuses_to_write_over_the_csv_and_schema_it_trained_on(tmp_path):
    """The files a CSV datamodule read are recorded, as train records them: even with --overwrite,
    a slip of --out must not replace the private records by synthetic ones."""
    import yaml

    from lightning_dpgan.datamodules import CSVDataModule

    rng = np.random.default_rng(0)
    csv = tmp_path / "private.csv"
    pd.DataFrame({"amount": rng.gamma(2.0, 50.0, 40).round(2), "kind": rng.choice(["a", "b"], 40),
                  "label": rng.choice(["no", "yes"], 40)}).to_csv(csv, index=False)
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump({"label": "label", "label_kind": "binary", "columns": [
        {"name": "amount", "kind": "continuous", "bounds": [0, 500]},
        {"name": "kind", "kind": "categorical", "categories": ["a", "b"]},
        {"name": "label", "kind": "categorical", "categories": ["no", "yes"]}]}))
    data = CSVDataModule(csv=csv, schema=schema, batch_size=8)
    data.setup("fit")
    model = GAN(data.data_shape, None, arch="mlp", latent_dim=4)
    checkpoint = fit_by_hand(model, data, tmp_path / "run", steps=1)
    assert read_run_info(checkpoint)["data_files"] == [str(csv.resolve()), str(schema.resolve())]
    before = csv.read_bytes()
    with pytest.raises(ValueError, match="is a file the run trained on"):
        sample_to_file(checkpoint, 5, csv, overwrite=True)
    assert csv.read_bytes() == before
    rows = pd.read_csv(sample_to_file(checkpoint, 5, tmp_path / "synthetic.csv"))
    assert list(rows.columns) == ["amount", "kind", "label"]


def test_each_fit_records_the_privacy_it_trained_under(tiny_image_data_dir, tmp_path):
    """The run information is taken again at every fit of a module object: one that DP-SGD
    trained and that a second Trainer without a strategy then trained on is said to carry no
    guarantee (its first record kept saying dp-sgd, and sample pointed at a privacy.json)."""
    from lightning_dpgan.modules import DPGAN

    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=16, verify_checksums=False)
    model = DPGAN(data.data_shape, data.num_classes, latent_dim=8)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        private = fit_by_hand(model, data, tmp_path / "private", DPSGD(noise_multiplier=1.0, delta=1e-3), steps=1)
    assert not [warning for warning in said if "WITHOUT privacy" in str(warning.message)]
    assert read_run_info(private)["privacy"] == "dp-sgd"
    assert guarantee_note(private).startswith("released under the checkpoint's privacy spend")
    # a private model whose strategy was left out: allowed from Python, and said as it starts
    with pytest.warns(UserWarning, match="DPGAN is fitted with no privacy strategy among the Trainer's callbacks: it "
                                         "trains WITHOUT privacy"):
        trained_on = fit_by_hand(model, data, tmp_path / "trained_on", steps=2)
    assert read_run_info(trained_on)["privacy"] == "none"
    assert guarantee_note(trained_on).startswith("trained without privacy")
    # the same from the private checkpoint: a fresh module resumed on a Trainer without a strategy
    resumed = DPGAN(data.data_shape, data.num_classes, latent_dim=8)
    trainer = L.Trainer(max_epochs=-1, logger=False, default_root_dir=tmp_path / "resumed", enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepLimit(3)])
    with pytest.warns(UserWarning, match="WITHOUT privacy"):
        trainer.fit(resumed, datamodule=data, ckpt_path=private)
    (checkpoint,) = (tmp_path / "resumed" / "checkpoints").glob("*.ckpt")
    assert read_run_info(checkpoint)["privacy"] == "none" and resumed.train_steps == 3
    assert guarantee_note(checkpoint).startswith("trained without privacy")


def test_a_train_run_continued_from_python_is_a_python_runs_checkpoint(tiny_image_data_dir, tmp_path, capsys):
    """train's run information describes train's run (its privacy.json, its lineage): continued
    from Python, the checkpoint written next is marked as a Python run's, so train --resume and
    evaluate refuse it and sample does not point at the old run's report."""
    from run_helpers import tiny_run_args

    from lightning_dpgan.sampling import read_checkpoint

    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=2)) == 0
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "trained_by" not in read_run_info(last) and read_run_info(last)["lineage"]
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=16, verify_checksums=False)
    module = GAN(**read_checkpoint(last)["hyper_parameters"])
    trainer = L.Trainer(max_epochs=-1, logger=False, default_root_dir=tmp_path / "python", enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepLimit(4)])
    trainer.fit(module, datamodule=data, ckpt_path=last)
    (continued,) = (tmp_path / "python" / "checkpoints").glob("*.ckpt")
    info = read_run_info(continued)
    assert info["trained_by"] == "python" and info["privacy"] == "none" and module.train_steps == 4
    code = main(tiny_run_args(tiny_image_data_dir, tmp_path / "again", steps=6) + ["--resume", str(continued)])
    assert code == 2 and "written by a Trainer built in Python" in capsys.readouterr().err


def test_a_private_train_checkpoint_loaded_and_fitted_without_its_strategy_says_it_trains_without_privacy(
        tiny_image_data_dir, tmp_path):
    """DPGAN.load_from_checkpoint(train's checkpoint) kept train's record (privacy dp-sgd) through a
    fit on a Trainer without a strategy: no warning, and the checkpoints it wrote claimed a
    guarantee their training no longer had. Its record is now the Python fit's."""
    from run_helpers import tiny_run_args

    from lightning_dpgan.modules import DPGAN

    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "run", model="dpgan", steps=2) + ["--epsilon", "5"]) == 0
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert read_run_info(last)["privacy"] == "dp-sgd"
    module = DPGAN.load_from_checkpoint(last)
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=16, verify_checksums=False)
    trainer = L.Trainer(max_epochs=-1, logger=False, default_root_dir=tmp_path / "python", enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepLimit(4)])
    with pytest.warns(UserWarning, match="DPGAN is fitted with no privacy strategy"):
        trainer.fit(module, datamodule=data)
    (written,) = (tmp_path / "python" / "checkpoints").glob("*.ckpt")
    info = read_run_info(written)
    assert (info["privacy"], info["trained_by"]) == ("none", "python")
    assert guarantee_note(written).startswith("trained without privacy")


def test_evaluate_of_a_python_runs_folder_names_the_python_route(dpctgan_by_hand):
    """The folder a plain Trainer wrote into holds no config.yaml: evaluate says so, and how such a
    model is scored."""
    from lightning_dpgan.evaluate import evaluate_run

    checkpoint, _, _ = dpctgan_by_hand
    with pytest.raises(FileNotFoundError, match=r"has no config.yaml: is it the output folder of a train run\? \(A "
                                                r"model trained from Python is scored from Python: evaluate_table"):
        evaluate_run(checkpoint.parent.parent)
