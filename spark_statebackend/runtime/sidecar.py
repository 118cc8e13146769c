"""The sidecar: one Python process per executor JVM doing the blob-store work the shim hands it.

    python -m spark_statebackend.runtime.sidecar --spool-dir DIR --executor-id ID --conf FILE

It serves one spool dir (runtime/spool: the protocol) with three loops, each on its own named thread
and with its own state: the upload loop (upload_loop.py, `ssb-upload`: [C3]-[C4]), the restore loop
(restore_loop.py, `ssb-restore-dispatch` and its pool `ssb-restore-*`: [E2]-[E5], [D1]) and the commit
loop (commit_loop.py, `ssb-commit`: the driver's committer, [C5]-[C6]). Step numbers refer to
runtime/__init__.py. A fourth thread (`ssb-metrics`) publishes its metrics every second. Between two
turns a loop with nothing to do blocks (spool/wake.py) until the JVM writes a file into its spool dir
(inotify, read by the thread `ssb-spool-watch`), its own next timer is due, the sidecar stops, or at
worst a second has passed: an idle sidecar costs next to no CPU.

A sidecar started after its predecessor died (kill -9, or a crash point under test) redoes the
predecessor's claimed work: claimed snapshot events are uploaded unless their version is already
checkpointed, claimed progress events are committed, pending and taken restore requests are served.
On SIGTERM (the plugin stopping the application or executor) it first finishes the uploads and
checkpoints already handed over, and the turn each loop is in (a checkpoint's cleanup), for at most
drainTimeout. It exits when its parent (the executor JVM)
goes away, even after a kill -9 of the JVM.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import orjson

from ..checkpoints.logs import CheckpointLog, open_checkpoint_log
from ..common import crashpoints
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig
from ..engine.diff import DiffOptions
from ..engine.restore import RestoreConfig, RestoreManager
from ..engine.transfer import TransferPool
from ..settings import PREFIX, Settings
from ..spark.location import find_query_id
from ..stores import BlobStore, open_blob_store
from ..stores.counting import CountingBlobStore
from . import spool as sp
from .commit_loop import PROGRESS_DIR, CommitLoop, progress_done
from .committer import Committer
from .ownership import Ownership
from .restore_loop import RestoreLoop
from .spool.wake import SpoolWatch, StopEvent, Wake
from .upload_loop import UploadLoop

log = logging.getLogger("spark_statebackend.sidecar")  # name kept from the flat layout

METRICS_FILE = "metrics.json"
METRICS_SECONDS = 1.0
POLL_SECONDS = 0.02  # drain() only: how often a stopping sidecar looks whether its work is done
PARENT_POLL_SECONDS = 0.5  # without a pidfd: how often the parent JVM is looked for


class Sidecar:
    """One sidecar process over one spool directory: its loops and what they share (module doc)."""

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
        """`app_id`: the identity of the application attempt this sidecar serves (runtime/spool
        `app_identity`: the app id itself for an application without attempts); its reports and
        checkpoints carry it, the committer takes only its own identity's reports, and a checkpoint of
        another identity fences it (runtime/committer.py: zombies)."""
        self.app_id = app_id
        self.spool = spool
        self.executor_id = executor_id
        self.settings = settings
        self.metrics = metrics or Metrics(per_store=settings.metrics_per_store)
        # Every request to the store it opens is counted (ssb_blob_requests): what a batch costs in
        # requests, beside its bytes. A store handed in (tests) is used as it is.
        self.store = store or CountingBlobStore(
            open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url"),
            self.metrics.blob_requests,
        )
        self.log = checkpoint_log or open_checkpoint_log(
            settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url"
        )
        self.pool = TransferPool(settings.workers, name="ssb-transfer")  # every blob transfer
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
        # Who owns each query, as this process knows it (ownership.py): one instance for all three loops.
        self.ownership = Ownership(app_id)
        self.committer = self._committer()
        self.uploads = self._upload_loop()
        self.restores = RestoreLoop(
            spool,
            settings,
            store=self.store,
            checkpoint_log=self.log,
            restorer=self.restorer,
            resolve_query_id=self.resolve_query_id,
            ownership=self.ownership,
        )
        self.commits = CommitLoop(self.progress_dir, self.committer, self.resolve_query_id)
        # What each loop's thread blocks on between turns (spool/wake.py): its spool dir's new files,
        # its own timers, the stop.
        self.wakes = {n: Wake() for n in ("ssb-upload", "ssb-commit", "ssb-stream")}
        self.wakes["ssb-restore-dispatch"] = self.restores.wake
        self.spool_watch = SpoolWatch()
        self.stop_event = StopEvent()
        self.stop_event.add(*self.wakes.values())
        self._threads: list[threading.Thread] = []

    def _committer(self) -> Committer:
        """The driver's committer over this sidecar's store, log and pool (constructed on every
        sidecar; only the driver's is fed progress events)."""
        settings = self.settings
        return Committer(
            self.store,
            self.log,
            self.pool,
            backup_config=self.backup_config,
            commit_timeout_seconds=settings.commit_timeout_seconds,
            retain_checkpoints=settings.retain_checkpoints,
            metrics=self.metrics,
            on_done=progress_done,
            sweep_interval_seconds=settings.sweep_interval_seconds,
            app_id=self.app_id,
            spool_dir=self.spool.dir,
            ownership=self.ownership,
        )

    def _upload_loop(self) -> UploadLoop:
        """The upload loop of this sidecar's spool dir, sharing its store, log, pool and ownership."""
        return UploadLoop(
            self.spool,
            self.executor_id,
            self.settings,
            store=self.store,
            checkpoint_log=self.log,
            pool=self.pool,
            metrics=self.metrics,
            backup_config=self.backup_config,
            app_id=self.app_id,
            resolve_query_id=self.resolve_query_id,
            ownership=self.ownership,
            # Only the driver's sidecar commits: an executor's committer is never asked, and would only
            # accumulate what it is told.
            reported_here=self.committer.uploaded_here if self.executor_id == "driver" else None,
        )

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def from_conf(cls, spool: sp.Spool, executor_id: str, conf: Mapping[str, object]) -> Sidecar:
        """The sidecar a JVM describes in `sidecar-conf.json` (runtime/spool: "Sidecar command"): its
        settings are the conf's `spark.statebackend.*` keys, its application identity is the one
        `spark.app.id` and `spark.app.attempt.id` name (`sp.conf_app_identity`). Raises ConfigError
        naming the key on a bad setting."""
        settings = Settings.from_conf({k: str(v) for k, v in conf.items() if k.startswith(PREFIX)})
        return cls(spool, executor_id, settings, app_id=sp.conf_app_identity(conf))

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
            self.spool.streams_dir,
            self.progress_dir,
        ):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as the JVM's (runtime/spool)
        self.spool.write_sidecar_marker(self.executor_id)
        # Watched before the loops' first turn: a file written after that turn's look wakes the next.
        self.spool_watch.add(self.spool.events_dir, self.wakes["ssb-upload"])
        self.spool_watch.add(self.spool.requests_dir, self.wakes["ssb-restore-dispatch"])
        self.spool_watch.add(self.progress_dir, self.wakes["ssb-commit"])
        self.spool_watch.add(self.spool.streams_dir, self.wakes["ssb-stream"])
        self.spool_watch.start()
        loops: list[tuple[str, Callable[[], bool], Callable[[], float | None]]] = [
            ("ssb-upload", self.uploads.upload_once, self.uploads.due_in),
            ("ssb-restore-dispatch", self.restores.restore_once, lambda: None),  # no timers
            ("ssb-commit", self.commits.commit_once, self.commits.due_in),
            ("ssb-stream", self.uploads.streams.turn, self.uploads.streams.due_in),
        ]
        threads = [
            threading.Thread(target=self._loop, args=(step, self.wakes[name], due_in), name=name, daemon=True)
            for name, step, due_in in loops
        ]
        threads.append(threading.Thread(target=self._publish_metrics, name="ssb-metrics", daemon=True))
        for t in threads:
            t.start()
        self._threads = threads
        log.info("sidecar for executor %s serving %s (pid %d)", self.executor_id, self.spool.dir, os.getpid())
        return threads

    def _publish_metrics(self) -> None:
        """Every METRICS_SECONDS, write this sidecar's metric samples to `metrics.json` in its spool dir,
        where the JVM plugin turns them into Spark metrics (common/metrics.py)."""
        while not self.stop_event.wait(METRICS_SECONDS):
            try:
                staged = self.uploads.lag.oldest_staged_ms
                self.metrics.upload_lag.set(0.0 if staged is None else max(0.0, time.time() - staged / 1000))
                # Rewritten every time, changed or not: its age tells that this sidecar is alive.
                body = orjson.dumps({"schema_version": 1, "samples": self.metrics.samples()})
                sp.atomic_write_bytes(self.spool.dir / METRICS_FILE, body, fsync=False)
            except Exception:
                log.exception("sidecar %s: publishing metrics failed; retrying", self.executor_id)

    def idle(self) -> bool:
        """True when nothing staged waits for an upload and the committer has no batch pending."""
        uploads = self.spool.unfinished_events()
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
                    len(self.spool.unfinished_events()),
                    self.committer.pending(),
                )
                return False
            time.sleep(POLL_SECONDS)
        log.info("sidecar %s: drained; stopping", self.executor_id)
        return True

    def stop(self, timeout_seconds: float) -> bool:
        """Tell the loops to stop and wait, at most `timeout_seconds` in all, for each to finish the turn
        it is in; True if all did. A turn can outlive the work `idle()` sees: the committer hands a
        batch back once its checkpoint is written, then cleans up after it (runtime/cleanup.py), and an
        exit in the middle of that cleanup leaves the replaced checkpoint's record naming blobs that
        already expire (the next committer's start repairs it, but a stopped query may never start
        again). A turn still running at the deadline is logged and abandoned, as after a crash."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout_seconds
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        running = [t.name for t in self._threads if t.is_alive()]
        if running:
            log.warning(
                "sidecar %s: stopping while %s is still in a turn after %.0fs; its work is redone or "
                "repaired by the next sidecar of the application (as after a crash)",
                self.executor_id,
                ", ".join(running),
                timeout_seconds,
            )
        return not running

    def close(self) -> None:
        self.stop_event.set()
        self.spool_watch.close()
        self.restores.close()  # at most RESTORE_QUEUE queued: answered
        self.uploads.materializer.close()
        self.uploads.streams.close()
        self.committer.close()
        self.pool.close()
        self.spool.remove_sidecar_marker()
        self.log.close()
        self.store.close()

    def _loop(self, step: Callable[[], bool], wake: Wake, due_in: Callable[[], float | None]) -> None:
        """Run one loop's turns (`step`: True if it did work) until the stop; after a turn without
        work, block until there is some (spool/wake.py): a new file in the loop's dir, the loop's
        next timer (`due_in`: seconds, None: none), the stop, or at worst the wake's fallback."""
        while not self.stop_event.is_set():
            try:
                busy = step()
                timeout = None if busy else due_in()
            except Exception:
                log.exception("sidecar %s: %s failed; retrying", self.executor_id, step.__name__)
                busy, timeout = False, None
            if not busy:
                wake.wait(timeout)

    @property
    def progress_dir(self) -> Path:
        return self.spool.dir / PROGRESS_DIR

    def resolve_query_id(self, checkpoint_root: Path) -> str | None:
        """The query a checkpoint root belongs to: Spark's `metadata` file there (on the driver's
        host), else the locator the committer wrote to the blob store; None if neither knows it."""
        return find_query_id(checkpoint_root, self.store, self.log.read_latest)


def _watch_parent(parent: int, stop: threading.Event) -> None:
    """Set `stop` once the JVM `parent` is gone (we were reparented). Blocks on a pidfd of it where the
    kernel has them (Linux 5.3+), else looks every PARENT_POLL_SECONDS."""
    pidfd = _open_pidfd(parent)
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("executor JVM (pid %d) is gone; sidecar exiting", parent)
            stop.set()
            return
        if pidfd is None:
            stop.wait(PARENT_POLL_SECONDS)
            continue
        select.select([pidfd], [], [])  # readable once the process has exited
        os.close(pidfd)
        pidfd = None  # reparenting precedes it; should getppid() lag, look again as without one


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of `pid`, or None (no pidfd_open on this OS or kernel, or a seccomp filter denies it)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def main(argv: list[str] | None = None) -> int:
    # The JVM that started us. It passes its pid: if it dies before or while we start (the blob store's
    # ensure_ready can wait out its whole retry budget), we are reparented, and a parent pid read then
    # would be the new parent's, whose death we would wait for instead, serving the dead application's
    # spool (and committing its claimed batches) for ever. Without --jvm-pid (an older shim), read it
    # before anything that can block.
    parent = os.getppid()
    ap = argparse.ArgumentParser(
        prog="spark_statebackend.runtime.sidecar", description=__doc__.splitlines()[0]
    )
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
    conf: Mapping[str, object] = orjson.loads(args.conf.read_bytes())
    sidecar = Sidecar.from_conf(sp.Spool(args.spool_dir), args.executor_id, conf)
    settings = sidecar.settings
    # Test-only crash points (common/crashpoints.py): armed only when spark.statebackend.test.crashAt is set,
    # before any loop runs. The application attempt's spool dir (shared by its sidecars and JVMs on this
    # host) makes each fire once per application attempt.
    crashpoints.arm(
        settings.test_crash_at, process=f"sidecar-{args.executor_id}", once_dir=args.spool_dir.parent
    )
    # SIGTERM (the plugin stopping the application or executor): finish what is already staged and
    # committed first, bounded by drainTimeout; the parent's death (kill -9 of the JVM): stop at once.
    drain = threading.Event()  # only set by the handler, only read here: no lock of it is ever held
    # A pipe: what a signal handler may poke without taking a lock. Both that and the stop notify it,
    # so its fallback only bounds the damage of a bug.
    woken = Wake(fallback_seconds=60.0)
    sidecar.stop_event.add(woken)

    def on_sigterm(*_: object) -> None:
        drain.set()
        woken.notify()

    signal.signal(signal.SIGTERM, on_sigterm)
    # The handler runs on the main thread only, and only once it runs again: should the kernel hand the
    # signal to another thread, this wakes the main thread from its wait (the handler notifies too).
    signal.set_wakeup_fd(woken.notify_fd(), warn_on_full_buffer=False)
    threading.Thread(
        target=_watch_parent, args=(parent, sidecar.stop_event), name="ssb-parent-watch", daemon=True
    ).start()
    sidecar.start()
    while not sidecar.stop_event.is_set():
        if drain.is_set():
            # Both within drainTimeout: the JVM waits that long (plus 5 s) before it kills us.
            deadline = time.monotonic() + settings.drain_timeout_seconds
            sidecar.drain(settings.drain_timeout_seconds)
            sidecar.stop(max(0.0, deadline - time.monotonic()))
            break
        woken.wait()
    sidecar.stop_event.set()
    sidecar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
