"""The committer: turns finished micro-batches into durable combined checkpoints (driver side).

For each query, batch N's progress (from the JVM listener, see `ProgressEvent`) gives the input
offsets and how many state store instances commit version N+1. Then:

  [1] wait until every store instance has reported its marker for version N+1 (markers.py), or a
      later batch completes first (N is then skipped: its versions were superseded), or the commit
      timeout passes (an error; the batch stays uncheckpointed and the next one is tried);
  [2] snapshot the driver-side files of the checkpoint location (metadata, sources, the last two
      offsets/commits entries, operator metadata and schemas) as the pseudo store `_driver`, so a
      driver on a new host can rebuild its checkpoint location;
  [3] write CheckpointV2(N) - offsets and every marker - to the checkpoint log, atomically, as one
      record. This is the commit point: before it nothing is deleted, so a crash anywhere up to
      here leaves the previous checkpoint whole;
  [4] clean up: remove the TTL of every blob the new snapshots reference, delete blobs of files
      removed since the previous snapshots and the previous SnapshotIndex blobs, delete the marker
      reports of versions <= N+1, apply checkpoint retention. With retainCheckpoints K > 1, cleanup
      deletes nothing itself; after the log's retain(), retention.py deletes the blobs referenced
      only by checkpoints that fell out of the last K (module doc there: what K means per log kind).

A cleanup failure is logged and retried with the next checkpoint's cleanup (the TTL keeps referenced
blobs safe for `blobTtl`, far longer than a commit interval); it never un-commits anything.

Upgrades (changelog checkpointing): Spark commits version v by writing its changelog and uploads
snapshots later, on its maintenance thread, so a checkpointed recipe (snapshot s plus changelogs
s+1..v) can become longer than what Spark itself would replay from its own files once it has
published a newer snapshot (up to v itself). The shim then stages version v again with the shorter
recipe and the sidecar uploads it, diffed against its previous upload of the store, as an upgrade
report of version v (markers.py: upgrades/, never taken by a batch's own commit). While batch N = v-1
is the query's latest checkpoint and no newer batch is pending, `maybe_refresh` (called by the
sidecar's commit loop) reads those reports, for at most REFRESH_WINDOW_SECONDS after the checkpoint,
polling with a backoff: for each store it follows the upgrades of version v from the checkpointed
marker (an upgrade's SnapshotIndex diffs against the checkpointed one, or against an earlier upgrade
that does), and the last one replaces the store's marker in a new checkpoint of batch N (same
offsets, a new checkpoint id), written, fenced and cleaned up like any other; the reports it read are
deleted. So a restore never replays more changelogs than Spark would after a restart from its own
files, once the upload of Spark's newest snapshot has landed.

TTL sweep: uploads no checkpoint ever referenced (a batch that never completed, a query that never
checkpointed) and unconsumed reports carry `blobTtl`; once a committer has a query it also runs the
sweep of gc.py ([6]: every expired blob of the whole store, except what a retained checkpoint of any
query in the log or a newest index references) every `sweep_interval_seconds`, the first one
min(interval, 10 min) after its first query. `maybe_sweep` (called by the sidecar's commit loop)
only starts it: it runs on its own thread (`ssb-sweep`) with its own small transfer pool, one at a
time, each index read and delete bounded by `sweep_timeout_seconds`, so a slow listing never
delays a commit; a failed sweep is logged and tried again at the next interval.
A committer starting on a query (e.g. its sidecar restarted after a kill -9) first re-runs [4] for
the query's latest checkpoint and counts that batch as committed, so a crash between [3] and the end
of [4] leaves neither TTLs on referenced blobs nor replaced blobs behind.

An unusable marker in that latest checkpoint (hostile or foreign blob id, missing or corrupt
SnapshotIndex; `load_marker_index`) is data, never an instruction: the committer logs an ERROR naming
the query, the checkpoint, the store and the marker, skips that store's cleanup (nothing the marker
names is deleted, made permanent or used as a diff base: a bad `_driver` marker makes the next
`_driver` snapshot a full upload) and goes on committing the query's next batches, whose markers come
from fresh uploads, so the next checkpoint supersedes the bad one. Blobs only the bad checkpoint kept
are left to their TTL and `gc`. Any other failure of one query (the log or the store unreachable) is
logged and retried at the next poll; it never stops the polls of the other queries.

Zombies (SAMZA-2787: a paused old driver waking up beside a new one, or a whole old application):
every writer of a query's shared state is fenced. Marker reports carry the Spark application id of
the sidecar that wrote them and a committer takes only its own application's ([1]); before [3] every
marker is checked (`_check_markers`: its SnapshotIndex loads, is of this query, store and version,
and every file it added since the store's checkpointed snapshot exists); each checkpoint records its
writer's application id, and a committer (or sidecar) of an application that had checkpointed a
query and then sees a checkpoint written by another application stops for good (the sidecar uploads
nothing more for that query and counts its snapshots as lag, so that application's commits block).
Cleanup deletes blobs, so it runs only when [3] succeeded AND the log's latest checkpoint is the one
just written. A fenced write (CheckpointFencedError) raises, drops the query's pending batches and
stops this committer from ever committing the query again. If the latest checkpoint is not ours (a
newer writer got in after our write), [4] is skipped entirely and an error logged: the newer writer
owns cleanup now. Between that check and the deletes a newer writer can still write, but it started
from our checkpoint (it fences before it reads the latest), so it references only blobs of our
checkpoint's snapshots (which [4] never deletes) and blobs it uploaded itself.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ..checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
    check_query_id,
)
from ..checkpoints.logs import CheckpointFencedError, CheckpointLog
from ..checkpoints.reports import Report, delete_reports, read_reports, read_upgrades, write_locator
from ..checkpoints.retention import Retention
from ..common import crashpoints
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig, BackupManager, SnapshotOwner, indexes_prefix, load_snapshot_index
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import BlobNotFoundError, CorruptIndexError, StateBackendError
from ..spark.location import driver_staging_dir, stage_driver_files, state_instances
from ..stores import BlobStore

if TYPE_CHECKING:
    from ..checkpoints.gc import SweepReport

log = logging.getLogger("spark_statebackend.commit")  # name kept from the flat layout

#: Default of `sweepInterval`: listing a whole store (and, on S3, reading every blob's tags) every
#: few hours costs little; orphans then outlive their TTL by at most this.
DEFAULT_SWEEP_INTERVAL_SECONDS = 6 * 3600.0
#: The first sweep of a committer waits at most this after its first query (a short-lived driver
#: sweeps too), at most the interval itself.
FIRST_SWEEP_DELAY_SECONDS = 600.0
SWEEP_WORKERS = 2  # index reads and deletes of a sweep: few, the commits own the main transfer pool
#: How long after a changelog-mode checkpoint the committer looks for upgraded snapshots of its version
#: (module doc: Spark's maintenance thread uploads a snapshot within a maintenance interval, 60 s by
#: default), and the first and longest gap between two looks.
REFRESH_WINDOW_SECONDS = 600.0
REFRESH_FIRST_POLL_SECONDS = 0.25
REFRESH_MAX_POLL_SECONDS = 10.0


@dataclass
class _Upgradable:
    """A changelog-mode checkpoint whose snapshots Spark may still shorten (module doc: upgrades)."""

    checkpoint: CheckpointV2
    changelog: dict[str, bool]  # store -> its checkpointed snapshot replays changelogs
    until: float
    next_poll: float
    gap: float = REFRESH_FIRST_POLL_SECONDS


@dataclass(frozen=True)
class ProgressEvent:
    """What the JVM listener reports for one finished micro-batch of one query."""

    query_id: str
    query_name: str
    checkpoint_root: Path
    batch_id: int
    input_offsets: Mapping[str, str]
    state_store_instances: int
    batch_end_ms: int
    raw: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the spool file it came from: removed once the batch is checkpointed or dropped
    #: A batch written by offline state repartition (no query ran it): its offsets are the previous
    #: checkpoint's, and it starts a new partitioning (CheckpointV2.repartitioned_at_batch).
    offline: bool = False

    @staticmethod
    def offline_commit(doc: Mapping[str, Any], source: str) -> ProgressEvent:
        """Build from an `offline_commit` spool document (spool.py): `commits/<batch>` was written
        while no query ran on the checkpoint root, i.e. by offline state repartition. The number of
        store instances of the new partitioning is read from the checkpoint root (`state_instances`).
        Raises StateBackendError naming `source` for anything malformed."""
        try:
            root = str(doc["checkpoint_root"])
            if not os.path.isabs(root) or "\x00" in root:
                raise ValueError(f"checkpoint_root {root!r} is not an absolute path")
            query_id = check_query_id(doc["query_id"])
            batch_id = doc["batch_id"]
            if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
                raise ValueError(f"batch_id {batch_id!r} must be an integer >= 0")
            return ProgressEvent(
                query_id=query_id,
                query_name="",
                checkpoint_root=Path(root),
                batch_id=batch_id,
                input_offsets={},
                state_store_instances=state_instances(Path(root), batch_id),
                batch_end_ms=int(time.time() * 1000),
                raw=doc,
                source=source,
                offline=True,
            )
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise StateBackendError(f"malformed offline commit {source}: {e!r}") from None

    @staticmethod
    def from_progress_json(progress: Mapping[str, Any], checkpoint_root: str, source: str) -> ProgressEvent:
        """Build from a StreamingQueryProgress as JSON (`progress.json()` in Spark).

        Raises StateBackendError naming `source` for anything malformed or hostile: a missing or
        unusable query id (it becomes a log key), a negative batch id or instance count, a
        checkpoint root that is not an absolute path."""
        try:
            if not isinstance(progress, Mapping):
                raise TypeError(f"the progress is not a JSON object but {type(progress).__name__}")
            offsets = {}
            for s in progress.get("sources") or []:
                end = s.get("endOffset")
                offsets[str(s["description"])] = end if isinstance(end, str) else orjson.dumps(end).decode()
            instances = sum(
                int(op.get("numStateStoreInstances", 0)) for op in progress.get("stateOperators") or []
            )
            ts = progress.get("timestamp")
            start_ms = _parse_iso_ms(ts) if isinstance(ts, str) else int(time.time() * 1000)
            end_ms = start_ms + int(progress.get("batchDuration", 0))
            query_id = check_query_id(progress["id"])
            batch_id = int(progress["batchId"])
            if batch_id < 0 or instances < 0:
                raise ValueError(f"batchId {batch_id} and numStateStoreInstances {instances} must be >= 0")
            if not os.path.isabs(checkpoint_root) or "\x00" in checkpoint_root:
                raise ValueError(f"checkpoint_root {checkpoint_root!r} is not an absolute path")
            return ProgressEvent(
                query_id=query_id,
                query_name=str(progress.get("name") or ""),
                checkpoint_root=Path(checkpoint_root),
                batch_id=batch_id,
                input_offsets=offsets,
                state_store_instances=instances,
                batch_end_ms=end_ms,
                raw=progress,
                source=source,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # AttributeError: another JSON type where an object belongs, e.g. "sources": [1].
            raise StateBackendError(f"malformed progress event {source}: {e!r}") from None


def _parse_iso_ms(ts: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


_OFFSET_FILE = re.compile(r"^\d+$")
_INDEX_NAME = re.compile(r"[A-Za-z0-9._=-]{1,255}\.json")


class UnusableMarkerError(StateBackendError):
    """A checkpoint's blob-store marker names no usable SnapshotIndex of its store."""

    def __init__(self, query_id: str, store_key: str, marker: str, problem: str) -> None:
        super().__init__(
            f"query {query_id} store {store_key}: marker {marker[:300]!r} is unusable: {problem}"
        )
        self.query_id = query_id
        self.store_key = store_key
        self.marker = marker


def load_marker_index(store: BlobStore, query_id: str, store_key: str, marker: str) -> SnapshotIndex:
    """The SnapshotIndex that `marker` (read from a checkpoint of `query_id`) names for `store_key`.

    Raises UnusableMarkerError if the marker cannot be one of ours (every SnapshotIndex this package
    writes is `indexes/<query>/<store>/<name>.json`, see BackupManager.upload), or if its blob is missing
    or not a valid SnapshotIndex: retrying cannot help. Other errors (the store unreachable) pass
    through unchanged: a later attempt may succeed."""
    prefix = indexes_prefix(SnapshotOwner(query_id), store_key)
    if not (marker.startswith(prefix) and _INDEX_NAME.fullmatch(marker[len(prefix) :])):
        raise UnusableMarkerError(query_id, store_key, marker, f"not a SnapshotIndex blob id under {prefix}")
    try:
        return load_snapshot_index(store, marker)
    except (BlobNotFoundError, CorruptIndexError) as e:
        raise UnusableMarkerError(query_id, store_key, marker, str(e)) from None


class Committer:
    """Writes one CheckpointV2 per completed batch (module doc: the protocol). One per driver.

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
    ) -> None:
        """`on_done(event)` runs once a submitted batch is checkpointed, superseded or given up on: the
        sidecar then deletes its spool file, so a batch whose committer died is submitted again.
        `sweep_interval_seconds` <= 0 turns the periodic TTL sweep off (module doc). `app_id` is this
        Spark application's id: only its own executors' marker reports are taken (module doc: zombies),
        and it is recorded as each checkpoint's writer."""
        self.app_id = app_id
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.backup_config = backup_config or BackupConfig()
        self.commit_timeout = commit_timeout_seconds
        self.retain = retain_checkpoints
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.on_done = on_done
        self._lock = threading.Lock()
        self._pending: dict[
            str, dict[int, tuple[ProgressEvent, float]]
        ] = {}  # query -> batch -> (event, seen at)
        self._managers: dict[str, BackupManager] = {}
        self._last_id: dict[str, CheckpointId] = {}
        self._located: set[str] = set()
        self._repartitioned: dict[str, int] = {}  # query -> batch of its last offline repartition
        self._wrote: set[str] = set()  # queries this application has checkpointed (module doc: zombies)
        self._bytes: dict[str, int] = {}  # query -> bytes of the stores of its batch being committed
        self._restore_rate = 0.0  # bytes/s of the newest restore its executors measured (0: none)
        self._upload_rate = 0.0
        # query -> the state store instances of its latest checkpoint: a different set is a new
        # partitioning, even when no offline_commit told us (see _partitioning_changed)
        self._store_keys: dict[str, frozenset[str]] = {}
        self._names: dict[str, str] = {}  # query -> name from its checkpoints
        self.committed: dict[str, int] = {}  # query -> last committed batch id
        self._last_markers: dict[
            str, dict[str, str]
        ] = {}  # query -> blob-store markers of its latest checkpoint
        self._upgradable: dict[
            str, _Upgradable
        ] = {}  # query -> its latest checkpoint, if Spark may shorten it
        self.fenced: set[str] = set()  # queries a newer writer took over: never committed again
        self.sweep_interval = sweep_interval_seconds
        self.sweep_timeout = sweep_timeout_seconds
        self._next_sweep_at: float | None = None
        self._sweep: Future[SweepReport] | None = None
        # K > 1: the last K checkpoints and their unshared blobs (retention.py); K = 1 is cleanup's job.
        self.retention = (
            Retention(store, pool, retain_checkpoints, timeout_seconds=self.backup_config.timeout_seconds)
            if retain_checkpoints > 1
            else None
        )

    def submit(self, event: ProgressEvent) -> None:
        """Queue a finished batch for checkpointing (ignored for a query this committer was fenced from)."""
        with self._lock:
            if event.query_id in self.fenced:
                log.error("query %s batch %d ignored: this driver was fenced", event.query_id, event.batch_id)
                return
            self._pending.setdefault(event.query_id, {})[event.batch_id] = (event, self.clock())

    def pending(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._pending.values())

    def maybe_sweep(self) -> Future[SweepReport] | None:
        """Start the periodic TTL sweep (module doc) if it is due and none is running; never blocks.
        Returns the future of the sweep started now (completed on every path), else None. Call it
        from the committer thread."""
        if self.sweep_interval <= 0 or not self._managers:
            return None  # off, or no query yet (an executor sidecar's committer never has one)
        now = self.clock()
        if self._next_sweep_at is None:
            self._next_sweep_at = now + min(self.sweep_interval, FIRST_SWEEP_DELAY_SECONDS)
        if now < self._next_sweep_at or (self._sweep is not None and not self._sweep.done()):
            return None
        self._next_sweep_at = now + self.sweep_interval
        future: Future[SweepReport] = Future()
        self._sweep = future
        threading.Thread(target=self._run_sweep, args=(future,), name="ssb-sweep", daemon=True).start()
        return future

    def _run_sweep(self, future: Future[SweepReport]) -> None:
        from ..checkpoints.gc import GarbageCollector  # gc imports this module

        future.set_running_or_notify_cancel()
        try:
            with TransferPool(SWEEP_WORKERS, name="ssb-sweep-io") as pool:
                report = GarbageCollector(
                    self.store, self.log, pool, clock=self.clock, timeout_seconds=self.sweep_timeout
                ).sweep()
        except BaseException as e:
            log.exception("TTL sweep of %s failed; tried again in %.0fs", self.store.url, self.sweep_interval)
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

    def _manager(self, event: ProgressEvent) -> BackupManager:
        m = self._managers.get(event.query_id)
        if m is None:
            owner = SnapshotOwner(event.query_id, event.query_name)
            m = BackupManager(
                self.store, self.pool, owner=owner, config=self.backup_config, metrics=self.metrics
            )
            self.log.acquire_writer(event.query_id)  # fence earlier drivers before anything is read
            latest = self.log.read_latest(event.query_id)
            if self.retention is not None:
                history = self.log.read_history(event.query_id)
                self.retention.seed(
                    event.query_id,
                    [(str(c.checkpoint_id), c.markers(BLOBSTORE_BACKEND)) for c in history],
                )
            if latest is not None:
                self._last_id[event.query_id] = latest.checkpoint_id
                self._last_markers[event.query_id] = dict(latest.markers(BLOBSTORE_BACKEND))
                if latest.changelog_checkpointing:
                    self._watch_upgrades(latest, dict.fromkeys(latest.markers(BLOBSTORE_BACKEND), True))
                self._repartitioned[event.query_id] = latest.repartitioned_at_batch
                self._store_keys[event.query_id] = _store_keys(latest.markers(BLOBSTORE_BACKEND))
                self._names[event.query_id] = latest.query_name
                self.committed[event.query_id] = max(self.committed.get(event.query_id, -1), latest.batch_id)
                driver = latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE)
                if driver is not None:
                    try:
                        index = load_marker_index(self.store, event.query_id, DRIVER_STORE, driver)
                    except UnusableMarkerError as e:
                        log.error(
                            "query %s: latest checkpoint %s: %s; the next %s snapshot is uploaded in full",
                            event.query_id,
                            latest.checkpoint_id,
                            e,
                            DRIVER_STORE,
                        )
                    else:
                        m.set_base(DRIVER_STORE, (driver, index))
            self._managers[event.query_id] = m
            if latest is not None:
                self._finish_cleanup(latest, m)
        return m

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
            except Exception:
                # One query's trouble (its log partition or blobs unreachable) is retried at the next
                # poll and never stalls the other queries' commits.
                log.exception("query %s: commit attempt failed; retrying at the next poll", query_id)
        if fenced is not None:
            raise fenced
        return committed

    def _poll_query(self, query_id: str, batches: Mapping[int, tuple[ProgressEvent, float]]) -> int:
        committed = 0
        for batch_id in sorted(batches):
            event, seen_at = batches[batch_id]
            self._manager(event)  # first time: learn what is committed already (a restarted committer)
            if batch_id <= self.committed.get(query_id, -1):
                self._drop(query_id, batch_id)
                continue
            reports = (
                read_reports(self.store, query_id, batch_id + 1, app_id=self.app_id)
                if event.state_store_instances
                else {}
            )
            if len(reports) >= event.state_store_instances:
                try:
                    # A zombie learns it was fenced here, before it looks at the markers: from the log
                    # (a Kafka writer's epoch) or from the writer of the latest checkpoint.
                    self.log.acquire_writer(query_id)
                    problems = self._check_markers(query_id, batch_id + 1, reports)
                except CheckpointFencedError:
                    self._fence(query_id, batch_id)
                    raise
                if problems:
                    # Never into a checkpoint: a marker naming a missing or foreign snapshot would make
                    # the query unrestorable. The next batch's uploads get their own chance.
                    log.error(
                        "query %s batch %d: NOT checkpointed, unusable marker(s): %s",
                        query_id,
                        batch_id,
                        "; ".join(problems),
                    )
                    self._drop(query_id, batch_id)
                    continue
                try:
                    self._commit(event, reports)
                except CheckpointFencedError:
                    self._fence(query_id, batch_id)
                    raise
                committed += 1
                for older in [b for b in batches if b < batch_id]:
                    self._drop(query_id, older)
                continue
            if self.clock() - seen_at > self.commit_timeout:
                log.error(
                    "query %s batch %d: only %d of %d state store instances uploaded version %d within "
                    "%.0fs; the batch is not checkpointed",
                    query_id,
                    batch_id,
                    len(reports),
                    event.state_store_instances,
                    batch_id + 1,
                    self.commit_timeout,
                )
                self._drop(query_id, batch_id)
        return committed

    def _check_markers(self, query_id: str, version: int, reports: Mapping[str, Report]) -> list[str]:
        """Why the reported markers of `version` must not go into a checkpoint (empty: they may): each
        must name a SnapshotIndex of its store and query (load_marker_index) recording that version, and
        every file blob the snapshot added since the store's previous checkpointed snapshot must exist.
        (Retained files are those of a snapshot a checkpoint already names, which cleanup never deletes.)
        Store unreachable: raises, and the batch is tried again at the next poll."""
        committed = self.log.read_latest(query_id)
        if committed is not None and self.app_id and committed.writer_app_id == self.app_id:
            self._wrote.add(query_id)
        elif committed is not None and committed.writer_app_id and query_id in self._wrote:
            raise CheckpointFencedError(
                f"query {query_id}: checkpoint {committed.checkpoint_id} was written by application "
                f"{committed.writer_app_id} after this application ({self.app_id}) had checkpointed it"
            )
        previous = committed.markers(BLOBSTORE_BACKEND) if committed is not None else {}

        def check(key: str, report: Report) -> list[str]:
            try:
                index = load_marker_index(self.store, query_id, key, report.marker)
            except UnusableMarkerError as e:
                return [str(e)]
            sizes[key] = index.dir_index.total_size()
            md = index.metadata
            wrong_version = md.version is not None and md.version != version
            if md.store != key or md.query_id != query_id or wrong_version:
                return [
                    f"store {key}: marker {report.marker} is a snapshot of query {md.query_id} store "
                    f"{md.store} version {md.version}, not of version {version}"
                ]
            known: set[str] = set()
            prev = previous.get(key)
            if prev is not None:
                try:
                    prev_index = load_marker_index(self.store, query_id, key, prev)
                    known = set(prev_index.dir_index.present_blob_ids())
                except UnusableMarkerError:
                    known = set()
            added = [b for b in index.dir_index.present_blob_ids() if b not in known]
            missing = [b for b in added if not self.store.exists(b)]
            return [
                f"store {key}: snapshot {report.marker} names file blob {b!r}, which is missing"
                for b in missing
            ]

        sizes: dict[str, int] = {}
        found = self.pool.run_all([partial(check, k, r) for k, r in sorted(reports.items())])
        self._bytes[query_id] = sum(sizes.values())
        return [p for problems in found for p in problems]

    def _query_metrics(self, qid: str, batch_id: int, lag: float, reports: Mapping[str, Report]) -> None:
        """The per-query gauges a user watches (metrics.py), after checkpoint `batch_id` is durable."""
        m = self.metrics
        m.last_durable_batch.labels(qid).set(batch_id)
        m.last_checkpoint_lag.labels(qid).set(lag)
        restore = max((r.restore_rate for r in reports.values()), default=0.0)
        upload = max((r.upload_rate for r in reports.values()), default=0.0)
        own = m.value("ssb_restore_last_rate_bytes_per_second")
        self._restore_rate = max(restore, own) or self._restore_rate
        self._upload_rate = upload or self._upload_rate
        size = self._bytes.get(qid, 0)
        m.checkpoint_bytes.labels(qid).set(size)
        rate = self._restore_rate or self._upload_rate
        m.predicted_restore_seconds.labels(qid).set(size / rate if rate > 0 else -1.0)

    def _fence(self, query_id: str, batch_id: int) -> None:
        """A newer driver owns `query_id`: forget it for good (module doc: zombies)."""
        log.error(
            "query %s batch %d: checkpoint NOT written, this driver was fenced by a newer one; it stops "
            "committing the query and deletes nothing",
            query_id,
            batch_id,
        )
        with self._lock:
            self.fenced.add(query_id)
            self._pending.pop(query_id, None)

    def _drop(self, query_id: str, batch_id: int) -> None:
        with self._lock:
            item = self._pending.get(query_id, {}).pop(batch_id, None)
        if item is not None and self.on_done is not None:
            self.on_done(item[0])

    def _finish_cleanup(self, latest: CheckpointV2, manager: BackupManager) -> None:
        """Run [4] again for the latest checkpoint, as Samza re-runs cleanup at start: a committer that
        died after [3] (or during [4]) left TTLs on referenced blobs and replaced blobs undeleted.
        Idempotent; a failure is logged (the next checkpoint's cleanup covers the TTLs again)."""
        qid = latest.query_id
        try:
            usable = {}
            for key, marker in latest.markers(BLOBSTORE_BACKEND).items():
                try:
                    load_marker_index(self.store, qid, key, marker)
                except UnusableMarkerError as e:
                    log.error(
                        "query %s: latest checkpoint %s: %s; cleanup of store %s skipped (nothing it names "
                        "is deleted or made permanent; the next checkpoint supersedes it)",
                        qid,
                        latest.checkpoint_id,
                        e,
                        key,
                    )
                    continue
                usable[key] = marker
            manager.cleanup(usable, delete_replaced=self.retention is None)
            delete_reports(self.store, qid, latest.batch_id + 1)
            delete_reports(self.store, qid, latest.batch_id, upgrades=True)  # older versions: obsolete
        except Exception:
            log.exception("query %s: cleanup of checkpoint %s at start failed", qid, latest.checkpoint_id)

    def _commit(self, event: ProgressEvent, reports: Mapping[str, Report]) -> None:
        qid = event.query_id
        manager = self._manager(event)
        store_markers = {k: r.marker for k, r in reports.items()}
        input_offsets: Mapping[str, str] = event.input_offsets
        if event.offline:
            # Offline repartition re-plans no input: its batch has the offsets of the batch before it.
            prev = self.log.read_latest(qid)
            input_offsets = prev.input_offsets if prev is not None else {}
            self._repartitioned[qid] = event.batch_id
        elif self._partitioning_changed(event, store_markers):
            self._repartitioned[qid] = event.batch_id
        with tempfile.TemporaryDirectory(
            prefix=".driver-", dir=driver_staging_dir(event.checkpoint_root)
        ) as tmp:
            stage_driver_files(event.checkpoint_root, event.batch_id, Path(tmp))
            cp_label = f"b{event.batch_id:012d}"
            driver_marker = manager.upload(
                cp_label, {DRIVER_STORE: Path(tmp)}, versions={DRIVER_STORE: event.batch_id}
            )
        markers = {**store_markers, **driver_marker}
        checkpoint_id = CheckpointId.create(event.batch_id, after=self._last_id.get(qid))
        checkpoint = CheckpointV2(
            checkpoint_id=checkpoint_id,
            query_id=qid,
            query_name=event.query_name or self._names.get(qid, ""),
            input_offsets=input_offsets,
            state_checkpoint_markers={BLOBSTORE_BACKEND: markers},
            changelog_checkpointing=any(r.changelog for r in reports.values()),
            repartitioned_at_batch=self._repartitioned.get(qid, 0),
            writer_app_id=self.app_id,
        )
        if qid not in self._located:
            # Before the commit point, so that no checkpoint exists that a new host cannot find.
            write_locator(self.store, str(event.checkpoint_root), qid, event.query_name)
            self._located.add(qid)
        crashpoints.crash_point(crashpoints.BEFORE_CHECKPOINT_WRITE)  # test-only; a no-op unless armed
        self.log.write(checkpoint)  # [3] the commit point; raises CheckpointFencedError (see poll)
        self._last_id[qid] = checkpoint_id
        self._wrote.add(qid)
        self._store_keys[qid] = _store_keys(store_markers)
        self.committed[qid] = event.batch_id
        self._drop(qid, event.batch_id)
        lag = max(0.0, self.clock() - event.batch_end_ms / 1000)
        self.metrics.checkpoint_lag.labels(qid).observe(lag)
        self.metrics.checkpoints_written.labels(qid).inc()
        self._query_metrics(qid, event.batch_id, lag, reports)
        log.info(
            "query %s batch %d: checkpoint %s written with %d state marker(s); lag %.3fs",
            qid,
            event.batch_id,
            checkpoint_id,
            len(markers),
            lag,
        )
        crashpoints.crash_point(crashpoints.AFTER_CHECKPOINT_WRITE)  # test-only; a no-op unless armed
        if not self._still_writer(qid, checkpoint_id, event.batch_id):
            return
        previous = self._last_markers.get(qid)
        self._last_markers[qid] = dict(markers)
        upgradable = qid in self._upgradable or checkpoint.changelog_checkpointing
        if checkpoint.changelog_checkpointing:
            self._watch_upgrades(checkpoint, {k: r.changelog for k, r in reports.items()})
        else:
            self._upgradable.pop(qid, None)
        try:  # [4]
            manager.cleanup(markers, delete_replaced=self.retention is None, previous=previous)
            delete_reports(self.store, qid, event.batch_id + 1)
            if upgradable:  # changelog checkpointing: upgrades of older versions are obsolete (this
                # version's may arrive yet, see maybe_refresh); other queries never have any
                delete_reports(self.store, qid, event.batch_id, upgrades=True)
            if self.retain >= 1:
                self.log.retain(qid, self.retain)
            if self.retention is not None:
                self.retention.commit(qid, str(checkpoint_id), markers, manager)
        except Exception:
            log.exception(
                "query %s batch %d: cleanup failed; it is retried after the next checkpoint",
                qid,
                event.batch_id,
            )

    def _watch_upgrades(self, checkpoint: CheckpointV2, changelog: dict[str, bool]) -> None:
        now = self.clock()
        self._upgradable[checkpoint.query_id] = _Upgradable(
            checkpoint,
            changelog,
            until=now + REFRESH_WINDOW_SECONDS,
            next_poll=now + REFRESH_FIRST_POLL_SECONDS,
        )

    def maybe_refresh(self) -> int:
        """Checkpoint upgraded snapshots of the latest checkpoints' versions (module doc: upgrades);
        returns how many checkpoints were written. Cheap when no look is due; call it from the
        committer thread. A failure is logged and retried at the next look."""
        written = 0
        now = self.clock()
        for qid, up in list(self._upgradable.items()):
            if now < up.next_poll:
                continue
            if now > up.until or qid in self.fenced:
                self._upgradable.pop(qid, None)
                continue
            up.next_poll = now + up.gap
            up.gap = min(up.gap * 2, REFRESH_MAX_POLL_SECONDS)
            try:
                written += self._refresh(qid, up)
            except CheckpointFencedError:
                self._fence(qid, up.checkpoint.batch_id)
                self._upgradable.pop(qid, None)
            except Exception:
                log.exception(
                    "query %s batch %d: looking for upgraded snapshots failed", qid, up.checkpoint.batch_id
                )
        return written

    def _refresh(self, qid: str, up: _Upgradable) -> int:
        cp = up.checkpoint
        version = cp.batch_id + 1
        with self._lock:
            if any(b > cp.batch_id for b in self._pending.get(qid, {})):
                return 0  # the next batch's checkpoint replaces this one, with recipes of its own
        reports = read_upgrades(self.store, qid, version, app_id=self.app_id)
        if not reports:
            return 0
        current = dict(cp.markers(BLOBSTORE_BACKEND))
        after: dict[tuple[str, str], Report] = {}  # (store, the marker it diffs against) -> the upgrade
        for r in reports:
            try:
                index = load_marker_index(self.store, qid, r.store, r.marker)
            except UnusableMarkerError as e:
                log.error("query %s batch %d: upgrade report %s: %s; ignored", qid, cp.batch_id, r.blob_id, e)
                continue
            parent = index.prev_snapshot_index_blob_id
            if index.metadata.version == version and parent is not None:
                after[(r.store, parent)] = r  # the later of two uploads on one parent wins
        upgrades: dict[str, str] = {}
        changelog = dict(up.changelog)
        for key, marker in current.items():
            m = marker
            for _ in range(len(reports)):  # a chain of upgrades from the checkpointed snapshot
                step = after.get((key, m))
                if step is None:
                    break
                m = step.marker
                changelog[key] = step.changelog
            if m != marker:
                upgrades[key] = m
        written = 0
        if upgrades:
            written = self._write_upgrades(qid, up, upgrades, changelog)
        # Every report read is used or can never be (its parent is no snapshot of this checkpoint's chain).
        self.pool.run_all([partial(self.store.delete, r.blob_id) for r in reports])
        return written

    def _write_upgrades(
        self, qid: str, up: _Upgradable, upgrades: dict[str, str], changelog: dict[str, bool]
    ) -> int:
        cp = up.checkpoint
        current = dict(cp.markers(BLOBSTORE_BACKEND))
        markers = {**current, **upgrades}
        checkpoint = dataclasses.replace(
            cp,
            checkpoint_id=CheckpointId.create(cp.batch_id, after=self._last_id.get(qid)),
            state_checkpoint_markers={**cp.state_checkpoint_markers, BLOBSTORE_BACKEND: markers},
            changelog_checkpointing=any(changelog.values()),
        )
        self.log.write(checkpoint)  # raises CheckpointFencedError (see maybe_refresh)
        self._last_id[qid] = checkpoint.checkpoint_id
        self._last_markers[qid] = markers
        up.checkpoint = checkpoint
        up.changelog = changelog
        self.metrics.checkpoints_written.labels(qid).inc()
        log.info(
            "query %s batch %d: checkpoint %s written with the upgraded snapshot(s) of %s (Spark published a "
            "newer snapshot of version %d after its commit)",
            qid,
            cp.batch_id,
            checkpoint.checkpoint_id,
            ", ".join(sorted(upgrades)),
            cp.batch_id + 1,
        )
        if not self._still_writer(qid, checkpoint.checkpoint_id, cp.batch_id):
            return 1
        manager = self._managers[qid]
        try:
            manager.cleanup(upgrades, delete_replaced=self.retention is None, previous=current)
            if self.retain >= 1:
                self.log.retain(qid, self.retain)
            if self.retention is not None:
                self.retention.commit(qid, str(checkpoint.checkpoint_id), markers, manager)
        except Exception:
            log.exception(
                "query %s batch %d: cleanup after an upgrade failed; retried later", qid, cp.batch_id
            )
        return 1
    def _partitioning_changed(self, event: ProgressEvent, store_markers: Mapping[str, str]) -> bool:
        """True if batch `event` has other state store instances than the query's latest checkpoint.

        Spark commits every store instance of every stateful operator in every batch, so the set only
        changes with the number of shuffle partitions: an offline repartition whose own batch was
        never checkpointed (the application exited before the committer got to it, or it ran without
        the backend). This batch then starts the new partitioning (repartitioned_at_batch), so no
        fallback restore can bring the old one back."""
        prev = self._store_keys.get(event.query_id)
        keys = _store_keys(store_markers)
        if prev is None or not prev or not keys or keys == prev:
            return False
        log.warning(
            "query %s batch %d: %d state store instances where its latest checkpoint has %d: the query was "
            "repartitioned without that being checkpointed; its new partitioning starts at this batch, and "
            "no restore goes back to an earlier checkpoint",
            event.query_id,
            event.batch_id,
            len(keys),
            len(prev),
        )
        return True

    def _still_writer(self, qid: str, checkpoint_id: CheckpointId, batch_id: int) -> bool:
        """True if the log's latest checkpoint of `qid` is `checkpoint_id`, the one just written.

        False means a newer writer committed after us (we are a zombie): cleanup must not run. A read
        failure also answers False: skipping one cleanup only delays deletes (the next one, or gc,
        catches up), deleting on a guess could lose a newer writer's blobs."""
        try:
            latest = self.log.read_latest(qid)
        except Exception as e:
            log.warning(
                "query %s batch %d: cannot re-read the latest checkpoint (%s); cleanup skipped",
                qid,
                batch_id,
                e,
            )
            return False
        if latest is not None and latest.checkpoint_id == checkpoint_id:
            return True
        log.error(
            "query %s batch %d: checkpoint %s was written but the log's latest is now %s: a newer driver "
            "owns the query (this one is a zombie); cleanup skipped, nothing deleted",
            qid,
            batch_id,
            checkpoint_id,
            latest.checkpoint_id if latest is not None else None,
        )
        return False


def _store_keys(markers: Mapping[str, str]) -> frozenset[str]:
    """The state store instances a checkpoint's blob-store markers cover (not the `_driver` files)."""
    return frozenset(k for k in markers if k != DRIVER_STORE)
