"""`make demo`: the main job on the embedded defaults (local-directory blob store, file checkpoint log).

1. Runs a windowed aggregation (rate source) with spark-statebackend; every batch is backed up.
2. Kills the driver with SIGKILL mid-stream, once a few checkpoints are durable.
3. Wipes the local state: the checkpoint location, Spark's local dirs, the spool.
4. Restarts the same job: the driver rebuilds its checkpoint location and the executors restore the
   state from the blob store; the job continues to the last batch.
5. Runs the same job on Spark's own provider without interruption and compares the results.

Prints the state size, the restore time, and whether the results match.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

LAST_BATCH = 12
KILL_AFTER_CHECKPOINT = 5


def _app(work: Path, until: int, *, plain: bool = False) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "spark_statebackend.demo_app",
        "--shape",
        "window",
        "--work",
        str(work),
        "--until-batch",
        str(until),
    ]
    return [*cmd, "--plain"] if plain else cmd


def _result(work: Path) -> list[list[int]]:
    state: dict[tuple[int, int], list[int]] = {}
    for p in sorted((work / "out").glob("*.json"), key=lambda p: int(p.stem)):
        if int(p.stem) <= LAST_BATCH:
            for row in json.loads(p.read_text()):
                state[(row[0], row[1])] = row
    return sorted(state.values())


def _latest_batch(work: Path) -> int:
    from .checkpoints.logs import open_checkpoint_log

    log_dir = work / "log"
    if not log_dir.is_dir():
        return -1
    cplog = open_checkpoint_log(log_dir.as_uri())
    best = -1
    for q in log_dir.iterdir():
        if q.is_dir():
            cp = cplog.read_latest(q.name)
            best = max(best, cp.batch_id if cp else -1)
    return best


def _state_bytes(work: Path) -> tuple[int, int]:
    from .checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
    from .checkpoints.logs import open_checkpoint_log
    from .engine.blobs import load_snapshot_index
    from .stores import open_blob_store

    store = open_blob_store((work / "blobs").as_uri())
    cplog = open_checkpoint_log((work / "log").as_uri())
    total = files = 0
    for q in (work / "log").iterdir():
        cp = cplog.read_latest(q.name) if q.is_dir() else None
        for key, marker in cp.markers(BLOBSTORE_BACKEND).items() if cp else ():
            if key != DRIVER_STORE:
                idx = load_snapshot_index(store, marker).dir_index
                total += idx.total_size()
                files += idx.file_count()
    return total, files


def main() -> int:
    work = Path(os.environ.get("SSB_DEMO_DIR", "work/demo")).absolute()
    shutil.rmtree(work, ignore_errors=True)
    run, ref = work / "run", work / "reference"
    print(f"spark-statebackend demo in {work}")

    print(f"[1/5] running a windowed aggregation with blob-store backup of every batch ({run})")
    proc = subprocess.Popen(
        _app(run, 10_000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while _latest_batch(run) < KILL_AFTER_CHECKPOINT:
        if proc.poll() is not None or time.monotonic() > deadline:
            print("error: the job stopped or stalled before its checkpoints became durable", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"[2/5] batch {_latest_batch(run)} is durable; killing the driver with SIGKILL")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)

    print("[3/5] wiping local state: checkpoint location, Spark local dirs, spool")
    for name in ("ckpt", "local", "spool"):
        shutil.rmtree(run / name, ignore_errors=True)

    print(
        "[4/5] restarting: the driver rebuilds its checkpoint location, executors restore from the blob store"
    )
    t0 = time.monotonic()
    done = subprocess.run(_app(run, LAST_BATCH), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        return 1
    restart_s = time.monotonic() - t0
    logs = "".join(p.read_text() for p in (run / "spool").rglob("sidecar.log"))
    restores = [
        float(s) for s in re.findall(r"restore indexes/\S+ \(store \d+/\d+/\S+\) into .* in ([0-9.]+)s", logs)
    ]
    size, files = _state_bytes(run)

    print(f"[5/5] reference: the same job on Spark's own provider, uninterrupted, to batch {LAST_BATCH}")
    ref_run = subprocess.run(_app(ref, LAST_BATCH, plain=True), capture_output=True, text=True, timeout=600)
    if ref_run.returncode != 0:
        print(ref_run.stderr[-4000:], file=sys.stderr)
        return 1
    match = _result(run) == _result(ref)
    print()
    print(f"state size (latest checkpoint): {size} bytes in {files} files")
    print(
        f"state store restores: {len(restores)}, longest {max(restores, default=0.0) * 1000:.0f} ms, "
        f"total {sum(restores) * 1000:.0f} ms; restart to batch {LAST_BATCH} took {restart_s:.1f} s"
    )
    print(f"results match an uninterrupted run: {match}")
    return 0 if match and restores else 1


if __name__ == "__main__":
    sys.exit(main())
