"""Restoring ahead: the stores of a rebuilt checkpoint location restored before their tasks ask
([D5] of spark/__init__.py, then [E2]-[E5] of runtime/__init__.py); the restore loop
(restore_loop.py) queues them here and runs them on its own pool.

When the driver's JVM also runs the query's tasks (a local master: this sidecar serves
both) and the driver-side restore rebuilt the location from checkpoint N, every store of N is restored
at once (version N+1, what batch N+1 loads; version K when it placed plans up to batch K, from the
upload reports, [E2]), queued behind the tasks' own requests on the same pool,
instead of one by one as each task reaches its store. Spark's first batch computes its first stage
meanwhile, so the restore is off its critical path. It is safe without a waiting task because
(1) restores of one store take the same lock, so a task's request for a store being restored ahead
waits for it and then finds every file in place (reused, nothing copied); (2) a store's own files are
placed checksum side files first and the versions oldest first (store_restore.py `placing_order`), so
the file a task's load needs to find complete (the zip or changelog of version N+1) arrives last and the
JVM's check never passes on a half-placed store; (3) nothing is ever deleted from a store's dir. Where
executors have sidecars of their own (a cluster), each restores the stores it loads, on its own host.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from functools import partial

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointV2, StoreInstance
from ..engine.transfer import TransferPool
from . import spool as sp
from .spool.wake import Wake
from .store_restore import Outcome, location_key

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before


class RestoresAhead:
    """The stores waiting to be restored ahead of their tasks (module doc): at most one checkpoint's
    stores per location, run after the tasks' own requests whenever the pool has a free slot.
    Thread-safe."""

    def __init__(self, restore: Callable[[sp.RestoreRequest], Outcome], wake: Wake) -> None:
        """`restore(req)`: a store's restore, taking its lock (RestoreLoop.restore). `wake`: the
        dispatch thread's, notified when a restore ahead is queued or one ends."""
        self._restore = restore
        self._wake = wake
        self._lock = threading.Lock()
        self._queue: deque[sp.RestoreRequest] = deque()  # guarded by _lock
        self._closing = False

    def close(self) -> None:
        """Drop what is queued; restores ahead already handed to the pool return at once."""
        self._closing = True
        with self._lock:
            self._queue.clear()

    def queue(
        self, req: sp.CheckpointLocationRequest, query_id: str, checkpoint: CheckpointV2, version: int
    ) -> None:
        """Queue every store of `checkpoint`, just restored into `req`'s location, to be restored ahead
        of its tasks at `version` (what the next batch loads: newer than the checkpoint's when the
        rebuild placed plans after it), replacing what was queued for that location."""
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
            self._queue = deque(
                j for j in self._queue if location_key(j.checkpoint_root) != location_key(root)
            )
            self._queue.extend(jobs)
        self._wake.notify()  # dispatched by the dispatch thread, which may be waiting
        log.info(
            "query %s: restoring the %d store(s) of checkpoint %s (version %d) into %s ahead of their tasks",
            query_id,
            len(jobs),
            checkpoint.checkpoint_id,
            version,
            root,
        )

    def drop(self, req: sp.RestoreRequest) -> None:
        """A task's own request restored this store version: nothing left to do ahead for it."""
        done = (location_key(req.checkpoint_root), req.instance, req.version)
        with self._lock:
            self._queue = deque(
                j for j in self._queue if (location_key(j.checkpoint_root), j.instance, j.version) != done
            )

    def dispatch(self, pool: TransferPool) -> bool:
        """Hand queued restores to `pool` while it has free slots (never blocks); True if any was."""
        busy = False
        with self._lock:
            while self._queue:
                future = pool.try_submit(partial(self._run, self._queue[0]))
                if future is None:
                    break
                future.add_done_callback(lambda _: self._wake.notify())  # a slot came free
                self._queue.popleft()
                busy = True
        return busy

    def _run(self, req: sp.RestoreRequest) -> None:
        """Restore one store ahead of its task. A failure is only a warning here: the task asks for
        the store itself when it loads it, and that restore reports its own error."""
        if self._closing:
            return
        try:
            status, message, _, _ = self._restore(req)
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
