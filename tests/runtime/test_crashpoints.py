"""Crash points without Spark: the real sidecar process is kill -9'd at each step of the commit and
restore lifecycle (spark.statebackend.test.crashAt), a new sidecar takes over, and nothing is lost or
leaked.

The test plays the JVM: for each batch it writes a store version per partition into the store's
checkpoint dir, stages it (hard links) and publishes its snapshot event, then writes the batch's
progress event, exactly as the shim and ProgressSpoolListener do (spool.py). One sidecar process
(`python -m spark_statebackend.runtime.sidecar`, executor id `driver`, as in local mode: uploads, restores and
the committer) serves the spool dir. After every batch the test waits until that batch is
checkpointed or the sidecar died; after a death it starts a new sidecar with the same conf (the
crash point fires once per application, so it does not fire again), which must finish its
predecessor's claimed work. At the end, every checkpointed snapshot restores to exactly what was
staged, the spool and staging dirs are empty, and the blob store holds exactly what the retained
checkpoint references (anything else carries a TTL; GC removes none of the referenced blobs, and
after GC and the TTL sweep only they are left).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.common import crashpoints
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.errors import ConfigError
from spark_statebackend.lifecycle.gc import GarbageCollector
from spark_statebackend.runtime import spool as sp
from spark_statebackend.settings import PREFIX, Settings
from spark_statebackend.stores import LocalBlobStore
from tests.paths import ROOT
from tests.servers.process import wait_until
from tests.servers.s3 import S3Server
from tests.trees import read_tree, restored_as

APP = "app-test"
PARTITIONS = (0, 1)
BATCHES = 4  # batches 0..3: state versions 1..4
SIDECAR_TIMEOUT = 60.0


# ---------------------------------------------------------------------------------------------- spec


def test_spec_grammar() -> None:
    specs = crashpoints.parse_spec("during_file_upload@3/sidecar-0, after_staging/jvm,during_restore")
    assert specs == (
        crashpoints.CrashSpec("during_file_upload", 3, "sidecar-0"),
        crashpoints.CrashSpec("after_staging", 1, "jvm"),
        crashpoints.CrashSpec("during_restore", 1, None),
    )
    assert specs[0].matches("sidecar-0") and not specs[0].matches("sidecar-1")
    assert specs[1].matches("jvm-driver") and not specs[1].matches("driver")
    assert crashpoints.CrashSpec("during_cleanup", 1, "sidecar").matches("sidecar-driver")
    assert crashpoints.parse_spec("") == ()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("during_upload", "unknown crash point"),
        ("during_cleanup@0", "whole number >= 1"),
        ("during_cleanup@x", "whole number >= 1"),
        ("during_cleanup/executor", "process must be"),
        ("after_staging/sidecar", "never reached"),
        ("before_checkpoint_write/jvm-1", "never reached"),
    ],
)
def test_bad_spec_names_the_key(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as err:
        Settings.from_conf({PREFIX + "test.crashAt": value})
    assert err.value.key == PREFIX + "test.crashAt"


def test_off_unless_armed(tmp_path: Path) -> None:
    """Unarmed (the production case) a crash point is a no-op; armed for another process, too."""
    assert Settings.from_conf({}, cwd=tmp_path).test_crash_at == ()
    crashpoints.disarm()
    crashpoints.crash_point(crashpoints.DURING_CLEANUP)  # would kill pytest if it fired
    crashpoints.arm("during_cleanup/sidecar-1", process="sidecar-0")
    try:
        assert crashpoints.armed() == ()
        crashpoints.crash_point(crashpoints.DURING_CLEANUP)
    finally:
        crashpoints.disarm()


def test_fires_at_the_nth_hit_once_per_app(tmp_path: Path) -> None:
    """A child process armed @2 dies by SIGKILL at its second hit; a second process sharing the once
    dir reaches the point twice and lives (the point already fired for this application)."""
    code = (
        "import sys; from pathlib import Path; from spark_statebackend.common import crashpoints as c\n"
        f"c.arm('during_cleanup@2', process='sidecar-0', once_dir=Path({str(tmp_path)!r}))\n"
        "c.crash_point('during_cleanup'); print('first', flush=True)\n"
        "c.crash_point('during_cleanup'); print('second', flush=True)\n"
    )
    first = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert first.returncode == -signal.SIGKILL, first
    assert first.stdout.split() == ["first"]
    assert "TEST CRASH POINT during_cleanup (hit 2)" in first.stderr
    assert (tmp_path / crashpoints.FIRED_DIR / "during_cleanup").is_file()
    again = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.split() == ["first", "second"], again


# --------------------------------------------------------------------------------- fake JVM + sidecar


class FakeApp:
    """One streaming query of one application on this host: what the JVM shim writes, and the sidecar."""

    def __init__(self, work: Path, crash_at: str = "") -> None:
        self.work = work
        self.ckpt = work / "ckpt"
        self.staging = self.ckpt / "_statebackend" / "staging" / APP
        self.spool = sp.Spool(work / "spool" / APP / "driver")
        self.blob_url = (work / "blobs").as_uri()
        self.log_url = (work / "log").as_uri()
        self.query_id = str(uuid.uuid4())
        self.expected: dict[tuple[int, int], dict[str, object]] = {}  # (partition, version) -> staged tree
        self.sidecars: list[subprocess.Popen[bytes]] = []
        self.conf = work / "sidecar-conf.json"
        conf = {
            PREFIX + "blobStore.url": self.blob_url,
            PREFIX + "blobStore.options.fsync": "false",
            PREFIX + "checkpointLog.url": self.log_url,
            PREFIX + "checkpointLog.options.fsync": "false",
            PREFIX + "transfer.workers": "2",
            "spark.app.id": APP,
        }
        if crash_at:
            conf[PREFIX + "test.crashAt"] = crash_at
        self.spool.dir.mkdir(parents=True)
        self.conf.write_bytes(orjson.dumps(conf))
        (self.ckpt / "state" / "0" / "_metadata").mkdir(parents=True)
        (self.ckpt / "metadata").write_text(orjson.dumps({"id": self.query_id}).decode() + "\n")
        (self.ckpt / "state" / "0" / "_metadata" / "metadata").write_text("operator metadata\n")
        self.store = LocalBlobStore(work / "blobs", fsync=False)
        self.cplog = open_checkpoint_log(self.log_url, {"fsync": "false"})

    # -- the sidecar

    def start_sidecar(self) -> subprocess.Popen[bytes]:
        log = open(self.spool.dir / sp.SIDECAR_LOG, "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                sp.SIDECAR_MODULE,
                "--spool-dir",
                str(self.spool.dir),
                "--executor-id",
                "driver",
                "--conf",
                str(self.conf),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.sidecars.append(proc)
        return proc

    @property
    def sidecar(self) -> subprocess.Popen[bytes]:
        return self.sidecars[-1]

    def stop(self) -> None:
        for proc in self.sidecars:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
        self.cplog.close()

    def sidecar_log(self) -> str:
        return (self.spool.dir / sp.SIDECAR_LOG).read_text(errors="replace")

    # -- the JVM's half

    def dfs_dir(self, partition: int) -> Path:
        return self.ckpt / "state" / "0" / str(partition)

    def commit_batch(self, batch: int) -> None:
        """Batch `batch` commits state version batch+1 of every partition: files, staging, events."""
        version = batch + 1
        for p in PARTITIONS:
            dfs = self.dfs_dir(p)
            (dfs / "SSTs").mkdir(parents=True, exist_ok=True)
            # Like RocksDB: each version adds an SST and compaction drops the oldest beyond three,
            # so cleanup has replaced files to delete.
            (dfs / "SSTs" / f"{version:04d}-{p}.sst").write_bytes(os.urandom(3000 + 100 * version))
            live = sorted(f.name for f in (dfs / "SSTs").iterdir())[-3:]
            (dfs / f"{version}.zip").write_bytes(orjson.dumps({"version": version, "ssts": live}))
            files = [f"{version}.zip", *(f"SSTs/{n}" for n in live)]
            leaf = self.staging / "0" / str(p) / "default" / f"{version}-{uuid.uuid4().hex[:8]}"
            for rel in files:
                (leaf / rel).parent.mkdir(parents=True, exist_ok=True)
                os.link(dfs / rel, leaf / rel)
            self.expected[(p, version)] = read_tree(leaf)
            self.spool.write_event(
                sp.SnapshotEvent(
                    query_id=self.query_id,
                    batch_id=batch,
                    checkpoint_root=self.ckpt,
                    dfs_dir=dfs,
                    operator=0,
                    partition=p,
                    store="default",
                    version=version,
                    spark_unique_id=None,
                    staged_dir=leaf,
                    files=tuple(files),
                    executor_id="driver",
                    created_at_ms=int(time.time() * 1000),
                    stage_nanos=1000,
                ),
                fsync=False,
            )
        for sub in ("offsets", "commits"):
            (self.ckpt / sub).mkdir(exist_ok=True)
            (self.ckpt / sub / str(batch)).write_text(f"{sub} {batch}\n")
        progress = {
            "id": self.query_id,
            "runId": str(uuid.uuid4()),
            "name": "q",
            "batchId": batch,
            "timestamp": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
            "batchDuration": 10,
            "sources": [{"description": "rate", "endOffset": {"offset": (batch + 1) * 10}}],
            "stateOperators": [{"numStateStoreInstances": len(PARTITIONS)}],
        }
        doc = {
            "schema_version": 1,
            "type": "progress",
            "query_id": self.query_id,
            "batch_id": batch,
            "checkpoint_root": str(self.ckpt),
            "progress_json": orjson.dumps(progress).decode(),
            "created_at_ms": int(time.time() * 1000),
        }
        sp.atomic_write_json(self.spool.dir / "progress" / f"{sp.new_file_stem()}.json", doc, fsync=False)

    def latest_batch(self) -> int:
        latest = self.cplog.read_latest(self.query_id)
        return -1 if latest is None else latest.batch_id

    def wait_checkpointed(self, batch: int) -> bool:
        """Wait until `batch` is checkpointed (True) or the sidecar died (False)."""
        wait_until(
            lambda: self.latest_batch() >= batch or self.sidecar.poll() is not None,
            SIDECAR_TIMEOUT,
            f"checkpoint of batch {batch} or the sidecar's death",
        )
        return self.latest_batch() >= batch


def run_batches(app: FakeApp, batches: range) -> int:
    """Commit `batches` one by one; restart the sidecar whenever it dies. Returns how many died."""
    deaths = 0
    for b in batches:
        app.commit_batch(b)
        while not app.wait_checkpointed(b):
            assert app.sidecar.returncode == -signal.SIGKILL, (
                app.sidecar.returncode,
                app.sidecar_log()[-3000:],
            )
            deaths += 1
            app.start_sidecar()
    return deaths


def assert_nothing_lost_or_leaked(app: FakeApp, last_batch: int) -> None:
    """Every snapshot of the latest checkpoint restores to what was staged; nothing is left in the
    spool or staging; the blob store holds exactly the referenced blobs after GC and the TTL sweep."""
    wait_until(
        lambda: not list(app.store.list("reports/")), SIDECAR_TIMEOUT, "cleanup after the last checkpoint"
    )
    latest = app.cplog.read_latest(app.query_id)
    assert latest is not None and latest.batch_id == last_batch
    markers = latest.markers(BLOBSTORE_BACKEND)
    assert set(markers) == {f"0/{p}/default" for p in PARTITIONS} | {DRIVER_STORE}
    with TransferPool(2) as pool:
        restorer = RestoreManager(app.store, pool)
        for p in PARTITIONS:
            dest = app.work / "check" / str(p)
            restorer.restore(markers[f"0/{p}/default"], dest)
            assert restored_as(read_tree(dest)) == restored_as(app.expected[(p, last_batch + 1)]), (
                f"partition {p}"
            )
        driver = app.work / "check" / "driver"
        restorer.restore(markers[DRIVER_STORE], driver)
        assert (driver / "offsets" / str(last_batch)).read_text() == f"offsets {last_batch}\n"
    # Every event and progress file was consumed, every staged dir removed.
    wait_until(
        lambda: not any(app.staging.rglob("*.zip")), SIDECAR_TIMEOUT, "staged snapshots removed after upload"
    )
    left = [p for d in ("events", "progress") for p in (app.spool.dir / d).rglob("*.json")]
    assert left == [], left
    # Blob store: referenced present, the rest expiring, exactly the referenced after the sweep.
    refs: set[str] = set()
    for cp in app.cplog.read_history(app.query_id):
        for marker in cp.markers(BLOBSTORE_BACKEND).values():
            refs.add(marker)
            refs |= set(load_snapshot_index(app.store, marker).dir_index.present_blob_ids())
    present = {b.blob_id for b in app.store.list("") if not b.blob_id.startswith("queries/")}
    assert refs <= present, sorted(refs - present)[:5]
    assert all(app.store.stat(b).expires_at_ms is None for b in refs), "a referenced blob still expires"
    extra = present - refs
    assert all(app.store.stat(b).expires_at_ms is not None for b in extra), sorted(extra)[:5]
    with TransferPool(2) as pool:  # GC (no grace) takes garbage but never a referenced blob
        GarbageCollector(app.store, app.cplog, pool, grace_seconds=0).run()
    assert refs <= {b.blob_id for b in app.store.list("")}
    app.store.sweep_expired(now_ms=int(time.time() * 1000) + 30 * 86400 * 1000)
    assert {b.blob_id for b in app.store.list("") if not b.blob_id.startswith("queries/")} == refs


@pytest.fixture
def make_app(tmp_path: Path):  # type: ignore[no-untyped-def]
    apps: list[FakeApp] = []

    def make(crash_at: str = "") -> FakeApp:
        app = FakeApp(tmp_path / f"app{len(apps)}", crash_at)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


# Per batch the sidecar uploads 2 store versions (2-4 file chunks each; 1-2 upload() calls), then
# the committer uploads the _driver snapshot (2 new files after batch 0), writes the checkpoint and
# cleans up 3 stores. Each n below lands in batch 1 or 2, so an earlier checkpoint exists.
SIDECAR_POINTS = {
    crashpoints.DURING_FILE_UPLOAD: 14,
    crashpoints.BEFORE_INDEX_UPLOAD: 4,
    crashpoints.BEFORE_CHECKPOINT_WRITE: 2,
    crashpoints.AFTER_CHECKPOINT_WRITE: 2,
    crashpoints.DURING_CLEANUP: 5,
}


def test_no_crash_baseline(make_app) -> None:  # type: ignore[no-untyped-def]
    """The harness itself: without a crash point every batch is checkpointed by one sidecar."""
    app = make_app()
    app.start_sidecar()
    assert run_batches(app, range(BATCHES)) == 0
    assert_nothing_lost_or_leaked(app, BATCHES - 1)


@pytest.mark.parametrize("point", sorted(SIDECAR_POINTS))
def test_sidecar_killed_at_commit_step(point: str, make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app(f"{point}@{SIDECAR_POINTS[point]}/sidecar-driver")
    app.start_sidecar()
    assert run_batches(app, range(BATCHES)) == 1, "the crash point fired exactly once"
    assert f"TEST CRASH POINT {point}" in app.sidecar_log()
    assert_nothing_lost_or_leaked(app, BATCHES - 1)


def test_sidecar_killed_at_the_last_batch_before_its_checkpoint(make_app) -> None:  # type: ignore[no-untyped-def]
    """No later batch supersedes the crashed one: the new sidecar must commit it from the claimed
    progress event its predecessor left."""
    app = make_app(f"{crashpoints.BEFORE_CHECKPOINT_WRITE}@{BATCHES}")
    app.start_sidecar()
    assert run_batches(app, range(BATCHES)) == 1
    assert_nothing_lost_or_leaked(app, BATCHES - 1)


def test_sidecar_killed_during_restore(make_app) -> None:  # type: ignore[no-untyped-def]
    """A restore request outlives the sidecar that was serving it: the next sidecar answers it, and
    the store's dir ends up exactly as staged (the half-built scratch dir is discarded)."""
    app = make_app(f"{crashpoints.DURING_RESTORE}@2")
    app.start_sidecar()
    assert run_batches(app, range(BATCHES)) == 0  # restores only: no crash while committing
    # The crash is meant for the restore: the last checkpoint's cleanup runs on the committer's thread
    # beside it, and one it interrupts is redone only when the query's next batch arrives (at_start).
    wait_until(lambda: not list(app.store.list("reports/")), SIDECAR_TIMEOUT, "the last checkpoint's cleanup")
    version = BATCHES
    dfs = app.dfs_dir(0)
    shutil.rmtree(dfs)  # a new host: the store's files are gone
    request = sp.RestoreRequest(
        request_id=str(uuid.uuid4()),
        query_id=app.query_id,
        checkpoint_root=app.ckpt,
        dfs_dir=dfs,
        operator=0,
        partition=0,
        store="default",
        version=version,
        spark_unique_id=None,
        executor_id="driver",
        created_at_ms=int(time.time() * 1000),
        missing=f"{version}.zip is absent",
    )
    app.spool.write_request(request, fsync=False)
    wait_until(lambda: app.sidecar.poll() is not None, SIDECAR_TIMEOUT, "the crash during the restore")
    assert app.sidecar.returncode == -signal.SIGKILL
    assert "TEST CRASH POINT during_restore" in app.sidecar_log()
    assert app.spool.take_response(request.request_id) is None  # the dead sidecar never answered
    app.start_sidecar()
    response: list[sp.RestoreResponse] = []

    def answered() -> bool:
        r = app.spool.take_response(request.request_id)
        if r is not None:
            response.append(r)
        return bool(response)

    wait_until(answered, SIDECAR_TIMEOUT, "the new sidecar's restore response")
    assert response[0].status == "restored", response[0]
    assert restored_as(read_tree(dfs)) == restored_as(app.expected[(0, version)])
    scratch = app.ckpt / "_statebackend" / "restore"
    assert not list(scratch.glob(".*restore-*")), "the interrupted restore's temp dir was left behind"
    assert_nothing_lost_or_leaked(app, BATCHES - 1)


def test_driver_killed_during_checkpoint_location_restore(make_app) -> None:  # type: ignore[no-untyped-def]
    """The driver-side rebuild of a lost checkpoint location (spark.restore_checkpoint_location), kill
    -9'd half-way, is simply redone by the next start, from the same durable checkpoint."""
    app = make_app()
    app.start_sidecar()
    run_batches(app, range(BATCHES))
    assert_nothing_lost_or_leaked(app, BATCHES - 1)
    app.stop()
    # A new host: only the blob store and the checkpoint log survive.
    lost = app.work / "lost-ckpt"
    os.rename(app.ckpt, lost)
    conf = {PREFIX + "blobStore.url": app.blob_url, PREFIX + "checkpointLog.url": app.log_url}
    code = (
        "import sys, orjson; from spark_statebackend.common import crashpoints as c\n"
        "from spark_statebackend.spark import driver_restore as s\n"
        "from spark_statebackend.settings import Settings\n"
        f"conf = orjson.loads({orjson.dumps(conf).decode()!r})\n"
        "c.arm(sys.argv[2], process='driver')\n"
        "print(s.restore_checkpoint_location(Settings.from_conf(conf), sys.argv[1]), flush=True)\n"
    )
    crashed = subprocess.run(
        [sys.executable, "-c", code, str(app.ckpt), "during_restore@2/driver"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed
    assert "TEST CRASH POINT during_restore (hit 2) in driver" in crashed.stderr
    ours = app.ckpt / "_statebackend"  # the scratch dir is inside the location, on its file system
    assert list(ours.glob(".driver-restore.restore-*")), "the crash left no half-built scratch dir"
    # What a crash while moving the files would leave too: a stale scratch dir, here with a symlink out
    # of it. The redo removes it first, never following the link.
    outside = app.work / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"not the restore's")
    (ours / "driver-restore" / "offsets").mkdir(parents=True)
    (ours / "driver-restore" / "offsets" / "link").symlink_to(outside, target_is_directory=True)
    redo = subprocess.run(
        [sys.executable, "-c", code, str(app.ckpt), ""], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert redo.returncode == 0, redo
    assert redo.stdout.strip() == f"restored batch {BATCHES - 1}"
    for rel in ("metadata", f"offsets/{BATCHES - 1}", f"commits/{BATCHES - 1}", "state/0/_metadata/metadata"):
        assert (app.ckpt / rel).read_bytes() == (lost / rel).read_bytes(), rel
    assert not [p.name for p in ours.iterdir() if "driver-restore" in p.name], "stale scratch dir left"
    assert (outside / "keep").read_bytes() == b"not the restore's"
    assert "left by an interrupted rebuild" in redo.stderr


def test_new_sidecar_does_not_upload_a_checkpointed_version_again(make_app) -> None:  # type: ignore[no-untyped-def]
    """A sidecar killed after uploading and reporting a version, but before deleting its claimed event,
    leaves that event to its successor. If the version was checkpointed meanwhile, the successor must
    not upload it again: a second copy as the next diff base would make cleanup leak the first."""
    app = make_app()
    app.start_sidecar()
    run_batches(app, range(BATCHES))
    app.stop()
    version = BATCHES  # checkpointed by batch BATCHES - 1
    dfs = app.dfs_dir(0)
    files = [f"{version}.zip", *(f"SSTs/{n}" for n in sorted(f.name for f in (dfs / "SSTs").iterdir())[-3:])]
    leaf = app.staging / "0" / "0" / "default" / f"{version}-again"
    for rel in files:
        (leaf / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(dfs / rel, leaf / rel)
    event = app.spool.write_event(
        sp.SnapshotEvent(
            query_id=app.query_id,
            batch_id=version - 1,
            checkpoint_root=app.ckpt,
            dfs_dir=dfs,
            operator=0,
            partition=0,
            store="default",
            version=version,
            spark_unique_id=None,
            staged_dir=leaf,
            files=tuple(files),
            executor_id="driver",
            created_at_ms=int(time.time() * 1000),
            stage_nanos=1000,
        ),
        fsync=False,
    )
    assert sp.claim(event) is not None  # claimed by the predecessor, which then died
    indexes_before = {b.blob_id for b in app.store.list("indexes/")}
    app.cplog = open_checkpoint_log(app.log_url, {"fsync": "false"})
    app.start_sidecar()
    wait_until(lambda: not leaf.exists(), SIDECAR_TIMEOUT, "the claimed event handled")
    assert {b.blob_id for b in app.store.list("indexes/")} == indexes_before, "uploaded again"
    assert "already checkpointed; not uploaded again" in app.sidecar_log()
    run_batches(app, range(BATCHES, BATCHES + 1))
    assert_nothing_lost_or_leaked(app, BATCHES)


def test_a_real_sidecar_never_merges_a_restore_the_jvm_no_longer_waits_for(make_app) -> None:  # type: ignore[no-untyped-def]
    """The JVM stops waiting at restoreTimeout (10 min by default) after writing its request and loads
    Spark's own files: a sidecar that gets to the request later must not place files behind it."""
    app = make_app()
    app.start_sidecar()
    assert run_batches(app, range(BATCHES)) == 0
    dfs = app.dfs_dir(0)
    shutil.rmtree(dfs)  # a new host: the store's files are gone
    request = sp.RestoreRequest(
        request_id=str(uuid.uuid4()),
        query_id=app.query_id,
        checkpoint_root=app.ckpt,
        dfs_dir=dfs,
        operator=0,
        partition=0,
        store="default",
        version=BATCHES,
        spark_unique_id=None,
        executor_id="driver",
        created_at_ms=int(time.time() * 1000) - 11 * 60 * 1000,  # written 11 minutes ago
        missing=f"{BATCHES}.zip is absent",
    )
    app.spool.write_request(request, fsync=False)
    response: list[sp.RestoreResponse] = []

    def answered() -> bool:
        r = app.spool.take_response(request.request_id)
        if r is not None:
            response.append(r)
        return bool(response)

    wait_until(answered, SIDECAR_TIMEOUT, "the sidecar's restore response")
    assert response[0].status == "error" and "restoreTimeout" in response[0].message, response[0]
    assert not dfs.exists()  # nothing placed
    assert not app.spool.pending_requests() and not sp.claimed(app.spool.requests_dir)


@pytest.mark.services
@pytest.mark.parametrize("jvm_pid_arg", [True, False], ids=["jvm-pid-given", "older-shim"])
def test_a_sidecar_whose_jvm_dies_while_it_starts_exits(
    jvm_pid_arg: bool, moto_server: S3Server, tmp_path: Path
) -> None:
    """kill -9 of the JVM while its sidecar is still starting (ensure_ready waits on a stalled blob
    store): the sidecar must see that its JVM is gone and exit, instead of serving the dead
    application's spool (and committing its claimed batches) for ever. It used to read its parent's
    pid only after the start, by which time it had been reparented (found by the chaos run). The shim
    passes its pid (--jvm-pid); without it the sidecar reads its parent before anything can block."""
    import psutil

    from tests.faultproxy import FaultProxy

    spool_dir = tmp_path / "spool" / APP / "0"
    spool_dir.mkdir(parents=True)
    conf = {
        PREFIX + "blobStore.url": f"s3://ssb-parent-{uuid.uuid4().hex[:8]}/state",
        PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
        "spark.app.id": APP,
    }
    with FaultProxy(moto_server.port) as proxy:
        for k, v in {**moto_server.options(port=proxy.port), "read_timeout": "60s"}.items():
            conf[f"{PREFIX}blobStore.options.{k}"] = v
        (tmp_path / "sidecar-conf.json").write_bytes(orjson.dumps(conf))
        sidecar_cmd = [
            sys.executable, "-m", sp.SIDECAR_MODULE, "--spool-dir", str(spool_dir),
            "--executor-id", "0", "--conf", str(tmp_path / "sidecar-conf.json"),
        ]  # fmt: skip
        # The stand-in JVM starts the sidecar (its child, as the plugin's) and waits to be killed.
        jvm_pid = "['--jvm-pid', str(os.getpid())]" if jvm_pid_arg else "[]"
        jvm_code = (
            "import os, subprocess, sys, time\n"
            f"p = subprocess.Popen({sidecar_cmd!r} + {jvm_pid}, "
            f"stdout=open({str(spool_dir / 'sidecar.log')!r}, 'ab'), "
            "stderr=subprocess.STDOUT)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n"
        )
        proxy.stall()
        jvm = subprocess.Popen(
            [sys.executable, "-c", jvm_code], cwd=ROOT, stdout=subprocess.PIPE, start_new_session=True
        )
        try:
            assert jvm.stdout is not None
            sidecar = psutil.Process(int(jvm.stdout.readline()))
            wait_until(lambda: proxy.stats.stalled_connections >= 1, 60, "the sidecar's start to stall")
            jvm.kill()
            jvm.wait(timeout=30)
            wait_until(lambda: sidecar.ppid() != jvm.pid, 30, "the sidecar to be reparented")
            proxy.heal()  # the start completes (a stalled connection resumes)

            def exited() -> bool:
                try:
                    return sidecar.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    return True

            wait_until(exited, 60, "the orphaned sidecar to exit")
            log = (spool_dir / "sidecar.log").read_text()
            assert f"executor JVM (pid {jvm.pid}) is gone; sidecar exiting" in log, log[-3000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(jvm.pid, signal.SIGKILL)  # the sidecar stays in the stand-in's session
            jvm.wait(timeout=30)
