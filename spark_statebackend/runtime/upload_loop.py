"""The sidecar's upload loop ([C3]-[C4] of runtime/__init__.py), on its thread `ssb-upload`:
staged snapshot events -> BackupManager.upload -> a marker report per store instance -> the staged
hard links deleted. Its diff bases are in diff_bases.py, its lag and retries in upload_lag.py.

Only the newest staged version of a store is uploaded: versions staged while an upload was in flight
are skipped (Samza's max.commit.delay behaviour; the shim blocks commits when an upload lags too far,
see `status.json`). Before each upload the diff base of every store is checked against the query's
latest checkpoint (`DiffBases.refresh`), so a base older than the committed snapshot (whose removed files
cleanup may already have deleted) is never used. A failed upload (blob store or checkpoint log
unreachable) keeps its snapshot and is retried with backoff until it succeeds, a newer version of its
stores supersedes it, or commitTimeout has passed since it was staged; until then it counts as lag in
`status.json` (the staging time of the oldest snapshot not yet uploaded), so the shim blocks commits
after maxCommitDelay and fails them after commitTimeout instead of letting the query run on without
backups. A claimed event a dead predecessor left is uploaded again unless its version is already
checkpointed. A sidecar of an application that another one has fenced (a zombie) uploads nothing more
for that query and keeps its snapshots counted as lag.

A snapshot whose files went with its query's checkpoint location (Spark deletes a query's temporary
location when it stops; a user deletes a stopped query's) can never be uploaded: an event whose
checkpoint root or staged dir no longer exists is dropped with one WARNING naming the query, store,
version and missing path, before its upload and again after a failed one, and stops counting as lag.
That is decided by looking at those paths, never from an upload's error: any other failure is
retried as above.

A version's uploads wait for the rest of the batch on this executor (batch_hold.py says when and why),
and Spark's snapshots published meanwhile wait too. What the loop checks of a staged event before it
trusts its paths, and its reading of claimed events (each once), is staged_events.py.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..checkpoints.logs import CheckpointLog
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig, BackupManager, StoreRecipe
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..lifecycle.reports import Report, read_reports, write_report
from ..settings import Settings
from ..stores import BlobStore
from . import spool as sp
from .batch_hold import BatchHold
from .built_staging import stage_built_snapshot
from .changelog_streams import ChangelogStreams
from .diff_bases import DiffBases, Fenced
from .materializer import Materializer
from .ownership import Ownership
from .staged_events import ClaimedEvents, gone_path, log_gone, recency
from .upload_lag import UploadLag

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before


class UploadLoop:
    """Uploads what the shim staged in one spool dir (module doc). Runs on one thread."""

    def __init__(
        self,
        spool: sp.Spool,
        executor_id: str,
        settings: Settings,
        *,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        pool: TransferPool,
        metrics: Metrics,
        backup_config: BackupConfig,
        app_id: str,
        resolve_query_id: Callable[[Path], str | None],
        ownership: Ownership,
        reported_here: Callable[[str, Report, SnapshotIndex], None] | None = None,
    ) -> None:
        """`ownership`: the sidecar process's (runtime/ownership.py); its DiffBases feed it.
        `reported_here(query_id, report, index)`: told of each batch report [C4] written, with the
        SnapshotIndex it names (the committer of the same process, Committer.uploaded_here)."""
        self.spool = spool
        self.executor_id = executor_id
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.app_id = app_id
        self.resolve_query_id = resolve_query_id
        self.reported_here = reported_here
        self.bases = DiffBases(
            store,
            checkpoint_log,
            pool,
            backup_config=backup_config,
            metrics=metrics,
            app_id=app_id,
            commit_timeout_seconds=settings.commit_timeout_seconds,
            ownership=ownership,
        )
        self.lag = UploadLag(spool.dir)
        self.hold = BatchHold(settings.max_commit_delay_seconds / 2)
        self._fenced: set[str] = set()  # queries another application took over since
        # event path -> request ids of superseded events whose tasks wait for it (durableCommit)
        self._waiters: dict[Path, list[str]] = {}
        self._due_in: float | None = None  # set by each turn: see due_in
        self.claimed = ClaimedEvents(spool, executor_id)
        # A snapshot built from changelogs goes up as an upgrade between commits (built_staging.py).
        self.materializer = Materializer(
            settings.changelog_snapshot_every,
            metrics,
            on_built=partial(stage_built_snapshot, spool, app_id),
            busy=self.committing,
        )
        # Changelogs uploaded while Spark writes them (changelog_streams.py); its thread is the sidecar's.
        self.streams = ChangelogStreams(
            spool,
            store,
            metrics,
            chunk_size=settings.changelog_stream_chunk,
            ttl_seconds=backup_config.ttl_seconds,
            max_age_seconds=settings.commit_timeout_seconds,
        )

    def committing(self) -> bool:
        """Whether this executor is committing a batch: a task writes a changelog (a stream is open) or
        a staged version waits for its upload."""
        return self.streams.writing() or bool(self.spool.unfinished_events())

    def due_in(self) -> float | None:
        """Seconds until a snapshot the last turn left waiting is due by time alone (its retry, the end
        of its batch hold; runtime/spool/wake.py), None if none waits: the loop's wait for new events
        lasts at most that long."""
        return self._due_in

    def upload_once(self) -> bool:
        """Upload the newest staged version of every store with pending events; True if any work."""
        self._due_in = None
        events = self.claimed.take()
        if not events:
            return False
        newest: dict[tuple[str, str], tuple[Path, sp.SnapshotEvent]] = {}
        for path, ev in events:
            if ev.query_id is None:
                # A task outside a micro-batch (offline repartition): the checkpoint root says whose.
                qid = self.resolve_query_id(ev.checkpoint_root)
                if qid is None:
                    log.error(
                        "snapshot event %s: store %s version %d of %s belongs to no known query (no "
                        "metadata file, no locator in the blob store); it is NOT backed up",
                        path,
                        ev.instance.key,
                        ev.version,
                        ev.checkpoint_root,
                    )
                    self._discard(path, ev, "error", "the snapshot belongs to no known query; NOT backed up")
                    continue
                ev = dataclasses.replace(ev, query_id=qid)
            if self._drop_if_gone(path, ev):
                continue
            k = (ev.query_id or "", ev.instance.key)
            old = newest.get(k)
            if old is None or recency(ev) >= recency(old[1]):
                if old is not None:
                    log.info(
                        "query %s store %s: skipping version %d, version %d is staged",
                        k[0],
                        k[1],
                        old[1].version,
                        ev.version,
                    )
                    self._carry_waiters(old[0], old[1], path)
                    self._discard(*old)
                newest[k] = (path, ev)
            else:
                self._carry_waiters(path, ev, newest[k][0])
                self._discard(path, ev)
        groups: dict[tuple[str, int], list[tuple[Path, sp.SnapshotEvent]]] = {}
        for (qid, _), item in newest.items():
            groups.setdefault((qid, item[1].version), []).append(item)
        busy = False
        now = time.monotonic()
        self.lag.keep_retries(groups)  # superseded ones are gone
        # A task waiting for its own upload (durableCommit) holds its core: no batch hold, or the batch's
        # other stores, queued behind it, could not commit until the hold ran out.
        held = {g for g in self.hold.held(groups) if not any(ev.request_id for _, ev in groups[g])}
        waits: list[float] = []  # seconds until each group left waiting is due
        for (qid, version), items in sorted(groups.items(), key=lambda g: g[0][1]):
            if not self.lag.retry_due((qid, version), now):
                waits.append(self.lag.retry_in((qid, version), time.monotonic()))
                continue  # failed a moment ago: its retry is not due yet
            if (qid, version) in held:
                waits.append(self.hold.release_in(items, time.time()))
                continue  # a batch is still being committed here (module doc)
            self.upload_group(qid, version, items)
            busy = True
        self._due_in = min(waits, default=None)
        return busy

    def upload_group(self, query_id: str, version: int, items: list[tuple[Path, sp.SnapshotEvent]]) -> None:
        """[C3]-[C4] for the staged events of one version of one query (the newest of each store). Never
        raises: a fenced query's snapshots stay lag, any other failure is kept for a retry
        (`_upload_failed`)."""
        self.lag.publish(in_flight=(query_id, min(ev.created_at_ms for _, ev in items)))
        try:
            committed = self.bases.refresh(query_id, [ev.instance.key for _, ev in items])
            items = self._skip_checkpointed(query_id, version, committed, items)
            if not items:
                self.lag.settled((query_id, version))
                return
            self._upload(query_id, version, committed, items)
        except Fenced as e:
            self._fenced_off(query_id, items, e)
        except Exception as e:
            self._upload_failed(query_id, version, items, e)
        finally:
            self.lag.publish()

    def _skip_checkpointed(
        self, query_id: str, version: int, committed: int, items: list[tuple[Path, sp.SnapshotEvent]]
    ) -> list[tuple[Path, sp.SnapshotEvent]]:
        """`items` less those already checkpointed (`committed`: the latest checkpoint's version), which
        are answered "uploaded" and removed. A restarted sidecar redoing its predecessor's claimed events
        would only leave a second, unreferenced copy. Except an upgrade of the checkpointed version
        itself: the committer checkpoints it in place of the first upload."""
        done = [
            (p, ev) for p, ev in items if version < committed or (version == committed and not ev.upgrade)
        ]
        if not done:
            return items
        log.info(
            "query %s version %d: already checkpointed; not uploaded again (%d store(s))",
            query_id,
            version,
            len(done),
        )
        for path, ev in done:
            self.lag.caught_up((query_id, ev.instance.key))
            self._discard(path, ev, "uploaded", f"version {version} is checkpointed already")
        return [item for item in items if item not in done]

    def _upload(
        self, query_id: str, version: int, committed: int, items: list[tuple[Path, sp.SnapshotEvent]]
    ) -> None:
        """[C3] diff `items` against each store's base, upload the new files, then each SnapshotIndex;
        [C4] report each marker, then remove the events (their waiting tasks answered). Raises on a
        failure (Fenced when another application owns the query); what was reported stays reported."""
        dirs = {ev.instance.key: ev.staged_dir for _, ev in items}
        recipes = {
            ev.instance.key: StoreRecipe(
                snapshot_version=ev.version if ev.snapshot_version is None else ev.snapshot_version,
                changelog_versions=ev.changelog_versions,
                spark_unique_id=ev.spark_unique_id,
            )
            for _, ev in items
        }
        upgrades = {ev.instance.key for _, ev in items if ev.upgrade}
        if upgrades and version > committed:
            # Spark's snapshot of a version not checkpointed yet, for a store whose batch report is
            # missing (the batch's own event lost to it above, or went with a predecessor that died):
            # it is that report, or the committer would wait for it for ever.
            upgrades &= set(read_reports(self.store, query_id, version, app_id=self.app_id))
        manager = self.bases.manager(query_id)
        # the changelogs' starts uploaded while Spark wrote them
        ahead = {ev.instance.key: self.streams.take(query_id, ev) for _, ev in items}
        versions = dict.fromkeys(dirs, version)
        markers = manager.upload(f"v{version:012d}", dirs, versions=versions, recipes=recipes, uploaded=ahead)

        def report(key: str, marker: str) -> None:
            last = manager.last_upload(key)
            write_report(
                self.store,
                query_id,
                version,
                key,
                marker,
                self.executor_id,
                self.settings.blob_ttl_seconds,
                changelog=bool(recipes[key].changelog_versions),
                app_id=self.app_id,
                restore_rate=self.metrics.last_restore_rate,
                upload_rate=last.rate if last is not None else 0.0,
                upgrade=key in upgrades,
                on_written=partial(self._reported, query_id, manager),
            )

        # [C4] each marker reported to the committer. The reports go side by side on the transfer pool:
        # one durable put each (two fsyncs on a file:// store), written one after another on this
        # thread they held up the rest of a 200-store batch. A failure leaves the others written; the
        # group is retried whole.
        manager.pool.run_all([partial(report, key, marker) for key, marker in markers.items()])
        for key in markers:
            self.bases.uploaded(query_id, key, version)
            self.lag.caught_up((query_id, key))
        self.lag.settled((query_id, version))
        self.hold.uploaded(query_id, version, set(markers) - upgrades)
        for path, ev in items:
            # the staged hard links and the event; a task waiting for its commit goes on
            self._discard(path, ev, "uploaded", markers[ev.instance.key])
            self.materializer.offer(query_id, ev)
        log.info(
            "query %s version %d: %d store(s) uploaded by executor %s",
            query_id,
            version,
            len(items),
            self.executor_id,
        )

    def _fenced_off(self, query_id: str, items: list[tuple[Path, sp.SnapshotEvent]], error: Fenced) -> None:
        """A zombie: another application took the query over and checkpoints it now. Upload nothing
        more for it, and keep its snapshots counted as lag so this application's commits of the query
        block after maxCommitDelay and fail after commitTimeout instead of running on."""
        if query_id not in self._fenced:
            self._fenced.add(query_id)
            log.error(
                "%s; application %s was fenced: executor %s uploads nothing more for it, and its "
                "commits block",
                error,
                self.app_id,
                self.executor_id,
            )
        for path, ev in items:
            self.lag.lagging((query_id, ev.instance.key), ev.created_at_ms)
            self._discard(path, ev, "error", str(error))

    def _reported(self, query_id: str, manager: BackupManager, report: Report) -> None:
        """Tell `reported_here` of a batch's report (never an upgrade's: the committer reads those)."""
        if self.reported_here is not None and not report.upgrade:
            self.reported_here(query_id, report, manager.snapshot_index(report.marker))

    def _upload_failed(
        self, query_id: str, version: int, items: list[tuple[Path, sp.SnapshotEvent]], error: Exception
    ) -> None:
        """Keep the snapshots for a retry and count them as lag (module doc), or give up on them once
        commitTimeout has passed since they were staged (the shim has failed those commits by then).
        Snapshots whose files are gone with their checkpoint location are dropped (module doc)."""
        items = [(path, ev) for path, ev in items if not self._drop_if_gone(path, ev)]
        if not items:
            self.lag.settled((query_id, version))
            return
        staged_ms = min(ev.created_at_ms for _, ev in items)
        age = time.time() - staged_ms / 1000
        if age > self.settings.commit_timeout_seconds:
            log.error(
                "query %s version %d: upload of %d store(s) failed for %.0fs, beyond commitTimeout (%.0fs); "
                "giving up on these snapshots (the next version is uploaded afresh): %s",
                query_id,
                version,
                len(items),
                age,
                self.settings.commit_timeout_seconds,
                error,
            )
            for path, ev in items:
                self.lag.caught_up((query_id, ev.instance.key))
                self._discard(path, ev, "error", f"upload failed beyond commitTimeout: {error}")
            self.lag.settled((query_id, version))
            return
        failures, delay = self.lag.failed((query_id, version))
        for _, ev in items:
            self.lag.lagging((query_id, ev.instance.key), ev.created_at_ms)
        log.error(
            "query %s version %d: upload of %d store(s) failed (attempt %d; staged %.1fs ago); retrying in "
            "%.1fs, commits wait once it is older than maxCommitDelay: %s",
            query_id,
            version,
            len(items),
            failures,
            age,
            delay,
            error,
            exc_info=failures == 1,
        )

    def _drop_if_gone(self, path: Path, ev: sp.SnapshotEvent) -> bool:
        """Drop event `path` if its snapshot's files are gone (`gone_path`, module doc): logged once,
        removed from the spool, no longer lag. False (nothing done) while they are there."""
        gone = gone_path(ev)
        if gone is None:
            return False
        log_gone(path, ev, gone)
        self.lag.caught_up((ev.query_id or "", ev.instance.key))
        self._discard(path, ev, "error", f"{gone} no longer exists; NOT backed up")
        self.lag.publish()  # it may have been lag (a failed attempt before): the gate lets go now
        return True

    def _discard(
        self, path: Path, ev: sp.SnapshotEvent, status: sp.RestoreStatus | None = None, message: str = ""
    ) -> None:
        """Remove event `path` and its staged dir; with `status`, first answer the tasks waiting for it
        (its own request id and those it carries, `_carry_waiters`): "uploaded" once the version is
        durable, "error" when it never will be. Without one the event was superseded, and its waiters
        are the surviving event's."""
        shutil.rmtree(ev.staged_dir, ignore_errors=True)
        waiting = self._waiters.pop(path, [])
        if status is not None:
            for request_id in [*([ev.request_id] if ev.request_id else []), *waiting]:
                self.spool.write_response(sp.RestoreResponse(request_id, status, message), fsync=False)
        sp.remove(path)

    def _carry_waiters(self, path: Path, ev: sp.SnapshotEvent, to: Path) -> None:
        """Event `path` is superseded by event `to` of the same store (a newer recipe of the version: an
        upgrade): a task waiting for `path`'s upload is answered when `to`'s is."""
        carried = [*([ev.request_id] if ev.request_id else []), *self._waiters.pop(path, [])]
        if carried:
            self._waiters.setdefault(to, []).extend(carried)
