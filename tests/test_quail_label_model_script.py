"""benchmarks/quail_label_model.py: QUAIL's label model per DP-SGD setting, scored on dev rows only."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpgan.datamodules.adult import AdultDataModule
from lightning_dpgan.datamodules.king import KingDataModule
from lightning_dpgan.quail import QUAIL
from tests.test_dev_split import load_benchmark_script

FIXTURES = Path(__file__).parent / "fixtures"
script = load_benchmark_script("quail_label_model")


def test_a_setting_becomes_quails_arguments_with_their_types():
    setting = script.parse_setting("label_model=mlp,epochs=30,batch_size=1024,lr=0.05,hidden=32x16,max_grad_norm=0.5")
    assert setting == {"label_model": "mlp", "epochs": 30, "batch_size": 1024, "lr": 0.05, "hidden": [32, 16],
                       "max_grad_norm": 0.5}
    quail = QUAIL(**setting)
    assert (quail.settings.epochs, quail.settings.batch_size, quail.settings.lr) == (30, 1024, 0.05)
    assert quail.hidden == [32, 16] and script.parse_setting("") == {}
    logged = script.parse_setting("log_features=capital-gain+capital-loss,lr=0.05")
    assert QUAIL(**logged).log_features == ["capital-gain", "capital-loss"]
    assert QUAIL(**script.parse_setting("log_label=true")).log_label is True
    assert QUAIL(**script.parse_setting("log_label=false")).log_label is False
    with pytest.raises(ValueError, match="log_label=true or log_label=false"):
        script.parse_setting("log_label=yes")


@pytest.mark.parametrize("fraction", ["0", "1"])
def test_the_sweep_refuses_to_run_without_held_out_training_rows(fraction, capsys):
    with pytest.raises(SystemExit):
        script.main(["--dataset", "king", "--data-dir", str(FIXTURES / "king_tiny"), "--dev-fraction", fraction])
    assert "never on the test split" in capsys.readouterr().err


def test_the_label_model_trains_without_the_dev_rows_and_is_scored_on_exactly_them(monkeypatch, capsys):
    trained_on, scored_on = [], []
    fit = QUAIL.fit_labeler

    def spy_fit(self, datamodule, *args, **kwargs):
        trained_on.append(datamodule.labelled_records()[0].shape[0])
        return fit(self, datamodule, *args, **kwargs)

    monkeypatch.setattr(QUAIL, "fit_labeler", spy_fit)
    monkeypatch.setattr(script, "dev_score", lambda labeler, dev, schema: scored_on.append(dev) or 0.5)
    script.main(["--dataset", "king", "--data-dir", str(FIXTURES / "king_tiny"), "--dev-fraction", "0.25",
                 "--seeds", "0", "1", "--setting", "epochs=1,batch_size=8", "--setting", "epochs=2,batch_size=8"])
    expected = KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, dev_fraction=0.25)
    dev = expected.held_out("dev")
    assert len(scored_on) == 4 and all(frame.equals(dev) for frame in scored_on)
    assert trained_on == [len(expected.train_frame)] * 4
    assert not set(expected.train_frame.index) & set(dev.index)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| epochs=")]
    assert [line.split(" | ")[0] for line in table] == ["| epochs=1,batch_size=8", "| epochs=2,batch_size=8"]
    assert all("0.500, 0.500 | 0.500 ± 0.000" in line for line in table)


class _Labeler:
    """A stand-in for a trained label model: ``label`` inserts the given values, ``predict``
    returns the given scores."""

    def __init__(self, schema, values=None, scores=None):
        self.schema, self.values, self.scores = schema, values, scores

    def label(self, features: pd.DataFrame) -> pd.DataFrame:
        labelled = features.reset_index(drop=True).copy()
        labelled.insert(self.schema.names.index(self.schema.label), self.schema.label, self.values)
        return labelled

    def predict(self, rows: pd.DataFrame) -> torch.Tensor:
        return torch.as_tensor(self.scores, dtype=torch.float32)


def test_a_continuous_label_is_scored_by_r2_in_the_evaluations_target():
    datamodule = KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, dev_fraction=0.3)
    dev, schema = datamodule.held_out("dev"), datamodule.schema
    truth = dev[schema.label].to_numpy()
    assert script.dev_score(_Labeler(schema, values=truth), dev, schema) == pytest.approx(1.0)
    # the mean of the bounds-scaled target, in price: R² 0 exactly
    assert script.dev_score(_Labeler(schema, values=np.full(len(dev), truth.mean())), dev, schema) == pytest.approx(0.0, abs=1e-9)


def test_a_binary_label_is_scored_by_auroc_of_the_positive_class():
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, dev_fraction=0.3)
    dev, schema = datamodule.held_out("dev"), datamodule.schema
    positive = (dev[schema.label].astype(str) == str(schema.label_column.categories[1])).to_numpy()
    assert 0 < positive.sum() < len(dev)
    right = np.stack([~positive, positive], axis=1).astype(float)
    assert script.dev_score(_Labeler(schema, scores=right), dev, schema) == 1.0
    assert script.dev_score(_Labeler(schema, scores=right[:, ::-1].copy()), dev, schema) == 0.0
