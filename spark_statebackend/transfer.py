"""Chunked, checksummed, parallel file transfer between local files and a BlobStore.

One bounded, named thread pool (`TransferPool`) carries every chunk of every file; callers submit a
whole batch of work and wait for it as a group (`run_all`): the first failure cancels what has not
started, waits for what is running (no future is left behind on any path), and re-raises.

- Upload: a file larger than `chunk_size` becomes several FileBlobs. Each chunk's CRC32C is computed
  from the very bytes the store reads (ChecksumReader); if a store SDK seeks around inside the stream,
  the checksum is recomputed from the file instead of being trusted.
- Download: each chunk is written at its offset with pwrite by its own task, its CRC32C computed as
  it is written and compared with the stored one; a mismatch raises ChecksumError naming the file
  and blob. Chunks of one file arrive out of order; completion of a file is only declared by the
  caller once all its chunks succeeded.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, cast

from . import crashpoints
from .blobstore import BlobStore, Opener
from .checksum import ChecksumReader, ChecksumWriter, checksum_range, chunk_layout, file_checksum, format_crc
from .errors import ChecksumError, StateBackendError
from .index import FileBlob, FileIndex, FileMetadata

T = TypeVar("T")

DEFAULT_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_WORKERS = 8


class Progress(Protocol):
    """Told the total, then bytes as chunks finish; the CLI shows a bar, tests count, the default ignores."""

    def start(self, total_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


class NoProgress:
    def start(self, total_bytes: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass


class TransferPool:
    """The bounded worker pool for blob I/O. Size it by the number of connections the store allows."""

    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "ssb-transfer") -> None:
        if workers < 1:
            raise ValueError("transfer pool needs at least one worker")
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        return self._executor.submit(fn)

    def run_all(self, tasks: Iterable[Callable[[], T]], timeout: float | None = None) -> list[T]:
        """Run tasks on the pool and return their results in order.

        On the first error, cancel what has not started, wait (at most `timeout` again) for the
        running tasks to end so none is left writing behind the caller's back, and raise that error.
        On timeout, cancel what has not started and raise TimeoutError at once: a task stuck in I/O
        cannot be interrupted, so it finishes (bounded by the store's own timeouts) in the background
        and the caller is never blocked longer than `timeout`."""
        futures = [self._executor.submit(t) for t in tasks]
        if not futures:
            return []
        _, pending = wait(futures, timeout=timeout, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception()), None)
        if failed is None and not pending:
            return [f.result() for f in futures]
        for f in pending:
            f.cancel()
        if failed is not None:
            wait(futures, timeout=timeout)
            exc = failed.exception()
            assert exc is not None
            raise exc
        raise TimeoutError(f"{len(pending)} of {len(futures)} transfers did not finish within {timeout}s")

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> TransferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class PlannedChunk:
    """One chunk upload: bytes [offset, offset+size) of `path` go to blob `blob_id`."""

    file_key: int
    path: Path
    blob_id: str
    offset: int
    size: int


def new_blob_id(prefix: str) -> str:
    """A fresh, unique blob id under `prefix` (a store-relative folder)."""
    return f"{prefix}/{uuid.uuid4().hex}" if prefix else uuid.uuid4().hex


def plan_file_upload(
    file_key: int, path: Path, size: int, blob_prefix: str, chunk_size: int
) -> list[PlannedChunk]:
    """The chunks a file of `size` bytes is split into."""
    return [
        PlannedChunk(file_key, path, new_blob_id(blob_prefix), off, n)
        for off, n in chunk_layout(size, chunk_size)
    ]


def upload_chunk(
    store: BlobStore,
    chunk: PlannedChunk,
    metadata: Mapping[str, str],
    ttl_seconds: float | None,
    progress: Progress,
) -> FileBlob:
    """Upload one chunk and return its FileBlob with the checksum of the bytes the store read."""
    readers: list[ChecksumReader] = []

    def opener() -> ChecksumReader:
        r = ChecksumReader(open(chunk.path, "rb"), chunk.offset, chunk.size)  # noqa: SIM115 - closed by store
        readers.append(r)
        return r

    # ChecksumReader is a read-only BinaryIO in all but name (read/readinto/seek/tell/close).
    store.put(chunk.blob_id, cast(Opener, opener), chunk.size, metadata=metadata, ttl_seconds=ttl_seconds)
    last = readers[-1] if readers else None
    if last is not None and last.trusted and last.bytes_read == chunk.size:
        checksum = format_crc(last.crc)
    else:
        # The store did not stream the chunk once front to back: checksum the file range itself.
        checksum = checksum_range(chunk.path, chunk.offset, chunk.size)
    progress.advance(chunk.size)
    crashpoints.crash_point(crashpoints.DURING_FILE_UPLOAD)  # test-only; a no-op unless armed
    return FileBlob(blob_id=chunk.blob_id, offset=chunk.offset, size=chunk.size, checksum=checksum)


def assemble_file_index(name: str, metadata: FileMetadata, blobs: Sequence[FileBlob]) -> FileIndex:
    """FileIndex from uploaded chunks (in any order)."""
    ordered = tuple(sorted(blobs, key=lambda b: b.offset))
    return FileIndex(
        name=name, blobs=ordered, metadata=metadata, checksum=file_checksum([b.checksum for b in ordered])
    )


def download_chunk(
    store: BlobStore, blob: FileBlob, dest: Path, label: str, progress: Progress, *, sync: bool = False
) -> None:
    """Write one chunk into `dest` at its offset, verifying its checksum while writing.

    `dest` must exist; `label` (the file's path in the snapshot) is named in errors. With `sync`,
    the chunk's task also makes it durable (fdatasync), so syncing overlaps the other downloads."""
    fd = os.open(dest, os.O_WRONLY)
    try:
        writer = ChecksumWriter(fd, blob.offset)
        n = store.get(blob.blob_id, writer, 0, blob.size)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    if n != blob.size:
        raise StateBackendError(f"{label}: blob {blob.blob_id!r} delivered {n} of {blob.size} bytes")
    actual = format_crc(writer.crc)
    if actual != blob.checksum:
        raise ChecksumError(label, blob.blob_id, blob.checksum, actual)
    progress.advance(blob.size)
    crashpoints.crash_point(crashpoints.DURING_RESTORE)  # test-only; a no-op unless armed


class LockedProgress:
    """Makes a Progress safe to call from many pool threads."""

    def __init__(self, inner: Progress) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    def start(self, total_bytes: int) -> None:
        with self._lock:
            self._inner.start(total_bytes)

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self._inner.advance(nbytes)
