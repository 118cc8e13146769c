"""End to end with real Spark queries: back up every batch, lose the local state, restart, compare.

Each run is a separate driver process (spark_statebackend/demo_app.py), so a test can kill -9 it.
The reference
is the same query on Spark's own RocksDB provider, run without interruption to the same batch id.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.stores import open_blob_store
from tests.demorig import (
    LAST,
    ROOT,
    app_command,
    assert_blob_store_exact,
    durable_batch,
    result,
    wipe_local_state,
)
from tests.servers.process import wait_until
from tests.servers.tansu import KafkaBroker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def run_app(
    work: Path,
    shape: str,
    until: int,
    *,
    plain: bool = False,
    master: str = "local[2]",
    log_url: str | None = None,
    timeout: float = 300,
) -> str:
    args = ("--plain",) if plain else ()
    if log_url:
        args += ("--log-url", log_url)
    cmd = app_command(work, shape, until, master=master, args=args)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    refs: dict[str, object] = {}
    for shape in ("agg", "dedup", "join", "window"):
        work = tmp_path_factory.mktemp(f"ref-{shape}")
        run_app(work, shape, LAST, plain=True)
        refs[shape] = result(work, shape)
        refs[f"{shape}-dir"] = work
    return refs


def assert_ssts_saved_by_links(work: Path) -> None:
    """linkSstFiles: the executors saved their SSTs into the checkpoint location as hard links
    (LinkingLocalFileSystem); Hadoop's copy would have written a .crc beside each one."""
    state = work / "ckpt" / "state"
    assert list(state.rglob("SSTs/*.sst")), "no SST in the checkpoint location"
    assert not list(state.rglob("SSTs/.*.crc")), "SSTs were copied by Hadoop's file system"


@pytest.mark.parametrize("shape", ["agg", "dedup", "join", "window"])
def test_restore_after_losing_all_local_state(
    shape: str, references: dict[str, object], tmp_path: Path
) -> None:
    run_app(tmp_path, shape, 2)
    wipe_local_state(tmp_path)
    out = run_app(tmp_path, shape, LAST)
    assert "CHECKPOINTED" in out
    assert result(tmp_path, shape) == references[shape]
    assert_blob_store_exact(tmp_path)
    sidecar_logs = "".join(p.read_text() for p in (tmp_path / "spool").rglob("sidecar.log"))
    assert "restored query" in sidecar_logs  # the state came back from the blob store
    # local[2]: the driver's sidecar serves the tasks too, so it restored the stores ahead of them.
    assert "ahead of their tasks" in sidecar_logs


def test_kill_9_driver_mid_stream(references: dict[str, object], tmp_path: Path) -> None:
    cmd = app_command(tmp_path, "agg", 1000)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or durable_batch(tmp_path) >= 3, 180, "checkpoint of batch 3"
        )
        assert proc.poll() is None, "the driver died on its own"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # driver JVM, Python and sidecar together
        proc.wait(timeout=30)
    out = run_app(tmp_path, "agg", LAST)
    assert "CHECKPOINTED" in out
    assert result(tmp_path, "agg") == references["agg"]
    assert_blob_store_exact(tmp_path)


# The join: four stores per partition on two executors. The single-store shapes (agg, dedup) run in local
# mode above, in the chaos run and (agg) on the multi-host rig.
@pytest.mark.parametrize("shape", ["join"])
def test_local_cluster_two_executors(shape: str, references: dict[str, object], tmp_path: Path) -> None:
    master = "local-cluster[2,1,1024]"
    run_app(tmp_path, shape, 2, master=master)
    assert_ssts_saved_by_links(tmp_path)
    executors = {p.parent.name for p in (tmp_path / "spool").rglob("sidecar.log")}
    assert {"0", "1"} <= executors, executors  # one sidecar per executor JVM
    # Each sidecar's log also went where Spark's executor logs go: the executor's stderr, which the
    # Spark UI's executor log links show and cluster managers aggregate.
    # local-cluster's workers keep them in <SPARK_HOME>/work/<app id>/<executor id>/.
    [app_id] = [p.name for p in (tmp_path / "spool").iterdir() if p.is_dir()]
    import pyspark

    app_dir = Path(pyspark.__file__).resolve().parent / "work" / app_id
    try:
        for executor in ("0", "1"):
            text = (app_dir / executor / "stderr").read_text(errors="replace")
            forwarded = rf"\[sidecar {executor}\] .* sidecar for executor {executor} serving"
            assert re.search(forwarded, text), text[-3000:]
    finally:
        shutil.rmtree(app_dir, ignore_errors=True)  # it is inside the installed pyspark
    wipe_local_state(tmp_path)
    run_app(tmp_path, shape, LAST, master=master)
    assert result(tmp_path, shape) == references[shape]
    assert_ssts_saved_by_links(tmp_path)
    assert_blob_store_exact(tmp_path)
    sidecar_logs = "".join(p.read_text() for p in (tmp_path / "spool").rglob("sidecar.log"))
    assert "restored query" in sidecar_logs  # the state came back from the blob store
    # Executors with sidecars of their own restore what they load, each on its host: none ahead.
    assert "ahead of their tasks" not in sidecar_logs


def test_checkpoints_on_a_kafka_topic(
    kafka_broker: KafkaBroker, references: dict[str, object], tmp_path: Path
) -> None:
    log_url = f"kafka://{kafka_broker.bootstrap}/ssb-e2e-{os.getpid()}-{time.time_ns()}"
    run_app(tmp_path, "agg", 2, log_url=log_url)
    cplog = open_checkpoint_log(log_url)
    store = open_blob_store((tmp_path / "blobs").as_uri())
    qids = {b.blob_id.split("/")[1] for b in store.list("indexes/")}
    assert len(qids) == 1
    history = cplog.read_history(qids.pop())
    batches = [c.batch_id for c in history]
    assert batches == sorted(set(batches)) and batches[-1] == 2  # one checkpoint per batch, in order
    wipe_local_state(tmp_path)
    run_app(tmp_path, "agg", LAST, log_url=log_url)
    assert result(tmp_path, "agg") == references["agg"]


def _executor_pid(executor_id: str, app_marker: Path) -> int:
    """Pid of the executor JVM with this id whose spool lives under `app_marker` (this test's app)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        is_executor = (
            "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and "--executor-id" in cmd
        )
        if (
            is_executor
            and cmd[cmd.index("--executor-id") + 1] == executor_id
            and app_marker.name in " ".join(cmd)
        ):
            return int(proc.pid)
    raise AssertionError(f"no executor JVM {executor_id} for {app_marker.name}")


def test_local_cluster_executor_killed_its_partitions_restored_elsewhere(
    references: dict[str, object], tmp_path: Path
) -> None:
    """kill -9 one executor JVM between batches and lose its partitions' files, as a lost host would;
    the partitions are restored from the blob store by another executor and the results stay exact."""
    import re

    last = 4
    cmd = app_command(tmp_path, "agg", last, master="local-cluster[2,1,1024]", args=("--trigger-ms", "8000"))
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:

        def durable(n: int) -> bool:
            assert proc.poll() is None, "the driver exited early"
            return durable_batch(tmp_path) >= n

        wait_until(lambda: durable(1), 240, "checkpoint of batch 1")
        app_dir = next(p for p in (tmp_path / "spool").iterdir() if p.is_dir())
        log0 = (app_dir / "0" / "sidecar.log").read_text()
        victims = {int(p) for p in re.findall(r"store 0/(\d+)/default uploaded", log0)}
        assert victims, "executor 0 uploaded no partition"
        os.kill(_executor_pid("0", app_dir), signal.SIGKILL)
        for p in victims:  # its host is gone: so are the files of its partitions
            shutil.rmtree(tmp_path / "ckpt" / "state" / "0" / str(p), ignore_errors=True)
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 0, out[-4000:]
    assert result(tmp_path, "agg", last) == result(references["agg-dir"], "agg", last)  # type: ignore[arg-type]
    restored = set()
    for d in app_dir.iterdir():
        if d.name not in ("0", "driver") and (d / "sidecar.log").exists():
            restored |= {
                int(p)
                for p in re.findall(
                    r"restored query \S+ store 0/(\d+)/default", (d / "sidecar.log").read_text()
                )
            }
    assert victims <= restored, f"partitions {victims} of the killed executor; restored elsewhere: {restored}"
