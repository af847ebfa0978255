"""The evaluation's fixed settings and the edge cases a mutation audit found untested: each
checked against an independent value (scikit-learn fitted by hand, a hand computation)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from run_helpers import record_calls
from sklearn.model_selection import train_test_split
from sklearn.svm import LinearSVC

from lightning_dpgan.benchmark.runner import FOUR_CLASSIFIERS, with_derived_measures
from lightning_dpgan.data.schema import Column, TableSchema
from lightning_dpgan.evaluation import membership, utility
from lightning_dpgan.evaluation.fidelity import pmse, total_variation_per_column
from lightning_dpgan.evaluation.ranking import _tie_aware_agreement, feature_importance_agreement

#: the settings the module's comment documents, which the Adult goal (LR, RF, GB, MLP) and
#: DP-SACTGAN's Table 2 (ridge) are measured with
DOCUMENTED = {
    ("CLASSIFIERS", "logistic_regression"): {"max_iter": 1000},
    ("CLASSIFIERS", "random_forest"): {"n_estimators": 100},
    ("CLASSIFIERS", "bernoulli_nb"): {"binarize": 0.5},
    ("CLASSIFIERS", "adaboost"): {"n_estimators": 50},
    ("CLASSIFIERS", "bagging"): {"n_estimators": 10},
    ("CLASSIFIERS", "gradient_boosting"): {"n_estimators": 100, "max_depth": 3},
    ("CLASSIFIERS", "mlp"): {"hidden_layer_sizes": (100,), "max_iter": 300, "early_stopping": True},
    ("CLASSIFIERS", "xgboost"): {"n_estimators": 100, "max_depth": 6, "tree_method": "hist"},
    ("REGRESSORS", "ridge"): {"alpha": 1.0},
    ("REGRESSORS", "random_forest"): {"n_estimators": 100},
}


@pytest.mark.parametrize(("table", "name"), list(DOCUMENTED), ids=[f"{t}-{n}" for t, n in DOCUMENTED])
def test_each_model_has_its_documented_settings_and_takes_the_seed(table, name):
    model = getattr(utility, table)[name](7)
    params = model.get_params()
    assert {key: params[key] for key in DOCUMENTED[table, name]} == DOCUMENTED[table, name]
    if "random_state" in params and (table, name) != ("REGRESSORS", "ridge"):  # ridge's solver draws nothing
        assert params["random_state"] == 7  # a benchmark's seeds must vary the models, not only the split


def test_every_classifier_and_regressor_has_its_settings_listed_here_or_takes_the_defaults():
    listed = {name for table, name in DOCUMENTED if table == "CLASSIFIERS"}
    assert set(utility.CLASSIFIERS) - listed == {"gaussian_nb", "linear_svm", "decision_tree", "lda"}
    assert len(utility.CLASSIFIERS) == 12 and set(utility.REGRESSORS) == {"linear_regression", "ridge", "random_forest"}


def test_macro_f1_counts_the_classes_of_the_test_rows_only():
    """A class predicted but absent from the test rows is no class of the score: F1 by hand over
    classes 0 and 1 is (2/3 + 1) / 2."""
    y = np.array([0, 0, 1, 1])
    proba = np.eye(3)[[0, 2, 1, 1]]
    assert utility._multiclass_scores(y, proba)["f1"] == pytest.approx(5 / 6)


def test_the_linear_svms_multiclass_scores_are_a_distribution_that_keeps_its_decisions():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 2)) + np.repeat([[0, 0], [3, 0], [0, 3]], 30, axis=0)
    y = np.repeat([0, 1, 2], 30)
    model = utility.LinearSVMScores(random_state=0, max_iter=5000).fit(x, y)
    proba = model.predict_proba(x)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert (proba.argmax(axis=1) == LinearSVC(random_state=0, max_iter=5000).fit(x, y).predict(x)).all()


SCHEMA = TableSchema(columns=(
    Column("x", "continuous", bounds=(0.0, 1.0), source="test"),
    Column("kind", "categorical", categories=("a", "b", "c", "d"), source="test"),
    Column("y", "categorical", categories=("no", "yes"), source="test"),
), label="y", label_kind="binary")


def table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=n)
    return pd.DataFrame({"x": x, "kind": rng.choice(["a", "b", "c"], n), "y": np.where(x < 0.5, "yes", "no")})


def test_setting_c_splits_the_synthetic_table_with_the_runs_seed(monkeypatch):
    synthetic = table(50, seed=1)
    calls = record_calls(monkeypatch, utility, "classification_utility")
    utility.settings_abc(table(40, seed=2), synthetic, table(20, seed=3), SCHEMA, {"lr": utility.CLASSIFIERS[
        "logistic_regression"]}, seed=3)
    c_train, c_test = calls[2][:2]
    expected_train, expected_test = train_test_split(synthetic, test_size=0.2, random_state=3, shuffle=True,
                                                     stratify=synthetic["y"].astype(str).to_numpy())
    assert c_test.index.tolist() == expected_test.index.tolist()
    assert c_train.index.tolist() == expected_train.index.tolist()


def test_total_variation_is_half_the_summed_gaps_of_every_value():
    """Real kind a/b, synthetic c/d: every value's share differs, TV is 1 (the largest single
    gap, 0.5, understated it)."""
    real = pd.DataFrame({"x": [0.1] * 4, "kind": ["a", "a", "b", "b"], "y": ["no"] * 4})
    synthetic = real.assign(kind=["c", "c", "d", "d"])
    assert total_variation_per_column(real, synthetic, SCHEMA)["kind"] == pytest.approx(1.0)


def test_the_pmse_null_counts_the_designs_rank_not_its_columns():
    """Category 'd' is in neither table: its column is all zeros and adds no parameter, so the
    null is (k - 1)(1 - c)^2 c / N with k the rank of [1, x] (3 here: the intercept, x and one
    more category of the three held, reference-coded: 4), computed by hand."""
    real, synthetic = table(200, seed=4), table(100, seed=5)
    n, c = 300, 100 / 300
    x = pd.concat([real, synthetic])
    design = np.column_stack([np.ones(n), x["x"], *(x["kind"].eq(k).to_numpy(float) for k in ("b", "c", "d")),
                              x["y"].eq("yes").to_numpy(float)])
    k = np.linalg.matrix_rank(design)
    assert k == 5  # intercept, x, b, c and the label; d is all zeros
    assert pmse(real, synthetic, SCHEMA)["pmse_null"] == pytest.approx((k - 1) * (1 - c) ** 2 * c / n)


def test_a_feature_tied_negatively_to_the_label_ranks_by_its_strength():
    frame = table(200, seed=6)  # y = yes exactly where x < 0.5: r(x, y) strongly negative
    ranked = feature_importance_agreement(frame, frame, SCHEMA)["real"]
    by_hand = abs(np.corrcoef(frame["x"], frame["y"].eq("yes"))[0, 1])
    assert by_hand > 0.5 and ranked["x"] == pytest.approx(by_hand)


def test_values_that_differ_in_the_third_digit_are_ranked_not_tied():
    assert _tie_aware_agreement(np.array([0.300, 0.302]), np.array([0.302, 0.300])) == 0.0
    assert _tie_aware_agreement(np.array([0.3, 0.3 + 1e-12]), np.array([0.5, 0.5])) == 1.0  # rounding: a tie


def test_the_attack_measures_euclidean_distances_and_reports_their_median():
    """Member (3, 4) is 5 from the synthetic (0, 0), non-member (6, 0) is 6: the attack scores the
    member closer (AUC 1), where L1 distances (7 and 6) would reverse it."""
    result = membership.membership_inference(torch.zeros(1, 2), torch.tensor([[3.0, 4.0]]), torch.tensor([[6.0, 0.0]]))
    assert result["auc"] == 1.0 and result["median_dcr_members"] == pytest.approx(5.0)
    members = torch.tensor([[0.0], [1.0], [10.0]])
    assert membership.membership_inference(torch.zeros(1, 1), members, torch.ones(3, 1) * 2)["median_dcr_members"] == 1.0


def test_the_attack_draws_its_non_members_at_random_not_the_first_rows(monkeypatch):
    """Held-out rows sorted by a column: the first max_records of them are no random sample."""
    seen, original = [], membership.closest_record_distances
    monkeypatch.setattr(membership, "closest_record_distances",
                        lambda records, reference: seen.append(records.clone()) or original(records, reference))
    membership.membership_inference(torch.zeros(1, 1), torch.arange(100.0).unsqueeze(1) + 0.5,
                                    torch.arange(100.0).unsqueeze(1), max_records=10, seed=0)
    drawn = seen[1].squeeze(1)
    assert len(drawn) == 10 and drawn.tolist() != list(range(10)) and drawn.max() > 10


def test_the_adult_goals_figure_is_setting_bs_average_over_all_four_classifiers_or_none():
    measures = {**{f"utility/A_auroc/{name}": 0.9 for name in FOUR_CLASSIFIERS},
                **{f"utility/C_auroc/{name}": 0.6 for name in FOUR_CLASSIFIERS},
                **{f"utility/B_auroc/{name}": value for name, value in zip(FOUR_CLASSIFIERS, (0.7, 0.8, 0.7, 0.8))}}
    assert with_derived_measures(measures)["utility/B_auroc_four"] == pytest.approx(0.75)
    three = {key: value for key, value in measures.items() if key != f"utility/B_auroc/{FOUR_CLASSIFIERS[-1]}"}
    assert "utility/B_auroc_four" not in with_derived_measures(three)  # never three under the four's name
