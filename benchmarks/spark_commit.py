"""Spark side by side, on the workload of research/baseline.md: local[2], 8 shuffle partitions,
dropDuplicates over 10 batches of ROWS rows x 1 KB (about 1 GiB of live RocksDB state at the default
100k rows per batch), a `processingTime` trigger of 15 s, noop sink.

Four configurations in one run, each pair measured back to back so their ratios share the machine's
load: Spark's own RocksDB provider and ours (Spark's provider plus this backend), each in default mode
and in changelog mode (`spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled`).
For each, from Spark's own progress (steady batches 1..9; batch 0 is the cold start):
- commitTimeMs p50/p99, summed over the 8 partition tasks as Spark reports it (two run at a time, so
  the wall time on the task threads is about half), and its parts from the state operator's custom
  metrics (flush, checkpoint, file sync, changelog writer commit, ...): what is left on the task thread;
- batch duration p50/p99;
- ours only: checkpoint lag p50/p99 (end of a batch to its CheckpointV2 being durable, from the
  committer's log) and where it goes (`*_lag_<step>_s_p50/p99`: when each step of the checkpoint
  ended, from the batch's end, as the committer's log line states them), the time our hook spends
  staging each commit (from the shim's log), and per steady batch the blob-store requests by kind
  (`*_blob_<op>_per_batch`, the sidecars' `ssb_blob_requests`), the sidecars' CPU seconds
  (`*_sidecar_cpu_s_per_batch`, /proc/<pid>/stat, with the builds it ran in child processes) and the
  committer thread's (`*_commit_thread_cpu_s_per_batch`), each sampled as the batch's progress arrived
  (usage_run.jsonl);
- restart to the first completed batch (in changelog mode once Spark has published the snapshot it
  made at the last batch and, for ours, its upload is checkpointed: `_settle_snapshots`, whose wait
  is reported as *_settle_s): a new driver process on a wiped host (for Spark: empty
  spark.local.dir, same checkpoint location; for ours: checkpoint location, spark.local.dir and spool
  all gone, so the driver's files and the state come from the blob store; and ours also as Spark's,
  "samehost": checkpoint location kept, local dirs and spool empty), timed from the process
  launch to the end of its first batch (Spark's progress timestamp + batchDuration), and from the
  query's start() call; and the same restart without state (a fresh checkpoint location, same query and
  source), so that state's share = with state - without. Each is run SSB_BENCH_RESTARTS times from
  the same saved state, interleaved with the other side's of the same mode (Spark with state, without,
  ours with, without, ...); the median run is reported, with the spread.

Environment (figures are printed, never asserted):
  SSB_BENCH_ROWS       rows per batch (default 100000; e.g. 2000 for a quick smoke run)
  SSB_BENCH_TRIGGER_S  trigger interval in seconds (default 15, as the baseline)
  SSB_BENCH_RESTARTS   restarts with and without state per configuration (default 3; 0: none)
  SSB_BENCH_CONFIGS    comma-separated subset of spark_default,ours_default,spark_changelog,ours_changelog
  SSB_BENCH_RESULTS    where each configuration's progress and logs are kept (default bench-results)
  SSB_BENCH_EXTRA_CONF `key=value,key=value` Spark confs added to every run, for experiments
  SSB_BENCH_PARTITIONS shuffle partitions, so state stores per operator (default 8; Spark's own
                       default is 200)
  SSB_BENCH_OPERATORS  stateful operators in the query (default 1; 2 adds a second dropDuplicates on
                       `value` behind its own shuffle, so a store per partition per operator: 400 stores
                       at Spark's default 200 shuffle partitions)
  SSB_BENCH_BLOB_URL   our blob store instead of a directory under the work dir
  SSB_BENCH_DIR        where the (large) work directories go (default: the system temp dir)
  SSB_BENCH_PRIVILEGED 1: run the drivers with root's full capabilities when the bench runs as root

Identity. Run as root, every driver (its JVM, its sidecars; Spark's side alike) runs without the
capabilities that let root ignore file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER,
dropped with util-linux's setpriv), as a non-root Spark user runs: our restore from a local blob store
then hard-links SSTs, as it does for every user that cannot write through a read-only blob. A process
with CAP_DAC_OVERRIDE could write into a blob through a linked name, so there every SST is copied
(engine/placing.py); ours' wiped-host restart is therefore also run with root's capabilities
("restart_root"), so both figures come from the same run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

BATCHES = 10
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: (name, ours, changelog), in the order they run: each of ours right after Spark's in the same mode.
CONFIGS: tuple[tuple[str, bool, bool], ...] = (
    ("spark_default", False, False),
    ("ours_default", True, False),
    ("spark_changelog", False, True),
    ("ours_changelog", True, True),
)
#: Spark 4.3's per-commit timings in the state operator's customMetrics (summed over the tasks). From
#: RocksDB.commit's bytecode: commitTimeMs = flush + compact + checkpoint (the three only when the commit
#: makes a snapshot) + fileSync + what no timer covers (the store's metrics, logging). fileSync contains
#: saveZipFiles (default mode: the snapshot's SSTs and zip written to the checkpoint location) or the
#: changelog writer's commit (changelog mode: closing `<v>.changelog`, and with ours the hook's staging).
COMMIT_PARTS = (
    "rocksdbCommitFlushLatency",
    "rocksdbCommitCompactLatency",
    "rocksdbCommitCheckpointLatency",
    "rocksdbCommitFileSyncLatencyMs",
)
FILE_SYNC_PARTS = ("rocksdbSaveZipFilesLatencyMs", "rocksdbChangeLogWriterCommitLatencyMs")
#: The shim's and Spark's state store loggers at INFO into a file (per-commit staging times, restore
#: waits, Spark's per-store load and commit lines); everything else at WARN on the console.
LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss.SSS} [%t] %p %c{1}: %m%n
logger.ssb.name = dev.statebackend.spark
logger.ssb.level = info
logger.ssb.additivity = false
logger.ssb.appenderRef.file.ref = file
logger.state.name = org.apache.spark.sql.execution.streaming.state
logger.state.level = info
logger.state.additivity = false
logger.state.appenderRef.file.ref = file
"""


def _pct(values: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default); nan for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _trigger_s() -> float:
    return float(os.environ.get("SSB_BENCH_TRIGGER_S", "15"))


def _partitions() -> int:
    n = int(os.environ.get("SSB_BENCH_PARTITIONS", "8"))
    if n < 1:
        raise SystemExit(f"SSB_BENCH_PARTITIONS must be positive, not {n}")
    return n


def _operators() -> int:
    n = int(os.environ.get("SSB_BENCH_OPERATORS", "1"))
    if n not in (1, 2):
        raise SystemExit(f"SSB_BENCH_OPERATORS must be 1 or 2, not {n}")
    return n


# ------------------------------------------------------------------------------------------------ driver


def driver(spec: dict[str, Any]) -> None:
    """One driver process: run the dedup query on checkpoint `spec["ckpt"]` until batch `spec["until"]`,
    append every progress to `progress_<phase>.jsonl` and the time start() was called to
    `times_<phase>.json`. With the backend, it stops only once that batch is checkpointed, so the next
    phase can restore it."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    work, phase = Path(spec["work"]), str(spec["phase"])
    log4j = work / f"log4j2-{phase}.properties"
    log4j.write_text(LOG4J.replace("{log}", str(work / f"jvm-{phase}.log")))
    b = (
        SparkSession.builder.master("local[2]")
        .appName(f"ssb-bench-{phase}")
        .config("spark.driver.memory", "8g")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.as_uri()}")
        .config("spark.sql.shuffle.partitions", str(spec.get("partitions", 8)))
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(work / "local"))
        # Spark's default provider is the HDFS-backed one; the baseline (and every user of RocksDB state)
        # sets this, for both sides alike. The backend itself needs no provider setting.
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config(CHANGELOG_KEY, "true" if spec["changelog"] else "false")
    )
    for item in filter(None, os.environ.get("SSB_BENCH_EXTRA_CONF", "").split(",")):
        key, _, value = item.partition("=")
        b = b.config(key.strip(), value.strip())
    if spec["ours"]:
        import spark_statebackend

        settings: dict[str, str] = {
            "blobStore.url": _blob_url(work, spec),
            "checkpointLog.url": (work / "log").as_uri(),
            "spoolDir": str(work / "spool"),
        }
        spark_statebackend.configure(b, check=True, **settings)
    spark = b.getOrCreate()
    payload = F.concat(
        *[F.sha2(F.concat(F.col("value").cast("string"), F.lit(f"#{i}")), 256) for i in range(16)]
    )
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", int(spec["rows"]))
        .option("numPartitions", 2)
        .option("startTimestamp", 0)
        .option("advanceMillisPerBatch", 1000)
        .load()
        .withColumn("payload", payload)
        .dropDuplicates(["value", "payload"])
    )
    if _operators() == 2:
        # Another key, so another shuffle and a second set of stores; its state is one row per value.
        df = df.dropDuplicates(["value"])
    start_call = time.time()
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(work / spec["ckpt"]))
        .trigger(processingTime=f"{_trigger_s()} seconds")
        .start()
    )
    (work / f"times_{phase}.json").write_text(json.dumps({"start_call": start_call, "started": time.time()}))
    seen: dict[int, Any] = {}
    until = int(spec["until"])
    with (
        open(work / f"progress_{phase}.jsonl", "a") as out,
        open(work / f"usage_{phase}.jsonl", "a") as usage,
    ):
        while not seen or max(seen) < until:
            for p in q.recentProgress:
                if p["batchId"] not in seen:
                    seen[p["batchId"]] = p
                    out.write(json.dumps(p, default=str) + "\n")
                    out.flush()
                    if spec["ours"]:
                        usage.write(json.dumps({"batchId": p["batchId"], **_sidecar_usage(work)}) + "\n")
                        usage.flush()
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            time.sleep(0.2)
    q.stop()
    if spec["ours"]:
        from spark_statebackend.checkpoints.logs import open_checkpoint_log

        cplog = open_checkpoint_log((work / "log").as_uri())
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            latest = cplog.read_latest(str(q.id))
            if latest is not None and latest.batch_id >= until:
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"batch {until} was not checkpointed within 300 s")
    # Only what reads the saved state later needs the snapshots settled (`settle`, bench_mode); without
    # it, waiting for a snapshot Spark never makes (minDeltasForSnapshot beyond the run) cost 300 s.
    if spec["changelog"] and phase == "run" and spec.get("settle", True):
        settled = _settle_snapshots(work, spec, str(q.id), until + 1)
        times = json.loads((work / f"times_{phase}.json").read_text())
        (work / f"times_{phase}.json").write_text(json.dumps({**times, **settled}))
    spark.stop()


def _sidecar_usage(work: Path) -> dict[str, float]:
    """What the sidecars serving `work`'s spool have used so far: CPU seconds (user + system, from
    /proc/<pid>/stat) and blob-store requests by kind (their `ssb_blob_requests` metric, from the
    `metrics.json` each publishes every second into its spool dir, so up to a second old)."""
    spool = str(work / "spool")
    cpu = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"spark_statebackend.runtime.sidecar" not in cmdline or not any(
                a.decode(errors="replace").startswith(spool) for a in cmdline
            ):
                continue
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        # utime, stime, and cutime, cstime: the child processes it waited for (changelogSnapshotEvery's
        # builds run in one each).
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        cpu += ticks / os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {"sidecar_cpu_s": cpu}
    # os.walk skips a dir removed while it walks (the sidecars' staging dirs come and go); rglob raises.
    for root, _dirs, files in os.walk(work / "spool"):
        if "metrics.json" not in files:
            continue
        try:
            samples = json.loads((Path(root) / "metrics.json").read_text())["samples"]
        except (OSError, ValueError, KeyError):
            continue  # being replaced: the next batch's sample has it
        for sample in samples:
            if sample.get("name") == "ssb_blob_requests_total":
                key = f"blob_{sample['labels']['op']}"
                out[key] = out.get(key, 0.0) + float(sample["value"])
    return out


def _blob_url(work: Path, spec: dict[str, Any]) -> str:
    """Our blob store: the run's own (benchmarks.scale_curve), else SSB_BENCH_BLOB_URL, else a directory
    in the work dir."""
    return str(spec.get("blob_url") or os.environ.get("SSB_BENCH_BLOB_URL") or (work / "blobs").as_uri())


def _settle_snapshots(work: Path, spec: dict[str, Any], query_id: str, version: int) -> dict[str, float]:
    """Changelog mode, before the saved state is taken: let Spark publish the snapshot it made at
    `version` (its maintenance thread uploads it once the stopped query's stores are closed; a process
    that exits first leaves only changelogs) and, for ours, let that snapshot's upload be checkpointed
    (an upgrade of the same batch). Without this the two sides' restarts replay a different number of
    changelogs depending only on how soon each driver exited. Returns the seconds each wait took
    (-1: it timed out and the restart replays changelogs)."""
    out: dict[str, float] = {}
    t0 = time.monotonic()
    state = work / spec["ckpt"] / "state" / "0"
    stores = sorted(p for p in state.iterdir() if p.is_dir() and p.name.isdigit())

    def published() -> bool:
        return all(any(d.glob(f"{version}.zip")) or any(d.glob(f"{version}_*.zip")) for d in stores)

    while not published() and time.monotonic() - t0 < 300:
        time.sleep(0.2)
    out["spark_snapshot_settle_s"] = time.monotonic() - t0 if published() else -1.0
    if spec["ours"] and published():
        from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
        from spark_statebackend.checkpoints.logs import open_checkpoint_log
        from spark_statebackend.engine.blobs import load_snapshot_index
        from spark_statebackend.stores import open_blob_store

        store = open_blob_store(_blob_url(work, spec))
        cplog = open_checkpoint_log((work / "log").as_uri())
        t1 = time.monotonic()
        snapshot_of: dict[str, int | None] = {}  # index blob -> its snapshot version (indexes are immutable)

        def upgraded() -> bool:
            latest = cplog.read_latest(query_id)
            if latest is None:
                return False
            markers = [m for k, m in latest.markers(BLOBSTORE_BACKEND).items() if not k.startswith("_")]
            for m in markers:
                if m not in snapshot_of:
                    snapshot_of[m] = load_snapshot_index(store, m).metadata.snapshot_version
            return len(markers) == len(stores) and all(snapshot_of[m] == version for m in markers)

        while not upgraded() and time.monotonic() - t1 < 300:
            time.sleep(0.2)
        out["ours_upgrade_settle_s"] = time.monotonic() - t1 if upgraded() else -1.0
    return out


#: What root may do that a Spark user may not: write through a read-only file (dac_override), read
#: anything (dac_read_search), chmod or touch another's file (fowner). setpriv's bounding-set syntax.
_ROOT_FILE_CAPS = "-dac_override,-dac_read_search,-fowner"


def _identity(privileged: bool) -> list[str]:
    """The command prefix a driver runs under (module doc, Identity): nothing unless this process is root
    and the driver is to run as a non-root Spark user would."""
    if privileged or os.geteuid() != 0 or os.environ.get("SSB_BENCH_PRIVILEGED") == "1":
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SystemExit("running as root: setpriv (util-linux) is needed, or set SSB_BENCH_PRIVILEGED=1")
    return [setpriv, "--bounding-set", _ROOT_FILE_CAPS, "--"]


def _run(
    work: Path, phase: str, *, ours: bool, changelog: bool, until: int, rows: int, ckpt: str,
    privileged: bool = False, partitions: int = 8, blob_url: str | None = None, settle: bool = True,
) -> float:  # fmt: skip
    """Runs one driver process to batch `until` (with root's file capabilities only if `privileged`) with
    `partitions` shuffle partitions (state stores) and, for ours, `blob_url` as its blob store (None:
    _blob_url's default); returns its launch time (epoch seconds). `settle`: a changelog-mode run waits
    for its last snapshot to settle (_settle_snapshots), for what reads the saved state later."""
    spec = {
        "work": str(work), "phase": phase, "ours": ours, "changelog": changelog,
        "until": until, "rows": rows, "ckpt": ckpt, "partitions": partitions, "blob_url": blob_url,
        "settle": settle,
    }  # fmt: skip
    launched = time.time()
    with open(work / f"driver-{phase}.out", "w") as out:
        # Its own session, so a driver that hangs in exit (baseline.md saw one) is killed with its JVM.
        proc = subprocess.Popen(
            [*_identity(privileged), sys.executable, "-m", "benchmarks.spark_commit", json.dumps(spec)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=3600)
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:  # interrupted (Ctrl-C, or SIGTERM through main's handler): no leftovers
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            _reap_group(proc)
    if rc != 0:
        tail = (work / f"driver-{phase}.out").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{phase} driver failed ({rc}):\n{tail}")
    return launched


def _reap_group(proc: subprocess.Popen[bytes]) -> None:
    """Waits until every process of the driver's session is gone: its JVM (which may still be deleting
    its local dirs after Python exited) and the sidecars it started, so the next phase starts on a quiet
    machine with nothing writing to the dirs it wipes. Kills what is left after 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline + 30:  # a group of unreaped zombies never answers "gone"
        proc.poll()  # reaps the driver itself (the group's leader) once it has exited
        late = time.monotonic() > deadline
        try:
            os.killpg(proc.pid, signal.SIGKILL if late else 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        print(f"warning: processes of session {proc.pid} still listed after SIGKILL", file=sys.stderr)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------------ figures


def _progress(work: Path, phase: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (work / f"progress_{phase}.jsonl").read_text().splitlines()]


def _custom(p: dict[str, Any], metric: str) -> float:
    return float(sum(float(op.get("customMetrics", {}).get(metric, 0)) for op in p.get("stateOperators", [])))


def _commit_ms(p: dict[str, Any]) -> float:
    return float(sum(op.get("commitTimeMs", 0) for op in p.get("stateOperators", [])))


def _batch_end(p: dict[str, Any]) -> float:
    """Epoch seconds at which the batch completed: its trigger's start plus its duration."""
    started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + float(p["batchDuration"]) / 1000


def _dir_bytes(d: Path) -> float:
    return float(sum(f.stat().st_size for f in d.rglob("*") if f.is_file())) if d.exists() else 0.0


def _logs(work: Path, pattern: str) -> str:
    """The files `pattern` names directly in `work` (the saved logs), concatenated."""
    return "".join(p.read_text(errors="replace") for p in sorted(work.glob(pattern)))


def _steady_figures(name: str, progress: list[dict[str, Any]], out: dict[str, float]) -> None:
    steady = [p for p in progress if p["batchId"] > 0]
    commit = [_commit_ms(p) for p in steady]
    out[f"{name}_batches"] = float(len(steady))
    out[f"{name}_commit_ms_p50"] = _pct(commit, 0.5)
    out[f"{name}_commit_ms_p99"] = _pct(commit, 0.99)
    for metric in (*COMMIT_PARTS, *FILE_SYNC_PARTS):
        values = [_custom(p, metric) for p in steady]
        if any(values):
            out[f"{name}_{metric}_p50"] = _pct(values, 0.5)
            out[f"{name}_{metric}_p99"] = _pct(values, 0.99)
    # What RocksDB.commit's timers do not cover, per batch (its median: a snapshot batch's large timed
    # parts must not hide it).
    rest = [_commit_ms(p) - sum(_custom(p, m) for m in COMMIT_PARTS) for p in steady]
    out[f"{name}_commit_untimed_ms_p50"] = _pct(rest, 0.5)
    # Commits without a snapshot (changelog mode: all but every minDeltasForSnapshot-th): what the task
    # thread does when Spark does no data work in its commit.
    light = [_commit_ms(p) for p in steady if _custom(p, "rocksdbCommitFlushLatency") == 0]
    out[f"{name}_commits_without_flush"] = float(len(light))
    if light:
        out[f"{name}_commit_ms_without_flush_p50"] = _pct(light, 0.5)
        out[f"{name}_commit_ms_without_flush_max"] = max(light)
    out[f"{name}_batch_ms_p50"] = _pct([float(p["batchDuration"]) for p in steady], 0.5)
    out[f"{name}_batch_ms_p99"] = _pct([float(p["batchDuration"]) for p in steady], 0.99)
    # The batch whose commit took longest, and what it did (in changelog mode: the snapshot commit).
    worst = max(steady, key=_commit_ms, default=None)
    if worst is not None:
        out[f"{name}_commit_ms_max_batch"] = float(worst["batchId"])
        out[f"{name}_commit_ms_max_flush_ms"] = _custom(worst, "rocksdbCommitFlushLatency")
    for metric in ("rocksdbFilesCopied", "rocksdbBytesCopied"):
        out[f"{name}_{metric}_sum"] = sum(_custom(p, metric) for p in steady)


def _ours_commit_figures(name: str, work: Path, out: dict[str, float]) -> None:
    """Our committer's lag per batch, and the shim's staging time per commit, from the logs of the run."""
    sidecar = _logs(work, "sidecar-run-*.log")
    lags = {
        int(b): float(s)
        for b, s in re.findall(
            r"batch (\d+): checkpoint \S+ written with \d+ state marker\(s\); lag ([0-9.]+)s", sidecar
        )
    }
    steady = [lag for b, lag in lags.items() if b > 0]
    out[f"{name}_checkpoints_written"] = float(len(lags))
    out[f"{name}_checkpoint_lag_s_p50"] = _pct(steady, 0.5)
    out[f"{name}_checkpoint_lag_s_p99"] = _pct(steady, 0.99)
    out[f"{name}_checkpoint_lag_s_max_all"] = max(lags.values(), default=float("nan"))
    _lag_stage_figures(name, sidecar, out)
    _usage_figures(name, work, sidecar, out)
    jvm = _logs(work, "jvm-run.log")
    per_version: dict[int, float] = defaultdict(float)
    for version, micros in re.findall(r"staged query=\S+ store=\S+ version=(\d+) .*? in (\d+) us", jvm):
        per_version[int(version)] += int(micros) / 1000
    staged = [ms for v, ms in per_version.items() if v > 1]  # batch N commits version N+1
    out[f"{name}_stage_ms_sum_p50"] = _pct(staged, 0.5)
    out[f"{name}_stage_ms_sum_p99"] = _pct(staged, 0.99)
    out[f"{name}_commit_gate_blocks"] = float(jvm.count("blocking this commit"))


def _lag_stage_figures(name: str, sidecar: str, out: dict[str, float]) -> None:
    """Where each steady batch's checkpoint lag went (the committer's log line: each step's end, from
    the batch's end): p50 and p99 of each step's end."""
    ends: dict[str, list[float]] = defaultdict(list)
    for batch, stages in re.findall(
        r"batch (\d+): checkpoint \S+ written .*?; lag [0-9.]+s \((.*?);", sidecar
    ):
        if int(batch) > 0:
            for step, at in re.findall(r"([a-z_ ]+) \+(-?[0-9.]+)s", stages):
                ends[step.strip().replace(" ", "_")].append(float(at))
    for step, values in ends.items():
        out[f"{name}_lag_{step}_s_p50"] = _pct(values, 0.5)
        out[f"{name}_lag_{step}_s_p99"] = _pct(values, 0.99)


def _usage_figures(name: str, work: Path, sidecar: str, out: dict[str, float]) -> None:
    """Per steady batch: the sidecars' CPU and blob-store requests (usage_run.jsonl, sampled as each
    batch's progress arrived) and the commit thread's CPU (the committer's log line), each the change
    from batch 1 to the last batch over the batches between."""
    usage = {int(u["batchId"]): u for u in _jsonl(work / "usage_run.jsonl")}
    if len(usage) >= 2 and 1 in usage:
        last = max(usage)
        first, end = usage[1], usage[last]
        for key in sorted(set(first) | set(end)):
            if key != "batchId":
                out[f"{name}_{key}_per_batch"] = (end.get(key, 0.0) - first.get(key, 0.0)) / (last - 1)
    cpu = {
        int(b): float(s)
        for b, s in re.findall(
            r"batch (\d+): checkpoint \S+ written .*?commit thread cpu ([0-9.]+)s", sidecar
        )
    }
    if len(cpu) >= 2 and 1 in cpu:
        last = max(cpu)
        out[f"{name}_commit_thread_cpu_s_per_batch"] = (cpu[last] - cpu[1]) / (last - 1)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _restart_figures(work: Path, phase: str, launched: float, *, ours: bool) -> dict[str, float]:
    """One restart's figures: when its first batch completed, and what loading the state took."""
    first = _progress(work, phase)[0]
    times = json.loads((work / f"times_{phase}.json").read_text())
    fig = {
        "first_batch_id": float(first["batchId"]),
        "to_first_batch_s": _batch_end(first) - launched,
        "start_to_first_batch_s": _batch_end(first) - times["start_call"],
        "start_call_s": times["started"] - times["start_call"],  # ours: the driver-side restore
        "first_batch_ms": float(first["batchDuration"]),
        "load_ms_sum": _custom(first, "rocksdbLoadLatencyMs"),
        "replayed_changelogs": _custom(first, "rocksdbNumReplayChangelogFiles"),
    }
    if ours:
        sidecar = _logs(work, f"sidecar-{phase}-*.log")
        restored = r"restore indexes/\S+ \(store \d+/\d+/\S+\) into .*\((\d+) hard-linked from the store\)"
        found = re.findall(restored + r", .* in ([0-9.]+)s", sidecar)
        restores = [float(s) for _, s in found]
        waits = _restore_waits_ms(_logs(work, f"jvm-{phase}.log"))
        fig.update(
            store_restores=float(len(restores)),
            restore_files_linked=float(sum(int(n) for n, _ in found)),
            restore_ms_sum=1000 * sum(restores),
            restore_ms_max=1000 * max(restores, default=0.0),
            task_restore_wait_ms_sum=sum(waits),
            task_restore_wait_ms_max=max(waits, default=0.0),
        )
    return fig


def _restore_waits_ms(jvm_log: str) -> list[float]:
    """How long each store's task waited for its restore: the shim's "requesting a restore" line to its
    "restored" line, by the log's timestamps (HH:mm:ss.SSS, one run never crosses midnight here)."""

    def ms(stamp: str) -> float:
        h, m, rest = stamp.split(":")
        return (int(h) * 60 + int(m)) * 60_000 + float(rest) * 1000

    asked: dict[str, float] = {}
    waits = []
    for line in jvm_log.splitlines():
        found = re.match(r"(\d\d:\d\d:\d\d\.\d+) .*? store=(\S+) version=(\d+)(.*)", line)
        if found is None:
            continue
        stamp, store, _, tail = found.groups()
        if tail.endswith("requesting a restore"):
            asked[store] = ms(stamp)
        elif tail.startswith(" restored (") and store in asked:
            waits.append(ms(stamp) - asked.pop(store))
    return waits


class _Config:
    """One configuration's work dir and what its restarts start from."""

    def __init__(
        self, root: Path, name: str, ours: bool, changelog: bool, *,
        partitions: int = 8, blob_url: str | None = None,
    ) -> None:  # fmt: skip
        self.name, self.ours, self.changelog = name, ours, changelog
        self.partitions = partitions
        self.blob_url = blob_url or os.environ.get("SSB_BENCH_BLOB_URL")
        self.work = root / name
        self.work.mkdir()
        # What every restart starts from, saved by hard links after the run (nothing here writes a file
        # in place): Spark keeps its checkpoint location (its only copy of the state); ours loses it
        # too, with the spool, and gets everything back from the blob store and the checkpoint log. A
        # remote store (SSB_BENCH_BLOB_URL) is not ours to reset: one restart only.
        self.remote = ours and bool(self.blob_url)
        self.kept: tuple[str, ...] = ("blobs", "log", "ckpt") if ours else ("ckpt",)
        if self.remote:
            self.kept = ()
        self.restarts: dict[str, list[dict[str, float]]] = {"restart": [], "fresh": []}
        if ours and not self.remote:
            self.restarts["samehost"] = []  # Spark's own kind of restart, with the backend on
            if _identity(False):  # the drivers run unprivileged: the wiped host also as root (module doc)
                self.restarts["restart_root"] = []


def _first_run(c: _Config, rows: int, out: dict[str, float], *, settle: bool) -> None:
    """Batches 0..9 on an empty checkpoint: the steady-state figures, then the state is saved (`settle`:
    for restarts or measurements that follow, see _run)."""
    t0 = time.monotonic()
    _run(
        c.work, "run", ours=c.ours, changelog=c.changelog, until=BATCHES - 1, rows=rows, ckpt="ckpt",
        partitions=c.partitions, blob_url=c.blob_url, settle=settle,
    )  # fmt: skip
    out[f"{c.name}_run_wall_s"] = time.monotonic() - t0
    out[f"{c.name}_run_load1_after"] = _load()
    times = json.loads((c.work / "times_run.json").read_text())
    for key in ("spark_snapshot_settle_s", "ours_upgrade_settle_s"):
        if key in times:
            out[f"{c.name}_{key}"] = float(times[key])
    _save_sidecar_logs(c.work, "run")
    _steady_figures(c.name, _progress(c.work, "run"), out)
    out[f"{c.name}_state_dir_bytes"] = _dir_bytes(c.work / "ckpt" / "state")
    if c.ours:
        _ours_commit_figures(c.name, c.work, out)
        out[f"{c.name}_blob_store_bytes"] = _dir_bytes(c.work / "blobs")
    for d in c.kept:
        shutil.copytree(c.work / d, c.work / "saved" / d, copy_function=os.link)


def _restart(c: _Config, phase: str, i: int, rows: int) -> None:
    """One restart of a new driver process with empty local dirs and spool: with state ("restart": the
    checkpoint the run left, first batch 10; for ours on a wiped host, the checkpoint location gone
    too), ours also on the same host ("samehost": the checkpoint location kept, as Spark's restart), or
    without state ("fresh": a new checkpoint location, i.e. a new query on the same source, batch 0)."""
    for d in ("local", "spool", "ckpt", "ckpt-fresh", *c.kept):
        shutil.rmtree(c.work / d, ignore_errors=True)
    for d in c.kept:
        if not (c.ours and d == "ckpt" and phase.startswith("restart")):
            shutil.copytree(c.work / "saved" / d, c.work / d, copy_function=os.link)
    ckpt, until = ("ckpt-fresh", 0) if phase == "fresh" else ("ckpt", BATCHES)
    tag = f"{phase}{i}"
    launched = _run(
        c.work, tag, ours=c.ours, changelog=c.changelog, until=until, rows=rows, ckpt=ckpt,
        privileged=phase == "restart_root", partitions=c.partitions, blob_url=c.blob_url,
    )  # fmt: skip
    _save_sidecar_logs(c.work, tag)
    c.restarts[phase].append(_restart_figures(c.work, tag, launched, ours=c.ours))


#: Each restart with state, and the name of its share (it minus the restart without state, "fresh").
_SHARES = (
    ("restart", "state_share"),
    ("samehost", "samehost_state_share"),
    ("restart_root", "root_state_share"),
)


def _restart_summary(c: _Config, out: dict[str, float]) -> None:
    # Paired share: each round's restart with state minus the same round's restart without (they ran
    # back to back), median over rounds; less exposed to the machine's drift than a difference of medians.
    for phase, name in _SHARES:
        if phase not in c.restarts:
            continue
        for base in ("to_first_batch_s", "start_to_first_batch_s"):
            pairs = [w[base] - f[base] for w, f in zip(c.restarts[phase], c.restarts["fresh"], strict=True)]
            if pairs:
                out[f"{c.name}_{name}_paired_{base}"] = statistics.median(pairs)
    for phase, runs in c.restarts.items():
        if not runs:
            continue  # SSB_BENCH_RESTARTS=0: the steady-state figures only
        # The median run by its time from start() (with 3, one outlier either way is ignored), and the
        # spread of both times over all runs.
        runs.sort(key=lambda f: f["start_to_first_batch_s"])
        for key, value in runs[(len(runs) - 1) // 2].items():
            out[f"{c.name}_{phase}_{key}"] = value
        for key in ("to_first_batch_s", "start_to_first_batch_s"):
            out[f"{c.name}_{phase}_{key}_min"] = min(f[key] for f in runs)
            out[f"{c.name}_{phase}_{key}_max"] = max(f[key] for f in runs)
    # State's share from the process launch (what the issue names), and from the query's start() call:
    # launching the Python driver, its JVM and (ours) the sidecars does not depend on the state, so the
    # second is the same difference without the launch's noise on a shared machine.
    for base in ("to_first_batch_s", "start_to_first_batch_s"):
        for phase, name in _SHARES:
            if f"{c.name}_{phase}_{base}" in out:
                out[f"{c.name}_{name}_{base}"] = (
                    out[f"{c.name}_{phase}_{base}"] - out[f"{c.name}_fresh_{base}"]
                )


def bench_mode(
    root: Path, configs: list[_Config], rows: int, out: dict[str, float], *,
    rounds: int | None = None, evidence: Path | None = None,
    before_cleanup: Callable[[list[_Config]], None] | None = None,
) -> None:  # fmt: skip
    """The configurations of one mode (Spark's and ours): each one's run, then their restarts
    interleaved (Spark with state, without, ours with, without; `rounds`, default SSB_BENCH_RESTARTS),
    so that a change in the machine's load hits both sides alike. `before_cleanup` sees the work dirs
    (saved state, blob stores, logs) before their logs go to `evidence` (default
    SSB_BENCH_RESULTS/spark_commit) and the dirs are removed."""
    try:
        if rounds is None:
            rounds = int(os.environ.get("SSB_BENCH_RESTARTS", "3"))
        for c in configs:
            _first_run(c, rows, out, settle=rounds > 0 or before_cleanup is not None)
        for i in range(rounds):
            for c in configs:
                if c.remote and i > 0:
                    continue
                for phase in c.restarts:
                    _restart(c, phase, i, rows)
        for c in configs:
            _restart_summary(c, out)
        if before_cleanup is not None:
            before_cleanup(configs)
    finally:  # a failed run keeps its drivers' output too
        into = evidence or Path(os.environ.get("SSB_BENCH_RESULTS", "bench-results")) / "spark_commit"
        for c in configs:
            _keep_evidence(c.work, into / c.name)
            shutil.rmtree(c.work, ignore_errors=True)  # a few GB per configuration


def _keep_evidence(work: Path, into: Path) -> None:
    """Spark's progress, the drivers' output and the logs the figures came from, for a reader to check
    (the checkpoints and blob store, a few GB, are not kept)."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for f in work.iterdir():
        if f.is_file() and f.suffix in (".jsonl", ".json", ".out", ".log"):
            shutil.copy2(f, into / f.name)


def _save_sidecar_logs(work: Path, phase: str) -> None:
    """The sidecars' logs of a phase, out of the spool before it is wiped (the driver's and executors')."""
    spool = work / "spool"
    for i, f in enumerate(sorted(spool.rglob("sidecar.log")) if spool.exists() else []):
        shutil.copy2(f, work / f"sidecar-{phase}-{i}.log")


def _ratios(out: dict[str, float]) -> None:
    for mode in ("default", "changelog"):
        ours, spark = f"ours_{mode}", f"spark_{mode}"
        for fig in (
            "commit_ms_p50", "commit_ms_p99", "batch_ms_p50", "batch_ms_p99",
            "state_share_to_first_batch_s", "state_share_start_to_first_batch_s",
            "state_share_paired_to_first_batch_s", "state_share_paired_start_to_first_batch_s",
        ):  # fmt: skip
            if out.get(f"{spark}_{fig}") and f"{ours}_{fig}" in out:
                out[f"ratio_{mode}_{fig}"] = out[f"{ours}_{fig}"] / out[f"{spark}_{fig}"]
            # Ours restarted as Spark restarts (checkpoint location kept), and on a wiped host with root's
            # capabilities (every SST copied), against Spark's restart.
            for kind in ("samehost", "root"):
                other = f"{ours}_{kind}_{fig}"
                if fig.startswith("state_share") and out.get(f"{spark}_{fig}") and other in out:
                    out[f"ratio_{mode}_{kind}_{fig}"] = out[other] / out[f"{spark}_{fig}"]
    # The commit-time goal: ours in changelog mode against Spark's default mode.
    if out.get("spark_default_commit_ms_p99") and "ours_changelog_commit_ms_p99" in out:
        out["ratio_ours_changelog_over_spark_default_commit_ms_p99"] = (
            out["ours_changelog_commit_ms_p99"] / out["spark_default_commit_ms_p99"]
        )
        out["ratio_ours_changelog_over_spark_default_commit_ms_p50"] = (
            out["ours_changelog_commit_ms_p50"] / out["spark_default_commit_ms_p50"]
        )


def _load() -> float:
    return os.getloadavg()[0]


def main() -> dict[str, float]:
    # The drivers run in their own sessions, which a signal to this process's group does not reach:
    # turn SIGTERM into an exception, so the running driver is killed on the way out (_run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = int(os.environ.get("SSB_BENCH_ROWS", "100000"))
    chosen = [c for c in filter(None, os.environ.get("SSB_BENCH_CONFIGS", "").split(","))]
    out: dict[str, float] = {
        "rows_per_batch": float(rows),
        "trigger_s": _trigger_s(),
        "operators": float(_operators()),
        "partitions": float(_partitions()),
    }
    out["load1_before"] = _load()
    with tempfile.TemporaryDirectory(prefix="ssb-spark-bench-", dir=os.environ.get("SSB_BENCH_DIR")) as tmp:
        for mode in ("default", "changelog"):
            configs = [
                _Config(Path(tmp), name, ours, changelog, partitions=_partitions())
                for name, ours, changelog in CONFIGS
                if name.endswith(mode) and (not chosen or name in chosen)
            ]
            if not configs:
                continue
            t0 = time.monotonic()
            bench_mode(Path(tmp), configs, rows, out)
            out[f"{mode}_wall_s"] = time.monotonic() - t0
            out[f"{mode}_load1_after"] = _load()
    _ratios(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 2:
        driver(json.loads(sys.argv[1]))
    else:
        for k, v in main().items():
            print(f"{k:56} {v:14.3f}")
