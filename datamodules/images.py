"""Base LightningDataModule for 28x28 grayscale image datasets stored as IDX files."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dpgan.data.download import (
    DATA_DIR_ENV,
    CacheNotWritableError,
    ContentMismatchError,
    DataIntegrityError,
    DatasetNotFoundError,
    RemoteFile,
    data_folder,
    damaged_cache_message,
    default_cache_dir,
    fetch,
    locate,
    settings_with_text_paths,
    verify_file,
    warn_downloading,
)
from lightning_dpgan.data.dev_split import check_dev_fraction, check_held_out_split, dev_split
from lightning_dpgan.data.idx import read_idx
from lightning_dpgan.distributed import rows_per_process
from lightning_dpgan.data.partition import teacher_partitions
from lightning_dpgan.outputs import images_to_uint8
from lightning_dpgan.privacy.validation import validate_int

log = logging.getLogger(__name__)

_SPLITS = ("train", "test")


def known_image_files() -> dict[str, str]:
    """Every image dataset's official files by md5, so that one put in another's place (a
    Fashion-MNIST file in MNIST's folder) is named for what it is."""
    from lightning_dpgan.datamodules.fashion_mnist import FashionMNISTDataModule
    from lightning_dpgan.datamodules.mnist import MNISTDataModule

    return {**MNISTDataModule.official_files(), **FashionMNISTDataModule.official_files()}


class IDXImageDataModule(L.LightningDataModule):
    """Train/test splits of an IDX image dataset, scaled to [-1, 1] for tanh generators.

    Subclasses only declare where the files live and what they must contain. Files are
    looked up in ``data_dir`` first (also in its ``subdirs``), then in the download cache.
    Only the train split feeds :meth:`train_dataloader`; the test split is kept apart for
    evaluation so it never leaks into (privacy-accounted) training. With ``dev_fraction`` a
    seeded share of the train split is held out of training too, as ``dev_dataset``
    (:mod:`lightning_dpgan.data.dev_split`): settings are chosen on it, not on the test split.
    """

    name: ClassVar[str] = ""
    subdirs: ClassVar[tuple[str, ...]] = ()
    files: ClassVar[dict[str, tuple[RemoteFile, RemoteFile]]] = {}
    classes: ClassVar[list[str]] = []
    data_shape: ClassVar[tuple[int, int, int]] = (1, 28, 28)
    num_classes: ClassVar[int] = 10
    kind: ClassVar[str] = "image"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        download: bool = True,
        verify_checksums: bool = True,
        dev_fraction: float = 0.0,
    ) -> None:
        """
        Args:
            data_dir: folder holding the dataset files (directly or in one of ``subdirs``);
                defaults to ``$LIGHTNING_DPGAN_DATA_DIR``.
            cache_dir: where downloads are stored; defaults to :func:`default_cache_dir`.
            batch_size: records per training batch.
            num_workers: DataLoader worker processes.
            download: fetch missing files from the mirrors; if False, missing files are an error.
            verify_checksums: check each file's decompressed md5 and size before loading.
                Turn off only for deliberately custom files.
            dev_fraction: share of the train split held out of training as ``dev_dataset``
                (0: none); ``evaluate --split dev`` scores a run on it.
        """
        super().__init__()
        validate_int("--batch-size", batch_size, minimum=1)
        validate_int("--data.num_workers", num_workers, minimum=0)
        check_dev_fraction(dev_fraction)
        self.save_hyperparameters()
        settings_with_text_paths(self.hparams)
        self.data_dir = data_folder(data_dir)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.train_dataset: TensorDataset | None = None
        self.test_dataset: TensorDataset | None = None
        self.dev_dataset: TensorDataset | None = None

    @property
    def train_size(self) -> int:
        """Number of training records, the ``n`` in the privacy requirement ``delta < 1/n``."""
        if self.train_dataset is None:
            raise RuntimeError(f"{type(self).__name__}.train_size is known only after setup('fit').")
        return len(self.train_dataset)

    def partitions(self, num_parts: int, seed: int = 0) -> list[torch.Tensor]:
        """Disjoint, covering, sorted index sets of the training images: one per PATE teacher."""
        return teacher_partitions(self.train_size, num_parts, seed)

    def prepare_data(self) -> None:
        """Make every file available locally, downloading into the cache when allowed."""
        missing = [remote for remote in self._remotes() if self._find_local(remote) is None]
        if missing and not self.hparams.download:
            raise DatasetNotFoundError(self._not_found_message("download=False", missing))
        # a file the user's folder lacks comes from the cache as silently as from the network otherwise:
        # custom train files would be scored against the official test files
        cached = [remote.name for remote in self._remotes() if remote not in missing and (
            self.data_dir is None or locate(remote.name, self.data_dir, self.subdirs) is None)]
        warn_downloading(self.name, cached, self.data_dir, self._cache_folder(), cached=True)
        warn_downloading(self.name, [remote.name for remote in missing], self.data_dir, self._cache_folder())
        for remote in missing:
            try:
                fetch(remote, self._cache_folder())
            except DatasetNotFoundError as err:
                raise DatasetNotFoundError(f"{err} {self._not_found_message('download failed', missing)}") from err

    def setup(self, stage: str | None = None) -> None:
        """Load both splits (once) as tensors, the dev records apart from the train split's; the
        rest of the train split alone feeds training."""
        if self.train_dataset is None:
            train = self._load_split("train")
            kept, dev = dev_split(len(train), self.hparams.dev_fraction)
            if len(dev):
                images, labels = train.tensors
                train = TensorDataset(images[kept], labels[kept])
                self.dev_dataset = TensorDataset(images[dev], labels[dev])
            self.train_dataset = train
        if self.test_dataset is None:
            self.test_dataset = self._load_split("test")

    def privacy_cost(self) -> dict[str, Any]:
        """Nothing: pixels are scaled by the fixed map x / 127.5 - 1, which reads no statistic of
        the images (privacy.json's preprocessing says so rather than an unexplained 0)."""
        return {"epsilon": 0.0, "delta": 0.0,
                "mechanism": "fixed pixel scaling to [-1, 1] (reads no statistic of the images)"}

    def train_rows_digest(self) -> str:
        """SHA-256 of the training images and labels as they are trained on (after the dev split).
        The checkpoint keeps it (private, like the images), so that ``evaluate`` can tell that the
        files under a run changed after training: its membership figures would be of other images."""
        self.setup()
        images, labels = self.train_dataset.tensors
        digest = hashlib.sha256(images.contiguous().numpy())  # read in place: MNIST's are 188 MB as float32
        digest.update(labels.contiguous().numpy())
        return digest.hexdigest()

    def held_out(self, split: str = "test") -> TensorDataset:
        """The records a run is scored on: the ``"test"`` split, or the ``"dev"`` records held
        out of the train split (only when the run was trained with ``dev_fraction``)."""
        check_held_out_split(split, self.hparams.dev_fraction, self.name)
        return self._require(self.test_dataset if split == "test" else self.dev_dataset, split)

    def train_dataloader(self) -> DataLoader:
        """Shuffled full batches of the train split (drop_last keeps batch sizes constant)."""
        dataset = self._require(self.train_dataset, "train")
        processes = self.trainer.world_size if self.trainer is not None else 1
        share = rows_per_process(len(dataset), processes)  # the records each DDP process reads
        if share < self.hparams.batch_size:
            records = (f"the {len(dataset)} training records of {self.name}" if processes == 1 else
                       f"the {share} training records each of the {processes} processes reads ({len(dataset)} "
                       f"in all, of {self.name})")
            raise ValueError(f"--batch-size {self.hparams.batch_size} exceeds {records}: pass a smaller --batch-size")
        return self._loader(dataset, shuffle=True, drop_last=True)

    def test_dataloader(self) -> DataLoader:
        """The test split in file order."""
        return self._loader(self._require(self.test_dataset, "test"), shuffle=False, drop_last=False)

    @staticmethod
    def to_uint8(images: torch.Tensor) -> torch.Tensor:
        """Map images in [-1, 1] back to uint8 pixels (inverse of the loading scale)."""
        return torch.from_numpy(images_to_uint8(images))

    def _loader(self, dataset: TensorDataset, shuffle: bool, drop_last: bool) -> DataLoader:
        workers = self.hparams.num_workers
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    def _require(self, dataset: TensorDataset | None, split: str) -> TensorDataset:
        if dataset is None:
            raise RuntimeError(f"The {split} split of {self.name} is not loaded; call setup() first.")
        return dataset

    def _remotes(self) -> list[RemoteFile]:
        return [remote for split in _SPLITS for remote in self.files[split]]

    def raw_file_names(self) -> list[str]:
        """The files looked up in ``data_dir`` (``sample --out`` refuses those found there)."""
        return [remote.name for remote in self._remotes()]

    def _cache_folder(self) -> Path:
        return self.cache_dir / self.name

    def _find_local(self, remote: RemoteFile) -> Path | None:
        """Path of ``remote`` in ``data_dir`` (preferred) or in the download cache, if present."""
        if self.data_dir is not None and (found := locate(remote.name, self.data_dir, self.subdirs)):
            return found
        cached = self._cache_folder() / remote.name
        return cached if cached.is_file() else None

    def _resolve(self, remote: RemoteFile) -> Path:
        """Local path of ``remote``, verified when ``verify_checksums`` is on."""
        path = self._find_local(remote)
        if path is None:
            raise DatasetNotFoundError(self._not_found_message("call prepare_data() first to download them", [remote]))
        if not self.hparams.verify_checksums:
            log.warning("%s: --data.verify_checksums false: %s is read as it is, not checked against the official "
                        "%s", self.name, path, remote.name)
        else:
            try:
                verify_file(path, remote, known_image_files())
            except DataIntegrityError as err:
                in_cache = path == self._cache_folder() / remote.name
                if in_cache and self.hparams.download:  # a damaged download: fetch checks it and downloads it again
                    try:
                        return fetch(remote, self._cache_folder())
                    except (DatasetNotFoundError, CacheNotWritableError) as failed:  # no network, or a cache it
                        # cannot write: the damaged copy is the thing to name
                        said = damaged_cache_message(path, err, self.name, not isinstance(failed, CacheNotWritableError))
                        raise type(failed)(f"{failed} {said}") from failed
                remedy = "delete the file to download it again (or run with downloads allowed), " if in_cache else ""
                custom = (", or, for deliberately custom files, train with `--data.verify_checksums false` (evaluate "
                          "reads a run's files as it was trained)") if isinstance(err, ContentMismatchError) else ""
                raise DataIntegrityError(
                    f"{err} To fix: {remedy}pass `--data-dir DIR` pointing at the official {self.name} files{custom}."
                ) from err
        return path

    @classmethod
    def official_files(cls) -> dict[str, str]:
        """md5 -> "DATASET's FILE" for each file this dataset pins."""
        return {remote.md5: f"{cls.name}'s {remote.name}" for pair in cls.files.values() for remote in pair}

    def _load_split(self, split: str) -> TensorDataset:
        images_remote, labels_remote = self.files[split]
        images_path, labels_path = self._resolve(images_remote), self._resolve(labels_remote)
        images, labels = read_idx(images_path), read_idx(labels_path)
        self._check_arrays(images, labels, images_path, labels_path)
        pixels = torch.from_numpy(images).unsqueeze(1).to(torch.float32) / 127.5 - 1.0
        return TensorDataset(pixels, torch.from_numpy(labels.astype(np.int64)))

    def _check_arrays(self, images: np.ndarray, labels: np.ndarray, images_path: Path, labels_path: Path) -> None:
        """Reject files that parse as IDX but cannot be this dataset's images and labels."""
        if images.dtype != np.uint8 or images.shape[1:] != self.data_shape[1:]:
            raise DataIntegrityError(
                f"{images_path}: expected uint8 images of shape (N, {self.data_shape[1]}, "
                f"{self.data_shape[2]}), got {images.dtype} of shape {images.shape}."
            )
        if not np.issubdtype(labels.dtype, np.integer):  # a float class (3.7, NaN) would be cast or crash a net
            raise DataIntegrityError(f"{labels_path}: expected integer class labels, got {labels.dtype}.")
        if labels.ndim != 1 or len(labels) != len(images):
            raise DataIntegrityError(
                f"{labels_path} holds labels of shape {labels.shape} for the {len(images)} "
                f"images in {images_path}; the files do not belong together."
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise DataIntegrityError(
                f"{labels_path}: labels range over [{labels.min()}, {labels.max()}], "
                f"expected [0, {self.num_classes - 1}]."
            )

    def _not_found_message(self, reason: str, missing: list[RemoteFile]) -> str:
        expected = ", ".join(remote.name for remote in missing)
        where = [str(self.data_dir)] if self.data_dir else []
        where.append(str(self._cache_folder()))
        return (
            f"{self.name} files not found ({reason}). Expected: {expected} "
            f"(or their un-gzipped forms). Searched: {', '.join(where)}. Pass `--data-dir DIR` "
            f"(or set {DATA_DIR_ENV}) pointing at a folder holding them, directly or in a "
            f"subfolder named one of {list(self.subdirs)}."
        )
