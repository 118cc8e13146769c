"""What the Azure and S3 blob stores share: options, TTL tags, retries, block uploads, ordered parallel reads.

`CloudBlobStore` implements the BlobStore contract once, on top of a handful of primitive SDK calls
(`_raw_*`) that each backend supplies. Every primitive is one request (or one streamed response) and
is wrapped in the shared `RetryPolicy` by this class, so retry, error translation and secret-scrubbing
behave the same on every cloud.

put(blob, opener, size):
  [1] size <= block_size: one request; every attempt calls `opener()` afresh and reads `size` bytes.
  [2] larger: begin an upload (S3: a multipart upload; Azure: a random block-id prefix), then read
      the source front to back once, handing each block to the bounded I/O pool, which stages it
      (Azure Put Block / S3 UploadPart). A staged block that must be retried re-opens the input
      (`opener()`, seek to the block) rather than trusting memory shared with the failed attempt.
  [3] commit the block list with metadata and the TTL tag. Until then readers see the previous
      blob (or none): a failed put never damages what was there. On failure the upload is aborted
      (S3) or left to the service's garbage collection of uncommitted blocks (Azure, 7 days).
get(blob, sink, offset, length):
  [1] split [offset, end) into `download_chunk_size` ranges; one range is fetched in the caller's
      thread, several go to the pool, at most `max_concurrency` ahead of the one being delivered.
  [2] each range is a ranged GET retried on its own; a retry resumes after the last byte received.
  [3] ranges are written to the sink strictly in order, each exactly once, only when complete.
Memory: blocks and ranges held in memory are limited store-wide by a semaphore of
2 * max_concurrency buffers (so at most that many * block/chunk size bytes are buffered).
TTL: the expiry time (epoch ms, zero-padded to 16 digits so that string order is time order) is a
tag named `ssb_expires_at_ms`; remove_ttl deletes the tag; sweep_expired lists the prefix and
deletes blobs whose tag is in the past. Cloud lifecycle rules work in whole days and need the
management plane, so the sweep is ours.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import re
import threading
import time
import urllib.parse
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar, Generic, TypeVar

from ..errors import BlobExistsError, BlobNotFoundError, BlobStoreError, ConfigError, StateBackendError
from ..index import check_blob_id
from ..retry import RetryPolicy
from ..units import (
    deprecated_name,
    format_duration,
    format_size,
    parse_duration,
    parse_legacy_seconds,
    parse_size,
)
from .base import BlobInfo, BlobStore, Opener, Sink

log = logging.getLogger("spark_statebackend.blobstore")

T = TypeVar("T")
U = TypeVar("U")  # what a backend returns for a staged block (S3: the part's ETag)

MiB = 1024 * 1024
TTL_TAG = "ssb_expires_at_ms"

# ---------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class CloudSettings:
    """Options every cloud store accepts (see the README section "Blob store URLs and options")."""

    retry_budget_seconds: float = 120.0
    retry_initial_backoff_seconds: float = 0.2
    retry_max_backoff_seconds: float = 10.0
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0
    max_concurrency: int = 8
    block_size: int = 8 * MiB
    download_chunk_size: int = 8 * MiB


#: Duration options: name -> (deprecated name whose value is a bare number of seconds, zero allowed).
_DURATION_OPTIONS: dict[str, tuple[str, bool]] = {
    "retry_budget": ("retry_budget_seconds", True),  # 0: no retries
    "retry_initial_backoff": ("retry_initial_backoff_seconds", False),
    "retry_max_backoff": ("retry_max_backoff_seconds", False),
    "connect_timeout": ("connect_timeout_seconds", False),
    "read_timeout": ("read_timeout_seconds", False),
}
_SIZE_OPTIONS = ("block_size", "download_chunk_size")
_COMMON_OPTIONS = (*_DURATION_OPTIONS, *_SIZE_OPTIONS, "max_concurrency")
_LEGACY_OPTIONS = {old: new for new, (old, _) in _DURATION_OPTIONS.items()}


def parse_settings(
    options: Mapping[str, str], key: str, backend_keys: Iterable[str], *, min_block_size: int = 1
) -> CloudSettings:
    """Read the common options; reject unknown ones (a typo must not silently mean a default).

    Durations and sizes use Spark's grammar (units.py: `retry_budget=2min`, `block_size=8m`); the
    deprecated `*_seconds` names still take a bare number of seconds, with a warning."""
    known = set(_COMMON_OPTIONS) | set(_LEGACY_OPTIONS) | set(backend_keys)
    unknown = sorted(set(options) - known)
    if unknown:
        listed = sorted(set(_COMMON_OPTIONS) | set(backend_keys))
        raise ConfigError(
            f"{key} options", f"unknown option(s) {', '.join(unknown)}; known: {', '.join(listed)}"
        )
    values: dict[str, Any] = {}
    for name, (old, zero_ok) in _DURATION_OPTIONS.items():
        field_name = f"{name}_seconds"
        if name in options and old in options:
            raise ConfigError(
                f"{key} option {old}", f"deprecated spelling of {name}, which is also set; keep only {name}"
            )
        if name in options:
            values[field_name] = parse_duration(options[name], f"{key} option {name}", positive=not zero_ok)
        elif old in options:
            example = format_duration(getattr(CloudSettings(), field_name))
            deprecated_name(f"{key} option {old}", name, example)
            values[field_name] = parse_legacy_seconds(
                options[old], f"{key} option {old}", positive=not zero_ok
            )
    for name in _SIZE_OPTIONS:
        if name in options:
            values[name] = parse_size(options[name], f"{key} option {name}")
    if "max_concurrency" in options:
        raw = str(options["max_concurrency"])
        try:
            values["max_concurrency"] = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{key} option max_concurrency", f"{raw!r} is not a whole number") from None
        if values["max_concurrency"] < 1:
            raise ConfigError(f"{key} option max_concurrency", f"must be positive, got {raw!r}")
    settings = CloudSettings(**values)
    if settings.block_size < min_block_size:
        raise ConfigError(
            f"{key} option block_size", f"must be at least {format_size(min_block_size)} for this store"
        )
    if settings.retry_max_backoff_seconds < settings.retry_initial_backoff_seconds:
        raise ConfigError(f"{key} option retry_max_backoff", "must be >= retry_initial_backoff")
    return settings


def split_url(url: str, scheme: str, key: str, what: str) -> tuple[str, str]:
    """`scheme://<root>/<prefix>` -> (root, prefix), the prefix normalised to '' or 'a/b/'."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme.lower() != scheme or not parsed.netloc:
        raise ConfigError(key, f"expected {scheme}://<{what}>/<prefix>, got {url!r}")
    if parsed.query or parsed.fragment or parsed.params:
        raise ConfigError(
            key, f"{scheme} URL must not have a query or fragment: put options in the options map"
        )
    prefix = parsed.path.strip("/")
    if prefix:
        try:
            check_blob_id(prefix)
        except ValueError as e:
            raise ConfigError(key, f"bad prefix in {url!r}: {e}") from None
        prefix += "/"
    return parsed.netloc, prefix


# ---------------------------------------------------------------------------------------------------
# TTL tags and metadata encoding


def expiry_tag_value(expires_at_ms: int) -> str:
    return f"{expires_at_ms:016d}"


def parse_expiry(tags: Mapping[str, str] | None) -> int | None:
    value = (tags or {}).get(TTL_TAG)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        # Not ours to interpret; a blob with a garbled expiry is kept rather than deleted.
        return None


def expires_at(ttl_seconds: float | None) -> int | None:
    return None if ttl_seconds is None else int((time.time() + ttl_seconds) * 1000)


_PLAIN_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_ENCODED = "x_"
# Printable ASCII minus '%': anything else in a value is percent-encoded (headers are ASCII).
_SAFE_VALUE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def encode_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """Metadata as both clouds accept it: keys are lower-case identifiers (Azure requires C#
    identifiers, S3 lower-cases), values printable ASCII. Other keys and values are encoded
    reversibly, so any str -> str mapping round-trips."""
    out: dict[str, str] = {}
    for k, v in (metadata or {}).items():
        if _PLAIN_KEY.match(k) and not k.startswith(_ENCODED):
            name = k
        else:
            name = _ENCODED + base64.b32encode(k.encode()).decode().rstrip("=").lower()
        out[name] = urllib.parse.quote(v, safe=_SAFE_VALUE)
    return out


def decode_metadata(raw: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (raw or {}).items():
        name = k.lower()
        if name.startswith(_ENCODED):
            b32 = name[len(_ENCODED) :].upper()
            # A key that merely looks encoded (someone else's) is kept as it is.
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                name = base64.b32decode(b32 + "=" * (-len(b32) % 8)).decode()
        out[name] = urllib.parse.unquote(v)
    return out


# ---------------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class ErrorInfo:
    """What a backend makes of an SDK exception. `text` must already be free of secrets."""

    #: "not_found" | "no_container" | "exists" | "auth" (refused by the service) | "bad_credentials"
    #: (unusable before anything is sent, e.g. a key that cannot sign) | "range" | "transient" | "final"
    kind: str
    text: str


_URL_QUERY = re.compile(r"(https?://[^\s'\"?]*)\?[^\s'\"]*")
_SECRET_FIELDS = re.compile(
    r"(AccountKey|SharedAccessSignature|sig|Signature|aws_secret_access_key|SecretAccessKey|"
    r"X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|x-amz-security-token)=([^;&\s,'\"]+)",
    re.IGNORECASE,
)


class Scrubber:
    """Removes secrets from text meant for errors and logs: URL query strings (SAS tokens, presigned
    signatures), key=value pairs that name a secret, and the literal secrets the store was given."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first, so a secret that contains another is removed whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str, limit: int = 300) -> str:
        text = _URL_QUERY.sub(r"\1?<redacted>", text)
        text = _SECRET_FIELDS.sub(r"\1=<redacted>", text)
        for s in self._secrets:
            text = text.replace(s, "<redacted>")
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------
# Concurrency helpers


class _Buffers:
    """Store-wide limit on in-memory blocks/ranges. `take(block=False)` lets a reader that already
    holds buffers deliver one instead of waiting, which is what keeps ordered reads deadlock-free."""

    def __init__(self, n: int) -> None:
        self._sem = threading.BoundedSemaphore(n)

    def take(self, block: bool = True) -> bool:
        return self._sem.acquire(blocking=block)

    def give(self) -> None:
        self._sem.release()


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


class _RangeOutside(Exception):
    """Internal: a ranged read started at or beyond the end of the blob (HTTP 416)."""


# ---------------------------------------------------------------------------------------------------
# The shared store


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
        except (StateBackendError, _RangeOutside):
            raise
        except Exception as e:
            raise self._translate(e, what, blob_id) from None

    def _kind(self, exc: BaseException) -> ErrorInfo:
        """The backend's classification, except that our own errors are always final."""
        if isinstance(exc, _RangeOutside):
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
        name = self._name(blob_id)
        meta = encode_metadata(metadata)
        started = time.monotonic()
        if size <= self.settings.block_size:
            self._call(
                lambda: self._raw_put(
                    name, _read_block(opener, 0, size, blob_id), meta, expires_at(ttl_seconds)
                ),
                f"put blob {blob_id!r}",
                blob_id,
            )
        else:
            self._put_blocks(blob_id, name, opener, size, meta, ttl_seconds)
        log.debug("put blob %r (%d bytes) in %.3fs", blob_id, size, time.monotonic() - started)

    def _block_size_for(self, size: int) -> int:
        return self.settings.block_size

    def _put_blocks(
        self, blob_id: str, name: str, opener: Opener, size: int, meta: dict[str, str], ttl: float | None
    ) -> None:
        block = self._block_size_for(size)
        count = math.ceil(size / block)
        upload = self._call(
            lambda: self._raw_begin_blocks(name, meta, expires_at(ttl)), f"begin put {blob_id!r}"
        )
        window = self.settings.max_concurrency
        futures: list[Future[U]] = []
        pending: set[Future[U]] = set()
        try:
            with opener() as src:
                for i in range(count):
                    offset = i * block
                    n = min(block, size - offset)
                    data = _read_exact(src, n, blob_id)
                    self._buffers.take()
                    try:
                        fut = self.pool.submit(
                            self._stage_task, blob_id, name, upload, i, offset, n, data, opener
                        )
                    except BaseException:
                        self._buffers.give()
                        raise
                    fut.add_done_callback(lambda _f: self._buffers.give())
                    futures.append(fut)
                    pending.add(fut)
                    del data
                    if len(pending) >= window:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for f in done:
                            f.result()  # the first failed block fails the put
            staged = [f.result() for f in futures]
            self._call(
                lambda: self._raw_commit_blocks(name, upload, staged, meta, expires_at(ttl)),
                f"commit put of blob {blob_id!r} ({count} blocks)",
                blob_id,
            )
        except BaseException:
            for f in pending:
                f.cancel()
            wait(futures)
            try:
                self.policy.call(
                    lambda: self._raw_abort_blocks(name, upload), describe=f"abort put {blob_id!r}"
                )
            except Exception as e:  # the upload failed already; say so, then raise the real error
                log.warning("could not abort the failed put of blob %r: %s", blob_id, self._kind(e).text)
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
            return self._raw_stage_block(name, upload, index, payload)

        return self._call(once, f"put blob {blob_id!r} block {index} at {offset}", blob_id)

    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        name = self._name(blob_id)
        meta = encode_metadata(metadata)
        attempts = 0

        def once() -> None:
            nonlocal attempts
            attempts += 1
            try:
                self._raw_create(name, data, meta)
            except Exception as e:
                # A retried create that finds its own bytes there: an earlier attempt succeeded and
                # only its answer was lost. That is success, which makes create idempotent.
                if attempts > 1 and self._kind(e).kind == "exists" and self._holds(blob_id, data):
                    return
                raise

        self._call(once, f"create blob {blob_id!r}", blob_id)

    def _holds(self, blob_id: str, data: bytes) -> bool:
        try:
            return self.get_bytes(blob_id) == data
        except BlobNotFoundError:
            return False

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        name = self._name(blob_id)
        if offset < 0 or (length is not None and length < 0):
            raise BlobStoreError(f"get {blob_id!r}: negative offset or length ({offset}, {length})")
        started = time.monotonic()
        chunk = self.settings.download_chunk_size
        if length == 0:
            size = self.stat(blob_id).size
            if offset > size:
                raise self._outside(blob_id, size, offset, offset)
            return 0
        sizes: list[int] = []
        if length is None:
            # The size is learnt from the first range's answer; the rest is planned from it.
            try:
                first = self._fetch(blob_id, name, offset, chunk, sizes)
            except _RangeOutside:
                size = self.stat(blob_id).size
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

    def _outside(self, blob_id: str, size: int, start: int, end: int) -> BlobStoreError:
        return BlobStoreError(
            f"blob {blob_id!r} in {self.url} has {size} bytes; range [{start}, {end}) is outside it"
        )

    def _read_ordered(
        self, blob_id: str, name: str, sink: Sink, start: int, end: int, sizes: list[int]
    ) -> int:
        """Deliver [start, end) to the sink in order, fetching ranges in parallel (module doc, get)."""
        chunk = self.settings.download_chunk_size
        ranges = [(s, min(chunk, end - s)) for s in range(start, end, chunk)]
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
                while nxt is not None and len(inflight) < self.settings.max_concurrency:
                    # Wait for a buffer only while holding none; else deliver first (deadlock-free).
                    if not self._buffers.take(block=not inflight):
                        break
                    try:
                        inflight.append(
                            self.pool.submit(self._fetch_exact, blob_id, name, nxt[0], nxt[1], sizes)
                        )
                    except BaseException:
                        self._buffers.give()
                        raise
                    nxt = next(todo, None)
                head = inflight.popleft()
                try:
                    data = head.result()
                finally:
                    self._buffers.give()
                sink.write(data)
                delivered += len(data)
        except BaseException:
            for f in inflight:
                f.cancel()
            wait(inflight)
            for _ in inflight:
                self._buffers.give()
            raise
        return delivered

    def _fetch_exact(self, blob_id: str, name: str, start: int, n: int, sizes: list[int]) -> bytes:
        try:
            data = self._fetch(blob_id, name, start, n, sizes)
        except _RangeOutside:
            raise self._outside(blob_id, sizes[0] if sizes else start, start, start + n) from None
        if len(data) != n:
            raise self._outside(blob_id, sizes[0] if sizes else start + len(data), start, start + n)
        return data

    def _fetch(self, blob_id: str, name: str, start: int, n: int, sizes: list[int]) -> bytes:
        """Bytes [start, start+n) or fewer if the blob ends first; `sizes` records the blob size seen.

        A retry resumes after the last byte received, so a broken stream costs only what was lost."""
        buf = bytearray()

        def once() -> None:
            pos = start + len(buf)
            try:
                total, pieces = self._raw_open_range(name, pos, start + n)
            except Exception as e:
                if self._kind(e).kind == "range":
                    raise _RangeOutside from None
                raise
            if sizes and sizes[0] != total:
                raise BlobStoreError(f"blob {blob_id!r} in {self.url} changed size while being read")
            if not sizes:
                sizes.append(total)
            try:
                for piece in pieces:
                    buf.extend(piece)
            finally:
                close = getattr(pieces, "close", None)
                if close is not None:
                    close()

        self._call(once, f"get blob {blob_id!r} [{start}, {start + n})", blob_id)
        return bytes(buf)

    def delete(self, blob_id: str) -> None:
        name = self._name(blob_id)
        self._call(lambda: self._raw_delete(name), f"delete blob {blob_id!r}", blob_id=None)

    def remove_ttl(self, blob_id: str) -> None:
        name = self._name(blob_id)
        tags = self._call(lambda: self._raw_get_tags(name), f"remove TTL of blob {blob_id!r}", blob_id)
        if TTL_TAG in tags:
            rest = {k: v for k, v in tags.items() if k != TTL_TAG}
            self._call(lambda: self._raw_set_tags(name, rest), f"remove TTL of blob {blob_id!r}", blob_id)

    def set_ttl(self, blob_id: str, ttl_seconds: float) -> None:
        name = self._name(blob_id)
        what = f"set TTL of blob {blob_id!r}"
        tags = self._call(lambda: self._raw_get_tags(name), what, blob_id)
        tags[TTL_TAG] = expiry_tag_value(int((time.time() + ttl_seconds) * 1000))
        self._call(lambda: self._raw_set_tags(name, tags), what, blob_id)

    def stat(self, blob_id: str) -> BlobInfo:
        name = self._name(blob_id)
        size, modified, raw_meta, tags = self._call(
            lambda: self._raw_stat(name), f"stat blob {blob_id!r}", blob_id
        )
        if tags is None:
            tags = self._call(lambda: self._raw_get_tags(name), f"stat blob {blob_id!r}", blob_id)
        return BlobInfo(blob_id, size, modified, parse_expiry(tags), decode_metadata(raw_meta))

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
            yield BlobInfo(name[len(self.prefix) :], size, modified, parse_expiry(tags))

    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed = 0
        for name, tags in self._tagged(self._pages("")):
            blob_id = name[len(self.prefix) :]
            expiry = parse_expiry(tags)
            if expiry is None or expiry > now or (keep is not None and keep(blob_id)):
                continue
            value = tags[TTL_TAG]
            if self._call(
                lambda n=name, v=value: self._raw_delete_if_expired(n, v),  # type: ignore[misc]
                f"sweep: delete expired blob {blob_id!r}",
            ):
                log.info("swept expired blob %r (expired at %d)", blob_id, expiry)
                removed += 1
            else:
                log.info("sweep kept blob %r: its TTL changed since it was listed", blob_id)
        return removed

    def _tagged(
        self, listing: Iterator[tuple[str, int, int, dict[str, str] | None]]
    ) -> Iterator[tuple[str, dict[str, str]]]:
        """(name, tags) for every listed blob; tags the listing lacked are read on the pool, one batch
        of at most 4 * max_concurrency at a time. A blob deleted meanwhile is skipped."""

        def read(name: str) -> dict[str, str] | None:
            blob_id = name[len(self.prefix) :]
            try:
                return self._call(
                    lambda: self._raw_get_tags(name), f"sweep: read TTL of {blob_id!r}", blob_id
                )
            except BlobNotFoundError:
                return None

        batch: list[str] = []
        for name, _size, _modified, tags in listing:
            if tags is not None:
                yield name, tags
                continue
            batch.append(name)
            if len(batch) >= 4 * self.settings.max_concurrency:
                yield from (
                    (n, t) for n, t in zip(batch, self.pool.map(read, batch), strict=True) if t is not None
                )
                batch = []
        yield from ((n, t) for n, t in zip(batch, self.pool.map(read, batch), strict=True) if t is not None)

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
