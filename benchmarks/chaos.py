"""Randomized fault run (`make chaos`): real queries under seeded random faults, then exact checks.

    python -m benchmarks.chaos [--minutes 30] [--seed N] [--min-faults 0] [--gap 2:12] [--work DIR]
        [--s3 seaweedfs|moto] [--cluster local|rig] [--no-verify-restart] [--report FILE]

What runs: benchmarks/chaos_app.py, four queries in one driver: an aggregation and a stream-stream join
over the deterministic rate-micro-batch source (`agg`, `join`), and two queries over a file source whose
files keep arriving (`files_sink`: dropDuplicates on the record id into Spark's file sink with its
`_spark_metadata` log; `files_fb`: applyInPandasWithState per key into a `foreachBatch` that writes
out/files_fb/<batch>.json only if that batch id is not there yet). Both file sinks are idempotent by
batch id the way users' sinks are (the first run of a batch id wins), so a batch Spark plans again
with other files than the first time loses records, which the checker sees. The runner writes the
input while the application runs (`Feeder`: a file due every 0.1-2 s and written while the slower file
query has fewer than MAX_BACKLOG files left to read, each RECORDS_PER_FILE records with ids never
repeated and a key; written under a dot name and renamed, so Spark never reads a partial file), so
what Spark plans for a batch depends on when it plans it (maxFilesPerTrigger=2: sometimes the queries
lag the input, sometimes they wait for it), and the input keeps pace with the queries on a loaded
machine. The blob store is a real S3 server (SeaweedFS,
or moto) reached through tests/faultproxy.py, the checkpoint log a Tansu broker. All are started here
on 127.0.0.1 and stopped by pid.

Where the application runs (--cluster):
  local  `local-cluster[2,1,1024]` (default): the executors share the driver's disk;
  rig    tests/cluster_rig.py (root, `unshare -m`): a standalone master and two worker hosts, each in
         its own mount namespace and on its own loopback address, and each application on a driver
         host of its own, so checkpoint locations, Spark local dirs and spools are private to each
         host as on a real cluster (input and output stay on a shared disk, as data on a shared file
         system would). Adds the fault kind host_loss and runs with spark.statebackend.durableCommit=
         true (RIG_SSB_SETTINGS): with durableCommit=false a host lost right after a task's commit
         fails the query by design (the documented limit of the opt-out).

Faults. `plan(seed)` alone fixes their order, kinds, gaps and parameters (never what happens in the run),
so a seed reproduces the fault sequence; the timing of each fault relative to Spark's batches is not
reproducible, that is the point of running many. Every round of eleven (thirteen on the rig) holds every
kind at least once:
  driver_kill    kill -9 of the driver JVM. Everything else of the application (executors, sidecars, the
                 Python driver) must exit by itself; then a new application starts on the same checkpoint
                 locations, after wiping the host first (the first driver kill always, then by the seed):
                 checkpoint locations, spark.local.dir, the executors' work dirs and the spool are
                 deleted, so the state must come back from the blob store (on the rig: a new driver host);
  clean_stop     the application is stopped at a random moment, the runner not waiting for any
                 checkpoint: by the seed either "quit" (the app calls query.stop() on every query, then
                 spark.stop(), at once) or "sigterm" (SIGTERM to the driver JVM, whose shutdown hook stops
                 the SparkContext). Once everything of it has exited, every batch Spark committed
                 (commits/ of each location) must be in the checkpoint log (else an incident, unless a
                 proxy fault or a freeze overlapped the stop: counted as clean_stops_behind_under_fault);
                 then a new application starts, on the same host or a wiped one (by the seed);
  executor_kill  kill -9 of an executor JVM (Spark launches a new one);
  sidecar_kill   kill -9 of a sidecar, the driver's (the committer) or an executor's (the plugin starts a
                 new one; at most 3 kills per sidecar in 10 minutes, below the plugin's restart limit);
  blob_503       every blob store request answered 503 for a few seconds (the proxy);
  blob_stall     no byte through the proxy for a few seconds, both ways;
  broker_freeze  the checkpoint broker stopped with SIGSTOP (which keeps Tansu's in-memory topics) for
                 a few seconds, then SIGCONT;
  host_loss      (--cluster rig only, twice per round) a worker host dies: SIGKILL of its worker daemon,
                 its executor JVM and its sidecar, its disk wiped, and a new worker started on a fresh
                 disk at the same address (ClusterRig.kill_host, wipe, restart_worker). The query must
                 go on: Spark retries the lost tasks on the other host, which restores their state.
A kill or stop waits until the application is up (every query finished a batch since its start, both
executors and every sidecar run); one proxy fault and one freeze at a time. The chaos phase ends once
--minutes have passed, --min-faults were injected and every kind was injected at least once.

Incidents (each fails the run): the driver exiting when nothing killed it (except a start that fails
while a proxy fault or a freeze is on: the start-up check refuses unreachable services by design, so it
is counted apart and the driver started again), a query without a new batch for --stall-limit seconds,
processes of a stopped or killed driver still running 60 s later, a clean stop that does not end with
every query's last batch checkpointed, a verification restart that does not resume from that
checkpoint, a query running under a new id although the log had a checkpoint of its old one (a query
whose first application died before its first checkpoint, restarted on a wiped host, rightly starts as
a new query: counted as new_ids_before_first_checkpoint).

At the end the last faults run their course, the driver (started again if needed) finishes two more
batches of each query, the input stops and the file queries drain it (until both sinks hold every
record written, or neither ran a batch for DRAIN_IDLE_S), and the driver stops cleanly (it waits for
every query's last batch in the log); with --verify-restart (default) the runner then writes four more
input files and starts once more on a wiped host, for 3 more batches of each rate query and 2 of each
file query, which must resume from the last checkpoint, rebuilt from the blob store. Then:
  (1) output: every batch file of each query equals the one of an uninterrupted reference run (Spark's
      own provider without the backend, local[2], the same batch ids). The sink overwrites
      out/<q>/<batch>.json when a batch runs again, so exactly-once for it means equal per batch id.
      Counted: records compared, records lost (in the reference, not in the run), records extra
      (duplicated or different), the first mismatch;
  (3) files: every record the Feeder wrote (all before the final stop) reaches each file query's
      committed output exactly once: for files_sink the part files `_spark_metadata` lists (the newest
      `<b>.compact` and the batch files after it; a part file no batch committed, left by a batch that
      ran again, is not output), for files_fb the union of out/files_fb/*.json. Counted: records
      expected, lost (written, not in the output), extra (twice, unknown, or under another key), per
      sink and in all. And files_fb's state equals a reference from the input alone: each row's count
      and sum are the previous row's of its key plus the batch's ids (the state a batch ran on was the
      one the previous batch left), and each key's last row has the count and sum of every id written
      with that key;
  (4) blobs: every blob the latest checkpoint of each query references exists and is permanent; every
      other blob (but the query locators) carries a TTL; `spark-statebackend gc --grace 0s` deletes none
      of the referenced ones; after a TTL sweep at a time past every TTL the store holds exactly the
      referenced blobs plus the locators. (On Tansu, which never compacts, gc finds the older records
      whose blobs cleanup deleted and, never deleting on a guess, deletes nothing of the query.) The
      plans of batches after a query's latest checkpoint (`plans/<query>/<batch>.json`, stored before
      Spark publishes a batch's offsets) count as referenced: Spark planned those batches and runs them
      again on a restart; a plan at or below the latest checkpoint is a stray.
The report (printed, and written to --report, default <work>/chaos-report.json) has the seed, minutes
run, faults per kind, restarts (wiped or not), batches, input files, records compared, records lost and
extra (`output` for the rate queries, `files` for the file queries), every incident and the fault log.
Exit 0 only if the run passed: no incident, checks 1, 3 and 4 exact.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from benchmarks.chaos_app import FILE_QUERIES, MAX_FILES_PER_TRIGGER, QUERIES, RATE_QUERIES

ROOT = Path(__file__).resolve().parent.parent
KINDS = (
    "driver_kill",
    "clean_stop",
    "executor_kill",
    "sidecar_kill",
    "blob_503",
    "blob_stall",
    "broker_freeze",
)
#: One round of the plan, shuffled by the seed: every kind at least once, the cheap ones more often
#: (a driver kill costs a whole application start, a minute or two on a 2-core machine).
ROUND = (
    "driver_kill",
    "clean_stop",
    "executor_kill",
    "executor_kill",
    "sidecar_kill",
    "sidecar_kill",
    "blob_503",
    "blob_503",
    "blob_stall",
    "broker_freeze",
    "broker_freeze",
)
#: On the multi-host rig (--cluster rig) every round holds two host losses more.
RIG_KINDS = (*KINDS, "host_loss")
RIG_ROUND = (*ROUND, "host_loss", "host_loss")
SIDECAR_KILLS_PER_WINDOW = 3  # the plugin restarts a sidecar at most 5 times per 10 minutes
SIDECAR_WINDOW_S = 600.0
EXECUTORS = 2
BUCKET = "ssb-chaos"
#: Seconds each timed fault lasts, drawn uniformly. All stay inside what the run's settings absorb: a
#: frozen broker blocks commits after maxCommitDelay and fails the query only after commitTimeout; a
#: faulty proxy is retried within the blob store's retry_budget.
DURATIONS = {"blob_503": (2.0, 12.0), "blob_stall": (2.0, 15.0), "broker_freeze": (3.0, 25.0)}
SSB_SETTINGS = {
    "maxCommitDelay": "10s",  # short, so a freeze or a stalled store really blocks commits
    "commitTimeout": "3min",
    "restoreTimeout": "4min",  # restores on a loaded 2-core machine, through a faulty proxy
    "drainTimeout": "30s",
}
BLOB_OPTIONS = {
    "retry_budget": "90s",
    "retry_initial_backoff": "100ms",
    "retry_max_backoff": "2s",
    "connect_timeout": "3s",
    "read_timeout": "5s",  # a stalled proxy is noticed after 5 s and the request retried
    "max_concurrency": "4",
}
#: On the rig: a host lost right after a task's commit loses a state version nothing else holds unless
#: the commit waited for its upload (with durableCommit=false the query fails, a documented limit).
RIG_SSB_SETTINGS = {"durableCommit": "true"}
LOG_OPTIONS = {"replication.factor": "1", "read.timeout": "5s", "write.timeout": "5s", "admin.timeout": "10s"}
STOPPED_GRACE_S = 60.0  # how long what is left of a killed or stopped driver may take to exit
#: The file queries' input: records per file, keys, seconds between two files (drawn uniformly), and
#: at most how many files written and not yet read by the slower file query (its source log says): the
#: input keeps pace with the queries, however loaded the machine, so a batch sometimes finds several
#: files waiting and sometimes one or none: what a batch plans depends on when it plans it.
RECORDS_PER_FILE = 10
KEYS = 5
FEED_GAP = (0.1, 2.0)
MAX_BACKLOG = 3 * MAX_FILES_PER_TRIGGER
DRAIN_IDLE_S = 30.0  # the file queries drained: no batch this long after the last file was written


# ---- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One planned fault. `delay`: seconds after the previous fault was injected (or the chaos began)."""

    n: int
    kind: str
    delay: float
    seconds: float = 0.0  # blob_503, blob_stall, broker_freeze: how long
    wiped: bool = False  # driver_kill, clean_stop: restart on a wiped host
    restart_after: float = 0.0  # driver_kill, clean_stop: seconds from the old application gone to the new
    how: str = ""  # clean_stop: "quit" (the application stops its queries and Spark) or "sigterm" (its JVM)
    pick: float = 0.0  # executor_kill, sidecar_kill: the target, as a fraction of the sorted candidates


def plan(seed: int, gap: tuple[float, float] = (2.0, 12.0), rig: bool = False) -> Iterator[Fault]:
    """The endless fault sequence of `seed`: rounds of ROUND (RIG_ROUND on the rig) in a seeded order.
    Every draw comes from one Random(seed) in a fixed order, so the sequence never depends on what
    happened in the run."""
    rng = random.Random(seed)
    n = 0
    first_driver_kill = True
    while True:
        kinds = list(RIG_ROUND if rig else ROUND)
        rng.shuffle(kinds)
        for kind in kinds:
            n += 1
            delay = round(rng.uniform(*gap), 3)
            if kind == "driver_kill":
                wiped = first_driver_kill or rng.random() < 0.5
                first_driver_kill = False
                yield Fault(n, kind, delay, wiped=wiped, restart_after=round(rng.uniform(0.0, 5.0), 3))
            elif kind == "clean_stop":
                wiped = rng.random() < 0.5
                how = "sigterm" if rng.random() < 0.5 else "quit"
                yield Fault(
                    n, kind, delay, wiped=wiped, restart_after=round(rng.uniform(0.0, 5.0), 3), how=how
                )
            elif kind in DURATIONS:
                yield Fault(n, kind, delay, seconds=round(rng.uniform(*DURATIONS[kind]), 3))
            else:
                yield Fault(n, kind, delay, pick=round(rng.random(), 6))


def pick(candidates: list[str], fraction: float) -> str:
    """The candidate at `fraction` of the (sorted) list: deterministic for a given list."""
    return candidates[min(int(fraction * len(candidates)), len(candidates) - 1)]


# ---- the file queries' input -------------------------------------------------------------------


class Feeder:
    """Writes the file queries' input into `input_dir` while the run goes on (module doc): file i holds
    RECORDS_PER_FILE JSON lines `{"id": i * RECORDS_PER_FILE + j, "key": ...}`, written under a dot name
    (which Spark's file source skips) and renamed into place, so no query ever reads a partial file.
    A file is due every FEED_GAP seconds, and written only if `read()` (the files the slower file
    query has read; None: unknown, e.g. while the application restarts) is at most MAX_BACKLOG behind.
    `records()` is every record written so far, id -> key: what the checker expects in the output."""

    def __init__(
        self,
        input_dir: Path,
        seed: int,
        read: Callable[[], int | None] = lambda: None,
        gap: tuple[float, float] = FEED_GAP,
    ) -> None:
        self.input_dir = input_dir
        self.gap = gap
        self.read = read
        self._rng = random.Random(f"feed-{seed}")  # its own stream: the fault plan never depends on it
        self._records: dict[int, int] = {}
        self._files = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.input_dir.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="chaos-feeder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No file after this returns (a write under way has finished)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def write(self, files: int = 1) -> None:
        """Write `files` more files now."""
        for _ in range(files):
            with self._lock:
                i = self._files
                first = i * RECORDS_PER_FILE
                rows = {first + j: self._rng.randrange(KEYS) for j in range(RECORDS_PER_FILE)}
                tmp = self.input_dir / f".f-{i:07d}.json.tmp"
                tmp.write_text("".join(json.dumps({"id": k, "key": v}) + "\n" for k, v in rows.items()))
                tmp.rename(self.input_dir / f"f-{i:07d}.json")
                self._records.update(rows)
                self._files += 1

    def records(self) -> dict[int, int]:
        with self._lock:
            return dict(self._records)

    @property
    def files(self) -> int:
        return self._files

    def _loop(self) -> None:
        while not self._stop.wait(self._rng.uniform(*self.gap)):
            read = self.read()
            if read is not None and self._files - read < MAX_BACKLOG:
                self.write()


def files_read(source_log: Path) -> int | None:
    """How many input files a file query has read, from its source log (`sources/0` of its checkpoint
    location: per batch, JSON lines naming the files it read, `f-<index>.json`): the newest entry's
    highest index + 1 (files are read oldest first); 0 if there is no log (yet); None if it cannot be
    read now."""
    if not source_log.is_dir():
        return 0
    try:
        names = [p.name for p in source_log.iterdir() if p.name[:1].isdigit()]
        if not names:
            return 0
        newest = max(names, key=lambda n: int(n.split(".")[0]))
        lines = (source_log / newest).read_text().splitlines()[1:]
    except (OSError, ValueError):
        return None  # no location yet (a new host), or a file renamed under us: ask again
    found = [int(m.group(1)) for m in map(re.compile(r"/f-(\d+)\.json").search, lines) if m]
    return max(found) + 1 if found else None


# ---- processes ---------------------------------------------------------------------------------


def spark_home() -> Path:
    """SPARK_HOME, else the installed pyspark (which is a Spark home)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def session_processes(sid: int) -> list[Any]:
    """Every live process of session `sid`. A driver run is started in a session of its own, and its
    JVM, executors and sidecars all stay in it, so this finds exactly what one run left behind."""
    return live_processes(lambda p: os.getsid(p.pid) == sid)


def live_processes(match: Callable[[Any], bool]) -> list[Any]:
    """Every live (not zombie) process `match` accepts (a psutil.Process with info pid, cmdline, status)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and match(p):
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def _past(moment: float) -> bool:
    return time.monotonic() >= moment


def _arg_after(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd and cmd.index(flag) + 1 < len(cmd) else None


class Driver:
    """One run of benchmarks/chaos_app.py in its own session (`proc`, started with start_new_session,
    its output in `log_path`); parses the lines it prints (chaos_app). On the rig (`host` set) its
    executors and their sidecars run on the worker hosts: `elsewhere` lists them."""

    def __init__(
        self,
        index: int,
        proc: subprocess.Popen[bytes],
        log_path: Path,
        out: IO[bytes] | None = None,
        host: Any = None,
        elsewhere: Callable[[Driver], list[Any]] = lambda d: [],
    ) -> None:
        self.index = index
        self.proc = proc
        self.log_path = log_path
        self.host = host
        self._out = out
        self._elsewhere = elsewhere
        self.started = time.monotonic()
        self.app_id: str | None = None
        self.query_ids: dict[str, str] = {}
        self.batches: dict[str, int] = {}  # newest batch each query finished in this run
        self.first_batch: dict[str, int] = {}
        self.executions: collections.Counter[str] = collections.Counter()
        self.last_progress: dict[str, float] = {}
        self.checkpointed: dict[str, int] = {}
        self.failed: str | None = None
        self.expected_exit = False  # set before the runner kills or stops it
        self._pos = 0
        self._partial = b""

    @property
    def sid(self) -> int:
        return self.proc.pid  # start_new_session: the session id is the leader's pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def poll(self) -> None:
        """Read what the driver printed since the last call."""
        with open(self.log_path, "rb") as f:
            f.seek(self._pos)
            data = f.read()
        self._pos += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        now = time.monotonic()
        for raw in lines:
            parts = raw.decode(errors="replace").split()
            if len(parts) == 3 and parts[0] == "BATCH" and parts[1] in QUERIES and parts[2].isdigit():
                q, b = parts[1], int(parts[2])
                self.batches[q] = max(self.batches.get(q, -1), b)
                self.first_batch.setdefault(q, b)
                self.executions[q] += 1
                self.last_progress[q] = now
            elif len(parts) == 2 and parts[0] == "APP":
                self.app_id = parts[1]
            elif len(parts) == 3 and parts[0] == "QUERY" and parts[1] in QUERIES:
                self.query_ids[parts[1]] = parts[2]
            elif len(parts) == 3 and parts[0] == "CHECKPOINTED" and parts[2].isdigit():
                self.checkpointed[parts[1]] = int(parts[2])
            elif parts[:2] == ["QUERY", "FAILED"] and self.failed is None:
                self.failed = " ".join(parts)

    def came_up(self) -> bool:
        """Every query has finished a batch in this run (so any restore is done)."""
        return all(q in self.batches for q in QUERIES)

    def up(self) -> bool:
        return self.alive() and self.came_up()

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def all_processes(self) -> list[Any]:
        """Every live process of this run: its session, and on the rig its executors and sidecars."""
        return session_processes(self.sid) + self._elsewhere(self)

    def processes(self) -> dict[str, Any]:
        """{'jvm': driver JVM, 'executor-<id>': executor JVM, 'sidecar-<id>': sidecar} of this run."""
        from spark_statebackend.runtime.spool import SIDECAR_MODULE  # the module the plugin launches

        procs: dict[str, Any] = {}
        for p in self.all_processes():
            cmd = p.info["cmdline"] or []
            if "org.apache.spark.deploy.SparkSubmit" in cmd:
                procs["jvm"] = p
            elif "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd:
                procs[f"executor-{_arg_after(cmd, '--executor-id')}"] = p
            elif SIDECAR_MODULE in cmd:
                procs[f"sidecar-{_arg_after(cmd, '--executor-id')}"] = p
        return procs

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


# ---- the run -----------------------------------------------------------------------------------


@dataclass
class Options:
    seed: int
    minutes: float
    work: Path
    min_faults: int = 0
    s3: str = "seaweedfs"
    gap: tuple[float, float] = (2.0, 12.0)
    stall_limit: float = 300.0
    verify_restart: bool = True
    trigger_ms: int = 500
    report: Path | None = None
    cluster: str = "local"  # or "rig": tests/cluster_rig.py, hosts that share no disk


@dataclass
class Incident:
    kind: str
    at_s: float
    what: str
    detail: str = ""


class Aborted(Exception):
    """The run cannot go on (the application never comes up); the report says why."""


@dataclass
class Tally:
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    restarts: collections.Counter[str] = field(default_factory=collections.Counter)
    start_failures_under_fault: int = 0
    new_ids_before_first_checkpoint: int = 0  # a query started again as new: its first run never checkpointed
    clean_stops_behind_under_fault: int = 0  # a clean stop whose drain met a proxy fault or a freeze
    incidents: list[Incident] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)


class Chaos:
    """The runner (module doc). `run()` returns the report."""

    def __init__(self, opts: Options) -> None:
        self.o = opts
        self.work = opts.work
        self.tally = Tally()
        self.driver: Driver | None = None
        self.drivers: list[Driver] = []
        self.t0 = time.monotonic()
        self.proxy_until = 0.0
        self.thaw_at: float | None = None  # set while the broker is frozen
        self.fault_windows: list[tuple[float, float]] = []  # (start, end) of proxy faults and freezes
        self.sidecar_kills: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
        self.stop_file = self.work / "stop"
        self.quit_file = self.work / "quit"
        self.feeder = Feeder(self.work / "input", opts.seed, read=self.files_read)
        self.s3: Any = None
        self.proxy: Any = None
        self.tansu: Any = None
        self.blob_url = f"s3://{BUCKET}/run-{opts.seed}-{uuid.uuid4().hex[:8]}"
        self.log_url = ""
        self.rig: Any = None  # tests.cluster_rig.ClusterRig under --cluster rig
        self.driver_disk: Path | None = (
            None  # on the rig: the driver host's disk, kept for a same-host restart
        )
        self.kinds = RIG_KINDS if opts.cluster == "rig" else KINDS

    # -- small helpers

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def say(self, text: str) -> None:
        print(f"[chaos {self.now():7.1f}s] {text}", flush=True)

    def incident(self, kind: str, what: str, detail: str = "") -> None:
        self.tally.incidents.append(Incident(kind, self.now(), what, detail[-6000:]))
        self.say(f"INCIDENT {kind}: {what}")

    def ssb(self) -> dict[str, str]:
        """spark.statebackend.* keys (no prefix) of the run; the blob store is reached via the proxy."""
        keys = {
            "blobStore.url": self.blob_url,
            "checkpointLog.url": self.log_url,
            "spoolDir": str((self.rig.mount if self.rig is not None else self.work) / "spool"),
            **SSB_SETTINGS,
            **(RIG_SSB_SETTINGS if self.rig is not None else {}),
        }
        for k, v in {**BLOB_OPTIONS, **self.s3.options(port=self.proxy.port)}.items():
            keys[f"blobStore.options.{k}"] = v
        for k, v in LOG_OPTIONS.items():
            keys[f"checkpointLog.options.{k}"] = v
        return keys

    def open_store(self) -> Any:
        """The run's blob store, reached directly (the checks must not meet the proxy's faults)."""
        from spark_statebackend.stores import open_blob_store

        return open_blob_store(self.blob_url, {**BLOB_OPTIONS, **self.s3.options()})

    def open_log(self) -> Any:
        from spark_statebackend.checkpoints.logs import open_checkpoint_log

        return open_checkpoint_log(self.log_url, LOG_OPTIONS)

    def app_env(self) -> dict[str, str]:
        """This checkout first on the path, so the driver and the sidecars import the code under test."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    # -- the driver

    def start_driver(self, extra_args: tuple[str, ...] = ()) -> Driver:
        self.stop_file.unlink(missing_ok=True)
        self.quit_file.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "benchmarks.chaos_app", "--work", str(self.work),
            "--trigger-ms", str(self.o.trigger_ms),
            *(a for k, v in self.ssb().items() for a in ("--ssb", f"{k}={v}")),
            "--quit-file", str(self.quit_file),
            *(extra_args or ("--stop-file", str(self.stop_file))),
        ]  # fmt: skip
        index = len(self.drivers)
        if self.rig is None:
            cmd += ["--master", f"local-cluster[{EXECUTORS},1,1024]"]
            log_path = self.work / "logs" / f"driver-{index}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "wb")  # noqa: SIM115 - closed by Driver.close()
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=self.app_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            d = Driver(index, proc, log_path, out=out)
        else:
            d = self.start_rig_driver(index, cmd)
        self.drivers.append(d)
        self.driver = d
        self.say(f"driver {index} started (pid {d.proc.pid})")
        return d

    # -- the rig (--cluster rig)

    def start_rig_driver(self, index: int, cmd: list[str]) -> Driver:
        """Start the application as a driver host of the rig: on the previous driver's disk (a restart
        on the same host) or on a new one (`driver_disk` None: a new host). Each host's checkpoint
        locations, Spark local dir and spool are private (at the rig's mount); input and output are
        on the shared disk, as on a cluster with a shared file system for data."""
        from tests.cluster_rig import rig_conf

        rig = self.rig
        assert rig is not None
        conf = {**rig_conf(rig, "ssb-chaos"), "spark.sql.shuffle.partitions": "2"}
        cmd = [
            *cmd, "--master", rig.master_url, "--checkpoint-root", str(rig.mount / "ckpt"),
            "--input", str(self.work / "input"), "--out", str(self.work / "out"),
            *(a for k, v in conf.items() for a in ("--extra", f"{k}={v}")),
        ]  # fmt: skip
        host = rig.start_driver(f"driver{index}", cmd, disk=self.driver_disk)
        self.driver_disk = host.real
        return Driver(index, host.procs[-1], rig.log_of(host), host=host, elsewhere=self.on_workers)

    def on_workers(self, d: Driver) -> list[Any]:
        """The processes of `d`'s application on the rig's worker hosts (executors and sidecars name
        the application id in their command lines)."""
        if self.rig is None or not d.app_id:
            return []
        pids = {pid for w in self.rig.workers for pid in w.processes()}
        app = str(d.app_id)
        return live_processes(lambda p: p.pid in pids and any(app in a for a in p.info["cmdline"] or []))

    def files_read(self) -> int | None:
        """The input files every file query has read (the Feeder's pace); None while no application
        runs."""
        d = self.driver
        if d is None or not d.alive():
            return None
        counts = [files_read(self.host_dir(d, "ckpt") / q / "sources" / "0") for q in FILE_QUERIES]
        return None if None in counts else min(c for c in counts if c is not None)

    def host_dir(self, d: Driver, name: str) -> Path:
        """`name` (ckpt, spool) of `d`'s host as the runner sees it."""
        return (d.host.real if d.host is not None else self.work) / name

    def lose_host(self, f: Fault, entry: dict[str, Any]) -> bool:
        """host_loss: SIGKILL every process of a worker host (daemon, executor, sidecar), wipe its disk
        and start a new worker at its address (tests/cluster_rig.py)."""
        rig = self.rig
        assert rig is not None
        n = int(pick(["1", "2"], f.pick))
        victim = rig.worker(n)
        killed = rig.kill_host(victim)
        rig.wipe(victim)
        self.say(f"fault {f.n}: host {victim.name} lost (pids {killed}), disk wiped; a new worker starts")
        rig.restart_worker(n)
        entry.update(target=victim.name, pids=killed)
        return True

    def worker_dirs(self) -> list[Path]:
        """The executors' work dirs of the run's applications: local-cluster's in-process workers put
        them under $SPARK_HOME/work/<app id> (SPARK_WORKER_DIR is read only by a standalone worker).
        On the rig they are on the worker hosts' disks."""
        if self.rig is not None:
            return []
        return [spark_home() / "work" / d.app_id for d in self.drivers if d.app_id]

    def save_logs(self, d: Driver) -> None:
        """Keep the sidecar and executor logs of a run before a wipe deletes them (the rig keeps
        every host's disk and logs)."""
        if not d.app_id or self.rig is not None:
            return
        dest = self.work / "logs" / f"run-{d.index}"
        spool, executors = self.work / "spool" / d.app_id, spark_home() / "work" / d.app_id
        for src_root, pattern in ((spool, "sidecar.log"), (executors, "std*")):
            for p in src_root.rglob(pattern) if src_root.is_dir() else []:
                target = dest / src_root.name / p.relative_to(src_root)
                target.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    shutil.copyfile(p, target)

    def wipe_host(self) -> None:
        """What a new host has: no checkpoint locations, no Spark local or worker dirs, no spool. (On
        the rig: the next driver starts on a new host.)"""
        self.driver_disk = None
        for name in ("ckpt", "local", "spool"):
            shutil.rmtree(self.work / name, ignore_errors=True)
        for path in self.worker_dirs():
            shutil.rmtree(path, ignore_errors=True)

    def wait_gone(self, d: Driver, what: str) -> None:
        """Everything of a killed or stopped driver must exit by itself; what is left after
        STOPPED_GRACE_S is an incident, and is killed."""
        deadline = time.monotonic() + STOPPED_GRACE_S
        while (d.alive() or d.all_processes()) and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.2)
        left = d.all_processes()
        if left:
            cmds = "\n".join(" ".join(p.info["cmdline"] or []) for p in left)
            self.incident(
                "leak",
                f"{what}: {len(left)} process(es) of driver {d.index} still run {STOPPED_GRACE_S:.0f}s later",
                cmds,
            )
            self.kill_all(d)
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.proc.wait(timeout=30)
        d.poll()
        d.close()

    def kill_all(self, d: Driver) -> None:
        """kill -9 every process of the run (its session), whatever the runner expected of it."""
        d.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.sid, signal.SIGKILL)
        for p in d.all_processes():  # what left the process group (the session, or on the rig's workers)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.proc.wait(timeout=30)
        d.poll()
        d.close()

    def restart(self, wiped: bool, why: str) -> None:
        assert self.driver is not None
        self.save_logs(self.driver)
        if wiped:
            self.wipe_host()
        self.tally.restarts["wiped" if wiped else "same_host"] += 1
        self.say(f"restarting the driver ({'wiped host' if wiped else 'same host'}): {why}")
        self.start_driver()

    # -- monitoring

    def faulted_since(self, t: float) -> bool:
        """Whether a proxy fault or a broker freeze was on at some time since `t`."""
        return any(end >= t for _, end in self.fault_windows)

    def tick(self) -> None:
        """Thaw the broker when due; notice a driver that exited on its own or stopped making progress."""
        now = time.monotonic()
        if self.thaw_at is not None and now >= self.thaw_at:
            self.thaw()
        d = self.driver
        if d is None:
            return
        d.poll()
        if d.expected_exit:
            return
        if not d.alive():
            d.expected_exit = True
            code = d.proc.returncode
            if not d.came_up() and d.failed is None and self.faulted_since(d.started):
                self.tally.start_failures_under_fault += 1
                self.say(f"driver {d.index} failed to start under a fault (exit {code}); starting it again")
            else:
                self.incident(
                    "exit",
                    f"driver {d.index} exited with {code} with nothing killing it",
                    d.failed or d.tail(),
                )
            self.wait_gone(d, "an exited driver")
            self.restart(False, f"driver {d.index} exited")
            return
        for q in QUERIES:
            since = now - d.last_progress.get(q, d.started)
            if since > self.o.stall_limit:
                self.incident(
                    "stuck",
                    f"query {q} finished no batch for {since:.0f}s (driver {d.index})",
                    self.diagnostics(d),
                )
                self.kill_all(d)
                self.restart(False, "stuck")
                return

    def diagnostics(self, d: Driver) -> str:
        parts = [f"== driver {d.index} output\n{d.tail(4000)}"]
        root = self.rig.root / "hosts" if self.rig is not None else self.work / "spool"
        for p in sorted(root.rglob("sidecar.log")):
            parts.append(f"== {p.relative_to(self.work)}\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def wait_for(self, cond: Callable[[], bool], timeout: float | None = None) -> bool:
        """Tick (a poll, 5 times a second) until `cond()`; False after `timeout` seconds (None: no limit
        here, as `tick` restarts a driver that exits or stops making progress)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cond():
            if deadline is not None and time.monotonic() > deadline:
                return False
            self.tick()
            time.sleep(0.2)
        return True

    def ready(self) -> bool:
        """The application is up with every executor and every sidecar running."""
        d = self.driver
        if d is None or not d.up():
            return False
        procs = d.processes()
        execs = [k.split("-", 1)[1] for k in procs if k.startswith("executor-")]
        return (
            "jvm" in procs
            and len(execs) == EXECUTORS
            and all(f"sidecar-{e}" in procs for e in [*execs, "driver"])
        )

    def ensure_ready(self) -> None:
        """Wait until the application is `ready`; one that is not after the stall limit (counted from
        now or from its start, as `tick` may start it again meanwhile) is an incident and is started
        again, at most 3 times, then the run is aborted."""
        for _ in range(3):
            began = time.monotonic()

            def late(began: float = began) -> bool:
                assert self.driver is not None
                return time.monotonic() - max(began, self.driver.started) > self.o.stall_limit

            self.wait_for(lambda: self.ready() or late())
            if self.ready():
                return
            d = self.driver
            assert d is not None
            self.incident(
                "not_ready",
                f"driver {d.index} not up after {self.o.stall_limit:.0f}s; running: {sorted(d.processes())}",
                self.diagnostics(d),
            )
            self.kill_all(d)
            self.restart(False, "not ready")
        raise Aborted("the application never came up; see the incidents")

    # -- faults

    def inject(self, f: Fault) -> bool:
        """Wait for the fault's precondition, inject it; False if it had no target (counted apart)."""
        if f.kind in ("driver_kill", "clean_stop", "executor_kill", "sidecar_kill", "host_loss"):
            self.ensure_ready()
        elif f.kind in ("blob_503", "blob_stall"):
            self.wait_for(lambda: time.monotonic() >= self.proxy_until)
        else:
            self.wait_for(lambda: self.thaw_at is None)
        d = self.driver
        assert d is not None
        entry: dict[str, Any] = {"n": f.n, "kind": f.kind, "at_s": self.now()}
        now = time.monotonic()
        if f.kind == "driver_kill":
            jvm = d.processes().get("jvm")
            if jvm is None:
                return False
            d.expected_exit = True
            os.kill(jvm.pid, signal.SIGKILL)
            entry.update(driver=d.index, wiped=f.wiped, batches=dict(d.batches))
            self.say(
                f"fault {f.n}: kill -9 driver {d.index}'s JVM (pid {jvm.pid}); restart "
                f"{'on a wiped host' if f.wiped else 'on the same host'} {f.restart_after:.1f}s later"
            )
            self.wait_gone(d, "a killed driver")
            restart_at = time.monotonic() + f.restart_after
            self.wait_for(lambda: time.monotonic() >= restart_at)
            self.restart(f.wiped, f"fault {f.n}")
        elif f.kind == "clean_stop":
            jvm = d.processes().get("jvm")
            if jvm is None:
                return False
            d.expected_exit = True
            if f.how == "sigterm":
                os.kill(jvm.pid, signal.SIGTERM)
            else:
                self.quit_file.touch()
            entry.update(driver=d.index, how=f.how, wiped=f.wiped, batches=dict(d.batches))
            self.say(
                f"fault {f.n}: stop driver {d.index} at once ("
                f"{'SIGTERM to its JVM' if f.how == 'sigterm' else 'query.stop(), spark.stop()'}); restart "
                f"{'on a wiped host' if f.wiped else 'on the same host'} {f.restart_after:.1f}s later"
            )
            self.wait_gone(d, "a stopped driver")
            entry["uncheckpointed"] = self.check_stopped(d, now)
            restart_at = time.monotonic() + f.restart_after
            self.wait_for(lambda: time.monotonic() >= restart_at)
            self.restart(f.wiped, f"fault {f.n}")
        elif f.kind == "host_loss":
            self.lose_host(f, entry)
        elif f.kind in ("executor_kill", "sidecar_kill"):
            procs = d.processes()
            prefix = "executor-" if f.kind == "executor_kill" else "sidecar-"
            cands = sorted(k for k in procs if k.startswith(prefix))
            if f.kind == "sidecar_kill":  # stay below the plugin's restart limit (module doc)
                cands = [
                    k for k in cands if len(self.recent_sidecar_kills(d, k, now)) < SIDECAR_KILLS_PER_WINDOW
                ]
            if not cands:
                return False
            target = pick(cands, f.pick)
            os.kill(procs[target].pid, signal.SIGKILL)
            if f.kind == "sidecar_kill":
                self.sidecar_kills[(d.index, target)].append(now)
            entry.update(target=target, pid=procs[target].pid)
            self.say(f"fault {f.n}: kill -9 {target} (pid {procs[target].pid})")
        elif f.kind in ("blob_503", "blob_stall"):
            if f.kind == "blob_503":
                self.proxy.answer_503(seconds=f.seconds)
            else:
                self.proxy.stall(seconds=f.seconds)
            self.proxy_until = now + f.seconds
            self.fault_windows.append((now, self.proxy_until))
            entry.update(seconds=f.seconds)
            self.say(
                f"fault {f.n}: blob store {'answers 503' if f.kind == 'blob_503' else 'stalls'} "
                f"for {f.seconds:.1f}s"
            )
        else:
            os.kill(self.tansu.pid, signal.SIGSTOP)
            self.thaw_at = now + f.seconds
            self.fault_windows.append((now, self.thaw_at))
            entry.update(seconds=f.seconds)
            self.say(f"fault {f.n}: checkpoint broker frozen for {f.seconds:.1f}s")
        self.tally.injected[f.kind] += 1
        self.tally.log.append(entry)
        return True

    def check_stopped(self, d: Driver, stopped_at: float) -> dict[str, list[int]]:
        """After a clean stop: every batch Spark committed (commits/ in the query's location) must be in
        the checkpoint log, unless a proxy fault or a broker freeze overlapped the stop's drainTimeout
        (counted apart). Returns {query: [Spark's last commit, the log's latest]} for the ones behind."""
        behind: dict[str, list[int]] = {}
        with contextlib.closing(self.open_log()) as log:
            for q in QUERIES:
                commits = self.host_dir(d, "ckpt") / q / "commits"
                names = [p.name for p in commits.iterdir()] if commits.is_dir() else []
                committed = max((int(n) for n in names if n.isdigit()), default=-1)
                qid = d.query_ids.get(q)
                latest = log.read_latest(qid) if qid else None
                durable = -1 if latest is None else latest.batch_id
                if committed > durable:
                    behind[q] = [committed, durable]
        if behind and self.faulted_since(stopped_at - 30.0):
            self.tally.clean_stops_behind_under_fault += 1
            self.say(f"clean stop under a fault left the log behind Spark's commits: {behind}")
        elif behind:
            self.incident(
                "clean_stop",
                f"driver {d.index} stopped cleanly with batches Spark committed not checkpointed "
                f"({{query: [Spark's last commit, the log's latest]}}: {behind})",
                d.tail(),
            )
        return behind

    def recent_sidecar_kills(self, d: Driver, key: str, now: float) -> list[float]:
        return [t for t in self.sidecar_kills[(d.index, key)] if now - t < SIDECAR_WINDOW_S]

    def thaw(self) -> None:
        if self.thaw_at is not None:
            os.kill(self.tansu.pid, signal.SIGCONT)
            self.thaw_at = None

    # -- phases

    def chaos(self) -> None:
        faults = plan(self.o.seed, self.o.gap, rig=self.rig is not None)
        end = time.monotonic() + self.o.minutes * 60
        last = time.monotonic()

        def more() -> bool:
            injected = self.tally.injected
            return (
                time.monotonic() < end
                or sum(injected.values()) < self.o.min_faults
                or any(injected[k] == 0 for k in self.kinds)
            )

        while more():
            f = next(faults)
            due = last + f.delay
            self.wait_for(partial(_past, due))
            if not self.inject(f):
                self.tally.skipped[f.kind] += 1
                self.say(f"fault {f.n} ({f.kind}): no target, skipped")
            last = time.monotonic()

    def settle(self, more_batches: int = 2) -> None:
        """Let the last faults run their course; the driver (started again if it is down) must then
        finish a few more batches."""
        self.wait_for(lambda: time.monotonic() >= self.proxy_until and self.thaw_at is None)
        self.proxy.heal()  # nothing left to heal, unless a fault outlived its planned length
        self.ensure_ready()

        def batches() -> dict[str, int]:
            return dict(self.driver.batches) if self.driver is not None else {}

        target = {q: batches()[q] + more_batches for q in QUERIES}
        self.wait_for(lambda: all(batches().get(q, -1) >= target[q] for q in QUERIES))

    def drain(self) -> None:
        """Stop writing input and let the file queries read every file written: done once both sinks
        hold every record (checked every 5 s), or once neither query has run a batch for DRAIN_IDLE_S
        (what is missing then is lost, and the checker says so)."""
        self.feeder.stop()
        stopped = time.monotonic()
        self.say(f"input stopped at {self.feeder.files} files; draining the file queries")
        next_check = 0.0

        def drained() -> bool:
            nonlocal next_check
            d = self.driver
            if d is None or not d.alive():
                return False
            last = max([stopped, d.started, *(d.last_progress.get(q, 0.0) for q in FILE_QUERIES)])
            if time.monotonic() - last > DRAIN_IDLE_S:
                return True
            if time.monotonic() < next_check:
                return False
            next_check = time.monotonic() + 5.0
            report = check_files(self.work / "out", self.feeder.records())
            return bool(report["records_lost"] == 0)

        self.wait_for(drained)

    def finish(self, d: Driver, timeout: float, what: str) -> dict[str, int]:
        """Wait for a driver that ends by itself (a stop file, --until); every query's last batch must
        be checkpointed. Returns {query: its last checkpointed batch}."""
        d.expected_exit = True
        if not self.wait_for(lambda: not d.alive(), timeout):
            self.incident(
                "unclean_stop",
                f"{what}: driver {d.index} still running after {timeout:.0f}s",
                self.diagnostics(d),
            )
            self.kill_all(d)
            return {}
        self.wait_gone(d, what)  # the JVM and the sidecars (draining) may end after the Python driver
        if d.proc.returncode != 0 or set(d.checkpointed) != set(QUERIES):
            self.incident(
                "unclean_stop",
                f"{what}: driver {d.index} exited {d.proc.returncode}, checkpointed {d.checkpointed}",
                d.tail(),
            )
        self.say(f"driver {d.index} stopped ({what}); checkpointed {d.checkpointed}")
        return self.latest_checkpoints(d)

    def latest_checkpoints(self, d: Driver) -> dict[str, int]:
        """{query: the batch of its latest checkpoint} after driver `d` stopped: what the next start
        must resume after. The app's own CHECKPOINTED lines say only that its last batch seen is in the
        log; a batch that finished between its last look and the stop may be checkpointed too."""
        durable = dict(d.checkpointed)
        with contextlib.closing(self.open_log()) as log:
            for q in durable:
                latest = log.read_latest(d.query_ids[q]) if q in d.query_ids else None
                if latest is not None and latest.batch_id > durable[q]:
                    durable[q] = latest.batch_id
        return durable

    def verify_restart(self, durable: dict[str, int]) -> None:
        """Start on a wiped host, run 3 more batches of each query, stop. Each query must begin at the
        batch after its last checkpoint, in a location the driver's sidecar rebuilt from it."""
        self.save_logs(self.drivers[-1])
        self.wipe_host()
        self.tally.restarts["wiped_verification"] += 1
        # Two batches of new files for each file query, there before it starts: each batch takes two.
        self.feeder.write(2 * MAX_FILES_PER_TRIGGER)
        until = {q: durable[q] + (2 if q in FILE_QUERIES else 3) for q in QUERIES}
        d = self.start_driver(tuple(a for q, n in until.items() for a in ("--until", f"{q}={n}")))
        self.finish(d, 900, "verification restart")
        sidecar_log = self.host_dir(d, "spool") / str(d.app_id) / "driver" / "sidecar.log"
        rebuilt = sidecar_log.read_text(errors="replace") if sidecar_log.is_file() else ""
        for q in QUERIES:
            if d.first_batch.get(q) != durable[q] + 1:
                self.incident(
                    "restore",
                    f"verification restart: query {q} began at batch "
                    f"{d.first_batch.get(q)}, its last checkpoint was {durable[q]}",
                    d.tail(),
                )
            pattern = rf"query {d.query_ids.get(q)}: .* rebuilt from checkpoint \S+ \(batch {durable[q]};"
            if not re.search(pattern, rebuilt):
                self.incident(
                    "restore",
                    f"verification restart: the checkpoint location of {q} was not "
                    f"rebuilt from checkpoint batch {durable[q]} ({sidecar_log})",
                    rebuilt[-3000:],
                )

    def reference(self, last: dict[str, int]) -> Path:
        """An uninterrupted run to the same batch ids on Spark's own provider (no backend)."""
        ref = self.work / "reference"
        shutil.rmtree(ref, ignore_errors=True)
        cmd = [
            sys.executable, "-m", "benchmarks.chaos_app", "--work", str(ref), "--plain",
            "--master", "local[2]", "--trigger-ms", "0", "--queries", ",".join(RATE_QUERIES),
            *(a for q, n in last.items() for a in ("--until", f"{q}={n}")),
        ]  # fmt: skip
        ref.mkdir(parents=True)
        self.say(f"reference run to batches {last}")
        with open(ref / "driver.log", "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=self.app_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=900 + 2 * max(last.values()))
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if code != 0:
            raise RuntimeError(f"the reference run failed ({code}); see {ref / 'driver.log'}")
        return ref / "out"

    def run(self) -> dict[str, Any]:
        from tests.faultproxy import FaultProxy
        from tests.servers.s3 import run_moto, run_seaweedfs
        from tests.servers.tansu import start_tansu

        self.work.mkdir(parents=True, exist_ok=True)
        logs = self.work / "logs" / "servers"
        report: dict[str, Any] = {
            "seed": self.o.seed,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "minutes_requested": self.o.minutes,
        }
        with contextlib.ExitStack() as stack:
            if self.o.s3 == "moto":
                self.s3 = stack.enter_context(run_moto(logs))
            else:
                self.s3 = stack.enter_context(run_seaweedfs(logs, self.work / "seaweedfs"))
            self.proxy = stack.enter_context(FaultProxy(self.s3.port))
            self.tansu = start_tansu(logs)
            stack.callback(self.tansu.stop)
            stack.callback(self.thaw)  # runs first: a frozen broker would not stop on SIGTERM
            self.log_url = f"kafka://127.0.0.1:{self.tansu.port}/ssb-chaos-{self.o.seed}"
            store = stack.enter_context(contextlib.closing(self.open_store()))
            store.ensure_ready()
            stack.callback(self.cleanup_drivers)
            self.say(
                f"seed {self.o.seed}; work {self.work}; blob store {self.blob_url} via proxy "
                f"{self.proxy.port} ({self.o.s3}); log {self.log_url}"
            )
            stack.callback(self.feeder.stop)
            if self.o.cluster == "rig":
                self.rig = stack.enter_context(self.start_rig())
            try:
                self.feeder.start()
                self.start_driver()
                self.ensure_ready()
                chaos_started = time.monotonic()
                try:
                    self.chaos()
                finally:
                    report["minutes_run"] = round((time.monotonic() - chaos_started) / 60, 2)
                self.say("chaos over; healing and stopping")
                self.settle()
                self.drain()
                assert self.driver is not None
                self.stop_file.touch()
                durable = self.finish(self.driver, 400, "clean stop")
                if self.o.verify_restart and set(durable) == set(QUERIES):
                    self.verify_restart(durable)
            except Aborted as e:
                self.incident("aborted", str(e))
            self.feeder.stop()
            last = self.final_batches()
            ids = self.query_ids()
            report.update(self.summary(last))
            if all(n >= 0 for n in last.values()):
                report["output"] = compare_outputs(self.work / "out", self.reference(last), last)
                report["files"] = check_files(self.work / "out", self.feeder.records())
                report["blobs"] = check_blobs(self, store, ids)
        report["incidents"] = [asdict(i) for i in self.tally.incidents]
        report["passed"] = passed(report)
        report["wall_minutes"] = round((time.monotonic() - self.t0) / 60, 2)
        return report

    def start_rig(self) -> Any:
        """The multi-host rig: a standalone master and two worker hosts (tests/cluster_rig.py)."""
        from tests.cluster_rig import ClusterRig, multihost_skip_reason

        reason = multihost_skip_reason()
        if reason:
            raise SystemExit(f"--cluster rig: {reason}")
        self.say("starting the rig: a master and two worker hosts")
        return ClusterRig(self.work / "rig")

    def cleanup_drivers(self) -> None:
        """Kill whatever of the run's drivers still runs; keep their logs and drop their worker dirs."""
        for d in self.drivers:
            if d.alive() or d.all_processes():
                self.kill_all(d)
            self.save_logs(d)
        for path in self.worker_dirs():
            shutil.rmtree(path, ignore_errors=True)

    def final_batches(self) -> dict[str, int]:
        """The newest batch file of each rate query (every batch up to it must be there)."""
        return {
            q: max((int(p.stem) for p in (self.work / "out" / q).glob("*.json")), default=-1)
            for q in RATE_QUERIES
        }

    def query_ids(self) -> dict[str, str]:
        """Each query's id in the last application that ran it. A new id is right only when the
        previous one never reached the log (its application died before its first checkpoint, and a
        wiped host left Spark nothing to read): the blob store did not know the query, so nothing
        could be restored. A new id for a query the log knows is an incident (a silent fresh start)."""
        ids: dict[str, str] = {}
        with contextlib.closing(self.open_log()) as log:
            for d in self.drivers:
                for q, qid in d.query_ids.items():
                    old = ids.get(q)
                    if old is not None and old != qid:
                        if log.read_latest(old) is not None:
                            self.incident("query_id", f"query {q} ran as {old} (checkpointed) and as {qid}")
                        else:
                            self.tally.new_ids_before_first_checkpoint += 1
                    ids[q] = qid
        return ids

    def summary(self, last: dict[str, int]) -> dict[str, Any]:
        return {
            "faults_injected": sum(self.tally.injected.values()),
            "cluster": self.o.cluster,
            "faults": {k: self.tally.injected.get(k, 0) for k in self.kinds},
            "faults_skipped": dict(self.tally.skipped),
            "restarts": {
                "wiped": self.tally.restarts["wiped"],
                "same_host": self.tally.restarts["same_host"],
                "wiped_verification": self.tally.restarts["wiped_verification"],
            },
            "start_failures_under_fault": self.tally.start_failures_under_fault,
            "new_ids_before_first_checkpoint": self.tally.new_ids_before_first_checkpoint,
            "clean_stops_behind_under_fault": self.tally.clean_stops_behind_under_fault,
            "applications": len(self.drivers),
            "input_files": self.feeder.files,
            "batches": {
                q: last.get(q, max((d.batches.get(q, -1) for d in self.drivers), default=-1)) + 1
                for q in QUERIES
            },
            "batch_executions": {q: sum(d.executions[q] for d in self.drivers) for q in QUERIES},
            "fault_log": self.tally.log,
        }


# ---- checks ------------------------------------------------------------------------------------


def _rows(path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in json.loads(path.read_text()))


def compare_outputs(out: Path, ref: Path, last: dict[str, int]) -> dict[str, Any]:
    """Batch by batch, each query's output against the reference's (module doc, check 1)."""
    compared = lost = extra = 0
    first: dict[str, Any] | None = None
    for q, n in last.items():
        for b in range(n + 1):
            ref_rows = _rows(ref / q / f"{b}.json")
            got_path = out / q / f"{b}.json"
            got = _rows(got_path) if got_path.exists() else []
            compared += len(ref_rows)
            missing = collections.Counter(ref_rows) - collections.Counter(got)
            surplus = collections.Counter(got) - collections.Counter(ref_rows)
            lost += sum(missing.values())
            extra += sum(surplus.values())
            if (missing or surplus or not got_path.exists()) and first is None:
                first = {
                    "query": q,
                    "batch": b,
                    "file_missing": not got_path.exists(),
                    "missing": [list(r) for r in list(missing)[:5]],
                    "extra": [list(r) for r in list(surplus)[:5]],
                }
    return {
        "records_compared": compared,
        "records_lost": lost,
        "records_extra": extra,
        "first_mismatch": first,
    }


def sink_log_files(sink: Path) -> tuple[list[Path], list[str]]:
    """The part files Spark's file sink committed under `sink`: those its `_spark_metadata` log lists
    (the newest `<b>.compact` and every batch file after it; "delete" entries remove), nothing else
    (a batch that ran again may have left part files no batch committed). Returns (files, problems)."""
    log = sink / "_spark_metadata"
    entries = {p.name: p for p in log.iterdir() if p.name[:1].isdigit()} if log.is_dir() else {}
    batches = sorted(int(n.split(".")[0]) for n in entries)
    if not batches:
        return [], []
    compacts = [b for b in batches if f"{b}.compact" in entries]
    first = compacts[-1] if compacts else 0
    problems: list[str] = []
    paths: dict[str, None] = {}
    for b in range(first, batches[-1] + 1):
        name = f"{b}.compact" if b == first and compacts else str(b)
        if name not in entries:
            problems.append(f"{log}: no entry {name}")
            continue
        lines = entries[name].read_text().splitlines()
        if lines[:1] != ["v1"]:
            problems.append(f"{entries[name]}: version {lines[:1]}")
        for line in lines[1:]:
            status = json.loads(line)
            if status.get("action") == "delete":
                paths.pop(status["path"], None)
            else:
                paths[status["path"]] = None
    return [Path(unquote(urlparse(u).path)) for u in paths], problems


def compare_records(expected: dict[int, int], got: list[tuple[int, int]]) -> dict[str, Any]:
    """Records (id, key) a sink committed against the ones written: lost (written, not in the output
    with its key) and extra (duplicated, unknown, or with another key)."""
    seen = collections.Counter(got)
    lost = [i for i, k in expected.items() if seen[(i, k)] == 0]
    extra = [r for r, n in seen.items() for _ in range(n - (1 if expected.get(r[0]) == r[1] else 0))]
    return {
        "records_expected": len(expected),
        "records_lost": len(lost),
        "records_extra": len(extra),
        "first_lost": sorted(lost)[:5],
        "first_extra": sorted(extra)[:5],
    }


def fb_batches(out: Path) -> dict[int, list[Any]]:
    """files_fb's committed output: batch id -> its [key, ids, count, sum] rows."""
    return {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}


def check_fb_state(expected: dict[int, int], batches: dict[int, list[Any]]) -> dict[str, Any]:
    """files_fb's state as its output shows it: each row's count and sum must be the previous row's of
    its key plus the batch's ids (state restored as it was), and each key's last row must give the
    count and sum of every id written with that key (the reference, from the input alone)."""
    reference: dict[int, list[int]] = {}
    for i, k in expected.items():
        c, t = reference.get(k, [0, 0])
        reference[k] = [c + 1, t + i]
    running: dict[int, list[int]] = {}
    inconsistent: list[dict[str, Any]] = []
    for b in sorted(batches):
        for key, ids, c, t in batches[b]:
            prev = running.get(key, [0, 0])
            if [c, t] != [prev[0] + len(ids), prev[1] + sum(ids)]:
                inconsistent.append(
                    {"batch": b, "key": key, "got": [c, t], "previous": prev, "ids": len(ids)}
                )
            running[key] = [c, t]
    wrong = {k: {"got": running.get(k), "reference": v} for k, v in reference.items() if running.get(k) != v}
    wrong.update({k: {"got": v, "reference": None} for k, v in running.items() if k not in reference})
    return {
        "ok": not inconsistent and not wrong,
        "keys": len(reference),
        "inconsistent_rows": len(inconsistent),
        "first_inconsistent": inconsistent[:3],
        "final_state_wrong": dict(list(wrong.items())[:5]),
    }


def check_files(out: Path, expected: dict[int, int]) -> dict[str, Any]:
    """Check 3 of the module doc: every record written reaches each file query's committed output
    exactly once, and files_fb's state equals the reference."""
    files, problems = sink_log_files(out / "files_sink")
    sink_rows = [
        (int(r["id"]), int(r["key"]))
        for f in files
        for r in map(json.loads, f.read_text().splitlines() if f.is_file() else [])
    ]
    problems += [f"{f}: listed in _spark_metadata, not there" for f in files if not f.is_file()]
    sink = {**compare_records(expected, sink_rows), "committed_files": len(files), "problems": problems[:5]}
    batches = fb_batches(out / "files_fb")
    fb_rows = [(int(i), int(key)) for rows in batches.values() for key, ids, _, _ in rows for i in ids]
    fb = {
        **compare_records(expected, fb_rows),
        "batches": len(batches),
        "state": check_fb_state(expected, batches),
    }
    return {
        "records_expected": len(expected),
        "records_lost": sink["records_lost"] + fb["records_lost"],
        "records_extra": sink["records_extra"] + fb["records_extra"],
        "ok": bool(
            expected
            and not problems
            and sink["records_lost"] == sink["records_extra"] == 0
            and fb["records_lost"] == fb["records_extra"] == 0
            and fb["state"]["ok"]
        ),
        "files_sink": sink,
        "files_fb": fb,
    }


def pending_plans(present: set[str], qid: str, latest_batch: int) -> set[str]:
    """The batch plans (`plans/<query>/<batch>.json`, stored before Spark publishes a batch's offsets)
    of batches after the query's latest checkpoint: Spark planned them and may run them again, so they
    stay, permanent, until a checkpoint covers them (a plan at or below it is a stray)."""
    from spark_statebackend.engine.blobs import blob_segment

    prefix = f"plans/{blob_segment(qid)}/"
    batches = {b: b[len(prefix) :].split(".")[0] for b in present if b.startswith(prefix)}
    return {b for b, n in batches.items() if n.isdigit() and int(n) > latest_batch}


def check_blobs(run: Chaos, store: Any, qids: dict[str, str]) -> dict[str, Any]:
    """Check 4 of the module doc, against the latest checkpoint of each query (and the plans of the
    batches after it, `pending_plans`)."""
    from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
    from spark_statebackend.engine.blobs import load_snapshot_index

    refs: set[str] = set()
    unreadable: list[str] = []
    latest_batch: dict[str, int] = {}
    with contextlib.closing(run.open_log()) as log:
        for q, qid in qids.items():
            latest = log.read_latest(qid)
            if latest is None:
                unreadable.append(f"query {q} ({qid}) has no checkpoint")
                continue
            latest_batch[qid] = latest.batch_id
            for m in latest.markers(BLOBSTORE_BACKEND).values():
                try:
                    refs |= {m, *load_snapshot_index(store, m).dir_index.present_blob_ids()}
                except Exception as e:  # reported, and fails the check
                    unreadable.append(f"{m}: {e}")
    present = {b.blob_id for b in store.list("")}
    pending: set[str] = set().union(*(pending_plans(present, qid, n) for qid, n in latest_batch.items()))
    keep = refs | pending
    missing = sorted(refs - present)
    with_ttl = sorted(b for b in keep & present if store.stat(b).expires_at_ms is not None)
    others = [b for b in present if b not in keep and not b.startswith("queries/")]
    permanent_strays = sorted(b for b in others if store.stat(b).expires_at_ms is None)
    gc = run_gc(run)
    deleted_referenced = sorted(keep - {b.blob_id for b in store.list("")})
    past_every_ttl_ms = int(time.time() * 1000) + 30 * 86400 * 1000  # blobTtl is at most days
    swept = store.sweep_expired(now_ms=past_every_ttl_ms)
    left = {b.blob_id for b in store.list("") if not b.blob_id.startswith("queries/")}
    ok = not (unreadable or missing or with_ttl or permanent_strays or deleted_referenced) and left == keep
    return {
        "ok": ok,
        "referenced": len(refs),
        "pending_plans": len(pending),
        "present_before_gc": len(present),
        "unreadable_indexes": unreadable[:10],
        "referenced_missing": missing[:10],
        "referenced_with_ttl": with_ttl[:10],
        "unreferenced_permanent": len(permanent_strays),
        "unreferenced_permanent_first": permanent_strays[:10],
        "unreferenced_with_ttl": len(others) - len(permanent_strays),
        "gc": gc,
        "gc_deleted_referenced": deleted_referenced[:10],
        "swept_after_ttl": swept,
        "left_unreferenced": sorted(left - keep)[:10],
        "left_missing": sorted(keep - left)[:10],
    }


def run_gc(run: Chaos) -> dict[str, Any]:
    """`spark-statebackend gc --grace 0s` on the run's store and log, as an operator would run it."""
    cmd = [
        sys.executable, "-c", "from spark_statebackend.cli import main; main()", "-q", "gc",
        "--blob-url", run.blob_url, "--log", run.log_url, "--grace", "0s", "--json",
        *(a for k, v in {**BLOB_OPTIONS, **run.s3.options()}.items() for a in ("--option", f"{k}={v}")),
        *(a for k, v in LOG_OPTIONS.items() for a in ("--log-option", f"{k}={v}")),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=run.app_env(), capture_output=True, text=True, timeout=900)
    try:
        report: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"exit": proc.returncode, "stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    keep = ("blobs_scanned", "referenced", "deleted", "kept_for_grace", "kept_other")
    out = {k: report.get(k) for k in keep}
    out["exit"] = proc.returncode
    problems = report.get("problems") or []
    out["problems"] = len(problems)
    out["first_problems"] = problems[:3]
    return out


def passed(report: dict[str, Any]) -> bool:
    out = report.get("output", {})
    return bool(
        not report.get("incidents")
        and out.get("records_lost") == 0
        and out.get("records_extra") == 0
        and out.get("first_mismatch") is None
        and out.get("records_compared", 0) > 0
        and report.get("files", {}).get("ok")
        and report.get("blobs", {}).get("ok")
    )


# ---- command line ------------------------------------------------------------------------------


def _gap(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    return float(lo), float(hi or lo)


def parse_args(argv: list[str] | None = None) -> Options:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the chaos phase (default 30)")
    ap.add_argument("--seed", type=int, help="fixes the fault plan (default: a random one, reported)")
    ap.add_argument("--min-faults", type=int, default=0, help="go on past --minutes until this many faults")
    ap.add_argument("--gap", type=_gap, default=(2.0, 12.0), help="MIN:MAX seconds between faults")
    ap.add_argument("--work", type=Path, help="default: chaos-results/seed-<seed>-<time>")
    ap.add_argument("--s3", choices=("seaweedfs", "moto"), default="seaweedfs")
    ap.add_argument("--stall-limit", type=float, default=300.0, help="seconds without a batch = stuck")
    ap.add_argument("--no-verify-restart", dest="verify_restart", action="store_false")
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--report", type=Path, help="default: <work>/chaos-report.json")
    ap.add_argument(
        "--cluster",
        choices=("local", "rig"),
        default="local",
        help="local-cluster (default) or the multi-host rig (root; adds host_loss, durableCommit=true)",
    )
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1_000_000)
    work = a.work or ROOT / "chaos-results" / f"seed-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Options(
        seed=seed, minutes=a.minutes, work=work.resolve(), min_faults=a.min_faults, s3=a.s3, gap=a.gap,
        stall_limit=a.stall_limit, verify_restart=a.verify_restart, trigger_ms=a.trigger_ms, report=a.report,
        cluster=a.cluster,
    )  # fmt: skip


def write_report(report: dict[str, Any], opts: Options) -> Path:
    path = opts.report or opts.work / "chaos-report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    return path


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    # SIGTERM (make interrupted, a CI timeout) unwinds like Ctrl-C: the servers and drivers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = Chaos(opts).run()
    path = write_report(report, opts)
    brief = {k: v for k, v in report.items() if k not in ("fault_log", "incidents")}
    brief["incidents"] = [{k: i[k] for k in ("kind", "at_s", "what")} for i in report["incidents"]]
    print(json.dumps(brief, indent=2, default=str))
    print(f"report: {path}; {'PASSED' if report['passed'] else 'FAILED'} (seed {opts.seed})")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
