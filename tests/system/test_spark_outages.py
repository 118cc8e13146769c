"""The Kafka checkpoint broker unreachable for longer than maxCommitDelay, with real Spark (issue 6).

The broker is Tansu, which keeps its topics in memory, so it is never killed: it is frozen with
SIGSTOP (its connections hang, as in a network partition) and thawed with SIGCONT. The query is the
`agg` shape of demo_app in local[2] with maxCommitDelay=2s, so the designed behaviour is observable in
seconds (sidecar.py and CommitGate.java):

- a sidecar upload first reads the query's latest checkpoint (to check its diff base), so with the
  log frozen it stalls, then fails after `read.timeout` (3 s here) and is retried with backoff; the
  snapshot keeps counting as lag in `status.json` all along;
- once that lag passes maxCommitDelay the shim blocks the next commit of each store (the gate file
  `commit-gate.json` appears): the query stops; no checkpoint can be written;
- the broker back, the retried upload succeeds, the gate lets go, and the committer checkpoints the
  newest batch whose stores have all uploaded (intermediate batches are skipped, not written late);
- a blocked commit that waits longer than commitTimeout fails its task and so the query, with an
  error naming both settings; the restart resumes from the last durable checkpoint.

The gate is what holds commits with `durableCommit=false` (ASYNC below); with the default
`durableCommit=true` each commit waits for its own upload instead, and the same outage fails the
query after commitTimeout with an error naming durableCommit and commitTimeout.

Each run is compared with an uninterrupted run on Spark's own provider, after a restart with all local
state wiped, and the blob store must hold exactly the referenced blobs after GC and the TTL sweep.

Last, the plugin's restart limit: a sidecar that keeps dying is given up after 5 restarts, and the
query then fails with an error naming that cause (at the driver's next batch plan, or at the commit
gate) instead of running on without backups.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.gc import GarbageCollector
from spark_statebackend.lifecycle.plans import plan_batches, plan_id
from spark_statebackend.runtime import spool as sp
from spark_statebackend.stores import open_blob_store
from tests.demorig import ROOT, app_command, durable_batch, result, wipe_local_state
from tests.demorig import assert_exact_after_gc as assert_file_log_exact_after_gc
from tests.servers.process import ServerProcess, wait_until
from tests.servers.process import freeze as freeze_pid

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

SHAPE = "agg"
LAST = 34
MAX_COMMIT_DELAY_S = 2
LOG_TIMEOUT_MS = 3000  # read.timeout / write.timeout of the checkpoint log
#: Uploads after the commit: the commit gate is what holds commits back (module doc).
ASYNC = ("spark.statebackend.durableCommit=false",)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> object:
    work = tmp_path_factory.mktemp("ref-agg")
    cmd = app_command(work, SHAPE, LAST, args=("--plain",))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return result(work, SHAPE, LAST)


class Driver:
    """One demo_app run in its own session (so whatever it leaves running can be killed by group)."""

    def __init__(
        self, work: Path, until: int, log_url: str | None, commit_timeout: str, extra: tuple[str, ...] = ()
    ) -> None:
        self.work = work
        conf = [
            f"spark.statebackend.maxCommitDelay={MAX_COMMIT_DELAY_S}s",
            f"spark.statebackend.commitTimeout={commit_timeout}",
            *extra,
        ]
        args: tuple[str, ...] = ()
        if log_url is not None:
            args = ("--log-url", log_url)
            conf += [
                "spark.statebackend.checkpointLog.options.replication.factor=1",
                f"spark.statebackend.checkpointLog.options.read.timeout={LOG_TIMEOUT_MS}ms",
                f"spark.statebackend.checkpointLog.options.write.timeout={LOG_TIMEOUT_MS}ms",
            ]
        args += tuple(a for c in conf for a in ("--extra", c))
        work.mkdir(parents=True, exist_ok=True)
        self.out_path = work / f"driver-{len(list(work.glob('driver-*.log')))}.log"
        self._out = open(self.out_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            app_command(work, SHAPE, until, args=args),
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def last_batch(self) -> int:
        """The newest batch the query has finished (demo_app prints BATCH <id>)."""
        return max((int(b) for b in re.findall(r"^BATCH (\d+)$", self.output(), re.M)), default=-1)

    def alive(self) -> bool:
        """True while the driver runs; fails the test, with its output, once it has exited."""
        code = self.proc.poll()
        assert code is None, f"the driver exited ({code}):\n{self.output()[-4000:]}"
        return True

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # JVM and sidecar too
        self.proc.wait(timeout=30)
        self._out.close()


def durable(work: Path, log_url: str) -> int:
    """The query's newest checkpointed batch in the Kafka log (-1: none yet). The broker must be up."""
    store = open_blob_store((work / "blobs").as_uri())
    qids = {b.blob_id.split("/")[1] for b in store.list("indexes/")}
    if not qids:
        return -1
    assert len(qids) == 1, qids
    latest = open_checkpoint_log(log_url, {"replication.factor": "1"}).read_latest(qids.pop())
    return -1 if latest is None else latest.batch_id


def history(work: Path, log_url: str) -> list[int]:
    store = open_blob_store((work / "blobs").as_uri())
    (qid,) = {b.blob_id.split("/")[1] for b in store.list("indexes/")}
    return [c.batch_id for c in open_checkpoint_log(log_url).read_history(qid)]


def spool_files(work: Path, name: str) -> list[Path]:
    return list((work / "spool").glob(f"*/driver/{name}"))


def sidecar_log(work: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (work / "spool").glob("*/driver/sidecar.log"))


def freeze(server: ServerProcess) -> None:
    freeze_pid(server.pid)


def thaw(server: ServerProcess) -> None:
    os.kill(server.pid, signal.SIGCONT)


def assert_exact_after_gc(work: Path, log_url: str) -> None:
    """GC (no grace) deletes none of the blobs the latest checkpoint references; every other blob
    carries a TTL; after the TTL sweep the store holds exactly the referenced ones (plus locators).
    With retainCheckpoints=1 only the latest checkpoint is restorable: Tansu never compacts, so the
    topic still holds older records whose blobs cleanup deleted (GC then reports them and deletes
    nothing of the query: never on a guess)."""
    store = open_blob_store((work / "blobs").as_uri())
    (qid,) = {b.blob_id.split("/")[1] for b in store.list("indexes/")}
    latest = open_checkpoint_log(log_url).read_latest(qid)
    assert latest is not None
    refs: set[str] = set()
    for marker in latest.markers(BLOBSTORE_BACKEND).values():
        refs |= {marker, *load_snapshot_index(store, marker).dir_index.present_blob_ids()}
    # The plans of batches Spark planned after the latest checkpoint stay (lifecycle/plans.py);
    # the ones a checkpoint covers are gone.
    plans = plan_batches(store, qid)
    assert all(b > latest.batch_id for b in plans), (plans, latest.batch_id)
    refs |= {plan_id(qid, b) for b in plans}
    with TransferPool(2) as pool:
        GarbageCollector(store, open_checkpoint_log(log_url), pool, grace_seconds=0).run()
    present = {b.blob_id for b in store.list("")}
    assert refs <= present, f"referenced blobs missing: {sorted(refs - present)[:5]}"
    extra = {b for b in present - refs if not b.startswith("queries/")}
    assert all(store.stat(b).expires_at_ms is not None for b in extra), sorted(extra)[:5]
    store.sweep_expired(now_ms=int(time.time() * 1000) + 30 * 86400 * 1000)
    assert {b.blob_id for b in store.list("") if not b.blob_id.startswith("queries/")} == refs


def resume_on_a_new_host(work: Path, log_url: str, reference: object) -> str:
    """Wipe every local file, run on to LAST (the driver rebuilds its checkpoint location from the
    Kafka log), compare with the reference; GC (no grace) keeps every referenced blob, and after it
    and the TTL sweep the store holds exactly those."""
    before = durable(work, log_url)
    wipe_local_state(work)
    driver = Driver(work, LAST, log_url, "60s")
    try:
        code = driver.wait(timeout=300)
    finally:
        driver.stop()
    out = driver.output()
    assert code == 0, out[-5000:]
    log = sidecar_log(work)  # the driver's sidecar rebuilt the location (the JVM asked it at start)
    assert re.search(rf"rebuilt from checkpoint \S+ \(batch {before};", log), log[-4000:]
    assert "restored query" in log  # the state came back from the blob store
    assert result(work, SHAPE, LAST) == reference
    assert_exact_after_gc(work, log_url)
    return out


def resume_on_the_same_host(work: Path, log_url: str, reference: object) -> None:
    """Run on to LAST on the same host (Spark's own files of the location as they are, [D3]), compare
    with the reference; the blob store is exact after GC and the TTL sweep."""
    driver = Driver(work, LAST, log_url, "60s")
    try:
        code = driver.wait(timeout=300)
    finally:
        driver.stop()
    assert code == 0, driver.output()[-5000:]
    assert result(work, SHAPE, LAST) == reference
    assert_exact_after_gc(work, log_url)


def test_broker_frozen_longer_than_max_commit_delay(
    private_tansu: ServerProcess, reference: object, tmp_path: Path
) -> None:
    log_url = f"kafka://127.0.0.1:{private_tansu.port}/ssb-outage-{time.time_ns()}"
    until = LAST - 6
    driver = Driver(tmp_path, until, log_url, "60s", ASYNC)
    try:
        wait_until(lambda: driver.alive() and durable(tmp_path, log_url) >= 2, 180, "checkpoint of batch 2")
        before = durable(tmp_path, log_url)
        freeze(private_tansu)
        frozen_at = time.monotonic()
        # The sidecar's upload cannot check its diff base; after maxCommitDelay the shim blocks commits.
        wait_until(lambda: bool(spool_files(tmp_path, "commit-gate.json")), 60, "a blocked commit")
        assert time.monotonic() - frozen_at >= MAX_COMMIT_DELAY_S
        stalled_at = driver.last_batch()
        assert stalled_at - before <= 15, f"ran {stalled_at - before} batches past the last checkpoint"
        # Hold the outage well past maxCommitDelay and two log timeouts: each failed upload is
        # retried and still counts as lag, so the gate must hold the whole time.
        deadline = frozen_at + 4 * MAX_COMMIT_DELAY_S + 2 * LOG_TIMEOUT_MS / 1000
        while time.monotonic() < deadline:
            driver.alive()
            assert spool_files(tmp_path, "commit-gate.json"), "the gate let a commit through"
            assert driver.last_batch() <= stalled_at + 1, "batches finished while the log was down"
            time.sleep(0.2)  # sampling the state, not synchronising with it
        assert sp.claimed(spool_files(tmp_path, "progress")[0]), "no batch was waiting for its checkpoint"
        assert re.search(rf"upload of \d+ store\(s\) failed.*{re.escape(log_url)}", sidecar_log(tmp_path))
        thaw(private_tansu)
        # The retried upload succeeds, the gate lets go, checkpoints resume past the stall.
        wait_until(lambda: durable(tmp_path, log_url) > stalled_at, 120, "a checkpoint after the stall")
        code = driver.wait(timeout=240)
        assert code == 0, driver.output()[-5000:]
        assert f"CHECKPOINTED {until}" in driver.output()
    finally:
        with contextlib.suppress(ProcessLookupError):
            thaw(private_tansu)
        driver.stop()
    batches = history(tmp_path, log_url)
    assert batches == sorted(set(batches)) and batches[-1] == until, batches  # each batch at most once
    assert not spool_files(tmp_path, "commit-gate.json")
    resume_on_a_new_host(tmp_path, log_url, reference)


@pytest.mark.parametrize(
    "durable_commit",
    [True, False],
    ids=["durable_commit", "async_upload"],
)
def test_broker_frozen_longer_than_commit_timeout_fails_the_query(
    private_tansu: ServerProcess, reference: object, tmp_path: Path, durable_commit: bool
) -> None:
    log_url = f"kafka://127.0.0.1:{private_tansu.port}/ssb-outage-{time.time_ns()}"
    commit_timeout_s = 8
    driver = Driver(tmp_path, 1000, log_url, f"{commit_timeout_s}s", () if durable_commit else ASYNC)
    try:
        wait_until(lambda: driver.alive() and durable(tmp_path, log_url) >= 2, 180, "checkpoint of batch 2")
        freeze(private_tansu)
        frozen_at = time.monotonic()
        code = driver.wait(timeout=120)
        failed_after = time.monotonic() - frozen_at
        out = driver.output()
        logs = sidecar_log(tmp_path)
    finally:
        with contextlib.suppress(ProcessLookupError):
            thaw(private_tansu)
        driver.stop()
    assert code == 1 and "QUERY FAILED" in out, out[-5000:]
    failure = out[out.index("QUERY FAILED") :]
    # durableCommit: the commit waited for its own upload; otherwise the gate held it after maxCommitDelay.
    # Never the plan of the next batch: a plan request reads no checkpoint log (runtime/ownership.py).
    keys = ("durableCommit", "commitTimeout") if durable_commit else ("commitTimeout", "maxCommitDelay")
    for key in keys:
        assert f"spark.statebackend.{key}" in failure, failure[:5000]
    assert "the plan of the batch" not in failure, failure[:5000]
    assert failed_after >= commit_timeout_s + (0 if durable_commit else MAX_COMMIT_DELAY_S), failed_after
    # The sidecar says why: the checkpoint log (named with its broker) did not answer.
    assert re.search(rf"upload of \d+ store\(s\) failed.*{re.escape(log_url)}", logs), logs[-3000:]
    if durable_commit:
        resume_on_a_new_host(tmp_path, log_url, reference)
    else:
        # Spark committed the batches of the first maxCommitDelay of the outage, and their plans were
        # stored, while no upload got through: their state is on this host only, so this host resumes
        # (a new one would re-run the newest planned batch and fail loudly naming query, store and
        # version: spark/ [D4], never older state).
        resume_on_the_same_host(tmp_path, log_url, reference)


def test_a_sidecar_that_keeps_dying_is_given_up_and_commits_then_block(
    reference: object, tmp_path: Path
) -> None:
    """StateBackendPlugin restarts a dead sidecar at most 5 times in 10 minutes. Here the first sidecar
    works until the test kill -9s it and every replacement exits at once (`sidecar.python` is a wrapper
    that runs the real sidecar only the first time). After the 5th restart the plugin gives up with an
    ERROR saying the executor's state is no longer backed up, and the query fails, naming that cause: it
    does not run on unbacked. Here the executor is the driver, whose sidecar stores each batch's plan
    before Spark publishes its offsets (runtime/ [C0]), so the next batch's plan fails at once (the JVM
    does not wait out the sidecar's liveness grace); were a store's commit reached first, the commit
    gate, told by `status.json` that the backup lags from then on, would block it after maxCommitDelay
    and fail it after commitTimeout, naming the same cause. A restart with a working sidecar resumes
    exactly."""
    commit_timeout_s = 6
    once = tmp_path / "sidecar-started-once"
    wrapper = tmp_path / "sidecar-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        # The plugin's start-up validation runs with the same Python: it always works.
        f'case "$*" in *spark_statebackend.spark.validate*) exec "{sys.executable}" "$@";; esac\n'
        f'if mkdir "{once}" 2>/dev/null; then exec "{sys.executable}" "$@"; fi\n'
        'echo "test sidecar wrapper: exiting at once" >&2\n'
        "exit 3\n"
    )
    wrapper.chmod(0o755)
    extra = (f"spark.statebackend.sidecar.python={wrapper}", *ASYNC)
    driver = Driver(tmp_path, 1000, None, f"{commit_timeout_s}s", extra)
    try:
        wait_until(lambda: driver.alive() and durable_batch(tmp_path) >= 2, 180, "checkpoint of batch 2")
        pid = int(
            re.findall(r"sidecar for executor driver serving \S+ \(pid (\d+)\)", sidecar_log(tmp_path))[0]
        )
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        durable_at_kill = durable_batch(tmp_path)  # the committer died with it: nothing is written after
        code = driver.wait(timeout=120)
        failed_after = time.monotonic() - killed_at
        out = driver.output()
    finally:
        driver.stop()
    assert (
        len(re.findall(r"exited unexpectedly with code \d+; restarting it \(restart \d of at most 5", out))
        == 5
    )
    assert "NOT restarting it: this executor's state is no longer backed up" in out, out[-5000:]
    assert sidecar_log(tmp_path).count("test sidecar wrapper: exiting at once") == 5
    assert code == 1 and "QUERY FAILED" in out, out[-5000:]
    failure = out[out.index("QUERY FAILED") :]
    # The error says why (the sidecar was given up: no backup runs), where to look, and the key bounding
    # the wait it stopped (the plan's, or the commit gate's).
    assert "the plugin gave up restarting this executor's sidecar" in failure, failure[:5000]
    assert "is no longer backed up" in failure and "sidecar.log" in failure, failure[:5000]
    assert "spark.statebackend.commitTimeout" in failure, failure[:5000]
    assert re.search(r"the batch does not run|spark\.statebackend\.maxCommitDelay", failure), failure[:5000]
    assert failed_after < 60, f"the query ran {failed_after:.0f}s without backups"
    assert durable_batch(tmp_path) == durable_at_kill
    # Same host, a working sidecar: resume from the last durable checkpoint with the reference output.
    driver = Driver(tmp_path, LAST, None, "60s")
    try:
        code = driver.wait(timeout=300)
    finally:
        driver.stop()
    assert code == 0, driver.output()[-5000:]
    assert result(tmp_path, SHAPE, LAST) == reference
    assert_file_log_exact_after_gc(tmp_path)
