"""A stateful job whose planning depends on time, with a sink idempotent by batch id (issue 21's faults).

    python tests/apps/files_job.py --work DIR [--available-now] [--slow-listener SECONDS] [--plain]
        [--setting KEY=VALUE ...]   # spark_statebackend.configure() settings, e.g. maxCommitDelay=2s
        [--checkpoint-location LOC] [--conf KEY=VALUE ...]   # LOC (default DIR/ckpt), Spark confs
        [--sink-pause SECONDS]

Input: JSON files `{"id": n}` that the test drops into `<work>/in` while the job runs, one file per
micro-batch (maxFilesPerTrigger=1): which files a batch reads depends on when Spark planned it, so a
batch planned again after a restart reads other files than the first time. Query: dropDuplicates on
`id` (state: every id seen). Sink: foreachBatch writing `<work>/out/<batch id>.json` only if that batch
has no file yet, the way Spark's file sink and Delta skip a batch id they committed. So a batch Spark
re-plans after its output was written loses the records only the new plan read, and a record whose
state was lost comes out twice: `<work>/out` holds every input id exactly once only if recovery re-ran
each planned batch with the offsets Spark first gave it. A batch that runs again still reads its whole
output (Spark 4 fails a batch whose foreachBatch leaves stateful partitions unread), and keeps it in
`<work>/reruns/<batch id>.<n>.json`: a re-run on the state and offsets of the first run has the same ids.

`--available-now` processes what is there and stops; otherwise it runs until killed (the test kills
it). `--slow-listener` adds a query listener that takes that long per progress event, as a user's
listener may. `--sink-pause` makes the sink wait that long after it wrote a batch's output, before
Spark commits the batch (a sink that ends slowly): a kill then leaves a batch to run again. At the end
the job stops the query and the session (a clean stop) and prints `DONE`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--available-now", action="store_true")
    ap.add_argument("--slow-listener", type=float, default=0.0)
    ap.add_argument("--plain", action="store_true", help="Spark's own provider, no backend")
    ap.add_argument("--setting", action="append", default=[], help="KEY=VALUE for configure()")
    ap.add_argument("--checkpoint-location", help="any Hadoop path; default <work>/ckpt")
    ap.add_argument("--conf", action="append", default=[], help="KEY=VALUE, a Spark conf entry")
    ap.add_argument("--sink-pause", type=float, default=0.0)
    args = ap.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    work: Path = args.work
    b = (
        SparkSession.builder.master("local[2]")
        .appName("ssb-files-job")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    )
    for item in args.conf:
        b = b.config(*item.split("=", 1))
    if not args.plain:
        import spark_statebackend

        spark_statebackend.configure(
            b,
            **{
                "blobStore.url": (work / "blobs").as_uri(),
                "checkpointLog.url": (work / "log").as_uri(),
                "spoolDir": str(work / "spool"),
                **dict(item.split("=", 1) for item in args.setting),
            },
        )
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    if args.slow_listener > 0:

        class Slow(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
                pass

            def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
                time.sleep(args.slow_listener)  # the fault: a listener that takes its time

            def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
                pass

            def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
                pass

        spark.streams.addListener(Slow())

    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    reruns = work / "reruns"

    def write(target: Path, ids: list[int]) -> None:
        """Whole or not at all: the job may be killed at any moment."""
        tmp = target.parent / f".{target.name}.tmp"
        tmp.write_text(json.dumps(ids))
        tmp.replace(target)

    def sink(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        target = out / f"{batch_id}.json"
        ids = sorted(r["id"] for r in batch_df.collect())
        if target.exists():  # idempotent by batch id: a batch already written is skipped
            reruns.mkdir(exist_ok=True)
            write(reruns / f"{batch_id}.{len(list(reruns.glob(f'{batch_id}.*.json')))}.json", ids)
            return
        write(target, ids)
        print(f"BATCH {batch_id}", flush=True)
        time.sleep(args.sink_pause)  # the fault: a sink that ends slowly, its output already written

    df = (
        spark.readStream.schema("id LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(work / "in"))
        .dropDuplicates(["id"])
    )
    location = args.checkpoint_location or str(work / "ckpt")
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", location)
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="200 milliseconds")
    q = writer.start()
    q.awaitTermination()
    q.stop()
    spark.stop()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
