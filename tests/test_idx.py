"""IDX reading and file download/verification."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from lightning_dpgan.data import download
from lightning_dpgan.data.download import (
    CacheNotWritableError,
    DataIntegrityError,
    DatasetNotFoundError,
    RemoteFile,
    default_cache_dir,
    default_data_dir,
    fetch,
    locate,
    verify_file,
)
from lightning_dpgan.data.idx import read_idx


@pytest.mark.parametrize("name", ["images-idx3-ubyte.gz", "images-idx3-ubyte"])
def test_read_idx_round_trips_uint8_images(tmp_path: Path, write_idx, name: str) -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    path = write_idx(tmp_path / name, images)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")

    loaded = read_idx(path)

    assert loaded.dtype == np.uint8 and loaded.shape == (5, 28, 28)
    np.testing.assert_array_equal(loaded, images)


def test_read_idx_round_trips_labels_and_wide_big_endian_types(tmp_path: Path, write_idx) -> None:
    labels = np.array([3, 1, 4, 1, 5, 9], dtype=np.uint8)
    wide = np.array([[1, -2], [70000, -70000]], dtype=np.int32)

    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "labels-idx1-ubyte.gz", labels)), labels)
    loaded_wide = read_idx(write_idx(tmp_path / "wide.idx", wide))
    assert loaded_wide.dtype.isnative
    np.testing.assert_array_equal(loaded_wide, wide)


def test_read_idx_rejects_truncated_payload_naming_the_file(tmp_path: Path, write_idx) -> None:
    path = write_idx(tmp_path / "full", np.zeros((4, 28, 28), dtype=np.uint8))
    truncated = tmp_path / "truncated-idx3-ubyte"
    truncated.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(DataIntegrityError, match="truncated-idx3-ubyte"):
        read_idx(truncated)


def test_read_idx_rejects_a_payload_longer_than_its_header(tmp_path: Path, write_idx) -> None:
    """Bytes past the announced shape are damage too (two files joined, a wrong header)."""
    path = write_idx(tmp_path / "full", np.zeros((4, 28, 28), dtype=np.uint8))
    padded = tmp_path / "padded-idx3-ubyte"
    padded.write_bytes(path.read_bytes() + b"\0" * 10)

    with pytest.raises(DataIntegrityError, match="padded-idx3-ubyte: header announces shape .* holds 3146 payload bytes"):
        read_idx(padded)


def test_read_idx_rejects_truncated_gzip_stream(tmp_path: Path, write_idx) -> None:
    path = write_idx(tmp_path / "full.gz", np.arange(4000, dtype=np.uint8).reshape(4000 // 4, 4) % 7)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])

    with pytest.raises(DataIntegrityError, match="cut.gz"):
        read_idx(cut)


def test_read_idx_rejects_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "not-idx"
    path.write_bytes(b"PK\x03\x04" + bytes(100))

    with pytest.raises(DataIntegrityError, match="bad magic"):
        read_idx(path)


def _remote_for(content: bytes, name: str, urls: tuple[str, ...] = ()) -> RemoteFile:
    return RemoteFile(name, urls, hashlib.md5(content).hexdigest(), len(content))


def test_verify_file_checks_decompressed_content_whatever_the_compression(tmp_path: Path) -> None:
    content = b"\x00\x00\x08\x01" + bytes(range(200))
    remote = _remote_for(content, "data.gz")
    fast, best, raw = tmp_path / "fast.gz", tmp_path / "best.gz", tmp_path / "raw"
    fast.write_bytes(gzip.compress(content, compresslevel=1))
    best.write_bytes(gzip.compress(content, compresslevel=9, mtime=12345))
    raw.write_bytes(content)
    assert fast.read_bytes() != best.read_bytes()

    for path in (fast, best, raw):
        verify_file(path, remote)
    raw.write_bytes(content[:-1] + b"\xff")
    with pytest.raises(DataIntegrityError, match=f"{re.escape(str(raw))}.*expected decompressed md5 {remote.md5}"):
        verify_file(raw, remote)


def test_locate_prefers_subdirs_and_accepts_ungzipped_names(tmp_path: Path) -> None:
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    (tmp_path / "MNIST" / "raw" / "a-idx1-ubyte").write_bytes(b"x")
    (tmp_path / "a-idx1-ubyte.gz").write_bytes(b"x")
    (tmp_path / "b-idx1-ubyte.gz").write_bytes(b"x")

    assert locate("a-idx1-ubyte.gz", tmp_path, ("mnist", "MNIST/raw")) == tmp_path / "MNIST/raw/a-idx1-ubyte"
    assert locate("b-idx1-ubyte.gz", tmp_path, ("mnist",)) == tmp_path / "b-idx1-ubyte.gz"
    assert locate("c-idx1-ubyte.gz", tmp_path, ("mnist",)) is None


def test_default_dirs_follow_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_DPGAN_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(tmp_path / "d"))
    assert (default_cache_dir(), default_data_dir()) == (tmp_path / "c", tmp_path / "d")

    monkeypatch.delenv("LIGHTNING_DPGAN_CACHE_DIR")
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "lightning_dpgan"
    assert default_data_dir() is None


@pytest.fixture
def mirrors(tmp_path: Path) -> dict[str, Path]:
    """Three file:// mirror folders: one empty, one serving good bytes, one serving corrupt bytes."""
    folders = {kind: tmp_path / "mirrors" / kind for kind in ("empty", "good", "corrupt")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    content = b"payload " * 1000
    (folders["good"] / "f.gz").write_bytes(gzip.compress(content))
    (folders["corrupt"] / "f.gz").write_bytes(gzip.compress(content[:-1] + b"!"))
    return folders


def _mirrored_remote(mirrors: dict[str, Path], *kinds: str) -> RemoteFile:
    return RemoteFile.mirrored("f.gz", [mirrors[k].as_uri() for k in kinds], hashlib.md5(b"payload " * 1000).hexdigest(), 8000)


def test_fetch_falls_back_to_the_next_mirror(tmp_path: Path, mirrors: dict[str, Path]) -> None:
    cache = tmp_path / "cache"

    path = fetch(_mirrored_remote(mirrors, "empty", "good"), cache)

    assert path == cache / "f.gz"
    assert path.read_bytes() == (mirrors["good"] / "f.gz").read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == ["f.gz"]


def test_fetch_rejects_corrupt_mirror_and_leaves_nothing_behind(tmp_path: Path, mirrors: dict[str, Path]) -> None:
    cache = tmp_path / "cache"
    remote = _mirrored_remote(mirrors, "corrupt", "empty")

    with pytest.raises(DatasetNotFoundError) as excinfo:
        fetch(remote, cache)

    message = str(excinfo.value)
    assert "f.gz" in message and "\n" not in message  # one line; the datamodule adds where to put the file
    assert all(url in message for url in remote.urls)
    assert not cache.exists()  # the cache folder the failed download made is taken away again


def test_a_failed_download_keeps_a_cache_folder_that_was_there_or_holds_other_files(
        tmp_path: Path, mirrors: dict[str, Path]) -> None:
    remote = _mirrored_remote(mirrors, "corrupt")
    cache = tmp_path / "shared"
    cache.mkdir()
    with pytest.raises(DatasetNotFoundError):
        fetch(remote, cache / "adult")
    assert list(cache.iterdir()) == []  # 'adult' was made and taken away; 'shared' was there before
    (cache / "mnist").mkdir()
    (cache / "mnist" / "other.gz").write_bytes(b"x")
    with pytest.raises(DatasetNotFoundError):
        fetch(remote, cache / "mnist")
    assert (cache / "mnist" / "other.gz").read_bytes() == b"x"


def test_fetch_reuses_valid_cache_and_replaces_corrupt_cache(
    tmp_path: Path, mirrors: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    remote = _mirrored_remote(mirrors, "good")
    cache.mkdir()
    (cache / "f.gz").write_bytes(b"stale partial download")

    fetch(remote, cache)
    assert (cache / "f.gz").read_bytes() == (mirrors["good"] / "f.gz").read_bytes()

    monkeypatch.setattr(download.urllib.request, "urlopen", lambda *a, **k: pytest.fail("re-downloaded"))
    assert fetch(remote, cache) == cache / "f.gz"


def test_a_cache_that_cannot_be_written_is_named_and_no_mirror_is_tried(
        tmp_path: Path, mirrors: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only or unmakeable cache read as "could not download from any mirror", each mirror's
    failure being the temporary file's, and sent the user to look at the network."""
    import errno

    monkeypatch.setattr(download.urllib.request, "urlopen", lambda *a, **k: pytest.fail("a mirror was contacted"))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(CacheNotWritableError, match=r"download cache .*a_file/mnist cannot be written .*"
                                                    r"LIGHTNING_DPGAN_CACHE_DIR.*--data.cache_dir.*--data-dir"):
        fetch(_mirrored_remote(mirrors, "good"), tmp_path / "a_file" / "mnist")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(download.tempfile, "TemporaryFile", read_only)
    with pytest.raises(CacheNotWritableError, match=r"cache .*new/mnist cannot be written \(Read-only file system\)"):
        fetch(_mirrored_remote(mirrors, "good"), tmp_path / "new" / "mnist")
    assert not (tmp_path / "new").exists()  # the folders it made for nothing are taken away


def test_a_killed_downloads_leftover_is_removed_but_not_one_being_written(tmp_path: Path, mirrors: dict[str, Path]) -> None:
    import os
    import time

    cache = tmp_path / "cache"
    cache.mkdir()
    stale, live = cache / ".f.gz.abc123.part", cache / ".f.gz.def456.part"
    stale.write_bytes(b"half")
    live.write_bytes(b"half")
    long_ago = time.time() - download.STALE_PART_S - 60
    os.utime(stale, (long_ago, long_ago))
    # a download that waits on a slow mirror writes at least once a read timeout: ten of them is no leftover
    paused = time.time() - 10 * download.DOWNLOAD_TIMEOUT_S
    os.utime(live, (paused, paused))
    fetch(_mirrored_remote(mirrors, "good"), cache)
    assert not stale.exists() and live.read_bytes() == b"half"


def test_a_download_gets_the_usual_file_permissions_not_mkstemps(tmp_path: Path, mirrors: dict[str, Path]) -> None:
    """A cache shared by several users (LIGHTNING_DPGAN_CACHE_DIR) must stay readable by them."""
    import os

    old = os.umask(0o022)
    try:
        path = fetch(_mirrored_remote(mirrors, "good"), tmp_path / "cache")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_data_dir_that_is_not_a_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo would otherwise download the files (or read the cache) with nothing said."""
    with pytest.raises(DatasetNotFoundError, match=r"--data-dir .*mnsit is not a folder"):
        download.data_folder(tmp_path / "mnsit")
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(DatasetNotFoundError, match=r"\$LIGHTNING_DPGAN_DATA_DIR .*gone is not a folder"):
        download.data_folder(None)
    assert download.data_folder(tmp_path) == tmp_path
    monkeypatch.delenv("LIGHTNING_DPGAN_DATA_DIR")
    assert download.data_folder(None) is None


def test_files_missing_from_the_data_dir_are_downloaded_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from lightning_dpgan.datamodules.mnist import MNISTDataModule

    fetched = []
    monkeypatch.setattr("lightning_dpgan.datamodules.images.fetch", lambda remote, cache: fetched.append(remote.name))
    (tmp_path / "mine").mkdir()
    with caplog.at_level("WARNING"):
        MNISTDataModule(data_dir=tmp_path / "mine", cache_dir=tmp_path / "cache").prepare_data()
    assert len(fetched) == 4
    assert f"not found in {tmp_path / 'mine'}" in caplog.text and "downloading into" in caplog.text


def test_read_idx_rejects_nonzero_leading_bytes_even_with_a_known_type_code(tmp_path: Path, write_idx) -> None:
    """The magic number's first two bytes must be zero: a file starting ``01 02 08 01`` has a valid
    type and dimension count after them, but is not IDX data and must not be read as 8-bit values."""
    good = write_idx(tmp_path / "good", np.arange(4, dtype=np.uint8)).read_bytes()
    bad = tmp_path / "not-idx-but-close"
    bad.write_bytes(b"\x01\x02" + good[2:])

    with pytest.raises(DataIntegrityError, match="not-idx-but-close is not an IDX file: bad magic number 0x01020801"):
        read_idx(bad)


@pytest.mark.parametrize("content", [b"", b"\x00\x00\x08"], ids=["empty", "three-bytes"])
def test_read_idx_rejects_a_file_shorter_than_the_magic_number(tmp_path: Path, content: bytes) -> None:
    """An empty or cut-off download is named as such, not left to fail inside ``struct``."""
    path = tmp_path / "stub-idx1-ubyte"
    path.write_bytes(content)

    expected = f"stub-idx1-ubyte is too short to be an IDX file ({len(content)} bytes)"
    with pytest.raises(DataIntegrityError, match=re.escape(expected)):
        read_idx(path)


def test_read_idx_rejects_a_header_cut_inside_its_dimensions(tmp_path: Path) -> None:
    """Magic says 3 dimensions (12 bytes of sizes) but only one size follows."""
    path = tmp_path / "cut-header-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + (5).to_bytes(4, "big"))

    with pytest.raises(DataIntegrityError, match="cut-header-idx3-ubyte: IDX header is truncated"):
        read_idx(path)


def test_read_idx_reads_type_0x09_as_signed_bytes(tmp_path: Path, write_idx) -> None:
    """0x09 is signed: 0xFF is -1, not 255."""
    values = np.array([-128, -1, 0, 1, 127], dtype=np.int8)
    path = write_idx(tmp_path / "signed.idx", values)
    assert path.read_bytes()[2] == 0x09

    loaded = read_idx(path)

    assert loaded.dtype == np.int8
    np.testing.assert_array_equal(loaded, values)


def test_a_header_whose_shape_overflows_an_int64_is_refused_naming_the_file(tmp_path: Path) -> None:
    """(2^31, 2^31, 4) elements wrap an int64 product to 0, which an empty payload then matched:
    numpy's reshape error named no file. The byte count is Python's, exact."""
    path = tmp_path / "forged-idx3-ubyte"
    path.write_bytes((0x0803).to_bytes(4, "big") + b"".join(size.to_bytes(4, "big") for size in (2**31, 2**31, 4)))
    with pytest.raises(DataIntegrityError, match=f"{path.name}: header announces shape .* \\({2**64} payload bytes\\)"):
        read_idx(path)
