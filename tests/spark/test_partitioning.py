"""A repartition no checkpoint recorded is never undone (without Spark, about 2 s).

Offline state repartition writes its batch while no query runs; the committer checkpoints it from an
`offline_commit` event (tests/spark/test_repartition.py, real Spark). If the application ends before that
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
from spark_statebackend.errors import RestoreError
from spark_statebackend.lifecycle.locators import write_locator
from spark_statebackend.spark.driver_restore import restore_checkpoint_location
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import Driver, Executor
from tests.sidecarrig import QID, Rig, build_rig
from tests.trees import make_tree, read_tree


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
    r = build_rig(tmp_path, batches=3, retain=3)
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
        assert any("ahead of its latest durable checkpoint" in r.getMessage() for r in caplog.records)
    finally:
        rig.sidecar.close()


def test_local_batches_beyond_the_checkpoint_are_kept_as_spark_wrote_them(rig: Rig) -> None:
    """The same location ahead of its checkpoint, with the partitioning unchanged: Spark's own files
    continue the query. Rolling back would drop `offsets/3`, which a sink may have committed output
    for, and make Spark plan batch 3 again with other input (issue 21)."""
    try:
        make_tree(rig.location, {"offsets": {"3": offsets(3, 2)}, "commits": {"3": b"v1\n{}"}})
        before = read_tree(rig.location)
        assert restore_checkpoint_location(rig.settings, str(rig.location)) == "current"
        assert read_tree(rig.location) == before
    finally:
        rig.sidecar.close()


def test_a_rebuild_never_deletes_spark_entries_after_its_checkpoint(rig: Rig) -> None:
    """A location without its `metadata` file but with Spark's entries after the checkpoint (a partial
    copy): a rebuild from the checkpoint would delete them, so the start is refused, naming them, and
    the location is left as it was."""
    try:
        make_tree(rig.location, {"offsets": {"3": offsets(3, 2)}, "commits": {"3": b"v1\n{}"}})
        (rig.location / "metadata").unlink()
        write_locator(rig.sidecar.store, str(rig.location), QID, "q")  # how a new host finds the query
        before = read_tree(rig.location)
        with pytest.raises(RestoreError, match=r"\(commits/3\); rebuilding it would delete them"):
            restore_checkpoint_location(rig.settings, str(rig.location))
        assert read_tree(rig.location) == before
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
