"""Measuring how useful synthetic data is: train on synthetic records, test on real ones."""
from lightning_dpgan.evaluation.fidelity import (
    correlation_difference,
    invented_share_per_column,
    jensen_shannon_per_column,
    pmse,
    total_variation_per_column,
    wasserstein_per_column,
)
from lightning_dpgan.evaluation.images import SmallCNN, cnn_accuracy, load_synthetic_npz
from lightning_dpgan.evaluation.membership import closest_record_distances, membership_inference
from lightning_dpgan.evaluation.ranking import feature_importance_agreement, synthetic_ranking_agreement
from lightning_dpgan.evaluation.utility import (
    CLASSIFIERS,
    REGRESSORS,
    classification_utility,
    feature_names,
    features_and_label,
    regression_utility,
    settings_abc,
    utility_differences,
)

__all__ = [
    "CLASSIFIERS",
    "REGRESSORS",
    "SmallCNN",
    "classification_utility",
    "closest_record_distances",
    "cnn_accuracy",
    "correlation_difference",
    "feature_importance_agreement",
    "feature_names",
    "features_and_label",
    "invented_share_per_column",
    "jensen_shannon_per_column",
    "load_synthetic_npz",
    "membership_inference",
    "pmse",
    "regression_utility",
    "settings_abc",
    "synthetic_ranking_agreement",
    "total_variation_per_column",
    "utility_differences",
    "wasserstein_per_column",
]
