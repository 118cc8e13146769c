"""Restoring ahead (runtime/restore_ahead.py): when the driver's sidecar also serves the tasks' restores (a
local master), a rebuilt checkpoint location gets every store of its checkpoint restored before any task
asks, and a task that asks meanwhile waits for that restore instead of racing it. A real Sidecar on a
local blob store and a file checkpoint log (the `rig` and `gated` fixtures of conftest.py)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.store_restore import placing_order
from tests.servers.process import wait_until
from tests.sidecarrig import KEY_DIR, GatedStore, Rig, restore_request


def _rebuild(rig: Rig, *, restore_stores: bool) -> sp.RestoreResponse:
    """The driver JVM's request at a query's start on a location that lost everything but its
    `metadata` (so the query is known without a locator), served by the sidecar."""
    for sub in ("offsets", "commits", "state"):
        shutil.rmtree(rig.location / sub, ignore_errors=True)
    request = sp.CheckpointLocationRequest(
        request_id=str(uuid.uuid4()),
        checkpoint_root=rig.location,
        mode="start",
        executor_id="driver",
        created_at_ms=int(time.time() * 1000),
        restore_stores=restore_stores,
    )
    rig.sidecar.restores.serve_request(rig.sidecar.spool.write_request(request, fsync=False))
    response = rig.sidecar.spool.take_response(request.request_id)
    assert response is not None and response.status == "restored", response
    assert response.message == "restored batch 2"
    return response


def test_a_rebuilt_location_gets_its_stores_restored_before_any_task_asks(
    gated: tuple[Rig, GatedStore], caplog: pytest.LogCaptureFixture
) -> None:
    rig, _ = gated
    store_dir = rig.location / "state" / KEY_DIR
    with caplog.at_level(logging.INFO, logger="spark_statebackend.sidecar"):
        _rebuild(rig, restore_stores=True)
        assert not list(store_dir.iterdir())  # the rebuild itself placed only the driver's files
        assert rig.sidecar.restores.restore_once()  # no task request in the spool: the restore ahead went
        wait_until(
            lambda: any("restored query" in r.getMessage() for r in caplog.records), 60, "the restore ahead"
        )
    # Exactly batch 2's snapshot of the store (version 3), as a task's own request would have placed it.
    assert (store_dir / "3.zip").read_bytes() == b"zip 2"
    assert (store_dir / "2.sst").read_bytes() == b"s"
    assert sorted(p.name for p in store_dir.iterdir()) == ["2.sst", "3.zip"]
    assert not rig.sidecar.spool.pending_requests()
    said = [r.getMessage() for r in caplog.records]
    assert any(
        "restoring the 1 store(s)" in m and "(version 3)" in m and "ahead of their tasks" in m for m in said
    )
    assert any("restored query" in m and "store 0/0/default version 3" in m for m in said)


def test_without_restore_stores_the_stores_wait_for_their_tasks(rig: Rig) -> None:
    _rebuild(rig, restore_stores=False)  # executors have sidecars of their own (a cluster)
    assert not rig.sidecar.restores.restore_once()  # nothing to do until a task asks
    assert not list((rig.location / "state" / KEY_DIR).iterdir())


def test_a_task_asking_during_a_restore_ahead_waits_for_it_and_gets_the_files(
    gated: tuple[Rig, GatedStore],
) -> None:
    rig, store = gated
    spool = rig.sidecar.spool
    store_dir = rig.location / "state" / KEY_DIR
    _rebuild(rig, restore_stores=True)
    store.gate.clear()
    assert rig.sidecar.restores.restore_once()
    assert store.waiting.acquire(timeout=60)  # the restore ahead holds the store, reading its index
    # The task's load found the version incomplete and asks (the JVM's RestoreRequester).
    task = restore_request(rig, 3, store_dir, request_id="task", created_at_ms=int(time.time() * 1000))
    spool.write_request(task, fsync=False)
    assert rig.sidecar.restores.restore_once()
    assert spool.take_response("task") is None  # it waits for the store's lock, not racing
    store.gate.set()
    answer: list[sp.RestoreResponse] = []

    def answered() -> bool:
        rig.sidecar.restores.restore_once()
        got = spool.take_response("task")
        if got is not None:
            answer.append(got)
        return bool(answer)

    wait_until(answered, 60, "the task's request answered")
    assert answer[0].status == "restored", answer[0]
    assert answer[0].bytes == 0  # every file was already in place: reused, nothing downloaded again
    assert (store_dir / "3.zip").read_bytes() == b"zip 2"
    assert sorted(p.name for p in store_dir.iterdir()) == ["2.sst", "3.zip"]


def test_closing_the_sidecar_drops_the_restores_ahead_still_queued(rig: Rig) -> None:
    _rebuild(rig, restore_stores=True)
    loop = rig.sidecar.restores
    stopping = threading.Thread(target=loop.close, name="ssb-test-close")
    stopping.start()  # before the dispatcher ever ran: the queued restore ahead is dropped
    stopping.join(60)
    assert not stopping.is_alive()
    assert not loop.restore_once()
    assert not list((rig.location / "state" / KEY_DIR).iterdir())


def test_a_stores_own_files_are_placed_checksums_first_and_its_newest_version_last() -> None:
    names = ["3.zip", "3.zip.crc", "3.changelog", "2.changelog.crc", "2.changelog", "1.zip", "notes"]
    names.append("10.zip")
    assert sorted(names, key=placing_order) == [
        "2.changelog.crc",
        "3.zip.crc",
        "notes",
        "1.zip",
        "2.changelog",
        "3.changelog",
        "3.zip",
        "10.zip",
    ]
    v2 = ["5_ab.changelog", "4_cd.zip", "5_ab.changelog.crc", "4_cd.zip.crc"]
    assert sorted(v2, key=placing_order)[-1] == "5_ab.changelog"


def test_the_request_field_reads_back_and_defaults_to_false(tmp_path: Path) -> None:
    spool = sp.Spool(tmp_path / "spool")
    for flag in (True, False):
        request = sp.CheckpointLocationRequest(
            request_id=str(uuid.uuid4()),
            checkpoint_root=tmp_path / "cp",
            mode="start",
            executor_id="driver",
            created_at_ms=1,
            restore_stores=flag,
        )
        got = sp.read_request(spool.write_request(request, fsync=False))
        assert isinstance(got, sp.CheckpointLocationRequest) and got.restore_stores is flag
    old = b'{"schema_version": 2, "type": "checkpoint_location", "request_id": "r1",'
    old += b' "checkpoint_root": "/cp", "mode": "start", "executor_id": "driver", "created_at_ms": 1}'
    parsed = sp.read_any_request(old)
    assert isinstance(parsed, sp.CheckpointLocationRequest) and parsed.restore_stores is False
    with pytest.raises(sp.SpoolFormatError, match="restore_stores"):
        sp.read_any_request(old[:-1] + b', "restore_stores": "yes"}')
