"""A run refused for its settings or its file is refused before any DP release reads a value; a
refusal that can only come after one says what the releases spent.

The releases made before training (a CSV's DP schema estimate, DP modes, QUAIL's label model)
spend budget whether or not the run then trains, and a refused run writes no privacy.json: a
refusal the row count or the file's own values decide must come first.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from lightning_dpgan.cli import main
from lightning_dpgan.datamodules import csv as csv_module
from lightning_dpgan.datamodules.csv import CSVDataModule

ROWS = 80
TINY = ["--model.latent_dim", "4", "--max-steps", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false"]
DP_SCHEMA = ["--data.target", "label", "--data.categorical", "kind,label", "--data.label_kind", "binary",
             "--data.integer", "visits", "--data.bounds_epsilon", "5"]
SCHEMA = {"label": "label", "label_kind": "binary", "columns": [
    {"name": "amount", "kind": "continuous", "bounds": [0, 1000], "source": "a test's public bound"},
    {"name": "visits", "kind": "integer", "bounds": [0, 50], "source": "a test's public bound"},
    {"name": "kind", "kind": "categorical", "categories": ["a", "b"], "source": "a test's public list"},
    {"name": "label", "kind": "categorical", "categories": ["no", "yes"], "source": "a test's public list"}]}


def table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"amount": rng.gamma(2.0, 50.0, ROWS).round(2), "visits": rng.integers(0, 30, ROWS),
                         "kind": rng.choice(["a", "b"], ROWS), "label": rng.choice(["no", "yes"], ROWS)})


def train_args(csv, out, model: str, *extra: str) -> list[str]:
    return ["train", "--model", model, "--dataset", "csv", "--data.csv", str(csv), "--output-dir", str(out),
            *TINY, *extra]


@pytest.fixture
def no_estimate(monkeypatch):
    """The DP schema estimate fails the test if it runs: what it reads would be spent."""
    def estimate(*args, **kwargs):
        raise AssertionError("the DP schema estimate ran before the refusal")

    monkeypatch.setattr(csv_module, "infer_schema_dp", estimate)


def error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


# 80 rows, 64 of them training rows after the seeded test split
@pytest.mark.parametrize("model, settings, said", [
    ("dpgan", ["--epsilon", "8", "--delta", "0.05"], "--delta 0.05 (given, or a config file's or the preset's) is "
                                                     "not below 1/n = 0.015625 for the n = 64 training records"),
    ("dpgan", ["--epsilon", "8", "--batch-size", "500"], "--batch-size 500 exceeds the 64 training records"),
    ("pategan", ["--epsilon", "20", "--data.bounds_delta", "1e-9", "--privacy.num_teachers", "500"], "--privacy.num_teachers 500"),
    ("gswgan", ["--epsilon", "20", "--data.bounds_delta", "1e-9", "--privacy.num_critics", "500"], "--privacy.num_critics 500"),
    ("quail", ["--epsilon", "20", "--batch-size", "16", "--quail.batch_size", "500"], "--quail.batch_size 500 exceeds the 64 training records"),
], ids=["delta", "dp-sgd-batch", "teachers", "critics", "quail-batch"])
def test_settings_the_row_count_rules_out_are_refused_before_the_schema_estimate(
        model, settings, said, tmp_path, capsys, no_estimate):
    csv = tmp_path / "data.csv"
    table().to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", model, *DP_SCHEMA, *settings)) == 2
    line = error_line(capsys)
    assert said in line
    assert "exceeds the 64 training records" in line or "not below 1/n" in line
    assert not (tmp_path / "out").exists()


def test_the_delta_check_comes_before_the_dp_modes_too(tmp_path, capsys, no_dp_modes):
    """A public schema and DP modes (DP-CTGAN's default): the histogram is the release."""
    csv, schema = public_schema_csv(tmp_path, table())
    assert main(train_args(csv, tmp_path / "out", "dpctgan", "--data.schema", str(schema), "--epsilon", "8",
                           "--delta", "0.05")) == 2
    assert "is not below 1/n = 0.015625" in error_line(capsys)


def held_out_row(schema_path) -> int:
    """The index of a row the seeded split holds out (the test split), found as train finds it."""
    datamodule = CSVDataModule(csv=schema_path.parent / "data.csv", schema=schema_path)
    datamodule.training_row_count()
    return int(datamodule.test_frame.index[0])


@pytest.mark.parametrize("value, column, said", [
    (np.inf, "amount", "column 'amount' holds infinite values (1 row: inf (data row {row}))"),
    (30.5, "visits", "column 'visits' is integer but 1 rows hold fractional values (30.5 (data row {row}))"),
    ("99999999999999999999", "visits", "whole numbers too large for 64 bits: '99999999999999999999' (data row {row})"),
], ids=["infinite", "fraction-in-an-integer-column", "beyond-64-bits"])
@pytest.mark.parametrize("with_schema", [True, False], ids=["schema-file", "dp-schema"])
def test_a_value_no_encoding_takes_in_a_held_out_row_is_refused_before_training(
        value, column, said, with_schema, tmp_path, capsys, no_estimate):
    """It was refused only by ``evaluate``, once training had spent the budget (``train
    --evaluate`` too), or named no row."""
    csv, schema = tmp_path / "data.csv", tmp_path / "schema.yaml"
    table().to_csv(csv, index=False)
    schema.write_text(yaml.safe_dump(SCHEMA))
    row = held_out_row(schema)
    frame = table().astype({column: object})
    frame.loc[row, column] = value
    frame.to_csv(csv, index=False)
    data = ["--data.schema", str(schema)] if with_schema else DP_SCHEMA
    assert main(train_args(csv, tmp_path / "out", "dpgan", *data, "--epsilon", "8", "--evaluate")) == 2
    assert said.format(row=row + 1) in error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def no_dp_modes(monkeypatch):
    """The DP modes' histogram fails the test if it is drawn: what it reads would be spent."""
    from lightning_dpgan.data.table_transformer import TableTransformer

    def fit_dp(*args, **kwargs):
        raise AssertionError("the DP modes were drawn before the refusal")

    monkeypatch.setattr(TableTransformer, "fit_dp", fit_dp)


def public_schema_csv(tmp_path, frame: pd.DataFrame):
    csv, schema = tmp_path / "data.csv", tmp_path / "schema.yaml"
    frame.to_csv(csv, index=False)
    schema.write_text(yaml.safe_dump(SCHEMA))
    return csv, schema


def test_a_public_schemas_label_checks_come_before_the_dp_modes(tmp_path, capsys, no_dp_modes):
    """A binary label's third value in a held-out row, and a label of one class, need no release
    with a schema file: they were refused in setup, after the modes were drawn."""
    csv, schema = public_schema_csv(tmp_path, table())
    row = held_out_row(schema)
    frame = table()
    frame.loc[row, "label"] = "maybe"
    frame.to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", "dpctgan", "--data.schema", str(schema), "--epsilon", "8",
                           "--batch-size", "16")) == 2
    assert f"1 test rows hold other values ('maybe' (data row {row + 1}))" in error_line(capsys)
    table().assign(label="yes").to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", "dpctgan", "--data.schema", str(schema), "--epsilon", "8",
                           "--batch-size", "16")) == 2
    assert "holds one class ('yes') in all 64 training rows" in error_line(capsys)


def test_image_networks_for_a_table_are_refused_before_the_schema_estimate(tmp_path, capsys, no_estimate):
    """--model.arch dcgan on a table failed as the networks were built, after the DP schema
    estimate, on a keyword DCGAN's layers do not take (output_activation)."""
    csv = tmp_path / "data.csv"
    table().to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", "dpgan", *DP_SCHEMA, "--epsilon", "8", "--batch-size", "16",
                           "--model.arch", "dcgan")) == 2
    assert "model.arch dcgan builds convolutions for images of (channels, height, width) with sides divisible by 4, " \
           "not a table's records: use model.arch mlp (or auto)" in error_line(capsys)


def test_a_quail_split_no_noise_can_certify_is_refused_before_the_dp_modes(tmp_path, capsys, no_dp_modes, no_estimate):
    """At --quail-split 1e-9 the label model's share (8e-9 at delta 8e-15) lies below what the RDP
    accountant certifies with any noise (about 0.024 at that delta): the label model refused it
    only as it trained, after the DP modes had spent their budget."""
    csv, schema = public_schema_csv(tmp_path, table())
    assert main(train_args(csv, tmp_path / "out", "quail", "--data.schema", str(schema), "--epsilon", "8",
                           "--delta", "8e-6", "--batch-size", "16", "--quail.batch_size", "16", "--quail-split",
                           "1e-9")) == 2
    line = error_line(capsys)
    assert "QUAIL's label model gets --quail-split 1e-09 of --epsilon 8 and --delta 8e-06 (epsilon 8e-09, delta 8e-15)" in line
    assert "certifies no less than epsilon" in line and line.endswith("Refused before any row was read: nothing was spent")


def test_critics_for_a_model_of_one_discriminator_are_refused_before_the_dp_modes(tmp_path, capsys, no_dp_modes):
    csv, schema = public_schema_csv(tmp_path, table())
    assert main(train_args(csv, tmp_path / "out", "dpsactgan", "--data.schema", str(schema), "--epsilon", "8",
                           "--batch-size", "16", "--privacy.num_critics", "4")) == 2
    assert "--privacy.num_critics 4 needs a model that trains one critic per partition (gswgan); DPSACTGAN has a " \
           "single discriminator" in error_line(capsys)


def test_the_spend_after_a_release_is_said_in_the_strategys_neighbouring_relation(tmp_path, capsys):
    """PATE's --epsilon and --delta are for replace-one neighbours: the schema estimate's (5, 1e-9)
    for add/remove is (10, (1 + e^5) 1e-9 summed over the columns) there, as privacy.json would say."""
    csv = tmp_path / "data.csv"
    frame = table()
    frame.loc[3, "label"] = "Yes "
    frame.to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", "pategan", *DP_SCHEMA, "--data.bounds_delta", "1e-9",
                           "--epsilon", "1000", "--privacy.teacher_batch_size", "4")) == 2
    line = error_line(capsys)
    assert "had spent epsilon 10 and delta " in line
    assert "; restated for replace-one by group privacy from what each spent for add/remove neighbours" in line


def test_a_refusal_after_the_schema_estimate_says_what_it_spent(tmp_path, capsys):
    """A third value of a binary label in a training row can only be found once the estimate has
    released the label's classes: the refusal names the row and the budget spent."""
    csv = tmp_path / "data.csv"
    frame = table()
    frame.loc[3, "label"] = "Yes "
    frame.to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", "dpgan", *DP_SCHEMA, "--epsilon", "8")) == 2
    line = error_line(capsys)
    assert "the label 'label' must be binary with classes ['no', 'yes'], but 1 rows hold other values ('Yes ' (data " \
           "row 4))" in line
    assert ("This run was refused after DP releases drawn from the training rows had spent epsilon 5 and delta "
            "1e-06 (schema 5 (DP schema estimation") in line
    assert "count them as spent on this data" in line


@pytest.mark.parametrize("model, settings, said", [
    ("dpgan", ["--epsilon", "5.5", "--delta", "1e-3", "--batch-size", "32", "--privacy.noise_multiplier", "0.5"],
     "a single training step would spend at least epsilon = "),
    ("pategan", ["--epsilon", "20", "--data.bounds_delta", "1e-9", "--privacy.num_teachers", "8"],
     "(its 320 queries all answered unanimously, the cheapest case), more than --epsilon 20"),
    ("gpate", ["--epsilon", "20", "--data.bounds_delta", "1e-9", "--privacy.num_teachers", "8", "--privacy.sigma1", "3"],
     "(its 80 threshold checks alone, every query unanswered, the cheapest case), more than --epsilon 20"),
    ("dpgan", ["--epsilon", "5.003"], "however much noise is added, a training step spends at least epsilon 0.0035 at "
                                      "delta 1e-05 (the least the accountant reports)"),
    ("dpgan", ["--epsilon", "5.009", "--privacy.accountant", "prv"],
     "however much noise is added, a training step spends at least epsilon 0.00999 at delta 1e-05 (the least the "
     "accountant reports), so this run would spend at least epsilon = 5.01, more than --epsilon 5.009: raise --epsilon "
     "(or --delta), or use --privacy.accountant rdp, whose least is 0.0035."),
    ("gswgan", ["--epsilon", "5.003"], "however much noise is added, a training step spends at least epsilon 0.0035"),
    ("gswgan", ["--epsilon", "10.003", "--data.bounds_delta", "1e-9", "--privacy.num_critics", "4"],
     "however much noise is added, a training step spends at least epsilon 0.0035 at delta 1e-05"),
], ids=["dp-sgd", "pate", "gpate", "dp-sgd-calibrated", "dp-sgd-calibrated-prv", "sanitizer-calibrated",
        "gs-wgan-calibrated"])
def test_a_first_step_the_budget_cannot_pay_for_is_refused_before_the_schema_estimate(
        model, settings, said, tmp_path, capsys, no_estimate):
    """Priced from the settings and the row count: the budget's own refusal came as training
    started, once the estimate had spent its epsilon."""
    csv = tmp_path / "data.csv"
    table().to_csv(csv, index=False)
    assert main(train_args(csv, tmp_path / "out", model, *DP_SCHEMA, *settings)) == 2
    line = error_line(capsys)
    assert said in line and "Of that, " in line and " would be spent before training (" in line
    assert line.endswith("Refused before any DP release read the rows: nothing was spent")


def test_the_first_steps_price_comes_before_the_dp_modes_too(tmp_path, capsys, no_dp_modes):
    csv, schema = public_schema_csv(tmp_path, table())
    assert main(train_args(csv, tmp_path / "out", "patectgan", "--data.schema", str(schema), "--epsilon", "5",
                           "--delta", "1e-3")) == 2
    line = error_line(capsys)
    assert "a single training step would spend at least epsilon" in line and "modes 0.2" in line  # 0.1, restated
    assert line.endswith("nothing was spent")


def test_a_first_step_too_dear_once_quails_label_model_has_spent_says_it_once(tmp_path, capsys):
    """The price before the releases is a lower bound (the label model may spend less than its
    share, and training gets the delta the releases leave): a run it lets through may still be
    refused once the label model has trained, and that refusal says what it spent, once. Step
    4.96 at training's delta (4.60 at the whole), label model 2.49: 7.45 against 5."""
    csv, schema = tmp_path / "data.csv", tmp_path / "schema.yaml"
    table().to_csv(csv, index=False)
    schema.write_text(yaml.safe_dump(SCHEMA))
    assert main(train_args(csv, tmp_path / "out", "quail", "--data.schema", str(schema), "--data.modes", "bounds",
                           "--epsilon", "5", "--delta", "1e-3", "--batch-size", "16", "--quail.batch_size", "16",
                           "--privacy.noise_multiplier", "0.6")) == 2
    line = error_line(capsys)
    assert "a single training step would spend epsilon = 7.4" in line and "more than --epsilon 5" in line
    assert "Of that, 2.493 was spent before training" in line and "quail_label_model 2.49" in line
    assert "This run was refused after DP releases" not in line and "nothing was spent" not in line


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_a_calibrated_steps_price_is_where_the_calibration_starts_refusing(kind):
    """Priced before the releases, a step whose noise is yet to be calibrated costs the least the
    accountant reports however much noise: a training budget at or below it is one the
    calibration refuses (after the releases spent theirs), and one above it one it can meet."""
    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.privacy.accountants import calibrate_noise_multiplier
    from lightning_dpgan.privacy.accountants.opacus_adapter import UnreachableEpsilon

    floor = DPSGD(target_epsilon=1.0, accountant=kind).first_step_epsilon(1000, 50, {}, 1e-5)
    with pytest.raises(UnreachableEpsilon, match="however much noise is added"):
        calibrate_noise_multiplier(floor, 1e-5, 0.05, 20, kind=kind)
    assert calibrate_noise_multiplier(1.2 * floor, 1e-5, 0.05, 20, kind=kind) > 0
