"""The driver of the randomized fault run (benchmarks/chaos.py): four stateful queries in one application.

    python -m benchmarks.chaos_app --work DIR [--master M] [--plain] [--queries Q,Q...] [--until QUERY=N ...]
        [--stop-file PATH] [--quit-file PATH] [--input DIR] [--out DIR] [--checkpoint-root DIR]
        [--trigger-ms MS] [--ssb KEY=VALUE ...] [--extra KEY=VALUE ...]

Two queries over the deterministic `rate-micro-batch` source: demo_app's `agg` (a groupBy count/sum in
update mode) and `join` (a stream-stream inner join without watermark, so its state grows all run).
Batch b always reads the same rows, whatever restarts happened. Query q writes batch b's rows to
out/<q>/<b>.json (a temp file renamed over it, so a batch that runs again overwrites it): the union
over batch ids is the query's output, and an uninterrupted `--plain` run (Spark's own RocksDB
provider, no backend; `--queries agg,join`) to the same batch ids is the reference.

Two queries over a file source whose files keep arriving (the runner writes them into --input, default
<work>/input, while the application runs: JSON lines `{"id": <unique>, "key": <k>}`), so what Spark
plans for a batch depends on when it plans it (maxFilesPerTrigger=2):
  files_sink  dropDuplicates on `id` (state: every id seen) into Spark's file sink, out/files_sink
              (JSON; `_spark_metadata` says which part files batches committed, and a batch id it
              holds is skipped when it runs again);
  files_fb    applyInPandasWithState per `key` (state: count and sum of the ids seen) into
              `foreachBatch`, which writes out/files_fb/<b>.json as [key, [ids of the batch], count,
              sum] rows only if that file is not there yet (skip-if-present: an idempotent writer keyed
              by batch id, as Delta's txnVersion is).
Both sinks keep what the first run of a batch id wrote, so a batch that Spark plans again with other
files loses the records of the first plan that the second has not: the runner's checker sees it.

Each query has its own checkpoint location, <checkpoint root>/<q> (default <work>/ckpt).
`--ssb KEY=VALUE` are spark.statebackend.* keys without the prefix, set with configure(); `--extra`
are raw Spark conf keys.

Output lines (stdout, flushed), which the runner parses:
    APP <application id>
    QUERY <name> <query id>
    BATCH <name> <batch id>          each finished batch
    QUERY FAILED <name> <error>      then exit 1
    CHECKPOINTED <name> <batch id>   after a clean stop: the query's last batch is in the checkpoint log
    STOPPED                          then exit 0
    QUIT                             after --quit-file: stopped without waiting, then exit 0
A batch is a progress event with input rows: a file query with no new file runs no batch (its idle
progress events are not batches). The run ends when every `--until` query has finished batch N (each
query stops at its own N), or when `--stop-file` appears. With the backend on, a clean end waits until
each query's last finished batch is checkpointed and its reports are cleaned up (exit 3 if that takes
longer than --commit-wait). `--quit-file` is the stop of a user who does not wait: once it appears
every query is stopped and the SparkContext with it at once (whatever the backend still has to do
happens inside `stop()`, as for any application).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RATE_QUERIES = ("agg", "join")
FILE_QUERIES = ("files_sink", "files_fb")
QUERIES = RATE_QUERIES + FILE_QUERIES
MAX_FILES_PER_TRIGGER = 2
INPUT_SCHEMA = "id LONG, key LONG"
FB_SCHEMA = "key LONG, ids ARRAY<LONG>, c LONG, s LONG"


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


def _skip_if_present_sink(out: Path) -> Any:
    """foreachBatch writing out/<batch>.json once: a batch id already there is skipped, as an
    idempotent writer keyed by batch id does (the first run of a batch id wins)."""
    out.mkdir(parents=True, exist_ok=True)

    def sink(batch_df: Any, batch_id: int) -> None:
        final = out / f"{batch_id}.json"
        if final.exists():
            return
        rows = sorted([r["key"], sorted(r["ids"]), r["c"], r["s"]] for r in batch_df.collect())
        tmp = out / f".{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(final)

    return sink


def _count_ids(key: tuple[Any, ...], pdfs: Any, state: Any) -> Any:
    """applyInPandasWithState of files_fb: one row per key and batch, the batch's ids of the key and the
    key's running count and sum of ids (its state)."""
    import pandas as pd

    count, total = state.get if state.exists else (0, 0)
    ids = sorted(int(i) for pdf in pdfs for i in pdf["id"])
    count, total = int(count) + len(ids), int(total) + sum(ids)
    state.update((count, total))
    yield pd.DataFrame({"key": [int(key[0])], "ids": [ids], "c": [count], "s": [total]})


def build_files(spark: Any, name: str, input_dir: Path, out: Path) -> Any:
    """The writer (not started) of file query `name` (module doc)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    input_dir.mkdir(parents=True, exist_ok=True)
    records = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", MAX_FILES_PER_TRIGGER)
        .json(str(input_dir))
    )
    if name == "files_sink":
        return (
            records.dropDuplicates(["id"])
            .writeStream.outputMode("append")
            .format("json")
            .option("path", str(out / name))
        )
    counted = records.groupBy("key").applyInPandasWithState(
        _count_ids, FB_SCHEMA, "c LONG, s LONG", "update", GroupStateTimeout.NoTimeout
    )
    return counted.writeStream.outputMode("update").foreachBatch(_skip_if_present_sink(out / name))


def _batches(progress: list[dict[str, Any]], after: int) -> list[int]:
    """The batch ids after `after` that ran: progress events with input rows (an idle file query
    reports progress without running a batch)."""
    return sorted(p["batchId"] for p in progress if p["batchId"] > after and p.get("numInputRows", 0) > 0)


def _report_batches(name: str, query: Any, seen: dict[str, int]) -> None:
    """Print `BATCH <name> <id>` for each batch `query` ran since `seen[name]`, and advance it."""
    last = query.lastProgress
    if last is None or last["batchId"] <= seen[name]:
        return
    # recentProgress (up to 100 batches, each a JSON document) only when batches were missed:
    # asking for it on every poll costs the driver a core on a 2-core machine.
    progress = query.recentProgress if last["batchId"] > seen[name] + 1 else [last]
    for batch in _batches(progress, seen[name]):
        seen[name] = batch
        print(f"BATCH {name} {batch}", flush=True)


def wait_committed(ssb: dict[str, str], query_id: str, batch: int, timeout: float) -> bool:
    """True once `batch` (or a later one) of `query_id` is the latest checkpoint and the reports of the
    next version are gone (the committer cleaned up after it)."""
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.errors import StateBackendError
    from spark_statebackend.lifecycle.reports import reports_prefix
    from spark_statebackend.settings import PREFIX, Settings
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
    ap.add_argument("--queries", default=",".join(QUERIES), help="comma-separated (default: all)")
    ap.add_argument("--input", type=Path, help="the file queries' input dir (default <work>/input)")
    ap.add_argument("--out", type=Path, help="the sinks' root (default <work>/out)")
    ap.add_argument("--checkpoint-root", help="the checkpoint locations' root (default <work>/ckpt)")
    ap.add_argument("--quit-file", type=Path, help="stop at once, not waiting for checkpoints")
    ap.add_argument("--until", action="append", default=[], help="QUERY=N: stop QUERY after batch N")
    ap.add_argument("--stop-file", type=Path, help="stop cleanly once this file exists")
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--ssb", action="append", default=[], help="spark.statebackend.KEY=VALUE, no prefix")
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE spark conf")
    ap.add_argument("--commit-wait", type=float, default=180.0, help="seconds, at a clean stop")
    args = ap.parse_args()
    names = tuple(q for q in args.queries.split(",") if q)
    if not names or set(names) - set(QUERIES):
        raise SystemExit(f"--queries: expected some of {QUERIES}, got {args.queries!r}")
    until = {k: int(v) for k, v in _pairs(args.until, "--until").items()}
    if set(until) - set(names):
        raise SystemExit(f"--until: unknown queries {sorted(set(until) - set(names))}")
    if not until and args.stop_file is None:
        raise SystemExit("give --until or --stop-file")
    ssb = _pairs(args.ssb, "--ssb")

    # files_fb's Python workers need this interpreter's pandas and pyarrow (PySpark reads the variable
    # when the SparkContext starts).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_statebackend.demo_app import build

    work: Path = args.work
    out: Path = args.out or work / "out"
    ckpt_root = args.checkpoint_root or str(work / "ckpt")
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
    for name in names:
        if name in FILE_QUERIES:
            writer = build_files(spark, name, args.input or work / "input", out)
        else:
            df, mode = build(spark, name)
            writer = df.writeStream.outputMode(mode).foreachBatch(_sink(out / name))
        queries[name] = (
            writer.option("checkpointLocation", f"{ckpt_root}/{name}")
            .queryName(f"ssb_chaos_{name}")
            .trigger(processingTime=f"{args.trigger_ms} milliseconds")
            .start()
        )
        print(f"QUERY {name} {queries[name].id}", flush=True)
    seen = dict.fromkeys(names, -1)
    running = set(names)
    while running:
        for name in sorted(running):
            q = queries[name]
            _report_batches(name, q, seen)
            if q.exception() is not None:
                print(f"QUERY FAILED {name} {q.exception()}", flush=True)
                return 1
            if name in until and seen[name] >= until[name]:
                q.stop()
                running.discard(name)
        if args.stop_file is not None and args.stop_file.exists():
            break
        if args.quit_file is not None and args.quit_file.exists():
            for q in queries.values():
                q.stop()
            spark.stop()
            print("QUIT", flush=True)
            return 0
        time.sleep(0.2)
    for name, q in queries.items():
        q.stop()
        # A batch can finish between the last poll and the stop: it is Spark's last commit, and the
        # checkpoint the next start must resume after, so it is reported and waited for too.
        _report_batches(name, q, seen)
    code = 0
    if not args.plain:
        for name in names:
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
