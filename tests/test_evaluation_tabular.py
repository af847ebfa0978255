"""Tabular evaluation metrics against hand-computed values on tiny tables made here."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from run_helpers import record_calls
from sklearn import metrics
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import label_binarize
from sklearn.tree import DecisionTreeClassifier

from lightning_dpgan import evaluate as evaluate_module
from lightning_dpgan.data.schema import Column, TableSchema
from lightning_dpgan.evaluation import (
    CLASSIFIERS,
    classification_utility,
    correlation_difference,
    feature_importance_agreement,
    features_and_label,
    invented_share_per_column,
    jensen_shannon_per_column,
    pmse,
    regression_utility,
    settings_abc,
    synthetic_ranking_agreement,
    total_variation_per_column,
    utility_differences,
    wasserstein_per_column,
)
from lightning_dpgan.evaluation import membership, utility

FAST = {name: CLASSIFIERS[name] for name in ("logistic_regression", "decision_tree", "gaussian_nb")}

SCHEMA = TableSchema(
    columns=(
        Column("x1", "continuous", bounds=(0.0, 10.0), source="test"),
        Column("x2", "integer", bounds=(0, 100), source="test"),
        Column("color", "categorical", categories=("red", "green", "blue"), source="test"),
        Column("y", "categorical", categories=("no", "yes"), source="test"),
    ),
    label="y",
    label_kind="binary",
)

REGRESSION_SCHEMA = TableSchema(
    columns=(
        Column("x", "continuous", bounds=(0.0, 1.0), source="test"),
        Column("target", "continuous", bounds=(0.0, 2.0), source="test"),
    ),
    label="target",
    label_kind="continuous",
)


def make_table(n: int, seed: int, separable: bool = True, shift: float = 0.0) -> pd.DataFrame:
    """x1 uniform on [0, 10] (+ shift); y = "yes" iff x1 > 5 when separable, else a coin flip."""
    rng = np.random.default_rng(seed)
    x1 = np.clip(rng.uniform(0, 10, n) + shift, 0, 10)
    positive = x1 > 5 if separable else rng.random(n) < 0.5
    return pd.DataFrame(
        {
            "x1": x1,
            "x2": rng.integers(0, 101, n),
            "color": rng.choice(["red", "green", "blue"], n),
            "y": np.where(positive, "yes", "no"),
        }
    )


# --- ranking ------------------------------------------------------------------------------------


def test_sra_is_one_for_equal_rankings_and_zero_for_reversed() -> None:
    a = {"lr": 0.9, "rf": 0.8, "nb": 0.7, "svm": 0.6}
    assert synthetic_ranking_agreement(a, {"lr": 0.6, "rf": 0.5, "nb": 0.4, "svm": 0.3}) == 1.0
    assert synthetic_ranking_agreement(a, {"lr": 0.3, "rf": 0.4, "nb": 0.5, "svm": 0.6}) == 0.0


def test_sra_counts_agreeing_pairs_per_eq_8() -> None:
    # A ranks 1 > 2 > 3; C swaps models 2 and 3: pairs (1,2), (1,3) agree, (2,3) does not -> 4/6.
    assert synthetic_ranking_agreement([3.0, 2.0, 1.0], [3.0, 1.0, 2.0]) == pytest.approx(4 / 6)
    # a tie is not an agreement (strict inequality in Eq. 8): the pair tied in A disagrees, the other two agree
    assert synthetic_ranking_agreement([1.0, 1.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(4 / 6)


def test_sra_is_undefined_when_a_setting_has_no_score() -> None:
    # every AUROC of a setting whose test part holds one class is NaN: nothing to rank, not "all reversed"
    assert math.isnan(synthetic_ranking_agreement([0.9, 0.8, 0.7], [float("nan")] * 3))
    assert math.isnan(synthetic_ranking_agreement({"a": float("nan"), "b": 0.5}, {"a": 0.6, "b": 0.5}))


def test_sra_rejects_mismatched_models() -> None:
    with pytest.raises(ValueError):
        synthetic_ranking_agreement({"a": 1.0, "b": 2.0}, {"a": 1.0, "c": 2.0})


def test_feature_importance_agreement_of_a_copy_is_one() -> None:
    frame = make_table(300, seed=0)
    result = feature_importance_agreement(frame, frame.copy(), SCHEMA)
    assert result["agreement"] == 1.0
    assert max(result["real"], key=result["real"].get) == "x1"
    assert result["real"] == result["synthetic"]


def test_feature_importance_agreement_of_a_collapsed_table_is_undefined_not_reversed() -> None:
    """One feature row repeated with both labels: every synthetic |r| is 0, no ranking (it read
    0.0, "every ranking reversed"), as for a constant label."""
    frame = make_table(300, seed=0)
    collapsed = pd.concat([frame.iloc[:1]] * 20, ignore_index=True).assign(y=["no", "yes"] * 10)
    result = feature_importance_agreement(frame, collapsed, SCHEMA)
    assert math.isnan(result["agreement"]) and set(result["synthetic"].values()) == {0.0}


BINARY_FEATURE_SCHEMA = TableSchema(
    columns=(
        Column("x", "continuous", bounds=(0.0, 1.0), source="test"),
        Column("sex", "categorical", categories=("f", "m"), source="test"),
        Column("y", "categorical", categories=("no", "yes"), source="test"),
    ),
    label="y",
    label_kind="binary",
)


def test_feature_importance_counts_pairs_tied_in_both_tables_as_agreeing() -> None:
    """A binary column's two categories always have the same |r| with the label: tied in any
    table. Tied in both, the pair agrees (a copy scores 1); features x > sex in the real table
    and sex > x in the other disagree on the 4 ordered pairs across them."""
    rng = np.random.default_rng(0)
    x, sex = rng.random(400), rng.choice(["f", "m"], 400)
    real = pd.DataFrame({"x": x, "sex": sex, "y": np.where(x > 0.5, "yes", "no")})
    result = feature_importance_agreement(real, real.copy(), BINARY_FEATURE_SCHEMA)
    assert result["real"]["sex=f"] == pytest.approx(result["real"]["sex=m"])
    assert result["agreement"] == 1.0
    flipped = real.assign(y=np.where(sex == "m", "yes", "no"))  # the label follows sex, not x
    importances = feature_importance_agreement(real, flipped, BINARY_FEATURE_SCHEMA)
    assert importances["real"]["x"] > importances["real"]["sex=f"]  # each table's own ranking
    assert importances["synthetic"]["sex=f"] > importances["synthetic"]["x"]
    # ordered pairs: (x, sex=f), (x, sex=m) and their reverses disagree; (sex=f, sex=m) both ways agree
    assert importances["agreement"] == pytest.approx(2 / 6)


# --- fidelity -----------------------------------------------------------------------------------


def test_wasserstein_and_jsd_are_zero_on_identical_data_and_positive_otherwise() -> None:
    real = make_table(200, seed=1)
    assert wasserstein_per_column(real, real.copy(), SCHEMA) == {"x1": 0.0, "x2": 0.0}
    assert jensen_shannon_per_column(real, real.copy(), SCHEMA) == {"color": 0.0, "y": 0.0}
    other = make_table(200, seed=2, shift=3.0)
    other["color"] = "red"
    assert wasserstein_per_column(real, other, SCHEMA)["x1"] > 0.1
    assert jensen_shannon_per_column(real, other, SCHEMA)["color"] > 0.1


def test_wasserstein_is_on_bounds_scaled_values() -> None:
    # point masses at 2 and 7 on bounds (0, 10): |2 - 7| / 10 = 0.5
    a = pd.DataFrame({"x1": [2.0] * 4, "x2": [0] * 4, "color": ["red"] * 4, "y": ["no", "yes"] * 2})
    b = a.assign(x1=7.0)
    assert wasserstein_per_column(a, b, SCHEMA)["x1"] == pytest.approx(0.5)


def test_jsd_hand_computed() -> None:
    # p = (1, 0, 0), q = (0, 1, 0): disjoint supports, JS divergence (base 2) = 1
    a = pd.DataFrame({"x1": [1.0, 2.0], "x2": [0, 1], "color": ["red", "red"], "y": ["no", "yes"]})
    b = a.assign(color="green")
    assert jensen_shannon_per_column(a, b, SCHEMA)["color"] == pytest.approx(1.0)


def test_jsd_is_the_divergence_not_the_distance_on_overlapping_supports() -> None:
    # p = (1/2, 1/2, 0), q = (0, 1/2, 1/2): M = (1/4, 1/2, 1/4), KL(p || M) = KL(q || M) = 1/2 bit,
    # so the divergence is 1/2 and the distance (its square root) 0.707
    a = pd.DataFrame({"x1": [1.0] * 4, "x2": [0] * 4, "color": ["red", "red", "green", "green"], "y": ["no", "yes"] * 2})
    b = a.assign(color=["green", "green", "blue", "blue"])
    assert jensen_shannon_per_column(a, b, SCHEMA)["color"] == pytest.approx(0.5)


def test_total_variation_and_invented_share_hand_computed() -> None:
    """TV = half the L1 distance of the frequencies: colour (1/2, 1/4, 1/4) against (1/4, 1/4,
    1/2) is 0.25; x2 (integers) 0 and 1 against 1 and 7 is 0.5, and half the synthetic rows hold
    7, which no real row holds; x1 (continuous, no grid) is left out."""
    real = pd.DataFrame({"x1": [1.0, 2.0, 3.0, 4.0], "x2": [0, 0, 1, 1], "color": ["red", "red", "green", "blue"],
                         "y": ["no", "yes", "no", "yes"]})
    synthetic = real.assign(x2=[1, 1, 7, 7], color=["red", "green", "blue", "blue"])
    assert total_variation_per_column(real, real.copy(), SCHEMA) == {"x2": 0.0, "color": 0.0, "y": 0.0}
    distances = total_variation_per_column(real, synthetic, SCHEMA)
    assert distances == {"x2": pytest.approx(0.5), "color": pytest.approx(0.25), "y": 0.0}
    assert invented_share_per_column(real, synthetic, SCHEMA) == {"x2": 0.5, "color": 0.0, "y": 0.0}
    disjoint = real.assign(color="blue")
    assert total_variation_per_column(real.assign(color="red"), disjoint, SCHEMA)["color"] == pytest.approx(1.0)
    assert invented_share_per_column(real.assign(color="red"), disjoint, SCHEMA)["color"] == 1.0


def real_rows_with_a_category_outside_the_schema() -> pd.DataFrame:
    """Half the real rows' colour ("purple") is outside the schema, as a rare category a
    DP-estimated list left out; training keeps such rows with the colour blank."""
    return pd.DataFrame({"x1": [1.0, 2.0, 7.0, 8.0], "x2": [0, 1, 2, 3], "color": ["red", "red", "purple", "purple"],
                         "y": ["no", "no", "yes", "yes"]})


def test_the_measures_keep_real_rows_whose_category_is_outside_the_schema() -> None:
    """Every measure scores the rows training kept, not fewer: the purple rows are all positive,
    so leaving them out changed the task (and every utility figure) without a word."""
    real = real_rows_with_a_category_outside_the_schema()
    features, labels = features_and_label(real, SCHEMA)
    assert len(features) == 4 and labels.tolist() == [0, 0, 1, 1]
    colour = slice(2, 5)  # after x1 and x2: red, green, blue
    assert features[2:, colour].sum() == 0 and features[:2, colour].tolist() == [[1, 0, 0], [1, 0, 0]]
    # JSD counts the rows outside the schema as one more value, as TV does: (1/2, 0, 0, 1/2) against (1, 0, 0, 0)
    synthetic = real.assign(color="red")
    m = np.array([0.75, 0.25])
    expected = 0.5 * (0.5 * np.log2(0.5 / m[0]) + 0.5 * np.log2(0.5 / m[1])) + 0.5 * np.log2(1 / m[0])
    assert jensen_shannon_per_column(real, synthetic, SCHEMA)["color"] == pytest.approx(expected)
    assert total_variation_per_column(real, synthetic, SCHEMA)["color"] == pytest.approx(0.5)
    assert wasserstein_per_column(real, real.copy(), SCHEMA)["x1"] == 0.0


def test_a_real_row_whose_label_is_outside_the_classes_is_left_out_of_utility() -> None:
    schema = TableSchema(SCHEMA.columns[:3] + (Column("y", "categorical", categories=("no", "yes", "maybe")),),
                         label="y", label_kind="categorical")
    real = real_rows_with_a_category_outside_the_schema().assign(color="red", y=["no", "yes", "never", "maybe"])
    features, labels = features_and_label(real, schema)
    assert labels.tolist() == [0, 1, 2] and len(features) == 3


def test_total_variation_reads_a_stepped_column_on_its_grid() -> None:
    """Off-grid synthetic values (another tool's table) count at the nearest grid value."""
    schema = TableSchema((Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5),))
    real = pd.DataFrame({"floors": [1.0, 1.5, 2.0, 2.0]})
    assert total_variation_per_column(real, pd.DataFrame({"floors": [1.1, 1.6, 1.9, 2.1]}), schema) == {"floors": 0.0}
    assert invented_share_per_column(real, pd.DataFrame({"floors": [3.9, 2.0]}), schema) == {"floors": 0.5}


def test_correlation_difference() -> None:
    real = make_table(200, seed=3)
    assert correlation_difference(real, real.copy(), SCHEMA) == pytest.approx(0.0, abs=1e-12)
    scrambled = real.assign(y=real["y"].sample(frac=1.0, random_state=0).to_numpy())
    assert correlation_difference(real, scrambled, SCHEMA) > 0.5


def test_pmse_null_formula_and_a_different_distribution_far_above_it() -> None:
    a, b = make_table(1000, seed=4), make_table(1000, seed=5)
    same = pmse(a, b, SCHEMA, seed=0)
    # k - 1 = 5 features (x1, x2, 2 colour dummies, 1 label dummy); c = 1/2, N = 2000
    assert same["pmse_null"] == pytest.approx(5 * 0.25 * 0.5 / 2000)
    different = pmse(a, make_table(1000, seed=6, shift=4.0), SCHEMA, seed=0)
    assert different["pmse_ratio"] > 50


GAUSSIAN_SCHEMA = TableSchema(
    columns=tuple(Column(f"x{i}", "continuous", bounds=(-10.0, 10.0), source="test") for i in range(10)), label=None
)


@pytest.mark.parametrize("n_real, n_synthetic", [(600, 600), (400, 1600)])
def test_pmse_ratio_is_one_for_draws_from_the_fitted_model_and_one_over_1_minus_c_for_a_fresh_sample(
        n_real: int, n_synthetic: int) -> None:
    """Snoke et al.'s null is that of a synthesizer fitted to the real rows: draws from a
    Gaussian fitted to them average a ratio of 1. A fresh sample of the true distribution is
    farther from the real rows than that, by 1 / (1 - c) in expectation (2 at c = 1/2, 5 at c = 4/5)."""
    rng = np.random.default_rng(0)
    columns = list(GAUSSIAN_SCHEMA.names)
    fitted, fresh = [], []
    for _ in range(100):
        real = pd.DataFrame(rng.normal(0.0, 1.0, (n_real, 10)), columns=columns)
        sample = pd.DataFrame(rng.normal(0.0, 1.0, (n_synthetic, 10)), columns=columns)
        fresh.append(pmse(real, sample, GAUSSIAN_SCHEMA)["pmse_ratio"])
        drawn = rng.normal(real.mean().to_numpy(), real.std().to_numpy(), (n_synthetic, 10))
        fitted.append(pmse(real, pd.DataFrame(drawn, columns=columns), GAUSSIAN_SCHEMA)["pmse_ratio"])
    c = n_synthetic / (n_real + n_synthetic)
    assert np.mean(fitted) == pytest.approx(1.0, rel=0.2)
    assert np.mean(fresh) == pytest.approx(1 / (1 - c), rel=0.2)


# --- classification utility ---------------------------------------------------------------------


def test_features_and_label_use_the_public_schema_only() -> None:
    frame = pd.DataFrame({"x1": [5.0, 20.0], "x2": [50, 0], "color": ["blue", "red"], "y": ["yes", "no"]})
    x, y = features_and_label(frame, SCHEMA)
    np.testing.assert_allclose(x, [[0.5, 0.5, 0, 0, 1], [1.0, 0.0, 1, 0, 0]])  # 20 clipped to the bound
    np.testing.assert_array_equal(y, [1, 0])  # positive class = second category, "yes"


def test_auroc_is_one_on_separable_data_and_half_on_random_labels() -> None:
    separable = classification_utility(make_table(400, 7), make_table(200, 8), SCHEMA, FAST)
    assert separable["per_classifier"]["decision_tree"]["auroc"] > 0.97
    assert separable["average"]["auroc"] > 0.95
    random = classification_utility(
        make_table(400, 7, separable=False), make_table(400, 8, separable=False), SCHEMA, FAST
    )
    assert random["average"]["auroc"] == pytest.approx(0.5, abs=0.1)


def test_the_twelve_classifiers_are_the_papers_models() -> None:
    """PATE-GAN's appendix list, each name built as the model it names."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.ensemble import AdaBoostClassifier, BaggingClassifier, GradientBoostingClassifier, RandomForestClassifier
    from sklearn.naive_bayes import BernoulliNB, GaussianNB
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import LinearSVC
    from xgboost import XGBClassifier

    expected = {"logistic_regression": LogisticRegression, "random_forest": RandomForestClassifier,
                "gaussian_nb": GaussianNB, "bernoulli_nb": BernoulliNB, "linear_svm": LinearSVC,
                "decision_tree": DecisionTreeClassifier, "lda": LinearDiscriminantAnalysis, "adaboost": AdaBoostClassifier,
                "bagging": BaggingClassifier, "gradient_boosting": GradientBoostingClassifier, "mlp": MLPClassifier,
                "xgboost": XGBClassifier}
    assert set(CLASSIFIERS) == set(expected)
    for name, factory in CLASSIFIERS.items():
        model = factory(0)
        assert isinstance(model, expected[name]), name
        others = [kind for other, kind in expected.items() if other != name and not issubclass(expected[name], kind)]
        assert not any(isinstance(model, kind) for kind in others), name  # not also another of the twelve
    assert CLASSIFIERS["bernoulli_nb"](0).binarize == 0.5  # features in [0, 1]


def test_all_twelve_classifiers_run() -> None:
    assert len(CLASSIFIERS) == 12
    result = classification_utility(make_table(500, 9), make_table(200, 10), SCHEMA)
    assert set(result["per_classifier"]) == set(CLASSIFIERS)
    for scores in result["per_classifier"].values():
        assert scores["auroc"] > 0.8 and not scores["degenerate"]


def direct_auroc(model, train: pd.DataFrame, test: pd.DataFrame) -> float:
    """AUROC of ``model`` fitted by hand on the encoded frames, outside ``classification_utility``."""
    from sklearn.metrics import roc_auc_score

    x, y = features_and_label(train, SCHEMA)
    x_test, y_test = features_and_label(test, SCHEMA)
    model.fit(x, y)
    scores = model.decision_function(x_test) if hasattr(model, "decision_function") else model.predict_proba(x_test)[:, 1]
    return roc_auc_score(y_test, scores)


def one_positive_row() -> pd.DataFrame:
    train = make_table(200, 13)
    return pd.concat([train[train["y"] == "no"], train[train["y"] == "yes"].head(1)])


def test_linear_svm_scores_a_class_with_a_single_training_row() -> None:
    """Poor synthetic data can hold one row of a class: the SVM must still score (no
    calibration folds), and its scores keep the SVM's ranking."""
    from sklearn.svm import LinearSVC

    train, test = one_positive_row(), make_table(200, 14)
    result = classification_utility(train, test, SCHEMA, {"linear_svm": CLASSIFIERS["linear_svm"]})
    scores = result["per_classifier"]["linear_svm"]
    assert not scores["degenerate"]
    assert scores["auroc"] == pytest.approx(direct_auroc(LinearSVC(random_state=0, max_iter=5000), train, test), abs=1e-12)
    assert scores["auroc"] > 0.9  # one positive row on the right side of x1 = 5 still ranks the test rows


def full_schedule_mlp():
    """The MLP of CLASSIFIERS with early stopping off: what a too-small split must fall back to."""
    return CLASSIFIERS["mlp"](0).set_params(early_stopping=False)


def test_mlp_scores_a_class_with_a_single_training_row() -> None:
    """Its early stopping holds out a stratified tenth of the rows, impossible for a class of
    one row: it trains the full schedule instead of failing the whole evaluation."""
    train, test = one_positive_row(), make_table(200, 14)
    result = classification_utility(train, test, SCHEMA, {"mlp": CLASSIFIERS["mlp"]})
    scores = result["per_classifier"]["mlp"]
    assert not scores["degenerate"]
    assert scores["auroc"] == pytest.approx(direct_auroc(full_schedule_mlp(), train, test), abs=1e-12)


def test_mlp_scores_a_table_too_small_for_its_validation_split() -> None:
    """Ten rows (7/3): a tenth held out is one row, fewer than the two classes it must hold."""
    train = make_table(200, 13)
    train = pd.concat([train[train["y"] == "no"].head(7), train[train["y"] == "yes"].head(3)])
    test = make_table(200, 14)
    result = classification_utility(train, test, SCHEMA, {"mlp": CLASSIFIERS["mlp"]})
    scores = result["per_classifier"]["mlp"]
    assert not scores["degenerate"]
    assert scores["auroc"] == pytest.approx(direct_auroc(full_schedule_mlp(), train, test), abs=1e-12)
    assert scores["auroc"] > 0.8  # ten rows of a separable label still rank the test rows


def test_setting_c_holds_out_a_rare_class_on_both_sides() -> None:
    """Four positives in 300 synthetic rows: an unstratified 20 % split leaves none in C's test
    part for this seed (every C AUROC undefined); stratified, C is scored."""
    synthetic = make_table(600, 15)
    synthetic = pd.concat([synthetic[synthetic["y"] == "no"].head(296), synthetic[synthetic["y"] == "yes"].head(4)])
    unstratified = train_test_split(synthetic, test_size=0.2, random_state=2, shuffle=True)[1]
    assert (unstratified["y"] == "yes").sum() == 0  # what happened before the split was stratified
    result = settings_abc(make_table(300, 13), synthetic, make_table(150, 14), SCHEMA, FAST, seed=2)
    assert all(math.isfinite(scores["auroc"]) for scores in result["C"]["per_classifier"].values())


@pytest.mark.parametrize("name", ["gaussian_nb", "lda", "adaboost"])
def test_a_classifier_that_cannot_learn_from_repeated_rows_scores_as_a_constant(name) -> None:
    """A collapsed generator's table: one feature row repeated, both classes (5 "yes" of 10).
    Gaussian NB gives NaN probabilities, LDA and AdaBoost raise; each must score as a constant
    prediction (AUROC 0.5), flagged with why, not end the evaluation."""
    one_row = make_table(1, 11)
    train = pd.concat([one_row] * 10, ignore_index=True).assign(y=["yes"] * 5 + ["no"] * 5)
    test = make_table(200, 12)
    positive_rate = (test["y"] == "yes").mean()
    scores = classification_utility(train, test, SCHEMA, {name: CLASSIFIERS[name]})["per_classifier"][name]
    assert scores["degenerate"] is True and scores["degenerate_reason"] != "one label class"
    assert scores["auroc"] == 0.5 and scores["auprc"] == pytest.approx(positive_rate)
    assert scores["accuracy"] == pytest.approx(1 - positive_rate)  # a tie: the first class, "no"


@pytest.mark.parametrize("name", ["bernoulli_nb", "logistic_regression", "decision_tree", "xgboost"])
def test_a_classifier_that_predicts_the_same_for_every_row_scores_as_a_constant(name) -> None:
    """On the collapsed table these fit, and learn nothing: Bernoulli NB's probabilities differed
    by float rounding alone (5e-17), which AUROC ranked (0.414 here, not a constant's 0.5)."""
    one_row = make_table(1, 11)
    train = pd.concat([one_row] * 10, ignore_index=True).assign(y=["yes"] * 5 + ["no"] * 5)
    scores = classification_utility(train, make_table(200, 12), SCHEMA, {name: CLASSIFIERS[name]})["per_classifier"][name]
    assert scores["auroc"] == 0.5
    assert scores["degenerate_reason"] == "gave the same prediction for every test row"


def test_probabilities_apart_by_more_than_rounding_stay_a_ranking() -> None:
    """The rounding threshold is relative to the probabilities' size: 1e-20 apart from 1e-20 is a
    ranking; 0.5 apart by 5e-17 is not. A column within rounding of 1 is not flattened while its
    complement ranks: read alone, it would have turned an AUROC of 1 into 0.5."""
    tiny = np.array([[1.0, 1e-20], [1.0, 2e-20], [1.0, 3e-20]])
    kept, constant = utility._without_rounding_noise(tiny)
    assert kept[:, 1].tolist() == [1e-20, 2e-20, 3e-20] and kept[:, 0].tolist() == [1.0] * 3 and not constant
    crowded = np.array([[1e-15, 1 - 1e-15], [2e-15, 1 - 2e-15], [3e-15, 1 - 3e-15]])
    kept, constant = utility._without_rounding_noise(crowded)
    assert (kept == crowded).all() and not constant
    # 1e-15 around 0.5 is a few rounding steps (flattened); 1e-12 is thousands (kept); a pure leaf is constant
    assert utility._without_rounding_noise(np.array([[0.5, 0.5], [0.5 + 1e-15, 0.5 - 1e-15]]))[1]
    assert not utility._without_rounding_noise(np.array([[0.5, 0.5], [0.5 + 1e-12, 0.5 - 1e-12]]))[1]
    assert utility._without_rounding_noise(np.array([[1.0, 0.0]] * 3))[1]
    halves = np.array([[0.5, 0.5], [0.5 + 5e-17, 0.5 - 5e-17]])
    flat, constant = utility._without_rounding_noise(halves)
    assert np.ptp(flat, axis=0).tolist() == [0.0, 0.0] and constant


def test_a_classifier_that_fails_on_real_rows_is_an_error_not_a_score() -> None:
    """Setting A trains on real rows: a failure there is a fault to see, not a table's to score."""
    one_row = make_table(1, 11)
    train = pd.concat([one_row] * 10, ignore_index=True).assign(y=["yes"] * 5 + ["no"] * 5)
    with pytest.raises(Exception):
        classification_utility(train, make_table(200, 12), SCHEMA, {"lda": CLASSIFIERS["lda"]}, synthetic=False)


def test_a_classifier_that_learns_is_not_flagged() -> None:
    scores = classification_utility(make_table(200, 11), make_table(200, 12), SCHEMA, FAST)["per_classifier"]
    assert all(not s["degenerate"] and s["degenerate_reason"] is None for s in scores.values())


def noisy_table(n: int, seed: int) -> pd.DataFrame:
    """y = "yes" iff x1 plus noise passes 5: a classifier ranks rows imperfectly."""
    frame = make_table(n, seed)
    noise = np.random.default_rng(seed + 100).normal(0, 2.5, n)
    return frame.assign(y=np.where(frame["x1"] + noise > 5, "yes", "no"))


def test_binary_scores_are_the_library_metrics_of_the_fitted_probabilities() -> None:
    """On rows a model ranks imperfectly, each figure is scikit-learn's on the class-1 probability
    (AUROC, AUPRC) or the predicted class (accuracy, F1 of class 1): an AUPRC of hard predictions
    matches on separable rows only."""
    train, test = noisy_table(400, 21), noisy_table(300, 22)
    scores = classification_utility(train, test, SCHEMA, {"lr": CLASSIFIERS["logistic_regression"]})["per_classifier"]["lr"]
    x, y = features_and_label(train, SCHEMA)
    x_test, y_test = features_and_label(test, SCHEMA)
    proba = LogisticRegression(max_iter=1000, random_state=0).fit(x, y).predict_proba(x_test)
    assert 0.6 < roc_auc_score(y_test, proba[:, 1]) < 0.95  # imperfect, as the test needs
    assert scores["auroc"] == pytest.approx(roc_auc_score(y_test, proba[:, 1]), abs=1e-12)
    assert scores["auprc"] == pytest.approx(average_precision_score(y_test, proba[:, 1]), abs=1e-12)
    assert scores["accuracy"] == pytest.approx(metrics.accuracy_score(y_test, proba.argmax(axis=1)), abs=1e-12)
    assert scores["f1"] == pytest.approx(metrics.f1_score(y_test, proba.argmax(axis=1)), abs=1e-12)


def test_a_training_frame_of_the_positive_class_alone_predicts_it_for_every_row() -> None:
    """The constant prediction takes the training frame's class shares: all "yes" rows predict
    "yes", so accuracy is the positive rate and F1 is 2p / (1 + p)."""
    train = make_table(100, 11).assign(y="yes")
    test = make_table(200, 12)
    positive_rate = (test["y"] == "yes").mean()
    for scores in classification_utility(train, test, SCHEMA, FAST)["per_classifier"].values():
        assert scores["degenerate_reason"] == "one label class"
        assert scores["accuracy"] == pytest.approx(positive_rate)
        assert scores["f1"] == pytest.approx(2 * positive_rate / (1 + positive_rate))


def test_single_class_training_frame_is_degenerate() -> None:
    train = make_table(100, 11).assign(y="no")
    test = make_table(200, 12)
    positive_rate = (test["y"] == "yes").mean()
    result = classification_utility(train, test, SCHEMA, FAST)
    for scores in result["per_classifier"].values():
        assert scores["degenerate"] is True and scores["degenerate_reason"] == "one label class"
        assert scores["auroc"] == 0.5
        assert scores["auprc"] == pytest.approx(positive_rate)
        assert scores["accuracy"] == pytest.approx(1 - positive_rate)
        assert scores["f1"] == 0.0


def test_setting_b_with_a_copy_of_the_real_training_data_equals_setting_a() -> None:
    real_train, real_test = make_table(300, 13), make_table(150, 14)
    result = settings_abc(real_train, real_train.copy(), real_test, SCHEMA, FAST, seed=0)
    assert result["B"] == result["A"]
    assert set(result["C"]["per_classifier"]) == set(FAST)


def test_settings_train_and_test_on_the_frames_the_paper_names(monkeypatch) -> None:
    """A: real train -> real test; B: all synthetic rows -> real test; C: 80 % of the synthetic
    rows -> the other, disjoint 20 %. The synthetic rows invert the real label rule, so a
    setting that tests on real rows scores near 0 after synthetic training and one that tests on
    synthetic rows near 1: B must be the former and C the latter."""
    from lightning_dpgan.evaluation import utility

    calls = []
    original = utility.classification_utility
    monkeypatch.setattr(utility, "classification_utility", lambda train, test, *args, **kwargs:
                        calls.append((train, test)) or original(train, test, *args, **kwargs))
    real_train, real_test = make_table(400, 13), make_table(300, 14)
    synthetic = make_table(1000, 15)
    synthetic["y"] = np.where(synthetic["y"] == "yes", "no", "yes")
    result = settings_abc(real_train, synthetic, real_test, SCHEMA, FAST, seed=0)
    (a_train, a_test), (b_train, b_test), (c_train, c_test) = calls
    assert a_train is real_train and a_test is real_test
    assert b_train is synthetic and b_test is real_test
    assert (len(c_train), len(c_test)) == (800, 200)
    assert set(c_train.index).isdisjoint(c_test.index) and set(c_train.index) | set(c_test.index) == set(synthetic.index)
    assert result["A"]["average"]["auroc"] > 0.95
    assert result["B"]["average"]["auroc"] < 0.05
    assert result["C"]["average"]["auroc"] > 0.95


# --- regression utility -------------------------------------------------------------------------


def regression_table(n: int, seed: int, noise: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    return pd.DataFrame({"x": x, "target": np.clip(2 * x + noise * rng.normal(size=n), 0, 2)})


def test_regression_r2_of_a_perfect_linear_relation_is_one() -> None:
    result = regression_utility(regression_table(200, 0), regression_table(100, 1), REGRESSION_SCHEMA)
    linear = result["per_regressor"]["linear_regression"]
    assert linear["r2"] == pytest.approx(1.0, abs=1e-9)
    assert linear["explained_variance"] == pytest.approx(1.0, abs=1e-9)
    assert linear["mae"] == pytest.approx(0.0, abs=1e-9)
    assert result["per_regressor"]["random_forest"]["r2"] > 0.95


def test_regression_scores_are_the_library_metrics_of_an_imperfect_fit() -> None:
    """R² and explained variance are not symmetric in their arguments: the truth goes first."""
    train, test = regression_table(300, 4, noise=0.4), regression_table(200, 5, noise=0.4)
    linear = regression_utility(train, test, REGRESSION_SCHEMA)["per_regressor"]["linear_regression"]
    x, y = features_and_label(train, REGRESSION_SCHEMA)
    x_test, y_test = features_and_label(test, REGRESSION_SCHEMA)
    predicted = LinearRegression().fit(x, y).predict(x_test)
    assert abs(metrics.r2_score(y_test, predicted) - metrics.r2_score(predicted, y_test)) > 0.05
    assert linear["r2"] == pytest.approx(metrics.r2_score(y_test, predicted), abs=1e-12)
    assert linear["explained_variance"] == pytest.approx(metrics.explained_variance_score(y_test, predicted), abs=1e-12)
    assert linear["mae"] == pytest.approx(metrics.mean_absolute_error(y_test, predicted), abs=1e-12)


def test_regression_scores_a_target_scaled_and_clipped_by_its_public_bounds() -> None:
    """MAE is a fraction of the target's public range (0, 2): a mean predictor's raw error is
    halved, and a test target past the upper bound is scored as the bound itself."""
    from sklearn.dummy import DummyRegressor

    train = pd.DataFrame({"x": [0.1, 0.5, 0.9, 0.3], "target": [0.2, 1.0, 1.8, 0.6]})  # mean 0.9
    test = pd.DataFrame({"x": [0.2, 0.7, 0.4], "target": [0.4, 1.4, 3.0]})  # 3.0 is scored as 2.0
    result = regression_utility(train, test, REGRESSION_SCHEMA, regressors={"mean": lambda seed: DummyRegressor()})
    raw_error = np.mean(np.abs(np.array([0.4, 1.4, 2.0]) - 0.9))
    assert result["per_regressor"]["mean"]["mae"] == pytest.approx(raw_error / 2, abs=1e-6)  # float32 encoding


def test_utility_differences_are_real_minus_synthetic() -> None:
    test = regression_table(100, 2)
    real = regression_utility(regression_table(200, 3), test, REGRESSION_SCHEMA)
    synthetic = regression_utility(regression_table(200, 4, noise=0.5), test, REGRESSION_SCHEMA)
    differences = utility_differences(real, synthetic)
    ridge = differences["per_regressor"]["ridge"]
    assert ridge["r2"] > 0 and ridge["explained_variance"] > 0  # synthetic does worse: positive
    assert ridge["mae"] < 0  # error metric: synthetic worse -> negative
    expected = real["average"]["r2"] - synthetic["average"]["r2"]
    assert differences["average"]["r2"] == pytest.approx(expected)


def test_utility_differences_skip_flags() -> None:
    real = {"per_classifier": {"lr": {"auroc": 0.9, "degenerate": False}}, "average": {"auroc": 0.9}}
    synthetic = {"per_classifier": {"lr": {"auroc": 0.7, "degenerate": True}}, "average": {"auroc": 0.7}}
    differences = utility_differences(real, synthetic)
    assert differences["per_classifier"]["lr"] == {"auroc": pytest.approx(0.2)}
    assert math.isclose(differences["average"]["auroc"], 0.2)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_parallel_ensembles_take_the_processs_thread_count(monkeypatch, threads) -> None:
    """A benchmark cell run beside others gets one thread (OMP_NUM_THREADS, which torch follows):
    its random forests, bagging and XGBoost must not start more than that."""
    import torch

    from lightning_dpgan.evaluation.utility import REGRESSORS

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    ensembles = [CLASSIFIERS[name](0) for name in ("random_forest", "bagging", "xgboost")] + [REGRESSORS["random_forest"](0)]
    assert [model.get_params()["n_jobs"] for model in ensembles] == [threads] * 4


def test_a_numeric_column_with_more_grid_values_than_the_cap_is_left_to_wasserstein() -> None:
    """Adult's fnlwgt has 2,000,000 integer values: two real samples differ on nearly every row,
    so its total variation is sampling noise (0.70 between Adult's own splits), not fidelity."""
    from lightning_dpgan.evaluation.fidelity import MAX_FEW_VALUES

    schema = TableSchema((Column("weight", "integer", bounds=(1, 2_000_000)),
                          Column("hours", "integer", bounds=(1, MAX_FEW_VALUES))))
    rng = np.random.default_rng(0)
    real = pd.DataFrame({"weight": rng.integers(1, 2_000_000, 500), "hours": rng.integers(1, 99, 500)})
    other_real_sample = pd.DataFrame({"weight": rng.integers(1, 2_000_000, 500), "hours": rng.integers(1, 99, 500)})
    assert set(total_variation_per_column(real, other_real_sample, schema)) == {"hours"}
    assert set(invented_share_per_column(real, other_real_sample, schema)) == {"hours"}
    assert set(wasserstein_per_column(real, other_real_sample, schema)) == {"weight", "hours"}


# --- what the averages, the multiclass scores and a dev evaluation are computed from (mutation audit) ---


TWO_COLUMNS = TableSchema((Column("a", "continuous", bounds=(0.0, 1.0), source="test"),
                           Column("b", "continuous", bounds=(0.0, 1.0), source="test")), label=None)


def test_a_feature_constant_in_one_table_keeps_its_diagonal():
    real = pd.DataFrame({"a": [0.0, 1.0, 0.0, 1.0], "b": [0.0, 1.0, 1.0, 0.0]})  # corr(a, b) = 0: identity
    flat = real.assign(b=0.5)  # b constant: correlation 0 with a by the documented rule, 1 with itself
    assert correlation_difference(real, flat, TWO_COLUMNS) == pytest.approx(0.0, abs=1e-12)


def test_correlation_difference_is_the_frobenius_norm():
    real = pd.DataFrame({"a": [0.0, 1.0, 0.0, 1.0], "b": [0.0, 1.0, 0.0, 1.0]})  # [[1, 1], [1, 1]]
    other = pd.DataFrame({"a": [0.0, 1.0, 0.0, 1.0], "b": [0.0, 1.0, 1.0, 0.0]})  # identity
    assert correlation_difference(real, other, TWO_COLUMNS) == pytest.approx(math.sqrt(2), abs=1e-12)


def test_correlation_difference_is_pearsons_not_a_rank_correlations():
    """On a table where the two differ (one outlier): Spearman's rho is 1 here, Pearson's r is not."""
    a = np.array([0.01, 0.02, 0.03, 0.04, 1.0])
    b = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    real = pd.DataFrame({"a": a, "b": b})
    other = pd.DataFrame({"a": a, "b": b[::-1].copy()})
    r_real, r_other = np.corrcoef(a, b)[0, 1], np.corrcoef(a, b[::-1])[0, 1]
    assert correlation_difference(real, other, TWO_COLUMNS) == pytest.approx(math.sqrt(2) * abs(r_real - r_other), abs=1e-6)
    assert abs(r_real) < 0.9  # the rank correlations would be +1 and -1: a difference of 2 sqrt(2)


def noisy_labels(n, seed):
    """make_table's rows with a quarter of the labels flipped: classifiers that score differently."""
    frame = make_table(n, seed)
    rng = np.random.default_rng(seed + 100)
    flip = rng.random(n) < 0.25
    frame.loc[flip, "y"] = np.where(frame.loc[flip, "y"] == "yes", "no", "yes")
    return frame


def test_the_average_is_over_every_classifier():
    five = FAST | {name: CLASSIFIERS[name] for name in ("bernoulli_nb", "lda")}  # more than the paper's four
    result = classification_utility(noisy_labels(400, 1), noisy_labels(300, 2), SCHEMA, five)
    for metric in ("auroc", "auprc", "accuracy", "f1"):
        values = [result["per_classifier"][name][metric] for name in five]
        assert result["average"][metric] == pytest.approx(float(np.mean(values)), abs=1e-12), metric


MULTI = TableSchema((Column("x1", "continuous", bounds=(0.0, 10.0), source="test"),
                     Column("y", "categorical", categories=("a", "b", "c"), source="test")),
                    label="y", label_kind="categorical")


def multi_table(n, seed, cuts=(3, 7), flip_rate=0.3):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 10, n)
    y = np.select([x1 < cuts[0], x1 < cuts[1]], ["a", "b"], "c")
    flip = rng.random(n) < flip_rate
    y[flip] = rng.choice(["a", "b", "c"], flip.sum())
    return pd.DataFrame({"x1": x1, "y": y})


def test_multiclass_auroc_and_auprc_are_one_vs_rest_macro_averages():
    train, test = multi_table(400, 1), multi_table(300, 2)
    result = classification_utility(train, test, MULTI, {"lr": CLASSIFIERS["logistic_regression"]})["per_classifier"]["lr"]
    x, y = features_and_label(train, MULTI)
    x_test, y_test = features_and_label(test, MULTI)
    proba = LogisticRegression(max_iter=1000, random_state=0).fit(x, y).predict_proba(x_test)
    assert result["auroc"] == pytest.approx(roc_auc_score(y_test, proba, multi_class="ovr", average="macro"), abs=1e-12)
    assert result["auprc"] == pytest.approx(
        average_precision_score(label_binarize(y_test, classes=[0, 1, 2]), proba, average="macro"), abs=1e-12)


def test_multiclass_f1_is_the_macro_average_over_classes():
    """On imbalanced classes (about 15 / 65 / 20 %), each predicted, macro F1 differs from micro
    F1, which is the accuracy."""
    train, test = (multi_table(n, seed, cuts=(1.5, 8), flip_rate=0.1) for n, seed in ((400, 1), (300, 2)))
    result = classification_utility(train, test, MULTI, {"lr": CLASSIFIERS["logistic_regression"]})["per_classifier"]["lr"]
    x, y = features_and_label(train, MULTI)
    x_test, y_test = features_and_label(test, MULTI)
    predicted = LogisticRegression(max_iter=1000, random_state=0).fit(x, y).predict_proba(x_test).argmax(axis=1)
    assert set(predicted) == {0, 1, 2}
    macro, accuracy = metrics.f1_score(y_test, predicted, average="macro"), metrics.accuracy_score(y_test, predicted)
    assert abs(macro - accuracy) > 0.03
    assert result["f1"] == pytest.approx(macro, abs=1e-12) and result["accuracy"] == pytest.approx(accuracy, abs=1e-12)


class NoTestSplit:
    """A datamodule stand-in whose test split must not be read (a dev-split evaluation)."""

    def __init__(self, schema, train):
        self.schema, self.train_frame = schema, train

    @property
    def test_frame(self):
        raise AssertionError("the test split was read during a dev evaluation")


def test_a_dev_evaluation_of_a_classification_table_reads_no_test_row(monkeypatch):
    monkeypatch.setattr(utility, "CLASSIFIERS", FAST)
    attacked = record_calls(monkeypatch, membership, "membership_inference")
    train, dev, synthetic = make_table(300, 1), make_table(100, 2), make_table(300, 3)
    results = evaluate_module.evaluate_table(NoTestSplit(SCHEMA, train), synthetic, held_out=dev)
    released, members, non_members = attacked[0]
    assert torch.equal(members, SCHEMA.encode(train)[0]) and torch.equal(non_members, SCHEMA.encode(dev)[0])
    assert torch.equal(released, SCHEMA.encode(synthetic)[0])
    assert results["fidelity/pmse"] == pmse(train, synthetic, SCHEMA)["pmse"]
    assert results["fidelity/correlation_difference"] == correlation_difference(train, synthetic, SCHEMA)


def test_a_dev_evaluation_of_a_regression_table_reads_no_test_row(monkeypatch):
    attacked = record_calls(monkeypatch, membership, "membership_inference")
    train, dev, synthetic = regression_table(200, 1), regression_table(80, 2), regression_table(200, 3, noise=0.3)
    results = evaluate_module.evaluate_table(NoTestSplit(REGRESSION_SCHEMA, train), synthetic, held_out=dev)
    assert results["utility/real_r2"] == regression_utility(train, dev, REGRESSION_SCHEMA)["average"]["r2"]
    assert results["utility/synthetic_r2"] == regression_utility(synthetic, dev, REGRESSION_SCHEMA)["average"]["r2"]
    _, members, non_members = attacked[0]
    assert torch.equal(members, REGRESSION_SCHEMA.encode(train)[0])
    assert torch.equal(non_members, REGRESSION_SCHEMA.encode(dev)[0])


def canned_settings(monkeypatch, **aurocs):
    """``settings_abc`` replaced by fixed results: per setting, each classifier's AUROC as given
    (its AUPRC half of it, accuracy and F1 equal to it) and their averages."""
    def canned(scores):
        per = {name: {"auroc": s, "auprc": s / 2, "accuracy": s, "f1": s, "degenerate": False} for name, s in scores.items()}
        average = {m: float(np.mean([p[m] for p in per.values()])) for m in ("auroc", "auprc", "accuracy", "f1")}
        return {"per_classifier": per, "average": average}

    monkeypatch.setattr(utility, "settings_abc", lambda *args, **kwargs: {k: canned(v) for k, v in aurocs.items()})


def test_the_reported_sra_ranks_setting_a_against_setting_c(monkeypatch):
    a, c = {"lr": 0.9, "dt": 0.8, "nb": 0.7}, {"lr": 0.4, "dt": 0.6, "nb": 0.5}  # only dt > nb agrees
    b = {"lr": 0.1, "dt": 0.2, "nb": 0.3}  # the reverse of A
    canned_settings(monkeypatch, A=a, B=b, C=c)
    train = make_table(200, 1)
    results = evaluate_module.evaluate_table(NoTestSplit(SCHEMA, train), make_table(200, 3), held_out=make_table(100, 2))
    assert results["utility/sra"] == pytest.approx(1 / 3)  # A against A would be 1, A against B 0


def test_the_reported_per_classifier_scores_and_differences_are_each_settings_own(monkeypatch):
    canned_settings(monkeypatch, A={"lr": 0.9, "dt": 0.8}, B={"lr": 0.7, "dt": 0.5}, C={"lr": 0.6, "dt": 0.4})
    results = evaluate_module.evaluate_table(NoTestSplit(SCHEMA, make_table(200, 1)), make_table(200, 3),
                                             held_out=make_table(100, 2))
    assert results["utility/A_auroc/dt"] == 0.8 and results["utility/C_auprc/lr"] == 0.3
    assert results["utility/B_auroc/lr"] == 0.7
    assert results["utility/difference_auroc"] == pytest.approx(0.85 - 0.6)  # A minus B, averaged
    assert results["utility/difference_auprc"] == pytest.approx((0.85 - 0.6) / 2)


def test_the_reported_regression_scores_are_also_per_regressor():
    train, dev, synthetic = regression_table(200, 1), regression_table(80, 2), regression_table(200, 3, noise=0.3)
    results = evaluate_module.evaluate_table(NoTestSplit(REGRESSION_SCHEMA, train), synthetic, held_out=dev)
    real = regression_utility(train, dev, REGRESSION_SCHEMA)["per_regressor"]
    synthetic_scores = regression_utility(synthetic, dev, REGRESSION_SCHEMA)["per_regressor"]
    assert set(real) == {name.split("/")[2] for name in results if name.startswith("utility/real_r2/")}
    for regressor in real:
        for metric in ("mae", "explained_variance", "r2"):
            assert results[f"utility/real_{metric}/{regressor}"] == real[regressor][metric]
            assert results[f"utility/synthetic_{metric}/{regressor}"] == synthetic_scores[regressor][metric]
            assert results[f"utility/difference_{metric}/{regressor}"] == pytest.approx(
                real[regressor][metric] - synthetic_scores[regressor][metric])


def test_the_reported_feature_agreement_and_per_column_fidelity_are_the_library_measures(monkeypatch):
    monkeypatch.setattr(utility, "CLASSIFIERS", FAST)
    train, dev = make_table(300, 1), make_table(100, 2)
    unrelated = make_table(300, 3)
    unrelated["y"] = np.where(unrelated["x2"] > 50, "yes", "no")  # y follows x2, not x1: the ranking changes
    results = evaluate_module.evaluate_table(NoTestSplit(SCHEMA, train), unrelated, held_out=dev)
    assert results["utility/feature_agreement"] == feature_importance_agreement(train, unrelated, SCHEMA)["agreement"] < 1.0
    copied = evaluate_module.evaluate_table(NoTestSplit(SCHEMA, train), train.copy(), held_out=dev)
    assert copied["utility/feature_agreement"] == 1.0
    assert results["fidelity/wasserstein/x2"] == wasserstein_per_column(train, unrelated, SCHEMA)["x2"]
    assert results["fidelity/jsd/color"] == jensen_shannon_per_column(train, unrelated, SCHEMA)["color"]
    assert results["fidelity/jsd/y"] == jensen_shannon_per_column(train, unrelated, SCHEMA)["y"]
    tree = pmse(train, unrelated, SCHEMA, model="cart")
    assert results["fidelity/pmse_cart"] == tree["pmse"] and results["fidelity/pmse_cart_ratio"] == tree["pmse_ratio"]


def test_a_multiclass_table_reports_no_feature_agreement(monkeypatch):
    """Pearson r with a class index has no meaning for three or more unordered classes."""
    monkeypatch.setattr(utility, "CLASSIFIERS", FAST)
    results = evaluate_module.evaluate_table(NoTestSplit(MULTI, multi_table(300, 1)), multi_table(300, 3),
                                             held_out=multi_table(100, 2))
    assert "utility/feature_agreement" not in results and "utility/sra" in results


def test_the_tree_pmse_ratio_is_one_for_a_fresh_sample_and_sees_a_lost_dependence_the_logistic_one_misses():
    """The CART null is a permutation null (two exchangeable samples): a fresh sample of the real
    distribution averages a ratio of 1. A table with the real marginals whose label no longer
    follows x1 differs only jointly: the main-effects logistic model stays at its fresh-sample
    level (1 / (1 - c) = 2), the tree sees it."""
    fresh, lost_tree, lost_logistic = [], [], []
    for seed in range(5):
        real = make_table(1000, 10 + seed)
        fresh.append(pmse(real, make_table(1000, 20 + seed), SCHEMA, model="cart", seed=seed)["pmse_ratio"])
        unrelated = make_table(1000, 30 + seed, separable=False)
        lost_tree.append(pmse(real, unrelated, SCHEMA, model="cart", seed=seed)["pmse_ratio"])
        lost_logistic.append(pmse(real, unrelated, SCHEMA, seed=seed)["pmse_ratio"])
    assert np.mean(fresh) == pytest.approx(1.0, abs=0.2)
    assert np.mean(lost_tree) > 3 and np.mean(lost_logistic) < 3


def test_the_tree_pmse_null_is_the_mean_over_relabellings_and_bad_settings_are_refused():
    a, b = make_table(300, 1), make_table(300, 2, shift=3.0)
    three = pmse(a, b, SCHEMA, model="cart", permutations=3, seed=7)
    x = np.vstack([SCHEMA.encode(a)[0].numpy(), SCHEMA.encode(b)[0].numpy()]).astype(np.float64)
    t = np.r_[np.zeros(300), np.ones(300)]

    def tree_pmse(labels):
        tree = DecisionTreeClassifier(max_leaf_nodes=32, min_samples_leaf=5, random_state=7).fit(x, labels)
        return np.mean((tree.predict_proba(x)[:, 1] - 0.5) ** 2)

    rng = np.random.default_rng(7)
    assert three["pmse"] == pytest.approx(tree_pmse(t))
    assert three["pmse_null"] == pytest.approx(np.mean([tree_pmse(rng.permutation(t)) for _ in range(3)]))
    assert three["pmse_ratio"] == pytest.approx(tree_pmse(t) / three["pmse_null"]) and three["pmse_ratio"] > 1.5
    with pytest.raises(ValueError, match="at least one permutation"):
        pmse(a, b, SCHEMA, model="cart", permutations=0)
    with pytest.raises(ValueError, match="'logistic' or 'cart'"):
        pmse(a, b, SCHEMA, model="forest")


def test_feature_agreement_is_undefined_where_a_label_is_constant():
    """Every |r| is 0 against a constant label: no ranking, rather than 0 ("all reversed")."""
    real = make_table(200, 1)
    one_class = real.assign(y="no")
    assert math.isnan(feature_importance_agreement(real, one_class, SCHEMA)["agreement"])
    assert math.isnan(feature_importance_agreement(one_class, real, SCHEMA)["agreement"])


def test_a_setting_whose_scores_are_all_tied_ranks_nothing():
    """Every classifier of C trained on one class scores 0.5: no ranking, so no agreement (not 0,
    which would read as every ranking reversed)."""
    assert math.isnan(synthetic_ranking_agreement([0.9, 0.8, 0.7], [0.5, 0.5, 0.5]))
    assert math.isnan(synthetic_ranking_agreement([0.6, 0.6, 0.6], [0.9, 0.8, 0.7]))
    assert synthetic_ranking_agreement([0.9, 0.8, 0.7], [0.6, 0.5, 0.5]) == pytest.approx(4 / 6)  # the tied pair disagrees


def test_a_synthetic_table_of_one_row_is_scored_with_setting_c_undefined(monkeypatch):
    monkeypatch.setattr(utility, "CLASSIFIERS", FAST)
    results = evaluate_module.evaluate_table(NoTestSplit(SCHEMA, make_table(200, 1)), make_table(1, 3),
                                             held_out=make_table(100, 2))
    assert results["synthetic_records"] == 1 and math.isnan(results["utility/sra"])
    assert math.isnan(results["utility/C_auroc"]) and results["utility/B_auroc"] == 0.5
    result = settings_abc(make_table(200, 1), make_table(1, 3), make_table(100, 2), SCHEMA, FAST)
    assert all(math.isnan(scores["auroc"]) for scores in result["C"]["per_classifier"].values())
    assert math.isnan(result["C"]["average"]["auroc"])
    assert all(scores["degenerate"] for scores in result["B"]["per_classifier"].values())  # one class to learn
    assert result["A"]["average"]["auroc"] > 0.8


def test_a_synthetic_table_with_an_infinite_value_is_refused_before_any_measure(monkeypatch):
    attacked = record_calls(monkeypatch, membership, "membership_inference")
    synthetic = make_table(300, 3)
    synthetic.loc[synthetic.index[7], "x1"] = -np.inf  # clipped to the lower bound, it would pass for 0
    with pytest.raises(ValueError, match=r"cannot be scored: column 'x1' holds infinite values \(1 row: -inf \(data row 8\)\)"):
        evaluate_module.evaluate_table(NoTestSplit(SCHEMA, make_table(300, 1)), synthetic, held_out=make_table(100, 2))
    assert not attacked


def test_a_synthetic_category_outside_the_schema_is_refused_before_any_measure(monkeypatch):
    monkeypatch.setattr(utility, "CLASSIFIERS", FAST)
    attacked = record_calls(monkeypatch, membership, "membership_inference")
    synthetic = make_table(300, 3)
    synthetic.loc[synthetic.index[:150], "color"] = "purple"
    with pytest.raises(ValueError, match=r"cannot be scored: values outside the schema's categories .*'color': 150"):
        evaluate_module.evaluate_table(NoTestSplit(SCHEMA, make_table(300, 1)), synthetic, held_out=make_table(100, 2))
    assert not attacked


@pytest.mark.parametrize("damage,problem", [
    (lambda table: table.assign(x2=table["x2"].astype(float) + 0.5), "column 'x2' is integer but 300 rows hold fractional"),
    (lambda table: table.assign(x1=["abc"] + list(table["x1"][1:])), "column 'x1' is continuous but holds non-numeric"),
    (lambda table: table.assign(y=["maybe"] + list(table["y"][1:])), "the label 'y' must be binary"),
], ids=["fraction-in-integer", "text-in-numeric", "third-label-class"])
def test_a_damaged_synthetic_table_is_told_to_be_written_again_not_the_schema_changed(damage, problem):
    """The data's remedies ("declare the column continuous in the schema") would change a
    finished run: a synthetic table that train did not write is to be sampled again."""
    with pytest.raises(ValueError) as refused:
        evaluate_module.evaluate_table(NoTestSplit(SCHEMA, make_table(300, 1)), damage(make_table(300, 3)),
                                       held_out=make_table(100, 2))
    message = str(refused.value)
    assert problem in message and "write it again with python -m lightning_dpgan sample" in message
    assert "declare" not in message and "schema file" not in message
    run = Path("/runs/adult")  # a run's table: its own paths in the command, not RUN placeholders
    with pytest.raises(ValueError) as refused:
        evaluate_module.evaluate_table(NoTestSplit(SCHEMA, make_table(300, 1)), damage(make_table(300, 3)),
                                       held_out=make_table(100, 2), source=run / "synthetic.csv")
    assert (f"sample --checkpoint {run / 'checkpoints' / 'last.ckpt'} -n N --out {run / 'synthetic.csv'} "
            "--overwrite") in str(refused.value) and "RUN" not in str(refused.value)


def test_synthetic_values_outside_the_bounds_are_scored_clipped_and_said(capsys):
    """train never writes them: a table made elsewhere, or edited. A synthetic x1 of 500 (bounds
    0 to 10) used to be scored as 10 without a word."""
    synthetic = make_table(300, 3)
    synthetic.loc[synthetic.index[:4], "x1"] = 500.0
    evaluate_module.refuse_unencodable(synthetic, SCHEMA)
    assert "values outside the schema's bounds (per column: {'x1': 4})" in capsys.readouterr().err
    evaluate_module.refuse_unencodable(make_table(300, 3), SCHEMA)
    assert "bounds" not in capsys.readouterr().err


def test_a_synthetic_table_missing_a_class_scores_each_probability_as_its_own_class():
    """Trained on classes b and c only, the classifier's two probability columns are b's and
    c's: placed in a's and b's, every prediction would name the wrong class."""
    x1 = np.linspace(3, 10, 200)
    train = pd.DataFrame({"x1": x1, "y": np.where(x1 < 7, "b", "c")})
    test = multi_table(300, 2, flip_rate=0)
    test = test[(test["x1"] < 6.9) | (test["x1"] > 7.1)]  # clear of where the tree may put its cut
    result = classification_utility(train, test, MULTI, {"dt": CLASSIFIERS["decision_tree"]})["per_classifier"]["dt"]
    x_test, y_test = features_and_label(test, MULTI)
    expected = metrics.accuracy_score(y_test, np.where(test["x1"] < 7, 1, 2))
    assert result["accuracy"] == pytest.approx(expected) and expected > 0.6


def test_setting_a_refuses_a_classifier_that_fails_on_real_rows_where_b_would_score_it_degenerate():
    """Setting A trains on real rows: non-finite probabilities there (Gaussian NB on ten copies
    of a row) are an error, while a synthetic table's are scored as a constant prediction."""
    one_row = make_table(1, 11)
    train = pd.concat([one_row] * 10, ignore_index=True).assign(y=["yes"] * 5 + ["no"] * 5)
    nb = {"gaussian_nb": CLASSIFIERS["gaussian_nb"]}
    with pytest.raises(ValueError, match="non-finite probabilities on real training rows"):
        classification_utility(train, make_table(200, 12), SCHEMA, nb, synthetic=False)
    with pytest.raises(ValueError, match="non-finite probabilities on real training rows"):
        settings_abc(train, make_table(200, 1), make_table(100, 2), SCHEMA, nb)
    scored = classification_utility(train, make_table(200, 12), SCHEMA, nb, synthetic=True)["per_classifier"]
    assert scored["gaussian_nb"]["degenerate"]


def test_synthetic_ranking_agreement_pairs_the_classifiers_by_name_not_by_order():
    assert synthetic_ranking_agreement({"lr": 0.9, "rf": 0.8, "nb": 0.7}, {"nb": 0.5, "rf": 0.6, "lr": 0.7}) == 1.0


def test_feature_importance_agreement_refuses_a_label_of_more_than_two_classes():
    with pytest.raises(ValueError, match="binary or continuous"):
        feature_importance_agreement(multi_table(100, 1), multi_table(100, 2), MULTI)


def test_membership_inference_measures_both_groups_to_the_synthetic_records():
    """By hand: members at distances 0 and 10 from the one synthetic record, non-members at 11
    and 1; the attack (closer = member) orders 3 of the 4 member/non-member pairs right."""
    result = membership.membership_inference(torch.tensor([[0.0]]), torch.tensor([[0.0], [10.0]]),
                                             torch.tensor([[11.0], [1.0]]))
    assert result["auc"] == 0.75
    assert (result["median_dcr_members"], result["median_dcr_non_members"]) == (5.0, 6.0)
    capped = membership.membership_inference(torch.randn(40, 3), torch.randn(50, 3), torch.randn(30, 3), max_records=10)
    assert capped["records_per_group"] == 10


def test_membership_inference_draws_its_members_at_random_not_the_first_rows():
    """More members than non-members: the first rows of a sorted training split (here, copies of
    the synthetic records) would make the attack look perfect."""
    generator = torch.Generator().manual_seed(1)
    synthetic = torch.randn(10, 3, generator=generator)
    members = torch.cat([synthetic, torch.randn(10, 3, generator=generator) + 100])
    non_members = torch.randn(10, 3, generator=generator) + 100
    assert membership.membership_inference(synthetic, members, non_members)["auc"] < 1.0


def test_a_categorical_label_is_scored_over_its_classes_even_when_its_last_is_absent():
    """The schema, not the rows, says how many classes a label has: a three-class label whose
    third class neither split holds is scored one-vs-rest over the classes present (macro F1,
    mean AUPRC of both), not as a binary label whose F1 and AUPRC are the second class's alone."""
    train, test = (multi_table(n, seed, cuts=(5, 10), flip_rate=0.2) for n, seed in ((400, 1), (300, 2)))
    train, test = (frame[frame["y"] != "c"] for frame in (train, test))
    result = classification_utility(train, test, MULTI, {"lr": CLASSIFIERS["logistic_regression"]})["per_classifier"]["lr"]
    x, y = features_and_label(train, MULTI)
    x_test, y_test = features_and_label(test, MULTI)
    proba = LogisticRegression(max_iter=1000, random_state=0).fit(x, y).predict_proba(x_test)
    macro_f1 = metrics.f1_score(y_test, proba.argmax(axis=1), average="macro")
    assert result["f1"] == pytest.approx(macro_f1, abs=1e-12)
    assert result["auprc"] == pytest.approx(
        np.mean([average_precision_score(y_test == k, proba[:, k]) for k in (0, 1)]), abs=1e-12)
    assert macro_f1 != pytest.approx(metrics.f1_score(y_test, proba.argmax(axis=1)), abs=1e-3)


def test_a_classifier_failing_with_an_empty_message_on_synthetic_rows_is_scored_as_a_constant():
    """A synthetic table a classifier raises on is scored as a constant prediction, named with the
    error's first line. An error with no message at all took down the whole evaluation: the first
    line of nothing was an IndexError inside the handler."""
    class Refusing(LogisticRegression):
        def fit(self, x, y):
            raise ValueError()

    x, y = np.random.default_rng(0).normal(size=(20, 2)), np.array([0, 1] * 10)
    probabilities, reason = utility._fit_predict_proba(lambda seed: Refusing(), x, y, x[:5], 2, seed=0)
    assert reason == "could not be fitted (ValueError)"
    np.testing.assert_allclose(probabilities, np.full((5, 2), 0.5))


def test_an_errors_first_line_is_quoted_without_its_final_period_or_its_type_when_empty():
    from lightning_dpgan.error_text import first_line

    assert first_line(RuntimeError("\n  bad shape.  \ntables of the dispatcher\n")) == "bad shape"
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(KeyError("name")) == "'name'"


@pytest.mark.parametrize("measure", [wasserstein_per_column, jensen_shannon_per_column, total_variation_per_column,
                                     invented_share_per_column, correlation_difference, pmse],
                         ids=lambda measure: measure.__name__)
def test_an_empty_table_is_refused_by_every_fidelity_measure(measure):
    """Called as a library on an empty synthetic table, they gave NaN divergences, a total
    variation of 0.5 everywhere and a correlation difference of 8.56, as if measured."""
    real, empty = make_table(50, 0), make_table(5, 1).head(0)
    with pytest.raises(ValueError, match="a table of 0 rows: the fidelity measures compare distributions"):
        measure(real, empty, SCHEMA)
    with pytest.raises(ValueError, match="a table of 0 rows"):
        measure(empty, real, SCHEMA)
    measure(real, make_table(1, 1), SCHEMA)  # one row is a distribution (a point mass)
