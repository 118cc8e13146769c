"""The CheckpointLog contract, run against the file log and the Kafka log (Tansu here, real Kafka where
Docker exists), plus what only one of them does: the file log's crash safety and fencing races,
the Kafka log's partitioning, tombstones, unreachable brokers and the semantics only real Kafka has."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from spark_statebackend.checkpoints.checkpoint import CheckpointId, CheckpointV2, CorruptCheckpointError
from spark_statebackend.checkpoints.logs import (
    CheckpointFencedError,
    CheckpointLog,
    CheckpointLogError,
    open_checkpoint_log,
)
from spark_statebackend.checkpoints.logs.file import FileCheckpointLog
from spark_statebackend.checkpoints.logs.kafka import murmur2, partition_for_key
from spark_statebackend.errors import ConfigError
from tests.paths import ROOT
from tests.servers.process import ServerProcess, free_port, freeze, wait_until
from tests.servers.tansu import KafkaBroker, start_tansu

REPO = ROOT
KAFKA_TIMEOUTS = {"write.timeout.ms": "10000", "read.timeout.ms": "10000", "admin.timeout.ms": "10000"}


def checkpoint(query_id: str, batch: int, **markers: str) -> CheckpointV2:
    return CheckpointV2(
        checkpoint_id=CheckpointId.create(batch),
        query_id=query_id,
        query_name=f"name-of-{query_id}",
        input_offsets={"KafkaV2[Subscribe[in]]": orjson.dumps({"in": {"0": batch * 10}}).decode()},
        state_checkpoint_markers={
            "blobstore": {"0/0/default": f"indexes/{query_id}/0-0-default/{batch}.json", **markers},
            "spark": {"0/0/default": str(batch + 1)},
        },
    )


class Harness(Protocol):
    kind: str

    def open(self, **options: str) -> CheckpointLog:
        """A new, independent instance on the same log (another driver, as far as fencing goes)."""

    def inject(self, query_id: str, value: bytes | None) -> str:
        """Append a raw record for `query_id` behind the log's back; return where it landed."""


class FileHarness:
    kind = "file"

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, **options: str) -> CheckpointLog:
        return open_checkpoint_log(self.root.as_uri(), options)

    def inject(self, query_id: str, value: bytes | None) -> str:
        assert value is not None, "the file log has no tombstones"
        qdir = self.root / query_id
        qdir.mkdir(parents=True, exist_ok=True)
        seqs = [int(n[:20]) for n in os.listdir(qdir) if n.endswith(".json") and not n.startswith(".")]
        path = qdir / f"{max(seqs, default=-1) + 1:020d}.json"
        path.write_bytes(value)
        return f"file {path}"


class KafkaHarness:
    kind = "kafka"

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self.broker = broker
        self.topic = topic
        self.url = f"kafka://{broker.bootstrap}/{topic}"
        # Query ids repeat across tests; a per-test prefix keeps their transactional.ids apart.
        self.txn_prefix = f"test-{topic}-"

    def open(self, **options: str) -> CheckpointLog:
        opts = {
            "replication.factor": "1",
            "transactional.id.prefix": self.txn_prefix,
            **KAFKA_TIMEOUTS,
            **options,
        }
        return open_checkpoint_log(self.url, opts)

    def inject(self, query_id: str, value: bytes | None, partitions: int = 1) -> str:
        key = query_id.encode()
        partition = partition_for_key(key, partitions)
        delivered: list[Any] = []
        p = Producer({"bootstrap.servers": self.broker.bootstrap})
        p.produce(
            self.topic,
            key=key,
            value=value,
            partition=partition,
            on_delivery=lambda e, m: delivered.append((e, m)),
        )
        assert p.flush(10) == 0
        err, msg = delivered[0]
        assert err is None
        return f"kafka topic {self.topic} partition {partition} offset {msg.offset()}"


@pytest.fixture(params=["file", "kafka"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if request.param == "file":
        return FileHarness(tmp_path / "checkpoints")
    broker: KafkaBroker = request.getfixturevalue("kafka_broker")
    return KafkaHarness(broker, f"ckpt-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def opened(harness: Harness) -> Iterator[Callable[..., CheckpointLog]]:
    """Opens instances of the harness's log (resources created) and closes them after the test."""
    logs: list[CheckpointLog] = []

    def make(**options: str) -> CheckpointLog:
        log = harness.open(**options)
        log.create_resources()
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


# -- the contract -------------------------------------------------------------------------------


def test_empty_log_has_no_checkpoints(harness: Harness, opened: Callable[..., CheckpointLog]) -> None:
    fresh = harness.open()
    try:
        assert fresh.read_latest("q1") is None  # before create_resources: nothing, and nothing created
        assert fresh.read_history("q1") == []
    finally:
        fresh.close()
    log = opened()
    assert log.read_latest("q1") is None
    assert log.read_history("q1") == []


def test_write_then_read_latest_and_history(opened: Callable[..., CheckpointLog]) -> None:
    log = opened()
    written = [checkpoint("q1", b) for b in range(4)]
    for cp in written:
        log.write(cp)
        assert log.read_latest("q1") == cp
    assert log.read_history("q1") == written
    other = opened()  # another instance sees the same committed log
    assert other.read_latest("q1") == written[-1]
    assert other.read_history("q1") == written


def test_many_queries_share_one_log(opened: Callable[..., CheckpointLog]) -> None:
    log = opened()
    written: dict[str, list[CheckpointV2]] = {f"query-{i}": [] for i in range(3)}
    for batch in range(3):
        for q in written:
            cp = checkpoint(q, batch)
            log.write(cp)
            written[q].append(cp)
    for q, cps in written.items():
        assert log.read_latest(q) == cps[-1]
        assert log.read_history(q) == cps
    assert log.read_latest("query-9") is None


def test_unknown_fields_are_ignored(harness: Harness, opened: Callable[..., CheckpointLog]) -> None:
    log = opened()
    log.write(checkpoint("q1", 0))
    newer = checkpoint("q1", 1)
    doc = orjson.loads(newer.to_json())
    doc["written_by"] = "a newer spark-statebackend"
    doc["lineage"] = {"parent": "x", "extra": [1, 2]}
    harness.inject("q1", orjson.dumps(doc))
    assert log.read_latest("q1") == newer
    assert [c.batch_id for c in log.read_history("q1")] == [0, 1]


@pytest.mark.parametrize(
    "raw",
    [b"not json", b'{"version": 2}', b'{"version": 3, "future": true}', b"[1, 2]"],
    ids=["garbage", "truncated", "newer-version", "array"],
)
def test_malformed_record_is_named_by_where_it_lives(
    harness: Harness, opened: Callable[..., CheckpointLog], raw: bytes
) -> None:
    log = opened()
    log.write(checkpoint("q1", 0))
    where = harness.inject("q1", raw)
    with pytest.raises(CorruptCheckpointError) as info:
        log.read_latest("q1")
    assert where in str(info.value)
    with pytest.raises(CorruptCheckpointError, match=re.escape(where)):
        log.read_history("q1")
    assert log.read_latest("q2") is None  # other queries are unaffected


def test_record_of_another_query_under_this_key_is_corrupt(
    harness: Harness, opened: Callable[..., CheckpointLog]
) -> None:
    log = opened()
    where = harness.inject("q1", checkpoint("q2", 0).to_json())
    with pytest.raises(CorruptCheckpointError, match=re.escape(where)) as info:
        log.read_latest("q1")
    assert "'q2'" in str(info.value)


def test_second_writer_fences_the_first(opened: Callable[..., CheckpointLog]) -> None:
    old = opened()
    first = checkpoint("q1", 0)
    old.write(first)
    new = opened()
    new.acquire_writer("q1")  # a restarted driver claims the query before it reads
    assert new.read_latest("q1") == first
    zombie = checkpoint("q1", 1)
    with pytest.raises(CheckpointFencedError, match="fenced") as info:
        old.write(zombie)
    assert "NOT" in str(info.value) and "q1" in str(info.value)
    with pytest.raises(CheckpointFencedError):  # fenced for good
        old.write(checkpoint("q1", 2))
    with pytest.raises(CheckpointFencedError):  # and may not reclaim the query
        old.acquire_writer("q1")
    new.acquire_writer("q1")  # idempotent for the current writer
    assert new.read_latest("q1") == first
    resumed = checkpoint("q1", 1)
    new.write(resumed)
    assert new.read_latest("q1") == resumed
    assert zombie not in new.read_history("q1")
    assert new.read_history("q1") == [first, resumed]
    # Fencing is per query: the old instance still writes other queries.
    old.write(checkpoint("q2", 0))
    assert new.read_latest("q2") is not None


def test_write_acquires_implicitly_and_later_acquire_fences(opened: Callable[..., CheckpointLog]) -> None:
    a, b = opened(), opened()
    a.write(checkpoint("q1", 0))
    b.write(checkpoint("q1", 1))  # implicit acquire fences a
    with pytest.raises(CheckpointFencedError):
        a.write(checkpoint("q1", 2))
    assert [c.batch_id for c in b.read_history("q1")] == [0, 1]


def test_retain_keeps_at_least_the_latest(harness: Harness, opened: Callable[..., CheckpointLog]) -> None:
    log = opened()
    written = [checkpoint("q1", b) for b in range(5)]
    for cp in written:
        log.write(cp)
    with pytest.raises(ValueError):
        log.retain("q1", 0)
    deleted = log.retain("q1", 2)
    history = log.read_history("q1")
    if harness.kind == "file":
        assert deleted == 3
        assert history == written[-2:]
    else:  # a compacted topic does its own retention
        assert deleted == 0
        assert history[-1] == written[-1]
    assert log.read_latest("q1") == written[-1]
    after = checkpoint("q1", 5)
    log.write(after)
    assert log.read_latest("q1") == after


# -- file log -----------------------------------------------------------------------------------


def file_log(root: Path, **options: str) -> FileCheckpointLog:
    log = FileCheckpointLog(root, options)
    log.create_resources()
    return log


def test_file_log_layout(tmp_path: Path) -> None:
    log = file_log(tmp_path / "ck")
    cp = checkpoint("q1", 0)
    log.write(cp)
    names = sorted(os.listdir(tmp_path / "ck" / "q1"))
    assert names == ["00000000000000000000.json", "00000000000000000001.json"]  # writer fence, checkpoint
    assert (tmp_path / "ck" / "q1" / names[1]).read_bytes() == cp.to_json()
    assert orjson.loads((tmp_path / "ck" / "q1" / names[0]).read_bytes())["kind"] == "writer-fence"


def test_file_log_missing_directory(tmp_path: Path) -> None:
    log = FileCheckpointLog(tmp_path / "absent")
    with pytest.raises(CheckpointLogError, match="does not exist"):
        log.validate_resources()
    with pytest.raises(CheckpointLogError, match="does not exist"):
        log.write(checkpoint("q1", 0))
    assert not (tmp_path / "absent").exists()
    assert log.read_latest("q1") is None


def test_file_log_ignores_and_sweeps_temporary_files(tmp_path: Path) -> None:
    log = file_log(tmp_path / "ck")
    cp = checkpoint("q1", 0)
    log.write(cp)
    qdir = tmp_path / "ck" / "q1"
    torn = qdir / ".tmp-deadbeef.json"
    torn.write_bytes(cp.to_json()[:25])  # what a crash in the middle of step [1] leaves
    fresh_torn = qdir / ".tmp-cafe.json"
    fresh_torn.write_bytes(b"{")
    old = time.time() - 7200
    os.utime(torn, (old, old))
    assert log.read_latest("q1") == cp
    nxt = checkpoint("q1", 1)
    log.write(nxt)
    assert log.read_history("q1") == [cp, nxt]
    log.retain("q1", 5)
    assert not torn.exists()  # older than an hour: swept
    assert fresh_torn.exists()  # might belong to a live writer: kept


def test_file_log_retain_keeps_newest_fence_and_slot_numbers_never_repeat(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    writers = [file_log(root) for _ in range(3)]
    for i, w in enumerate(writers):
        w.write(checkpoint("q1", i))  # each acquires: three fences, each fencing the previous
    last = writers[-1]
    assert last.retain("q1", 1) == 2
    names = sorted(os.listdir(root / "q1"))
    kinds = [orjson.loads((root / "q1" / n).read_bytes()).get("kind") for n in names]
    assert kinds == ["writer-fence", None]
    for w in writers[:-1]:
        with pytest.raises(CheckpointFencedError):
            w.write(checkpoint("q1", 9))
    last.write(checkpoint("q1", 3))
    assert int(sorted(os.listdir(root / "q1"))[-1][:20]) == 6  # slots 0..5 used before; no reuse


def test_file_log_write_racing_a_new_writer_never_lands_after_its_fence(tmp_path: Path) -> None:
    """A zombie paused between syncing its record and claiming a slot must find the new writer's
    fence when it resumes (step [2] of the protocol), never land after it."""
    root = tmp_path / "ck"
    zombie, new = file_log(root), file_log(root)
    zombie.write(checkpoint("q1", 0))
    paused, resume = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hook(stage: str) -> None:
        if stage == "temp-synced" and threading.current_thread().name == "zombie-writer":
            paused.set()
            assert resume.wait(timeout=20)

    def zombie_write() -> None:
        try:
            zombie.write(checkpoint("q1", 1))
        except BaseException as e:
            errors.append(e)

    FileCheckpointLog._stage_hook = hook
    try:
        t = threading.Thread(target=zombie_write, name="zombie-writer")
        t.start()
        assert paused.wait(timeout=20)
        new.acquire_writer("q1")
        resume.set()
        t.join(timeout=20)
        assert not t.is_alive()
    finally:
        FileCheckpointLog._stage_hook = None
    assert len(errors) == 1 and isinstance(errors[0], CheckpointFencedError)
    assert [c.batch_id for c in new.read_history("q1")] == [0]
    assert not [n for n in os.listdir(root / "q1") if n.startswith(".tmp-")]


def test_file_log_concurrent_writers_of_different_queries(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    logs = [file_log(root, fsync="false") for _ in range(4)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            for b in range(25):
                logs[i].write(checkpoint(f"q{i}", b))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), name=f"writer-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert errors == []
    reader = file_log(root)
    for i in range(4):
        assert [c.batch_id for c in reader.read_history(f"q{i}")] == list(range(25))


_CHILD = """
import os, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from spark_statebackend.checkpoints.checkpoint import CheckpointId, CheckpointV2
from spark_statebackend.checkpoints.logs.file import FileCheckpointLog
root, stage, marker = sys.argv[1], sys.argv[2], Path(sys.argv[3])
log = FileCheckpointLog(root)
def cp(b):
    markers = {{"blobstore": {{"0/0/s": "m%d" % b}}}}
    return CheckpointV2(CheckpointId.create(b), "q1", "crash", {{"src": str(b)}}, markers)
if stage == "loop":
    b = 0
    while True:
        log.write(cp(b))
        b += 1
        marker.write_text(str(b))
log.write(cp(1))
def hook(s):
    if s == stage:
        marker.write_text(s)
        time.sleep(3600)  # parked until the parent kills us
FileCheckpointLog._stage_hook = hook
log.write(cp(2))
"""


def _run_child(root: Path, stage: str, marker: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(repo=str(REPO)), str(root), stage, str(marker)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=20)


@pytest.mark.parametrize(
    ("stage", "visible_batch"),
    [("temp-written", 1), ("temp-synced", 1), ("linked", 2), ("dir-synced", 2)],
)
def test_file_log_kill_9_at_every_write_stage(tmp_path: Path, stage: str, visible_batch: int) -> None:
    root = tmp_path / "ck"
    file_log(root)
    marker = tmp_path / "marker"
    proc = _run_child(root, stage, marker)
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, 30, f"child to reach {stage}")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        _kill(proc)
    log = file_log(root)
    latest = log.read_latest("q1")
    assert latest is not None and latest.batch_id == visible_batch
    assert [c.batch_id for c in log.read_history("q1")] == list(range(1, visible_batch + 1))
    log.write(checkpoint("q1", 3))  # the log stays writable after the crash
    assert log.read_latest("q1") == log.read_history("q1")[-1]
    assert log.read_latest("q1").batch_id == 3  # type: ignore[union-attr]


def test_file_log_kill_9_at_random_moments_never_tears_a_record(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    file_log(root)
    seen = 0
    for round_ in range(4):
        marker = tmp_path / f"marker-{round_}"
        proc = _run_child(root, "loop", marker)
        target = 3 + 7 * round_
        try:
            wait_until(
                lambda m=marker, n=target, p=proc: (
                    (m.exists() and int(m.read_text() or 0) >= n) or p.poll() is not None
                ),  # type: ignore[misc]
                60,
                f"child to write {target} checkpoints",
            )
            assert proc.poll() is None
        finally:
            _kill(proc)
        history = file_log(root).read_history("q1")  # every record parses (no torn record)
        assert len(history) > seen
        seen = len(history)


# -- Kafka log ----------------------------------------------------------------------------------


@pytest.fixture
def kafka(kafka_broker: KafkaBroker) -> Iterator[KafkaHarness]:
    yield KafkaHarness(kafka_broker, f"ckpt-{uuid.uuid4().hex[:12]}")


def _admin(broker: KafkaBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _create_topic(broker: KafkaBroker, topic: str, partitions: int, **config: str) -> None:
    admin = _admin(broker)  # must outlive the future: a destroyed handle fails it
    fut = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config)]
    )
    fut[topic].result(timeout=10)


def test_murmur2_matches_kafka_reference_values() -> None:
    # Values from Kafka's UtilsTest.testMurmur2.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_partitioning_matches_librdkafka_murmur2(kafka: KafkaHarness) -> None:
    _create_topic(kafka.broker, kafka.topic, 7)
    placed: dict[bytes, int] = {}
    p = Producer({"bootstrap.servers": kafka.broker.bootstrap, "partitioner": "murmur2"})
    for i in range(40):
        key = f"query-{i}-{uuid.uuid4()}".encode()
        p.produce(
            kafka.topic,
            key=key,
            value=b"x",
            on_delivery=lambda e, m: placed.__setitem__(m.key(), m.partition()),
        )
    assert p.flush(10) == 0
    assert len(placed) == 40
    assert {k: partition_for_key(k, 7) for k in placed} == placed
    assert len(set(placed.values())) > 1


def test_kafka_log_over_several_partitions(kafka: KafkaHarness) -> None:
    log = kafka.open(partitions="3")
    log.create_resources()
    try:
        queries = [f"q{i}" for i in range(8)]
        for q in queries:
            log.write(checkpoint(q, 0))
        for q in queries:
            latest = log.read_latest(q)
            assert latest is not None and latest.query_id == q
        # Each record sits in the partition its key hashes to.
        c = Consumer(
            {"bootstrap.servers": kafka.broker.bootstrap, "group.id": "t", "enable.partition.eof": True}
        )
        c.assign([TopicPartition(kafka.topic, p, 0) for p in range(3)])
        seen: dict[str, int] = {}
        eofs = 0
        deadline = time.monotonic() + 20
        while eofs < 3 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                eofs += 1
                continue
            seen[m.key().decode()] = m.partition()
        c.close()
        assert seen == {q: partition_for_key(q.encode(), 3) for q in queries}
    finally:
        log.close()


def test_kafka_topic_is_created_compacted(kafka: KafkaHarness) -> None:
    log = kafka.open(**{"topic.min.insync.replicas": "1"})
    log.create_resources()
    log.create_resources()  # idempotent
    log.validate_resources()
    log.close()
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, kafka.topic)
    admin = _admin(kafka.broker)
    configs = admin.describe_configs([res])[res].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact"


def test_kafka_validate_rejects_missing_or_wrong_topics(kafka: KafkaHarness) -> None:
    log = kafka.open()
    with pytest.raises(CheckpointLogError, match="does not exist"):
        log.validate_resources()
    with pytest.raises(CheckpointLogError, match="does not exist"):
        log.write(checkpoint("q1", 0))
    assert log.read_latest("q1") is None
    assert kafka.topic not in _admin(kafka.broker).list_topics(timeout=10).topics  # reading created nothing
    log.close()

    deleting = f"{kafka.topic}-delete"
    _create_topic(kafka.broker, deleting, 1, **{"cleanup.policy": "delete"})
    with pytest.raises(CheckpointLogError, match=re.escape("cleanup.policy='delete'")):
        open_checkpoint_log(
            f"kafka://{kafka.broker.bootstrap}/{deleting}", KAFKA_TIMEOUTS
        ).validate_resources()

    wide = f"{kafka.topic}-wide"
    _create_topic(kafka.broker, wide, 2, **{"cleanup.policy": "compact"})
    with pytest.raises(CheckpointLogError, match="has 2 partitions but the option 'partitions' says 1"):
        open_checkpoint_log(f"kafka://{kafka.broker.bootstrap}/{wide}", KAFKA_TIMEOUTS).create_resources()


def test_kafka_tombstone_clears_the_query(kafka: KafkaHarness) -> None:
    log = kafka.open()
    log.create_resources()
    try:
        log.write(checkpoint("q1", 0))
        log.write(checkpoint("q2", 0))
        kafka.inject("q1", None)
        assert log.read_latest("q1") is None
        assert log.read_history("q1") == []
        assert log.read_latest("q2") is not None
        again = checkpoint("q1", 1)
        log.write(again)
        assert log.read_history("q1") == [again]
    finally:
        log.close()


def test_kafka_reader_is_exact_after_multi_record_batches(kafka: KafkaHarness) -> None:
    """Tansu answers ListOffsets with (base offset of the last batch + 1) after a multi-record batch;
    a reader that stops at that offset would miss the batch's later records."""
    log = kafka.open()
    log.create_resources()
    try:
        log.write(checkpoint("q1", 0))
        newest = checkpoint("q1", 1)
        p = Producer(
            {"bootstrap.servers": kafka.broker.bootstrap, "linger.ms": 200, "batch.num.messages": 100}
        )
        for i in range(5):
            p.produce(kafka.topic, key=f"other-{i}".encode(), value=b"{}", partition=0)
        p.produce(kafka.topic, key=b"q1", value=newest.to_json(), partition=0)
        for i in range(4):
            p.produce(kafka.topic, key=f"other-{i}".encode(), value=b"{}", partition=0)
        assert p.flush(10) == 0
        assert log.read_latest("q1") == newest
        assert [c.batch_id for c in log.read_history("q1")] == [0, 1]
    finally:
        log.close()


def test_kafka_write_fails_within_its_timeout_when_broker_unreachable() -> None:
    url = f"kafka://127.0.0.1:{free_port()}/ckpt"
    log = open_checkpoint_log(
        url, {"write.timeout.ms": "1500", "read.timeout.ms": "1500", "admin.timeout.ms": "1500"}
    )
    try:
        started = time.monotonic()
        with pytest.raises(CheckpointLogError) as info:
            log.write(checkpoint("q1", 0))
        assert time.monotonic() - started < 1.5 + 1.0
        msg = str(info.value)
        assert url in msg and "nothing was committed" in msg and "1.5s" in msg
        assert not info.value.outcome_unknown
        for op in (lambda: log.read_latest("q1"), log.create_resources):
            started = time.monotonic()
            with pytest.raises(CheckpointLogError, match=url):
                op()
            assert time.monotonic() - started < 1.5 + 1.0
    finally:
        log.close()


def test_kafka_write_fails_within_its_timeout_when_broker_dies(server_logs: Path) -> None:
    server = start_tansu(server_logs)
    url = f"kafka://127.0.0.1:{server.port}/ckpt"
    log = open_checkpoint_log(
        url, {"replication.factor": "1", "write.timeout.ms": "2000", "admin.timeout.ms": "5000"}
    )
    try:
        log.create_resources()
        log.write(checkpoint("q1", 0))
        server.stop()
        started = time.monotonic()
        with pytest.raises(CheckpointLogError) as info:
            log.write(checkpoint("q1", 1))
        assert time.monotonic() - started < 2.0 + 1.5
        assert "UNKNOWN" in str(info.value) or "NOT committed" in str(info.value)
        assert not isinstance(info.value, CheckpointFencedError)
    finally:
        log.close()
        server.stop()


def test_open_checkpoint_log_rejects_bad_urls_and_options(tmp_path: Path) -> None:
    for url in (
        "kafka://host/topic",
        "kafka://h:1",
        "kafka://h:1/a/b",
        "kafka://h:1/bad topic",
        "s3://b/x",
        "file://relative/x",
        "file:relative",
    ):
        with pytest.raises(ConfigError):
            open_checkpoint_log(url, key="spark.x.log")
    with pytest.raises(ConfigError, match="'retries'"):
        open_checkpoint_log("kafka://h:1/t", {"retries": "3"})
    with pytest.raises(ConfigError, match=re.escape("kafka.isolation.level")):
        open_checkpoint_log("kafka://h:1/t", {"kafka.isolation.level": "read_uncommitted"})
    with pytest.raises(ConfigError, match=re.escape("write.timeout.ms")):
        open_checkpoint_log("kafka://h:1/t", {"write.timeout.ms": "soon"})
    with pytest.raises(ConfigError, match=re.escape("replication.factor")):
        open_checkpoint_log("kafka://h:1/t", {"replication.factor": "0"})
    with pytest.raises(ConfigError, match="fsync"):
        open_checkpoint_log(tmp_path.as_uri(), {"fsync": "maybe"})
    log = open_checkpoint_log("kafka://a:1,b:2/t", {"kafka.client.id": "x", "topic.retention.ms": "1"})
    assert log.url == "kafka://a:1,b:2/t"


# -- semantics only real Kafka has (Tansu: research/services.md section 3) -----------------------


@pytest.mark.real_kafka
def test_zombie_record_flushed_before_the_fence_is_never_read(kafka: KafkaHarness) -> None:
    """The zombie's record reached the broker inside a transaction that the new writer's
    init_transactions aborts: read_committed must hide it (Tansu shows aborted records)."""
    log = kafka.open()
    log.create_resources()
    try:
        first = checkpoint("q1", 0)
        log.write(first)
        log.close()
        zombie = Producer(
            {
                "bootstrap.servers": kafka.broker.bootstrap,
                "transactional.id": kafka.txn_prefix + "q1",
            }
        )
        zombie.init_transactions(10)
        zombie.begin_transaction()
        zombie.produce(kafka.topic, key=b"q1", value=checkpoint("q1", 1).to_json(), partition=0)
        assert zombie.flush(10) == 0
        new = kafka.open()
        new.acquire_writer("q1")
        with pytest.raises(KafkaException):
            zombie.commit_transaction(10)
        assert new.read_latest("q1") == first
        new.close()
    finally:
        log.close()


def test_open_transaction_of_another_query_delays_rather_than_falsifies_read_latest(
    kafka: KafkaHarness,
) -> None:
    """read_committed stops at the last stable offset, which another query's open transaction holds
    back; stopping there would return an older checkpoint of q1 than the one committed. (Tansu keeps
    the last stable offset right; it only fails to hide aborted records.)"""
    log = kafka.open(**{"read.timeout.ms": "2000"})
    log.create_resources()
    try:
        other = Producer(
            {"bootstrap.servers": kafka.broker.bootstrap, "transactional.id": f"other-{kafka.topic}"}
        )
        other.init_transactions(10)
        other.begin_transaction()
        other.produce(kafka.topic, key=b"q2", value=checkpoint("q2", 0).to_json(), partition=0)
        assert other.flush(10) == 0
        cp = checkpoint("q1", 0)
        log.write(cp)
        with pytest.raises(CheckpointLogError, match="open transaction"):
            log.read_latest("q1")
        other.abort_transaction(10)
        assert log.read_latest("q1") == cp
    finally:
        log.close()


@pytest.mark.real_kafka
def test_list_offsets_is_exact_after_a_multi_record_batch(kafka: KafkaHarness) -> None:
    _create_topic(kafka.broker, kafka.topic, 1)
    p = Producer({"bootstrap.servers": kafka.broker.bootstrap, "linger.ms": 200})
    for i in range(10):
        p.produce(kafka.topic, value=b"%d" % i, partition=0)
    assert p.flush(10) == 0
    tp = TopicPartition(kafka.topic, 0)
    admin = _admin(kafka.broker)
    assert admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(timeout=10).offset == 10


@pytest.mark.real_kafka
def test_compaction_keeps_the_latest_checkpoint(kafka: KafkaHarness) -> None:
    log = kafka.open(
        **{
            "topic.segment.ms": "100",
            "topic.min.cleanable.dirty.ratio": "0.01",
            "topic.delete.retention.ms": "100",
        }
    )
    log.create_resources()
    try:
        batch = 0

        def compacted() -> bool:
            nonlocal batch
            log.write(checkpoint("q1", batch))  # keeps segments rolling
            batch += 1
            return len(log.read_history("q1")) < batch

        wait_until(compacted, 90, "the log cleaner to compact the checkpoint topic", interval=0.5)
        latest = log.read_latest("q1")
        assert latest is not None and latest.batch_id == batch - 1
    finally:
        log.close()


def test_kafka_read_against_a_frozen_broker_fails_and_never_reads_as_empty(
    private_tansu: ServerProcess,
) -> None:
    """A frozen broker (SIGSTOP: connections stay open, nothing answers) must make every read fail
    within read.timeout. librdkafka answers a timed-out ListOffsets now with an error, now with offset
    -1001 as if it had succeeded; the reader once took that for an empty partition, read_latest said
    "no checkpoint" and the sidecar uploaded with its diff base unchecked, clearing the upload lag that
    held the commit gate (test_spark_outages caught it). Both offset lookups are asked directly too:
    read_latest alone fails on the old code only when both come back -1001."""
    url = f"kafka://127.0.0.1:{private_tansu.port}/frozen-{time.time_ns()}"
    log = open_checkpoint_log(url, {"replication.factor": "1", "read.timeout": "1s", "write.timeout": "5s"})
    try:
        log.create_resources()
        log.acquire_writer("q1")
        log.write(checkpoint("q1", 0))
        assert (latest := log.read_latest("q1")) is not None and latest.batch_id == 0
        reader = log._reader  # type: ignore[attr-defined]  # the offset lookups, below read_latest
        tp = TopicPartition(log.topic, partition_for_key(b"q1", 1))  # type: ignore[attr-defined]
        freeze(private_tansu.pid)
        for attempt in range(2):
            started = time.monotonic()
            with pytest.raises(CheckpointLogError, match=re.escape(url)):
                log.read_latest("q1")
            assert time.monotonic() - started < 1.0 + 1.0, attempt
            for spec in (OffsetSpec.latest(), OffsetSpec.earliest()):
                with pytest.raises(CheckpointLogError, match=re.escape(url)):
                    reader._offset(tp, spec, time.monotonic() + 1.0)
        os.kill(private_tansu.pid, signal.SIGCONT)
        assert (latest := log.read_latest("q1")) is not None and latest.batch_id == 0
    finally:
        os.kill(private_tansu.pid, signal.SIGCONT)
        log.close()
