"""UCI Adult (1994 US census extract) as a :class:`TabularDataModule`."""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path

import pandas as pd

from lightning_dpgan.data.download import (DataIntegrityError, RemoteFile, compression_of, damaged_compression_refused,
                                           open_decompressed)
from lightning_dpgan.data.csv_fields import ExtraFieldsError, read_csv_fields
from lightning_dpgan.data.schema import Column, TableSchema
from lightning_dpgan.datamodules.tabular import TabularDataModule

log = logging.getLogger(__name__)

UCI_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
TRAIN_FILE = RemoteFile.mirrored("adult.data", [UCI_URL], "5d7c39d7b8804f071cdd1f2a7c460872", 3_974_305)
TEST_FILE = RemoteFile.mirrored("adult.test", [UCI_URL], "35238206dfdf7f1fe215bbb874adecdc", 2_003_153)

_NAMES = "adult.names (UCI)"
_CPS = "1994 Current Population Survey top-code"

#: The public schema. Category lists and their order are those of adult.names; bounds come from
#: adult.names' extraction rule ((AAGE>16) && (AGI>100) && (AFNLWGT>1) && (HRSWK>0)) and from
#: the census' published top-codes -- never from the rows.
SCHEMA = TableSchema(
    columns=(
        Column("age", "integer", bounds=(17, 90), source=f"{_NAMES}: AAGE>16; {_CPS} of age at 90"),
        Column(
            "workclass",
            "categorical",
            categories=("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
                        "Without-pay", "Never-worked"),
            source=_NAMES,
        ),
        Column(
            "fnlwgt",
            "integer",
            bounds=(1, 2_000_000),
            source=f"{_NAMES}: AFNLWGT>1; no published maximum, so a generous fixed upper bound of 2e6 "
            "(the CPS weight is the number of people a record stands for, in hundredths)",
        ),
        Column(
            "education",
            "categorical",
            categories=("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc",
                        "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool"),
            source=_NAMES,
        ),
        Column("education-num", "integer", bounds=(1, 16), source=f"{_NAMES}: ordinal code of its 16 education levels"),
        Column(
            "marital-status",
            "categorical",
            categories=("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                        "Married-spouse-absent", "Married-AF-spouse"),
            source=_NAMES,
        ),
        Column(
            "occupation",
            "categorical",
            categories=("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
                        "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing",
                        "Transport-moving", "Priv-house-serv", "Protective-serv", "Armed-Forces"),
            source=_NAMES,
        ),
        Column(
            "relationship",
            "categorical",
            categories=("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
            source=_NAMES,
        ),
        Column(
            "race",
            "categorical",
            categories=("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
            source=_NAMES,
        ),
        Column("sex", "categorical", categories=("Female", "Male"), source=_NAMES),
        Column("capital-gain", "integer", bounds=(0, 99_999), source=f"{_CPS} of capital gains at 99999"),
        Column(
            "capital-loss",
            "integer",
            bounds=(0, 99_999),
            source="no separate published limit: the 99999 top-code of the census' five-digit income fields, "
            "as for capital-gain",
        ),
        Column("hours-per-week", "integer", bounds=(1, 99), source=f"{_NAMES}: HRSWK>0; {_CPS} of hours at 99"),
        Column(
            "native-country",
            "categorical",
            categories=("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
                        "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
                        "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
                        "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
                        "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
            source=_NAMES,
        ),
        Column("income", "categorical", categories=("<=50K", ">50K"), source=f"{_NAMES}: the two classes"),
    ),
    label="income",
    label_kind="binary",
)

MISSING = "?"


class AdultDataModule(TabularDataModule):
    """UCI Adult census income: 6 numeric + 8 categorical columns, binary label income >50K.

    Uses the official split: ``adult.data`` (32,561 rows) trains, ``adult.test`` (16,281 rows)
    is the test split; ``test_fraction`` is ignored, and ``split_seed`` only draws the dev rows
    (``dev_fraction``) out of adult.data. Rows with a missing
    value (``?``, in workclass, occupation or native-country) are dropped from both splits --
    45,222 rows remain, the version most papers use. Dropping depends on each row alone, so it
    costs no privacy. adult.test's first line and the ``.`` after its labels are removed.
    Files are read from ``data_dir`` (or its ``adult/`` subfolder), else downloaded from UCI
    and checked by md5 and size.
    """

    name = "adult"
    subdirs = ("adult",)
    files = (TRAIN_FILE, TEST_FILE)
    #: ``encoding="mode-specific"`` defaults: CTAB-GAN+'s setting for Adult, which DP-SACTGAN
    #: adopts (sec. 4.2) -- capital-gain and capital-loss are mixed columns whose 0 ("no gain",
    #: "no loss", most rows) is a category of its own; no long-tail columns.
    default_mixed = {"capital-gain": (0.0,), "capital-loss": (0.0,)}
    default_log_columns = ()
    @property
    def ignored_split_settings(self) -> tuple[str, ...]:  # type: ignore[override]
        """The official split takes no ``test_fraction``; ``split_seed`` draws only the dev rows."""
        return ("test_fraction",) if self.hparams.dev_fraction else ("test_fraction", "split_seed")

    def _build_schema(self) -> TableSchema:
        return SCHEMA

    def _read_split(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return read_adult(self._resolve(TRAIN_FILE)), read_adult(self._resolve(TEST_FILE))


def _first_long_row(path: Path) -> str:
    """Which line of ``path`` holds more than 15 fields (an empty last field, a trailing comma,
    is none: pandas reads it as no field), said as pandas says it of a later row."""
    with io.TextIOWrapper(open_decompressed(path), encoding="utf-8", newline="") as stream:
        for line, row in enumerate(csv.reader(stream), start=1):
            while row and not row[-1].strip():
                row.pop()
            if len(row) > len(SCHEMA.names) and not (line == 1 and row[0].startswith("|")):
                return f"line {line} holds {len(row)} fields"
    return "a row holds more fields"


def read_adult(path: Path) -> pd.DataFrame:
    """Read adult.data or adult.test in the original UCI format, rows with ``?`` dropped.

    The index is the row number in the file (after the banner line), so splits stay traceable.
    """
    try:
        with damaged_compression_refused(path, DataIntegrityError, "is it the UCI Adult file? Copy or download it again"):
            with io.TextIOWrapper(open_decompressed(path), encoding="utf-8") as stream:  # a gzipped copy too
                banner = stream.readline().startswith("|")
            # index_col=False (read_csv_fields): a row of more than 15 fields is refused; pandas
            # otherwise made its first fields the row index, shifting every column
            frame = read_csv_fields(path, header=None, names=SCHEMA.names, skiprows=1 if banner else 0,
                                    skipinitialspace=True, keep_default_na=False, dtype=str,
                                    compression=compression_of(path))
    except UnicodeDecodeError as err:
        raise DataIntegrityError(f"{path} is not a text file ({err.reason} at byte {err.start}): is it the UCI "
                                 "Adult file?") from err
    except (pd.errors.ParserError, ExtraFieldsError) as err:  # a row of more than 15 fields
        reason = " ".join(str(err).split()) if isinstance(err, pd.errors.ParserError) else _first_long_row(path)
        raise DataIntegrityError(f"{path} is not in the UCI Adult format (15 comma-separated fields a row): {reason}; "
                                 "is it the UCI Adult file?") from err
    if frame.empty:  # read against the schema, it said none of 0 rows fits the category lists
        raise DataIntegrityError(f"{path} is empty (no rows after its banner line): is it the UCI Adult file?")
    # a short row's missing fields come back empty (or NaN), not as '?': the file is damaged, not incomplete
    malformed = frame.isna().any(axis=1) | (frame == "").any(axis=1)
    if malformed.any():
        rows = (frame.index[malformed] + 1 + banner).tolist()[:5]
        raise DataIntegrityError(f"{path}: {int(malformed.sum())} rows have fewer than 15 fields or an empty one "
                                 f"(lines {rows}...; a missing value is written '?')")
    missing = (frame == MISSING).any(axis=1)
    log.info("%s: dropped %d of %d rows with missing values ('?')", path.name, int(missing.sum()), len(frame))
    frame = frame[~missing].copy()
    frame["income"] = frame["income"].str.rstrip(".")
    for column in SCHEMA.columns:
        if column.is_numeric:
            values = pd.to_numeric(frame[column.name], errors="coerce")
            if values.isna().any():
                bad = frame.index[values.isna()]
                raise DataIntegrityError(
                    f"{path}: column {column.name} holds values that are not numbers ({frame[column.name][bad[:3]].tolist()} "
                    f"on lines {(bad[:5] + 1 + banner).tolist()}): the UCI files have no header line and 15 fields a row")
            frame[column.name] = values
    return frame
