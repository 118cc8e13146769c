"""A stateful streaming driver, run as its own process by `make demo` and the end-to-end tests.

    python -m spark_statebackend.demo_app --shape window|agg|dedup|join --work DIR --until-batch N
        [--master M] [--plain | --no-configure] [--log-url URL] [--blob-url URL] [--extra KEY=VALUE ...]
        [--runtime-conf KEY=VALUE ...] [--wait-caught-up]

Input is the deterministic `rate-micro-batch` source (fixed rows per batch, fixed timestamps), so
every run of the same batch ids produces the same rows. Each batch's output is written to
out/<batch id>.json (overwritten if the batch runs again), so the union over batch ids is the query's
result whatever restarts happened. `--plain` runs Spark's own RocksDB provider (the reference).
`--extra` confs go on the session builder; `--no-configure` leaves the backend to confs the launcher
set (spark-submit --conf spark.jars=... --conf spark.plugins=...), as a job that never calls
configure() does; `--runtime-conf` confs are set with spark.conf.set before the query starts.
`--wait-caught-up` (changelog checkpointing, checkpoint format v1): before exiting, wait until Spark has
closed every state store of the run and the latest checkpoint restores each one from the newest
snapshot Spark has for it (runtime/upgrades.py), so a restart from the blob store and one from
Spark's own files start from the same snapshot.
The process prints `BATCH <id>` as batches finish and exits 0 after batch N is done and, with the
backend on, checkpointed and cleaned up. Spark's progress of every batch of the run (its JSON, with
the state operators' custom metrics such as rocksdbNumReplayChangelogFiles) is written to
progress/<batch id>.json, so tests can read what Spark itself measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SHAPES = ("window", "agg", "dedup", "join")
ROWS = 100
ROWS_PER_BATCH_ENV = "SSB_DEMO_ROWS"


def build(spark, shape: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    def rate(rows: int = int(os.environ.get(ROWS_PER_BATCH_ENV, ROWS))):  # type: ignore[no-untyped-def]
        return (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows)
            .option("numPartitions", 2)
            .option("startTimestamp", 0)
            .option("advanceMillisPerBatch", 1000)
            .load()
        )

    if shape == "window":
        return (
            rate()
            .withWatermark("timestamp", "10 seconds")
            .groupBy(F.window("timestamp", "5 seconds"), (F.col("value") % 10).alias("k"))
            .agg(F.count("*").alias("c"), F.sum("value").alias("s"))
            .select(F.col("window.start").cast("long").alias("w"), "k", "c", "s"),
            "update",
        )
    if shape == "agg":
        return (
            rate()
            .withColumn("k", F.col("value") % 7)
            .groupBy("k")
            .agg(F.count("*").alias("c"), F.sum("value").alias("s")),
            "update",
        )
    if shape == "dedup":
        return (
            rate()
            .withColumn("k", F.col("value") % 250)
            .withWatermark("timestamp", "1 hour")
            .dropDuplicates(["k"])
            .select("k", "value"),
            "append",
        )
    left = rate().select(F.col("value").alias("lk"), F.col("value").alias("lv"))
    right = rate().select((F.col("value") - 50).alias("rk"), F.col("value").alias("rv"))
    return left.join(right, F.col("lk") == F.col("rk")).select("lk", "lv", "rv"), "append"


def main() -> int:
    """Run the query until batch --until-batch is done (and, with the backend, committed); the exit
    code: 0 done, 1 the query failed, 2 it timed out (each also printed)."""
    args = _parse_args()
    work: Path = args.work
    spark = _session(args)
    q = _start_query(spark, args)
    failed, seen = _wait_for_batch(q, args.until_batch)
    if failed:
        return failed
    q.stop()
    _write_progress(q, work / "progress")
    if not args.plain:
        _wait_committed(args, work, q.id, seen)
        if args.wait_caught_up:
            _wait_caught_up(args, work, q.id)
    spark.stop()
    return 0


def _parse_args() -> argparse.Namespace:
    """The command line (the module doc)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--until-batch", type=int, required=True)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--log-url")
    ap.add_argument("--blob-url")
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE spark conf")
    ap.add_argument(
        "--no-configure", action="store_true", help="the launcher's confs enable the backend (spark-submit)"
    )
    ap.add_argument(
        "--runtime-conf", action="append", default=[], help="KEY=VALUE set with spark.conf.set before start"
    )
    ap.add_argument("--trigger-ms", type=int, default=200, help="processing-time trigger interval")
    ap.add_argument(
        "--wait-caught-up", action="store_true", help="wait until the backup has Spark's newest snapshots"
    )
    return ap.parse_args()


def _session(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The SparkSession: RocksDB state, the --extra confs, the backend configured under --work unless
    --plain or --no-configure, then the --runtime-conf confs set."""
    from pyspark.sql import SparkSession

    work: Path = args.work
    b = (
        SparkSession.builder.master(args.master)
        .appName(f"ssb-test-{args.shape}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.executor.memory", "1g")
    )
    for item in args.extra:
        k, _, v = item.partition("=")
        b = b.config(k, v)
    if not args.plain and not args.no_configure:
        import spark_statebackend

        settings: dict[str, str] = {
            "blobStore.url": args.blob_url or (work / "blobs").as_uri(),
            "checkpointLog.url": args.log_url or (work / "log").as_uri(),
            "spoolDir": str(work / "spool"),
        }
        spark_statebackend.configure(b, check=True, **settings)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for item in args.runtime_conf:
        k, _, v = item.partition("=")
        spark.conf.set(k, v)
    return spark


def _start_query(spark, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Start the --shape query, writing each batch's sorted rows to out/<batch id>.json."""
    work: Path = args.work
    df, mode = build(spark, args.shape)
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)

    def sink(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = sorted(tuple(r) for r in batch_df.collect())
        tmp = out / f".{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"{batch_id}.json")

    return (
        df.writeStream.outputMode(mode)
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "ckpt"))
        .queryName(f"ssb_{args.shape}")
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )


def _wait_for_batch(q, until_batch: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Print `BATCH <id>` as batches finish until batch `until_batch` is done; (0, the last batch id
    seen), or (1, it) if the query failed, (2, it) if 240 s passed first (each printed)."""
    deadline = time.monotonic() + 240
    seen = -1
    while True:
        p = q.lastProgress
        if p is not None and p["batchId"] > seen:
            seen = p["batchId"]
            print(f"BATCH {seen}", flush=True)
        if seen >= until_batch:
            return 0, seen
        if q.exception() is not None:
            print(f"QUERY FAILED {q.exception()}", flush=True)
            return 1, seen
        if time.monotonic() > deadline:
            print("TIMEOUT", flush=True)
            return 2, seen
        time.sleep(0.05)


def _write_progress(q, into: Path) -> None:  # type: ignore[no-untyped-def]
    """Every progress Spark kept for this run (recentProgress: the last 100 batches), one file per batch."""
    into.mkdir(parents=True, exist_ok=True)
    for p in q.recentProgress:
        tmp = into / f".{p.batchId}.tmp"
        tmp.write_text(p.json)
        tmp.replace(into / f"{p.batchId}.json")


def _wait_caught_up(args: argparse.Namespace, work: Path, query_id: str) -> None:
    """Wait until Spark has closed every state store of this run (its RocksDB instances' local dirs
    are gone: its maintenance thread publishes no further snapshot of them) and the latest checkpoint's
    recipe of every store starts from the newest snapshot zip <= its version in Spark's store dir."""
    from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, StoreInstance
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.engine.blobs import load_snapshot_index
    from spark_statebackend.stores import open_blob_store

    store = open_blob_store(args.blob_url or (work / "blobs").as_uri())
    log = open_checkpoint_log(args.log_url or (work / "log").as_uri())

    def caught_up() -> bool:
        if any((work / "local").rglob("StateStoreId*")):
            return False  # a store Spark has not closed yet may still publish a snapshot
        latest = log.read_latest(query_id)
        if latest is None:
            return False
        for key, marker in latest.markers(BLOBSTORE_BACKEND).items():
            if key == DRIVER_STORE:
                continue
            md = load_snapshot_index(store, marker).metadata
            d = (work / "ckpt").joinpath(*StoreInstance.parse(key).dir_parts())
            zips = [
                int(p.stem) for p in d.glob("*.zip") if p.stem.isdigit() and int(p.stem) <= (md.version or 0)
            ]
            if md.snapshot_version != max(zips, default=0):
                return False
        return True

    deadline = time.monotonic() + 120
    while not caught_up():
        if time.monotonic() > deadline:
            print("CATCH-UP TIMEOUT", flush=True)
            sys.exit(4)
        time.sleep(0.1)
    print("CAUGHT UP", flush=True)


def _wait_committed(args: argparse.Namespace, work: Path, query_id: str, batch: int) -> None:
    """Wait until the committer has checkpointed `batch` (or later) and cleaned up after it.

    Reports of a later version may remain: q.stop() can interrupt a batch (e.g. a no-data batch that
    advances the watermark) after its stores uploaded; those reports never complete and expire by TTL."""
    from spark_statebackend.checkpoints.checkpoint import version_of_batch
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.lifecycle.reports import reports_prefix
    from spark_statebackend.stores import open_blob_store

    store = open_blob_store(args.blob_url or (work / "blobs").as_uri())
    log = open_checkpoint_log(args.log_url or (work / "log").as_uri())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        latest = log.read_latest(query_id)
        if latest is not None and latest.batch_id >= batch:
            cleaned = not list(store.list(reports_prefix(query_id, version_of_batch(latest.batch_id))))
            if cleaned:
                print(f"CHECKPOINTED {latest.batch_id}", flush=True)
                return
        time.sleep(0.1)
    print("COMMIT TIMEOUT", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    sys.exit(main())
