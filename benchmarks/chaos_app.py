"""The driver of the randomized fault run (benchmarks/chaos.py): two stateful queries in one application.

    python -m benchmarks.chaos_app --work DIR [--master M] [--plain] [--until QUERY=N ...]
        [--stop-file PATH] [--trigger-ms MS] [--ssb KEY=VALUE ...] [--extra KEY=VALUE ...]

The queries are demo_app's `agg` (a groupBy count/sum in update mode) and `join` (a stream-stream
inner join without watermark, so its state grows all run), both over the deterministic
`rate-micro-batch` source: batch b always reads the same rows, whatever restarts happened. Query q
writes batch b's rows to out/<q>/<b>.json (a temp file renamed over it, so a batch that runs again
overwrites it): the union over batch ids is the query's output, and an uninterrupted `--plain` run
(Spark's own RocksDB provider, no backend) to the same batch ids is the reference.

Each query has its own checkpoint location, ckpt/<q>. `--ssb KEY=VALUE` are spark.statebackend.*
keys without the prefix, set with configure(); `--extra` are raw Spark conf keys.

Output lines (stdout, flushed), which the runner parses:
    APP <application id>
    QUERY <name> <query id>
    BATCH <name> <batch id>          each finished batch
    QUERY FAILED <name> <error>      then exit 1
    CHECKPOINTED <name> <batch id>   after a clean stop: the query's last batch is in the checkpoint log
    STOPPED                          then exit 0
The run ends when every `--until` query has finished batch N (each query stops at its own N), or when
`--stop-file` appears. With the backend on, a clean end waits until each query's last finished batch
is checkpointed and its reports are cleaned up (exit 3 if that takes longer than --commit-wait).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

QUERIES = ("agg", "join")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what}: expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _sink(out: Path) -> Any:
    out.mkdir(parents=True, exist_ok=True)

    def sink(batch_df: Any, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in batch_df.collect())
        tmp = out / f".{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"{batch_id}.json")

    return sink


def wait_committed(ssb: dict[str, str], query_id: str, batch: int, timeout: float) -> bool:
    """True once `batch` (or a later one) of `query_id` is the latest checkpoint and the reports of the
    next version are gone (the committer cleaned up after it)."""
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.checkpoints.reports import reports_prefix
    from spark_statebackend.errors import StateBackendError
    from spark_statebackend.spark.config import PREFIX, Settings
    from spark_statebackend.stores import open_blob_store

    settings = Settings.from_conf({PREFIX + k: v for k, v in ssb.items()})
    store = open_blob_store(settings.blob_url, settings.blob_options)
    log = open_checkpoint_log(settings.log_url, settings.log_options)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                latest = log.read_latest(query_id)
                if (
                    latest is not None
                    and latest.batch_id >= batch
                    and not list(store.list(reports_prefix(query_id, latest.batch_id + 1)))
                ):
                    return True
            except StateBackendError as e:  # a log or store still recovering: ask again
                print(f"waiting for the checkpoint of {query_id}: {e}", file=sys.stderr, flush=True)
            time.sleep(0.2)
        return False
    finally:
        log.close()
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--plain", action="store_true", help="Spark's own provider, no backend (reference)")
    ap.add_argument("--until", action="append", default=[], help="QUERY=N: stop QUERY after batch N")
    ap.add_argument("--stop-file", type=Path, help="stop cleanly once this file exists")
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--ssb", action="append", default=[], help="spark.statebackend.KEY=VALUE, no prefix")
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE spark conf")
    ap.add_argument("--commit-wait", type=float, default=180.0, help="seconds, at a clean stop")
    args = ap.parse_args()
    until = {k: int(v) for k, v in _pairs(args.until, "--until").items()}
    if set(until) - set(QUERIES):
        raise SystemExit(f"--until: unknown queries {sorted(set(until) - set(QUERIES))}")
    if not until and args.stop_file is None:
        raise SystemExit("give --until or --stop-file")
    ssb = _pairs(args.ssb, "--ssb")

    from pyspark.sql import SparkSession

    from spark_statebackend.demo_app import build

    work: Path = args.work
    b = (
        SparkSession.builder.master(args.master)
        .appName("ssb-chaos")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # its \r-redrawn bars would garble our lines
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.executor.memory", "1g")
    )
    for k, v in _pairs(args.extra, "--extra").items():
        b = b.config(k, v)
    if not args.plain:
        import spark_statebackend

        spark_statebackend.configure(b, check=True, **ssb)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"APP {spark.sparkContext.applicationId}", flush=True)
    queries = {}
    for name in QUERIES:
        df, mode = build(spark, name)
        queries[name] = (
            df.writeStream.outputMode(mode)
            .foreachBatch(_sink(work / "out" / name))
            .option("checkpointLocation", str(work / "ckpt" / name))
            .queryName(f"ssb_chaos_{name}")
            .trigger(processingTime=f"{args.trigger_ms} milliseconds")
            .start()
        )
        print(f"QUERY {name} {queries[name].id}", flush=True)
    seen = dict.fromkeys(QUERIES, -1)
    running = set(QUERIES)
    while running:
        for name in sorted(running):
            q = queries[name]
            last = q.lastProgress
            if last is not None and last["batchId"] > seen[name]:
                # recentProgress (up to 100 batches, each a JSON document) only when batches were missed:
                # asking for it on every poll costs the driver a core on a 2-core machine.
                progress = q.recentProgress if last["batchId"] > seen[name] + 1 else [last]
                for b in sorted(p["batchId"] for p in progress):
                    if b > seen[name]:
                        seen[name] = b
                        print(f"BATCH {name} {b}", flush=True)
            if q.exception() is not None:
                print(f"QUERY FAILED {name} {q.exception()}", flush=True)
                return 1
            if name in until and seen[name] >= until[name]:
                q.stop()
                running.discard(name)
        if args.stop_file is not None and args.stop_file.exists():
            break
        time.sleep(0.2)
    for q in queries.values():
        q.stop()
    code = 0
    if not args.plain:
        for name in QUERIES:
            if seen[name] < 0:
                continue
            if wait_committed(ssb, queries[name].id, seen[name], args.commit_wait):
                print(f"CHECKPOINTED {name} {seen[name]}", flush=True)
            else:
                print(f"COMMIT TIMEOUT {name} {seen[name]}", flush=True)
                code = 3
    spark.stop()
    print("STOPPED", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
