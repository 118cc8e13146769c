"""Reads of the cloud stores: get() as ranged GETs fetched in parallel and delivered in order.

The steps [G1]-[G3] are stated in stores/cloud/__init__.py; ranges held in memory count against the
store-wide buffer limit there.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any

from ...errors import BlobStoreError
from ..base import Sink

if TYPE_CHECKING:
    from .store import CloudBlobStore

log = logging.getLogger("spark_statebackend.blobstore")  # name kept from the flat layout


class RangeOutside(Exception):
    """A ranged read started at or beyond the end of the blob (HTTP 416); the primitives' "range"."""


def get(
    store: CloudBlobStore[Any], blob_id: str, sink: Sink, offset: int = 0, length: int | None = None
) -> int:
    """BlobStore.get ([G1]-[G3] of stores/cloud/__init__.py)."""
    name = store._name(blob_id)
    if offset < 0 or (length is not None and length < 0):
        raise BlobStoreError(f"get {blob_id!r}: negative offset or length ({offset}, {length})")
    started = time.monotonic()
    chunk = store.settings.download_chunk_size
    if length == 0:
        size = store.stat(blob_id).size
        if offset > size:
            raise _outside(store, blob_id, size, offset, offset)
        return 0
    sizes: list[int] = []
    if length is None:
        # The size is learnt from the first range's answer; the rest is planned from it.
        try:
            first = _fetch(store, blob_id, name, offset, chunk, sizes)
        except RangeOutside:
            size = store.stat(blob_id).size
            if offset == size:
                return 0
            raise _outside(store, blob_id, size, offset, offset) from None
        sink.write(first)
        end = sizes[0]
        delivered = len(first) + _read_ordered(store, blob_id, name, sink, offset + len(first), end, sizes)
    else:
        end = offset + length
        delivered = _read_ordered(store, blob_id, name, sink, offset, end, sizes)
    if sizes and sizes[0] < end:
        raise _outside(store, blob_id, sizes[0], offset, end)
    log.debug("got blob %r [%d, %d) in %.3fs", blob_id, offset, end, time.monotonic() - started)
    return delivered


def _read_ordered(
    store: CloudBlobStore[Any], blob_id: str, name: str, sink: Sink, start: int, end: int, sizes: list[int]
) -> int:
    """Deliver [start, end) to the sink in order, fetching ranges in parallel (module doc, get)."""
    chunk = store.settings.download_chunk_size
    ranges = [(s, min(chunk, end - s)) for s in range(start, end, chunk)]  # [G1]
    if not ranges:
        return 0
    if len(ranges) == 1:
        data = _fetch_exact(store, blob_id, name, *ranges[0], sizes)
        sink.write(data)
        return len(data)
    delivered = 0
    inflight: deque[Future[bytes]] = deque()
    todo = iter(ranges)
    nxt = next(todo, None)
    try:
        while nxt is not None or inflight:
            while nxt is not None and len(inflight) < store.settings.max_concurrency:
                # Wait for a buffer only while holding none; else deliver first (deadlock-free).
                if not store._buffers.take(block=not inflight):
                    break
                try:
                    inflight.append(
                        store.pool.submit(_fetch_exact, store, blob_id, name, nxt[0], nxt[1], sizes)
                    )
                except BaseException:
                    store._buffers.give()
                    raise
                nxt = next(todo, None)
            head = inflight.popleft()
            try:
                data = head.result()
            finally:
                store._buffers.give()
            sink.write(data)  # [G3] in order, each range once
            delivered += len(data)
    except BaseException:
        for f in inflight:
            f.cancel()
        wait(inflight)
        for _ in inflight:
            store._buffers.give()
        raise
    return delivered


def _fetch_exact(
    store: CloudBlobStore[Any], blob_id: str, name: str, start: int, n: int, sizes: list[int]
) -> bytes:
    try:
        data = _fetch(store, blob_id, name, start, n, sizes)
    except RangeOutside:
        raise _outside(store, blob_id, sizes[0] if sizes else start, start, start + n) from None
    if len(data) != n:
        raise _outside(store, blob_id, sizes[0] if sizes else start + len(data), start, start + n)
    return data


def _fetch(
    store: CloudBlobStore[Any], blob_id: str, name: str, start: int, n: int, sizes: list[int]
) -> bytes:
    """[G2] Bytes [start, start+n) or fewer if the blob ends first; `sizes` records the blob size seen.

    A retry resumes after the last byte received, so a broken stream costs only what was lost."""
    buf = bytearray()

    def once() -> None:
        pos = start + len(buf)
        try:
            total, pieces = store._raw_open_range(name, pos, start + n)
        except Exception as e:
            if store._kind(e).kind == "range":
                raise RangeOutside from None
            raise
        if sizes and sizes[0] != total:
            raise BlobStoreError(f"blob {blob_id!r} in {store.url} changed size while being read")
        if not sizes:
            sizes.append(total)
        try:
            for piece in pieces:
                buf.extend(piece)
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()

    store._call(once, f"get blob {blob_id!r} [{start}, {start + n})", blob_id)
    return bytes(buf)


def _outside(store: CloudBlobStore[Any], blob_id: str, size: int, start: int, end: int) -> BlobStoreError:
    return BlobStoreError(
        f"blob {blob_id!r} in {store.url} has {size} bytes; range [{start}, {end}) is outside it"
    )
