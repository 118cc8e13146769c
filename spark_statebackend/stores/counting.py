"""A BlobStore that counts the requests made through it, by kind, and passes each on unchanged.

The sidecar wraps its store in one (runtime/sidecar.py), so what a batch costs in blob-store requests
(billed per request on S3 and Azure) is a metric, `ssb_blob_requests{op}`, beside its bytes. A call
counts once, as the one request it asks of the store: `put`, `put_bytes` and `create` as PUT, `get` and
`get_bytes` as GET (a ranged or retried read may be several HTTP requests below), `list` as LIST (one
per call, whatever the pages), `delete` (and `delete_many` once per `delete_batch_size` blobs), `stat`
and `exists` (HEAD), `remove_ttl` and `set_ttl` (TTL, a metadata write), `sweep_expired` (SWEEP). Failed
requests count too: they are billed as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from prometheus_client import Counter

from .base import BlobInfo, BlobStore, Opener, Sink

#: The `op` label of each kind of request (module doc).
OPS = ("put", "get", "list", "delete", "head", "ttl", "sweep")


class CountingBlobStore(BlobStore):
    """`inner`, with every request counted in `requests` (a Counter labelled `op`, module doc)."""

    def __init__(self, inner: BlobStore, requests: Counter) -> None:
        self.inner = inner
        self.url = inner.url
        self.whole_file_blobs = inner.whole_file_blobs
        self.delete_batch_size = inner.delete_batch_size
        self._counts = {op: requests.labels(op) for op in OPS}  # every op exported from the start

    def _count(self, op: str) -> None:
        self._counts[op].inc()

    def local_path(self, blob_id: str) -> Path | None:
        return self.inner.local_path(blob_id)  # no request: a path computed locally

    @property
    def local_files_durable(self) -> bool:
        return self.inner.local_files_durable

    def ensure_ready(self) -> None:
        self.inner.ensure_ready()

    def put(
        self,
        blob_id: str,
        opener: Opener,
        size: int,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        self._count("put")
        self.inner.put(blob_id, opener, size, metadata=metadata, ttl_seconds=ttl_seconds)

    def put_bytes(
        self,
        blob_id: str,
        data: bytes,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        self._count("put")
        self.inner.put_bytes(blob_id, data, metadata=metadata, ttl_seconds=ttl_seconds)

    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        self._count("put")
        self.inner.create(blob_id, data, metadata=metadata)

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        self._count("get")
        return self.inner.get(blob_id, sink, offset, length)

    def get_bytes(self, blob_id: str, offset: int = 0, length: int | None = None) -> bytes:
        self._count("get")
        return self.inner.get_bytes(blob_id, offset, length)

    def delete(self, blob_id: str) -> None:
        self._count("delete")
        self.inner.delete(blob_id)

    def delete_many(self, blob_ids: Iterable[str]) -> None:
        ids = list(blob_ids)
        for _ in range(0, len(ids), max(1, self.delete_batch_size)):
            self._count("delete")
        self.inner.delete_many(ids)

    def remove_ttl(self, blob_id: str) -> None:
        self._count("ttl")
        self.inner.remove_ttl(blob_id)

    def set_ttl(self, blob_id: str, ttl_seconds: float) -> None:
        self._count("ttl")
        self.inner.set_ttl(blob_id, ttl_seconds)

    def stat(self, blob_id: str) -> BlobInfo:
        self._count("head")
        return self.inner.stat(blob_id)

    def exists(self, blob_id: str) -> bool:
        self._count("head")
        return self.inner.exists(blob_id)

    def list(self, prefix: str = "") -> Iterator[BlobInfo]:
        self._count("list")
        return self.inner.list(prefix)

    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        self._count("sweep")
        return self.inner.sweep_expired(now_ms, keep)

    def close(self) -> None:
        self.inner.close()
