"""retainCheckpoints = K: the last K checkpoints stay restorable, older ones' unshared blobs are freed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.logs import CheckpointLog, open_checkpoint_log
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import Driver, Executor, assert_restorable, closure, query_blobs
from tests.servers.tansu import KafkaBroker


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    with TransferPool(4, name="ssb-test-retention") as p:
        yield p


def file_log(tmp_path: Path) -> CheckpointLog:
    log = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    log.create_resources()
    return log


def run_batches(driver: Driver, executor: Executor, batches: range) -> None:
    for b in batches:
        executor.upload(b + 1)
        assert driver.finish_batch(b) == 1, f"batch {b} not committed"


@pytest.mark.parametrize("keep", [1, 3])
def test_last_k_checkpoints_restorable_and_only_their_blobs_kept(
    keep: int, local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    qid = str(uuid.uuid4())
    log = file_log(tmp_path)
    executor = Executor(local_store, pool, qid, tmp_path / "exec")
    driver = Driver(local_store, log, pool, qid, tmp_path / "drv", retain=keep)
    for b in range(8):
        run_batches(driver, executor, range(b, b + 1))
        history = log.read_history(qid)
        assert [c.batch_id for c in history] == list(range(max(0, b - keep + 1), b + 1))
        # Exactly the blobs of the retained checkpoints remain: older ones' unshared blobs are gone,
        # nothing a retained checkpoint needs is.
        assert query_blobs(local_store) == closure(local_store, history)
        for cp in history:
            assert_restorable(local_store, pool, cp, executor.expected, tmp_path / f"r{b}")
            for blob in closure(local_store, [cp]):
                assert local_store.stat(blob).expires_at_ms is None, f"{blob} of {cp.checkpoint_id} expires"
    if keep > 1:
        assert driver.committer.retention is not None
        assert len(driver.committer.retention.retained(qid)) == keep


def test_k3_keeps_more_than_k1_for_the_same_history(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    sizes = {}
    for keep in (1, 3):
        store = LocalBlobStore(tmp_path / f"blobs{keep}", fsync=False)
        store.ensure_ready()
        qid = str(uuid.uuid4())
        executor = Executor(store, pool, qid, tmp_path / f"exec{keep}", seed=7)
        driver = Driver(store, file_log(tmp_path / f"l{keep}"), pool, qid, tmp_path / f"drv{keep}", keep)
        run_batches(driver, executor, range(8))
        sizes[keep] = len(query_blobs(store))
    assert sizes[3] > sizes[1]


def test_restarted_committer_learns_retained_history_from_the_log(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    qid = str(uuid.uuid4())
    executor = Executor(local_store, pool, qid, tmp_path / "exec")
    first = Driver(local_store, file_log(tmp_path), pool, qid, tmp_path / "drv1", retain=3)
    run_batches(first, executor, range(4))
    # A new driver (new log instance: it fences the first) continues the query.
    log2 = file_log(tmp_path)
    second = Driver(local_store, log2, pool, qid, tmp_path / "drv2", retain=3)
    run_batches(second, executor, range(4, 7))
    history = log2.read_history(qid)
    assert [c.batch_id for c in history] == [4, 5, 6]
    assert query_blobs(local_store) == closure(local_store, history)
    for cp in history:
        assert_restorable(local_store, pool, cp, executor.expected, tmp_path / "r")


def test_retention_on_kafka_log_counts_blobs_not_records(
    kafka_broker: KafkaBroker, local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """A compacted topic cannot delete records: history may show more than K (until compaction; Tansu
    never compacts), but only the last K checkpoints keep their blobs and restore."""
    topic = f"ret-{uuid.uuid4().hex[:10]}"
    opts = {
        "replication.factor": "1",
        "transactional.id.prefix": f"test-{topic}-",
        "write.timeout.ms": "10000",
        "read.timeout.ms": "10000",
        "admin.timeout.ms": "10000",
    }
    log = open_checkpoint_log(f"kafka://{kafka_broker.bootstrap}/{topic}", opts)
    log.create_resources()
    try:
        qid = str(uuid.uuid4())
        executor = Executor(local_store, pool, qid, tmp_path / "exec")
        driver = Driver(local_store, log, pool, qid, tmp_path / "drv", retain=3)
        run_batches(driver, executor, range(5))
        history = log.read_history(qid)
        assert [c.batch_id for c in history][-3:] == [2, 3, 4]
        last3 = history[-3:]
        assert query_blobs(local_store) == closure(local_store, last3)
        for cp in last3:
            assert_restorable(local_store, pool, cp, executor.expected, tmp_path / "r")
    finally:
        log.close()
