"""The BlobStore contract every backend (local directory, Azure Blob, S3) implements.

A blob store holds immutable named byte strings ("blobs") with string metadata and an optional TTL.
Blob ids are relative names made of [A-Za-z0-9._-/=] (see `check_blob_id`); the store maps
them to its own namespace under the configured prefix.

Contract (the parametrised contract tests in tests/ check every backend against it):
- put: writes the blob from a re-openable source; a retried attempt calls the opener again, so no
  attempt ever sees a half-consumed stream. A TTL, when given, makes the blob expire unless
  remove_ttl is called first. After put returns, the blob is durable.
- create: like put from bytes, but fails with BlobExistsError if the name is taken (exclusive create).
- get: streams bytes [offset, offset + length) into `sink.write` in order, each byte exactly once;
  a backend that retries a broken read resumes after the last byte it delivered.
- delete: idempotent; deleting a missing blob succeeds. delete_many deletes many the same way, in as few
  requests as the service allows (delete_batch_size per request).
- remove_ttl: the blob no longer expires; BlobNotFoundError if it does not exist (a referenced blob
  that vanished is data loss, never something to paper over).
- set_ttl: the blob expires `ttl_seconds` from now unless remove_ttl is called first (a permanent blob
  that no retained checkpoint references any more goes back to being an unreferenced upload);
  BlobNotFoundError if it does not exist.
- sweep_expired: deletes blobs whose TTL has passed, and only those; a `keep(blob_id)` predicate,
  asked only about expired blobs, spares the ones it answers True for (those a checkpoint references).
- Errors: BlobNotFoundError for missing blobs, BlobStoreError (or RetryBudgetExceededError) for
  failures that outlasted retries. No error message contains a secret.

Optional capability (the local-directory store has it; the default says "no"):
- local_path: the blob's bytes as one local regular file, which restore may hard-link into place
  instead of copying (after verifying its checksum). Such a file is the store's: nobody else may write,
  chmod or utime it, because a hard link shares the inode and the inode's mtime is the blob's age.
- whole_file_blobs: backups store every file as one blob whatever the chunk size, so that every
  file can take that path.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

#: Blob ids are at most this long, made of these characters, in '/'-separated non-empty segments.
MAX_BLOB_ID_CHARS = 1024
_BLOB_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/=")


def check_blob_id(blob_id: str) -> str:
    """Return `blob_id` if it is a well-formed relative blob name, else raise ValueError."""
    if not isinstance(blob_id, str) or not blob_id:
        raise ValueError(f"blob id {blob_id!r} is empty or not a string")
    if len(blob_id) > MAX_BLOB_ID_CHARS:
        raise ValueError(f"blob id longer than {MAX_BLOB_ID_CHARS} characters")
    if not set(blob_id) <= _BLOB_ID_CHARS:
        raise ValueError(f"blob id {blob_id!r} has characters outside [A-Za-z0-9._-/=]")
    parts = blob_id.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"blob id {blob_id!r} has an empty, '.' or '..' segment")
    return blob_id


class Sink(Protocol):
    """Where get() delivers bytes."""

    def write(self, data: bytes, /) -> int | None: ...


Opener = Callable[[], BinaryIO]
"""Returns a fresh stream positioned at the first byte to upload; called once per attempt."""


@dataclass(frozen=True)
class BlobInfo:
    """What a listing or stat tells about one blob."""

    blob_id: str
    size: int
    modified_ms: int
    expires_at_ms: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


class BlobStore(ABC):
    """Abstract blob store; see the module docstring for the contract."""

    #: The store's URL with any secret removed; safe to log.
    url: str

    #: True: a backup stores each file as a single blob (the chunk size does not apply), because the
    #: store serves blobs as local files that a restore hard-links whole (see local_path).
    whole_file_blobs: bool = False

    def local_path(self, blob_id: str) -> Path | None:
        """Where the bytes of `blob_id` would lie as one regular file on a local filesystem, or None
        if this store keeps no such file (every remote store). The blob may not exist.

        Callers may read the file or hard-link it, and must never write, truncate, chmod or utime it
        (through any link): its inode is the blob, and its mtime the blob's age that GC's grace reads.
        `local_files_durable` says whether its bytes are on stable storage once put() returned."""
        return None

    @property
    def local_files_durable(self) -> bool:
        """Whether the files local_path names were fsynced by put() (False: a caller that needs them
        durable must sync them itself)."""
        return False

    @abstractmethod
    def ensure_ready(self) -> None:
        """Create the container/bucket/directory if missing and check that it is usable.

        Raises BlobStoreError with a message naming the URL (never a secret) when the endpoint is
        unreachable or the credentials are refused."""

    @abstractmethod
    def put(
        self,
        blob_id: str,
        opener: Opener,
        size: int,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        """Store `size` bytes read from `opener()` under `blob_id`, overwriting any previous blob."""

    def put_bytes(
        self,
        blob_id: str,
        data: bytes,
        *,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        """Store `data` under `blob_id`."""
        self.put(blob_id, lambda: io.BytesIO(data), len(data), metadata=metadata, ttl_seconds=ttl_seconds)

    @abstractmethod
    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        """Store `data` under `blob_id` only if no blob has that name; else raise BlobExistsError."""

    @abstractmethod
    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        """Stream bytes [offset, offset+length) (to the end if length is None) into `sink`.

        Returns the number of bytes delivered. Raises BlobNotFoundError if the blob is missing and
        BlobStoreError if it is shorter than the range asked for."""

    def get_bytes(self, blob_id: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return bytes [offset, offset+length) of the blob."""
        buf = io.BytesIO()
        self.get(blob_id, buf, offset, length)
        return buf.getvalue()

    @abstractmethod
    def delete(self, blob_id: str) -> None:
        """Delete the blob; succeeds if it does not exist."""

    #: The most blobs one delete request of this store's service removes (S3's DeleteObjects: 1000,
    #: Azure's blob batch: 256); 1 where each delete is its own request or system call.
    delete_batch_size: int = 1

    def delete_many(self, blob_ids: Iterable[str]) -> None:
        """Delete every blob of `blob_ids`, each as delete() would (a missing one is no error), in
        requests of up to `delete_batch_size` blobs. Raises on the first failure that outlasted the
        retries; some of the blobs may then be gone and the others not (deleting is idempotent, so
        the caller may simply repeat)."""
        for blob_id in blob_ids:
            self.delete(blob_id)

    @abstractmethod
    def remove_ttl(self, blob_id: str) -> None:
        """Make the blob permanent. Raises BlobNotFoundError if it does not exist."""

    @abstractmethod
    def set_ttl(self, blob_id: str, ttl_seconds: float) -> None:
        """Make the blob expire `ttl_seconds` from now. Raises BlobNotFoundError if it does not exist."""

    @abstractmethod
    def stat(self, blob_id: str) -> BlobInfo:
        """Size, modification time, expiry and metadata. Raises BlobNotFoundError if missing."""

    def exists(self, blob_id: str) -> bool:
        """Whether a blob of that name exists."""
        from ..errors import BlobNotFoundError

        try:
            self.stat(blob_id)
        except BlobNotFoundError:
            return False
        return True

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[BlobInfo]:
        """Every blob whose id starts with `prefix` (expires_at_ms/metadata may be left empty)."""

    @abstractmethod
    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        """Delete every blob whose TTL expired at or before `now_ms` (default: now) unless `keep(blob
        id)` says True (asked about expired blobs only, on the calling thread); return the count."""

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing to release
        """Release connections; the store is unusable afterwards."""
