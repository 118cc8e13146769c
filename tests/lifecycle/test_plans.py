"""Batch plans (lifecycle/plans.py, runtime/ [C0], spark/ [D4]): each batch's plan is stored by the
driver's sidecar before Spark publishes its offsets, a rebuild places the plans after its checkpoint,
and cleanup deletes the ones a checkpoint covers. A real Sidecar on a local blob store and a file
checkpoint log (the `rig` fixture of conftest.py: checkpoints of batches 0..2, state versions 1..3)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import CheckpointId
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.errors import BlobStoreError
from spark_statebackend.lifecycle.plans import Plan, plan_batches, plan_id, read_plan, store_plan
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.cleanup import Cleanup
from spark_statebackend.runtime.ownership import Fenced, Ownership
from spark_statebackend.runtime.plan_store import PlanStore
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.spark.driver_restore import restore_checkpoint_location
from spark_statebackend.stores import LocalBlobStore
from tests.sidecarrig import KEY, QID, Rig, restore_request
from tests.trees import make_tree


def _ask(rig: Rig, batch: int, offsets: bytes) -> sp.RestoreResponse:
    """The driver JVM's plan request as it is about to publish `offsets/<batch>`, served by the sidecar."""
    request = sp.PlanRequest(
        request_id=str(uuid.uuid4()),
        query_id=QID,
        checkpoint_root=rig.location,
        batch_id=batch,
        offsets=offsets,
        executor_id="driver",
        created_at_ms=int(time.time() * 1000),
    )
    rig.sidecar.restores.serve_request(rig.sidecar.spool.write_request(request, fsync=False))
    response = rig.sidecar.spool.take_response(request.request_id)
    assert response is not None
    assert not rig.sidecar.spool.pending_requests()
    return response


def _spark_plans(rig: Rig, batch: int) -> None:
    """What Spark writes before it publishes `offsets/<batch>`: the previous batch's commit and, for a
    file source, the source log entry of the files it planned."""
    make_tree(
        rig.location,
        {
            "commits": {str(batch - 1): b"commits %d" % (batch - 1)},
            "sources": {"0": {str(batch): b"files of %d" % batch}},
        },
    )


def test_a_plan_holds_the_offsets_and_what_spark_wrote_since_the_previous_one(rig: Rig) -> None:
    _spark_plans(rig, 3)
    response = _ask(rig, 3, b"offsets 3")
    assert (response.status, response.message) == ("uploaded", plan_id(QID, 3))
    first = read_plan(rig.store, QID, 3)
    assert first is not None
    # The sidecar's first plan of the location: every driver file besides the offsets being written.
    assert first.files == {
        "offsets/3": b"offsets 3",
        "commits/2": b"commits 2",
        "metadata": (rig.location / "metadata").read_bytes(),
        "sources/0/3": b"files of 3",
    }
    make_tree(rig.location, {"offsets": {"3": b"offsets 3"}})  # Spark published it
    _spark_plans(rig, 4)
    assert _ask(rig, 4, b"offsets 4").status == "uploaded"
    second = read_plan(rig.store, QID, 4)
    assert second is not None
    assert second.files == {
        "offsets/4": b"offsets 4",
        "commits/3": b"commits 3",
        "sources/0/4": b"files of 4",
    }
    assert second.app_id == ""  # the rig's sidecar has no application identity


def test_a_plan_never_follows_a_symlink(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """A symlink planted among Spark's files is left out of the plan, named in a WARNING, never
    followed (the checkpoints of the query fail on it, and the commit gate stops the query)."""
    outside = rig.tmp / "outside"
    outside.write_bytes(b"not Spark's")
    _spark_plans(rig, 3)
    (rig.location / "sources" / "0" / "zz-planted").symlink_to(outside)
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        assert _ask(rig, 3, b"offsets 3").status == "uploaded"
    plan = read_plan(rig.store, QID, 3)
    assert plan is not None and "sources/0/zz-planted" not in plan.files and "sources/0/3" in plan.files
    assert any(
        "sources/0/zz-planted" in r.getMessage() and "symlink" in r.getMessage() for r in caplog.records
    )


def test_a_plan_is_never_overwritten(rig: Rig) -> None:
    _spark_plans(rig, 3)
    assert _ask(rig, 3, b"offsets 3").status == "uploaded"
    stored = rig.blob_path(plan_id(QID, 3)).read_bytes()
    again = _ask(rig, 3, b"offsets 3")  # Spark re-ran the planned batch: the same plan
    assert (again.status, again.message) == ("uploaded", plan_id(QID, 3))
    other = _ask(rig, 3, b"offsets 3, planned again")
    assert other.status == "error"
    for said in (f"query {QID} batch 3", plan_id(QID, 3), "other offsets"):
        assert said in other.message, other.message
    assert rig.blob_path(plan_id(QID, 3)).read_bytes() == stored


def test_a_fenced_application_stores_no_plan(rig: Rig) -> None:
    """The plan store asks the sidecar's Ownership, which the committer feeds with the latest checkpoint
    it reads before each write (runtime/ownership.py): once that read shows another identity's
    checkpoint after this application's, no plan is stored, and the answer names query, batch, owner
    and checkpoint."""
    ownership = Ownership("app-1")
    plans = PlanStore(rig.store, ownership=ownership, resolve_query_id=lambda _: QID)
    _spark_plans(rig, 3)
    latest = rig.checkpoints[-1]
    ours = dataclasses.replace(
        latest, checkpoint_id=CheckpointId.create(3, after=latest.checkpoint_id), writer_app_id="app-1"
    )
    rig.sidecar.log.write(ours)
    ownership.saw(rig.sidecar.log.read_latest(QID))  # the committer's read before its next write
    request = sp.PlanRequest("p1", QID, rig.location, 4, b"offsets 4", "driver", 0)
    assert plans.serve(request) == ("uploaded", plan_id(QID, 4))
    theirs = dataclasses.replace(
        ours, checkpoint_id=CheckpointId.create(4, after=ours.checkpoint_id), writer_app_id="app-2"
    )
    rig.sidecar.log.write(theirs)
    with pytest.raises(Fenced):
        ownership.saw(rig.sidecar.log.read_latest(QID))
    status, message = plans.serve(dataclasses.replace(request, batch_id=5, offsets=b"offsets 5"))
    assert status == "error"
    for said in (f"query {QID} batch 5", "app-2", "fenced", str(theirs.checkpoint_id)):
        assert said in message, message
    assert read_plan(rig.store, QID, 5) is None


def test_a_plan_is_stored_while_the_checkpoint_log_hangs(rig: Rig, tmp_path: Path) -> None:
    """A plan request never reads the checkpoint log (plan_store.py): with the log at a Kafka address
    nobody answers, whose every read hangs for its read.timeout, the plan is stored at the blob store's
    pace, and the JVM's wait for it stays far below a short commitTimeout."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hanging = open_checkpoint_log(f"kafka://127.0.0.1:{port}/ssb-hang", {"read.timeout": "30s"})
    sidecar = Sidecar(
        sp.Spool(tmp_path / "spool-hang"), "driver", rig.settings, checkpoint_log=hanging, app_id="app-1"
    )
    try:
        _spark_plans(rig, 3)
        started = time.monotonic()
        status, message = sidecar.restores.plans.serve(_plan_request(rig, 3))
        waited = time.monotonic() - started
    finally:
        sidecar.close()  # its own store on the rig's blob dir, and the hanging log
    assert (status, message) == ("uploaded", plan_id(QID, 3))
    assert waited < 5.0, f"the plan waited {waited:.1f}s: it read the checkpoint log"
    stored = read_plan(rig.store, QID, 3)
    assert stored is not None and stored.app_id == "app-1" and stored.offsets == b"offsets 3"


def _new_host(rig: Rig) -> None:
    """The driver's disk is gone but for `metadata` (so the rig's query is known without a locator)."""
    for sub in ("offsets", "commits", "state", "sources"):
        shutil.rmtree(rig.location / sub, ignore_errors=True)


def test_a_rebuild_places_the_plans_after_its_checkpoint(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    for batch in (3, 4):
        _spark_plans(rig, batch)
        assert _ask(rig, batch, b"offsets %d" % batch).status == "uploaded"
        make_tree(rig.location, {"offsets": {str(batch): b"offsets %d" % batch}})
    _spark_plans(rig, 5)  # commits/4 and the source entry of 5 on disk, offsets/5 not yet: no plan of 5
    stale = Plan(QID, 7, {"offsets/7": b"offsets 7"})
    store_plan(rig.store, stale)  # after a gap: a batch Spark plans again
    _new_host(rig)
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.spark"):
        outcome = restore_checkpoint_location(rig.settings, str(rig.location), store=rig.store)
    assert outcome == "restored batch 2; plans of batches 3..4"
    loc = rig.location
    assert [(loc / "offsets" / str(b)).read_bytes() for b in (2, 3, 4)] == [
        b"offsets %d" % b for b in (2, 3, 4)
    ]
    # Spark re-runs batch 4 with the offsets it planned: its commits end at 3
    assert sorted(p.name for p in (loc / "commits").iterdir()) == ["1", "2", "3"]
    assert sorted(p.name for p in (loc / "offsets").iterdir()) == ["1", "2", "3", "4"]
    assert {p.name: p.read_bytes() for p in (loc / "sources" / "0").iterdir()} == {
        "3": b"files of 3",
        "4": b"files of 4",
    }
    assert plan_batches(rig.store, QID) == [3, 4]
    assert any(plan_id(QID, 7) in r.getMessage() and "stale" in r.getMessage() for r in caplog.records)


def test_a_plan_whose_offsets_never_reached_the_location_is_placed_at_the_next_start(rig: Rig) -> None:
    """The plan of batch 3 was stored, then the driver stopped before Spark published `offsets/3` (a
    kill, or query.stop() interrupting the wait). The same host's next start uses Spark's files as
    they are, plus that plan, so Spark runs batch 3 with the offsets it planned instead of planning it
    again (which would conflict with the stored plan, which a new host would run)."""
    _spark_plans(rig, 3)
    assert _ask(rig, 3, b"offsets 3").status == "uploaded"
    assert not (rig.location / "offsets" / "3").exists()
    outcome = restore_checkpoint_location(rig.settings, str(rig.location), store=rig.store)
    assert outcome == "current; plans of batches 3..3"
    assert (rig.location / "offsets" / "3").read_bytes() == b"offsets 3"
    assert (rig.location / "commits" / "2").read_bytes() == b"commits 2"
    assert not (rig.location / "_statebackend" / "driver-restore").exists()
    # Started again with the plan in place: nothing more to place.
    assert restore_checkpoint_location(rig.settings, str(rig.location), store=rig.store) == "current"


def test_a_rebuild_refuses_a_plan_it_cannot_read(rig: Rig) -> None:
    _spark_plans(rig, 3)
    assert _ask(rig, 3, b"offsets 3").status == "uploaded"
    path = rig.blob_path(plan_id(QID, 3))
    path.chmod(0o600)
    path.write_bytes(b"{not a plan")
    _new_host(rig)
    with pytest.raises(Exception, match=f"plan of batch 3 \\({plan_id(QID, 3)}\\).*does not start"):
        restore_checkpoint_location(rig.settings, str(rig.location), store=rig.store)


def test_cleanup_deletes_the_plans_its_checkpoint_covers(rig: Rig) -> None:
    for batch in (2, 3, 4):
        store_plan(rig.store, Plan(QID, batch, {f"offsets/{batch}": b"o"}))
    latest = rig.sidecar.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 2
    Cleanup(rig.store, rig.sidecar.log, 3, None).at_start(latest, rig.sidecar.uploads.bases.manager(QID))
    assert plan_batches(rig.store, QID) == [3, 4]


def test_a_version_no_checkpoint_nor_report_holds_fails_loudly(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """After a rebuild placed plans, a task loads a version newer than every checkpoint ([E2]): with no
    upload report of it, the answer is not_found and an ERROR names query, store and version (Spark's
    own load then fails: no files), never older state."""
    dfs_dir = rig.location / "state" / "0" / "0"
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.sidecar"):
        status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 5, dfs_dir))
    assert status == "not_found"
    assert f"query {QID} holds version 5" in message
    assert any(
        QID in r.getMessage() and KEY in r.getMessage() and "version 5" in r.getMessage()
        for r in caplog.records
    )
    assert not dfs_dir.exists() or not list(dfs_dir.iterdir())


class _OutageStore(LocalBlobStore):
    """The rig's local blob store during an outage: its first `failures` creates fail as a remote
    store's do when it answers 503 for longer than its client retries."""

    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def create(self, blob_id: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise BlobStoreError(f"{self.url}: 503 Slow Down (test outage) creating {blob_id}")
        super().create(blob_id, data, metadata=metadata)


def _plan_request(rig: Rig, batch: int) -> sp.PlanRequest:
    return sp.PlanRequest(
        request_id=str(uuid.uuid4()),
        query_id=QID,
        checkpoint_root=rig.location,
        batch_id=batch,
        offsets=b"offsets %d" % batch,
        executor_id="driver",
        created_at_ms=int(time.time() * 1000),
    )


def test_an_outage_holds_the_plan_until_it_ends(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """A blob store outage shorter than commitTimeout delays the batch; it never fails it (a chaos run
    failed its query when the checkpoint log, which fencing then read on every plan, was frozen for 14 s)."""
    _spark_plans(rig, 3)
    store = _OutageStore(rig.tmp / "blobs", failures=3)
    plans = PlanStore(store, ownership=Ownership(""), resolve_query_id=lambda _: QID, retry_for=60.0)
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        status, message = plans.serve(_plan_request(rig, 3))
    assert (status, message) == ("uploaded", plan_id(QID, 3))
    assert store.failures == 0
    stored = read_plan(rig.store, QID, 3)
    assert stored is not None and stored.offsets == b"offsets 3"
    assert "retrying until spark.statebackend.commitTimeout" in caplog.text
    assert "503 Slow Down" in caplog.text


def test_an_outage_longer_than_commit_timeout_fails_the_plan_naming_it(rig: Rig) -> None:
    _spark_plans(rig, 3)
    store = _OutageStore(rig.tmp / "blobs", failures=10**6)
    # retry_for leaves less than RETRY_MARGIN_SECONDS + one backoff: the first failure is the last
    plans = PlanStore(store, ownership=Ownership(""), resolve_query_id=lambda _: QID, retry_for=5.1)
    status, message = plans.serve(_plan_request(rig, 3))
    assert status == "error"
    assert f"query {QID} batch 3" in message and "spark.statebackend.commitTimeout" in message
    assert "503 Slow Down" in message
    assert read_plan(rig.store, QID, 3) is None


def test_a_closing_sidecar_answers_a_held_plan_at_once(rig: Rig) -> None:
    _spark_plans(rig, 3)
    store = _OutageStore(rig.tmp / "blobs", failures=10**6)
    plans = PlanStore(store, ownership=Ownership(""), resolve_query_id=lambda _: QID, retry_for=600.0)
    plans.close()
    assert plans.serve(_plan_request(rig, 3))[0] == "error"
