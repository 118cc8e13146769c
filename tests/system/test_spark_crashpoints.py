"""Crash points with real Spark: kill -9 at each step of the commit and restore lifecycle, in the driver,
a sidecar and an executor; the query resumes from the last durable checkpoint with exactly the output
of an uninterrupted run, and the blob store ends up holding exactly what the checkpoints reference.

Every run is a driver process (spark_statebackend/demo_app.py, the `agg` shape) started in its own
session, so the test can kill whatever a crash left behind by process group. Crash points are armed
with `spark.statebackend.test.crashAt` (crashpoints.py): `after_staging` halts the JVM that staged a
version (in local mode the driver's, so the whole application dies and the test starts it again); a
crash point in a sidecar kills only that sidecar, which the plugin restarts at once and which must
finish its predecessor's work; `/driver` kills the PySpark driver process itself. After each crash
run the test wipes the local state (a new host) or keeps it (same host), runs the query on to batch
LAST, and compares with a reference run on Spark's own provider.

Process layout: in local[2] one JVM is driver and executor and one sidecar (`sidecar-driver`) does
uploads, restores and commits, which makes it the cheap layout for the per-point matrix. In
local-cluster[2,1,1024] each executor JVM has its own sidecar (`sidecar-0`, `sidecar-1`) and the
driver's sidecar runs the committer; one run there crashes an executor JVM, an executor sidecar and
the driver's sidecar (three times), and the restart run crashes an executor sidecar mid-restore.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.common import crashpoints as cp
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.stores import open_blob_store
from tests.changelogrig import CHANGELOG, assert_backed_up_in_changelog_mode, conf_args
from tests.demorig import (
    ROOT,
    app_command,
    assert_exact_after_gc,
    durable_batch,
    query_id_of,
    result,
    wipe_local_state,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

LAST = 6
SHAPE = "agg"
LOCAL_CLUSTER = "local-cluster[2,1,1024]"


def run_app(
    work: Path,
    until: int,
    *,
    crash_at: str = "",
    master: str = "local[2]",
    plain: bool = False,
    extra: tuple[str, ...] = (),
) -> tuple[int, str]:
    """Run the driver to batch `until` (`extra`: more demo_app arguments); return (exit code, its
    output). Whatever a crash left running in the driver's process group (JVM, sidecars) is killed
    afterwards."""
    args = ("--plain",) if plain else ()
    args += extra
    if crash_at:
        args += ("--extra", f"{cp.KEY}={crash_at}")
    cmd = app_command(work, SHAPE, until, master=master, args=args)
    work.mkdir(parents=True, exist_ok=True)
    out_path = work / f"driver-{len(list(work.glob('driver-*.log')))}.log"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=400)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return code, out_path.read_text(errors="replace")


def run_ok(
    work: Path,
    until: int,
    *,
    crash_at: str = "",
    master: str = "local[2]",
    plain: bool = False,
    extra: tuple[str, ...] = (),
) -> str:
    code, out = run_app(work, until, crash_at=crash_at, master=master, plain=plain, extra=extra)
    assert code == 0, f"driver failed ({code}):\n{out[-6000:]}"
    return out


def sidecar_logs(work: Path) -> dict[str, str]:
    """Executor id -> its sidecar log (all sidecars it had), for the application(s) under work/spool."""
    logs: dict[str, str] = {}
    for p in (work / "spool").glob("*/*/sidecar.log"):
        logs[p.parent.name] = logs.get(p.parent.name, "") + p.read_text(errors="replace")
    return logs


def starts(log: str) -> int:
    return len(re.findall(r"sidecar for executor \S+ serving", log))


def assert_rebuilt(work: Path, durable: int) -> None:
    """The driver's sidecar (asked by the JVM before Spark read the location) rebuilt the checkpoint
    location from exactly the durable checkpoint of `durable`."""
    log = sidecar_logs(work).get("driver", "")
    assert re.search(rf"rebuilt from checkpoint \S+ \(batch {durable};", log), log[-4000:]


def latest_batch(work: Path) -> int:
    query_id_of(work)  # exactly one query
    batch = durable_batch(work)
    assert batch >= 0, "no durable checkpoint"
    return batch


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> object:
    work = tmp_path_factory.mktemp("ref-agg")
    run_ok(work, LAST, plain=True)
    return result(work, SHAPE, LAST)


def resume_and_check(work: Path, reference: object, *, wiped: bool) -> None:
    """Run on to LAST from the last durable checkpoint; same output as the reference; exact blobs."""
    durable = latest_batch(work)
    if wiped:
        wipe_local_state(work)
    run_ok(work, LAST)
    if wiped:  # the driver rebuilt its checkpoint location from exactly the durable checkpoint
        assert_rebuilt(work, durable)
        assert "restored query" in "".join(sidecar_logs(work).values())  # state came from the blob store
    assert result(work, SHAPE, LAST) == reference
    assert_exact_after_gc(work)


# Hit counts for local[2] `agg` (2 state partitions): per batch the sidecar uploads 2 store versions
# (2 new files each), the committer the `_driver` snapshot (7 files at batch 0, then 2), writes the
# checkpoint and cleans up 3 stores. Each n lands in batch 1 or 2, after a first durable checkpoint.
SIDECAR_POINTS = {
    cp.DURING_FILE_UPLOAD: 14,
    cp.BEFORE_INDEX_UPLOAD: 4,
    cp.BEFORE_CHECKPOINT_WRITE: 2,
    cp.AFTER_CHECKPOINT_WRITE: 2,
    cp.DURING_CLEANUP: 5,
}


@pytest.mark.parametrize("point", list(SIDECAR_POINTS))
def test_local_sidecar_killed(point: str, reference: object, tmp_path: Path) -> None:
    """The sidecar (uploads + committer) dies at `point`; the plugin restarts it, the new one finishes
    the claimed work, the run checkpoints its last batch; then a new host resumes from the blob store."""
    out = run_ok(tmp_path, 3, crash_at=f"{point}@{SIDECAR_POINTS[point]}/sidecar-driver")
    log = sidecar_logs(tmp_path)["driver"]
    assert f"TEST CRASH POINT {point}" in log
    assert starts(log) == 2, "the plugin restarted the dead sidecar once"
    assert "CHECKPOINTED 3" in out
    resume_and_check(tmp_path, reference, wiped=True)


def test_local_jvm_killed_after_staging(reference: object, tmp_path: Path) -> None:
    """The JVM halts right after staging a version (local mode: the whole driver dies); the restarted
    application on the same host resumes from the last durable checkpoint."""
    code, out = run_app(tmp_path, LAST, crash_at=f"{cp.AFTER_STAGING}@3")
    assert code != 0 and "TEST CRASH POINT after_staging (hit 3) in jvm-driver" in out, out[-4000:]
    assert "CHECKPOINTED" not in out
    resume_and_check(tmp_path, reference, wiped=False)


def test_local_driver_sidecar_killed_while_rebuilding_then_during_a_store_restore(
    reference: object, tmp_path: Path
) -> None:
    """On a new host the driver's sidecar dies while rebuilding the checkpoint location (its first
    restored file) and its replacement, on the same request the JVM is waiting for, rebuilds it from
    the start; in the next run on a new host, the sidecar dies while restoring a store and the
    replacement serves the waiting request. Both runs end with exactly the reference output."""
    run_ok(tmp_path, 2)
    durable = latest_batch(tmp_path)
    wipe_local_state(tmp_path)
    out = run_ok(tmp_path, 4, crash_at=f"{cp.DURING_RESTORE}@1/sidecar-driver")
    log = sidecar_logs(tmp_path)["driver"]
    assert "TEST CRASH POINT during_restore (hit 1) in sidecar-driver" in log
    before, _, after = log.partition("TEST CRASH POINT during_restore")
    assert "rebuilt from checkpoint" not in before, "the crash came in the middle of the rebuild"
    assert starts(log) == 2
    assert_rebuilt(tmp_path, durable)
    assert "CHECKPOINTED 4" in out

    durable = latest_batch(tmp_path)
    store = open_blob_store((tmp_path / "blobs").as_uri())
    latest = open_checkpoint_log((tmp_path / "log").as_uri()).read_latest(query_id_of(tmp_path))
    assert latest is not None
    driver_marker = latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE)
    assert driver_marker is not None
    driver_files = load_snapshot_index(store, driver_marker).dir_index.file_count()
    wipe_local_state(tmp_path)
    run_ok(tmp_path, LAST, crash_at=f"{cp.DURING_RESTORE}@{driver_files + 2}/sidecar-driver")
    log = sidecar_logs(tmp_path)["driver"]
    assert_rebuilt(tmp_path, durable)
    assert f"TEST CRASH POINT during_restore (hit {driver_files + 2}) in sidecar-driver" in log
    before, _, after = log.partition("TEST CRASH POINT during_restore")
    assert "restored query" not in before and "restored query" in after  # the replacement served it
    assert starts(log) == 2
    assert result(tmp_path, SHAPE, LAST) == reference
    assert_exact_after_gc(tmp_path)


def test_local_cluster_crashes_in_executor_jvm_executor_sidecar_and_driver_sidecar(
    reference: object, tmp_path: Path
) -> None:
    """local-cluster: executor 0's JVM halts after staging (Spark retries its task elsewhere),
    executor 1's sidecar dies before an index upload and (restarted) during a file upload, and the
    driver's sidecar (the committer) dies before a checkpoint write, after one and during a cleanup;
    the run still checkpoints every batch it needs. A new host then restores, with an executor
    sidecar dying mid-restore."""
    crashes = ",".join(
        [
            f"{cp.AFTER_STAGING}@2/jvm-0",
            f"{cp.DURING_FILE_UPLOAD}@3/sidecar-1",
            f"{cp.BEFORE_INDEX_UPLOAD}@1/sidecar-1",
            f"{cp.BEFORE_CHECKPOINT_WRITE}@2/sidecar-driver",
            f"{cp.AFTER_CHECKPOINT_WRITE}@2/sidecar-driver",
            f"{cp.DURING_CLEANUP}@4/sidecar-driver",
        ]
    )
    out = run_ok(tmp_path, 4, crash_at=crashes, master=LOCAL_CLUSTER)
    assert "CHECKPOINTED 4" in out
    logs = sidecar_logs(tmp_path)
    fired = next((tmp_path / "spool").glob(f"*/{cp.FIRED_DIR}"))
    assert {p.name for p in fired.iterdir()} == {
        cp.AFTER_STAGING,
        cp.DURING_FILE_UPLOAD,
        cp.BEFORE_INDEX_UPLOAD,
        cp.BEFORE_CHECKPOINT_WRITE,
        cp.AFTER_CHECKPOINT_WRITE,
        cp.DURING_CLEANUP,
    }
    assert starts(logs["driver"]) == 4, "the committer's sidecar was restarted after each of its 3 crashes"
    for point in (cp.BEFORE_INDEX_UPLOAD, cp.DURING_FILE_UPLOAD):
        assert f"TEST CRASH POINT {point}" in logs["1"]
    assert starts(logs["1"]) == 3, "executor 1's sidecar was restarted after each of its 2 crashes"
    assert "executor JVM" in logs["0"] and "is gone" in logs["0"]  # executor 0's sidecar saw it die
    durable = latest_batch(tmp_path)
    wipe_local_state(tmp_path)
    # Either executor's sidecar, whichever restores a store first (a point fires once per application);
    # not the driver's, which rebuilds the checkpoint location first.
    either = f"{cp.DURING_RESTORE}/sidecar-0,{cp.DURING_RESTORE}/sidecar-1"
    run_ok(tmp_path, LAST, crash_at=either, master=LOCAL_CLUSTER)
    assert_rebuilt(tmp_path, durable)
    logs = sidecar_logs(tmp_path)
    crashed = [e for e, log in logs.items() if "TEST CRASH POINT during_restore" in log]
    assert len(crashed) == 1 and crashed[0] != "driver" and starts(logs[crashed[0]]) == 2, sorted(logs)
    assert "restored query" in logs[crashed[0]]  # its replacement served the request
    assert result(tmp_path, SHAPE, LAST) == reference
    assert_exact_after_gc(tmp_path)


def test_changelog_mode_crashes_in_the_jvm_the_sidecar_and_a_store_restore(
    reference: object, tmp_path: Path
) -> None:
    """Changelog checkpointing (changelogrig.CHANGELOG: snapshots every 2 versions, made by
    Spark's maintenance thread). The JVM halts right after staging a changelog commit (local mode: the
    application dies); the restarted application, on the same host, loses its sidecar during a file
    upload and again before a checkpoint write, and still checkpoints; then a new host restores and the
    sidecar dies in the middle of a store's restore (changelogs and snapshot files), its replacement
    serves the waiting request, and the query runs on with exactly the reference output. The blob
    store holds exactly what the checkpoints reference after each phase."""
    changelog = conf_args("--extra", CHANGELOG)
    code, out = run_app(tmp_path, LAST, crash_at=f"{cp.AFTER_STAGING}@3", extra=changelog)
    assert code != 0 and "TEST CRASH POINT after_staging (hit 3) in jvm-driver" in out, out[-4000:]
    assert "CHECKPOINTED" not in out
    shutil.rmtree(tmp_path / "spool", ignore_errors=True)  # the dead app's: keeps the counts below simple

    crashes = f"{cp.DURING_FILE_UPLOAD}@3/sidecar-driver,{cp.BEFORE_CHECKPOINT_WRITE}@1/sidecar-driver"
    out = run_ok(tmp_path, 3, crash_at=crashes, extra=changelog)
    assert "CHECKPOINTED 3" in out
    log = sidecar_logs(tmp_path)["driver"]
    for point in (cp.DURING_FILE_UPLOAD, cp.BEFORE_CHECKPOINT_WRITE):
        assert f"TEST CRASH POINT {point}" in log
    assert starts(log) == 3, "the plugin restarted the dead sidecar after each of its 2 crashes"
    # Where these runs stop depends on the crashes, so the checkpointed version may be one Spark has a
    # snapshot of (an upgrade: no changelog to replay); Spark's files say the mode was on.
    assert any((tmp_path / "ckpt" / "state" / "0" / "0").glob("*.changelog"))
    assert_backed_up_in_changelog_mode(tmp_path, replays=False)
    assert_exact_after_gc(tmp_path)

    # A new host: the driver's sidecar first rebuilds the checkpoint location (one restored file per
    # file of the `_driver` snapshot, each a hit of during_restore), then restores the stores; crash
    # at the second file of the first store.
    durable = latest_batch(tmp_path)
    store = open_blob_store((tmp_path / "blobs").as_uri())
    latest = open_checkpoint_log((tmp_path / "log").as_uri()).read_latest(query_id_of(tmp_path))
    assert latest is not None
    driver_marker = latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE)
    assert driver_marker is not None
    driver_files = load_snapshot_index(store, driver_marker).dir_index.file_count()
    wipe_local_state(tmp_path)
    out = run_ok(
        tmp_path, LAST, crash_at=f"{cp.DURING_RESTORE}@{driver_files + 2}/sidecar-driver", extra=changelog
    )
    log = sidecar_logs(tmp_path)["driver"]
    # The driver's sidecar rebuilt the location from exactly the durable checkpoint, then crashed.
    assert_rebuilt(tmp_path, durable)
    assert f"TEST CRASH POINT during_restore (hit {driver_files + 2}) in sidecar-driver" in log
    assert starts(log) == 2
    before, _, after = log.partition("TEST CRASH POINT during_restore")
    assert "restored query" not in before, "the crash came after a store restore, not during one"
    assert "restored query" in after  # the replacement served the store restore the JVM waited for
    assert result(tmp_path, SHAPE, LAST) == reference
    assert_backed_up_in_changelog_mode(tmp_path, replays=False)
    assert_exact_after_gc(tmp_path)
