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

What Kafka gives and Tansu does not (see README "Checkpoint log"): read_committed hiding records
of aborted or fenced transactions, and compaction.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from ...errors import ConfigError
from ..checkpoint import CheckpointV2, CorruptCheckpointError, check_query_id
from . import CheckpointFencedError, CheckpointLog, CheckpointLogError
from ._options import Options

log = logging.getLogger("spark_statebackend.checkpointlog.kafka")  # name kept from the flat layout
_client_log = logging.getLogger(log.name + ".librdkafka")


class _ClientLog:
    """Where librdkafka's log lines go. The conditions it shouts about here (connection refused by a
    dead broker, a fenced producer) reach the caller as our own errors, which name the last client
    error; so its lines are demoted to DEBUG, tagged with librdkafka's own level."""

    def log(self, level: int, msg: str, *args: object) -> None:
        if _client_log.isEnabledFor(logging.DEBUG):
            _client_log.debug("[%s] " + msg, logging.getLevelName(level), *args)


_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_HOSTPORT_RE = re.compile(r"[A-Za-z0-9._-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")

_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})

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


@dataclass
class _Writer:
    producer: Producer
    transactional_id: str
    fenced: str | None = None


class KafkaCheckpointLog(CheckpointLog):
    """Checkpoint log on one Kafka topic; see the module docstring for the protocol.

    Options (strings): replication.factor (3; -1 = broker default), partitions (1),
    write.timeout / read.timeout / admin.timeout (30s each), transaction.timeout (60s) (durations in
    Spark's grammar, units.py; the deprecated `*.ms` spellings take milliseconds),
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
        # Durations in Spark's grammar (units.py); the deprecated `*.ms` names still take milliseconds.
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
        self._client_conf: dict[str, Any] = {
            **client_extra,
            "bootstrap.servers": bootstrap,
            "logger": _ClientLog(),
            "error_cb": self._on_client_error,
        }
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._writers: dict[str, _Writer] = {}
        self._admin: AdminClient | None = None
        self._known_partitions: int | None = None
        self._last_client_error: str | None = None

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, str], *, key: str) -> KafkaCheckpointLog:
        """`kafka://host:port[,host:port...]/topic`."""
        parsed = urlparse(url)
        hosts = parsed.netloc.split(",") if parsed.netloc else []
        if not hosts or not all(_HOSTPORT_RE.fullmatch(h) for h in hosts):
            raise ConfigError(key, f"kafka URL must be kafka://host:port[,host:port]/topic, got {url!r}")
        topic = parsed.path[1:] if parsed.path.startswith("/") else ""
        if not topic or "/" in topic or parsed.query or parsed.fragment:
            raise ConfigError(
                key, f"kafka URL must name exactly one topic: kafka://host:port/topic, got {url!r}"
            )
        return cls(",".join(hosts), topic, options, key=key)

    # -- clients --------------------------------------------------------------------------------

    def _on_client_error(self, err: KafkaError) -> None:
        # Runs inside poll()/flush() of whichever client; it only records, never raises.
        self._last_client_error = err.str()
        _client_log.debug("%s: client error %s", self.url, err)

    def _client_hint(self) -> str:
        return f" (last client error: {self._last_client_error})" if self._last_client_error else ""

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            # An admin handle is a producer to librdkafka, which would auto-create a topic on a
            # metadata request for it: reading a missing log must not create it.
            self._admin = AdminClient({**self._client_conf, "allow.auto.create.topics": False})
        return self._admin

    def _topic_partitions(self, deadline: float) -> int | None:
        """The topic's partition count from metadata, None if the topic does not exist."""
        if self._known_partitions is not None:
            return self._known_partitions
        try:
            md = self._admin_client().list_topics(topic=self.topic, timeout=_remaining(deadline))
        except KafkaException as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: cannot read metadata of topic {self.topic}: "
                f"{_kerr(e).str()}{self._client_hint()}"
            ) from e
        t = md.topics.get(self.topic)
        if t is None or (t.error is not None and t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if t.error is not None:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.topic} is unusable: {t.error.str()}"
            )
        count = len(t.partitions)
        if count != self.partitions:
            # Records are placed by hash of the query id over the partition count: a topic whose
            # count differs from what writers assume would scatter one query over two partitions.
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.topic} has {count} partitions but the option "
                f"'partitions' says {self.partitions}; never change a checkpoint topic's partition count"
            )
        self._known_partitions = count
        return count

    # -- resources ------------------------------------------------------------------------------

    def create_resources(self) -> None:
        deadline = time.monotonic() + self.admin_timeout_s
        if self._topic_partitions(deadline) is None:
            new = NewTopic(
                self.topic,
                num_partitions=self.partitions,
                replication_factor=self.replication_factor,
                config={**self._topic_config, "cleanup.policy": "compact"},
            )
            timeout = _remaining(deadline)
            fut = self._admin_client().create_topics(
                [new], operation_timeout=timeout, request_timeout=timeout
            )[self.topic]
            try:
                fut.result(timeout=_remaining(deadline))
                log.info("%s: created checkpoint topic %s", self.url, self.topic)
            except KafkaException as e:
                if _kerr(e).code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise CheckpointLogError(
                        f"checkpoint log {self.url}: cannot create topic {self.topic} "
                        f"(partitions={self.partitions}, replication.factor={self.replication_factor}): "
                        f"{_kerr(e).str()}{self._client_hint()}"
                    ) from e
            except TimeoutError as e:
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: creating topic {self.topic} timed out after "
                    f"{self.admin_timeout_s:.1f}s{self._client_hint()}"
                ) from e
            self._wait_for_topic(deadline)
        self.validate_resources()

    def _wait_for_topic(self, deadline: float) -> None:
        # Metadata may lag a successful CreateTopics for a moment; poll it until the deadline.
        while self._topic_partitions(deadline) is None:
            if time.monotonic() > deadline:
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: topic {self.topic} was created but never appeared"
                )
            time.sleep(0.05)

    def validate_resources(self) -> None:
        """The topic exists with the configured partition count and cleanup.policy=compact."""
        deadline = time.monotonic() + self.admin_timeout_s
        if self._topic_partitions(deadline) is None:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.topic} does not exist "
                "(create_resources() creates it)"
            )
        res = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        try:
            configs = (
                self._admin_client()
                .describe_configs([res], request_timeout=_remaining(deadline))[res]
                .result(timeout=_remaining(deadline))
            )
        except (KafkaException, TimeoutError) as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: cannot read the configuration of topic {self.topic}: "
                f"{e}{self._client_hint()}"
            ) from e
        entry = configs.get("cleanup.policy")
        policy = entry.value if entry is not None else None
        if policy != "compact":
            # "delete" (or "compact,delete") would drop a query's only checkpoint after retention.ms.
            raise CheckpointLogError(
                f"checkpoint log {self.url}: topic {self.topic} has cleanup.policy={policy!r}; "
                "a checkpoint topic must be cleanup.policy=compact"
            )

    # -- writing --------------------------------------------------------------------------------

    def acquire_writer(self, query_id: str) -> None:
        check_query_id(query_id)
        with self._write_lock:
            self._writer(query_id, time.monotonic() + self.write_timeout_s, what="acquiring the writer")

    def _writer(self, query_id: str, deadline: float, what: str) -> _Writer:
        w = self._writers.get(query_id)
        if w is not None:
            if w.fenced is not None:
                raise self._fenced_error(query_id, w, what)
            return w
        tid = self.transactional_id_prefix + query_id
        conf = {
            **self._client_conf,
            "transactional.id": tid,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "transaction.timeout.ms": self.transaction_timeout_ms,
            # librdkafka requires message.timeout.ms <= transaction.timeout.ms.
            "message.timeout.ms": min(int(self.write_timeout_s * 1000), self.transaction_timeout_ms),
        }
        producer = Producer(conf)
        try:
            producer.init_transactions(_remaining(deadline))
        except KafkaException as e:
            _discard(producer)
            err = _kerr(e)
            if err.code() in _FENCED_CODES:
                raise CheckpointFencedError(
                    f"checkpoint log {self.url}: {what} for query {query_id} failed: transactional.id {tid} "
                    f"was fenced while initialising: {err.str()}"
                ) from e
            raise CheckpointLogError(
                f"checkpoint log {self.url}: {what} for query {query_id} failed: could not initialise "
                f"transactions (transactional.id {tid}) within {self.write_timeout_s:.1f}s: {err.str()}"
                f"{self._client_hint()}; nothing was committed"
            ) from e
        w = _Writer(producer, tid)
        self._writers[query_id] = w
        return w

    def _fenced_error(self, query_id: str, w: _Writer, what: str) -> CheckpointFencedError:
        return CheckpointFencedError(
            f"checkpoint log {self.url}: {what} for query {query_id} NOT committed: this writer "
            f"(transactional.id {w.transactional_id}) was fenced by a newer writer of the same query "
            f"({w.fenced}); another driver owns the query now"
        )

    def write(self, checkpoint: CheckpointV2) -> None:
        query_id = checkpoint.query_id
        what = f"checkpoint {checkpoint.checkpoint_id}"
        with self._write_lock:
            deadline = time.monotonic() + self.write_timeout_s
            w = self._writer(query_id, deadline, what)
            try:
                partitions = self._topic_partitions(deadline)
            except CheckpointLogError as e:
                raise CheckpointLogError(f"{e}; {what} for query {query_id} was NOT committed") from e
            if partitions is None:
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: {what} for query {query_id} NOT committed: "
                    f"topic {self.topic} does not exist (create_resources() creates it)"
                )
            key = query_id.encode()
            stage = "begin"
            try:
                w.producer.begin_transaction()
                stage = "produce"
                w.producer.produce(
                    self.topic,
                    key=key,
                    value=checkpoint.to_json(),
                    partition=partition_for_key(key, partitions),
                )
                stage = "commit"
                # commit_transaction flushes and fails if the record was not delivered.
                w.producer.commit_transaction(_remaining(deadline))
            except (KafkaException, BufferError) as e:
                self._write_failed(query_id, w, e, stage, what, deadline)
            log.debug("%s: committed %s for query %s", self.url, what, query_id)

    def _write_failed(
        self, query_id: str, w: _Writer, exc: Exception, stage: str, what: str, deadline: float
    ) -> None:
        err = _kerr(exc) if isinstance(exc, KafkaException) else None
        if err is not None and err.code() in _FENCED_CODES:
            w.fenced = err.str()
            _discard(w.producer)
            raise self._fenced_error(query_id, w, what) from exc
        outcome_unknown = stage == "commit"
        if err is not None and err.txn_requires_abort():
            try:
                w.producer.abort_transaction(max(_remaining(deadline), 1.0))
                outcome_unknown = False
            except KafkaException:
                pass
        # Start over with a fresh producer on the next write: its init_transactions resolves any
        # transaction this one left open, and librdkafka's state after a timeout is not ours to reason about.
        self._writers.pop(query_id, None)
        _discard(w.producer)
        reason = err.str() if err is not None else str(exc)
        status = (
            "its outcome is UNKNOWN (treat it as not committed)"
            if outcome_unknown
            else "it was NOT committed"
        )
        raise CheckpointLogError(
            f"checkpoint log {self.url}: {what} for query {query_id} failed during {stage} within "
            f"{self.write_timeout_s:.1f}s: {reason}{self._client_hint()}; {status}",
            outcome_unknown=outcome_unknown,
        ) from exc

    # -- reading --------------------------------------------------------------------------------

    def read_latest(self, query_id: str) -> CheckpointV2 | None:
        records = self._scan(query_id, latest_only=True)
        return records[-1] if records else None

    def read_history(self, query_id: str) -> list[CheckpointV2]:
        return self._scan(query_id, latest_only=False)

    def _scan(self, query_id: str, *, latest_only: bool) -> list[CheckpointV2]:
        check_query_id(query_id)
        key = query_id.encode()
        with self._read_lock:
            deadline = time.monotonic() + self.read_timeout_s
            partitions = self._topic_partitions(deadline)
            if partitions is None:
                return []
            partition = partition_for_key(key, partitions)
            tp = TopicPartition(self.topic, partition)
            high = self._offset(tp, OffsetSpec.latest(), deadline)  # type: ignore[no-untyped-call]
            # An explicit start offset: assigning at OFFSET_BEGINNING costs an extra lookup that
            # librdkafka schedules with a 500 ms delay.
            low = self._offset(tp, OffsetSpec.earliest(), deadline)  # type: ignore[no-untyped-call]
            if high <= low:
                return []
            found: list[tuple[int, bytes]] = []
            consumer = Consumer(
                {
                    **self._client_conf,
                    # Never used to commit; assign() does not join the group.
                    "group.id": f"spark-statebackend-checkpoint-reader-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    # The end-of-partition event comes with an empty fetch: do not let it idle long.
                    "fetch.wait.max.ms": 20,
                }
            )
            try:
                consumer.assign([TopicPartition(self.topic, partition, low)])
                end = self._consume_until(consumer, key, high, found, latest_only, deadline, partition)
            finally:
                consumer.close()
            log.debug("%s: read partition %d to offset %d for query %s", self.url, partition, end, query_id)
            out = []
            for offset, value in found:
                source = f"kafka topic {self.topic} partition {partition} offset {offset}"
                cp = CheckpointV2.from_json(value, source=source)
                if cp.query_id != query_id:
                    raise CorruptCheckpointError(
                        source, f"record keyed {query_id!r} holds query {cp.query_id!r}"
                    )
                out.append(cp)
            return out

    def _offset(self, tp: TopicPartition, spec: OffsetSpec, deadline: float) -> int:
        """The partition's earliest or latest offset; latest asked READ_UNCOMMITTED (the high watermark)."""
        try:
            fut = self._admin_client().list_offsets(
                {tp: spec},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=_remaining(deadline),
            )[tp]
            return int(fut.result(timeout=_remaining(deadline)).offset)
        except (KafkaException, TimeoutError) as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: cannot read the offsets of {tp.topic}[{tp.partition}] within "
                f"{self.read_timeout_s:.1f}s: {e}{self._client_hint()}"
            ) from e

    def _consume_until(
        self,
        consumer: Consumer,
        key: bytes,
        high: int,
        found: list[tuple[int, bytes]],
        latest_only: bool,
        deadline: float,
        partition: int,
    ) -> int:
        """Collect records of `key` until an end-of-partition event at offset >= `high`."""
        last_eof = -1
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                blocked = (
                    f"; reading stopped at offset {last_eof}, below the high watermark {high}: an open "
                    "transaction holds the last stable offset back"
                    if last_eof >= 0
                    else ""
                )
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: reading {self.topic}[{partition}] did not reach its end "
                    f"within {self.read_timeout_s:.1f}s{blocked}{self._client_hint()}"
                )
            msg = consumer.poll(min(remaining, 0.5))
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    last_eof = msg.offset() or 0
                    if last_eof >= high:
                        return last_eof
                    continue
                if err.fatal() or not err.retriable():
                    raise CheckpointLogError(
                        f"checkpoint log {self.url}: reading {self.topic}[{partition}] failed: {err.str()}"
                    )
                self._last_client_error = err.str()
                continue
            if msg.key() != key:
                continue
            offset = msg.offset()
            if offset is None:  # only error events lack an offset
                continue
            value = msg.value()
            if value is None:
                found.clear()  # a tombstone deletes everything before it
            elif latest_only:
                found[:] = [(offset, value)]
            else:
                found.append((offset, value))

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._write_lock:
            for w in self._writers.values():
                _discard(w.producer)
            self._writers.clear()
        self._admin = None


def _kerr(e: KafkaException) -> KafkaError:
    arg = e.args[0] if e.args else None
    return arg if isinstance(arg, KafkaError) else KafkaError(KafkaError._FAIL, str(e))


def _remaining(deadline: float) -> float:
    """Seconds left until `deadline`, at least a small positive value (librdkafka rejects 0 as 'wait')."""
    return max(deadline - time.monotonic(), 0.001)


def _discard(producer: Producer) -> None:
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
