"""Statistical fidelity of a synthetic table to the real one.

- Per-column distances as DP-SACTGAN reports them (Sec. 5.2, Tables 3-4, following CTAB-GAN):
  Wasserstein distance (WD) for numeric columns, Jensen-Shannon divergence (JSD) for categorical
  ones, and Diff-Corr, the distance between the two tables' pairwise correlation matrices.
- Per column with few values (categorical, or numeric on a public grid): the total-variation
  distance between the two tables' value frequencies, and the share of synthetic rows whose
  value never occurs in the real rows (values a synthesizer invented, e.g. ZIP codes that the
  noise of a DP histogram put in its conditions).
- The propensity-score mean squared error (pMSE) of Snoke & Slavković (2018), used by the QUAIL
  evaluation (Sec. "Distributional similarity"): how well a classifier tells the tables apart,
  relative to what it achieves by chance.

All of them read frames through the schema's fixed public encoding
(:meth:`TableSchema.encode`: numeric columns clipped and scaled to [0, 1] by their public
bounds, categorical columns one-hot over the schema's category list), so nothing is fitted to
either table and distances are on the same scale for every column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.spatial.distance import jensenshannon
from scipy.stats import wasserstein_distance
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from lightning_dpgan.data.schema import Column, TableSchema, _category_codes


def _check_rows(*frames: pd.DataFrame) -> None:
    """Refuse an empty table, which has no distribution: it gave NaN divergences, a total
    variation of 0.5 everywhere and a correlation difference as if it had been measured. (One
    row is a distribution: a point mass, each of its features constant.)"""
    for frame in frames:
        if len(frame) == 0:
            raise ValueError("a table of 0 rows: the fidelity measures compare distributions, and it has none")


def _encoded(frame: pd.DataFrame, schema: TableSchema) -> np.ndarray:
    """Every row, as training encoded it: a category outside the schema (a real row's rare
    category that a DP-estimated list left out) leaves its column blank, an all-zero block."""
    _check_rows(frame)
    return schema.encode(frame, unknown="blank")[0].numpy().astype(np.float64)


def wasserstein_per_column(real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema) -> dict[str, float]:
    """WD between real and synthetic values of each numeric column, on the bounds-scaled [0, 1] values.

    Scaling by the public bounds (CTAB-GAN min-max scales before WD) makes each WD a fraction of
    the column's range, so columns can be averaged. Returns ``{column: WD}``.
    """
    x_real, x_synthetic = _encoded(real, schema), _encoded(synthetic, schema)
    slices = schema.column_slices
    return {
        c.name: float(wasserstein_distance(x_real[:, slices[c.name].start], x_synthetic[:, slices[c.name].start]))
        for c in schema.columns
        if c.is_numeric
    }


def jensen_shannon_per_column(real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema) -> dict[str, float]:
    """JS *divergence* (base 2, in [0, 1]) between category frequencies of each categorical column.

    DP-SACTGAN names the metric the Jensen-Shannon divergence, so this returns the squared
    ``scipy.spatial.distance.jensenshannon`` distance; frequencies are over the schema's full
    category list, so a category the synthetic data never produces still counts, and so do the
    rows of categories outside the list (one more value, as :func:`total_variation_per_column`
    counts them). (CTAB-GAN's code reports the unsquared distance, base 2: take ``sqrt`` to compare.)
    Returns ``{column: JSD}``.
    """
    x_real, x_synthetic = _encoded(real, schema), _encoded(synthetic, schema)
    out = {}
    for column in schema.columns:
        if column.is_numeric:
            continue
        block = schema.column_slices[column.name]
        p, q = _with_outside_share(x_real[:, block]), _with_outside_share(x_synthetic[:, block])
        out[column.name] = float(jensenshannon(p, q, base=2) ** 2)
    return out


def _with_outside_share(one_hot: np.ndarray) -> np.ndarray:
    """A categorical column's frequencies, the share of blank rows (outside the schema) last."""
    shares = one_hot.mean(axis=0)
    return np.append(shares, max(0.0, 1.0 - shares.sum()))


def _value_codes(column: Column, series: pd.Series) -> pd.Series:
    """A column's values as codes: category index (-1 for a category outside the schema) or the
    nearest value of its public grid (after clipping to the bounds)."""
    if column.is_numeric:
        return pd.Series(column.grid_codes(series.to_numpy(dtype=np.float64)))
    return pd.Series(_category_codes(column, series))


#: the most grid values (integers or steps within the bounds) a numeric column may have to count as
#: few-valued. Beyond it a column is continuous in effect (Adult's fnlwgt: 2,000,000 integers,
#: nearly every row its own value): two real samples differ on most values, so its total
#: variation is mostly sampling noise (0.70 between Adult's own splits) and would swamp the mean
MAX_FEW_VALUES = 1000


def _few_valued(schema: TableSchema) -> list[Column]:
    """Columns with few values: categorical ones, and numeric ones whose public grid has at most
    :data:`MAX_FEW_VALUES` values (the others are left to :func:`wasserstein_per_column`)."""
    return [c for c in schema.columns if not c.is_numeric or (c.grid_size is not None and c.grid_size <= MAX_FEW_VALUES)]


def total_variation_per_column(real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema) -> dict[str, float]:
    """Total-variation distance, ``0.5 * sum_v |p_real(v) - p_synthetic(v)|`` in [0, 1], between
    the value frequencies of each categorical column and each numeric column with a public grid of
    at most :data:`MAX_FEW_VALUES` values (:attr:`Column.grid`: integers, stepped values; off-grid
    values count at the nearest grid value). Other numeric columns are left to
    :func:`wasserstein_per_column`.
    Returns ``{column: TV}``."""
    _check_rows(real, synthetic)
    out = {}
    for column in _few_valued(schema):
        p = _value_codes(column, real[column.name]).value_counts(normalize=True)
        q = _value_codes(column, synthetic[column.name]).value_counts(normalize=True)
        out[column.name] = float(0.5 * p.sub(q, fill_value=0.0).abs().sum())
    return out


def invented_share_per_column(real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema) -> dict[str, float]:
    """Per column of :func:`total_variation_per_column`, the share of synthetic rows whose value
    occurs in no real row. Returns ``{column: share}``."""
    _check_rows(real, synthetic)
    out = {}
    for column in _few_valued(schema):
        seen = set(_value_codes(column, real[column.name]))
        out[column.name] = float((~_value_codes(column, synthetic[column.name]).isin(seen)).mean())
    return out


def _correlation_matrix(x: np.ndarray) -> np.ndarray:
    """Pearson correlations of the encoded features; pairs with a constant feature count as 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        matrix = np.corrcoef(x, rowvar=False)
    matrix = np.nan_to_num(matrix, nan=0.0)
    np.fill_diagonal(matrix, 1.0)
    return matrix


def correlation_difference(real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema) -> float:
    """Diff-Corr: Frobenius (L2) norm of the difference of the two pairwise correlation matrices.

    DP-SACTGAN reports "Diff Cor" without a formula; CTAB-GAN, whose evaluation it follows,
    defines it as the L2 norm of the difference between the real and synthetic correlation
    matrices. Here the matrices are Pearson correlations over all encoded features (the label
    included; one feature per numeric column, one per category), rather than CTAB-GAN's mix of
    Pearson / Theil's U / correlation ratio, so the value is not numerically comparable with the
    paper's tables, only across generators here. A feature constant in a table has correlation 0
    with every other feature there.
    """
    difference = _correlation_matrix(_encoded(real, schema)) - _correlation_matrix(_encoded(synthetic, schema))
    return float(np.linalg.norm(difference))


def _reference_coded(x: np.ndarray, schema: TableSchema) -> np.ndarray:
    """Drop the first slot of every one-hot block, so the design with an intercept is not collinear."""
    first_slots = [schema.column_slices[c.name].start for c in schema.columns if not c.is_numeric]
    return np.delete(x, first_slots, axis=1)


def pmse(
    real: pd.DataFrame, synthetic: pd.DataFrame, schema: TableSchema, model: str = "logistic", seed: int = 0,
    permutations: int = 10,
) -> dict[str, float]:
    """Propensity-score MSE and its ratio to the null expectation (Snoke & Slavković 2018).

    Stack the ``n_real`` and ``n_syn`` encoded rows, label them ``t = 1`` for synthetic, fit a
    propensity model of ``t`` on the features and compute ``pMSE = mean_i (p_i - c)^2`` with
    ``c = n_syn / N``. ``model`` is one of Snoke et al.'s two:

    ``"logistic"``: an *unpenalised* main-effects logistic regression (categorical columns
    reference-coded, so the design with an intercept is not collinear). ``pmse_null`` is their
    closed-form null for ``k`` parameters, ``(k - 1)(1 - c)^2 c / N`` (``k``: the rank of the
    design matrix with its intercept, so constant or collinear features add no parameter). It is
    the expected pMSE when the synthetic rows are drawn from a correct model *fitted to these real
    rows*; ``pmse_ratio`` = pMSE / null is then about 1, and larger the more the tables differ.
    Note what it is not: two independent samples of one distribution differ more than a sample and
    draws from its own fitted model, with expected pMSE ``(k - 1)(1 - c) c / N``, a ratio of about
    ``1 / (1 - c)`` -- 2 with as many synthetic as real rows (``evaluate``'s default). The ratio
    depends on ``c``: compare runs with the same number of synthetic rows.

    ``"cart"``: a classification tree, which also sees interactions and non-linear differences a
    main-effects model misses (it reads every category's one-hot slot). A tree has no closed-form
    null, so ``pmse_null`` is Snoke et al.'s permutation estimate: the mean pMSE of the same tree
    fitted to ``permutations`` random relabellings of which rows are synthetic (seeded by
    ``seed``). That is the null of two *exchangeable* samples, so here a fresh sample of the real
    distribution has a ratio of about 1, unlike the logistic ratio's ``1 / (1 - c)``. The tree
    has a fixed size (at most :data:`CART_LEAVES` leaves of at least :data:`CART_MIN_LEAF` rows,
    grown best first) rather than synthpop's rpart pruning at ``cp`` 1e-3: scikit-learn's
    cost-complexity pruning at that level keeps about a hundred splits of pure noise on 2,000
    rows, whose null then hides real differences, and at 1e-2 it keeps none, leaving the ratio
    undefined.
    """
    x_real, x_synthetic = _encoded(real, schema), _encoded(synthetic, schema)
    x = np.vstack([x_real, x_synthetic])
    t = np.r_[np.zeros(len(x_real)), np.ones(len(x_synthetic))]
    n, c = len(t), len(x_synthetic) / len(t)
    if model == "logistic":
        x = _reference_coded(x, schema)
        score = _propensity_mse(LogisticRegression(C=np.inf, max_iter=5000, random_state=seed), x, t, c)
        k = int(np.linalg.matrix_rank(np.column_stack([np.ones(n), x])))
        null = (k - 1) * (1 - c) ** 2 * c / n
    elif model == "cart":
        if permutations < 1:
            raise ValueError(f"the CART null needs at least one permutation, got {permutations}")
        score = _propensity_mse(_propensity_tree(seed), x, t, c)
        rng = np.random.default_rng(seed)
        null = float(np.mean([_propensity_mse(_propensity_tree(seed), x, rng.permutation(t), c)
                              for _ in range(permutations)]))
    else:
        raise ValueError(f"the propensity model is 'logistic' or 'cart', got {model!r}")
    return {"pmse": score, "pmse_null": float(null), "pmse_ratio": score / null if null > 0 else float("nan")}


#: the CART propensity model's size: leaves, grown best first, and the fewest rows a leaf holds
CART_LEAVES, CART_MIN_LEAF = 32, 5


def _propensity_tree(seed: int) -> DecisionTreeClassifier:
    return DecisionTreeClassifier(max_leaf_nodes=CART_LEAVES, min_samples_leaf=CART_MIN_LEAF, random_state=seed)


def _propensity_mse(classifier: LogisticRegression | DecisionTreeClassifier, x: np.ndarray, t: np.ndarray,
                    c: float) -> float:
    propensity = classifier.fit(x, t).predict_proba(x)[:, 1]
    return float(np.mean((propensity - c) ** 2))
