"""The embedded default blob store: a directory on a local (or shared) filesystem, `file:///path`.

Layout under the root:
    blobs/<blob id>          the bytes
    meta/<blob id>.json      {"metadata": {...}, "expires_at_ms": int | null}
    tmp/                     files being written (same filesystem, so renames are atomic)

Writes go to tmp/, are fsynced, then renamed into place (and the parent directory fsynced), so a
crash never leaves a torn blob under its final name. The metadata file of a put is renamed into
place *before* the data, so a blob never exists without its TTL; an orphaned metadata file left by
a crash expires and is removed by sweep_expired like any other.

A blob is never written in place: put() always renames a new file over the name, so a blob file's
inode is immutable once it is under blobs/. That is what lets restore hard-link blob files into a
store's directory (`local_path`): a later put, delete or sweep of the blob only changes the name under
blobs/, never the bytes a restored directory holds. Every file is stored as one blob
(`whole_file_blobs`, option `whole_files`, default true) so every file can be linked.

Blob files are created read-only and private to the owner (`BLOB_MODE`, 0400) before they get their
name, so a restored hard link cannot be written through by a process that honours mode bits, and no
other local user can read backed-up state; this store never chmods or touches a blob file
afterwards. Mode bits do not stop root (CAP_DAC_OVERRIDE), so restore links a blob only when the
process cannot write through it, and copies it otherwise (engine/placing.py). The directories this
store creates (the root included) are 0700 (`DIR_MODE`); a directory that already exists keeps its
mode: this store never changes the mode of anything it did not create. Blobs of an older store
(0444) stay as they are and are read, restored and linked as before.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..common.durable import fsync_dir
from ..errors import BlobExistsError, BlobNotFoundError, BlobStoreError
from .base import BlobInfo, BlobStore, Opener, Sink, check_blob_id

_COPY_BLOCK = 4 * 1024 * 1024

#: Mode of every blob file: read-only, for the owner only, set before the file gets its final name, so
#: no blob is ever writable through a restored hard link by a process that mode bits bind, nor
#: readable by another user (module doc).
BLOB_MODE = 0o400

#: Mode of every directory this store creates (the root, blobs/, meta/, tmp/ and the blob id's
#: subdirectories): only the owner may list or enter them.
DIR_MODE = 0o700


def _make_dirs(path: Path) -> None:
    """Create directory `path` and its missing parents, each with DIR_MODE (the umask may only narrow
    it). Existing directories keep their mode; a name that exists as something else fails later, in
    the operation that needed the directory."""
    missing: list[Path] = []
    while not path.is_dir() and path.parent != path:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by a concurrent writer
            os.mkdir(d, DIR_MODE)


def _create_private(path: Path) -> BinaryIO:
    """A new file at `path` open for writing, created 0600 so that not even its bytes in flight (in a
    tmp/ of an older store, which may be world-readable) are readable by another user."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


class LocalBlobStore(BlobStore):
    """BlobStore on a local directory. `fsync=False` trades crash durability for speed (tests, bench).

    `whole_files` (default True): backups store each file as one blob, so restore can hard-link it;
    False keeps the configured chunking (tests of the chunked path)."""

    def __init__(self, root: Path | str, *, fsync: bool = True, whole_files: bool = True) -> None:
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()
        self.fsync = fsync
        self.whole_file_blobs = whole_files
        self._blobs = self.root / "blobs"
        self._meta = self.root / "meta"
        self._tmp = self.root / "tmp"

    # ---- paths

    def _path(self, base: Path, blob_id: str, suffix: str = "") -> Path:
        try:
            check_blob_id(blob_id)
        except ValueError as e:
            raise BlobStoreError(f"{self.url}: {e}") from None
        return base / (blob_id + suffix)

    def local_path(self, blob_id: str) -> Path | None:
        """blobs/<blob id>: the blob's bytes, an inode this store never writes again (module doc)."""
        return self._path(self._blobs, blob_id)

    @property
    def local_files_durable(self) -> bool:
        return self.fsync

    def _tmp_file(self) -> Path:
        return self._tmp / f"{uuid.uuid4().hex}.tmp"

    # ---- contract

    def ensure_ready(self) -> None:
        try:
            for d in (self._blobs, self._meta, self._tmp):
                _make_dirs(d)
            probe = self._tmp / f"probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise BlobStoreError(f"blob store {self.url} is not a writable directory: {e.strerror}") from None

    def _write_tmp(self, opener: Opener, size: int, blob_id: str) -> Path:
        tmp = self._tmp_file()
        _make_dirs(tmp.parent)
        written = 0
        try:
            with opener() as src, _create_private(tmp) as dst:
                while written < size:
                    block = src.read(min(_COPY_BLOCK, size - written))
                    if not block:
                        break
                    dst.write(block)
                    written += len(block)
                dst.flush()
                os.fchmod(dst.fileno(), BLOB_MODE)
                if self.fsync:
                    os.fsync(dst.fileno())
            if written != size:
                raise BlobStoreError(f"put {blob_id!r}: source ended after {written} of {size} bytes")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _write_meta(
        self, blob_id: str, metadata: Mapping[str, str] | None, expires_at_ms: int | None
    ) -> None:
        path = self._path(self._meta, blob_id, ".json")
        _make_dirs(path.parent)
        tmp = self._tmp_file()
        with _create_private(tmp) as fh:
            fh.write(orjson.dumps({"metadata": dict(metadata or {}), "expires_at_ms": expires_at_ms}))
        os.replace(tmp, path)

    def put(
        self,
        blob_id: str,
        opener: Opener,
        size: int,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        final = self._path(self._blobs, blob_id)
        tmp = self._write_tmp(opener, size, blob_id)
        try:
            expires = None if ttl_seconds is None else int((time.time() + ttl_seconds) * 1000)
            self._write_meta(blob_id, metadata, expires)
            _make_dirs(final.parent)
            os.replace(tmp, final)
            if self.fsync:
                fsync_dir(final.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        import io

        final = self._path(self._blobs, blob_id)
        tmp = self._write_tmp(lambda: io.BytesIO(data), len(data), blob_id)
        try:
            _make_dirs(final.parent)
            # link() refuses an existing target atomically, which rename() would silently replace.
            os.link(tmp, final)
        except FileExistsError:
            raise BlobExistsError(blob_id) from None
        finally:
            tmp.unlink(missing_ok=True)
        self._write_meta(blob_id, metadata, None)
        if self.fsync:
            fsync_dir(final.parent)

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        path = self._path(self._blobs, blob_id)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the with below; open alone maps the error
        except FileNotFoundError:
            raise BlobNotFoundError(blob_id, self.url) from None
        with f:
            total = os.fstat(f.fileno()).st_size
            end = total if length is None else offset + length
            if offset < 0 or end > total:
                raise BlobStoreError(
                    f"blob {blob_id!r} has {total} bytes; range [{offset}, {end}) is outside it"
                )
            f.seek(offset)
            remaining = end - offset
            while remaining:
                block = f.read(min(_COPY_BLOCK, remaining))
                if not block:
                    raise BlobStoreError(f"blob {blob_id!r} shrank while being read")
                sink.write(block)
                remaining -= len(block)
        return end - offset

    def delete(self, blob_id: str) -> None:
        self._path(self._blobs, blob_id).unlink(missing_ok=True)
        self._path(self._meta, blob_id, ".json").unlink(missing_ok=True)

    def _read_meta(self, blob_id: str) -> dict[str, Any]:
        try:
            doc = orjson.loads(self._path(self._meta, blob_id, ".json").read_bytes())
        except FileNotFoundError:
            return {"metadata": {}, "expires_at_ms": None}
        except orjson.JSONDecodeError as e:
            raise BlobStoreError(f"metadata of blob {blob_id!r} is unreadable: {e}") from None
        return doc if isinstance(doc, dict) else {"metadata": {}, "expires_at_ms": None}

    def remove_ttl(self, blob_id: str) -> None:
        if not self._path(self._blobs, blob_id).exists():
            raise BlobNotFoundError(blob_id, self.url)
        meta = self._read_meta(blob_id)
        if meta.get("expires_at_ms") is not None:
            self._write_meta(blob_id, meta.get("metadata") or {}, None)

    def set_ttl(self, blob_id: str, ttl_seconds: float) -> None:
        if not self._path(self._blobs, blob_id).exists():
            raise BlobNotFoundError(blob_id, self.url)
        meta = self._read_meta(blob_id)
        self._write_meta(blob_id, meta.get("metadata") or {}, int((time.time() + ttl_seconds) * 1000))

    def stat(self, blob_id: str) -> BlobInfo:
        try:
            st = self._path(self._blobs, blob_id).stat()
        except FileNotFoundError:
            raise BlobNotFoundError(blob_id, self.url) from None
        meta = self._read_meta(blob_id)
        return BlobInfo(
            blob_id=blob_id,
            size=st.st_size,
            modified_ms=st.st_mtime_ns // 1_000_000,
            expires_at_ms=meta.get("expires_at_ms"),
            metadata=meta.get("metadata") or {},
        )

    def list(self, prefix: str = "") -> Iterator[BlobInfo]:
        # Walk only the subtree the prefix can be in.
        head, _, _ = prefix.rpartition("/")
        start = self._blobs / head if head else self._blobs
        if not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            rel_dir = Path(dirpath).relative_to(self._blobs).as_posix()
            for name in sorted(filenames):
                blob_id = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not blob_id.startswith(prefix):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(os.path.join(dirpath, name))
                    yield BlobInfo(blob_id=blob_id, size=st.st_size, modified_ms=st.st_mtime_ns // 1_000_000)

    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed = 0
        if not self._meta.is_dir():
            return 0
        for dirpath, _, filenames in os.walk(self._meta):
            for name in filenames:
                if not name.endswith(".json"):
                    continue
                meta_path = Path(dirpath) / name
                blob_id = meta_path.relative_to(self._meta).as_posix()[: -len(".json")]
                try:
                    doc = orjson.loads(meta_path.read_bytes())
                except (FileNotFoundError, orjson.JSONDecodeError):
                    continue
                expires = doc.get("expires_at_ms") if isinstance(doc, dict) else None
                if expires is not None and expires <= now and not (keep is not None and keep(blob_id)):
                    self.delete(blob_id)
                    removed += 1
        return removed
