"""Machine-learning utility of synthetic tables: train a model on one frame, test it on another.

Classification follows PATE-GAN (Jordon et al., ICLR 2019, Sec. 5): the same 12 scikit-learn /
XGBoost predictive models, scored by AUROC and AUPRC, in three train/test settings

- **Setting A**: train on the real training set, test on the real test set;
- **Setting B**: train on synthetic data, test on the real test set;
- **Setting C**: train on synthetic data, test on a disjoint held-out part of the synthetic data.

Regression follows DP-SACTGAN (Sec. 5.1, Table 2): linear, ridge and random-forest regressors
scored by MAE, explained variance and R², reported as real-minus-synthetic differences
(:func:`utility_differences`).

Every frame goes through one fixed encoding built from the public :class:`TableSchema` alone
(:func:`features_and_label`), so real and synthetic frames land in the same feature columns and
no scaler or category list is fitted on either of them. Classifier settings are fixed below
(seeded, modest sizes so a 30k-row table runs in minutes on two cores); nothing is tuned on the
test data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.ensemble import (
    AdaBoostClassifier,
    BaggingClassifier,
    GradientBoostingClassifier,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    explained_variance_score,
    f1_score,
    mean_absolute_error,
    r2_score,
    roc_auc_score,
)
from sklearn.model_selection import train_test_split
from sklearn.naive_bayes import BernoulliNB, GaussianNB
from sklearn.neural_network import MLPClassifier
from sklearn.svm import LinearSVC
from sklearn.tree import DecisionTreeClassifier

from lightning_dpgan.data.schema import TableSchema
from lightning_dpgan.error_text import first_line

Factory = Callable[[int], BaseEstimator]

#: PATE-GAN's 12 predictive models (Sec. 5 and Appendix), name -> ``factory(seed)``.
#: Fixed settings, library defaults unless noted:
#: - logistic regression: lbfgs, ``max_iter=1000`` so it converges on one-hot data;
#: - random forest: 100 trees; bagging: 10 trees (the default); AdaBoost: 50 stumps (default);
#: - Bernoulli NB: features are in [0, 1], so they are binarised at 0.5;
#: - linear SVM: ``LinearSVC``, its decision function mapped to [0, 1] by a logistic/softmax
#:   (:class:`LinearSVMScores`): AUROC and AUPRC depend only on the ranking of scores, and
#:   calibration folds would fail on synthetic data with a class of fewer rows than folds
#:   (``SVC(kernel="linear", probability=True)`` is quadratic in rows: too slow);
#: - gradient boosting: 100 depth-3 trees (default);
#: - MLP: one hidden layer of 100 units, at most 300 epochs, early stopping on 10% of the
#:   *training* frame;
#: - XGBoost: 100 depth-6 trees, histogram method, 2 threads. The paper's appendix names
#:   "XGBoostRegressor"; a classifier is the model that yields class probabilities.
class LinearSVMScores(LinearSVC):
    """A linear SVM whose ``predict_proba`` is a monotone map of its decision function.

    Not calibrated probabilities: scores whose ranking (all AUROC/AUPRC need) and whose 0.5
    threshold (the SVM's own decision) are the SVM's.
    """

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        margins = self.decision_function(x)
        if margins.ndim == 1:
            positive = 1.0 / (1.0 + np.exp(-margins))
            return np.column_stack([1.0 - positive, positive])
        shifted = np.exp(margins - margins.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)


def parallel_jobs() -> int:
    """Threads for the ensembles that fit in parallel (random forest, bagging, XGBoost): this
    process's compute-thread count, one per core unless ``OMP_NUM_THREADS`` limits it, as it does
    for a benchmark cell run beside others (``benchmark --jobs``)."""
    import torch

    return torch.get_num_threads()


CLASSIFIERS: dict[str, Factory] = {
    "logistic_regression": lambda seed: LogisticRegression(max_iter=1000, random_state=seed),
    "random_forest": lambda seed: RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=parallel_jobs()),
    "gaussian_nb": lambda seed: GaussianNB(),
    "bernoulli_nb": lambda seed: BernoulliNB(binarize=0.5),
    "linear_svm": lambda seed: LinearSVMScores(random_state=seed, max_iter=5000),
    "decision_tree": lambda seed: DecisionTreeClassifier(random_state=seed),
    "lda": lambda seed: LinearDiscriminantAnalysis(),
    "adaboost": lambda seed: AdaBoostClassifier(n_estimators=50, random_state=seed),
    "bagging": lambda seed: BaggingClassifier(n_estimators=10, random_state=seed, n_jobs=parallel_jobs()),
    "gradient_boosting": lambda seed: GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=seed),
    "mlp": lambda seed: MLPClassifier(
        hidden_layer_sizes=(100,), max_iter=300, early_stopping=True, random_state=seed
    ),
    "xgboost": lambda seed: _xgboost(seed),
}


def _xgboost(seed: int) -> Any:
    """XGBoost, imported when used: the image benchmarks (and GPU images) do without it."""
    from xgboost import XGBClassifier

    return XGBClassifier(n_estimators=100, max_depth=6, tree_method="hist", n_jobs=parallel_jobs(),
                         random_state=seed, verbosity=0)

#: DP-SACTGAN's regressors (Table 2 reports Ridge): name -> ``factory(seed)``.
REGRESSORS: dict[str, Factory] = {
    "linear_regression": lambda seed: LinearRegression(),
    "ridge": lambda seed: Ridge(alpha=1.0),
    "random_forest": lambda seed: RandomForestRegressor(n_estimators=100, random_state=seed, n_jobs=parallel_jobs()),
}

CLASSIFICATION_METRICS = ("auroc", "auprc", "accuracy", "f1")
REGRESSION_METRICS = ("mae", "explained_variance", "r2")


# --- encoding ---------------------------------------------------------------------------------


def feature_names(schema: TableSchema) -> list[str]:
    """Names of the columns of ``X`` from :func:`features_and_label`: ``name`` or ``name=category``."""
    names = []
    for column in schema.columns:
        if column.name == schema.label:
            continue
        if column.is_numeric:
            names.append(column.name)
        else:
            names.extend(f"{column.name}={category}" for category in column.categories)
    return names


def features_and_label(frame: pd.DataFrame, schema: TableSchema) -> tuple[np.ndarray, np.ndarray]:
    """Encode ``frame`` with the schema's fixed public map; return features ``X`` and label ``y``.

    Uses :meth:`TableSchema.encode`: numeric columns clipped to their public bounds and scaled to
    [0, 1], categorical columns one-hot in the schema's category order. A feature holding a
    category outside the schema is left blank (an all-zero block), as training encoded the row;
    a row whose *label* is outside the schema's classes has no class to learn or score and is
    left out. ``y`` is the class index in the label's category list for a categorical/binary
    label (so the positive class of a binary label, index 1, is the schema's *second*
    category), and the bounds-scaled value in [0, 1] for a continuous label.
    """
    if schema.label is None:
        raise ValueError("utility needs a schema with a label column")
    encoded = schema.encode(frame, unknown="blank")[0].numpy().astype(np.float64)
    block = schema.label_slice
    label = encoded[:, block]
    if not schema.label_column.is_numeric:
        encoded, label = encoded[label.sum(axis=1) > 0], label[label.sum(axis=1) > 0]
    features = np.delete(encoded, np.arange(block.start, block.stop), axis=1)
    y = label[:, 0] if schema.label_column.is_numeric else label.argmax(axis=1)
    return features, y


# --- classification ---------------------------------------------------------------------------


def _fit_predict_proba(
    factory: Factory, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, n_classes: int, seed: int,
    synthetic: bool = True,
) -> tuple[np.ndarray, str | None]:
    """Class probabilities ``(n_test, n_classes)`` and why the classifier is degenerate (None: it is not).

    Classes absent from the training set get probability 0 (models are fitted on the classes
    present, re-indexed to 0..m-1 as XGBoost requires). A training set no model of this kind
    can learn from -- a single class, or rows a collapsed generator repeated (LDA and AdaBoost
    refuse them, Gaussian NB returns NaN) -- gets a constant prediction, the training set's class
    shares: its AUROC is 0.5 and its average precision the test set's positive rate. Only a
    ``synthetic`` training set is given that allowance: a failure on real rows is raised.
    """
    present, y_index = np.unique(y_train, return_inverse=True)
    if len(present) < 2:
        return _class_shares(y_train, len(x_test), n_classes), "one label class"
    model = factory(seed)
    params = model.get_params()
    if params.get("early_stopping") and not stratified_split_possible(y_index, params["validation_fraction"]):
        # Early stopping holds out a stratified share of the training rows, which a class with a
        # single row or a tiny table (rare, poor synthetic data) cannot be split into: train the full schedule.
        model.set_params(early_stopping=False)
    try:
        model.fit(x_train, y_index)
        fitted = model.predict_proba(x_test)
    except (ValueError, IndexError, np.linalg.LinAlgError) as error:
        if not synthetic:
            raise
        return _class_shares(y_train, len(x_test), n_classes), f"could not be fitted ({first_line(error)})"
    if not np.isfinite(fitted).all():
        if not synthetic:
            raise ValueError(f"{type(model).__name__} gave non-finite probabilities on real training rows")
        return _class_shares(y_train, len(x_test), n_classes), "gave non-finite probabilities"
    fitted, constant = _without_rounding_noise(fitted)
    proba = np.zeros((len(x_test), n_classes))
    proba[:, present] = fitted
    return proba, "gave the same prediction for every test row" if constant else None


#: A class's probabilities that differ across the test rows by no more than this many float64
#: rounding steps of their size are one prediction
ROUNDING_STEPS = 64


def _without_rounding_noise(fitted: np.ndarray) -> tuple[np.ndarray, bool]:
    """``fitted`` as one constant prediction (its mean), and True, where every class column's
    spread is float rounding; else ``fitted`` unchanged, and False. A model that learned nothing
    (Bernoulli NB on a collapsed table) gave probabilities 5e-17 apart, which AUROC ranked as if
    they meant something (0.457, where a constant prediction scores 0.5). The threshold is
    relative, and a column is never flattened alone: probabilities of 1 - 1e-15 crowd within
    rounding of 1 while their complements, 1e-15 apart from one another, are a ranking."""
    spread = np.ptp(fitted, axis=0)
    noise = spread <= ROUNDING_STEPS * np.finfo(float).eps * np.abs(fitted).max(axis=0)
    if not noise.all():
        return fitted, False
    return np.broadcast_to(fitted.mean(axis=0), fitted.shape).copy(), True


def _class_shares(y_train: np.ndarray, rows: int, n_classes: int) -> np.ndarray:
    """The constant prediction of a classifier that learned nothing: each class's training share."""
    shares = np.bincount(y_train, minlength=n_classes) / len(y_train)
    return np.tile(shares, (rows, 1))


def stratified_split_possible(y: np.ndarray, test_fraction: float) -> bool:
    """Whether scikit-learn can split labels ``y`` with ``test_fraction`` held out, stratified:
    every class needs two rows, and each side at least one row per class."""
    classes, counts = np.unique(y, return_counts=True)
    held_out = math.ceil(test_fraction * len(y))
    return bool(counts.min() >= 2 and held_out >= len(classes) and len(y) - held_out >= len(classes))


def _binary_scores(y: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """AUROC / AUPRC / accuracy / F1 with class 1 (the schema's second category) as positive.

    AUROC and AUPRC are undefined (NaN) when the test set holds a single class.
    """
    both = len(np.unique(y)) == 2
    return {
        "auroc": float(roc_auc_score(y, proba[:, 1])) if both else float("nan"),
        "auprc": float(average_precision_score(y, proba[:, 1])) if both else float("nan"),
        "accuracy": float(accuracy_score(y, proba.argmax(axis=1))),
        "f1": float(f1_score(y, proba.argmax(axis=1), pos_label=1, zero_division=0.0)),
    }


def _multiclass_scores(y: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """One-vs-rest AUROC / AUPRC macro-averaged over the classes present in the test set, macro F1."""
    classes = [k for k in range(proba.shape[1]) if 0 < (y == k).sum() < len(y)]
    auroc = [roc_auc_score(y == k, proba[:, k]) for k in classes]
    auprc = [average_precision_score(y == k, proba[:, k]) for k in classes]
    predicted = proba.argmax(axis=1)
    return {
        "auroc": float(np.mean(auroc)) if classes else float("nan"),
        "auprc": float(np.mean(auprc)) if classes else float("nan"),
        "accuracy": float(accuracy_score(y, predicted)),
        "f1": float(f1_score(y, predicted, average="macro", labels=np.unique(y), zero_division=0.0)),
    }


def classification_utility(
    train_frame: pd.DataFrame,
    test_frame: pd.DataFrame,
    schema: TableSchema,
    classifiers: Mapping[str, Factory] | None = None,
    seed: int = 0,
    synthetic: bool = True,
) -> dict[str, Any]:
    """Train each classifier on ``train_frame``, test on ``test_frame`` (PATE-GAN Table 1);
    ``synthetic``: whether ``train_frame`` is synthetic (see the degenerate rule).

    Returns ``{"per_classifier": {name: {auroc, auprc, accuracy, f1, degenerate}}, "average":
    {metric: mean over classifiers}}``. For a binary label the positive class is the schema's
    second category. **Degenerate rule**: a training frame a classifier cannot learn from (a
    single class, which poor synthetic data can have, or repeated rows it refuses) gets a
    constant prediction, the frame's class shares, so its AUROC is 0.5 and its AUPRC the test
    set's positive rate, and it is flagged ``"degenerate": True`` with its
    ``"degenerate_reason"``. It stays in the averages: a generator that loses a class or collapses
    should be scored down, not skipped. A fit that fails on real rows (``synthetic=False``,
    setting A) is raised instead: there it would be a fault, not the table's. Averages ignore NaN
    (undefined on a one-class test set).
    """
    if schema.label_kind not in ("binary", "categorical"):
        raise ValueError(f"classification needs a binary or categorical label, got {schema.label_kind!r}")
    classifiers = CLASSIFIERS if classifiers is None else classifiers
    x_train, y_train = features_and_label(train_frame, schema)
    x_test, y_test = features_and_label(test_frame, schema)
    y_train, y_test = y_train.astype(np.int64), y_test.astype(np.int64)
    n_classes = schema.label_column.width
    score = _binary_scores if n_classes == 2 else _multiclass_scores
    per_classifier = {}
    for name, factory in classifiers.items():
        proba, reason = _fit_predict_proba(factory, x_train, y_train, x_test, n_classes, seed, synthetic)
        per_classifier[name] = {**score(y_test, proba), "degenerate": reason is not None, "degenerate_reason": reason}
    return {"per_classifier": per_classifier, "average": _average(per_classifier, CLASSIFICATION_METRICS)}


def _average(per_model: Mapping[str, Mapping[str, Any]], metrics: tuple[str, ...]) -> dict[str, float]:
    averages = {}
    for metric in metrics:
        values = np.array([scores[metric] for scores in per_model.values()], dtype=np.float64)
        averages[metric] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    return averages


def settings_abc(
    real_train: pd.DataFrame,
    synthetic: pd.DataFrame,
    real_test: pd.DataFrame,
    schema: TableSchema,
    classifiers: Mapping[str, Factory] | None = None,
    seed: int = 0,
    synthetic_test_fraction: float = 0.2,
) -> dict[str, dict[str, Any]]:
    """PATE-GAN's Settings A, B and C (Sec. 5), each a :func:`classification_utility` result.

    A trains and tests on real data, B trains on all of ``synthetic`` and tests on real data, C
    splits ``synthetic`` 80/20 (shuffled with ``seed``) into disjoint train and test parts, as
    the paper requires the two to be disjoint. The split is stratified by the label where it
    can be, so that a rare class (a few synthetic frauds) is on both sides and C's AUROCs are
    defined. Compare A with C through
    :func:`lightning_dpgan.evaluation.ranking.synthetic_ranking_agreement`. A synthetic table of
    one row cannot be split: C is then undefined, every score NaN.
    """
    scores = {
        "A": classification_utility(real_train, real_test, schema, classifiers, seed, synthetic=False),
        "B": classification_utility(synthetic, real_test, schema, classifiers, seed),
    }
    if len(synthetic) < 2:
        names = CLASSIFIERS if classifiers is None else classifiers
        undefined = {name: {**dict.fromkeys(CLASSIFICATION_METRICS, float("nan")), "degenerate": False,
                            "degenerate_reason": None} for name in names}
        return {**scores, "C": {"per_classifier": undefined, "average": _average(undefined, CLASSIFICATION_METRICS)}}
    labels = synthetic[schema.label].astype(str).to_numpy()
    stratify = labels if stratified_split_possible(labels, synthetic_test_fraction) else None
    synthetic_train, synthetic_test = train_test_split(
        synthetic, test_size=synthetic_test_fraction, random_state=seed, shuffle=True, stratify=stratify
    )
    return {**scores, "C": classification_utility(synthetic_train, synthetic_test, schema, classifiers, seed)}


# --- regression -------------------------------------------------------------------------------


def regression_utility(
    train_frame: pd.DataFrame,
    test_frame: pd.DataFrame,
    schema: TableSchema,
    regressors: Mapping[str, Factory] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Train each regressor on ``train_frame``, test on ``test_frame`` (DP-SACTGAN Table 2).

    The target is the label scaled to [0, 1] by its *public* bounds (as every numeric column is
    encoded), so MAE is a fraction of the target's public range and comparable across tables.
    (Not on DP-SACTGAN's scale: its Table 2 MAE gaps, 3.66 to 10.98, are not of a [0, 1] target.
    R² and explained variance do not depend on the scale.) Returns ``{"per_regressor": {name: {mae,
    explained_variance, r2}}, "average": {...}}``.
    """
    if schema.label_kind != "continuous":
        raise ValueError(f"regression needs a continuous label, got {schema.label_kind!r}")
    regressors = REGRESSORS if regressors is None else regressors
    x_train, y_train = features_and_label(train_frame, schema)
    x_test, y_test = features_and_label(test_frame, schema)
    per_regressor = {}
    for name, factory in regressors.items():
        predicted = factory(seed).fit(x_train, y_train).predict(x_test)
        per_regressor[name] = {
            "mae": float(mean_absolute_error(y_test, predicted)),
            "explained_variance": float(explained_variance_score(y_test, predicted)),
            "r2": float(r2_score(y_test, predicted)),
        }
    return {"per_regressor": per_regressor, "average": _average(per_regressor, REGRESSION_METRICS)}


def utility_differences(real_result: Mapping[str, Any], synthetic_result: Mapping[str, Any]) -> dict[str, Any]:
    """Real-minus-synthetic for every metric, as DP-SACTGAN's utility tables report (Sec. 5.1).

    Works on the output of :func:`classification_utility` or :func:`regression_utility` (nested
    dicts are walked; booleans such as ``degenerate`` are skipped). The sign is kept: for
    higher-is-better metrics (AUROC, R², ...) a positive difference means the synthetic data
    does worse; for MAE a *negative* difference means the synthetic data does worse. The
    paper's tables print magnitudes; take ``abs`` to compare with them.
    """
    differences: dict[str, Any] = {}
    for key, real_value in real_result.items():
        if key not in synthetic_result:
            continue
        synthetic_value = synthetic_result[key]
        if isinstance(real_value, Mapping):
            differences[key] = utility_differences(real_value, synthetic_value)
        elif isinstance(real_value, (int, float)) and not isinstance(real_value, bool):
            differences[key] = float(real_value) - float(synthetic_value)
    return differences
