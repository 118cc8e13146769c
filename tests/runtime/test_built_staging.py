"""A snapshot the sidecar built from Spark's changelogs goes up as an upgrade of its version between
commits (runtime/built_staging.py), so the next commit's durable wait uploads its changelog alone.

A real Sidecar (upload loop, materializer child process, rocksdict) on a local blob store; the
changelogs are in Spark's format (tests/runtime/test_materializer.py); no Spark: the Spark tests in
tests/system/ prove Spark loads what the materializer builds.
"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from spark_statebackend.lifecycle.reports import read_reports, read_upgrades
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.built_staging import stage_built_snapshot
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from tests.runtime.test_materializer import spark_changelog

QID = "6f1c2f0e-0000-4000-8000-000000000002"
KEY = "0/0/default"
BUILD_TIMEOUT_S = 120.0


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
            PREFIX + "changelogSnapshotEvery": "3",
        }
    )
    s = Sidecar(sp.Spool(tmp_path / "spool"), "driver", settings, app_id="app-1")
    s.store.ensure_ready()
    s.log.create_resources()
    yield s
    s.close()


def _commit(sidecar: Sidecar, root: Path, version: int, snapshot: int) -> Path:
    """Spark's commit of `version` (its changelog) staged as the JVM stages it: the recipe (`<snapshot>.zip`
    with its SSTs, then the changelogs after it) hard-linked into a staging dir, and an event."""
    store = root / "state" / "0" / "0"
    store.mkdir(parents=True, exist_ok=True)
    records = [("put", f"k{version}-{i}".encode(), os.urandom(256)) for i in range(200)]
    (store / f"{version}.changelog").write_bytes(spark_changelog(records, v2=False))
    files = [f"{v}.changelog" for v in range(snapshot + 1, version + 1)]
    if snapshot:
        files.append(f"{snapshot}.zip")
        files += [f"SSTs/{p.name}" for p in (store / "SSTs").iterdir()]
    staged = root / "_statebackend" / "staging" / "app" / "0" / "0" / "default" / f"{version}-{version:08d}"
    for f in files:
        (staged / f).parent.mkdir(parents=True, exist_ok=True)
        os.link(store / f, staged / f)
    return sidecar.spool.write_event(
        sp.SnapshotEvent(
            query_id=QID, batch_id=version - 1, checkpoint_root=root, dfs_dir=store, operator=0, partition=0,
            store="default", version=version, spark_unique_id=None, staged_dir=staged, files=tuple(files),
            executor_id="driver", created_at_ms=int(time.time() * 1000), stage_nanos=1,
            snapshot_version=snapshot, changelog_versions=tuple(range(snapshot + 1, version + 1)),
        )
    )  # fmt: skip


def test_a_built_snapshot_is_uploaded_as_an_upgrade_and_the_next_commit_uploads_its_changelog_alone(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    uploads = sidecar.uploads
    for v in (1, 2, 3):
        _commit(sidecar, root, v, 0)
        assert uploads.upload_once()
    store = root / "state" / "0" / "0"
    batch_marker = read_reports(sidecar.store, QID, 3)[KEY].marker
    uploads.materializer.flush(BUILD_TIMEOUT_S)  # version 3 replays 3 changelogs: 3.zip was built

    (path,) = sidecar.spool.pending_events()
    ev = sp.read_event(path)
    ssts = sorted(f for f in ev.files if f.startswith("SSTs/"))
    assert ev.upgrade and ev.version == 3 and ev.snapshot_version == 3 and ev.changelog_versions == ()
    assert ev.request_id is None and ssts and sorted(ev.files) == ["3.zip", *ssts]
    for f in ev.files:  # hard links of the store's own files, nothing copied
        assert (ev.staged_dir / f).stat().st_ino == (store / f).stat().st_ino
    assert ev.staged_dir.parent == root / "_statebackend" / "staging" / "app-1" / "0" / "0" / "default"

    assert uploads.upload_once()
    (upgrade,) = read_upgrades(sidecar.store, QID, 3)
    manager = uploads.bases.manager(QID)
    assert manager.snapshot_index(upgrade.marker).prev_snapshot_index_blob_id == batch_marker
    assert not ev.staged_dir.exists()
    # Version 4 starts from 3.zip: its SSTs went up with the upgrade, so only 4.changelog is new.
    _commit(sidecar, root, 4, 3)
    assert uploads.upload_once()
    last = manager.last_upload(KEY)
    assert last is not None
    assert (last.stats.files_added, last.stats.files_retained) == (1, 1 + len(ssts)), last.stats
    assert manager.snapshot_index(
        read_reports(sidecar.store, QID, 4)[KEY].marker
    ).prev_snapshot_index_blob_id == (upgrade.marker)


def test_a_built_snapshot_that_cannot_be_staged_is_logged_and_leaves_nothing(
    sidecar: Sidecar, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    path = _commit(sidecar, root, 1, 0)
    ev = sp.read_event(path)
    (root / "state" / "0" / "0" / "1.zip").write_bytes(b"not a zip")
    assert stage_built_snapshot(sidecar.spool, "app", QID, ev) is None
    assert sidecar.spool.pending_events() == [path]  # no second event
    assert sorted(
        p.name for p in (root / "_statebackend" / "staging" / "app" / "0" / "0" / "default").iterdir()
    ) == ["1-00000001"]  # the batch's own staged dir only
    warning = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert QID in warning and "store 0/0/default version 1" in warning and "1.zip" in warning


def test_staging_never_follows_a_symlinked_staging_dir(sidecar: Sidecar, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for v in (1, 2, 3):
        _commit(sidecar, root, v, 0)
        assert sidecar.uploads.upload_once()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "_statebackend" / "staging" / "app-1").symlink_to(elsewhere)
    sidecar.uploads.materializer.flush(BUILD_TIMEOUT_S)
    assert (root / "state" / "0" / "0" / "3.zip").exists()  # built
    assert sidecar.spool.pending_events() == [] and list(elsewhere.iterdir()) == []


def test_a_zip_naming_an_sst_outside_its_store_is_not_staged(sidecar: Sidecar, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ev = sp.read_event(_commit(sidecar, root, 1, 0))
    store = root / "state" / "0" / "0"
    (store / "SSTs").mkdir()
    outside = root / "state" / "0" / "secret.sst"
    outside.write_bytes(b"s" * 10)
    meta = {"sstFiles": [{"localFileName": "1.sst", "dfsSstFileName": "../../secret.sst", "sizeBytes": 10}]}
    with zipfile.ZipFile(store / "1.zip", "w") as zf:
        zf.writestr("metadata", "v1\n" + orjson.dumps(meta).decode())
    assert stage_built_snapshot(sidecar.spool, "app-1", QID, ev) is None
    assert not (root / "_statebackend" / "staging" / "app-1").exists()
    assert outside.stat().st_nlink == 1  # never linked
