"""Changelog checkpointing end to end with real Spark queries: backed up, restored, and no more replay
than Spark's own.

Spark's changelog checkpointing (`spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled`)
commits a version by writing `<v>.changelog`; its maintenance thread uploads a snapshot `<s>.zip` every
`minDeltasForSnapshot` versions. The shim stages, for each committed version, the files Spark needs to
load it (jvm-bridge Recipe.java: the newest snapshot zip with its SSTs plus the changelogs after it),
the sidecar uploads them, and a restore puts exactly those back for Spark to replay.

Every run is a driver process (spark_statebackend/demo_app.py) with changelog checkpointing on,
`minDeltasForSnapshot=2` and a 100 ms maintenance interval, so Spark makes and uploads snapshots during
these short runs. The references are the same queries on Spark's own provider, also in changelog mode,
run without interruption.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import orjson
import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.demo_app import ROWS_PER_BATCH_ENV
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.spark import jar_path
from spark_statebackend.spark.enable import PLUGIN_CLASS
from spark_statebackend.stores import open_blob_store
from tests.changelogrig import (
    CHANGELOG,
    assert_backed_up_in_changelog_mode,
    conf_args,
    latest_checkpoint,
    store_dir,
)
from tests.demorig import (
    ROOT,
    app_command,
    assert_blob_store_exact,
    result,
    wipe_local_state,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

FORMAT_V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}
# A fresh run makes snapshots at versions 2, 4, ...; one restored from version 3 (snapshot 2 +
# changelog 3) at 4, 6, ... So versions 3 and 5, the ones these tests check, always replay a changelog
# (a snapshot of the version itself, which Spark publishes after the commit, is an upgrade: see
# test_restore_replays_no_more_changelogs_than_spark).
FIRST = 2  # the first run stops after this batch (state version 3)
LAST = 4  # the restored run goes on to this batch (state version 5)


def run(
    work: Path,
    shape: str,
    until: int,
    *,
    builder_conf: Mapping[str, str] = CHANGELOG,
    args: tuple[str, ...] = (),
    timeout: float = 400,
) -> str:
    """Run demo_app to batch `until` with `builder_conf` on its session builder; return its output."""
    cmd = app_command(work, shape, until, args=conf_args("--extra", builder_conf) + args)
    return _check(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout))


def _check(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (
        f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc.stdout


class _References(dict[str, object]):
    """shape -> its result at LAST on Spark's own provider in changelog mode, run on first use."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self.factory = factory

    def __missing__(self, shape: str) -> object:
        work = self.factory.mktemp(f"ref-{shape}")
        run(work, shape, LAST, args=("--plain",))
        self[shape] = result(work, shape, LAST)
        return self[shape]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return _References(tmp_path_factory)


# --- what a checkpoint of a changelog-mode query holds ------------------------------------------------


def sidecar_logs(work: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (work / "spool").rglob("sidecar.log"))


# --- 1. end to end per shape, checkpoint format v1 and v2 -----------------------------------------------


@pytest.mark.parametrize(("shape", "fmt"), [("agg", 1), ("join", 1), ("dedup", 2)], ids=lambda x: str(x))
def test_changelog_mode_restores_after_losing_all_local_state(
    shape: str, fmt: int, references: dict[str, object], tmp_path: Path
) -> None:
    """Back up a changelog-mode query, lose its checkpoint location, Spark's local dirs and the spool
    (a new host), restart: the state comes back from the blob store and the output equals an
    uninterrupted run on Spark's own provider."""
    conf = {**CHANGELOG, **(FORMAT_V2 if fmt == 2 else {})}
    run(tmp_path, shape, FIRST, builder_conf=conf)
    first = assert_backed_up_in_changelog_mode(tmp_path, fmt=fmt)
    assert first.batch_id == FIRST
    wipe_local_state(tmp_path)
    out = run(tmp_path, shape, LAST, builder_conf=conf)
    assert "CHECKPOINTED" in out
    assert "restored query" in sidecar_logs(tmp_path)  # the state came back from the blob store
    assert result(tmp_path, shape, LAST) == references[shape]
    last = assert_backed_up_in_changelog_mode(tmp_path, fmt=fmt)
    assert last.batch_id == LAST
    assert_blob_store_exact(tmp_path)


# --- 2. the ways of turning changelog checkpointing on ----------------------------------------------


def spark_submit_command(work: Path, until: int, conf: Mapping[str, str]) -> list[str]:
    """pyspark's own bin/spark-submit running demo_app.py, which does not call configure(): the jar,
    the plugin and the spark.statebackend.* keys come from --conf only, as for any job."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    launcher = {
        "spark.jars": str(jar_path()),
        "spark.plugins": PLUGIN_CLASS,
        "spark.statebackend.blobStore.url": (work / "blobs").as_uri(),
        "spark.statebackend.checkpointLog.url": (work / "log").as_uri(),
        "spark.statebackend.spoolDir": str(work / "spool"),
        "spark.statebackend.sidecar.python": sys.executable,
        **conf,
    }
    return [
        str(submit), "--master", "local[2]", *conf_args("--conf", launcher),
        str(ROOT / "spark_statebackend" / "demo_app.py"),
        "--shape", "agg", "--work", str(work), "--until-batch", str(until), "--no-configure",
    ]  # fmt: skip


def test_changelog_mode_set_with_spark_submit_is_backed_up(tmp_path: Path) -> None:
    """`spark-submit --conf` turns changelog checkpointing on for a driver that never imports
    configure(): every checkpointed store records the changelogs Spark replays."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    cmd = spark_submit_command(tmp_path, FIRST, CHANGELOG)
    out = _check(subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400))
    assert f"CHECKPOINTED {FIRST}" in out
    assert_backed_up_in_changelog_mode(tmp_path)


def test_changelog_mode_set_at_runtime_before_start_is_backed_up(tmp_path: Path) -> None:
    """`spark.conf.set(...)` on a running session, before the query starts, turns changelog
    checkpointing on for that query (the session was built without it): it is backed up as such."""
    out = run(tmp_path, "agg", FIRST, builder_conf={}, args=conf_args("--runtime-conf", CHANGELOG))
    assert f"CHECKPOINTED {FIRST}" in out
    assert_backed_up_in_changelog_mode(tmp_path)


# --- 3. a restore never replays more changelogs than Spark would -----------------------------------------


def replayed(work: Path, batch: int) -> tuple[int, int]:
    """(changelogs replayed, stores loaded from files) in Spark's progress of `batch`: its own metrics
    rocksdbNumReplayChangelogFiles and rocksdbNumLoadedFromDfs, summed over the operator's stores. (The
    dedup shape has one store per partition, loaded once per batch; in the agg shape the save operator
    re-loads the restore operator's store and the counts are reset.)"""
    progress = orjson.loads((work / "progress" / f"{batch}.json").read_bytes())
    (op,) = progress["stateOperators"]
    metrics = op["customMetrics"]
    return int(metrics["rocksdbNumReplayChangelogFiles"]), int(metrics["rocksdbNumLoadedFromDfs"])


def newest_snapshot(spark_dir: Path, version: int) -> int:
    """The snapshot Spark loads `version` from after a restart on its own files (format v1): the newest
    zip <= version; 0 for none."""
    return max((int(p.stem) for p in spark_dir.glob("*.zip") if int(p.stem) <= version), default=0)


def test_restore_replays_no_more_changelogs_than_spark(tmp_path: Path) -> None:
    """After a restore, Spark replays no more changelogs than after a restart on its own, unwiped files
    at the same batch, once the backup has caught up with Spark's snapshots (demo_app --wait-caught-up).

    Spark's maintenance thread publishes a snapshot after the commit it was taken at, so the recipe
    staged at a commit can be longer than Spark's own by the time it restarts; the shim then stages the
    version again with the shorter recipe and the committer checkpoints that upgrade (commit.py). Two
    restarts of one run: `restored` loses all local state (a new host), `own` keeps Spark's files and
    runs on Spark's provider alone. Spark's own metrics count the replays. Then the restored run stops
    at version 4, a snapshot version (Spark publishes 4.zip after committing it): its checkpoint must
    restore version 4 from 4.zip with no replay, as Spark's own files would."""
    restored, own = tmp_path / "restored", tmp_path / "own"
    run(restored, "dedup", FIRST, args=("--wait-caught-up",))
    shutil.copytree(restored, own, symlinks=True)
    wipe_local_state(restored)
    out = run(restored, "dedup", FIRST + 1, args=("--wait-caught-up",))
    assert "CAUGHT UP" in out and "restored query" in sidecar_logs(restored)
    run(own, "dedup", FIRST + 1, args=("--plain",))

    # Version 3, replayed from snapshot 2 in both: one changelog per store, two stores loaded from files.
    assert replayed(restored, FIRST + 1) == replayed(own, FIRST + 1) == (2, 2)
    assert result(restored, "dedup", FIRST + 1) == result(own, "dedup", FIRST + 1)

    # Version 4 is a snapshot version: Spark publishes 4.zip only after committing 4.changelog, so the
    # commit-time recipe was snapshot 2 + changelogs 3, 4; what is checkpointed is the upgrade (taken by
    # the batch's own checkpoint if it came first, else by a new checkpoint of the batch).
    cp = assert_backed_up_in_changelog_mode(restored, replays=False)
    assert cp.batch_id == FIRST + 1 and not cp.changelog_checkpointing
    store = open_blob_store((restored / "blobs").as_uri())
    for key, marker in cp.markers(BLOBSTORE_BACKEND).items():
        if key != DRIVER_STORE:
            md = load_snapshot_index(store, marker).metadata
            assert md.version == FIRST + 2
            assert md.snapshot_version == newest_snapshot(store_dir(restored, key), FIRST + 2) == FIRST + 2, (
                md
            )
    assert_blob_store_exact(restored)


# --- 4. snapshots the sidecar builds from the changelogs (changelogSnapshotEvery) -------------------------


def test_sidecar_snapshots_bound_the_replay_when_spark_never_snapshots(
    tmp_path: Path, references: dict[str, object]
) -> None:
    """With `minDeltasForSnapshot` beyond the run Spark never flushes RocksDB on a task thread and writes
    changelogs only; with `changelogSnapshotEvery` the sidecar builds the snapshots instead
    (spark/materialize.py). The checkpoint's recipes then start from those, a restore on a new host
    replays only the changelogs after them (Spark's own metrics count them), and the output equals an
    uninterrupted run on Spark's own provider."""
    conf = {
        **CHANGELOG,
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1000000",
        "spark.statebackend.changelogSnapshotEvery": "1",
    }
    # State versions 1..4. A build (about a second) runs after each version's upload, beside the next
    # batches: a 3 s trigger lets the first ones land before version 4 is committed (with Spark's
    # default pace every batch can commit before any build ends, and the recipes then start from none).
    run(tmp_path, "dedup", LAST - 1, builder_conf=conf, args=("--trigger-ms", "3000"))
    assert "snapshot built from" in sidecar_logs(tmp_path)
    cp = latest_checkpoint(tmp_path)
    assert cp.batch_id == LAST - 1
    store = open_blob_store((tmp_path / "blobs").as_uri())
    starts = {}
    for key, marker in cp.markers(BLOBSTORE_BACKEND).items():
        if key != DRIVER_STORE:
            md = load_snapshot_index(store, marker).metadata
            assert md.version == LAST and md.snapshot_version is not None, md
            starts[key] = md.snapshot_version
    # Spark made no snapshot (minDeltasForSnapshot), so each recipe starts from one the sidecar built.
    assert len(starts) == 2 and all(s > 0 for s in starts.values()), starts

    wipe_local_state(tmp_path)
    run(tmp_path, "dedup", LAST, builder_conf=conf)
    assert replayed(tmp_path, LAST) == (sum(LAST - s for s in starts.values()), 2)
    assert result(tmp_path, "dedup", LAST) == references["dedup"]


# --- 5. changelogs uploaded while Spark writes them (changelogStreamChunk) ---------------------------------


def test_changelogs_uploaded_while_written_are_backed_up_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With durableCommit (the default) the sidecar uploads each changelog while the task writes it
    (runtime/changelog_streams.py), so the commit waits only for its rest. 20,000 rows a batch into a
    join's state and Spark's LZ4 blocks of 1 KiB make each changelog grow in many small writes during
    the task; with 4 KiB stream blobs, the checkpointed changelogs are made of blobs uploaded before
    their commit plus the rest, and restoring the checkpoint gives back Spark's files byte for byte."""
    monkeypatch.setenv(ROWS_PER_BATCH_ENV, "20000")
    conf = {
        **CHANGELOG,
        "spark.statebackend.changelogStreamChunk": "4k",
        "spark.io.compression.lz4.blockSize": "1k",
    }
    run(tmp_path, "join", FIRST, builder_conf=conf)
    assert "were uploaded while Spark wrote it" in sidecar_logs(tmp_path)
    cp = latest_checkpoint(tmp_path)
    store = open_blob_store((tmp_path / "blobs").as_uri())
    chunked = 0
    with TransferPool(2) as pool:
        for key, marker in sorted(cp.markers(BLOBSTORE_BACKEND).items()):
            if key == DRIVER_STORE:
                continue
            index = load_snapshot_index(store, marker)
            changelogs = {n: f for n, f in index.dir_index.walk_files() if n.endswith(".changelog")}
            assert changelogs, key
            chunked += sum(len(f.blobs) > 1 for f in changelogs.values())
            dest = tmp_path / "restored" / key.replace("/", "_")
            RestoreManager(store, pool).restore(marker, dest)
            for name in changelogs:
                assert (dest / name).read_bytes() == (store_dir(tmp_path, key) / name).read_bytes(), name
    assert chunked, "no checkpointed changelog was uploaded in parts"
    assert_blob_store_exact(tmp_path)
