"""durableCommit: a task's commit waits until its version is uploaded and reported (issue 21).

The JVM puts a request id in the snapshot event and waits for `responses/<id>.json`; the sidecar's
upload loop answers "uploaded" once the version's SnapshotIndex is reported (durable), "error" when it
never will be, and never holds a waited-for version back for the rest of its batch (the waiting task
holds its core). Real sidecar, local blob store, file log; the JVM side runs in
test_multihost.py (a lost host after durable commits) and test_exactly_once.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.lifecycle.reports import read_reports
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from tests.staging import stage_version

QID = "5b1e2f8a-7c3d-4e9f-a0b1-c2d3e4f5a6b7"


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
            PREFIX + "durableCommit": "true",
            PREFIX + "maxCommitDelay": "60s",  # a batch hold of up to 30 s for uploads no task waits for
        }
    )
    s = Sidecar(sp.Spool(tmp_path / "spool"), "driver", settings)
    s.store.ensure_ready()
    s.log.create_resources()
    for d in (s.spool.events_dir, s.spool.dir / "responses"):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    yield s
    s.close()


def test_a_waited_for_version_is_answered_once_it_is_reported(sidecar: Sidecar, tmp_path: Path) -> None:
    root = tmp_path / "cp"
    stage_version(sidecar, root, QID, 0, 1, request_id="r-1")
    assert sidecar.uploads.upload_once()
    answer = sidecar.spool.take_response("r-1")
    assert answer is not None and answer.status == "uploaded"
    reported = read_reports(sidecar.store, QID, 1)
    assert answer.message == reported["0/0/default"].marker  # the marker that is now durable


def test_a_waited_for_version_is_never_held_for_the_rest_of_its_batch(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    """Partitions 0 and 1 uploaded at version 1; only partition 0 has committed version 2. Without a
    waiting task the batch hold keeps version 2 back until partition 1 commits (up to 30 s here); with
    one it goes at once, or partition 1's task, queued behind the waiting one, could never commit."""
    root = tmp_path / "cp"
    for p in (0, 1):
        stage_version(sidecar, root, QID, p, 1)
    assert sidecar.uploads.upload_once()
    stage_version(sidecar, root, QID, 0, 2)
    sidecar.uploads.upload_once()
    assert "0/0/default" not in read_reports(sidecar.store, QID, 2), (
        "expected the batch hold without a waiter"
    )
    stage_version(sidecar, root, QID, 1, 2, request_id="r-2")  # now a task waits (partition 1)
    stage_version(sidecar, root, QID, 0, 3, request_id="r-3")
    sidecar.uploads.upload_once()
    for request_id in ("r-2", "r-3"):
        answer = sidecar.spool.take_response(request_id)
        assert answer is not None and answer.status == "uploaded", request_id


def test_a_superseded_event_is_answered_with_the_version_that_supersedes_it(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    """An upgrade of the same version (Spark published a snapshot meanwhile) supersedes the commit's
    event: the waiting task is answered when the upgrade's upload makes the version durable."""
    root = tmp_path / "cp"
    stage_version(sidecar, root, QID, 0, 3, snapshot=1, request_id="r-commit")
    stage_version(sidecar, root, QID, 0, 3, snapshot=3, upgrade=True)
    assert sidecar.uploads.upload_once()
    answer = sidecar.spool.take_response("r-commit")
    assert answer is not None and answer.status == "uploaded", answer


def test_a_version_that_can_never_be_uploaded_is_answered_error(sidecar: Sidecar, tmp_path: Path) -> None:
    root = tmp_path / "cp"
    stage_version(sidecar, root, QID, 0, 1, request_id="r-gone")
    shutil.rmtree(root)  # the location went with its query
    sidecar.uploads.upload_once()
    answer = sidecar.spool.take_response("r-gone")
    assert answer is not None and answer.status == "error" and "no longer exists" in answer.message
