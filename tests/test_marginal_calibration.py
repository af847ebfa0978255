"""Marginal calibration: generated numeric columns moved onto their released DP histogram, ranks
kept (closed-form quantiles on tiny histograms made here, a tiny transformer and a tiny run)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from test_ctgan_encoding import LOG, MIXED, SCHEMA, make_frame
from test_ctgan_models import KING_SCHEMA, check_decoded, run_args

from lightning_dpgan.cli import main
from lightning_dpgan.data.dp_histogram import NoisyHistogram, dp_column_histograms
from lightning_dpgan.data.marginal_calibration import Marginal
from lightning_dpgan.data.schema import Column, TableSchema
from lightning_dpgan.data.table_transformer import TableTransformer
from lightning_dpgan.datamodules.adult import AdultDataModule
from lightning_dpgan.datamodules.tabular import TabularDataModule
from lightning_dpgan.sampling import read_run_info, sample_to_file


def histogram(counts, edges, special_values=(), special_counts=(), log=False) -> NoisyHistogram:
    return NoisyHistogram(name="c", counts=np.asarray(counts, float), edges=np.asarray(edges, float),
                          special_values=tuple(special_values), special_counts=np.asarray(special_counts, float), log=log)


def test_the_quantiles_of_a_histogram_are_uniform_within_its_bins_with_special_values_as_atoms():
    # an atom of 2 at 0, then bins [0, 10) with 2 and [10, 20) with 4 (noise made one count negative: clipped)
    marginal = Marginal.from_histogram(histogram([2.0, 4.0, -3.0], [0.0, 10.0, 20.0, 30.0], [0.0], [2.0]), low=0.0)
    assert marginal.quantile(np.array([0.1, 0.25])).tolist() == [0.0, 0.0]  # the atom holds the first quarter
    np.testing.assert_allclose(marginal.quantile(np.array([0.25 + 0.125, 0.5, 0.75, 1.0])), [5.0, 10.0, 15.0, 20.0])
    assert len(marginal.weights) == 3  # the bin whose count the noise made negative holds nothing


def test_a_long_tail_marginal_is_uniform_in_log_space():
    low = 5.0
    edges = np.log1p(np.array([0.0, 99.0, 9999.0]))  # log(x - low + 1) at x = 5, 104, 10004
    marginal = Marginal.from_histogram(histogram([1.0, 1.0], edges, log=True), low=low)
    np.testing.assert_allclose(marginal.quantile(np.array([0.0, 0.25, 0.5, 1.0])),
                               [5.0, low + np.expm1(np.log1p(99.0) / 2), 104.0, 10004.0])


def test_a_long_tail_columns_special_value_is_an_atom_at_its_own_value():
    """A mixed long-tail column counts its special value (here 9, lower bound 5) apart: the atom
    sits at log(9 - 5 + 1) in the histogram's log space, between the bins [5, 104) and
    [104, 10004], and reads back as 9 -- not as exp(9) - 1 + 5 from a raw value taken for a log."""
    low = 5.0
    edges = np.log1p(np.array([0.0, 99.0, 9999.0]))
    marginal = Marginal.from_histogram(histogram([1.0, 2.0], edges, [9.0], [1.0], log=True), low=low)
    np.testing.assert_allclose(marginal.quantile(np.array([0.125, 0.3, 0.45, 0.5, 1.0])),
                               [low + np.expm1(np.log1p(99.0) / 2), 9.0, 9.0, 104.0, 10004.0])


def test_an_atom_comes_before_the_interval_it_opens_whatever_order_the_pieces_are_given_in():
    """A special value at a column's lower bound, given after the bin that starts there: its
    mass still holds the first probabilities (the class docstring's order)."""
    marginal = Marginal([0.0, 0.0], [10.0, 0.0], [3.0, 1.0])
    np.testing.assert_allclose(marginal.quantile(np.array([0.1, 0.2, 0.625, 1.0])), [0.0, 0.0, 5.0, 10.0])


def test_a_histogram_the_noise_left_empty_gives_no_marginal():
    assert Marginal.from_histogram(histogram([-1.0, 0.0], [0.0, 1.0, 2.0]), low=0.0) is None
    assert Marginal.from_grid([1, 2, 3], [0.0, 0.0, 0.0]) is None


def test_calibration_keeps_the_order_of_the_records_and_gives_the_marginals_quantiles():
    marginal = Marginal.from_grid([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    values = np.array([7.5, -2.0, 3.3, 0.1, 9.0, 4.4, 2.2, 8.1, 5.0, 6.6])
    calibrated = marginal.calibrate(values, np.zeros(len(values)))
    order = np.argsort(values)
    assert (np.diff(calibrated[order]) >= 0).all()  # a larger generated value never gets a smaller one
    assert sorted(calibrated.tolist()) == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]  # (r + 1/2)/10 quantiles: the frequencies exactly


def test_equal_generated_values_are_spread_over_the_marginal_in_the_order_of_their_tie_breaks():
    """A collapsed column (every record 3 bedrooms) gets the marginal's spread; which record
    gets which value follows the tie breaks, not the row order."""
    marginal = Marginal.from_grid([1, 2, 3, 4], [0.25, 0.25, 0.25, 0.25])
    tie_breaks = np.array([0.9, 0.1, 0.6, 0.3])
    assert marginal.calibrate(np.full(4, 3.0), tie_breaks).tolist() == [4.0, 1.0, 3.0, 2.0]
    with pytest.raises(ValueError, match="need as many tie breaks"):
        marginal.calibrate(np.ones(4), np.ones(3))


def test_a_marginal_reads_back_from_its_description_bit_for_bit_and_refuses_a_malformed_one():
    marginal = Marginal.from_histogram(histogram([3.0, 1.0, 7.0], [0.0, 0.3, 0.7, 1.1], [0.0], [5.0]), low=0.0)
    restored = Marginal.from_dict(json.loads(json.dumps(marginal.to_dict())))
    assert restored == marginal and restored.weights.tolist() == marginal.weights.tolist()
    for broken in ({"starts": [0.0], "ends": [1.0], "weights": [-1.0]}, {"starts": [1.0], "ends": [0.0], "weights": [1.0]},
                   {"starts": [0.0, 1.0], "ends": [1.0], "weights": [1.0]}, {"starts": [0.0], "ends": [1.0]}):
        with pytest.raises(ValueError, match="a marginal"):
            Marginal.from_dict(broken)


@pytest.fixture(scope="module")
def calibrated_transformer() -> TableTransformer:
    transformer, _ = TableTransformer.fit_dp(make_frame(3000), SCHEMA, 50.0, mixed=MIXED, log_columns=LOG,
                                             rng=np.random.default_rng(0), threshold=3.0, calibrated=True)
    return transformer


def test_each_numeric_columns_marginal_is_the_release_the_modes_saw():
    """The marginal is the noisy histogram after the threshold (not the raw counts, not a
    recount of the rows), and a discrete column's is its released value frequencies."""
    frame = make_frame(3000)
    transformer, _ = TableTransformer.fit_dp(frame, SCHEMA, 5.0, mixed=MIXED, log_columns=LOG, rng=np.random.default_rng(7),
                                             threshold=3.0, discrete=["rooms"])
    released, _ = dp_column_histograms(frame, SCHEMA, 5.0, 64, LOG, MIXED, rng=np.random.default_rng(7), discrete=["rooms"])
    for name in ("x", "gain", "lot"):
        expected = Marginal.from_histogram(released[name].thresholded(3.0), SCHEMA.column(name).bounds[0])
        assert transformer.encoders[SCHEMA.names.index(name)].marginal == expected
        assert transformer.encoders[SCHEMA.names.index(name)].marginal != Marginal.from_histogram(released[name], 0.0)
    rooms = transformer.encoders[SCHEMA.names.index("rooms")]
    assert rooms.marginal == Marginal.from_grid(SCHEMA.column("rooms").grid, rooms.frequencies)
    assert transformer.encoders[SCHEMA.names.index("colour")].marginal is None


def test_a_calibrated_transformer_spreads_a_collapsed_batch_over_the_released_marginals(calibrated_transformer):
    """What the option is for: a generator that gives every record the same row."""
    collapsed = calibrated_transformer.encode(make_frame(1, seed=1))[0].repeat(2000, 1)
    plain = calibrated_transformer.with_calibration(False).decode(collapsed)
    assert (plain.nunique() == 1).all()
    decoded = calibrated_transformer.decode(collapsed, generator=torch.Generator().manual_seed(0))
    real = make_frame(3000)
    for name in ("x", "rooms", "lot"):
        marginal = calibrated_transformer.encoders[SCHEMA.names.index(name)].marginal
        expected = SCHEMA.column(name).typed(marginal.quantile((np.arange(2000) + 0.5) / 2000))
        np.testing.assert_allclose(np.sort(decoded[name].to_numpy(float)), np.sort(expected))
        assert abs(decoded[name].median() - real[name].median()) < 0.1 * real[name].std()  # the histogram is the data's
    assert (decoded["gain"] == 0).mean() == pytest.approx((real["gain"] == 0).mean(), abs=0.05)  # the special value's share
    assert decoded["colour"].nunique() == 1  # categories are the generator's: calibration is for numbers


def test_calibration_is_kept_in_the_description_and_needs_released_marginals(calibrated_transformer):
    spec = calibrated_transformer.to_dict()
    assert spec["calibrated"] is True and "marginal" in spec["columns"][0]
    assert TableTransformer.from_dict(spec) == calibrated_transformer
    older = {**spec, "columns": [{k: v for k, v in column.items() if k != "marginal"} for column in spec["columns"]]}
    older.pop("calibrated")
    assert TableTransformer.from_dict(older).calibrated is False  # written before calibration existed
    with pytest.raises(ValueError, match="train again to calibrate"):
        TableTransformer.from_dict(older).with_calibration(True)
    with pytest.raises(ValueError, match="released marginals"):
        TableTransformer.from_bounds(SCHEMA).with_calibration(True)


def test_calibration_refused_when_the_threshold_left_no_marginal_says_so():
    """A threshold that cut every bin leaves nothing to calibrate to; it was told to train again
    with --data.modes dp, which it had done. Without calibration the same release still trains."""
    fit = dict(mixed=MIXED, log_columns=LOG, rng=np.random.default_rng(0), threshold=1e9)
    with pytest.raises(ValueError, match=r"nothing to calibrate to.*Lower --data.histogram_threshold"):
        TableTransformer.fit_dp(make_frame(300), SCHEMA, 1.0, calibrated=True, **fit)
    transformer, _ = TableTransformer.fit_dp(make_frame(300), SCHEMA, 1.0, **fit)
    assert all(encoder.marginal is None for encoder in transformer.encoders)


@pytest.mark.parametrize("settings, message", [
    (dict(calibrate_marginals=True), "needs --data.encoding mode-specific with --data.modes dp"),
    (dict(encoding="mode-specific", modes="bounds", calibrate_marginals=True), "needs --data.encoding mode-specific"),
    (dict(encoding="mode-specific", calibrate_marginals="yes"), "calibrate_marginals must be true or false"),
    # the histogram's own settings where none is released: they were taken, recorded and did nothing
    (dict(modes_epsilon=0.5), r"^--data.modes_epsilon sets the DP histogram .* with --data.encoding minmax no "
                              "histogram is released and nothing is spent on modes: leave it out$"),
    (dict(modes_epsilon=0.5, histogram_threshold=3),
     r"^--data.modes_epsilon and --data.histogram_threshold set the DP histogram .*: leave them out$"),
])
def test_the_datamodule_refuses_calibration_without_a_dp_histogram(settings, message):
    with pytest.raises(ValueError, match=message):
        AdultDataModule(**settings)


def test_the_histograms_settings_are_taken_where_it_is_released_and_their_defaults_anywhere():
    released = AdultDataModule(encoding="mode-specific", modes_epsilon=0.5, histogram_threshold=3)
    assert released.hparams.histogram_threshold == 3
    assert released.planned_privacy_cost()["parts"]["modes"]["epsilon"] == 0.5  # the histogram this run will draw
    defaults = AdultDataModule(modes_epsilon=0.1, histogram_threshold=0)  # as a run's config.yaml lists them
    assert defaults.planned_privacy_cost()["epsilon"] == 0.0  # min-max encoding: no histogram, nothing spent
    # --data.modes bounds turns off the DP modes that a CTGAN model's presets set these for
    public = AdultDataModule(encoding="mode-specific", modes="bounds", modes_epsilon=0.5, histogram_threshold=3)
    assert public.planned_privacy_cost()["epsilon"] == 0.0


def test_a_resumed_datamodule_calibrates_as_this_run_asks(calibrated_transformer):
    """Calibration is post-processing of the release: a resume may switch it either way."""
    cost = {"epsilon": 0.1, "delta": 0.0, "mechanism": "laplace", "neighbours": "add-remove"}
    released = calibrated_transformer.to_dict()
    for wanted in (False, True):
        datamodule = _tiny_datamodule(calibrate_marginals=wanted)
        datamodule.restore_transformer(released, cost)
        assert datamodule.table_transformer.calibrated is wanted


class TinyDataModule(TabularDataModule):
    """A table datamodule over the tiny schema (restored transformers only: it reads no file)."""

    name = "tiny"

    def _build_schema(self):
        return SCHEMA


def _tiny_datamodule(**settings):
    return TinyDataModule(encoding="mode-specific", mixed=MIXED, log_columns=LOG, **settings)


def test_a_calibrated_run_writes_and_samples_the_released_marginals(tmp_path):
    """(No threshold: at 40 rows the King preset's cut of 4 noise scales leaves no count, and a
    column without a marginal keeps its generated values.)"""
    output = tmp_path / "run"
    assert main(run_args("dpctgan", "king", output, 2, "--data.calibrate_marginals", "true", "--num_synthetic", "400",
                         "--data.histogram_threshold", "0")) == 0
    synthetic = pd.read_csv(output / "synthetic.csv")
    check_decoded(synthetic, KING_SCHEMA)
    released = TableTransformer.from_dict(read_run_info(output / "checkpoints" / "last.ckpt")["table_transformer"])
    assert released.calibrated
    for name in ("sqft_living", "grade", "lat"):
        marginal = released.encoders[KING_SCHEMA.names.index(name)].marginal
        expected = KING_SCHEMA.column(name).typed(marginal.quantile((np.arange(400) + 0.5) / 400))
        np.testing.assert_allclose(np.sort(synthetic[name].to_numpy(float)), np.sort(expected), rtol=1e-9)
    report = json.loads((output / "privacy.json").read_text())
    assert report["preprocessing"]["parts"]["modes"]["epsilon"] == pytest.approx(0.1)  # nothing more spent
    published = sample_to_file(output / "checkpoints" / "last.ckpt", 40, tmp_path / "published.csv")
    marginal = released.encoders[KING_SCHEMA.names.index("sqft_living")].marginal
    expected = KING_SCHEMA.column("sqft_living").typed(marginal.quantile((np.arange(40) + 0.5) / 40))
    np.testing.assert_allclose(np.sort(pd.read_csv(published)["sqft_living"].to_numpy(float)), np.sort(expected), rtol=1e-9)


# ---------------------------------------------------------------- the released histograms
class ZeroNoise:
    """An ``rng`` whose Laplace draws are zeros (the true counts show), recording the scales."""

    def __init__(self) -> None:
        self.scales = []

    def laplace(self, loc, scale, size):
        self.scales.append(scale)
        return np.zeros(size)


def test_a_long_tail_histogram_counts_values_beyond_the_bounds_in_the_outermost_bins_of_log_space():
    """Edges run over [0, log(high - low + 1)] of log(x - low + 1), fixed by the public bounds;
    a value below the lower bound is clipped to it first (log of a negative argument would be
    NaN and land in the top bin), one above the upper bound counts in the top bin."""
    from lightning_dpgan.data.schema import Column, TableSchema

    schema = TableSchema(columns=(Column("lot", "continuous", bounds=(5.0, 10_004.0)),
                                  Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")
    frame = pd.DataFrame({"lot": [1.0, 5.0, 50.0, 20_000.0], "y": ["no", "yes", "no", "yes"]})
    released, cost = dp_column_histograms(frame, schema, 2.0, bins=4, log_columns=["lot"], rng=ZeroNoise())
    lot = released["lot"]
    np.testing.assert_allclose(lot.edges, np.linspace(0.0, np.log(10_000.0), 5))
    assert lot.counts.tolist() == [2.0, 1.0, 0.0, 1.0]  # log(46) = 3.8 is in the second of four bins of 2.3
    assert lot.scale == 2 / 2.0 and cost["epsilon"] == 2.0


def test_a_threshold_cuts_regular_and_special_counts_alike_in_units_of_the_noise_scale():
    """thresholded(k) zeroes every count below k noise scales, the special values' counts too
    (an invented special count is as misleading as an invented bin); kept_mass and kept_bins
    read counts clipped at 0."""
    released = NoisyHistogram(name="c", counts=np.array([1.0, 5.0, 7.0, -3.0]), edges=np.arange(5.0),
                              special_values=(0.0, 2.0), special_counts=np.array([3.0, 7.0]), scale=2.0)
    cut = released.thresholded(3.0)  # 3 scales of 2: counts below 6 go
    assert cut.counts.tolist() == [0.0, 0.0, 7.0, 0.0] and cut.special_counts.tolist() == [0.0, 7.0]
    assert (released.kept_mass, released.kept_bins) == (1.0 + 5.0 + 7.0 + 3.0 + 7.0, 5)
    assert (cut.kept_mass, cut.kept_bins) == (14.0, 2)


def test_rows_with_an_unknown_category_are_counted_in_no_histogram_even_when_training_blanks_them():
    """unknown="blank" keeps such rows for training, but a row with no category has no bin in
    that column's histogram: it is left out of every column's, so each counted record moves one
    bin of each column and nothing reads a record the release does not count everywhere."""
    from lightning_dpgan.data.schema import Column, TableSchema

    schema = TableSchema(columns=(Column("x", "continuous", bounds=(0.0, 4.0)),
                                  Column("colour", "categorical", categories=("red", "green")),
                                  Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")
    frame = pd.DataFrame({"x": [0.5, 1.5, 2.5, 3.5], "colour": ["red", "purple", "green", "red"],
                          "y": ["no", "yes", "no", "yes"]})
    released, _ = dp_column_histograms(frame, schema, 1.0, bins=4, rng=ZeroNoise(), unknown="blank")
    assert released["x"].counts.tolist() == [1.0, 0.0, 1.0, 1.0]  # the purple row (x = 1.5) is not counted
    assert released["colour"].counts.tolist() == [2.0, 1.0] and released["y"].counts.tolist() == [2.0, 1.0]


def test_a_discrete_column_may_hold_256_values_and_no_more():
    from lightning_dpgan.data.dp_histogram import MAX_DISCRETE_VALUES, check_column_roles
    from lightning_dpgan.data.schema import Column, SchemaError, TableSchema

    def schema(high):
        return TableSchema(columns=(Column("k", "integer", bounds=(0, high)),
                                    Column("y", "categorical", categories=("no", "yes"))), label="y", label_kind="binary")

    assert MAX_DISCRETE_VALUES == 256
    check_column_roles(schema(255), {}, [], ["k"])  # 0..255: 256 values
    with pytest.raises(SchemaError, match="can hold 257 values"):
        check_column_roles(schema(256), {}, [], ["k"])


def test_calibration_ranks_by_value_first_and_uses_tie_breaks_only_for_ties():
    """K2: the tie breaks order equal values only; distinct generated values keep their order
    whatever their tie breaks say."""
    marginal = Marginal.from_grid([1, 2, 3, 4], [0.25, 0.25, 0.25, 0.25])
    calibrated = marginal.calibrate(np.array([4.0, 1.0, 3.0, 2.0]), np.array([0.1, 0.9, 0.5, 0.3]))
    assert calibrated.tolist() == [4.0, 1.0, 3.0, 2.0]


def test_a_calibrated_long_tail_column_with_a_nonzero_lower_bound_reads_its_marginal_in_its_own_units():
    """T13: a long-tail column's histogram is counted in log(x - low + 1); its calibration
    marginal must map back with the column's own lower bound, not 0 (else every value is shifted
    down by ``low`` and then clipped to it)."""
    low, high = 100.0, 10_100.0
    schema = TableSchema(columns=(Column("price", "continuous", bounds=(low, high)),))
    top = float(np.log1p(high - low))
    histogram = NoisyHistogram(name="price", counts=np.array([50.0, 50.0]), edges=np.array([0.0, top / 2, top]),
                               log=True, scale=1.0)
    transformer = TableTransformer.from_histograms(schema, {"price": histogram}, log_columns=["price"], calibrated=True,
                                                   max_modes=1)
    encoder = transformer.encoders[0]
    block = np.zeros((4, transformer.encoded_dim))
    block[:, 0] = [-0.5, -0.1, 0.1, 0.5]
    block[:, 1] = 1.0  # first mode for every row
    decoded = transformer.decode(block, generator=torch.Generator().manual_seed(0))["price"].to_numpy()
    expected = low + np.expm1(top * (np.arange(4) + 0.5) / 4)  # the (r + 1/2)/n quantiles, uniform in log space
    assert encoder.log and decoded == pytest.approx(expected)
