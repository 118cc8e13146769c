"""Offline state repartition (Spark 4.3's StreamingCheckpointManager.repartition) on a backed-up query.

One local[2] application with the backend (configure(), real sidecars, a file:// blob store and log,
retainCheckpoints=2) runs demo_app's `agg` query one micro-batch per start (availableNow on
rate-micro-batch), so every run ends between batches and repartition finds the last batch committed.
What is shown, in order:
- repartition works on a checkpoint backed up by us (Spark's provider check passes: the query keeps
  Spark's own RocksDBStateStoreProvider);
- its new batch is checkpointed by our committer (the offline_commit path): a CheckpointV2 with
  repartitioned_at_batch = that batch and a marker for every new partition's store;
- with that checkpoint unusable (a blob of it deleted), a start on a wiped location fails loudly
  rather than restoring the retained pre-repartition checkpoint (the old partitioning);
- a start on a wiped location then resumes with the new partitioning and exactly the output of an
  uninterrupted run (tests/conftest.py::agg_reference), shifted by one batch after the repartition
  batch, which runs no query and re-plans no input.
The "wiped host" is the checkpoint location deleted under the same application (its sidecars and
spool stay): each query start rebuilds the location, and each store is restored from the blob store.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointV2
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.spark.driver_restore import snapshot_problems
from spark_statebackend.stores import open_blob_store
from tests.jobrig import outputs
from tests.servers.process import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("repartition")


@pytest.fixture(scope="module")
def spark(work: Path) -> Iterator[SparkSession]:
    import spark_statebackend

    active = SparkSession.getActiveSession()
    if active is not None:  # another module's session would carry the wrong conf
        active.stop()
    b = (
        SparkSession.builder.master("local[2]")
        .appName("test_repartition")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
    )
    spark_statebackend.configure(
        b,
        **{
            "blobStore.url": (work / "blobs").as_uri(),
            "checkpointLog.url": (work / "log").as_uri(),
            "spoolDir": str(work / "spool"),
            "retainCheckpoints": "2",
        },
    )
    session = b.getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def run_one_batch(spark: SparkSession, work: Path) -> dict[str, object]:
    """Start the query on work/ckpt for one micro-batch (availableNow), wait until that batch is
    checkpointed and return its progress. (A start finding its location ahead of the latest durable
    checkpoint resumes from that checkpoint: without the wait, the next start could rerun this batch.)"""
    from spark_statebackend.demo_app import build

    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)

    def sink(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = sorted(tuple(r) for r in batch_df.collect())
        (out / f"{batch_id}.json").write_text(json.dumps(rows))

    df, mode = build(spark, "agg")
    q = (
        df.writeStream.outputMode(mode)
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300), "the query did not finish its batch"
    assert q.exception() is None, q.exception()
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(progress) == 1, progress
    wait_checkpointed(work, str(q.id), progress[0]["batchId"])
    return progress[0]


def latest_checkpoint(work: Path, query_id: str) -> CheckpointV2 | None:
    return open_checkpoint_log((work / "log").as_uri()).read_latest(query_id)


def wait_checkpointed(work: Path, query_id: str, batch: int) -> CheckpointV2:
    wait_until(
        lambda: (c := latest_checkpoint(work, query_id)) is not None and c.batch_id >= batch,
        120,
        f"checkpoint of batch {batch}",
        interval=0.1,
    )
    latest = latest_checkpoint(work, query_id)
    assert latest is not None
    return latest


def test_offline_repartition_is_checkpointed_and_never_undone(
    spark: SparkSession, work: Path, agg_reference: Path
) -> None:
    for batch in range(3):
        progress = run_one_batch(spark, work)
        assert progress["batchId"] == batch
    qid = str(progress["id"])
    before = wait_checkpointed(work, qid, 2)
    assert sorted(before.markers(BLOBSTORE_BACKEND)) == ["0/0/default", "0/1/default", DRIVER_STORE]

    # 1. Repartition 2 -> 4 with no query running: Spark writes batch 3 (offsets, state version 4 of
    # each new partition, commits/3), and our committer checkpoints it.
    spark._streamingCheckpointManager.repartition(str(work / "ckpt"), 4)  # type: ignore[attr-defined]
    offsets = (work / "ckpt" / "offsets" / "3").read_text().splitlines()
    assert json.loads(offsets[1])["conf"]["spark.sql.shuffle.partitions"] == "4"
    after = wait_checkpointed(work, qid, 3)
    assert after.batch_id == 3 and after.repartitioned_at_batch == 3
    assert after.input_offsets == before.input_offsets  # repartition re-plans no input
    new_stores = [f"0/{p}/default" for p in range(4)]
    assert sorted(after.markers(BLOBSTORE_BACKEND)) == [*new_stores, DRIVER_STORE]
    store = open_blob_store((work / "blobs").as_uri())
    for key in new_stores:
        index = load_snapshot_index(store, after.markers(BLOBSTORE_BACKEND)[key])
        assert index.metadata.version == 4, key  # Spark's rewrite commits version batch + 1
    cplog = open_checkpoint_log((work / "log").as_uri())
    wait_until(lambda: len(cplog.read_history(qid)) == 2, 60, "retention after the checkpoint")
    history = cplog.read_history(qid)
    assert [(c.batch_id, c.repartitioned_at_batch) for c in history] == [(2, 0), (3, 3)]
    with TransferPool(2, name="test-verify") as pool:  # the old partitioning is still restorable...
        assert snapshot_problems(store, pool, history[0]) == []

    # 2. ...but with the new checkpoint unusable (one store's SnapshotIndex gone) on a wiped host, the
    # retained pre-repartition checkpoint (batch 2) must not be restored in its place.
    victim = store.local_path(after.markers(BLOBSTORE_BACKEND)["0/3/default"])
    assert victim is not None
    aside = work / "victim.aside"
    victim.rename(aside)
    shutil.rmtree(work / "ckpt")
    with pytest.raises(Exception, match="no retained checkpoint is restorable") as failed:
        run_one_batch(spark, work)
    message = str(failed.value)
    assert "0/3/default" in message and "predate the offline state repartition at batch 3" in message
    assert not (work / "ckpt").exists()
    assert latest_checkpoint(work, qid) == after  # nothing rewritten to point at the old partitioning
    aside.rename(victim)

    # 3. On the still wiped host, with the checkpoint whole again: the query resumes with 4 partitions.
    for batch in (4, 5):
        progress = run_one_batch(spark, work)
        assert progress["batchId"] == batch
        ops = progress["stateOperators"]
        assert isinstance(ops, list) and ops[0]["numShufflePartitions"] == 4, ops
    assert sorted(p.name for p in (work / "ckpt" / "state" / "0").glob("[0-9]*")) == ["0", "1", "2", "3"]
    logs = "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))
    assert all(f"store {key} version 4 from" in logs for key in new_stores), (
        "not restored from the blob store"
    )
    # Batch 3 ran no query and re-planned no input, so batch b > 3 did what the reference's batch b - 1
    # did: the same rows, in the same state.
    got = {int(p.stem): json.loads(p.read_text()) for p in (work / "out").glob("*.json")}
    want = outputs(agg_reference, 4)
    assert sorted(got) == [0, 1, 2, 4, 5]
    assert [got[b] for b in (0, 1, 2, 4, 5)] == [want[b] for b in range(5)]
    assert wait_checkpointed(work, qid, 5).repartitioned_at_batch == 3
