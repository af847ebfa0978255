"""The scripts under benchmarks/ that print figures (RESULTS.md quotes them): the figures come
from the right rows, splits, budgets and reductions. Every test runs the script's own code on stand-ins (tiny frames, stub
trainers/label models/timers), so none trains a model: each takes well under a few seconds."""
import collections
import json
import re
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import norm

from lightning_dpgan.datamodules.king import KingDataModule
from lightning_dpgan.evaluation.utility import CLASSIFIERS
from lightning_dpgan.privacy.accountants.gnmax import ConfidentGNMaxAccountant
from lightning_dpgan.quail import QUAIL
from test_dev_split import load_benchmark_script

FIXTURES = Path(__file__).parent / "fixtures"
KING_TINY = FIXTURES / "king_tiny"


class Stop(Exception):
    """Raised by a stand-in to end a script's main once what it checks has happened."""


def king(dev_fraction: float = 0.3) -> KingDataModule:
    datamodule = KingDataModule(data_dir=KING_TINY, download=False, dev_fraction=dev_fraction)
    datamodule.setup("fit")
    return datamodule


@pytest.fixture
def keep_threads():
    """Scripts' main set torch's thread count for the process: put it back."""
    threads = torch.get_num_threads()
    yield str(threads)
    torch.set_num_threads(threads)


class RecordingLabeler:
    """A stand-in for QUAIL's stored label model: records every feature table it labels and
    labels it with a price that is a function of sqft_living (inside the schema's bounds)."""

    def __init__(self, schema):
        self.schema, self.seen = schema, []

    def label(self, features: pd.DataFrame) -> pd.DataFrame:
        self.seen.append(features.copy())
        low, high = self.schema.label_column.bounds
        labelled = features.reset_index(drop=True).copy()
        price = np.clip(low + 100.0 * labelled["sqft_living"].to_numpy(dtype=float), low, high)
        labelled.insert(self.schema.names.index(self.schema.label), self.schema.label, price)
        return labelled


# ---------------------------------------------------------------------------------------- utility.py
utility = load_benchmark_script("utility")


def test_utility_quick_and_full_presets_fill_only_what_is_not_given(tmp_path):
    args, extra = utility.parse_args(["--model", "gan", "--dataset", "mnist", "--quick", "--output-dir", str(tmp_path)])
    assert (args.max_steps, args.n_synthetic, args.cnn_epochs) == (300, 5000, 1) and extra == []
    args, extra = utility.parse_args(["--model", "gan", "--dataset", "mnist", "--output-dir", str(tmp_path),
                                      "--cnn-epochs", "3", "--model.lr_generator", "1e-4"])
    assert (args.max_steps, args.n_synthetic, args.cnn_epochs) == (None, 60000, 3)
    assert extra == ["--model.lr_generator", "1e-4"]


def test_utility_passes_epsilon_to_train_only_for_a_private_model_and_the_seed_to_both_commands(tmp_path):
    args, _ = utility.parse_args(["--model", "gan", "--dataset", "mnist", "--epsilon", "2", "--output-dir", str(tmp_path)])
    private = utility.train_command(args, 3, tmp_path, True, ["--x", "1"])
    public = utility.train_command(args, 3, tmp_path, False, [])
    assert private[private.index("--epsilon") + 1] == "2.0" and "--epsilon" not in public
    assert private[private.index("--seed") + 1] == "3" and private[-2:] == ["--x", "1"]
    sample = utility.sample_command(tmp_path, 7, 3)
    assert sample[sample.index("--seed") + 1] == "3" and sample[sample.index("-n") + 1] == "7"


def test_utility_reads_a_passed_through_privacy_in_both_spellings():
    assert utility.privacy_name("gan", ["--privacy", "dp-sgd"]) == "dp-sgd"
    assert utility.privacy_name("gan", ["--x", "1", "--privacy=dp-sgd"]) == "dp-sgd"
    assert utility.is_private("gan", ["--privacy", "dp-sgd"]) and not utility.is_private("gan", ["--privacy", "none"])


def test_utility_reference_trains_on_n_real_train_records_and_everything_tests_on_the_test_split(tmp_path, monkeypatch):
    train = (torch.arange(20.0).view(20, 1), torch.arange(20) % 10)
    test = (torch.full((5, 1), -1.0), torch.zeros(5, dtype=torch.long))
    synthetic = (torch.full((4, 1), 100.0), torch.ones(4, dtype=torch.long))

    def fake_train_and_sample(args, seed, private, extra):
        run_dir = args.output_dir / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "privacy.json").write_text(json.dumps({"epsilon": 1.0, "delta": 1e-5, "mechanism": "m", "steps": 3}))
        return run_dir, [["train"], ["sample"]]

    calls, accuracies = [], iter([0.2, 0.4, 0.9, 0.7])

    def fake_cnn(train_images, train_labels, test_images, test_labels, **schedule):
        calls.append((train_images, test_images, schedule["seed"]))
        return {"accuracy": next(accuracies), "train_records": len(train_images), "test_records": len(test_images)}

    monkeypatch.setattr(utility, "train_and_sample", fake_train_and_sample)
    monkeypatch.setattr(utility, "real_splits", lambda run_dir, data_dir: (train, test))
    monkeypatch.setattr(utility, "load_synthetic_npz", lambda path: synthetic)
    monkeypatch.setattr(utility, "cnn_accuracy", fake_cnn)
    utility.main(["--model", "gan", "--dataset", "mnist", "--seeds", "0", "1", "--n-synthetic", "6",
                  "--cnn-epochs", "1", "--output-dir", str(tmp_path)])
    assert len(calls) == 4 and all(torch.equal(images, test[0]) for _, images, _ in calls)
    assert all(torch.equal(images, synthetic[0]) for images, _, _ in calls[:2])
    for images, _, seed in calls[2:]:  # the reference: 6 distinct real training records
        values = images.view(-1).tolist()
        assert len(values) == 6 == len(set(values)) and set(values) <= set(range(20))
    report = json.loads((tmp_path / "utility.json").read_text())
    assert report["summary"]["mean"] == pytest.approx(0.3)
    assert report["summary"]["std"] == pytest.approx(statistics.stdev([0.2, 0.4]))
    assert report["real_reference"]["mean"] == pytest.approx(0.8) and report["real_reference"]["train_records"] == 6
    assert report["real_reference"]["std"] == pytest.approx(statistics.stdev([0.9, 0.7]))
    assert utility.summarize([0.5]) == {"mean": 0.5, "std": 0.0, "n": 1}


# ------------------------------------------------------------------------------- tabular_utility.py
tabular = load_benchmark_script("tabular_utility")


def test_tabular_utility_settings_a_and_b_and_their_averages(tmp_path, monkeypatch, capsys):
    train, test, synthetic = (pd.DataFrame({"x": [i]}) for i in range(3))
    datamodule = SimpleNamespace(train_frame=train, test_frame=test, schema="schema")
    names, calls = list(CLASSIFIERS), []

    def fake_utility(train_frame, test_frame, schema, seed=0):
        calls.append((train_frame, test_frame))
        base = 0.5 if train_frame is synthetic else 0.8
        return {"per_classifier": {n: {"auroc": base + 0.01 * i, "auprc": base - 0.01 * i, "degenerate": False}
                                   for i, n in enumerate(names)}}

    monkeypatch.setattr(tabular, "run_datamodule", lambda run, dataset, data_dir: datamodule)
    monkeypatch.setattr(tabular, "read_synthetic_table", lambda path, schema: synthetic)
    monkeypatch.setattr(tabular, "classification_utility", fake_utility)
    (tmp_path / "privacy.json").write_text(json.dumps({"epsilon": 1.0, "target_epsilon": 1.0, "delta": 1e-5}))
    monkeypatch.setattr(sys, "argv", ["tabular_utility.py", "--run", str(tmp_path)])
    tabular.main()
    assert [(a is train, b is test) for a, b in calls[:1]] == [(True, True)]
    assert calls[1][0] is synthetic and calls[1][1] is test and len(calls) == 2
    out = capsys.readouterr().out
    four = [names.index(n) for n in tabular.FOUR]
    for label, indices in (("average of 12", range(len(names))), ("average of LR/RF/GB/MLP", four)):
        a, b = map(float, re.search(rf"^{re.escape(label)}\s+([0-9.]+)\s+([0-9.]+)$", out, re.MULTILINE).groups())
        assert a == pytest.approx(0.8 + 0.01 * np.mean(list(indices)), abs=1e-4)
        assert b == pytest.approx(0.5 + 0.01 * np.mean(list(indices)), abs=1e-4)


# ----------------------------------------------------------------------------------------- quail.py
quail_script = load_benchmark_script("quail")


def test_quail_scores_four_classifiers_trained_on_synthetic_on_the_test_split(tmp_path, monkeypatch):
    (tmp_path / "privacy.json").write_text(json.dumps({"epsilon": 0.9, "steps": 5}))
    train, test, synthetic = (pd.DataFrame({"x": [i]}) for i in range(3))
    datamodule = SimpleNamespace(train_frame=train, test_frame=test, schema="schema")
    seen = []

    def fake_utility(train_frame, test_frame, schema, chosen, seed):
        seen.append((train_frame, test_frame, sorted(chosen)))
        return {"per_classifier": {n: {"auroc": 0.6 + 0.1 * i, "f1": 0.3 + 0.1 * i} for i, n in enumerate(chosen)}}

    monkeypatch.setattr(quail_script, "read_synthetic_table", lambda path, schema: synthetic)
    monkeypatch.setattr(quail_script, "classification_utility", fake_utility)
    scores = quail_script.synthetic_scores(tmp_path, datamodule, 0)
    assert seen[0][0] is synthetic and seen[0][1] is test and seen[0][2] == sorted(quail_script.FOUR)
    rf = list(quail_script.FOUR).index("random_forest")
    assert scores == pytest.approx({"epsilon": 0.9, "steps": 5, "rf_f1": 0.3 + 0.1 * rf, "auroc_4": 0.75})


def test_quail_label_model_is_scored_on_the_test_rows_with_the_positive_class(tmp_path, monkeypatch):
    from lightning_dpgan.datamodules.adult import AdultDataModule

    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False)
    datamodule.setup("fit")
    schema, test = datamodule.schema, datamodule.test_frame
    positive = (test[schema.label].astype(str) == str(schema.label_column.categories[1])).to_numpy()
    assert 0 < positive.sum() < len(test)
    predicted_on = []

    class Labeler:
        def __init__(self):
            self.schema = schema

        def predict(self, rows):
            predicted_on.append(rows)
            # a perfect classifier of the rows it is given: logit of the positive class high on positives
            truth = (rows[schema.label].astype(str) == str(schema.label_column.categories[1])).to_numpy()
            return torch.as_tensor(np.stack([~truth, truth], axis=1).astype(np.float32) * 4)

    monkeypatch.setattr(quail_script, "read_run_info", lambda path: None)
    monkeypatch.setattr(quail_script, "table_labeler", lambda info: Labeler())
    scores = quail_script.label_model_scores(tmp_path, datamodule)
    assert scores == {"label_model_auroc": 1.0, "label_model_accuracy": 1.0, "label_model_f1": 1.0}
    assert len(predicted_on) == 1 and predicted_on[0].equals(test)


def test_quail_arguments_after_the_double_dash_go_to_train_without_it(monkeypatch):
    captured = []

    def fake_train(name, model_args, seed, args):
        captured.append((name, model_args, args.train_args))
        raise Stop

    monkeypatch.setattr(quail_script, "train", fake_train)
    monkeypatch.setattr(sys, "argv", ["quail.py", "--data-dir", str(FIXTURES / "adult_tiny"), "--seeds", "0",
                                      "--split", "0.25", "--", "--max-steps", "2"])
    with pytest.raises(Stop):
        quail_script.main()
    name, model_args, train_args = captured[0]
    assert train_args == ["--max-steps", "2"]
    assert model_args == ["--model", "quail", "--quail-synthesizer", "dpctgan", "--quail-split", "0.25"]


# ----------------------------------------------------------------------------- quail_label_model.py
label_model_script = load_benchmark_script("quail_label_model")


def test_label_model_sweep_fits_at_the_whole_budget_per_seed_and_reports_mean_sample_std_and_largest_cost(monkeypatch, capsys):
    fits, scores, costs = [], iter([0.1, 0.2, 0.9]), iter([0.30, 0.50, 0.40])

    def fake_fit(self, datamodule, epsilon, delta, neighbours, seed=0):
        fits.append((epsilon, delta, neighbours, seed))
        return SimpleNamespace(cost={"epsilon": next(costs)})

    clock = iter([0.0, 30.0])
    monkeypatch.setattr(QUAIL, "fit_labeler", fake_fit)
    monkeypatch.setattr(label_model_script, "dev_score", lambda labeler, dev, schema: next(scores))
    monkeypatch.setattr(label_model_script, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    label_model_script.main(["--dataset", "king", "--data-dir", str(KING_TINY), "--epsilon", "2", "--delta", "1e-4",
                             "--dev-fraction", "0.25", "--seeds", "4", "5", "6", "--setting", "epochs=1"])
    # QUAIL.fit_labeler takes the label model's share itself: the script hands it the whole budget
    assert fits == [(2.0, 1e-4, "add-remove", seed) for seed in (4, 5, 6)]
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| epochs=1 ")]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    std = np.std([0.1, 0.2, 0.9], ddof=1)
    assert cells == ["epochs=1", "0.5000", "0.100, 0.200, 0.900", f"0.400 ± {std:.3f}", "10"]


def test_label_model_setting_parses_its_numbers():
    assert label_model_script.parse_setting("scale_share=0.5,split=0.25,max_grad_norm=2") == {
        "scale_share": 0.5, "split": 0.25, "max_grad_norm": 2.0}


def test_label_model_r2_is_of_the_truth_not_of_the_prediction():
    """R² is asymmetric: predictions spread twice as wide as the truth score 1 - 1 = 0 against the
    truth, 0.75 the other way round."""
    datamodule = king(0.3)
    dev, schema = datamodule.held_out("dev"), datamodule.schema
    from lightning_dpgan.evaluation.utility import features_and_label

    _, truth = features_and_label(dev, schema)
    low, high = schema.label_column.bounds
    scaled = truth.mean() + 2 * (truth - truth.mean())
    assert scaled.min() >= 0 and scaled.max() <= 1
    prices = low + scaled * (high - low)

    class Labeler:
        def label(self, features):
            labelled = features.reset_index(drop=True).copy()
            labelled.insert(schema.names.index(schema.label), schema.label, prices)
            return labelled

    from sklearn.metrics import r2_score

    assert label_model_script.dev_score(Labeler(), dev, schema) == pytest.approx(r2_score(truth, scaled), abs=1e-6)
    assert r2_score(truth, scaled) == pytest.approx(0.0, abs=1e-6)


# -------------------------------------------------------------------------------- regression_gap.py
regression_gap = load_benchmark_script("regression_gap")


def test_regression_gap_relabels_the_right_feature_tables_and_scores_the_split_asked_for(tmp_path, monkeypatch, capsys):
    datamodule = king(0.3)
    train, schema = datamodule.train_frame, datamodule.schema
    synthetic = pd.concat([train, train.iloc[:5]], ignore_index=True)
    synthetic["sqft_living"] = synthetic["sqft_living"] + 1  # values no real training row holds
    assert not synthetic["sqft_living"].isin(train["sqft_living"]).any()
    labeler = RecordingLabeler(schema)
    monkeypatch.setattr(regression_gap, "read_run_info", lambda path: None)
    monkeypatch.setattr(regression_gap, "table_labeler", lambda info: labeler)
    monkeypatch.setattr(regression_gap, "load_run_datamodule", lambda run, data_dir: datamodule)
    monkeypatch.setattr(regression_gap, "read_synthetic_table", lambda path, schema: synthetic)
    from sklearn.linear_model import LinearRegression

    monkeypatch.setitem(regression_gap.REGRESSORS, "random_forest", lambda seed: LinearRegression())  # fast
    utility_calls, regression_utility = [], regression_gap.regression_utility

    def recording_utility(train_frame, test_frame, schema, seed=0):
        utility_calls.append((train_frame, test_frame))
        return regression_utility(train_frame, test_frame, schema, seed=seed)

    monkeypatch.setattr(regression_gap, "regression_utility", recording_utility)
    regression_gap.main(["--run", str(tmp_path), "--split", "dev"])
    out = capsys.readouterr().out
    assert f"{len(synthetic)} synthetic rows, {len(datamodule.held_out('dev'))} dev rows" in out
    # the first column: trained on the real training rows, the second on the synthetic ones
    assert [a is b for (a, _), b in zip(utility_calls, (train, synthetic))] == [True, True]
    assert all(test.equals(datamodule.held_out("dev")) for _, test in utility_calls)
    features = train.drop(columns=[schema.label])
    real, shuffled, synth, *drawn = labeler.seen
    assert real.equals(features)
    assert all(sorted(shuffled[c]) == sorted(features[c]) for c in features)  # each column's own values ...
    assert not shuffled.reset_index(drop=True).equals(features.reset_index(drop=True))  # ... in another order
    assert synth.equals(synthetic.drop(columns=[schema.label]))
    assert len(drawn) == len(features.columns)
    for name, table in zip(features.columns, drawn):
        assert table[name].isin(train[name]).all(), name  # drawn from the REAL marginal
        others = [c for c in features.columns if c != name]
        assert table[others].equals(synthetic[others])
    assert not drawn[list(features.columns).index("sqft_living")]["sqft_living"].equals(synthetic["sqft_living"])


# --------------------------------------------------------------------------------- step_rounding.py
step_rounding = load_benchmark_script("step_rounding")


def test_step_rounding_scores_the_decoded_rows_then_the_rounded_ones_on_the_split_asked_for(tmp_path, monkeypatch, capsys):
    datamodule = king(0.3)
    schema = datamodule.schema
    decoded = datamodule.train_frame.copy()
    decoded["floors"] = decoded["floors"] + 0.1  # off the half-floor grid
    decoded.to_csv(tmp_path / "synthetic.csv", index=False)
    labeler, scored = RecordingLabeler(schema), []

    def fake_utility(train_frame, test_frame, schema):
        scored.append(test_frame)
        share = float(np.isclose(train_frame["floors"] * 2, np.round(train_frame["floors"] * 2)).mean())
        return {"average": {"r2": share}, "per_regressor": {"ridge": {"r2": share}}}

    monkeypatch.setattr(step_rounding, "read_run_info", lambda path: None)
    monkeypatch.setattr(step_rounding, "table_labeler", lambda info: labeler)
    monkeypatch.setattr(step_rounding, "load_run_datamodule", lambda run, data_dir: datamodule)
    monkeypatch.setattr(step_rounding, "regression_utility", fake_utility)
    step_rounding.main(["--run", str(tmp_path), "--split", "dev"])
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == f"| {tmp_path.name} | 0.000 | 1.000 | ridge 0.000 -> 1.000 |"
    assert len(scored) == 2 and all(frame.equals(datamodule.held_out("dev")) for frame in scored)
    # labels recomputed from each feature table, the label column not among the features
    assert [schema.label in table for table in labeler.seen] == [False, False]
    assert np.allclose(labeler.seen[1]["floors"], np.round(decoded["floors"] * 2) / 2)


# ------------------------------------------------------------------------------ column_marginals.py
column_marginals = load_benchmark_script("column_marginals")


def test_column_marginals_counts_real_values_in_the_training_rows(tmp_path, monkeypatch):
    datamodule = king(0.3)
    train = datamodule.train_frame
    synthetic = train.copy()
    synthetic["zipcode"] = train["zipcode"].iloc[0]
    monkeypatch.setattr(column_marginals, "load_run_datamodule", lambda run, data_dir: datamodule)
    monkeypatch.setattr(column_marginals, "read_synthetic_table", lambda path, schema: synthetic)
    result = column_marginals.column_marginals(tmp_path, None)
    assert train["zipcode"].nunique() > 1
    assert result["zipcode"]["real_values"] == train["zipcode"].nunique()
    assert result["zipcode"]["synthetic_values"] == 1


def test_column_marginals_mean_over_runs(tmp_path, monkeypatch, capsys):
    per_run = {tmp_path / "a": {"zipcode": {"tv": 0.2, "invented": 0.1, "real_values": 5.0, "synthetic_values": 4.0}},
               tmp_path / "b": {"zipcode": {"tv": 0.4, "invented": 0.3, "real_values": 5.0, "synthetic_values": 3.0}}}
    monkeypatch.setattr(column_marginals, "column_marginals", lambda run, data_dir: per_run[run])
    column_marginals.main(["--run", str(tmp_path / "a"), "--run", str(tmp_path / "b")])
    assert "| zipcode | mean of 2 | – | – | 0.300 | 0.200 |" in capsys.readouterr().out.splitlines()


# ------------------------------------------------------------------------- confident_gnmax_floor.py
floor = load_benchmark_script("confident_gnmax_floor")


def test_gnmax_floor_pass_probabilities_threshold_halfway_between_unanimous_and_split():
    unanimous, split = floor.pass_probabilities(200, 40.0)
    assert unanimous == pytest.approx(norm.sf(150, loc=200, scale=40))
    assert split == pytest.approx(norm.sf(150, loc=100, scale=40))


def test_gnmax_floor_least_sigma1_spends_the_budget_on_the_checks_alone():
    sigma = floor.least_sigma1(640, 1.0, 1e-5)
    accountant = ConfidentGNMaxAccountant("data-independent")
    assert accountant.epsilon_if_queries(1e-5, 640, sigma, floor.NEVER_ANSWERED, answered_fraction=0.0) == pytest.approx(1.0, abs=1e-2)
    assert accountant.epsilon_if_queries(1e-5, 640, 0.9 * sigma, floor.NEVER_ANSWERED, answered_fraction=0.0) > 1.0


def test_gnmax_floor_rows_count_queries_per_step(tmp_path, monkeypatch):
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["confident_gnmax_floor.py", "--teachers", "100", "--queries-per-step", "8",
                                      "--steps", "1", "10", "--json", str(out)])
    floor.main()
    rows = json.loads(out.read_text())["rows"]
    assert [row["queries"] for row in rows] == [8, 80]
    for row in rows:
        assert row["sigma1"] == pytest.approx(floor.least_sigma1(row["queries"], 1.0, 1e-5))
        assert row["sigma1_over_k"] == pytest.approx(row["sigma1"] / 100)
        assert (row["pass_unanimous"], row["pass_split"]) == pytest.approx(floor.pass_probabilities(100, row["sigma1"]))


# ---------------------------------------------------------------------------------- ctgan_family.py
ctgan_family = load_benchmark_script("ctgan_family")


@pytest.mark.parametrize("kind, function, table, name, real, synthetic, gap", [
    ("continuous", "regression_utility", "per_regressor", "ridge", {"mae": 0.1, "explained_variance": 0.8, "r2": 0.7},
     {"mae": 0.3, "explained_variance": 0.5, "r2": 0.2}, {"Ridge MAE": 0.2, "Ridge EVS": 0.3, "Ridge R2": 0.5}),
    ("binary", "classification_utility", "per_classifier", "logistic_regression", {"accuracy": 0.85, "auroc": 0.9, "f1": 0.6},
     {"accuracy": 0.75, "auroc": 0.8, "f1": 0.4}, {"LR ACC %": 10.0, "LR AUC": 0.1, "LR F1": 0.2}),
], ids=["regression", "classification"])
def test_ctgan_family_gap_is_real_minus_synthetic_on_the_test_rows(monkeypatch, kind, function, table, name, real,
                                                                   synthetic, gap):
    """DP-SACTGAN's tables: the model trained on the training rows, then on the synthetic ones,
    both tested on the test rows; MAE's gap the other way round, accuracy's in percent points."""
    train, test, table_rows = object(), object(), object()
    datamodule = SimpleNamespace(schema=SimpleNamespace(label_kind=kind), train_frame=train, test_frame=test)
    calls = []

    def fake(train_frame, test_frame, schema, chosen, seed):
        calls.append((train_frame, test_frame, sorted(chosen)))
        return {table: {name: real if train_frame is train else synthetic}}

    monkeypatch.setattr(ctgan_family, function, fake)
    assert ctgan_family.utility_gap(datamodule, table_rows, 0) == pytest.approx(gap)
    assert calls == [(train, test, [name]), (table_rows, test, [name])]


def test_ctgan_family_fidelity_against_the_training_rows(monkeypatch):
    train, test, synthetic = object(), object(), object()
    datamodule = SimpleNamespace(schema="schema", train_frame=train, test_frame=test)
    seen = []

    def measure(values):
        def fake(real, synth, schema):
            seen.append((real, synth))
            return values
        return fake

    monkeypatch.setattr(ctgan_family, "wasserstein_per_column", measure({"a": 0.1, "b": 0.3}))
    monkeypatch.setattr(ctgan_family, "jensen_shannon_per_column", measure({"c": 0.5}))
    monkeypatch.setattr(ctgan_family, "correlation_difference", lambda real, synth, schema: seen.append((real, synth)) or 0.7)
    assert ctgan_family.fidelity(datamodule, synthetic) == pytest.approx({"WD": 0.2, "JSD": 0.5, "Diff-Corr": 0.7})
    assert len(seen) == 3 and all(real is train and synth is synthetic for real, synth in seen)


def test_ctgan_family_arguments_after_the_double_dash_go_to_train(monkeypatch):
    captured = []

    def fake_train(model, dataset, args):
        captured.append(args)
        raise Stop

    monkeypatch.setattr(ctgan_family, "train", fake_train)
    monkeypatch.setattr(sys, "argv", ["ctgan_family.py", "--models", "dpctgan", "--", "--model.loss", "cross_entropy"])
    with pytest.raises(Stop):
        ctgan_family.main()
    assert captured[0].train_args == ["--model.loss", "cross_entropy"]


# ------------------------------------------------------------------------------ teacher_ensemble.py
teacher_ensemble = load_benchmark_script("teacher_ensemble")


def test_teacher_ensemble_timer_warms_up_once_and_waits_for_the_device_around_each_run(monkeypatch):
    events = []
    ticks = iter([0.0, 0.001, 1.0, 1.009, 2.0, 2.002])  # runs of 1, 9 and 2 ms
    monkeypatch.setattr(teacher_ensemble, "_sync", lambda device: events.append("sync"))
    monkeypatch.setattr(teacher_ensemble, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    median = teacher_ensemble.median_ms(lambda: events.append("fn"), 3, torch.device("cpu"))
    assert events == ["fn"] + ["sync", "fn", "sync"] * 3
    assert median == pytest.approx(2.0)


def test_teacher_ensemble_loop_is_timed_over_at_most_loop_max_teachers_and_scaled_to_k(monkeypatch):
    monkeypatch.setattr(teacher_ensemble, "median_ms", lambda fn, reps, device: 1.0)
    arch = teacher_ensemble.architectures((), 2, 4)["mlp"]
    _, results = teacher_ensemble.measure(arch, 6, 2, 1, torch.device("cpu"))
    assert results == {name: (1.0, 3.0, True) for name in teacher_ensemble.PARTS}
    _, results = teacher_ensemble.measure(arch, 2, 5, 1, torch.device("cpu"))
    assert results == {name: (1.0, 1.0, False) for name in teacher_ensemble.PARTS}


def test_teacher_ensemble_step_row_sums_the_parts_and_speedup_is_loop_over_batched(capsys):
    arch = teacher_ensemble.architectures((), 2, 4)["mlp"]
    results = {"votes": (1.0, 4.0, False), "input-gradients": (2.0, 6.0, False), "update": (3.0, 9.0, True)}
    records = teacher_ensemble.print_rows(arch, 10, "Form", results)
    step = records[-1]
    assert (step["part"], step["batched_ms"], step["loop_ms"], step["loop_extrapolated"]) == ("step", 6.0, 19.0, True)
    assert step["speedup"] == pytest.approx(19 / 6) and records[0]["speedup"] == pytest.approx(4.0)


@pytest.mark.parametrize(("quick", "reps"), [(True, 3), (False, 7)])
def test_teacher_ensemble_repetitions(monkeypatch, keep_threads, quick, reps):
    seen = []

    def fake_measure(arch, k, loop_max, reps, device):
        seen.append(reps)
        return "Form", {name: (1.0, 2.0, False) for name in teacher_ensemble.PARTS}

    monkeypatch.setattr(teacher_ensemble, "measure", fake_measure)
    teacher_ensemble.main(["--ks", "2", "--archs", "mlp", "--threads", keep_threads, *(["--quick"] if quick else [])])
    assert seen == [reps]


# -------------------------------------------------------------------------------- dpsgd_overhead.py
dpsgd_overhead = load_benchmark_script("dpsgd_overhead")


def test_dpsgd_overhead_leaves_out_the_warm_up_and_compares_each_critic_with_its_own_baseline(tmp_path, monkeypatch, keep_threads):
    step_seconds = {("dcgan", None): 1.0, ("dcgan", "auto"): 2.0, ("dcgan", "hooks"): 3.0,
                    ("mlp", None): 4.0, ("mlp", "auto"): 8.0, ("mlp", "hooks"): 12.0}
    runs = collections.Counter()

    def fake_timed(step, device):
        runs[step] += 1
        return 100.0 if runs[step] <= 3 else step_seconds[step]  # the warm-up rounds are slow

    monkeypatch.setattr(dpsgd_overhead, "make_step", lambda arch, mode, device: ((arch, mode), mode or "non-private"))
    monkeypatch.setattr(dpsgd_overhead, "timed", fake_timed)
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["dpsgd_overhead.py", "--steps", "2", "--warmup", "3", "--threads", keep_threads,
                                      "--json", str(out)])
    dpsgd_overhead.main()
    rows = {(row["critic"], row["requested"]): row for row in json.loads(out.read_text())["rows"]}
    for key, seconds in step_seconds.items():
        assert rows[key]["ms_per_step"] == pytest.approx(1000 * seconds)
        assert rows[key]["ratio"] == pytest.approx({None: 1.0, "auto": 2.0, "hooks": 3.0}[key[1]])


# ----------------------------------------------------------------------------------- gpate_speed.py
gpate_speed = load_benchmark_script("gpate_speed")


def test_gpate_step_timer_waits_for_the_gpu_at_both_ends(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: waits.append("sync"))
    timer, module = gpate_speed.StepTimer(), SimpleNamespace(device=torch.device("cuda"))
    timer.on_train_batch_start(None, module)
    assert waits == ["sync"]
    timer.on_train_batch_end(None, module)
    assert waits == ["sync", "sync"] and len(timer.times) == 1


def test_gpate_seconds_per_iteration_is_the_median_after_the_warm_up(monkeypatch):
    durations = [10.0, 10.0, 10.0, 1.0, 2.0, 3.0, 4.0]  # three slow warm-up iterations
    ticks = iter(np.cumsum([[0.0, d] for d in durations]).tolist())

    class FakeTrainer:
        def __init__(self, callbacks, **kwargs):
            self.callbacks = callbacks

        def fit(self, module, datamodule):
            limit = next(c for c in self.callbacks if isinstance(c, gpate_speed.StepLimit))
            timer = next(c for c in self.callbacks if isinstance(c, gpate_speed.StepTimer))
            for _ in range(limit.max_steps):
                timer.on_train_batch_start(self, module)
                timer.on_train_batch_end(self, module)

    monkeypatch.setattr(gpate_speed, "L", SimpleNamespace(Trainer=FakeTrainer))
    monkeypatch.setattr(gpate_speed, "MNISTDataModule", lambda **kwargs: None)
    monkeypatch.setattr(gpate_speed, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    args = SimpleNamespace(device="cpu", data_dir=None, latent_dim=4, teacher_channels=2, teacher_hidden=4, batch=2,
                           sigma1=600.0, sigma2=100.0, warmup=3, steps=4)
    assert gpate_speed.seconds_per_iteration(gpate_speed.GPATE, 3, args) == pytest.approx(2.5)


# ---------------------------------------------------------------------------------- canary_audit.py
canary_audit = load_benchmark_script("canary_audit")


def test_canary_audit_broken_variant_zeroes_the_noise_after_install():
    installed = []
    mechanism = SimpleNamespace(noise_multiplier=1.3)
    strategy = SimpleNamespace(mechanism=mechanism, install=lambda trainer, module: installed.append((trainer, module)))
    run = SimpleNamespace(strategy=strategy)
    canary_audit.without_noise(run)
    assert mechanism.noise_multiplier == 1.3
    run.strategy.install("trainer", "module")
    assert installed == [("trainer", "module")] and mechanism.noise_multiplier == 0.0


def test_canary_audit_audits_each_claimed_epsilon_sound_and_without_noise(tmp_path, monkeypatch, keep_threads):
    audits = []

    def fake_run_audit(config, out, trials, samples, prepare_run):
        audits.append((config["epsilon"], out.name, prepare_run, trials))
        return SimpleNamespace(to_dict=lambda: {"claimed_epsilon": config["epsilon"], "epsilon_lower": 0.1,
                                                "true_positives": 1, "false_positives": 0, "threshold": 0.5})

    monkeypatch.setattr(canary_audit, "run_audit", fake_run_audit)
    monkeypatch.setattr(sys, "argv", ["canary_audit.py", "--trials", "4", "--epsilons", "0.5", "2",
                                      "--out-dir", str(tmp_path / "out")])
    canary_audit.main()
    assert audits == [(0.5, "eps0.5_sound", None, 4), (0.5, "eps0.5_no_noise", canary_audit.without_noise, 4),
                      (2.0, "eps2_sound", None, 4), (2.0, "eps2_no_noise", canary_audit.without_noise, 4)]


def test_large_table_times_each_stage_on_the_table_it_makes(tmp_path, capsys):
    """The script's table is what its schema declares (the mode-specific encoding's width follows
    from the schema alone), the split is the datamodule's, and a figure is printed per stage."""
    script = load_benchmark_script("large_table")
    frame, schema = script.make_table(50)
    assert list(frame.columns) == [column["name"] for column in schema["columns"]]
    for column in schema["columns"]:
        if column["kind"] == "categorical":
            assert set(frame[column["name"]]) <= set(column["categories"])
        else:
            assert frame[column["name"]].between(*column["bounds"]).all()
    result = script.main(["--rows", "400"])
    assert result["rows"] == 400 and result["training_rows"] == 320  # the default test fraction, 0.2
    assert [stage["stage"] for stage in result["stages"]] == ["read and split", "DP modes and encoding (setup)"]
    assert all(stage["seconds"] >= 0 and stage["peak_mb"] > 0 for stage in result["stages"])
    printed = capsys.readouterr().out.splitlines()
    assert json.loads(printed[-1]) == result and printed[0].startswith("read and split")


def test_label_model_scale_times_an_epoch_of_both_samplers_and_of_the_label_model(capsys):
    """An epoch is int(1 / q) batches for both samplers, and the label model trains the epoch
    the figure names (its charged steps are that epoch's batches)."""
    script = load_benchmark_script("label_model_scale")
    trained = []
    real_train = script.train_dp_label_model
    script.train_dp_label_model = lambda *args, **kwargs: trained.append(real_train(*args, **kwargs))
    try:
        (result,) = script.main(["--rows", "2000", "--batch-size", "100", "--features", "3"])
    finally:
        script.train_dp_label_model = real_train
    assert result["batches"] == 20 and trained[0]["steps"] == 20
    assert all(result[key] >= 0 for key in ("opacus_sampler_s", "poisson_batches_s", "label_model_epoch_s"))
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == result
