"""The checkpoint topic of a Kafka checkpoint log (kafka.py), as its writer and reader share it: the
clients' settings, the topic's partition count (fixed: a query's records go to the partition Kafka's
default partitioner picks for its id, `partition_for_key`), and the last client error for messages.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from .base import CheckpointLogError

_client_log = logging.getLogger("spark_statebackend.checkpointlog.kafka.librdkafka")  # name kept


class _ClientLog:
    """Where librdkafka's log lines go. The conditions it shouts about here (connection refused by a
    dead broker, a fenced producer) reach the caller as our own errors, which name the last client
    error; so its lines are demoted to DEBUG, tagged with librdkafka's own level."""

    def log(self, level: int, msg: str, *args: object) -> None:
        if _client_log.isEnabledFor(logging.DEBUG):
            _client_log.debug("[%s] " + msg, logging.getLevelName(level), *args)


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (Java), as a signed 32-bit int."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & ~3
    extra = length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default (Java) partitioner and librdkafka's murmur2 pick for `key`."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class KafkaTopic:
    """One checkpoint topic and the admin client that reads its metadata (module doc)."""

    def __init__(self, bootstrap: str, name: str, partitions: int, client_extra: dict[str, str]) -> None:
        self.bootstrap = bootstrap
        self.name = name
        self.url = f"kafka://{bootstrap}/{name}"
        self.partitions = partitions  # what the option says; the topic must have exactly this many
        self.client_conf: dict[str, Any] = {
            **client_extra,
            "bootstrap.servers": bootstrap,
            "logger": _ClientLog(),
            "error_cb": self.on_client_error,
        }
        self._admin: AdminClient | None = None
        self._known_partitions: int | None = None
        self.last_client_error: str | None = None

    def on_client_error(self, err: KafkaError) -> None:
        # Runs inside poll()/flush() of whichever client; it only records, never raises.
        self.last_client_error = err.str()
        _client_log.debug("%s: client error %s", self.url, err)

    def hint(self) -> str:
        """The last client error, for messages (librdkafka's own lines are demoted to DEBUG)."""
        return f" (last client error: {self.last_client_error})" if self.last_client_error else ""

    def admin(self) -> AdminClient:
        if self._admin is None:
            # An admin handle is a producer to librdkafka, which would auto-create a topic on a
            # metadata request for it: reading a missing log must not create it.
            self._admin = AdminClient({**self.client_conf, "allow.auto.create.topics": False})
        return self._admin

    def partition_count(self, deadline: float) -> int | None:
        """The topic's partition count from metadata, None if the topic does not exist."""
        if self._known_partitions is not None:
            return self._known_partitions
        try:
            md = self.admin().list_topics(topic=self.name, timeout=remaining(deadline))
        except KafkaException as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: cannot read metadata of topic {self.name}: "
                f"{kerr(e).str()}{self.hint()}"
            ) from e
        t = md.topics.get(self.name)
        if t is None or (t.error is not None and t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if t.error is not None:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.name} is unusable: {t.error.str()}"
            )
        count = len(t.partitions)
        if count != self.partitions:
            # Records are placed by hash of the query id over the partition count: a topic whose
            # count differs from what writers assume would scatter one query over two partitions.
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.name} has {count} partitions but the option "
                f"'partitions' says {self.partitions}; never change a checkpoint topic's partition count"
            )
        self._known_partitions = count
        return count

    def close(self) -> None:
        self._admin = None


def kerr(e: KafkaException) -> KafkaError:
    """The KafkaError an exception carries (a generic one if it carries none)."""
    arg = e.args[0] if e.args else None
    return arg if isinstance(arg, KafkaError) else KafkaError(KafkaError._FAIL, str(e))


def remaining(deadline: float) -> float:
    """Seconds left until `deadline`, at least a small positive value (librdkafka rejects 0 as 'wait')."""
    return max(deadline - time.monotonic(), 0.001)


def discard_producer(producer: Producer) -> None:
    """Drop a producer without waiting for an unreachable broker: purge what is queued first, so
    close() has nothing to flush."""
    with contextlib.suppress(KafkaException, RuntimeError):
        producer.purge(in_queue=True, in_flight=True, blocking=False)
        producer.flush(0)
    # close() tries to abort a transaction a fenced or timed-out producer can no longer abort, and
    # says so in a RuntimeWarning: expected here, the outcome is already reported to the caller.
    with warnings.catch_warnings(), contextlib.suppress(KafkaException, RuntimeError):
        warnings.simplefilter("ignore", RuntimeWarning)
        producer.close()
