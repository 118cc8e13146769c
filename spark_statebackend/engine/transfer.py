"""Chunked, checksummed, parallel file transfer between local files and a BlobStore.

One bounded, named thread pool (`TransferPool`) carries every chunk of every file; callers submit a
whole batch of work and wait for it as a group (`run_all`): the first failure cancels what has not
started, waits for what is running (no future is left behind on any path), and re-raises. Its queue
is bounded too: at most `workers + queue_size` tasks are submitted and not yet finished, across all
callers; a caller with more work blocks until a slot frees (back-pressure), so a snapshot of 100,000
files never becomes 100,000 queued closures.

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
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar, cast

from ..common import crashpoints
from ..common.nofollow import open_regular
from ..errors import ChecksumError, StateBackendError
from ..stores import BlobStore, Opener
from .checksum import (
    ChecksumReader,
    ChecksumWriter,
    checksum_open_range,
    chunk_layout,
    file_checksum,
    format_crc,
)
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
    """The bounded worker pool for blob I/O. Size it by the number of connections the store allows.

    At most `workers + queue_size` tasks (default queue_size: 2 x workers) are submitted and not yet
    finished at any time, across every caller (module doc): `submit` and `run_all` block for a slot,
    never longer than their timeout."""

    def __init__(
        self, workers: int = DEFAULT_WORKERS, name: str = "ssb-transfer", queue_size: int | None = None
    ) -> None:
        if workers < 1:
            raise ValueError("transfer pool needs at least one worker")
        self.workers = workers
        self.name = name
        self.queue_size = 2 * workers if queue_size is None else queue_size
        if self.queue_size < 0:
            raise ValueError("transfer pool queue size must not be negative")
        self._slots = threading.BoundedSemaphore(workers + self.queue_size)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def submit(self, fn: Callable[[], T], timeout: float | None = None) -> Future[T]:
        """Queue `fn`, waiting (at most `timeout` seconds; None: until one frees) for a free slot.

        Raises TimeoutError naming the pool when no slot freed in time."""
        if not self._slots.acquire(timeout=timeout):
            raise TimeoutError(
                f"transfer pool {self.name}: no free slot within {timeout}s ({self.workers} workers, "
                f"{self.queue_size} queued, all busy)"
            )
        return self._submit_holding_slot(fn)

    def try_submit(self, fn: Callable[[], T]) -> Future[T] | None:
        """Queue `fn` if a slot is free now, else None (the caller keeps its work for later)."""
        if not self._slots.acquire(blocking=False):
            return None
        return self._submit_holding_slot(fn)

    def _submit_holding_slot(self, fn: Callable[[], T]) -> Future[T]:
        """Submit `fn` under the slot the caller has just acquired; the slot is released when the task
        ends, fails or is cancelled, or right away if the executor refuses the task."""
        try:
            future = self._executor.submit(fn)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def run_all(self, tasks: Iterable[Callable[[], T]], timeout: float | None = None) -> list[T]:
        """Run tasks on the pool and return their results in order.

        `tasks` is consumed lazily: a task is taken from it only once a slot is free, so a generator
        never runs ahead of the pool. On the first error, stop taking tasks, cancel what has not
        started, wait (at most `timeout` again) for the running tasks to end so none is left writing
        behind the caller's back, and raise that error. On timeout (the whole call, waiting for slots
        included), cancel what has not started and raise TimeoutError at once: a task stuck in I/O
        cannot be interrupted, so it finishes (bounded by the store's own timeouts) in the background
        and the caller is never blocked longer than `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failed = threading.Event()  # set by the first task that raises: stop taking tasks

        def guarded(task: Callable[[], T]) -> T:
            try:
                return task()
            except BaseException:
                failed.set()  # before the task's slot frees, so the caller stops at its next task
                raise

        futures: list[Future[T]] = []
        timed_out = False
        for task in tasks:
            if failed.is_set():
                break
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                futures.append(self.submit(partial(guarded, task), timeout=remaining))
            except TimeoutError:
                timed_out = True
                break
        if not futures:
            if timed_out:
                raise TimeoutError(f"transfer pool {self.name}: no free slot within {timeout}s")
            return []
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        _, pending = wait(futures, timeout=remaining, return_when=FIRST_EXCEPTION)
        failure = next((f for f in futures if f.done() and not f.cancelled() and f.exception()), None)
        if failure is None and not pending and not timed_out:
            return [f.result() for f in futures]
        for f in pending:
            f.cancel()
        if failure is not None:
            wait(futures, timeout=timeout)
            exc = failure.exception()
            assert exc is not None
            raise exc
        raise TimeoutError(
            f"transfer pool {self.name}: {len(pending)} of {len(futures)} transfers started did not "
            f"finish within {timeout}s" + (" (and more were still waiting for a slot)" if timed_out else "")
        )

    def close(self, *, cancel_pending: bool = True) -> None:
        """Stop the pool: cancel the queued tasks (or, without `cancel_pending`, run them), then wait
        for the running ones."""
        self._executor.shutdown(wait=True, cancel_futures=cancel_pending)

    def __enter__(self) -> TransferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class PlannedChunk:
    """One chunk upload: bytes [offset, offset+size) of `path` go to blob `blob_id`. `inode`: the
    file's inode when it was planned (its diff or stream saw it); the upload reads only that file."""

    file_key: int
    path: Path
    blob_id: str
    offset: int
    size: int
    inode: int | None = None


def new_blob_id(prefix: str) -> str:
    """A fresh, unique blob id under `prefix` (a store-relative folder)."""
    return f"{prefix}/{uuid.uuid4().hex}" if prefix else uuid.uuid4().hex


def plan_file_upload(
    file_key: int,
    path: Path,
    size: int,
    blob_prefix: str,
    chunk_size: int,
    start: int = 0,
    inode: int | None = None,
) -> list[PlannedChunk]:
    """The chunks bytes [start, size) of a file are split into (`start` > 0: the bytes before it are
    uploaded already, e.g. streamed while the file was written); `inode` as in PlannedChunk."""
    return [
        PlannedChunk(file_key, path, new_blob_id(blob_prefix), start + off, n, inode)
        for off, n in chunk_layout(size - start, chunk_size)
    ]


def upload_chunk(
    store: BlobStore,
    chunk: PlannedChunk,
    metadata: Mapping[str, str],
    ttl_seconds: float | None,
    progress: Progress,
) -> FileBlob:
    """Upload one chunk and return its FileBlob with the checksum of the bytes the store read.

    The file is opened without following a symlink and must still be the planned inode
    (UnsafePathError otherwise): a name swapped after the diff never feeds other bytes into a blob."""
    readers: list[ChecksumReader] = []

    def opener() -> ChecksumReader:
        r = ChecksumReader(open_regular(chunk.path, chunk.inode), chunk.offset, chunk.size)
        readers.append(r)
        return r

    # ChecksumReader is a read-only BinaryIO in all but name (read/readinto/seek/tell/close).
    store.put(chunk.blob_id, cast(Opener, opener), chunk.size, metadata=metadata, ttl_seconds=ttl_seconds)
    last = readers[-1] if readers else None
    if last is not None and last.trusted and last.bytes_read == chunk.size:
        checksum = format_crc(last.crc)
    else:
        # The store did not stream the chunk once front to back: checksum the file range itself.
        with open_regular(chunk.path, chunk.inode) as f:
            checksum = checksum_open_range(f, chunk.offset, chunk.size, str(chunk.path))
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

    `dest` must exist (common.nofollow.open_new) and is not opened through a symlink; `label` (the
    file's path in the snapshot) is named in errors. With `sync`, the chunk's task also makes it
    durable (fdatasync), so syncing overlaps the other downloads."""
    fd = os.open(dest, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
