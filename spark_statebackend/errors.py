"""The exceptions spark-statebackend raises.

Every error names what it is about (the blob, the file, the config key, the store instance) so that a
user reading one line of a log knows where to look. Callers catch the narrowest class they can handle;
`StateBackendError` is the root of all of them.
"""

from __future__ import annotations


class StateBackendError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(StateBackendError):
    """A configuration value is missing or invalid; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class BlobStoreError(StateBackendError):
    """A blob store operation failed for good (after any retries)."""


class BlobNotFoundError(BlobStoreError):
    """A blob that should exist does not."""

    def __init__(self, blob_id: str, store_url: str = "") -> None:
        where = f" in {store_url}" if store_url else ""
        super().__init__(f"blob {blob_id!r} not found{where}")
        self.blob_id = blob_id


class BlobExistsError(BlobStoreError):
    """An exclusive create found the name already taken."""

    def __init__(self, blob_id: str) -> None:
        super().__init__(f"blob {blob_id!r} already exists")
        self.blob_id = blob_id


class RetryBudgetExceededError(BlobStoreError):
    """A transient fault outlasted the retry budget."""


class ChecksumError(StateBackendError):
    """Bytes read back do not match the checksum recorded when they were written."""

    def __init__(self, what: str, blob_id: str, expected: str, actual: str) -> None:
        super().__init__(
            f"checksum mismatch for {what} (blob {blob_id!r}): expected {expected}, got {actual}"
        )
        self.what = what
        self.blob_id = blob_id


class CorruptIndexError(StateBackendError):
    """A stored index document is malformed, hostile or of an unknown newer schema version."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"bad index document {source!r}: {problem}")
        self.source = source
        self.problem = problem


class UnsafePathError(StateBackendError):
    """A name would escape the directory it belongs to (separator, '..', absolute path)."""


class CheckpointError(StateBackendError):
    """A checkpoint record is malformed or a checkpoint log operation failed."""


class RestoreError(StateBackendError):
    """A restore could not produce the requested snapshot."""
