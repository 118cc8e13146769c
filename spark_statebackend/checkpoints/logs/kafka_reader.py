"""The reading half of a Kafka checkpoint log (kafka.py, module doc: reading [1]-[3]): the records of
one query, read to the true end of its partition with isolation read_committed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from ..checkpoint import CheckpointV2, CorruptCheckpointError
from .base import CheckpointLogError
from .kafka_topic import KafkaTopic, kerr, partition_for_key, remaining

log = logging.getLogger("spark_statebackend.checkpointlog.kafka")  # name kept from the flat layout


class Reader:
    """Reads one log instance's checkpoints (module doc); reads are serialised."""

    def __init__(self, topic: KafkaTopic, read_timeout_s: float) -> None:
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        self._lock = threading.Lock()

    def scan(self, query_id: str, *, latest_only: bool) -> list[CheckpointV2]:
        """Read [1]-[3]: the checkpoints of `query_id` in log order (only the newest: `latest_only`)."""
        key = query_id.encode()
        with self._lock:
            deadline = time.monotonic() + self.read_timeout_s
            partitions = self.topic.partition_count(deadline)
            if partitions is None:
                return []
            partition = partition_for_key(key, partitions)
            tp = TopicPartition(self.topic.name, partition)
            high = self._offset(tp, OffsetSpec.latest(), deadline)  # type: ignore[no-untyped-call]
            # An explicit start offset: assigning at OFFSET_BEGINNING costs an extra lookup that
            # librdkafka schedules with a 500 ms delay.
            low = self._offset(tp, OffsetSpec.earliest(), deadline)  # type: ignore[no-untyped-call]
            if high <= low:
                return []
            found: list[tuple[int, bytes]] = []
            consumer = Consumer(
                {
                    **self.topic.client_conf,
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
                consumer.assign([TopicPartition(self.topic.name, partition, low)])
                end = self._consume_until(consumer, key, high, found, latest_only, deadline, partition)
            finally:
                consumer.close()
            log.debug(
                "%s: read partition %d to offset %d for query %s", self.topic.url, partition, end, query_id
            )
            out = []
            for offset, value in found:
                source = f"kafka topic {self.topic.name} partition {partition} offset {offset}"
                cp = CheckpointV2.from_json(value, source=source)
                if cp.query_id != query_id:
                    raise CorruptCheckpointError(
                        source, f"record keyed {query_id!r} holds query {cp.query_id!r}"
                    )
                out.append(cp)
            return out

    def _offset(self, tp: TopicPartition, spec: OffsetSpec, deadline: float) -> int:
        """The partition's earliest or latest offset; latest asked READ_UNCOMMITTED (the high watermark).
        Raises CheckpointLogError if the broker does not give one within the deadline."""
        try:
            fut = self.topic.admin().list_offsets(
                {tp: spec},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=remaining(deadline),
            )[tp]
            offset = int(fut.result(timeout=remaining(deadline)).offset)
        except (KafkaException, TimeoutError) as e:
            why = kerr(e).str() if isinstance(e, KafkaException) else "timed out"
            raise CheckpointLogError(
                f"checkpoint log {self.topic.url}: cannot read the offsets of {tp.topic}[{tp.partition}] "
                f"within {self.read_timeout_s:.1f}s: {why}{self.topic.hint()}"
            ) from e
        if offset < 0:
            # librdkafka answers a ListOffsets request that timed out now with an error, now with
            # OFFSET_INVALID (-1001) as if it had succeeded. Taken as an offset, that made the partition
            # look empty, so a frozen broker read as "no checkpoint yet" and an upload went ahead
            # without its diff base checked.
            raise CheckpointLogError(
                f"checkpoint log {self.topic.url}: no offset for {tp.topic}[{tp.partition}] within "
                f"{self.read_timeout_s:.1f}s (librdkafka gave offset {offset}){self.topic.hint()}"
            )
        return offset

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
                    f"checkpoint log {self.topic.url}: reading {self.topic.name}[{partition}] did not reach "
                    f"its end within {self.read_timeout_s:.1f}s{blocked}{self.topic.hint()}"
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
                        f"checkpoint log {self.topic.url}: reading {self.topic.name}[{partition}] failed: "
                        f"{err.str()}"
                    )
                self.topic.last_client_error = err.str()
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
