"""Uploads of the cloud stores: put() as one request or as blocks staged in parallel, and create().

The steps [P1]-[P3] are stated in stores/cloud/__init__.py; blocks held in memory count against the
store-wide buffer limit of the IoPool (pool.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import BinaryIO, Generic, TypeVar

from ...errors import BlobNotFoundError, BlobStoreError
from ..base import Opener
from .calls import Calls
from .metadata import encode_metadata
from .options import CloudSettings, MiB
from .pool import IoPool
from .ttl import expires_at

log = logging.getLogger("spark_statebackend.blobstore")  # name kept from the flat layout

U = TypeVar("U")  # what a backend returns for a staged block (S3: the part's ETag)


class Uploader(Generic[U]):
    """BlobStore.put and BlobStore.create for a cloud store, over its upload primitives (the
    CloudBlobStore._raw_* of the same names: put, create, begin_blocks, stage_block, commit_blocks,
    abort_blocks), each run through `calls`."""

    def __init__(
        self,
        *,
        calls: Calls,
        io: IoPool,
        settings: CloudSettings,
        block_size_for: Callable[[int], int],
        put: Callable[[str, bytes, dict[str, str], int | None], None],
        create: Callable[[str, bytes, dict[str, str]], None],
        begin_blocks: Callable[[str, dict[str, str], int | None], str],
        stage_block: Callable[[str, str, int, bytes], U],
        commit_blocks: Callable[[str, str, Sequence[U], dict[str, str], int | None], None],
        abort_blocks: Callable[[str, str], None],
        read_back: Callable[[str], bytes],
    ) -> None:
        """`block_size_for(size)` is the block size of a put of `size` bytes; `read_back(blob_id)` the
        blob's bytes (BlobStore.get_bytes), which tells a retried create whether it succeeded before."""
        self._calls = calls
        self._io = io
        self._block_size = settings.block_size
        self._window = settings.max_concurrency
        self._block_size_for = block_size_for
        self._put = put
        self._create = create
        self._begin_blocks = begin_blocks
        self._stage_block = stage_block
        self._commit_blocks = commit_blocks
        self._abort_blocks = abort_blocks
        self._read_back = read_back

    def put(
        self,
        blob_id: str,
        name: str,
        opener: Opener,
        size: int,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        """BlobStore.put of `blob_id`, stored as `name` ([P1]-[P3] of stores/cloud/__init__.py)."""
        meta = encode_metadata(metadata)
        started = time.monotonic()
        if size <= self._block_size:  # [P1]
            self._calls.call(
                lambda: self._put(name, _read_block(opener, 0, size, blob_id), meta, expires_at(ttl_seconds)),
                f"put blob {blob_id!r}",
                blob_id,
            )
        else:
            self._put_blocks(blob_id, name, opener, size, meta, ttl_seconds)  # [P2]-[P3]
        log.debug("put blob %r (%d bytes) in %.3fs", blob_id, size, time.monotonic() - started)

    def _put_blocks(
        self, blob_id: str, name: str, opener: Opener, size: int, meta: dict[str, str], ttl: float | None
    ) -> None:
        block = self._block_size_for(size)
        count = math.ceil(size / block)
        upload = self._calls.call(
            lambda: self._begin_blocks(name, meta, expires_at(ttl)), f"begin put {blob_id!r}"
        )
        futures: list[Future[U]] = []
        pending: set[Future[U]] = set()
        try:
            with opener() as src:
                for i in range(count):
                    offset = i * block
                    n = min(block, size - offset)
                    data = _read_exact(src, n, blob_id)
                    self._io.take()
                    try:
                        fut = self._io.executor.submit(
                            self._stage_task, blob_id, name, upload, i, offset, n, data, opener
                        )
                    except BaseException:
                        self._io.give()
                        raise
                    fut.add_done_callback(lambda _f: self._io.give())
                    futures.append(fut)
                    pending.add(fut)
                    del data
                    if len(pending) >= self._window:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for f in done:
                            f.result()  # the first failed block fails the put
            staged = [f.result() for f in futures]  # [P3] every block staged: commit the list
            self._calls.call(
                lambda: self._commit_blocks(name, upload, staged, meta, expires_at(ttl)),
                f"commit put of blob {blob_id!r} ({count} blocks)",
                blob_id,
            )
        except BaseException:
            for f in pending:
                f.cancel()
            wait(futures)
            try:
                self._calls.policy.call(
                    lambda: self._abort_blocks(name, upload), describe=f"abort put {blob_id!r}"
                )
            except Exception as e:  # the upload failed already; say so, then raise the real error
                log.warning(
                    "could not abort the failed put of blob %r: %s", blob_id, self._calls.kind(e).text
                )
            raise

    def _stage_task(
        self,
        blob_id: str,
        name: str,
        upload: str,
        index: int,
        offset: int,
        n: int,
        data: bytes,
        opener: Opener,
    ) -> U:
        first: list[bytes] = [data]
        del data

        def once() -> U:
            # The first attempt uses the bytes read in order; a retry re-opens the input.
            payload = first.pop() if first else _read_block(opener, offset, n, blob_id)
            return self._stage_block(name, upload, index, payload)

        return self._calls.call(once, f"put blob {blob_id!r} block {index} at {offset}", blob_id)

    def create(
        self, blob_id: str, name: str, data: bytes, *, metadata: Mapping[str, str] | None = None
    ) -> None:
        """BlobStore.create of `blob_id`, stored as `name`: exclusive, and idempotent under retries."""
        meta = encode_metadata(metadata)
        attempts = 0

        def once() -> None:
            nonlocal attempts
            attempts += 1
            try:
                self._create(name, data, meta)
            except Exception as e:
                # A retried create that finds its own bytes there: an earlier attempt succeeded and
                # only its answer was lost. That is success, which makes create idempotent.
                if attempts > 1 and self._calls.kind(e).kind == "exists" and self._holds(blob_id, data):
                    return
                raise

        self._calls.call(once, f"create blob {blob_id!r}", blob_id)

    def _holds(self, blob_id: str, data: bytes) -> bool:
        try:
            return self._read_back(blob_id) == data
        except BlobNotFoundError:
            return False


def _read_exact(stream: BinaryIO, n: int, blob_id: str) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        piece = stream.read(n - got)
        if not piece:
            raise BlobStoreError(f"put {blob_id!r}: source ended after {got} of {n} bytes")
        parts.append(piece)
        got += len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_block(opener: Opener, offset: int, n: int, blob_id: str) -> bytes:
    """Bytes [offset, offset+n) of a freshly opened source."""
    with opener() as src:
        if offset:
            if src.seekable():
                src.seek(offset)
            else:
                _discard(src, offset, blob_id)
        return _read_exact(src, n, blob_id)


def _discard(src: BinaryIO, n: int, blob_id: str) -> None:
    while n > 0:
        piece = src.read(min(n, 8 * MiB))
        if not piece:
            raise BlobStoreError(f"put {blob_id!r}: source ended while skipping to a block")
        n -= len(piece)
