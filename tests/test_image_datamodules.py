"""IDX image datamodules on the tiny synthetic fixture data."""

from __future__ import annotations

import dataclasses

import gzip
import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lightning_dpgan.data.download import DataIntegrityError, DatasetNotFoundError, RemoteFile, content_digest
from lightning_dpgan.data.idx import read_idx
from lightning_dpgan.datamodules.fashion_mnist import FashionMNISTDataModule
from lightning_dpgan.datamodules.images import IDXImageDataModule
from lightning_dpgan.datamodules.mnist import MNISTDataModule

DATAMODULES = [MNISTDataModule, FashionMNISTDataModule]
FILE_NAMES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]


def _ready(cls: type[IDXImageDataModule], data_dir: Path, tmp_path: Path, **kwargs) -> IDXImageDataModule:
    dm = cls(data_dir=data_dir, cache_dir=tmp_path / "cache", download=False, verify_checksums=False, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("cls", DATAMODULES)
def test_the_pinned_sizes_are_of_the_decompressed_idx_files(cls) -> None:
    """60,000 train and 10,000 test records: 16 header bytes + 784 pixels each for images, 8 + 1
    each for labels. The md5s beside them are of the same decompressed bytes (not the gz, whose
    bytes differ between mirrors), 32 hex digits, one per file."""
    expected = {"train-images-idx3-ubyte.gz": 16 + 60_000 * 784, "train-labels-idx1-ubyte.gz": 8 + 60_000,
                "t10k-images-idx3-ubyte.gz": 16 + 10_000 * 784, "t10k-labels-idx1-ubyte.gz": 8 + 10_000}
    files = [remote for split in ("train", "test") for remote in cls.files[split]]
    assert {remote.name: remote.size for remote in files} == expected
    assert all(len(remote.md5) == 32 and int(remote.md5, 16) >= 0 for remote in files)
    assert len({remote.md5 for remote in files}) == 4


@pytest.mark.parametrize("cls", DATAMODULES)
def test_setup_loads_scaled_images_and_keeps_splits_apart(cls, tiny_image_data_dir: Path, tmp_path: Path) -> None:
    dm = _ready(cls, tiny_image_data_dir, tmp_path)
    raw_train = read_idx(tiny_image_data_dir / cls.name / "train-images-idx3-ubyte.gz")
    raw_test = read_idx(tiny_image_data_dir / cls.name / "t10k-images-idx3-ubyte.gz")

    images, labels = dm.train_dataset.tensors
    test_images, test_labels = dm.test_dataset.tensors
    assert images.shape == (160, *cls.data_shape) and images.dtype == torch.float32
    assert test_images.shape == (40, *cls.data_shape)
    assert labels.dtype == torch.int64 and sorted(labels.unique().tolist()) == list(range(10))
    assert images.min() == -1.0 and images.max() == 1.0
    assert torch.allclose(images[:, 0], torch.from_numpy(raw_train).float() / 127.5 - 1)
    assert torch.allclose(test_images[:, 0], torch.from_numpy(raw_test).float() / 127.5 - 1)
    assert dm.train_size == 160
    assert len(cls.classes) == cls.num_classes == 10


def test_train_loader_yields_full_shuffled_batches_of_train_split_only(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    dm = _ready(MNISTDataModule, tiny_image_data_dir, tmp_path, batch_size=48)
    torch.manual_seed(0)

    batches = list(dm.train_dataloader())

    assert [len(x) for x, _ in batches] == [48, 48, 48]  # 160 // 48, remainder dropped
    seen = torch.cat([x for x, _ in batches])
    train, test = dm.train_dataset.tensors[0], dm.test_dataset.tensors[0]
    as_rows = lambda t: {tuple(row.tolist()) for row in IDXImageDataModule.to_uint8(t).flatten(1)}  # noqa: E731
    assert as_rows(seen) <= as_rows(train) and not as_rows(seen) & as_rows(test)
    assert not torch.equal(seen, train[: len(seen)])  # shuffled


def test_test_loader_covers_test_split_in_order(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    dm = _ready(FashionMNISTDataModule, tiny_image_data_dir, tmp_path, batch_size=16)

    batches = list(dm.test_dataloader())

    assert [len(x) for x, _ in batches] == [16, 16, 8]
    assert torch.equal(torch.cat([y for _, y in batches]), dm.test_dataset.tensors[1])


def test_batch_size_larger_than_train_set_is_rejected(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    dm = _ready(MNISTDataModule, tiny_image_data_dir, tmp_path, batch_size=161)

    with pytest.raises(ValueError, match="--batch-size 161 exceeds the 160 training records"):
        dm.train_dataloader()


def test_a_batch_larger_than_each_ddp_process_share_is_rejected(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    """Two processes read 80 of the 160 records each: full batches of 100 would give them none
    (Lightning then stops with "no training batches" and the run would report zero steps)."""
    dm = _ready(MNISTDataModule, tiny_image_data_dir, tmp_path, batch_size=100)
    assert len(dm.train_dataloader()) == 1
    dm.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match=r"--batch-size 100 exceeds the 80 training records each of the 2 processes "
                                         r"reads \(160 in all, of mnist\)"):
        dm.train_dataloader()


@pytest.mark.parametrize("kwargs, flag", [({"batch_size": 0}, "--batch-size"), ({"batch_size": 2.5}, "--batch-size"),
                                          ({"num_workers": -1}, "--data.num_workers")])
def test_invalid_arguments_are_rejected_by_their_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=f"^{flag} must be an integer"):
        MNISTDataModule(**kwargs)


def test_to_uint8_inverts_the_loading_scale(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    dm = _ready(MNISTDataModule, tiny_image_data_dir, tmp_path)
    raw = read_idx(tiny_image_data_dir / "mnist" / "train-images-idx3-ubyte.gz")

    restored = MNISTDataModule.to_uint8(dm.train_dataset.tensors[0])

    assert restored.dtype == torch.uint8
    np.testing.assert_array_equal(restored[:, 0].numpy(), raw)
    assert MNISTDataModule.to_uint8(torch.tensor([-3.0, 0.0, 3.0])).tolist() == [0, 128, 255]


def test_checksum_mismatch_names_file_md5s_and_fix(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    dm = MNISTDataModule(data_dir=tiny_image_data_dir, cache_dir=tmp_path, download=False)
    expected = MNISTDataModule.files["train"][0]
    actual_md5, _ = content_digest(tiny_image_data_dir / "mnist" / expected.name)

    with pytest.raises(DataIntegrityError) as excinfo:
        dm.setup("fit")

    message = str(excinfo.value)
    for part in (expected.name, expected.md5, actual_md5, "--data-dir", "--data.verify_checksums false"):
        assert part in message


def test_another_datasets_official_file_in_the_place_of_this_ones_is_named_for_what_it_is(
        tiny_image_data_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """Fashion-MNIST's files in MNIST's folder: the md5 mismatch says whose file it is."""
    from lightning_dpgan.datamodules.images import known_image_files

    known = known_image_files()  # every pinned file of both datasets, by its md5
    for module in (MNISTDataModule, FashionMNISTDataModule):
        for remote in (remote for pair in module.files.values() for remote in pair):
            assert known[remote.md5] == f"{module.name}'s {remote.name}"
    planted = MNISTDataModule.files["train"][0].name
    md5, size = content_digest(tiny_image_data_dir / "mnist" / planted)
    # the tiny file stands in for Fashion-MNIST's official one: its md5 pinned as Fashion's
    fashion = {split: tuple(dataclasses.replace(remote, md5=md5, size=size) if remote.name == planted else remote
                            for remote in pair) for split, pair in FashionMNISTDataModule.files.items()}
    monkeypatch.setattr(FashionMNISTDataModule, "files", fashion)
    with pytest.raises(DataIntegrityError, match=f"does not match {planted}.*: it is fashion-mnist's {planted}. To fix"):
        MNISTDataModule(data_dir=tiny_image_data_dir, cache_dir=tmp_path, download=False).setup("fit")


def test_missing_files_without_download_name_files_and_data_dir(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    dm = FashionMNISTDataModule(data_dir=tmp_path / "empty", cache_dir=tmp_path / "cache", download=False)

    with pytest.raises(DatasetNotFoundError) as excinfo:
        dm.prepare_data()

    message = str(excinfo.value)
    assert all(name in message for name in FILE_NAMES)
    assert "--data-dir" in message and "LIGHTNING_DPGAN_DATA_DIR" in message
    with pytest.raises(DatasetNotFoundError, match="prepare_data"):
        dm.setup()


def test_mismatched_image_and_label_counts_are_rejected(tiny_image_data_dir: Path, tmp_path: Path, write_idx) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_image_data_dir / "mnist", data_dir)
    write_idx(data_dir / "t10k-labels-idx1-ubyte.gz", np.zeros(39, dtype=np.uint8))

    with pytest.raises(DataIntegrityError, match="do not belong together"):
        _ready(MNISTDataModule, data_dir, tmp_path)


def test_out_of_range_labels_are_rejected(tiny_image_data_dir: Path, tmp_path: Path, write_idx) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_image_data_dir / "mnist", data_dir)
    write_idx(data_dir / "t10k-labels-idx1-ubyte.gz", np.full(40, 10, dtype=np.uint8))

    with pytest.raises(DataIntegrityError, match=r"expected \[0, 9\]"):
        _ready(MNISTDataModule, data_dir, tmp_path)


def _module_pinned_to(source: Path, mirror_bases: list[str]) -> type[IDXImageDataModule]:
    """A datamodule served by ``mirror_bases`` whose pinned checksums are those of ``source``'s files."""
    remotes = [RemoteFile.mirrored(name, mirror_bases, *content_digest(source / name)) for name in FILE_NAMES]
    files = {"train": (remotes[0], remotes[1]), "test": (remotes[2], remotes[3])}
    return type("Tiny", (IDXImageDataModule,), {"name": "tiny", "subdirs": ("tiny",), "files": files})


def test_prepare_data_downloads_verified_files_into_cache(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    source = tiny_image_data_dir / "mnist"
    cls = _module_pinned_to(source, [(tmp_path / "missing").as_uri(), source.as_uri()])
    dm = cls(data_dir=None, cache_dir=tmp_path / "cache", verify_checksums=True)

    dm.prepare_data()
    dm.setup()

    assert sorted(p.name for p in (tmp_path / "cache" / "tiny").iterdir()) == sorted(FILE_NAMES)
    assert dm.train_size == 160 and len(dm.test_dataset) == 40
    digest = lambda p: hashlib.md5(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(tmp_path / "cache" / "tiny" / FILE_NAMES[0]) == digest(source / FILE_NAMES[0])


def test_a_damaged_cached_file_is_downloaded_again_when_downloads_are_allowed(
        tiny_image_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut-off download in the cache is the framework's own file: fetch it again rather than
    tell the user to delete it. Without downloads, the message says to delete it."""
    source = tiny_image_data_dir / "mnist"
    cls = _module_pinned_to(source, [source.as_uri()])
    cache = tmp_path / "cache" / "tiny"
    cls(data_dir=None, cache_dir=tmp_path / "cache").prepare_data()
    damaged = cache / FILE_NAMES[0]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])

    with pytest.raises(DataIntegrityError, match="To fix: delete the file to download it again"):
        cls(data_dir=None, cache_dir=tmp_path / "cache", download=False).setup()
    dm = cls(data_dir=None, cache_dir=tmp_path / "cache")
    dm.prepare_data()
    dm.setup()
    assert damaged.read_bytes() == (source / FILE_NAMES[0]).read_bytes() and dm.train_size == 160


def test_a_damaged_cached_file_that_cannot_be_downloaded_again_is_named(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    """No network and a cut-off file in the cache: the message said only that no mirror could be
    reached, not which file was damaged and stays there."""
    source = tiny_image_data_dir / "mnist"
    _module_pinned_to(source, [source.as_uri()])(data_dir=None, cache_dir=tmp_path / "cache").prepare_data()
    damaged = tmp_path / "cache" / "tiny" / FILE_NAMES[0]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    offline = _module_pinned_to(source, [(tmp_path / "nowhere").as_uri()])(data_dir=None, cache_dir=tmp_path / "cache")
    with pytest.raises(DatasetNotFoundError, match=f"The cached copy {damaged} is damaged .* could not be downloaded "
                                                   "again: delete it, and pass `--data-dir DIR`"):
        offline.setup()


def test_a_damaged_cached_file_in_a_cache_that_cannot_be_written_is_named(tiny_image_data_dir: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only cache holding a cut-off file said only that the cache cannot be written."""
    from lightning_dpgan.data.download import CacheNotWritableError
    from lightning_dpgan.datamodules import images as images_module

    source = tiny_image_data_dir / "mnist"
    _module_pinned_to(source, [source.as_uri()])(data_dir=None, cache_dir=tmp_path / "cache").prepare_data()
    damaged = tmp_path / "cache" / "tiny" / FILE_NAMES[0]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])

    def read_only(remote, cache_dir):
        raise CacheNotWritableError(f"The download cache {cache_dir} cannot be written (Permission denied)")

    monkeypatch.setattr(images_module, "fetch", read_only)
    with pytest.raises(CacheNotWritableError, match=f"cannot be written .*The cached copy {damaged} is damaged .*that cache "
                                                    "cannot be written to replace it"):
        _module_pinned_to(source, [source.as_uri()])(data_dir=None, cache_dir=tmp_path / "cache").setup()


def test_prepare_data_download_failure_explains_how_to_provide_files(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    unreachable = (tmp_path / "nowhere").as_uri()
    dm = _module_pinned_to(tiny_image_data_dir / "mnist", [unreachable])(cache_dir=tmp_path / "cache")

    with pytest.raises(DatasetNotFoundError) as excinfo:
        dm.prepare_data()

    message = str(excinfo.value)
    assert unreachable in message
    # every file still missing (here all four), not only the first, whose download failed
    assert f"Expected: {', '.join(FILE_NAMES)} (or their" in message and "--data-dir" in message
    # one paragraph, its advice said once (the download's own message said to pass --data-dir too)
    assert message.count("--data-dir") == 1 and "\n" not in message
    assert not (tmp_path / "cache").exists()  # the failed download leaves no empty cache folders


@pytest.mark.parametrize(("images", "labels", "message"), [
    (np.zeros((40, 28, 28), dtype=np.float32), np.zeros(40, dtype=np.uint8),
     r"expected uint8 images of shape \(N, 28, 28\), got float32"),
    (np.zeros((40, 32, 32), dtype=np.uint8), np.zeros(40, dtype=np.uint8),
     r"expected uint8 images of shape \(N, 28, 28\), got uint8 of shape \(40, 32, 32\)"),
    (np.zeros((40, 28, 28), dtype=np.uint8), np.zeros((40, 1), dtype=np.uint8),
     r"holds labels of shape \(40, 1\) for the 40 images"),
    # a float class was cut to an integer (3.7 trained as 3), and NaN passed the range check to crash a net
    (np.zeros((40, 28, 28), dtype=np.uint8), np.full(40, 3.7), r"expected integer class labels, got float64"),
    (np.zeros((40, 28, 28), dtype=np.uint8), np.full(40, np.nan), r"expected integer class labels, got float64"),
], ids=["float-pixels", "32x32-images", "2d-labels", "float-labels", "nan-labels"])
def test_idx_files_that_parse_but_are_not_28x28_bytes_and_flat_labels_are_rejected(
        tiny_image_data_dir: Path, tmp_path: Path, write_idx, images, labels, message) -> None:
    """A valid IDX file of another dataset (CIFAR-sized images, float pixels, one-hot-like 2-D
    labels) would otherwise train with the wrong scale or shape instead of being refused."""
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_image_data_dir / "mnist", data_dir)
    write_idx(data_dir / "t10k-images-idx3-ubyte.gz", images)
    write_idx(data_dir / "t10k-labels-idx1-ubyte.gz", labels)

    with pytest.raises(DataIntegrityError, match=message):
        _ready(MNISTDataModule, data_dir, tmp_path)


def test_files_in_the_data_dir_are_preferred_to_the_download_cache(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    """The user's folder wins: a stale cache of other files (here Fashion-MNIST's bytes under
    MNIST's names) must not be what trains when --data-dir holds the files."""
    cache = tmp_path / "cache"
    shutil.copytree(tiny_image_data_dir / "fashion-mnist", cache / "mnist")
    dm = _ready(MNISTDataModule, tiny_image_data_dir, tmp_path)  # its cache_dir is tmp_path / "cache"
    assert (cache / "mnist" / FILE_NAMES[0]).is_file()

    raw = read_idx(tiny_image_data_dir / "mnist" / FILE_NAMES[0])
    assert torch.equal(dm.train_dataset.tensors[0][:, 0], torch.from_numpy(raw).float() / 127.5 - 1)


def test_a_data_dir_file_failing_its_checksum_is_never_replaced_by_a_download(
        tiny_image_data_dir: Path, tmp_path: Path) -> None:
    """Only the framework's own cache is fetched again: a user's file that does not match is an
    error even with downloads allowed (training on a silently downloaded copy would not be the
    data the user pointed at), and nothing is downloaded."""
    source = tiny_image_data_dir / "mnist"
    cls = _module_pinned_to(source, [source.as_uri()])  # a mirror that would serve the right bytes
    mine = tmp_path / "mine"
    shutil.copytree(source, mine / "tiny")
    damaged = mine / "tiny" / FILE_NAMES[0]
    damaged.write_bytes(gzip.compress(gzip.decompress(damaged.read_bytes())[:-1] + b"\x01", mtime=0))

    with pytest.raises(DataIntegrityError, match=f"{damaged} does not match {FILE_NAMES[0]}"):
        cls(data_dir=mine, cache_dir=tmp_path / "cache", download=True).setup()
    assert not (tmp_path / "cache").exists()


def test_a_batch_of_exactly_the_train_split_is_allowed(tiny_image_data_dir: Path, tmp_path: Path) -> None:
    """The limit is the number of records: a batch of all 160 gives one full batch per epoch."""
    dm = _ready(MNISTDataModule, tiny_image_data_dir, tmp_path, batch_size=160)
    assert len(dm.train_dataloader()) == 1


def test_downloads_without_a_data_dir_are_not_warned_about(
        tiny_image_data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The warning says the user's folder lacked the files; with no folder given, downloading is
    the normal path and there is nothing to warn about."""
    source = tiny_image_data_dir / "mnist"
    with caplog.at_level("WARNING"):
        _module_pinned_to(source, [source.as_uri()])(data_dir=None, cache_dir=tmp_path / "cache").prepare_data()
    assert "not found in" not in caplog.text
    assert sorted(p.name for p in (tmp_path / "cache" / "tiny").iterdir()) == sorted(FILE_NAMES)


def test_a_file_the_data_dir_lacks_read_from_the_cache_is_warned_of_as_a_download_is(
        tiny_image_data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """--data-dir held the train files alone: the test files came from an earlier download in the
    cache without a word, so custom training files were scored against the official test split."""
    data_dir, cache = tmp_path / "mine", tmp_path / "cache" / "mnist"
    data_dir.mkdir()
    shutil.copytree(tiny_image_data_dir / "mnist", cache)
    for name in FILE_NAMES[:2]:  # the train images and labels
        shutil.copy(tiny_image_data_dir / "mnist" / name, data_dir / name)
    with caplog.at_level("WARNING"):
        MNISTDataModule(data_dir=data_dir, cache_dir=tmp_path / "cache", verify_checksums=False).prepare_data()
    assert f"{FILE_NAMES[2]}, {FILE_NAMES[3]} not found in {data_dir}" in caplog.text
    assert f"reading the earlier download in {cache}" in caplog.text and FILE_NAMES[0] not in caplog.text
    caplog.clear()  # one folder as both data dir and cache (both variables set alike): found in the data dir
    with caplog.at_level("WARNING"):
        MNISTDataModule(data_dir=tmp_path / "cache", cache_dir=tmp_path / "cache", verify_checksums=False).prepare_data()
    assert "not found in" not in caplog.text
