"""Upgraded snapshots (changelog checkpointing): a version re-uploaded after Spark published a snapshot
that shortens its recipe is checkpointed in place of the first upload, and cleanup stays exact.

Spark's maintenance thread uploads a snapshot after the commit it was taken at, so the recipe staged at
commit time (snapshot s + changelogs s+1..v) can outlive Spark's own, shorter one. The shim stages the
version again (an `upgrade` event), the sidecar uploads it diffed against the checkpointed snapshot and
reports it as an upgrade, and the committer writes a new checkpoint of the same batch with it
(commit.py: upgrades). These tests drive the real BackupManager, Committer and Sidecar on a local blob
store and a file checkpoint log, with no Spark.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
)
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.backup import BackupManager, StoreRecipe
from spark_statebackend.engine.blobs import SnapshotOwner
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.reports import read_reports, read_upgrades, write_report
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.cleanup import Cleanup
from spark_statebackend.runtime.committer import Committer
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import closure, query_blobs
from tests.trees import make_tree

QID = "5b2f3c1e-7d4a-4e8b-9c0d-1a2b3c4d5e6f"
KEY = "0/0/default"
OTHER = "0/1/default"


@pytest.fixture
def pool() -> TransferPool:
    with TransferPool(4) as p:
        yield p


def recipe(snapshot: int, version: int) -> StoreRecipe:
    return StoreRecipe(snapshot_version=snapshot, changelog_versions=tuple(range(snapshot + 1, version + 1)))


# --- cleanup along the chain ------------------------------------------------------------------------


def _three_uploads(
    store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> tuple[BackupManager, str, str, str]:
    """Checkpointed A (version 1: snapshot 0 + changelog 1), then B (version 2: snapshot 1 + changelog
    2, removing A's zip and changelog) and an upgrade U of version 2 (snapshot 2) that diffs against B."""
    m = BackupManager(store, pool, owner=SnapshotOwner(QID))
    d = make_tree(tmp_path / "st", {"0.zip": b"snap0", "SSTs": {"a.sst": b"a" * 50}, "1.changelog": b"c1"})
    a = m.upload("v1", {KEY: d}, versions={KEY: 1}, recipes={KEY: recipe(0, 1)})[KEY]
    m.cleanup({KEY: a})
    for name in ("0.zip", "1.changelog"):
        (d / name).unlink()
    make_tree(d, {"1.zip": b"snap1", "2.changelog": b"c2"})
    b = m.upload("v2", {KEY: d}, versions={KEY: 2}, recipes={KEY: recipe(1, 2)})[KEY]
    for name in ("1.zip", "2.changelog", "SSTs/a.sst"):
        (d / name).unlink()
    make_tree(d, {"2.zip": b"snap2", "SSTs": {"b.sst": b"b" * 60}})
    u = m.upload("v2", {KEY: d}, versions={KEY: 2}, recipes={KEY: recipe(2, 2)})[KEY]
    return m, a, b, u


def _closure(store: LocalBlobStore, marker: str) -> set[str]:
    cp = CheckpointV2(
        CheckpointId.create(1), QID, state_checkpoint_markers={BLOBSTORE_BACKEND: {KEY: marker}}
    )
    return closure(store, [cp])


def test_cleanup_deletes_what_uploads_between_two_checkpoints_removed(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    m, a, _, u = _three_uploads(local_store, pool, tmp_path)
    m.cleanup({KEY: u}, previous={KEY: a})
    assert query_blobs(local_store) == _closure(local_store, u)  # A's and B's files and indexes are gone
    assert all(local_store.stat(x).expires_at_ms is None for x in _closure(local_store, u))


def test_cleanup_without_the_previous_checkpoint_leaves_what_the_chain_removed(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """The contrast: knowing only its direct predecessor, cleanup deletes B but not what B removed from
    A (A's files, made permanent when A was checkpointed), nor A's index; gc finds them later."""
    m, a, b, u = _three_uploads(local_store, pool, tmp_path)
    m.cleanup({KEY: u})
    left = query_blobs(local_store) - _closure(local_store, u)
    assert a in left and b not in left
    assert left - {a}, "the files only A referenced are left behind"


def test_cleanup_stops_where_the_chain_does_not_reach_the_previous_checkpoint(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """A chain that never reaches the previous checkpoint's marker (a base from elsewhere) deletes only
    what cleanup without it deletes: never a blob it cannot place between the two checkpoints."""
    m, a, b, u = _three_uploads(local_store, pool, tmp_path)
    m.cleanup({KEY: u}, previous={KEY: f"indexes/{QID}/0/0/default/elsewhere.json"})
    left = query_blobs(local_store) - _closure(local_store, u)
    assert a in left and b not in left and left - {a}


def test_a_chain_that_misses_the_previous_checkpoint_leaves_its_blobs_expiring_not_permanent(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """Executor A uploads version 1 (checkpointed). The store moves to executor B, which uploads version
    2 diffed against 1 with a new file x (checkpointed: x is permanent). It moves back to A while the
    committer lags, so A's base is still its own version 1 and version 3 diffs against 1: its chain
    never passes version 2. Once 3 is checkpointed, what only 2 referenced (x, 2's index) is referenced
    by no retained checkpoint. It used to stay permanent for ever (the randomized fault run found 206
    such blobs in 30 minutes); it must now expire like any unreferenced upload, and nothing version 3
    references may lose its permanence."""
    a = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    b = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    committer = BackupManager(local_store, pool, owner=SnapshotOwner(QID))  # the driver's, cleanup only
    on_a = make_tree(tmp_path / "a", {"1.zip": b"z1", "SSTs": {"s.sst": b"s" * 40}})
    v1 = a.upload("v1", {KEY: on_a}, versions={KEY: 1})[KEY]
    committer.cleanup({KEY: v1})
    of_v1 = _closure(local_store, v1)
    on_b = make_tree(tmp_path / "b", {"2.zip": b"z2", "SSTs": {"s.sst": b"s" * 40, "x.sst": b"x" * 40}})
    b.set_base(KEY, (v1, committer.snapshot_index(v1)))
    v2 = b.upload("v2", {KEY: on_b}, versions={KEY: 2})[KEY]
    committer.cleanup({KEY: v2}, previous={KEY: v1})
    only_v2 = _closure(local_store, v2) - of_v1  # x, 2.zip and the index
    (on_a / "1.zip").unlink()  # version 3 on A: x was compacted away in version 3, y is new
    make_tree(on_a, {"3.zip": b"z3", "SSTs": {"y.sst": b"y" * 40}})
    v3 = a.upload("v3", {KEY: on_a}, versions={KEY: 3})[KEY]
    assert committer.snapshot_index(v3).prev_snapshot_index_blob_id == v1  # not via version 2
    committer.cleanup({KEY: v3}, previous={KEY: v2})
    kept = _closure(local_store, v3)
    present = query_blobs(local_store)
    assert kept <= present
    assert all(local_store.stat(blob).expires_at_ms is None for blob in kept)
    orphans = present - kept
    assert only_v2 <= orphans, sorted(orphans)
    permanent = sorted(blob for blob in orphans if local_store.stat(blob).expires_at_ms is None)
    assert not permanent, f"unreferenced yet permanent: {permanent}"
    local_store.sweep_expired(now_ms=int(time.time() * 1000) + 30 * 86400 * 1000)
    assert query_blobs(local_store) == kept


def test_a_committer_dead_before_its_cleanup_leaves_nothing_permanent_that_its_successor_misses(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """The same three versions, but the committer dies right after writing version 3's checkpoint,
    before its cleanup. The next committer re-runs that cleanup at start; it used to know only the
    latest checkpoint, so what only version 2 referenced stayed permanent for ever (the randomized
    fault run's unexplained permanent blobs). It now reads the replaced checkpoint from the log."""
    log = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    log.create_resources()

    def checkpoint(batch: int, marker: str) -> CheckpointV2:
        cp = CheckpointV2(
            CheckpointId.create(batch), QID, state_checkpoint_markers={BLOBSTORE_BACKEND: {KEY: marker}}
        )
        log.write(cp)
        return cp

    a = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    b = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    first = BackupManager(local_store, pool, owner=SnapshotOwner(QID))  # the committer that dies
    on_a = make_tree(tmp_path / "a", {"1.zip": b"z1", "SSTs": {"s.sst": b"s" * 40}})
    v1 = a.upload("v1", {KEY: on_a}, versions={KEY: 1})[KEY]
    checkpoint(0, v1)
    first.cleanup({KEY: v1})
    of_v1 = _closure(local_store, v1)
    on_b = make_tree(tmp_path / "b", {"2.zip": b"z2", "SSTs": {"s.sst": b"s" * 40, "x.sst": b"x" * 40}})
    b.set_base(KEY, (v1, first.snapshot_index(v1)))
    v2 = b.upload("v2", {KEY: on_b}, versions={KEY: 2})[KEY]
    checkpoint(1, v2)
    first.cleanup({KEY: v2}, previous={KEY: v1})
    only_v2 = _closure(local_store, v2) - of_v1
    (on_a / "1.zip").unlink()
    make_tree(on_a, {"3.zip": b"z3", "SSTs": {"y.sst": b"y" * 40}})
    v3 = a.upload("v3", {KEY: on_a}, versions={KEY: 3})[KEY]
    latest = checkpoint(2, v3)  # ... and the committer is killed here
    successor = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    Cleanup(local_store, log, 1, None).at_start(latest, successor)
    kept = _closure(local_store, v3)
    present = query_blobs(local_store)
    assert kept <= present
    assert all(local_store.stat(blob).expires_at_ms is None for blob in kept)
    assert only_v2 <= present - kept
    permanent = sorted(blob for blob in present - kept if local_store.stat(blob).expires_at_ms is None)
    assert not permanent, f"unreferenced yet permanent: {permanent}"
    # ... and the log no longer names the replaced checkpoint, whose blobs now expire.
    assert [cp.checkpoint_id for cp in log.read_history(QID)] == [latest.checkpoint_id]
    # At a later start (its cleanup done, the replaced index expiring) the re-run changes nothing.
    Cleanup(local_store, log, 1, None).at_start(
        latest, BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    )
    assert query_blobs(local_store) == present
    assert all(local_store.stat(blob).expires_at_ms is None for blob in kept)


def test_a_replaced_record_naming_another_querys_index_changes_nothing_of_that_query(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """The replaced checkpoint is read from the log, so its markers are data: a record naming another
    query's index must not make the cleanup at start give that query's blobs a TTL."""
    other_qid = "0f0e0d0c-0b0a-4908-8706-050403020100"
    other = BackupManager(local_store, pool, owner=SnapshotOwner(other_qid))
    theirs = other.upload("v1", {KEY: make_tree(tmp_path / "o", {"1.zip": b"o" * 30})}, versions={KEY: 1})[
        KEY
    ]
    other.cleanup({KEY: theirs})
    their_blobs = _closure(local_store, theirs)
    log = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    log.create_resources()
    log.write(
        CheckpointV2(CheckpointId.create(0), QID, state_checkpoint_markers={BLOBSTORE_BACKEND: {KEY: theirs}})
    )
    ours = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    mine = ours.upload("v2", {KEY: make_tree(tmp_path / "m", {"2.zip": b"m" * 30})}, versions={KEY: 2})[KEY]
    latest = CheckpointV2(
        CheckpointId.create(1), QID, state_checkpoint_markers={BLOBSTORE_BACKEND: {KEY: mine}}
    )
    log.write(latest)
    Cleanup(local_store, log, 1, None).at_start(
        latest, BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    )
    assert all(local_store.exists(b) and local_store.stat(b).expires_at_ms is None for b in their_blobs)
    assert all(local_store.stat(b).expires_at_ms is None for b in _closure(local_store, mine))


# --- the committer checkpoints upgrades -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Rig:
    """An executor's BackupManager for two stores and a Committer with a controllable clock."""

    def __init__(self, store: LocalBlobStore, pool: TransferPool, root: Path) -> None:
        self.store = store
        self.root = root
        self.log = open_checkpoint_log((root / "log").as_uri())
        self.log.create_resources()
        self.clock = Clock()
        self.committer = Committer(store, self.log, pool, clock=self.clock)
        self.executor = BackupManager(store, pool, owner=SnapshotOwner(QID))
        self.ckpt = root / "ckpt"
        self.ckpt.mkdir()
        (self.ckpt / "metadata").write_text(f'{{"id":"{QID}"}}\n')
        self.dirs = {
            k: make_tree(root / k.replace("/", "_"), {"SSTs": {"base.sst": b"x" * 80}}) for k in (KEY, OTHER)
        }

    def commit_version(
        self, version: int, snapshot: int, *, upgrade: bool = False, keys: tuple[str, ...] = (KEY, OTHER)
    ) -> dict[str, str]:
        """Spark's files of `version` in every store (snapshot zip + changelogs after it), uploaded and
        reported (as an upgrade if `upgrade`)."""
        for key in keys:
            d = self.dirs[key]
            for p in list(d.glob("*.zip")) + list(d.glob("*.changelog")):
                p.unlink()
            (d / f"{snapshot}.zip").write_bytes(f"{key} snapshot {snapshot}".encode())
            for v in range(snapshot + 1, version + 1):
                (d / f"{v}.changelog").write_bytes(f"{key} changelog {v}".encode())
        markers = self.executor.upload(
            f"v{version:012d}",
            {k: self.dirs[k] for k in keys},
            versions=dict.fromkeys(keys, version),
            recipes=dict.fromkeys(keys, recipe(snapshot, version)),
        )
        for key, marker in markers.items():
            write_report(
                self.store,
                QID,
                version,
                key,
                marker,
                "exec",
                3600,
                changelog=snapshot < version,
                upgrade=upgrade,
            )
        return markers

    def finish_batch(self, batch_id: int) -> int:
        for sub in ("offsets", "commits"):
            (self.ckpt / sub).mkdir(exist_ok=True)
            (self.ckpt / sub / str(batch_id)).write_text(f"v1\n{batch_id}\n")
        self.committer.submit(
            ProgressEvent(QID, "rig", self.ckpt, batch_id, {"src": str(batch_id)}, 2, int(time.time() * 1000))
        )
        return self.committer.poll()

    def refresh(self, after: float = 1.0) -> int:
        self.clock.now += after
        return self.committer.maybe_refresh()

    def latest(self) -> CheckpointV2:
        cp = self.log.read_latest(QID)
        assert cp is not None
        return cp

    def assert_exact(self) -> None:
        """The blob store holds exactly what the latest checkpoint references, all of it permanent."""
        refs = closure(self.store, [self.latest()])
        assert query_blobs(self.store) == refs
        assert all(self.store.stat(b).expires_at_ms is None for b in refs)


@pytest.fixture
def rig(local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path) -> Rig:
    return Rig(local_store, pool, tmp_path)


def test_an_upgrade_of_the_checkpointed_version_is_checkpointed_in_its_place(rig: Rig) -> None:
    rig.commit_version(1, 0)
    assert rig.finish_batch(0) == 1
    first = rig.latest()
    assert first.changelog_checkpointing
    assert rig.refresh() == 0  # nothing upgraded yet
    # Spark's maintenance thread published snapshot 1 of store KEY after the commit.
    upgraded = rig.commit_version(1, 1, upgrade=True, keys=(KEY,))
    assert rig.refresh() == 1
    cp = rig.latest()
    assert cp.batch_id == 0 and cp.checkpoint_id > first.checkpoint_id
    assert cp.input_offsets == first.input_offsets
    assert cp.marker(BLOBSTORE_BACKEND, KEY) == upgraded[KEY]
    for key in (OTHER, DRIVER_STORE):
        assert cp.marker(BLOBSTORE_BACKEND, key) == first.marker(BLOBSTORE_BACKEND, key)
    assert cp.changelog_checkpointing  # OTHER still replays its changelog
    assert not read_upgrades(rig.store, QID, 1)  # read, and deleted
    rig.assert_exact()
    assert rig.refresh(after=30) == 0  # nothing new: no second checkpoint
    # The next batch diffs against the upgrade and checkpoints as usual.
    rig.commit_version(2, 1)
    assert rig.finish_batch(1) == 1
    rig.assert_exact()


def test_an_upgrade_before_its_batch_is_checkpointed_waits_for_that_checkpoint(rig: Rig) -> None:
    """An upgrade reported before its batch's checkpoint is not taken by that checkpoint (which takes
    the commit-time reports) nor deleted with its reports; the refresh after it takes the upgrade."""
    rig.commit_version(1, 0)
    assert rig.finish_batch(0) == 1
    committed = rig.commit_version(2, 0)
    upgraded = rig.commit_version(2, 2, upgrade=True)  # both stores, before batch 1 is checkpointed
    assert rig.finish_batch(1) == 1
    assert rig.latest().markers(BLOBSTORE_BACKEND)[KEY] == committed[KEY]
    assert len(read_upgrades(rig.store, QID, 2)) == 2
    assert rig.refresh() == 1
    cp = rig.latest()
    assert cp.batch_id == 1 and cp.marker(BLOBSTORE_BACKEND, KEY) == upgraded[KEY]
    assert cp.marker(BLOBSTORE_BACKEND, OTHER) == upgraded[OTHER]
    assert not cp.changelog_checkpointing  # every store's snapshot is its version: nothing replays
    rig.assert_exact()  # the commit-time uploads of version 2, and what they removed, are gone


def test_two_upgrades_of_one_version_are_followed_to_the_last(rig: Rig) -> None:
    """Spark may publish two snapshots after a commit (a lagging one, then the version's own): the
    second upgrade diffs against the first, and the checkpoint takes the last of the chain."""
    rig.commit_version(3, 0)
    assert rig.finish_batch(2) == 1
    rig.commit_version(3, 2, upgrade=True, keys=(KEY,))
    last = rig.commit_version(3, 3, upgrade=True, keys=(KEY,))
    assert rig.refresh() == 1
    cp = rig.latest()
    assert cp.marker(BLOBSTORE_BACKEND, KEY) == last[KEY]
    assert cp.changelog_checkpointing  # OTHER still replays
    rig.assert_exact()  # the first upgrade's index and what the chain removed are gone


def test_a_pending_newer_batch_defers_the_refresh(rig: Rig) -> None:
    rig.commit_version(1, 0)
    assert rig.finish_batch(0) == 1
    rig.commit_version(1, 1, upgrade=True)
    rig.commit_version(2, 1, keys=(KEY,))  # batch 1 under way: one of its two stores reported
    assert rig.finish_batch(1) == 0
    assert rig.refresh() == 0  # its checkpoint will replace batch 0's
    rig.commit_version(2, 1, keys=(OTHER,))
    assert rig.committer.poll() == 1
    assert rig.latest().batch_id == 1
    assert not read_upgrades(rig.store, QID, 1)  # obsolete, deleted with batch 1's cleanup
    rig.assert_exact()


def test_only_an_upgrade_of_exactly_the_checkpointed_snapshot_is_taken(
    rig: Rig, local_store: LocalBlobStore, pool: TransferPool
) -> None:
    rig.commit_version(1, 0)
    assert rig.finish_batch(0) == 1
    first = rig.latest()
    # Version 1 uploaded by another sidecar with no diff base: not descended from the checkpoint.
    stray = BackupManager(local_store, pool, owner=SnapshotOwner(QID))
    marker = stray.upload("v1", {KEY: rig.dirs[KEY]}, versions={KEY: 1}, recipes={KEY: recipe(1, 1)})[KEY]
    write_report(local_store, QID, 1, KEY, marker, "other", 3600, upgrade=True)
    assert rig.refresh() == 0
    assert rig.latest().checkpoint_id == first.checkpoint_id
    assert not read_upgrades(local_store, QID, 1)  # seen, never usable: deleted


def test_upgrades_are_looked_for_with_a_backoff_and_not_after_the_window(rig: Rig) -> None:
    from spark_statebackend.runtime.upgrades import REFRESH_WINDOW_SECONDS

    rig.commit_version(1, 0)
    assert rig.finish_batch(0) == 1
    looks = 0
    original = rig.committer.upgrades.refresh

    def counting(up: object, q: object) -> int:
        nonlocal looks
        looks += 1
        return original(up, q)  # type: ignore[arg-type]

    rig.committer.upgrades.refresh = counting  # type: ignore[method-assign]
    for _ in range(100):
        rig.refresh(after=0.1)  # 10 s in steps of 0.1 s
    assert 3 <= looks <= 8, looks  # 0.25 s, doubling: not one look per step
    rig.clock.now += REFRESH_WINDOW_SECONDS
    rig.commit_version(1, 1, upgrade=True)
    assert rig.refresh() == 0 and not rig.committer.upgrades.windows  # the window is over


# --- the sidecar: upgrades of checkpointed versions are uploaded, and stay the diff base --------------


@pytest.fixture
def sidecar(tmp_path: Path) -> Sidecar:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
        }
    )
    s = Sidecar(sp.Spool(tmp_path / "spool"), "driver", settings)
    s.store.ensure_ready()
    s.log.create_resources()
    yield s
    s.close()


def _event(
    tmp_path: Path, version: int, snapshot: int, *, upgrade: bool, n: int
) -> tuple[Path, sp.SnapshotEvent]:
    staged = make_tree(
        tmp_path / "staging" / "app" / "0" / "0" / "default" / f"{version}-{n:08d}",
        {
            f"{snapshot}.zip": f"snapshot {snapshot}".encode(),
            **{f"{v}.changelog": b"c" for v in range(snapshot + 1, version + 1)},
        },
    )
    source = tmp_path / f"event-{n}.json"
    source.write_text("{}")
    ckpt = tmp_path / "ckpt"
    ev = sp.SnapshotEvent(
        query_id=QID, batch_id=version - 1, checkpoint_root=ckpt, dfs_dir=ckpt / "state" / "0" / "0",
        operator=0, partition=0, store="default", version=version, spark_unique_id=None, staged_dir=staged,
        files=(), executor_id="driver", created_at_ms=int(time.time() * 1000), stage_nanos=1,
        snapshot_version=snapshot, changelog_versions=tuple(range(snapshot + 1, version + 1)),
        upgrade=upgrade,
    )  # fmt: skip
    return source, ev


def test_the_sidecar_uploads_an_upgrade_of_a_checkpointed_version_and_keeps_it_as_base(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    sidecar.uploads.upload_group(QID, 3, [_event(tmp_path, 3, 2, upgrade=False, n=1)])
    (committed,) = (r.marker for r in read_reports(sidecar.store, QID, 3).values())
    sidecar.log.write(
        CheckpointV2(
            CheckpointId.create(2), QID, state_checkpoint_markers={BLOBSTORE_BACKEND: {KEY: committed}}
        )
    )
    # The same version again, not an upgrade (a restarted sidecar's claimed event): not uploaded.
    sidecar.uploads.upload_group(QID, 3, [_event(tmp_path, 3, 2, upgrade=False, n=2)])
    assert read_reports(sidecar.store, QID, 3)[KEY].marker == committed
    # An upgrade: uploaded against the checkpointed snapshot and reported as such.
    sidecar.uploads.upload_group(QID, 3, [_event(tmp_path, 3, 3, upgrade=True, n=3)])
    assert read_reports(sidecar.store, QID, 3)[KEY].marker == committed  # never among a batch's reports
    (report,) = read_upgrades(sidecar.store, QID, 3)
    assert report.upgrade and report.marker != committed and not report.changelog
    manager = sidecar.uploads.bases.manager(QID)
    assert manager.previous_marker(KEY) == report.marker
    assert manager.snapshot_index(report.marker).prev_snapshot_index_blob_id == committed
    # Not yet checkpointed, it stays the base of the next version (cleanup follows the chain).
    assert sidecar.uploads.bases.refresh(QID, [KEY]) == 3
    assert manager.previous_marker(KEY) == report.marker
    # An older version is never uploaded, upgrade or not.
    sidecar.uploads.upload_group(QID, 2, [_event(tmp_path, 2, 2, upgrade=True, n=4)])
    assert not read_upgrades(sidecar.store, QID, 2) and not read_reports(sidecar.store, QID, 2)


def test_the_newest_recipe_of_a_version_wins_among_staged_events(tmp_path: Path) -> None:
    from spark_statebackend.runtime.staged_events import recency

    _, commit = _event(tmp_path, 5, 2, upgrade=False, n=1)
    _, upgrade = _event(tmp_path, 5, 4, upgrade=True, n=2)
    _, later_commit = _event(tmp_path, 6, 4, upgrade=False, n=3)
    assert recency(upgrade) > recency(commit)
    assert recency(later_commit) > recency(upgrade)


def test_the_upgrade_flag_of_a_snapshot_event_round_trips_and_defaults_to_false(tmp_path: Path) -> None:
    import orjson

    _, ev = _event(tmp_path, 5, 4, upgrade=True, n=1)
    assert sp.SnapshotEvent.from_json(orjson.dumps(ev.to_json())).upgrade
    doc = ev.to_json()
    del doc["upgrade"]  # written before upgrades existed
    assert not sp.SnapshotEvent.from_json(orjson.dumps(doc)).upgrade
    doc["upgrade"] = "yes"
    with pytest.raises(sp.SpoolFormatError, match="upgrade"):
        sp.SnapshotEvent.from_json(orjson.dumps(doc), "bad-event")
