"""Snapshots built from Spark's changelogs off the task thread, after uploads (setting
`changelogSnapshotEvery`; spark/materialize.py builds one, docs/changelog-snapshots.md says why).

After the upload loop uploads version v of a store whose recipe replays at least `every` changelogs
(changelog checkpointing, checkpoint format v1), `offer` queues `<v>.zip` to be built in the store's dir.
One build runs at a time, on the sidecar's `ssb-materialize` thread, in a child process at a lower CPU
priority (`nice`): it replays changelogs in Python and must not hold this process's GIL or the cores
the tasks and the uploads need. At most `MAX_QUEUED` stores wait; one offered meanwhile is skipped, and
its next upload offers it again. The next commit's recipe starts from the zip (jvm-bridge Recipe), so it
is uploaded like a snapshot of Spark's own; before that, the sidecar stages it as an upgrade of its
version (`on_built`, built_staging.py), so it is uploaded between commits rather than in the next
commit's durable wait. A build starts once the executor's commits are done (`busy`), so it runs
between batches, not while the tasks commit. A build that fails is logged (WARNING, naming query, store,
version and why) and changes nothing: Spark's changelogs stay, and the next upload offers it again.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..common.metrics import Metrics
from ..common.nofollow import DirTree, remove_below
from ..errors import StateBackendError
from ..spark.location import MATERIALIZE_PARTS
from .spool import SnapshotEvent

log = logging.getLogger("spark_statebackend.materialize")

#: Stores waiting for (or in) a build; more offered meanwhile are skipped until their next upload.
MAX_QUEUED = 8
#: A build taking longer is killed (logged); the store is offered again at its next upload.
BUILD_TIMEOUT_S = 900.0
#: Builds wait for the executor's commits to finish (`busy`) until it has been busy this long without
#: a pause; then they run anyway until it pauses.
YIELD_MAX_S = 30.0
#: How often a waiting build looks whether the commits have finished (only while one waits).
YIELD_POLL_S = 0.05


class Materializer:
    """Builds `<v>.zip` of stores from their changelogs (module doc), one at a time. Any thread."""

    def __init__(
        self,
        every: int,
        metrics: Metrics,
        python: str = sys.executable,
        on_built: Callable[[str, SnapshotEvent], object] | None = None,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        """`every`: changelogSnapshotEvery (0: off, `offer` does nothing); `metrics`: the sidecar's
        (ssb_changelog_snapshots by result: built, exists, failed; ssb_changelog_snapshot_seconds);
        `python`: runs the builds; `on_built(query_id, event)`: called on the build thread after each
        build that published `<event.version>.zip` (the sidecar stages it: built_staging.py);
        `busy()`: True while this executor commits a batch (UploadLoop.committing): a build starts
        only once it is False, or after YIELD_MAX_S, so that neither its CPU and disk writes nor its
        upgrade's upload slow the commits down."""
        self.every = every
        self.metrics = metrics
        self.python = python
        self.on_built = on_built
        self.busy = busy
        self._stop = threading.Event()
        self._busy_since: float | None = None  # build thread's: since when busy() has said True
        self._lock = threading.Lock()
        self._queued: set[Path] = set()  # store dirs
        self._child: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssb-materialize")

    def offer(self, query_id: str, ev: SnapshotEvent) -> Future[None] | None:
        """Queue a build of `<ev.version>.zip` when `ev` (just uploaded) replays `every` changelogs or
        more; the build's future, or None when nothing was queued (off, short recipe, checkpoint format
        v2, the store queued already, the queue full, closed)."""
        if (
            not self.every
            or len(ev.changelog_versions) < self.every
            or ev.spark_unique_id is not None  # checkpoint format v2: Spark's own snapshots only
        ):
            return None
        with self._lock:
            if self._closed or ev.dfs_dir in self._queued or len(self._queued) >= MAX_QUEUED:
                return None
            self._queued.add(ev.dfs_dir)
        future = self._pool.submit(self._build, query_id, ev)
        future.add_done_callback(lambda _: self._done(ev.dfs_dir))
        return future

    def _done(self, store_dir: Path) -> None:
        with self._lock:
            self._queued.discard(store_dir)

    def _build(self, query_id: str, ev: SnapshotEvent) -> None:
        name = uuid.uuid4().hex
        scratch = ev.checkpoint_root.joinpath(*MATERIALIZE_PARTS, name)
        what = f"query {query_id} store {ev.instance.key} version {ev.version}"
        started = time.monotonic()
        try:
            self._yield_to_commits()
            with DirTree(ev.checkpoint_root) as tree:  # UnsafePathError for a symlink among them
                tree.dir_fd(MATERIALIZE_PARTS, create=True)
            cmd = [self.python, "-m", "spark_statebackend.spark.materialize"]
            cmd += [str(ev.checkpoint_root), str(ev.dfs_dir), str(ev.version), str(scratch)]
            nice = shutil.which("nice")
            with self._lock:
                if self._closed:
                    return
                self._child = subprocess.Popen(
                    [nice, "-n", "10", *cmd] if nice else cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                child = self._child
            try:
                out, err = child.communicate(timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
                err += f"\nkilled after {BUILD_TIMEOUT_S:.0f}s".encode()
            finally:
                with self._lock:
                    self._child = None
            result = "failed" if child.returncode else "built"
            if child.returncode == 0 and out.strip() == b"exists":
                result = "exists"
            self.metrics.changelog_snapshots.labels(result).inc()
            if child.returncode == 0:
                elapsed = time.monotonic() - started
                self.metrics.changelog_snapshot_seconds.observe(elapsed)
                log.info(
                    "%s: snapshot built from %d changelog(s) in %.2fs: %s",
                    what,
                    len(ev.changelog_versions),
                    elapsed,
                    out.decode(errors="replace").strip(),
                )
                if result == "built" and self.on_built is not None:
                    self.on_built(query_id, ev)
            else:
                log.warning(
                    "%s: no snapshot built from its changelogs in %s (exit %s): %s; loads replay them "
                    "until the next build",
                    what,
                    ev.dfs_dir,
                    child.returncode,
                    err.decode(errors="replace").strip()[-2000:],
                )
        except Exception:
            self.metrics.changelog_snapshots.labels("failed").inc()
            log.exception("%s: building a snapshot from its changelogs in %s failed", what, ev.dfs_dir)
        finally:
            _remove_scratch(ev.checkpoint_root, name)

    def _yield_to_commits(self) -> None:
        """Wait while `busy()`, or until closed; but once the executor has been busy for YIELD_MAX_S
        without a pause (a query that commits all the time), builds run without waiting until it
        pauses, so the replay stays bounded under any load."""
        while self.busy is not None and self.busy():
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = now
            if now - self._busy_since >= YIELD_MAX_S or self._stop.wait(YIELD_POLL_S):
                return
        self._busy_since = None

    def flush(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the builds offered before this call to end (TimeoutError
        after that); at once when closed. One build runs at a time, in the order offered."""
        with self._lock:
            if self._closed:
                return
            marker = self._pool.submit(lambda: None)
        marker.result(timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Drop queued builds, kill a running one and wait up to `timeout` for its thread."""
        self._stop.set()
        with self._lock:
            self._closed = True
            child = self._child
        if child is not None:
            child.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)
        waiter = threading.Thread(
            target=self._pool.shutdown, kwargs={"wait": True}, name="ssb-materialize-close", daemon=True
        )
        waiter.start()
        waiter.join(timeout)


def _remove_scratch(root: Path, name: str) -> None:
    """Remove a build's scratch dir `name` without following a symlink below `root`."""
    try:
        remove_below(root, (*MATERIALIZE_PARTS, name))
    except (OSError, StateBackendError) as e:  # UnsafePathError: refused, logged when it was created
        log.warning("cannot remove the snapshot build dir %s: %s", root.joinpath(*MATERIALIZE_PARTS, name), e)
