"""An idle sidecar waits instead of polling (runtime/spool/wake.py): its loops block until the JVM puts a
file into the dir they serve (inotify), their own timer is due, the stop, or at worst a fallback. Real
sidecar threads, real inotify, local blob store, file checkpoint log."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_statebackend.lifecycle.reports import read_reports
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.restore_loop import RESTORE_QUEUE, RESTORE_WORKERS
from spark_statebackend.runtime.sidecar import METRICS_FILE, Sidecar
from spark_statebackend.runtime.spool import wake
from spark_statebackend.runtime.spool.wake import SpoolWatch, Wake
from spark_statebackend.settings import PREFIX, Settings
from tests.staging import stage_version

QID = "3d1f0a52-7c4e-4b8a-9e61-2f5a8c0d4b17"
LOOPS = ("upload", "restore", "commit")


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Turns:
    """When each loop of a sidecar ended a turn (monotonic seconds), recorded around its real step."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.at: dict[str, list[float]] = {name: [] for name in LOOPS}
        self._lock = threading.Lock()
        sidecar.uploads.upload_once = self._counted("upload", sidecar.uploads.upload_once)  # type: ignore[method-assign]
        sidecar.restores.restore_once = self._counted("restore", sidecar.restores.restore_once)  # type: ignore[method-assign]
        sidecar.commits.commit_once = self._counted("commit", sidecar.commits.commit_once)  # type: ignore[method-assign]

    def _counted(self, name: str, step: Callable[[], bool]) -> Callable[[], bool]:
        def turn() -> bool:
            try:
                return step()
            finally:
                with self._lock:
                    self.at[name].append(time.monotonic())

        return turn

    def count(self, name: str) -> int:
        with self._lock:
            return len(self.at[name])


def _started(tmp: Path, monkeypatch: pytest.MonkeyPatch, fallback_seconds: float) -> tuple[Sidecar, Turns]:
    monkeypatch.setattr(wake, "FALLBACK_SECONDS", fallback_seconds)  # read by every Wake made from now on
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp / "log").as_uri(),
        }
    )
    sidecar = Sidecar(sp.Spool(tmp / "spool"), "driver", settings)
    turns = Turns(sidecar)
    sidecar.start()
    _wait_for("every loop's first turn", lambda: all(turns.count(n) >= 1 for n in LOOPS))
    return sidecar, turns


@pytest.fixture
def stopping() -> Iterator[list[Sidecar]]:
    started: list[Sidecar] = []
    yield started
    for sidecar in started:
        sidecar.stop(10)
        sidecar.close()


def test_an_idle_sidecar_s_loops_sleep_until_their_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[Sidecar]
) -> None:
    sidecar, turns = _started(tmp_path, monkeypatch, fallback_seconds=0.5)
    stopping.append(sidecar)
    _wait_for("three turns of every loop", lambda: all(turns.count(n) >= 3 for n in LOOPS))
    for name in LOOPS:
        at = turns.at[name][:3]
        gaps = [b - a for a, b in itertools.pairwise(at)]
        # Polling every 20 ms (before) turned each loop 50 times a second with nothing to do.
        assert min(gaps) >= 0.4, f"the idle {name} loop turned again after {min(gaps):.3f}s"


@pytest.mark.parametrize("how", ["renamed into place", "written in place"])
def test_a_snapshot_event_wakes_the_upload_loop_long_before_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[Sidecar], how: str
) -> None:
    sidecar, turns = _started(tmp_path, monkeypatch, fallback_seconds=60.0)
    stopping.append(sidecar)
    before = turns.count("upload")
    root = tmp_path / "cp"
    started = time.monotonic()
    if how == "written in place":  # a writer that closes the file it wrote in the dir itself
        staged = stage_version(sidecar, root, QID, 0, 1)
    else:  # the JVM: a finished file renamed into the dir
        outside = tmp_path / "outside"
        outside.mkdir()
        staged = stage_version(SimpleNamespace(spool=SimpleNamespace(events_dir=outside)), root, QID, 0, 1)  # type: ignore[arg-type]
        (event,) = outside.iterdir()
        os.rename(event, sidecar.spool.events_dir / event.name)
    _wait_for(
        "the upload of version 1",
        lambda: not staged.exists() and "0/0/default" in read_reports(sidecar.store, QID, 1),
        timeout=20.0,
    )
    assert time.monotonic() - started < 20.0  # a third of the fallback: the event itself woke the loop
    # The turn the event woke, and at most one more (inotify's events of that turn's own look).
    assert turns.count("upload") - before <= 3


def test_the_stop_wakes_waiting_loops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[Sidecar]
) -> None:
    sidecar, _ = _started(tmp_path, monkeypatch, fallback_seconds=60.0)
    stopping.append(sidecar)
    started = time.monotonic()
    assert sidecar.stop(20) is True, "a loop still waited for its fallback"
    assert time.monotonic() - started < 20.0


def test_a_dir_that_cannot_be_watched_is_polled_until_it_can(tmp_path: Path) -> None:
    later = tmp_path / "later"
    waiting = Wake(fallback_seconds=60.0)
    watch = SpoolWatch()
    watch.add(later, waiting)
    watch.start()
    try:
        assert not waiting.watched  # missing: its loop looks every UNWATCHED_POLL_SECONDS
        started = time.monotonic()
        assert not waiting.wait()
        assert time.monotonic() - started < 5.0, "an unwatched dir must be polled, not waited for"
        later.mkdir()
        _wait_for("the watch of the new dir", lambda: waiting.watched)
        waiting.wait(0)  # the wake-up that came with the watch: what arrived meanwhile is looked at
        (later / ".event.json.0.tmp").write_bytes(b"{")  # a temporary never wakes the loop
        assert not waiting.wait(0.3)
        os.rename(later / ".event.json.0.tmp", later / "event.json")
        started = time.monotonic()
        assert waiting.wait(30.0)
        assert time.monotonic() - started < 10.0
    finally:
        watch.close()


def test_a_sidecar_process_stops_on_sigterm_without_waiting_out_a_timer(tmp_path: Path) -> None:
    """The main thread blocks too (no 100 ms polling for the signal): SIGTERM's handler wakes it."""
    spool = sp.Spool(tmp_path / "spool")
    conf = tmp_path / "sidecar-conf.json"
    sp.atomic_write_json(
        conf,
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
            "spark.app.id": "app-wake",
        },
    )
    args = ["--spool-dir", str(spool.dir), "--executor-id", "driver", "--conf", str(conf)]
    proc = subprocess.Popen(
        [sys.executable, "-m", sp.SIDECAR_MODULE, *args, "--jvm-pid", str(os.getpid())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # Its first metrics, a second after the loops started: the main thread is in its wait by then.
        _wait_for("the sidecar's first metrics", (spool.dir / METRICS_FILE).exists, timeout=120)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        # Well under the main thread's fallback (60 s): the handler itself woke it.
        assert time.monotonic() - started < 20.0, out.decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out.decode()[-3000:]
    assert b"drained; stopping" in out


def test_a_request_left_in_the_spool_by_a_full_restore_pool_goes_once_a_slot_frees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[Sidecar]
) -> None:
    """Back-pressure: requests beyond the pool's slots stay in the spool, where no new file announces
    them again; the end of a restore wakes the dispatch loop instead of its fallback."""
    sidecar, _ = _started(tmp_path, monkeypatch, fallback_seconds=60.0)
    stopping.append(sidecar)
    gate = threading.Event()

    def gated_restore(
        req: sp.RestoreRequest, *, may_place: Callable[[], str | None] | None = None
    ) -> tuple[sp.RestoreStatus, str, int, int]:
        assert gate.wait(60), "the test never opened the gate"
        return "not_found", "gated", 0, 0

    sidecar.restores.restore = gated_restore  # type: ignore[method-assign]
    slots = RESTORE_WORKERS + RESTORE_QUEUE
    ids = [f"req-{i}" for i in range(slots + 4)]
    root = tmp_path / "cp"
    for request_id in ids:
        sidecar.spool.write_request(
            sp.RestoreRequest(
                request_id=request_id,
                query_id=QID,
                checkpoint_root=root,
                dfs_dir=root / "state/0/0",
                operator=0,
                partition=0,
                store="default",
                version=1,
                spark_unique_id=None,
                executor_id="driver",
                created_at_ms=int(time.time() * 1000),
            ),
            fsync=False,
        )
    _wait_for("every slot taken", lambda: len(sidecar.restores.in_progress) == slots)
    assert len(sidecar.spool.pending_requests()) == len(ids)  # the rest wait in the spool
    started = time.monotonic()
    gate.set()
    answered: set[str] = set()

    def all_answered() -> bool:
        answered.update(i for i in ids if sidecar.spool.take_response(i) is not None)
        return len(answered) == len(ids)

    _wait_for("every request answered", all_answered, timeout=30.0)
    assert time.monotonic() - started < 30.0  # half the fallback: the freed slots woke the dispatch
