"""Spark's own RocksDB provider in changelog mode, no backend, never snapshotting on its own.

    python tests/apps/changelog_job.py --work DIR --ids LO:HI [--ids LO:HI ...]

One availableNow micro-batch per `--ids` range (a JSON file of `{"id": n}` for LO <= n < HI is added to
`<work>/in` before each), through dropDuplicates on `id` with one shuffle partition, so the single store
`<work>/ckpt/state/0/0` holds every id seen. `minDeltasForSnapshot` is far beyond any run, so Spark writes
only changelogs (no snapshot on the task thread). Prints `COUNTS <json list>`: the new ids per batch;
an id whose state was lost counts again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--ids", action="append", default=[], help="LO:HI, one batch each")
    args = ap.parse_args()

    from pyspark.sql import SparkSession

    work: Path = args.work
    inp = work / "in"
    inp.mkdir(parents=True, exist_ok=True)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("ssb-changelog-job")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "1000000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    counts: list[int] = []
    for rng in args.ids:
        lo, hi = (int(x) for x in rng.split(":"))
        n = len(list(inp.iterdir()))
        (inp / f"{n:04d}.json").write_text("\n".join(json.dumps({"id": i}) for i in range(lo, hi)))
        q = (
            spark.readStream.schema("id long")
            .json(str(inp))
            .dropDuplicates(["id"])
            .writeStream.trigger(availableNow=True)
            .option("checkpointLocation", str(work / "ckpt"))
            .foreachBatch(lambda df, _batch: counts.append(df.count()))
            .start()
        )
        q.awaitTermination()
    print("COUNTS " + json.dumps(counts), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
