"""Reliability (issue 6): unusable snapshots at restore, and hostile inputs reaching a real sidecar.

Executor side: a restore request whose checkpoint names a SnapshotIndex or file blob that is missing,
corrupt or hostile is answered not_found / error naming the blob, and the store's directory is left
exactly as it was (the JVM then falls back to Spark's own files). Driver side
(restore_checkpoint_location): an unusable latest checkpoint falls back to the newest retained one
whose snapshots verify, logging an ERROR naming the bad blob, and never to wrong or empty state.
Hostile inputs: every bad snapshot event, restore request, progress event and checkpoint marker is
refused with a clear error and changes nothing durable (blob store listing, checkpoint log).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from spark_statebackend.checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
)
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.errors import RestoreError, RetryBudgetExceededError, StateBackendError
from spark_statebackend.lifecycle.locators import locator_entries, read_locator, write_locator
from spark_statebackend.lifecycle.reports import write_report
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.restore_loop import RESTORE_QUEUE, RESTORE_WORKERS
from spark_statebackend.spark.driver_restore import restore_checkpoint_location
from spark_statebackend.stores import LocalBlobStore, Sink
from tests.servers.process import wait_until
from tests.sidecarrig import (
    KEY,
    KEY_DIR,
    QID,
    STAGING,
    GatedStore,
    Rig,
    build_rig,
    progress_bytes,
    restore_request,
    snapshot_event,
)
from tests.trees import make_tree, read_tree, restored_as

# ------------------------------------------------------------------------------------ executor side

Damage = Callable[[Rig], str]  # damages the rig, returns the blob id the answer must name


def _damage(path: Path, data: bytes) -> None:
    """Overwrite a blob file in place (bit rot, tampering): blob files are read-only (0400)."""
    os.chmod(path, 0o644)
    path.write_bytes(data)


def _missing_index(rig: Rig) -> str:
    rig.blob_path(rig.index_of(2)).unlink()
    return rig.index_of(2)


def _corrupt_index(rig: Rig) -> str:
    _damage(rig.blob_path(rig.index_of(2)), b'{"schema_version": 1, "oops": ')
    return rig.index_of(2)


def _missing_file_blob(rig: Rig) -> str:
    blob = rig.file_blob(2, "3.zip")
    rig.blob_path(blob).unlink()
    return blob


def _corrupt_file_blob(rig: Rig) -> str:
    blob = rig.file_blob(2, "3.zip")
    data = rig.blob_path(blob).read_bytes()
    _damage(rig.blob_path(blob), bytes([data[0] ^ 0xFF]) + data[1:])  # same size, other bytes
    return blob


@pytest.mark.parametrize(
    ("damage", "status"),
    [
        (_missing_index, "not_found"),
        (_corrupt_index, "error"),
        (_missing_file_blob, "error"),
        (_corrupt_file_blob, "error"),
    ],
)
def test_executor_restore_of_an_unusable_snapshot_names_the_blob_and_leaves_the_dir(
    rig: Rig, damage: Damage, status: str, caplog: pytest.LogCaptureFixture
) -> None:
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"2.zip": b"spark's own", "1.sst": b"s"})
    before = read_tree(dfs)
    bad_blob = damage(rig)
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.sidecar"):
        got, message, files, _ = rig.sidecar.restores.restore(restore_request(rig, 3, dfs))
    assert (got, files) == (status, 0)
    assert bad_blob in message
    assert any(bad_blob in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert read_tree(dfs) == before
    assert not (rig.location / "_statebackend" / "restore" / "0_0_default").exists()


def test_executor_restore_of_a_usable_snapshot_still_works(rig: Rig) -> None:
    dfs = rig.location / "state" / KEY_DIR
    status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 2, dfs))
    assert status == "restored", message
    assert (dfs / "2.zip").read_bytes() == b"zip 1"


def test_executor_restores_a_version_no_checkpoint_holds_from_its_upload_report(rig: Rig) -> None:
    """Spark's files are never rolled back to the latest checkpoint (spark/ [D3]): after a crash the
    query resumes from batches the checkpoint log has not caught up with, and a task that lands on a
    host without their files asks for a version no checkpoint holds. The upload the crashed
    application reported is restored; with no report, the answer is not_found naming both."""
    store_dir = make_tree(rig.tmp / "state" / "v5", {"5.zip": b"zip 4", "4.sst": b"s4"})
    marker = rig.sidecar.uploads.bases.manager(QID).upload("b4", {KEY: store_dir}, versions={KEY: 5})[KEY]
    write_report(rig.store, QID, 5, KEY, marker, "7", app_id="crashed-app")
    dfs = rig.location / "state" / KEY_DIR
    status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 5, dfs))
    assert status == "restored", message
    assert (dfs / "5.zip").read_bytes() == b"zip 4" and (dfs / "4.sst").read_bytes() == b"s4"

    status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 6, dfs))
    assert status == "not_found" and "no checkpoint or upload report" in message and "version 6" in message


def test_a_report_naming_a_foreign_snapshot_is_never_restored(rig: Rig) -> None:
    """A report of a version beyond the checkpoints whose marker is not a SnapshotIndex of this store
    (another store's, a file chunk) is refused, naming the report; the store's dir is left alone."""
    other = rig.sidecar.uploads.bases.manager(QID).upload(
        "b4", {"0/1/default": make_tree(rig.tmp / "other", {"5.zip": b"x"})}, versions={"0/1/default": 5}
    )["0/1/default"]
    report = write_report(rig.store, QID, 5, KEY, other, "7", app_id="crashed-app")
    dfs = rig.location / "state" / KEY_DIR
    before = read_tree(rig.location)
    status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 5, dfs))
    assert status == "not_found" and report in message and "not a SnapshotIndex blob id" in message
    assert read_tree(rig.location) == before


# ------------------------------------------------------------------------------------ driver side


def test_driver_falls_back_to_the_previous_retained_checkpoint(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    bad = _missing_index(rig)
    new_host = rig.tmp / "new-host" / "cp"
    (rig.tmp / "new-host").mkdir()
    # the locator lets a wiped host find its query id; write the metadata instead (same effect)
    make_tree(new_host, {"metadata": (rig.location / "metadata").read_bytes()})
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.spark"):
        outcome = restore_checkpoint_location(rig.settings, str(new_host))
    assert outcome == "restored batch 1"
    assert sorted(os.listdir(new_host / "commits")) == ["0", "1"]
    assert (new_host / "offsets" / "1").read_bytes() == b"offsets 1"
    assert any(bad in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    # the log's latest now resumes from batch 1 with its markers: the committer and executors agree
    latest = rig.sidecar.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 1
    assert latest.checkpoint_id > rig.checkpoints[2].checkpoint_id
    assert latest.markers(BLOBSTORE_BACKEND) == rig.checkpoints[1].markers(BLOBSTORE_BACKEND)
    assert rig.sidecar.restores.stores.find_marker(QID, KEY, 2) == (rig.index_of(1), "")
    # running again (e.g. after a crash right after) changes nothing more
    blobs_and_log = rig.durable()
    assert restore_checkpoint_location(rig.settings, str(new_host)) == "current"
    assert rig.durable() == blobs_and_log


@pytest.mark.parametrize("damage", [_corrupt_index, _missing_file_blob])
def test_driver_skips_a_checkpoint_whose_store_snapshot_is_damaged(rig: Rig, damage: Damage) -> None:
    damage(rig)
    (rig.location / "commits" / "2").unlink()  # local files behind the latest checkpoint
    assert restore_checkpoint_location(rig.settings, str(rig.location)) == "restored batch 1"


def test_driver_skips_a_checkpoint_whose_driver_snapshot_is_damaged(rig: Rig) -> None:
    driver = rig.index_of(2, DRIVER_STORE)
    _damage(rig.blob_path(driver), b"\x00garbage")
    (rig.location / "commits" / "2").unlink()
    assert restore_checkpoint_location(rig.settings, str(rig.location)) == "restored batch 1"


class OutageStore(LocalBlobStore):
    """The real local store, except that the blobs in `unreachable` fail as an outage past the retry
    budget does (not as a missing blob)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.unreachable: set[str] = set()

    def _check(self, blob_id: str) -> None:
        if blob_id in self.unreachable:
            raise RetryBudgetExceededError(f"blob {blob_id!r}: 503 Slow Down past the retry budget")

    def exists(self, blob_id: str) -> bool:
        self._check(blob_id)
        return super().exists(blob_id)

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        self._check(blob_id)
        return super().get(blob_id, sink, offset, length)


@pytest.mark.parametrize("which", ["store file", "driver file"])
def test_driver_never_falls_back_to_an_older_checkpoint_for_an_outage(tmp_path: Path, which: str) -> None:
    """An outage while the latest checkpoint is checked says nothing of that checkpoint: the start
    fails naming query and checkpoint (and can be retried), the log gains no fallback copy and the
    location is left as it was. Before, the outage counted as a damaged snapshot and an older
    checkpoint was restored, whose later plans cleanup may have deleted (Spark re-planned batches)."""
    store = OutageStore(tmp_path / "blobs")
    rig = build_rig(tmp_path, batches=3, retain=3, store=store)
    key = KEY if which == "store file" else DRIVER_STORE
    index = load_snapshot_index(store, rig.index_of(2, key))
    store.unreachable.update(index.dir_index.present_blob_ids())
    (rig.location / "commits" / "2").unlink()  # local files behind the latest checkpoint
    location, durable = read_tree(rig.location), rig.durable()
    with pytest.raises(RestoreError) as e:
        restore_checkpoint_location(rig.settings, str(rig.location), store=store)
    message = str(e.value)
    for named in (QID, str(rig.checkpoints[2].checkpoint_id), "blob store failed", "503"):
        assert named in message, (named, message)
    assert read_tree(rig.location) == location and rig.durable() == durable
    store.unreachable.clear()  # the outage ends: the latest checkpoint itself is restored
    assert restore_checkpoint_location(rig.settings, str(rig.location), store=store) == "restored batch 2"


def test_driver_refuses_to_start_when_nothing_is_restorable(rig: Rig) -> None:
    for batch in range(3):
        rig.blob_path(rig.index_of(batch)).unlink()
    before = rig.durable()
    new_host = rig.tmp / "wiped" / "cp"
    make_tree(new_host, {"metadata": (rig.location / "metadata").read_bytes()})  # no Spark files
    with pytest.raises(RestoreError, match="refusing to start from wrong state") as e:
        restore_checkpoint_location(rig.settings, str(new_host))
    assert all(rig.index_of(b) in str(e.value) for b in range(3))
    assert rig.durable() == before
    assert sorted(os.listdir(new_host)) == ["metadata"]


def test_driver_uses_sparks_own_files_when_nothing_is_restorable(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    for batch in range(3):
        rig.blob_path(rig.index_of(batch, DRIVER_STORE)).unlink()
    (rig.location / "commits" / "2").unlink()  # Spark's files are at batch 1
    before, local = rig.durable(), read_tree(rig.location)
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.spark"):
        assert restore_checkpoint_location(rig.settings, str(rig.location)) == "current"
    assert any("Spark resumes from its own files" in r.getMessage() for r in caplog.records)
    assert rig.durable() == before
    assert read_tree(rig.location) == local


def test_driver_with_retain_one_has_nothing_to_fall_back_to(tmp_path: Path) -> None:
    rig = build_rig(tmp_path, batches=2, retain=1)
    try:
        _missing_index_1 = rig.index_of(1)
        rig.blob_path(_missing_index_1).unlink()
        new_host = tmp_path / "wiped" / "cp"
        make_tree(new_host, {"metadata": (rig.location / "metadata").read_bytes()})
        with pytest.raises(RestoreError, match=_missing_index_1.replace(".", r"\.")):
            restore_checkpoint_location(rig.settings, str(new_host))
    finally:
        rig.sidecar.close()


# ------------------------------------------------------------------------------------ hostile inputs


BAD_EVENTS: list[tuple[str, Callable[[Rig, Path], bytes]]] = [
    ("not JSON", lambda r, s: b"{not json"),
    ("a JSON array", lambda r, s: b"[1, 2]"),
    ("unknown schema version", lambda r, s: snapshot_event(r, s, schema_version=99)),
    ("version 0", lambda r, s: snapshot_event(r, s, version=0)),
    ("negative operator", lambda r, s: snapshot_event(r, s, operator=-1)),
    ("relative staged_dir", lambda r, s: snapshot_event(r, s, staged_dir="staging/4-abc")),
    ("file path escaping the staged dir", lambda r, s: snapshot_event(r, s, files=["../../etc/passwd"])),
    ("absolute file path", lambda r, s: snapshot_event(r, s, files=["/etc/passwd"])),
    ("version a boolean", lambda r, s: snapshot_event(r, s, version=True)),
    (
        "staged_dir outside the staging layout",
        lambda r, s: snapshot_event(r, s, staged_dir=str(r.tmp / "victim")),
    ),
    ("staged_dir of another store", lambda r, s: snapshot_event(r, s, store="other")),
    (
        "staged_dir with ..",
        lambda r, s: snapshot_event(r, s, staged_dir=str(s / ".." / ".." / ".." / ".." / "4-x")),
    ),
    ("hostile query id", lambda r, s: snapshot_event(r, s, query_id="../../etc")),
    ("16 MiB of padding", lambda r, s: b" " * (16 * 1024 * 1024 + 1) + b"{}"),
]

BAD_REQUESTS: list[tuple[str, Callable[[Rig, Path], dict[str, object] | bytes], str | None]] = [
    ("not JSON", lambda r, d: b"\xff\xfe", None),
    ("request id with a path", lambda r, d: {"request_id": "../../x"}, None),
    ("relative dfs_dir", lambda r, d: {"dfs_dir": "state/0/0"}, None),
    ("version 0", lambda r, d: {"version": 0}, None),
    ("version a string", lambda r, d: {"version": "3"}, None),
    ("hostile query id", lambda r, d: {"query_id": "../../etc"}, "error"),
    ("query id of 5000 chars", lambda r, d: {"query_id": "q" * 5000}, "error"),
    ("absurd version", lambda r, d: {"version": 10**18}, "not_found"),
    ("store name with a path", lambda r, d: {"store": "../../default"}, "not_found"),
    ("unknown query", lambda r, d: {"query_id": "0000-unknown"}, "not_found"),
]

BAD_PROGRESS: list[tuple[str, Callable[[Rig], bytes]]] = [
    ("not JSON", lambda r: b"nope"),
    ("no progress_json", lambda r: orjson.dumps({"type": "progress", "checkpoint_root": str(r.location)})),
    ("progress_json not JSON", lambda r: progress_bytes(r, {"progress_json": "{x"})),
    ("no query id", lambda r: progress_bytes(r, id=None)),
    ("hostile query id", lambda r: progress_bytes(r, id="../../etc")),
    ("batchId not a number", lambda r: progress_bytes(r, batchId="x")),
    ("negative batchId", lambda r: progress_bytes(r, batchId=-7)),
    ("negative instances", lambda r: progress_bytes(r, stateOperators=[{"numStateStoreInstances": -1}])),
    ("bad timestamp", lambda r: progress_bytes(r, timestamp="yesterday")),
    ("relative checkpoint root", lambda r: progress_bytes(r, {"checkpoint_root": "cp"})),
    ("checkpoint root with ..", lambda r: progress_bytes(r, {"checkpoint_root": "relative/../x"})),
    ("a JSON array", lambda r: b"[1, 2]"),
    ("a JSON string", lambda r: b'"progress"'),
    ("progress_json an array", lambda r: progress_bytes(r, {"progress_json": "[1]"})),
    ("sources not objects", lambda r: progress_bytes(r, sources=[1])),
    ("checkpoint root a number", lambda r: progress_bytes(r, {"checkpoint_root": 7})),
]

HOSTILE_MARKERS = [
    "../../../etc/passwd",
    "/etc/passwd",
    "indexes/../../../../x.json",
    "indexes/" + "a" * 5000,
    "indexes/a\x00b.json",
    "indexes/\\..\\..\\x",
    "files/" + QID + "/0/0/default/not-an-index",  # a real chunk blob, not a SnapshotIndex
]

BAD_INPUTS_TRIED = len(BAD_EVENTS) + len(BAD_REQUESTS) + len(BAD_PROGRESS) + len(HOSTILE_MARKERS)


def _spool_name() -> str:
    """A name the spool lists (`<20 digits>-<uuid>.json`, spool.py); any other name is never read."""
    return f"{time.time_ns():020d}-{uuid.uuid4()}.json"


def test_bad_snapshot_events_are_refused_and_change_nothing(rig: Rig) -> None:
    victim = make_tree(rig.tmp / "victim", {"4.zip": b"precious"})
    before = rig.durable()
    for i, (what, make) in enumerate(BAD_EVENTS):
        staged = make_tree(rig.location / STAGING / f"4-{i:04d}", {"4.zip": b"zip 4"})
        path = rig.sidecar.spool.events_dir / _spool_name()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make(rig, staged))
        rig.sidecar.uploads.upload_once()
        assert (path.parent / sp.BAD_DIR / path.name).is_file(), f"{what}: not read and quarantined"
        assert rig.durable() == before, what
        assert read_tree(victim) == {"4.zip": (b"precious", 0o644)}, what
        assert not list(sp.claimed(rig.sidecar.spool.events_dir)), what
        assert not rig.sidecar.spool.pending_events(), what


def test_bad_restore_requests_are_refused_and_change_nothing(rig: Rig) -> None:
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"2.zip": b"spark's own"})
    local, before = read_tree(dfs), rig.durable()
    spool = rig.sidecar.spool
    for i, (what, make, status) in enumerate(BAD_REQUESTS):
        doc = make(rig, dfs)
        request_id = f"bad{i:04d}"
        if isinstance(doc, dict):
            fields = {**restore_request(rig, 3, dfs, request_id=request_id).to_json(), **doc}
            data = orjson.dumps(fields)
            request_id = str(fields["request_id"])
        else:
            data = doc
        path = spool.requests_dir / f"{i:04d}-bad.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rig.sidecar.restores.serve_request(path)
        assert not path.exists(), what
        if status is None:  # malformed: quarantined, no answer (the JVM times out and falls back)
            assert not spool.pending_requests(), what
        else:
            response = spool.take_response(request_id)
            assert response is not None and response.status == status, (what, response)
            assert response.message, what
        assert rig.durable() == before, what
        assert read_tree(dfs) == local, what


def test_bad_progress_events_are_refused_and_the_committer_keeps_working(rig: Rig) -> None:
    before = rig.durable()
    progress_dir = rig.sidecar.progress_dir
    progress_dir.mkdir(parents=True, exist_ok=True)
    for what, make in BAD_PROGRESS:
        name = _spool_name()
        (progress_dir / name).write_bytes(make(rig))
        rig.sidecar.commits.commit_once()  # raises nothing: a bad event never blocks the committer loop
        assert (progress_dir / sp.BAD_DIR / name).is_file(), f"{what}: not read and quarantined"
        assert rig.sidecar.committer.pending() == 0, what
        assert not sp.claimed(progress_dir) and not sp.list_pending(progress_dir), what
        assert rig.durable() == before, what


def test_a_bad_claimed_progress_event_never_blocks_the_recovery_of_the_ones_after_it(rig: Rig) -> None:
    # A sidecar restarted after a crash resubmits its predecessor's claimed events, oldest first.
    claimed_dir = rig.sidecar.progress_dir / sp.CLAIMED_DIR
    claimed_dir.mkdir(parents=True)
    bad = [_spool_name() for _ in range(3)]
    good = _spool_name()
    bad_data = [b"[1, 2]", b"42", progress_bytes(rig, {"progress_json": "[]"})]
    for name, data in zip(bad, bad_data, strict=True):
        (claimed_dir / name).write_bytes(data)
    (claimed_dir / good).write_bytes(progress_bytes(rig, batchId=3))
    before = rig.durable()
    rig.sidecar.commits.commit_once()  # raises nothing
    assert sorted(p.name for p in (rig.sidecar.progress_dir / sp.BAD_DIR).iterdir()) == sorted(bad)
    assert rig.sidecar.committer.pending() == 1  # batch 3 waits for its store's report
    assert [p.name for p in sp.claimed(rig.sidecar.progress_dir)] == [good]  # claimed until committed
    assert rig.durable() == before


@pytest.mark.parametrize("marker", HOSTILE_MARKERS, ids=range(len(HOSTILE_MARKERS)))
def test_a_checkpoint_naming_a_hostile_blob_is_refused_and_changes_nothing(rig: Rig, marker: str) -> None:
    markers = {**rig.checkpoints[2].markers(BLOBSTORE_BACKEND), KEY: marker}
    if marker.startswith("files/"):
        markers[KEY] = rig.file_blob(2, "3.zip")
    cp = CheckpointV2(
        CheckpointId.create(2, after=rig.checkpoints[2].checkpoint_id),
        QID,
        state_checkpoint_markers={BLOBSTORE_BACKEND: markers},
    )
    rig.sidecar.log.write(cp)
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"2.zip": b"spark's own"})
    local, before = read_tree(dfs), rig.durable()
    status, message, files, _ = rig.sidecar.restores.restore(restore_request(rig, 3, dfs))
    assert status in ("error", "not_found") and files == 0
    assert "unusable" in message
    assert read_tree(dfs) == local
    assert rig.durable() == before


# ------------------------------------------------------------------------------------ full disk


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes fail with EFBIG in this process, as on a full disk (no root needed)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def _big_snapshot(tmp: Path) -> Rig:
    rig = build_rig(tmp, batches=1, retain=1)
    big = make_tree(tmp / "state" / "v2", {"2.zip": os.urandom(256 * 1024), "1.sst": b"s"})
    manager = rig.sidecar.uploads.bases.manager(QID)
    markers = manager.upload("b1", {KEY: big}, versions={KEY: 2})
    cp = CheckpointV2(
        CheckpointId.create(1, after=rig.checkpoints[0].checkpoint_id),
        QID,
        state_checkpoint_markers={
            BLOBSTORE_BACKEND: {**rig.checkpoints[0].markers(BLOBSTORE_BACKEND), **markers}
        },
    )
    rig.sidecar.log.write(cp)
    rig.checkpoints.append(cp)
    return rig


def test_executor_restore_into_a_full_disk_fails_clearly_and_leaves_the_dir(tmp_path: Path) -> None:
    rig = _big_snapshot(tmp_path)
    try:
        dfs = make_tree(rig.location / "state" / KEY_DIR, {"1.zip": b"spark's own"})
        local, before = read_tree(dfs), rig.durable()
        with _file_size_limit(64 * 1024):
            status, message, files, _ = rig.sidecar.restores.restore(restore_request(rig, 2, dfs))
        assert (status, files) == ("error", 0)
        assert "File too large" in message and rig.index_of(1) in message
        assert read_tree(dfs) == local
        assert rig.durable() == before
        assert not any((rig.location / "_statebackend" / "restore").iterdir())
        # with room again, the same request restores
        assert rig.sidecar.restores.restore(restore_request(rig, 2, dfs))[0] == "restored"
    finally:
        rig.sidecar.close()


def test_driver_restore_into_a_full_disk_fails_clearly_and_leaves_the_location(tmp_path: Path) -> None:
    rig = _big_snapshot(tmp_path)
    try:
        # a driver snapshot too big for the disk: the checkpoint location holds a big source file
        make_tree(rig.location, {"sources": {"0": {"0": os.urandom(256 * 1024)}}})
        from spark_statebackend.spark.location import stage_driver_files

        staged = tmp_path / "driver-b2"
        stage_driver_files(rig.location, 1, staged)
        markers = rig.sidecar.uploads.bases.manager(QID).upload(
            "b2", {DRIVER_STORE: staged}, versions={DRIVER_STORE: 1}
        )
        latest = rig.checkpoints[-1]
        cp = CheckpointV2(
            CheckpointId.create(1, after=latest.checkpoint_id),
            QID,
            state_checkpoint_markers={BLOBSTORE_BACKEND: {**latest.markers(BLOBSTORE_BACKEND), **markers}},
        )
        rig.sidecar.log.write(cp)
        location = make_tree(
            tmp_path / "host2" / "cp", {"metadata": (rig.location / "metadata").read_bytes()}
        )
        local, before = read_tree(location), rig.durable()
        with _file_size_limit(64 * 1024), pytest.raises(OSError, match="File too large"):
            restore_checkpoint_location(rig.settings, str(location))
        assert read_tree(location) == {**local, "_statebackend/": {}}  # its scratch dir (ours) is gone
        assert rig.durable() == before
        assert sorted(p.name for p in location.parent.iterdir()) == ["cp"]  # nothing made beside it
        assert restore_checkpoint_location(rig.settings, str(location)) == "restored batch 1"
    finally:
        rig.sidecar.close()


# ------------------------------------------------------------------------------------ symlinks


def _with_ssts(rig: Rig) -> dict[str, object]:
    """Checkpoint batch 3 (state version 4) of a store dir with an `SSTs/` subdir; returns its tree."""
    tree: dict[str, object] = {"4.zip": b"zip 3", "SSTs": {"000009-ab.sst": b"sst 3"}}
    store_dir = make_tree(rig.tmp / "state" / "v4", tree)  # type: ignore[arg-type]
    rig.checkpoint(
        3, rig.sidecar.uploads.bases.manager(QID).upload("b3", {KEY: store_dir}, versions={KEY: 4})
    )
    return tree


@pytest.mark.parametrize(
    "link",
    ["state/0/0/SSTs", "state", "_statebackend", "_statebackend/restore"],
)
def test_executor_restore_never_writes_through_a_symlink_under_the_checkpoint_location(
    rig: Rig, link: str, caplog: pytest.LogCaptureFixture
) -> None:
    _with_ssts(rig)
    outside = make_tree(rig.tmp / "outside", {"keep": b"k"})
    make_tree(rig.location / "state" / KEY_DIR, {"3.zip": b"spark's own"})
    planted = rig.location / link
    if planted.exists():
        os.rename(planted, outside / "moved")  # its content now lives outside, behind the link
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(outside, target_is_directory=True)
    before_outside, before_local = read_tree(outside), read_tree(rig.location)
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.sidecar"):
        status, message, files, _ = rig.sidecar.restores.restore(
            restore_request(rig, 4, rig.location / "state" / KEY_DIR)
        )
    assert (status, files) == ("error", 0), message
    assert str(planted) in message and "symlink" in message
    assert any(str(planted) in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert read_tree(outside) == before_outside
    after_local = read_tree(rig.location)
    if not link.startswith("_statebackend"):  # the scratch dir's parent is ours; the scratch is gone
        assert after_local.pop("_statebackend/", {"restore/": {}}) == {"restore/": {}}
    assert after_local == before_local


def test_executor_restore_replaces_a_stale_file_and_a_symlink_where_a_restored_file_belongs(rig: Rig) -> None:
    tree = _with_ssts(rig)
    victim = make_tree(rig.tmp / "outside", {"victim": b"not yours"})
    dfs = make_tree(
        rig.location / "state" / KEY_DIR,
        {"4.zip": b"a stale zip of another run", "SSTs": {}, "1.sst": b"older version's, kept"},
    )
    (dfs / "SSTs" / "000009-ab.sst").symlink_to(victim / "victim")
    status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 4, dfs))
    assert status == "restored", message
    got = restored_as(read_tree(dfs))
    assert got["4.zip"] == (tree["4.zip"], 0o644)
    assert got["SSTs/"] == {"000009-ab.sst": (b"sst 3", 0o400)}  # a file now, not the link
    assert got["1.sst"] == (b"older version's, kept", 0o400)  # files of other versions stay
    assert read_tree(victim) == {"victim": (b"not yours", 0o644)}


@pytest.mark.parametrize("link", ["offsets", "commits"])
def test_driver_rebuild_never_writes_or_deletes_through_a_symlink(rig: Rig, link: str) -> None:
    new_host = make_tree(rig.tmp / "new-host" / "cp", {"metadata": (rig.location / "metadata").read_bytes()})
    outside = make_tree(rig.tmp / "outside", {"7": b"someone's file 7", "1": b"someone's file 1"})
    (new_host / link).symlink_to(outside, target_is_directory=True)
    before_outside, before_local = read_tree(outside), read_tree(new_host)
    blobs_and_log = rig.durable()
    with pytest.raises(StateBackendError, match="symlink") as e:
        restore_checkpoint_location(rig.settings, str(new_host))
    assert str(new_host / link) in str(e.value)
    assert read_tree(outside) == before_outside
    assert read_tree(new_host) == before_local
    assert rig.durable() == blobs_and_log
    assert sorted(p.name for p in new_host.parent.iterdir()) == ["cp"]  # no scratch left


def test_restore_into_a_symlinked_destination_replaces_the_link_never_its_target(rig: Rig) -> None:
    # What the CLI's `restore --dest` runs: a dest that is a symlink is neither read nor written through.
    outside = rig.tmp / "outside"
    index = rig.index_of(2)
    rig.sidecar.restorer.restore(index, outside)  # the outside dir already holds exactly the snapshot
    before_outside = read_tree(outside)
    dest = rig.tmp / "dest"
    dest.symlink_to(outside, target_is_directory=True)
    stale = rig.tmp / ".dest.old-123456789abc"
    stale.symlink_to(outside, target_is_directory=True)  # left by an interrupted restore
    result = rig.sidecar.restorer.restore(index, dest)
    assert not result.skipped
    assert not dest.is_symlink() and read_tree(dest) == before_outside
    assert read_tree(outside) == before_outside
    assert not stale.is_symlink() and not stale.exists()
    assert sorted(p.name for p in rig.tmp.iterdir() if p.name.startswith(".dest")) == []


# ------------------------------------------------------------------------------------ restore bounds


def test_restore_requests_beyond_the_bounded_pool_wait_in_the_spool(gated: tuple[Rig, GatedStore]) -> None:
    rig, store = gated
    spool = rig.sidecar.spool
    store.gate.clear()
    now_ms = int(time.time() * 1000)
    dfs = rig.location / "state" / KEY_DIR
    requests = [restore_request(rig, 3, dfs, request_id=f"r{i:03d}", created_at_ms=now_ms) for i in range(20)]
    for r in requests:
        spool.write_request(r, fsync=False)
    assert rig.sidecar.restores.restore_once()
    bound = RESTORE_WORKERS + RESTORE_QUEUE
    assert len(rig.sidecar.restores.in_progress) == bound  # the rest wait in the spool, not in a queue
    # One restore is held at the gate; the other workers wait for that store's restore lock.
    assert store.waiting.acquire(timeout=60)
    assert not rig.sidecar.restores.restore_once()  # still full: nothing more is taken
    assert len(rig.sidecar.restores.in_progress) == bound
    assert len(spool.pending_requests()) == len(requests)  # nothing answered, nothing lost
    store.gate.set()
    answered: dict[str, sp.RestoreResponse] = {}

    def all_answered() -> bool:
        rig.sidecar.restores.restore_once()
        for r in requests:
            got = spool.take_response(r.request_id)
            if got is not None:
                answered[r.request_id] = got
        return len(answered) == len(requests)

    wait_until(all_answered, 60, "every request answered")
    assert {a.status for a in answered.values()} == {"restored"}
    assert not spool.pending_requests() and not sp.claimed(spool.requests_dir)


def test_a_restore_the_jvm_gave_up_on_is_never_merged(
    gated: tuple[Rig, GatedStore], caplog: pytest.LogCaptureFixture
) -> None:
    rig, store = gated
    spool = rig.sidecar.spool
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"2.zip": b"spark's own"})
    before = read_tree(dfs)
    request = restore_request(rig, 3, dfs, created_at_ms=int(time.time() * 1000))
    path = spool.write_request(request, fsync=False)
    store.gate.clear()
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        serving = threading.Thread(
            target=rig.sidecar.restores.serve_request, args=(path,), name="ssb-test-serve"
        )
        serving.start()
        assert store.waiting.acquire(timeout=60)  # the sidecar is restoring
        path.unlink()  # restoreTimeout: the JVM stops waiting and deletes its request (RestoreRequester)
        store.gate.set()
        serving.join(60)
    assert not serving.is_alive()
    assert read_tree(dfs) == before  # nothing placed behind the JVM's back
    assert spool.take_response(request.request_id) is None  # nobody waits for an answer
    assert not list((rig.location / "_statebackend" / "restore").iterdir())  # scratch removed
    assert any("withdrew its request" in r.getMessage() for r in caplog.records)


def test_a_restore_past_the_jvms_deadline_is_answered_error_and_not_merged(rig: Rig) -> None:
    spool = rig.sidecar.spool
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"2.zip": b"spark's own"})
    before = read_tree(dfs)
    written = int(time.time() * 1000) - int(rig.settings.restore_timeout_seconds * 1000)
    request = restore_request(rig, 3, dfs, created_at_ms=written)  # the JVM's restoreTimeout is about over
    path = spool.write_request(request, fsync=False)
    rig.sidecar.restores.serve_request(path)
    response = spool.take_response(request.request_id)
    assert response is not None and response.status == "error"
    assert "restoreTimeout" in response.message and str(dfs) in response.message
    assert read_tree(dfs) == before
    assert not path.exists()


# ------------------------------------------------------------------------------------ query locator


def test_a_checkpoint_location_used_by_two_live_queries_is_never_guessed(rig: Rig) -> None:
    """Two queries with the same local checkpoint path (two hosts or applications on one shared store):
    a wiped host must not restore the other query's state. The locator records every query seen
    committing from a path, and the reader refuses when more than one is still live."""
    log = rig.sidecar.log
    other = "0a1b2c3d-0000-4000-8000-0000000000c2"
    shared = rig.tmp / "host-b" / "cp"  # host B's copy of the path; its disk was wiped
    started = int(time.time() * 1000)  # explicit times: two writes can share a millisecond
    write_locator(rig.store, str(shared), QID, "mine", seen_at_ms=started)  # both committers start ...
    write_locator(rig.store, str(shared), other, "theirs", seen_at_ms=started + 1)
    latest = log.read_latest(QID)
    assert latest is not None
    mine = CheckpointV2(  # ... and both go on checkpointing
        CheckpointId.create(latest.batch_id, after=latest.checkpoint_id),
        QID,
        input_offsets=latest.input_offsets,
        state_checkpoint_markers=latest.state_checkpoint_markers,
    )
    log.write(mine)
    log.write(CheckpointV2(CheckpointId.create(0), other, input_offsets={"src": "0"}))
    before = rig.durable()
    with pytest.raises(RestoreError) as e:
        restore_checkpoint_location(rig.settings, str(shared))
    message = str(e.value)
    assert str(shared) in message and QID in message and other in message and "'theirs'" in message
    assert not shared.exists()  # nothing restored
    assert rig.durable() == before

    # What the reader still resolves on its own:
    newest = mine.checkpoint_id.millis
    reused = str(rig.tmp / "reused" / "cp")  # the user wiped the path and started a new query on it
    write_locator(rig.store, reused, QID, "old", seen_at_ms=newest - 60_000)
    successor = "0a1b2c3d-0000-4000-8000-0000000000c3"
    write_locator(rig.store, reused, successor, "new", seen_at_ms=newest + 1)
    log.write(CheckpointV2(CheckpointId(newest + 2, 0, 0), successor, input_offsets={"src": "0"}))
    assert read_locator(rig.store, reused, log.read_latest) == successor
    # Its committer restarts (a new claim) and dies before checkpointing: still the one to resume.
    write_locator(rig.store, reused, successor, "new", seen_at_ms=newest + 60_000)
    assert read_locator(rig.store, reused, log.read_latest) == successor
    fresh = str(rig.tmp / "fresh" / "cp")  # reused by a query that has not checkpointed yet
    write_locator(rig.store, fresh, QID, "old", seen_at_ms=newest - 60_000)
    write_locator(rig.store, fresh, "0a1b2c3d-0000-4000-8000-0000000000c4", "new", seen_at_ms=newest + 1)
    assert read_locator(rig.store, fresh, log.read_latest) is None
    alone = str(rig.tmp / "alone" / "cp")
    write_locator(rig.store, alone, QID, "only")
    assert read_locator(rig.store, alone, log.read_latest) == QID
    assert [e.query_id for e in locator_entries(rig.store, str(shared))] == [QID, other]
