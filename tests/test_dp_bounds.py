"""DP schema estimation: bounds that cover the data, categories that hide rare values, exact cost."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lightning_dpgan.data.dp_bounds import (
    dp_categories,
    dp_numeric_bounds,
    geometric_grid,
    infer_schema_dp,
    stability_threshold,
)
from lightning_dpgan.data.schema import SchemaError


def test_grid_is_fixed_symmetric_and_sorted():
    edges = geometric_grid()
    assert np.all(np.diff(edges) > 0)
    np.testing.assert_array_equal(edges, -edges[::-1])
    assert 0.0 in edges and edges[-1] == 2.0**40


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).uniform(3, 700, 2000),
        np.random.default_rng(1).normal(-5000, 800, 2000),
        np.random.default_rng(2).uniform(-0.5, 0.3, 2000),
        np.zeros(2000),
    ],
    ids=["positive", "negative", "around-zero", "constant"],
)
def test_with_a_large_epsilon_the_bounds_cover_the_data(values):
    (low, high), cost = dp_numeric_bounds(values, epsilon=1e4, alpha=0.0, rng=np.random.default_rng(3))
    assert low <= values.min() and values.max() <= high
    assert low < high
    assert high - low <= 4 * max(abs(values.min()), abs(values.max()), 2.0**-10)  # a factor-2 grid
    assert cost == {"epsilon": 1e4, "delta": 0.0, "mechanism": "laplace histogram on a geometric grid"}


def test_bounds_are_grid_edges_so_a_single_outlier_cannot_set_them():
    values = np.concatenate([np.random.default_rng(0).uniform(10, 60, 5000), [1e9]])
    (low, high), _ = dp_numeric_bounds(values, epsilon=1.0, rng=np.random.default_rng(4))
    edges = set(geometric_grid())
    assert low in edges and high in edges
    assert high <= 64.0  # the outlier's lone bin is below the noise threshold


class FixedNoise:
    """An ``rng`` whose Laplace draw is chosen by the test: zeros but for ``spikes`` {index: value}."""

    def __init__(self, spikes: dict[int, float]) -> None:
        self.spikes, self.scales = spikes, []

    def laplace(self, loc, scale, size):
        self.scales.append(scale)
        noise = np.zeros(size)
        for index, value in self.spikes.items():
            noise[index] = value
        return noise


def bin_of(value: float) -> int:
    return int(np.searchsorted(geometric_grid(), value, side="right") - 1)


def test_with_too_little_budget_the_largest_noisy_bin_is_returned():
    """Five records at 100 (bin [64, 128)); at epsilon 1e-3 no bin reaches the threshold, so the
    largest *noisy* count is released: here the noise's, in bin [1024, 2048)."""
    noise = FixedNoise({bin_of(1500.0): 50.0})
    (low, high), _ = dp_numeric_bounds(np.full(5, 100.0), epsilon=1e-3, rng=noise)
    assert (low, high) == (1024.0, 2048.0)
    assert noise.scales == [pytest.approx(1e3)]  # Laplace(1 / epsilon)
    (low, high), _ = dp_numeric_bounds(np.full(5, 100.0), epsilon=1e-3, rng=FixedNoise({}))
    assert (low, high) == (64.0, 128.0)  # without noise, the data's own bin


def test_an_empty_bin_passing_the_threshold_by_chance_is_rare_enough_not_to_stretch_bounds_often():
    """300 ages: an empty bin far out, lifted by the noise over a threshold that let such bins
    through with probability 0.05, weighed more than alpha of the mass in a table this small, and
    the bounds stretched across the grid to cover it (-2^21 for an 18-89 column, in about 3 % of
    estimates). The threshold now lets one through with probability 0.01: that noise stays
    below it, and noise above it still counts."""
    from lightning_dpgan.data import dp_bounds

    bins = len(geometric_grid()) - 1
    assert dp_bounds._FALSE_BIN_PROBABILITY == 0.01
    ages = np.random.default_rng(0).integers(18, 90, 300).astype(float)
    far = bin_of(-2.0**20 - 1)
    passing_the_old_threshold = math.log(bins / (2 * 0.05)) + 1  # epsilon 1
    (low, high), _ = dp_numeric_bounds(ages, epsilon=1.0, rng=FixedNoise({far: passing_the_old_threshold}))
    assert (low, high) == (16.0, 128.0)
    passing_the_threshold = math.log(bins / (2 * 0.01)) + 1
    (low, high), _ = dp_numeric_bounds(ages, epsilon=1.0, rng=FixedNoise({far: passing_the_threshold}))
    assert low == -(2.0**21) and high == 128.0


def test_the_noisy_counts_not_the_true_ones_set_the_bounds():
    """The noise reaches the release: a noisy bin far above the data widens the bounds to it,
    and noise that sinks the data's top bin below the threshold narrows them."""
    values = np.random.default_rng(0).uniform(10, 60, 5000)  # bins [8, 16), [16, 32), [32, 64)
    (_, high), _ = dp_numeric_bounds(values, epsilon=1.0, alpha=0.0, rng=FixedNoise({bin_of(2.0**20 + 1): 1e4}))
    assert high == 2.0**21
    (low, high), _ = dp_numeric_bounds(values, epsilon=1.0, alpha=0.0, rng=FixedNoise({bin_of(40.0): -1e6}))
    assert (low, high) == (8.0, 32.0)


def test_the_noisy_counts_not_the_true_ones_pick_the_categories():
    """A value seen once is released when its noise lifts it over the threshold, and a common
    one is withheld when its noise sinks it (counts in order of first appearance)."""
    values = ["a"] * 300 + ["b"] * 200 + ["rare"]
    epsilon, delta = 0.5, 1e-6
    lift = stability_threshold(epsilon, delta)  # 1 + lift is above the threshold
    noise = FixedNoise({2: lift})
    released, _ = dp_categories(values, epsilon, delta, rng=noise)
    assert released == ["a", "b", "rare"]
    assert noise.scales == [pytest.approx(1 / epsilon)]  # Laplace(1 / epsilon): a count's sensitivity is 1
    released, _ = dp_categories(values, epsilon, delta, rng=FixedNoise({0: -300.0}))
    assert released == ["b"]


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.inf, math.nan, True, "1"])
def test_numeric_bounds_refuse_bad_parameters(epsilon):
    with pytest.raises(ValueError, match="epsilon must be a"):  # True is not a budget of 1
        dp_numeric_bounds([1.0], epsilon=epsilon)
    with pytest.raises(ValueError, match="alpha"):
        dp_numeric_bounds([1.0], epsilon=1.0, alpha=1.0)


def test_stability_threshold_releases_a_singleton_with_probability_delta():
    epsilon, delta = 0.5, 1e-6
    tau = stability_threshold(epsilon, delta)
    assert 0.5 * math.exp(-epsilon * (tau - 1)) == pytest.approx(delta)


def test_categories_seen_once_are_never_released_with_a_small_epsilon():
    rng = np.random.default_rng(6)
    singletons = [f"person-{i}" for i in range(3000)]
    values = singletons + ["common-a"] * 4000 + ["common-b"] * 3000
    released, cost = dp_categories(values, epsilon=0.1, delta=1e-6, rng=rng)
    assert released == ["common-a", "common-b"]
    assert cost == {"epsilon": 0.1, "delta": 1e-6, "mechanism": "stability-based histogram"}


def test_categories_come_back_sorted_as_python_values():
    released, _ = dp_categories(pd.Series([3, 1, 2] * 1000), epsilon=5.0, delta=1e-6, rng=np.random.default_rng(7))
    assert released == [1, 2, 3] and all(type(v) is int for v in released)


def test_categories_refuse_bad_delta():
    with pytest.raises(ValueError, match="delta"):
        dp_categories(["a"], epsilon=1.0, delta=0.0)


def make_frame(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "amount": rng.gamma(2.0, 50.0, n),
            "rooms": rng.integers(1, 9, n),
            "city": rng.choice(["north", "south", "east"], n),
            "fraud": rng.choice([0, 1], n, p=[0.8, 0.2]),
        }
    )


def test_infer_schema_spends_exactly_the_budget_passed_in():
    frame = make_frame()
    schema, cost = infer_schema_dp(
        frame, "fraud", ["city"], epsilon=2.0, delta=1e-6, label_kind="binary", integer=["rooms"], rng=np.random.default_rng(8)
    )
    assert cost["epsilon"] == 2.0 and cost["delta"] == 1e-6
    per_column = cost["columns"]
    assert sum(c["epsilon"] for c in per_column.values()) == pytest.approx(2.0)
    assert all(c["epsilon"] == pytest.approx(0.5) for c in per_column.values())
    assert per_column["city"]["delta"] == pytest.approx(5e-7) and per_column["amount"]["delta"] == 0.0
    assert [c.kind for c in schema.columns] == ["continuous", "integer", "categorical", "categorical"]
    assert schema.label == "fraud" and schema.label_kind == "binary"
    assert schema.column("fraud").categories == (0, 1)
    assert schema.column("city").categories == ("east", "north", "south")
    assert all(c.source.startswith("DP estimate") for c in schema.columns)
    records, report = schema.encode(frame)
    assert report.rows_encoded == len(frame) and records.shape[1] == schema.encoded_dim


def test_infer_schema_without_categorical_columns_spends_no_delta():
    frame = make_frame()[["amount", "rooms"]]
    _, cost = infer_schema_dp(frame, "amount", [], epsilon=1.0, delta=1e-6, label_kind="continuous", rng=np.random.default_rng(9))
    assert cost["epsilon"] == 1.0 and cost["delta"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(target="missing"), "target column 'missing' is missing"),
        (dict(categorical=["nope"]), r"categorical columns \['nope'\] are not in the data"),
        (dict(categorical=[]), r"'city' holds non-numeric values \('\w+' \(data row \d+\).*--data.categorical"),
        (dict(label_kind="continuous", target="amount", categorical=["city", "amount"]), "listed as categorical"),
        (dict(label_kind="regression"), "label_kind must be"),
        (dict(integer=["city"]), "both as categorical and as integer"),
        (dict(drop=["fraud"]), "the target 'fraud' cannot be dropped"),
    ],
)
def test_infer_schema_errors_are_clear(kwargs, message):
    args = dict(target="fraud", categorical=["city"], epsilon=1.0, delta=1e-6, label_kind="binary")
    args.update(kwargs)
    with pytest.raises(SchemaError, match=message):
        infer_schema_dp(make_frame(), rng=np.random.default_rng(10), **args)


@pytest.mark.parametrize("rows,said", [([7], r"amount \(1 rows: data row 8\)"), ([3, 4], r"amount \(2 rows: data rows 4, 5\)")])
def test_infer_schema_refuses_nans_naming_their_rows(rows, said):
    frame = make_frame()
    frame.loc[rows, "amount"] = np.nan
    with pytest.raises(SchemaError, match=said):
        infer_schema_dp(frame, "fraud", ["city"], epsilon=1.0, delta=1e-6, label_kind="binary")


def test_a_binary_label_whose_rare_class_is_not_released_asks_for_a_schema_file():
    frame = make_frame(400)
    frame["fraud"] = [1] * 3 + [0] * 397
    with pytest.raises(SchemaError, match="schema file") as refused:
        infer_schema_dp(frame, "fraud", ["city"], epsilon=1.0, delta=1e-6, label_kind="binary", rng=np.random.default_rng(11))
    assert "count --data.bounds_epsilon and --data.bounds_delta as spent" in str(refused.value)  # the verdict is a release


def test_a_column_none_of_whose_categories_is_released_says_the_estimate_spent_its_budget():
    """The refusal is read off the noisy counts: the budget is spent though no run records it, and
    a rerun with a larger budget spends again."""
    frame = make_frame(400)
    frame["city"] = [f"c{i}" for i in range(400)]  # every category once: none passes the threshold
    with pytest.raises(SchemaError, match="no category of column 'city' passed the DP threshold") as refused:
        infer_schema_dp(frame, "fraud", ["city"], epsilon=1.0, delta=1e-6, label_kind="binary", rng=np.random.default_rng(3))
    assert "count --data.bounds_epsilon and --data.bounds_delta as spent on this data" in str(refused.value)
    # no budget releases an ID's values: the way out is to leave it out
    assert "No budget releases the values of an ID or free-text column" in str(refused.value) and "--data.drop city" in str(refused.value)


def test_a_label_none_of_whose_classes_is_released_is_not_told_to_be_dropped():
    """A numeric label declared binary (every value its own class): --data.drop fraud, as an ID
    column is told, is refused for the target; the label's own remedies are named instead."""
    frame = make_frame(400)
    frame["fraud"] = np.arange(400) * 1.5
    with pytest.raises(SchemaError, match="no category of the label column 'fraud' passed the DP threshold") as refused:
        infer_schema_dp(frame, "fraud", ["city"], epsilon=1.0, delta=1e-6, label_kind="binary", rng=np.random.default_rng(3))
    assert "--data.drop" not in str(refused.value)
    assert "check --data.target and --data.label_kind (a numeric label is --data.label_kind continuous)" in str(refused.value)


def test_released_categories_that_differ_only_in_spaces_or_case_are_pointed_out(caplog):
    """' cardio' and 'cardio' both pass the threshold and become two categories: said, from the
    released list alone (post-processing, no budget); one spelling per category says nothing."""
    from lightning_dpgan.data.dp_bounds import spelling_twins

    assert spelling_twins(["cardio", " cardio", "F", "f ", "neuro", 3]) == [["cardio", " cardio"], ["F", "f "]]
    assert spelling_twins(["cardio", "neuro"]) == []
    frame = pd.DataFrame({"ward": ["cardio"] * 300 + [" cardio"] * 300 + ["neuro"] * 300, "y": [0, 1, 1] * 300})
    with caplog.at_level("WARNING"):
        schema, _ = infer_schema_dp(frame, "y", ["ward"], epsilon=20.0, delta=1e-6, label_kind="binary",
                                    rng=np.random.default_rng(0))
    assert sorted(schema.column("ward").categories) == [" cardio", "cardio", "neuro"]
    assert "differ only in spaces or case ('cardio' / ' cardio')" in caplog.text or \
        "differ only in spaces or case (' cardio' / 'cardio')" in caplog.text


def test_a_column_on_a_grid_edge_counts_in_the_bin_it_opens_so_non_negative_data_keeps_a_zero_low():
    """Bins are [a, b): a value equal to an edge counts in the bin that starts there. A count
    column of zeros and small positives (capital gain, children) gets a lower bound of 0, not
    -2^-10: counted in [-2^-10, 0) instead, its zeros would make the bounds, and the encoding's
    clipping, admit negative values the column never holds."""
    values = np.concatenate([np.zeros(500), np.random.default_rng(0).uniform(1, 30, 500)])
    (low, high), _ = dp_numeric_bounds(values, epsilon=1e4, alpha=0.0, rng=np.random.default_rng(1))
    assert (low, high) == (0.0, 32.0)
    (low, high), _ = dp_numeric_bounds(np.zeros(100), epsilon=1e4, alpha=0.0, rng=np.random.default_rng(2))
    assert (low, high) == (0.0, 2.0**-10)


def test_the_empty_bin_threshold_is_the_one_the_docstring_states():
    """The threshold ln(B / (2 * 0.01)) / epsilon, derived here from what it is for: each of the B
    empty bins passes it by Laplace(1/epsilon) noise alone with probability exp(-epsilon t) / 2,
    so B of them pass with probability 0.01 at most. Noise just below it on an empty bin far from
    the data is dropped; just above it, kept (and stretches the bounds). Epsilon 0.5 checks the
    division by epsilon too."""
    bins, epsilon = len(geometric_grid()) - 1, 0.5
    threshold = math.log(bins / (2 * 0.01)) / epsilon
    assert bins * 0.5 * math.exp(-epsilon * threshold) == pytest.approx(0.01)
    values = np.random.default_rng(0).uniform(10, 60, 5000)
    far = bin_of(2.0**20 + 1)
    (_, high), _ = dp_numeric_bounds(values, epsilon, alpha=0.0, rng=FixedNoise({far: threshold * 0.999}))
    assert high == 64.0
    (_, high), _ = dp_numeric_bounds(values, epsilon, alpha=0.0, rng=FixedNoise({far: threshold * 1.001}))
    assert high == 2.0**21


def test_an_integer_columns_bounds_are_whole_numbers_that_cover_the_grid_bounds():
    """Grid edges below 1 are fractions (2^-10 for a column of zeros): an integer column's bounds
    are rounded outwards, floor(low) and ceil(high), so they stay whole numbers and still cover."""
    frame = pd.DataFrame({"children": np.zeros(3000, dtype=int), "y": [0, 1, 1] * 1000})
    schema, _ = infer_schema_dp(frame, "y", [], epsilon=1e3, delta=1e-6, label_kind="binary", integer=["children"],
                                rng=np.random.default_rng(0))
    assert schema.column("children").kind == "integer"
    assert schema.column("children").bounds == (0.0, 1.0)


def test_dropped_columns_are_neither_estimated_nor_charged():
    """A dropped column is not released and takes no share of the budget: the m columns that
    remain split epsilon, each spending epsilon / m."""
    frame = make_frame()
    frame["row_id"] = np.arange(len(frame))
    schema, cost = infer_schema_dp(frame, "fraud", ["city"], epsilon=2.0, delta=1e-6, label_kind="binary",
                                   integer=["rooms"], drop=["row_id"], rng=np.random.default_rng(8))
    assert "row_id" not in schema.names and set(cost["columns"]) == {"amount", "rooms", "city", "fraud"}
    assert all(c["epsilon"] == pytest.approx(0.5) for c in cost["columns"].values())
    assert cost["epsilon"] == 2.0


def test_without_an_rng_the_noise_comes_from_fresh_entropy():
    """rng=None must not mean a fixed seed (noise from a known seed can be subtracted): releases
    dominated by noise differ from call to call. Bounds at epsilon 1e-6: the largest noisy bin
    of 101, all identical over 6 calls with probability about 101^-5. Categories: 30 values of
    14 records each against a threshold of about 14.1, each released with probability about
    0.44; two identical lists with probability about 1.5e-9."""
    bounds = {dp_numeric_bounds(np.full(5, 100.0), epsilon=1e-6)[0] for _ in range(6)}
    assert len(bounds) > 1
    values = [f"v{i:02d}" for i in range(30) for _ in range(14)]
    assert stability_threshold(1.0, 1e-6) == pytest.approx(14.12, abs=0.01)
    assert dp_categories(values, 1.0, 1e-6) != dp_categories(values, 1.0, 1e-6)
    frame = pd.DataFrame({"t": np.full(5, 100.0)})
    estimates = {infer_schema_dp(frame, "t", [], 1e-6, 0.0, "continuous")[0].column("t").bounds for _ in range(6)}
    assert len(estimates) > 1


def test_a_binary_label_released_with_three_classes_says_the_estimate_spent_its_budget():
    """Read off the noisy release as well: the budget is spent though nothing trained."""
    frame = make_frame(600)
    frame["fraud"] = ["a", "b", "c"] * 200
    with pytest.raises(SchemaError, match="holds more than two classes") as refused:
        infer_schema_dp(frame, "fraud", ["city", "fraud"], epsilon=1.0, delta=1e-6, label_kind="binary",
                        rng=np.random.default_rng(4))
    assert "count --data.bounds_epsilon and --data.bounds_delta as spent on this data" in str(refused.value)
