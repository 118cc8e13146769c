"""Storage amplification (issue 6): blob-store bytes over live state bytes after many batches with
compactions, and the orphan count before and after GC.

The query (local[2], 2 shuffle partitions, so two RocksDB stores): `rate-micro-batch` with
SSB_AMP_ROWS rows per batch, grouped by `value % SSB_AMP_KEYS` with count, sum and the max of a
64-byte payload, so every batch rewrites keys all over a bounded key space. Each RocksDB commit
flushes a new L0 SST; RocksDB's background compactions then merge them, so SST files keep being
replaced and the backend keeps deleting the blobs of replaced files. SSB_AMP_COMPACT_ON_COMMIT=1
sets `spark.sql.streaming.stateStore.rocksdb.compactOnCommit` (a full compaction every commit: the
worst case, every SST rewritten every batch).

After SSB_AMP_BATCHES batches (default 500) the driver stops the query and waits until the
committer has checkpointed the last batch and cleaned up after it. Then, with nothing in flight:
- live bytes: the sum of `dir_index.total_size()` over the latest checkpoint's SnapshotIndexes,
  for the state stores and for the `_driver` pseudo store (Spark's metadata, offsets, commits);
- blob bytes: every blob under files/ and indexes/ (reports/ and queries/ are counted apart);
- amplification = blob bytes / live bytes (goal <= 1.2), overall and for the state stores alone
  (their files/ and indexes/ blobs over their live bytes);
- orphans: blobs under files/, indexes/ or reports/ that no retained checkpoint references, before
  and after a GC with zero grace (goal 0 after);
- compactions: Spark's compaction metrics from the progress, and the SST files replaced between
  consecutive snapshots of a store (from the sidecars' "N removed" log lines); the state bytes
  uploaded over the run (the churn cleanup had to delete again).

Figures are printed, never asserted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCHES = int(os.environ.get("SSB_AMP_BATCHES", "500"))
ROWS = int(os.environ.get("SSB_AMP_ROWS", "1000"))
KEYS = int(os.environ.get("SSB_AMP_KEYS", "20000"))
COMPACT_ON_COMMIT = os.environ.get("SSB_AMP_COMPACT_ON_COMMIT", "") not in ("", "0", "false")
TRIGGER_MS = 100
DRIVER_TIMEOUT_S = 1800.0


def driver(work: Path, batches: int) -> None:
    """The driver process: run the aggregation until batch `batches - 1` is checkpointed and cleaned
    up; append every progress to progress.jsonl and the query id to query_id."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_statebackend
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.lifecycle.reports import reports_prefix
    from spark_statebackend.stores import open_blob_store

    b = (
        SparkSession.builder.master("local[2]")
        .appName("ssb-amplification")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.compactOnCommit", str(COMPACT_ON_COMMIT).lower())
    )
    blob_url, log_url = (work / "blobs").as_uri(), (work / "log").as_uri()
    spark_statebackend.configure(
        b,
        check=True,
        **{"blobStore.url": blob_url, "checkpointLog.url": log_url, "spoolDir": str(work / "spool")},
    )
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .option("startTimestamp", 0)
        .option("advanceMillisPerBatch", 1000)
        .load()
        # A multiplicative hash spreads each batch's consecutive values over the whole key space, so
        # every batch updates keys in every SST rather than appending a sorted run.
        .withColumn("k", (F.col("value") * 7919) % KEYS)
        .withColumn("payload", F.sha2(F.col("value").cast("string"), 256))
        .groupBy("k")
        .agg(F.count("*").alias("c"), F.sum("value").alias("s"), F.max("payload").alias("p"))
    )
    q = (
        df.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(work / "ckpt"))
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )
    (work / "query_id").write_text(str(q.id))
    last = batches - 1
    seen = -1
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    with open(work / "progress.jsonl", "a") as out:
        while seen < last:
            # recentProgress keeps only the last 100 progresses: poll often enough not to miss any.
            for p in q.recentProgress:
                if p["batchId"] > seen:
                    seen = p["batchId"]
                    out.write(json.dumps(p, default=str) + "\n")
            out.flush()
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timeout at batch {seen}")
            time.sleep(0.2)
    q.stop()
    # The last checkpoint is written after its batch ends; cleanup after it deletes the reports of
    # its store version (batch + 1). Wait for both, so the measurement sees the steady state.
    store, cplog = open_blob_store(blob_url), open_checkpoint_log(log_url)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        latest = cplog.read_latest(str(q.id))
        if (
            latest is not None
            and latest.batch_id >= seen
            and not list(store.list(reports_prefix(str(q.id), latest.batch_id + 1)))
        ):
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"batch {seen} was not checkpointed and cleaned up in time")
    spark.stop()


def _sum_metric(progress: list[dict[str, Any]], name: str) -> float:
    return float(
        sum(
            float(op.get("customMetrics", {}).get(name, 0))
            for p in progress
            for op in p.get("stateOperators", [])
        )
    )


def measure(work: Path) -> dict[str, float]:
    """Figures of a finished run in `work` (the query stopped, its last batch checkpointed)."""
    from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.engine.blobs import load_snapshot_index
    from spark_statebackend.engine.transfer import TransferPool
    from spark_statebackend.lifecycle.gc import GarbageCollector
    from spark_statebackend.lifecycle.reachability import snapshot_closure
    from spark_statebackend.stores import open_blob_store

    qid = (work / "query_id").read_text().strip()
    store = open_blob_store((work / "blobs").as_uri())
    cplog = open_checkpoint_log((work / "log").as_uri())
    latest = cplog.read_latest(qid)
    assert latest is not None, "no checkpoint"
    res: dict[str, float] = {"checkpointed_batch": float(latest.batch_id)}

    live_state = live_driver = 0
    state_prefixes: list[str] = []
    for store_key, marker in latest.markers(BLOBSTORE_BACKEND).items():
        size = load_snapshot_index(store, marker).dir_index.total_size()
        if store_key == DRIVER_STORE:
            live_driver += size
        else:
            live_state += size
            seg = marker.split("/")[2:-1]  # indexes/<query>/<store key...>/<label>.json
            state_prefixes += [f"files/{qid}/{'/'.join(seg)}/", f"indexes/{qid}/{'/'.join(seg)}/"]
    res["live_state_bytes"] = float(live_state)
    res["live_driver_bytes"] = float(live_driver)
    res["live_bytes"] = float(live_state + live_driver)

    def blob_figures(prefix: str) -> None:
        infos = list(store.list(""))
        by_top: dict[str, tuple[int, int]] = {}
        for i in infos:
            top = i.blob_id.split("/", 1)[0]
            n, size = by_top.get(top, (0, 0))
            by_top[top] = (n + 1, size + i.size)
        for top in ("files", "indexes", "reports", "queries"):
            n, size = by_top.get(top, (0, 0))
            res[f"{prefix}{top}_blobs"] = float(n)
            res[f"{prefix}{top}_bytes"] = float(size)
        res[f"{prefix}blob_bytes"] = res[f"{prefix}files_bytes"] + res[f"{prefix}indexes_bytes"]
        res[f"{prefix}amplification"] = res[f"{prefix}blob_bytes"] / max(res["live_bytes"], 1)
        state_bytes = sum(i.size for i in infos if i.blob_id.startswith(tuple(state_prefixes)))
        res[f"{prefix}state_blob_bytes"] = float(state_bytes)
        res[f"{prefix}state_amplification"] = state_bytes / max(live_state, 1)

    def orphans() -> tuple[int, int]:
        """Blobs of the query that no retained checkpoint references (count, bytes)."""
        refs: set[str] = set()
        for cp in cplog.read_history(qid):
            for marker in cp.markers(BLOBSTORE_BACKEND).values():
                refs |= snapshot_closure(marker, load_snapshot_index(store, marker))
        extra = [i for i in store.list("") if not i.blob_id.startswith("queries/") and i.blob_id not in refs]
        return len(extra), sum(i.size for i in extra)

    blob_figures("")
    res["orphans_before_gc"], res["orphan_bytes_before_gc"] = map(float, orphans())
    with TransferPool(8) as pool:
        # Zero grace is safe here only because the query is stopped: nothing is being uploaded.
        report = GarbageCollector(store, cplog, pool, grace_seconds=0.0).run()
    res["gc_deleted"] = float(report.deleted)
    res["gc_problems"] = float(len(report.problems))
    res["orphans_after_gc"], res["orphan_bytes_after_gc"] = map(float, orphans())
    blob_figures("after_gc_")

    progress = [json.loads(x) for x in (work / "progress.jsonl").read_text().splitlines()]
    res["progress_batches_seen"] = float(len(progress))
    keys = sorted(
        {k for p in progress for op in p.get("stateOperators", []) for k in op.get("customMetrics", {})}
    )
    for name in keys:
        if "ompact" in name:
            res[f"spark_{name}_sum"] = _sum_metric(progress, name)
    logs = "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))
    snapshots = [
        (int(up), int(n))
        for store_key, up, n in re.findall(
            r"snapshot \S+ store (\S+): \d+ file\(s\) / (\d+) byte\(s\) new, \d+ retained, (\d+) removed",
            logs,
        )
        if store_key != DRIVER_STORE
    ]
    # A state store snapshot always drops the previous version's <v>.zip; anything more removed is
    # an SST a compaction replaced.
    res["state_snapshots"] = float(len(snapshots))
    res["snapshots_with_replaced_ssts"] = float(sum(1 for _, n in snapshots if n > 1))
    res["ssts_replaced"] = float(sum(max(n - 1, 0) for _, n in snapshots))
    # Churn: what was uploaded (and, but for the live bytes, deleted again) over the whole run.
    res["state_bytes_uploaded"] = float(sum(up for up, _ in snapshots))
    res["uploaded_over_live_state"] = res["state_bytes_uploaded"] / max(live_state, 1)
    return res


def main() -> dict[str, float]:
    results: dict[str, float] = {
        "batches": float(BATCHES),
        "rows_per_batch": float(ROWS),
        "keys": float(KEYS),
        "compact_on_commit": float(COMPACT_ON_COMMIT),
    }
    with tempfile.TemporaryDirectory(prefix="ssb-amp-", dir=os.environ.get("SSB_BENCH_DIR")) as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "benchmarks.amplification", str(work), str(BATCHES)],
            check=True,
            timeout=DRIVER_TIMEOUT_S + 600,
        )
        results["run_s"] = time.monotonic() - t0
        results.update(measure(work))
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3:
        driver(Path(sys.argv[1]), int(sys.argv[2]))
    else:
        for k, v in main().items():
            print(f"{k:40} {v:14.3f}")
