"""`spark_statebackend.status(spark, query)` in a real application (issue 22 item 5):

- in an application that has not checkpointed the query yet (a restart, right after a restore), the
  status is the latest checkpoint the checkpoint log holds, not "-1, nothing written";
- in an application without the backend (no plugin, or enabled=false) it fails with a ConfigError
  naming the key to set, not py4j's "TypeError: 'JavaPackage' object is not callable".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

DRIVER = r"""
import json, sys, time
from pathlib import Path
from pyspark.sql import SparkSession, functions as F
import spark_statebackend
from spark_statebackend.errors import ConfigError

mode, work = sys.argv[1], Path(sys.argv[2])

def session(enable, **more):
    b = (SparkSession.builder.master("local[2]").appName("ssb-status")
         .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false"))
    if enable:
        spark_statebackend.configure(b, **{
            "blobStore.url": (work / "blobs").as_uri(), "checkpointLog.url": (work / "log").as_uri(),
            "spoolDir": str(work / "spool"), **more,
        })
    return b.getOrCreate()

def show(st):
    print("STATUS " + json.dumps(st.__dict__), flush=True)

def refused(spark, qid):
    try:
        spark_statebackend.status(spark, qid)
    except ConfigError as e:
        print("REFUSED " + json.dumps({"key": e.key, "message": str(e)}), flush=True)
    except Exception as e:
        print("OTHER-ERROR " + type(e).__name__ + ": " + str(e), flush=True)
    else:
        print("NOT-REFUSED", flush=True)

if mode == "run":
    spark = session(True)
    rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 20).load()
    agg = rows.groupBy((F.col("value") % 5).alias("k")).count()
    q = (agg.writeStream.format("memory").queryName("counts").outputMode("complete")
         .option("checkpointLocation", str(work / "ckpt")).trigger(processingTime="200 milliseconds").start())
    deadline = time.monotonic() + 240
    while spark_statebackend.status(spark, q).last_durable_batch < 3:
        assert time.monotonic() < deadline, "no checkpoint of batch 3 in time"
        time.sleep(0.2)
    q.stop()
    print("QUERY " + str(q.id), flush=True)
    spark.stop()
elif mode == "status":
    spark = session(True)
    show(spark_statebackend.status(spark, sys.argv[3]))
    show(spark_statebackend.status(spark, "00000000-0000-0000-0000-000000000000"))  # a query never seen
    spark.stop()
else:  # a JVM's classpath is set when it starts: one application per process
    spark = session(mode == "disabled", enabled="false")
    refused(spark, "00000000-0000-0000-0000-000000000000")
    spark.stop()
"""


def run(work: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, args[0], str(work), *args[1:]],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout.splitlines()


def tagged(lines: list[str], tag: str) -> list[str]:
    return [ln[len(tag) + 1 :] for ln in lines if ln.startswith(tag + " ")]


def test_status_in_a_new_application_reports_the_latest_checkpoint_of_the_log(tmp_path: Path) -> None:
    (qid,) = tagged(run(tmp_path, "run"), "QUERY")
    with open_checkpoint_log((tmp_path / "log").as_uri()) as log:
        latest = log.read_latest(qid)
    assert latest is not None and latest.batch_id >= 3

    known, unknown = (json.loads(s) for s in tagged(run(tmp_path, "status", qid), "STATUS"))
    # This application has written no checkpoint of the query: its figures come from the log.
    assert known["query_id"] == qid
    assert known["last_durable_batch"] == latest.batch_id
    assert known["source"] == "checkpoint log" and known["checkpoints_written"] == 0
    # A query the log has never seen is still "not known yet".
    assert unknown["last_durable_batch"] == -1 and unknown["source"] == "sidecar"


def test_status_without_the_backend_names_the_key_to_set(tmp_path: Path) -> None:
    lines = run(tmp_path, "no-plugin") + run(tmp_path, "disabled")
    assert not [ln for ln in lines if ln.startswith(("OTHER-ERROR", "NOT-REFUSED"))], lines
    no_plugin, disabled = (json.loads(s) for s in tagged(lines, "REFUSED"))
    assert no_plugin["key"] == "spark.plugins"
    assert "spark-statebackend is not enabled in this application" in no_plugin["message"]
    assert "spark.plugins=dev.statebackend.spark.StateBackendPlugin" in no_plugin["message"]
    assert "spark.jars" in no_plugin["message"]
    assert disabled["key"] == "spark.statebackend.enabled"
    assert "is false in this application" in disabled["message"]
