"""The writing half of a Kafka checkpoint log (kafka.py, module doc: writing [1]-[3]): one
transactional producer per query, whose transactional.id fences every older writer of the query.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer

from ..checkpoint import CheckpointV2
from .base import CheckpointFencedError, CheckpointLogError
from .kafka_topic import KafkaTopic, discard_producer, kerr, partition_for_key, remaining

log = logging.getLogger("spark_statebackend.checkpointlog.kafka")  # name kept from the flat layout

_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


@dataclass
class _Writer:
    producer: Producer
    transactional_id: str
    fenced: str | None = None


class TransactionalWriter:
    """The transactional producers of one log instance, one per query it writes (module doc)."""

    def __init__(
        self,
        topic: KafkaTopic,
        transactional_id_prefix: str,
        write_timeout_s: float,
        transaction_timeout_ms: int,
    ) -> None:
        self.topic = topic
        self.transactional_id_prefix = transactional_id_prefix
        self.write_timeout_s = write_timeout_s
        self.transaction_timeout_ms = transaction_timeout_ms
        self._lock = threading.Lock()
        self._writers: dict[str, _Writer] = {}

    def acquire(self, query_id: str) -> None:
        """Write [1] for `query_id` now (CheckpointLog.acquire_writer)."""
        with self._lock:
            self._writer(query_id, time.monotonic() + self.write_timeout_s, what="acquiring the writer")

    def _writer(self, query_id: str, deadline: float, what: str) -> _Writer:
        w = self._writers.get(query_id)
        if w is not None:
            if w.fenced is not None:
                raise self._fenced_error(query_id, w, what)
            return w
        tid = self.transactional_id_prefix + query_id
        conf = {
            **self.topic.client_conf,
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
            producer.init_transactions(remaining(deadline))
        except KafkaException as e:
            discard_producer(producer)
            err = kerr(e)
            if err.code() in _FENCED_CODES:
                raise CheckpointFencedError(
                    f"checkpoint log {self.topic.url}: {what} for query {query_id} failed: transactional.id "
                    f"{tid} was fenced while initialising: {err.str()}"
                ) from e
            raise CheckpointLogError(
                f"checkpoint log {self.topic.url}: {what} for query {query_id} failed: could not initialise "
                f"transactions (transactional.id {tid}) within {self.write_timeout_s:.1f}s: {err.str()}"
                f"{self.topic.hint()}; nothing was committed"
            ) from e
        w = _Writer(producer, tid)
        self._writers[query_id] = w
        return w

    def _fenced_error(self, query_id: str, w: _Writer, what: str) -> CheckpointFencedError:
        return CheckpointFencedError(
            f"checkpoint log {self.topic.url}: {what} for query {query_id} NOT committed: this writer "
            f"(transactional.id {w.transactional_id}) was fenced by a newer writer of the same query "
            f"({w.fenced}); another driver owns the query now"
        )

    def write(self, checkpoint: CheckpointV2) -> None:
        """Write [2]-[3] of `checkpoint` (CheckpointLog.write)."""
        query_id = checkpoint.query_id
        what = f"checkpoint {checkpoint.checkpoint_id}"
        with self._lock:
            deadline = time.monotonic() + self.write_timeout_s
            w = self._writer(query_id, deadline, what)
            try:
                partitions = self.topic.partition_count(deadline)
            except CheckpointLogError as e:
                raise CheckpointLogError(f"{e}; {what} for query {query_id} was NOT committed") from e
            if partitions is None:
                raise CheckpointLogError(
                    f"checkpoint log {self.topic.url}: {what} for query {query_id} NOT committed: "
                    f"topic {self.topic.name} does not exist (create_resources() creates it)"
                )
            key = query_id.encode()
            stage = "begin"
            try:
                w.producer.begin_transaction()
                stage = "produce"
                w.producer.produce(
                    self.topic.name,
                    key=key,
                    value=checkpoint.to_json(),
                    partition=partition_for_key(key, partitions),
                )
                stage = "commit"
                # commit_transaction flushes and fails if the record was not delivered.
                w.producer.commit_transaction(remaining(deadline))
            except (KafkaException, BufferError) as e:
                self._write_failed(query_id, w, e, stage, what, deadline)
            log.debug("%s: committed %s for query %s", self.topic.url, what, query_id)

    def _write_failed(
        self, query_id: str, w: _Writer, exc: Exception, stage: str, what: str, deadline: float
    ) -> None:
        err = kerr(exc) if isinstance(exc, KafkaException) else None
        if err is not None and err.code() in _FENCED_CODES:
            w.fenced = err.str()
            discard_producer(w.producer)
            raise self._fenced_error(query_id, w, what) from exc
        outcome_unknown = stage == "commit"
        if err is not None and err.txn_requires_abort():
            try:
                w.producer.abort_transaction(max(remaining(deadline), 1.0))
                outcome_unknown = False
            except KafkaException:
                pass
        # Start over with a fresh producer on the next write: its init_transactions resolves any
        # transaction this one left open, and librdkafka's state after a timeout is not ours to reason about.
        self._writers.pop(query_id, None)
        discard_producer(w.producer)
        reason = err.str() if err is not None else str(exc)
        status = (
            "its outcome is UNKNOWN (treat it as not committed)"
            if outcome_unknown
            else "it was NOT committed"
        )
        raise CheckpointLogError(
            f"checkpoint log {self.topic.url}: {what} for query {query_id} failed during {stage} within "
            f"{self.write_timeout_s:.1f}s: {reason}{self.topic.hint()}; {status}",
            outcome_unknown=outcome_unknown,
        ) from exc

    def close(self) -> None:
        with self._lock:
            for w in self._writers.values():
                discard_producer(w.producer)
            self._writers.clear()
