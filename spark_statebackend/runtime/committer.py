"""The committer ([C5]-[C6] of runtime/__init__.py, which states its protocol): turns finished
micro-batches into durable combined checkpoints. One per driver, driven by the driver sidecar's commit
loop (commit_loop.py). Beside the batches' checkpoints it checkpoints a batch again when Spark shortens
its recipe (upgrades.py) and runs the periodic TTL sweep (sweeper.py); its cleanup is cleanup.py.

A committer starting on a query (e.g. its sidecar restarted after a kill -9) fences earlier writers,
re-runs the cleanup of the query's latest checkpoint and counts that batch as committed, so a crash
between the write and the end of its cleanup leaves neither TTLs on referenced blobs nor replaced
blobs behind. An unusable marker in that latest checkpoint (hostile or foreign blob id, missing or
corrupt SnapshotIndex; lifecycle/markers.py) is data, never an instruction: the committer logs an
ERROR naming the query, the checkpoint, the store and the marker, skips that store's cleanup (nothing
the marker names is deleted, made permanent or used as a diff base: a bad `_driver` marker makes the
next `_driver` snapshot a full upload) and goes on committing the query's next batches, whose markers
come from fresh uploads, so the next checkpoint supersedes the bad one. Blobs only the bad checkpoint
kept are left to their TTL and `gc`. Any other failure of one query (the log or the store unreachable)
is logged and retried at the next poll; it never stops the polls of the other queries.

Zombies (SAMZA-2787: a paused old driver waking up beside a new one, a whole old application, or an
old attempt of the same application, whose executors YARN may leave running beside the next attempt's):
every writer of a query's shared state is fenced. An application is told apart by its identity, its
app id plus its attempt if it has one (runtime/spool `app_identity`). Marker reports carry the
identity of the sidecar that wrote them and a committer takes only its own identity's; every marker is
checked before the write (its SnapshotIndex loads, is of this query, store and version, and every file
it added since the store's checkpointed snapshot exists); each checkpoint records its writer's
identity, and a committer (or sidecar) of an application that had checkpointed a query and then sees a
checkpoint written by another identity (another application, or another attempt) stops for good (the
sidecar uploads nothing more for that query and counts its snapshots as lag, so that application's
commits block, and its driver sidecar stores no more plans of it). That rule, and what the sidecar
process knows of it, live in one place (ownership.py), which this committer feeds. A fenced write
(CheckpointFencedError) raises, drops the query's pending batches and stops this committer from ever
committing the query again; if a newer writer got in after our write, cleanup is skipped
(cleanup.py).

Costs: a batch's reports are listed at every poll while it waits for them, but each report blob is
fetched once (they are written once under unique names), and not at all when this sidecar's own upload
loop wrote it (`uploaded_here`: the driver's stores, and with a local master all of them); the
SnapshotIndexes of the previous checkpoint's markers, which `check_markers` diffs each new snapshot
against, are not fetched again when this committer checked them itself, nor a new marker's index
uploaded here (only its blob's existence is asked); when this sidecar wrote every report of a batch
(a local master) the reports are not even listed. The `_driver` snapshot goes up while the markers
are checked. Each checkpoint's log line states where its lag
went: from the batch's end to its progress being handed over, every store reported, the markers
checked, the `_driver` files uploaded and the log written; and the CPU its thread has used so far."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
    version_of_batch,
)
from ..checkpoints.logs import CheckpointFencedError, CheckpointLog
from ..common import crashpoints
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig, BackupManager
from ..engine.blobs import SnapshotOwner
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..lifecycle.gc import SweepReport
from ..lifecycle.locators import write_locator
from ..lifecycle.markers import check_markers, load_checkpoint_indexes
from ..lifecycle.reports import Report, read_reports
from ..lifecycle.retention import Retention
from ..spark.location import driver_staging_dir, stage_driver_files
from ..stores import BlobStore
from .checkpoint_lag import CheckpointLag
from .cleanup import Cleanup
from .ownership import Ownership
from .progress import ProgressEvent
from .query_state import QueryState, instance_keys
from .sweeper import DEFAULT_SWEEP_INTERVAL_SECONDS, Sweeper
from .upgrades import Upgrades, UpgradeWindow

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
        # Blobs written once under unique names and never changed, so read once (module doc: costs):
        # the reports of each pending batch read so far, and per query the SnapshotIndexes of the
        # markers it checked last (the next batch's diff against them needs no fetch).
        self._reports: dict[tuple[str, int], dict[str, Report]] = {}
        self._indexes: dict[str, dict[str, SnapshotIndex]] = {}
        self._restore_rate = 0.0  # bytes/s of the newest restore its executors measured (0: none)
        self._upload_rate = 0.0
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
            if query_id in self.fenced:
                return
            self._reports.setdefault((query_id, report.version - 1), {})[report.blob_id] = report
            self._indexes.setdefault(query_id, {})[report.marker] = index

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
        """What is known of `event`'s query; the first time, learnt from the log (module doc: a
        committer starting on a query)."""
        q = self._queries.get(event.query_id)
        if q is not None:
            return q
        owner = SnapshotOwner(event.query_id, event.query_name)
        q = QueryState(
            BackupManager(self.store, self.pool, owner=owner, config=self.backup_config, metrics=self.metrics)
        )
        self.log.acquire_writer(event.query_id)  # fence earlier drivers before anything is read
        latest = self.log.read_latest(event.query_id)
        if self.retention is not None:
            history = self.log.read_history(event.query_id)
            self.retention.seed(
                event.query_id, [(str(c.checkpoint_id), c.markers(BLOBSTORE_BACKEND)) for c in history]
            )
        if latest is not None:
            q.last_id = latest.checkpoint_id
            q.last_markers = dict(latest.markers(BLOBSTORE_BACKEND))
            if latest.changelog_checkpointing:
                changelog = dict.fromkeys(latest.markers(BLOBSTORE_BACKEND), True)
                self.upgrades.watch(latest, changelog, self.clock())
            q.repartitioned_at = latest.repartitioned_at_batch
            q.store_keys = instance_keys(latest.markers(BLOBSTORE_BACKEND))
            q.name = latest.query_name
            q.committed = latest.batch_id
            driver = load_checkpoint_indexes(self.store, latest, stores=[DRIVER_STORE])
            for e in driver.unusable.values():
                log.error("%s; the next %s snapshot is uploaded in full", e, DRIVER_STORE)
            if DRIVER_STORE in driver.usable:
                q.manager.set_base(DRIVER_STORE, driver.usable[DRIVER_STORE])
        self._queries[event.query_id] = q
        if latest is not None:
            self.cleanup.at_start(latest, q.manager)
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
            reports = self._read_reports(query_id, batch_id, event.state_store_instances)
            if len(reports) >= event.state_store_instances:  # [C5] every store has reported
                stages = _Stages(event, seen_at, self.clock)
                try:
                    # A zombie learns it was fenced here, before it looks at the markers: from the log
                    # (a Kafka writer's epoch) or from the writer of the latest checkpoint.
                    self.log.acquire_writer(query_id)
                    # The `_driver` snapshot needs nothing of the markers: it goes up while they are
                    # checked, and is only named by the checkpoint if they pass.
                    driver = self._driver_files.submit(self._driver_snapshot, q, event)
                    try:
                        problems = self._check_markers(q, query_id, version_of_batch(batch_id), reports)
                    except BaseException:
                        _settled(driver)
                        raise
                    stages.mark("markers checked")
                except CheckpointFencedError as e:
                    self._fence(query_id, batch_id, e)
                    raise
                if problems:
                    _settled(driver)  # uploaded for nothing: unreferenced, it expires with its TTL
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
                    continue
                try:
                    self._commit(q, event, reports, stages, driver)
                except CheckpointFencedError as e:
                    self._fence(query_id, batch_id, e)
                    raise
                committed += 1
                for older in [b for b in batches if b < batch_id]:
                    self._drop(query_id, older)
                self.lag.checkpointed(query_id)
                continue
            if self.clock() - seen_at > self.commit_timeout:
                log.error(
                    "query %s batch %d: only %d of %d state store instances uploaded version %d within "
                    "%.0fs; the batch is not checkpointed",
                    query_id,
                    batch_id,
                    len(reports),
                    event.state_store_instances,
                    version_of_batch(batch_id),
                    self.commit_timeout,
                )
                self._drop(query_id, batch_id)
                self.lag.not_checkpointed(
                    query_id,
                    f"batch {batch_id}: only {len(reports)} of {event.state_store_instances} state store "
                    f"instances uploaded version {version_of_batch(batch_id)} within commitTimeout",
                )
        return committed

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
        with self._lock:
            known = dict(self._indexes.get(query_id, {}))  # the upload loop may add to the original
        problems, q.bytes = check_markers(
            self.store, self.pool, query_id, version, reports, previous, known=known
        )
        with self._lock:
            self._indexes.setdefault(query_id, {}).update(known)  # with the ones it loaded
        for report in reports.values():
            if report.marker in known:  # checked: the cleanup after its checkpoint needs no fetch
                q.manager.remember_index(report.marker, known[report.marker])
        return problems

    def _driver_snapshot(self, q: QueryState, event: ProgressEvent) -> dict[str, str]:
        """[C5] the `_driver` snapshot's marker: what a driver on a new host rebuilds the checkpoint
        location from. None for a remote location (`ProgressEvent.remote_location`): it is durable
        itself, Spark's metadata stays there and nothing rebuilds it (spark/ [D1])."""
        if event.remote_location:
            return {}
        staging = driver_staging_dir(self.spool_dir)  # never the location: it may be deleted at stop
        with tempfile.TemporaryDirectory(prefix=".driver-", dir=staging) as tmp:
            stage_driver_files(event.checkpoint_root, event.batch_id, Path(tmp))
            cp_label = f"b{event.batch_id:012d}"
            return q.manager.upload(
                cp_label, {DRIVER_STORE: Path(tmp)}, versions={DRIVER_STORE: event.batch_id}
            )

    def _commit(
        self,
        q: QueryState,
        event: ProgressEvent,
        reports: Mapping[str, Report],
        stages: _Stages,
        driver: Future[dict[str, str]],
    ) -> None:
        """[C5] the checkpoint of batch `event` (every marker reported and checked, its `_driver`
        snapshot going up as `driver`), then [C6]. `stages`: when each step of it ended, for the log
        line of its lag."""
        qid = event.query_id
        store_markers = {k: r.marker for k, r in reports.items()}
        input_offsets: Mapping[str, str] = event.input_offsets
        if event.offline:
            # Offline repartition re-plans no input: its batch has the offsets of the batch before it.
            prev = self.log.read_latest(qid)
            input_offsets = prev.input_offsets if prev is not None else {}
            q.repartitioned_at = event.batch_id
        elif q.partitioning_changed(event.query_id, event.batch_id, store_markers):
            q.repartitioned_at = event.batch_id
        driver_marker = driver.result()  # its failure fails this attempt, retried at the next poll
        stages.mark("driver files")
        markers = {**store_markers, **driver_marker}
        checkpoint_id = CheckpointId.create(event.batch_id, after=q.last_id)
        checkpoint = CheckpointV2(
            checkpoint_id=checkpoint_id,
            query_id=qid,
            query_name=event.query_name or q.name,
            input_offsets=input_offsets,
            state_checkpoint_markers={BLOBSTORE_BACKEND: markers},
            changelog_checkpointing=any(r.changelog for r in reports.values()),
            repartitioned_at_batch=q.repartitioned_at,
            writer_app_id=self.app_id,
        )
        if not q.located:
            # Before the commit point, so that no checkpoint exists that a new host cannot find.
            write_locator(self.store, event.location, qid, event.query_name)
            q.located = True
            stages.mark("locator")
        crashpoints.crash_point(crashpoints.BEFORE_CHECKPOINT_WRITE)  # test-only; a no-op unless armed
        self.log.write(checkpoint)  # [C5] the commit point; raises CheckpointFencedError (see poll)
        stages.mark("log write")
        q.last_id = checkpoint_id
        self._forget_older(qid, event.batch_id, store_markers)
        self.ownership.wrote(checkpoint)
        q.store_keys = instance_keys(store_markers)
        q.committed = event.batch_id
        self._drop(qid, event.batch_id)
        lag = max(0.0, self.clock() - event.batch_end_ms / 1000)
        self.metrics.name_query(qid, checkpoint.query_name)
        self.metrics.checkpoint_lag.labels(qid).observe(lag)
        self.metrics.checkpoints_written.labels(qid).inc()
        self._query_metrics(q, qid, event.batch_id, lag, reports)
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
        q.last_markers = dict(markers)
        upgradable = self.upgrades.watched(qid) or checkpoint.changelog_checkpointing
        if checkpoint.changelog_checkpointing:
            self.upgrades.watch(checkpoint, {k: r.changelog for k, r in reports.items()}, self.clock())
        else:
            self.upgrades.forget(qid)
        self.cleanup.after_checkpoint(q.manager, checkpoint, previous, upgradable=upgradable)  # [C6]

    def _query_metrics(
        self, q: QueryState, qid: str, batch_id: int, lag: float, reports: Mapping[str, Report]
    ) -> None:
        """The per-query gauges a user watches (common/metrics.py), after checkpoint `batch_id` is durable."""
        m = self.metrics
        m.last_durable_batch.labels(qid).set(batch_id)
        m.last_checkpoint_lag.labels(qid).set(lag)
        restore = max((r.restore_rate for r in reports.values()), default=0.0)
        upload = max((r.upload_rate for r in reports.values()), default=0.0)
        own = m.last_restore_rate  # a plain attribute: collecting the registry here cost O(stores)
        self._restore_rate = max(restore, own) or self._restore_rate
        self._upload_rate = upload or self._upload_rate
        m.checkpoint_bytes.labels(qid).set(q.bytes)
        rate = self._restore_rate or self._upload_rate
        m.predicted_restore_seconds.labels(qid).set(q.bytes / rate if rate > 0 else -1.0)

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
            self._indexes.pop(query_id, None)
            for key in [k for k in self._reports if k[0] == query_id]:
                del self._reports[key]
        self.lag.forget(query_id)

    def _read_reports(self, query_id: str, batch_id: int, instances: int) -> dict[str, Report]:
        """The newest report of each store instance of `batch_id` (lifecycle/reports.py). When this
        sidecar's own upload loop wrote one for every instance (a local master: all of them run here),
        those are the batch's, and the store is not listed: no other process of this application
        uploads its stores, and another application's reports are never taken anyway."""
        if not instances:
            return {}
        cache = self._reports_of(query_id, batch_id)
        newest: dict[str, Report] = {}
        for report in list(cache.values()):
            if report.app_id == self.app_id and (
                report.store not in newest or report.created_ns > newest[report.store].created_ns
            ):
                newest[report.store] = report
        if len(newest) >= instances:
            return newest
        version = version_of_batch(batch_id)
        return read_reports(self.store, query_id, version, app_id=self.app_id, cache=cache)

    def _reports_of(self, query_id: str, batch_id: int) -> dict[str, Report]:
        with self._lock:
            return self._reports.setdefault((query_id, batch_id), {})

    def _forget_older(self, query_id: str, batch_id: int, markers: Mapping[str, str]) -> None:
        """Checkpoint `batch_id` of `query_id` was written with `markers`: of the indexes known, keep
        its own (the next batch's `previous`) and those of later versions (uploaded meanwhile), and
        forget the reports of it and of every batch before it."""
        current = set(markers.values())
        with self._lock:
            known = self._indexes.get(query_id, {})
            self._indexes[query_id] = {
                m: i
                for m, i in known.items()
                if m in current or (i.metadata.version or 0) > version_of_batch(batch_id)
            }
            for key in [k for k in self._reports if k[0] == query_id and k[1] <= batch_id]:
                del self._reports[key]

    def _drop(self, query_id: str, batch_id: int) -> None:
        with self._lock:
            self._reports.pop((query_id, batch_id), None)
            item = self._pending.get(query_id, {}).pop(batch_id, None)
        if item is not None and self.on_done is not None:
            self.on_done(item[0])

    def maybe_refresh(self) -> int:
        """Checkpoint upgraded snapshots of the latest checkpoints' versions (upgrades.py); returns how
        many checkpoints were written. Cheap when no look is due; call it from the committer thread. A
        failure is logged and retried at the next look."""
        written = 0
        for qid, up in self.upgrades.due(self.clock(), self.fenced):
            try:
                written += self._refresh(qid, up)
            except CheckpointFencedError as e:
                self._fence(qid, up.checkpoint.batch_id, e)
                self.upgrades.forget(qid)
            except Exception:
                log.exception(
                    "query %s batch %d: looking for upgraded snapshots failed", qid, up.checkpoint.batch_id
                )
        return written

    def _refresh(self, qid: str, up: UpgradeWindow) -> int:
        with self._lock:
            if any(b > up.checkpoint.batch_id for b in self._pending.get(qid, {})):
                return 0  # the next batch's checkpoint replaces this one, with recipes of its own
        return self.upgrades.refresh(up, self._queries[qid])


def _settled(future: Future[dict[str, str]]) -> None:
    """Wait for a `_driver` snapshot no checkpoint will name (its batch was not checkpointed): the
    next one must not upload beside it. Its failure is the next attempt's to see."""
    try:
        future.result()
    except Exception:
        log.debug("a _driver snapshot no checkpoint names failed", exc_info=True)


class _Stages:
    """When each step of one checkpoint ended, from its batch's end (Spark's progress: timestamp +
    batchDuration), as its log line states them: where a checkpoint's lag goes."""

    def __init__(self, event: ProgressEvent, seen_at: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._end = event.batch_end_ms / 1000
        self._marks: list[tuple[str, float]] = [("progress handed over", seen_at), ("reported", clock())]

    def mark(self, step: str) -> None:
        """`step` ended now."""
        self._marks.append((step, self._clock()))

    def __str__(self) -> str:
        return ", ".join(f"{step} +{at - self._end:.3f}s" for step, at in self._marks)
