"""What Spark committed stays committed, and no batch Spark planned is planned again (issue 21).

Real Spark (local[2]) running tests/apps/files_job.py: a file source whose batches depend on which
files are there when Spark plans them, and a sink that skips a batch id it already wrote (as Spark's
file sink and Delta do). Nothing here waits for our checkpoint before it stops or kills the job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.spark.location import latest_commit, read_query_id
from tests.paths import ROOT, TESTS
from tests.servers.process import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

JOB = TESTS / "apps" / "files_job.py"
IDS_PER_FILE = 20


def add_files(work: Path, first: int, count: int) -> set[int]:
    """Drop input files first..first+count-1 (each IDS_PER_FILE new ids) atomically; their ids."""
    inp = work / "in"
    inp.mkdir(parents=True, exist_ok=True)
    ids: set[int] = set()
    for f in range(first, first + count):
        rows = [f * 1000 + i for i in range(IDS_PER_FILE)]
        tmp = inp / f".{f}.tmp"
        tmp.write_text("".join(json.dumps({"id": r}) + "\n" for r in rows))
        tmp.replace(inp / f"{f:03d}.json")
        ids.update(rows)
    return ids


def job(work: Path, *args: str) -> list[str]:
    return [sys.executable, str(JOB), "--work", str(work), *args]


def start_job(work: Path, *args: str) -> subprocess.Popen[str]:
    """The job as a process group of its own (its JVM and sidecars in it), output on stdout."""
    return subprocess.Popen(
        job(work, *args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def run_job(work: Path, *args: str) -> str:
    proc = subprocess.run(job(work, *args), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and "DONE" in proc.stdout, (
        f"job failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


def durable_batch(work: Path) -> int:
    """The batch of the query's latest checkpoint in the log; -1 if none."""
    qid = read_query_id(work / "ckpt")
    assert qid is not None, "the job wrote no checkpoint location metadata"
    latest = open_checkpoint_log((work / "log").as_uri()).read_latest(qid)
    return -1 if latest is None else latest.batch_id


def sink_ids(work: Path) -> list[int]:
    """Every id the sink received, over all batches (duplicates kept)."""
    found: list[int] = []
    for p in sorted((work / "out").glob("*.json")):
        found.extend(json.loads(p.read_text()))
    return found


def spark_logs(root: Path) -> dict[str, bytes]:
    """Spark's offset and commit log entries of a checkpoint location, by relative path."""
    return {
        f"{sub}/{p.name}": p.read_bytes()
        for sub in ("offsets", "commits")
        for p in (root / sub).glob("*")
        if p.name.isdigit()
    }


def test_a_clean_stop_checkpoints_the_last_batch_behind_a_slow_listener(tmp_path: Path) -> None:
    """SparkContext.stop() shuts plugins down before the listener bus: a user's listener that takes
    1.5 s per event keeps the last batches' progress queued when the driver's sidecar is told to drain.
    The stop must still end with the last batch Spark committed in the checkpoint log."""
    add_files(tmp_path, 0, 4)
    run_job(tmp_path, "--available-now", "--slow-listener", "1.5")
    last = latest_commit(tmp_path / "ckpt")
    assert last == 3, f"expected batches 0..3 for 4 files, Spark committed up to {last}"
    assert durable_batch(tmp_path) == last, (
        f"Spark committed batch {last} but the checkpoint log ends at {durable_batch(tmp_path)}"
    )


def test_a_restart_on_the_same_host_never_replans_a_batch_spark_planned(tmp_path: Path) -> None:
    """The driver is killed (-9, with its JVM and sidecar) while Spark's commits run ahead of the
    checkpoint log (a slow listener holds the hand-over back); more files arrive; the job restarts on
    the same host. Spark's offset and commit entries must stay as Spark wrote them (a batch it planned
    runs again with the same offsets), and every input id must reach the sink exactly once."""
    ids = add_files(tmp_path, 0, 6)
    proc = start_job(tmp_path, "--slow-listener", "2.0")
    try:
        wait_until(
            lambda: latest_commit(tmp_path / "ckpt") >= 3 or proc.poll() is not None,
            300,
            "Spark's commit of batch 3",
        )
        assert proc.poll() is None, f"the job ended early:\n{proc.stdout.read() if proc.stdout else ''}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    before = spark_logs(tmp_path / "ckpt")
    committed = latest_commit(tmp_path / "ckpt")
    assert durable_batch(tmp_path) < committed, (
        f"the checkpoint log caught up with Spark's commits ({committed}) before the kill: this run "
        "cannot show a restart ahead of the log"
    )
    ids |= add_files(tmp_path, 6, 3)

    run_job(tmp_path, "--available-now")

    after = spark_logs(tmp_path / "ckpt")
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, f"recovery deleted or rewrote entries Spark wrote: {changed}"
    got = sink_ids(tmp_path)
    dupes = sorted({i for i in got if got.count(i) > 1})
    lost = sorted(ids - set(got))
    assert not lost and not dupes, f"lost {len(lost)} ids (e.g. {lost[:5]}), duplicated {dupes[:5]}"
    assert durable_batch(tmp_path) == latest_commit(tmp_path / "ckpt")


def latest_offsets(root: Path) -> int:
    """The newest batch id in `<root>/offsets/`, -1 if none."""
    ids = [int(p.name) for p in (root / "offsets").glob("*") if p.name.isdigit()]
    return max(ids, default=-1)


def test_a_new_driver_host_re_runs_the_batches_spark_planned(tmp_path: Path) -> None:
    """The driver is killed (-9) while Spark runs ahead of the checkpoint log (a slow listener holds the
    hand-over back): Spark has committed batches after the latest checkpoint and planned the next one,
    and the sink has written their output. The driver's disk is lost (its checkpoint location wiped),
    more files arrive, and the job restarts: the location is rebuilt from the checkpoint and the batch
    plans stored since (runtime/ [C0], spark/ [D4]), so Spark re-runs the batches it planned with the
    offsets it gave them, and every input id reaches the sink exactly once. durableCommit makes the state
    of each committed version durable before its commit, so the versions after the checkpoint are there
    to restore (a missing one fails the restart, tests/lifecycle/test_plans.py)."""
    ckpt = tmp_path / "ckpt"
    ids = add_files(tmp_path, 0, 8)
    proc = start_job(tmp_path, "--slow-listener", "2.0", "--setting", "durableCommit=true")
    try:

        def ahead() -> bool:
            if proc.poll() is not None:
                return True
            committed = latest_commit(ckpt)
            if committed < 3 or read_query_id(ckpt) is None or durable_batch(tmp_path) < 0:
                return False
            planned = latest_offsets(ckpt)
            # Not while the planned batch's output is written but its commit is not: Spark re-runs that
            # batch, and a sink that skips it without reading it fails Spark's state commit validation
            # (STATE_STORE_COMMIT_VALIDATION_FAILED), with or without the backend.
            running = not (tmp_path / "out" / f"{planned}.json").exists()
            return durable_batch(tmp_path) < committed < planned and running

        wait_until(ahead, 300, "Spark's commits and plans ahead of the checkpoint log")
        assert proc.poll() is None, f"the job ended early:\n{proc.stdout.read() if proc.stdout else ''}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    committed, planned, durable = latest_commit(ckpt), latest_offsets(ckpt), durable_batch(tmp_path)
    assert durable < committed < planned, (durable, committed, planned)
    written = sorted(int(p.stem) for p in (tmp_path / "out").glob("*.json"))
    assert written and written[-1] > durable, (
        f"the sink wrote no batch after the checkpoint {durable}: {written}"
    )
    shutil.rmtree(ckpt)  # the driver's disk is gone: a new host
    shutil.rmtree(tmp_path / "local", ignore_errors=True)
    ids |= add_files(tmp_path, 8, 3)

    out = run_job(tmp_path, "--available-now")

    got = sink_ids(tmp_path)
    dupes = sorted({i for i in got if got.count(i) > 1})
    lost = sorted(ids - set(got))
    assert not lost and not dupes, (
        f"lost {len(lost)} ids (e.g. {lost[:5]}), duplicated {dupes[:5]}; Spark had committed batch "
        f"{committed} and planned {planned}, the checkpoint log was at {durable}:\n{out[-2000:]}"
    )
    logs = "".join(p.read_text() for p in (tmp_path / "spool").glob("*/driver/sidecar.log"))
    assert f"plans of batches {durable + 1}..{planned}" in logs, "the rebuild placed no plans"
    assert durable_batch(tmp_path) == latest_commit(ckpt)


def test_a_query_whose_checkpoints_keep_failing_stops_naming_the_cause(tmp_path: Path) -> None:
    """A symlink planted in `sources/` after the start makes every checkpoint of the query fail (the
    `_driver` snapshot never follows one). The query must not run on without checkpoints: once its
    checkpoints have failed for longer than maxCommitDelay, Spark's commit of its next batch waits, and after
    commitTimeout the query fails with an error naming both keys and the cause."""
    add_files(tmp_path, 0, 40)
    # drainTimeout: the stop after the failure waits for batches that can no longer be checkpointed
    settings = ("maxCommitDelay=2s", "commitTimeout=8s", "drainTimeout=5s")
    proc = start_job(tmp_path, *(a for kv in settings for a in ("--setting", kv)))
    try:
        wait_until(
            lambda: (
                (read_query_id(tmp_path / "ckpt") is not None and durable_batch(tmp_path) >= 1)
                or proc.poll() is not None
            ),
            300,
            "the query's second checkpoint",
        )
        assert proc.poll() is None, f"the job ended early:\n{proc.stdout.read() if proc.stdout else ''}"
        outside = tmp_path / "outside"
        outside.write_text("not Spark's")
        link = tmp_path / "ckpt" / "sources" / "0" / "zz-planted"
        link.symlink_to(outside)
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode != 0 and "DONE" not in output, output[-3000:]
    for said in (
        "spark.statebackend.maxCommitDelay",
        "spark.statebackend.commitTimeout",
        f"{link} is a symlink",
    ):
        assert said in output, f"{said!r} not in the job's output:\n{output[-5000:]}"
    assert latest_commit(tmp_path / "ckpt") < 39, "the query ran through its input without checkpoints"


def test_durable_commits_run_the_job_exactly(tmp_path: Path) -> None:
    """durableCommit=true: each task's commit waits for its version's upload (the JVM waits for the
    sidecar's answer to the event's request id). The job runs to the end with every id exactly once,
    every answer was taken, and its last batch is checkpointed."""
    ids = add_files(tmp_path, 0, 4)
    run_job(tmp_path, "--available-now", "--setting", "durableCommit=true")
    got = sink_ids(tmp_path)
    assert sorted(got) == sorted(ids)
    assert durable_batch(tmp_path) == latest_commit(tmp_path / "ckpt") == 3
    spools = list((tmp_path / "spool").glob("*/driver"))
    assert len(spools) == 1, spools
    assert not list((spools[0] / "responses").glob("*.json")), "an answer nobody waited for"
    log = (spools[0] / "sidecar.log").read_text()
    assert log.count("uploaded by executor driver") >= 4  # a version of each batch, each answered


def test_sigterm_checkpoints_the_last_batch_behind_a_slow_listener(tmp_path: Path) -> None:
    """SIGTERM to the driver's JVM (what a resource manager sends to stop it): Spark's shutdown hook
    runs SparkContext.stop(); the batches Spark committed, held back behind a user's listener that
    takes 1.5 s per event, are checkpointed before the driver's sidecar stops."""
    add_files(tmp_path, 0, 40)
    proc = start_job(tmp_path, "--slow-listener", "1.5")
    try:
        wait_until(
            lambda: latest_commit(tmp_path / "ckpt") >= 3 or proc.poll() is not None, 300, "batch 3 committed"
        )
        assert proc.poll() is None, f"the job ended early:\n{proc.stdout.read() if proc.stdout else ''}"
        jvms = [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "java"]
        assert len(jvms) == 1, jvms
        jvms[0].send_signal(signal.SIGTERM)
        proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    last = latest_commit(tmp_path / "ckpt")
    assert durable_batch(tmp_path) == last, (
        f"Spark committed batch {last} but the checkpoint log ends at {durable_batch(tmp_path)}"
    )
