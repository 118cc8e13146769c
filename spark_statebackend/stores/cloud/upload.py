"""Uploads of the cloud stores: put() as one request or as blocks staged in parallel, and create().

The steps [P1]-[P3] are stated in stores/cloud/__init__.py; blocks held in memory count against the
store-wide buffer limit there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from ...errors import BlobNotFoundError, BlobStoreError
from ..base import Opener
from .metadata import encode_metadata
from .options import MiB
from .ttl import expires_at

if TYPE_CHECKING:
    from .store import CloudBlobStore

log = logging.getLogger("spark_statebackend.blobstore")  # name kept from the flat layout

U = TypeVar("U")  # what a backend returns for a staged block (S3: the part's ETag)


def put(
    store: CloudBlobStore[Any],
    blob_id: str,
    opener: Opener,
    size: int,
    *,
    metadata: Mapping[str, str] | None = None,
    ttl_seconds: float | None = None,
) -> None:
    """BlobStore.put ([P1]-[P3] of stores/cloud/__init__.py)."""
    name = store._name(blob_id)
    meta = encode_metadata(metadata)
    started = time.monotonic()
    if size <= store.settings.block_size:  # [P1]
        store._call(
            lambda: store._raw_put(
                name, _read_block(opener, 0, size, blob_id), meta, expires_at(ttl_seconds)
            ),
            f"put blob {blob_id!r}",
            blob_id,
        )
    else:
        _put_blocks(store, blob_id, name, opener, size, meta, ttl_seconds)  # [P2]-[P3]
    log.debug("put blob %r (%d bytes) in %.3fs", blob_id, size, time.monotonic() - started)


def _put_blocks(
    store: CloudBlobStore[U],
    blob_id: str,
    name: str,
    opener: Opener,
    size: int,
    meta: dict[str, str],
    ttl: float | None,
) -> None:
    block = store._block_size_for(size)
    count = math.ceil(size / block)
    upload = store._call(
        lambda: store._raw_begin_blocks(name, meta, expires_at(ttl)), f"begin put {blob_id!r}"
    )
    window = store.settings.max_concurrency
    futures: list[Future[U]] = []
    pending: set[Future[U]] = set()
    try:
        with opener() as src:
            for i in range(count):
                offset = i * block
                n = min(block, size - offset)
                data = _read_exact(src, n, blob_id)
                store._buffers.take()
                try:
                    fut = store.pool.submit(
                        _stage_task, store, blob_id, name, upload, i, offset, n, data, opener
                    )
                except BaseException:
                    store._buffers.give()
                    raise
                fut.add_done_callback(lambda _f: store._buffers.give())
                futures.append(fut)
                pending.add(fut)
                del data
                if len(pending) >= window:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        f.result()  # the first failed block fails the put
        staged = [f.result() for f in futures]  # [P3] every block staged: commit the list
        store._call(
            lambda: store._raw_commit_blocks(name, upload, staged, meta, expires_at(ttl)),
            f"commit put of blob {blob_id!r} ({count} blocks)",
            blob_id,
        )
    except BaseException:
        for f in pending:
            f.cancel()
        wait(futures)
        try:
            store.policy.call(
                lambda: store._raw_abort_blocks(name, upload), describe=f"abort put {blob_id!r}"
            )
        except Exception as e:  # the upload failed already; say so, then raise the real error
            log.warning("could not abort the failed put of blob %r: %s", blob_id, store._kind(e).text)
        raise


def _stage_task(
    store: CloudBlobStore[U],
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
        return store._raw_stage_block(name, upload, index, payload)

    return store._call(once, f"put blob {blob_id!r} block {index} at {offset}", blob_id)


def create(
    store: CloudBlobStore[Any], blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None
) -> None:
    """BlobStore.create: exclusive, and idempotent under retries (below)."""
    name = store._name(blob_id)
    meta = encode_metadata(metadata)
    attempts = 0

    def once() -> None:
        nonlocal attempts
        attempts += 1
        try:
            store._raw_create(name, data, meta)
        except Exception as e:
            # A retried create that finds its own bytes there: an earlier attempt succeeded and
            # only its answer was lost. That is success, which makes create idempotent.
            if attempts > 1 and store._kind(e).kind == "exists" and _holds(store, blob_id, data):
                return
            raise

    store._call(once, f"create blob {blob_id!r}", blob_id)


def _holds(store: CloudBlobStore[Any], blob_id: str, data: bytes) -> bool:
    try:
        return store.get_bytes(blob_id) == data
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
