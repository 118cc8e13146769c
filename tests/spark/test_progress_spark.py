"""The backend's figures for a query in its StreamingQueryProgress (issue 22 item 5): a real query's
`lastProgress` and a listener's `onQueryProgress` carry `observedMetrics["statebackend"]`, and the figures
are those `spark_statebackend.status()` read from the same publication of the driver's sidecar."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

DRIVER = r"""
import json, os, sys, time
from pathlib import Path
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.streaming import StreamingQueryListener
import spark_statebackend
from spark_statebackend.spark.query_status import METRICS_FILE, driver_spool_dir

work = Path(sys.argv[1])
b = (SparkSession.builder.master("local[2]").appName("ssb-progress")
     .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false"))
spark_statebackend.configure(b, **{
    "blobStore.url": (work / "blobs").as_uri(), "checkpointLog.url": (work / "log").as_uri(),
    "spoolDir": str(work / "spool"),
})
spark = b.getOrCreate()
deadline = time.monotonic() + 240
seen = {}  # batch id -> the figures a Python listener got (None: none)

class Figures(StreamingQueryListener):
    def onQueryStarted(self, event): pass
    def onQueryIdle(self, event): pass
    def onQueryTerminated(self, event): pass
    def onQueryProgress(self, event):
        row = event.progress.observedMetrics.get("statebackend")
        seen[event.progress.batchId] = row.asDict() if row is not None else None

spark.streams.addListener(Figures())
(work / "in").mkdir()
(work / "stage").mkdir()

def add(k):
    # One new file is one batch (maxFilesPerTrigger 1); written aside and renamed into place whole.
    lines = "".join(json.dumps({"v": k * 10 + i}) + "\n" for i in range(20))
    (work / "stage" / f"{k}.json").write_text(lines)
    os.rename(work / "stage" / f"{k}.json", work / "in" / f"{k}.json")

def wait_for(what, check):
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)

rows = spark.readStream.schema("v LONG").option("maxFilesPerTrigger", 1).json(str(work / "in"))
agg = rows.groupBy((F.col("v") % 5).alias("k")).count()
q = (agg.writeStream.format("memory").queryName("counts").outputMode("complete")
     .option("checkpointLocation", str(work / "ckpt")).trigger(processingTime="200 milliseconds").start())
add(0)
wait_for("batch 0 durable", lambda: spark_statebackend.status(spark, q).last_durable_batch >= 0)

# The figures of checkpoint 0 settled: two publications of the sidecar in a row say the same.
metrics = driver_spool_dir(spark) / METRICS_FILE
before = spark_statebackend.status(spark, q)
while True:
    mtime = metrics.stat().st_mtime_ns
    wait_for("a new publication", lambda: metrics.stat().st_mtime_ns != mtime)
    now = spark_statebackend.status(spark, q)
    if now == before:
        break
    before = now

add(1)
wait_for("batch 1 at the listener", lambda: 1 in seen)
last = q.lastProgress
q.stop()
print("STATUS " + json.dumps(before.__dict__))
print("LISTENER " + json.dumps({str(k): v for k, v in seen.items()}))
print("LAST " + json.dumps({"batchId": last["batchId"], "observedMetrics": {
    k: r.asDict() for k, r in last["observedMetrics"].items()}}))
spark.stop()
"""


def run_driver(work: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(work)], capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("STATUS", "LISTENER", "LAST"):
            out[tag] = json.loads(rest)
    return out


def test_the_progress_carries_the_figures_status_reports(tmp_path: Path) -> None:
    out = run_driver(tmp_path)
    status, seen, last = out["STATUS"], out["LISTENER"], out["LAST"]
    assert status["last_durable_batch"] == 0 and status["source"] == "sidecar"
    expected = {
        "lastDurableBatch": status["last_durable_batch"],
        "checkpointLagSeconds": pytest.approx(status["checkpoint_lag_seconds"]),
        "checkpointBytes": status["checkpoint_bytes"],
        "predictedRestoreSeconds": pytest.approx(status["predicted_restore_seconds"]),
        "checkpointsWritten": status["checkpoints_written"],
    }
    # Batch 1's progress: read when Spark delivered it, before the committer had it, so checkpoint 0's.
    for where, figures in (
        ("listener", seen["1"]),
        ("lastProgress", last["observedMetrics"].get("statebackend")),
    ):
        assert figures is not None, f"{where}: no observedMetrics['statebackend'] in batch 1's progress"
        assert {k: figures[k] for k in expected} == expected, where
        assert figures["uploadLagSeconds"] >= 0, where
    assert last["batchId"] == 1
    assert status["checkpoint_bytes"] > 0 and status["checkpoints_written"] == 1
    # Batch 0's progress came before any checkpoint of the query: nothing known yet.
    assert (
        seen["0"] is not None and seen["0"]["lastDurableBatch"] == -1 and seen["0"]["checkpointsWritten"] == 0
    )
