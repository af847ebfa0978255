"""Base LightningDataModule for tables encoded by a public :class:`TableSchema`."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dpgan.data.download import (
    DATA_DIR_ENV,
    DatasetNotFoundError,
    RemoteFile,
    default_cache_dir,
    default_data_dir,
    fetch,
    locate,
    verify_file,
)
from lightning_dpgan.data.partition import teacher_partitions
from lightning_dpgan.data.schema import EncodingReport, TableSchema

log = logging.getLogger(__name__)

PUBLIC_SCHEMA_COST: dict[str, Any] = {"epsilon": 0.0, "delta": 0.0, "mechanism": "public schema"}


class TabularDataModule(L.LightningDataModule):
    """Rows of a table encoded into [0, 1] vectors by a public schema, label included.

    Subclasses say where the raw rows come from (:meth:`_read_split`) and what the schema is
    (:meth:`_build_schema`). The flow keeps the test split away from everything private:

    1. the raw rows are split into train/test -- a dataset's official split, or a seeded
       permutation that depends only on the row count and ``split_seed``;
    2. only the train split is encoded (:meth:`TableSchema.encode`) into ``train_dataset``,
       a ``TensorDataset`` of one tensor, so batches are ``[records]``;
    3. ``test_frame`` stays a raw DataFrame for evaluation; it is never encoded or trained on.

    GANs here generate whole rows (the label is one of the encoded columns), hence
    ``num_classes = None``. ``data_shape`` comes from the schema, without reading records for a
    built-in dataset.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "table"
    num_classes: ClassVar[int | None] = None
    #: Subfolders of ``data_dir`` searched (before ``data_dir`` itself) for the raw files.
    subdirs: ClassVar[tuple[str, ...]] = ()
    #: Files downloaded by :meth:`prepare_data` when missing; empty for other sources.
    files: ClassVar[tuple[RemoteFile, ...]] = ()

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        download: bool = True,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ) -> None:
        """
        Args:
            data_dir: folder holding the raw files (directly or in one of ``subdirs``);
                defaults to ``$LIGHTNING_DPGAN_DATA_DIR``.
            cache_dir: where downloads are stored; defaults to ``$LIGHTNING_DPGAN_CACHE_DIR``
                or ``~/.cache/lightning_dpgan``.
            batch_size: records per training batch.
            num_workers: DataLoader worker processes.
            download: fetch missing files from the canonical source; if False, missing files
                are an error.
            test_fraction: share of rows held out for evaluation (datasets with an official
                split ignore it).
            split_seed: seed of the train/test permutation (ignored with an official split).
        """
        super().__init__()
        _check_int("batch_size", batch_size, minimum=1)
        _check_int("num_workers", num_workers, minimum=0)
        _check_int("split_seed", split_seed, minimum=0)
        if not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        self.save_hyperparameters()
        self.data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.train_frame: pd.DataFrame | None = None
        self.test_frame: pd.DataFrame | None = None
        self.train_dataset: TensorDataset | None = None
        self._schema: TableSchema | None = None
        self._report: EncodingReport | None = None

    # --- what subclasses provide -------------------------------------------------------------

    def _read_split(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Raw ``(train, test)`` frames restricted to the schema's columns, not encoded."""
        raise NotImplementedError

    def _build_schema(self) -> TableSchema:
        """The dataset's schema; built-ins return a constant written from public sources."""
        raise NotImplementedError

    # --- schema and shapes -------------------------------------------------------------------

    @property
    def schema(self) -> TableSchema:
        """The schema that encodes and decodes records (built once, on first use)."""
        if self._schema is None:
            self._schema = self._build_schema()
        return self._schema

    @property
    def data_shape(self) -> tuple[int]:
        return (self.schema.encoded_dim,)

    def privacy_cost(self) -> dict[str, Any]:
        """Privacy spent on preprocessing, to add to training's: nothing for a public schema."""
        return dict(PUBLIC_SCHEMA_COST)

    # --- Lightning hooks ---------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Make every raw file available locally, downloading into the cache when allowed."""
        for remote in self.files:
            self._resolve(remote)

    def setup(self, stage: str | None = None) -> None:
        """Split the rows (once) and encode the train split alone into ``train_dataset``."""
        if self.train_dataset is not None:
            return
        self._load_frames()
        records, self._report = self.schema.encode(self.train_frame)
        self.train_dataset = TensorDataset(records)
        log.info("%s train split: %s", self.name, self._report.summary())

    def train_dataloader(self) -> DataLoader:
        """Shuffled batches of encoded train records; full batches only when there are enough."""
        dataset = self._require_dataset()
        workers = self.hparams.num_workers
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            drop_last=len(dataset) >= self.hparams.batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    # --- results -----------------------------------------------------------------------------

    @property
    def train_size(self) -> int:
        """Number of encoded training records, the ``n`` in the privacy requirement ``delta < 1/n``."""
        return len(self._require_dataset())

    @property
    def encoding_report(self) -> dict[str, Any]:
        """Clip/reject counts of encoding the train split (private statistics: do not publish)."""
        if self._report is None:
            raise RuntimeError(f"{type(self).__name__}.encoding_report is known only after setup().")
        return self._report.to_dict()

    def decode(self, records: torch.Tensor) -> pd.DataFrame:
        """Encoded (e.g. generated) records back to a DataFrame with the original columns."""
        return self.schema.decode(records)

    def partitions(self, num_parts: int, seed: int = 0) -> list[torch.Tensor]:
        """Disjoint index sets of the train records that together cover them (PATE teachers).

        A seeded shuffle cut into ``num_parts`` parts whose sizes differ by at most one
        (:func:`~lightning_dpgan.data.partition.disjoint_partitions`); each part is sorted. Each
        record is in exactly one part, which PATE's analysis relies on.
        """
        _check_int("num_parts", num_parts, minimum=1)
        return teacher_partitions(self.train_size, num_parts, seed)

    # --- helpers for subclasses --------------------------------------------------------------

    def _load_frames(self) -> None:
        if self.train_frame is None:
            self.train_frame, self.test_frame = self._read_split()

    def _seeded_split(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """A fixed train/test split by a permutation seeded with ``split_seed``.

        It depends on the row count alone (not on values), and keeps each frame's index (the
        row number in the file), so the split is reproducible and checkable.
        """
        n_rows = len(frame)
        n_test = int(round(n_rows * self.hparams.test_fraction))
        if not 0 < n_test < n_rows:
            raise ValueError(
                f"{self.name}: test_fraction={self.hparams.test_fraction} leaves {n_test} of {n_rows} rows for "
                "testing; both splits need at least one row"
            )
        order = np.random.default_rng(self.hparams.split_seed).permutation(n_rows)
        return frame.iloc[np.sort(order[n_test:])], frame.iloc[np.sort(order[:n_test])]

    def _resolve(self, remote: RemoteFile) -> Path:
        """Local path of ``remote``, downloading it when missing and allowed.

        A file in ``data_dir`` is the user's and is taken as is (its content is still checked
        by the schema); cached and downloaded copies are verified by md5 and size.
        """
        if self.data_dir is not None and (found := locate(remote.name, self.data_dir, self.subdirs)):
            return found
        cached = self._cache_folder() / remote.name
        if cached.is_file() and not self.hparams.download:
            verify_file(cached, remote)
            return cached
        if not self.hparams.download:
            raise DatasetNotFoundError(self._not_found_message([remote.name], "download=False"))
        try:
            return fetch(remote, self._cache_folder())
        except DatasetNotFoundError as err:
            raise DatasetNotFoundError(f"{err}\n{self._not_found_message([remote.name], 'download failed')}") from err

    def _cache_folder(self) -> Path:
        return self.cache_dir / self.name

    def _not_found_message(self, names: list[str], reason: str) -> str:
        where = [str(self.data_dir)] if self.data_dir else []
        where.append(str(self._cache_folder()))
        return (
            f"{self.name} files not found ({reason}). Expected: {', '.join(names)}. Searched: "
            f"{', '.join(where)}. Pass `--data-dir DIR` (or set {DATA_DIR_ENV}) pointing at a folder "
            f"holding them, directly or in a subfolder named one of {list(self.subdirs)}."
        )

    def _require_dataset(self) -> TensorDataset:
        if self.train_dataset is None:
            raise RuntimeError(f"{type(self).__name__}: the train split is not loaded; call setup() first.")
        return self.train_dataset


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
