"""TableSchema: fixed public encoding, the clip/reject rule, clear errors, and no data leak."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from lightning_dpgan.data.schema import Column, EncodingReport, SchemaError, TableSchema, as_schema_categories


def make_schema(**overrides) -> TableSchema:
    spec = dict(
        columns=(
            Column("height", "continuous", bounds=(100.0, 220.0), source="test"),
            Column("age", "integer", bounds=(0, 120)),
            Column("colour", "categorical", categories=("red", "green", "blue")),
            Column("zone", "categorical", categories=(10, 20)),
            Column("label", "categorical", categories=("no", "yes")),
        ),
        label="label",
        label_kind="binary",
    )
    spec.update(overrides)
    return TableSchema(**spec)


def make_frame(n: int = 50, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "height": rng.uniform(100, 220, n),
            "age": rng.integers(0, 121, n),
            "colour": rng.choice(["red", "green", "blue"], n),
            "zone": rng.choice([10, 20], n),
            "label": rng.choice(["no", "yes"], n),
        }
    )


# --- layout and round trip ----------------------------------------------------------------------


def test_layout_slices_cover_the_encoded_vector():
    schema = make_schema()
    assert schema.encoded_dim == 1 + 1 + 3 + 2 + 2
    slices = schema.column_slices
    assert list(slices) == schema.names
    assert [s.start for s in slices.values()] == [0, 1, 2, 5, 7]
    assert slices["label"].stop == schema.encoded_dim
    assert schema.label_slice == slice(7, 9)


def test_encode_decode_round_trip_restores_values_dtypes_and_categories():
    schema, frame = make_schema(), make_frame()
    records, report = schema.encode(frame)
    assert records.dtype == torch.float32 and records.shape == (len(frame), schema.encoded_dim)
    assert records.min() >= 0 and records.max() <= 1
    assert report.rows_encoded == len(frame) and report.rows_rejected == 0

    decoded = schema.decode(records)
    assert list(decoded.columns) == list(frame.columns)
    np.testing.assert_allclose(decoded["height"], frame["height"], atol=120 * 1e-6)
    assert decoded["age"].dtype == np.int64
    np.testing.assert_array_equal(decoded["age"], frame["age"])
    for name in ("colour", "zone", "label"):
        assert isinstance(decoded[name].dtype, pd.CategoricalDtype)
        assert list(decoded[name].cat.categories) == list(schema.column(name).categories)
        assert decoded[name].astype(object).tolist() == frame[name].tolist()


def test_one_hot_follows_the_schema_category_order():
    schema = make_schema()
    frame = make_frame(3).assign(colour=["blue", "red", "green"])
    records, _ = schema.encode(frame)
    block = records[:, schema.column_slices["colour"]]
    assert block.tolist() == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]


def test_decode_maps_any_generator_output_inside_the_schema():
    schema = make_schema()
    decoded = schema.decode(torch.randn(200, schema.encoded_dim) * 3)
    assert decoded["height"].between(100, 220).all()
    assert decoded["age"].between(0, 120).all()
    assert set(decoded["colour"]) <= {"red", "green", "blue"}


def test_decode_rejects_wrong_shapes_and_non_finite_values():
    schema = make_schema()
    with pytest.raises(ValueError, match="shape"):
        schema.decode(torch.zeros(4, schema.encoded_dim + 1))
    bad = torch.zeros(2, schema.encoded_dim)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        schema.decode(bad)


# --- the stated rule for out-of-schema values --------------------------------------------------


def test_numeric_values_outside_the_bounds_are_clipped_and_counted():
    schema = make_schema()
    frame = make_frame(6)
    frame.loc[0, "height"] = 50.0
    frame.loc[1, "height"] = 1e9
    frame.loc[2, "height"] = 1e300
    frame.loc[3, "age"] = 150
    records, report = schema.encode(frame)
    assert report.clipped["height"] == {"below": 1, "above": 2}
    assert report.clipped["age"] == {"below": 0, "above": 1}
    assert records[:3, 0].tolist() == [0.0, 1.0, 1.0]
    decoded = schema.decode(records)
    assert decoded.loc[1, "height"] == 220.0 and decoded.loc[3, "age"] == 120


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_an_infinite_value_is_refused_not_clipped(value):
    """Clipped, an infinity would pass for the bound itself: refused like a missing value."""
    frame = make_frame(6)
    frame.loc[2, "height"] = value
    with pytest.raises(SchemaError, match=rf"column 'height' holds infinite values \(1 row: {value!r} \(data row 3\)\)"):
        make_schema().encode(frame)


def test_unknown_categories_reject_their_rows_and_are_counted():
    schema = make_schema()
    frame = make_frame(10)
    frame.loc[[2, 5], "colour"] = "purple"
    frame.loc[5, "zone"] = 30
    records, report = schema.encode(frame)
    assert report.rejected == {"colour": 2, "zone": 1, "label": 0}
    assert report.rows_in == 10 and report.rows_encoded == 8 and len(records) == 8
    assert report.to_dict()["rows_rejected"] == 2
    expected, _ = schema.encode(frame.drop(index=[2, 5]))
    assert torch.equal(records, expected)


def test_unknown_categories_raise_when_asked():
    frame = make_frame(10)
    frame.loc[4, "colour"] = "purple"
    with pytest.raises(SchemaError, match="colour"):
        make_schema().encode(frame, unknown="error")
    with pytest.raises(ValueError, match="unknown must be"):
        make_schema().encode(frame, unknown="ignore")


def test_a_non_binary_label_is_an_error_not_a_silent_drop():
    frame = make_frame(10)
    frame.loc[3, "label"] = "maybe"
    with pytest.raises(SchemaError, match="binary"):
        make_schema().encode(frame)


def test_report_to_dict_and_summary():
    report = EncodingReport(5, 4, {"x": {"below": 1, "above": 0}}, {"c": 1})
    assert report.to_dict() == {
        "rows_in": 5,
        "rows_encoded": 4,
        "rows_rejected": 1,
        "rows_blanked": 0,
        "clipped": {"x": {"below": 1, "above": 0}},
        "rejected": {"c": 1},
    }
    assert "4/5" in report.summary() and "'x': 1" in report.summary()


def test_blank_keeps_a_row_with_an_unknown_category_and_zeroes_only_that_block():
    """For replace-one training: the row stays (the number of rows does not depend on a value),
    its unknown column encodes as no category, its other columns as usual."""
    schema = make_schema()
    frame = make_frame(10)
    frame.loc[3, "colour"] = "purple"
    records, report = schema.encode(frame, unknown="blank")
    dropped, _ = schema.encode(frame, unknown="drop")
    assert len(records) == 10 and report.rows_encoded == 10 and report.rows_blanked == 1 and report.rejected["colour"] == 1
    block = schema.column_slices["colour"]
    assert records[3, block].sum() == 0
    others = [i for i in range(schema.encoded_dim) if not block.start <= i < block.stop]
    reference, _ = schema.encode(frame.drop(index=3).reset_index(drop=True))
    assert torch.equal(torch.cat([records[:3], records[4:]]), reference) and torch.equal(dropped, reference)
    # the blanked row's other columns are its own encoding, not shifted by the missing category
    known, _ = schema.encode(frame.loc[[3]].assign(colour="red").reset_index(drop=True))
    assert torch.equal(records[3, others], known[0, others])


def test_fractional_bounds_decode_and_code_integers_within_them():
    """DP-estimated bounds are fractional: an integer column on (0.4, 10) holds 1..10, so 0.4
    decodes to 1, not 0, and codes run 0..9 (-1 would mark the last value in a one-hot)."""
    column = Column("rooms", "integer", bounds=(0.4, 10.0), source="test")
    assert column.typed(np.array([0.4, 0.2, 10.3, 5.6])).tolist() == [1, 1, 10, 6]
    assert column.grid.tolist() == list(range(1, 11))
    assert column.grid_codes(np.array([0.4, 1.0, 10.0, 12.0])).tolist() == [0, 0, 9, 9]


def test_grid_values_keep_the_decimals_of_their_bound_and_step_and_stay_within_the_bounds():
    """Rounded to a fixed 10 decimals, a 1e-13 step's values were all written 0.0 (below the
    bound), and a bound of 12 decimals lost two, decoding below itself: evaluate then called the
    table edited."""
    pico = Column("pico", "continuous", bounds=(1e-12, 2e-12), step=1e-13, source="test")
    assert pico.grid.tolist()[:3] == [1e-12, 1.1e-12, 1.2e-12] and len(set(pico.grid.tolist())) == pico.grid_size == 11
    assert pico.typed(np.array([1.5e-12, 0.0, 3e-12])).tolist() == [1.5e-12, 1e-12, 2e-12]
    precise = Column("p", "continuous", bounds=(0.123456789012, 1.0), step=0.1, source="test")
    assert precise.typed(np.array([0.72, 0.0])).tolist() == [0.723456789012, 0.123456789012]
    below = Column("q", "continuous", bounds=(-2.00000000007, 3.0), step=0.5, source="test")
    assert below.typed(np.array([-5.0])).tolist() == [-2.00000000007]
    assert Column("s", "continuous", bounds=(0.0, 1.0), step=0.1, source="test").grid.tolist()[3] == 0.3


def test_a_step_that_does_not_divide_the_range_decodes_onto_its_grid():
    """Bounds (0, 1) with step 0.6 hold 0 and 0.6: 1.0 decodes to 0.6, not to 1.2 past the bound."""
    column = Column("share", "continuous", bounds=(0.0, 1.0), step=0.6, source="test")
    assert column.grid.tolist() == [0.0, 0.6]
    assert column.typed(np.array([1.0, 0.2, 0.35])).tolist() == [0.6, 0.0, 0.6]
    assert column.grid_codes(np.array([1.0, 0.0])).tolist() == [1, 0]


def test_a_continuous_column_without_a_step_drops_the_float32_digits():
    """The generator's outputs are float32: decoded without a step, 75143.97 was written to
    synthetic.csv as 75143.96875 and 0.1 as 0.10000000149011612. Seven significant digits of the
    smaller of the value and the range are kept: a log-scale value near zero keeps its own digits,
    a value far from zero in a narrow range keeps the range's."""
    price = Column("price", "continuous", bounds=(0.0, 7.7e6), source="test")
    drawn = np.array([np.float32(75143.97), np.float32(0.0032), 0.0, 7.7e6], dtype=np.float64)
    assert drawn[0] == 75143.96875
    assert price.typed(drawn).tolist() == [75143.97, 0.0032, 0.0, 7.7e6]
    share = Column("share", "continuous", bounds=(0.0, 1.0), source="test")
    assert share.typed(np.array([np.float32(0.1)], dtype=np.float64)).tolist() == [0.1]
    narrow = Column("reading", "continuous", bounds=(1e6, 1e6 + 1), source="test")
    assert narrow.typed(np.array([1e6 + 0.123456789])).tolist() == [1000000.1234568]
    tiny = Column("dose", "continuous", bounds=(-1e-6, 1e-6), source="test")
    assert tiny.typed(np.array([np.float32(3.3e-7)], dtype=np.float64)).tolist() == [3.3e-7]
    # a bound of more digits stays the bound: rounded, it passed it, and evaluate called the table edited
    precise = Column("income", "continuous", bounds=(1234.5671234, 98765.4376543), source="test")
    assert precise.typed(np.array([0.0, 1e9, 5e4])).tolist() == [1234.5671234, 98765.4376543, 5e4]


# --- privacy: the encoder is fixed by the schema alone -----------------------------------------


def test_changing_an_out_of_bounds_private_value_changes_nothing_else():
    schema = make_schema()
    before = schema.to_dict()
    frame = make_frame(30)
    frame.loc[7, "height"] = 1e6
    outlier = frame.copy()
    outlier.loc[7, "height"] = 1e15  # the same record, an even bigger outlier
    encoded, _ = schema.encode(frame)
    encoded_outlier, _ = schema.encode(outlier)
    assert torch.equal(encoded, encoded_outlier)  # clipped to the same bound
    assert schema.to_dict() == before and schema == make_schema()


def test_one_record_cannot_move_any_other_records_encoding():
    schema = make_schema()
    frame = make_frame(30)
    changed = frame.copy()
    changed.loc[0, ["height", "age", "colour"]] = [-1e12, 0, "blue"]
    encoded, _ = schema.encode(frame)
    encoded_changed, _ = schema.encode(changed)
    assert torch.equal(encoded[1:], encoded_changed[1:])
    # each row alone encodes exactly as within the table: no statistic of the table is read
    alone = torch.cat([schema.encode(frame.iloc[[i]])[0] for i in range(len(frame))])
    assert torch.equal(alone, encoded)


def test_an_unseen_category_does_not_widen_the_encoding():
    schema = make_schema()
    frame = make_frame(10)
    frame.loc[0, "colour"] = "a-rare-private-value"
    records, _ = schema.encode(frame)
    assert records.shape[1] == schema.encoded_dim
    assert torch.equal(records, schema.encode(make_frame(10).drop(index=[0]))[0])


# --- clear errors ------------------------------------------------------------------------------


def test_missing_values_are_named_with_counts():
    frame = make_frame(10)
    frame.loc[[1, 2], "height"] = np.nan
    frame.loc[3, "colour"] = None
    with pytest.raises(SchemaError, match=r"height \(2 rows: data rows 2, 3\), colour \(1 rows: data row 4\)"):
        make_schema().encode(frame)


def test_missing_target_is_named():
    with pytest.raises(SchemaError, match="target column 'label' is missing"):
        make_schema().validate_frame(make_frame(5).drop(columns=["label"]))


def test_missing_columns_are_named():
    with pytest.raises(SchemaError, match=r"missing from the data: \['age'\]; the schema names every column the data "
                                          r"must hold: add them to the data, or remove them from the schema$"):
        make_schema().validate_frame(make_frame(5).drop(columns=["age"]))
    # renamed: the unexpected name is the clue to what happened
    with pytest.raises(SchemaError, match=r"missing from the data: \['age'\] \(and the data has columns the schema "
                                          r"does not name: \['Age'\]\)"):
        make_schema().validate_frame(make_frame(5).rename(columns={"age": "Age"}))


def test_unknown_columns_are_an_error_unless_dropped():
    frame = make_frame(5).assign(customer_id=range(5))
    with pytest.raises(SchemaError, match=r"unknown columns.*customer_id"):
        make_schema().validate_frame(frame)
    records, _ = make_schema(drop=("customer_id",)).encode(frame)
    assert records.shape == (5, make_schema().encoded_dim)


def test_dtype_problems_are_clear():
    schema = make_schema()
    with pytest.raises(SchemaError, match="'height' is continuous but holds non-numeric"):
        schema.validate_frame(make_frame(5).assign(height="tall"))
    with pytest.raises(SchemaError, match="'age' is integer but 1 rows hold fractional"):
        schema.validate_frame(make_frame(5).assign(age=[1, 2, 3.5, 4, 5]))
    with pytest.raises(SchemaError, match="'zone' has numeric categories"):
        schema.validate_frame(make_frame(5).assign(zone="10"))
    with pytest.raises(SchemaError, match="'colour' has string categories"):
        schema.validate_frame(make_frame(5).assign(colour=1))
    with pytest.raises(TypeError):
        schema.validate_frame(make_frame(5).to_numpy())
    # pandas reads a whole number past 64 bits as a Python int in an object column: no text to show
    for huge in (pd.Series([1, 2, 3, 10**20, 5], dtype=object), pd.Series(["1", "2", "3", str(10**20), "5"])):
        with pytest.raises(SchemaError, match=r"'age' is integer but holds non-numeric values \(whole numbers too "
                                              r"large for 64 bits: '?100000000000000000000'? \(data row 4\)\)"):
            schema.validate_frame(make_frame(5).assign(age=huge))  # as a Python int, or as read_csv keeps it: text
    # True/False pass for numbers in pandas: a synthetic table edited so, or any frame, is refused
    flags = [True, False, True, True, False]
    with pytest.raises(SchemaError, match="'age' is integer but holds True/False.*declare it categorical"):
        schema.validate_frame(make_frame(5).assign(age=flags))
    with pytest.raises(SchemaError, match="'height' is continuous but holds True/False"):
        schema.validate_frame(make_frame(5).assign(height=pd.Series(flags, dtype=object)))  # a frame built by hand


def test_a_name_written_with_other_unicode_code_points_is_told_apart_from_a_missing_one():
    """'café' with é as one code point (NFC, most editors) or as e and a combining accent (NFD,
    some macOS exports) prints the same in the error, and the two names looked alike for nothing."""
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    schema = make_schema(columns=make_schema().columns + (Column(composed, "continuous", bounds=(0.0, 1.0)),))
    with pytest.raises(SchemaError, match=r"columns missing from the data: \['café'\].*written with other Unicode "
                                          r"code points.*\(NFC\)"):
        schema.validate_frame(make_frame(5).assign(**{decomposed: 0.5}))
    with pytest.raises(SchemaError) as refused:  # a name that is missing indeed: no such hint
        schema.validate_frame(make_frame(5).assign(other=0.5))
    assert "Unicode" not in str(refused.value)


def test_a_checkpoints_schema_is_the_same_whatever_its_columns_step_and_source_text_say(tmp_path):
    """resume and evaluate refuse another schema than a checkpoint's: only what changes how rows
    are encoded counts, so a reworded source (a built-in column's provenance) locks no run out."""
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.run import check_same_schema

    trained = make_schema().to_dict()
    reworded = make_schema(columns=(Column("height", "continuous", bounds=(100.0, 220.0), source="census, table 3"),
                                    *make_schema().columns[1:]))
    check_same_schema(reworded, trained, tmp_path / "last.ckpt")
    wider = make_schema(columns=(Column("height", "continuous", bounds=(100.0, 250.0)), *make_schema().columns[1:]))
    with pytest.raises(ConfigError, match=r"trained on another schema \(differing: height\): put it back"):
        check_same_schema(wider, trained, tmp_path / "last.ckpt", remedy="put it back")


def test_integer_bounds_up_to_two_to_the_53_decode_exactly():
    column = Column("x", "integer", bounds=(-(2**53), 2**53))
    assert column.typed(np.array([2.0**53, -(2.0**53), 2.0**53 - 1])).tolist() == [2**53, -(2**53), 2**53 - 1]


def test_constant_columns_are_fine():
    records, _ = make_schema().encode(make_frame(5).assign(height=150.0, colour="red"))
    assert records.shape[0] == 5


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (dict(name="x", kind="continuous", bounds=(1, 1)), "low < high"),
        (dict(name="x", kind="continuous"), "bounds=\\(low, high\\) are required"),
        (dict(name="x", kind="integer", bounds=(0.2, 0.8)), "contain no integer"),
        # decoded as int64: 1e20 wrapped round to -9223372036854775808, below the bound 0
        (dict(name="x", kind="integer", bounds=(0, 1e20)), "pass ±2\\^53.*declare the column continuous"),
        (dict(name="x", kind="integer", bounds=(-(2**53) - 2, 0)), "pass ±2\\^53"),
        (dict(name="x", kind="categorical"), "non-empty categories"),
        (dict(name="x", kind="categorical", categories=("a", "a")), "unique"),
        (dict(name="x", kind="ordinal", bounds=(0, 1)), "kind must be"),
        (dict(name="x", kind="continuous", bounds=(0, 1), categories=("a",)), "not categories"),
        (dict(name="x", kind="continuous", bounds=(0, 1), step=0), "step must be a number in"),
        (dict(name="x", kind="continuous", bounds=(0, 1), step=2), "step must be a number in"),
        (dict(name="x", kind="continuous", bounds=(0, 1), step=float("nan")), "step must be a number in"),
        (dict(name="x", kind="integer", bounds=(0, 10), step=2), "only a continuous column takes a step"),
    ],
)
def test_inconsistent_columns_are_refused(column, message):
    with pytest.raises(SchemaError, match=message):
        Column(**column)


def test_inconsistent_labels_are_refused():
    three = Column("label", "categorical", categories=("a", "b", "c"))
    with pytest.raises(SchemaError, match="exactly 2 categories"):
        TableSchema((three,), label="label", label_kind="binary")
    with pytest.raises(SchemaError, match="not one of the schema's columns"):
        TableSchema((three,), label="target", label_kind="categorical")
    with pytest.raises(SchemaError, match="continuous but the column is categorical"):
        TableSchema((three,), label="label", label_kind="continuous")
    with pytest.raises(SchemaError, match="without a label"):
        TableSchema((three,), label_kind="binary")
    with pytest.raises(SchemaError, match="duplicate"):
        TableSchema((three, three))


def test_a_stepped_column_decodes_onto_its_grid_and_only_there():
    floors = Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5)
    decoded = floors.typed(np.array([0.2, 1.24, 1.26, 2.74, 3.9, 9.0]))
    np.testing.assert_allclose(decoded, [1.0, 1.0, 1.5, 2.5, 4.0, 4.0])
    # a grid that stops short of the upper bound never rounds past it
    odd = Column("x", "continuous", bounds=(0.0, 1.0), step=0.3).typed(np.array([0.99, 1.0]))
    np.testing.assert_allclose(odd, [0.9, 0.9])
    # grid values come out as written, not with the float error of k * step (0.1 * 3)
    assert list(Column("z", "continuous", bounds=(0.0, 1.0), step=0.1).typed(np.array([0.29, 0.71]))) == [0.3, 0.7]
    # without a step a continuous value only stays within the bounds
    np.testing.assert_allclose(Column("y", "continuous", bounds=(0.0, 1.0)).typed(np.array([0.123, 2.0])), [0.123, 1.0])


def test_a_schema_with_a_step_decodes_generator_output_onto_the_grid():
    schema = make_schema(columns=(Column("height", "continuous", bounds=(100.0, 220.0), step=2.5),
                                  Column("label", "categorical", categories=("no", "yes"))))
    decoded = schema.decode(np.random.default_rng(0).uniform(-0.2, 1.2, size=(300, schema.encoded_dim)))
    units = (decoded["height"] - 100.0) / 2.5
    np.testing.assert_allclose(units, np.round(units), atol=1e-9)
    assert decoded["height"].between(100.0, 220.0).all() and decoded["height"].nunique() > 20


def test_a_step_does_not_change_encoding_so_off_grid_tables_are_still_scored():
    """Tables from other synthesizers, or from runs decoded before a step was declared, hold
    values off the grid: they encode exactly as without the step."""
    plain = make_schema(columns=(Column("height", "continuous", bounds=(100.0, 220.0)),
                                 Column("label", "categorical", categories=("no", "yes"))))
    stepped = make_schema(columns=(Column("height", "continuous", bounds=(100.0, 220.0), step=0.5),
                                   Column("label", "categorical", categories=("no", "yes"))))
    frame = pd.DataFrame({"height": [150.0, 150.25, 171.3], "label": ["no", "yes", "no"]})
    assert torch.equal(stepped.encode(frame)[0], plain.encode(frame)[0])


# --- serialisation -----------------------------------------------------------------------------


def test_dict_round_trip_is_yaml_friendly(tmp_path):
    stepped = Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5)
    schema = make_schema(drop=("id",), columns=make_schema().columns + (stepped,))
    spec = schema.to_dict()
    assert spec["columns"][-1]["step"] == 0.5
    assert TableSchema.from_dict(yaml.safe_load(yaml.safe_dump(spec))) == schema
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert TableSchema.load(path) == schema
    json_path = tmp_path / "schema.json"
    json_path.write_text(json.dumps(spec))
    assert TableSchema.load(json_path) == schema


def test_load_reports_bad_files(tmp_path):
    with pytest.raises(SchemaError, match="not found"):
        TableSchema.load(tmp_path / "absent.yaml")
    with pytest.raises(SchemaError, match=f"schema file {tmp_path} is a folder: pass the file in it"):
        TableSchema.load(tmp_path)
    latin = tmp_path / "latin.yaml"  # a category "café" saved by an editor in Latin-1
    latin.write_bytes(b"columns:\n  - {name: x, kind: categorical, categories: [caf\xe9, tea]}\n")
    with pytest.raises(SchemaError, match=r"schema file .*latin.yaml is not UTF-8 text \(.* at byte \d+\): save it as UTF-8"):
        TableSchema.load(latin)
    marked = tmp_path / "notepad.json"  # saved as "UTF-8" by Notepad: a byte-order mark first
    marked.write_bytes(b"\xef\xbb\xbf" + json.dumps({"columns": [{"name": "x", "kind": "categorical",
                                                                 "categories": ["a", "b"]}]}).encode())
    assert TableSchema.load(marked).names == ["x"]
    path = tmp_path / "bad.yaml"
    path.write_text("columns:\n  - {name: x, kind: continuous, bounds: [0, 1], colour: red}\n")
    with pytest.raises(SchemaError, match=r"bad.yaml.*unknown keys \['colour'\]"):
        TableSchema.load(path)


@pytest.mark.parametrize(("written", "read_as"), [("010", "8"), ("1:30", "90"), ("0x1A", "26"), ("007", "7")])
def test_a_schema_number_yaml_reads_as_another_is_refused_with_its_line(tmp_path, written, read_as):
    """YAML 1.1 reads 010 as octal 8 and 1:30 as 90 (base 60), and 007 as 7 as decimal does:
    unquoted product codes or times would become categories no record ('010', '007') holds, every
    row blanked but for a warning."""
    path = tmp_path / "codes.yaml"
    path.write_text(f"columns:\n  - {{name: code, kind: categorical, categories: [{written}, abc]}}\n")
    with pytest.raises(SchemaError, match=rf"codes.yaml, line 2: {written} reads as the number {read_as} in YAML: "
                                          rf"quote it \('{written}'\)"):
        TableSchema.load(path)
    path.write_text(f"columns:\n  - {{name: code, kind: categorical, categories: ['{written}', abc]}}\n"
                    "  - {name: n, kind: integer, bounds: [-0, 1_000]}\n")  # quoted, and plain numbers: read as written
    schema = TableSchema.load(path)
    assert schema.column("code").categories == (written, "abc") and schema.column("n").bounds == (0.0, 1000.0)


def test_a_key_given_twice_in_a_schema_file_is_refused_not_the_last_taken(tmp_path):
    """YAML and JSON keep a repeated key's last value in silence: a column's declared public
    bounds were replaced by a second ``bounds`` without a word."""
    path = tmp_path / "twice.yaml"
    path.write_text("columns:\n  - {name: x, kind: integer, bounds: [0, 50], bounds: [0, 100]}\n")
    with pytest.raises(SchemaError, match=r"twice.yaml cannot be parsed: the key 'bounds' is given twice in one mapping"):
        TableSchema.load(path)
    as_json = tmp_path / "twice.json"
    as_json.write_text('{"columns": [{"name": "x", "kind": "integer", "bounds": [0, 50], "bounds": [0, 100]}]}')
    with pytest.raises(SchemaError, match=r"twice.json cannot be parsed: the key\(s\) 'bounds' given twice"):
        TableSchema.load(as_json)
    as_json.write_text('{"columns": [{"name": "x", "kind": "integer", "bounds": [0, 50]}]}')
    assert TableSchema.load(as_json).column("x").bounds == (0.0, 50.0)


# --- added by the mutation audit -----------------------------------------------------------------


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_a_missing_value_cannot_be_a_category(missing):
    """A schema listing None/NaN as a category would encode missing values as data."""
    with pytest.raises(SchemaError, match="cannot contain missing values"):
        Column("colour", "categorical", categories=("red", missing))


def test_a_value_on_a_bound_is_not_counted_as_clipped():
    """The report counts values moved by clipping: one at the bound itself is inside the domain."""
    frame = make_frame(4).assign(height=[100.0, 220.0, 99.0, 221.0])
    _, report = make_schema().encode(frame)
    assert report.clipped["height"] == {"below": 1, "above": 1}


def test_a_categorical_label_needs_at_least_two_classes():
    one = Column("label", "categorical", categories=("a",))
    with pytest.raises(SchemaError, match="lists one class"):
        TableSchema((Column("x", "continuous", bounds=(0, 1)), one), label="label", label_kind="categorical")


def test_a_column_cannot_be_both_encoded_and_dropped():
    with pytest.raises(SchemaError, match=r"both schema columns and listed in drop"):
        make_schema(drop=("age",))


def test_a_step_whose_range_is_a_float_rounded_multiple_keeps_its_last_grid_value():
    """0.3 / 0.1 is 2.9999999999999996 in floats: the grid still reaches the upper bound."""
    column = Column("x", "continuous", bounds=(0.0, 0.3), step=0.1)
    assert column.grid_size == 4
    assert column.grid.tolist() == [0.0, 0.1, 0.2, 0.3]
    assert column.typed(np.array([0.3]))[0] == 0.3


@pytest.mark.parametrize("bounds", [[0, True], [False, 1]])
def test_boolean_bounds_in_a_schema_file_are_refused(bounds):
    """YAML reads yes/no/on/off as booleans, which float() would take as 0 and 1."""
    with pytest.raises(SchemaError, match="two numbers"):
        Column.from_dict({"name": "x", "kind": "continuous", "bounds": bounds})


def test_label_values_outside_the_binary_classes_are_listed_with_their_rows():
    frame = make_frame(5).assign(label=["no", "maybe", "yes", "yes", "unsure"])
    outside = make_schema().label_values_outside_classes(frame)
    assert outside.to_dict() == {1: "maybe", 4: "unsure"}


def test_duplicated_column_names_in_the_data_are_refused():
    frame = make_frame(3)
    frame = pd.concat([frame, frame[["age"]]], axis=1)
    with pytest.raises(SchemaError, match=r"duplicated column names: \['age'\]"):
        make_schema().validate_frame(frame)


def test_categories_read_as_text_become_the_schemas_numbers_and_unlisted_ones_stay_text():
    """A CSV reads the zone 10 as "10": matched to the schema's category 10 (so it encodes), while
    "30", not listed, stays an unknown category rather than being coerced into one."""
    frame = make_frame(3).assign(zone=["10", "20", "30"])
    converted = as_schema_categories(frame, make_schema())
    assert converted["zone"].tolist() == [10, 20, "30"]
    assert frame["zone"].tolist() == ["10", "20", "30"]  # the caller's frame is left as it was
    _, report = make_schema().encode(converted)  # the text "30" is an unknown category: its row is rejected
    assert (report.rows_encoded, report.rejected["zone"]) == (2, 1)


def test_numeric_categories_held_as_python_objects_encode_as_those_categories():
    """A frame built by hand (or a slice of the table above) may hold the zones 10 and 20 as Python
    ints in an object column: each is written as a category, so it encodes, where it was refused
    as "not written as one of them" with no value to show."""
    for zones in ([10, 20], as_schema_categories(make_frame(3).assign(zone=["10", "20", "30"]), make_schema())
                  ["zone"].iloc[:2].tolist()):
        frame = make_frame(2).assign(zone=pd.Series(zones, dtype=object))
        encoded, report = make_schema().encode(frame)  # zone's categories: (10, 20)
        block = encoded[:, make_schema().column_slices["zone"]]
        assert report.rows_encoded == 2 and block.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_the_readmes_example_schema_file_reads_as_it_says():
    """The README's example is what a newcomer copies: it must load, with the label, kinds,
    drop list and quoted categories it describes."""
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"An example schema file:.*?```yaml\n(.*?)```", readme, re.S).group(1)
    schema = TableSchema.from_dict(yaml.safe_load(block))
    assert (schema.label, schema.label_kind, schema.drop) == ("diagnosis", "binary", ("patient_id",))
    kinds = {column.name: column.kind for column in schema.columns}
    assert kinds == {"age": "integer", "sex": "categorical", "crp": "continuous", "diagnosis": "categorical"}
    assert schema.column("diagnosis").categories == ("no", "yes")  # quoted: YAML would read no as False


def test_a_column_list_that_names_a_column_twice_is_refused_naming_its_option():
    """--data.discrete_columns age,age was taken as age alone: a repeat does nothing, so it is more
    likely a typo for another column than meant."""
    from lightning_dpgan.data.schema import column_names
    from lightning_dpgan.datamodules.adult import AdultDataModule
    from lightning_dpgan.quail import QUAIL

    assert column_names(" age, hours ,", "--data.log_columns") == ["age", "hours"]
    assert column_names(["age", "age"]) == ["age", "age"]  # no option to name: the caller's to judge
    with pytest.raises(ValueError, match=r"^--data.drop names 'age', 'b' more than once: give each column once$"):
        column_names("age,b,age,b,c", "--data.drop")
    with pytest.raises(ValueError, match="^--data.discrete_columns names 'age' more than once"):
        AdultDataModule(encoding="mode-specific", discrete_columns="age,age")
    with pytest.raises(ValueError, match="^--quail.log_features names 'fnlwgt' more than once"):
        QUAIL(log_features=["fnlwgt", "fnlwgt"])


@pytest.mark.parametrize("spec, said", [
    ({"drop": "pid"}, "drop must be a list, got 'pid': write it as a YAML list, e.g. drop: [pid]"),
    ({"categories": "ny"}, "column 'y': categories must be a list, got 'ny'"),
])
def test_a_schema_list_written_as_one_string_is_refused_not_read_letter_by_letter(spec, said):
    """``drop: pid`` was read as the columns 'p', 'i' and 'd' ("not in the file"), and
    ``categories: "ny"`` as the classes n and y."""
    label = {"name": "y", "kind": "categorical", "categories": spec.get("categories", ["n", "y"])}
    file = {"columns": [{"name": "age", "kind": "integer", "bounds": [0, 110]}, label], "label": "y",
            "label_kind": "binary", **({"drop": spec["drop"]} if "drop" in spec else {})}
    with pytest.raises(SchemaError, match=re.escape(said)):
        TableSchema.from_dict(file)


@pytest.mark.parametrize("name, flag", [("age", "age"), ("null", "'\"null\"'"), ("1e3", "'\"1e3\"'"),
                                        ("on", "'\"on\"'"), ("city,state", "'[\"city,state\"]'"), ("a b", "'a b'")])
def test_a_column_name_is_written_as_a_flag_reads_it_back(name, flag):
    """A remedy's flag value: the CLI reads values as YAML (1e3 a number, null no value), splits
    at commas, and the shell at spaces."""
    import shlex

    from lightning_dpgan.config import parse_value
    from lightning_dpgan.data.schema import as_flag_value, column_names

    assert as_flag_value(name) == flag
    assert column_names(parse_value(shlex.split(flag)[0])) == [name]


def test_numbers_held_as_strings_are_named_as_such_not_blamed_on_other_rows_of_a_file():
    """A frame built in Python with a column of "1.5"-style strings (an evaluation function called
    directly) was told "the text is in other rows of the file", where there is no file."""
    from lightning_dpgan.data.schema import check_numeric_values

    with pytest.raises(SchemaError, match=r"column 'income' is continuous but holds non-numeric values \(read as object, "
                                          r"though these rows' values are all numbers: .*pandas.to_numeric converts"):
        check_numeric_values("income", "continuous", pd.Series(["1.5", "20", "3e2"]), estimated=False)
