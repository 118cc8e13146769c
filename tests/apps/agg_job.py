"""A stateful streaming job for spark-submit that knows nothing of spark-statebackend.

    spark-submit [--jars ... --conf spark.plugins=... --conf spark.statebackend.*=...] agg_job.py
        --work DIR --until-batch N [--hold] [--checkpoint-location LOC]

It never imports spark_statebackend: whatever the backend does for it comes from spark-submit's
conf keys alone (README "Using it"). The query is exactly demo_app's `agg` shape (rate-micro-batch,
100 rows per batch, grouped by value % 7 with count and sum, update mode), so its output compares
with a demo_app reference run. Each batch's rows go to DIR/out/<batch id>.json (overwritten when a
batch runs again). It prints `BATCH <id>` as batches finish and `FIRST <id>` for the first batch this
run executed, then stops the query after batch N. With --hold it then waits for the file
DIR/release before stopping Spark, so a test can wait for the batch to be checkpointed while the
driver (and its sidecar) still run. Exit 0 on success, 1 if the query failed, 2 on a timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

TIMEOUT_S = 300


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--until-batch", type=int, required=True)
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--checkpoint-location")
    args = ap.parse_args()
    work: Path = args.work
    spark = (
        SparkSession.builder.appName("ssb-submit-agg")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 100)
        .option("numPartitions", 2)
        .option("startTimestamp", 0)
        .option("advanceMillisPerBatch", 1000)
        .load()
        .withColumn("k", F.col("value") % 7)
        .groupBy("k")
        .agg(F.count("*").alias("c"), F.sum("value").alias("s"))
    )
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    first: list[int] = []

    def sink(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        if not first:
            first.append(batch_id)
            print(f"FIRST {batch_id}", flush=True)
        rows = sorted(tuple(r) for r in batch_df.collect())
        tmp = out / f".{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"{batch_id}.json")

    q = (
        df.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint_location or str(work / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    deadline = time.monotonic() + TIMEOUT_S
    seen = -1
    while seen < args.until_batch:
        p = q.lastProgress
        if p is not None and p["batchId"] > seen:
            seen = p["batchId"]
            print(f"BATCH {seen}", flush=True)
        if q.exception() is not None:
            print(f"QUERY FAILED {q.exception()}", flush=True)
            return 1
        if time.monotonic() > deadline:
            print("TIMEOUT", flush=True)
            return 2
        time.sleep(0.05)
    q.stop()
    release = work / "release"
    while args.hold and not release.exists():
        if time.monotonic() > deadline:
            print("TIMEOUT waiting for release", flush=True)
            return 2
        time.sleep(0.05)
    release.unlink(missing_ok=True)
    assert "spark_statebackend" not in sys.modules, "the job must not need spark_statebackend"
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
