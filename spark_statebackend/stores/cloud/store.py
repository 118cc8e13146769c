"""CloudBlobStore: the BlobStore contract implemented once for Azure and S3 (stores/cloud/__init__.py),
on top of the primitives (`_raw_*`) each backend supplies, each wrapped in the shared RetryPolicy by
`_call`, with its errors translated and scrubbed of secrets. put and create are upload.py, get is
read.py, remove_ttl and sweep_expired are ttl.py.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Generic, TypeVar

from ...errors import BlobExistsError, BlobNotFoundError, BlobStoreError, StateBackendError
from ..base import BlobInfo, BlobStore, Opener, Sink, check_blob_id
from ..retry import RetryPolicy
from . import read, ttl, upload
from .errors import ErrorInfo, Scrubber
from .metadata import decode_metadata
from .options import CloudSettings
from .read import RangeOutside

T = TypeVar("T")
U = TypeVar("U")  # what a backend returns for a staged block (S3: the part's ETag)


class _Buffers:
    """Store-wide limit on in-memory blocks/ranges. `take(block=False)` lets a reader that already
    holds buffers deliver one instead of waiting, which is what keeps ordered reads deadlock-free."""

    def __init__(self, n: int) -> None:
        self._sem = threading.BoundedSemaphore(n)

    def take(self, block: bool = True) -> bool:
        return self._sem.acquire(blocking=block)

    def give(self) -> None:
        self._sem.release()


class CloudBlobStore(BlobStore, Generic[U]):
    """BlobStore over a cloud object store; subclasses provide the `_raw_*` primitives."""

    scheme: ClassVar[str]

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
        self.policy = RetryPolicy(
            budget_seconds=settings.retry_budget_seconds,
            initial_backoff=settings.retry_initial_backoff_seconds,
            max_backoff=settings.retry_max_backoff_seconds,
            is_retriable=lambda e: self._kind(e).kind == "transient",
            describe_error=lambda e: self._kind(e).text,
        )
        self._buffers = _Buffers(2 * settings.max_concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

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
    def _raw_list_page(
        self, name_prefix: str, token: str | None
    ) -> tuple[list[tuple[str, int, int, dict[str, str] | None]], str | None]:
        """One page of (name, size, modified ms, tags or None) and the next page's token."""

    # ---- plumbing

    def _name(self, blob_id: str) -> str:
        try:
            check_blob_id(blob_id)
        except ValueError as e:
            raise BlobStoreError(f"{self.url}: {e}") from None
        return self.prefix + blob_id

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The store's bounded I/O pool, created on first use."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.settings.max_concurrency,
                    thread_name_prefix=f"ssb-{self.scheme}-{self.root}"[:40],
                )
            return self._pool

    def _call(self, fn: Callable[[], T], what: str, blob_id: str | None = None) -> T:
        """Run one primitive under the retry policy; translate what escapes into our errors."""
        try:
            return self.policy.call(fn, describe=f"{what} ({self.url} at {self.endpoint})")
        except (StateBackendError, RangeOutside):
            raise
        except Exception as e:
            raise self._translate(e, what, blob_id) from None

    def _kind(self, exc: BaseException) -> ErrorInfo:
        """The backend's classification, except that our own errors are always final."""
        if isinstance(exc, RangeOutside):
            return ErrorInfo("range", "range outside the blob")
        if isinstance(exc, StateBackendError):
            return ErrorInfo("final", str(exc))
        return self._classify(exc)

    def _translate(self, exc: BaseException, what: str, blob_id: str | None) -> BlobStoreError:
        info = self._kind(exc)
        if info.kind == "not_found" and blob_id is not None:
            return BlobNotFoundError(blob_id, self.url)
        if info.kind == "exists" and blob_id is not None:
            return BlobExistsError(blob_id)
        if info.kind == "no_container":
            return BlobStoreError(
                f"{what}: the {self._root_word} {self.root!r} does not exist at {self.endpoint} "
                f"({info.text}); ensure_ready() creates it"
            )
        if info.kind == "bad_credentials":
            return BlobStoreError(
                f"{what}: the credentials for {self.url} cannot be used to sign a request to "
                f"{self.endpoint} ({info.text}); check the account key (its value is not shown)"
            )
        if info.kind == "auth":
            return BlobStoreError(
                f"{what}: {self.endpoint} refused the credentials for {self.url} ({info.text}); "
                "check the account, keys and permissions"
            )
        return BlobStoreError(f"{what} ({self.url}) failed: {info.text}")

    _root_word = "container"

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
        upload.put(self, blob_id, opener, size, metadata=metadata, ttl_seconds=ttl_seconds)

    def _block_size_for(self, size: int) -> int:
        """The block size of a put of `size` bytes (S3 grows it to stay within 10,000 parts)."""
        return self.settings.block_size

    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        upload.create(self, blob_id, data, metadata=metadata)

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        return read.get(self, blob_id, sink, offset, length)

    def delete(self, blob_id: str) -> None:
        name = self._name(blob_id)
        self._call(lambda: self._raw_delete(name), f"delete blob {blob_id!r}", blob_id=None)

    def remove_ttl(self, blob_id: str) -> None:
        ttl.remove_ttl(self, blob_id)

    def set_ttl(self, blob_id: str, ttl_seconds: float) -> None:
        ttl.set_ttl(self, blob_id, ttl_seconds)

    def stat(self, blob_id: str) -> BlobInfo:
        name = self._name(blob_id)
        size, modified, raw_meta, tags = self._call(
            lambda: self._raw_stat(name), f"stat blob {blob_id!r}", blob_id
        )
        if tags is None:
            tags = self._call(lambda: self._raw_get_tags(name), f"stat blob {blob_id!r}", blob_id)
        return BlobInfo(blob_id, size, modified, ttl.parse_expiry(tags), decode_metadata(raw_meta))

    def _pages(self, prefix: str) -> Iterator[tuple[str, int, int, dict[str, str] | None]]:
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
            yield BlobInfo(name[len(self.prefix) :], size, modified, ttl.parse_expiry(tags))

    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        return ttl.sweep_expired(self, now_ms, keep)

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
