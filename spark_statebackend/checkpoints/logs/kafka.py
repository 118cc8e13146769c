"""Checkpoint log on a compacted Kafka topic (confluent-kafka), as Samza's KafkaCheckpointManager:
one record per checkpoint, keyed by query id, written by a transactional producer whose
transactional.id derives from the query id, so a newer driver of a query fences a zombie one.

Writing (write()):
  [1] acquire_writer: a transactional producer with transactional.id = <prefix><query id>;
      init_transactions() bumps the producer epoch at the coordinator, which fences every older
      producer with that id and aborts its open transaction;
  [2] each checkpoint is its own transaction holding exactly one record, produced to the partition
      murmur2(query id) picks (Kafka's default partitioner, computed here so readers and writers
      agree without trusting a client default);
  [3] commit_transaction() within the write timeout; only its success reports the checkpoint
      committed. A fenced producer raises CheckpointFencedError, now and on every later write.

Reading (read_latest(), read_history()):
  [1] H = the partition's high watermark, asked with isolation READ_UNCOMMITTED (ListOffsets);
  [2] consume the partition from its beginning with isolation.level=read_committed and
      enable.partition.eof, keeping records of our key;
  [3] stop at the first end-of-partition event at offset >= H. With read_committed the end is the
      last stable offset, which an open transaction of *another* query can hold below H; stopping
      there could return a checkpoint older than one already committed, whose blobs cleanup may have
      deleted. So we keep waiting until the LSO passes H or the read timeout expires (an error).
  Why not "read until the high watermark": Tansu (our test broker) answers ListOffsets with the base
  offset of the last batch + 1, too low after a multi-record batch, while its Fetch responses carry
  the right watermark. The end-of-partition event comes from the Fetch response, so this reader is
  exact on Kafka and on Tansu; an H that is too low only makes [3] stop at the true end. Our own
  writes are single-record transactions, so on Tansu even ListOffsets is right for them. A poll
  timeout ("nothing came for a while") is never taken as the end: it would silently return an older
  checkpoint under load.

What Kafka gives and Tansu does not (see docs/stores-and-logs.md "Checkpoint log"): read_committed
hiding records of aborted or fenced transactions, and compaction.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from urllib.parse import urlparse

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic  # type: ignore[attr-defined]

from ...common.urls import redact_url
from ...errors import ConfigError
from ..checkpoint import CheckpointV2, check_query_id
from ._options import Options
from .base import CheckpointLog, CheckpointLogError
from .kafka_reader import Reader
from .kafka_topic import KafkaTopic, kerr, murmur2, partition_for_key, remaining
from .kafka_writer import TransactionalWriter

__all__ = ["KafkaCheckpointLog", "murmur2", "partition_for_key"]

log = logging.getLogger("spark_statebackend.checkpointlog.kafka")  # name kept from the flat layout

_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_HOSTPORT_RE = re.compile(r"[A-Za-z0-9._-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")

# Client settings this module relies on for its guarantees; a pass-through option may not change them.
_RESERVED_CLIENT_KEYS = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "enable.idempotence",
        "acks",
        "isolation.level",
        "enable.partition.eof",
        "enable.auto.commit",
        "group.id",
        "partitioner",
        "logger",
        "error_cb",
    }
)


class KafkaCheckpointLog(CheckpointLog):
    """Checkpoint log on one Kafka topic; see the module docstring for the protocol. Its topic is
    kafka_topic.py, its writer kafka_writer.py, its reader kafka_reader.py.

    Options (strings): replication.factor (3; -1 = broker default), partitions (1),
    write.timeout / read.timeout / admin.timeout (30s each), transaction.timeout (60s) (durations in
    Spark's grammar, common/units.py; the deprecated `*.ms` spellings take milliseconds),
    transactional.id.prefix ("spark-statebackend-checkpoints-"), kafka.<librdkafka key>
    passed to every client (security settings, ...), topic.<topic config> used when creating the
    topic (e.g. topic.min.insync.replicas)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        options: Mapping[str, str] | None = None,
        *,
        key: str = "checkpoint log URL",
    ) -> None:
        opts = Options(options or {}, key)
        self.replication_factor = opts.integer("replication.factor", 3, minimum=-1)
        if self.replication_factor == 0:
            raise ConfigError(
                f"{key} option 'replication.factor'", "0 is not a replication factor (use -1 or >= 1)"
            )
        self.partitions = opts.integer("partitions", 1, minimum=1, maximum=100_000)
        # Durations in Spark's grammar (common/units.py); the deprecated `*.ms` names still take milliseconds.
        self.write_timeout_s = opts.duration_ms("write.timeout", "30s", legacy_ms="write.timeout.ms") / 1000.0
        self.read_timeout_s = opts.duration_ms("read.timeout", "30s", legacy_ms="read.timeout.ms") / 1000.0
        self.admin_timeout_s = opts.duration_ms("admin.timeout", "30s", legacy_ms="admin.timeout.ms") / 1000.0
        self.transaction_timeout_ms = opts.duration_ms(
            "transaction.timeout", "60s", legacy_ms="transaction.timeout.ms", minimum_ms=1000
        )
        self.transactional_id_prefix = opts.string(
            "transactional.id.prefix", "spark-statebackend-checkpoints-"
        )
        client_extra = opts.prefixed("kafka.")
        self._topic_config = opts.prefixed("topic.")
        opts.finish()
        for name in client_extra:
            if name in _RESERVED_CLIENT_KEYS:
                raise ConfigError(
                    f"{key} option 'kafka.{name}'",
                    "is set by the checkpoint log itself and may not be overridden",
                )
        if "cleanup.policy" in self._topic_config:
            raise ConfigError(
                f"{key} option 'topic.cleanup.policy'", "the checkpoint topic is always compacted"
            )
        if not _TOPIC_RE.fullmatch(topic) or topic in (".", ".."):
            raise ConfigError(key, f"{topic!r} is not a valid Kafka topic name")
        self.bootstrap = bootstrap
        self.topic = topic
        self.url = f"kafka://{bootstrap}/{topic}"
        self._topic = KafkaTopic(bootstrap, topic, self.partitions, client_extra)
        self._writer = TransactionalWriter(
            self._topic, self.transactional_id_prefix, self.write_timeout_s, self.transaction_timeout_ms
        )
        self._reader = Reader(self._topic, self.read_timeout_s)

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, str], *, key: str) -> KafkaCheckpointLog:
        """`kafka://host:port[,host:port...]/topic`."""
        parsed = urlparse(url)
        hosts = parsed.netloc.split(",") if parsed.netloc else []
        if not hosts or not all(_HOSTPORT_RE.fullmatch(h) for h in hosts):
            raise ConfigError(
                key, f"kafka URL must be kafka://host:port[,host:port]/topic, got {redact_url(url)!r}"
            )
        topic = parsed.path[1:] if parsed.path.startswith("/") else ""
        if not topic or "/" in topic or parsed.query or parsed.fragment:
            raise ConfigError(
                key,
                f"kafka URL must name exactly one topic: kafka://host:port/topic, got {redact_url(url)!r}",
            )
        return cls(",".join(hosts), topic, options, key=key)

    # -- resources ------------------------------------------------------------------------------

    def create_resources(self) -> None:
        deadline = time.monotonic() + self.admin_timeout_s
        if self._topic.partition_count(deadline) is None:
            new = NewTopic(
                self.topic,
                num_partitions=self.partitions,
                replication_factor=self.replication_factor,
                config={**self._topic_config, "cleanup.policy": "compact"},
            )
            timeout = remaining(deadline)
            fut = self._topic.admin().create_topics(
                [new], operation_timeout=timeout, request_timeout=timeout
            )[self.topic]
            try:
                fut.result(timeout=remaining(deadline))
                log.info("%s: created checkpoint topic %s", self.url, self.topic)
            except KafkaException as e:
                if kerr(e).code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise CheckpointLogError(
                        f"checkpoint log {self.url}: cannot create topic {self.topic} "
                        f"(partitions={self.partitions}, replication.factor={self.replication_factor}): "
                        f"{kerr(e).str()}{self._topic.hint()}"
                    ) from e
            except TimeoutError as e:
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: creating topic {self.topic} timed out after "
                    f"{self.admin_timeout_s:.1f}s{self._topic.hint()}"
                ) from e
            self._wait_for_topic(deadline)
        self.validate_resources()

    def _wait_for_topic(self, deadline: float) -> None:
        # Metadata may lag a successful CreateTopics for a moment; poll it until the deadline.
        while self._topic.partition_count(deadline) is None:
            if time.monotonic() > deadline:
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: topic {self.topic} was created but never appeared"
                )
            time.sleep(0.05)

    def validate_resources(self) -> None:
        """The topic exists with the configured partition count and cleanup.policy=compact."""
        deadline = time.monotonic() + self.admin_timeout_s
        if self._topic.partition_count(deadline) is None:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.topic} does not exist "
                "(create_resources() creates it)"
            )
        res = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        try:
            configs = (
                self._topic.admin()
                .describe_configs([res], request_timeout=remaining(deadline))[res]
                .result(timeout=remaining(deadline))
            )
        except (KafkaException, TimeoutError) as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: cannot read the configuration of topic {self.topic}: "
                f"{e}{self._topic.hint()}"
            ) from e
        entry = configs.get("cleanup.policy")
        policy = entry.value if entry is not None else None
        if policy != "compact":
            # "delete" (or "compact,delete") would drop a query's only checkpoint after retention.ms.
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.topic} has cleanup.policy={policy!r}; "
                "a checkpoint topic must be cleanup.policy=compact"
            )

    # -- writing and reading --------------------------------------------------------------------

    def acquire_writer(self, query_id: str) -> None:
        check_query_id(query_id)
        self._writer.acquire(query_id)

    def write(self, checkpoint: CheckpointV2) -> None:
        self._writer.write(checkpoint)

    def read_latest(self, query_id: str) -> CheckpointV2 | None:
        check_query_id(query_id)
        records = self._reader.scan(query_id, latest_only=True)
        return records[-1] if records else None

    def read_history(self, query_id: str) -> list[CheckpointV2]:
        check_query_id(query_id)
        return self._reader.scan(query_id, latest_only=False)

    def close(self) -> None:
        self._writer.close()
        self._topic.close()
