"""What an idle sidecar costs, and how soon it starts an upload once the JVM hands one over (issue 23).

A real sidecar process (`python -m spark_statebackend.runtime.sidecar`, started the way the plugin
starts one, with file:// blob store and checkpoint log) serves an empty spool dir:
- idle CPU: its utime + stime (/proc/<pid>/stat) over SSB_IDLE_SECONDS (default 60) after a short
  warm-up, as a percentage of one core, and its threads' context switches per second (how often it
  wakes up at all);
- wake latency: SSB_IDLE_EVENTS (default 100) snapshot events, one at a time, each written the way the
  JVM writes one (a hidden temporary renamed into events/) after the sidecar has been idle for a
  moment, timed from that rename to the sidecar claiming the event (its rename into events/claimed/,
  the first thing an upload turn does; seen here with inotify), and to the upload's end (its staged
  dir deleted).

SSB_IDLE_SIDECAR_ROOT runs the sidecar from another checkout's root (a before/after comparison on the
same machine at the same time). Figures are printed, never asserted.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import inotify_simple
import orjson

from spark_statebackend.runtime import spool as sp
from spark_statebackend.settings import PREFIX

ROOT = Path(__file__).resolve().parent.parent
QUERY_ID = "5f0c3e0e-8a4b-4f34-9d59-0d6f1c3a9b21"


def _cpu_ticks(pid: int) -> int:
    """utime + stime of process `pid`, in clock ticks (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def _context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of `pid` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
    return total


def _wait_for(what: str, cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.001)


def _start_sidecar(work: Path) -> tuple[subprocess.Popen[bytes], sp.Spool, Path]:
    spool = sp.Spool(work / "spool")
    spool.dir.mkdir(parents=True, mode=0o700)
    ckpt = work / "ckpt"
    ckpt.mkdir()
    (ckpt / "metadata").write_text(orjson.dumps({"id": QUERY_ID}).decode() + "\n")
    conf = {
        PREFIX + "blobStore.url": (work / "blobs").as_uri(),
        PREFIX + "blobStore.options.fsync": "false",
        PREFIX + "checkpointLog.url": (work / "log").as_uri(),
        PREFIX + "checkpointLog.options.fsync": "false",
        "spark.app.id": "app-idle-bench",
    }
    conf_file = spool.dir / sp.SIDECAR_CONF
    sp.atomic_write_json(conf_file, conf, fsync=False)
    with open(spool.dir / sp.SIDECAR_LOG, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                sp.SIDECAR_MODULE,
                "--spool-dir",
                str(spool.dir),
                "--executor-id",
                "driver",
                "--conf",
                str(conf_file),
                "--jvm-pid",
                str(os.getpid()),
            ],
            cwd=os.environ.get("SSB_IDLE_SIDECAR_ROOT", str(ROOT)),  # `-m` imports from there
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    _wait_for("the sidecar's marker", lambda: (spool.dir / sp.SIDECAR_MARKER).exists())
    return proc, spool, ckpt


def _event(ckpt: Path, version: int) -> tuple[dict[str, Any], Path]:
    """A snapshot event of store 0/0/default `version` and its staged dir (what the shim stages)."""
    staged = ckpt / "_statebackend/staging/app/0/0/default" / f"{version}-{uuid.uuid4().hex[:8]}"
    staged.mkdir(parents=True)
    (staged / f"{version}.zip").write_bytes(os.urandom(4096))
    doc = {
        "schema_version": sp.SCHEMA_VERSION,
        "type": "snapshot",
        "query_id": QUERY_ID,
        "batch_id": version - 1,
        "checkpoint_root": str(ckpt),
        "dfs_dir": str(ckpt / "state/0/0"),
        "operator": 0,
        "partition": 0,
        "store": "default",
        "version": version,
        "spark_unique_id": None,
        "snapshot_version": version,
        "changelog_versions": [],
        "staged_dir": str(staged),
        "files": [f"{version}.zip"],
        "executor_id": "driver",
        "created_at_ms": int(time.time() * 1000),
        "stage_nanos": 1,
    }
    return doc, staged


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_idle(pid: int, seconds: float) -> dict[str, float]:
    ticks = os.sysconf("SC_CLK_TCK")
    cpu0, ctx0, t0 = _cpu_ticks(pid), _context_switches(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, ctx1, t1 = _cpu_ticks(pid), _context_switches(pid), time.monotonic()
    elapsed = t1 - t0
    return {
        "idle_seconds": elapsed,
        "idle_cpu_percent_of_a_core": 100.0 * (cpu1 - cpu0) / ticks / elapsed,
        "idle_context_switches_per_second": (ctx1 - ctx0) / elapsed,
    }


def measure_latency(spool: sp.Spool, ckpt: Path, events: int) -> dict[str, float]:
    claim_ms: list[float] = []
    upload_ms: list[float] = []
    with inotify_simple.INotify() as watch:
        watch.add_watch(spool.events_dir, inotify_simple.flags.MOVED_FROM)
        for version in range(1, events + 1):
            time.sleep(random.uniform(0.05, 0.25))  # the sidecar is idle, blocked in its wait
            doc, staged = _event(ckpt, version)
            name = f"{sp.new_file_stem()}.json"
            t0 = time.perf_counter()
            sp.atomic_write_bytes(spool.events_dir / name, orjson.dumps(doc), fsync=False)
            claimed = False
            while not claimed:
                found = watch.read(timeout=30_000)
                if not found:
                    raise TimeoutError(f"event {name} was not claimed within 30 s")
                claimed = any(e.name == name for e in found)
            claim_ms.append((time.perf_counter() - t0) * 1000)
            _wait_for(f"the upload of version {version}", lambda s=staged: not s.exists())
            upload_ms.append((time.perf_counter() - t0) * 1000)
    return {
        "events": float(events),
        "claim_latency_ms_p50": statistics.median(claim_ms),
        "claim_latency_ms_p99": _percentile(claim_ms, 0.99),
        "claim_latency_ms_max": max(claim_ms),
        "upload_done_ms_p50": statistics.median(upload_ms),
        "upload_done_ms_p99": _percentile(upload_ms, 0.99),
    }


def main() -> dict[str, float]:
    idle_seconds = float(os.environ.get("SSB_IDLE_SECONDS", "60"))
    events = int(os.environ.get("SSB_IDLE_EVENTS", "100"))
    work = Path(tempfile.mkdtemp(prefix="ssb-idle-"))
    proc, spool, ckpt = _start_sidecar(work)
    try:
        time.sleep(3.0)  # warm-up: imports done, the loops' first turns over
        out = measure_idle(proc.pid, idle_seconds)
        out.update(measure_latency(spool, ckpt, events))
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    for key, value in main().items():
        print(f"  {key:40} {value:14.3f}")
