"""Export: a query's state back into Spark's own layout, so the query runs on without the backend.

`export_state` makes a local checkpoint location hold everything Spark's own RocksDB provider needs to
resume the query where Spark's commit log says it is, with no file of the backend needed:

  [X1] the query: `query_id`, else the location's `metadata`, else the locator of its path.
  [X2] Spark's driver files: the driver-side restore (driver_restore.py, [D2]-[D5]): a location
       without them (a new directory) or behind the latest durable checkpoint is rebuilt from it and
       the batch plans stored after it; one at or ahead of it keeps Spark's files as they are (never
       rolled back: docs/exactly-once.md). Operator metadata and state schemas (`state/<op>/_*`) missing
       from the location are taken from the checkpoint's `_driver` snapshot and the plans after it;
       a file Spark has is never replaced.
  [X3] the version: Spark resumes after the newest entry L of `commits/`, so every store must hold
       state version L+1 (`version_of_batch(L)`), the one its next batch loads: from the checkpoint of
       batch L, or, for a batch Spark committed after the latest checkpoint, from its upload reports
       (lifecycle/markers.py `find_version_snapshot`, as an executor restore). `batch`, when given,
       must be L: any other version would not match Spark's commit log.
  [X4] the stores: every store of the latest checkpoint (of the reports, for a newer version). A
       store dir that holds files is refused, naming it, unless `force`. Each snapshot goes through
       the marker guard and is restored (every chunk checksum-verified) into a scratch dir inside the
       location; any missing or corrupt blob fails the export naming query, store, version and blob,
       and the location's store dirs are left untouched.
  [X5] only then are the stores' files moved into `state/<op>/<part>[/<store>]/`, never following a
       symlink below the location; the scratch dir is removed.

Nothing in the blob store or the log is changed, except what the driver-side restore itself writes
(a fallback checkpoint's copy, stale plans deleted).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointV2,
    StoreInstance,
    version_of_batch,
)
from ..checkpoints.logs import CheckpointLog, open_checkpoint_log
from ..common.nofollow import DirTree, move_tree_into, remove_below
from ..engine.restore import RestoreManager
from ..engine.transfer import TransferPool
from ..errors import StateBackendError
from ..lifecycle.markers import find_version_snapshot, load_checkpoint_indexes, load_version_snapshot
from ..lifecycle.reports import read_reports
from ..settings import PREFIX, Settings
from ..stores import BlobStore, open_blob_store
from .driver_restore import restore_checkpoint_location
from .location import OURS_DIR, check_no_symlinks, find_query_id, latest_commit, local_path
from .rebuild import place_plans

log = logging.getLogger("spark_statebackend.spark")

#: The export's scratch dir inside the location (on its file system, so files move by rename).
EXPORT_PARTS = (OURS_DIR, "export")


class ExportError(StateBackendError):
    """The state cannot be exported; the message names the query, the store, the version and the blob."""


@dataclass(frozen=True)
class ExportedStore:
    """One store written into the location: its key, the snapshot it came from, and its files."""

    key: str
    marker: str
    files: int
    bytes: int


@dataclass(frozen=True)
class ExportResult:
    """What `export_state` did: the query, the batch Spark resumes after (-1: none committed), the
    state version written, what the driver-side restore did, and the stores written."""

    query_id: str
    batch: int
    version: int
    driver: str
    stores: tuple[ExportedStore, ...]


def export_state(
    settings: Settings,
    location: str,
    *,
    query_id: str | None = None,
    batch: int | None = None,
    force: bool = False,
    store: BlobStore | None = None,
    checkpoint_log: CheckpointLog | None = None,
) -> ExportResult:
    """Write the query's state into the local checkpoint `location` in Spark's own layout (module doc,
    [X1]-[X5]), so that Spark's RocksDB provider, without the backend, resumes the query after the
    newest batch of the location's commit log with exactly the state that batch committed.

    Raises ExportError naming the query, store, version and blob when a snapshot is missing, corrupt or
    not the store's, when a store dir holds files and `force` is not given, or when `batch` is not the
    batch the location resumes after; RestoreError / UnsafePathError from the driver-side restore (a
    symlink among Spark's files, entries it would have to delete). `store` and `checkpoint_log`, when
    given, are used (and left open)."""
    root = local_path(location)
    root.mkdir(parents=True, exist_ok=True)
    check_no_symlinks(root)
    owned_store = store is None
    if store is None:
        store = open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url")
    cplog = checkpoint_log or open_checkpoint_log(
        settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url"
    )
    try:
        qid = query_id or find_query_id(root, store, cplog.read_latest)  # [X1]
        if qid is None:
            raise ExportError(
                f"no query is known for {root}: it has no Spark `metadata` file and no query locator names "
                "its path; give the query id"
            )
        driver = restore_checkpoint_location(  # [X2]
            settings, str(root), store=store, checkpoint_log=cplog, query_id=qid
        )
        latest = cplog.read_latest(qid)
        if latest is None:  # the restore said 'fresh'
            raise ExportError(f"query {qid} has no checkpoint in {cplog.url}: there is no state to export")
        committed = latest_commit(root)  # [X3]
        if batch is not None and batch != committed:
            raise ExportError(
                f"query {qid}: {root} resumes after batch {committed} (its commit log), so its stores "
                f"must hold state version {version_of_batch(committed)}; exporting batch {batch} would "
                "give Spark state that does not match its commit log"
            )
        version = version_of_batch(committed)
        with TransferPool(settings.workers, name="ssb-export") as pool:
            if driver.startswith("current"):
                _fill_operator_files(store, pool, qid, latest, root)
            keys = _store_keys(store, cplog, qid, version) if committed >= 0 else []
            stores = _export_stores(store, pool, cplog, qid, version, keys, root, force)
        return ExportResult(qid, committed, version, driver, tuple(stores))
    finally:
        if checkpoint_log is None:
            cplog.close()
        if owned_store:
            store.close()


def _store_keys(store: BlobStore, cplog: CheckpointLog, qid: str, version: int) -> list[str]:
    """The stores the location's next batch loads at `version` ([X4]): those of the newest checkpoint
    holding it; for a version newer than every checkpoint, the latest checkpoint's and any reported
    for it, so that a store whose report is missing fails the export, naming it, never drops out."""
    latest = cplog.read_latest(qid)
    holding = [c for c in cplog.read_history(qid) if version_of_batch(c.batch_id) == version]
    if latest is not None and version_of_batch(latest.batch_id) == version:
        holding.append(latest)
    if holding:
        keys = set(holding[-1].markers(BLOBSTORE_BACKEND))
    else:
        keys = set(read_reports(store, qid, version))
        if latest is not None:
            keys |= set(latest.markers(BLOBSTORE_BACKEND))
    return sorted(k for k in keys if k != DRIVER_STORE)


def _export_stores(
    store: BlobStore,
    pool: TransferPool,
    cplog: CheckpointLog,
    qid: str,
    version: int,
    keys: list[str],
    root: Path,
    force: bool,
) -> list[ExportedStore]:
    """[X4]-[X5]: every store of `keys` at `version` restored into scratch, then moved into its dir."""
    dirs = {k: _store_dir(qid, k) for k in keys}
    busy = [d for d in dirs.values() if _has_files(root, d)]
    if busy and not force:
        shown = ", ".join(str(root.joinpath(*d)) for d in busy[:5]) + (" ..." if len(busy) > 5 else "")
        raise ExportError(
            f"query {qid}: {len(busy)} store dir(s) already hold files ({shown}); export writes state "
            f"version {version} into them. Pass --force (force=True) to write over their files, or export "
            "into a location whose store dirs are empty"
        )
    scratch = root.joinpath(*EXPORT_PARTS)
    _clear(root, EXPORT_PARTS)
    restorer = RestoreManager(store, pool)
    exported: list[ExportedStore] = []
    try:
        for key in keys:
            exported.append(
                _restore_one(store, restorer, cplog, qid, key, version, scratch / _scratch_name(key))
            )
        for key in keys:  # [X5] only once every store is in hand: a failure above leaves them untouched
            move_tree_into(scratch / _scratch_name(key), root, dirs[key])
    finally:
        _clear(root, EXPORT_PARTS)
    for e in exported:
        log.info(
            "export query %s store %s version %d: %d file(s) from %s", qid, e.key, version, e.files, e.marker
        )
    return exported


def _restore_one(
    store: BlobStore,
    restorer: RestoreManager,
    cplog: CheckpointLog,
    qid: str,
    key: str,
    version: int,
    into: Path,
) -> ExportedStore:
    """Store `key` at `version` restored into `into` through the marker guard, every chunk verified."""
    found, why = find_version_snapshot(store, cplog, qid, key, version)
    if found is None:
        raise ExportError(f"query {qid} store {key} version {version}: {why}")
    try:
        marker, index = load_version_snapshot(store, qid, key, found)
        recorded = index.metadata.version
        if recorded is not None and recorded != version:
            raise ExportError(f"snapshot {marker} records version {recorded}")
        restorer.restore(marker, into, index=index)
    except StateBackendError as e:  # a missing, corrupt or hostile blob: e names it
        raise ExportError(
            f"query {qid} store {key} version {version}: cannot export from {found.marker}: {e}"
        ) from e
    return ExportedStore(key, marker, index.dir_index.file_count(), index.dir_index.total_size())


def _fill_operator_files(
    store: BlobStore, pool: TransferPool, qid: str, latest: CheckpointV2, root: Path
) -> None:
    """[X2] for a location Spark's files continue: the operator metadata and state schemas under
    `state/` it lacks (its state/ wiped or never written there), from the latest checkpoint's `_driver`
    snapshot with the plans stored after it over it. Files the location has are Spark's: never replaced."""
    if latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE) is None:
        return
    scratch = root.joinpath(*EXPORT_PARTS)
    _clear(root, EXPORT_PARTS)
    try:
        try:
            marker, index = load_checkpoint_indexes(store, latest, stores=[DRIVER_STORE]).require(
                DRIVER_STORE
            )
            RestoreManager(store, pool).restore(marker, scratch, index=index)
            place_plans(store, qid, latest.batch_id, scratch)
        except StateBackendError as e:
            raise ExportError(
                f"query {qid}: the operator metadata of checkpoint {latest.checkpoint_id} cannot be read: {e}"
            ) from e
        for dirpath, _dirs, files in os.walk(scratch):
            for name in files:
                path = Path(dirpath, name)
                rel = path.relative_to(scratch)
                if rel.parts[0] != "state" or os.path.lexists(root / rel):
                    path.unlink()
        if (scratch / "state").is_dir():
            placed = move_tree_into(scratch / "state", root, ("state",))
            if placed:
                log.warning(
                    "export query %s: %d operator metadata file(s) missing in %s restored", qid, placed, root
                )
    finally:
        _clear(root, EXPORT_PARTS)


def _store_dir(qid: str, key: str) -> tuple[str, ...]:
    try:
        return StoreInstance.parse(key).dir_parts()
    except ValueError as e:  # a key no Spark store has: data, never a path
        raise ExportError(f"query {qid}: store key {key!r}: {e}") from None


def _scratch_name(key: str) -> str:
    return key.replace("/", "_")


def _has_files(root: Path, parts: tuple[str, ...]) -> bool:
    """Whether the store dir root/parts holds state files, looked at without following a symlink below
    root. Entries named `_*` are Spark's driver files, not the store's (partition 0's `_metadata/schema`:
    location.py `stage_driver_files`)."""
    with DirTree(root) as tree:
        fd = tree.dir_fd(parts, create=False)
        return fd is not None and any(not name.startswith("_") for name in os.listdir(fd))


def _clear(root: Path, parts: tuple[str, ...]) -> None:
    """Remove root/parts (ours) without following a symlink; its parent `_statebackend/` stays."""
    remove_below(root, parts, create_parent=True)
    with contextlib.suppress(OSError):  # empty, nothing else of ours: Spark's own layout only
        os.rmdir(root / parts[0])
