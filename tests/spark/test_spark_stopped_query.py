"""A query on Spark's temporary checkpoint location, stopped, then another query of the same
application, with real Spark (issue 21): local[2], one application with the backend (configure(), a
real sidecar, file:// blob store and log), run as its own driver process (a Python process holds one
SparkContext, and the modules before this one leave theirs with another conf).

Spark deletes a temporary location when its query stops. The first query's last snapshots are staged
while its sidecar is frozen (SIGSTOP, as a sidecar busy with a long upload would be), so they still
wait for their upload when Spark deletes the location with them. The sidecar then drops them
(upload_loop: their files are gone) instead of retrying them for ever, and since the commit gate reads
the lag of the committing store's own query (`status.json` `oldest_by_query`, CommitGate.java), the
second query's commits are never held: before, they blocked after maxCommitDelay until commitTimeout.
Nothing of ours is written into the first query's location after it stopped (the `_driver` snapshot
is staged in the spool), so it can be deleted at once and stays deleted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

MAX_COMMIT_DELAY_S = 2
COMMIT_TIMEOUT_S = 120  # far beyond the wait for the second query: a held commit shows as a stall
SECOND_BATCHES = 8  # the second query's batches checkpointed within SECOND_WAIT_S
SECOND_WAIT_S = 90

DRIVER = r"""
import json, os, shutil, signal, sys, time
from pathlib import Path
from pyspark.sql import SparkSession
import spark_statebackend
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.demo_app import build
from spark_statebackend.runtime import spool as sp

work = Path(sys.argv[1])
max_delay, commit_timeout, batches, wait_s = sys.argv[2:6]
b = (
    SparkSession.builder.master("local[2]").appName("ssb-stopped-query")
    .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
    .config("spark.local.dir", str(work / "local"))
)
spark_statebackend.configure(b, **{
    "blobStore.url": (work / "blobs").as_uri(), "checkpointLog.url": (work / "log").as_uri(),
    "spoolDir": str(work / "spool"), "maxCommitDelay": max_delay + "s",
    "commitTimeout": commit_timeout + "s",
    "drainTimeout": "5s",  # the first query's last batches never complete: do not wait for them
    # Snapshots staged behind a busy sidecar exist only with asynchronous commits: with the default
    # durable commits (and batch plans) the first query would wait for its frozen sidecar instead.
    "durableCommit": "false",
})
spark = b.getOrCreate()
spool = sp.Spool.for_executor(work / "spool", spark.sparkContext.applicationId, "driver")
cplog = open_checkpoint_log((work / "log").as_uri())

def durable(qid):
    latest = cplog.read_latest(qid)
    return -1 if latest is None else latest.batch_id

def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)

def start(name, checkpoint):
    df, mode = build(spark, "agg")
    w = df.writeStream.outputMode(mode).format("memory").queryName(name)
    w = w.trigger(processingTime="300 milliseconds")
    return (w if checkpoint is None else w.option("checkpointLocation", str(checkpoint))).start()

def last_batch(q):
    p = q.lastProgress
    return -1 if p is None else int(p["batchId"])

def events_of(qid):
    return [e for _, e in spool.iter_events() if e.query_id == qid] + sp.claimed(spool.events_dir)

def gate_doc():
    try:
        return (spool.dir / "commit-gate.json").read_text()
    except FileNotFoundError:
        return ""

first = start("first", None)  # no checkpointLocation: Spark's temporary one
root = Path(str(first._jsq.streamingQuery().resolvedCheckpointRoot()).removeprefix("file:"))
qid_a = str(first.id)
wait(lambda: durable(qid_a) >= 1, 240, "the first query's checkpoint of batch 1")
pid = spool.read_sidecar_marker().pid
os.kill(pid, signal.SIGSTOP)  # its uploads wait: the next snapshots stay staged
try:
    frozen_at = last_batch(first)
    wait(lambda: last_batch(first) >= frozen_at + 2, 60, "two batches staged while frozen")
    first.stop()
    staged_a = len(events_of(qid_a))
finally:
    os.kill(pid, signal.SIGCONT)
deleted_by_spark = not root.exists()
if root.exists():
    shutil.rmtree(root)  # its owner deletes it right after the stop: must not race with us

second = start("second", work / "ckpt-b")
qid_b = str(second.id)
held, started = [], time.monotonic()
while durable(qid_b) < int(batches) and time.monotonic() - started < float(wait_s):
    if qid_b in gate_doc():
        held.append(gate_doc())
    if second.exception() is not None:
        break
    time.sleep(0.1)  # sampling, not synchronising
reached, error = durable(qid_b), second.exception()
second.stop()
deadline = time.monotonic() + 30
while events_of(qid_a) and time.monotonic() < deadline:
    time.sleep(0.1)
print("RESULT " + json.dumps({
    "root": str(root), "qid_a": qid_a, "qid_b": qid_b, "staged_a": staged_a,
    "deleted_by_spark": deleted_by_spark, "held": held[:1], "reached": reached,
    "error": None if error is None else str(error)[:2000], "events_a_left": len(events_of(qid_a)),
    "status": json.loads((spool.dir / "status.json").read_text()), "root_exists": root.exists(),
    "sidecar_log": str(spool.dir / sp.SIDECAR_LOG),
}))
spark.stop()
print("ROOT EXISTS AFTER STOP " + str(root.exists()))
ours = work / "ckpt-b" / "_statebackend"  # what is left of ours in a location after a clean stop
print("OURS LEFT " + json.dumps(sorted(str(p.relative_to(ours)) for p in ours.rglob("*") if not p.is_dir())))
"""


def test_a_stopped_temporary_query_neither_holds_the_next_query_nor_writes_into_its_location(
    tmp_path: Path,
) -> None:
    args = [
        str(tmp_path),
        str(MAX_COMMIT_DELAY_S),
        str(COMMIT_TIMEOUT_S),
        str(SECOND_BATCHES),
        str(SECOND_WAIT_S),
    ]
    proc = subprocess.run([sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    r = json.loads(line.removeprefix("RESULT "))
    assert Path(r["root"]).name.startswith("temporary-"), r["root"]
    assert r["staged_a"] > 0, "no snapshot of the first query was waiting for its upload at its stop"
    # The second query ran on: no commit of it held, its batches checkpointed in time.
    assert r["error"] is None, r["error"]
    assert r["held"] == [], f"a commit of the second query was held: {r['held']}"
    assert r["reached"] >= SECOND_BATCHES, (
        f"the second query stalled: checkpointed up to batch {r['reached']}"
    )
    # The first query's snapshots were dropped, said so, and no longer count as lag.
    assert r["events_a_left"] == 0
    assert r["qid_a"] not in r["status"]["oldest_by_query"], r["status"]
    log = Path(r["sidecar_log"]).read_text(errors="replace")
    assert f"query {r['qid_a']} store 0/" in log and "no longer exists" in log, log[-3000:]
    assert "not a directory" not in log, "an upload of the deleted location was attempted and failed"
    # Deleted at the stop (by Spark, else by the test), and nothing of ours wrote into it since.
    assert not r["root_exists"] and "ROOT EXISTS AFTER STOP False" in proc.stdout
    # The second query's location after its clean stop: its staged snapshots all consumed (the empty
    # staging dirs <app>/<op>/<part>/<store>/ stay), no driver staging.
    assert "OURS LEFT []" in proc.stdout, proc.stdout[-2000:]
