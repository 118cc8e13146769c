"""A transformWithState driver, run as its own process by tests/system/test_tws.py (like demo_app for the
other shapes).

    python -m tests.stubs.tws_app --api row|pandas|both --work DIR --until-batch N
        [--plain] [--conf-only] [--stay] [--master M] [--extra KEY=VALUE ...]

Per API (the Row API `groupBy(...).transformWithState`, `transformWithStateInPandas`, or both) it runs
one query, named after the API, over a deterministic input (`rate-micro-batch`: 4 rows per batch,
values 4b..4b+3, event time b+1 seconds), grouped by key `k<value % 5>` (so a key skips batches). The
query is the union of two transformWithState operators (one time mode each):

  operator 0, timeMode ProcessingTime: ValueState, ListState, MapState, a value, a list and a map
              with a TTL of 1 ms and with a TTL of a day, and processing-time timers (one due in the
              next batch, one a day away);
  operator 1, timeMode EventTime (watermark on the event time): event-time timers and ValueStates.

Every output row is (key, kind, detail JSON). `kind` names the state kind it reports on (value, list,
map, ttl, ptimer from operator 0, etimer from operator 1), so a test can say which kind went wrong.
Each batch's rows go to out/<query>/<batch id>.json (overwritten if the batch runs again); the
checkpoint location is ckpt/<query>.

Why the output is a pure function of the batch ids processed, whatever restarts happen:
  - input rows, event times and watermarks come from the batch id (rate-micro-batch offsets);
  - processing time is the batch's timestamp (the trigger's wall clock, stored in offsets/<batch> and
    reused when a batch runs again), so nothing absolute is ever written out, and every processing-time
    duration is either 1 ms ("gone by the next batch": consecutive batches are far more than 1 ms
    apart, a restart included) or a day ("never within a test");
  - noDataMicroBatches is off: with it on, a ProcessingTime transformWithState asks for a batch after
    every batch (Spark 4.3, SPARK-50180), so batch ids would depend on timing;
  - the batch id comes from the task's local property `streaming.sql.batchId`, the same on a re-run.

`--plain` runs on Spark's own RocksDB provider without spark-statebackend (the reference). Otherwise
the backend is enabled with `spark_statebackend.configure()`, or with `--conf-only` by conf keys alone
(spark.jars, spark.plugins, spark.statebackend.*), as spark-submit users do. The process prints
`BATCH <query> <id>` as batches finish (`RESTARTED <query>` when it starts a query again whose
first batch failed because Spark's planning worker missed its fixed 10 s to connect back, as happens
on a busy machine) and exits 0 once every query is past batch N and, with the
backend on, has batch N (or later) checkpointed and cleaned up. With `--stay` it stops each query
after batch N and then waits to be killed: a kill -9 test kills it once the batches it needs are
durable, so no query gets far beyond N (a query that runs ahead is stopped at N).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROWS_PER_BATCH = 4
KEYS = 5
DAY_MS = 86_400_000
OUT_SCHEMA = "key string, kind string, detail string"
APIS = ("row", "pandas")
CONNECT_BACK = "Python worker failed to connect back"


def _batch_id() -> int:
    """The micro-batch this task belongs to (Spark sets it on every task of a streaming batch)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    value = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
    if value is None:
        raise RuntimeError("no streaming.sql.batchId on the task: not a micro-batch task")
    return int(value)


def _dump(doc: object) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class KindsLogic:
    """The ProcessingTime processor's logic, shared by both APIs (they differ only in row types)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.events = handle.getListState("events", "v long")
        self.sums = handle.getMapState("sums", "bucket string", "s long")
        self.ttl_value = {
            "short": handle.getValueState("ttlShortValue", "b long", ttlDurationMs=1),
            "long": handle.getValueState("ttlLongValue", "b long", ttlDurationMs=DAY_MS),
        }
        self.ttl_list = {
            "short": handle.getListState("ttlShortList", "b long", ttlDurationMs=1),
            "long": handle.getListState("ttlLongList", "b long", ttlDurationMs=DAY_MS),
        }
        self.ttl_map = {
            "short": handle.getMapState("ttlShortMap", "b string", "v long", ttlDurationMs=1),
            "long": handle.getMapState("ttlLongMap", "b string", "v long", ttlDurationMs=DAY_MS),
        }
        self.fires = handle.getValueState("timerFires", "n long")

    def on_rows(self, key: str, values: list[int], now_ms: int) -> list[tuple[str, str, str]]:
        batch = _batch_id()
        out: list[tuple[str, str, str]] = []
        count = (self.count.get()[0] if self.count.exists() else 0) + len(values)
        self.count.update((count,))
        out.append((key, "value", _dump({"count": count})))

        for v in values:
            self.events.appendValue((v,))
        out.append((key, "list", _dump({"events": [e[0] for e in self.events.get()]})))

        for v in values:
            bucket = f"b{v % 3}"
            s = self.sums.getValue((bucket,))[0] if self.sums.containsKey((bucket,)) else 0
            self.sums.updateValue((bucket,), (s + v,))
        out.append((key, "map", _dump({"sums": {k[0]: v[0] for k, v in self.sums.iterator()}})))

        # TTL: what survived since this key's previous batch (read before this batch writes).
        seen: dict[str, object] = {}
        for term in ("short", "long"):
            value = self.ttl_value[term]
            seen[f"{term}_value"] = value.get()[0] if value.exists() else None
            seen[f"{term}_list"] = [e[0] for e in self.ttl_list[term].get()]
            seen[f"{term}_map"] = {k[0]: v[0] for k, v in self.ttl_map[term].iterator()}
        out.append((key, "ttl", _dump(seen)))
        for term in ("short", "long"):
            if term == "short" or not self.ttl_value[term].exists():
                self.ttl_value[term].update((batch,))
            self.ttl_list[term].appendValue((batch,))
            self.ttl_map[term].updateValue((f"b{batch}",), (len(values),))

        # Processing-time timers: one fires in the next batch; one a day away never fires here.
        timers = sorted(self.handle.listTimers())
        out.append((key, "ptimer", _dump({"registered": len(timers)})))
        if not timers:
            self.handle.registerTimer(now_ms + DAY_MS)
        self.handle.registerTimer(now_ms + 1)
        return out

    def on_timer(self, key: str) -> list[tuple[str, str, str]]:
        fires = (self.fires.get()[0] if self.fires.exists() else 0) + 1
        self.fires.update((fires,))
        return [(key, "ptimer", _dump({"fired": fires, "left": len(list(self.handle.listTimers()))}))]


class EventLogic:
    """The EventTime processor's logic: a timer 0.5 s of event time after the newest row of a key (it
    fires two batches later: the watermark of batch b is batch b-1's event time)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.max_ms = handle.getValueState("maxEventMs", "t long")
        self.fires = handle.getValueState("fires", "n long")

    def on_rows(self, key: str, event_ms: list[int], watermark_ms: int) -> list[tuple[str, str, str]]:
        newest = max([*event_ms, self.max_ms.get()[0] if self.max_ms.exists() else 0])
        self.max_ms.update((newest,))
        self.handle.registerTimer(newest + 500)
        timers = sorted(self.handle.listTimers())
        return [(key, "etimer", _dump({"max": newest, "watermark": watermark_ms, "timers": timers}))]

    def on_timer(self, key: str, expiry_ms: int, watermark_ms: int) -> list[tuple[str, str, str]]:
        fires = (self.fires.get()[0] if self.fires.exists() else 0) + 1
        self.fires.update((fires,))
        doc = {"expired": expiry_ms, "watermark": watermark_ms, "fired": fires}
        return [(key, "etimer", _dump(doc))]


def processors(api: str) -> tuple[Any, Any]:
    """The (ProcessingTime, EventTime) processors for `api`: thin adapters around the shared logic."""
    from pyspark.sql.streaming import StatefulProcessor

    if api == "row":
        from pyspark.sql import Row

        def rows_of(out: list[tuple[str, str, str]]) -> Iterator[Any]:
            for key, kind, detail in out:
                yield Row(key=key, kind=kind, detail=detail)

        class RowKinds(StatefulProcessor, KindsLogic):  # type: ignore[misc]
            def init(self, handle: Any) -> None:
                KindsLogic.init(self, handle)

            # Spark calls these with keyword arguments: the parameter names are part of the API.
            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
                values = [int(r.value) for r in rows]
                return rows_of(self.on_rows(key[0], values, timerValues.getCurrentProcessingTimeInMs()))

            def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
                return rows_of(self.on_timer(key[0]))

            def close(self) -> None:
                pass

        class RowEvents(StatefulProcessor, EventLogic):  # type: ignore[misc]
            def init(self, handle: Any) -> None:
                EventLogic.init(self, handle)

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
                ms = [int(r.timestamp.timestamp() * 1000) for r in rows]
                return rows_of(self.on_rows(key[0], ms, timerValues.getCurrentWatermarkInMs()))

            def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
                return rows_of(
                    self.on_timer(
                        key[0], expiredTimerInfo.getExpiryTimeInMs(), timerValues.getCurrentWatermarkInMs()
                    )
                )

            def close(self) -> None:
                pass

        return RowKinds(), RowEvents()

    import pandas as pd

    def frames_of(out: list[tuple[str, str, str]]) -> Iterator[Any]:
        if out:
            yield pd.DataFrame(
                {"key": [o[0] for o in out], "kind": [o[1] for o in out], "detail": [o[2] for o in out]}
            )

    class PandasKinds(StatefulProcessor, KindsLogic):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            KindsLogic.init(self, handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            values = [int(v) for pdf in rows for v in pdf["value"]]
            return frames_of(self.on_rows(key[0], values, timerValues.getCurrentProcessingTimeInMs()))

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            return frames_of(self.on_timer(key[0]))

        def close(self) -> None:
            pass

    class PandasEvents(StatefulProcessor, EventLogic):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            EventLogic.init(self, handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            ms = [int(pd.Timestamp(t).value // 1_000_000) for pdf in rows for t in pdf["timestamp"]]
            return frames_of(self.on_rows(key[0], ms, timerValues.getCurrentWatermarkInMs()))

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            return frames_of(
                self.on_timer(
                    key[0], expiredTimerInfo.getExpiryTimeInMs(), timerValues.getCurrentWatermarkInMs()
                )
            )

        def close(self) -> None:
            pass

    return PandasKinds(), PandasEvents()


def build(spark: Any, api: str) -> Any:
    """The streaming DataFrame of `api`'s query: both processors' outputs, unioned (two operators)."""
    from pyspark.sql import functions as F

    def rate() -> Any:
        return (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", ROWS_PER_BATCH)
            .option("numPartitions", 2)
            .option("startTimestamp", 1000)  # batch 0's rows are later than its watermark (0)
            .option("advanceMillisPerBatch", 1000)
            .load()
            .withColumn("key", F.concat(F.lit("k"), (F.col("value") % KEYS).cast("string")))
        )

    proc, event = processors(api)

    def tws(grouped: Any, processor: Any, time_mode: str) -> Any:
        method = grouped.transformWithState if api == "row" else grouped.transformWithStateInPandas
        return method(
            statefulProcessor=processor, outputStructType=OUT_SCHEMA, outputMode="Update", timeMode=time_mode
        )

    by_proc = tws(rate().select("key", "value").groupBy("key"), proc, "ProcessingTime")
    by_event = tws(
        rate().select("key", "timestamp").withWatermark("timestamp", "0 seconds").groupBy("key"),
        event,
        "EventTime",
    )
    return by_proc.unionByName(by_event)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=(*APIS, "both"), required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--until-batch", type=int, required=True)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--plain", action="store_true", help="Spark's own provider, no spark-statebackend")
    ap.add_argument("--conf-only", action="store_true", help="enable the backend by conf keys alone")
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE spark conf")
    ap.add_argument(
        "--stay", action="store_true", help="after batch N, stay until killed (no commit wait, no stop)"
    )
    ap.add_argument("--trigger-ms", type=int, default=200, help="processing-time trigger interval")
    args = ap.parse_args()

    # Spark's Python workers (the processors) run on this interpreter: it has pandas, pyarrow, protobuf.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    work: Path = args.work
    b = (
        SparkSession.builder.master(args.master)
        .appName(f"ssb-test-tws-{args.api}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # transformWithStateInPandas hands timestamps over as naive wall-clock values of this zone.
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executor.memory", "1g")
    )
    for item in args.extra:
        k, _, v = item.partition("=")
        b = b.config(k, v)
    urls = {"blobStore.url": (work / "blobs").as_uri(), "checkpointLog.url": (work / "log").as_uri()}
    if not args.plain:
        import spark_statebackend
        from spark_statebackend.spark import jar_path
        from spark_statebackend.spark.enable import PLUGIN_CLASS

        settings = {**urls, "spoolDir": str(work / "spool")}
        if args.conf_only:
            # What a spark-submit user sets: the jar, the plugin and the keys; the sidecars' Python
            # comes from PYSPARK_PYTHON (set above).
            b = b.config("spark.jars", str(jar_path())).config("spark.plugins", PLUGIN_CLASS)
            for k, v in settings.items():
                b = b.config(f"spark.statebackend.{k}", v)
        else:
            spark_statebackend.configure(b, check=True, **settings)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def sink_for(query: str) -> Any:
        out = work / "out" / query
        out.mkdir(parents=True, exist_ok=True)

        def sink(batch_df: Any, batch_id: int) -> None:
            rows = sorted(tuple(r) for r in batch_df.collect())
            tmp = out / f".{batch_id}.tmp"
            tmp.write_text(json.dumps(rows))
            tmp.replace(out / f"{batch_id}.json")

        return sink

    def start(query: str) -> Any:
        return (
            build(spark, query)
            .writeStream.outputMode("update")
            .foreachBatch(sink_for(query))
            .option("checkpointLocation", str(work / "ckpt" / query))
            .queryName(f"tws_{query}")
            .trigger(processingTime=f"{args.trigger_ms} milliseconds")
            .start()
        )

    running: dict[str, Any] = {}
    restarts: dict[str, int] = {}

    def failed(query: str) -> bool:
        """True if `query` failed for good; a query whose planning worker missed Spark's fixed 10 s to
        connect back (a busy machine) is started again, at most 3 times: Spark's own restart."""
        error = running[query].exception()
        if error is None:
            return False
        if CONNECT_BACK in str(error) and restarts.get(query, 0) < 3:
            restarts[query] = restarts.get(query, 0) + 1
            print(f"RESTARTED {query}: {CONNECT_BACK}", flush=True)
            running[query] = start(query)
            return False
        print(f"QUERY FAILED {query}: {error}", flush=True)
        return True

    seen: dict[str, int] = {}

    def check() -> bool:
        """Note finished batches and stop every query past batch N; False if a query failed."""
        for query, q in list(running.items()):
            p = q.lastProgress
            if p is not None and p["batchId"] > seen[query]:
                seen[query] = p["batchId"]
                print(f"BATCH {query} {seen[query]}", flush=True)
            if seen[query] >= args.until_batch:
                if q.isActive:
                    q.stop()  # this one is done; the others may still be behind
            elif failed(query):
                return False
        return True

    deadline = time.monotonic() + 600
    for query in APIS if args.api == "both" else (args.api,):
        running[query], seen[query] = start(query), -1
        # One query start at a time: the first batch of a transformWithState query runs a Python
        # worker on the driver to plan its state schema, and Spark gives that worker a fixed 10 s
        # to connect back; several starting together on a busy machine miss it.
        while seen[query] < 0 and time.monotonic() < deadline:
            if not check():
                return 1
            time.sleep(0.05)
    while min(seen.values()) < args.until_batch:
        if not check():
            return 1
        if time.monotonic() > deadline:
            print(f"TIMEOUT {seen}", flush=True)
            return 2
        time.sleep(0.05)
    for q in running.values():
        q.stop()
    if args.stay:
        # Wait to be killed (kill -9 tests): nothing is flushed or stopped in order.
        print("STAYING", flush=True)
        time.sleep(600)
        return 4
    if not args.plain:
        for query, q in running.items():
            if not _wait_committed(urls, q.id, seen[query]):
                return 3
    spark.stop()
    return 0


def _wait_committed(urls: dict[str, str], query_id: str, batch: int) -> bool:
    """Wait (at most 120 s) until `batch` or later of `query_id` is checkpointed and its reports are
    cleaned up; as demo_app's wait (a stop may leave reports of an interrupted later batch)."""
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.lifecycle.reports import reports_prefix
    from spark_statebackend.stores import open_blob_store

    store = open_blob_store(urls["blobStore.url"])
    log = open_checkpoint_log(urls["checkpointLog.url"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        latest = log.read_latest(query_id)
        if latest is None or latest.batch_id < batch:
            time.sleep(0.1)
            continue
        if not list(store.list(reports_prefix(query_id, latest.batch_id + 1))):
            print(f"CHECKPOINTED {query_id} {latest.batch_id}", flush=True)
            return True
        time.sleep(0.1)
    print(f"COMMIT TIMEOUT {query_id}", flush=True)
    return False


if __name__ == "__main__":
    sys.exit(main())
