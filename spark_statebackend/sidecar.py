"""The sidecar: one Python process per executor JVM doing the blob-store work the shim hands it.

    python -m spark_statebackend.sidecar --spool-dir DIR --executor-id ID --conf FILE [--jvm-pid PID]

It serves the spool protocol (spool.py) with three loops, each on its own named thread:

- upload (`ssb-upload`): snapshot events -> BackupManager.upload -> a marker report per store
  instance (markers.py) -> the staged hard links are deleted. Only the newest staged version of a
  store is uploaded: versions staged while an upload was in flight are skipped (Samza's
  max.commit.delay behaviour; the shim blocks commits when an upload lags too far, see
  `status.json`). Before each upload the diff base of every store is checked against the query's
  latest checkpoint, so a base older than the committed snapshot (whose removed files cleanup may
  already have deleted) is never used. A failed upload (blob store or checkpoint log unreachable)
  keeps its snapshot and is retried with backoff until it succeeds, a newer version of its stores
  supersedes it, or commitTimeout has passed since it was staged; until then it counts as lag in
  `status.json` (the staging time of the oldest snapshot not yet uploaded), so the shim blocks
  commits after maxCommitDelay and fails them after commitTimeout instead of letting the query run
  on without backups.
- restore (`ssb-restore-*`, a bounded pool: RESTORE_WORKERS running, RESTORE_QUEUE queued, further
  requests wait in the spool; restores of one store one at a time): restore requests -> the
  matching marker of the latest checkpoint (or an older retained one) -> RestoreManager into a
  scratch dir on the checkpoint's filesystem -> the request taken while the JVM still waits
  (spool.py: "Taking a request") -> files moved into the store's dir -> a response. Identical local
  files are reused. Every request the JVM still waits for gets a response on every path (restored /
  not_found / error); one it withdrew (restoreTimeout) gets none and nothing is placed. Nothing below the
  checkpoint location is followed if it is a symlink (the store's dir, the scratch dir, `SSTs/`:
  the request is answered `error` naming it), and a stale file where a restored one belongs is
  replaced, never kept (nofollow.py).
- commit (`ssb-commit`): batch progress events written by the JVM listener into `progress/` ->
  Committer (commit.py). Only the driver's spool dir receives them. An event stays claimed until
  its batch is checkpointed or dropped.

A sidecar started after its predecessor died (kill -9, or a crash point under test) redoes the
predecessor's claimed work: claimed snapshot events are uploaded unless their version is already
checkpointed, claimed progress events are committed, pending and taken restore requests are served
(a restore's half-built scratch dir is removed by the next restore of that store).

It exits when its parent (the executor JVM) goes away, even after a kill -9 of the JVM.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from . import crashpoints
from . import spool as sp
from .backup import BackupConfig, BackupManager, SnapshotOwner, StoreRecipe, load_snapshot_index
from .blobstore import BlobStore, open_blob_store
from .checkpoint import CheckpointV2, check_query_id
from .checkpointlog import CheckpointLog, open_checkpoint_log
from .commit import BLOBSTORE_BACKEND, Committer, ProgressEvent, UnusableMarkerError, load_marker_index
from .config import PREFIX, Settings
from .diff import DiffOptions
from .errors import BlobNotFoundError, StateBackendError, UnsafePathError
from .index import SnapshotIndex
from .markers import read_locator, store_key, write_report
from .metrics import Metrics
from .nofollow import DirTree, move_tree_into, relative_parts
from .restore import RestoreConfig, RestoreManager
from .transfer import TransferPool

log = logging.getLogger("spark_statebackend.sidecar")

PROGRESS_DIR = "progress"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.json"
METRICS_SECONDS = 1.0
POLL_SECONDS = 0.02
RESTORE_WORKERS = 4  # restores run at once (each also uses the shared transfer pool)
RESTORE_QUEUE = 4  # restores queued behind them; more requests stay pending in the spool
#: A restore's files are placed only if the JVM still waits for at least this long (or a quarter of
#: restoreTimeout, if less): placing them is a few renames, far quicker.
RESTORE_PLACE_MARGIN_SECONDS = 2.0
RETRY_INITIAL_SECONDS = 0.5  # first retry of a failed upload; doubles up to RETRY_MAX_SECONDS
RETRY_MAX_SECONDS = 5.0


class Sidecar:
    """The three loops of one sidecar process over one spool directory (module doc)."""

    def __init__(
        self,
        spool: sp.Spool,
        executor_id: str,
        settings: Settings,
        *,
        store: BlobStore | None = None,
        checkpoint_log: CheckpointLog | None = None,
        metrics: Metrics | None = None,
        app_id: str = "",
    ) -> None:
        """`app_id`: the Spark application this sidecar serves (its reports and checkpoints carry it;
        the committer takes only its own application's reports)."""
        self.app_id = app_id
        self._owned: set[str] = set()  # queries a checkpoint of this application was seen for
        self._fenced: set[str] = set()  # queries another application took over since
        self.spool = spool
        self.executor_id = executor_id
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.store = store or open_blob_store(
            settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url"
        )
        self.log = checkpoint_log or open_checkpoint_log(
            settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url"
        )
        self.pool = TransferPool(settings.workers, name="ssb-transfer")
        # Restores in flight are bounded (workers + queue); further requests wait in the spool.
        self.restore_pool = TransferPool(RESTORE_WORKERS, name="ssb-restore", queue_size=RESTORE_QUEUE)
        diff = DiffOptions(settings.small_file_bytes, settings.checksum_all_files)
        self.backup_config = BackupConfig(
            chunk_size=settings.chunk_size,
            diff=diff,
            ttl_seconds=settings.blob_ttl_seconds,
            timeout_seconds=settings.commit_timeout_seconds,
        )
        self.restorer = RestoreManager(
            self.store,
            self.pool,
            config=RestoreConfig(diff=diff, timeout_seconds=settings.restore_timeout_seconds),
            metrics=self.metrics,
        )
        self.committer = Committer(
            self.store,
            self.log,
            self.pool,
            backup_config=self.backup_config,
            commit_timeout_seconds=settings.commit_timeout_seconds,
            retain_checkpoints=settings.retain_checkpoints,
            metrics=self.metrics,
            on_done=self._progress_done,
            sweep_interval_seconds=settings.sweep_interval_seconds,
            app_id=app_id,
        )
        self._progress_recovered = False
        self._requests_recovered = False
        self._managers: dict[str, BackupManager] = {}
        self._bases: dict[tuple[str, str], int] = {}  # (query, store) -> version of the diff base
        self._base_uploaded_at: dict[tuple[str, str], float] = {}  # monotonic time this process uploaded it
        self._in_progress: set[str] = set()
        self._store_restore_locks: dict[tuple[str, str], threading.Lock] = {}  # (checkpoint root, store)
        # (query, store) -> staging time (epoch ms) of its oldest snapshot not yet uploaded: the lag the
        # shim's commit gate reads from status.json. Set when an upload fails, cleared when one succeeds.
        self._lagging: dict[tuple[str, str], int] = {}
        self._oldest_staged_ms: int | None = None  # what status.json says, for the upload-lag gauge
        self._retry: dict[tuple[str, int], tuple[int, float]] = {}  # (query, version) -> (failures, next try)
        self._lock = threading.Lock()
        self.stop_event = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> list[threading.Thread]:
        """Prepare resources and start the loops; returns the threads (none if the sidecar was told to
        stop while it prepared them, e.g. its JVM died while the blob store was slow to answer)."""
        self.store.ensure_ready()
        self.log.create_resources()
        if self.stop_event.is_set():
            return []
        for d in (
            self.spool.events_dir,
            self.spool.requests_dir,
            self.spool.responses_dir,
            self.progress_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        self.spool.write_sidecar_marker(self.executor_id)
        threads = [
            threading.Thread(target=self._loop, args=(self.upload_once,), name="ssb-upload", daemon=True),
            threading.Thread(
                target=self._loop, args=(self.restore_once,), name="ssb-restore-dispatch", daemon=True
            ),
            threading.Thread(target=self._loop, args=(self.commit_once,), name="ssb-commit", daemon=True),
            threading.Thread(target=self._publish_metrics, name="ssb-metrics", daemon=True),
        ]
        for t in threads:
            t.start()
        log.info("sidecar for executor %s serving %s (pid %d)", self.executor_id, self.spool.dir, os.getpid())
        return threads

    def _publish_metrics(self) -> None:
        """Every METRICS_SECONDS, write this sidecar's metric samples to `metrics.json` in its spool dir,
        where the JVM plugin turns them into gauges of Spark's metrics system (metrics.py)."""
        while not self.stop_event.wait(METRICS_SECONDS):
            try:
                staged = self._oldest_staged_ms
                self.metrics.upload_lag.set(0.0 if staged is None else max(0.0, time.time() - staged / 1000))
                # Rewritten every time, changed or not: its age tells that this sidecar is alive.
                body = orjson.dumps({"schema_version": 1, "samples": self.metrics.samples()})
                sp.atomic_write_bytes(self.spool.dir / METRICS_FILE, body, fsync=False)
            except Exception:
                log.exception("sidecar %s: publishing metrics failed; retrying", self.executor_id)

    def idle(self) -> bool:
        """True when nothing staged waits for an upload and the committer has no batch pending."""
        uploads = sp.claimed(self.spool.events_dir) + self.spool.pending_events()
        progress = sp.list_pending(self.progress_dir) + sp.claimed(self.progress_dir)
        return not uploads and not progress and self.committer.pending() == 0

    def drain(self, timeout_seconds: float) -> bool:
        """Let the loops finish the uploads and checkpoints of work already handed over (a stopping
        application's last batches), for at most `timeout_seconds`; True if everything was done. What
        is left is logged: it is redone by the next sidecar of the application, or, after the
        application ends, those batches are simply not checkpointed (Spark's own files keep them)."""
        deadline = time.monotonic() + timeout_seconds
        while not self.idle():
            if time.monotonic() >= deadline or self.stop_event.is_set():
                log.warning(
                    "sidecar %s: stopping with work left after %.0fs of drainTimeout (%d event(s), "
                    "%d batch(es) pending)",
                    self.executor_id,
                    timeout_seconds,
                    len(sp.claimed(self.spool.events_dir) + self.spool.pending_events()),
                    self.committer.pending(),
                )
                return False
            time.sleep(POLL_SECONDS)
        log.info("sidecar %s: drained; stopping", self.executor_id)
        return True

    def close(self) -> None:
        self.stop_event.set()
        self.restore_pool.close(cancel_pending=False)  # at most RESTORE_QUEUE queued: answer them
        self.committer.close()
        self.pool.close()
        self.spool.remove_sidecar_marker()
        self.log.close()
        self.store.close()

    def _loop(self, step: Any) -> None:
        while not self.stop_event.is_set():
            try:
                busy = step()
            except Exception:
                log.exception("sidecar %s: %s failed; retrying", self.executor_id, step.__name__)
                busy = False
            if not busy:
                self.stop_event.wait(POLL_SECONDS)

    @property
    def progress_dir(self) -> Path:
        return self.spool.dir / PROGRESS_DIR

    # ------------------------------------------------------------------ upload

    def _manager(self, query_id: str) -> BackupManager:
        m = self._managers.get(query_id)
        if m is None:
            m = BackupManager(
                self.store,
                self.pool,
                owner=SnapshotOwner(query_id),
                config=self.backup_config,
                metrics=self.metrics,
            )
            self._managers[query_id] = m
        return m

    def _refresh_bases(self, query_id: str, keys: list[str]) -> int:
        """Make every store's diff base at least as new as the latest checkpoint's snapshot; return the
        latest checkpoint's state version (0: none).

        A base of the committed version that is not the committed snapshot itself (this version was
        uploaded twice, e.g. by a task retried after an executor died, and the checkpoint took the
        other upload) is replaced by the committed one: cleanup deletes replaced blobs along the
        checkpointed chain only, so diffing against the other upload would leak the committed one.
        An upgrade of the committed snapshot (the same version re-uploaded, diffed against the committed
        one, after Spark published a snapshot that shortens its recipe) stays the base whether or not
        the committer has checkpointed it yet: cleanup follows the chain back to the checkpointed one
        (BackupManager.cleanup). So is a newer base that was uploaded more than commitTimeout ago and
        never checkpointed (its batch failed, or the store moved away and back): GC may delete its
        files once they are older than its grace, so new snapshots must not keep referring to them."""
        latest = self.log.read_latest(query_id)
        if latest is None:
            return 0
        if self.app_id and latest.writer_app_id == self.app_id:
            self._owned.add(query_id)
        elif latest.writer_app_id and query_id in self._owned:
            raise _Fenced(query_id, latest.writer_app_id, str(latest.checkpoint_id))
        committed_version = latest.batch_id + 1
        manager = self._manager(query_id)
        stale = {}
        for key in keys:
            base = self._bases.get((query_id, key))
            marker = latest.marker(BLOBSTORE_BACKEND, key)
            uploaded_at = self._base_uploaded_at.get((query_id, key), 0.0)
            abandoned = (
                base is not None
                and base > committed_version
                and (time.monotonic() - uploaded_at > self.settings.commit_timeout_seconds)
            )
            other_upload = (
                base == committed_version
                and manager.previous_marker(key) != marker
                and manager.previous_parent(key) != marker  # not an upgrade of the committed snapshot
            )
            if marker is not None and (base is None or base < committed_version or other_upload or abandoned):
                stale[key] = marker
        loads = [partial(_load_base, self.store, query_id, k, m) for k, m in stale.items()]
        loaded = self.pool.run_all(loads)
        for (key, marker), index in zip(stale.items(), loaded, strict=True):
            if isinstance(index, UnusableMarkerError):
                # Data, not an instruction: never diff against it (cleanup would delete what it names
                # as "replaced"), nor against an older base (cleanup after the checkpoints since may
                # have deleted its files): this store's next snapshot is uploaded whole.
                log.error(
                    "query %s: latest checkpoint %s: %s; store %s is uploaded afresh with no diff base",
                    query_id,
                    latest.checkpoint_id,
                    index,
                    key,
                )
                manager.set_base(key, None)
            else:
                manager.set_base(key, (marker, index))
            self._bases[(query_id, key)] = committed_version
        return committed_version

    def upload_once(self) -> bool:
        """Upload the newest staged version of every store with pending events; True if any work."""
        pending = sp.claimed(self.spool.events_dir) + self.spool.pending_events()
        if not pending:
            return False
        events: list[tuple[Path, sp.SnapshotEvent]] = []
        for path in pending:
            claimed = path if path.parent.name == sp.CLAIMED_DIR else sp.claim(path)
            if claimed is None:
                continue
            try:
                events.append((claimed, _check_staged_layout(sp.read_event(claimed), claimed)))
            except (StateBackendError, OSError) as e:
                log.error("sidecar %s: bad snapshot event %s: %s", self.executor_id, claimed, e)
                sp.quarantine(claimed)
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
                        store_key(*ev.instance),
                        ev.version,
                        ev.checkpoint_root,
                    )
                    self._discard(path, ev)
                    continue
                ev = dataclasses.replace(ev, query_id=qid)
            k = (ev.query_id or "", store_key(*ev.instance))
            old = newest.get(k)
            if old is None or _recency(ev) >= _recency(old[1]):
                if old is not None:
                    log.info(
                        "query %s store %s: skipping version %d, version %d is staged",
                        k[0],
                        k[1],
                        old[1].version,
                        ev.version,
                    )
                    self._discard(*old)
                newest[k] = (path, ev)
            else:
                self._discard(path, ev)
        groups: dict[tuple[str, int], list[tuple[Path, sp.SnapshotEvent]]] = {}
        for (qid, _), item in newest.items():
            groups.setdefault((qid, item[1].version), []).append(item)
        busy = False
        now = time.monotonic()
        self._retry = {g: r for g, r in self._retry.items() if g in groups}  # superseded ones are gone
        for (qid, version), items in sorted(groups.items(), key=lambda g: g[0][1]):
            retry = self._retry.get((qid, version))
            if retry is not None and now < retry[1]:
                continue  # failed a moment ago: its retry is not due yet
            self._upload_group(qid, version, items)
            busy = True
        return busy

    def _upload_group(self, query_id: str, version: int, items: list[tuple[Path, sp.SnapshotEvent]]) -> None:
        self._write_status(in_flight_ms=min(ev.created_at_ms for _, ev in items))
        try:
            committed = self._refresh_bases(query_id, [store_key(*ev.instance) for _, ev in items])
            # Already checkpointed (a restarted sidecar redoing its predecessor's claimed events):
            # uploading it again would only leave a second, unreferenced copy. Except an upgrade of the
            # checkpointed version itself: the committer checkpoints it in place of the first upload.
            done = [
                (p, ev) for p, ev in items if version < committed or (version == committed and not ev.upgrade)
            ]
            if done:
                log.info(
                    "query %s version %d: already checkpointed; not uploaded again (%d store(s))",
                    query_id,
                    version,
                    len(done),
                )
                for path, ev in done:
                    self._lagging.pop((query_id, store_key(*ev.instance)), None)
                    self._discard(path, ev)
                items = [item for item in items if item not in done]
                if not items:
                    self._retry.pop((query_id, version), None)
                    return
            dirs = {store_key(*ev.instance): ev.staged_dir for _, ev in items}
            recipes = {
                store_key(*ev.instance): StoreRecipe(
                    snapshot_version=ev.version if ev.snapshot_version is None else ev.snapshot_version,
                    changelog_versions=ev.changelog_versions,
                    spark_unique_id=ev.spark_unique_id,
                )
                for _, ev in items
            }
            upgrades = {store_key(*ev.instance) for _, ev in items if ev.upgrade}
            markers = self._manager(query_id).upload(
                f"v{version:012d}", dirs, versions=dict.fromkeys(dirs, version), recipes=recipes
            )
            for key, marker in markers.items():
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
                    restore_rate=self.metrics.value("ssb_restore_last_rate_bytes_per_second"),
                    upload_rate=self.metrics.value("ssb_backup_upload_rate_bytes_per_second", store=key),
                    upgrade=key in upgrades,
                )
                self._bases[(query_id, key)] = version
                self._base_uploaded_at[(query_id, key)] = time.monotonic()
                self._lagging.pop((query_id, key), None)
            self._retry.pop((query_id, version), None)
            for path, ev in items:
                self._discard(path, ev)
            log.info(
                "query %s version %d: %d store(s) uploaded by executor %s",
                query_id,
                version,
                len(items),
                self.executor_id,
            )
        except _Fenced as e:
            # A zombie: another application took the query over and checkpoints it now. Upload nothing
            # more for it, and keep its snapshots counted as lag so this application's commits of the
            # query block after maxCommitDelay and fail after commitTimeout instead of running on.
            if query_id not in self._fenced:
                self._fenced.add(query_id)
                log.error(
                    "query %s: application %s (checkpoint %s) now owns this query; application %s was "
                    "fenced: executor %s uploads nothing more for it, and its commits block",
                    query_id,
                    e.owner,
                    e.checkpoint_id,
                    self.app_id,
                    self.executor_id,
                )
            for path, ev in items:
                k = (query_id, store_key(*ev.instance))
                self._lagging[k] = min(self._lagging.get(k, ev.created_at_ms), ev.created_at_ms)
                self._discard(path, ev)
        except Exception as e:
            self._upload_failed(query_id, version, items, e)
        finally:
            self._write_status(in_flight_ms=None)

    def _upload_failed(
        self, query_id: str, version: int, items: list[tuple[Path, sp.SnapshotEvent]], error: Exception
    ) -> None:
        """Keep the snapshots for a retry and count them as lag (module doc), or give up on them once
        commitTimeout has passed since they were staged (the shim has failed those commits by then)."""
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
                self._lagging.pop((query_id, store_key(*ev.instance)), None)
                self._discard(path, ev)
            self._retry.pop((query_id, version), None)
            return
        failures = self._retry.get((query_id, version), (0, 0.0))[0] + 1
        delay = min(RETRY_INITIAL_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS)
        self._retry[(query_id, version)] = (failures, time.monotonic() + delay)
        for _, ev in items:
            k = (query_id, store_key(*ev.instance))
            self._lagging[k] = min(self._lagging.get(k, ev.created_at_ms), ev.created_at_ms)
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

    def _discard(self, path: Path, ev: sp.SnapshotEvent) -> None:
        shutil.rmtree(ev.staged_dir, ignore_errors=True)
        sp.remove(path)

    def _write_status(self, in_flight_ms: int | None) -> None:
        """status.json for the shim's commit gate: the staging time of the oldest snapshot not yet
        uploaded, in flight (`in_flight_ms`) or failed and waiting for a retry (`_lagging`)."""
        times = [*self._lagging.values(), *([in_flight_ms] if in_flight_ms is not None else [])]
        self._oldest_staged_ms = min(times) if times else None
        sp.atomic_write_json(
            self.spool.dir / STATUS_FILE,
            {
                "schema_version": 1,
                "oldest_upload_staged_at_ms": min(times) if times else None,
                "updated_at_ms": int(time.time() * 1000),
            },
            fsync=False,
        )

    # ------------------------------------------------------------------ restore

    def restore_once(self) -> bool:
        """Dispatch pending restore requests to the bounded restore pool; True if any was dispatched.

        When every slot is taken the rest stay in the spool (back-pressure) until a restore ends. The
        first call also takes requests a dead predecessor had claimed (see `_serve_request`)."""
        busy = False
        paths = self.spool.pending_requests()
        if not self._requests_recovered:
            paths = sp.claimed(self.spool.requests_dir) + paths
            self._requests_recovered = True
        for path in paths:
            with self._lock:
                if path.name in self._in_progress:
                    continue
                self._in_progress.add(path.name)
            if self.restore_pool.try_submit(partial(self._serve_request, path)) is None:
                with self._lock:
                    self._in_progress.discard(path.name)
                break
            busy = True
        return busy

    def _serve_request(self, path: Path) -> None:
        """Answer one restore request (spool.py protocol). The files are placed in the store's dir only
        after the request is taken (renamed into requests/claimed/) while the JVM still waits: a
        request the JVM deleted (it gave up at restoreTimeout) is never merged, and gets no answer."""
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

            def may_place() -> str | None:
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
                if isinstance(req, sp.CheckpointLocationRequest):
                    status, message, files, nbytes = self.prepare_checkpoint_location(req)
                else:
                    status, message, files, nbytes = self.restore(req, may_place=may_place)
            except _Withdrawn:
                assert isinstance(req, sp.RestoreRequest)
                log.warning(
                    "restore of query %s store %s version %s: the JVM stopped waiting (restoreTimeout) and "
                    "withdrew its request before the files were placed; nothing was merged into %s, "
                    "Spark's own files decide",
                    req.query_id,
                    store_key(*req.instance),
                    req.version,
                    req.dfs_dir,
                )
                return
            except Exception as e:
                log.exception("request %s failed", path)
                status, message, files, nbytes = "error", f"{type(e).__name__}: {e}", 0, 0
            self.spool.write_response(
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
                self._in_progress.discard(path.name)

    def resolve_query_id(self, checkpoint_root: Path) -> str | None:
        """The query a checkpoint root belongs to: Spark's `metadata` file there (on the driver's
        host), else the locator the committer wrote to the blob store; None if neither knows it."""
        from .spark import read_query_id

        return read_query_id(checkpoint_root) or read_locator(
            self.store, str(checkpoint_root), self.log.read_latest
        )

    def prepare_checkpoint_location(
        self, req: sp.CheckpointLocationRequest
    ) -> tuple[sp.RestoreStatus, str, int, int]:
        """Serve a checkpoint-location request (spool.py): rebuild the driver's files of the query's
        latest durable checkpoint if needed. 'restored' with what was done, or 'error' saying why the
        query must not start; never starts a known query from scratch."""
        from .spark import restore_checkpoint_location

        outcome = restore_checkpoint_location(
            self.settings, str(req.checkpoint_root), mode=req.mode, store=self.store, checkpoint_log=self.log
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
            f"too late to place the restored files of store {store_key(*req.instance)} version "
            f"{req.version}: the JVM has waited {waited:.1f}s of its restoreTimeout ({timeout:.1f}s) and "
            f"loads Spark's own files then; nothing was merged into {req.dfs_dir}"
        )

    def find_marker(self, query_id: str, key: str, version: int | None) -> tuple[str | None, str]:
        """The blob-store marker of store `key` at state `version` (None: the latest checkpoint's),
        from the retained checkpoints."""
        history: list[CheckpointV2] = []
        latest = self.log.read_latest(query_id)
        if version is None:
            if latest is None:
                return None, f"query {query_id} has no checkpoint"
            version = latest.batch_id + 1
        if latest is not None and latest.batch_id + 1 == version:
            history = [latest]
        else:
            history = [c for c in self.log.read_history(query_id) if c.batch_id + 1 == version]
        if not history:
            have = "none" if latest is None else f"batch {latest.batch_id} (version {latest.batch_id + 1})"
            return None, f"no retained checkpoint of query {query_id} holds version {version}; latest: {have}"
        marker = history[-1].marker(BLOBSTORE_BACKEND, key)
        if marker is None:
            return None, f"checkpoint {history[-1].checkpoint_id} has no blob-store marker for store {key}"
        return marker, ""

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
            log.error("restore store %s: %s", store_key(*req.instance), why)
            return "not_found", why, 0, 0
        req = dataclasses.replace(req, query_id=query_id)
        key = store_key(*req.instance)
        with self._lock:
            lock = self._store_restore_locks.setdefault((str(req.checkpoint_root), key), threading.Lock())
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
        marker, why = self.find_marker(req.query_id, key, req.version)
        if marker is None:
            # version None comes from a task outside a micro-batch (state reader, offline repartition):
            # a store the latest checkpoint lacks is normally one that repartition creates empty, and
            # Spark fails loudly by itself if it must read a store that has no files.
            level = logging.WARNING if req.version is None else logging.ERROR
            log.log(level, "restore query %s store %s version %s: %s", req.query_id, key, req.version, why)
            return "not_found", why, 0, 0
        scratch_rel = ("_statebackend", "restore", key.replace("/", "_"))
        scratch = req.checkpoint_root.joinpath(*scratch_rel)
        try:
            # Neither the store's dir nor the scratch dir may lie behind a symlink planted under the
            # checkpoint location (nofollow.py): the restore would write, and its cleanup delete,
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
            index = load_snapshot_index(self.store, marker)
            result = self.restorer.restore(marker, scratch, reuse_dirs=[req.dfs_dir], index=index)
        except StateBackendError as e:  # missing / corrupt / hostile index or blob, store failure
            # The snapshot the checkpoint names is unusable: say so, naming the blob, and leave the
            # store's dir untouched so the JVM falls back to Spark's own files (Spark fails loudly if
            # those are missing too; it never starts from empty state because of this).
            shutil.rmtree(scratch, ignore_errors=True)
            status: sp.RestoreStatus = (
                "not_found" if isinstance(e, BlobNotFoundError) and e.blob_id == marker else "error"
            )
            why = f"snapshot {marker} of store {key} version {req.version} is unusable: {e}"
            log.error("restore query %s: %s; Spark's own files decide", req.query_id, why)
            return status, why, 0, 0
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
            moved = move_tree_into(scratch, req.checkpoint_root, dfs_rel)
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

    # ------------------------------------------------------------------ commit

    def commit_once(self) -> bool:
        """Hand new progress events to the committer, then let it commit what it can.

        An event is claimed, not removed, until its batch is checkpointed or dropped (`_progress_done`):
        a sidecar that starts after a crash submits its predecessor's claimed events again first."""
        busy = False
        paths = sp.list_pending(self.progress_dir)
        if not self._progress_recovered:
            paths = sp.claimed(self.progress_dir) + paths
            self._progress_recovered = True
        for path in paths:
            busy = True
            claimed = path if path.parent.name == sp.CLAIMED_DIR else sp.claim(path)
            if claimed is None:
                continue
            try:
                event = _read_progress_event(claimed, self.resolve_query_id)
            except StateBackendError as e:
                # Quarantined and skipped: one bad file must never hold up the events after it.
                log.error("bad progress event %s: %s", claimed, e)
                sp.quarantine(claimed)
                continue
            if event is None:
                sp.remove(claimed)
            else:
                self.committer.submit(event)
        self.committer.maybe_sweep()  # only starts it, on its own thread, when due
        busy = self.committer.maybe_refresh() > 0 or busy  # upgraded snapshots of checkpointed versions
        if self.committer.pending():
            return self.committer.poll() > 0 or busy
        return busy

    def _progress_done(self, event: ProgressEvent) -> None:
        if event.source:
            sp.remove(event.source)


class _Fenced(Exception):
    """The query's latest checkpoint was written by another application after this one's."""

    def __init__(self, query_id: str, owner: str, checkpoint_id: str) -> None:
        super().__init__(f"query {query_id} is owned by application {owner} (checkpoint {checkpoint_id})")
        self.owner = owner
        self.checkpoint_id = checkpoint_id


class _Withdrawn(Exception):
    """The JVM deleted its restore request (it stopped waiting) before the files were placed."""


def _read_progress_event(path: Path, resolve_query_id: Callable[[Path], str | None]) -> ProgressEvent | None:
    """The ProgressEvent in spool file `path` (a finished micro-batch, or an offline commit whose
    query id, if absent, `resolve_query_id` finds from its checkpoint root), or None for a file of
    another type (skipped).

    Raises StateBackendError naming `path` for anything else: unreadable, not JSON, JSON that is not
    an object (the file, or its `progress_json`), a missing or mistyped field."""
    try:
        doc = orjson.loads(path.read_bytes())
        if not isinstance(doc, dict):
            raise TypeError(f"not a JSON object but {type(doc).__name__}")
        if doc.get("type") == "offline_commit":
            if doc.get("query_id") is None and isinstance(doc.get("checkpoint_root"), str):
                doc["query_id"] = resolve_query_id(Path(doc["checkpoint_root"]))
            return ProgressEvent.offline_commit(doc, str(path))
        if doc.get("type") != "progress":
            return None
        progress = orjson.loads(doc["progress_json"])
        if not isinstance(progress, dict):
            raise TypeError(f"progress_json is not a JSON object but {type(progress).__name__}")
        root = doc["checkpoint_root"]
        if not isinstance(root, str):
            raise TypeError(f"checkpoint_root is not a string but {type(root).__name__}")
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise StateBackendError(f"malformed progress event {path}: {e!r}") from None
    return ProgressEvent.from_progress_json(progress, root, str(path))


def _load_base(store: BlobStore, query_id: str, key: str, marker: str) -> SnapshotIndex | UnusableMarkerError:
    """The SnapshotIndex of a checkpointed marker, or the UnusableMarkerError saying why it is none."""
    try:
        return load_marker_index(store, query_id, key, marker)
    except UnusableMarkerError as e:
        return e


def _recency(ev: sp.SnapshotEvent) -> tuple[int, int, int]:
    """Which of two staged events of one store wins: the newer version; for one version the recipe
    from the newer snapshot (an upgrade), then the one staged last (a retried task)."""
    snapshot = ev.version if ev.snapshot_version is None else ev.snapshot_version
    return (ev.version, snapshot, ev.created_at_ms)


def _check_staged_layout(ev: sp.SnapshotEvent, source: Path) -> sp.SnapshotEvent:
    """Return `ev` if its query id is usable and its staged dir has the shim's layout,
    `.../<op>/<part>/<store>/<version>-<rand>` (spool.py), else raise SpoolFormatError. The sidecar
    uploads that dir and then deletes it, so an event naming any other directory (a hostile or
    corrupt one) must be refused before either."""
    d = ev.staged_dir
    parts = d.parts
    ok = (
        len(parts) >= 5
        and ".." not in parts
        and d.name.startswith(f"{ev.version}-")
        and len(d.name) > len(f"{ev.version}-")
        and parts[-2] == sp.sanitize_id(ev.store)
        and parts[-3] == str(ev.partition)
        and parts[-4] == str(ev.operator)
    )
    if ev.query_id is not None:
        try:
            check_query_id(ev.query_id)
        except ValueError as e:
            raise sp.SpoolFormatError(source, str(e)) from None
    if not ok:
        raise sp.SpoolFormatError(
            source,
            f"staged_dir {str(d)!r} is not a staging dir of store {store_key(*ev.instance)} version "
            f"{ev.version} (<staging>/<app>/<op>/<part>/<store>/<version>-<random>); refused",
        )
    return ev


def _watch_parent(parent: int, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        if os.getppid() != parent:
            log.warning("executor JVM (pid %d) is gone; sidecar exiting", parent)
            stop.set()


def main(argv: list[str] | None = None) -> int:
    # The JVM that started us. It passes its pid: if it dies before or while we start (the blob store's
    # ensure_ready can wait out its whole retry budget), we are reparented, and a parent pid read then
    # would be the new parent's, whose death we would wait for instead, serving the dead application's
    # spool (and committing its claimed batches) for ever. Without --jvm-pid (an older shim), read it
    # before anything that can block.
    parent = os.getppid()
    ap = argparse.ArgumentParser(prog="spark_statebackend.sidecar", description=__doc__.splitlines()[0])
    ap.add_argument("--spool-dir", required=True, type=Path)
    ap.add_argument("--executor-id", required=True)
    ap.add_argument("--conf", required=True, type=Path, help="JSON file of spark.statebackend.* keys")
    ap.add_argument("--jvm-pid", type=int, help="the JVM that started this sidecar: exit once it is gone")
    args = ap.parse_args(argv)
    if args.jvm_pid is not None:
        parent = args.jvm_pid
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
    )
    conf: Mapping[str, str] = orjson.loads(args.conf.read_bytes())
    settings = Settings.from_conf({k: str(v) for k, v in conf.items() if k.startswith(PREFIX)})
    # Test-only crash points (crashpoints.py): armed only when spark.statebackend.test.crashAt is set.
    # The app's spool dir (shared by its sidecars and JVMs on this host) makes each fire once per app.
    crashpoints.arm(
        settings.test_crash_at, process=f"sidecar-{args.executor_id}", once_dir=args.spool_dir.parent
    )
    app_id = str(conf.get("spark.app.id", ""))
    sidecar = Sidecar(sp.Spool(args.spool_dir), args.executor_id, settings, app_id=app_id)
    # SIGTERM (the plugin stopping the application or executor): finish what is already staged and
    # committed first, bounded by drainTimeout; the parent's death (kill -9 of the JVM): stop at once.
    drain = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: drain.set())
    threading.Thread(
        target=_watch_parent, args=(parent, sidecar.stop_event), name="ssb-parent-watch", daemon=True
    ).start()
    sidecar.start()
    while not sidecar.stop_event.wait(0.1):
        if drain.is_set():
            sidecar.drain(settings.drain_timeout_seconds)
            break
    sidecar.stop_event.set()
    sidecar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
