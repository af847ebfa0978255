"""King County (Seattle area) house sales, May 2014 - May 2015, as a :class:`TabularDataModule`."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
from sklearn.datasets import fetch_openml

from lightning_dpgan.data.csv_fields import read_dataset_csv, refuse_extra_columns
from lightning_dpgan.data.download import (DataIntegrityError, DatasetNotFoundError, RemoteFile, is_valid_copy, locate,
                                           warn_downloading)
from lightning_dpgan.data.schema import Column, SchemaError, TableSchema
from lightning_dpgan.datamodules.tabular import TabularDataModule

log = logging.getLogger(__name__)

FILE_NAME = "kc_house_data.csv"
OPENML_ID = 42092  # "house_sales": the Kaggle file, 21,613 rows x 21 columns
KAGGLE_URL = "https://www.kaggle.com/datasets/harlfoxem/housesalesprediction"
N_ROWS = 21_613
#: Kaggle's kc_house_data.csv as distributed (2,515,206 bytes), pinned by its content's md5: a
#: copy in --data-dir is the user's and trains as it is, with a warning when it is another (an
#: edited price keeps the row count). Kaggle publishes no checksum; this is the unedited copy's.
KAGGLE_FILE = RemoteFile(FILE_NAME, (KAGGLE_URL,), "b1e7bdf4f3e61792c0979a5697dc7145", 2_515_206)
RAW_COLUMNS = (
    "id", "date", "price", "bedrooms", "bathrooms", "sqft_living", "sqft_lot", "floors", "waterfront", "view",
    "condition", "grade", "sqft_above", "sqft_basement", "yr_built", "yr_renovated", "zipcode", "lat", "long",
    "sqft_living15", "sqft_lot15",
)
DATE_ORIGIN = pd.Timestamp("2014-01-01")

_KAGGLE = "Kaggle description: sales between May 2014 and May 2015"
_ASSESSOR = "King County Assessor's code"
_EXTENT = "King County's extent (US Census TIGER county boundary)"
_WIDE = "no published limit: a generous fixed bound, larger values are clipped"
_AREA = f"whole square feet (the file's format); {_WIDE}"
_LOT = "whole square feet (the file's format); 50 acres (43,560 sq ft each), " + _WIDE

#: The public schema. Bounds come from the dataset's description, the King County Assessor's
#: coding (grade, condition, view), geography (the county's extent, its ZIP code range) and,
#: where no limit is published, generous round bounds stated as such -- never from the rows.
#: ``id`` is dropped (an identifier); ``date`` becomes whole days since 2014-01-01;
#: ``zipcode`` is categorical over every code of the 980/981 ZIP prefixes (98001-98199): a
#: fixed range holding all but two of the county's codes (see its source), so no list is read
#: from the data -- a wide one-hot block (199 slots), but ZIP codes are names, not quantities.
SCHEMA = TableSchema(
    columns=(
        Column(
            "date",
            "integer",
            bounds=(120, 515),
            source=f"days since 2014-01-01; {_KAGGLE} (2014-05-01 = 120, 2015-05-31 = 515)",
        ),
        Column("price", "continuous", bounds=(0.0, 10_000_000.0), step=1.0, source=f"whole US dollars; {_WIDE}"),
        Column("bedrooms", "integer", bounds=(0, 15), source=_WIDE),
        Column("bathrooms", "continuous", bounds=(0.0, 10.0), step=0.25,
               source=f"{_ASSESSOR}: counted in quarters; {_WIDE}"),
        Column("sqft_living", "continuous", bounds=(0.0, 20_000.0), step=1.0, source=_AREA),
        Column("sqft_lot", "continuous", bounds=(0.0, 2_178_000.0), step=1.0, source=_LOT),
        Column("floors", "continuous", bounds=(1.0, 4.0), step=0.5, source=f"{_ASSESSOR}: floors in half steps"),
        Column("waterfront", "categorical", categories=(0, 1), source="0/1 indicator (dataset description)"),
        Column("view", "integer", bounds=(0, 4), source=f"{_ASSESSOR}: view rating 0 (none) to 4 (excellent)"),
        Column("condition", "integer", bounds=(1, 5), source=f"{_ASSESSOR}: building condition 1 (poor) to 5 (very good)"),
        Column("grade", "integer", bounds=(1, 13), source=f"{_ASSESSOR}: building grade 1 to 13"),
        Column("sqft_above", "continuous", bounds=(0.0, 20_000.0), step=1.0, source=_AREA),
        Column("sqft_basement", "continuous", bounds=(0.0, 10_000.0), step=1.0, source=_AREA),
        Column("yr_built", "integer", bounds=(1850, 2015),
               source=f"King County was founded in 1852: a generous round bound below it (older years are clipped); {_KAGGLE}"),
        Column("yr_renovated", "integer", bounds=(0, 2015), source=f"0 = never renovated, else a year; {_KAGGLE}"),
        Column(
            "zipcode",
            "categorical",
            categories=tuple(range(98001, 98200)),
            source="every code of the USPS ZIP prefixes 980/981 (Seattle area), which hold all of King County's "
            "codes but those of Baring (98224) and Skykomish (98288): such rows would be rejected and counted",
        ),
        Column("lat", "continuous", bounds=(47.0, 47.8), source=f"{_EXTENT}: 47.08-47.78 N, padded"),
        Column("long", "continuous", bounds=(-122.6, -121.0), source=f"{_EXTENT}: 122.54-121.07 W, padded"),
        Column("sqft_living15", "continuous", bounds=(0.0, 20_000.0), step=1.0, source=_AREA),
        Column("sqft_lot15", "continuous", bounds=(0.0, 2_178_000.0), step=1.0, source=_LOT),
    ),
    label="price",
    label_kind="continuous",
)


class KingDataModule(TabularDataModule):
    """King County house sales 2014-15: 19 features, regression target price (21,613 rows).

    No official split: a seeded ``test_fraction`` split. The raw file is ``kc_house_data.csv``
    from ``data_dir`` (or its ``king/`` subfolder) in the original Kaggle format; the Kaggle
    download needs a login, so without a local file the same data is fetched from OpenML
    (data id 42092, "house_sales"; scikit-learn checks the file's md5 against OpenML's, and the
    row count and columns are checked here) into the cache. With ``download=False`` only
    ``data_dir`` is used.
    """

    name = "king"
    subdirs = ("king",)
    #: ``encoding="mode-specific"`` defaults. DP-SACTGAN (sec. 4.2) adopts CTAB-GAN+'s column
    #: types (continuous, discrete, mixed, long-tail) but lists no per-column setting for King,
    #: so these follow the columns' public definitions: ``sqft_basement`` 0 means "no
    #: basement" and ``yr_renovated`` 0 "never renovated" (mixed, special value 0); lot areas
    #: and the price, bounded by generous round limits far above typical values, are long-tail
    #: (the continuous label price stays one min-max scalar, taken in log space).
    default_mixed = {"sqft_basement": (0.0,), "yr_renovated": (0.0,)}
    default_log_columns = ("price", "sqft_lot", "sqft_lot15")

    def _build_schema(self) -> TableSchema:
        return SCHEMA

    def prepare_data(self) -> None:
        """Download the OpenML copy into the cache unless a local file is there."""
        if self._local_file() is None:
            warn_downloading(self.name, [FILE_NAME], self.data_dir, self._cache_folder())
            self._fetch_openml()

    def _read_split(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        path = self._local_file()
        raw = read_dataset_csv(path, "the Kaggle kc_house_data.csv") if path is not None else self._fetch_openml()
        if path is not None:
            refuse_extra_columns(raw, RAW_COLUMNS, path, "kc_house_data.csv's", "price")
            if len(raw) != N_ROWS:
                log.warning("king: %s holds %d sales, not the Kaggle file's %d: training on it as it is", path, len(raw),
                            N_ROWS)
            elif not is_valid_copy(path, KAGGLE_FILE):
                log.warning("king: %s is not the canonical %s (its content's md5 differs from %s, with the same number "
                            "of sales): training on it as it is", path, FILE_NAME, KAGGLE_FILE.md5)
        return self._seeded_split(to_schema_frame(raw, str(path or f"OpenML {OPENML_ID}")))

    def _cache_folder(self) -> Path:
        """Where the OpenML copy is kept (the only download: the Kaggle original needs a login)."""
        return self.cache_dir / "openml"

    def raw_file_names(self) -> list[str]:
        """Kaggle's file, looked up in ``data_dir`` (its download is OpenML's copy, in the cache)."""
        return [FILE_NAME]

    def _local_file(self) -> Path | None:
        return locate(FILE_NAME, self.data_dir, self.subdirs) if self.data_dir is not None else None

    def _fetch_openml(self) -> pd.DataFrame:
        """The OpenML copy (scikit-learn reuses its cache in ``cache_dir/openml``)."""
        if not self.hparams.download:
            raise DatasetNotFoundError(
                f"{self._not_found_message([FILE_NAME], 'download=False')} The original is at {KAGGLE_URL}."
            )
        try:
            bunch = fetch_openml(data_id=OPENML_ID, data_home=str(self._cache_folder()), as_frame=True, parser="auto")
        except (OSError, ValueError) as err:
            raise DatasetNotFoundError(
                f"{self._not_found_message([FILE_NAME], f'OpenML {OPENML_ID} unavailable: {err}')} "
                f"The original is at {KAGGLE_URL} (downloading it needs a Kaggle login)."
            ) from err
        frame = bunch.frame
        if len(frame) != N_ROWS:
            raise DataIntegrityError(f"OpenML {OPENML_ID} has {len(frame)} rows, expected {N_ROWS}")
        return frame


def to_schema_frame(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """The raw Kaggle/OpenML columns as the schema's: ``id`` dropped, ``date`` in days since
    2014-01-01, numbers (quoted in the CSV, categories in OpenML) as numbers."""
    missing = [name for name in RAW_COLUMNS if name not in raw.columns]
    if missing:
        raise DataIntegrityError(f"{origin}: columns {missing} missing; is this kc_house_data.csv?")
    frame = raw.drop(columns=["id"])
    try:
        sold = pd.to_datetime(frame["date"].astype(str).str[:8], format="%Y%m%d")
    except ValueError as err:
        raise SchemaError(f"{origin}: column 'date' must hold dates like 20141013T000000: {err}") from err
    frame["date"] = (sold - DATE_ORIGIN).dt.days
    for name in SCHEMA.names:
        if not pd.api.types.is_numeric_dtype(frame[name].dtype):
            try:
                frame[name] = pd.to_numeric(frame[name].astype(str))
            except ValueError as err:  # pandas names the value and its position, not the file or column
                raise DataIntegrityError(f"{origin}: column {name!r} holds a value that is not a number ({err}); "
                                         "is this kc_house_data.csv?") from err
    return frame
