"""The committer's part of a checkpoint location on another Hadoop scheme (issue 22 item 2; the JVM
side with real Spark: tests/spark/test_remote_location.py). The JVM listener hands such a batch with
the location's name (`checkpoint_location`) and the driver's local mirror root of it as its checkpoint
root, which holds no Spark metadata: the location is durable itself and nothing rebuilds it, so the
checkpoint has no `_driver` snapshot, and the query's locator names the remote location. A real
Committer on a local blob store and a file log (tests/commitrig.py).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.errors import StateBackendError
from spark_statebackend.lifecycle.locators import locator_entries
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import STORES, Driver, Executor

LOCATION = "objfs://bucket/ckpt"


def test_a_remote_locations_batch_is_checkpointed_without_a_driver_snapshot(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    cplog.create_resources()
    qid = str(uuid.uuid4())
    spool = tmp_path / "spool"
    spool.mkdir()
    mirror_root = tmp_path / "mirrors" / "0123abcd"
    mirror_root.mkdir(parents=True)  # the listener creates it; it holds no offsets/, commits/, metadata
    with TransferPool(4, name="ssb-test-remote") as pool:
        executor = Executor(store, pool, qid, tmp_path / "exec")
        driver = Driver(store, cplog, pool, qid, tmp_path / "drv", spool_dir=spool)
        for batch in range(2):
            executor.upload(batch + 1)
            driver.committer.submit(
                ProgressEvent(
                    query_id=qid,
                    query_name="remote",
                    checkpoint_root=mirror_root,
                    batch_id=batch,
                    input_offsets={"src": str(batch)},
                    state_store_instances=len(STORES),
                    batch_end_ms=int(time.time() * 1000),
                    remote_location=LOCATION,
                )
            )
            assert driver.committer.poll() == 1, f"batch {batch} was not checkpointed"
    latest = cplog.read_latest(qid)
    assert latest is not None and latest.batch_id == 1
    assert set(latest.markers(BLOBSTORE_BACKEND)) == set(STORES)  # no DRIVER_STORE
    assert DRIVER_STORE not in latest.markers(BLOBSTORE_BACKEND)
    assert [e.query_id for e in locator_entries(store, LOCATION)] == [qid]
    assert locator_entries(store, str(mirror_root)) == []


@pytest.mark.parametrize("bad", ["file:///tmp/x", "relative/path", "objfs://a\nb", "no-scheme"])
def test_a_remote_location_that_is_not_a_remote_uri_is_refused(bad: str) -> None:
    progress = {"id": str(uuid.uuid4()), "batchId": 0, "timestamp": "2026-01-01T00:00:00.000Z"}
    with pytest.raises(StateBackendError, match="checkpoint_location"):
        ProgressEvent.from_progress_json(progress, "/mirror", "src.json", bad)
