"""The committer ([C5]-[C6] of runtime/__init__.py, which states its protocol): turns finished
micro-batches into durable combined checkpoints. One per driver, driven by the driver sidecar's commit
loop (commit_loop.py). Beside the batches' checkpoints it checkpoints a batch again when Spark shortens
its recipe (upgrades.py) and runs the periodic TTL sweep (sweeper.py); its cleanup is cleanup.py,
what goes into a checkpoint checkpoint_build.py, the per-query numbers after one commit_metrics.py.

A committer starting on a query learns it from the log (query_start.py). Any other failure of one query
(the log or the store unreachable) is logged and retried at the next poll; it never stops the polls of
the other queries.

Zombies (SAMZA-2787: a paused old driver, a whole old application, an old attempt of the same one):
every writer of a query's shared state is fenced, by the rule whose one home is ownership.py (its
module doc); this committer feeds it every latest checkpoint it reads before a write and each one it
writes. A fenced write (CheckpointFencedError) raises, drops the query's pending batches and stops
this committer from ever committing the query again; if a newer writer got in after our write,
cleanup is skipped (cleanup.py).

Costs: each report and SnapshotIndex blob is read once (commit_reads.py); the `_driver` snapshot goes
up while the markers are checked; each checkpoint's log line states where its lag went (the steps of
checkpoint_build.Stages) and the CPU its thread has used so far."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

from ..checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    version_of_batch,
)
from ..checkpoints.logs import CheckpointFencedError, CheckpointLog
from ..common import crashpoints
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..lifecycle.gc import SweepReport
from ..lifecycle.locators import write_locator
from ..lifecycle.reports import Report
from ..lifecycle.retention import Retention
from ..stores import BlobStore
from .checkpoint_build import Stages, build_checkpoint, driver_snapshot, settled
from .checkpoint_lag import CheckpointLag
from .cleanup import Cleanup
from .commit_metrics import CommitMetrics
from .commit_reads import CommitReads
from .ownership import Ownership
from .progress import ProgressEvent
from .query_start import QueryStart
from .query_state import QueryState, instance_keys
from .sweeper import DEFAULT_SWEEP_INTERVAL_SECONDS, Sweeper
from .upgrades import Upgrades

log = logging.getLogger("spark_statebackend.commit")  # name kept from the flat layout


class Committer:
    """Writes one CheckpointV2 per completed batch ([C5]-[C6] of runtime/__init__.py). One per driver.

    Thread-safety: `submit` may be called from any thread; `poll` runs on one committer thread."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        pool: TransferPool,
        *,
        backup_config: BackupConfig | None = None,
        commit_timeout_seconds: float = 1800.0,
        retain_checkpoints: int = 1,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        on_done: Callable[[ProgressEvent], None] | None = None,
        sweep_interval_seconds: float = DEFAULT_SWEEP_INTERVAL_SECONDS,
        sweep_timeout_seconds: float = 600.0,
        app_id: str = "",
        spool_dir: Path | None = None,
        ownership: Ownership | None = None,
    ) -> None:
        """`on_done(event)` runs once a submitted batch is checkpointed, superseded or given up on: the
        sidecar then deletes its spool file, so a batch whose committer died is submitted again.
        `sweep_interval_seconds` <= 0 turns the periodic TTL sweep off (sweeper.py). `app_id` is this
        application attempt's identity (spool `app_identity`: the app id itself without attempts): only
        its own executors' marker reports are taken (module doc: zombies),
        and it is recorded as each checkpoint's writer. `spool_dir`: the driver's spool dir, where the
        `_driver` snapshot is staged (spark/location.py driver_staging_dir; None: a private temp dir).
        `ownership`: the sidecar process's (runtime/ownership.py; None: one of its own), fed with every
        latest checkpoint this committer reads before a write and with every checkpoint it writes."""
        self.app_id = app_id
        self.ownership = ownership or Ownership(app_id)
        self.spool_dir = spool_dir
        # What the shim's gate on Spark's commit log reads (checkpoint_lag.py): a query whose checkpoints
        # keep failing is held at its next batch's commit and fails after commitTimeout, naming the cause.
        self.lag = CheckpointLag(spool_dir, clock)
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.backup_config = backup_config or BackupConfig()
        self.commit_timeout = commit_timeout_seconds
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.on_done = on_done
        self._lock = threading.Lock()
        # query -> batch -> (event, when it was submitted)
        self._pending: dict[str, dict[int, tuple[ProgressEvent, float]]] = {}
        self._queries: dict[str, QueryState] = {}
        self.gauges = CommitMetrics(self.metrics)  # the per-query numbers after each checkpoint
        # Blobs written once under unique names and never changed, so read once (module doc: costs).
        self.reads = CommitReads(store, pool, app_id)
        self.fenced: set[str] = set()  # queries a newer writer took over: never committed again
        self.sweeper = Sweeper(
            store,
            checkpoint_log,
            clock=clock,
            interval_seconds=sweep_interval_seconds,
            timeout_seconds=sweep_timeout_seconds,
        )
        # K > 1: the last K checkpoints and their unshared blobs (lifecycle/retention.py); K = 1 is
        # cleanup's job.
        self.retention = (
            Retention(store, pool, retain_checkpoints, timeout_seconds=self.backup_config.timeout_seconds)
            if retain_checkpoints > 1
            else None
        )
        self.cleanup = Cleanup(store, checkpoint_log, retain_checkpoints, self.retention)
        self.upgrades = Upgrades(
            store, checkpoint_log, pool, app_id=app_id, metrics=self.metrics, cleanup=self.cleanup
        )
        self.starts = QueryStart(
            store,
            checkpoint_log,
            pool,
            backup_config=self.backup_config,
            metrics=self.metrics,
            retention=self.retention,
            upgrades=self.upgrades,
            cleanup=self.cleanup,
            clock=clock,
        )
        # The `_driver` snapshot of the batch being checkpointed, beside its marker checks (_poll_query).
        self._driver_files = ThreadPoolExecutor(1, thread_name_prefix="ssb-driver-files")

    def submit(self, event: ProgressEvent) -> None:
        """Queue a finished batch for checkpointing (ignored for a query this committer was fenced from)."""
        with self._lock:
            if event.query_id in self.fenced:
                log.error("query %s batch %d ignored: this driver was fenced", event.query_id, event.batch_id)
                return
            self._pending.setdefault(event.query_id, {})[event.batch_id] = (event, self.clock())

    def uploaded_here(self, query_id: str, report: Report, index: SnapshotIndex) -> None:
        """`report` was just written by this process's own upload loop (the driver's sidecar uploads
        the driver's stores, and with a local master every store), for `index`: the batch's poll takes
        both from here instead of fetching them (module doc: costs). Any thread."""
        with self._lock:
            if query_id not in self.fenced:
                self.reads.told(query_id, report, index)

    def pending(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._pending.values())

    def maybe_sweep(self) -> Future[SweepReport] | None:
        """Start the periodic TTL sweep if it is due (sweeper.py); never blocks. Call it from the
        committer thread."""
        return self.sweeper.maybe_sweep(has_query=bool(self._queries))

    def close(self, timeout: float = 30.0) -> None:
        """Wait (at most `timeout`) for a running sweep (Sweeper.close)."""
        self.sweeper.close(timeout)
        self._driver_files.shutdown(wait=False)  # a poll never returns before its snapshot did

    def _query(self, event: ProgressEvent) -> QueryState:
        """What is known of `event`'s query; the first time, learnt from the log (query_start.py)."""
        q = self._queries.get(event.query_id)
        if q is None:
            q = self.starts.start(event, partial(self._queries.__setitem__, event.query_id))
        return q

    def poll(self) -> int:
        """Try to commit every pending batch, oldest first; return how many were committed."""
        committed = 0
        with self._lock:
            queries = {q: dict(b) for q, b in self._pending.items()}
        fenced: CheckpointFencedError | None = None
        for query_id, batches in queries.items():
            try:
                committed += self._poll_query(query_id, batches)
            except CheckpointFencedError as e:
                fenced = e  # _fence ran; the other queries still get their turn
            except Exception as e:
                # One query's trouble (its log partition or blobs unreachable, a symlink in its location)
                # is retried at the next poll and never stalls the other queries' commits; from the first
                # failure the query lags, which holds its commits after maxCommitDelay.
                log.exception("query %s: commit attempt failed; retrying at the next poll", query_id)
                self.lag.not_checkpointed(query_id, f"{type(e).__name__}: {e}")
        self.lag.publish()
        if fenced is not None:
            raise fenced
        return committed

    def _poll_query(self, query_id: str, batches: Mapping[int, tuple[ProgressEvent, float]]) -> int:
        """Try each pending batch of `query_id`, oldest first; how many were checkpointed. Raises
        CheckpointFencedError once the query was fenced (`_fence` ran)."""
        committed = 0
        for batch_id in sorted(batches):
            event, seen_at = batches[batch_id]
            if not event.checkpoint_root.is_dir():
                # Deleted with its stopped query (Spark's temporary location, or the user's): its
                # snapshots were dropped (upload_loop.py), nothing is left to checkpoint or to hold.
                log.warning(
                    "query %s batch %d: checkpoint location %s no longer exists; the batch is not "
                    "checkpointed",
                    query_id,
                    batch_id,
                    event.checkpoint_root,
                )
                self._drop(query_id, batch_id)
                self.lag.forget(query_id)
                continue
            q = self._query(event)  # first time: learn what is committed already (a restarted committer)
            if batch_id <= q.committed:
                self._drop(query_id, batch_id)
                continue
            reports, needed = self.reads.batch_reports(q, event)
            if len(reports) >= needed:  # [C5] every store has reported
                if self._checkpoint_batch(q, event, reports, seen_at):
                    committed += 1
                    for older in [b for b in batches if b < batch_id]:
                        self._drop(query_id, older)
                    self.lag.checkpointed(query_id)
            elif self.clock() - seen_at > self.commit_timeout:
                self._give_up(event, len(reports), needed)
        return committed

    def _checkpoint_batch(
        self, q: QueryState, event: ProgressEvent, reports: Mapping[str, Report], seen_at: float
    ) -> bool:
        """[C5] checkpoint batch `event` (handed over at `seen_at`), whose every store reported, unless a
        marker is unusable (the batch is then dropped, logged); True if it was checkpointed. Raises
        CheckpointFencedError (after `_fence`) when another writer owns the query."""
        query_id, batch_id = event.query_id, event.batch_id
        stages = Stages(event, seen_at, self.clock)
        try:
            # A zombie learns it was fenced here, before it looks at the markers: from the log
            # (a Kafka writer's epoch) or from the writer of the latest checkpoint.
            self.log.acquire_writer(query_id)
            # The `_driver` snapshot needs nothing of the markers: it goes up while they are
            # checked, and is only named by the checkpoint if they pass.
            driver = self._driver_files.submit(driver_snapshot, q, event, self.spool_dir)
            try:
                problems = self._check_markers(q, query_id, version_of_batch(batch_id), reports)
            except BaseException:
                settled(driver)
                raise
            stages.mark("markers checked")
        except CheckpointFencedError as e:
            self._fence(query_id, batch_id, e)
            raise
        if problems:
            settled(driver)  # uploaded for nothing: unreferenced, it expires with its TTL
            # Never into a checkpoint: a marker naming a missing or foreign snapshot would make
            # the query unrestorable. The next batch's uploads get their own chance.
            log.error(
                "query %s batch %d: NOT checkpointed, unusable marker(s): %s",
                query_id,
                batch_id,
                "; ".join(problems),
            )
            self._drop(query_id, batch_id)
            self.lag.not_checkpointed(
                query_id, f"batch {batch_id}: unusable marker(s): {'; '.join(problems)}"
            )
            return False
        try:
            self._commit(q, event, reports, stages, driver)
        except CheckpointFencedError as e:
            self._fence(query_id, batch_id, e)
            raise
        return True

    def _give_up(self, event: ProgressEvent, reported: int, needed: int) -> None:
        """Batch `event` is not checkpointed: only `reported` of its `needed` stores reported within
        commitTimeout (logged, and the query's checkpoints lag)."""
        query_id, batch_id = event.query_id, event.batch_id
        log.error(
            "query %s batch %d: only %d of %d state store instances uploaded version %d within "
            "%.0fs; the batch is not checkpointed",
            query_id,
            batch_id,
            reported,
            needed,
            version_of_batch(batch_id),
            self.commit_timeout,
        )
        self._drop(query_id, batch_id)
        self.lag.not_checkpointed(
            query_id,
            f"batch {batch_id}: only {reported} of {needed} state store "
            f"instances uploaded version {version_of_batch(batch_id)} within commitTimeout",
        )

    def _check_markers(
        self, q: QueryState, query_id: str, version: int, reports: Mapping[str, Report]
    ) -> list[str]:
        """Why the reported markers of `version` must not go into a checkpoint (check_markers; empty:
        they may). Raises CheckpointFencedError if another application wrote the latest checkpoint
        after this one had checkpointed the query; store unreachable: raises, and the batch is tried
        again at the next poll."""
        latest = self.log.read_latest(query_id)
        self.ownership.saw(latest)  # raises ownership.Fenced, a CheckpointFencedError
        previous = latest.markers(BLOBSTORE_BACKEND) if latest is not None else {}
        return self.reads.check(q, query_id, version, reports, previous)

    def _commit(
        self,
        q: QueryState,
        event: ProgressEvent,
        reports: Mapping[str, Report],
        stages: Stages,
        driver: Future[dict[str, str]],
    ) -> None:
        """[C5] the checkpoint of batch `event` (every marker reported and checked, its `_driver`
        snapshot going up as `driver`), then [C6]. `stages`: when each step of it ended, for the log
        line of its lag."""
        qid = event.query_id
        driver_markers = driver.result()  # its failure fails this attempt, retried at the next poll
        stages.mark("driver files")
        checkpoint = build_checkpoint(
            q, event, reports, driver_markers, checkpoint_log=self.log, app_id=self.app_id
        )
        store_markers = {k: r.marker for k, r in reports.items()}
        checkpoint_id = checkpoint.checkpoint_id
        markers = dict(checkpoint.markers(BLOBSTORE_BACKEND))
        if not q.located:
            # Before the commit point, so that no checkpoint exists that a new host cannot find.
            write_locator(self.store, event.location, qid, event.query_name)
            q.located = True
            stages.mark("locator")
        crashpoints.crash_point(crashpoints.BEFORE_CHECKPOINT_WRITE)  # test-only; a no-op unless armed
        self.log.write(checkpoint)  # [C5] the commit point; raises CheckpointFencedError (see poll)
        stages.mark("log write")
        q.last_id = checkpoint_id
        self.reads.checkpointed(qid, event.batch_id, store_markers)
        self.ownership.wrote(checkpoint)
        q.store_keys = instance_keys(markers)
        q.committed = event.batch_id
        self._drop(qid, event.batch_id)
        lag = max(0.0, self.clock() - event.batch_end_ms / 1000)
        self.gauges.checkpoint_written(q, qid, checkpoint.query_name, event.batch_id, lag, reports)
        log.info(
            "query %s batch %d: checkpoint %s written with %d state marker(s); lag %.3fs (%s; commit "
            "thread cpu %.3fs)",
            qid,
            event.batch_id,
            checkpoint_id,
            len(markers),
            lag,
            stages,
            time.thread_time(),
        )
        crashpoints.crash_point(crashpoints.AFTER_CHECKPOINT_WRITE)  # test-only; a no-op unless armed
        if not self.cleanup.still_writer(qid, checkpoint_id, event.batch_id):
            return
        previous = q.last_markers
        q.last_markers = markers
        upgradable = self.upgrades.watched(qid) or checkpoint.changelog_checkpointing
        if checkpoint.changelog_checkpointing:
            self.upgrades.watch(checkpoint, {k: r.changelog for k, r in reports.items()}, self.clock())
        else:
            self.upgrades.forget(qid)
        self.cleanup.after_checkpoint(q.manager, checkpoint, previous, upgradable=upgradable)  # [C6]

    def _fence(self, query_id: str, batch_id: int, error: CheckpointFencedError) -> None:
        """A newer driver owns `query_id`: forget it for good (module doc: zombies), and tell the
        sidecar's Ownership (its plans of the query stop too)."""
        self.ownership.refused(query_id, str(error))  # a no-op after ownership.Fenced: it knows already
        log.error(
            "query %s batch %d: checkpoint NOT written, this driver was fenced by a newer one; it stops "
            "committing the query and deletes nothing: %s",
            query_id,
            batch_id,
            error,
        )
        with self._lock:
            self.fenced.add(query_id)
            self._pending.pop(query_id, None)
            self.reads.forget(query_id)
        self.lag.forget(query_id)

    def _drop(self, query_id: str, batch_id: int) -> None:
        with self._lock:
            self.reads.dropped(query_id, batch_id)
            item = self._pending.get(query_id, {}).pop(batch_id, None)
        if item is not None and self.on_done is not None:
            self.on_done(item[0])

    def maybe_refresh(self) -> int:
        """Checkpoint upgraded snapshots of the latest checkpoints' versions (Upgrades.refresh_due);
        returns how many checkpoints were written. Call it from the committer thread."""
        return self.upgrades.refresh_due(self.clock(), self.fenced, self._queries, self._newer, self._fence)

    def _newer(self, qid: str, batch_id: int) -> bool:
        with self._lock:  # the next batch's checkpoint replaces this one, with recipes of its own
            return any(b > batch_id for b in self._pending.get(qid, {}))
