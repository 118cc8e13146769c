"""Checkpoint logs: where combined checkpoints (CheckpointV2) are made durable, and `open_checkpoint_log`,
which picks an implementation by URL scheme.

    file:///abs/dir               FileCheckpointLog, the embedded default (one directory per query)
    kafka://host:port[,host:port]/topic
                                  KafkaCheckpointLog (confluent-kafka, transactional producer)

Contract (tests/checkpoints/test_checkpointlog.py runs one parametrised suite against every implementation):
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

from collections.abc import Mapping
from urllib.parse import urlparse

from ...common.urls import file_url_path, redact_url, refuse_userinfo
from ...errors import ConfigError
from .base import CheckpointFencedError, CheckpointLog, CheckpointLogError

__all__ = [
    "SCHEMES",
    "CheckpointFencedError",
    "CheckpointLog",
    "CheckpointLogError",
    "open_checkpoint_log",
]

SCHEMES = ("file", "kafka")


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
