"""Mirrors of remote checkpoint locations are cleaned up on their hosts (issue 22 item 2): what a JVM
of an application with the plugin removes from `spark.statebackend.mirrorDir` at its start
(jvm-bridge MirrorCleaner), and what it must keep.

One real driver (spark-submit, the built jar, local master) starts on a mirror dir planted with
mirror roots as dead JVMs leave them; the cleaner runs on its own thread at plugin start, and the
driver waits for that thread before it stops. A root held by a live process is held by a real other
process: Java's FileChannel locks are POSIX record locks (fcntl) on Linux, so a Python process with
`fcntl.lockf` on the root's lock file holds the same lock a JVM would. A second driver runs a real
stateful query on a remote location (the object store stub of test_remote_location.py) and shows
that a JVM using a mirror holds its lock, so no cleaner can take it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_statebackend.spark import jar_path
from tests.jobrig import OBJFS_CLASS, PLUGIN, backend_conf, job_env, objfs_jar, pyspark_home
from tests.servers.process import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

DAY = 24 * 3600.0
LOCK_FILE = "mirror.lock"  # MirrorLock.FILE
REMOVED_MARK = b"removed\n"  # MirrorLock.REMOVED: written into a root's lock file before its move
CLEANER_THREAD = "statebackend-mirror-clean"  # MirrorCleaner.THREAD_NAME

#: The driver: starts a session (the plugin starts the cleaner), waits for the cleaner's thread to end.
DRIVER = f"""
import json, sys
from pyspark.sql import SparkSession
b = SparkSession.builder.appName("ssb-mirror-cleanup")
for k, v in json.loads(sys.argv[1]).items():
    b = b.config(k, v)
spark = b.getOrCreate()
for t in spark.sparkContext._jvm.java.lang.Thread.getAllStackTraces().keySet().toArray():
    if t.getName() == "{CLEANER_THREAD}":
        t.join(300000)
print("CLEANER-DONE", flush=True)
spark.stop()
"""

#: The driver of a query on a remote location: runs until batch 1 is done, says so, waits for `release`.
QUERY_DRIVER = """
import json, os, sys, time
from pyspark.sql import SparkSession
conf, location, release = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
b = SparkSession.builder.appName("ssb-mirror-in-use")
for k, v in conf.items():
    b = b.config(k, v)
spark = b.getOrCreate()
counts = spark.readStream.format("rate").option("rowsPerSecond", 5).load().groupBy().count()
q = (counts.writeStream.format("noop").outputMode("complete").option("checkpointLocation", location)
     .trigger(processingTime="200 milliseconds").start())
deadline = time.monotonic() + 240
while (q.lastProgress or {}).get("batchId", -1) < 1:
    assert q.exception() is None and time.monotonic() < deadline, q.exception()
    time.sleep(0.1)
print("USING", flush=True)
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)
q.stop()
spark.stop()
"""

#: A live process other than a JVM holding a mirror root's shared lock until its stdin closes.
HOLDER = """
import fcntl, sys
f = open(sys.argv[1], "rb")
fcntl.lockf(f, fcntl.LOCK_SH)
print("LOCKED", flush=True)
sys.stdin.read()
"""


def root_name(location: str) -> str:
    """A location's mirror root name: RemoteLocations.mirrorRoot, the first 32 hex of its sha256."""
    return hashlib.sha256(location.encode()).hexdigest()[:32]


def set_age(top: Path, age_seconds: float) -> None:
    """Every path under `top` (and `top`) last modified `age_seconds` ago, links themselves only."""
    when = time.time() - age_seconds
    for p in [top, *top.rglob("*")]:
        os.utime(p, (when, when), follow_symlinks=False)


def plant(mirrors: Path, location: str, *, lock_file: bool = True) -> Path:
    """A mirror root as a JVM of `location` leaves it at its exit: its `location` file, a store's
    files and (unless `lock_file` is false, as before this change) its lock file."""
    root = mirrors / root_name(location)
    store = root / "state" / "0" / "0"
    (store / "SSTs").mkdir(parents=True)
    for d in (mirrors, root, root / "state", root / "state" / "0", store):
        d.chmod(0o700)
    (root / "location").write_text(f"{location}\n")
    (store / "1.zip").write_bytes(b"z" * 1000)
    (store / "SSTs" / "000001-x.sst").write_bytes(b"s" * 3000)
    if lock_file:
        (root / LOCK_FILE).touch()
    return root


@dataclass
class Planted:
    work: Path
    roots: dict[str, Path]
    outside: Path
    explicit_staging: Path
    output: str


OLD, OLD_NO_LOCK, HELD, PENDING, YOUNG, LINKED, STAGED_ELSEWHERE, TOP_LINK = (
    "objfs://bucket/old",
    "objfs://bucket/old-no-lock-file",
    "objfs://bucket/held",
    "objfs://bucket/pending",
    "objfs://bucket/young",
    "objfs://bucket/linked",
    "objfs://bucket/staged-elsewhere",
    "objfs://bucket/top-level-link",
)


def _plant_all(work: Path) -> Planted:
    mirrors = work / "mirrors"
    outside = work / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "precious").write_text("not the mirror's")
    (outside / "precious.zip").write_text("not the mirror's either")
    roots = {loc: plant(mirrors, loc) for loc in (OLD, HELD, PENDING, YOUNG, LINKED, STAGED_ELSEWHERE)}
    roots[OLD_NO_LOCK] = plant(mirrors, OLD_NO_LOCK, lock_file=False)
    # A version staged and not yet uploaded (durableCommit=false: Spark committed it already).
    staged = roots[PENDING] / "_statebackend" / "staging" / "app-1" / "0" / "0" / "default" / "2-0a1b2c3d"
    staged.mkdir(parents=True)
    (staged / "2.zip").write_bytes(b"p" * 10)
    # Links planted in a mirror, to a dir and a file outside it.
    (roots[LINKED] / "state" / "0" / "1").symlink_to(outside / "dir", target_is_directory=True)
    (roots[LINKED] / "state" / "0" / "0" / "2.zip").symlink_to(outside / "precious.zip")
    # Staged under an explicit stagingDir the root's JVMs recorded.
    explicit = work / "explicit-staging"
    (explicit / "app-2" / "0" / "0" / "default" / "3-0a1b2c3d").mkdir(parents=True)
    (explicit / "app-2" / "0" / "0" / "default" / "3-0a1b2c3d" / "3.zip").write_bytes(b"e")
    records = roots[STAGED_ELSEWHERE] / "staging-dirs"
    records.mkdir(mode=0o700)
    (records / hashlib.sha256(str(explicit).encode()).hexdigest()[:32]).write_text(f"{explicit}\n")
    for loc, root in roots.items():
        set_age(root, 3600 if loc == YOUNG else 30 * DAY)
    # A "root" that is a symlink to a dir outside: never entered.
    (outside / "as-root").mkdir()
    (outside / "as-root" / "precious").write_text("kept")
    (mirrors / root_name(TOP_LINK)).symlink_to(outside / "as-root", target_is_directory=True)
    # A tombstone a cleaner stopped while deleting.
    (mirrors / ".removing-0123-crashed" / "state").mkdir(parents=True)
    return Planted(work, roots, outside, explicit, "")


def submit(work: Path, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `script` as a PySpark driver with pyspark's own spark-submit and the built jar (its output
    holds Spark's and our INFO log)."""
    path = work / f"driver-{len(list(work.glob('driver-*.py')))}.py"
    path.write_text(script)
    cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--master", "local[1]", "--jars", str(jar_path()),
           str(path), *args]  # fmt: skip
    return subprocess.run(cmd, cwd=work, env=job_env(), capture_output=True, text=True, timeout=timeout)


def base_conf(work: Path) -> dict[str, str]:
    return {
        "spark.plugins": PLUGIN,
        **backend_conf(work, mirrorDir=str(work / "mirrors"), mirrorRetention="1d"),
        "spark.statebackend.sidecar.mode": "none",
        "spark.ui.enabled": "false",
        "spark.local.dir": str(work / "local"),
    }


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planted]:
    """The planted mirror dir after one driver's start on it, with HELD's lock held meanwhile."""
    work = tmp_path_factory.mktemp("mirror-cleanup")
    work.chmod(0o700)
    p = _plant_all(work)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(p.roots[HELD] / LOCK_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "LOCKED"
        run = submit(work, DRIVER, json.dumps(base_conf(work)))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    p.output = run.stdout + run.stderr
    assert run.returncode == 0 and "CLEANER-DONE" in p.output, p.output[-4000:]
    assert "spark-statebackend: mirror cleanup of" in p.output, "the cleaner did not run at plugin start"
    yield p


def kept_line(p: Planted, location: str) -> str:
    lines = [ln for ln in p.output.splitlines() if f"of checkpoint location {location} kept: " in ln]
    assert len(lines) == 1, (location, p.output[-4000:])
    return lines[0]


def test_an_old_unused_mirror_is_removed_and_logged_with_its_location_and_bytes(planted: Planted) -> None:
    for location in (OLD, OLD_NO_LOCK):
        root = planted.roots[location]
        assert not os.path.lexists(root), f"{root} ({location}) was not removed"
        line = next(ln for ln in planted.output.splitlines() if f"removed the mirror {root} " in ln)
        size = 4000 + len(f"{location}\n") + len(REMOVED_MARK)  # the store's files, `location`, the lock file
        assert f"of checkpoint location {location} ({size} bytes)" in line, line
        assert " INFO " in line, line
    assert not list((planted.work / "mirrors").glob(".removing-*")), "a tombstone was left"


def test_a_mirror_a_live_process_holds_is_kept(planted: Planted) -> None:
    assert (planted.roots[HELD] / "state" / "0" / "0" / "1.zip").is_file()
    assert "in use by a running process on this host" in kept_line(planted, HELD)


def test_a_mirror_with_a_staged_version_waiting_for_its_upload_is_kept(planted: Planted) -> None:
    root = planted.roots[PENDING]
    assert (root / "state" / "0" / "0" / "1.zip").is_file()
    assert "staged versions wait for their upload" in kept_line(planted, PENDING)


def test_a_mirror_whose_explicit_staging_dir_holds_a_staged_version_is_kept(planted: Planted) -> None:
    assert (planted.roots[STAGED_ELSEWHERE] / "state" / "0" / "0" / "1.zip").is_file()
    line = kept_line(planted, STAGED_ELSEWHERE)
    assert f"the staging dir {planted.explicit_staging} " in line, line
    assert (planted.explicit_staging / "app-2" / "0" / "0" / "default" / "3-0a1b2c3d" / "3.zip").is_file()


def test_a_young_mirror_is_kept(planted: Planted) -> None:
    assert (planted.roots[YOUNG] / "state" / "0" / "0" / "1.zip").is_file()
    assert "used within spark.statebackend.mirrorRetention" in kept_line(planted, YOUNG)


def test_a_symlink_in_a_mirror_is_not_followed(planted: Planted) -> None:
    assert not os.path.lexists(planted.roots[LINKED]), "the mirror holding the links was not removed"
    assert (planted.outside / "dir" / "precious").read_text() == "not the mirror's"
    assert (planted.outside / "precious.zip").read_text() == "not the mirror's either"
    link = planted.work / "mirrors" / root_name(TOP_LINK)
    assert link.is_symlink() and (planted.outside / "as-root" / "precious").read_text() == "kept"


# -- a JVM using a mirror holds its lock --------------------------------------------------------------


def test_a_jvm_running_a_query_on_a_remote_location_holds_its_mirror(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """While the driver's query runs, its mirror root's lock cannot be taken exclusively (as a cleaner
    of another JVM would try), the JVM stamped the lock file when it took its shared lock, and the root
    records the explicit stagingDir its versions are staged in."""
    work = tmp_path
    work.chmod(0o700)
    jar = objfs_jar(tmp_path_factory.mktemp("objfs"))
    location = "objfs://bucket/live"
    conf = {
        **base_conf(work),
        "spark.statebackend.stagingDir": str(work / "staging"),
        "spark.hadoop.fs.objfs.impl": OBJFS_CLASS,
        "spark.hadoop.fs.objfs.root": str(work / "objfs"),
        "spark.sql.shuffle.partitions": "1",
    }
    release = work / "release"
    script = work / "query-driver.py"
    script.write_text(QUERY_DRIVER)
    cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--master", "local[1]", "--jars", str(jar_path()),
           "--driver-class-path", str(jar), str(script), json.dumps(conf), location,
           str(release)]  # fmt: skip
    log = work / "query-driver.log"
    lock = work / "mirrors" / root_name(location) / LOCK_FILE
    started = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=job_env(), stdout=out, stderr=subprocess.STDOUT)
        try:

            def using() -> bool:
                assert proc.poll() is None, log.read_text()[-4000:]
                return "USING" in log.read_text()

            wait_until(using, 240, "the query's second batch")
            assert lock.stat().st_mtime >= started - 1, "the JVM did not stamp the lock file"
            records = list((lock.parent / "staging-dirs").iterdir())  # for the cleaner: see above
            assert [r.read_text() for r in records] == [f"{work / 'staging'}\n"], records
            with open(lock, "r+b") as f, pytest.raises(OSError) as refused:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert refused.value.errno in (errno.EAGAIN, errno.EACCES)
        finally:
            release.touch()
            proc.wait(timeout=120)
    assert proc.returncode == 0, log.read_text()[-4000:]
    with open(lock, "r+b") as f:  # the JVM is gone, and its lock with it
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
