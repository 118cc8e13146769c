"""A driver killed with -9 at any moment on a remote checkpoint location loses nothing (issue 22 item 2).

Real Spark (local[2]) running tests/apps/files_job.py (a file source, files arriving while it runs,
dropDuplicates on `id`, a sink that skips a batch id it wrote and keeps what a re-run produced) on the
location `objfs://bucket/ckpt`: the object-store-like Hadoop file system of tests/stubs/
ObjectStoreFileSystem.java, as tests/spark/test_remote_location.py sets it up, with the backend's
defaults (durableCommit on). Spark's metadata is in the location; each store's files are in the host's
mirror, backed up to the blob store.

The driver's whole process group (Python, its JVM and the sidecar) is killed with SIGKILL at a seeded
random moment after Spark's commit of a batch shows in the location: nothing waits for our checkpoint.
On the same host the kill waits further for a batch whose output is written and whose commit is not
(a sink that ends slowly), so the restart runs a batch again whose state versions were already
committed and uploaded; on the new host a slow listener holds the checkpoint log back, so the stores
usually come from the upload reports of versions no checkpoint holds (each test prints where Spark's
logs and the checkpoint log stood at the kill). Then the job restarts, on the same host (mirror, spool
and Spark's local dir kept) or on a new one (only the location, the blob store and the checkpoint log
left), with more files and a file re-sending ids the query had already seen, and runs to the end.
Every id must reach the sink exactly once (a re-sent id that comes out again means state was lost), a
batch Spark runs again must produce what it produced the first time, and Spark's `offsets/` and
`commits/` entries must be left exactly as Spark wrote them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from spark_statebackend.spark.location import latest_commit, latest_entry
from tests.demorig import durable_batch
from tests.servers.process import wait_until
from tests.spark.test_remote_location import (  # noqa: F401 - objfs is a fixture
    LOCATION,
    STATE_FILE,
    objfs,
    objfs_conf,
    remote_files,
)
from tests.system.test_exactly_once import IDS_PER_FILE, add_files, run_job, sink_ids, spark_logs, start_job

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

#: The kill moments are drawn from this seed (set SSB_KILL_SEED to try others); failures name it.
SEED = int(os.environ.get("SSB_KILL_SEED", "22"))
#: The first file number of the files a restart adds (the feeder stays well below it).
LATE = 500


def remote_root(work: Path) -> Path:
    """Where ObjectStoreFileSystem keeps the location `objfs://bucket/ckpt` (fs.objfs.root=<work>/objfs)."""
    return work / "objfs" / "bucket" / "ckpt"


def job_args(work: Path, jar: Path) -> list[str]:
    """files_job's arguments for the remote location: the same Spark conf as test_remote_location's."""
    args = ["--checkpoint-location", LOCATION]
    for k, v in objfs_conf(work, jar).items():
        args += ["--conf", f"{k}={v}"]
    return args


@contextmanager
def arriving_files(work: Path, first: int, every: float = 0.4, most: int = 40) -> Iterator[set[int]]:
    """Files first, first+1, ... (at most `most`) dropped into the input one per `every` seconds on a
    thread while the body runs, as files arrive at a running job; yields the set of their ids, complete
    on exit. Few files: with more than Spark's minBatchesToRetain (100) batches Spark itself would delete
    the oldest `offsets/` and `commits/` entries the test compares."""
    ids: set[int] = set()
    stop = threading.Event()

    def feed() -> None:
        n = first
        while n < first + most and not stop.wait(every):  # the arrival rate, not a synchronisation
            ids.update(add_files(work, n, 1))
            n += 1

    feeder = threading.Thread(target=feed, name="arriving-files", daemon=True)
    feeder.start()
    try:
        yield ids
    finally:
        stop.set()
        feeder.join(10)
        assert not feeder.is_alive(), "the file feeder did not stop"


def kill_at_random_moment(
    proc: subprocess.Popen[str], work: Path, after: int, rng: random.Random, *, rerun: bool
) -> float:
    """SIGKILL to the job's whole process group (its JVM and sidecars) a random 0-1.5 s after Spark's
    commit of batch `after` shows in the location, with `rerun` at the first moment after that when a
    batch is left to run again (`rerun_pending`); the delay drawn. Nothing waits for a checkpoint."""
    try:
        wait_until_committed(proc, work, after)
        delay = rng.uniform(0.0, 1.5)
        time.sleep(delay)  # the kill moment, drawn at random: not a synchronisation
        if rerun:
            wait_until(
                lambda: rerun_pending(work) is not None or proc.poll() is not None, 120, "a batch to re-run"
            )
            assert proc.poll() is None, f"the job ended early:\n{proc.stdout.read() if proc.stdout else ''}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # SIGKILL is delivered at once, but a JVM takes a moment to be torn down after it
    group = proc.pid
    wait_until(lambda: not [p for p in psutil.process_iter() if _alive_in_group(p, group)], 60, "the kill")
    return delay


def _alive_in_group(p: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(p.pid) == group and p.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def rerun_pending(work: Path) -> int | None:
    """The batch Spark planned whose output the sink wrote but whose commit Spark has not written: the
    batch a restart runs again (the sink then reads it whole and skips it); None if there is none."""
    planned = latest_entry(remote_root(work), "offsets")
    written = (work / "out" / f"{planned}.json").exists()
    return planned if written and latest_commit(remote_root(work)) < planned else None


def wait_until_committed(proc: subprocess.Popen[str], work: Path, batch: int) -> None:
    wait_until(
        lambda: latest_commit(remote_root(work)) >= batch or proc.poll() is not None,
        300,
        f"Spark's commit of batch {batch} in the remote location",
    )
    assert proc.poll() is None, f"the job ended early:\n{proc.stdout.read() if proc.stdout else ''}"


def resend_file(work: Path) -> set[int]:
    """A late file with every id of file 0 (seen before the kill) and IDS_PER_FILE new ones; the new ids.
    Dedup state that survived keeps the old ids out of the sink; state rebuilt from scratch lets them
    through a second time."""
    old = [json.loads(line)["id"] for line in (work / "in" / "000.json").read_text().splitlines()]
    new = [(LATE + 99) * 1000 + i for i in range(IDS_PER_FILE)]
    tmp = work / "in" / ".resend.tmp"
    tmp.write_text("".join(json.dumps({"id": r}) + "\n" for r in old + new))
    tmp.replace(work / "in" / f"{LATE + 99}.json")
    return set(new)


def rerun_mismatches(work: Path) -> list[str]:
    """The re-runs (files_job's `reruns/<batch>.<n>.json`) whose ids differ from their batch's output."""
    out = work / "out"
    return [
        p.name
        for p in sorted((work / "reruns").glob("*.json"))
        if json.loads(p.read_text()) != json.loads((out / f"{p.name.split('.')[0]}.json").read_text())
    ]


def assert_nothing_lost(work: Path, ids: set[int], before: dict[str, bytes], context: str) -> None:
    """Every id in the sink exactly once, re-runs equal to the first runs, Spark's entries untouched,
    the last batch checkpointed and no state file in the location."""
    after = spark_logs(remote_root(work))
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, f"recovery deleted or rewrote entries Spark wrote: {changed}; {context}"
    got = sink_ids(work)
    dupes = sorted({i for i in got if got.count(i) > 1})
    lost = sorted(ids - set(got))
    assert not lost and not dupes, (
        f"lost {len(lost)} ids (e.g. {lost[:5]}), duplicated {len(dupes)} (e.g. {dupes[:5]}); {context}"
    )
    differ = rerun_mismatches(work)
    assert not differ, f"batches run again produced other ids than their first run: {differ}; {context}"
    assert durable_batch(work) == latest_commit(remote_root(work)), context
    assert not [f for f in remote_files(work) if STATE_FILE.search(f)], "state files reached the location"


def first_run_killed(
    work: Path, jar: Path, rng: random.Random, *extra: str, rerun: bool = False
) -> tuple[set[int], str]:
    """Run the job on the remote location with files arriving, kill it with -9 after Spark's commit of
    batch 3 (kill_at_random_moment); the ids dropped in and what the kill left (for failure messages)."""
    ids = add_files(work, 0, 2)
    proc = start_job(work, *job_args(work, jar), *extra)
    try:  # files arrive once the query runs (not during Spark's start), so its batches stay few
        wait_until_committed(proc, work, 0)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise
    with arriving_files(work, 2) as arrived:
        delay = kill_at_random_moment(proc, work, 3, rng, rerun=rerun)
    root = remote_root(work)
    context = (
        f"seed {SEED}: killed {delay:.2f} s after commit 3 with Spark's commits at "
        f"{latest_commit(root)}, its offsets at {latest_entry(root, 'offsets')}, the checkpoint log at "
        f"{durable_batch(work)}"
    )
    print(context)  # shown with the output of a failed test
    return ids | arrived, context


def test_a_kill_at_any_moment_then_a_restart_on_the_same_host(tmp_path: Path, objfs: Path) -> None:  # noqa: F811
    """Killed once a batch's output is written and before Spark's commit of it (a sink that ends
    slowly), its state versions already committed into the mirror and uploaded: the restart on the
    same host runs that batch again, on the state before it, and then the rest."""
    work = tmp_path
    ids, context = first_run_killed(work, objfs, random.Random(SEED), "--sink-pause", "0.5", rerun=True)
    pending = rerun_pending(work)
    assert pending is not None, f"no batch left to run again; {context}"
    before = spark_logs(remote_root(work))
    ids |= add_files(work, LATE, 2) | resend_file(work)

    out = run_job(work, "--available-now", *job_args(work, objfs))

    assert_nothing_lost(work, ids, before, f"{context}\n{out[-2000:]}")
    assert (work / "reruns" / f"{pending}.0.json").exists(), f"batch {pending} was not run again; {context}"


def test_a_kill_at_any_moment_then_a_restart_on_a_new_host(tmp_path: Path, objfs: Path) -> None:  # noqa: F811
    """The same kill while the checkpoint log lags behind Spark's commits (a user's listener taking
    1 s per event), then a restart with the mirror, the spool and Spark's local dir wiped: the stores
    come back from the blob store (a checkpoint or the upload reports of the versions after it)."""
    work = tmp_path
    ids, context = first_run_killed(work, objfs, random.Random(SEED + 1), "--slow-listener", "1.0")
    before = spark_logs(remote_root(work))
    for name in ("mirrors", "spool", "local"):  # a new host: only the location and the services remain
        shutil.rmtree(work / name)
    ids |= add_files(work, LATE, 2) | resend_file(work)

    out = run_job(work, "--available-now", *job_args(work, objfs))

    assert_nothing_lost(work, ids, before, f"{context}\n{out[-2000:]}")
    logs = "".join(p.read_text() for p in (work / "spool").glob("*/driver/sidecar.log"))
    assert "restored query" in logs, f"no store was restored on the new host; {context}"
