"""A repartition no checkpoint recorded is never undone (without Spark, about 2 s).

Offline state repartition writes its batch while no query runs; the committer checkpoints it from an
`offline_commit` event (tests/test_repartition.py, real Spark). If the application ends before that
(`repartition(...)` as the last line of a maintenance script) or ran without the backend, no
checkpoint holds the new partitioning. Then:
- the driver must not roll the location back to the latest checkpoint, the old partitioning, when a
  query starts (restore_checkpoint_location keeps Spark's own files, which hold the repartition);
- the committer must start a new partitioning epoch (CheckpointV2.repartitioned_at_batch) at the first
  checkpoint whose state stores differ from the previous one's, so no fallback restore goes back
  across it, and a restarted committer must learn the stores from the latest checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.spark.driver_restore import restore_checkpoint_location
from spark_statebackend.stores import LocalBlobStore

from .commitrig import Driver, Executor
from .test_reliability import QID, Rig, _build
from .trees import make_tree, read_tree


def offsets(batch: int, partitions: int) -> bytes:
    """An `offsets/<batch>` file as Spark writes it: version, batch metadata with the confs, sources."""
    meta = {
        "batchWatermarkMs": 0,
        "batchTimestampMs": batch,
        "conf": {"spark.sql.shuffle.partitions": str(partitions)},
    }
    return b"v1\n" + orjson.dumps(meta) + b'\n{"src":%d}' % batch


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    """Checkpoints of batches 0..2 (2 shuffle partitions), and Spark's files for them in the location."""
    r = _build(tmp_path, batches=3, retain=3)
    make_tree(r.location, {"offsets": {str(b): offsets(b, 2) for b in range(3)}})
    return r


def test_an_offline_repartition_no_checkpoint_holds_is_kept(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        # repartition 2 -> 4: batch 3 has batch 2's offsets with 4 partitions, committed by Spark
        make_tree(rig.location, {"offsets": {"3": offsets(2, 4)}, "commits": {"3": b"v1\n{}"}})
        before, durable = read_tree(rig.location), rig.durable()
        with caplog.at_level(logging.WARNING, logger="spark_statebackend.spark"):
            assert restore_checkpoint_location(rig.settings, str(rig.location)) == "current"
        assert read_tree(rig.location) == before  # batch 3 is not dropped
        assert rig.durable() == durable
        assert any("repartitioned offline at batch 3" in r.getMessage() for r in caplog.records)
    finally:
        rig.sidecar.close()


def test_local_batches_beyond_the_checkpoint_are_still_rolled_back(rig: Rig) -> None:
    """The same location ahead of its checkpoint, with the partitioning unchanged: the durable
    checkpoint wins as before (the local batch is dropped and runs again)."""
    try:
        make_tree(rig.location, {"offsets": {"3": offsets(3, 2)}, "commits": {"3": b"v1\n{}"}})
        assert restore_checkpoint_location(rig.settings, str(rig.location)) == "restored batch 2"
        assert not (rig.location / "commits" / "3").exists() and not (rig.location / "offsets" / "3").exists()
    finally:
        rig.sidecar.close()


def test_the_first_checkpoint_with_other_stores_starts_a_new_partitioning(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri())
    cplog.create_resources()
    with TransferPool(4, name="test") as pool:
        executor = Executor(store, pool, QID, tmp_path / "executor")
        driver = Driver(store, cplog, pool, QID, tmp_path / "driver", retain=5)
        for batch in (0, 1):
            executor.upload(batch + 1)
            assert driver.finish_batch(batch) == 1
        four = [f"0/{p}/default" for p in range(4)]
        for key in four:
            executor.dir(key).mkdir(parents=True, exist_ok=True)
        executor.upload(3, four)  # no offline_commit was seen for the repartition: batch 2 has 4 stores
        assert driver.finish_batch(2, instances=4) == 1
        executor.upload(4, four)
        assert driver.finish_batch(3, instances=4) == 1
        # A new driver's committer learns the stores from the latest checkpoint: no new epoch at batch 4.
        restarted = Driver(store, cplog, pool, QID, tmp_path / "driver-2", retain=5)
        executor.upload(5, four)
        assert restarted.finish_batch(4, instances=4) == 1
    epochs = [(c.batch_id, c.repartitioned_at_batch) for c in cplog.read_history(QID)]
    assert epochs == [(0, 0), (1, 0), (2, 2), (3, 2), (4, 2)]
