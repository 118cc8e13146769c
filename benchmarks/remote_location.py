"""A remote checkpoint location beside Spark's provider on the same file system (issue 22 item 2).

One short run, local[2]: a stateful aggregation (rate-micro-batch, SSB_BENCH_ROWS rows per batch,
grouped by value % SSB_BENCH_KEYS with count and sum, SSB_BENCH_PARTITIONS shuffle partitions,
SSB_BENCH_BATCHES batches, processingTime 1 s) whose checkpoint location is on tests/stubs'
object-store file system (`objfs://`, no hard links, non-atomic rename: every file Spark writes there
is a copy then a rename by copy). Twice, back to back: Spark's own RocksDB provider writing its state
into the location, then Spark's provider with this backend (state in the host's mirror, backed up to
a local blob store). Reported from Spark's progress, steady batches 1..N-1: the state operator's
commitTimeMs and the batch's triggerExecution, p50/p99, and ours / Spark's.

    .venv/bin/python -m benchmarks.remote_location
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = int(os.environ.get("SSB_BENCH_ROWS", "20000"))
KEYS = int(os.environ.get("SSB_BENCH_KEYS", "20000"))
PARTITIONS = int(os.environ.get("SSB_BENCH_PARTITIONS", "8"))
BATCHES = int(os.environ.get("SSB_BENCH_BATCHES", "12"))
LOCATION = "objfs://bucket/ckpt"


def app(work: Path) -> int:
    """The job (run by spark-submit): prints `PROGRESS <json>` per batch, stops after BATCHES."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.appName("ssb-remote-bench").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
        .withColumn("k", F.col("value") % KEYS)
        .groupBy("k")
        .agg(F.count("*").alias("c"), F.sum("value").alias("s"))
    )
    q = (
        df.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", LOCATION)
        .trigger(processingTime="1 second")
        .start()
    )
    seen = -1
    deadline = time.monotonic() + 900
    while seen < BATCHES - 1 and time.monotonic() < deadline and q.exception() is None:
        p = q.lastProgress
        if p is not None and p["batchId"] > seen:
            seen = p["batchId"]
            print("PROGRESS " + json.dumps(p, default=str), flush=True)
        time.sleep(0.05)
    q.stop()
    spark.stop()
    return 0 if seen >= BATCHES - 1 else 1


def _run(work: Path, jar: Path, ours: bool) -> list[dict[str, object]]:
    from spark_statebackend.spark import jar_path
    from tests.jobrig import OBJFS_CLASS, PLUGIN, backend_conf, job_env, pyspark_home

    work.mkdir(parents=True)
    conf = {
        "spark.sql.shuffle.partitions": str(PARTITIONS),
        "spark.ui.enabled": "false",
        "spark.local.dir": str(work / "local"),
        "spark.hadoop.fs.objfs.impl": OBJFS_CLASS,
        "spark.hadoop.fs.objfs.root": str(work / "objfs"),
        "spark.driver.extraClassPath": str(jar),
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    }  # fmt: skip
    if ours:
        conf.update({"spark.plugins": PLUGIN, **backend_conf(work, mirrorDir=str(work / "mirrors"))})
    cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--master", "local[2]", "--jars", str(jar_path())]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += [__file__, "--app", str(work)]
    proc = subprocess.run(cmd, cwd=work, env=job_env(), capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        side = "ours" if ours else "spark"
        raise RuntimeError(f"{side} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [json.loads(line[9:]) for line in proc.stdout.splitlines() if line.startswith("PROGRESS ")]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _figures(progress: list[dict[str, object]]) -> dict[str, float]:
    steady = [p for p in progress if 0 < int(p["batchId"]) < BATCHES]  # type: ignore[call-overload]
    commit = [float(p["stateOperators"][0]["commitTimeMs"]) for p in steady]  # type: ignore[index]
    batch = [float(p["durationMs"]["triggerExecution"]) for p in steady]  # type: ignore[index]
    return {
        "commit_ms_p50": _pct(commit, 0.5),
        "commit_ms_p99": _pct(commit, 0.99),
        "batch_ms_p50": _pct(batch, 0.5),
        "batch_ms_p99": _pct(batch, 0.99),
        "batch_ms_mean": statistics.fmean(batch),
    }


def main() -> dict[str, object]:
    from tests.jobrig import objfs_jar

    base = Path(tempfile.mkdtemp(prefix="ssb-remote-bench-"))
    try:
        jar = objfs_jar(base / "objfs-build")
        spark = _figures(_run(base / "spark", jar, ours=False))
        ours = _figures(_run(base / "ours", jar, ours=True))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out: dict[str, object] = {"rows": ROWS, "keys": KEYS, "partitions": PARTITIONS, "batches": BATCHES}
    out.update({f"spark_{k}": v for k, v in spark.items()})
    out.update({f"ours_{k}": v for k, v in ours.items()})
    out.update({f"ratio_{k}": ours[k] / spark[k] if spark[k] else float("nan") for k in spark})
    return out


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--app":
        sys.exit(app(Path(sys.argv[2])))
    for key, value in main().items():
        print(f"{key:28} {value:12.3f}" if isinstance(value, float) else f"{key:28} {value}")
