"""CloudBlobStore: the BlobStore contract implemented once for Azure and S3 (stores/cloud/__init__.py),
on top of the primitives (`_raw_*`) each backend supplies.

The store is a facade over small parts, each given its collaborators explicitly when the store is built
and none reaching into another: `Calls` (calls.py) runs a primitive under the shared RetryPolicy and
translates its errors; `IoPool` (pool.py) is the bounded I/O pool and buffer limit; `Uploader`
(upload.py: put, create), `Reader` (read.py: get) and `TtlKeeper` (ttl.py: remove_ttl, set_ttl,
sweep_expired) receive the backend's primitives as bound methods. stat, list and delete are here.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Generic, TypeVar

from ...errors import BlobStoreError
from ..base import BlobInfo, BlobStore, Opener, Sink, check_blob_id
from .calls import Calls
from .errors import ErrorInfo, Scrubber
from .metadata import decode_metadata
from .options import CloudSettings
from .pool import IoPool
from .read import Reader
from .ttl import Listed, TtlKeeper, parse_expiry
from .upload import Uploader

T = TypeVar("T")
U = TypeVar("U")  # what a backend returns for a staged block (S3: the part's ETag)


class CloudBlobStore(BlobStore, Generic[U]):
    """BlobStore over a cloud object store; subclasses provide the `_raw_*` primitives."""

    scheme: ClassVar[str]
    #: What the store's root is called in errors (S3: "bucket").
    _root_word: ClassVar[str] = "container"

    def __init__(
        self, *, root: str, prefix: str, settings: CloudSettings, scrub: Scrubber, endpoint: str
    ) -> None:
        self.root = root
        self.prefix = prefix
        self.settings = settings
        self.url = f"{self.scheme}://{root}/{prefix.rstrip('/')}"
        #: Where requests go, without any secret; named in errors about reachability.
        self.endpoint = endpoint
        self._scrub = scrub
        self._calls = Calls(
            classify=self._classify,
            settings=settings,
            url=self.url,
            endpoint=endpoint,
            root=root,
            root_word=self._root_word,
        )
        #: The shared retry policy of every request the store makes.
        self.policy = self._calls.policy
        self._io = IoPool(settings.max_concurrency, f"ssb-{self.scheme}-{root}"[:40])
        self._uploader: Uploader[U] = Uploader(
            calls=self._calls,
            io=self._io,
            settings=settings,
            block_size_for=self._block_size_for,
            put=self._raw_put,
            create=self._raw_create,
            begin_blocks=self._raw_begin_blocks,
            stage_block=self._raw_stage_block,
            commit_blocks=self._raw_commit_blocks,
            abort_blocks=self._raw_abort_blocks,
            read_back=self.get_bytes,
        )
        self._reader = Reader(
            calls=self._calls,
            io=self._io,
            settings=settings,
            url=self.url,
            open_range=self._raw_open_range,
            size_of=lambda blob_id: self.stat(blob_id).size,
        )
        self._ttl = TtlKeeper(
            calls=self._calls,
            io=self._io,
            settings=settings,
            prefix=prefix,
            listing=self._pages,
            get_tags=self._raw_get_tags,
            set_tags=self._raw_set_tags,
            delete_if_expired=self._raw_delete_if_expired,
        )

    # ---- what a backend supplies

    @abstractmethod
    def _classify(self, exc: BaseException) -> ErrorInfo:
        """Kind and secret-free description of an exception raised by a primitive."""

    @abstractmethod
    def _raw_put(self, name: str, data: bytes, metadata: dict[str, str], expires_ms: int | None) -> None: ...

    @abstractmethod
    def _raw_create(self, name: str, data: bytes, metadata: dict[str, str]) -> None:
        """Put only if the name is free; an "exists" error otherwise."""

    @abstractmethod
    def _raw_begin_blocks(self, name: str, metadata: dict[str, str], expires_ms: int | None) -> str:
        """Start a block upload; returns an upload id."""

    @abstractmethod
    def _raw_stage_block(self, name: str, upload: str, index: int, data: bytes) -> U: ...

    @abstractmethod
    def _raw_commit_blocks(
        self, name: str, upload: str, staged: Sequence[U], metadata: dict[str, str], expires_ms: int | None
    ) -> None: ...

    @abstractmethod
    def _raw_abort_blocks(self, name: str, upload: str) -> None: ...

    @abstractmethod
    def _raw_open_range(self, name: str, start: int, end: int) -> tuple[int, Iterator[bytes]]:
        """GET bytes [start, end) (fewer if the blob ends first): (total blob size, body pieces).
        Raises an error classified "range" if start is at or past the end of a non-empty blob."""

    @abstractmethod
    def _raw_delete(self, name: str) -> None:
        """Delete; a missing blob is not an error."""

    def _raw_delete_batch(self, names: Sequence[str]) -> list[str]:
        """Delete `names` (at most `delete_batch_size`) in one request; returns those the service did
        not delete (each then goes through _raw_delete, retried alone). A missing blob counts as
        deleted. Only called where `delete_batch_size` > 1."""
        raise NotImplementedError

    @abstractmethod
    def _raw_delete_if_expired(self, name: str, tag_value: str) -> bool:
        """Delete only if the TTL tag still holds `tag_value` (as nearly atomically as the cloud
        allows: Azure checks the tag in the delete request itself, S3 re-reads it just before).
        Returns whether the blob was deleted."""

    @abstractmethod
    def _raw_get_tags(self, name: str) -> dict[str, str]: ...

    @abstractmethod
    def _raw_set_tags(self, name: str, tags: dict[str, str]) -> None: ...

    @abstractmethod
    def _raw_stat(self, name: str) -> tuple[int, int, dict[str, str], dict[str, str] | None]:
        """(size, modified ms, raw metadata, tags or None if another request would be needed)."""

    @abstractmethod
    def _raw_list_page(self, name_prefix: str, token: str | None) -> tuple[list[Listed], str | None]:
        """One page of (name, size, modified ms, tags or None) and the next page's token."""

    # ---- for the backends

    def _block_size_for(self, size: int) -> int:
        """The block size of a put of `size` bytes (S3 grows it to stay within 10,000 parts)."""
        return self.settings.block_size

    def _call(self, fn: Callable[[], T], what: str, blob_id: str | None = None) -> T:
        """Run one primitive under the retry policy; translate what escapes into our errors (calls.py)."""
        return self._calls.call(fn, what, blob_id)

    def _name(self, blob_id: str) -> str:
        try:
            check_blob_id(blob_id)
        except ValueError as e:
            raise BlobStoreError(f"{self.url}: {e}") from None
        return self.prefix + blob_id

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The store's bounded I/O pool, created on first use."""
        return self._io.executor

    # ---- contract

    def put(
        self,
        blob_id: str,
        opener: Opener,
        size: int,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        self._uploader.put(
            blob_id, self._name(blob_id), opener, size, metadata=metadata, ttl_seconds=ttl_seconds
        )

    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        self._uploader.create(blob_id, self._name(blob_id), data, metadata=metadata)

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        return self._reader.get(blob_id, self._name(blob_id), sink, offset, length)

    def delete(self, blob_id: str) -> None:
        name = self._name(blob_id)
        self._call(lambda: self._raw_delete(name), f"delete blob {blob_id!r}", blob_id=None)

    def delete_many(self, blob_ids: Iterable[str]) -> None:
        ids = {self._name(b): b for b in blob_ids}
        if self.delete_batch_size <= 1:
            left: Iterable[str] = ids
        else:
            left = []
            names = list(ids)
            for start in range(0, len(names), self.delete_batch_size):
                chunk = names[start : start + self.delete_batch_size]
                left += self._call(
                    lambda c=chunk: self._raw_delete_batch(c),  # type: ignore[misc]
                    f"delete {len(chunk)} blobs ({ids[chunk[0]]!r} first)",
                )
        # A batch answers per blob: what it did not delete (throttled, a server error) goes one by one
        # under the retry policy, so a partial answer never passes as success.
        for name in left:
            self._call(lambda n=name: self._raw_delete(n), f"delete blob {ids[name]!r}")  # type: ignore[misc]

    def remove_ttl(self, blob_id: str) -> None:
        self._ttl.remove_ttl(blob_id, self._name(blob_id))

    def set_ttl(self, blob_id: str, ttl_seconds: float) -> None:
        self._ttl.set_ttl(blob_id, self._name(blob_id), ttl_seconds)

    def stat(self, blob_id: str) -> BlobInfo:
        name = self._name(blob_id)
        size, modified, raw_meta, tags = self._call(
            lambda: self._raw_stat(name), f"stat blob {blob_id!r}", blob_id
        )
        if tags is None:
            tags = self._call(lambda: self._raw_get_tags(name), f"stat blob {blob_id!r}", blob_id)
        return BlobInfo(blob_id, size, modified, parse_expiry(tags), decode_metadata(raw_meta))

    def _pages(self, prefix: str) -> Iterator[Listed]:
        name_prefix = self.prefix + prefix
        token: str | None = None
        while True:
            page, token = self._call(
                lambda t=token: self._raw_list_page(name_prefix, t),  # type: ignore[misc]
                f"list {name_prefix!r}",
            )
            yield from page
            if not token:
                return

    def list(self, prefix: str = "") -> Iterator[BlobInfo]:
        for name, size, modified, tags in self._pages(prefix):
            yield BlobInfo(name[len(self.prefix) :], size, modified, parse_expiry(tags))

    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        return self._ttl.sweep_expired(now_ms, keep)

    def close(self) -> None:
        self._io.close()
