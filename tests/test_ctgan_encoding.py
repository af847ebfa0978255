"""CTGAN / CTAB-GAN+ encoding under DP: histograms, modes, the table transformer, conditions,
and the tabular datamodules' mode-specific encoding (tiny frames made here, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from run_helpers import empty_folder

from lightning_dpgan.data import dp_histogram
from lightning_dpgan.data.conditional import ConditionalSampler
from lightning_dpgan.data.dp_histogram import dp_column_histograms
from lightning_dpgan.data.modes import MAX_MODES, ModeSpecificNormalizer
from lightning_dpgan.data.schema import Column, SchemaError, TableSchema
from lightning_dpgan.data.table_transformer import MODE_SPECIFIC, ColumnEncoder, TableTransformer, _frequencies, record_uniforms
from lightning_dpgan.datamodules import tabular as tabular_module
from lightning_dpgan.datamodules.adult import AdultDataModule
from lightning_dpgan.datamodules.csv import CSVDataModule
from lightning_dpgan.datamodules.king import KingDataModule

FIXTURES = Path(__file__).parent / "fixtures"

SCHEMA = TableSchema(
    columns=(
        Column("x", "continuous", bounds=(-10.0, 10.0)),
        Column("gain", "integer", bounds=(0, 10_000)),
        Column("lot", "continuous", bounds=(0.0, 2_000_000.0)),
        Column("rooms", "integer", bounds=(0, 12)),
        Column("colour", "categorical", categories=("red", "green", "blue")),
        Column("y", "categorical", categories=("no", "yes")),
    ),
    label="y",
    label_kind="binary",
)
MIXED = {"gain": [0.0]}
LOG = ["lot"]


def make_frame(n: int = 1500, seed: int = 0) -> pd.DataFrame:
    """A bimodal x, a mixed gain (70 % zeros), a long-tail lot, small integers, categories."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x": np.where(rng.random(n) < 0.5, rng.normal(-5.0, 1.0, n), rng.normal(5.0, 1.0, n)),
            "gain": np.where(rng.random(n) < 0.7, 0, rng.integers(1000, 8000, n)),
            "lot": np.exp(rng.normal(9.0, 0.7, n)),
            "rooms": rng.integers(1, 9, n),
            "colour": rng.choice(["red", "green", "blue"], n, p=[0.6, 0.3, 0.1]),
            "y": rng.choice(["no", "yes"], n),
        }
    )


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return make_frame()


@pytest.fixture(scope="module")
def fitted(frame) -> tuple[TableTransformer, dict]:
    return TableTransformer.fit_dp(frame, SCHEMA, 50.0, mixed=MIXED, log_columns=LOG, rng=np.random.default_rng(0))


# --- the DP histogram --------------------------------------------------------------------------


def true_counts(frame: pd.DataFrame, schema: TableSchema, **kwargs) -> dict[str, np.ndarray]:
    """Counts without (practically any) noise: epsilon so large the Laplace scale is ~1e-12."""
    histograms, _ = dp_column_histograms(frame, schema, 1e13, rng=np.random.default_rng(0), **kwargs)
    return {name: np.concatenate([h.counts, h.special_counts]) for name, h in histograms.items()}


def test_histogram_noise_is_laplace_with_scale_d_over_epsilon(frame):
    epsilon, bins = 2.0, 1500
    histograms, cost = dp_column_histograms(frame, SCHEMA, epsilon, bins=bins, log_columns=LOG, special_values=MIXED,
                                            rng=np.random.default_rng(7))
    exact = true_counts(frame, SCHEMA, bins=bins, log_columns=LOG, special_values=MIXED)
    noise = np.concatenate([np.concatenate([h.counts, h.special_counts]) - exact[name] for name, h in histograms.items()])
    scale = len(SCHEMA.columns) / epsilon  # d = 6 columns share epsilon: Laplace(d / epsilon)
    assert len(noise) == 4 * bins + 1 + 3 + 2
    assert np.mean(np.abs(noise)) == pytest.approx(scale, rel=0.05)  # E|Laplace(b)| = b
    assert np.std(noise) == pytest.approx(np.sqrt(2) * scale, rel=0.06)
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=scale / 2).cdf).pvalue < 1e-6  # a wrong scale is caught
    assert cost == {"epsilon": 2.0, "delta": 0.0, "mechanism": "laplace column histograms (L1 sensitivity 6)",
                    "neighbours": "add-remove"}


def test_one_record_moves_one_bin_per_column(frame):
    """The stated sensitivity: adding a record changes the concatenated counts by d in L1."""
    kwargs = dict(bins=16, log_columns=LOG, special_values=MIXED)
    without, with_one = true_counts(frame.iloc[1:], SCHEMA, **kwargs), true_counts(frame, SCHEMA, **kwargs)
    changes = [np.abs(with_one[name] - without[name]).sum() for name in SCHEMA.names]
    assert np.allclose(changes, 1.0, atol=1e-6)


def test_histogram_bins_specials_and_log_space(frame):
    histograms, _ = dp_column_histograms(frame, SCHEMA, 1e13, bins=8, log_columns=LOG, special_values=MIXED,
                                         rng=np.random.default_rng(0))
    gain, lot, colour = histograms["gain"], histograms["lot"], histograms["colour"]
    assert gain.special_values == (0.0,)
    assert gain.special_counts[0] == pytest.approx((frame["gain"] == 0).sum(), abs=1e-6)
    assert gain.counts.sum() == pytest.approx((frame["gain"] != 0).sum(), abs=1e-6)
    assert lot.log and lot.edges[0] == 0.0 and lot.edges[-1] == pytest.approx(np.log1p(2e6))
    assert np.allclose(histograms["x"].edges, np.linspace(-10, 10, 9))
    assert np.allclose(colour.counts, [(frame["colour"] == c).sum() for c in ("red", "green", "blue")], atol=1e-6)


def test_histogram_refuses_bad_arguments(frame):
    with pytest.raises(ValueError, match="epsilon"):
        dp_column_histograms(frame, SCHEMA, 0.0)
    with pytest.raises(SchemaError, match="not in the schema"):
        dp_column_histograms(frame, SCHEMA, 1.0, log_columns=["nope"])
    with pytest.raises(SchemaError, match="categorical"):
        dp_column_histograms(frame, SCHEMA, 1.0, special_values={"colour": [0]})
    with pytest.raises(SchemaError, match="within its bounds"):
        dp_column_histograms(frame, SCHEMA, 1.0, special_values={"gain": [-1]})


def test_thresholding_zeroes_counts_below_k_scales_and_keeps_the_rest(frame):
    histograms, _ = dp_column_histograms(frame, SCHEMA, 3.0, bins=32, special_values=MIXED, rng=np.random.default_rng(3))
    gain = histograms["gain"]
    assert gain.scale == pytest.approx(len(SCHEMA.columns) / 3.0)  # the scale it was released with
    cut = gain.thresholded(2.0)
    low = gain.counts < 2.0 * gain.scale
    assert low.any() and (~low).any()
    assert (cut.counts[low] == 0).all() and (cut.counts[~low] == gain.counts[~low]).all()
    assert cut.special_counts == pytest.approx(gain.special_counts)  # ~1000 zeros: far above the cut
    assert gain.thresholded(0) is gain
    for bad in (-1.0, float("nan"), True):
        with pytest.raises(ValueError, match="threshold"):
            gain.thresholded(bad)


def test_thresholding_removes_the_modes_noise_invents_in_empty_bins():
    """A column whose records all sit in [40, 60] of bounds [0, 1000], at a noise scale of a
    tenth of the records: clipped at 0, the noise of the ~60 empty bins holds a large share of
    the mass and the mixture puts modes out there; cut at 5 scales (an empty bin survives with
    probability exp(-5)/2), every kept mode is real. Category frequencies are not cut."""
    schema = TableSchema((Column("v", "continuous", bounds=(0.0, 1000.0)), Column("y", "categorical", categories=("a", "b"))),
                         label="y", label_kind="binary")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"v": rng.uniform(40, 60, 1000), "y": rng.choice(["a", "b"], 1000)})
    epsilon = 2 / 100  # d = 2 columns: Laplace scale 100, a tenth of the 1000 records
    plain, _ = TableTransformer.fit_dp(frame, schema, epsilon, rng=np.random.default_rng(1))
    cut, cost = TableTransformer.fit_dp(frame, schema, epsilon, threshold=5.0, rng=np.random.default_rng(1))
    invented = lambda t: t.encoders[0].normalizer.weights[np.abs(t.encoders[0].normalizer.means - 50) > 50].sum()  # noqa: E731
    assert invented(plain) > 0.2
    assert invented(cut) == 0.0 and ((cut.encoders[0].normalizer.means > 30) & (cut.encoders[0].normalizer.means < 70)).all()
    assert cost["epsilon"] == epsilon  # post-processing: the release costs what it cost
    assert cut.condition_frequencies == plain.condition_frequencies


def test_a_cut_that_leaves_a_sliver_of_a_thinly_spread_column_is_reported(caplog):
    """2,000 records spread evenly over 64 bins (about 31 a bin) at a Laplace scale of 20: a cut
    at 4 scales (80) drops nearly every real bin, so the modes and the marginal keep a sliver of
    the column, and fit_dp warns, naming the column and the share kept. The same records packed
    into a few bins, or the same spread with no cut, pass without a word."""
    schema = TableSchema((Column("spread", "continuous", bounds=(0.0, 1000.0)),
                          Column("packed", "continuous", bounds=(0.0, 1000.0)),
                          Column("y", "categorical", categories=("a", "b"))), label="y", label_kind="binary")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"spread": rng.uniform(0, 1000, 2000), "packed": rng.uniform(40, 60, 2000),
                          "y": rng.choice(["a", "b"], 2000)})
    epsilon = 3 / 20  # d = 3 columns: Laplace scale 20
    with caplog.at_level("WARNING", logger="lightning_dpgan.data.table_transformer"):
        cut, _ = TableTransformer.fit_dp(frame, schema, epsilon, threshold=4.0, calibrated=True, rng=np.random.default_rng(1))
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "the DP histogram of spread" in warnings[0], warnings
    share = int(warnings[0].split("keeps ")[1].split("%")[0])
    assert share < 20 and "of the 2000 training records" in warnings[0] and "calibrated values" in warnings[0]
    spread = cut.encoders[0].marginal
    assert spread.ends.max() - spread.starts.min() < 500  # what the warning is about: a sliver of [0, 1000]
    caplog.clear()
    with caplog.at_level("WARNING", logger="lightning_dpgan.data.table_transformer"):
        TableTransformer.fit_dp(frame, schema, epsilon, rng=np.random.default_rng(1))
    assert not caplog.records


def test_the_datamodule_passes_its_threshold_to_the_fit(monkeypatch):
    seen = {}
    original = TableTransformer.fit_dp.__func__

    def spy(cls, *args, **kwargs):
        seen["threshold"] = kwargs.get("threshold")
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(TableTransformer, "fit_dp", classmethod(spy))
    datamodule = KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, encoding="mode-specific",
                                histogram_threshold=3.0, max_modes=3)
    _ = datamodule.data_shape
    assert seen["threshold"] == 3.0


# --- modes -------------------------------------------------------------------------------------


def test_dp_modes_find_the_two_modes_of_a_bimodal_column(fitted):
    transformer, _ = fitted
    normalizer = transformer.encoders[0].normalizer
    assert normalizer.n_modes == 2
    assert normalizer.means == pytest.approx([-5.0, 5.0], abs=0.3)
    assert normalizer.stds == pytest.approx([1.0, 1.0], rel=0.2)
    assert normalizer.weights == pytest.approx([0.5, 0.5], abs=0.05)


def test_normalizer_maps_values_to_alpha_and_back():
    normalizer = ModeSpecificNormalizer([-5.0, 5.0], [1.0, 2.0], [0.5, 0.5])
    values = np.array([-6.0, -5.0, 4.0, 9.0])
    alpha, modes = normalizer.transform(values, np.random.default_rng(0).random(4))
    assert modes.tolist() == [0, 0, 1, 1]
    assert alpha == pytest.approx([-0.25, 0.0, -0.125, 0.5])
    assert normalizer.inverse(alpha, modes) == pytest.approx(values)
    assert normalizer.inverse(alpha, np.eye(2)[modes]) == pytest.approx(values)  # one-hot works as well
    assert normalizer.transform([100.0])[0] == pytest.approx([0.99])  # clipped to tanh's reach
    assert ModeSpecificNormalizer.from_dict(json.loads(json.dumps(normalizer.to_dict()))) == normalizer


def test_modes_are_drawn_with_their_posterior_probabilities():
    normalizer = ModeSpecificNormalizer([0.0, 1.0], [1.0, 1.0], [0.5, 0.5])
    value = 0.5 + np.log(7 / 3)  # posterior (0.3, 0.7): log-odds of mode 1 = x - 0.5 for these modes
    assert normalizer.posterior([value])[0] == pytest.approx([0.3, 0.7])
    _, modes = normalizer.transform(np.full(1000, value), (np.arange(1000) + 0.5) / 1000)
    assert (modes == 0).sum() == 300  # mode 0 exactly where the draw falls below its probability
    with pytest.raises(ValueError, match="one uniform draw per value"):
        normalizer.transform([0.1, 0.2], [0.5])


def test_a_records_mode_draws_depend_on_that_record_alone():
    """A seeded generator over the rows would tie each row's draw to the rows before it: removing
    one record would re-encode every later one, and DP-SGD's guarantee on the encoded rows would
    not carry over to the records."""
    frame = make_frame(2000, seed=5)
    draws = record_uniforms(frame)
    assert draws.shape == (2000, frame.shape[1]) and ((draws >= 0) & (draws < 1)).all()
    assert np.array_equal(record_uniforms(frame.iloc[1:]), draws[1:])  # removing a record
    assert np.array_equal(record_uniforms(frame.iloc[::-1]), draws[::-1])  # reordering
    assert np.array_equal(record_uniforms(pd.concat([frame.iloc[:3], frame.iloc[:3]])), np.vstack([draws[:3]] * 2))
    assert not np.array_equal(record_uniforms(frame, seed=1), draws)
    # a column's inferred dtype depends on the other rows: one fractional value makes whole numbers floats
    whole = pd.DataFrame({"n": [1, 2, 3], "c": ["a", "b", "a"]})
    with_fraction = pd.DataFrame({"n": [1.0, 2.0, 3.0, 4.5], "c": pd.Categorical(["a", "b", "a", "b"])})
    assert np.array_equal(record_uniforms(with_fraction)[:3], record_uniforms(whole))
    # still uniform draws: each column's fraction below 0.3 within 5 standard errors, no correlation between columns
    assert np.abs((draws < 0.3).mean(axis=0) - 0.3).max() < 5 * np.sqrt(0.3 * 0.7 / 2000)
    correlations = np.corrcoef(draws.T)[np.triu_indices(frame.shape[1], 1)]
    assert np.abs(correlations).max() < 5 / np.sqrt(2000)


def test_a_record_holding_an_unlisted_category_leaves_every_other_records_encoding_unchanged():
    """A schema file's categories [0, 1] are numbers: read from a CSV, a column of listed values is
    int64, and one record holding an unlisted "2" (kept blank) makes it object. The draws hashed
    the values as read, 1 as 1.0 in the first frame and as "1" in the second, so that one record
    re-drew the modes of about half the others, and DP-SGD's guarantee on the encoded rows no longer
    held for the records."""
    schema = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 100.0)), Column("flag", "categorical", categories=(0, 1)),
                                  Column("y", "categorical", categories=("a", "b"))), label="y", label_kind="binary")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(30, 8, 200), rng.normal(70, 8, 200)]).clip(0, 100)
    listed = pd.DataFrame({"x": x, "flag": rng.integers(0, 2, 400), "y": rng.choice(["a", "b"], 400)})
    transformer, _ = TableTransformer.fit_dp(listed, schema, 50.0, rng=np.random.default_rng(0))
    assert transformer.encoders[0].normalizer.n_modes > 1  # modes to draw from, else nothing could change
    one_unlisted = listed.astype({"flag": object})
    one_unlisted.loc[399, "flag"] = "2"
    added = pd.concat([listed, pd.DataFrame({"x": [50.0], "flag": ["2"], "y": ["a"]})], ignore_index=True)
    encoded, _ = transformer.encode(listed, unknown="blank")
    for neighbour in (one_unlisted, added):
        assert neighbour["flag"].dtype == object
        other, _ = transformer.encode(neighbour, unknown="blank")
        assert torch.equal(other[:399], encoded[:399])
    # -0.0 and 0.0 are one value: the same record draws the same modes
    signed = listed.assign(x=np.where(np.arange(400) == 0, -0.0, listed["x"]))
    unsigned = listed.assign(x=np.where(np.arange(400) == 0, 0.0, listed["x"]))
    assert np.array_equal(record_uniforms(signed), record_uniforms(unsigned))


def test_a_declared_special_value_decodes_as_declared_not_rounded():
    """Continuous values are rounded to 7 significant digits (the generator's float32): a mixed
    column's declared special value 12.3456789 came out 12.34568, a value the column never holds."""
    schema = TableSchema(columns=(Column("reading", "continuous", bounds=(0.0, 100.0)),
                                  Column("y", "categorical", categories=("a", "b"))), label="y", label_kind="binary")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"reading": np.where(rng.random(300) < 0.5, 12.3456789, rng.uniform(20, 80, 300)),
                          "y": rng.choice(["a", "b"], 300)})
    transformer, _ = TableTransformer.fit_dp(frame, schema, 50.0, mixed={"reading": [12.3456789]},
                                             rng=np.random.default_rng(0))
    decoded = transformer.decode(transformer.encode(frame)[0])["reading"]
    special = frame["reading"] == 12.3456789
    assert (decoded[special] == 12.3456789).all()
    assert np.allclose(decoded[~special], frame["reading"][~special], rtol=1e-5)
    # on a step's grid too: 0.3 declared, step 0.5, was decoded as 0.5, merged with a value of the grid
    stepped = TableSchema(columns=(Column("reading", "continuous", bounds=(0.0, 100.0), step=0.5), schema.columns[1]),
                          label="y", label_kind="binary")
    frame = frame.assign(reading=np.where(special, 0.3, np.round(frame["reading"] * 2) / 2))
    transformer, _ = TableTransformer.fit_dp(frame, stepped, 50.0, mixed={"reading": [0.3]}, rng=np.random.default_rng(0))
    decoded = transformer.decode(transformer.encode(frame)[0])["reading"]
    assert (decoded[special] == 0.3).all() and (decoded[~special] == frame["reading"][~special]).all()


def test_removing_a_record_leaves_every_other_records_encoding_unchanged(fitted, frame):
    transformer, _ = fitted
    full, _ = transformer.encode(frame)
    without_first, _ = transformer.encode(frame.iloc[1:])
    assert torch.equal(full[1:], without_first)


def test_bounds_normalizer_is_min_max():
    normalizer = ModeSpecificNormalizer.from_bounds(0.0, 80.0)
    alpha, modes = normalizer.transform([0.4, 40.0, 79.6], [0.1, 0.5, 0.9])
    assert modes.tolist() == [0, 0, 0] and alpha == pytest.approx([-0.99, 0.0, 0.99])
    assert normalizer.inverse([-1.0, 1.0], [0, 0]) == pytest.approx([0.0, 80.0])


def test_a_histogram_that_noise_left_empty_falls_back_to_the_bounds():
    normalizer = ModeSpecificNormalizer.fit_histogram(np.linspace(0, 1, 5), [-3.0, -1.0, -0.5, -2.0])
    assert normalizer == ModeSpecificNormalizer.from_bounds(0.0, 1.0)


# --- the table transformer ---------------------------------------------------------------------


def test_mode_specific_round_trip(fitted, frame):
    transformer, _ = fitted
    encoded, report = transformer.encode(frame)
    assert encoded.dtype == torch.float32 and encoded.shape == (len(frame), transformer.encoded_dim)
    assert report.rows_encoded == len(frame)
    decoded = transformer.decode(encoded)
    assert list(decoded.columns) == SCHEMA.names
    assert np.quantile(np.abs(decoded["x"] - frame["x"]), 0.99) < 1e-4
    assert np.abs(decoded["x"] - frame["x"]).max() < 1.0
    assert (decoded["colour"].astype(str) == frame["colour"]).all()  # categorical: exact
    assert (decoded["y"].astype(str) == frame["y"]).all()
    assert decoded["rooms"].dtype == np.int64 and (decoded["rooms"] == frame["rooms"]).all()


def test_mixed_special_value_round_trips_exactly(fitted, frame):
    transformer, _ = fitted
    block = transformer.column_slices["gain"]
    encoded, _ = transformer.encode(frame)
    zeros = (frame["gain"] == 0).to_numpy()
    assert transformer.output_spans[2:4] == [(1, "tanh"), (block.stop - block.start - 1, "softmax")]
    assert (encoded[zeros, block.start] == 0).all()  # alpha = 0 for a special value
    assert (encoded[zeros, block.start + 1] == 1).all()  # its own one-hot slot, first
    assert (encoded[~zeros, block.start + 1] == 0).all()
    decoded = transformer.decode(encoded)["gain"]
    assert (decoded[zeros] == 0).all() and (decoded[~zeros] != 0).all()
    assert np.abs(decoded[~zeros] - frame["gain"][~zeros]).max() <= 1


def test_long_tail_column_round_trips_and_stays_in_bounds(fitted, frame):
    transformer, _ = fitted
    decoded = transformer.decode(transformer.encode(frame)[0])["lot"]
    assert np.quantile(np.abs(decoded / frame["lot"] - 1), 0.99) < 1e-4
    extreme = torch.zeros(4, transformer.encoded_dim)
    block = transformer.column_slices["lot"]
    extreme[:, block.start] = torch.tensor([-1.0, 1.0, -1.0, 1.0])
    extreme[[0, 1], block.start + 1] = 1.0  # lowest mode
    extreme[[2, 3], block.stop - 1] = 1.0  # highest mode
    assert transformer.decode(extreme)["lot"].between(0.0, 2e6).all()
    outside = frame.head(2).assign(lot=[-5.0, 9e9])
    encoded, report = transformer.encode(outside)
    assert report.clipped["lot"] == {"below": 1, "above": 1}
    # clipped to the bounds, then as far as the DP modes reach (CTGAN's alpha stops at 4 sigma)
    low, high = transformer.decode(encoded)["lot"]
    assert 0.0 <= low < frame["lot"].min() and frame["lot"].max() < high <= 2e6


def test_integers_are_rounded_and_clipped_on_decode(fitted):
    transformer, _ = fitted
    noise = torch.randn(200, transformer.encoded_dim, generator=torch.Generator().manual_seed(0))
    decoded = transformer.decode(torch.tanh(noise))
    for name in ("gain", "rooms"):
        assert decoded[name].dtype == np.int64
        low, high = SCHEMA.column(name).bounds
        assert decoded[name].between(low, high).all()


def test_a_stepped_column_decodes_onto_its_grid_under_mode_specific_encoding():
    """King's floors come in half steps: CTGAN's decoder must not invent 1.73 floors."""
    schema = TableSchema(columns=(Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5),
                                  Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"floors": rng.choice([1.0, 1.5, 2.0, 3.0], 600), "y": rng.choice(["no", "yes"], 600)})
    transformer, _ = TableTransformer.fit_dp(frame, schema, epsilon=1.0, rng=rng)
    decoded = transformer.decode(torch.tanh(torch.randn(400, transformer.encoded_dim, generator=torch.Generator().manual_seed(1))))
    assert set(decoded["floors"].unique()) <= {1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0}
    assert decoded["floors"].nunique() >= 3


def test_unknown_categories_follow_the_schema_rule(fitted, frame):
    transformer, _ = fitted
    dirty = frame.head(5).copy()
    dirty.loc[dirty.index[0], "colour"] = "purple"
    encoded, report = transformer.encode(dirty)
    assert encoded.shape[0] == 4 and report.rejected["colour"] == 1
    with pytest.raises(SchemaError, match="outside the schema"):
        transformer.encode(dirty, unknown="error")


def test_layout_spans_conditions_and_label(fitted):
    transformer, _ = fitted
    spans = transformer.output_spans
    assert sum(width for width, _ in spans) == transformer.encoded_dim
    assert {activation for _, activation in spans} == {"tanh", "softmax"}
    colour, label = transformer.column_slices["colour"], transformer.column_slices["y"]
    assert transformer.condition_spans == [(colour.start, 3), (label.start, 2)]
    assert transformer.label_span == (label.start, 2, "binary")
    red, green, blue = transformer.condition_frequencies[0]
    assert red > green > blue and red + green + blue == pytest.approx(1.0)
    layout = transformer.layout()
    assert json.loads(json.dumps(layout)) == layout
    assert set(layout) == {"spans", "condition_spans", "condition_frequencies", "label"}
    assert layout["label"] == {"start": label.start, "width": 2, "kind": "binary"}


def test_to_dict_from_dict_round_trip(fitted, frame):
    transformer, _ = fitted
    restored = TableTransformer.from_dict(json.loads(json.dumps(transformer.to_dict())))
    assert restored == transformer and restored.layout() == transformer.layout()
    encoded, _ = transformer.encode(frame.head(50))
    pd.testing.assert_frame_equal(restored.decode(encoded), transformer.decode(encoded))
    with pytest.raises(ValueError, match="format"):
        TableTransformer.from_dict({"columns": []})


def test_continuous_label_is_one_min_max_scalar():
    schema = TableSchema(
        (Column("area", "continuous", bounds=(0.0, 100.0)), Column("price", "continuous", bounds=(0.0, 1e6))),
        label="price",
        label_kind="continuous",
    )
    frame = pd.DataFrame({"area": [10.0, 50.0, 90.0], "price": [0.0, 5e5, 1e6]})
    for log_columns, expected in (((), [-1.0, 0.0, 1.0]), (("price",), None)):
        transformer = TableTransformer.from_bounds(schema, log_columns=log_columns)
        start, width, kind = transformer.label_span
        assert (width, kind) == (1, "continuous") and transformer.output_spans[-1] == (1, "tanh")
        encoded, _ = transformer.encode(frame)
        scalar = encoded[:, start].numpy()
        assert scalar.min() >= -1 and scalar.max() <= 1
        if expected is not None:
            assert scalar == pytest.approx(expected)
        assert transformer.decode(encoded)["price"].to_numpy() == pytest.approx(frame["price"], rel=1e-5, abs=1e-2)
    with pytest.raises(SchemaError, match="cannot be mixed"):
        TableTransformer.from_bounds(schema, mixed={"price": [0.0]})


def test_a_continuous_label_can_be_mode_specific_with_its_modes_from_the_dp_histogram():
    """``label_scalar=False``: the label gets an alpha and a mode softmax like any numeric column,
    its modes fitted on the same DP release (one more histogram column, so the Laplace scale is
    d/ε with the label counted), it may be mixed, and it decodes back."""
    schema = TableSchema(
        (Column("area", "continuous", bounds=(0.0, 100.0)), Column("price", "continuous", bounds=(0.0, 1e6))),
        label="price",
        label_kind="continuous",
    )
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"area": rng.uniform(10, 90, 3000),
                          "price": np.where(rng.random(3000) < 0.5, rng.normal(2e5, 1e4, 3000), rng.normal(7e5, 1e4, 3000))})
    transformer, cost = TableTransformer.fit_dp(frame, schema, 50.0, max_modes=4, label_scalar=False,
                                                rng=np.random.default_rng(1))
    assert "sensitivity 2" in cost["mechanism"]  # area and price; the scalar label would make it 1
    start, width, kind = transformer.label_span
    label_encoder = transformer.encoders[-1]
    assert kind == "continuous" and width == 1 + label_encoder.normalizer.n_modes and width > 2
    assert transformer.output_spans[-2:] == [(1, "tanh"), (width - 1, "softmax")]
    means = label_encoder.normalizer.means[label_encoder.normalizer.weights > 0.2]
    assert sorted(means) == pytest.approx([2e5, 7e5], rel=0.05)  # the two price clusters are modes
    encoded, _ = transformer.encode(frame.head(200))
    assert transformer.decode(encoded)["price"].to_numpy() == pytest.approx(frame["price"].head(200), rel=1e-3)
    scalar, _ = TableTransformer.fit_dp(frame, schema, 50.0, max_modes=4, rng=np.random.default_rng(1))
    assert scalar.label_span[1] == 1  # the default stays the single scalar
    mixed = TableTransformer.from_bounds(schema, mixed={"price": [0.0]}, label_scalar=False)
    assert mixed.label_span[1] == 1 + 1 + 1  # alpha, the special value 0, one mode over the bounds
    with pytest.raises(ValueError, match="label_scalar"):
        TableTransformer.from_bounds(schema, label_scalar="no")


def test_the_king_datamodule_encodes_its_label_as_asked(tmp_path):
    kwargs = dict(data_dir=FIXTURES / "king_tiny", download=False, encoding="mode-specific", modes="bounds")
    scalar, modes = KingDataModule(**kwargs), KingDataModule(**kwargs, label_encoding="mode-specific")
    assert scalar.table_layout["label"]["width"] == 1
    assert modes.table_layout["label"]["width"] == 2  # alpha and the single bounds mode
    assert modes.data_shape[0] == scalar.data_shape[0] + 1


def test_bounds_modes_read_no_rows():
    """``from_bounds`` takes no frame; fitted by a datamodule on different data it is the same."""
    transformer = TableTransformer.from_bounds(SCHEMA, mixed=MIXED, log_columns=LOG)
    assert all(e.normalizer.n_modes == 1 for e in transformer.encoders if e.normalizer is not None)
    assert transformer.condition_frequencies == [[1 / 3] * 3, [0.5, 0.5]]
    encoded, _ = transformer.encode(make_frame(200))
    assert transformer.decode(encoded)["x"].to_numpy() == pytest.approx(make_frame(200)["x"], abs=0.2)


# --- conditions --------------------------------------------------------------------------------

SPANS = [(2, 3), (6, 2)]
FREQUENCIES = [[0.7, 0.25, 0.05], [0.9, 0.1]]


@pytest.mark.parametrize("log_frequency", [True, False])
def test_sampled_conditions_follow_the_frequency_law(log_frequency):
    sampler = ConditionalSampler(SPANS, FREQUENCIES)
    cond, column = sampler.sample(40_000, log_frequency=log_frequency, generator=torch.Generator().manual_seed(0))
    assert cond.shape == (40_000, 5) and sampler.cond_dim == 5
    assert (cond.sum(dim=1) == 1).all()
    assert stats.chisquare(torch.bincount(column, minlength=2).numpy()).pvalue > 1e-3  # columns uniform
    for j, (offset, frequencies) in enumerate(zip([0, 3], FREQUENCIES)):
        rows = column == j
        observed = cond[rows, offset : offset + len(frequencies)].sum(dim=0).numpy()
        law = np.log1p(np.array(frequencies) * 1000.0) if log_frequency else np.array(frequencies)
        expected = law / law.sum() * rows.sum().item()
        assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_conditions_of_real_records_are_their_own():
    rng = np.random.default_rng(0)
    records = torch.zeros(500, 8)
    first, second = rng.integers(0, 3, 500), rng.integers(0, 2, 500)
    records[:, 0] = torch.from_numpy(rng.random(500))
    records[np.arange(500), 2 + first] = 1.0
    records[np.arange(500), 6 + second] = 1.0
    sampler = ConditionalSampler(SPANS, FREQUENCIES)
    cond, column = sampler.from_records(records, generator=torch.Generator().manual_seed(1))
    assert set(column.tolist()) == {0, 1}
    assert (cond.sum(dim=1) == 1).all()
    own = torch.where(column == 0, torch.from_numpy(first), 3 + torch.from_numpy(second))
    assert (cond.argmax(dim=1) == own).all()
    # a record's condition does not change with the rest of the batch
    alone, column_alone = sampler.from_records(records[:1], generator=torch.Generator().manual_seed(1))
    assert column_alone[0] == column[0] and torch.equal(alone[0], cond[0])


def test_condition_loss_is_small_when_the_generator_complies():
    sampler = ConditionalSampler(SPANS, FREQUENCIES)
    cond, column = sampler.sample(64, generator=torch.Generator().manual_seed(2))
    complying = torch.zeros(64, 8)
    for i in range(64):
        start, width = SPANS[column[i]]
        offset = [0, 3][column[i]]
        complying[i, start + int(cond[i, offset : offset + width].argmax())] = 20.0
    assert sampler.condition_loss(complying, cond, column) < 1e-6
    defying = torch.zeros(64, 8)
    for i in range(64):
        start, width = SPANS[column[i]]
        offset = [0, 3][column[i]]
        wrong = (int(cond[i, offset : offset + width].argmax()) + 1) % width
        defying[i, start + wrong] = 20.0
    assert sampler.condition_loss(defying, cond, column) > 15.0


def test_a_table_without_categorical_columns_has_empty_conditions():
    sampler = ConditionalSampler([], [])
    cond, column = sampler.sample(4)
    assert sampler.cond_dim == 0 and cond.shape == (4, 0) and column.tolist() == [-1] * 4
    cond, column = sampler.from_records(torch.rand(3, 5))
    assert cond.shape == (3, 0) and sampler.condition_loss(torch.rand(3, 5), cond, column) == 0


def test_sampler_from_a_transformer_layout(fitted, frame):
    transformer, _ = fitted
    sampler = ConditionalSampler.from_layout(json.loads(json.dumps(transformer.layout())))
    assert sampler.cond_dim == 5
    encoded, _ = transformer.encode(frame.head(10))
    cond, column = sampler.from_records(encoded)
    colour = frame.head(10)["colour"].map({"red": 0, "green": 1, "blue": 2}).to_numpy()
    label = frame.head(10)["y"].map({"no": 3, "yes": 4}).to_numpy()
    assert cond.argmax(dim=1).tolist() == np.where(column.numpy() == 0, colour, label).tolist()


# --- datamodules -------------------------------------------------------------------------------


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    frame.to_csv(path, index=False)
    return path


def csv_module(path: Path, **kwargs) -> CSVDataModule:
    args = dict(csv=path, target="y", categorical="colour", label_kind="binary", integer=["gain", "rooms"],
                bounds_epsilon=20.0, batch_size=16, encoding="mode-specific", modes_epsilon=5.0, max_modes=3,
                mixed=MIXED, log_columns=LOG)
    args.update(kwargs)
    return CSVDataModule(**args)


def test_csv_mode_specific_reports_the_composed_cost_and_decodes(tmp_path, monkeypatch):
    seen = []
    original = tabular_module.TableTransformer.fit_dp

    def spy(frame, *args, **kwargs):
        seen.append(frame)
        return original(frame, *args, **kwargs)

    monkeypatch.setattr(tabular_module.TableTransformer, "fit_dp", spy)
    datamodule = csv_module(write_csv(tmp_path / "data.csv", make_frame(400)))
    assert datamodule.data_shape == (datamodule.table_transformer.encoded_dim,)
    assert len(seen) == 1 and seen[0] is datamodule.train_frame and len(seen[0]) == 320  # train split only
    cost = datamodule.privacy_cost()
    assert cost["epsilon"] == pytest.approx(25.0) and cost["delta"] == 1e-6
    assert cost["neighbours"] == "add-remove"
    assert cost["parts"]["schema"]["epsilon"] == 20.0 and cost["parts"]["modes"]["epsilon"] == 5.0
    assert "laplace column histograms" in cost["mechanism"]
    datamodule.setup()
    (batch,) = next(iter(datamodule.train_dataloader()))
    assert batch.shape == (16, datamodule.data_shape[0])
    assert datamodule.table_layout == datamodule.table_transformer.layout()
    generated = torch.tanh(torch.randn(32, datamodule.data_shape[0]))
    decoded = datamodule.decode(generated)
    assert list(decoded.columns) == datamodule.schema.names and len(decoded) == 32
    assert len(seen) == 1  # the fit ran once


def test_restore_transformer_avoids_a_second_fit(tmp_path, monkeypatch):
    path = write_csv(tmp_path / "data.csv", make_frame(400))
    first = csv_module(path)
    first.setup()
    released, cost, schema = first.released_transformer(), first.privacy_cost(), first.schema
    assert first.fits_encoding is False

    def refuse(*args, **kwargs):
        raise AssertionError("a resumed run must not fit (and pay for) the modes again")

    monkeypatch.setattr(tabular_module.TableTransformer, "fit_dp", refuse)
    resumed = csv_module(path)
    assert resumed.fits_encoding is True
    with pytest.raises(ValueError, match="restore the released schema"):
        resumed.restore_transformer(json.loads(json.dumps(released)), cost)
    resumed.restore_schema(schema, cost)
    resumed.restore_transformer(json.loads(json.dumps(released)), cost)
    assert resumed.fits_encoding is False
    resumed.setup()
    assert resumed.privacy_cost() == cost
    assert resumed.table_transformer == first.table_transformer
    with pytest.raises(RuntimeError, match="already"):
        resumed.restore_transformer(released, cost)
    missing_cost = csv_module(path)
    missing_cost.restore_schema(schema, cost)
    with pytest.raises(ValueError, match="under-report"):
        missing_cost.restore_transformer(released, {"parts": {"schema": cost["parts"]["schema"]}})


def test_a_transformer_released_before_kings_schema_declared_steps_restores_and_decodes_as_trained():
    """King's floors and bathrooms gained a step after runs were trained: those runs' checkpoints
    still resume, sample and evaluate (a step only rounds decoded values), decoding as before;
    another bounds is still another encoding, refused."""
    def king():
        return KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, encoding="mode-specific", modes="bounds")

    first = king()
    first.setup()
    released, cost = json.loads(json.dumps(first.released_transformer())), first.privacy_cost()
    for column in released["schema"]["columns"]:
        column.pop("step", None)
    older = king()
    older.restore_transformer(released, cost)
    older.setup()
    noise = torch.tanh(torch.randn(300, older.table_transformer.encoded_dim, generator=torch.Generator().manual_seed(0)))
    floors = older.table_transformer.decode(noise)["floors"]
    assert not ((floors * 2) % 1 == 0).all()  # decoded as that run was trained: no grid
    assert ((first.table_transformer.decode(noise)["floors"] * 2) % 1 == 0).all()
    moved = json.loads(json.dumps(released))
    next(c for c in moved["schema"]["columns"] if c["name"] == "floors")["bounds"] = [1.0, 5.0]
    with pytest.raises(ValueError, match="another schema"):
        king().restore_transformer(moved, cost)


def test_bounds_modes_cost_nothing_and_read_no_rows(tmp_path):
    datamodule = KingDataModule(data_dir=empty_folder(tmp_path), download=False, encoding="mode-specific",
                                modes="bounds")
    assert datamodule.data_shape == (datamodule.table_transformer.encoded_dim,)
    assert datamodule.train_frame is None
    cost = datamodule.privacy_cost()
    assert cost["epsilon"] == 0.0 and cost["delta"] == 0.0 and datamodule.fits_encoding is False


def test_bounds_transformer_does_not_depend_on_the_rows(tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA.to_dict()))
    transformers = []
    for seed in (0, 1):
        path = write_csv(tmp_path / f"data{seed}.csv", make_frame(300, seed=seed))
        module = CSVDataModule(csv=path, schema=schema_file, encoding="mode-specific", modes="bounds",
                               mixed=MIXED, log_columns=LOG)
        transformers.append(module.released_transformer())
        assert module.train_frame is None
    assert transformers[0] == transformers[1]


def test_dataset_defaults_for_mixed_and_long_tail_columns():
    adult = AdultDataModule(encoding="mode-specific")
    assert adult.mixed == {"capital-gain": [0.0], "capital-loss": [0.0]} and adult.log_columns == []
    king = KingDataModule(encoding="mode-specific")
    assert king.mixed == {"sqft_basement": [0.0], "yr_renovated": [0.0]}
    assert king.log_columns == ["price", "sqft_lot", "sqft_lot15"]
    assert AdultDataModule(encoding="mode-specific", mixed={}).mixed == {}
    for module in (adult, king):
        TableTransformer.from_bounds(module.schema, mixed=module.mixed, log_columns=module.log_columns)


def test_adult_mode_specific_keeps_capital_gain_zeros():
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", download=False, batch_size=8,
                                 encoding="mode-specific", modes_epsilon=1.0, max_modes=3)
    datamodule.setup()
    decoded = datamodule.decode(datamodule.train_dataset.tensors[0])
    train = datamodule.train_frame.reset_index(drop=True)
    for name in ("capital-gain", "capital-loss"):
        assert ((decoded[name] == 0) == (train[name] == 0)).all()
    assert (decoded["income"].astype(str) == train["income"]).all()
    assert datamodule.privacy_cost()["epsilon"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(encoding="ctgan"), ValueError, "encoding must be one of"),
        (dict(encoding="mode-specific", modes="data"), ValueError, "modes must be one of"),
        (dict(encoding="mode-specific", modes_epsilon=0.0), ValueError, "modes_epsilon"),
        (dict(encoding="mode-specific", modes_epsilon=-1), ValueError, "modes_epsilon"),
        (dict(encoding="mode-specific", max_modes=0), ValueError, "max_modes"),
        (dict(mixed={"price": [0]}), ValueError, "pass --data.encoding mode-specific"),
        (dict(encoding="mode-specific", mixed={"price": "zero"}), ValueError, "special values"),
        (dict(encoding="mode-specific", label_encoding="modes"), ValueError, "label_encoding must be one of"),
        (dict(label_encoding="mode-specific"), ValueError, "pass --data.encoding mode-specific"),
        (dict(encoding="mode-specific", histogram_threshold=-1.0), ValueError, "histogram_threshold"),
    ],
)
def test_bad_encoding_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        KingDataModule(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(mixed={"zipcode": [98001]}), "categorical"),
        (dict(log_columns=["basement"]), "not in the schema"),
        (dict(mixed={"yr_renovated": [3000]}), "within its bounds"),
    ],
)
def test_encoding_columns_are_checked_against_the_schema_before_reading(kwargs, message, tmp_path):
    datamodule = KingDataModule(data_dir=tmp_path, download=False, encoding="mode-specific", **kwargs)
    with pytest.raises(SchemaError, match=message):
        _ = datamodule.data_shape
    assert datamodule.train_frame is None


def test_minmax_encoding_is_unchanged(tmp_path):
    datamodule = KingDataModule(data_dir=FIXTURES / "king_tiny", download=False)
    assert datamodule.table_transformer is None and datamodule.table_layout is None
    assert datamodule.released_transformer() is None and datamodule.fits_encoding is False
    assert datamodule.privacy_cost() == {"epsilon": 0.0, "delta": 0.0, "mechanism": "public schema"}
    assert datamodule.data_shape == (datamodule.schema.encoded_dim,)


def test_rows_in_schema_keeps_what_the_schema_encodes(frame):
    dirty = frame.head(6).copy()
    dirty.loc[dirty.index[[1, 4]], "colour"] = "purple"
    kept, report = dp_histogram.rows_in_schema(SCHEMA, dirty)
    assert list(kept.index) == [dirty.index[i] for i in (0, 2, 3, 5)] and report.rows_encoded == 4


@pytest.mark.parametrize("unknown", ["drop", "blank"])
def test_rows_in_schema_reports_as_encode_does_without_building_the_encoding(frame, monkeypatch, unknown):
    """It built the schema's whole dense encoding (float64 and a float32 copy) for the report
    alone: 8 GB thrown away at a million rows of 868 encoded columns, twice a run."""
    dirty = frame.head(40).copy()
    dirty.loc[dirty.index[[1, 4]], "colour"] = "purple"
    dirty.loc[dirty.index[7], "x"] = 50.0  # clipped
    encoded, expected = SCHEMA.encode(dirty, unknown=unknown)

    def no_encoding(*args, **kwargs):
        raise AssertionError("rows_in_schema built the dense encoding")

    monkeypatch.setattr(TableSchema, "encode", no_encoding)
    kept, report = dp_histogram.rows_in_schema(SCHEMA, dirty, unknown)
    assert report == expected and len(kept) == len(encoded) == report.rows_encoded
    assert report.clipped["x"]["above"] == 1 and report.rejected["colour"] == 2


def test_mode_specific_blank_keeps_an_unknown_category_as_a_zero_block(fitted, frame):
    """PATE-CTGAN trains on this encoding under replace-one: a row with an unknown category
    stays, with that column's one-hot block empty (not the last category, which a -1 index
    would have set); the other rows are encoded as without it."""
    transformer, _ = fitted
    dirty = frame.head(6).copy()
    dirty.loc[dirty.index[2], "colour"] = "purple"
    encoded, report = transformer.encode(dirty, unknown="blank")
    clean, _ = transformer.encode(frame.head(6))
    assert len(encoded) == 6 and report.rows_blanked == 1
    block = transformer.column_slices["colour"]
    assert encoded[2, block].sum() == 0 and encoded[2].abs().sum() > 0
    assert torch.equal(torch.cat([encoded[:2], encoded[3:]]), torch.cat([clean[:2], clean[3:]]))


# --- discrete columns (one-hot over a public grid) --------------------------------------------


def test_a_numeric_columns_grid_is_public_and_codes_clip_to_it():
    grade = Column("grade", "integer", bounds=(0.5, 13.0))
    assert grade.grid.tolist() == list(range(1, 14))
    assert grade.grid_codes(np.array([-3.0, 1.0, 7.4, 7.6, 13.0, 99.0])).tolist() == [0, 0, 6, 7, 12, 12]
    floors = Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5)
    assert floors.grid.tolist() == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    assert floors.grid_codes(np.array([1.0, 1.7, 1.8, 4.0])).tolist() == [0, 1, 2, 6]
    tenths = Column("t", "continuous", bounds=(0.0, 1.0), step=0.1)
    assert tenths.grid.tolist()[3] == 0.3  # written as typed() writes it, not 0.30000000000000004
    assert Column("x", "continuous", bounds=(0.0, 1.0)).grid is None
    assert Column("c", "categorical", categories=("a", "b")).grid is None
    with pytest.raises(SchemaError, match="no grid"):
        Column("x", "continuous", bounds=(0.0, 1.0)).grid_codes(np.array([0.5]))


def test_a_discrete_column_is_counted_value_by_value(frame):
    histograms, _ = dp_column_histograms(frame, SCHEMA, 1e13, discrete=["rooms"], rng=np.random.default_rng(0))
    rooms = histograms["rooms"]
    assert not rooms.is_numeric and rooms.categories == tuple(range(13))
    assert np.allclose(rooms.counts, np.bincount(frame["rooms"], minlength=13), atol=1e-6)


def test_a_discrete_column_keeps_the_sensitivity_and_the_noise_scale(frame):
    """One record still moves one bin of each column, and every grid bin (the empty ones
    too) gets Laplace noise of scale d / epsilon."""
    kwargs = dict(bins=16, log_columns=LOG, special_values=MIXED, discrete=["rooms"])
    without, with_one = true_counts(frame.iloc[1:], SCHEMA, **kwargs), true_counts(frame, SCHEMA, **kwargs)
    assert np.allclose([np.abs(with_one[n] - without[n]).sum() for n in SCHEMA.names], 1.0, atol=1e-6)
    schema = TableSchema((Column("n", "integer", bounds=(0, 199)),))
    values = pd.DataFrame({"n": np.full(50, 3)})
    rng = np.random.default_rng(3)
    releases = [dp_column_histograms(values, schema, 0.5, discrete=["n"], rng=rng) for _ in range(20)]
    assert all(len(h["n"].counts) == 200 and h["n"].scale == 2.0 for h, _ in releases)
    noise = np.concatenate([h["n"].counts - np.bincount(values["n"], minlength=200) for h, _ in releases])
    cost = releases[0][1]
    assert stats.kstest(noise, stats.laplace(scale=2.0).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=1.0).cdf).pvalue < 1e-6
    assert cost["epsilon"] == 0.5


def test_a_discrete_column_round_trips_exactly_and_conditions_on_its_values(frame):
    transformer, _ = TableTransformer.fit_dp(frame, SCHEMA, 50.0, mixed=MIXED, log_columns=LOG, discrete=["rooms"],
                                             rng=np.random.default_rng(0))
    rooms = transformer.column_slices["rooms"]
    assert rooms.stop - rooms.start == 13  # 0..12, one slot each
    encoded, _ = transformer.encode(frame)
    assert (encoded[:, rooms].sum(dim=1) == 1).all()
    assert (encoded[:, rooms].argmax(dim=1).numpy() == frame["rooms"].to_numpy()).all()
    decoded = transformer.decode(encoded)
    assert decoded["rooms"].dtype == np.int64 and (decoded["rooms"] == frame["rooms"]).all()
    colour, label = transformer.column_slices["colour"], transformer.column_slices["y"]
    assert transformer.condition_spans == [(rooms.start, 13), (colour.start, 3), (label.start, 2)]
    true_shares = np.bincount(frame["rooms"], minlength=13) / len(frame)
    assert np.abs(np.array(transformer.condition_frequencies[0]) - true_shares).max() < 0.02  # d/eps = 0.12 records
    restored = TableTransformer.from_dict(json.loads(json.dumps(transformer.to_dict())))
    assert restored == transformer and restored.layout() == transformer.layout()
    bounds = TableTransformer.from_bounds(SCHEMA, discrete=["rooms"])
    assert bounds.condition_frequencies[0] == pytest.approx([1 / 13] * 13)


def test_a_discrete_stepped_column_decodes_generated_logits_onto_its_grid():
    schema = TableSchema((Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5),))
    transformer = TableTransformer.from_bounds(schema, discrete=["floors"])
    logits = torch.full((3, 7), -5.0)
    logits[0, 0], logits[1, 3], logits[2, 6] = 1.0, 2.0, 0.5
    assert transformer.decode(logits)["floors"].tolist() == [1.0, 2.5, 4.0]


@pytest.mark.parametrize(
    ("discrete", "kwargs", "message"),
    [
        (["colour"], {}, "categorical"),
        (["nope"], {}, "not in the schema"),
        (["x"], {}, "no public grid"),
        (["gain"], {}, "can hold 10001 values"),
        (["rooms"], dict(mixed={"rooms": [0.0]}), "discrete and mixed or long-tail"),
        (["rooms"], dict(log_columns=["rooms"]), "discrete and mixed or long-tail"),
    ],
)
def test_bad_discrete_declarations_are_refused(discrete, kwargs, message):
    with pytest.raises(SchemaError, match=message):
        TableTransformer.from_bounds(SCHEMA, discrete=discrete, **kwargs)


def test_a_scalar_continuous_label_cannot_be_discrete():
    schema = TableSchema((Column("area", "integer", bounds=(0, 9)), Column("price", "integer", bounds=(0, 9))),
                         label="price", label_kind="continuous")
    with pytest.raises(SchemaError, match="cannot be discrete"):
        TableTransformer.from_bounds(schema, discrete=["price"])
    transformer = TableTransformer.from_bounds(schema, discrete=["price"], label_scalar=False)
    assert transformer.label_span == (2, 10, "continuous")  # after area's [alpha, one bounds mode]


def test_the_datamodule_encodes_its_declared_discrete_columns(tmp_path):
    kwargs = dict(data_dir=FIXTURES / "king_tiny", download=False, encoding="mode-specific", modes_epsilon=1.0)
    plain, discrete = KingDataModule(**kwargs), KingDataModule(**kwargs, discrete_columns="grade, floors")
    assert KingDataModule(encoding="mode-specific").discrete_columns == []
    kinds = {e.column.name: e.encoding for e in discrete.table_transformer.encoders}
    assert kinds["grade"] == kinds["floors"] == "discrete" and kinds["view"] == "mode-specific"
    assert len(discrete.table_layout["condition_spans"]) == len(plain.table_layout["condition_spans"]) + 2
    assert discrete.privacy_cost()["epsilon"] == plain.privacy_cost()["epsilon"] == 1.0
    discrete.setup()
    decoded = discrete.decode(discrete.train_dataset.tensors[0])
    train = discrete.train_frame.reset_index(drop=True)
    assert (decoded["grade"] == train["grade"]).all() and (decoded["floors"] == train["floors"]).all()
    with pytest.raises(ValueError, match="pass --data.encoding mode-specific"):
        KingDataModule(discrete_columns=["grade"])
    refused = KingDataModule(data_dir=tmp_path, download=False, encoding="mode-specific", discrete_columns=["zipcode"])
    with pytest.raises(SchemaError, match="categorical"):
        _ = refused.data_shape
    assert refused.train_frame is None  # checked before any row is read


def test_a_wide_integer_column_is_refused_as_discrete_without_building_its_grid():
    """A grid of 10^15 values would not fit in memory: the size is counted, not built."""
    schema = TableSchema((Column("n", "integer", bounds=(0, 1e15)),))
    assert schema.column("n").grid_size == 10**15 + 1
    with pytest.raises(SchemaError, match="can hold 1000000000000001 values"):
        TableTransformer.from_bounds(schema, discrete=["n"])


def test_fit_dp_takes_discrete_columns_from_any_iterable_and_never_thresholds_them(frame):
    kwargs = dict(mixed=MIXED, log_columns=LOG)
    plain, _ = TableTransformer.fit_dp(frame, SCHEMA, 0.5, discrete=iter(["rooms"]), rng=np.random.default_rng(4), **kwargs)
    cut, _ = TableTransformer.fit_dp(frame, SCHEMA, 0.5, discrete=("rooms",), threshold=100.0,
                                     rng=np.random.default_rng(4), **kwargs)
    assert plain.encoders[3].encoding == cut.encoders[3].encoding == "discrete"
    # the same release: the threshold cut every numeric count (100 scales) but no value frequency
    assert cut.encoders[3].frequencies == plain.encoders[3].frequencies
    assert cut.encoders[0].normalizer != plain.encoders[0].normalizer


def test_a_discrete_column_needs_a_histogram_counted_over_its_grid(frame):
    histograms, _ = dp_column_histograms(frame, SCHEMA, 1.0, rng=np.random.default_rng(0))  # rooms in 64 bins
    with pytest.raises(SchemaError, match="not counted over its grid"):
        TableTransformer.from_histograms(SCHEMA, histograms, discrete=["rooms"])


def test_a_transformer_description_with_an_unknown_encoding_or_wrong_widths_is_refused(frame):
    transformer = TableTransformer.from_bounds(SCHEMA, discrete=["rooms"])
    spec = json.loads(json.dumps(transformer.to_dict()))
    spec["columns"][3]["encoding"] = "ordinal"
    with pytest.raises(ValueError, match="unknown encoding 'ordinal'"):
        TableTransformer.from_dict(spec)
    spec["columns"][3]["encoding"] = "discrete"
    spec["columns"][3]["frequencies"] = spec["columns"][3]["frequencies"][:-1]
    with pytest.raises(ValueError, match=r"one frequency per value of the column \(13\), got 12"):
        TableTransformer.from_dict(spec)


def test_discrete_declarations_follow_the_datamodules_label_rules(tmp_path):
    """Bounds modes read no row; QUAIL's exclude_label leaves the label out of the declaration
    (as for the dataset's other roles), while a scalar continuous label is refused."""
    kwargs = dict(data_dir=empty_folder(tmp_path), download=False, encoding="mode-specific", modes="bounds")
    bounds = KingDataModule(**kwargs, discrete_columns=["grade"])
    grade = next(e for e in bounds.table_transformer.encoders if e.column.name == "grade")
    assert grade.encoding == "discrete" and grade.frequencies == pytest.approx([1 / 13] * 13)
    assert bounds.train_frame is None and bounds.privacy_cost()["epsilon"] == 0.0
    schema = TableSchema((Column("area", "integer", bounds=(0, 9)), Column("price", "integer", bounds=(0, 9))),
                         label="price", label_kind="continuous")
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema.to_dict()))
    csv_kwargs = dict(csv=write_csv(tmp_path / "t.csv", pd.DataFrame({"area": [1, 2], "price": [3, 4]})),
                      schema=schema_file, encoding="mode-specific", modes="bounds", discrete_columns=["area", "price"])
    features_only = CSVDataModule(**csv_kwargs, exclude_label=True)
    assert [e.encoding for e in features_only.table_transformer.encoders] == ["discrete"]
    with pytest.raises(SchemaError, match="cannot be discrete"):
        _ = CSVDataModule(**csv_kwargs).table_transformer


def test_condition_frequencies_and_modes_are_the_noisy_release_post_processed():
    """The conditional vector's category frequencies and a column's modes are post-processing of
    the one noisy release fit_dp draws, never of the rows' own counts."""
    frame = make_frame(600)
    epsilon = 0.5  # Laplace scale d/eps = 12 records: far from the raw shares
    released, _ = dp_column_histograms(frame, SCHEMA, epsilon, log_columns=LOG, special_values=MIXED,
                                       rng=np.random.default_rng(3))
    transformer, _ = TableTransformer.fit_dp(frame, SCHEMA, epsilon, mixed=MIXED, log_columns=LOG,
                                             rng=np.random.default_rng(3))
    for name, frequencies in zip(("colour", "y"), transformer.condition_frequencies):
        noisy = np.clip(released[name].counts, 0.0, None)
        assert frequencies == pytest.approx(noisy / noisy.sum())
        raw = frame[name].value_counts().reindex(list(SCHEMA.column(name).categories), fill_value=0).to_numpy()
        assert np.abs(np.array(frequencies) - raw / raw.sum()).max() > 1e-3  # the noise is there
    x = released["x"]
    assert transformer.encoders[0].normalizer == ModeSpecificNormalizer.fit_histogram(x.edges, x.counts, MAX_MODES, 0)


def test_the_label_scalar_uses_the_public_bounds_not_the_rows_range():
    """A continuous label's scalar is scaled by the schema's public bounds (log bounds for a long-tail
    label), never by the rows' min/max: a record's scalar does not move when another is removed."""
    schema = TableSchema(
        (Column("area", "continuous", bounds=(0.0, 100.0)), Column("price", "continuous", bounds=(0.0, 1e6))),
        label="price", label_kind="continuous",
    )
    frame = pd.DataFrame({"area": [10.0, 50.0, 90.0], "price": [2e5, 4e5, 6e5]})  # strictly inside the bounds
    for log_columns in ((), ("price",)):
        transformer = TableTransformer.from_bounds(schema, log_columns=log_columns)
        start = transformer.label_span[0]
        encoded, _ = transformer.encode(frame)
        price = frame["price"].to_numpy()
        expected = (2 * np.log1p(price) / np.log1p(1e6) - 1) if log_columns else 2 * price / 1e6 - 1
        assert encoded[:, start].numpy() == pytest.approx(expected, abs=1e-6)
        without_first, _ = transformer.encode(frame.iloc[1:])
        assert torch.equal(without_first, encoded[1:])  # a record's scalar is its own


def test_category_frequencies_clip_negative_noisy_counts_at_zero():
    """A category whose noisy count fell below 0 gets no frequency (its magnitude is noise, not
    records), so the conditional sampler never asks for it; nothing left positive: uniform."""
    assert _frequencies(np.array([-5.0, 10.0, 0.0])) == (0.0, 1.0, 0.0)
    assert _frequencies(np.array([-1.0, -2.0])) == (0.5, 0.5)


# --- added by the mutation audit -----------------------------------------------------------------


def test_condition_loss_is_the_mean_cross_entropy_over_rows():
    """With all-zero logits each row's cross-entropy is log(width of its chosen column), so the
    loss is the mean of those: a sum over rows would scale the generator's loss with the batch."""
    sampler = ConditionalSampler(SPANS, FREQUENCIES)
    cond, column = sampler.sample(64, generator=torch.Generator().manual_seed(2))
    widths = torch.tensor([width for _, width in SPANS], dtype=torch.float64)[column]
    expected = torch.log(widths).mean().item()
    assert sampler.condition_loss(torch.zeros(64, 8), cond, column).item() == pytest.approx(expected, rel=1e-6)


def test_negative_noisy_frequencies_give_a_category_no_mass_in_the_sampler():
    """DP frequencies may be negative after noise: clipped at 0 (never asked for), not mirrored."""
    sampler = ConditionalSampler([(0, 3)], [[-0.5, 1.0, 0.5]])
    assert sampler.category_probabilities(log_frequency=False)[0].tolist() == pytest.approx([0.0, 2 / 3, 1 / 3])


def test_conditional_sampler_refuses_inconsistent_layouts():
    with pytest.raises(ValueError, match="does not match 2 frequencies"):
        ConditionalSampler([(0, 3)], [[0.5, 0.5]])
    with pytest.raises(ValueError, match="log_scale"):
        ConditionalSampler(SPANS, FREQUENCIES, log_scale=0.0)
    with pytest.raises(ValueError, match="do not hold the condition blocks"):
        ConditionalSampler(SPANS, FREQUENCIES).from_records(torch.zeros(4, 7))  # the second block ends at 8


@pytest.mark.parametrize("mode", [2, -1])
def test_inverse_refuses_a_mode_index_outside_the_modes(mode):
    """-1 would silently read the last mode through numpy's negative indexing."""
    normalizer = ModeSpecificNormalizer([-5.0, 5.0], [1.0, 2.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="mode index"):
        normalizer.inverse([0.0], [mode])


def test_a_mode_needs_a_positive_std():
    with pytest.raises(ValueError, match="positive stds"):
        ModeSpecificNormalizer([0.0, 1.0], [1.0, 0.0])


def test_inverse_clips_alpha_to_a_tanh_range():
    """A generator's alpha beyond [-1, 1] (raw, not through its tanh) decodes to the edge of its
    mode, mu +- 4 sigma, not further out."""
    normalizer = ModeSpecificNormalizer([-5.0, 5.0], [1.0, 2.0], [0.5, 0.5])
    assert normalizer.inverse([3.0, -7.0], [0, 1]) == pytest.approx([-5.0 + 4.0, 5.0 - 8.0])


def test_the_posterior_weighs_each_mode_by_its_weight():
    """Halfway between two modes of equal std the densities are equal, so the posterior is the
    modes' weights themselves."""
    normalizer = ModeSpecificNormalizer([0.0, 1.0], [1.0, 1.0], [0.2, 0.8])
    assert normalizer.posterior([0.5])[0] == pytest.approx([0.2, 0.8])


def test_a_transformer_description_with_an_extra_column_is_refused():
    """A description naming a column its schema lacks was written for another table."""
    spec = json.loads(json.dumps(TableTransformer.from_bounds(SCHEMA).to_dict()))
    spec["columns"].append(dict(spec["columns"][0], name="stray"))
    with pytest.raises(ValueError, match="do not match its schema"):
        TableTransformer.from_dict(spec)


@pytest.mark.parametrize("log_columns", [(), ("price",)])
def test_a_continuous_label_outside_its_bounds_encodes_at_the_edge_of_the_scalar(log_columns):
    """The label scalar is clipped to the public bounds first, so an outlier price lands on -1 or
    1 like a price on the bound, never outside the tanh range a regressor can reach."""
    schema = TableSchema(
        (Column("area", "continuous", bounds=(0.0, 100.0)), Column("price", "continuous", bounds=(10.0, 1e6))),
        label="price",
        label_kind="continuous",
    )
    transformer = TableTransformer.from_bounds(schema, log_columns=log_columns)
    frame = pd.DataFrame({"area": [10.0, 20.0, 30.0, 40.0], "price": [-5e5, 10.0, 1e6, 3e6]})
    encoded, _ = transformer.encode(frame)
    start = transformer.label_span[0]
    assert encoded[:, start].tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0])


def test_a_scalar_continuous_label_takes_no_share_of_the_histogram_budget():
    """The scalar label is min-max over public bounds and needs no statistic: fit_dp must not
    count it, so the other columns' Laplace scale is d/ε with d not counting the label."""
    schema = TableSchema(
        (Column("area", "continuous", bounds=(0.0, 100.0)), Column("price", "continuous", bounds=(0.0, 1e6))),
        label="price",
        label_kind="continuous",
    )
    frame = pd.DataFrame({"area": np.linspace(10, 90, 50), "price": np.linspace(1e5, 9e5, 50)})

    class RecordedLaplace:
        """Real Laplace noise, with the scale of every draw kept."""

        def __init__(self):
            self.rng, self.scales = np.random.default_rng(0), []

        def laplace(self, loc=0.0, scale=1.0, size=None):
            self.scales.append(scale)
            return self.rng.laplace(loc, scale, size)

    scalar, mode_specific = RecordedLaplace(), RecordedLaplace()
    _, cost = TableTransformer.fit_dp(frame, schema, 5.0, max_modes=2, rng=scalar)
    assert scalar.scales and all(scale == pytest.approx(1 / 5.0) for scale in scalar.scales)  # d = 1: area alone
    assert cost["mechanism"].endswith("(L1 sensitivity 1)")
    # the same label encoded mode-specific is counted: d = 2, each column's noise twice as wide
    _, cost = TableTransformer.fit_dp(frame, schema, 5.0, max_modes=2, rng=mode_specific, label_scalar=False)
    assert mode_specific.scales and all(scale == pytest.approx(2 / 5.0) for scale in mode_specific.scales)
    assert cost["mechanism"].endswith("(L1 sensitivity 2)")


def test_a_long_tail_column_from_bounds_round_trips_through_its_log_space_mode():
    """Without data a long-tail column's one mode spans its bounds in log space, where its values
    are encoded: a mode over the raw bounds would squash every log value to one end."""
    transformer = TableTransformer.from_bounds(SCHEMA, mixed=MIXED, log_columns=LOG)
    frame = make_frame(100)
    decoded = transformer.decode(transformer.encode(frame)[0])
    assert decoded["lot"].to_numpy() == pytest.approx(frame["lot"].to_numpy(), rel=1e-3)


def test_a_discrete_column_refuses_a_histogram_counted_over_another_grid(frame):
    """A histogram over rooms 0..12 cannot give the frequencies of rooms declared 0..10."""
    histograms, _ = dp_column_histograms(frame, SCHEMA, 1.0, discrete=["rooms"], rng=np.random.default_rng(0))
    narrower = TableSchema(tuple(Column("rooms", "integer", bounds=(0, 10)) if c.name == "rooms" else c
                                 for c in SCHEMA.columns), label="y", label_kind="binary")
    with pytest.raises(SchemaError, match="not counted over its grid"):
        TableTransformer.from_histograms(narrower, histograms, discrete=["rooms"])


def test_a_value_clipped_onto_a_special_value_encodes_as_that_special_value():
    """gain's bound 0 is also its special value: -5, clipped to 0, is the special value 0 (its
    slot, alpha 0), exactly as a recorded 0 is, not a regular value at the bottom of a mode."""
    transformer = TableTransformer.from_bounds(SCHEMA, mixed=MIXED, log_columns=LOG)
    frame = make_frame(2).assign(gain=[-5, 0])
    encoded, _ = transformer.encode(frame)
    block = encoded[:, transformer.column_slices["gain"]]
    assert torch.equal(block[0], block[1])
    assert block[0].tolist() == [0.0, 1.0, 0.0]  # alpha, the special value 0, the one bounds mode


def test_sample_defaults_to_ctgans_log_frequency_law():
    """C2: CTGAN's training-by-sampling defaults to log-frequency (rare categories emphasised);
    a caller that does not say so gets ∝ log(1 + 1000 f), not ∝ f."""
    sampler = ConditionalSampler([(0, 2)], [[0.99, 0.01]])
    cond, _ = sampler.sample(20_000, generator=torch.Generator().manual_seed(0))
    share = cond[:, 1].mean().item()
    law = np.log1p(np.array([0.99, 0.01]) * 1000.0)
    assert share == pytest.approx(law[1] / law.sum(), abs=0.02)  # ~0.26; the linear law gives 0.01


def test_mode_weights_stay_with_their_modes_when_means_are_given_unsorted():
    """M8: modes are sorted by mean (a mixture fit returns them in any order); each weight must
    move with its mode, or the posterior favours the wrong one."""
    normalizer = ModeSpecificNormalizer([1.0, 0.0], [1.0, 1.0], [0.8, 0.2])
    assert normalizer.means.tolist() == [0.0, 1.0]
    assert normalizer.posterior([0.5])[0] == pytest.approx([0.2, 0.8])  # equal densities: the weights


def test_the_posterior_divides_each_density_by_its_std():
    """M7: at a shared mean the Gaussian density of a mode is 1/(sqrt(2 pi) sigma); a mode three
    times as wide takes a quarter of the posterior, not half."""
    normalizer = ModeSpecificNormalizer([0.0, 0.0], [1.0, 3.0], [0.5, 0.5])
    assert normalizer.posterior([0.0])[0] == pytest.approx([0.75, 0.25])


def test_each_columns_mode_is_drawn_from_its_own_uniform():
    """T10: two columns with the same modes and the same values must still draw their modes
    independently (CTGAN samples each column's mode on its own); one shared draw would tie every
    record's modes together across columns."""
    columns = (Column("a", "continuous", bounds=(-10.0, 10.0)), Column("b", "continuous", bounds=(-10.0, 10.0)))
    schema = TableSchema(columns=columns)
    normalizer = ModeSpecificNormalizer([-1.0, 1.0], [1.0, 1.0], [0.5, 0.5])
    transformer = TableTransformer(schema, [ColumnEncoder(c, MODE_SPECIFIC, normalizer) for c in columns], "bounds")
    values = np.random.default_rng(0).uniform(-0.01, 0.01, 400)  # posterior ~ (0.5, 0.5) in both columns
    encoded, _ = transformer.encode(pd.DataFrame({"a": values, "b": values}))
    mode_a, mode_b = encoded[:, 1:3].argmax(dim=1), encoded[:, 4:6].argmax(dim=1)
    assert 0.3 < mode_a.float().mean().item() < 0.7
    assert 0.3 < (mode_a == mode_b).float().mean().item() < 0.7  # independent draws agree about half the time
