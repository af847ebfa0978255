"""The bad-input matrix (docs/architecture.md, "Bad input"): each case fails at the user's entry
point -- ``main([...])`` returns 2 and prints ``error: <what is wrong and what to do>`` -- or is
handled as documented, and nothing is lost or half-written: files of an earlier run in the output
folder keep their bytes, and no temporary file is left behind. Cases already covered elsewhere are
named in the docs and not repeated here."""
from __future__ import annotations

import errno
import gzip
import json
import os
import re
import shutil
import stat
import struct
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from lightning_dpgan import outputs
from lightning_dpgan.cli import main
from lightning_dpgan.data.schema import SchemaError
from lightning_dpgan.datamodules.csv import DEFAULT_BOUNDS_DELTA, DEFAULT_BOUNDS_EPSILON, CSVDataModule
from lightning_dpgan.outputs import OutputWriteError, atomic_write, write_csv, write_json, write_png, write_yaml
from lightning_dpgan.sampling import CheckpointError, read_run_info, resume_checkpoint
from run_helpers import act_after_training_step, press_ctrl_c, record_calls, sigint_restored, tiny_run_args

#: What an earlier run left in the output folder: a failed run must not lose it. The runs below
#: pass --overwrite (a folder holding a run is refused otherwise): the earlier outputs are set
#: aside in previous/ before anything else, and must be found there or where they were.
EARLIER_RUN = {
    "config.yaml": b"model: the earlier run's\n",
    "privacy.json": b'{"mechanism": "dp-sgd", "epsilon": 1.0, "note": "the earlier run"}\n',
    "metrics.json": b'{"steps": 1000}\n',
    "samples.png": b"earlier samples",
    "synthetic.csv": b"amount,visits,kind,label\n1.0,2,a,no\n",
    "checkpoints/last.ckpt": b"the earlier run's weights and accountant",
}


def plant_earlier_run(output_dir: Path) -> None:
    for name, data in EARLIER_RUN.items():
        (output_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (output_dir / name).write_bytes(data)


def assert_nothing_lost(output_dir: Path, set_aside: bool = False) -> None:
    """The earlier run's files keep their bytes: in place, as a run refused before training
    leaves them (its outputs put back), or -- ``set_aside``, a run that failed once training
    had started -- in place or in previous/; a file at the top is either the earlier one or
    absent after a failure (no half-run claims the folder); no temporary file is left."""
    for name, data in EARLIER_RUN.items():
        places = (output_dir / name, output_dir / "previous" / name) if set_aside else (output_dir / name,)
        kept = [path for path in places if path.is_file() and path.read_bytes() == data]
        assert kept, f"{name} was lost" + ("" if set_aside else " (or left in previous/)")
    if not set_aside:
        assert not (output_dir / "previous").exists(), "a refusal before training left previous/ behind"
    leftovers = [p.name for p in output_dir.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def error_line(capsys) -> str:
    """The one ``error: ...`` line main printed (an escaped exception fails the test by itself)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


def assert_refused(argv: list[str], capsys, *keywords: str) -> str:
    assert main(argv) == 2
    line = error_line(capsys)
    for keyword in keywords:
        assert keyword in line, f"{keyword!r} not in {line!r}"
    return line


# --- data files --------------------------------------------------------------------------------


def image_args(data_dir: Path, output_dir: Path, *extra: str, verify: bool = False, **kwargs) -> list[str]:
    args = tiny_run_args(data_dir, output_dir, steps=2, **kwargs) + ["--overwrite", *extra]
    if verify:  # the default of a real run; the fixtures are not the canonical files
        index = args.index("--data.verify_checksums")
        del args[index : index + 2]
    return args


@pytest.fixture
def damaged_image_dir(tiny_image_data_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny image data whose files the test may damage."""
    return Path(shutil.copytree(tiny_image_data_dir / "mnist", tmp_path / "data" / "mnist")).parent


def test_a_file_with_the_wrong_checksum_is_a_clear_error(tiny_image_data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused(image_args(tiny_image_data_dir, out, verify=True), capsys,
                   "train-images-idx3-ubyte.gz does not match", "expected decompressed md5", "To fix", "--data-dir")
    assert_nothing_lost(out)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["last.ckpt"]  # no new one


@pytest.mark.parametrize("verify", [True, False], ids=["checksums-on", "checksums-off"])
def test_a_truncated_image_file_is_a_clear_error(damaged_image_dir, tmp_path, capsys, verify):
    path = damaged_image_dir / "mnist" / "train-images-idx3-ubyte.gz"
    if verify:  # a download cut off half-way: the gzip stream ends early
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        keywords = ["is not a readable gzip file", "was reached. To fix: pass `--data-dir DIR` pointing at the official "
                    "mnist files."]
    else:  # an intact gzip of a cut-off IDX file
        raw = gzip.decompress(path.read_bytes())
        path.write_bytes(gzip.compress(raw[: len(raw) // 2], mtime=0))
        keywords = ["header announces shape", "truncated or corrupt, re-download it"]
    out = tmp_path / "out"
    plant_earlier_run(out)
    refusal = assert_refused(image_args(damaged_image_dir, out, verify=verify), capsys, str(path), *keywords)
    assert "verify_checksums false" not in refusal  # damaged whether checked or not: no remedy
    assert_nothing_lost(out)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["last.ckpt"]  # no new one


# --- CSV files (with a schema file, and with the schema estimated under DP) --------------------


CSV_SCHEMA = {"label": "label", "label_kind": "binary", "columns": [
    {"name": "amount", "kind": "continuous", "bounds": [0, 500]},
    {"name": "visits", "kind": "integer", "bounds": [0, 30]},
    {"name": "kind", "kind": "categorical", "categories": ["a", "b"]},
    {"name": "label", "kind": "categorical", "categories": ["no", "yes"]}]}
TINY_MLP = ["--model.latent_dim", "4", "--model.generator_kwargs.hidden", "[8]",
            "--model.discriminator_kwargs.hidden", "[8]"]


def table(n: int = 80, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"amount": rng.gamma(2.0, 50.0, n).round(2), "visits": rng.integers(0, 30, n),
                         "kind": rng.choice(["a", "b"], n), "label": rng.choice(["no", "yes"], n)})


def csv_args(csv: Path, out: Path, schema: Path | None, *extra: str) -> list[str]:
    args = ["train", "--model", "gan", "--dataset", "csv", "--data.csv", str(csv), "--output-dir", str(out),
            "--max-steps", "2", "--batch-size", "8", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--overwrite", *TINY_MLP]
    if schema is not None:
        return args + ["--data.schema", str(schema), *extra]
    return args + ["--data.target", "label", "--data.categorical", "kind,label", "--data.label_kind", "binary",
                   "--data.bounds_epsilon", "5", *extra]


def with_nans(frame: pd.DataFrame) -> pd.DataFrame:
    frame.loc[range(0, 80, 8), "amount"] = np.nan  # in both splits
    return frame


def with_text_amount(frame: pd.DataFrame) -> pd.DataFrame:
    frame["amount"] = frame["amount"].astype(object)
    frame.loc[range(0, 80, 8), "amount"] = "lots"
    return frame


def with_third_class(frame: pd.DataFrame) -> pd.DataFrame:
    frame.loc[range(0, 80, 8), "label"] = "maybe"
    return frame


def with_infinite_amount(frame: pd.DataFrame) -> pd.DataFrame:
    frame.loc[range(0, 80, 8), "amount"] = np.inf  # clipped to the bound, it would pass for the bound itself
    return frame


def with_one_class(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(label="yes")


def truncated(text: str) -> str:
    return text[: len(text) // 2 + 3]  # cut mid-line, as by a failed copy


#: case -> (file content: frame edit or text, keywords with a schema file, keywords with a DP schema)
CSV_CASES = {
    "empty-file": ("", ["is empty", "header row"], ["is empty", "header row"]),
    "header-only": ("amount,visits,kind,label\n", ["has a header", "no records"], ["has a header", "no records"]),
    "nans": (with_nans, ["missing values (NaN)", "amount", "drop or impute"],
             ["missing values (NaN)", "amount", "drop or impute"]),
    "truncated": (truncated, ["missing values (NaN)", "drop or impute"], ["missing values (NaN)", "drop or impute"]),
    # Excel writes a separator line before the header: it was blamed on trailing commas
    "excel-separator-line": ("sep=,\namount,visits,kind,label\n" + "1.0,2,a,no\n3.0,4,b,yes\n" * 20,
                             ["starts with Excel's separator line ('sep=')", "remove that first line"],
                             ["starts with Excel's separator line ('sep=')", "remove that first line"]),
    "ragged-rows": ("amount,visits,kind,label\n1.0,2,a,no\n3.0,4,b,yes,extra\n",
                    ["cannot be read as a CSV table", "same number of fields"],
                    ["cannot be read as a CSV table", "same number of fields"]),
    "binary-file": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", ["is not UTF-8 text"], ["is not UTF-8 text"]),
    "latin-1": ("amount,visits,kind,label\n".encode() + "1.0,2,caf\u00e9,no\n".encode("latin-1") * 40,
                ["is not UTF-8 text", "iconv -f cp1252 -t utf-8"], ["is not UTF-8 text", "iconv -f cp1252 -t utf-8"]),
    "semicolons": ("amount;visits;kind;label\n" + "1.0;2;a;no\n3.0;4;b;yes\n" * 20,
                   ["the header read as a single column", "comma-separated"],
                   ["the header read as a single column", "comma-separated"]),
    # '?' and blanks in one column: both said in one refusal, not the blanks after '?' is fixed
    "text-and-blanks": (lambda frame: with_text_amount(frame).assign(
                            amount=lambda f: f["amount"].where(f.index % 8 != 1, None)),
                        ["'amount' is continuous but holds non-numeric", "'lots' (data row 1)", "and 10 missing values"],
                        ["'amount' holds non-numeric values", "'lots' (data row 1)", "and 10 missing values"]),
    "wrong-dtype": (with_text_amount, ["'amount' is continuous but holds non-numeric", "'lots' (data row", "fix those values"],
                    ["'amount' holds non-numeric values", "'lots' (data row", "fix those values", "--data.categorical"]),
    # pandas reads True/False as booleans, which pass for numbers: trained as 0/1, written as fractions
    "booleans-in-a-numeric-column": (lambda frame: frame.assign(amount=frame.index % 3 == 0),
                                     ["'amount' is continuous but holds True/False", "declare it categorical in the schema file"],
                                     ["'amount' is numeric but holds True/False", "list it with --data.categorical amount"]),
    "booleans-and-a-gap": (lambda frame: frame.assign(amount=(frame.index % 3 == 0)).astype({"amount": object}).assign(
                               amount=lambda f: f["amount"].where(f.index != 5, None)),
                           ["'amount' is continuous but holds True/False"], ["'amount' is numeric but holds True/False"]),
    "repeated-column": ("amount,visits,amount,label\n1.0,2,3.0,no\n3.0,4,5.0,yes\n",
                        ["names the columns ['amount'] more than once"], ["names the columns ['amount'] more than once"]),
    "unknown-label-class": (with_third_class, ["label 'label' must be binary", "fix or drop those rows"],
                            ["label 'label' must be binary", "fix or drop those rows"]),
    "missing-file": (None, ["CSV file not found", "--data.csv"], ["CSV file not found", "--data.csv"]),
    "a-folder": (Path.mkdir, ["is a folder: pass the CSV file in it"], ["is a folder: pass the CSV file in it"]),
    "infinite-values": (with_infinite_amount, ["'amount' holds infinite values", "(data row 1)", "fix or drop"],
                        ["'amount' holds infinite values", "(data row 1)", "fix or drop"]),
    # pandas took each row's first field as its index and read the rest one column to the left
    "an-extra-field-on-every-row": ("amount,visits,kind,label\n" + "1.0,2,a,no,9\n3.0,4,b,yes,8\n" * 20,
                                    ["more fields than its header", "(line 2: 5 fields)", "delimiter"],
                                    ["more fields than its header", "(line 2: 5 fields)", "delimiter"]),
    # a European spreadsheet's export: ';' between fields, decimal commas that split the rows
    "semicolons-and-decimal-commas": ("amount;visits;kind;label\n" + "1,5;2;a;no\n3,25;4;b;yes\n" * 20,
                                      ["more fields than its header", "separated by ';', not commas", "decimal=','"],
                                      ["more fields than its header", "separated by ';', not commas", "decimal=','"]),
    # not text at all: the fix is the file's kind, not an encoding
    "gzip-named-csv": (gzip.compress(table().to_csv(index=False).encode()),
                       ["is gzip-compressed", ".gz ending"], ["is gzip-compressed", ".gz ending"]),
    "excel-workbook": (b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xa4\xc3\xd2\x8b",
                       ["is a zip archive", "Excel", "'CSV UTF-8'"], ["is a zip archive", "Excel", "'CSV UTF-8'"]),
    "utf-16": (table().to_csv(index=False).encode("utf-16"), ["is UTF-16 text", "save it as UTF-8"],
               ["is UTF-16 text", "save it as UTF-8"]),
    "utf-32": (table().to_csv(index=False).encode("utf-32"), ["is UTF-32 text", "iconv -f utf-32"],
               ["is UTF-32 text", "iconv -f utf-32"]),
    # a space after each comma: ' label' is not 'label'
    "spaces-after-commas": ("amount, visits, kind, label\n" + "1.0, 2, a, no\n3.0, 4, b, yes\n" * 20,
                            ["is missing from the data", "have spaces around them", "remove them from the header"],
                            ["target column 'label' is missing", "have spaces around them", "remove them from the header"]),
    # pandas' to_csv without index=False: the header's first name is empty
    "saved-row-index": (table().to_csv(), ["has no name for column 1 of its header", "row index"],
                        ["has no name for column 1 of its header", "row index"]),
    # a name left out between two others: neither a saved index nor a trailing comma
    "unnamed-middle-column": ("amount,,kind,label\n" + "1.0,2,a,no\n3.0,4,b,yes\n" * 20,
                              ["has no name for column 2 of its header", "a header cell left empty"],
                              ["has no name for column 2 of its header", "a header cell left empty"]),
    # UCI's missing-value marker in a numeric column: it is no category, and no number to fix
    "question-marks-for-missing": (lambda frame: frame.assign(amount=frame["amount"].astype(object).where(
                                       frame.index % 9 != 2, "?")),
                                   ["'amount' holds ('?' (data row 3)", "a missing value as some files write it",
                                    "drop or impute those rows"],
                                   ["'amount' holds ('?' (data row 3)", "a missing value as some files write it",
                                    "drop or impute those rows"]),
    # a spreadsheet's trailing comma on every line, the header's too: an unnamed last column
    "trailing-commas": ("amount,visits,kind,label,\n" + "1.0,2,a,no,\n3.0,4,b,yes,\n" * 20,
                        ["has no name for column 5 of its header", "a comma at the end of every line"],
                        ["has no name for column 5 of its header", "a comma at the end of every line"]),
    # numbers as a spreadsheet shows them: the fix is the number format, not --data.categorical
    "thousands-separators": (lambda frame: frame.assign(amount=[f"{1000 + 37 * i:,}.5" for i in range(len(frame))]),
                             ["'amount' is continuous but holds numbers written with a comma", "'1,000.5' (data row 1)",
                              "thousands=','", "decimal=','"],
                             ["'amount' is numeric but holds numbers written with a comma", "'1,000.5' (data row 1)",
                              "thousands=','", "decimal=','"]),
    # decimal commas, quoted in a comma-separated file: not to be read as thousands (0,125 is no 125)
    "decimal-commas": (lambda frame: frame.assign(amount=[f"0,{125 + i}" for i in range(len(frame))]),
                       ["'amount' is continuous but holds numbers written with a comma", "'0,125' (data row 1)",
                        "decimal=','"],
                       ["'amount' is numeric but holds numbers written with a comma", "'0,125' (data row 1)",
                        "decimal=','"]),
    "one-label-class": (with_one_class, ["label 'label' holds one class ('yes')", "at least two classes"],
                        ["label 'label' must be binary (exactly 2 categories), but the schema lists 1"]),
}


def write_case(path: Path, content) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    elif content is Path.mkdir:
        path.mkdir()
    elif content is truncated:
        path.write_text(truncated(table().to_csv(index=False)))
    elif content is not None:
        content(table()).to_csv(path, index=False)
    return path


def test_a_label_column_named_null_is_told_how_to_pass_it(tmp_path, capsys):
    """YAML reads --data.target null as no value: the refusal asked for the label column the user
    had just named; quoted, the column trains."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.rename(columns={"label": "null"}))
    args = csv_args(csv, tmp_path / "out", None, "--data.categorical", "kind,null")
    at = args.index("--data.target")
    args[at + 1] = "null"
    assert_refused(args, capsys, "needs the label column", """--data.target '"null"'""")
    args[at + 1] = '"null"'
    assert main(args) == 0
    assert "null" in pd.read_csv(tmp_path / "out" / "synthetic.csv").columns


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(CSV_SCHEMA))
    return path


def test_missing_value_spellings_in_a_categorical_column_are_said_to_be_read_as_categories(tmp_path, caplog):
    """In a categorical column only an empty field is missing (NA may be a region, None a smoker's
    answer), so 'NA', 'null' or ' ?' trained as categories while the README said a missing value is
    refused, with no word said: warned now, naming them, except where a schema file lists them."""
    frame = table(60)
    frame.loc[frame.index % 7 == 1, "kind"] = "NA"
    frame.loc[frame.index % 7 == 2, "kind"] = " ?"
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    estimated = CSVDataModule(csv=csv, target="label", categorical=["kind", "label"], label_kind="binary",
                              bounds_epsilon=5.0)
    with caplog.at_level("WARNING"):  # said as the file is read, before the DP estimate (which may drop a class)
        estimated.training_row_count()
    assert ("column 'kind' holds '?', 'NA', which other tools write for a missing value: in a categorical column only "
            "an empty field is missing, so each is a category of its own here") in caplog.text
    assert "column 'label'" not in caplog.text and "column 'amount'" not in caplog.text
    caplog.clear()
    schema = {**CSV_SCHEMA, "columns": [*CSV_SCHEMA["columns"][:2], {"name": "kind", "kind": "categorical",
                                                                     "categories": ["a", "b", "NA", " ?"]},
                                        CSV_SCHEMA["columns"][3]]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    with caplog.at_level("WARNING"):
        CSVDataModule(csv=csv, schema=tmp_path / "schema.yaml").setup("fit")
    assert "other tools write for a missing value" not in caplog.text  # declared: categories on purpose
    caplog.clear()
    blank = table(60)
    blank.loc[3, "kind"] = None  # an empty field: missing (refused), not a category 'nan' to warn of
    with caplog.at_level("WARNING"), pytest.raises(SchemaError, match="missing values"):
        CSVDataModule(csv=write_case(tmp_path / "blank.csv", lambda _: blank), target="label",
                      categorical=["kind", "label"], label_kind="binary", bounds_epsilon=5.0).setup("fit")
    assert "other tools write for a missing value" not in caplog.text


def test_an_integer_column_distinct_in_every_row_is_warned_of_as_an_identifier(tmp_path, caplog):
    """An ID column declared integer trained without a word, and 97 % of its synthetic values
    were real rows' IDs. Warned of now; a count column whose values repeat is not. (A large
    estimate budget: at 5, split over the columns, the small table's label lost a class now and
    then, which is the estimate's business, not this warning's.)"""
    wide = np.linspace(np.iinfo(np.int64).min // 2, np.iinfo(np.int64).max // 2, 200).astype(np.int64)
    frame = table(200).assign(record_id=range(1, 201), sparse=range(0, 2000, 10), wide=wide)
    csv = write_case(tmp_path / "ids.csv", lambda _: frame)
    datamodule = CSVDataModule(csv=csv, target="label", categorical=["kind", "label"],
                               integer=["visits", "record_id", "sparse", "wide"], label_kind="binary", bounds_epsilon=50.0)
    with caplog.at_level("WARNING"):
        datamodule.setup("fit")
    rows = len(datamodule.train_frame)
    assert (f"column 'record_id' holds a different whole number in each of the {rows} training rows, filling their "
            "range as a record ID does") in caplog.text and "--data.drop" in caplog.text
    # repeated values, or distinct ones spread thin (few synthetic values equal a real one): nothing said
    assert "column 'visits' holds" not in caplog.text and "column 'sparse' holds" not in caplog.text
    assert "column 'wide' holds" not in caplog.text  # its range overflowed an int64 subtraction to below 2n
    caplog.clear()
    small = CSVDataModule(csv=write_case(tmp_path / "small.csv", lambda _: frame.head(60)), target="label",
                          categorical=["kind", "label"], integer=["visits", "record_id"], label_kind="binary",
                          bounds_epsilon=50.0)
    with caplog.at_level("WARNING"):
        small.setup("fit")
    assert "as a record ID does" not in caplog.text  # a small table's columns may all differ


def test_whole_numbers_written_with_leading_zeros_are_warned_of_as_codes(tmp_path, caplog):
    """ZIP codes such as 01200 were read as 1200 and written back so in synthetic.csv, without a
    word. Warned of now as the file is read (before any DP estimate), by count (never by value),
    with the remedy for flags or a schema file; a count column holding 0 and 10 is not a code."""
    frame = table(60).assign(zip=np.where(np.arange(60) % 2, "01200", "02134"))
    csv = tmp_path / "zips.csv"
    frame.to_csv(csv, index=False)
    assert "01200" in csv.read_text()
    flags = CSVDataModule(csv=csv, target="label", categorical=["kind", "label"], integer=["visits", "zip"],
                          label_kind="binary", bounds_epsilon=5.0)
    with caplog.at_level("WARNING"):
        flags.training_row_count()
    assert ("column 'zip' is read as whole numbers, but 60 of the file's values in it are written with a leading zero"
            in caplog.text) and "--data.categorical zip" in caplog.text
    assert "01200" not in caplog.text and "2134" not in caplog.text and "column 'visits' is read" not in caplog.text
    caplog.clear()
    schema = {**CSV_SCHEMA, "columns": [*CSV_SCHEMA["columns"], {"name": "zip", "kind": "integer",
                                                                 "bounds": [0, 99999]}]}
    (tmp_path / "zips.yaml").write_text(yaml.safe_dump(schema))
    with caplog.at_level("WARNING"):
        CSVDataModule(csv=csv, schema=tmp_path / "zips.yaml").training_row_count()
    assert "60 of the file's values in it are written with a leading zero" in caplog.text
    assert "declare it categorical in the schema file" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # listed as categorical: kept as text, nothing to say
        codes = CSVDataModule(csv=csv, target="label", categorical=["kind", "label", "zip"], integer=["visits"],
                              label_kind="binary", bounds_epsilon=5.0)
        codes.training_row_count()
    assert "leading zero" not in caplog.text and codes.train_frame["zip"].str.startswith("0").all()


@pytest.mark.parametrize("text, may_hold, zeros", [
    ("n,m\n1,2\n3,4\n", False, 0),
    ("n,m\n1,2e-05\n3,0\n", False, 0),  # an exponent's -05, a lone zero
    ("n,m\n0.5,2\n", False, 0),
    ("n,m\n1,05\n3,4\n", True, 1),
    ("n,m\n1,-05\n3, 007\n", True, 2),
    ('n,m\n1,"007"\n3,4\n', True, 1),
    ("n,m\n05,2\n", True, 0),  # in another column than the one counted
])
def test_leading_zeros_are_found_in_the_bytes_and_counted_in_the_column(tmp_path, text, may_hold, zeros):
    from lightning_dpgan.data.csv_fields import leading_zero_counts, may_hold_leading_zeros

    path = tmp_path / "t.csv"
    path.write_text(text)
    assert may_hold_leading_zeros(path) is may_hold
    assert may_hold_leading_zeros(path, block=2) is may_hold  # a field cut between two blocks
    assert leading_zero_counts(path, ["m"]) == {"m": zeros}
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert may_hold_leading_zeros(packed) is True and leading_zero_counts(packed, ["m"]) == {"m": zeros}


def test_a_csv_none_of_whose_rows_fits_the_schema_says_so(tmp_path, capsys, schema_file):
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.assign(kind="c"))  # the schema lists a and b
    assert_refused(csv_args(csv, tmp_path / "out", schema_file), capsys, "none of the", "training rows fits the schema",
                   "blanked rows per column: {'kind'", "check the category lists")
    # categories written yes/no unquoted: YAML read them as booleans, which no value of the file matches
    yaml_text = schema_file.read_text().replace("- a\n", "- yes\n").replace("- b\n", "- no\n")
    assert "- yes\n" in yaml_text
    (tmp_path / "booleans.yaml").write_text(yaml_text)
    csv = write_case(tmp_path / "yes-no.csv", lambda frame: frame.assign(kind=np.where(frame.index % 2, "yes", "no")))
    assert_refused(csv_args(csv, tmp_path / "out", tmp_path / "booleans.yaml"), capsys, "training rows fits the schema",
                   "['kind'] list booleans: YAML reads unquoted no/yes", "quote the classes")


def test_declared_bounds_that_clip_every_value_of_a_column_are_refused(tmp_path, capsys, schema_file):
    """Amounts in thousands against bounds [0, 500]: every value was clipped to 500 and the run
    trained on a constant column, with one warning in the log."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.assign(amount=frame["amount"] * 1000 + 1000))
    refusal = assert_refused(csv_args(csv, tmp_path / "out", schema_file), capsys,
                             "training values of 'amount' lies outside its declared bounds [0, 500] (0 below,",
                             "above): the column would be learnt as a constant", "Correct the bounds in the schema")
    assert "every one of the" in refusal and not (tmp_path / "out").exists()
    some = write_case(tmp_path / "some.csv", lambda frame: frame.assign(amount=np.where(frame.index % 2, 900.0, 10.0)))
    assert main(csv_args(some, tmp_path / "half", schema_file)) == 0  # half of them: trained, with the warning


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema-file", "dp-schema"])
@pytest.mark.parametrize("case", list(CSV_CASES))
def test_a_bad_csv_is_a_clear_error_and_loses_nothing(tmp_path, capsys, schema_file, case, with_schema):
    content, schema_keywords, dp_keywords = CSV_CASES[case]
    csv = write_case(tmp_path / "data.csv", content)
    out = tmp_path / "out"
    plant_earlier_run(out)
    keywords = schema_keywords if with_schema else dp_keywords
    assert_refused(csv_args(csv, out, schema_file if with_schema else None), capsys, *keywords)
    assert_nothing_lost(out)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["last.ckpt"]  # no new one


def _cut(data: bytes) -> bytes:
    return data[: len(data) // 2]  # a copy or download cut off half-way


#: name -> (content, keywords): compressed files pandas opens by their name's ending, damaged; the
#: decompressor's own error (zlib.error, EOFError, LZMAError, BadZipFile) escaped as a traceback
DAMAGED_COMPRESSED_CSV = {
    "data.csv.gz": (lambda text: _cut(gzip.compress(text)), ["cannot be decompressed", "damaged or cut short"]),
    "data.csv.xz": (lambda text: _cut(__import__("lzma").compress(text)), ["cannot be decompressed", "damaged or cut short"]),
    "data.csv.bz2": (lambda text: _cut(__import__("bz2").compress(text)), ["cannot be decompressed", "damaged or cut short"]),
    "data.csv.zip": (lambda text: b"PK\x03\x04" + text[:40], ["cannot be decompressed", "damaged or cut short"]),
    "bad.csv.gz": (lambda text: b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 30,
                   ["cannot be decompressed", "damaged or cut short"]),
    "plain.csv.gz": (lambda text: text, ["cannot be decompressed", "not compressed as its name says"]),
}


@pytest.mark.parametrize("name", list(DAMAGED_COMPRESSED_CSV))
def test_a_damaged_compressed_csv_is_a_clear_error_and_loses_nothing(tmp_path, capsys, schema_file, name):
    make, keywords = DAMAGED_COMPRESSED_CSV[name]
    csv = tmp_path / name
    csv.write_bytes(make(table().to_csv(index=False).encode()))
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused(csv_args(csv, out, schema_file), capsys, str(csv), *keywords)
    assert_nothing_lost(out)


@pytest.mark.parametrize("flags,content,said", [
    # 'kind' holds text: the misspelt name was reported as text in a numeric column 'kind'
    (["--data.categorical", "knd,label"], lambda frame: frame, "categorical columns ['knd'] are not in the data"),
    # the target dropped was reported as missing from the file
    (["--data.drop", "label"], lambda frame: frame, "the target 'label' cannot be dropped"),
    # a column with no value at all: dropping its rows would drop every row
    ([], lambda frame: frame.assign(notes=np.nan), "'notes' holds no value at all: drop the column instead (--data.drop"),
    # a listed column also dropped was reported as missing from the file, by a check after the drop
    (["--data.categorical", "kind,label", "--data.drop", "kind"], lambda frame: frame,
     "columns ['kind'] are listed both as categorical and in --data.drop"),
    # a continuous label of True/False: listed as categorical, the target would be refused as such
    (["--data.categorical", "kind", "--data.label_kind", "continuous"],
     lambda frame: frame.assign(label=frame.index % 2 == 0),
     "'label' is numeric but holds True/False, which would train as the numbers 1 and 0 and come out as fractions: "
     "pass --data.label_kind binary"),
    # a label column with no value at all was told to be dropped, which the next try refused
    ([], lambda frame: frame.assign(label=np.nan), "the label column 'label' holds no value at all: it has nothing to "
                                                   "learn from (a label cannot be dropped)"),
], ids=["misspelt-categorical", "dropped-target", "empty-column", "listed-and-dropped", "boolean-label", "empty-label"])
def test_a_dp_schema_flag_naming_the_wrong_column_is_said_first(tmp_path, capsys, flags, content, said):
    """Without a schema file the flags name the columns; their mistakes are reported as such, not
    as what the file's values then look like."""
    csv = write_case(tmp_path / "data.csv", content)
    args = csv_args(csv, tmp_path / "out", None)
    categorical = args.index("--data.categorical")
    if "--data.categorical" in flags:
        del args[categorical : categorical + 2]
    assert_refused([*args, *flags], capsys, said)
    assert not (tmp_path / "out").exists()


def test_a_schema_files_drop_list_naming_a_column_the_file_lacks_is_refused_by_name(tmp_path, capsys):
    """The check of the flags' names moved before the values' checks; a schema file's drop list
    (and a resume's restored one) still needs its own: without it pandas raised a KeyError."""
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({**CSV_SCHEMA, "drop": ["customer_id"]}))
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    assert_refused(csv_args(csv, tmp_path / "out", tmp_path / "schema.yaml"), capsys,
                   "columns to drop ['customer_id'] are not in")


def test_a_column_named_like_a_missing_value_is_a_name_not_a_blank_one(tmp_path):
    """'NA', 'null', 'None' are names a header may hold: only an empty name is refused as a saved
    row index (pandas' default missing spellings made 'NA' read as no name)."""
    from lightning_dpgan.datamodules.csv import _header_names

    csv = write_case(tmp_path / "data.csv", "amount,NA,null,label\n1.0,2,3,no\n")
    assert _header_names(csv) == ["amount", "NA", "null", "label"]


def test_a_trailing_comma_on_every_row_is_read_as_no_field(tmp_path, schema_file):
    """A spreadsheet's habit: the rows end in an empty field. Read in place, not shifted one column."""
    frame = table()
    csv = write_case(tmp_path / "data.csv", "amount,visits,kind,label\n" + "".join(
        f"{row.amount},{row.visits},{row.kind},{row.label},\n" for row in frame.itertuples()))
    datamodule = CSVDataModule(csv=csv, schema=schema_file)
    datamodule.setup()
    read = pd.concat([datamodule.train_frame, datamodule.held_out("test")]).sort_index()
    pd.testing.assert_frame_equal(read.reset_index(drop=True), frame, check_dtype=False)


@pytest.mark.parametrize("bounds,shown", [(100, "got 100"), ([0, "abc"], "got [0, 'abc']"), ([0], "got [0]"),
                                          ("0-100", "got '0-100'")])
def test_a_schema_files_malformed_bounds_are_refused_by_column(tmp_path, capsys, bounds, shown):
    spec = yaml.safe_load(yaml.safe_dump(CSV_SCHEMA))
    spec["columns"][0]["bounds"] = bounds
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump(spec))
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    assert_refused(csv_args(csv, tmp_path / "out", schema), capsys, "column 'amount': bounds must be a list [low, high]",
                   shown)


@pytest.mark.parametrize("model", ["gan", "dpgan"])
def test_a_binary_label_whose_classes_yaml_read_as_booleans_says_to_quote_them(tmp_path, capsys, model):
    """A private run checks the label's classes before its releases, by the rows that hold none
    of them: that refusal said only "holds none of its classes", without the values or the hint."""
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump(CSV_SCHEMA).replace("- 'no'\n  - 'yes'", "- no\n  - yes"))
    assert yaml.safe_load(schema.read_text())["columns"][3]["categories"] == [False, True]
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    args = csv_args(csv, tmp_path / "out", schema)
    args[args.index("--model") + 1] = model
    assert_refused(args, capsys, "YAML reads unquoted no/yes", "quote the classes")
    if model == "dpgan":
        assert_refused(args, capsys, "holds none of its classes [False, True] (it holds 'no' (data row")


def test_a_label_of_one_listed_class_is_refused_by_the_schema():
    from lightning_dpgan.data.schema import Column, TableSchema

    with pytest.raises(SchemaError, match=r"label 'y' lists one class, \['yes'\]: a label to learn needs at least two"):
        TableSchema((Column("x", "continuous", bounds=(0.0, 1.0)), Column("y", "categorical", categories=("yes",))),
                    label="y", label_kind="categorical")


def test_a_dp_estimated_binary_label_of_three_classes_is_told_to_be_categorical(tmp_path, capsys):
    """Raising the budget (the generic remedy of a DP estimate) releases more classes, never fewer."""
    frame = pd.concat([table(100, 1), table(100, 2), table(100, 3)], ignore_index=True)
    frame["label"] = np.resize(["no", "yes", "maybe"], len(frame))
    csv = tmp_path / "data.csv"
    frame.to_csv(csv, index=False)
    line = assert_refused(csv_args(csv, tmp_path / "out", None, "--data.bounds_epsilon", "20"), capsys,
                          "the schema lists 3", "--data.label_kind categorical")
    assert "raise --data.bounds_epsilon" not in line


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema-file", "dp-schema"])
def test_text_in_a_held_out_row_alone_is_named_with_its_value_and_row(tmp_path, capsys, schema_file, with_schema):
    """Checked on the training split alone, the text could only be said to be "in other rows of
    the file"; the whole file is read first, so the message names the value and its row."""
    clean = write_case(tmp_path / "clean.csv", lambda frame: frame)
    held_out = CSVDataModule(csv=clean, schema=schema_file).held_out("test").index
    frame = table()
    frame["amount"] = frame["amount"].astype(object)
    frame.loc[held_out[0], "amount"] = "lots"
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    line = assert_refused(csv_args(csv, tmp_path / "out", schema_file if with_schema else None), capsys,
                          "'amount'", f"'lots' (data row {held_out[0] + 1})", "fix those values")
    assert "other rows of the file" not in line


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema-file", "dp-schema"])
def test_a_gap_in_the_held_out_rows_alone_is_refused_before_training(tmp_path, capsys, schema_file, with_schema):
    """A missing value in a test-split row, the training rows clean: refused before any budget
    is spent, not at ``evaluate`` after training."""
    clean = write_case(tmp_path / "clean.csv", lambda frame: frame)
    held_out = CSVDataModule(csv=clean, schema=schema_file).held_out("test").index
    frame = table()
    frame.loc[held_out[0], "visits"] = np.nan
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused(csv_args(csv, out, schema_file if with_schema else None), capsys,
                   "missing values (NaN)", f"visits (1 rows: data row {held_out[0] + 1})", "the held-out ones too")
    assert_nothing_lost(out)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["last.ckpt"]  # no new one


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema-file", "dp-schema"])
def test_categories_spelled_like_missing_values_are_categories(tmp_path, with_schema):
    """``None`` (no smoking) or ``NA`` (North America) in a categorical column are categories:
    pandas reads them as missing, which refused the file, schema file or not. An empty field is
    still missing, and so is ``NA`` in a numeric column; the synthetic table reads them back."""
    from lightning_dpgan.evaluate import read_synthetic_table

    spelled = ["None", "NA", "null", "N/A", "nan"]
    frame = table(400).assign(kind=lambda f: [spelled[i % 5] for i in range(len(f))])
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    if with_schema:
        spec = {**CSV_SCHEMA, "columns": [c if c["name"] != "kind" else {**c, "categories": spelled}
                                          for c in CSV_SCHEMA["columns"]]}
        (tmp_path / "schema.yaml").write_text(yaml.safe_dump(spec))
        datamodule = CSVDataModule(csv=csv, schema=tmp_path / "schema.yaml")
    else:
        datamodule = CSVDataModule(csv=csv, target="label", categorical="kind,label", label_kind="binary",
                                   bounds_epsilon=50)
    datamodule.setup("fit")
    assert sorted(datamodule.schema.column("kind").categories) == sorted(spelled)
    assert datamodule.encoding_report["rejected"].get("kind", 0) == 0
    synthetic = tmp_path / "synthetic.csv"
    datamodule.train_frame.to_csv(synthetic, index=False)
    assert set(read_synthetic_table(synthetic, datamodule.schema)["kind"]) == set(spelled)

    for column, value in (("kind", ""), ("amount", "NA")):
        gap = frame.astype({column: object})
        gap.loc[3, column] = value
        with pytest.raises(SchemaError, match=f"missing values.*{column}"):
            CSVDataModule(csv=write_case(tmp_path / "gap.csv", lambda _: gap), schema=tmp_path / "schema.yaml"
                          if with_schema else None, **({} if with_schema else {"target": "label", "categorical": "kind,label",
                                                                                "label_kind": "binary"})).setup("fit")


def test_values_that_match_a_declared_category_but_for_spaces_or_case_are_named(tmp_path, caplog):
    """A schema file's run blanked "a " and "B" as unknown categories with a count alone; the DP
    path already named such twins in its release."""
    frame = table(200).assign(kind=lambda f: [["a", "a ", "b", "B"][i % 4] for i in range(len(f))])
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(CSV_SCHEMA))
    datamodule = CSVDataModule(csv=csv, schema=tmp_path / "schema.yaml")
    with caplog.at_level("WARNING"):
        datamodule.setup("fit")
    assert "'kind' holds 'B', 'a ': declared categories but for spaces or case" in caplog.text
    caplog.clear()
    other = frame.assign(kind=lambda f: [["a", "c"][i % 2] for i in range(len(f))])  # another category: no hint
    datamodule = CSVDataModule(csv=write_case(tmp_path / "other.csv", lambda _: other), schema=tmp_path / "schema.yaml")
    with caplog.at_level("WARNING"):
        datamodule.setup("fit")
    assert "hold categories outside the schema" in caplog.text and "spaces or case" not in caplog.text


def test_a_declared_category_list_as_long_as_the_records_is_warned_of(tmp_path, caplog):
    """An ID column declared categorical in a schema file: its real values went into
    synthetic.csv under an epsilon that says nothing of them, with no word said."""
    frame = table(60).assign(kind=[f"P{i:05d}" for i in range(60)])
    schema = {**CSV_SCHEMA, "columns": [*CSV_SCHEMA["columns"][:2], {"name": "kind", "kind": "categorical",
                                                                     "categories": list(frame["kind"])},
                                        CSV_SCHEMA["columns"][3]]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    datamodule = CSVDataModule(csv=write_case(tmp_path / "ids.csv", lambda _: frame), schema=tmp_path / "schema.yaml")
    with caplog.at_level("WARNING"):
        datamodule.setup("fit")
    rows = len(datamodule.train_frame)
    assert (f"the schema lists 60 categories for column 'kind', half or more of the {rows} training rows: a list "
            "that long reads like one taken from the records") in caplog.text
    assert "'label'" not in caplog.text
    caplog.clear()
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(CSV_SCHEMA))  # two categories: nothing to say
    datamodule = CSVDataModule(csv=write_case(tmp_path / "data.csv", lambda frame: frame), schema=tmp_path / "schema.yaml")
    with caplog.at_level("WARNING"):
        datamodule.setup("fit")
    assert "categories for column" not in caplog.text


def test_a_dp_schema_budget_that_cannot_work_is_refused_by_its_flag(tmp_path):
    """A bad --data.bounds_epsilon/--data.bounds_delta is refused by its flag before the file is
    read; a budget too small for the file's rows says how many rows a category needs and which
    flag raises it."""
    dp = {"target": "label", "categorical": "kind,label", "label_kind": "binary"}
    for flags, named in (({"bounds_epsilon": 0}, "--data.bounds_epsilon"), ({"bounds_delta": 1.0}, "--data.bounds_delta"),
                         ({"bounds_epsilon": float("nan")}, "--data.bounds_epsilon")):
        with pytest.raises(ValueError, match=named):
            CSVDataModule(csv=tmp_path / "not-read-yet.csv", **dp, **flags)
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)  # 80 rows
    with pytest.raises(SchemaError, match=r"needs about \d+ training rows.*raise --data.bounds_epsilon"):
        CSVDataModule(csv=csv, **dp, bounds_epsilon=0.1).setup("fit")


def test_a_dp_schema_budget_beside_a_schema_file_is_refused_not_ignored(tmp_path, capsys, schema_file):
    """With a schema file nothing is estimated: a --data.bounds_epsilon/--data.bounds_delta beside it
    used to be ignored in silence. It is refused by its flag before anything is written, and
    without a schema file the estimate's default budget still applies."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    out = tmp_path / "out"
    plant_earlier_run(out)
    for extra, named in ((["--data.bounds_epsilon", "0.5"], "--data.bounds_epsilon sets"),
                         (["--data.bounds_delta", "1e-7"], "--data.bounds_delta sets"),
                         (["--data.bounds_epsilon", "0.5", "--data.bounds_delta", "1e-7"],
                          "--data.bounds_epsilon and --data.bounds_delta set")):
        assert_refused(csv_args(csv, out, schema_file, *extra), capsys, named, "nothing would be spent", "drop --data.schema")
        assert_nothing_lost(out)
    estimated = CSVDataModule(csv=csv, target="label", categorical="kind,label", label_kind="binary")
    assert (estimated.bounds_epsilon, estimated.bounds_delta) == (DEFAULT_BOUNDS_EPSILON, DEFAULT_BOUNDS_DELTA) == (0.1, 1e-6)


def test_a_released_schema_given_over_its_runs_config_replaces_the_estimate_settings_with_a_note(tmp_path, capsys):
    """The README's reuse of released_schema.yaml, --config RUN/config.yaml --data.schema
    RUN/released_schema.yaml, was refused twice for settings of the estimate the user never typed
    (config.yaml's bounds budget, then its categorical columns). Typed again beside the schema,
    they are still refused."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.assign(note="free text"))
    first = tmp_path / "first"
    assert main(csv_args(csv, first, None, "--data.drop", "note")) == 0
    released = first / "released_schema.yaml"
    again = ["train", "--config", str(first / "config.yaml"), "--data.schema", str(released), "--output-dir",
             str(tmp_path / "again")]
    capsys.readouterr()
    assert main(again) == 0
    note = capsys.readouterr().err
    assert "settings of the schema's DP estimate (data.bounds_epsilon, data.categorical, data.drop) are dropped" in note
    recorded = yaml.safe_load((tmp_path / "again" / "config.yaml").read_text())["data"]
    assert not recorded.get("bounds_epsilon") and not recorded.get("categorical")
    assert_refused(again[:-1] + [str(tmp_path / "third"), "--data.bounds_epsilon", "5"], capsys,
                   "--data.bounds_epsilon sets", "nothing would be spent")
    # resumed under the released file, the checkpoint's estimate would go uncounted: refused for that,
    # not as if the label or layout differed (the file lists the dropped columns, the estimate did not)
    line = assert_refused(again[:-1] + [str(tmp_path / "fourth"), "--resume", str(first / "checkpoints" / "last.ckpt")],
                          capsys, "spent epsilon 5, delta 1e-06 on preprocessing", "without --data.schema")
    assert "label / layout" not in line


def test_a_run_whose_config_recorded_the_unused_estimate_budget_beside_its_schema_file_still_evaluates(tmp_path, schema_file):
    """A run trained before the refusal with --data.bounds_epsilon/--data.bounds_delta beside its
    schema file recorded them (unused) in config.yaml; evaluate rebuilds its datamodule without them."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    run = tmp_path / "run"
    assert main(csv_args(csv, run, schema_file)) == 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert "bounds_epsilon" not in config["data"] and "bounds_delta" not in config["data"]
    config["data"].update(bounds_epsilon=0.1, bounds_delta=1e-6)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["evaluate", "--run", str(run)]) == 0
    assert (run / "evaluation.json").is_file()


@pytest.mark.parametrize("given", [None, "1"])
def test_a_teacher_minibatch_of_one_for_gpates_batchnorm_generator_is_refused_before_anything_is_written(
        tmp_path, capsys, given):
    """G-PATE's generator makes one record per record of a teacher's minibatch, by default the
    smallest partition's size: 20 teachers over adult_tiny's 36 records left 1, and the first step
    failed inside BatchNorm ("Expected more than 1 value per channel"). Refused up front now,
    naming both remedies; each of them trains."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    args = ["train", "--model", "gpate", "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" / "adult_tiny"),
            "--output-dir", str(out), "--overwrite", "--epsilon", "3", "--delta", "1e-3", "--privacy.num_teachers", "20",
            "--max-steps", "1", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            *(["--privacy.teacher_batch_size", given] if given else [])]
    refusal = assert_refused(args, capsys, "BatchNorm", "per record of a teacher's minibatch, here 1",
                             "--privacy.teacher_batch_size 2 or more")
    # fewer teachers make the default minibatch larger, not a given one
    assert ("36 training records over 20 teachers leave the smallest partition 1" in refusal) is (given is None)
    assert_nothing_lost(out)
    at = args.index("--privacy.num_teachers") + 1
    fewer = [*args[:at], "10", *args[at + 1:]]
    assert main(fewer) == (2 if given else 0)  # 3 records each
    if given:
        assert main([*fewer[:-1], "2"]) == 0


def test_a_batch_of_one_for_a_batchnorm_generator_is_refused_before_anything_is_written(tmp_path, capsys, schema_file):
    """--batch-size 1 (what a 3-row file's first refusal leads to) failed at the first step inside
    BatchNorm and left a folder with no checkpoint, whose rerun was told to --resume a checkpoint
    that did not exist; refused up front now, with the folder's earlier run untouched. A folder
    left without a checkpoint is not sent to --resume."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    args = csv_args(csv, out, schema_file)
    args[args.index("--batch-size") + 1] = "1"
    assert_refused(args, capsys, "BatchNorm", "at least 2 generated records", "--batch-size 2")
    assert_nothing_lost(out)
    half = tmp_path / "half"
    (half / "logs").mkdir(parents=True)
    (half / "config.yaml").write_text("model: {}\n")
    refusal = assert_refused([a if a != str(out) else str(half) for a in csv_args(csv, out, schema_file) if a != "--overwrite"],
                             capsys, "already holds a run's files", "choose another folder, or replace them")
    assert "--resume" not in refusal


def test_a_batch_that_ctgan_cannot_pack_is_refused_before_anything_is_written(tmp_path, capsys, schema_file):
    """CTGAN's discriminator judges packs of pac = 10 records: --batch-size 32 failed at the first
    step, after the folder was made, and the corrected rerun was refused for that folder."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    args = [*csv_args(csv, out, schema_file), "--model", "ctgan"]
    args[args.index("--batch-size") + 1] = "32"
    assert_refused(args, capsys, "--batch-size 32 (given, or a config file's or the preset's) is not a multiple of the "
                   "ctgan discriminator's pac = 10", "use --batch-size 30", "--model.pac")
    assert_nothing_lost(out)
    # under DP-SGD no batch size helps: pac must be 1, said first
    assert_refused([*args, "--privacy", "dp-sgd", "--epsilon", "5"], capsys, "pac = 10 under DP-SGD", "--model.pac 1")
    # a table smaller than the batch trains on all its rows each step: they must pack too
    probe = CSVDataModule(csv=csv, schema=schema_file)
    probe.setup()
    rows = len(probe.train_dataset)
    assert rows % 10 and rows < 100
    args[args.index("--batch-size") + 1] = "100"
    assert_refused(args, capsys, f"the training table has {rows} rows, fewer than --batch-size 100 (given, or a "
                   "config file's or the preset's)",
                   f"--model.pac to a divisor of {rows}")
    assert_nothing_lost(out)
    assert main([*args, "--model.pac", "2"]) == 0
    args[args.index("--batch-size") + 1] = "10"
    assert main(args) == 0


@pytest.mark.parametrize("dev", [False, True], ids=["test-row", "dev-row"])
def test_a_binary_label_outside_its_classes_in_a_held_out_row_is_refused_before_training(tmp_path, capsys, schema_file, dev):
    """One held-out row's label is neither class: it was refused only by evaluate, after training
    had spent the budget (encoding refuses it in the training rows alone). Now every row is
    checked before training, with the split, the value and its row."""
    extra = ["--data.dev_fraction", "0.25"] if dev else []
    probe = CSVDataModule(csv=write_case(tmp_path / "probe.csv", lambda frame: frame), schema=schema_file,
                          dev_fraction=0.25 if dev else 0.0)
    probe.setup()
    row = int(probe.held_out("dev" if dev else "test").index[0])
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.astype({"label": object}).assign(
        label=lambda f: f["label"].where(f.index != row, "maybe")))
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused([*csv_args(csv, out, schema_file), *extra], capsys, "must be binary with classes ['no', 'yes']",
                   f"1 {'dev' if dev else 'test'} rows hold other values ('maybe' (data row {row + 1}))",
                   "every row is checked before training, the held-out ones too")
    assert_nothing_lost(out)


def test_a_kaggle_credit_file_whose_held_out_row_has_a_third_class_is_refused_before_training(tmp_path, capsys):
    """The built-in credit schema is not the user's to edit: the refusal comes before training and
    names the row, and its remedy is to fix the row (a schema file's is only for a schema file)."""
    from lightning_dpgan.datamodules.kaggle_credit import KaggleCreditDataModule

    source = Path(__file__).parent / "fixtures" / "credit_tiny"
    probe = KaggleCreditDataModule(data_dir=source)
    probe.setup()
    row = int(probe.held_out("test").index[0])
    frame = pd.read_csv(source / "creditcard.csv")
    frame.loc[row, "Class"] = 2
    (tmp_path / "credit").mkdir()
    frame.to_csv(tmp_path / "credit" / "creditcard.csv", index=False)
    line = assert_refused(["train", "--model", "dpgan", "--dataset", "kaggle-credit", "--data-dir", str(tmp_path / "credit"),
                           "--max-steps", "2", "--batch-size", "16", "--output-dir", str(tmp_path / "out")], capsys,
                          "kaggle-credit: the label 'Class' must be binary", f"1 test rows hold other values (2 (data row {row + 1}))",
                          "fix or drop those rows")
    assert "with a schema file" in line and not (tmp_path / "out").exists()


def test_a_label_written_otherwise_than_its_numeric_classes_says_which_values_and_how(tmp_path):
    """Classes [0, 1] in the schema and 0.0/1.0 in the file: the values are numbers, so "holds
    non-numeric values" misled; the message shows the values and the spelling it matches."""
    spec = {**CSV_SCHEMA, "columns": [c if c["name"] != "label" else {**c, "categories": [0, 1]}
                                      for c in CSV_SCHEMA["columns"]]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(spec))
    frame = table().assign(label=lambda f: ["1.0" if value == "yes" else "0.0" for value in f["label"]])
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    with pytest.raises(SchemaError) as refused:
        CSVDataModule(csv=csv, schema=tmp_path / "schema.yaml").setup("fit")
    message = str(refused.value)
    assert "numeric categories [0, 1]" in message and ".0' (data row" in message and "as the schema writes it (0, 1)" in message
    # a value that is no category at all is not a spelling to fix: an unknown category, under the
    # rules of any other (a binary label's third class is refused, as such)
    frame = table().assign(label=lambda f: ["1" if value == "yes" else "2" for value in f["label"]])
    csv = write_case(tmp_path / "other.csv", lambda _: frame)
    with pytest.raises(SchemaError) as refused:
        CSVDataModule(csv=csv, schema=tmp_path / "schema.yaml").setup("fit")
    message = str(refused.value)
    assert "must be binary with classes [0, 1]" in message and "write the values that way" not in message


def test_a_value_outside_a_columns_numeric_categories_is_an_unknown_category_left_blank(tmp_path):
    """Categories [1, 2] and a row holding 3: kept with its column blank, as an unknown text
    category is, not refused as if misspelt (docs/architecture.md, "CSV category outside the schema")."""
    spec = {**CSV_SCHEMA, "columns": [c if c["name"] != "kind" else {**c, "categories": [1, 2]}
                                      for c in CSV_SCHEMA["columns"]]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(spec))
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.assign(kind=[str(1 + index % 3) for index in frame.index]))
    datamodule = CSVDataModule(csv=csv, schema=tmp_path / "schema.yaml")  # the default: as a run trains
    datamodule.setup("fit")
    threes = int((datamodule.train_frame["kind"] == "3").sum())
    assert threes and {name: count for name, count in datamodule._report.rejected.items() if count} == {"kind": threes}
    assert len(datamodule.train_dataset) == len(datamodule.train_frame)


def test_a_column_beyond_the_dp_grid_is_named_as_such_not_sent_to_a_larger_budget(tmp_path, caplog):
    """Values of 1e13 lie past the DP bounds' grid (±2^40): every one is clipped, and raising
    --data.bounds_epsilon, which the warning used to advise, cannot help."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.assign(amount=frame["amount"] * 1e11 + 1e13))
    datamodule = CSVDataModule(csv=csv, target="label", categorical="kind,label", label_kind="binary", bounds_epsilon=50)
    with caplog.at_level("WARNING"):
        datamodule.setup("fit")
    assert "the bounds clip more than 5% of the training values of amount" in caplog.text
    assert "amount reached the end of the DP estimate's grid" in caplog.text and "raise --data.bounds_epsilon" not in caplog.text


def test_unknown_categories_are_kept_blank_by_default_dropped_on_request_and_counted(tmp_path, schema_file):
    """Documented handling, not an error: a row whose category is outside the schema's list is
    kept with that column blank, so the number of training records does not depend on a value.
    A datamodule built by hand dropped it until "blank" was its default (a CSV with such a
    category trained DP-SGD on 114 of 160 rows, at a sample rate that released their count)."""
    frame = table()
    frame.loc[range(0, 80, 5), "kind"] = "zzz"
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    kept, dropped = CSVDataModule(csv=csv, schema=schema_file), CSVDataModule(csv=csv, schema=schema_file)
    dropped.unknown_categories = "drop"
    for datamodule in (kept, dropped):
        datamodule.setup("fit")
    unknown = int((kept.train_frame["kind"] == "zzz").sum())
    assert unknown > 0
    for datamodule in (kept, dropped):
        report = datamodule.encoding_report
        assert report["rejected"] == {"kind": unknown, "label": 0} and report["rows_in"] == len(datamodule.train_frame)
    assert kept.train_size == kept.encoding_report["rows_encoded"] == len(kept.train_frame)
    assert kept.encoding_report["rows_blanked"] == unknown
    assert dropped.train_size == dropped.encoding_report["rows_encoded"] == len(dropped.train_frame) - unknown


def test_a_constant_column_trains_and_keeps_its_single_value(tmp_path, capsys):
    """Documented handling, not an error: a constant categorical column keeps its one category,
    a constant numeric column gets (DP) bounds around its value."""
    frame = table().assign(amount=70.0, kind="a")
    csv = write_case(tmp_path / "data.csv", lambda _: frame)
    out = tmp_path / "out"
    assert main(csv_args(csv, out, None)) == 0
    schema = {c["name"]: c for c in read_run_info(out / "checkpoints" / "last.ckpt")["schema"]["columns"]}
    assert schema["kind"]["categories"] == ["a"]
    low, high = schema["amount"]["bounds"]
    assert low <= 70.0 <= high
    synthetic = pd.read_csv(out / "synthetic.csv")
    assert set(synthetic["kind"]) == {"a"} and synthetic["amount"].between(low, high).all()


# --- privacy parameters, model x strategy, configuration keys ----------------------------------


EPSILON_FIX = ["--epsilon must be a finite number > 0", "--epsilon 1.0"]
DELTA_FIX = ["--delta must be strictly between 0 and 1", "--delta 1e-05"]


@pytest.mark.parametrize(
    "extra,keywords",
    [
        (["--epsilon", "0"], EPSILON_FIX),
        (["--epsilon", "-1"], EPSILON_FIX),
        (["--epsilon", "nan"], EPSILON_FIX),
        (["--delta", "0"], DELTA_FIX),
        (["--delta=-1e-5"], DELTA_FIX),
        (["--delta", "-1e-5"], DELTA_FIX),  # argparse took it for an option: "expected one argument"
        (["--epsilon", "-1e-3"], EPSILON_FIX),
        (["--epsilon", "-inf"], EPSILON_FIX),  # argparse's "expected one argument" too
        (["--delta", "1"], DELTA_FIX),
        (["--delta", "0.01"], ["--delta 0.01 (given, or a config file's or the preset's) is not below 1/n = 0.00625",
                               "n = 160", "Pass --delta < 1/n"]),
        (["--epsilon", "0.001", "--delta", "1e-4"], ["a single training step would spend epsilon", "--epsilon 0.001"]),
    ],
    ids=["epsilon-zero", "epsilon-negative", "epsilon-nan", "delta-zero", "delta-negative", "delta-negative-spaced",
         "epsilon-negative-exponent", "epsilon-minus-infinity", "delta-one",
         "delta-not-below-1/n", "budget-below-one-step"],
)
def test_a_meaningless_privacy_budget_is_refused_before_training(tiny_image_data_dir, tmp_path, capsys, extra, keywords):
    out = tmp_path / "out"
    plant_earlier_run(out)
    args = image_args(tiny_image_data_dir, out, "--privacy.noise_multiplier", "1.0", *extra, model="dpgan")
    assert_refused(args, capsys, *keywords)
    assert_nothing_lost(out)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["last.ckpt"]  # no new one


def test_a_default_delta_not_below_one_over_n_is_said_to_be_the_default(tiny_image_data_dir, tmp_path, capsys,
                                                                          monkeypatch):
    """A user who gave no --delta was told "--delta 1e-05 is not below 1/n", as if theirs: the
    refusal says where it came from, the strategies' default (a model whose presets set none, made
    private by a strategy) or a flag, config file or preset (the private models' presets set it).
    (The default is raised here so that the 160 tiny records fall below it.)"""
    monkeypatch.setattr("lightning_dpgan.callbacks.strategy.DEFAULT_DELTA", 0.01)
    private_gan = ["--privacy", "dp-sgd", "--privacy.noise_multiplier", "1.0"]
    line = assert_refused(image_args(tiny_image_data_dir, tmp_path / "out", *private_gan), capsys,
                          "--delta 0.01 (the strategies' default) is not below 1/n = 0.00625")
    typed = assert_refused(image_args(tiny_image_data_dir, tmp_path / "out", *private_gan, "--delta", "0.01"), capsys,
                           "--delta 0.01 (given, or a config file's or the preset's) is not below")
    assert "default" not in typed and "Pass --delta < 1/n" in line


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_output_dir_is_refused_not_replaced_by_the_default_folder(tiny_image_data_dir, tmp_path, capsys,
                                                                           monkeypatch, empty):
    """--output-dir "$OUT" with OUT unset trained into outputs/<model>-<dataset>-<time>, unnoticed."""
    monkeypatch.chdir(tmp_path)
    args = [arg if arg != str(tmp_path / "out") else empty for arg in tiny_run_args(tiny_image_data_dir, tmp_path / "out")]
    assert_refused(args, capsys, "--output-dir is empty")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("budget,named", [(["--epsilon", "5"], "epsilon 5)"), (["--delta", "1e-5"], "delta 1e-05)")],
                         ids=["epsilon", "delta"])
def test_a_budget_for_a_non_private_model_is_refused_whichever_half_is_given(tiny_image_data_dir, tmp_path, capsys,
                                                                              budget, named):
    """--delta alone, like --epsilon alone, says the user expects a guarantee: a model that trains
    with --privacy none would ignore it and release its output with none. The message names the
    half that was set (it said "delta None" of the other)."""
    out = tmp_path / "out"
    assert_refused(tiny_run_args(tiny_image_data_dir, out) + budget, capsys, "an epsilon/delta is set",
                   f"a config file or a preset: {named}", "trains with --privacy none")
    assert not out.exists()


@pytest.mark.parametrize(
    "extra,said",
    [
        (["--epsilon", "1", "--epsilon", "8"], "--epsilon 1 and --epsilon 8 both set epsilon: give it once"),
        (["--epsilon=1", "--epsilon", "8"], "--epsilon 1 and --epsilon 8"),
        (["--delta", "-1e-5", "--delta", "1e-5"], "--delta -1e-5 and --delta 1e-5 both set delta"),
        (["--privacy", "dp-sgd", "--privacy", "none"], "--privacy dp-sgd and --privacy none both set privacy.name"),
        (["--model.name", "gan"], "--model dpgan and --model.name gan both set model.name: give it once under one name"),
        (["--data.batch_size", "8"], "--batch-size 16 and --data.batch_size 8 both set data.batch_size"),
        (["--max_steps", "9"], "--max-steps 2 and --max_steps 9"),
    ],
    ids=["epsilon", "epsilon-with-equals", "delta-negative", "privacy", "model-two-names", "flag-and-dotted",
         "underscore-spelling"],
)
def test_the_budget_given_twice_or_a_setting_under_two_names_is_refused(tiny_image_data_dir, tmp_path, capsys, extra,
                                                                        said):
    """argparse keeps the last of two values in silence: a run held to ε = 8 because of where a word
    stood in a long command. Under two names, the dotted override won wherever it stood."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused(image_args(tiny_image_data_dir, out, *extra, model="dpgan"), capsys, said)
    assert_nothing_lost(out)


def test_another_setting_given_twice_under_one_name_takes_the_last_with_a_note(tiny_image_data_dir, tmp_path, capsys):
    """A script may add ``--max-steps 3`` to a longer command: the last value is used, and said."""
    from lightning_dpgan.cli import build_config

    args = image_args(tiny_image_data_dir, tmp_path / "out", "--model", "gan", "--max-steps", "3", "--epsilon", "2",
                      "--epsilon=2.0", "--batch-size", "16", model="dpgan")
    config = build_config(args[1:])
    assert (config["model"]["name"], config["max_steps"], config["epsilon"], config["data"]["batch_size"]) == \
        ("gan", 3, 2.0, 16)
    notes = capsys.readouterr().err.splitlines()
    assert notes == ["train: note: --model given twice (dpgan, then gan): the last, gan, is used",
                     "train: note: --max-steps given twice (2, then 3): the last, 3, is used"]  # none for equal values


def test_the_other_commands_take_the_last_of_an_option_given_twice_with_a_note(tmp_path, capsys, monkeypatch):
    """evaluate, sample, audit and benchmark keep argparse's last value, as train does outside the
    budget, and say so: ``evaluate --seed 1 ... --seed 2`` scored with seed 2 in silence before."""
    from lightning_dpgan import evaluate
    from lightning_dpgan.benchmark.cli import parse_args
    from lightning_dpgan.canary_audit import audit_parser

    called = []
    monkeypatch.setattr(evaluate, "evaluate_run", lambda *args: called.append(args))
    main(["evaluate", "--run", str(tmp_path), "--seed", "1", "--cnn-epochs", "2", "--seed", "2", "--cnn-epochs", "2"])
    assert called[0][3:5] == (2, 2)  # (cnn_epochs, seed)
    assert capsys.readouterr().err.splitlines() == [
        "python -m lightning_dpgan evaluate: note: --seed given twice (1, then 2): the last, 2, is used"]
    audit, rest = audit_parser().parse_known_args(["--trials", "4", "--model", "gan", "--trials", "6"])
    benchmark = parse_args(["--suite", "speed", "--epsilons", "1", "--epsilons", "1", "10"])
    assert (audit.trials, rest, benchmark.epsilons) == (6, ["--model", "gan"], [1.0, 10.0])
    assert capsys.readouterr().err.splitlines() == [
        "python -m lightning_dpgan audit: note: --trials given twice (4, then 6): the last, 6, is used",
        "python -m lightning_dpgan benchmark: note: --epsilons given twice (1.0, then 1.0 10.0): the last, 1.0 10.0, "
        "is used"]


@pytest.mark.parametrize("privacy,compatible", [("pate", "pategan"), ("gpate", "gpate"), ("sanitizer", "gswgan")])
def test_a_model_without_the_strategys_slot_is_refused(tiny_image_data_dir, tmp_path, capsys, privacy, compatible):
    out = tmp_path / "out"
    plant_earlier_run(out)
    args = image_args(tiny_image_data_dir, out, "--privacy", privacy, "--epsilon", "1")  # gan: no slot for any of them
    line = assert_refused(args, capsys,
                          f"--privacy {privacy} needs a model with a", f"Models that take --privacy {privacy}:")
    assert compatible in line.split("Models that take")[1]
    assert_nothing_lost(out)


DATA_FREE_REFUSALS = {
    "epsilon-zero": (["--privacy", "dp-sgd", "--epsilon", "0"], EPSILON_FIX[0]),
    "delta-one": (["--privacy", "dp-sgd", "--epsilon", "1", "--delta", "1"], DELTA_FIX[0]),
    "no-slot": (["--privacy", "pate", "--epsilon", "1"], "--privacy pate needs a model with a"),
    "clipped-in-bf16": (["--privacy", "dp-sgd", "--epsilon", "1", "--trainer.precision", "bf16-mixed"],
                        "trainer.precision bf16-mixed cannot train under --privacy dp-sgd"),
    "unknown-strategy": (["--strategy", "zzz"], "--strategy zzz is not a Lightning strategy"),
    # these were refused as the trainer was built, after the DP releases
    "unknown-logger": (["--logger", "mlflow"], "unknown logger 'mlflow'"),
    "unknown-logger-key": (["--logger.colour", "red"],
                           "unknown key(s) logger.colour for logger 'csv'"),
    # wandb.init refused it with a TypeError, after the trainer was built
    "unknown-wandb-key": (["--logger", "wandb", "--logger.bogus", "1"],
                          "unknown key(s) logger.bogus for logger 'wandb'. Valid keys: logger."),
    # these ended after training, writing synthetic.csv (bf16-true, 64-true), or in Lightning's
    # refusal at fit (the others), both after the DP releases had read the rows
    "bf16-weights": (["--trainer.precision", "bf16-true"], "trainer.precision bf16-true keeps the networks' weights"),
    "float64-weights": (["--trainer.precision", "64-true"], "trainer.precision 64-true keeps the networks' weights"),
    "float64-alias": (["--trainer.precision", "64"], "trainer.precision 64 keeps the networks' weights"),
    "fp16-weights": (["--trainer.precision", "16-true"], "trainer.precision 16-true keeps the networks' weights"),
    "accumulated": (["--trainer.accumulate_grad_batches", "4"], "trainer.accumulate_grad_batches works under"),
    "lightning-clipping": (["--privacy", "dp-sgd", "--epsilon", "1", "--trainer.gradient_clip_val", "1.0"],
                           "--privacy.max_grad_norm"),
}


@pytest.mark.parametrize("extra, said", [
    (["--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    (["--data.split_seed", "-1"], "--data.split_seed must be an integer >= 0, got -1"),
    (["--model.pac", "0"], "--model.pac must be at least 1 (records per discriminator input), got 0"),
    (["--model.gradient_penalty", "-1"], "--model.gradient_penalty must be 0 or more, got -1"),
    (["--model.discriminator_steps", "0"], "--model.discriminator_steps must be at least 1, got 0"),
    (["--model.latent_dim", "0"], "--model.latent_dim must be at least 1, got 0"),
    (["--model.lr_generator", "-0.001"], "--model.lr_generator must be above 0, got -0.001"),
    (["--model.lr_discriminator", "0"], "--model.lr_discriminator must be above 0, got 0"),
    (["--data.modes_epsilon", "-1"], "--data.modes_epsilon must be a finite number > 0, got -1"),
    (["--data.histogram_threshold", "-1"], "--data.histogram_threshold must be a finite number >= 0, got -1"),
    (["--data.test_fraction", "2"], "--data.test_fraction must be in (0, 1), got 2"),
    (["--data.modes", "median"], "--data.modes must be one of ('dp', 'bounds'), got 'median'"),
    (["--data.dev_fraction", "1.5"], "--data.dev_fraction must be a number in [0, 1) (0: no dev split), got 1.5"),
], ids=["batch-size", "split-seed", "pac", "gradient-penalty", "discriminator-steps", "latent-dim", "negative-lr",
        "zero-lr", "modes-epsilon", "histogram-threshold", "test-fraction", "modes", "dev-fraction"])
def test_a_bad_model_or_data_setting_is_refused_by_the_flag_that_sets_it(tmp_path, capsys, extra, said):
    """They were refused as "batch_size must be ...", "modes_epsilon must be ...", "pac must be at
    least 1 and gradient_penalty non-negative": names of the code's arguments, and two settings
    blamed for one."""
    batch = [] if "--batch-size" in extra else ["--batch-size", "8"]
    args = ["train", "--model", "ctgan", "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" / "adult_tiny"),
            "--output-dir", str(tmp_path / "out"), "--max-steps", "2", *batch, *extra]
    assert_refused(args, capsys, said)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", sorted(DATA_FREE_REFUSALS))
def test_settings_that_need_no_data_are_refused_before_a_dp_release_reads_the_rows(tmp_path, capsys, monkeypatch, case):
    """A DP-estimated schema and a mode-specific table's DP histogram read the private rows.
    A run refused for a setting that needs no data (epsilon, delta, the model's slot, the
    precision) used to draw them first, since the model's width needs them: it must refuse
    before, so that a refused run reads nothing."""
    from lightning_dpgan.data import table_transformer
    from lightning_dpgan.datamodules import csv as csv_datamodule

    extra, message = DATA_FREE_REFUSALS[case]
    estimated = record_calls(monkeypatch, csv_datamodule, "infer_schema_dp")
    histograms = record_calls(monkeypatch, table_transformer, "dp_column_histograms")
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    assert_refused(csv_args(csv, tmp_path / "estimated", None, *extra), capsys, message)
    adult = ["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" / "adult_tiny"),
             "--output-dir", str(tmp_path / "modes"), "--data.encoding", "mode-specific", "--data.modes_epsilon", "1",
             "--max-steps", "2", "--batch-size", "8", *TINY_MLP, *extra]
    assert_refused(adult, capsys, message)
    assert estimated == [] and histograms == []


def test_an_accelerator_the_machine_lacks_is_refused_by_its_flag_before_the_rows_are_read(tmp_path, capsys, monkeypatch):
    """Lightning said "No supported gpu backend found!" once the trainer was built, after a CSV's
    DP schema estimate had read the rows."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    from lightning_dpgan.datamodules import csv as csv_datamodule

    estimated = record_calls(monkeypatch, csv_datamodule, "infer_schema_dp")
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: False))
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: False))
    assert_refused(csv_args(csv, tmp_path / "out", None, "--accelerator", "gpu"), capsys,
                   "--accelerator gpu: this machine has no GPU that torch can use: use --accelerator cpu")
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: True))
    monkeypatch.setattr(CUDAAccelerator, "auto_device_count", staticmethod(lambda: 1))
    assert_refused(csv_args(csv, tmp_path / "out", None, "--accelerator", "gpu", "--devices", "2"), capsys,
                   "--devices 2: this machine has 1 GPU")
    assert estimated == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("precision", ["16-mixed", "16"])
def test_a_loss_scaled_precision_is_refused_for_a_private_model(tiny_image_data_dir, tmp_path, capsys, precision):
    """fp16's loss scaler skips every network's update when one gradient overflows: one record
    could stop every teacher's update (G-PATE's votes are counts, so bf16-mixed is offered)."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    args = image_args(tiny_image_data_dir, out, "--epsilon", "1", "--trainer.precision", precision, model="gpate")
    assert_refused(args, capsys, f"trainer.precision {precision} cannot train a private model",
                   "--trainer.precision bf16-mixed")
    assert_nothing_lost(out)


@pytest.mark.parametrize("precision", ["32", "32-true"])
def test_float32_and_the_off_values_of_automatic_optimization_train_a_private_model(tiny_image_data_dir, tmp_path,
                                                                                   precision):
    out = tmp_path / "out"
    args = image_args(tiny_image_data_dir, out, "--epsilon", "1", "--trainer.precision", precision,
                      "--trainer.accumulate_grad_batches", "1", "--trainer.gradient_clip_val", "0", model="dpgan")
    assert main(args) == 0 and (out / "privacy.json").is_file()


@pytest.mark.parametrize("model,privacy", [("dpgan", "dp-sgd"), ("gswgan", "sanitizer")])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_a_strategy_that_clips_gradients_trains_in_float32_only(tiny_image_data_dir, tmp_path, capsys, model, privacy,
                                                                precision):
    """Under autocast the per-record norms and the clipped sum are bfloat16: removing one record
    moved a clipped sum by 1.2 C (DP-CTGAN's critic, batch 500), where the accountant assumes C.
    bf16-mixed was offered as the safe precision."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    args = image_args(tiny_image_data_dir, out, "--epsilon", "1", "--trainer.precision", precision, model=model)
    line = assert_refused(args, capsys, f"trainer.precision {precision} cannot train under --privacy {privacy}",
                          "Pass --trainer.precision 32-true")
    assert "bf16-mixed" not in line.split("cannot train")[1]
    assert_nothing_lost(out)


@pytest.mark.parametrize(
    "config,keywords",
    [
        ({"epsilonn": 1.0}, ["unknown key 'epsilonn'", "Did you mean 'epsilon'?"]),
        ({"model": {"latent_dimm": 8}}, ["unknown key(s) model.latent_dimm for model 'gan'", "Valid keys",
                                         "model.latent_dim"]),
        ({"trainer": {"max_stepz": 3}}, ["unknown Lightning Trainer argument(s): trainer.max_stepz"]),
    ],
    ids=["top-level", "model-section", "trainer-section"],
)
def test_a_config_file_key_that_does_not_exist_is_refused(tiny_image_data_dir, tmp_path, capsys, config, keywords):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused(image_args(tiny_image_data_dir, out, "--config", str(path)), capsys, *keywords)
    assert_nothing_lost(out)


# --- checkpoints -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_run(tiny_image_data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad_input") / "gan"
    assert main(image_args(tiny_image_data_dir, out)) == 0
    return out


def damaged_checkpoints(image_run: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """kind -> (checkpoint file, what the refusal says)."""
    good = image_run / "checkpoints" / "last.ckpt"
    (folder / "truncated.ckpt").write_bytes(good.read_bytes()[:2000])
    (folder / "text.ckpt").write_text("not a checkpoint\n")
    torch.save({"state_dict": {}, "epoch": 3}, folder / "foreign.ckpt")
    torch.save(torch.nn.Linear(2, 2), folder / "pickled.ckpt")  # a whole module: only an unsafe load reads it
    (folder / "bitflip.ckpt").write_bytes(with_a_bit_flipped_in_its_largest_tensor(good))
    return {
        "truncated": (folder / "truncated.ckpt", "is not a readable checkpoint (corrupt or truncated?)"),
        "text": (folder / "text.ckpt", "is not a readable checkpoint (corrupt or truncated?): it is not the zip archive "
                                       "torch.save writes. A run's checkpoint is the checkpoints/last.ckpt"),  # not torch's mmap advice
        "foreign": (folder / "foreign.ckpt", "was not written by lightning-dpgan's train"),
        "pickled": (folder / "pickled.ckpt", "holds Python objects, not only the tensors and settings"),
        "missing": (folder / "absent.ckpt", "checkpoint not found"),
        "bitflip": (folder / "bitflip.ckpt", "does not match the checksum it was written with"),
    }


def with_a_bit_flipped_in_its_largest_tensor(checkpoint: Path) -> bytes:
    """The checkpoint's bytes with one bit of its largest tensor's data flipped: a file that
    ``torch.load`` still reads (it does not check the records' CRC-32), with a wrong weight."""
    data = bytearray(checkpoint.read_bytes())
    with zipfile.ZipFile(checkpoint) as archive:
        largest = max(archive.infolist(), key=lambda info: info.file_size)
    # the record's local header: 30 bytes, then its name and extra field (lengths at 26 and 28)
    name_length, extra_length = struct.unpack("<HH", data[largest.header_offset + 26: largest.header_offset + 30])
    start = largest.header_offset + 30 + name_length + extra_length
    data[start + largest.file_size // 2] ^= 0x04
    return bytes(data)


def test_a_flipped_bit_inside_a_tensor_still_loads_with_torch(image_run, tmp_path):
    """Why the checksum check exists: without it the damaged file loads, its weight changed."""
    path = damaged_checkpoints(image_run, tmp_path)["bitflip"][0]
    damaged = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    good = torch.load(image_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert damaged.keys() == good.keys()
    assert any(not torch.equal(damaged[name], good[name]) for name in good)


@pytest.mark.parametrize("kind", ["truncated", "text", "foreign", "pickled", "missing", "bitflip"])
def test_resume_checkpoint_check_refuses_damaged_and_foreign_files(image_run, tmp_path, kind):
    path, message = damaged_checkpoints(image_run, tmp_path)[kind]
    with pytest.raises(CheckpointError, match=r"\(corrupt|not written|not found|is corrupt|holds Python objects") as excinfo:
        resume_checkpoint(path, "gan", "mnist")
    assert message in str(excinfo.value) and str(path) in str(excinfo.value)
    if kind == "bitflip":
        assert "Restore the file from a copy, or train again" in str(excinfo.value)
        assert "its record data/" in str(excinfo.value) and ".tmp" not in str(excinfo.value)  # not the file saved to
    elif kind != "missing":
        assert "checkpoints/last.ckpt" in str(excinfo.value)  # what to pass instead


def test_resume_checkpoint_check_refuses_another_model_or_dataset(image_run):
    path = image_run / "checkpoints" / "last.ckpt"
    assert resume_checkpoint(path, "gan", "mnist")[0]["model"] == "gan"
    for model, dataset in [("wgan", "mnist"), ("gan", "fashion-mnist")]:
        with pytest.raises(CheckpointError, match="is a checkpoint of --model gan --dataset mnist") as excinfo:
            resume_checkpoint(path, model, dataset)
        assert f"this run is --model {model} --dataset {dataset}" in str(excinfo.value)
        assert "drop --resume" in str(excinfo.value)


@pytest.mark.parametrize("kind", ["truncated", "text", "foreign", "pickled", "bitflip", "other-model"])
def test_train_resume_from_a_damaged_or_foreign_checkpoint_is_a_clear_error(
        image_run, tiny_image_data_dir, tmp_path, capsys, kind):
    if kind == "other-model":
        path, message, model = image_run / "checkpoints" / "last.ckpt", "is a checkpoint of --model gan", "wgan"
    else:
        (path, message), model = damaged_checkpoints(image_run, tmp_path)[kind], "gan"
    out = tmp_path / "out"
    plant_earlier_run(out)
    assert_refused(image_args(tiny_image_data_dir, out, "--resume", str(path), model=model), capsys, message)
    assert_nothing_lost(out)  # config.yaml included: it is written once training starts
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["last.ckpt"]  # no new one


@pytest.mark.parametrize("name,damage", [
    ("privacy.json", lambda text: text[: len(text) // 2]),  # cut short
    ("privacy.json", lambda text: "[1, 2]"),  # valid JSON, not a report
    ("config.yaml", lambda text: text + "\n  - : [unclosed"),
    ("config.yaml", lambda text: "just text"),
    ("config.yaml", lambda text: yaml.safe_dump({k: v for k, v in yaml.safe_load(text).items() if k != "model"})),
    ("config.yaml", lambda text: yaml.safe_dump({**yaml.safe_load(text), "model": "gan"})),
    ("config.yaml", lambda text: yaml.safe_dump({**(c := yaml.safe_load(text)), "data": {**c["data"], "name": None}})),
], ids=["privacy-cut", "privacy-list", "config-broken", "config-no-data", "config-no-model", "config-model-text",
        "config-data-name-null"])
def test_evaluate_refuses_a_damaged_run_file_by_name_before_any_work(image_run, tmp_path, capsys, monkeypatch,
                                                                     name, damage):
    from lightning_dpgan import evaluate

    run = Path(shutil.copytree(image_run, tmp_path / "run"))
    (run / name).write_text(damage((run / name).read_text()))
    worked = []
    monkeypatch.setattr(evaluate, "_evaluate_images", lambda *args, **kwargs: worked.append(1) or {})
    assert_refused(["evaluate", "--run", str(run)], capsys, str(run / name), "is damaged")
    assert not worked and not (run / "evaluation.json").exists()


@pytest.mark.parametrize("option,value,message", [
    ("-n", "-5", "argument -n: must be a whole number >= 1"),
    ("-n", "0", "argument -n: must be a whole number >= 1"),
    ("--cnn-epochs", "0", "argument --cnn-epochs: must be a whole number >= 1"),
    ("--seed", "-1", "argument --seed: must be a whole number in [0, 2^32)"),
    ("--seed", str(2**32), "argument --seed: must be a whole number in [0, 2^32)"),
    ("--device", "foo", "argument --device: 'foo' is not a torch device"),
    ("--device", "xpu", "argument --device: 'xpu' is not usable on this machine"),  # torch built without it
    ("--device", "meta", "argument --device: 'meta' holds no data"),
    ("--device", "mps", "argument --device: 'mps' is not usable on this machine"),  # not a Mac
])
def test_evaluate_refuses_a_bad_option_before_any_work(image_run, tmp_path, capsys, monkeypatch, option, value, message):
    from lightning_dpgan import evaluate

    worked = []
    monkeypatch.setattr(evaluate, "evaluate_run", lambda *args, **kwargs: worked.append(1))
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", "--run", str(image_run), option, value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err
    assert "registered at" not in err  # torch's dispatcher tables (7 kB for mps) stay out of the line
    assert not worked


def test_a_terminated_sample_leaves_no_temporary_file(tmp_path, schema_file):
    """SIGTERM (a scheduler's stop, ``kill``) in the middle of a large table: the partial file,
    which grows by gigabytes for a large -n, is removed, and the exit status says why."""
    import signal
    import subprocess
    import sys
    import time

    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    assert main(csv_args(csv, tmp_path / "run", schema_file)) == 0
    out = tmp_path / "samples" / "table.csv"
    out.parent.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "lightning_dpgan", "sample", "--checkpoint",
                                str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "-n", "100000000", "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(out.parent.glob(".table.csv.*.tmp")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert list(out.parent.glob(".table.csv.*.tmp")), process.communicate()[1]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert not list(out.parent.iterdir())  # neither the temporary file nor a partial table


def test_sample_refuses_the_csv_a_run_trained_on_after_its_config_is_gone(tmp_path, capsys, schema_file):
    """train keeps the data files, made absolute, in the checkpoint: with the run's config.yaml
    removed, sample --out DATA --overwrite replaced the private CSV with synthetic rows."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    assert main(csv_args(csv, tmp_path / "run", schema_file)) == 0
    (tmp_path / "run" / "config.yaml").unlink()
    before = csv.read_bytes()
    assert_refused(["sample", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "-n", "5",
                    "--out", str(csv), "--overwrite"], capsys, "is a file the run trained on")
    assert csv.read_bytes() == before


def test_evaluate_refuses_a_table_runs_checkpoint_whose_bytes_changed(tmp_path, capsys):
    """A table run is scored on its synthetic.csv, so its networks are never loaded, but its
    checkpoint's run information (schema, split, training rows' digest, spend) is trusted: a
    flipped bit there was scored, where sample and an image run's evaluate refused it."""
    run = tmp_path / "run"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" /
                 "adult_tiny"), "--output-dir", str(run), "--max-steps", "2", "--trainer.enable_progress_bar", "false"]) == 0
    checkpoint = run / "checkpoints" / "last.ckpt"
    checkpoint.write_bytes(with_a_bit_flipped_in_its_largest_tensor(checkpoint))
    assert_refused(["evaluate", "--run", str(run)], capsys, "does not match the checksum it was written with")
    assert not (run / "evaluation.json").exists()


def test_sample_refuses_to_replace_a_built_in_datasets_file_in_the_data_dir(tmp_path, capsys):
    """King's file in --data-dir (the Kaggle original needs a login) was replaced by synthetic
    rows with sample --out FILE --overwrite: train keeps the files it found there, in the
    checkpoint. Another file in that folder is still written."""
    data = tmp_path / "data"
    shutil.copytree(Path(__file__).parent / "fixtures" / "king_tiny", data / "king")
    original = data / "king" / "kc_house_data.csv"
    assert main(["train", "--model", "gan", "--dataset", "king", "--data-dir", str(data), "--output-dir",
                 str(tmp_path / "run"), "--max-steps", "2", "--trainer.enable_progress_bar", "false"]) == 0
    (tmp_path / "run" / "config.yaml").unlink()  # the checkpoint alone names the folder
    before = original.read_bytes()
    assert_refused(["sample", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "-n", "5",
                    "--out", str(original), "--overwrite"], capsys, "is a file the run trained on")
    assert original.read_bytes() == before
    beside = data / "king" / "synthetic.csv"
    beside.write_text("an earlier draw\n")
    assert main(["sample", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "-n", "5",
                 "--out", str(beside), "--overwrite"]) == 0
    assert len(pd.read_csv(beside)) == 5


def test_a_table_the_disk_has_no_room_for_is_refused_before_writing(tmp_path, capsys, schema_file, monkeypatch):
    import shutil as shutil_module

    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    assert main(csv_args(csv, tmp_path / "run", schema_file)) == 0
    checkpoint = str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    drawn = tmp_path / "drawn.csv"
    assert main(["sample", "--checkpoint", checkpoint, "-n", "50", "--out", str(drawn)]) == 0
    first = drawn.read_bytes()
    assert len(pd.read_csv(drawn)) == 50 and first.count(first.splitlines()[0]) == 1  # 50 rows, one header
    assert main(["sample", "--checkpoint", checkpoint, "-n", "50", "--out", str(drawn), "--overwrite"]) == 0
    assert drawn.read_bytes() == first  # the size probe draws aside: the same seed, the same rows
    usage = shutil_module.disk_usage(tmp_path)
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage._replace(free=1000))
    out = tmp_path / "big.csv"
    assert_refused(["sample", "--checkpoint", checkpoint, "-n", "1000", "--out", str(out)], capsys,
                   "-n 1000 rows would take about", "has 1000 bytes free: draw fewer rows")
    assert not out.exists() and not list(tmp_path.glob(".big.csv.*"))


def test_an_interrupted_command_says_so_without_a_traceback(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("lightning_dpgan.sampling.sample_to_file", interrupted)
    assert main(["sample", "--checkpoint", "c.ckpt", "-n", "5", "--out", "x.csv"]) == 130
    assert capsys.readouterr().err.strip() == "sample: interrupted"


def test_evaluate_refuses_training_rows_changed_since_the_run(tmp_path, capsys, schema_file, monkeypatch):
    """The labels of the file flipped after training: the utility and membership figures would be
    of other rows. The digest that tells is in the (private) checkpoint only."""
    from lightning_dpgan import evaluate

    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    out = tmp_path / "out"
    assert main(csv_args(csv, out, schema_file)) == 0
    digest = read_run_info(out / "checkpoints" / "last.ckpt")["train_rows_digest"]
    assert len(digest) == 64
    public = [path for path in out.rglob("*") if path.is_file() and path.suffix != ".ckpt"]
    assert public and not any(digest.encode() in path.read_bytes() for path in public)
    edited = pd.read_csv(csv)
    edited["label"] = edited["label"].map({"no": "yes", "yes": "no"})
    edited.to_csv(csv, index=False)
    assert_refused(["evaluate", "--run", str(out)], capsys, "the training records of csv are not those this run trained on",
                   str(out / "config.yaml"))
    assert not (out / "evaluation.json").exists()
    table().to_csv(csv, index=False)  # the rows it trained on, restored
    scored = record_calls(monkeypatch, evaluate, "evaluate_table")
    assert main(["evaluate", "--run", str(out)]) == 0 and scored


def test_evaluate_of_a_csv_run_whose_file_moved_says_where_it_was(tmp_path, capsys, schema_file):
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    out = tmp_path / "out"
    assert main(csv_args(csv, out, schema_file)) == 0
    csv.rename(tmp_path / "moved.csv")
    line = assert_refused(["evaluate", "--run", str(out)], capsys, f"CSV file not found: {csv}",
                          str(out / "config.yaml"), "put it back there")
    assert "--data.csv" not in line  # train's remedy: evaluate takes no such option


def test_evaluate_of_a_run_whose_data_folder_moved_names_the_recorded_folder_and_the_flag(tmp_path, capsys):
    """The run's data folder is config.yaml's, not a --data-dir the user gave evaluate: the
    refusal said "--data-dir X is not a folder". Now it names where X came from and the remedy,
    which works; sample's --seed is checked as evaluate's is."""
    data = Path(shutil.copytree(Path(__file__).parent / "fixtures" / "adult_tiny", tmp_path / "data"))
    out = tmp_path / "out"
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(data), "--output-dir", str(out),
                 "--max-steps", "2", "--batch-size", "8", *TINY_MLP, "--trainer.enable_progress_bar", "false"]) == 0
    data.rename(tmp_path / "moved")
    assert_refused(["evaluate", "--run", str(out)], capsys, f"the data folder recorded for this run, {data} (",
                   "config.yaml, data.data_dir), is not there any more: pass evaluate --data-dir")
    assert main(["evaluate", "--run", str(out), "--data-dir", str(tmp_path / "moved")]) == 0
    for seed in ("-1", str(2**64)):
        with pytest.raises(SystemExit) as stop:  # argparse's refusal, as evaluate's --seed
            main(["sample", "--checkpoint", str(out / "checkpoints" / "last.ckpt"), "-n", "5", "--out",
                  str(tmp_path / "x.csv"), "--seed", seed])
        assert stop.value.code == 2 and "argument --seed: must be a whole number in [0, 2^32)" in capsys.readouterr().err
        assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("kind", ["truncated", "text", "foreign", "pickled", "bitflip"])
def test_evaluate_refuses_a_damaged_checkpoint(image_run, tmp_path, capsys, kind):
    run = Path(shutil.copytree(image_run, tmp_path / "run"))
    damaged, message = damaged_checkpoints(image_run, tmp_path)[kind]
    shutil.copyfile(damaged, run / "checkpoints" / "last.ckpt")
    assert_refused(["evaluate", "--run", str(run)], capsys, message)
    assert not (run / "evaluation.json").exists()


def test_sample_refuses_a_checkpoint_with_a_flipped_bit(image_run, tmp_path, capsys):
    damaged, message = damaged_checkpoints(image_run, tmp_path)["bitflip"]
    out = tmp_path / "samples.png"
    assert_refused(["sample", "--checkpoint", str(damaged), "-n", "10", "--out", str(out)], capsys, message)
    assert not out.exists()


# --- out of disk -------------------------------------------------------------------------------


@pytest.fixture
def disk_full_for(monkeypatch):
    """``disk_full_for("privacy.json", ...)``: from now on, writing those files through
    ``atomic_write`` fails with the kernel's own ENOSPC -- the temporary file is created for
    real, but its descriptor is ``/dev/full``. Returns the temporary files it handed out."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    handed_out: list[Path] = []

    def arm(*names: str) -> list[Path]:
        def mkstemp(prefix="", suffix="", dir=None):
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dir)
            if any(prefix.startswith(f".{target}.") for target in names):
                os.close(fd)
                fd = os.open("/dev/full", os.O_WRONLY)
                handed_out.append(Path(name))
            return fd, name

        monkeypatch.setattr(outputs, "tempfile", SimpleNamespace(mkstemp=mkstemp))
        return handed_out

    return arm


def png(size: int = 64) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (size, size), dtype=np.uint8)


WRITERS = {
    "privacy.json": lambda path: write_json(path, {"epsilon": 1.0, "steps": list(range(5000))}),
    "config.yaml": lambda path: write_yaml(path, {"model": {"name": "gan"}}),
    "synthetic.csv": lambda path: write_csv(path, pd.DataFrame({"x": np.arange(20000)})),
    "samples.png": lambda path: write_png(path, png()),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_outputs_get_the_usual_permissions_not_the_temporary_files(tmp_path, name):
    """Written through a private temporary file (mode 0600), an output must still end up with
    the mode any file gets under the process's umask."""
    previous = os.umask(0o022)
    try:
        WRITERS[name](tmp_path / name)
        (tmp_path / "plain").write_text("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644


@pytest.mark.parametrize("earlier", [True, False], ids=["over-an-earlier-file", "new-file"])
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_full_disk_leaves_no_partial_file(tmp_path, disk_full_for, name, earlier):
    path = tmp_path / name
    if earlier:
        path.write_bytes(b"the earlier, complete file")
    handed_out = disk_full_for(name)
    with pytest.raises(OutputWriteError) as excinfo:
        WRITERS[name](path)
    assert handed_out and not handed_out[0].exists()  # the write went through a temporary file, now gone
    assert excinfo.value.errno == errno.ENOSPC and isinstance(excinfo.value, OSError)
    message = str(excinfo.value)
    assert f"could not write {path}: No space left on device" in message and "Free some disk space" in message
    if earlier:
        assert path.read_bytes() == b"the earlier, complete file"
        assert "still holds its previous content" in message
    else:
        assert "was not created" in message
    assert [p.name for p in tmp_path.iterdir()] == ([name] if earlier else [])


def test_a_write_that_fails_half_way_removes_what_it_wrote(tmp_path):
    path = tmp_path / "privacy.json"
    path.write_text('{"epsilon": 1.0}\n')

    def half_then_full(handle):
        handle.write(b'{"epsilon": 2.')
        handle.flush()
        assert len(list(tmp_path.glob(".privacy.json.*.tmp"))) == 1  # the half-written temporary file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OutputWriteError, match="No space left on device"):
        atomic_write(path, half_then_full)
    assert [p.name for p in tmp_path.iterdir()] == ["privacy.json"]
    assert path.read_text() == '{"epsilon": 1.0}\n'


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write_of_that_file(tmp_path):
    """SIGKILL (the OOM killer, a lost node) gives the writer no chance to remove its temporary
    file: a run's folder kept a hidden `.synthetic.csv.*.tmp` of gigabytes. The next write of the
    same file removes those whose writer, on this host, is gone and which were left untouched
    for ten minutes; a live writer's, another host's (one whose name starts with this host's
    too), a recent one's and another file's are kept."""
    import socket
    import subprocess
    import sys
    import time

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = socket.gethostname()
    orphan = tmp_path / f".synthetic.csv.{host}-{finished.pid}.k3j2.tmp"
    kept = [tmp_path / f".synthetic.csv.{host}-{os.getppid()}.a1b2.tmp",  # a live process
            tmp_path / f".synthetic.csv.{host}x-{finished.pid}.c3d4.tmp",  # another host
            tmp_path / f".synthetic.csv.{host}-{finished.pid}.cluster-{finished.pid}.g7h8.tmp",  # host "HOST-PID.cluster"
            tmp_path / f".privacy.json.{host}-{finished.pid}.e5f6.tmp"]  # another file
    recent = tmp_path / f".synthetic.csv.{host}-{finished.pid}.r9s0.tmp"
    long_ago = time.time() - outputs.ORPHAN_AGE_S - 1
    for path in [orphan, *kept, recent]:
        path.write_text("partial")
        if path is not recent:
            os.utime(path, (long_ago, long_ago))
    write_csv(tmp_path / "synthetic.csv", pd.DataFrame({"a": [1]}))
    assert recent.exists()  # its writer may be a live one in another container of this host name
    recent.unlink()
    assert not orphan.exists() and all(path.exists() for path in kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["synthetic.csv", *(p.name for p in kept)])


def test_other_failures_while_writing_also_remove_the_temporary_file(tmp_path):
    def interrupted(handle):
        handle.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not turned into an OSError
        atomic_write(tmp_path / "synthetic.csv", interrupted)
    assert list(tmp_path.iterdir()) == []


def test_sample_on_a_full_disk_is_a_clear_error_or_a_traceback_with_debug(image_run, tmp_path, capsys,
                                                                          disk_full_for, monkeypatch):
    out = tmp_path / "grid.png"
    out.write_bytes(b"an earlier grid")
    disk_full_for("grid.png")
    argv = ["sample", "--checkpoint", str(image_run / "checkpoints" / "last.ckpt"), "-n", "10", "--out", str(out),
            "--overwrite"]
    assert_refused(argv, capsys, f"could not write {out}: No space left on device", "still holds its previous content")
    assert out.read_bytes() == b"an earlier grid" and [p.name for p in tmp_path.iterdir()] == ["grid.png"]
    monkeypatch.setenv("LIGHTNING_DPGAN_DEBUG", "1")
    with pytest.raises(OutputWriteError):
        main(argv)


def test_a_run_whose_privacy_report_hits_a_full_disk_fails_clearly_and_loses_nothing(
        tiny_image_data_dir, tmp_path, capsys, disk_full_for):
    out = tmp_path / "out"
    plant_earlier_run(out)
    disk_full_for("privacy.json")
    assert_refused(image_args(tiny_image_data_dir, out), capsys,
                   f"could not write {out / 'privacy.json'}: No space left on device")
    # privacy.json is written last and the earlier one was set aside: no privacy.json claims a run
    # whose files were not all written
    assert_nothing_lost(out, set_aside=True)  # training had run
    assert not (out / "privacy.json").exists()
    assert (out / "checkpoints" / "last.ckpt").is_file()  # training itself finished


@pytest.mark.parametrize("name", ["samples.png", "metrics.json"])
def test_a_run_whose_other_outputs_hit_a_full_disk_writes_no_privacy_report(
        tiny_image_data_dir, tmp_path, capsys, disk_full_for, name):
    """privacy.json comes after every other output: a fresh one marks a complete run folder, so
    a failed samples.png or metrics.json leaves none (the earlier run's is kept aside)."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    disk_full_for(name)
    assert_refused(image_args(tiny_image_data_dir, out), capsys, f"could not write {out / name}: No space left on device")
    assert_nothing_lost(out, set_aside=True)
    assert not (out / "privacy.json").exists()


def test_a_run_whose_synthetic_table_hits_a_full_disk_keeps_the_earlier_table(tmp_path, capsys, disk_full_for):
    csv = write_case(tmp_path / "data.csv", lambda _: table())
    out = tmp_path / "out"
    plant_earlier_run(out)
    disk_full_for("synthetic.csv")
    assert_refused(csv_args(csv, out, None), capsys, f"could not write {out / 'synthetic.csv'}: No space left",
                   "synthetic.csv was not created")
    assert_nothing_lost(out, set_aside=True)  # the earlier table is in previous/; the table is written first: no report of this run claims it
    assert not (out / "privacy.json").exists()


def test_an_unknown_logger_is_refused_with_the_known_ones(tiny_image_data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(tiny_run_args(tiny_image_data_dir, out) + ["--logger", "foo"], capsys,
                   "unknown logger 'foo'", "csv", "tensorboard", "wandb")
    assert not (out / "config.yaml").exists()


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema-file", "dp-schema"])
def test_fractional_values_in_an_integer_column_name_the_remedy_that_fits(tmp_path, capsys, schema_file, with_schema):
    """A schema file declares the column; without one, --data.integer does: the advice must name
    what the user wrote."""
    csv = write_case(tmp_path / "data.csv", lambda frame: frame.assign(visits=frame["visits"] + 0.5))
    extra = [] if with_schema else ["--data.integer", "visits"]
    remedy = "declare the column continuous in the schema" if with_schema else "leave it out of --data.integer"
    assert_refused(csv_args(csv, tmp_path / "out", schema_file if with_schema else None, *extra), capsys,
                   "'visits' is integer but", "fractional values", remedy)


def test_a_delta_that_the_csvs_dp_bounds_use_up_names_the_option_that_spends_it(tmp_path, capsys):
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    out = tmp_path / "out"
    line = assert_refused(csv_args(csv, out, None, "--data.bounds_delta", "1e-6", "--delta", "1e-7", "--epsilon", "10",
                                   "--model", "dpctgan"),
                          capsys, "preprocessing would spend delta 1e-06 of --delta 1e-07", "--data.bounds_delta",
                          "only a larger --delta helps")
    assert "--data.modes_epsilon" not in line  # the DP modes' histogram spends no delta
    # a min-max table's cost is its schema's alone, without parts: named all the same, and nothing else
    line = assert_refused(csv_args(csv, out, None, "--data.bounds_epsilon", "20", "--epsilon", "10", "--model", "dpgan"),
                          capsys, "preprocessing would spend epsilon 20 of --epsilon 10", "--data.bounds_epsilon")
    assert "--data.modes_epsilon" not in line and "--quail-split" not in line


@pytest.mark.parametrize("model,extra,spent", [
    ("dpgan", ["--data.bounds_epsilon", "4", "--epsilon", "3"], "epsilon 4 of --epsilon 3"),
    ("dpctgan", ["--data.bounds_epsilon", "2", "--data.modes_epsilon", "1", "--epsilon", "3"], "epsilon 3 of --epsilon 3"),
    ("quail", ["--data.bounds_epsilon", "2", "--quail-split", "0.5", "--epsilon", "4"], "epsilon 4.1 of --epsilon 4"),  # dpctgan: modes 0.1
    # no --epsilon (a noise multiplier given): the delta the estimate's category lists spend still counts
    ("gan", ["--privacy", "dp-sgd", "--privacy.noise_multiplier", "1", "--delta", "1e-7"], "delta 1e-06 of --delta 1e-07"),
], ids=["dp-bounds", "bounds-and-modes", "bounds-and-label-model", "delta-without-epsilon"])
def test_a_budget_the_releases_before_training_use_up_is_refused_before_they_read_a_row(tmp_path, capsys, monkeypatch,
                                                                                      model, extra, spent):
    """The DP schema estimate (and the DP modes, QUAIL's label model) ran on the private rows, its
    clipping warning printed their counts, and only then was the run refused for a budget they
    used up, a figure their settings alone give: each attempt spent privacy no privacy.json records."""
    from lightning_dpgan.data import table_transformer
    from lightning_dpgan.datamodules import csv as csv_datamodule

    estimated = record_calls(monkeypatch, csv_datamodule, "infer_schema_dp")
    histograms = record_calls(monkeypatch, table_transformer, "dp_column_histograms")
    csv = write_case(tmp_path / "data.csv", lambda frame: frame)
    args = [arg if arg != "gan" else model for arg in csv_args(csv, tmp_path / "out", None, *extra)]
    if model == "quail":
        args += ["--quail-synthesizer", "dpctgan"]
    assert_refused(args, capsys, f"preprocessing would spend {spent} before training", "nothing was spent")
    assert estimated == [] and histograms == []


def test_a_refusal_before_training_leaves_no_folder_it_made(tiny_image_data_dir, tmp_path, capsys):
    """delta >= 1/n is found once the data is read, after the logger made logs/ in the new
    folder: a stray folder that reads like a run's. An existing folder is kept as it was."""
    out = tmp_path / "fresh"
    assert_refused(image_args(tiny_image_data_dir, out, "--privacy.noise_multiplier", "1.0", "--delta", "0.01",
                              model="dpgan"), capsys, "is not below 1/n")
    assert not out.exists()
    nested = tmp_path / "a" / "b" / "c"
    assert_refused(image_args(tiny_image_data_dir, nested, "--privacy.noise_multiplier", "1.0", "--delta", "0.01",
                              model="dpgan"), capsys, "is not below 1/n")
    assert not (tmp_path / "a").exists()  # the parents it made too
    kept = tmp_path / "kept"
    kept.mkdir()
    assert_refused(image_args(tiny_image_data_dir, kept, "--privacy.noise_multiplier", "1.0", "--delta", "0.01",
                              model="dpgan"), capsys, "is not below 1/n")
    assert kept.is_dir()
    # a folder that cannot be made is named by its flag, before any data is read
    (tmp_path / "a_file").write_text("kept")
    assert_refused(image_args(tiny_image_data_dir, tmp_path / "a_file" / "run"), capsys,
                   f"--output-dir {tmp_path / 'a_file' / 'run'} cannot be made")
    assert (tmp_path / "a_file").read_text() == "kept"


def test_the_data_folder_as_output_is_refused_and_left_as_it_was(tiny_image_data_dir, tmp_path, capsys):
    before = sorted(str(path.relative_to(tiny_image_data_dir)) for path in tiny_image_data_dir.rglob("*"))
    assert_refused(image_args(tiny_image_data_dir, tiny_image_data_dir), capsys,
                   f"--output-dir {tiny_image_data_dir} is the folder the private records are read from "
                   f"(--data-dir {tiny_image_data_dir})")
    assert sorted(str(path.relative_to(tiny_image_data_dir)) for path in tiny_image_data_dir.rglob("*")) == before
    (tmp_path / "raw").mkdir()
    csv = write_case(tmp_path / "raw" / "data.csv", lambda frame: frame)
    assert_refused(csv_args(csv, tmp_path, None), capsys, f"holds the folder the private records are read from "
                                                          f"(--data.csv {tmp_path / 'raw'})")
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == ["raw", "raw/data.csv"]


def test_the_subfolder_or_cache_the_data_files_lie_in_as_output_is_refused_and_left_as_it_was(
        tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    """--data-dir DIR reads MNIST from DIR/mnist/: --output-dir DIR/mnist was accepted, and the run
    folder meant for publishing held the raw IDX files; so was the download cache's folder."""
    subfolder = tiny_image_data_dir / "mnist"
    before = sorted(path.name for path in subfolder.iterdir())
    assert_refused(image_args(tiny_image_data_dir, subfolder), capsys,
                   f"--output-dir {subfolder} is the folder the private records are read from (--data-dir's files "
                   f"{subfolder})")
    assert sorted(path.name for path in subfolder.iterdir()) == before
    cache, elsewhere = tmp_path / "cache", tmp_path / "no-data"  # the files are read from the cache
    shutil.copytree(subfolder, cache / "mnist")
    elsewhere.mkdir()
    monkeypatch.setenv("LIGHTNING_DPGAN_CACHE_DIR", str(cache))
    assert_refused(image_args(elsewhere, cache), capsys,
                   f"--output-dir {cache} holds the folder the private records are read from (the download cache")
    assert sorted(path.name for path in cache.iterdir()) == ["mnist"]
    assert main(image_args(tiny_image_data_dir, cache / "run")) == 0  # read from --data-dir: the cache is not the data


def test_the_rows_of_a_synthetic_table_are_refused_for_an_image_run(tiny_image_data_dir, tmp_path, capsys):
    """--num_synthetic was recorded in config.yaml and did nothing: an image run writes no table."""
    assert_refused(image_args(tiny_image_data_dir, tmp_path / "run", "--num_synthetic", "5"), capsys,
                   "--num_synthetic 5 sets the rows of a table run's synthetic.csv, and mnist is an image dataset")
    assert not (tmp_path / "run").exists()


def test_a_compressed_csv_is_read_and_its_header_checked(tmp_path):
    """The repeated-name check reads the header as pandas reads the file (compression, UTF-8)."""
    from lightning_dpgan.data.schema import SchemaError
    from lightning_dpgan.datamodules.csv import _header_names

    table().to_csv(tmp_path / "fine.csv.gz", index=False)
    assert _header_names(tmp_path / "fine.csv.gz") == list(table().columns)
    table().rename(columns={"visits": "amount"}).to_csv(tmp_path / "twice.csv.gz", index=False)
    with pytest.raises(SchemaError, match=r"names the columns \['amount'\] more than once"):
        _header_names(tmp_path / "twice.csv.gz")


def test_a_column_read_as_text_for_a_value_in_other_rows_still_says_what_is_wrong():
    from lightning_dpgan.data.schema import non_numeric_examples

    assert non_numeric_examples(pd.Series(["1.5", "lots", "2"])) == "'lots' (data row 2)"
    assert "the text is in other rows" in non_numeric_examples(pd.Series(["1.5", "2"], dtype=object))


def test_a_refused_runs_new_folder_holding_more_than_logs_is_kept(tmp_path):
    """A data folder placed inside, or another run's files: not the refused run's to remove."""
    from lightning_dpgan.cli import _first_missing_folder, _remove_made_folder

    out = tmp_path / "new" / "run"
    assert _first_missing_folder(out) == tmp_path / "new" and _first_missing_folder(tmp_path) is None
    (out / "logs").mkdir(parents=True)
    (out / "data").mkdir()
    _remove_made_folder(out, tmp_path / "new")
    assert (out / "data").is_dir() and (out / "logs").is_dir()


def test_sigterm_during_training_keeps_its_steps_and_exits_143(tiny_image_data_dir, tmp_path, capsys, monkeypatch):
    """A scheduler's stop (``kill``) mid-run: Lightning stops between two batches. The steps
    since the last periodic save are kept in the checkpoint, with the accountant, the exit
    status is 143 (it was 0, as if the run had finished), and a resume takes up from there."""
    import signal

    def terminate() -> None:
        # Lightning's handler is installed on the main thread only: without it the signal would end pytest
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "Lightning's SIGTERM handler is not installed"
        os.kill(os.getpid(), signal.SIGTERM)

    act_after_training_step(monkeypatch, 2, terminate)
    out = tmp_path / "out"
    args = tiny_run_args(tiny_image_data_dir, out, model="dpgan", steps=6) + [
        "--epsilon", "5", "--checkpoint_every_n_steps", "0"]
    assert main(args) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "train: stopped by SIGTERM after 2 steps" in err
    assert f"Continue it with: python -m lightning_dpgan train --config {out / 'config.yaml'} --resume {out / 'checkpoints' / 'last.ckpt'}" in err
    saved = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["lightning_dpgan"]["train_steps"] == 2
    assert not (out / "privacy.json").exists()

    monkeypatch.undo()
    resumed = tmp_path / "resumed"
    assert main(tiny_run_args(tiny_image_data_dir, resumed, model="dpgan", steps=6) + [
        "--epsilon", "5", "--resume", str(out / "checkpoints" / "last.ckpt")]) == 0
    report = json.loads((resumed / "privacy.json").read_text())
    assert report["steps"] == 6 and report["epsilon"] <= 5


@pytest.mark.parametrize("every", [0, 2])
def test_ctrl_c_during_training_says_so_what_is_kept_and_exits_130(tiny_image_data_dir, tmp_path, capsys, monkeypatch,
                                                                   every):
    """Lightning turns Ctrl-C into exit status 1, the status of a failure: train says it was
    interrupted and exits 130, as sample and evaluate do. It said no more, though Lightning saves
    nothing on a Ctrl-C: how many steps the last periodic checkpoint holds, and how to go on
    (as a SIGTERM's stop says), or that there is nothing to continue."""
    act_after_training_step(monkeypatch, 3, press_ctrl_c)
    out = tmp_path / "out"
    with sigint_restored():
        assert main(tiny_run_args(tiny_image_data_dir, out, steps=6) + ["--checkpoint_every_n_steps", str(every)]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    if every:
        assert last.startswith(f"train: interrupted after 3 steps: {out / 'checkpoints' / 'last.ckpt'} holds 2 of them, "
                               "its last periodic save")
        assert f"Continue it with: python -m lightning_dpgan train --config {out / 'config.yaml'} --resume" in last
    else:
        assert last.startswith("train: interrupted after 3 steps, with no periodic checkpoint (--checkpoint_every_n_steps "
                               "0; Ctrl-C saves none as it stops): there is nothing to continue. Train again with")


def test_a_private_checkpoint_resumed_without_its_privacy_is_refused(tiny_image_data_dir, tmp_path, capsys):
    """The other way round (a non-private checkpoint under DP-SGD) was refused already: the
    budget it spent cannot be known. This way the run trained on without privacy, unwarned."""
    private = tmp_path / "private"
    assert main(tiny_run_args(tiny_image_data_dir, private, model="wgan", steps=2) + [
        "--privacy", "dp-sgd", "--epsilon", "5"]) == 0
    out = tmp_path / "out"
    args = tiny_run_args(tiny_image_data_dir, out, model="wgan", steps=4) + [
        "--resume", str(private / "checkpoints" / "last.ckpt")]
    assert_refused(args, capsys, "was trained with --privacy dp-sgd", "Resume with --privacy dp-sgd")
    assert not (out / "checkpoints").exists()


def test_a_run_too_short_for_one_generator_step_warns(tiny_image_data_dir, tmp_path, capsys):
    """DPGAN's critic takes 5 steps per generator step: 4 training steps spend the budget and
    leave the generator as initialised, which the run used to release without a word."""
    out = tmp_path / "out"
    assert main(tiny_run_args(tiny_image_data_dir, out, model="dpgan", steps=4) + ["--epsilon", "5"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: warning: no generator")]
    assert len(warning) == 1
    assert "once every 5 training steps" in warning[0] and "took 4" in warning[0] and "spent epsilon" in warning[0]
    five = tmp_path / "five"
    assert main(tiny_run_args(tiny_image_data_dir, five, model="dpgan", steps=5) + ["--epsilon", "5"]) == 0
    assert "no generator update" not in capsys.readouterr().err


def test_another_exit_from_within_training_is_not_taken_for_ctrl_c(tiny_image_data_dir, tmp_path, monkeypatch):
    """Lightning marks its trainer interrupted for any exception: only its own exit after a
    Ctrl-C is said as an interruption, a callback's sys.exit(3) passes on as it is."""
    import sys

    act_after_training_step(monkeypatch, 2, lambda: sys.exit(3))
    with pytest.raises(SystemExit) as exited:
        main(tiny_run_args(tiny_image_data_dir, tmp_path / "out", steps=6))
    assert exited.value.code == 3


@pytest.mark.parametrize(("model", "flag"), [("pategan", "--privacy.num_teachers"), ("gswgan", "--privacy.num_critics")])
def test_more_teachers_or_critics_than_records_is_refused_saying_where_the_count_may_come_from(tmp_path, capsys,
                                                                                                model, flag):
    """A preset's 100 teachers on a small file were refused as "--privacy.num_teachers 100 exceeds
    ...", naming a flag the user never typed, with no count that would do."""
    args = ["train", "--model", model, "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" / "adult_tiny"),
            "--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--epsilon", "50", "--delta", "1e-3",
            "--trainer.enable_progress_bar", "false", flag, "1000"]
    line = assert_refused(args, capsys, f"{flag} 1000 (given, or a config file's or the preset's) exceeds the ")
    records = int(line.split("exceeds the ")[1].split()[0])
    assert f"pass {flag} {records} or less" in line


def test_evaluate_of_an_image_run_without_its_checkpoint_is_refused_before_its_data_is_read(image_run, tmp_path, capsys,
                                                                                           monkeypatch):
    """The images scored are drawn from the checkpoint: without it, evaluate read the data, warned
    that the split was not checked, and only then said "checkpoint not found"."""
    from lightning_dpgan.datamodules.mnist import MNISTDataModule

    run = Path(shutil.copytree(image_run, tmp_path / "run"))
    (run / "checkpoints" / "last.ckpt").unlink()
    monkeypatch.setattr(MNISTDataModule, "prepare_data", lambda self: pytest.fail("the data was read"))
    assert_refused(["evaluate", "--run", str(run)], capsys, "has no checkpoints/last.ckpt: an image run is scored")
    assert not (run / "evaluation.json").exists()


@pytest.mark.parametrize("rename, given, said", [
    # a text label declared continuous: listing it as categorical or dropping it are both refused for the label
    ({}, dict(target="kind", label_kind="continuous", categorical="label"),
     "the label 'kind' is continuous but holds non-numeric values ('a' (data row 1)"),
    # a column named as YAML reads no value, or with a comma: the remedy is written as a flag keeps it one name
    ({"kind": "null"}, {}, "--data.drop '\"null\"' (a date or free text)"),
    ({"kind": "city,state"}, {}, "--data.categorical '[\"city,state\"]' if it is categorical"),
    # a flag's name the header has with spaces around it
    ({"kind": " kind"}, dict(categorical="kind,label"), "the header's names [' kind'] have spaces around them"),
], ids=["text-label-declared-continuous", "yaml-null-name", "comma-in-a-name", "spaces-in-the-header"])
def test_a_csv_columns_remedy_is_one_the_flags_take(tmp_path, rename, given, said):
    """The remedies named flags that refused the label, split a name at its comma, or wrote a
    name YAML reads as no value bare (``--data.drop null`` was what had been typed); a listed
    name the header holds with spaces around it got no hint."""
    csv = write_case(tmp_path / "data.csv", lambda _: table().rename(columns=rename))
    settings = {"target": "label", "categorical": "label", "label_kind": "binary", **given}
    with pytest.raises(SchemaError, match=re.escape(said)):
        CSVDataModule(csv=csv, bounds_epsilon=50, **settings).training_row_count()


@pytest.mark.parametrize("keep", ["dropped", "one-column-file"])
def test_a_csv_left_with_its_label_alone_is_refused_before_any_release(tmp_path, keep):
    """QUAIL refused it after the schema estimate had spent its budget; other models trained on
    the label alone, spent, and evaluate failed in scikit-learn's words ("0 feature(s)")."""
    frame = table() if keep == "dropped" else table()[["label"]]
    drop = {"drop": "amount,visits,kind"} if keep == "dropped" else {}
    datamodule = CSVDataModule(csv=write_case(tmp_path / "data.csv", lambda _: frame), target="label",
                               categorical="label", label_kind="binary", bounds_epsilon=50, **drop)
    with pytest.raises(SchemaError, match="the label 'label' is the only column of .* to train on"):
        datamodule.training_row_count()


def test_a_column_of_values_below_the_dp_grids_finest_magnitude_is_warned_of(tmp_path, caplog):
    """Concentrations of 1e-6 got estimated bounds [0, 2^-10] and were drawn a hundred times too
    large, without a word: nothing is clipped, so the clipping warning never came."""
    frame = table(300).assign(conc=lambda f: np.random.default_rng(1).uniform(1e-6, 5e-6, len(f)))
    datamodule = CSVDataModule(csv=write_case(tmp_path / "data.csv", lambda _: frame), target="label",
                               categorical="kind,label", integer="visits", label_kind="binary", bounds_epsilon=50)
    datamodule.setup("fit")
    assert max(datamodule.schema.column("conc").bounds) == 2.0**-10
    warned = [record.getMessage() for record in caplog.records if "DP estimate's finest" in record.getMessage()]
    assert len(warned) == 1 and "the estimated bounds of conc are" in warned[0] and "amount" not in warned[0]


def test_a_mode_specific_continuous_label_for_dpsactgan_is_refused_before_the_dp_histogram(tmp_path, capsys):
    """dpsactgan's regressor predicts one scalar: a mode-specific price (a scalar and its modes'
    one-hot) was refused as the module was built, after the DP histogram had spent epsilon 0.1."""
    king = Path(__file__).parent / "fixtures" / "king_tiny"
    args = ["train", "--model", "dpsactgan", "--dataset", "king", "--data-dir", str(king), "--output-dir",
            str(tmp_path / "out"), "--max-steps", "2", "--batch-size", "8", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]
    line = assert_refused(args + ["--data.label_encoding", "mode-specific"], capsys,
                          "predicts a continuous label as one scalar", "use --data.label_encoding scalar")
    assert "spent" not in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("model,setting", [("pategan", "num_teachers"), ("gswgan", "num_critics")])
def test_a_model_setting_its_privacy_strategy_owns_is_refused_with_where_to_set_it(tmp_path, capsys, model, setting):
    """``--model.num_teachers 7`` met a PATE strategy that built its own number of teachers, and
    was refused as "this model already has 7 teachers, not 100" once the data was read: refused
    now with the rest of the settings, naming ``--privacy.num_teachers``; and the model's --help
    no longer offers it."""
    out = tmp_path / "out"
    plant_earlier_run(out)
    args = ["train", "--model", model, "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" / "adult_tiny"),
            "--output-dir", str(out), "--overwrite", "--max-steps", "2", "--epsilon", "5000", f"--privacy.{setting}", "3",
            f"--model.{setting}", "7"]
    assert_refused(args, capsys, f"unknown key(s) model.{setting} for model '{model}'",
                   f"the privacy strategy's, set with --privacy.{setting}")
    assert_nothing_lost(out)
    with pytest.raises(SystemExit):
        main(["train", "--model", model, "--dataset", "adult", "--help"])
    listed = capsys.readouterr().out
    assert f"--privacy.{setting}" in listed and f"--model.{setting}" not in listed
    # a model that takes no such setting is not pointed at a --privacy.* its strategy would refuse too
    dpgan = ["train", "--model", "dpgan", "--dataset", "adult", "--data-dir", args[args.index("--data-dir") + 1],
             "--output-dir", str(out), "--overwrite", "--max-steps", "2", "--epsilon", "5", "--batch-size", "8",
             f"--model.{setting}", "7"]
    line = assert_refused(dpgan, capsys, f"unknown key(s) model.{setting} for model 'dpgan'")
    assert "--privacy." not in line
