"""A batch Spark re-runs without running its stateful tasks (the file sink had it already).

When an application stops after its file sink wrote batch N but before Spark committed it, the next
run plans batch N again and the sink skips it: no state store instance runs, the progress counts none,
and the state of batch N is the version N+1 the earlier run committed (and uploaded). The chaos run of
seed 65 found the checkpoint of such a batch naming no store at all: a restart on a new host could
then restore nothing for the version Spark loads next, and the blobs that version replaced stayed
permanent with no checkpoint referencing them. Real uploads, reports, committer, file log and local
blob store (tests/commitrig.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import CheckpointLog
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import STORES, Driver, Executor, assert_restorable, closure, file_log, query_blobs

QID = "5c1d9e0a-7b2f-4c3d-8e4f-a1b2c3d4e5f6"


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    with TransferPool(4, name="ssb-test-skipped") as p:
        yield p


def _permanent_strays(store: LocalBlobStore, log: CheckpointLog) -> set[str]:
    """Blobs of the query with no TTL that the latest checkpoint does not reference: what only gc
    would ever delete (the chaos run's `unreferenced_permanent`)."""
    latest = log.read_latest(QID)
    assert latest is not None
    referenced = closure(store, [latest])
    return {b for b in query_blobs(store) - referenced if store.stat(b).expires_at_ms is None}


def _first_run(store: LocalBlobStore, log: CheckpointLog, pool: TransferPool, tmp: Path) -> Executor:
    """Application 1 checkpoints batches 0-2 (versions 1-3), then its executor uploads version 4 of
    batch 3 and the application stops before that batch is checkpointed."""
    executor = Executor(store, pool, QID, tmp / "exec", seed=7, app_id="app-1")
    driver = Driver(store, log, pool, QID, tmp / "drv1", app_id="app-1")
    for batch in range(3):
        executor.upload(batch + 1)
        assert driver.finish_batch(batch) == 1
    executor.upload(4)
    driver.committer.close()
    return executor


def test_a_batch_whose_stores_did_not_run_is_checkpointed_with_the_earlier_runs_version(
    tmp_path: Path, pool: TransferPool
) -> None:
    store, log = LocalBlobStore(tmp_path / "blobs"), file_log(tmp_path / "log")
    executor = _first_run(store, log, pool, tmp_path)

    # Application 2 re-runs batch 3 and its sink skips it: the progress counts no store instance.
    driver = Driver(store, log, pool, QID, tmp_path / "drv2", app_id="app-2")
    assert driver.finish_batch(3, instances=0) == 1
    latest = log.read_latest(QID)
    assert latest is not None and latest.batch_id == 3 and latest.writer_app_id == "app-2"
    markers = latest.markers(BLOBSTORE_BACKEND)
    assert set(markers) == {*STORES, DRIVER_STORE}, markers
    assert {k: markers[k] for k in STORES} == {s: executor.markers[(s, 4)] for s in STORES}
    # What a new host restores for the version Spark loads next is exactly what Spark wrote.
    assert_restorable(store, pool, latest, executor.expected, tmp_path / "restored")
    # The cleanup of that checkpoint deleted what version 4 replaced: nothing permanent is left over.
    assert _permanent_strays(store, log) == set()

    # The next batch runs its stores again (application 2's executor, from that checkpoint).
    executor.app_id = "app-2"
    executor.upload(5)
    assert driver.finish_batch(4) == 1
    latest = log.read_latest(QID)
    assert latest is not None and latest.batch_id == 4
    assert_restorable(store, pool, latest, executor.expected, tmp_path / "restored")
    assert _permanent_strays(store, log) == set()


def test_a_skipped_batch_without_an_upload_of_its_version_is_not_checkpointed(
    tmp_path: Path, pool: TransferPool
) -> None:
    store, log = LocalBlobStore(tmp_path / "blobs"), file_log(tmp_path / "log")
    executor = Executor(store, pool, QID, tmp_path / "exec", seed=7, app_id="app-1")
    first = Driver(store, log, pool, QID, tmp_path / "drv1", app_id="app-1")
    executor.upload(1)
    assert first.finish_batch(0) == 1
    first.committer.close()
    # Version 2 was never uploaded by anyone (the earlier run died first): a checkpoint of batch 1
    # could name no snapshot of it, so it is not written; the latest stays batch 0, whose stores
    # still restore, and the next batch that runs its stores is checkpointed as usual.
    driver = Driver(store, log, pool, QID, tmp_path / "drv2", app_id="app-2")
    assert driver.finish_batch(1, instances=0) == 0
    latest = log.read_latest(QID)
    assert latest is not None and latest.batch_id == 0
    executor.app_id = "app-2"
    executor.upload(3)
    assert driver.finish_batch(2) == 1
    latest = log.read_latest(QID)
    assert latest is not None and latest.batch_id == 2
    assert set(latest.markers(BLOBSTORE_BACKEND)) == {*STORES, DRIVER_STORE}


def test_a_stateless_query_is_still_checkpointed_with_its_driver_files_alone(
    tmp_path: Path, pool: TransferPool
) -> None:
    store, log = LocalBlobStore(tmp_path / "blobs"), file_log(tmp_path / "log")
    driver = Driver(store, log, pool, QID, tmp_path / "drv", app_id="app-1")
    for batch in range(2):
        assert driver.finish_batch(batch, instances=0) == 1
    latest = log.read_latest(QID)
    assert latest is not None and set(latest.markers(BLOBSTORE_BACKEND)) == {DRIVER_STORE}
