"""Tabular datamodules on tiny made-up fixtures in the original file formats (no network)."""

from __future__ import annotations

import copy
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from run_helpers import empty_folder, record_calls
from sklearn.utils import Bunch

from lightning_dpgan.data.download import DataIntegrityError, DatasetNotFoundError
from lightning_dpgan.data.schema import SchemaError, TableSchema
from lightning_dpgan.datamodules import csv as csv_module
from lightning_dpgan.datamodules import king as king_module
from lightning_dpgan.datamodules import tabular as tabular_module
from lightning_dpgan.datamodules.adult import AdultDataModule, read_adult
from lightning_dpgan.datamodules.csv import CSVDataModule
from lightning_dpgan.datamodules.kaggle_credit import KaggleCreditDataModule
from lightning_dpgan.datamodules.king import KingDataModule

FIXTURES = Path(__file__).parent / "fixtures"
BUILT_INS = [
    (AdultDataModule, "adult_tiny"),
    (KingDataModule, "king_tiny"),
    (KaggleCreditDataModule, "credit_tiny"),
]
IDS = [cls.name for cls, _ in BUILT_INS]


def loaded(cls, folder: str, **kwargs):
    datamodule = cls(data_dir=FIXTURES / folder, batch_size=8, download=False, **kwargs)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_built_ins_yield_encoded_batches_in_the_unit_interval(cls, folder):
    datamodule = loaded(cls, folder)
    (batch,) = next(iter(datamodule.train_dataloader()))
    assert batch.shape == (8, datamodule.schema.encoded_dim)
    assert datamodule.data_shape == (datamodule.schema.encoded_dim,)
    assert batch.min() >= 0 and batch.max() <= 1
    assert datamodule.kind == "table" and datamodule.num_classes is None
    decoded = datamodule.decode(batch)
    assert list(decoded.columns) == list(datamodule.train_frame.columns) == datamodule.schema.names
    assert datamodule.privacy_cost() == {"epsilon": 0.0, "delta": 0.0, "mechanism": "public schema"}
    assert cls.__doc__.strip().splitlines()[0]


@pytest.mark.parametrize("renamed", [False, True], ids=["plain-name", "gz-suffix"])
@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_a_gzipped_copy_of_a_built_in_file_reads_as_the_plain_one(cls, folder, tmp_path, renamed):
    """A gzipped copy under the plain name ended in "'utf-8' codec can't decode byte 0x8b",
    naming no file; one named NAME.gz was not found at all."""
    import gzip

    for plain in (FIXTURES / folder).iterdir():
        target = tmp_path / (plain.name + ".gz" if renamed else plain.name)
        target.write_bytes(gzip.compress(plain.read_bytes()))
    zipped = cls(data_dir=tmp_path, batch_size=8, download=False)
    zipped.prepare_data()
    zipped.setup("fit")
    pd.testing.assert_frame_equal(zipped.train_frame, loaded(cls, folder).train_frame)


@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_a_gzipped_copy_cut_short_is_named_as_damaged_not_a_decompressor_traceback(cls, folder, tmp_path):
    """A copy or download cut off half-way: gzip's EOFError ("Compressed file ended before the
    end-of-stream marker") escaped the reader as a traceback naming no file."""
    import gzip

    for plain in (FIXTURES / folder).iterdir():
        packed = gzip.compress(plain.read_bytes())
        (tmp_path / plain.name).write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataIntegrityError, match=rf"{re.escape(str(tmp_path))}/\S+ cannot be decompressed "
                                                 r"\(Compressed file ended.*damaged or cut short.*Copy or download it again"):
        datamodule = cls(data_dir=tmp_path, batch_size=8, download=False)
        datamodule.prepare_data()
        datamodule.setup("fit")


@pytest.mark.parametrize(("content", "message"), [(b"\x00\xff\xfe binary " * 40, "is not a text"), (b"", "is empty")],
                         ids=["binary", "empty"])
@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_a_built_in_file_that_is_not_text_or_empty_is_named(cls, folder, tmp_path, content, message):
    """pandas said "No columns to parse from file" (credit, King) or the run read none of 0 rows
    against the schema (Adult), naming no file."""
    for plain in (FIXTURES / folder).iterdir():
        (tmp_path / plain.name).write_bytes(content)
    datamodule = cls(data_dir=tmp_path, batch_size=8, download=False)
    with pytest.raises(DataIntegrityError, match=rf"{re.escape(str(tmp_path))}/\S+ {message}"):
        datamodule.prepare_data()
        datamodule.setup("fit")


@pytest.mark.parametrize(("cls", "folder"), [(KingDataModule, "king_tiny"), (KaggleCreditDataModule, "credit_tiny")],
                         ids=["king", "kaggle-credit"])
def test_a_cut_row_of_a_built_in_csv_is_a_damaged_line_not_missing_values(cls, folder, tmp_path):
    """A file cut mid-row read as missing values in every later column, with the advice to drop or
    impute rows of the canonical dataset."""
    source = next((FIXTURES / folder).glob("*.csv"))
    lines = source.read_text().splitlines()
    (tmp_path / source.name).write_text("\n".join(lines[:4] + [lines[4][:len(lines[4]) // 2]]) + "\n")
    with pytest.raises(DataIntegrityError, match=r"1 rows have fewer fields than the header or an empty one \(rows \[5\]"):
        cls(data_dir=tmp_path, batch_size=8, download=False).setup()


@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_data_shape_is_known_without_reading_any_record(cls, folder, tmp_path):
    datamodule = cls(data_dir=empty_folder(tmp_path), download=False)
    assert datamodule.data_shape == (datamodule.schema.encoded_dim,)
    assert datamodule.train_frame is None


def test_adult_uses_the_official_split_and_drops_missing_values():
    datamodule = loaded(AdultDataModule, "adult_tiny")
    raw_train = (FIXTURES / "adult_tiny" / "adult.data").read_text().strip().splitlines()
    raw_test = (FIXTURES / "adult_tiny" / "adult.test").read_text().strip().splitlines()[1:]
    assert len(datamodule.train_frame) == sum("?" not in line for line in raw_train)
    assert len(datamodule.test_frame) == sum("?" not in line for line in raw_test)
    assert datamodule.train_size == len(datamodule.train_frame)
    for frame in (datamodule.train_frame, datamodule.test_frame):
        assert set(frame["income"]) <= {"<=50K", ">50K"}
        assert not (frame == "?").any().any()
    assert datamodule.schema.encoded_dim == 6 + 8 + 16 + 7 + 14 + 6 + 5 + 2 + 41 + 2
    assert datamodule.schema.label_slice == slice(datamodule.schema.encoded_dim - 2, datamodule.schema.encoded_dim)


def test_king_drops_id_converts_dates_and_counts_clipping():
    datamodule = loaded(KingDataModule, "king_tiny")
    frame = pd.concat([datamodule.train_frame, datamodule.test_frame]).sort_index()
    assert "id" not in frame.columns and len(frame) == 40
    assert frame["date"].between(120, 515).all()
    assert frame["price"].max() == 2_000_000  # written 2e+006 in the file
    bedrooms = datamodule.encoding_report["clipped"]["bedrooms"]
    assert bedrooms == {"below": 0, "above": int((datamodule.train_frame["bedrooms"] > 15).sum())}
    assert datamodule.decode(datamodule.train_dataset.tensors[0])["bedrooms"].max() <= 15


@pytest.mark.parametrize("module,fixture,whole", [
    (KingDataModule, "king_tiny", ["price", "sqft_living", "sqft_lot", "sqft_above", "sqft_basement", "sqft_living15",
                                   "sqft_lot15"]),
    (KaggleCreditDataModule, "credit_tiny", ["Time"]),
])
def test_columns_the_file_holds_in_whole_units_are_decoded_in_whole_units(module, fixture, whole):
    """King's prices and areas and credit's seconds are whole numbers in their files; a generator's
    values were written back as 6479.362845420837 sq ft and $98961.9077."""
    datamodule = loaded(module, fixture)
    generated = torch.rand(50, datamodule.train_dataset.tensors[0].shape[1], generator=torch.Generator().manual_seed(0))
    decoded = datamodule.decode(generated)
    for name in whole:
        assert datamodule.train_frame[name].mod(1).eq(0).all()  # the file's values are whole
        assert decoded[name].mod(1).eq(0).all() and decoded[name].nunique() > 1, name


def test_a_credit_file_resaved_with_float_classes_trains_as_the_original(tmp_path):
    """Class written 0.0/1.0 (the file re-saved through pandas with a float column): encoding
    matches 1.0 to the class 1, but the one-class check compared the text "1.0" with "1" and
    refused the file as holding none of its classes."""
    frame = pd.read_csv(FIXTURES / "credit_tiny" / "creditcard.csv")
    (tmp_path / "credit").mkdir()
    frame.assign(Class=frame["Class"].astype(float)).to_csv(tmp_path / "credit" / "creditcard.csv", index=False)
    resaved = KaggleCreditDataModule(data_dir=tmp_path / "credit", batch_size=8, download=False)
    resaved.setup()
    original = loaded(KaggleCreditDataModule, "credit_tiny")
    assert torch.equal(resaved.train_dataset.tensors[0], original.train_dataset.tensors[0])


def test_credit_has_thirty_features_and_a_binary_label():
    datamodule = loaded(KaggleCreditDataModule, "credit_tiny")
    assert datamodule.schema.encoded_dim == 30 + 2
    assert datamodule.schema.label == "Class" and datamodule.schema.label_kind == "binary"
    assert len(datamodule.train_frame) == 48 and len(datamodule.test_frame) == 12


@pytest.mark.parametrize("line,message", [
    (1, r"more fields than its header \(line 2: \d+ fields\)"),  # pandas would shift every row one column over
    (3, r"cannot be read as a CSV table \(Error tokenizing data. C error: Expected \d+ fields in line 4"),
], ids=["first-row", "a-later-row"])
@pytest.mark.parametrize(("cls", "folder"), BUILT_INS[1:], ids=IDS[1:])
def test_a_row_with_an_extra_field_is_refused_not_read_one_column_over(cls, folder, tmp_path, line, message):

    source = next((FIXTURES / folder).glob("*.csv"))
    lines = source.read_text().splitlines()
    lines[line] += ",9"
    copy = tmp_path / folder
    copy.mkdir()
    (copy / source.name).write_text("\n".join(lines) + "\n")
    with pytest.raises(DataIntegrityError, match=message):
        cls(data_dir=copy, download=False).setup()


@pytest.mark.parametrize(("cls", "folder"), BUILT_INS[1:], ids=IDS[1:])
def test_seeded_split_is_fixed_disjoint_and_covering(cls, folder):
    first, again = loaded(cls, folder), loaded(cls, folder)
    train, test = set(first.train_frame.index), set(first.test_frame.index)
    assert not train & test
    assert train | test == set(range(len(first.train_frame) + len(first.test_frame)))
    assert train == set(again.train_frame.index)
    assert train != set(loaded(cls, folder, split_seed=1).train_frame.index)


@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_the_test_split_is_never_encoded(cls, folder, monkeypatch):
    encoded_frames = []
    original = TableSchema.encode

    def spy(self, frame, *args, **kwargs):
        encoded_frames.append(frame)
        return original(self, frame, *args, **kwargs)

    monkeypatch.setattr(TableSchema, "encode", spy)
    datamodule = loaded(cls, folder)
    list(datamodule.train_dataloader())
    assert len(encoded_frames) == 1 and encoded_frames[0] is datamodule.train_frame


def test_partitions_are_disjoint_balanced_and_cover_the_train_split():
    datamodule = loaded(KingDataModule, "king_tiny")
    parts = datamodule.partitions(5, seed=3)
    assert all(p.dtype == torch.long for p in parts)
    joined = torch.cat(parts)
    assert sorted(joined.tolist()) == list(range(datamodule.train_size))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert [p.tolist() for p in datamodule.partitions(5, seed=3)] == [p.tolist() for p in parts]
    with pytest.raises(ValueError, match="cannot split 32 records into 33"):
        datamodule.partitions(datamodule.train_size + 1)


def test_results_before_setup_are_refused():
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny")
    with pytest.raises(RuntimeError, match="setup"):
        _ = datamodule.train_size
    with pytest.raises(RuntimeError, match="setup"):
        _ = datamodule.encoding_report


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(batch_size=0), "--batch-size"), (dict(test_fraction=1.0), "test_fraction"),
     (dict(split_seed=-1), "--data.split_seed")],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KingDataModule(**kwargs)


# --- downloads (monkeypatched: no network) -----------------------------------------------------


def fake_fetch_from(folder: Path, calls: list):
    def fake_fetch(remote, cache_dir):
        calls.append((remote, Path(cache_dir)))
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(folder / remote.name, Path(cache_dir) / remote.name))

    return fake_fetch


@pytest.mark.parametrize(("cls", "folder"), [BUILT_INS[0], BUILT_INS[2]], ids=[IDS[0], IDS[2]])
def test_missing_files_are_downloaded_into_the_cache(cls, folder, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(tabular_module, "fetch", fake_fetch_from(FIXTURES / folder, calls))
    datamodule = cls(cache_dir=tmp_path, batch_size=8)
    datamodule.prepare_data()
    datamodule.setup()
    assert {remote.name for remote, _ in calls} == {remote.name for remote in cls.files}
    assert all(url.startswith("https://") for remote, _ in calls for url in remote.urls)
    assert all(cache == tmp_path / cls.name for _, cache in calls)
    assert datamodule.train_size > 0


def test_download_false_without_files_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="--data-dir"):
        AdultDataModule(data_dir=tmp_path, cache_dir=tmp_path, download=False).setup()


def test_king_falls_back_to_openml(monkeypatch, tmp_path):
    raw = pd.read_csv(FIXTURES / "king_tiny" / "kc_house_data.csv")
    openml_like = raw.assign(zipcode=raw["zipcode"].astype(str).astype("category"), waterfront=raw["waterfront"].astype("category"))
    calls = []

    def fake_fetch_openml(**kwargs):
        calls.append(kwargs)
        return Bunch(frame=openml_like)

    monkeypatch.setattr(king_module, "fetch_openml", fake_fetch_openml)
    monkeypatch.setattr(king_module, "N_ROWS", len(raw))
    datamodule = KingDataModule(cache_dir=tmp_path, batch_size=8)
    datamodule.prepare_data()
    datamodule.setup()
    assert calls[0]["data_id"] == 42092 and calls[0]["data_home"] == str(tmp_path / "openml")
    expected = loaded(KingDataModule, "king_tiny")
    pd.testing.assert_frame_equal(datamodule.train_frame, expected.train_frame, check_dtype=False)


def test_king_without_file_or_openml_points_at_kaggle(monkeypatch, tmp_path):
    def unreachable(**kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(king_module, "fetch_openml", unreachable)
    with pytest.raises(DatasetNotFoundError, match="Kaggle login"):
        KingDataModule(cache_dir=tmp_path).setup()
    with pytest.raises(DatasetNotFoundError, match="download=False") as refused:
        KingDataModule(cache_dir=tmp_path, download=False).prepare_data()
    # the folders named are those searched: the OpenML copy's, not a king/ folder never looked in
    assert f"Searched: {tmp_path / 'openml'}" in str(refused.value) and str(tmp_path / "king") not in str(refused.value)


# --- csv ---------------------------------------------------------------------------------------


def write_csv(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    pd.DataFrame(
        {
            "row_id": np.arange(n),
            "amount": rng.gamma(2.0, 40.0, n).round(2),
            "visits": rng.integers(0, 30, n),
            "region": rng.choice(["north", "south"], n),
            "churned": rng.choice(["no", "yes"], n),
        }
    ).to_csv(path, index=False)
    return path


def test_csv_without_schema_spends_the_bounds_budget_on_the_train_split(tmp_path, monkeypatch):
    seen = record_calls(monkeypatch, csv_module, "infer_schema_dp")
    datamodule = CSVDataModule(
        csv=write_csv(tmp_path / "data.csv"),
        target="churned",
        categorical="region",
        label_kind="binary",
        integer=["visits"],
        drop="row_id",
        bounds_epsilon=20.0,
        batch_size=16,
    )
    assert datamodule.data_shape == (1 + 1 + 2 + 2,)
    cost = datamodule.privacy_cost()
    assert cost["epsilon"] == 20.0 and cost["delta"] == 1e-6
    assert len(seen) == 1 and seen[0][0] is datamodule.train_frame
    assert len(datamodule.train_frame) == 320
    datamodule.setup()
    (batch,) = next(iter(datamodule.train_dataloader()))
    assert batch.shape == (16, 6)
    assert list(datamodule.decode(batch).columns) == ["amount", "visits", "region", "churned"]


def test_csv_with_a_schema_file_spends_nothing(tmp_path):
    schema = {
        "label": "churned",
        "label_kind": "binary",
        "drop": ["row_id"],
        "columns": [
            {"name": "amount", "kind": "continuous", "bounds": [0, 1000], "source": "price list"},
            {"name": "visits", "kind": "integer", "bounds": [0, 100]},
            {"name": "region", "kind": "categorical", "categories": ["north", "south", "west"]},
            {"name": "churned", "kind": "categorical", "categories": ["no", "yes"]},
        ],
    }
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    datamodule = CSVDataModule(csv=write_csv(tmp_path / "data.csv"), schema=tmp_path / "schema.yaml", batch_size=16)
    assert datamodule.data_shape == (7,)
    datamodule.setup()
    assert datamodule.privacy_cost() == {"epsilon": 0.0, "delta": 0.0, "mechanism": "public schema"}
    assert datamodule.train_size == 320


def churn_schema() -> dict:
    """The schema file of :func:`write_csv`'s table, as a fresh mapping a test may edit."""
    return {"label": "churned", "label_kind": "binary", "drop": ["row_id"], "columns": [
        {"name": "amount", "kind": "continuous", "bounds": [0, 1000]},
        {"name": "visits", "kind": "integer", "bounds": [0, 100]},
        {"name": "region", "kind": "categorical", "categories": ["north", "south"]},
        {"name": "churned", "kind": "categorical", "categories": ["no", "yes"]}]}


def test_a_csv_run_resumes_only_under_the_schema_it_was_trained_with(tmp_path, capsys):
    from lightning_dpgan.cli import main

    schema = churn_schema()
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    csv = write_csv(tmp_path / "data.csv")
    common = ["train", "--model", "gan", "--dataset", "csv", "--data.csv", str(csv), "--data.schema",
              str(tmp_path / "schema.yaml"), "--max-steps", "2", "--batch-size", "16", "--trainer.enable_progress_bar", "false"]
    assert main([*common, "--output-dir", str(tmp_path / "first")]) == 0
    resume = ["--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt"), "--output-dir", str(tmp_path / "second")]
    schema["columns"][0]["step"] = 0.01  # a step only rounds decoded values: the run resumes
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    assert main([*common, *resume[:2], "--output-dir", str(tmp_path / "stepped"), "--max-steps", "3"]) == 0
    amounts = pd.read_csv(tmp_path / "stepped" / "synthetic.csv")["amount"]
    assert np.allclose(amounts * 100, np.round(amounts * 100), atol=1e-6)  # cents, as the step says
    schema["columns"][0]["bounds"] = [0, 5000]  # same width, another encoding of every amount
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    assert main([*common, *resume]) == 2
    refusal = capsys.readouterr().err
    assert "was trained on another schema (differing: amount)" in refusal and "train anew" in refusal
    # evaluate reads the schema file too: its synthetic table was decoded under the old bounds
    assert main(["evaluate", "--run", str(tmp_path / "first")]) == 2
    refusal = capsys.readouterr().err
    assert "was trained on another schema (differing: amount)" in refusal and "put back the schema" in refusal
    assert not (tmp_path / "first" / "evaluation.json").exists()
    schema["columns"][0]["bounds"] = [0, 1000]  # put back as it was: scored
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    assert main(["evaluate", "--run", str(tmp_path / "first")]) == 0


def test_a_mode_specific_run_resumed_under_another_schema_file_is_told_which_column_and_what_to_do(tmp_path, capsys):
    """CTGAN's checkpoint restores its encoding before the schema check ran: the refusal said only
    "the checkpoint's transformer was built for another schema", naming no column and no remedy."""
    from lightning_dpgan.cli import main

    schema = churn_schema()
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    common = ["train", "--model", "ctgan", "--dataset", "csv", "--data.csv", str(write_csv(tmp_path / "data.csv")),
              "--data.schema", str(tmp_path / "schema.yaml"), "--max-steps", "1", "--batch-size", "20",
              "--model.generator_kwargs.hidden", "[8]", "--model.discriminator_kwargs.hidden", "[8]",
              "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main([*common, "--output-dir", str(tmp_path / "first")]) == 0
    capsys.readouterr()
    schema["columns"][0]["bounds"] = [0, 5000]
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    resume = ["--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt"), "--output-dir", str(tmp_path / "second")]
    assert main([*common, *resume, "--max-steps", "2"]) == 2
    refusal = capsys.readouterr().err
    assert "was trained on another schema (differing: amount)" in refusal and "train anew" in refusal
    assert not (tmp_path / "second").exists()


def coded_csv(path: Path, odd_row: bool) -> Path:
    """Categories that look like numbers ("0101"), with or without one row coded "A1"."""
    rng = np.random.default_rng(1)
    codes = rng.choice(["0101", "0202", "0303"], 300).tolist() + (["A1"] if odd_row else [])
    pd.DataFrame({"amount": rng.uniform(0, 100, len(codes)).round(2), "code": codes,
                  "churned": rng.choice(["0", "1"], len(codes))}).to_csv(path, index=False)
    return path


def test_one_record_does_not_change_how_the_other_records_categories_are_read(tmp_path):
    """pandas would type "0101" as the number 101 unless some row holds "A1": one record would
    change the released categories and every other record's value."""
    frames = []
    for odd_row in (False, True):
        module = CSVDataModule(csv=coded_csv(tmp_path / f"{odd_row}.csv", odd_row), target="churned", categorical="code",
                               label_kind="binary", split_seed=0)
        train, _ = module._read_split()
        frames.append(pd.concat([train, _]).sort_index())
    plain, with_odd_row = frames
    assert plain["code"].tolist() == with_odd_row["code"].tolist()[:300]
    assert set(plain["code"]) == {"0101", "0202", "0303"} and set(plain["churned"]) == {"0", "1"}
    schema = {"label": "churned", "label_kind": "binary", "columns": [
        {"name": "amount", "kind": "continuous", "bounds": [0, 100]},
        {"name": "code", "kind": "categorical", "categories": [101, 202, 303]},  # a schema file may list numbers
        {"name": "churned", "kind": "categorical", "categories": ["0", "1"]}]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    module = CSVDataModule(csv=coded_csv(tmp_path / "plain.csv", False), schema=tmp_path / "schema.yaml")
    train, _ = module._read_split()
    assert set(train["code"]) == {"0101", "0202", "0303"}  # "0101" is not the category 101: text is read as written
    numbers = tmp_path / "numbers.csv"
    pd.read_csv(tmp_path / "plain.csv", dtype=str).assign(code=lambda f: f["code"].str.lstrip("0")).to_csv(numbers, index=False)
    train, _ = CSVDataModule(csv=numbers, schema=tmp_path / "schema.yaml")._read_split()
    assert set(train["code"]) == {101, 202, 303}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(), "label_kind must be one of"),
        (dict(label_kind="binary", target=None), "--data.target"),
        (dict(label_kind="binary", csv=None), "--data.csv"),
    ],
)
def test_csv_refuses_incomplete_arguments(tmp_path, kwargs, message):
    args = dict(csv=tmp_path / "data.csv", target="churned", categorical="region")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        CSVDataModule(**args)


def test_csv_refuses_arguments_that_contradict_the_schema_file(tmp_path):
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump({"label": "y", "label_kind": "binary", "columns": [
        {"name": "y", "kind": "categorical", "categories": [0, 1]}]}))
    with pytest.raises(ValueError, match="categorical"):
        CSVDataModule(csv=tmp_path / "d.csv", schema=path, categorical="y")
    with pytest.raises(ValueError, match="contradicts"):
        CSVDataModule(csv=tmp_path / "d.csv", schema=path, target="x")
    with pytest.raises(ValueError, match="contradicts"):
        CSVDataModule(csv=tmp_path / "d.csv", schema=path, label_kind="continuous")


def test_csv_data_errors_are_clear(tmp_path):
    path = write_csv(tmp_path / "data.csv")
    frame = pd.read_csv(path)
    frame.loc[[1, 2, 3], "amount"] = np.nan
    frame.to_csv(path, index=False)
    datamodule = CSVDataModule(csv=path, target="churned", categorical="region", label_kind="binary", drop="row_id")
    with pytest.raises(SchemaError, match=r"amount \(\d rows: data rows? ") as refused:
        datamodule.setup()
    # both splits in one message (they took two rounds), each gap by its row in the file
    message = str(refused.value)
    assert "in the training rows" in message and "in the test rows" in message
    named = {int(n) for n in re.findall(r"data rows? ([\d, ]+)\)", message)[0].split(", ") +
             re.findall(r"data rows? ([\d, ]+)\)", message)[1].split(", ")}
    assert named == {2, 3, 4}
    clean = write_csv(tmp_path / "clean.csv")
    missing_target = CSVDataModule(csv=clean, target="label", categorical="region", label_kind="binary")
    with pytest.raises(SchemaError, match="target column 'label'"):
        missing_target.setup()
    with pytest.raises(FileNotFoundError):
        CSVDataModule(csv=tmp_path / "absent.csv", target="y", label_kind="binary").prepare_data()


# --- mode-specific encoding (CTGAN / CTAB-GAN+; more in test_ctgan_encoding.py) ----------------


@pytest.mark.parametrize(("cls", "folder"), BUILT_INS, ids=IDS)
def test_built_ins_with_bounds_modes_encode_without_reading_for_the_shape(cls, folder, tmp_path):
    unread = cls(data_dir=empty_folder(tmp_path), download=False, encoding="mode-specific", modes="bounds")
    width = unread.data_shape[0]
    assert unread.train_frame is None
    datamodule = loaded(cls, folder, encoding="mode-specific", modes="bounds")
    (batch,) = next(iter(datamodule.train_dataloader()))
    assert batch.shape == (8, width) == (8, sum(w for w, _ in datamodule.table_layout["spans"]))
    assert batch.min() >= -1 and batch.max() <= 1
    decoded = datamodule.decode(batch)
    assert list(decoded.columns) == datamodule.schema.names
    cost = datamodule.privacy_cost()
    assert cost["epsilon"] == 0.0 and cost["delta"] == 0.0


def test_dp_modes_read_the_train_split_only(monkeypatch):
    from lightning_dpgan.data import table_transformer

    seen = record_calls(monkeypatch, table_transformer, "dp_column_histograms")
    datamodule = loaded(KingDataModule, "king_tiny", encoding="mode-specific", modes_epsilon=2.0, max_modes=2)
    assert len(seen) == 1 and seen[0][0] is datamodule.train_frame
    assert datamodule.privacy_cost()["epsilon"] == 2.0
    assert datamodule.train_dataset.tensors[0].shape[1] == datamodule.data_shape[0]


# --------------------------------------------------------- rows outside the schema, replace-one
KIND_SCHEMA = {"label": "label", "label_kind": "binary", "columns": [
    {"name": "amount", "kind": "continuous", "bounds": [0, 500]},
    {"name": "kind", "kind": "categorical", "categories": ["a", "b"]},
    {"name": "label", "kind": "categorical", "categories": ["no", "yes"]}]}


def kind_datamodules(tmp_path, unknown_categories):
    """Two neighbouring CSVs for replace-one: one training record's kind replaced by a value the
    schema does not list. Returns both set-up datamodules."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"amount": rng.uniform(0, 500, 200).round(2), "kind": rng.choice(["a", "b"], 200),
                          "label": rng.choice(["no", "yes"], 200)})
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(KIND_SCHEMA))
    modules = []
    for name, data in (("d.csv", frame), ("neighbour.csv", None)):
        if data is None:  # the first training row of the first datamodule, replaced
            data = frame.copy()
            data.loc[modules[0].train_frame.index[0], "kind"] = "zzz"
        data.to_csv(tmp_path / name, index=False)
        datamodule = CSVDataModule(csv=tmp_path / name, schema=tmp_path / "schema.yaml", batch_size=8)
        datamodule.unknown_categories = unknown_categories
        datamodule.setup("fit")
        modules.append(datamodule)
    return modules


def test_replace_one_training_keeps_a_row_with_an_unknown_category_blank(tmp_path):
    """PATE's sensitivity needs one replaced record to reach one teacher: with "blank" the
    neighbour has as many training records, the same partitions, and differs in one record,
    whose kind block is all zeros."""
    d, neighbour = kind_datamodules(tmp_path, "blank")
    assert neighbour.train_size == d.train_size == len(d.train_frame)
    assert neighbour.encoding_report["rows_blanked"] == 1 and neighbour.encoding_report["rejected"]["kind"] == 1
    for part, neighbour_part in zip(d.partitions(10, 0), neighbour.partitions(10, 0), strict=True):
        assert torch.equal(part, neighbour_part)
    before, after = d.train_dataset.tensors[0], neighbour.train_dataset.tensors[0]
    changed = (before != after).any(dim=1).nonzero().flatten().tolist()
    assert changed == [0]
    kind = d.schema.column_slices["kind"]
    assert after[0, kind].sum() == 0 and before[0, kind].sum() == 1


def test_dropping_the_row_instead_would_move_records_between_teachers(tmp_path):
    """Why: dropped, the replaced record is a removal, and one record fewer redraws the
    partition of every record."""
    d, neighbour = kind_datamodules(tmp_path, "drop")
    assert neighbour.train_size == d.train_size - 1
    rows = lambda module: [set(map(tuple, module.train_dataset.tensors[0][part].tolist()))  # noqa: E731
                           for part in module.partitions(10, 0)]
    moved = sum(a != b for a, b in zip(rows(d), rows(neighbour), strict=True))
    assert moved > 1


@pytest.mark.parametrize("privacy", [
    ["--model", "pategan"],
    ["--model", "gswgan", "--privacy.num_critics", "4"],
    ["--model", "dpctgan", "--batch-size", "16"],  # add/remove: dropped, the row count would be a released count of rare categories
    ["--model", "gswgan"],  # one critic: add/remove, no partitions
])
def test_a_run_trains_on_every_row_of_the_split_whatever_its_categories(tmp_path, privacy):
    """The number of training records is released (train_records, DP-SGD's sample rate,
    synthetic.csv's length): with a row whose category the schema lacks dropped, it would be a
    count of such rows; under replace-one it would also redraw the teachers' partitions."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.run import Run

    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(KIND_SCHEMA))
    pd.DataFrame({"amount": [1.0, 2.0] * 20, "kind": ["a", "zzz"] + ["a", "b"] * 19,
                  "label": ["no", "yes"] * 20}).to_csv(tmp_path / "d.csv", index=False)
    config = build_config([*privacy, "--dataset", "csv", "--data.csv", str(tmp_path / "d.csv"), "--data.schema",
                           str(tmp_path / "schema.yaml"), "--epsilon", "1000", "--delta", "1e-3", "--accelerator", "cpu"])
    datamodule = Run(config, tmp_path / "out").datamodule
    datamodule.setup("fit")
    assert datamodule.encoding_report["rejected"]["kind"] == ("zzz" in datamodule.train_frame["kind"].values)
    assert datamodule.train_size == len(datamodule.train_frame)
    assert len(datamodule.labelled_records()[0]) == len(datamodule.train_frame)  # QUAIL's label model's records


def test_a_gap_in_a_built_in_tables_test_rows_is_refused_before_training(tmp_path):
    """Kaggle credit with one missing value in a test row: before, it trained, spent the budget
    and failed only at evaluate (whose suggested rerun failed the same way)."""
    frame = pd.read_csv(FIXTURES / "credit_tiny" / "creditcard.csv")
    probe = loaded(KaggleCreditDataModule, "credit_tiny")
    test_row = probe.test_frame.index[0]
    frame.loc[test_row, "V5"] = np.nan
    (tmp_path / "credit").mkdir()
    frame.to_csv(tmp_path / "credit" / "creditcard.csv", index=False)
    datamodule = KaggleCreditDataModule(data_dir=tmp_path / "credit", batch_size=8, download=False)
    datamodule.prepare_data()
    # the canonical file has every field: a blank one is a damaged row, refused as the file is read
    with pytest.raises(DataIntegrityError, match=rf"1 rows have fewer fields than the header or an empty one "
                                                 rf"\(rows \[{test_row + 2}\]"):
        datamodule.setup("fit")


def test_bounds_that_clip_many_training_values_are_warned_with_the_remedy_for_a_dp_estimate(tmp_path, caplog):
    """A DP estimate of a small file's bounds can cut a column short (29 % of a 2,000-row income
    column clipped at the default budget): the one sign was a count in the log."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"amount": rng.uniform(0, 500, 200).round(2), "kind": rng.choice(["a", "b"], 200),
                          "label": rng.choice(["no", "yes"], 200)})
    frame.to_csv(tmp_path / "d.csv", index=False)
    narrow = {**KIND_SCHEMA, "columns": [{"name": "amount", "kind": "continuous", "bounds": [0, 300]},
                                          *KIND_SCHEMA["columns"][1:]]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(narrow))
    with caplog.at_level("WARNING"):
        from_file = CSVDataModule(csv=tmp_path / "d.csv", schema=tmp_path / "schema.yaml", batch_size=8)
        from_file.setup("fit")
    clipped = sum(from_file.encoding_report["clipped"]["amount"].values())
    assert clipped > 0.05 * len(from_file.train_frame)
    warning = next(r.getMessage() for r in caplog.records if "clip more than 5%" in r.getMessage())
    assert f"amount {clipped} of {len(from_file.train_frame)}" in warning and "DP estimate" not in warning
    # a category in two rows stays under the DP estimate's threshold: its rows are blanked, and
    # the warning says what to do about an estimated schema
    frame.loc[frame.index[:2], "kind"] = "rare"
    frame.to_csv(tmp_path / "rare.csv", index=False)
    caplog.clear()
    with caplog.at_level("WARNING"):
        estimated = CSVDataModule(csv=tmp_path / "rare.csv", target="label", categorical=["kind", "label"],
                                  label_kind="binary", bounds_epsilon=5.0, batch_size=8)
        estimated.setup("fit")
    warning = next(r.getMessage() for r in caplog.records if "outside the schema" in r.getMessage())
    assert "the schema is a DP estimate" in warning and "raise --data.bounds_epsilon" in warning
    assert from_file._estimate_hint() == ""
    # the same release given back as --data.schema: a budget flag beside it is refused, so the
    # remedy is to estimate again (spending again), or a public schema file
    released = tmp_path / "released.yaml"
    released.write_text(yaml.safe_dump(estimated.schema.to_dict()))
    reused = CSVDataModule(csv=tmp_path / "rare.csv", schema=released, batch_size=8)
    hint = reused._estimate_hint()
    assert "released by an earlier run's DP estimate" in hint and "without --data.schema; that spends again" in hint


@pytest.mark.parametrize("damage,message", [
    (lambda lines: lines[:3] + ["39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical"] + lines[3:],
     "1 rows have fewer than 15 fields or an empty one (lines [4]...; a missing value is written '?')"),
    # all 15 fields, one of them empty: it was reported as a row without 15 fields
    (lambda lines: lines[:3] + [",".join(["" if i == 1 else field for i, field in enumerate(lines[3].split(","))])]
     + lines[4:], "1 rows have fewer than 15 fields or an empty one (lines [4]"),
    (lambda lines: lines[:3] + [lines[3] + ", extra"] + lines[4:], "not in the UCI Adult format (15 comma-separated fields a row)"),
    # a field more on every row (a row number in front, a trailing one): pandas made the first
    # fields the index and trained on shifted columns, or failed with a TypeError of its own
    (lambda lines: [f"{i}, {line}" for i, line in enumerate(lines)], "line 1 holds 16 fields"),
    (lambda lines: [f"{line}, x" for line in lines], "line 1 holds 16 fields"),
    (lambda lines: [f"{lines[0]},"] + lines[1:3] + [lines[3] + ", x"] + lines[4:], "line 4 holds 16 fields"),
    (lambda lines: [",".join(name for name in AdultDataModule(batch_size=4).schema.names)] + lines,
     "column age holds values that are not numbers (['age'] on lines [1])"),
])
def test_a_damaged_adult_file_is_named_with_its_lines(tmp_path, damage, message):
    """A short row's fields came back empty and trained; a header line failed inside pandas."""
    from lightning_dpgan.datamodules.adult import read_adult

    lines = (FIXTURES / "adult_tiny" / "adult.data").read_text().splitlines()
    (tmp_path / "adult.data").write_text("\n".join(damage(lines)) + "\n")
    with pytest.raises(DataIntegrityError) as error:
        read_adult(tmp_path / "adult.data")
    assert str(tmp_path / "adult.data") in str(error.value) and message in str(error.value)


def test_an_adult_file_with_a_trailing_comma_on_every_row_is_read_as_the_file_it_is(tmp_path):
    """A spreadsheet's trailing comma is an empty last field, no field: pandas made the first field
    the index and shifted every column, and the file was refused as having short rows."""
    lines = (FIXTURES / "adult_tiny" / "adult.data").read_text().splitlines()
    (tmp_path / "adult.data").write_text("\n".join(f"{line}," if line else line for line in lines) + "\n")
    assert read_adult(tmp_path / "adult.data").equals(read_adult(FIXTURES / "adult_tiny" / "adult.data"))


def test_a_data_dir_file_that_is_not_the_canonical_one_trains_with_a_warning(caplog):
    """A truncated copy trains on fewer records (the count privacy.json reports): say so."""
    datamodule = AdultDataModule(data_dir=FIXTURES / "adult_tiny", batch_size=4)
    with caplog.at_level("WARNING"):
        datamodule.prepare_data()  # as Lightning calls it, before setup
        datamodule.setup()
    assert f"{FIXTURES / 'adult_tiny' / 'adult.data'} is not the canonical adult.data" in caplog.text
    assert caplog.text.count("is not the canonical adult.data") == 1  # said (and the file hashed) once, not twice
    assert datamodule.train_size == 36  # trained on as it is


def test_a_king_file_with_the_kaggle_files_row_count_but_other_content_trains_with_a_warning(monkeypatch, caplog):
    """King checked the row count alone: a copy with an edited price trained without a word,
    while the README says a file that is not the canonical one is warned of."""
    from lightning_dpgan.data.download import RemoteFile, content_digest

    path = FIXTURES / "king_tiny" / "kc_house_data.csv"
    monkeypatch.setattr(king_module, "N_ROWS", len(pd.read_csv(path)))  # the tiny copy's count stands in
    with caplog.at_level("WARNING"):
        KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, batch_size=4).setup()
    assert f"{path} is not the canonical kc_house_data.csv (its content's md5 differs from " in caplog.text
    caplog.clear()
    monkeypatch.setattr(king_module, "KAGGLE_FILE", RemoteFile("kc_house_data.csv", (), *content_digest(path)))
    with caplog.at_level("WARNING"):  # the canonical content (here the tiny copy's): nothing said
        KingDataModule(data_dir=FIXTURES / "king_tiny", download=False, batch_size=4).setup()
    assert "is not the canonical" not in caplog.text and "sales, not the Kaggle file's" not in caplog.text


@pytest.mark.parametrize("damage,message", [
    (lambda frame: frame.assign(Extra=1), "columns ['Extra'] are not the Kaggle creditcard.csv's (Time, V1-V28, "
                                          "Amount, Class): remove them, or train on the file as any table (--dataset csv"),
    (lambda frame: frame.iloc[:0], "kaggle-credit: the data file holds no rows, only its header"),
], ids=["extra-column", "header-only"])
def test_a_credit_file_with_an_extra_column_or_no_rows_is_refused_with_what_to_do(tmp_path, damage, message):
    """An extra column was refused with "add them to the schema or list them in its 'drop'
    list", which a built-in schema does not let a user do; a header alone blamed test_fraction."""
    frame = pd.read_csv(FIXTURES / "credit_tiny" / "creditcard.csv")
    (tmp_path / "credit").mkdir()
    damage(frame).to_csv(tmp_path / "credit" / "creditcard.csv", index=False)
    with pytest.raises(DataIntegrityError) as refused:
        KaggleCreditDataModule(data_dir=tmp_path / "credit", batch_size=8).setup()
    assert message in str(refused.value)


def test_a_table_too_small_for_its_split_names_the_flag_and_the_fractions_that_work(tmp_path):
    """One row can be split no way; three rows at the default fraction 0.2 leave none for testing:
    the refusal named neither --data.test_fraction nor what would do."""
    import json

    from test_ctgan_encoding import SCHEMA, make_frame

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA.to_dict()))
    make_frame(1, seed=0).to_csv(tmp_path / "one.csv", index=False)
    with pytest.raises(DataIntegrityError, match="csv: the data file holds one row; the train and test splits need at "
                                                 "least one each: train on more rows"):
        CSVDataModule(csv=tmp_path / "one.csv", schema=schema_file)._load_frames()
    make_frame(3, seed=0).to_csv(tmp_path / "three.csv", index=False)
    with pytest.raises(ValueError, match=r"--data.test_fraction 0.1 leaves 0 of 3 rows for testing; both splits need at "
                                         r"least one row: use a fraction from 0.333333 to 0.666667, or train on more rows"):
        CSVDataModule(csv=tmp_path / "three.csv", schema=schema_file, test_fraction=0.1)._load_frames()
    make_frame(2, seed=0).to_csv(tmp_path / "two.csv", index=False)
    with pytest.raises(ValueError, match=r"leaves 0 of 2 rows for testing; both splits need at least one row: use "
                                         r"--data.test_fraction 0.5, or train on more rows"):  # not "from 0.5 to 0.5"
        CSVDataModule(csv=tmp_path / "two.csv", schema=schema_file, test_fraction=0.1)._load_frames()
    for fraction, tested in ((0.333333, 1), (0.666667, 2)):  # the ends of the range, as said
        module = CSVDataModule(csv=tmp_path / "three.csv", schema=schema_file, test_fraction=fraction)
        module._load_frames()
        assert len(module.test_frame) == tested


def test_a_semicolon_file_with_a_schema_drop_list_is_said_to_be_not_comma_separated(tmp_path):
    """The drop list was checked first, and named its column as missing from a one-column header."""
    import json

    from test_ctgan_encoding import SCHEMA, make_frame

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps({**SCHEMA.to_dict(), "drop": ["id"]}))
    make_frame(20, seed=0).assign(id=range(20)).to_csv(tmp_path / "semi.csv", index=False, sep=";")
    with pytest.raises(SchemaError, match="columns to drop \\['id'\\] are not in .*the header read as a single column: "
                                          "the file must be comma-separated"):
        CSVDataModule(csv=tmp_path / "semi.csv", schema=schema_file)._load_frames()


def test_the_seeded_split_depends_on_the_row_count_alone(tmp_path):
    """The train/test split is the seeded permutation of the row count alone: changing records'
    values moves no record between the splits (a split that read values would release them)."""
    import json

    from test_ctgan_encoding import SCHEMA, make_frame

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA.to_dict()))
    frame = make_frame(200, seed=3)
    changed = frame.copy()
    changed.loc[0, "x"], changed.loc[1, "x"] = 9.5, -9.5  # two records' values, nothing else
    changed.loc[2:, "x"] = changed.loc[2:, "x"].to_numpy()[::-1]
    splits = []
    for name, data in (("a.csv", frame), ("b.csv", changed)):
        data.to_csv(tmp_path / name, index=False)
        module = CSVDataModule(csv=tmp_path / name, schema=schema_file, split_seed=4)
        module._load_frames()
        splits.append((list(module.train_frame.index), list(module.test_frame.index)))
    assert splits[0] == splits[1]
    order = np.random.default_rng(4).permutation(200)
    assert splits[0] == (sorted(order[40:].tolist()), sorted(order[:40].tolist()))


@pytest.mark.parametrize("model", [["--model", "gan", "--privacy", "dp-sgd"], ["--model", "wgan", "--privacy", "dp-sgd"],
                                   ["--model", "dpgan"]], ids=["gan+dp-sgd", "wgan+dp-sgd", "dpgan"])
def test_kaggle_credit_runs_at_its_own_delta_whatever_the_model(tmp_path, model):
    """Without --delta, credit trains at 1e-6 (1e-5 is not below 1/n for its full 227,846 rows),
    also for a model composed with a strategy, which has no credit preset; --delta still wins."""
    import json

    from lightning_dpgan.benchmark.suites import delta_for
    from lightning_dpgan.cli import main

    def delta(output, *extra):
        assert main(["train", *model, "--dataset", "kaggle-credit", "--data-dir", str(FIXTURES / "credit_tiny"),
                     "--epsilon", "5", "--max-steps", "2", "--batch-size", "8", "--output-dir", str(tmp_path / output),
                     "--trainer.enable_progress_bar", "false", *extra]) == 0
        return json.loads((tmp_path / output / "privacy.json").read_text())["delta"]

    assert delta("default") == KaggleCreditDataModule.default_delta == delta_for("kaggle-credit") == 1e-6
    assert delta("given", "--delta", "1e-7") == 1e-7


# --- checked by a mutation audit: behaviour no test above pinned --------------------------------


def test_the_dev_rows_are_drawn_with_the_split_seed():
    """``split_seed`` seeds the dev split too (Adult's train/test split is official, so it is the
    only draw the seed makes): another seed holds other training rows out, each as dev_split says."""
    from lightning_dpgan.data.dev_split import dev_split

    whole = loaded(AdultDataModule, "adult_tiny")
    n = len(whole.train_frame)
    devs = []
    for seed in (0, 1):
        datamodule = loaded(AdultDataModule, "adult_tiny", dev_fraction=0.3, split_seed=seed)
        kept, dev = dev_split(n, 0.3, seed)
        assert list(datamodule.held_out("dev").index) == list(whole.train_frame.index[dev])
        assert list(datamodule.train_frame.index) == list(whole.train_frame.index[kept])
        devs.append(set(datamodule.held_out("dev").index))
    assert devs[0] != devs[1]


def test_a_cached_file_that_is_not_the_canonical_one_is_refused_or_downloaded_again(tmp_path, monkeypatch):
    """The cache holds the framework's downloads, checked by md5 and size: a damaged copy there
    (here the tiny fixture under the canonical name) is refused without downloads, and fetched
    again with them -- never trained on."""
    cache = tmp_path / "cache"
    shutil.copytree(FIXTURES / "adult_tiny", cache / "adult")
    with pytest.raises(DataIntegrityError, match="does not match adult.data: expected decompressed md5"):
        AdultDataModule(cache_dir=cache, download=False).setup()
    calls = []
    monkeypatch.setattr(tabular_module, "fetch", fake_fetch_from(FIXTURES / "adult_tiny", calls))
    AdultDataModule(cache_dir=cache).prepare_data()
    assert sorted(remote.name for remote, _ in calls) == ["adult.data", "adult.test"]


def test_a_damaged_cached_table_that_cannot_be_downloaded_again_is_named_not_said_missing(tmp_path, monkeypatch):
    """Offline, a damaged cached copy read "adult files not found", with the file right there."""
    cache = tmp_path / "cache"
    shutil.copytree(FIXTURES / "adult_tiny", cache / "adult")

    def offline(remote, cache_dir):
        raise DatasetNotFoundError(f"Could not download {remote.name} from any mirror (no network).")

    monkeypatch.setattr(tabular_module, "fetch", offline)
    with pytest.raises(DatasetNotFoundError) as refused:
        AdultDataModule(cache_dir=cache).prepare_data()
    message = str(refused.value)
    assert f"The cached copy {cache / 'adult' / 'adult.data'} is damaged (" in message
    assert "delete it, and pass `--data-dir DIR`" in message and "not found" not in message
    with pytest.raises(DataIntegrityError, match=r"does not match adult.data.* To fix: delete the cached copy to "
                                                 r"download it again .*--data-dir DIR"):
        AdultDataModule(cache_dir=cache, download=False).prepare_data()


def test_every_missing_file_of_a_table_is_named_at_once(tmp_path):
    """Adult said "Expected: adult.data", and once it was copied, on the next run, adult.test."""
    with pytest.raises(DatasetNotFoundError, match=r"Expected: adult.data, adult.test\. Searched"):
        AdultDataModule(data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False).prepare_data()
    shutil.copy(FIXTURES / "adult_tiny" / "adult.test", tmp_path / "adult.test")
    with pytest.raises(DatasetNotFoundError, match=r"Expected: adult.data\. Searched"):  # the one still missing
        AdultDataModule(data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False).prepare_data()


def test_a_damaged_cached_table_in_a_cache_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    """A read-only cache holding a damaged copy said only that the cache cannot be written, not
    which file was damaged."""
    from lightning_dpgan.data.download import CacheNotWritableError

    cache = tmp_path / "cache"
    shutil.copytree(FIXTURES / "adult_tiny", cache / "adult")  # not the canonical files: "damaged"

    def read_only(remote, cache_dir):
        raise CacheNotWritableError(f"The download cache {cache_dir} cannot be written (Permission denied)")

    monkeypatch.setattr(tabular_module, "fetch", read_only)
    with pytest.raises(CacheNotWritableError) as refused:
        AdultDataModule(cache_dir=cache).prepare_data()
    assert "cannot be written (Permission denied)" in str(refused.value)
    assert f"The cached copy {cache / 'adult' / 'adult.data'} is damaged (" in str(refused.value)
    assert "that cache cannot be written to replace it" in str(refused.value) and "delete it" not in str(refused.value)


def test_king_refuses_an_openml_copy_of_another_size(monkeypatch, tmp_path):
    """The OpenML copy is checked by its row count (the Kaggle file's 21,613 sales)."""
    raw = pd.read_csv(FIXTURES / "king_tiny" / "kc_house_data.csv")
    monkeypatch.setattr(king_module, "fetch_openml", lambda **kwargs: Bunch(frame=raw))
    with pytest.raises(DataIntegrityError, match=f"OpenML 42092 has {len(raw)} rows, expected 21613"):
        KingDataModule(cache_dir=tmp_path).setup()


def test_king_refuses_an_extra_column_and_a_field_that_is_not_a_number_by_file_and_column(tmp_path):
    """An extra column was sent to "add it to the schema", which a built-in schema is not the
    user's to edit; a price of "abc" read "Unable to parse string" with no file or column."""
    raw = pd.read_csv(FIXTURES / "king_tiny" / "kc_house_data.csv")
    raw.assign(extra=1).to_csv(tmp_path / "kc_house_data.csv", index=False)
    with pytest.raises(DataIntegrityError, match=re.escape("kc_house_data.csv: columns ['extra'] are not kc_house_data.csv's")):
        KingDataModule(data_dir=tmp_path, download=False).setup()
    priced = raw.astype({"price": object})
    priced.loc[3, "price"] = "abc"
    with pytest.raises(DataIntegrityError, match=r"king.csv: column 'price' holds a value that is not a number"):
        king_module.to_schema_frame(priced, "king.csv")


def test_king_dates_are_days_since_the_start_of_2014():
    """The schema's bounds say 2014-05-01 is day 120 and 2015-05-31 day 515."""
    raw = pd.read_csv(FIXTURES / "king_tiny" / "kc_house_data.csv").iloc[:2]
    raw["date"] = ["20140501T000000", "20150531T000000"]
    assert king_module.to_schema_frame(raw, "test")["date"].tolist() == [120, 515]


@pytest.mark.parametrize(("cls", "folder", "column", "message"), [
    (KingDataModule, "king_tiny", "lat", "columns ['lat'] missing; is this kc_house_data.csv?"),
    (KaggleCreditDataModule, "credit_tiny", "V5", "columns ['V5'] missing; is this the Kaggle creditcard.csv?"),
], ids=["king", "kaggle-credit"])
def test_a_built_in_file_without_one_of_its_columns_is_refused_by_name(tmp_path, cls, folder, column, message):
    source = next((FIXTURES / folder).glob("*.csv"))
    (tmp_path / folder).mkdir()
    pd.read_csv(source).drop(columns=[column]).to_csv(tmp_path / folder / source.name, index=False)
    with pytest.raises(DataIntegrityError, match=re.escape(message)):
        cls(data_dir=tmp_path / folder, download=False).setup()


def test_an_extra_field_is_reported_at_its_own_line_after_rows_ending_in_a_comma(tmp_path):
    """A trailing comma (an empty last field) is no field: the line named is the one whose
    fourth field holds a value, not the first row ending in a comma."""
    path = tmp_path / "data.csv"
    path.write_text("amount,kind,label\n" + "1.0,a,no,\n" * 3 + "2.0,b,yes,9\n" + "3.0,b,yes,\n" * 20)
    with pytest.raises(SchemaError, match=re.escape("more fields than its header (line 5: 4 fields)")):
        CSVDataModule(csv=path, target="label", categorical="kind", label_kind="binary").setup()


def test_a_restored_dp_schema_must_bring_its_label_and_what_it_cost(tmp_path):
    """A resume reuses the released DP schema instead of estimating (and paying) again: the
    estimate's cost must come with it -- else privacy.json would under-report epsilon -- and
    its label must be this run's target."""
    path = write_csv(tmp_path / "data.csv")
    args = dict(csv=path, target="churned", categorical="region", label_kind="binary", drop="row_id", bounds_epsilon=3.0)
    first = CSVDataModule(**args)
    schema, cost = first.schema, first.privacy_cost()
    assert cost["epsilon"] == 3.0
    for missing in (None, {}, {"parts": {"modes": {"epsilon": 1.0, "delta": 0.0}}}, {"delta": 1e-6}):
        with pytest.raises(ValueError, match="under-report epsilon"):
            CSVDataModule(**args).restore_schema(schema, missing)
    with pytest.raises(ValueError, match="the checkpoint's schema has label 'churned', this run --data.target 'region'"):
        CSVDataModule(**{**args, "target": "region", "categorical": None}).restore_schema(schema, cost)
    resumed = CSVDataModule(**args)
    resumed.restore_schema(schema, {"epsilon": 9.0, "parts": {"schema": cost, "modes": {"epsilon": 6.0}}})
    assert resumed.estimates_schema is False and resumed.schema is schema
    assert resumed.privacy_cost() == cost  # the schema's part, reported again, not re-estimated


def test_a_table_file_the_data_dir_lacks_read_from_the_cache_is_warned_of(tmp_path, monkeypatch, caplog):
    """As a download is: the run reads the canonical copy, not a file of the user's folder."""
    cache, mine = tmp_path / "cache", tmp_path / "mine"
    shutil.copytree(FIXTURES / "adult_tiny", cache / "adult")
    mine.mkdir()
    monkeypatch.setattr(tabular_module, "verify_file", lambda path, remote: None)  # the tiny copy stands in
    with caplog.at_level("WARNING"):
        AdultDataModule(data_dir=mine, cache_dir=cache, download=False).setup()
    assert f"adult.data not found in {mine}" in caplog.text
    assert f"reading the earlier download in {cache / 'adult'}" in caplog.text


def test_the_test_split_holds_the_rounded_share_of_the_rows():
    """The test split is the rounded share of the rows (a count privacy.json releases): 13.6 of 40 is 14."""
    datamodule = loaded(KingDataModule, "king_tiny", test_fraction=0.34)  # 40 rows: 13.6 -> 14
    assert len(datamodule.test_frame) == 14 and len(datamodule.train_frame) == 26


def test_every_training_batch_is_full_when_the_split_has_enough_rows():
    """A short last batch is dropped when the split holds a full one: 32 training rows, batch 7, four of 7."""
    datamodule = loaded(KingDataModule, "king_tiny")  # 32 training rows, batch 8 -> use 7 to leave a remainder
    datamodule.hparams.batch_size = 7
    sizes = [len(batch[0]) for batch in datamodule.train_dataloader()]
    assert sizes and set(sizes) == {7}


def test_adult_rows_keep_their_line_numbers_after_the_missing_ones_are_dropped():
    """The index stays the file's line number (splits stay traceable, and the rows' digest hashes it)."""
    path = FIXTURES / "adult_tiny" / "adult.data"
    lines = path.read_text().splitlines()
    offset = 1 if lines[0].startswith("|") else 0
    expected = [i - offset for i, line in enumerate(lines) if i >= offset and line.strip() and "?" not in line]
    assert len(expected) < len(lines) - offset  # the fixture has rows with '?'
    assert list(read_adult(path).index) == expected


def test_a_king_file_of_another_size_is_warned_of(caplog):
    """A truncated local King file trains on fewer records: said, as for Adult."""
    with caplog.at_level(logging.WARNING):
        loaded(KingDataModule, "king_tiny")
    assert "not the Kaggle file's 21613" in caplog.text


def test_path_settings_are_kept_as_text_so_a_checkpoint_loads_with_weights_only(tmp_path):
    """Lightning saves a datamodule's settings in each checkpoint; a ``pathlib.Path`` there made
    torch's ``weights_only`` loading (``sample``, ``evaluate``, Lightning's resume) refuse it."""
    import io

    adult = AdultDataModule(data_dir=FIXTURES / "adult_tiny", cache_dir=tmp_path, batch_size=8)
    assert adult.hparams["data_dir"] == str(FIXTURES / "adult_tiny") and adult.hparams["cache_dir"] == str(tmp_path)
    assert adult.data_dir == FIXTURES / "adult_tiny"  # what the module reads from is unchanged
    saved = io.BytesIO()
    torch.save({"datamodule_hyper_parameters": dict(adult.hparams)}, saved)
    saved.seek(0)
    assert torch.load(saved, weights_only=True)["datamodule_hyper_parameters"]["data_dir"] == str(FIXTURES / "adult_tiny")


def test_a_strategy_built_by_hand_takes_the_datasets_own_delta():
    """Kaggle credit's default δ is 1e-6 (1e-5 is not below 1/n of its full rows): ``train`` passed
    it on, and a library user's strategy without a δ reported 1e-5."""
    from lightning_dpgan.callbacks.dp_sgd import DPSGD

    def delta_at_setup(datamodule, delta=None):
        strategy = DPSGD(noise_multiplier=1.0, delta=delta)
        strategy.train_records = len(datamodule.train_dataset)
        return strategy._checked_delta(datamodule)

    credit, adult = loaded(KaggleCreditDataModule, "credit_tiny"), loaded(AdultDataModule, "adult_tiny")
    assert delta_at_setup(credit) == 1e-6 and delta_at_setup(credit, 1e-4) == 1e-4  # a δ given still wins
    assert delta_at_setup(adult) == 1e-5  # no default of its own: the strategies'


def _mode_specific_adult():
    return AdultDataModule(data_dir=FIXTURES / "adult_tiny", batch_size=8, encoding="mode-specific", download=False)


def test_a_checkpoint_keeps_the_dp_releases_and_a_fresh_datamodule_restores_them_or_is_refused(tmp_path):
    """A datamodule built afresh for a resume from Python drew a second DP histogram (spent, in no
    report) and, when the width came out the same, trained on in silence under other modes: the
    releases now travel in the datamodule's checkpoint state."""
    first = _mode_specific_adult()
    layout = first.table_layout  # draws the DP modes
    state = first.state_dict()
    assert set(state) == {"table_transformer", "preprocessing_cost"}
    assert state["preprocessing_cost"]["epsilon"] == pytest.approx(0.1)

    for given in (state, {"AdultDataModule": state, "state_dict": {}}):  # the state, or the checkpoint read
        resumed = _mode_specific_adult()
        resumed.restore_releases(given)  # before anything reads the encoding: nothing drawn again
        assert resumed.table_layout == layout and resumed.privacy_cost() == first.privacy_cost()
        resumed.load_state_dict(state)  # the checkpoint's own releases: accepted

    redrawn = _mode_specific_adult()
    other = copy.deepcopy(state)  # another draw of the modes: one frequency moved
    frequencies = next(c for c in other["table_transformer"]["columns"] if "frequencies" in c)["frequencies"]
    frequencies[0], frequencies[-1] = frequencies[-1], frequencies[0] + 1e-3
    with pytest.raises(ValueError, match=r"adult: this datamodule's mode-specific encoding \(its DP modes\) is not the "
                                         r"checkpoint's: built afresh, it drew its own .*restore_releases\(checkpoint\)"):
        redrawn.load_state_dict({**other})
    assert _mode_specific_adult().state_dict() == {}  # nothing drawn yet: nothing to keep


def test_a_csvs_dp_estimated_schema_travels_in_the_state_and_is_restored_not_estimated_again(tmp_path, monkeypatch):
    def estimated():
        return CSVDataModule(csv=write_csv(tmp_path / "data.csv"), target="churned", categorical="region",
                             label_kind="binary", integer=["visits"], drop="row_id", bounds_epsilon=20.0, batch_size=16)

    first = estimated()
    first.setup("fit")
    state = first.state_dict()
    assert state["schema"] == first.schema.to_dict() and state["preprocessing_cost"] == first.privacy_cost()
    seen = record_calls(monkeypatch, csv_module, "infer_schema_dp")
    resumed = estimated()
    resumed.restore_releases(state)
    resumed.setup("fit")
    assert not seen and resumed.schema.to_dict() == first.schema.to_dict()
    assert resumed.privacy_cost() == first.privacy_cost()


def test_a_dp_ctgan_resumed_from_python_into_a_fresh_datamodule_pays_for_its_modes_once(tmp_path):
    """The README's resume, across processes: a fresh datamodule restores the checkpoint's DP
    modes, and the accountant goes on from the checkpoint."""
    import lightning as L

    from lightning_dpgan.callbacks import StepLimit
    from lightning_dpgan.callbacks.dp_sgd import DPSGD
    from lightning_dpgan.modules.dpctgan import DPCTGAN

    def fit(data, steps, ckpt_path=None):
        model = DPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout, generator_hidden=(8,),
                        discriminator_hidden=(8,), latent_dim=4)
        strategy = DPSGD(noise_multiplier=1.0, delta=1e-3)
        trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(steps), strategy], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=tmp_path)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return trainer, strategy

    trainer, _ = fit(_mode_specific_adult(), 2)
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    fresh = _mode_specific_adult()
    fresh.restore_releases(tmp_path / "two.ckpt")
    _, resumed = fit(fresh, 4, tmp_path / "two.ckpt")
    report = resumed.privacy_report()
    assert report["steps"] == 4 and report["preprocessing"]["epsilon"] == pytest.approx(0.1)
