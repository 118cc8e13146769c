"""Checkpoint logs: where combined checkpoints (CheckpointV2) are made durable, and `open_checkpoint_log`,
which picks an implementation by URL scheme.

    file:///abs/dir               FileCheckpointLog, the embedded default (one directory per query)
    kafka://host:port[,host:port]/topic
                                  KafkaCheckpointLog (confluent-kafka, transactional producer)

Contract (tests/test_checkpointlog.py runs one parametrised suite against every implementation):
- create_resources() creates what the log needs if missing (directory, topic) and then validates it;
  validate_resources() only checks (and fails with CheckpointLogError naming the resource).
- acquire_writer(query_id) makes this instance the only writer of that query's checkpoints: every
  earlier writer (another driver, a zombie) fails with CheckpointFencedError on its next write.
  Call it when a query starts, BEFORE read_latest, so that no zombie can commit after the read.
  write() acquires implicitly on first use.
- write(checkpoint) returns only once the record is durable and visible to read_latest. If it
  raises, the caller must treat the checkpoint as not committed (CheckpointLogError says when the
  outcome is unknown: `outcome_unknown`); a fenced writer raises CheckpointFencedError for good.
- read_latest(query_id) returns the newest committed checkpoint of the query (log order), or None
  when the log has none. read_history(query_id) returns every retained checkpoint, oldest first.
  A malformed record raises CorruptCheckpointError naming the topic/partition/offset or file.
- retain(query_id, keep_last) deletes all but the newest `keep_last` checkpoints where the log can
  (file log); a compacted Kafka topic keeps only the newest record per query on its own, so there
  it returns 0. Retained history is therefore "at least the latest", never a promise of more.
- Every operation is bounded by a configurable timeout; nothing blocks forever.
- Instances are safe to share between threads: operations on one instance are serialised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import TracebackType
from urllib.parse import urlparse

from ...common.urls import file_url_path, redact_url, refuse_userinfo
from ...errors import CheckpointError, ConfigError
from ..checkpoint import CheckpointV2

__all__ = [
    "SCHEMES",
    "CheckpointFencedError",
    "CheckpointLog",
    "CheckpointLogError",
    "open_checkpoint_log",
]

SCHEMES = ("file", "kafka")


class CheckpointLogError(CheckpointError):
    """A checkpoint log operation failed (unreachable, timed out, misconfigured resource).

    `outcome_unknown` is True when a write may or may not have been committed (a commit timed out);
    either way the caller must not act as if it had been."""

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class CheckpointFencedError(CheckpointLogError):
    """A newer writer for the same query exists; this writer can never write that query again."""


class CheckpointLog(ABC):
    """Abstract checkpoint log; see the module docstring for the contract."""

    #: The log's URL with any secret removed; safe to log.
    url: str

    @abstractmethod
    def create_resources(self) -> None:
        """Create the directory or topic if missing, then validate_resources()."""

    @abstractmethod
    def validate_resources(self) -> None:
        """Check that the log exists and is usable; raise CheckpointLogError naming what is wrong."""

    @abstractmethod
    def acquire_writer(self, query_id: str) -> None:
        """Fence every earlier writer of `query_id`; this instance becomes its only writer.
        Idempotent on an instance that already is the writer; an instance that was fenced raises
        CheckpointFencedError (a fenced driver must stop, not reclaim the query)."""

    @abstractmethod
    def write(self, checkpoint: CheckpointV2) -> None:
        """Durably append `checkpoint` to its query's log; see the contract for failure semantics."""

    @abstractmethod
    def read_latest(self, query_id: str) -> CheckpointV2 | None:
        """The newest committed checkpoint of `query_id`, or None if there is none."""

    @abstractmethod
    def read_history(self, query_id: str) -> list[CheckpointV2]:
        """Every retained checkpoint of `query_id`, oldest first."""

    def retain(self, query_id: str, keep_last: int) -> int:
        """Delete all but the newest `keep_last` (>= 1) checkpoints of `query_id` where the log
        supports deletion; return how many were deleted. The default keeps everything."""
        if keep_last < 1:
            raise ValueError(
                f"keep_last={keep_last} must be at least 1: the latest checkpoint is never deleted"
            )
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, most logs hold nothing to release
        """Release clients and files. Idempotent."""

    def __enter__(self) -> CheckpointLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def open_checkpoint_log(
    url: str, options: Mapping[str, str] | None = None, *, key: str = "checkpoint log URL"
) -> CheckpointLog:
    """Return the CheckpointLog for `url`. `options` carries implementation settings as strings (see
    docs/stores-and-logs.md "Checkpoint log"); `key` is the configuration key named in errors.
    Nothing is contacted and nothing is created until create_resources()/validate_resources() or the
    first operation.

    A URL holding credentials (`kafka://user:pass@host:9092/topic`) is refused with a ConfigError
    that shows it redacted (common/urls.py): credentials go in the options."""
    refuse_userinfo(url, key)
    opts = dict(options or {})
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        from .file import FileCheckpointLog

        return FileCheckpointLog(file_url_path(url, key), opts, key=key)
    if scheme == "kafka":
        try:
            from .kafka import KafkaCheckpointLog
        except ImportError as e:
            from ...common.extras import missing_extra

            raise missing_extra(key, "kafka://", "kafka", e) from None

        return KafkaCheckpointLog.from_url(url, opts, key=key)
    raise ConfigError(
        key,
        f"unknown checkpoint log URL scheme {parsed.scheme!r} in {redact_url(url)!r}; use one of {SCHEMES}",
    )
