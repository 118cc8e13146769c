"""The streaming job of the multi-host rig (tests/system/test_multihost.py), for spark-submit on a standalone
master. It never imports spark_statebackend: the backend, when on, comes from conf keys alone.

    spark-submit --master spark://... multihost_job.py --input DIR --out DIR
        --checkpoint-location LOC --files N [--trigger-ms MS]

A file source on DIR (text files, one integer per line, written there by the test while the job
runs; one file per batch: maxFilesPerTrigger=1, so batch b reads the b-th file by modification time
and every run plans the same batches), a stateful aggregation (count and sum per value % 13, update
mode) and a sink idempotent by batch id: foreachBatch writes batch b's rows to OUT/<b>.json (a retried
batch overwrites its file). OUT must be a directory every host sees.

It prints `QUERY <id>` once the query started, `FIRST <b>` for the first batch it ran, `BATCH <b>`
as batches finish, and stops after batch N-1 (the last file). Exit 0 on success, 1 if the query
failed (its error printed after `QUERY FAILED`), 2 on a timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

TIMEOUT_S = 600
KEYS = 13


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint-location", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--trigger-ms", type=int, default=1000)
    ap.add_argument(
        "--slow-while",
        type=Path,
        help="while this file exists (at most 5 minutes), a query listener blocks on its first progress "
        "event (a user's stuck listener: every listener of the bus, the backend's hand-over of batches "
        "too, waits behind it)",
    )
    args = ap.parse_args()
    spark = SparkSession.builder.getOrCreate()  # its name comes from spark-submit (spark.app.name)
    spark.sparkContext.setLogLevel("WARN")
    counts = (
        spark.readStream.option("maxFilesPerTrigger", 1)
        .text(str(args.input))
        .select(F.col("value").cast("long").alias("v"))
        .withColumn("k", F.col("v") % KEYS)
        .groupBy("k")
        .agg(F.count("*").alias("c"), F.sum("v").alias("s"))
    )
    if args.slow_while is not None:
        from pyspark.sql.streaming import StreamingQueryListener

        slow_file: Path = args.slow_while

        class Slow(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
                pass

            def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
                stuck_until = time.monotonic() + 300
                while slow_file.exists() and time.monotonic() < stuck_until:
                    time.sleep(0.2)  # the fault: a listener stuck until the test lets it go

            def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
                pass

            def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
                pass

        spark.streams.addListener(Slow())
    out: Path = args.out
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
        counts.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint_location)
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    print(f"QUERY {q.id}", flush=True)
    deadline = time.monotonic() + TIMEOUT_S
    seen = -1
    while seen < args.files - 1:
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
    assert "spark_statebackend" not in sys.modules, "the job must not need spark_statebackend"
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
