"""Spark side by side, on the workload of research/baseline.md: local[2], 8 partitions, dropDuplicates
over 10 batches of ROWS rows x 1 KB (about 1 GiB of live RocksDB state at 100k rows per batch).

Measured in one run, ours against Spark's own RocksDB provider:
- commitTimeMs and batch duration, p50/p99 (commitTimeMs is summed over the 8 partition tasks);
- restore in a new process with empty local dirs: Spark from its checkpoint location, ours from the
  local-directory blob store with the checkpoint location also gone (the harder case); the figure is
  the first batch after start (it includes loading the state) and the summed store load/restore time;
- checkpoint lag p99: end of a batch to its CheckpointV2 being durable (from the committer's log).

SSB_BENCH_ROWS (default 100000) scales the workload; SSB_BENCH_EXTRA_CONF (`key=value,key=value`)
adds Spark confs to both runs and SSB_BENCH_BLOB_URL replaces our blob store, for experiments;
figures are printed, never asserted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCHES = 10


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def driver(work: Path, ours: bool, until: int, rows: int) -> None:
    """One driver process: run the dedup query until batch `until`, write progress to progress.jsonl."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    b = (
        SparkSession.builder.master("local[2]")
        .appName("ssb-bench")
        .config("spark.driver.memory", "8g")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    )
    for item in filter(None, os.environ.get("SSB_BENCH_EXTRA_CONF", "").split(",")):
        key, _, value = item.partition("=")
        b = b.config(key.strip(), value.strip())
    if ours:
        import spark_statebackend

        settings: dict[str, str] = {
            "blobStore.url": os.environ.get("SSB_BENCH_BLOB_URL") or (work / "blobs").as_uri(),
            "checkpointLog.url": (work / "log").as_uri(),
            "spoolDir": str(work / "spool"),
        }
        spark_statebackend.configure(b, check=True, **settings)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    payload = F.concat(
        *[F.sha2(F.concat(F.col("value").cast("string"), F.lit(f"#{i}")), 256) for i in range(16)]
    )
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", 2)
        .option("startTimestamp", 0)
        .option("advanceMillisPerBatch", 1000)
        .load()
        .withColumn("payload", payload)
        .dropDuplicates(["value", "payload"])
    )
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(work / "ckpt"))
        .trigger(processingTime="6 seconds")
        .start()
    )
    seen: dict[int, Any] = {}
    with open(work / "progress.jsonl", "a") as out:
        while not seen or max(seen) < until:
            for p in q.recentProgress:
                if p["batchId"] not in seen:
                    seen[p["batchId"]] = p
                    out.write(json.dumps(p, default=str) + "\n")
                    out.flush()
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            time.sleep(0.2)
    q.stop()
    if ours:
        from spark_statebackend.checkpoints.logs import open_checkpoint_log

        cplog = open_checkpoint_log((work / "log").as_uri())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            latest = cplog.read_latest(str(q.id))
            if latest is not None and latest.batch_id >= until:
                break
            time.sleep(0.2)
    spark.stop()


def _run(work: Path, ours: bool, until: int, rows: int) -> list[dict[str, Any]]:
    before = (work / "progress.jsonl").read_text().splitlines() if (work / "progress.jsonl").exists() else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.spark_commit",
            str(work),
            "ours" if ours else "spark",
            str(until),
            str(rows),
        ],
        check=True,
        timeout=3600,
    )
    lines = (work / "progress.jsonl").read_text().splitlines()[len(before) :]
    return [json.loads(x) for x in lines]


def _custom_ms(p: dict[str, Any], metric: str) -> float:
    return float(sum(float(op.get("customMetrics", {}).get(metric, 0)) for op in p.get("stateOperators", [])))


def _commit_ms(p: dict[str, Any]) -> float:
    return float(sum(op.get("commitTimeMs", 0) for op in p.get("stateOperators", [])))


def main() -> dict[str, float]:
    rows = int(os.environ.get("SSB_BENCH_ROWS", "100000"))
    results: dict[str, float] = {"rows_per_batch": rows}
    with tempfile.TemporaryDirectory(prefix="ssb-spark-bench-", dir=os.environ.get("SSB_BENCH_DIR")) as tmp:
        for name, ours in (("spark", False), ("ours", True)):
            work = Path(tmp) / name
            work.mkdir()
            progress = _run(work, ours, BATCHES - 1, rows)
            steady = [p for p in progress if p["batchId"] > 0]
            results[f"{name}_commit_ms_p50"] = _pct([_commit_ms(p) for p in steady], 0.5)
            results[f"{name}_commit_ms_p99"] = _pct([_commit_ms(p) for p in steady], 0.99)
            for metric in (
                "rocksdbCommitFlushLatency",
                "rocksdbCommitFileSyncLatencyMs",
                "rocksdbCommitCheckpointLatency",
            ):
                results[f"{name}_{metric}_p50"] = _pct([_custom_ms(p, metric) for p in steady], 0.5)
                results[f"{name}_{metric}_p99"] = _pct([_custom_ms(p, metric) for p in steady], 0.99)
            results[f"{name}_batch_ms_p50"] = _pct([float(p["batchDuration"]) for p in steady], 0.5)
            results[f"{name}_batch_ms_p99"] = _pct([float(p["batchDuration"]) for p in steady], 0.99)
            state = work / "ckpt" / "state"
            results[f"{name}_state_dir_bytes"] = float(
                sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
            )
            if ours:  # the committer's lag per batch, before the spool (and its logs) is wiped
                run_logs = "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))
                lags = [
                    float(s)
                    for s in re.findall(r"written with \d+ state marker\(s\); lag ([0-9.]+)s", run_logs)
                ]
                results["ours_checkpoints_written"] = float(len(lags))
                results["ours_checkpoint_lag_s_p50"] = _pct(lags, 0.5)
                results["ours_checkpoint_lag_s_p99"] = _pct(lags, 0.99)
            # restore in a new process with empty local dirs
            shutil.rmtree(work / "local", ignore_errors=True)
            if ours:
                for d in ("ckpt", "spool"):
                    shutil.rmtree(work / d, ignore_errors=True)
            t0 = time.monotonic()
            after = _run(work, ours, BATCHES, rows)
            results[f"{name}_restart_to_first_batch_s"] = time.monotonic() - t0
            first = after[0]
            results[f"{name}_restore_first_batch_ms"] = float(first["batchDuration"])
            load = sum(
                float(op.get("customMetrics", {}).get("rocksdbLoadLatencyMs", 0))
                for op in first["stateOperators"]
            )
            results[f"{name}_rocksdb_load_ms_sum"] = load
            if ours:
                logs = "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))
                restores = [
                    float(s)
                    for s in re.findall(
                        r"restore indexes/\S+ \(store \d+/\d+/\S+\) into .* in ([0-9.]+)s", logs
                    )
                ]
                results["ours_store_restores"] = float(len(restores))
                results["ours_restore_ms_sum"] = 1000 * sum(restores)
                results["ours_restore_ms_max"] = 1000 * max(restores, default=0.0)
    if results.get("spark_rocksdb_load_ms_sum") and "ours_restore_ms_sum" in results:
        # Spark's state load copies the SSTs from its checkpoint location; ours restores them from the
        # blob store first (outside Spark's load timer), then Spark loads the restored files.
        results["ours_restore_plus_load_ms_sum"] = (
            results["ours_restore_ms_sum"] + results["ours_rocksdb_load_ms_sum"]
        )
        results["restore_ours_over_spark"] = (
            results["ours_restore_plus_load_ms_sum"] / results["spark_rocksdb_load_ms_sum"]
        )
    if results.get("spark_commit_ms_p99"):
        results["commit_p99_ours_over_spark"] = results["ours_commit_ms_p99"] / results["spark_commit_ms_p99"]
    return results


if __name__ == "__main__":
    if len(sys.argv) == 5:
        driver(Path(sys.argv[1]), sys.argv[2] == "ours", int(sys.argv[3]), int(sys.argv[4]))
    else:
        for k, v in main().items():
            print(f"{k:40} {v:14.3f}")
