"""The committer's periodic TTL sweep: blobs nobody will ever reference, deleted once their TTL passed.

Uploads no checkpoint ever referenced (a batch that never completed, a query that never checkpointed)
and unconsumed reports carry `blobTtl`. Once its committer has a query, a Sweeper runs the sweep of
lifecycle/gc.py ([6] there: every expired blob of the whole store, except what a retained checkpoint
of any query in the log or a newest index references) every `interval_seconds`, the first one
min(interval, 10 min) after the committer's first query. `maybe_sweep` (called by the sidecar's commit
loop) only starts it: it runs on its own thread (`ssb-sweep`) with its own small transfer pool, one at
a time, each index read and delete bounded by `timeout_seconds`, so a slow listing never delays a
commit; a failed sweep is logged and tried again at the next interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait

from ..checkpoints.logs import CheckpointLog
from ..engine.transfer import TransferPool
from ..lifecycle.gc import GarbageCollector, SweepReport
from ..stores import BlobStore

log = logging.getLogger("spark_statebackend.commit")  # the committer's, as before

#: Default of `sweepInterval`: listing a whole store (and, on S3, reading every blob's tags) every
#: few hours costs little; orphans then outlive their TTL by at most this.
DEFAULT_SWEEP_INTERVAL_SECONDS = 6 * 3600.0
#: The first sweep of a committer waits at most this after its first query (a short-lived driver
#: sweeps too), at most the interval itself.
FIRST_SWEEP_DELAY_SECONDS = 600.0
SWEEP_WORKERS = 2  # index reads and deletes of a sweep: few, the commits own the main transfer pool


class Sweeper:
    """Runs the TTL sweep of one blob store every `interval_seconds` (module doc); <= 0: never."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        *,
        clock: Callable[[], float],
        interval_seconds: float,
        timeout_seconds: float,
    ) -> None:
        self.store = store
        self.log = checkpoint_log
        self.clock = clock
        self.interval = interval_seconds
        self.timeout = timeout_seconds
        self._next_sweep_at: float | None = None
        self._sweep: Future[SweepReport] | None = None

    def maybe_sweep(self, has_query: bool) -> Future[SweepReport] | None:
        """Start the sweep if it is due and none is running; never blocks. `has_query`: the committer
        has a query (an executor sidecar's committer never has one, and never sweeps). Returns the
        future of the sweep started now (completed on every path), else None."""
        if self.interval <= 0 or not has_query:
            return None  # off, or no query yet
        now = self.clock()
        if self._next_sweep_at is None:
            self._next_sweep_at = now + min(self.interval, FIRST_SWEEP_DELAY_SECONDS)
        if now < self._next_sweep_at or (self._sweep is not None and not self._sweep.done()):
            return None
        self._next_sweep_at = now + self.interval
        future: Future[SweepReport] = Future()
        self._sweep = future
        threading.Thread(target=self._run, args=(future,), name="ssb-sweep", daemon=True).start()
        return future

    def _run(self, future: Future[SweepReport]) -> None:
        future.set_running_or_notify_cancel()
        try:
            with TransferPool(SWEEP_WORKERS, name="ssb-sweep-io") as pool:
                report = GarbageCollector(
                    self.store, self.log, pool, clock=self.clock, timeout_seconds=self.timeout
                ).sweep()
        except BaseException as e:
            log.exception("TTL sweep of %s failed; tried again in %.0fs", self.store.url, self.interval)
            future.set_exception(e)
            return
        for problem in report.problems:
            log.error("TTL sweep of %s: %s", self.store.url, problem)
        future.set_result(report)

    def close(self, timeout: float = 30.0) -> None:
        """Wait (at most `timeout`) for a running sweep. One still running is abandoned with a warning:
        its thread is a daemon, and a sweep deletes only expired unreferenced blobs, so stopping it
        anywhere is safe."""
        sweep = self._sweep
        if sweep is None:
            return
        done, _ = wait([sweep], timeout=timeout)
        if not done:
            log.warning(
                "TTL sweep of %s still running after %.0fs at close; abandoned", self.store.url, timeout
            )
