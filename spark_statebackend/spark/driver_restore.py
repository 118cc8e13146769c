"""The driver-side restore of a checkpoint location: [D2]-[D5] of spark/__init__.py.

`restore_checkpoint_location` is the driver's half of "state restored automatically": the JVM asks the
driver's sidecar to run it when a query starts on a checkpoint location ([D1], jvm-bridge DriverHooks;
runtime/restore_loop.py serves the request), and `spark-statebackend restore-checkpoint` runs it by
hand. It makes the location resume from the query's latest durable checkpoint N: Spark then runs batch
N+1, and each executor restores the state of version N+1 from the blob store when it loads it.

This module decides: which query, whether Spark's own files are used as they are, which checkpoint is
restorable (the latest, else a retained one, written back to the log as a copy), and whether a rebuild
would delete Spark's entries. Writing the chosen checkpoint's files into the location is rebuild.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
    version_of_batch,
)
from ..checkpoints.logs import CheckpointLog, open_checkpoint_log
from ..common.nofollow import DirTree
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..engine.verify import verify_snapshot
from ..errors import RestoreError, StateBackendError
from ..lifecycle.markers import load_checkpoint_indexes
from ..settings import PREFIX, Settings
from ..stores import BlobStore, open_blob_store
from .location import (
    check_no_symlinks,
    find_query_id,
    latest_commit,
    local_path,
    read_query_id,
)
from .rebuild import build_in_scratch, move_into_location, place_unpublished_plans

log = logging.getLogger("spark_statebackend.spark")  # name kept from the flat layout


def snapshot_problems(store: BlobStore, pool: TransferPool, checkpoint: CheckpointV2) -> list[str]:
    """Why `checkpoint` cannot be restored from the blob store (empty: it can), each naming the blob.

    Every marker must name a SnapshotIndex of the checkpoint's query and its store
    (lifecycle/markers.py `load_checkpoint_indexes`: never another query's snapshot, nor a blob
    that is not a SnapshotIndex). The `_driver` snapshot is verified in full (every blob read and
    checksummed: it is small); every file blob a store snapshot references must exist. Never raises
    for a missing, corrupt or hostile blob: that is reported as a problem. The blob store failing (an
    outage past its retry budget) raises: an outage says nothing of this checkpoint, and taking it for
    a bad one would restore an older checkpoint, whose later plans cleanup may have deleted, so Spark
    would re-plan batches it committed."""
    markers = checkpoint.markers(BLOBSTORE_BACKEND)
    driver = markers.get(DRIVER_STORE)
    if driver is None:
        return [f"checkpoint {checkpoint.checkpoint_id} has no {DRIVER_STORE} snapshot"]
    found = load_checkpoint_indexes(store, checkpoint, pool=pool)  # the store failing raises
    problems = [str(e) for e in found.unusable.values()]  # in key order
    if DRIVER_STORE in found.usable:
        index = found.usable[DRIVER_STORE][1]
        report = verify_snapshot(store, pool, driver, index=index, outage_raises=True)
        problems += [f"{DRIVER_STORE} snapshot {driver}: {p}" for p in report.problems]

    def check_store(key: str, marker: str, index: SnapshotIndex) -> list[str]:
        missing = [b for b in index.dir_index.present_blob_ids() if not store.exists(b)]
        return [f"store {key} snapshot {marker}: file blob {b!r} not found" for b in missing]

    stores = [(k, m, i) for k, (m, i) in found.usable.items() if k != DRIVER_STORE]  # in key order
    for missing in pool.run_all([partial(check_store, k, m, i) for k, m, i in stores]):
        problems.extend(missing)
    return problems


def restore_checkpoint_location(
    settings: Settings,
    location: str,
    *,
    mode: str = "start",
    store: BlobStore | None = None,
    checkpoint_log: CheckpointLog | None = None,
    on_rebuilt: Callable[[str, CheckpointV2, int], None] | None = None,
    query_id: str | None = None,
) -> str:
    """Make the local checkpoint location resume from the latest durable checkpoint (module doc).

    Returns what it did: 'fresh' (no checkpoint anywhere), 'current' (local files match the latest
    checkpoint, or no checkpoint is restorable and Spark's own files are used), or 'restored batch N'.
    `mode` "read" (a reader that is not a query: the state data source, offline repartition) leaves a
    location that has its `metadata` file as it is ('current'). `store` and `checkpoint_log`, when
    given, are used (and left open) instead of opening the configured ones. `on_rebuilt(query id,
    checkpoint, version)` is called once the location was rebuilt from that checkpoint (not when 'fresh'
    or 'current'), before this returns; `version` is the state version the next batch loads (the
    checkpoint's, or newer when plans were placed: rebuild.py `place_plans`). `query_id`, when given, is the
    query instead of the one [D2] finds (a location of another path: `export` into a new directory);
    a location whose `metadata` names another query raises RestoreError naming both.

    Reliability contract: when the latest checkpoint's snapshots are unusable (a SnapshotIndex or
    file blob missing or corrupt: `snapshot_problems`), the retained checkpoints are tried newest
    first; the first usable one is restored, an ERROR names every bad blob, and a copy of it (same
    batch, offsets and markers, a new checkpoint id) is written to the log so the committer and the
    executors' restores continue from it. If none is usable, Spark's own files are used when the
    checkpoint location has them (an ERROR says so); otherwise RestoreError is raised: a query is
    never started from wrong or empty state."""
    root = local_path(location)
    if mode not in ("start", "read"):
        raise ValueError(f"mode {mode!r} is not 'start' or 'read'")
    if mode == "start":
        # A symlink among Spark's files would fail every checkpoint of the query (stage_driver_files
        # never follows one): refused now, naming it, rather than running on with no checkpoint.
        check_no_symlinks(root)
    if mode == "read" and (root / "metadata").is_file():
        return "current"
    owned = store is None, checkpoint_log is None
    if store is None:
        store = open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url")
    cplog = checkpoint_log or open_checkpoint_log(
        settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url"
    )
    try:
        return _restore(settings, root, store, cplog, on_rebuilt, query_id)
    finally:
        if owned[1]:
            cplog.close()
        if owned[0]:
            store.close()


def _restore(
    settings: Settings,
    root: Path,
    store: BlobStore,
    cplog: CheckpointLog,
    on_rebuilt: Callable[[str, CheckpointV2, int], None] | None,
    query_id: str | None,
) -> str:
    """[D2]-[D5] for the location `root` with an open `store` and `cplog`; the result and contract of
    `restore_checkpoint_location`."""
    qid = query_id or find_query_id(root, store, cplog.read_latest)  # [D2]
    if query_id is not None and read_query_id(root) not in (None, query_id):
        raise RestoreError(
            f"checkpoint location {root} belongs to query {read_query_id(root)}, not to query {query_id}"
        )
    if qid is None:
        return "fresh"
    latest = cplog.read_latest(qid)  # [D3]
    if latest is None:
        return "fresh"
    local = latest_commit(root)
    if (root / "metadata").is_file() and local >= latest.batch_id:
        return _use_as_is(store, qid, root, latest.batch_id, local)
    if latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE) is None:
        log.error(
            "query %s checkpoint %s has no driver snapshot; Spark resumes from its own files",
            qid,
            latest.checkpoint_id,
        )
        return "current"
    with TransferPool(settings.workers, name="ssb-driver-restore") as pool:  # [D4]
        chosen, rejected = _first_usable(store, pool, cplog, qid, latest)
        if chosen is None:
            return _none_restorable(qid, root, local, rejected)
        _refuse_entries_beyond(qid, root, chosen)
        planned = build_in_scratch(store, pool, qid, chosen, root)
    n = chosen.batch_id
    if chosen is not latest:
        _repoint(cplog, chosen, latest)
    move_into_location(root, qid, chosen)  # [D5]
    plans = f"; plans of batches {n + 1}..{planned[-1]}" if planned else ""
    log.warning(
        "query %s: checkpoint location %s rebuilt from checkpoint %s (batch %d; local was at %d)%s: "
        "Spark runs batch %d next%s",
        qid,
        root,
        chosen.checkpoint_id,
        n,
        local,
        plans,
        planned[-1] if planned else n + 1,
        " again, with the offsets it planned" if planned else "",
    )
    if on_rebuilt is not None:
        # The batch Spark runs next (M: the newest planned one, else N+1) loads the version M-1 committed.
        on_rebuilt(qid, chosen, version_of_batch(planned[-1] - 1 if planned else n))
    return f"restored batch {n}{plans}"


def _use_as_is(store: BlobStore, qid: str, root: Path, checkpointed: int, local: int) -> str:
    """[D3] the location `root` is at its latest checkpoint's batch `checkpointed` or ahead of it
    (`local`, Spark's newest commit there): Spark's own files are used as they are, with the plans
    stored after its newest offsets placed (rebuild.py `place_unpublished_plans`); 'current', naming
    those plans."""
    if local > checkpointed:
        # Never rolled back: Spark's offsets after the checkpoint are plans sinks may already have
        # committed output for (by batch id); dropping them would make Spark plan those batches
        # again with whatever its sources hold now. Spark's own files continue the query (an
        # offline repartition among them included), and the next checkpoint catches the backup up.
        log.warning(
            "query %s: checkpoint location %s is ahead of its latest durable checkpoint (batch %d): "
            "Spark committed up to batch %d here; Spark's own files are used as they are and the "
            "backup catches up with the next checkpoint",
            qid,
            root,
            checkpointed,
            local,
        )
    planned = place_unpublished_plans(store, qid, root)
    return f"current; plans of batches {planned[0]}..{planned[-1]}" if planned else "current"


def _none_restorable(qid: str, root: Path, local: int, rejected: list[str]) -> str:
    """[D4] no retained checkpoint is restorable (`rejected`: why each was not): 'current' when the
    location has Spark's own files to resume from (an ERROR says so), else RestoreError."""
    if (root / "metadata").is_file() and local >= 0:
        log.error(
            "query %s: no retained checkpoint is restorable (%s); Spark resumes from its own files in %s "
            "(batch %d)",
            qid,
            "; ".join(rejected),
            root,
            local,
        )
        return "current"
    raise RestoreError(
        f"query {qid}: no retained checkpoint is restorable and {root} has no Spark checkpoint "
        f"files to fall back to; refusing to start from wrong state: {'; '.join(rejected)}"
    )


def _refuse_entries_beyond(qid: str, root: Path, chosen: CheckpointV2) -> None:
    """[D4] RestoreError if the location `root` holds Spark's entries beyond `chosen` (`entries_beyond`),
    naming them: rebuilding would delete them."""
    beyond = entries_beyond(root, chosen.batch_id)
    if beyond:
        raise RestoreError(
            f"query {qid}: checkpoint location {root} holds Spark's entries beyond batch "
            f"{chosen.batch_id} of the newest restorable checkpoint {chosen.checkpoint_id} "
            f"({', '.join(beyond)}); rebuilding it would delete them and make Spark plan those "
            "batches again with other input, so the query does not start. Restore the location's "
            "Spark files (its `metadata` file) or move the location aside"
        )


def entries_beyond(root: Path, batch: int) -> list[str]:
    """Spark's entries in `root` that a resume from checkpoint `batch` cannot keep, as relative paths:
    `commits/<k>` for k > batch and `offsets/<k>` for k > batch + 1 (with their `.crc`). `offsets/<batch+1>`
    is not among them: Spark runs that planned batch again with those offsets, on the checkpoint's
    state. Listed without following a symlink below `root`."""
    found: list[str] = []
    with DirTree(root) as tree:
        for sub, last_kept in (("commits", batch), ("offsets", batch + 1)):
            fd = tree.dir_fd((sub,), create=False)
            if fd is None:
                continue
            for name in sorted(os.listdir(fd)):
                num = name.lstrip(".").removesuffix(".crc")
                if num.isdigit() and int(num) > last_kept:
                    found.append(f"{sub}/{name}")
    return found


def _checked(store: BlobStore, pool: TransferPool, qid: str, cp: CheckpointV2) -> list[str]:
    """`snapshot_problems` of `cp`; the blob store failing raises RestoreError naming query and
    checkpoint: the start fails and can be retried, rather than falling back during an outage."""
    try:
        return snapshot_problems(store, pool, cp)
    except StateBackendError as e:  # never a problem of `cp` (snapshot_problems' contract)
        raise RestoreError(
            f"query {qid}: checkpoint {cp.checkpoint_id} (batch {cp.batch_id}) cannot be checked, the "
            f"blob store failed: {e}; an older checkpoint is never taken for an outage: start again "
            "once the blob store answers"
        ) from e


def _first_usable(
    store: BlobStore, pool: TransferPool, cplog: CheckpointLog, qid: str, latest: CheckpointV2
) -> tuple[CheckpointV2 | None, list[str]]:
    """The newest restorable checkpoint of `qid` (latest first, then the retained history newest
    first) and, for each one rejected before it, why (logged as an ERROR naming the bad blobs)."""
    rejected: list[str] = []
    problems = _checked(store, pool, qid, latest)
    if not problems:
        return latest, rejected
    # Never across an offline repartition: an older partitioning must not come back.
    epoch = latest.repartitioned_at_batch
    history = [c for c in reversed(cplog.read_history(qid)) if c.checkpoint_id < latest.checkpoint_id]
    older = [c for c in history if c.repartitioned_at_batch == epoch]
    excluded = len(history) - len(older)
    for cp in [latest, *older]:
        if cp is not latest:
            problems = _checked(store, pool, qid, cp)
        if not problems:
            log.error(
                "query %s: falling back to checkpoint %s (batch %d); newer checkpoints are unusable: %s",
                qid,
                cp.checkpoint_id,
                cp.batch_id,
                "; ".join(rejected),
            )
            return cp, rejected
        why = f"checkpoint {cp.checkpoint_id} (batch {cp.batch_id}): {', '.join(problems)}"
        log.error("query %s: %s", qid, why)
        rejected.append(why)
    if excluded:
        # Say why the retained ones were not tried: an operator would otherwise expect a fallback.
        why = (
            f"{excluded} older retained checkpoint(s) predate the offline state repartition at batch "
            f"{epoch} and are never restored (their partitioning is gone)"
        )
        log.error("query %s: %s", qid, why)
        rejected.append(why)
    return None, rejected


def _repoint(cplog: CheckpointLog, chosen: CheckpointV2, latest: CheckpointV2) -> None:
    """Write a copy of `chosen` (new id, after `latest`) so the log's latest is what Spark resumes from:
    the committer then counts its batch as the last committed and diffs against its snapshots, and
    executors find its markers. Re-running after a crash finds the copy usable and does nothing more."""
    copy = dataclasses.replace(
        chosen, checkpoint_id=CheckpointId.create(chosen.batch_id, after=latest.checkpoint_id)
    )
    cplog.acquire_writer(chosen.query_id)
    cplog.write(copy)
    log.error(
        "query %s: checkpoint %s written as a copy of %s (batch %d), replacing the unusable latest %s",
        chosen.query_id,
        copy.checkpoint_id,
        chosen.checkpoint_id,
        chosen.batch_id,
        latest.checkpoint_id,
    )
