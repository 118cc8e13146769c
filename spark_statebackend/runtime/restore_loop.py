"""The sidecar's restore loop ([E2]-[E5] of runtime/__init__.py, and [D1] of spark/__init__.py): the
restore requests of one spool dir, dispatched, taken and answered. A store's restore itself (which
snapshot, built in a scratch dir, its files placed) is store_restore.py; restoring a rebuilt
location's stores before their tasks ask is restore_ahead.py.

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
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path

from ..checkpoints.logs import CheckpointLog
from ..engine.restore import RestoreManager
from ..engine.transfer import TransferPool
from ..errors import StateBackendError
from ..settings import Settings
from ..spark.driver_restore import restore_checkpoint_location
from ..stores import BlobStore
from . import spool as sp
from .ownership import Ownership
from .plan_store import PlanStore
from .restore_ahead import RestoresAhead
from .spool.wake import Wake
from .store_restore import Outcome, StoreRestorer, location_key

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before

RESTORE_WORKERS = 4  # restores run at once (each also uses the shared transfer pool)
RESTORE_QUEUE = 4  # restores queued behind them; more requests stay pending in the spool
#: A restore's files are placed only if the JVM still waits for at least this long (or a quarter of
#: restoreTimeout, if less): placing them is a few renames, far quicker.
RESTORE_PLACE_MARGIN_SECONDS = 2.0

_Request = sp.RestoreRequest | sp.CheckpointLocationRequest | sp.PlanRequest


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
        self.stores = StoreRestorer(store, checkpoint_log, restorer)
        self.resolve_query_id = resolve_query_id
        # Restores in flight are bounded (workers + queue); further requests wait in the spool.
        self.pool = TransferPool(RESTORE_WORKERS, name="ssb-restore", queue_size=RESTORE_QUEUE)
        self._recovered = False  # requests a dead predecessor had taken are served first, once
        self.in_progress: set[str] = set()  # request file names dispatched and not yet answered
        self._store_locks: dict[tuple[str, str], threading.Lock] = {}  # (real checkpoint root, store)
        self._lock = threading.Lock()
        # What the dispatch thread waits on (sidecar.py): new requests, and a slot coming free or a
        # restore ahead queued, either of which lets it dispatch what waits.
        self.wake = Wake()
        self.ahead = RestoresAhead(self.restore, self.wake)

    def close(self) -> None:
        self.ahead.close()  # restores ahead still queued return at once
        self.plans.close()  # a plan held by an outage is answered at once
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
        return self.ahead.dispatch(self.pool) or busy  # then restores ahead, while slots are free

    def _slot_freed(self, _: Future[None]) -> None:
        """A restore ended: what waits in the spool or ahead may be dispatched now."""
        self.wake.notify()

    def serve_request(self, path: Path) -> None:
        """Answer one restore request (runtime/spool: the protocol). The files are placed in the store's
        dir only after the request is taken (renamed into requests/claimed/) while the JVM still waits:
        a request the JVM deleted (it gave up at restoreTimeout) is never merged, and gets no answer."""
        try:
            try:
                req = sp.read_request(path)
            except FileNotFoundError:
                return  # the JVM gave up waiting and removed it
            except StateBackendError as e:
                log.error("bad restore request %s: %s", path, e)
                sp.quarantine(path)
                return
            self._answer(path, req)
        finally:
            with self._lock:
                self.in_progress.discard(path.name)

    def _answer(self, path: Path, req: _Request) -> None:
        """Serve request `req` read from `path` and write its response ([E5]), then remove it; a store
        restore the JVM withdrew before its files were placed gets none (logged)."""
        started = time.monotonic()
        taken = path if path.parent.name == sp.CLAIMED_DIR else None

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

        try:
            status, message, files, nbytes = self._serve(req, may_place)
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

    def _serve(self, req: _Request, may_place: Callable[[], str | None]) -> Outcome:
        """What request `req` is answered, by its kind: a plan ([C0]), a checkpoint location ([D1]) or
        a store's restore ([E2]-[E5])."""
        if isinstance(req, sp.PlanRequest):  # [C0] a batch's plan, before Spark publishes it
            status, message = self.plans.serve(req)
            return status, message, 0, 0
        if isinstance(req, sp.CheckpointLocationRequest):
            return self.prepare_checkpoint_location(req)
        outcome = self.restore(req, may_place=may_place)
        if outcome[0] == "restored":
            self.ahead.drop(req)
        return outcome

    def prepare_checkpoint_location(self, req: sp.CheckpointLocationRequest) -> Outcome:
        """Serve a checkpoint-location request (runtime/spool): rebuild the driver's files of the query's
        latest durable checkpoint if needed. 'restored' with what was done, or 'error' saying why the
        query must not start; never starts a known query from scratch."""
        ahead = partial(self.ahead.queue, req) if req.restore_stores and req.mode == "start" else None
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

    def restore(
        self, req: sp.RestoreRequest, *, may_place: Callable[[], str | None] | None = None
    ) -> Outcome:
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
        lock_key = (location_key(req.checkpoint_root), key)  # a restore ahead and the task's request meet
        with self._lock:
            lock = self._store_locks.setdefault(lock_key, threading.Lock())
        timeout = self.settings.restore_timeout_seconds
        if not lock.acquire(timeout=timeout):
            why = f"another restore of store {key} of {req.checkpoint_root} still runs after {timeout:.0f}s"
            log.error("restore query %s version %s: %s", req.query_id, req.version, why)
            return "error", why, 0, 0
        try:
            return self.stores.restore(req, may_place)
        finally:
            lock.release()


class _Withdrawn(Exception):
    """The JVM deleted its restore request (it stopped waiting) before the files were placed."""
