"""Any CSV file as a :class:`TabularDataModule`, with a public schema or a DP-estimated one."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lightning_dpgan.data.csv_fields import (
    ExtraFieldsError,
    leading_zero_counts,
    may_hold_leading_zeros,
    read_csv_fields,
)
from lightning_dpgan.data.csv_missing import missing_lookalikes, missing_spellings
from lightning_dpgan.data.download import damaged_compression_refused
from lightning_dpgan.data.dp_bounds import SCHEMA_MECHANISM as DP_SCHEMA_MECHANISM, check_listed_columns, infer_schema_dp
from lightning_dpgan.data.schema import (LABEL_KINDS, SchemaError, TableSchema, as_flag_value, as_schema_categories,
                                         booleans_refusal, check_numeric_values, column_names, comma_numbers, header_hint,
                                         holds_booleans, non_numeric_values, row_examples)
from lightning_dpgan.datamodules.tabular import TabularDataModule
from lightning_dpgan.error_text import first_line
from lightning_dpgan.privacy.validation import validate_delta, validate_positive

log = logging.getLogger(__name__)

AUTO = "auto"
#: The budget of the DP schema estimate when no schema file is given and no flag sets it.
DEFAULT_BOUNDS_EPSILON = 0.1
DEFAULT_BOUNDS_DELTA = 1e-6
#: the fewest categories a declared list must have for setup to warn that it reads like one
#: taken from the records (with half as many as the training rows, or more)
RECORD_LIKE_CATEGORIES = 10
#: the fewest training rows for setup to warn of a whole-number column that reads like a record ID
#: (a different value in each row, filling at least half their range)
RECORD_LIKE_INTEGERS = 100


class CSVDataModule(TabularDataModule):
    """Any CSV file (--data.csv PATH --data.target COL): public schema file or DP-estimated bounds.

    With ``schema`` (a YAML/JSON :class:`TableSchema` file), the file alone decides column kinds,
    bounds, categories, the label kind and dropped columns, and preprocessing costs no privacy.
    Without it, the schema is estimated from the *train split* under
    (``bounds_epsilon``, ``bounds_delta``)-DP (:func:`infer_schema_dp`: Laplace histogram bounds,
    stability-based category lists, the budget split evenly over the columns); that cost is
    reported by :meth:`privacy_cost` and must be added to training's. The estimate runs once,
    on first use of ``schema`` (``data_shape`` included), with fresh noise each time a
    datamodule is built. The label kind is never guessed from the data (that would read it):
    take it from the schema file or pass ``label_kind``.
    """

    name = "csv"
    reads_data_dir = False

    def __init__(
        self,
        csv: str | os.PathLike[str] | None = None,
        target: str | None = None,
        categorical: Sequence[str] | str | None = None,
        schema: str | os.PathLike[str] | None = None,
        label_kind: str = AUTO,
        integer: Sequence[str] | str | None = None,
        drop: Sequence[str] | str | None = None,
        bounds_epsilon: float | None = None,
        bounds_delta: float | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            csv: path of the CSV file (header row, one record per line).
            target: the label column (taken from the schema file when omitted there).
            categorical: categorical columns, a list or a comma-separated string (a
                binary/categorical target is categorical anyway). Only without ``schema``.
            schema: path of a public schema file; then no privacy is spent on preprocessing.
            label_kind: ``binary``, ``categorical`` or ``continuous``; ``auto`` means "as in
                the schema file" and is an error without one.
            integer: numeric columns to decode as integers (only without ``schema``).
            drop: columns to ignore, e.g. identifiers (only without ``schema``, which has its
                own ``drop`` list).
            bounds_epsilon: ε spent estimating the schema, default ``DEFAULT_BOUNDS_EPSILON`` (only
                without ``schema``: with a schema file nothing is estimated, and a budget for it
                is refused rather than ignored).
            bounds_delta: δ spent on the category lists, default ``DEFAULT_BOUNDS_DELTA`` (only
                without ``schema``).
            **kwargs: :class:`TabularDataModule` arguments (batch size, split, ...).
        """
        super().__init__(**kwargs)
        if csv is None:
            raise ValueError("the csv dataset needs the file: pass --data.csv PATH")
        self.csv_path = Path(csv).expanduser()
        if kwargs.get("data_dir") is not None:
            log.warning("csv: --data-dir %s is not read: the csv dataset reads the file --data.csv names, %s",
                        kwargs["data_dir"], self.csv_path)
        self.categorical = column_names(categorical, "--data.categorical")
        self.integer = column_names(integer, "--data.integer")
        self.drop = column_names(drop, "--data.drop")
        self._bounds_cost: dict[str, Any] | None = None
        if schema is not None:
            _refuse_estimate_budget_with_a_schema(bounds_epsilon, bounds_delta)
            self._schema = self._public_schema(TableSchema.load(schema), target, label_kind)
            self.target, self.label_kind = self._schema.label, self._schema.label_kind
            self.drop = list(self._schema.drop)
        else:
            if target is None:
                raise ValueError("the csv dataset needs the label column: pass --data.target COL (a column named null "
                                 "or ~, which YAML reads as no value, passed quoted: --data.target '\"null\"')")
            if label_kind not in LABEL_KINDS:
                given = f"{label_kind!r}, the default, which takes it from a schema file" if label_kind == AUTO else repr(label_kind)
                raise ValueError(
                    f"without a schema file (--data.schema), label_kind must be one of {LABEL_KINDS}: pass "
                    f"--data.label_kind (got {given}); it is not guessed from the data, which would read private values"
                )
            self.target, self.label_kind = target, label_kind
            bounds_epsilon = DEFAULT_BOUNDS_EPSILON if bounds_epsilon is None else bounds_epsilon
            bounds_delta = DEFAULT_BOUNDS_DELTA if bounds_delta is None else bounds_delta
            _check_bounds_budget(bounds_epsilon, bounds_delta)
        self.bounds_epsilon = bounds_epsilon
        self.bounds_delta = bounds_delta

    def _public_schema(self, schema: TableSchema, target: str | None, label_kind: str) -> TableSchema:
        """Check that the other arguments do not contradict the schema file, then use it."""
        given = {"categorical": self.categorical, "integer": self.integer, "drop": self.drop}
        conflicting = [name for name, value in given.items() if value]
        if conflicting:
            raise ValueError(f"{conflicting} cannot be combined with a schema file, which defines the columns")
        if schema.label is None:
            raise SchemaError("the schema file names no label column; set 'label' and 'label_kind' in it")
        if target is not None and target != schema.label:
            raise ValueError(f"target='{target}' contradicts the schema file's label '{schema.label}'")
        if label_kind not in (AUTO, schema.label_kind):
            raise ValueError(f"label_kind='{label_kind}' contradicts the schema file's '{schema.label_kind}'")
        if schema.released_by_a_dp_estimate:
            log.warning("the schema file's columns come from a DP estimate (their source says so), released by an "
                        "earlier run: this run spends nothing on it, and its privacy.json does not hold that "
                        "estimate's epsilon. The rows' total is this run's plus that run's (docs/privacy.md)")
        return schema

    def _build_schema(self) -> TableSchema:
        """Estimate the schema from the train split under DP (only reached without a schema file)."""
        self._load_frames()
        schema, self._bounds_cost = infer_schema_dp(
            self.train_frame,
            self.target,
            self.categorical,
            self.bounds_epsilon,
            self.bounds_delta,
            self.label_kind,
            integer=self.integer,
        )
        return schema

    def _categorical_columns(self) -> list[str]:
        """The columns read as text: the schema file's categorical ones, or those declared (and a
        class label). Letting pandas type them from the rows would let one record change how
        every other record in its column reads ("0101" is 101 until some row holds "A1")."""
        if self._schema is not None:
            return [column.name for column in self._schema.columns if not column.is_numeric]
        return [*self.categorical, *([self.target] if self.label_kind in ("binary", "categorical") else [])]

    @property
    def estimates_schema(self) -> bool:
        """True until a schema exists: without a schema file, using it runs a DP estimate."""
        return self._schema is None

    def _released_schema(self) -> dict[str, Any] | None:
        """The schema the DP estimate released (this run's or a restored one), else None."""
        return self._schema.to_dict() if self._bounds_cost is not None else None

    def restore_schema(self, schema: TableSchema, cost: dict[str, Any] | None) -> None:
        """Use a schema released by an earlier run of the same training (a resume), and the
        privacy its estimate cost (already spent once: reported, never spent again).

        ``cost`` is the estimate's cost, or that run's composed :meth:`privacy_cost` (with a
        mode-specific encoding), whose ``parts["schema"]`` is taken."""
        if self._schema is not None:
            return  # a public schema file: nothing was estimated, nothing to restore
        if schema.label != self.target:
            raise ValueError(f"the checkpoint's schema has label '{schema.label}', this run --data.target '{self.target}'")
        if cost and "parts" in cost:
            cost = cost["parts"].get("schema")
        if not cost or "epsilon" not in cost:
            raise ValueError("the checkpoint does not record what its schema estimate cost: resuming would "
                             "under-report epsilon. Start a new run, or give a public --data.schema file.")
        self._schema, self._bounds_cost = schema, dict(cost)

    def _schema_cost(self) -> dict[str, Any]:
        """Nothing with a schema file; else the (ε, δ) spent by the DP schema estimate (which
        :meth:`privacy_cost` composes with a mode-specific encoding's cost)."""
        _ = self.schema  # runs the estimate if it has not run yet
        return dict(self._bounds_cost) if self._bounds_cost is not None else super()._schema_cost()

    def _planned_schema_cost(self) -> dict[str, Any]:
        """The DP estimate's (ε, δ) before it runs: δ goes to the category lists, which the label
        (unless continuous) and any --data.categorical column have."""
        if not self.estimates_schema:
            return super()._schema_cost() if self._bounds_cost is None else dict(self._bounds_cost)
        categories = self.label_kind != "continuous" or bool(self.categorical)
        return {"epsilon": float(self.bounds_epsilon), "delta": float(self.bounds_delta) if categories else 0.0,
                "mechanism": DP_SCHEMA_MECHANISM, "neighbours": "add-remove"}

    def prepare_data(self) -> None:
        """Check that the file exists (a user's CSV is never downloaded)."""
        if self.csv_path.is_dir():
            raise FileNotFoundError(f"--data.csv {self.csv_path} is a folder: pass the CSV file in it")
        if not self.csv_path.is_file():
            raise FileNotFoundError(f"CSV file not found: {self.csv_path}; pass the path of an existing file "
                                    "with --data.csv")

    def _read_split(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        self.prepare_data()
        frame = _read_csv(self.csv_path, self._categorical_columns())
        self._warn_of_missing_value_lookalikes(frame)
        if self._schema is None:  # the flags name columns: a typo said first, not as a column's values
            check_listed_columns(frame, self.target, self.categorical, self.integer, self.drop)
        self._refuse_what_numeric_columns_cannot_hold(frame)
        self._warn_of_leading_zeros(frame)
        if self._schema is not None:
            frame = as_schema_categories(frame, self._schema)
        missing = [name for name in self.drop if name not in frame.columns]  # a schema file's drop list, a resume's
        if missing:
            raise SchemaError(f"columns to drop {missing} are not in {self.csv_path} (columns: {list(frame.columns)})"
                              f"{header_hint(frame, missing)}")
        if [name for name in frame.columns if name not in self.drop] == [self.target]:
            # refused before any DP release: QUAIL's refusal came after the estimate, and a
            # one-column run trained, spent, and failed at evaluate in scikit-learn's words
            left = " once --data.drop's columns are left out" if self.drop and self._schema is None else ""
            raise SchemaError(f"the label '{self.target}' is the only column of {self.csv_path} to train on{left}: a "
                              "synthetic table needs features beside its label (the evaluation learns the label from "
                              "them, QUAIL's synthesizer trains on them). Keep at least one feature column")
        return self._seeded_split(frame.drop(columns=self.drop))

    def _warn_of_missing_value_lookalikes(self, frame: pd.DataFrame) -> None:
        """A categorical column holding ``NA``, ``null``, ``?`` ...: read as categories (a text
        field is missing only when empty, as ``None`` of a smoker column or ``NA`` of a region are
        categories), where the data holder may have meant a missing value, which is refused. A
        schema file listing the value declares it a category. For the data holder: the spellings
        are read from the private rows."""
        declared = {column.name: set(column.categories or ()) for column in self._schema.columns} if self._schema else {}
        for name in self._categorical_columns():
            held = set(frame[name].dropna().unique()) - declared.get(name, set()) if name in frame.columns else set()
            if name not in self.drop and (found := missing_lookalikes(held)):
                log.warning("%s: column '%s' holds %s, which other tools write for a missing value: in a categorical "
                            "column only an empty field is missing, so %s a category of its own here. If a missing "
                            "value is meant, leave the field empty (refused, with its rows) or remove those rows",
                            self.name, name, ", ".join(map(repr, found)), "it is" if len(found) == 1 else "each is")

    def _warn_of_leading_zeros(self, frame: pd.DataFrame) -> None:
        """A whole-number column written with leading zeros, as codes are (ZIP codes, account or
        product codes): read as numbers, '05258' becomes 5258, trains as a quantity, and
        synthetic.csv writes it without the zero. Said by count, never by value. The text is gone
        once pandas reads numbers: a scan of the file's bytes rules most files out at once, and
        otherwise the columns read as integers are read again as text, a chunk at a time. Counted
        over the file's rows, held-out ones included. For the data holder: read from the private rows."""
        names = [name for name in frame.columns if name != self.target and name not in self.drop
                 and pd.api.types.is_integer_dtype(frame[name])]
        if not names or not may_hold_leading_zeros(self.csv_path):
            return
        for name, zeros in leading_zero_counts(self.csv_path, names).items():
            if zeros:
                remedy = ("declare it categorical in the schema file" if self._schema is not None
                          else f"list it with --data.categorical {as_flag_value(name)}")
                log.warning("%s: column '%s' is read as whole numbers, but %d of the file's values in it are written "
                            "with a leading zero, as codes are (ZIP, account, product codes): the zeros are lost, the "
                            "column trains as a quantity and synthetic.csv writes it without them. If it is a code, %s",
                            self.name, name, zeros, remedy)

    def setup(self, stage: str | None = None) -> None:
        first = self.train_dataset is None
        super().setup(stage)
        if first:
            self._warn_of_record_like_category_lists()
            self._warn_of_identifier_like_integers()

    def _warn_of_record_like_category_lists(self) -> None:
        """A declared (public) category list at least half as long as the training rows, and
        :data:`RECORD_LIKE_CATEGORIES` long: it reads like one taken from the records (an ID,
        a name column put in a schema file), and synthetic.csv releases its values as they are,
        which the guarantee does not cover (it is for the records, the schema being public). A
        DP estimate's lists are thresholded, so never hold one record's value. For the data
        holder: the row count is read from the private rows. A CSV's alone: the built-in
        datasets' schemas are the datasets' documented ones."""
        if self._bounds_cost is not None:  # this run's DP estimate (or a resume's)
            return
        rows = self._report.rows_in
        for column in self.schema.columns:
            listed = len(column.categories or ())
            if column.from_dp_estimate or listed < max(RECORD_LIKE_CATEGORIES, rows / 2):
                continue
            log.warning("%s: the schema lists %d categories for column '%s', half or more of the %d training rows: a "
                        "list that long reads like one taken from the records (IDs, names), and synthetic.csv "
                        "releases its values as they are. The guarantee covers the records, the schema being "
                        "public: keep such a list only if it is public knowledge, else drop the column (the "
                        "schema's drop list)", self.name, listed, column.name, rows)

    def _warn_of_identifier_like_integers(self) -> None:
        """A whole-number feature holding another value in every training row, as a record ID
        does: it trains as a number, and its synthetic values, drawn over the same range, mostly
        equal real rows' IDs (97 % of them for IDs 1..n), so a reader may take synthetic rows for
        real people's. Nothing is leaked by it (the values are the schema's range), but the column
        carries nothing a synthetic table needs. For the data holder: read from the private rows."""
        rows = len(self.train_frame)
        if rows < RECORD_LIKE_INTEGERS:  # a small table's ages or counts may all differ and fill their range
            return
        for column in self.schema.columns:
            values = self.train_frame[column.name] if column.kind == "integer" else None
            if (values is not None and column.name != self.schema.label and values.nunique() == rows
                    and int(values.max()) - int(values.min()) < 2 * rows):  # Python ints: no int64 overflow
                log.warning("%s: column '%s' holds a different whole number in each of the %d training rows, filling "
                            "their range as a record ID does: its synthetic values are drawn over the same range, so "
                            "many will equal a real row's, and a reader may take synthetic rows for real people's. "
                            "Drop it if it identifies the records (--data.drop, or the schema file's drop list)",
                            self.name, column.name, rows)

    def _refuse_what_numeric_columns_cannot_hold(self, frame: pd.DataFrame) -> None:
        """Text, booleans, ±inf, a fraction in an integer column or a number beyond 64 bits in a
        numeric column, found in every row of the file before it is split and before any DP
        estimate reads it: checked on the training split alone, a value in a held-out row was
        refused only by ``evaluate``, after the budget was spent, or reported as "in other rows
        of the file", without the value or the row."""
        if self._schema is not None:
            if not set(self._schema.names) <= set(frame.columns):
                return  # other columns than the schema's: validate_frame says which, first
            numeric = [column.name for column in self._schema.columns if column.is_numeric]
        else:  # the flags' names were checked first (check_listed_columns): the target is there
            text = set(self._categorical_columns()) | set(self.drop)
            numeric = [name for name in frame.columns if name not in text]
        for name in (name for name in numeric if holds_booleans(frame[name])):  # before a DP estimate reads them
            kind = "numeric" if self._schema is None else self._schema.column(name).kind
            raise booleans_refusal(name, kind, estimated=self._schema is None, label=name == self.target)
        for name in (name for name in numeric if frame[name].dtype == object):
            bad = non_numeric_values(frame[name])
            if bad.empty:
                continue
            gaps = int(frame[name].isna().sum())  # read as missing ('', 'n/a'): said now, not in a second refusal
            values = f"({row_examples(bad)}){f' and {gaps} missing values' if gaps else ''}"
            if set(missing_lookalikes(bad)) == {str(value).strip() for value in bad}:
                raise SchemaError(f"column '{name}' holds {values}: a missing value as some files write it (UCI's "
                                  f"Adult writes '?'), and a numeric column cannot hold missing values: drop or impute "
                                  f"those rows first (e.g. pandas.read_csv(path, na_values=['?']).dropna() then "
                                  f".to_csv(new_path, index=False))")
            if comma_numbers(bad):
                kind = "numeric" if self._schema is None else self._schema.column(name).kind
                raise SchemaError(f"column '{name}' is {kind} but holds numbers written with a comma {values}, as "
                                  "thousands separators or decimal commas: write them without (e.g. "
                                  "pandas.read_csv(path, thousands=',') for separators, decimal=',' for decimal "
                                  "commas, then .to_csv(new_path, index=False)), checking which the file means")
            if self._schema is not None:
                kind = self._schema.column(name).kind
                raise SchemaError(f"column '{name}' is {kind} but holds non-numeric values {values}: "
                                  "fix those values in the data, or declare the column categorical in the schema if it is")
            if name == self.target:  # the label can be neither listed as categorical nor dropped
                raise SchemaError(f"the label '{name}' is {self.label_kind} but holds non-numeric values {values}: fix "
                                  "those values in the data, or give the label's kind with --data.label_kind binary or "
                                  "--data.label_kind categorical if it is a class")
            raise SchemaError(f"column '{name}' holds non-numeric values {values}: fix those values in the "
                              f"data, list the column with --data.categorical {as_flag_value(name)} if it is categorical, "
                              f"or leave it out with --data.drop {as_flag_value(name)} (a date or free text)")
        for name in numeric:
            kind = (self._schema.column(name).kind if self._schema is not None
                    else "integer" if name in self.integer else "continuous")
            check_numeric_values(name, kind, frame[name], estimated=self._schema is None)


def _refuse_estimate_budget_with_a_schema(epsilon: Any, delta: Any) -> None:
    """A schema file means nothing is estimated, so a budget for the estimate would be ignored:
    the user who set it believes some privacy was spent there, or that the bounds come from the
    data. Refuse it by its flags, before the file is read."""
    given = [flag for flag, value in (("--data.bounds_epsilon", epsilon), ("--data.bounds_delta", delta))
             if value is not None]
    if given:
        raise ValueError(f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} the budget of the DP estimate of "
                         "the schema, and --data.schema gives the schema: nothing is estimated, so nothing would be "
                         f"spent. Drop {' and '.join(given)}, or drop --data.schema to estimate the bounds and "
                         "categories from the data")


def _check_bounds_budget(epsilon: Any, delta: Any) -> None:
    """The DP schema estimate's budget, refused by its flags before the file is read."""
    validate_positive("--data.bounds_epsilon", epsilon)
    validate_delta(delta, flag="--data.bounds_delta")


def _read_csv(path: Path, text_columns: Sequence[str] = ()) -> pd.DataFrame:
    """The file's rows, ``text_columns`` as text (missing only when empty: ``None`` or ``NA`` may be
    a category, :mod:`~lightning_dpgan.data.csv_missing`), refusing an empty, header-only,
    unparseable or binary file by name."""
    try:
        with damaged_compression_refused(f"CSV file {path}", SchemaError,
                                         "copy it again, or give the uncompressed CSV file"):
            header = _header_names(path)
            frame = read_csv_fields(path, dtype={name: str for name in text_columns if name in header},
                                    keep_default_na=False, na_values=missing_spellings(header, text_columns))
    except pd.errors.EmptyDataError as err:
        raise SchemaError(f"CSV file {path} is empty: it needs a header row of column names, then one record "
                          "per line") from err
    except ExtraFieldsError as err:
        raise SchemaError(str(err)) from err
    except UnicodeDecodeError as err:
        kind = _not_text_kind(path)
        if kind is not None:
            raise SchemaError(f"CSV file {path} is not a CSV text file: it is {kind}") from err
        raise SchemaError(f"CSV file {path} is not UTF-8 text ({err.reason} at byte {err.start}): save it as UTF-8 "
                          "(e.g. 'CSV UTF-8' in a spreadsheet, or iconv -f cp1252 -t utf-8 for a file saved on "
                          "Windows: cp1252 reads latin-1's letters too, and its own, such as '€', which latin-1 "
                          "would turn into invisible control characters)") from err
    except pd.errors.ParserError as err:
        reason = " ".join(str(err).split())  # pandas' message ends in a newline
        raise SchemaError(f"CSV file {path} cannot be read as a CSV table ({reason}); check that it is the right "
                          "file, with the same number of fields on every line") from err
    except ImportError as err:  # pandas needs an optional package for some compressions (zstandard for .zst)
        raise SchemaError(f"CSV file {path} is compressed in a format that needs a package not installed here "
                          f"({first_line(err)}): install it, or give the uncompressed CSV file") from err
    if frame.empty:
        raise SchemaError(f"CSV file {path} has a header ({', '.join(map(str, frame.columns))}) but no records: "
                          "add one record per line after it")
    return frame


#: What a file that is not text starts with, and what to tell its owner (pandas reads a
#: compressed file by its name's ending: ``data.csv.gz`` is read, ``data.csv`` holding gzip is not)
_FILE_SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed: name it with the .gz ending (e.g. data.csv.gz) or decompress it"),
    (b"PK\x03\x04", "a zip archive (an Excel .xlsx workbook is one): export the sheet as 'CSV UTF-8', "
                     "or unzip the CSV file"),
    (b"\xff\xfe\x00\x00", "UTF-32 text: save it as UTF-8 ('CSV UTF-8' in a spreadsheet, or iconv -f utf-32 -t utf-8)"),
    (b"\x00\x00\xfe\xff", "UTF-32 text: save it as UTF-8 ('CSV UTF-8' in a spreadsheet, or iconv -f utf-32 -t utf-8)"),
    (b"\xff\xfe", "UTF-16 text: save it as UTF-8 ('CSV UTF-8' in a spreadsheet, or iconv -f utf-16 -t utf-8)"),
    (b"\xfe\xff", "UTF-16 text: save it as UTF-8 ('CSV UTF-8' in a spreadsheet, or iconv -f utf-16 -t utf-8)"),
)


def _not_text_kind(path: Path) -> str | None:
    """What a file that pandas could not decode is, from its first bytes, with the fix; None if
    it is none of the known kinds."""
    with open(path, "rb") as handle:
        start = handle.read(4)
    return next((kind for signature, kind in _FILE_SIGNATURES if start.startswith(signature)), None)


def _header_names(path: Path) -> list[str]:
    """The column names of the file's header as written, refusing a name given twice: pandas
    would rename the second ``a`` to ``a.1``, and the synthetic table would come back under a
    name the file never had. Read as pandas reads the file (compression, UTF-8)."""
    first_row = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)  # 'NA' may be a name
    names = first_row.iloc[0].tolist() if len(first_row) else []
    if names and str(names[0]).strip().lower().startswith("sep="):  # Excel's separator line, before the header
        raise SchemaError(f"CSV file {path} starts with Excel's separator line ({names[0]!r}), not the header: remove "
                          "that first line, so that the column names come first")
    unnamed = [position + 1 for position, name in enumerate(names) if not str(name).strip()]
    if unnamed:  # pandas would call it 'Unnamed: 0', a name the file never had, and train on it
        cause = ("a comma at the end of every line, as some spreadsheets export? Remove the trailing commas"
                 if unnamed == [len(names)] else
                 "a saved row index, as pandas' to_csv writes without index=False?" if unnamed == [1] else
                 "a header cell left empty?")
        raise SchemaError(f"CSV file {path} has no name for column {', '.join(map(str, unnamed))} of its header "
                          f"({cause}): name it in the header, or save the file without it")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise SchemaError(f"CSV file {path} names the columns {repeated} more than once in its header: give each "
                          "column its own name")
    return names
