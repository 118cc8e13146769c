"""A stopped query's checkpoint location is gone or going: the sidecar neither retries its snapshots for
ever nor holds another query's commits, and nothing of ours is written into that location (issue 21).

A query with no checkpointLocation runs on Spark's temporary location, which Spark deletes when the
query stops; a user (or a test) deletes a stopped query's own. A snapshot staged just before is then
gone with it: its upload used to fail (`<dir>: not a directory`) and be retried until commitTimeout,
counting as lag all along, and the commit gate, which read one figure per sidecar, held the commits of
every later query of the application. Real sidecar, local blob store, file checkpoint log.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.errors import BlobStoreError
from spark_statebackend.lifecycle.reports import read_reports
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.runtime.upload_lag import STATUS_FILE
from spark_statebackend.settings import PREFIX, Settings
from spark_statebackend.spark.location import DRIVER_STAGING_DIR
from spark_statebackend.stores import LocalBlobStore
from tests.servers.process import wait_until
from tests.staging import stage_version

QA = "3f0c9a52-1b7e-4d2a-9c61-5e8d7f2a0b14"  # the stopped query
QB = "8d2e4b71-6a3c-4f90-b1d5-2c7e9a0f3e68"  # the query running after it


class OutageStore(LocalBlobStore):
    """A local blob store whose puts for the queries in `down` fail (their blob ids name the query), as
    an outage that hits one query's uploads would; `on_fail` runs first (e.g. the location deleted
    while the upload was in flight)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.down: set[str] = set()
        self.on_fail: list[Path] = []  # directories deleted when a put fails

    def put(self, blob_id, opener, size, *, metadata=None, ttl_seconds=None):  # type: ignore[no-untyped-def]
        if any(q in blob_id for q in self.down):
            for d in self.on_fail:
                shutil.rmtree(d, ignore_errors=True)
            raise BlobStoreError(f"injected outage for {blob_id}")
        super().put(blob_id, opener, size, metadata=metadata, ttl_seconds=ttl_seconds)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
            PREFIX + "maxCommitDelay": "0s",  # no batch hold: each upload_once uploads what is staged
            PREFIX + "commitTimeout": "10min",
        }
    )
    store = OutageStore(tmp_path / "blobs")
    s = Sidecar(sp.Spool(tmp_path / "spool"), "driver", settings, store=store)
    s.store.ensure_ready()
    s.log.create_resources()
    for d in (s.spool.events_dir, s.progress_dir):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    yield s
    s.close()


def _status(sidecar: Sidecar) -> dict[str, object]:
    doc = orjson.loads((sidecar.spool.dir / STATUS_FILE).read_bytes())
    assert isinstance(doc, dict)
    return doc


def _spooled(sidecar: Sidecar) -> list[Path]:
    return sidecar.spool.pending_events() + sp.claimed(sidecar.spool.events_dir)


def test_a_snapshot_whose_location_was_deleted_is_dropped_once_not_retried(
    sidecar: Sidecar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "temporary-a"
    staged_at = int(time.time() * 1000) - 60_000  # long past maxCommitDelay: it would hold commits
    stage_version(sidecar, root, QA, 0, 3, staged_at_ms=staged_at)
    shutil.rmtree(root)  # Spark deletes a temporary location when its query stops
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        sidecar.uploads.upload_once()
        sidecar.uploads.upload_once()
    assert _spooled(sidecar) == [], "the event must leave the spool"
    status = _status(sidecar)
    assert status["oldest_upload_staged_at_ms"] is None and status["oldest_by_query"] == {}
    dropped = [r.getMessage() for r in caplog.records if "no longer exists" in r.getMessage()]
    assert len(dropped) == 1, dropped  # said once
    assert QA in dropped[0] and "0/0/default" in dropped[0] and "version 3" in dropped[0]
    assert str(root) in dropped[0] and "checkpoint location" in dropped[0]
    assert not read_reports(sidecar.store, QA, 3)
    assert not root.exists(), "the sidecar must not recreate the deleted location"


def test_a_snapshot_whose_staged_dir_is_gone_is_dropped_naming_it(
    sidecar: Sidecar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cp"
    staged = stage_version(sidecar, root, QA, 0, 2)
    shutil.rmtree(staged)
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        sidecar.uploads.upload_once()
    assert _spooled(sidecar) == []
    (line,) = [r.getMessage() for r in caplog.records if "no longer exists" in r.getMessage()]
    assert "staged dir" in line and str(staged) in line and QA in line and "version 2" in line
    assert _status(sidecar)["oldest_by_query"] == {}


def test_one_querys_failing_uploads_count_as_lag_of_that_query_only(sidecar: Sidecar, tmp_path: Path) -> None:
    """The commit gate reads the committing store's query in `oldest_by_query` (CommitGate.java)."""
    assert isinstance(sidecar.store, OutageStore)
    sidecar.store.down.add(QA)
    staged_a = int(time.time() * 1000) - 5_000
    stage_version(sidecar, tmp_path / "cp-a", QA, 0, 4, staged_at_ms=staged_a)
    stage_version(sidecar, tmp_path / "cp-b", QB, 0, 1)
    assert sidecar.uploads.upload_once()
    assert read_reports(sidecar.store, QB, 1), "query B's upload goes ahead"
    status = _status(sidecar)
    assert status["oldest_by_query"] == {QA: staged_a}, status
    assert status["oldest_upload_staged_at_ms"] == staged_a  # the overall figure stays, for the gauge
    assert len(_spooled(sidecar)) == 1, "query A's snapshot is kept for its retry (a transient failure)"
    sidecar.store.down.clear()
    wait_until(
        lambda: sidecar.uploads.upload_once() and bool(read_reports(sidecar.store, QA, 4)), 30, "A's retry"
    )
    assert _status(sidecar)["oldest_by_query"] == {}


def test_a_location_deleted_while_its_upload_fails_is_dropped_at_once(
    sidecar: Sidecar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The failure of an upload whose location went meanwhile is not retried: the paths are looked at
    after the failure, whatever the error said (here an unrelated blob store error)."""
    assert isinstance(sidecar.store, OutageStore)
    root = tmp_path / "temporary-a"
    stage_version(sidecar, root, QA, 1, 5, staged_at_ms=int(time.time() * 1000) - 5_000)
    sidecar.store.down.add(QA)
    sidecar.store.on_fail.append(root)
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        assert sidecar.uploads.upload_once()
    assert _spooled(sidecar) == [] and _status(sidecar)["oldest_by_query"] == {}
    (line,) = [r.getMessage() for r in caplog.records if "no longer exists" in r.getMessage()]
    assert QA in line and "0/1/default" in line and "version 5" in line and str(root) in line
    assert not any("retrying in" in r.getMessage() for r in caplog.records), "no retry was scheduled"


def _finished_batch(sidecar: Sidecar, root: Path, query_id: str, batch: int) -> None:
    """What Spark and the JVM listener leave for batch `batch` of a one-store query: its files in the
    location, its staged snapshot (version batch+1) and its progress document."""
    (root / "metadata").parent.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(orjson.dumps({"id": query_id}).decode() + "\n")
    for sub in ("offsets", "commits"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / str(batch)).write_text(f"v1\n{{}}\n{sub} {batch}\n")
    stage_version(sidecar, root, query_id, 0, batch + 1)
    progress = {
        "id": query_id,
        "runId": str(uuid.uuid4()),
        "name": "q",
        "batchId": batch,
        "timestamp": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        "batchDuration": 10,
        "sources": [{"description": "rate", "endOffset": {"offset": (batch + 1) * 10}}],
        "stateOperators": [{"numStateStoreInstances": 1}],
    }
    doc = {
        "schema_version": 1,
        "type": "progress",
        "query_id": query_id,
        "batch_id": batch,
        "checkpoint_root": str(root),
        "progress_json": orjson.dumps(progress).decode(),
        "created_at_ms": int(time.time() * 1000),
    }
    sp.atomic_write_json(sidecar.progress_dir / f"{sp.new_file_stem()}.json", doc, fsync=False)


def test_the_driver_snapshot_is_staged_in_the_spool_not_in_the_location(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    root = tmp_path / "cp"
    _finished_batch(sidecar, root, QA, 0)

    def checkpointed() -> bool:
        sidecar.uploads.upload_once()
        sidecar.commits.commit_once()
        latest = sidecar.log.read_latest(QA)
        return latest is not None and latest.batch_id == 0

    wait_until(checkpointed, 30, "the checkpoint of batch 0")
    latest = sidecar.log.read_latest(QA)
    assert latest is not None and DRIVER_STORE in latest.markers(BLOBSTORE_BACKEND)
    ours = root / "_statebackend"
    assert not (ours / "driver-staging").exists(), "the committer wrote into the checkpoint location"
    staging = sidecar.spool.dir / DRIVER_STAGING_DIR
    assert staging.is_dir() and stat.S_IMODE(staging.lstat().st_mode) == 0o700
    assert list(staging.iterdir()) == [], "the staged `_driver` snapshot outlived its upload"
    # What is left of ours in the location once its events are consumed: the staging dirs, empty.
    assert [p for p in (ours / "staging").rglob("*") if not p.is_dir()] == []
