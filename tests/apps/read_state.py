"""Read state with Spark's state data source, the backend enabled with configure().

    python read_state.py --work DIR LOCATION[@BATCH] ...

Prints one line `STATE <location> <json rows>` per location (rows sorted: key, value, partition id),
read with `spark.read.format("statestore")` (at BATCH if given, else the latest committed batch). The
blob store, checkpoint log and spool are DIR/blobs, DIR/log and DIR/spool, as for demo_app. Nothing else
runs in this application: the reader is the first thing that touches each location.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import spark_statebackend


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("locations", nargs="+")
    args = ap.parse_args()
    work: Path = args.work
    b = (
        SparkSession.builder.master("local[2]")
        .appName("ssb-read-state")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
    )
    spark_statebackend.configure(
        b,
        **{
            "blobStore.url": (work / "blobs").as_uri(),
            "checkpointLog.url": (work / "log").as_uri(),
            "spoolDir": str(work / "spool"),
        },
    )
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for item in args.locations:
        location, _, batch = item.partition("@")
        reader = spark.read.format("statestore")
        if batch:
            reader = reader.option("batchId", int(batch))
        rows = [r.asDict(recursive=True) for r in reader.load(location).collect()]
        rows.sort(key=lambda r: json.dumps(r, sort_keys=True))
        print(f"STATE {item} {json.dumps(rows, sort_keys=True)}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
