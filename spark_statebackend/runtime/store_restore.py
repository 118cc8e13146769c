"""One store's restore, as the restore loop runs it (restore_loop.py; [E2], [E3] and [E5] of
runtime/__init__.py): which snapshot holds the requested version (a retained checkpoint's marker, or an
upload report's), that snapshot through the marker guard, built in a scratch dir on the checkpoint's
filesystem, then its files placed into the store's dir without following a symlink.

Kept apart from the loop, which owns the requests (dispatch, taking a request, answering it, the
per-store lock): this module never sees the spool. Whatever it refuses, `StoreRestorer.restore` says so
as a (status, message) naming the query, store, version and blob, and leaves the store's dir exactly as
it was.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..checkpoints.logs import CheckpointLog
from ..common.nofollow import DirTree, move_tree_into, relative_parts
from ..engine.index import SnapshotIndex
from ..engine.restore import RestoreManager, RestoreResult
from ..errors import StateBackendError, UnsafePathError
from ..lifecycle.markers import (
    MarkedIndex,
    UnusableMarkerError,
    VersionSnapshot,
    find_version_snapshot,
    load_version_snapshot,
)
from ..stores import BlobStore
from . import spool as sp

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before

#: (status, message, files downloaded, bytes downloaded): what a restore answers (runtime/spool).
Outcome = tuple[sp.RestoreStatus, str, int, int]

_VERSION = re.compile(r"[0-9]+")


def placing_order(name: str) -> tuple[int, int, int, str]:
    """Sort key of a store dir's own files as a restore places them (restore_ahead.py, why):
    checksum side files first, then other files, then each version's files oldest first, a version's
    zip after its changelog; so the newest version's head file, which the JVM's check requires,
    arrives last."""
    if name.endswith(".crc"):
        return (0, 0, 0, name)
    found = _VERSION.match(name)
    if found is None:
        return (1, 0, 0, name)
    return (2, int(found.group()), name.split(".")[-1] == "zip", name)


def location_key(root: Path) -> str:
    """A checkpoint location's identity: its real path. A restore ahead and a task's own request may
    spell one location differently (a symlink, a trailing slash) and must still meet."""
    return os.path.realpath(root)


class _Refused(Exception):
    """A step of `StoreRestorer.restore` refused the restore; `outcome` is its answer (already logged)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome[1])
        self.outcome = outcome


def _refused(status: sp.RestoreStatus, why: str) -> _Refused:
    return _Refused((status, why, 0, 0))


class StoreRestorer:
    """Restores single stores of the queries whose checkpoints `checkpoint_log` holds (module doc)."""

    def __init__(self, store: BlobStore, checkpoint_log: CheckpointLog, restorer: RestoreManager) -> None:
        self.store = store
        self.log = checkpoint_log
        self.restorer = restorer

    def find_marker(self, query_id: str, key: str, version: int | None) -> tuple[str | None, str]:
        """The blob-store marker of store `key` at state `version` (None: the latest checkpoint's),
        from the retained checkpoints (or an upload report), or None and why not."""
        found, why = self._find_snapshot(query_id, key, version)
        return (None if found is None else found.marker), why

    def _find_snapshot(
        self, query_id: str, key: str, version: int | None
    ) -> tuple[VersionSnapshot | None, str]:
        """`find_marker`, with the checkpoint or report it was read from ([E2]; lifecycle/markers.py)."""
        return find_version_snapshot(self.store, self.log, query_id, key, version)

    def restore(self, req: sp.RestoreRequest, may_place: Callable[[], str | None] | None) -> Outcome:
        """Put `req.version` of its store (None: the latest checkpoint's) back into `req.dfs_dir`, for
        `req.query_id` (resolved by the caller, which holds the store's restore lock); the contract is
        RestoreLoop.restore's. `may_place()` is asked once the files are ready, just before they are
        placed: a reason not to place them is answered `error`; if it raises, that propagates. On every
        answer but `restored` (and when it raises) `req.dfs_dir` is left exactly as it was."""
        try:
            marker, index = self._snapshot_of(req)  # [E2]
            scratch_rel = ("_statebackend", "restore", req.instance.key.replace("/", "_"))
            dfs_rel = self._check_paths(req, scratch_rel)
            scratch = req.checkpoint_root.joinpath(*scratch_rel)
            result = self._build(req, marker, index, scratch)  # [E3]
            moved = self._place(req, marker, scratch, dfs_rel, may_place)  # [E5]
        except _Refused as e:
            return e.outcome
        log.info(
            "restored query %s store %s version %s from %s: %d file(s), %d byte(s) downloaded, %d reused",
            req.query_id,
            req.instance.key,
            req.version,
            marker,
            result.files_downloaded,
            result.bytes_downloaded,
            result.files_reused,
        )
        return (
            "restored",
            f"{moved} file(s) placed from {marker}",
            result.files_downloaded,
            result.bytes_downloaded,
        )

    def _snapshot_of(self, req: sp.RestoreRequest) -> MarkedIndex:
        """[E2] the (marker, SnapshotIndex) of `req`'s store and version, through the marker guard;
        raises _Refused (`not_found` or `error`, logged) when there is none or it is unusable."""
        assert req.query_id is not None  # resolved by the caller
        key = req.instance.key
        found, why = self._find_snapshot(req.query_id, key, req.version)
        if found is None:
            # version None comes from a task outside a micro-batch (state reader, offline repartition):
            # a store the latest checkpoint lacks is normally one that repartition creates empty, and
            # Spark fails loudly by itself if it must read a store that has no files.
            level = logging.WARNING if req.version is None else logging.ERROR
            log.log(level, "restore query %s store %s version %s: %s", req.query_id, key, req.version, why)
            raise _refused("not_found", why)
        try:  # The marker is data, never an instruction: only a SnapshotIndex of this query and store.
            return load_version_snapshot(self.store, req.query_id, key, found)
        except StateBackendError as e:  # an unusable marker (UnusableMarkerError), or the store failing
            # Refused before anything is written: the store's dir keeps Spark's own files, which decide
            # (Spark fails loudly if they are missing too; never empty state because of this). A missing
            # SnapshotIndex is `not_found`, as when no checkpoint names one; anything else `error`.
            status: sp.RestoreStatus = "error"
            why = f"restore of store {key} version {req.version} from {found.marker} refused: {e}"
            if isinstance(e, UnusableMarkerError):
                status = "not_found" if e.missing else "error"
                why = f"restore of version {req.version} refused: {e}"  # e names query, store, blob
            log.error("restore query %s: %s; Spark's own files decide", req.query_id, why)
            raise _refused(status, why) from e

    def _check_paths(self, req: sp.RestoreRequest, scratch_rel: tuple[str, ...]) -> tuple[str, ...]:
        """The store's dir relative to the checkpoint root, once neither it nor the scratch dir's parent
        (created) lies behind a symlink planted under the checkpoint location (common/nofollow.py): the
        restore would write, and its cleanup delete, outside it. Else raises _Refused (`error`)."""
        try:
            dfs_rel = relative_parts(req.checkpoint_root, req.dfs_dir)
            with DirTree(req.checkpoint_root) as tree:
                tree.check(dfs_rel)
                tree.dir_fd(scratch_rel[:-1], create=True)
        except UnsafePathError as e:
            why = f"restore of store {req.instance.key} version {req.version} refused: {e}"
            log.error("restore query %s: %s; the store's dir is untouched", req.query_id, why)
            raise _refused("error", why) from e
        return dfs_rel

    def _build(
        self, req: sp.RestoreRequest, marker: str, index: SnapshotIndex, scratch: Path
    ) -> RestoreResult:
        """[E3] the snapshot built into `scratch` (engine/ [R1]-[R6]); on failure the scratch dir is
        removed and _Refused (`error`, naming the blob or the disk's error) raised."""
        key = req.instance.key
        try:
            return self.restorer.restore(marker, scratch, reuse_dirs=[req.dfs_dir], index=index)
        except StateBackendError as e:  # missing / corrupt / hostile file blob, store failure
            # The snapshot the checkpoint names is unusable: say so, naming the blob, and leave the
            # store's dir untouched so the JVM falls back to Spark's own files (Spark fails loudly if
            # those are missing too; it never starts from empty state because of this).
            shutil.rmtree(scratch, ignore_errors=True)
            why = f"snapshot {marker} of store {key} version {req.version} is unusable: {e}"
            log.error("restore query %s: %s; Spark's own files decide", req.query_id, why)
            raise _refused("error", why) from e
        except OSError as e:  # the local disk: full (ENOSPC), file size limit (EFBIG), permissions
            shutil.rmtree(scratch, ignore_errors=True)
            why = f"restore of store {key} version {req.version} from {marker} into {scratch.parent}: {e}"
            log.error("restore query %s: %s; the store's dir is untouched", req.query_id, why)
            raise _refused("error", why) from e

    def _place(
        self,
        req: sp.RestoreRequest,
        marker: str,
        scratch: Path,
        dfs_rel: tuple[str, ...],
        may_place: Callable[[], str | None] | None,
    ) -> int:
        """[E5] move the built files from `scratch` into the store's dir (no symlink followed, the
        version's head file last) if `may_place` allows it; how many were moved. The scratch dir is
        removed whatever happens; a refusal or a failure raises _Refused (`error`)."""
        try:
            refusal = None if may_place is None else may_place()
            if refusal is not None:
                log.error("restore query %s: %s", req.query_id, refusal)
                raise _refused("error", refusal)
            return move_tree_into(scratch, req.checkpoint_root, dfs_rel, order=placing_order)
        except (UnsafePathError, OSError) as e:
            key = req.instance.key
            why = f"restore of store {key} version {req.version} from {marker} into {req.dfs_dir}: {e}"
            log.error("restore query %s: %s", req.query_id, why)
            raise _refused("error", why) from e
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
