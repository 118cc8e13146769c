"""A small stateful query on local-cluster[2,1,1024] with only the shim plugin and its keys set.

Run as `python local_cluster_job.py <jar> <spool root> <checkpoint dir> <fake sidecar> [<attempt id>]`;
prints one JSON line {"app_id": ..., "counts": {k: count}} and stops Spark (which must stop the sidecars).
With an attempt id the application runs as that attempt: `spark.app.attempt.id` is set as SparkContext
sets it under YARN cluster mode (a local master has no attempts of its own, and keeps the key).
Runs in its own process because a Python process can hold only one SparkContext.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    jar, spool_root, checkpoint, fake_sidecar = sys.argv[1:5]
    builder = SparkSession.builder
    if len(sys.argv) > 5:
        builder = builder.config("spark.app.attempt.id", sys.argv[5])
    spark = (
        builder.master("local-cluster[2,1,1024]")
        .appName("statebackend-local-cluster-test")
        .config("spark.jars", jar)
        .config("spark.plugins", "dev.statebackend.spark.StateBackendPlugin")
        .config("spark.statebackend.sidecar.mode", "process")
        .config("spark.statebackend.sidecar.python", fake_sidecar)
        .config("spark.statebackend.spoolDir", spool_root)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", "1")
        .getOrCreate()
    )
    try:
        rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 20).load()
        agg = rows.groupBy((F.col("value") % 5).alias("k")).count()
        q = (
            agg.writeStream.format("memory")
            .queryName("counts")
            .outputMode("complete")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        counts = {r["k"]: r["count"] for r in spark.table("counts").collect()}
        print(json.dumps({"app_id": spark.sparkContext.applicationId, "counts": counts}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
