"""A hostile or malformed marker in the LATEST checkpoint of a query (issue 6).

The markers of a checkpoint are data read back from the log: a blob id that escapes the store, names
another store's blob, a missing SnapshotIndex or a chunk posing as one. A committer (and an executor
sidecar) starting on such a query used to fail every poll for it: the committer could not load the
`_driver` diff base, so no batch of that query was ever committed again, and the queries polled after
it in the same poll were stalled too; the sidecar could not refresh its diff base, so every upload of
the query failed. Designed behaviour (commit.py module doc): an ERROR naming the query, the checkpoint,
the store and the marker; the marker is never used as a diff base (that store's next snapshot is
uploaded whole), never cleaned up (nothing it names is deleted or made permanent); the query goes on
committing and its next checkpoint supersedes the bad one; other queries are not affected.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
)
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.committer import Committer
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import STORES, Executor, assert_restorable, closure
from tests.sidecarrig import KEY, QID, STAGING, Rig, build_rig, progress_bytes, snapshot_event
from tests.trees import make_tree

Q1 = "11111111-1111-4111-8111-111111111111"
Q2 = "22222222-2222-4222-8222-222222222222"


def _bad_markers(store: LocalBlobStore, query_id: str) -> dict[str, str]:
    """Store key -> a marker that cannot be that store's SnapshotIndex, one kind per store."""
    # A chunk of the long-lived base.sst (every snapshot keeps it): a random chunk could be one the next
    # upload removes, which that upload's cleanup then deletes rightly, whatever the bad marker says.
    [marker] = [b.blob_id for b in store.list(f"indexes/{query_id}/{STORES[1]}/")]
    files = dict(load_snapshot_index(store, marker).dir_index.walk_files())
    chunk = files["base.sst"].blobs[0].blob_id
    return {
        DRIVER_STORE: "../../../etc/passwd",  # escapes the store
        STORES[0]: f"indexes/{query_id}/{STORES[0]}/v000000000099-deadbeef.json",  # missing
        STORES[1]: chunk,  # a real blob of the query, but a file chunk, not a SnapshotIndex
    }


def _event_of(query_id: str, root: Path, batch: int) -> ProgressEvent:
    for sub in ("offsets", "commits"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        (root / sub / str(batch)).write_text(f"v1\n{batch}\n")
    return ProgressEvent(
        query_id=query_id,
        query_name="rig",
        checkpoint_root=root,
        batch_id=batch,
        input_offsets={"src": str(batch)},
        state_store_instances=len(STORES),
        batch_end_ms=int(time.time() * 1000),
    )


def _spool_name() -> str:
    """A file name the spool lists (spool.py: `<20 digits>-<uuid>.json`)."""
    return f"{time.time_ns():020d}-{uuid.uuid4()}.json"


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    with TransferPool(4) as p:
        yield p


def test_committer_goes_on_past_a_latest_checkpoint_with_unusable_markers(
    tmp_path: Path, pool: TransferPool, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    log_url = (tmp_path / "log").as_uri()
    executors = {q: Executor(store, pool, q, tmp_path / q / "state", seed=i) for i, q in enumerate((Q1, Q2))}
    roots = {q: tmp_path / q / "ckpt" for q in (Q1, Q2)}
    for q in (Q1, Q2):
        (roots[q]).mkdir(parents=True)
        (roots[q] / "metadata").write_text(f'{{"id":"{q}"}}\n')

    # A first committer checkpoints batch 0 of both queries.
    open_checkpoint_log(log_url).create_resources()
    first = Committer(store, open_checkpoint_log(log_url), pool, app_id="app-1")
    for q in (Q1, Q2):
        executors[q].upload(1)
        first.submit(_event_of(q, roots[q], 0))
    assert first.poll() == 2

    # Q1's latest checkpoint (batch 1) is then replaced by one whose markers are hostile or broken.
    tamper = open_checkpoint_log(log_url)
    good = tamper.read_latest(Q1)
    assert good is not None
    bad_markers = _bad_markers(store, Q1)
    bad = CheckpointV2(
        CheckpointId.create(1, after=good.checkpoint_id),
        Q1,
        input_offsets={"src": "1"},
        state_checkpoint_markers={BLOBSTORE_BACKEND: bad_markers},
    )
    tamper.write(bad)
    durable_before = {b.blob_id for b in store.list("") if not b.blob_id.startswith("reports/")}
    permanent_before = {b.blob_id for b in store.list("") if store.stat(b.blob_id).expires_at_ms is None}

    # A new committer (a restarted driver sidecar) gets batch 2 of Q1 first, then batch 1 of Q2.
    committer = Committer(store, open_checkpoint_log(log_url), pool, app_id="app-1")
    executors[Q1].upload(3)
    executors[Q2].upload(2)
    committer.submit(_event_of(Q1, roots[Q1], 2))
    committer.submit(_event_of(Q2, roots[Q2], 1))
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.commit"):
        assert committer.poll() == 2  # both queries commit in the same poll; before the fix: raised

    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    for key, marker in bad_markers.items():
        named = [m for m in errors if Q1 in m and str(bad.checkpoint_id) in m and marker in m and key in m]
        assert named, f"no ERROR names query, checkpoint, store {key} and marker {marker}: {errors}"
    cplog = open_checkpoint_log(log_url)
    latest = {q: cplog.read_latest(q) for q in (Q1, Q2)}
    assert latest[Q1] is not None and latest[Q1].batch_id == 2
    assert latest[Q2] is not None and latest[Q2].batch_id == 1
    # The new checkpoint superseded the bad one (retainCheckpoints=1 keeps only the latest record).
    assert cplog.read_history(Q1) == [latest[Q1]] and latest[Q1].checkpoint_id > bad.checkpoint_id
    # Deleted: only what the new snapshots replaced (the executors' own previous uploads), never a blob
    # the new checkpoints reference nor one a bad marker names; that one is not made permanent either.
    after = {b.blob_id for b in store.list("")}
    deleted = durable_before - after
    assert not deleted & closure(store, [latest[Q1], latest[Q2]])
    chunk = bad_markers[STORES[1]]
    assert chunk in after and (chunk in permanent_before) == (store.stat(chunk).expires_at_ms is None)
    # Q1's new checkpoint restores to exactly what was uploaded; its _driver snapshot was uploaded whole
    # (no diff base, so its cleanup deleted nothing).
    assert_restorable(store, pool, latest[Q1], executors[Q1].expected, tmp_path / "restore")
    driver_marker = latest[Q1].marker(BLOBSTORE_BACKEND, DRIVER_STORE)
    assert driver_marker is not None
    assert load_snapshot_index(store, driver_marker).prev_snapshot_index_blob_id is None


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = build_rig(tmp_path, batches=3, retain=1)
    try:
        yield r
    finally:
        r.sidecar.close()


@pytest.mark.parametrize("kind", ["escaping", "missing", "chunk"])
def test_sidecar_uploads_afresh_past_an_unusable_latest_marker(
    rig: Rig, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The executor side: the latest checkpoint names an unusable SnapshotIndex for the store; the
    sidecar's next upload of that store has no diff base (an ERROR names the checkpoint and marker), and
    the committer checkpoints it, so the query's latest checkpoint is usable again."""
    good = rig.checkpoints[-1]
    chunk = rig.file_blob(2, "3.zip")
    marker = {
        "escaping": "indexes/../../../../x.json",
        "missing": f"indexes/{QID}/{KEY}/v000000000099-deadbeef.json",
        "chunk": chunk,
    }[kind]
    bad = CheckpointV2(
        CheckpointId.create(3, after=good.checkpoint_id),
        QID,
        input_offsets={"src": "3"},
        state_checkpoint_markers={BLOBSTORE_BACKEND: {**good.markers(BLOBSTORE_BACKEND), KEY: marker}},
    )
    rig.sidecar.log.write(bad)
    durable_before = {b.blob_id for b in rig.store.list("") if not b.blob_id.startswith("reports/")}

    staged = make_tree(rig.location / STAGING / "5-0001", {"5.zip": b"zip 5", "4.sst": b"s4"})
    events = rig.sidecar.spool.events_dir
    events.mkdir(parents=True, exist_ok=True)
    (events / _spool_name()).write_bytes(
        snapshot_event(rig, staged, version=5, batch_id=4, files=["5.zip", "4.sst"])
    )
    with caplog.at_level(logging.ERROR):
        assert rig.sidecar.uploads.upload_once()
        assert not any(sp.claimed(events)), "the upload failed (before the fix: every time)"
        progress = rig.sidecar.progress_dir
        progress.mkdir(parents=True, exist_ok=True)
        make_tree(rig.location, {"offsets": {"4": b"o4"}, "commits": {"4": b"c4"}})
        (progress / _spool_name()).write_bytes(progress_bytes(rig, batchId=4))
        rig.sidecar.commits.commit_once()

    errors = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert str(bad.checkpoint_id) in errors and marker[:300] in errors and QID in errors, errors
    latest = rig.sidecar.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 4
    new_marker = latest.marker(BLOBSTORE_BACKEND, KEY)
    assert new_marker is not None
    index = load_snapshot_index(rig.store, new_marker)
    assert index.prev_snapshot_index_blob_id is None  # uploaded whole, not diffed against the bad one
    assert {rel for rel, _ in index.dir_index.walk_files()} == {"5.zip", "4.sst"}
    after = {b.blob_id for b in rig.store.list("")}
    # Cleanup deleted only what the `_driver` snapshot replaced; nothing of the store (its old
    # snapshots, whatever the bad marker names) is touched: left to the TTL sweep and gc.
    deleted = durable_before - after
    assert all(f"/{QID}/{DRIVER_STORE}/" in b for b in deleted), sorted(deleted)[:5]
    if kind == "chunk":
        assert chunk in after
