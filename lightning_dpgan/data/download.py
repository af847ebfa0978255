"""Locating, downloading and verifying dataset files.

Datasets are identified by the checksum of their *decompressed* content rather than of the
compressed bytes: the same data is distributed both as the canonical ``.gz`` files and as
recompressed copies (e.g. Debian's ``dataset-fashion-mnist``), and both must be accepted.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import logging
import lzma
import os
import shutil
import tarfile
import tempfile
import time
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from lightning_dpgan.error_text import first_line

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "LIGHTNING_DPGAN_CACHE_DIR"
DATA_DIR_ENV = "LIGHTNING_DPGAN_DATA_DIR"
DOWNLOAD_TIMEOUT_S = 30.0
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


class DataIntegrityError(RuntimeError):
    """A dataset file exists but its content is not what it should be."""


class DatasetNotFoundError(FileNotFoundError):
    """A dataset file is neither available locally nor downloadable."""


class CacheNotWritableError(OSError):
    """The download cache cannot be made or written: a local problem, not the network's."""


#: a download's temporary file whose last write is older than this is left over by a killed run
#: (a download in progress writes to its file at least every read timeout)
STALE_PART_S = 3600.0


@dataclass(frozen=True)
class RemoteFile:
    """A downloadable file, pinned by the md5 and size of its decompressed content.

    ``urls`` are full URLs of the same file on different mirrors, tried in order.
    """

    name: str
    urls: tuple[str, ...]
    md5: str
    size: int

    @classmethod
    def mirrored(cls, name: str, mirrors: Iterable[str], md5: str, size: int) -> RemoteFile:
        """Build a file served under the same ``name`` by every mirror base URL."""
        return cls(name, tuple(base.rstrip("/") + "/" + name for base in mirrors), md5, size)


def default_cache_dir() -> Path:
    """Where downloads go: ``$LIGHTNING_DPGAN_CACHE_DIR``, else ``~/.cache/lightning_dpgan``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lightning_dpgan"


def default_data_dir() -> Path | None:
    """A user-provided folder of local dataset files: ``$LIGHTNING_DPGAN_DATA_DIR``, if set."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else None


def data_folder(data_dir: str | os.PathLike[str] | None) -> Path | None:
    """``data_dir`` (else ``$LIGHTNING_DPGAN_DATA_DIR``) as a folder that exists, or ``None``.

    A folder that does not exist (a typo) is refused: the files would otherwise be downloaded
    instead, or looked for in the cache, with nothing telling the user their own were not read."""
    if data_dir is not None and not str(data_dir).strip():  # Path("") is the current folder, in silence
        raise DatasetNotFoundError(f"--data-dir is empty: give a folder, or leave it out (${DATA_DIR_ENV} is used then)")
    folder = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if folder is not None and not folder.is_dir():
        given = "--data-dir" if data_dir is not None else f"${DATA_DIR_ENV}"
        raise DatasetNotFoundError(f"{given} {folder} is not a folder: pass the folder that holds the dataset's files "
                                   "(directly or in a subfolder named after the dataset)")
    return folder


def settings_with_text_paths(hparams: MutableMapping[str, Any]) -> None:
    """Turn a datamodule's path settings (``data_dir=Path(...)``) into text, in place. Lightning
    saves the settings in every checkpoint, and a ``pathlib.Path`` there is a pickled class that
    torch's ``weights_only`` loading refuses: Lightning's own resume (``trainer.fit(...,
    ckpt_path=...)``) and the commands' checkpoint reader could not read the checkpoint of a
    library user who passed one."""
    for key, value in hparams.items():
        if isinstance(value, os.PathLike):
            hparams[key] = os.fspath(value)


def warn_downloading(dataset: str, names: Sequence[str], data_dir: Path | None, cache: Path,
                     cached: bool = False) -> None:
    """Say, as a warning, that files not found in the user's data folder are downloaded (or, with
    ``cached``, read from an earlier download): the run then trains on the canonical files, not
    on copies the user may think it read."""
    if data_dir is not None and names:
        log.warning("%s: %s not found in %s (nor its subfolder %s): %s %s", dataset, ", ".join(names), data_dir,
                    dataset, "reading the earlier download in" if cached else "downloading into", cache)


def compression_of(path: str | os.PathLike[str]) -> str | None:
    """``"gzip"`` when ``path`` holds gzip data, else None: by magic bytes, not by extension, so a
    raw file named ``*.gz`` (or a gzip file without the suffix) is read as what it is."""
    with open(path, "rb") as probe:
        return "gzip" if probe.read(2) == _GZIP_MAGIC else None


def open_decompressed(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading, transparently gunzipping it when it is gzip data."""
    return gzip.open(path, "rb") if compression_of(path) else open(path, "rb")


#: what a damaged or cut compressed file raises as it is read (pandas reads .gz, .bz2, .xz, .zip and
#: .tar by their name's ending); gzip's "Not a gzipped file" and bz2's "Invalid data stream" are
#: OSErrors too, without the errno that the file system's own errors carry
_DECOMPRESSION_ERRORS = (EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, tarfile.TarError)


@contextlib.contextmanager
def damaged_compression_refused(path: str | os.PathLike[str], refusal: type[Exception], remedy: str) -> Iterator[None]:
    """Within the block (a read of ``path``), a compressed file that cannot be decompressed to its
    end is refused as ``refusal`` naming the file and ``remedy``, instead of the decompressor's
    traceback. The file system's own errors (permissions, a full disk) pass as they are."""
    try:
        yield
    except (*_DECOMPRESSION_ERRORS, OSError) as err:
        if isinstance(err, OSError) and err.errno is not None:
            raise
        raise refusal(f"{path} cannot be decompressed ({first_line(err)}): it is damaged or cut short, or not "
                      f"compressed as its name says; {remedy}") from err


def content_digest(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Return ``(md5 hex, size)`` of the decompressed content of ``path``.

    A corrupt or truncated gzip stream raises :class:`DataIntegrityError` naming the file.
    """
    md5, size = hashlib.md5(), 0
    with open_decompressed(path) as stream:
        try:
            while chunk := stream.read(_CHUNK):
                md5.update(chunk)
                size += len(chunk)
        except (*_DECOMPRESSION_ERRORS, OSError) as err:  # the same decompressor errors as a table read
            raise DataIntegrityError(f"{path} is not a readable gzip file: {err}.") from err
    return md5.hexdigest(), size


class ContentMismatchError(DataIntegrityError):
    """A file read whole whose content is not the one pinned (a damaged file raises its parent)."""


def verify_file(path: str | os.PathLike[str], remote: RemoteFile,
                known: dict[str, str] | None = None) -> None:
    """Raise :class:`DataIntegrityError` unless ``path`` decompresses to ``remote``'s content;
    ``known`` (md5 -> what file has it) names a file put in another's place."""
    md5, size = content_digest(path)
    if md5 != remote.md5 or size != remote.size:
        which = f": it is {known[md5]}" if known and md5 in known else ""
        raise ContentMismatchError(
            f"{path} does not match {remote.name}: expected decompressed md5 {remote.md5} "
            f"({remote.size} bytes), got md5 {md5} ({size} bytes){which}."
        )


def locate(name: str, data_dir: str | os.PathLike[str], subdirs: Sequence[str]) -> Path | None:
    """Find ``name`` (or its un-gzipped form, or a gzipped copy ``name.gz``) in
    ``data_dir/<subdir>/`` or ``data_dir/``.

    Subfolders are searched first so that a folder holding several datasets side by side
    (``mnist/``, ``fashion-mnist/``) resolves each file to its own dataset.
    """
    root = Path(data_dir).expanduser()
    names = [name, name.removesuffix(".gz") if name.endswith(".gz") else name + ".gz"]
    for folder in [*(root / sub for sub in subdirs), root]:
        for candidate in names:
            if (folder / candidate).is_file():
                return folder / candidate
    return None


def fetch(remote: RemoteFile, cache_dir: str | os.PathLike[str]) -> Path:
    """Return ``cache_dir/remote.name``, downloading it from the first mirror that works.

    An existing valid file is reused. Each download goes to a temporary file that is only
    renamed into place (atomically) once verified, so an interrupted or corrupt download
    never leaves a file that looks complete.
    """
    folder = Path(cache_dir).expanduser()
    dest = folder / remote.name
    if dest.is_file() and is_valid_copy(dest, remote):
        return dest
    made = _writable_cache(folder)
    _remove_stale_parts(folder, remote.name)
    failures = []
    for url in remote.urls:
        try:
            _download_verified(url, remote, dest)
            return dest
        except (OSError, ValueError, http.client.HTTPException, DataIntegrityError) as err:
            log.warning("Download of %s from %s failed: %s", remote.name, url, err)
            failures.append(f"{url}: {err}")
    _remove_if_empty(made)
    tried = "; ".join(failures) or "no mirrors configured"
    # the callers add where to put the file instead: each knows the folders it searched
    raise DatasetNotFoundError(f"Could not download {remote.name} from any mirror ({tried}).")


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; return those made, deepest first, so that a failed
    download can take them away again rather than leave an empty cache behind."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _writable_cache(folder: Path) -> list[Path]:
    """:func:`_make_folders`, then a probe that a file can be written there: a read-only or
    unmakeable cache is named as such, not reported as every mirror failing."""
    try:
        made = _make_folders(folder)
    except OSError as err:
        raise CacheNotWritableError(_unwritable(folder, err)) from err
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        _remove_if_empty(made)
        raise CacheNotWritableError(_unwritable(folder, err)) from err
    return made


def _unwritable(folder: Path, err: OSError) -> str:
    return (f"The download cache {folder} cannot be written ({err.strerror or err}): set ${CACHE_DIR_ENV} (or "
            "`--data.cache_dir`) to a folder you can write, or pass `--data-dir DIR` pointing at a folder that "
            "holds the dataset's files.")


def _remove_stale_parts(folder: Path, name: str) -> None:
    """Remove the temporary files a killed download of ``name`` left (none is ever trusted), but not
    one another process is writing now: only those untouched for :data:`STALE_PART_S`."""
    now = time.time()
    for part in folder.glob(f".{name}.*.part"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()


def damaged_cache_message(path: Path, err: DataIntegrityError, dataset: str, writable: bool = True) -> str:
    """What to say of a cached copy that fails its checksum and could not be downloaded again (the
    file is there, so "not found" would mislead), or, in a cache that cannot be written
    (``writable`` False), could not be replaced: deleting it there may not be the user's to do."""
    if not writable:
        return (f"The cached copy {path} is damaged ({err}), and that cache cannot be written to replace it: pass "
                f"`--data-dir DIR` pointing at the official {dataset} files, or another cache ({CACHE_DIR_ENV} or "
                "--data.cache_dir)")
    return (f"The cached copy {path} is damaged ({err}) and could not be downloaded again: delete it, and pass "
            f"`--data-dir DIR` pointing at the official {dataset} files")


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are still empty; one that holds anything stays."""
    for path in folders:
        try:
            path.rmdir()
        except OSError:
            return


def is_valid_copy(path: Path, remote: RemoteFile) -> bool:
    """Whether ``path`` decompresses to ``remote``'s content."""
    try:
        verify_file(path, remote)
    except DataIntegrityError:
        return False
    return True


def _download_verified(url: str, remote: RemoteFile, dest: Path) -> None:
    """Download ``url`` next to ``dest``, verify it, then atomically move it onto ``dest``."""
    from lightning_dpgan.outputs import file_creation_mask  # outputs imports torch: not for every command's --help

    log.info("Downloading %s from %s", remote.name, url)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{remote.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            shutil.copyfileobj(resp, out, _CHUNK)
        verify_file(tmp, remote)
        os.chmod(tmp, 0o666 & ~file_creation_mask())  # mkstemp's 0600 would keep a shared cache from other users
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
