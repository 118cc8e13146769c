"""The sidecar's restore loop ([E2]-[E5] of runtime/__init__.py, and [D1] of spark/__init__.py):
restore requests -> the matching marker of the latest checkpoint (or an older retained one) ->
RestoreManager into a scratch dir on the checkpoint's filesystem -> the request taken while the JVM
still waits (runtime/spool: "Taking a request") -> files moved into the store's dir -> a response.

Dispatched by the thread `ssb-restore-dispatch` to a bounded pool of its own (`ssb-restore-*`:
RESTORE_WORKERS running, RESTORE_QUEUE queued, further requests wait in the spool); restores of one
store run one at a time. Identical local files are reused. Every request the JVM still waits for gets a
response on every path (restored / not_found / error); one it withdrew (restoreTimeout) gets none and
nothing is placed. Nothing below the checkpoint location is followed if it is a symlink (the store's
dir, the scratch dir, `SSTs/`: the request is answered `error` naming it), and a stale file where a
restored one belongs is replaced, never kept (common/nofollow.py). Requests a dead predecessor had
pending or taken are served again (a restore's half-built scratch dir is removed by the next restore of
that store). A checkpoint-location request (driver spool dir only) runs the driver-side restore; a
plan request (driver spool dir only) stores a batch's plan (plan_store.py, runtime/ [C0]).

Restoring ahead: when the driver's JVM also runs the query's tasks (a local master: this sidecar serves
both) and the driver-side restore rebuilt the location from checkpoint N, every store of N is restored
at once (version N+1, what batch N+1 loads; version K when it placed plans up to batch K, from the
upload reports, [E2]), queued behind the tasks' own requests on the same pool,
instead of one by one as each task reaches its store. Spark's first batch computes its first stage
meanwhile, so the restore is off its critical path. It is safe without a waiting task because
(1) restores of one store take the same lock, so a task's request for a store being restored ahead
waits for it and then finds every file in place (reused, nothing copied); (2) a store's own files are
placed checksum side files first and the versions oldest first (`placing_order`), so the file a
task's load needs to find complete (the zip or changelog of version N+1) arrives last and the JVM's
check never passes on a half-placed store; (3) nothing is ever deleted from a store's dir. Where
executors have sidecars of their own (a cluster), each restores the stores it loads, on its own host.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path

from ..checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointV2,
    StoreInstance,
)
from ..checkpoints.logs import CheckpointLog
from ..common.nofollow import DirTree, move_tree_into, relative_parts
from ..engine.restore import RestoreManager
from ..engine.transfer import TransferPool
from ..errors import StateBackendError, UnsafePathError
from ..lifecycle.markers import (
    UnusableMarkerError,
    VersionSnapshot,
    find_version_snapshot,
    load_version_snapshot,
)
from ..settings import Settings
from ..spark.driver_restore import restore_checkpoint_location
from ..stores import BlobStore
from . import spool as sp
from .ownership import Ownership
from .plan_store import PlanStore
from .spool.wake import Wake

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before

RESTORE_WORKERS = 4  # restores run at once (each also uses the shared transfer pool)
RESTORE_QUEUE = 4  # restores queued behind them; more requests stay pending in the spool
#: A restore's files are placed only if the JVM still waits for at least this long (or a quarter of
#: restoreTimeout, if less): placing them is a few renames, far quicker.
RESTORE_PLACE_MARGIN_SECONDS = 2.0

_VERSION = re.compile(r"[0-9]+")


def placing_order(name: str) -> tuple[int, int, int, str]:
    """Sort key of a store dir's own files as a restore places them (module doc, "Restoring ahead"):
    checksum side files first, then other files, then each version's files oldest first, a version's
    zip after its changelog; so the newest version's head file, which the JVM's check requires,
    arrives last."""
    if name.endswith(".crc"):
        return (0, 0, 0, name)
    found = _VERSION.match(name)
    if found is None:
        return (1, 0, 0, name)
    return (2, int(found.group()), name.split(".")[-1] == "zip", name)


def _location(root: Path) -> str:
    """A checkpoint location's identity: its real path. A restore ahead and a task's own request may
    spell one location differently (a symlink, a trailing slash) and must still meet."""
    return os.path.realpath(root)


class RestoreLoop:
    """Serves the restore requests of one spool dir (module doc)."""

    def __init__(
        self,
        spool: sp.Spool,
        settings: Settings,
        *,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        restorer: RestoreManager,
        resolve_query_id: Callable[[Path], str | None],
        ownership: Ownership,
    ) -> None:
        """`ownership`: the sidecar process's (runtime/ownership.py): its identity is the one the plans
        it stores carry, and it says which queries this application was fenced from (no log I/O)."""
        self.spool = spool
        self.plans = PlanStore(
            store,
            ownership=ownership,
            resolve_query_id=resolve_query_id,
            retry_for=settings.commit_timeout_seconds,
        )
        self.settings = settings
        self.store = store
        self.log = checkpoint_log
        self.restorer = restorer
        self.resolve_query_id = resolve_query_id
        # Restores in flight are bounded (workers + queue); further requests wait in the spool.
        self.pool = TransferPool(RESTORE_WORKERS, name="ssb-restore", queue_size=RESTORE_QUEUE)
        self._recovered = False  # requests a dead predecessor had taken are served first, once
        self.in_progress: set[str] = set()  # request file names dispatched and not yet answered
        self._store_locks: dict[tuple[str, str], threading.Lock] = {}  # (real checkpoint root, store)
        self._lock = threading.Lock()
        # Stores to restore ahead of their tasks (module doc): at most one checkpoint's stores per
        # location, dispatched after the tasks' own requests whenever the pool has a free slot.
        self._ahead: deque[sp.RestoreRequest] = deque()  # guarded by _lock
        self._closing = False
        # What the dispatch thread waits on (sidecar.py): new requests, and a slot coming free or a
        # restore ahead queued, either of which lets it dispatch what waits.
        self.wake = Wake()

    def close(self) -> None:
        self._closing = True  # restores ahead still queued return at once
        self.plans.close()  # a plan held by an outage is answered at once
        with self._lock:
            self._ahead.clear()
        self.pool.close(cancel_pending=False)  # at most RESTORE_QUEUE queued: answer them

    def restore_once(self) -> bool:
        """Dispatch pending restore requests to the bounded restore pool; True if any was dispatched.

        When every slot is taken the rest stay in the spool (back-pressure) until a restore ends. The
        first call also takes requests a dead predecessor had claimed (see `serve_request`)."""
        busy = False
        paths = self.spool.pending_requests()
        if not self._recovered:
            paths = sp.claimed(self.spool.requests_dir) + paths
            self._recovered = True
        for path in paths:
            with self._lock:
                if path.name in self.in_progress:
                    continue
                self.in_progress.add(path.name)
            future = self.pool.try_submit(partial(self.serve_request, path))
            if future is None:
                with self._lock:
                    self.in_progress.discard(path.name)
                return busy  # the pool is full: restores ahead wait too
            future.add_done_callback(self._slot_freed)
            busy = True
        with self._lock:  # then restores ahead, while slots are free (try_submit never blocks)
            while self._ahead:
                future = self.pool.try_submit(partial(self._restore_ahead, self._ahead[0]))
                if future is None:
                    break
                future.add_done_callback(self._slot_freed)
                self._ahead.popleft()
                busy = True
        return busy

    def _slot_freed(self, _: Future[None]) -> None:
        """A restore ended: what waits in the spool or ahead may be dispatched now."""
        self.wake.notify()

    def serve_request(self, path: Path) -> None:
        """Answer one restore request (runtime/spool: the protocol). The files are placed in the store's
        dir only after the request is taken (renamed into requests/claimed/) while the JVM still waits:
        a request the JVM deleted (it gave up at restoreTimeout) is never merged, and gets no answer."""
        taken = path if path.parent.name == sp.CLAIMED_DIR else None
        try:
            try:
                req = sp.read_request(path)
            except FileNotFoundError:
                return  # the JVM gave up waiting and removed it
            except StateBackendError as e:
                log.error("bad restore request %s: %s", path, e)
                sp.quarantine(path)
                return
            started = time.monotonic()

            def may_place() -> str | None:  # [E4] take the request while the JVM still waits
                nonlocal taken
                assert isinstance(req, sp.RestoreRequest)  # only store restores place files
                late = self._too_late_to_place(req)
                if late is not None:
                    return late
                if taken is None:
                    taken = sp.claim(path)
                    if taken is None:
                        raise _Withdrawn()
                return None

            status: sp.RestoreStatus
            try:
                if isinstance(req, sp.PlanRequest):  # [C0] a batch's plan, before Spark publishes it
                    status, message = self.plans.serve(req)
                    files, nbytes = 0, 0
                elif isinstance(req, sp.CheckpointLocationRequest):
                    status, message, files, nbytes = self.prepare_checkpoint_location(req)
                else:
                    status, message, files, nbytes = self.restore(req, may_place=may_place)
                    if status == "restored":
                        self._drop_ahead(req)
            except _Withdrawn:
                assert isinstance(req, sp.RestoreRequest)
                log.warning(
                    "restore of query %s store %s version %s: the JVM stopped waiting (restoreTimeout) and "
                    "withdrew its request before the files were placed; nothing was merged into %s, "
                    "Spark's own files decide",
                    req.query_id,
                    req.instance.key,
                    req.version,
                    req.dfs_dir,
                )
                return
            except Exception as e:
                log.exception("request %s failed", path)
                status, message, files, nbytes = "error", f"{type(e).__name__}: {e}", 0, 0
            self.spool.write_response(  # [E5] the answer; the JVM lets Spark load
                sp.RestoreResponse(
                    request_id=req.request_id,
                    status=status,
                    message=message,
                    files=files,
                    bytes=nbytes,
                    duration_ms=int((time.monotonic() - started) * 1000),
                )
            )
            sp.remove(taken or path)
        finally:
            with self._lock:
                self.in_progress.discard(path.name)

    def prepare_checkpoint_location(
        self, req: sp.CheckpointLocationRequest
    ) -> tuple[sp.RestoreStatus, str, int, int]:
        """Serve a checkpoint-location request (runtime/spool): rebuild the driver's files of the query's
        latest durable checkpoint if needed. 'restored' with what was done, or 'error' saying why the
        query must not start; never starts a known query from scratch."""
        ahead = partial(self._queue_ahead, req) if req.restore_stores and req.mode == "start" else None
        outcome = restore_checkpoint_location(
            self.settings,
            str(req.checkpoint_root),
            mode=req.mode,
            store=self.store,
            checkpoint_log=self.log,
            on_rebuilt=ahead,
        )
        log.info("checkpoint location %s (%s): %s", req.checkpoint_root, req.mode, outcome)
        return "restored", outcome, 0, 0

    def _queue_ahead(
        self, req: sp.CheckpointLocationRequest, query_id: str, checkpoint: CheckpointV2, version: int
    ) -> None:
        """Queue every store of `checkpoint`, just restored into `req`'s location, to be restored ahead
        of its tasks at `version` (what the next batch loads: newer than the checkpoint's when the
        rebuild placed plans after it) (module doc), replacing what was queued for that location."""
        root = req.checkpoint_root
        jobs = []
        for key in sorted(checkpoint.markers(BLOBSTORE_BACKEND)):
            if key == DRIVER_STORE:
                continue
            try:
                inst = StoreInstance.parse(key)
                parts = inst.dir_parts()
            except ValueError:
                continue  # not one of Spark's store keys: the rebuild has logged it
            jobs.append(
                sp.RestoreRequest(
                    request_id=f"ahead-{uuid.uuid4()}",
                    query_id=query_id,
                    checkpoint_root=root,
                    dfs_dir=root.joinpath(*parts),
                    operator=inst.operator,
                    partition=inst.partition,
                    store=inst.store_name,
                    version=version,
                    spark_unique_id=None,
                    executor_id=req.executor_id,
                    created_at_ms=int(time.time() * 1000),
                )
            )
        with self._lock:
            self._ahead = deque(j for j in self._ahead if _location(j.checkpoint_root) != _location(root))
            self._ahead.extend(jobs)
        self.wake.notify()  # dispatched by the dispatch thread, which may be waiting
        log.info(
            "query %s: restoring the %d store(s) of checkpoint %s (version %d) into %s ahead of their tasks",
            query_id,
            len(jobs),
            checkpoint.checkpoint_id,
            version,
            root,
        )

    def _drop_ahead(self, req: sp.RestoreRequest) -> None:
        """A task's own request restored this store version: nothing left to do ahead for it."""
        done = (_location(req.checkpoint_root), req.instance, req.version)
        with self._lock:
            self._ahead = deque(
                j for j in self._ahead if (_location(j.checkpoint_root), j.instance, j.version) != done
            )

    def _restore_ahead(self, req: sp.RestoreRequest) -> None:
        """Restore one store ahead of its task (module doc). A failure is only a warning here: the
        task asks for the store itself when it loads it, and that restore reports its own error."""
        if self._closing:
            return
        try:
            status, message, _, _ = self.restore(req)
        except Exception as e:  # every path ends here: the task's own request is the fallback
            status, message = "error", f"{type(e).__name__}: {e}"
        if status != "restored":
            log.warning(
                "restore ahead of query %s store %s version %s into %s: %s %s; its task asks at its load",
                req.query_id,
                req.instance.key,
                req.version,
                req.dfs_dir,
                status,
                message,
            )

    def _too_late_to_place(self, req: sp.RestoreRequest) -> str | None:
        """Why the JVM may stop waiting for `req` any moment now (restoreTimeout since it wrote the
        request, less a margin), or None: files must then not be placed behind its back."""
        timeout = self.settings.restore_timeout_seconds
        margin = min(RESTORE_PLACE_MARGIN_SECONDS, timeout / 4)
        waited = time.time() - req.created_at_ms / 1000
        if waited <= timeout - margin:
            return None
        return (
            f"too late to place the restored files of store {req.instance.key} version "
            f"{req.version}: the JVM has waited {waited:.1f}s of its restoreTimeout ({timeout:.1f}s) and "
            f"loads Spark's own files then; nothing was merged into {req.dfs_dir}"
        )

    def find_marker(self, query_id: str, key: str, version: int | None) -> tuple[str | None, str]:
        """The blob-store marker of store `key` at state `version` (None: the latest checkpoint's),
        from the retained checkpoints (or an upload report: `_reported_marker`), or None and why not."""
        found, why = self._find_snapshot(query_id, key, version)
        return (None if found is None else found.marker), why

    def _find_snapshot(
        self, query_id: str, key: str, version: int | None
    ) -> tuple[VersionSnapshot | None, str]:
        """`find_marker`, with the checkpoint or report it was read from ([E2]; lifecycle/markers.py)."""
        return find_version_snapshot(self.store, self.log, query_id, key, version)

    def restore(
        self, req: sp.RestoreRequest, *, may_place: Callable[[], str | None] | None = None
    ) -> tuple[sp.RestoreStatus, str, int, int]:
        """Put `req.version` of its store back into `req.dfs_dir`; (status, message, files, bytes).

        'not_found' when no retained checkpoint holds that version or its SnapshotIndex is missing;
        'error' (naming the blob) when the index is corrupt or hostile or a file blob is missing or
        fails its checksum, or the local disk fails (full), or `may_place()` (asked once the files are
        ready, just before they are placed) gives a reason not to place them. In all these, and when
        `may_place` raises (which propagates), `req.dfs_dir` is left exactly as it was. `req.query_id`
        None: the query is resolved from the checkpoint root; `req.version` None: the latest
        checkpoint's version.

        Restores of one store instance run one at a time (they share its scratch dir: a second one
        would remove the first one's half-built copy as a leftover)."""
        query_id = req.query_id or self.resolve_query_id(req.checkpoint_root)
        if query_id is None:
            why = f"no query is known for checkpoint location {req.checkpoint_root}"
            log.error("restore store %s: %s", req.instance.key, why)
            return "not_found", why, 0, 0
        req = dataclasses.replace(req, query_id=query_id)
        key = req.instance.key
        lock_key = (_location(req.checkpoint_root), key)  # a restore ahead and the task's request meet
        with self._lock:
            lock = self._store_locks.setdefault(lock_key, threading.Lock())
        timeout = self.settings.restore_timeout_seconds
        if not lock.acquire(timeout=timeout):
            why = f"another restore of store {key} of {req.checkpoint_root} still runs after {timeout:.0f}s"
            log.error("restore query %s version %s: %s", req.query_id, req.version, why)
            return "error", why, 0, 0
        try:
            return self._restore_store(req, key, may_place)
        finally:
            lock.release()

    def _restore_store(
        self, req: sp.RestoreRequest, key: str, may_place: Callable[[], str | None] | None
    ) -> tuple[sp.RestoreStatus, str, int, int]:
        """`restore` with the store's restore lock held."""
        assert req.query_id is not None  # resolved by restore
        found, why = self._find_snapshot(req.query_id, key, req.version)  # [E2]
        if found is None:
            # version None comes from a task outside a micro-batch (state reader, offline repartition):
            # a store the latest checkpoint lacks is normally one that repartition creates empty, and
            # Spark fails loudly by itself if it must read a store that has no files.
            level = logging.WARNING if req.version is None else logging.ERROR
            log.log(level, "restore query %s store %s version %s: %s", req.query_id, key, req.version, why)
            return "not_found", why, 0, 0
        try:  # The marker is data, never an instruction: only a SnapshotIndex of this query and store.
            marker, index = load_version_snapshot(self.store, req.query_id, key, found)
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
            return status, why, 0, 0
        scratch_rel = ("_statebackend", "restore", key.replace("/", "_"))
        scratch = req.checkpoint_root.joinpath(*scratch_rel)
        try:
            # Neither the store's dir nor the scratch dir may lie behind a symlink planted under the
            # checkpoint location (common/nofollow.py): the restore would write, and its cleanup delete,
            # outside it.
            dfs_rel = relative_parts(req.checkpoint_root, req.dfs_dir)
            with DirTree(req.checkpoint_root) as tree:
                tree.check(dfs_rel)
                tree.dir_fd(scratch_rel[:-1], create=True)
        except UnsafePathError as e:
            why = f"restore of store {key} version {req.version} refused: {e}"
            log.error("restore query %s: %s; the store's dir is untouched", req.query_id, why)
            return "error", why, 0, 0
        try:
            # [E3] into the scratch dir (engine/ [R1]-[R6])
            result = self.restorer.restore(marker, scratch, reuse_dirs=[req.dfs_dir], index=index)
        except StateBackendError as e:  # missing / corrupt / hostile file blob, store failure
            # The snapshot the checkpoint names is unusable: say so, naming the blob, and leave the
            # store's dir untouched so the JVM falls back to Spark's own files (Spark fails loudly if
            # those are missing too; it never starts from empty state because of this).
            shutil.rmtree(scratch, ignore_errors=True)
            why = f"snapshot {marker} of store {key} version {req.version} is unusable: {e}"
            log.error("restore query %s: %s; Spark's own files decide", req.query_id, why)
            return "error", why, 0, 0
        except OSError as e:  # the local disk: full (ENOSPC), file size limit (EFBIG), permissions
            shutil.rmtree(scratch, ignore_errors=True)
            why = f"restore of store {key} version {req.version} from {marker} into {scratch.parent}: {e}"
            log.error("restore query %s: %s; the store's dir is untouched", req.query_id, why)
            return "error", why, 0, 0
        try:
            refusal = None if may_place is None else may_place()
            if refusal is not None:
                log.error("restore query %s: %s", req.query_id, refusal)
                return "error", refusal, 0, 0
            # [E5] placed (no symlink followed), the version's head file last
            moved = move_tree_into(scratch, req.checkpoint_root, dfs_rel, order=placing_order)
        except (UnsafePathError, OSError) as e:
            why = f"restore of store {key} version {req.version} from {marker} into {req.dfs_dir}: {e}"
            log.error("restore query %s: %s", req.query_id, why)
            return "error", why, 0, 0
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log.info(
            "restored query %s store %s version %s from %s: %d file(s), %d byte(s) downloaded, %d reused",
            req.query_id,
            key,
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


class _Withdrawn(Exception):
    """The JVM deleted its restore request (it stopped waiting) before the files were placed."""
