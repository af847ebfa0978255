"""Does synthetic data rank things the way real data does?

PATE-GAN (Sec. 5.4, Eq. 8) asks that a model that beats another on real data (Setting A) also
beats it on synthetic data (Setting C), so that researchers can choose methods on synthetic data
alone. The same agreement applied to features (how strongly each feature is tied to the label)
tells whether synthetic data preserves which features matter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import permutations
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpgan.data.schema import TableSchema
from lightning_dpgan.evaluation.utility import feature_names, features_and_label

Scores = Mapping[str, float] | Sequence[float]


def _aligned(scores_a: Scores, scores_c: Scores) -> tuple[np.ndarray, np.ndarray]:
    """Both score lists as arrays in the same model order (mappings are matched by key)."""
    if isinstance(scores_a, Mapping) != isinstance(scores_c, Mapping):
        raise TypeError("pass both scores as mappings (matched by name) or both as sequences")
    if isinstance(scores_a, Mapping):
        if set(scores_a) != set(scores_c):
            raise ValueError(f"the two settings score different models: {sorted(set(scores_a) ^ set(scores_c))}")
        names = list(scores_a)
        scores_a, scores_c = [scores_a[n] for n in names], [scores_c[n] for n in names]
    a, c = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_c, dtype=np.float64)
    if a.shape != c.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"need two equal-length lists of at least 2 scores, got {a.shape} and {c.shape}")
    return a, c


def synthetic_ranking_agreement(scores_a: Scores, scores_c: Scores) -> float:
    """PATE-GAN's agreed ranking probability (Eq. 8), the Synthetic Ranking Agreement.

    ``1 / (L (L - 1)) * sum_{j} sum_{k != j} I[(A_j - A_k)(C_j - C_k) > 0]`` over the ``L``
    models: the fraction of ordered pairs ranked the same way in both settings. It is 1 when the
    rankings agree, 0 when one is the reverse of the other. A tie in either setting makes the
    product 0, so the pair counts as disagreeing (the paper's strict inequality). NaN if a score
    is undefined (e.g. every AUROC of a setting whose test part holds one class), or if every
    score of a setting is the same (e.g. each of its classifiers trained on one class scores
    0.5): that setting ranks nothing, and 0 would read as "every ranking reversed".
    """
    a, c = _aligned(scores_a, scores_c)
    if not (np.isfinite(a).all() and np.isfinite(c).all()):
        return float("nan")
    if np.ptp(a) == 0.0 or np.ptp(c) == 0.0:
        return float("nan")
    agreed = sum((a[j] - a[k]) * (c[j] - c[k]) > 0 for j, k in permutations(range(len(a)), 2))
    return agreed / (len(a) * (len(a) - 1))


def _tie_aware_agreement(a: np.ndarray, c: np.ndarray) -> float:
    """Eq. 8 where a pair tied in *both* lists (to rounding) agrees; a tie in one list only
    still disagrees. NaN for fewer than two items: there is no pair to rank."""
    if len(a) < 2:
        return float("nan")
    def order(x: np.ndarray, j: int, k: int) -> int:
        return 0 if np.isclose(x[j], x[k], rtol=1e-9, atol=1e-12) else int(np.sign(x[j] - x[k]))

    agreed = sum(order(a, j, k) == order(c, j, k) for j, k in permutations(range(len(a)), 2))
    return agreed / (len(a) * (len(a) - 1))


def _label_correlations(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|Pearson r| of each feature with the label; 0 where a feature or the label is constant."""
    xc, yc = x - x.mean(axis=0), y - y.mean()
    denominator = np.sqrt((xc**2).sum(axis=0) * (yc**2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(denominator > 0, (xc * yc[:, None]).sum(axis=0) / denominator, 0.0)
    return np.abs(r)


def feature_importance_agreement(
    real_frame: pd.DataFrame, synthetic_frame: pd.DataFrame, schema: TableSchema
) -> dict[str, Any]:
    """Ranking agreement (Eq. 8) of the features' absolute Pearson correlation with the label.

    Features are the encoded columns of :func:`features_and_label` (one per numeric column, one
    per category), so a categorical column contributes each category's point-biserial
    correlation. Needs a binary or continuous label (a class index of a multi-class label has no
    meaningful Pearson correlation). Features tied in both tables agree: the two categories of
    a binary column always have the same |r|, and constant features all have 0, so with the
    strict Eq. 8 a table would not agree with its own copy. The agreement is NaN for a table
    with a single feature (no pair to rank) and where every |r| of either table is 0, its label
    or all its features constant (a collapsed generator's rows): no ranking, and 0 would read as
    "every ranking reversed". Returns ``{"agreement", "real",
    "synthetic"}``, the last two mapping feature names to their |r|.
    """
    if schema.label_kind not in ("binary", "continuous"):
        raise ValueError(f"feature importance needs a binary or continuous label, got {schema.label_kind!r}")
    names = feature_names(schema)
    real_x, real_y = features_and_label(real_frame, schema)
    synthetic_x, synthetic_y = features_and_label(synthetic_frame, schema)
    real, synthetic = _label_correlations(real_x, real_y), _label_correlations(synthetic_x, synthetic_y)
    unranked = not real.any() or not synthetic.any()  # a constant label, or every feature constant
    return {
        "agreement": float("nan") if unranked else _tie_aware_agreement(real, synthetic),
        "real": dict(zip(names, real.tolist(), strict=True)),
        "synthetic": dict(zip(names, synthetic.tolist(), strict=True)),
    }
