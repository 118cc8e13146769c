"""Writing a query's driver files into its checkpoint location: [D4]-[D5] of spark/__init__.py once
driver_restore.py has chosen the checkpoint to resume from. The chosen checkpoint's `_driver` snapshot
and the batch plans stored after it are built in a scratch dir inside the location
(`_statebackend/driver-restore/`, location.py), then moved into it without following any symlink below
it, `commits/` last; and the plans a location that Spark uses as it is lacks are placed the same way.

Kept apart from the decision (which checkpoint, whether to rebuild at all) because this is the only
part that writes into the checkpoint location: every path below it goes through common/nofollow.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointV2, StoreInstance
from ..common.nofollow import DirTree, move_tree_into, remove_below
from ..engine.restore import RestoreManager
from ..engine.transfer import TransferPool
from ..errors import RestoreError, StateBackendError
from ..lifecycle.markers import load_checkpoint_indexes
from ..lifecycle.plans import plan_batches, plan_id, read_plan
from ..stores import BlobStore
from .location import DRIVER_RESTORE_PARTS, latest_entry

log = logging.getLogger("spark_statebackend.spark")  # name kept from the flat layout


def build_in_scratch(
    store: BlobStore, pool: TransferPool, qid: str, chosen: CheckpointV2, root: Path
) -> list[int]:
    """[D4] restore `chosen`'s `_driver` snapshot into the scratch dir of the location `root` (a stale
    one, left by an interrupted rebuild, removed first), then the plans stored after it over it
    (`place_plans`); return the planned batches. Through the marker guard again: raises
    UnusableMarkerError, naming query, store, checkpoint and blob, if the snapshot has become unusable
    since it was chosen; RestoreError if a plan cannot be read. Nothing outside the scratch dir is
    written."""
    # On the location's own file system whatever its layout (a mount point, a symlink to another
    # disk), so that [D5] moves files by rename: inside it, under `_statebackend/` (location.py).
    scratch = root.joinpath(*DRIVER_RESTORE_PARTS)
    found = load_checkpoint_indexes(store, chosen, stores=[DRIVER_STORE])
    marker, index = found.require(DRIVER_STORE)
    if clear_scratch(root):
        log.warning("query %s: removed %s, left by an interrupted rebuild", qid, scratch)
    RestoreManager(store, pool).restore(marker, scratch, index=index)
    return place_plans(store, qid, chosen.batch_id, scratch)


def move_into_location(root: Path, qid: str, chosen: CheckpointV2) -> None:
    """[D5] move the scratch dir's files into the location `root` and create every store dir of
    `chosen`. Nothing below the location is followed if it is a symlink (common/nofollow.py): a
    planted `offsets -> /elsewhere` would make this write or delete outside it. The move checks every
    target before it changes anything, so a refusal (UnsafePathError) leaves the location as it was.
    The scratch dir is removed whatever happens."""
    try:
        # `commits/` last: a rebuild cut short leaves the location behind its checkpoint (redone at
        # the next start), never a commit whose offsets are not in place.
        move_tree_into(root.joinpath(*DRIVER_RESTORE_PARTS), root, before_place=_drop_crc, last=("commits",))
    finally:
        clear_scratch(root)
    with DirTree(root) as tree:
        # Every store dir of the checkpoint, empty until its executor restores it: Spark's readers
        # find a stateful operator's partitions by listing state/<op>/ on the driver.
        for key in chosen.markers(BLOBSTORE_BACKEND):
            if key != DRIVER_STORE:
                try:
                    tree.dir_fd(StoreInstance.parse(key).dir_parts(), create=True)
                except ValueError as e:  # a key no Spark store has: data, never a path
                    log.error("query %s checkpoint %s: key %r: %s", qid, chosen.checkpoint_id, key, e)


def place_plans(store: BlobStore, qid: str, batch: int, scratch: Path) -> list[int]:
    """Write the plans of batches `batch`+1, +2, ... that exist consecutively (lifecycle/plans.py) into
    the rebuild's `scratch` dir, oldest first, each over what is there; return their batches. Spark then
    finds `offsets/<M>` and `commits/<M-1>` of each and re-runs the newest planned batch with the offsets
    it first gave it. A stored plan after a gap (a batch planned without one: the backend off, or the
    plans deleted with the checkpoints they preceded, after a fallback to an older checkpoint) is of a
    batch Spark plans again: it is deleted, a WARNING naming it, so the new plan can be stored. A plan
    that cannot be read raises RestoreError naming its blob: the query does not start."""
    stored = plan_batches(store, qid)
    run: list[int] = []
    while batch + len(run) + 1 in stored:
        run.append(batch + len(run) + 1)
    for m in run:
        try:
            plan = read_plan(store, qid, m)
        except StateBackendError as e:
            raise RestoreError(
                f"query {qid}: the plan of batch {m} ({plan_id(qid, m)}), which Spark planned after "
                f"checkpoint batch {batch}, cannot be read ({e}); without it Spark would plan the batch "
                "again with other input, so the query does not start"
            ) from e
        if plan is None:  # deleted since listed: a checkpoint covers it now, and this rebuild is stale
            raise RestoreError(
                f"query {qid}: the plan of batch {m} ({plan_id(qid, m)}) vanished during the rebuild"
            )
        for rel, data in plan.files.items():
            target = scratch / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    for m in (b for b in stored if b > batch + len(run) + 1):
        log.warning(
            "query %s: plan %s of batch %d follows a batch without a plan after checkpoint batch %d: Spark "
            "plans that batch again, so the stale plan is deleted",
            qid,
            plan_id(qid, m),
            m,
            batch,
        )
        store.delete(plan_id(qid, m))
    return run


def place_unpublished_plans(store: BlobStore, qid: str, root: Path) -> list[int]:
    """Place the plans stored after the newest `offsets/` entry of the location `root`, which Spark uses
    as it is ([D3]); return their batches. Such a plan was stored ([C0]) and then the driver died before
    Spark published its offsets: Spark would plan that batch again, and the new plan would conflict with
    the stored one, which a new host would run. Placed like a rebuild's files (scratch dir, then moved
    without following a symlink, `commits/` last); normally there is none and nothing is written."""
    last = latest_entry(root, "offsets")
    if last + 1 not in plan_batches(store, qid):
        return []
    scratch = root.joinpath(*DRIVER_RESTORE_PARTS)
    clear_scratch(root)
    try:
        planned = place_plans(store, qid, last, scratch)
        move_tree_into(scratch, root, before_place=_drop_crc, last=("commits",))
    finally:
        clear_scratch(root)
    log.warning(
        "query %s: the plans of batches %d..%d were stored but their offsets never reached %s (the driver "
        "stopped in between); placed, so Spark runs batch %d with the offsets it planned",
        qid,
        planned[0],
        planned[-1],
        root,
        planned[-1],
    )
    return planned


def _drop_crc(dir_fd: int, name: str) -> None:
    """Before a file is placed over one of Spark's: Hadoop's checksum of the old one would no longer match."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f".{name}.crc", dir_fd=dir_fd)


def clear_scratch(root: Path) -> bool:
    """Remove the driver-side restore's scratch dir (DRIVER_RESTORE_PARTS) from the location `root`:
    an interrupted rebuild's, or this one's once its files are moved; True if there was one. Nothing
    is followed: its parent `_statebackend/` is opened (created if missing) with O_NOFOLLOW, so
    UnsafePathError if that is a symlink, and the dir is removed without following one below it."""
    return remove_below(root, DRIVER_RESTORE_PARTS, create_parent=True)
