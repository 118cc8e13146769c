"""Reads of the cloud stores: get() as ranged GETs fetched in parallel and delivered in order.

The steps [G1]-[G3] are stated in stores/cloud/__init__.py; ranges held in memory count against the
store-wide buffer limit of the IoPool (pool.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait

from ...errors import BlobStoreError
from ..base import Sink
from .calls import Calls
from .errors import RangeOutside
from .options import CloudSettings
from .pool import IoPool

log = logging.getLogger("spark_statebackend.blobstore")  # name kept from the flat layout

#: A backend's ranged GET: (name, start, end) -> (total blob size, body pieces); see
#: CloudBlobStore._raw_open_range.
OpenRange = Callable[[str, int, int], tuple[int, Iterator[bytes]]]


class Reader:
    """BlobStore.get for a cloud store, over its ranged-GET primitive."""

    def __init__(
        self,
        *,
        calls: Calls,
        io: IoPool,
        settings: CloudSettings,
        url: str,
        open_range: OpenRange,
        size_of: Callable[[str], int],
    ) -> None:
        """`open_range` is the backend's primitive, run through `calls`; `size_of(blob_id)` is the
        blob's size (a stat), asked only to tell an empty read at the end from one past it."""
        self._calls = calls
        self._io = io
        self._chunk = settings.download_chunk_size
        self._max_concurrency = settings.max_concurrency
        self._url = url
        self._open_range = open_range
        self._size_of = size_of

    def get(self, blob_id: str, name: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        """BlobStore.get of `blob_id`, stored as `name` ([G1]-[G3] of stores/cloud/__init__.py)."""
        if offset < 0 or (length is not None and length < 0):
            raise BlobStoreError(f"get {blob_id!r}: negative offset or length ({offset}, {length})")
        started = time.monotonic()
        if length == 0:
            size = self._size_of(blob_id)
            if offset > size:
                raise self._outside(blob_id, size, offset, offset)
            return 0
        sizes: list[int] = []
        if length is None:
            # The size is learnt from the first range's answer; the rest is planned from it.
            try:
                first = self._fetch(blob_id, name, offset, self._chunk, sizes)
            except RangeOutside:
                size = self._size_of(blob_id)
                if offset == size:
                    return 0
                raise self._outside(blob_id, size, offset, offset) from None
            sink.write(first)
            end = sizes[0]
            delivered = len(first) + self._read_ordered(blob_id, name, sink, offset + len(first), end, sizes)
        else:
            end = offset + length
            delivered = self._read_ordered(blob_id, name, sink, offset, end, sizes)
        if sizes and sizes[0] < end:
            raise self._outside(blob_id, sizes[0], offset, end)
        log.debug("got blob %r [%d, %d) in %.3fs", blob_id, offset, end, time.monotonic() - started)
        return delivered

    def _read_ordered(
        self, blob_id: str, name: str, sink: Sink, start: int, end: int, sizes: list[int]
    ) -> int:
        """Deliver [start, end) to the sink in order, fetching ranges in parallel (module doc, get)."""
        chunk = self._chunk
        ranges = [(s, min(chunk, end - s)) for s in range(start, end, chunk)]  # [G1]
        if not ranges:
            return 0
        if len(ranges) == 1:
            data = self._fetch_exact(blob_id, name, *ranges[0], sizes)
            sink.write(data)
            return len(data)
        delivered = 0
        inflight: deque[Future[bytes]] = deque()
        todo = iter(ranges)
        nxt = next(todo, None)
        try:
            while nxt is not None or inflight:
                while nxt is not None and len(inflight) < self._max_concurrency:
                    # Wait for a buffer only while holding none; else deliver first (deadlock-free).
                    if not self._io.take(block=not inflight):
                        break
                    try:
                        inflight.append(
                            self._io.executor.submit(self._fetch_exact, blob_id, name, nxt[0], nxt[1], sizes)
                        )
                    except BaseException:
                        self._io.give()
                        raise
                    nxt = next(todo, None)
                head = inflight.popleft()
                try:
                    data = head.result()
                finally:
                    self._io.give()
                sink.write(data)  # [G3] in order, each range once
                delivered += len(data)
        except BaseException:
            for f in inflight:
                f.cancel()
            wait(inflight)
            for _ in inflight:
                self._io.give()
            raise
        return delivered

    def _fetch_exact(self, blob_id: str, name: str, start: int, n: int, sizes: list[int]) -> bytes:
        try:
            data = self._fetch(blob_id, name, start, n, sizes)
        except RangeOutside:
            raise self._outside(blob_id, sizes[0] if sizes else start, start, start + n) from None
        if len(data) != n:
            raise self._outside(blob_id, sizes[0] if sizes else start + len(data), start, start + n)
        return data

    def _fetch(self, blob_id: str, name: str, start: int, n: int, sizes: list[int]) -> bytes:
        """[G2] Bytes [start, start+n) or fewer if the blob ends first; `sizes` records the blob size seen.

        A retry resumes after the last byte received, so a broken stream costs only what was lost."""
        buf = bytearray()

        def once() -> None:
            pos = start + len(buf)
            try:
                total, pieces = self._open_range(name, pos, start + n)
            except Exception as e:
                if self._calls.kind(e).kind == "range":
                    raise RangeOutside from None
                raise
            if sizes and sizes[0] != total:
                raise BlobStoreError(f"blob {blob_id!r} in {self._url} changed size while being read")
            if not sizes:
                sizes.append(total)
            try:
                for piece in pieces:
                    buf.extend(piece)
            finally:
                close = getattr(pieces, "close", None)
                if close is not None:
                    close()

        self._calls.call(once, f"get blob {blob_id!r} [{start}, {start + n})", blob_id)
        return bytes(buf)

    def _outside(self, blob_id: str, size: int, start: int, end: int) -> BlobStoreError:
        return BlobStoreError(
            f"blob {blob_id!r} in {self._url} has {size} bytes; range [{start}, {end}) is outside it"
        )
