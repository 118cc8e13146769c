"""The drop-in, both ways, and the state data source reader on backed-up locations (real Spark).

Each driver run is its own process (tests/jobrig.py: demo_app's `agg` job, enabled with configure()
or `--plain` for Spark alone), since the backend is switched on and off per application:
- a checkpoint started on Spark's own RocksDBStateStoreProvider without the backend is backed up from
  the next batch once the conf keys are set (its first snapshots uploaded whole), and restored on a
  wiped host;
- a checkpoint run with the backend continues on Spark alone once the keys are removed, with nothing
  of ours left in or needed by it;
- `spark.read.format("statestore")` on a location rebuilt but not yet run, and on a wiped one, restores
  the stores it reads and returns exactly the uninterrupted run's state.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.cli import main
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.stores import open_blob_store
from tests.demorig import ROOT, app_command, durable_batch, query_id_of
from tests.jobrig import APPS, REF_LAST, assert_outputs_equal, job_env, run_demo, wipe_host

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


def local_commit(work: Path) -> int:
    return max((int(p.name) for p in (work / "ckpt" / "commits").iterdir() if p.name.isdigit()), default=-1)


def sidecar_logs(work: Path) -> str:
    return "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))


def version_files(store_dir: Path, version: int) -> set[str]:
    """What version `version` of a RocksDB store is made of in Spark's checkpoint (format v1, no
    changelog): `<v>.zip` and every SST its metadata names."""
    with zipfile.ZipFile(store_dir / f"{version}.zip") as z:
        meta = z.read("metadata").decode().split("\n", 1)[1]
    return {f"{version}.zip"} | {f"SSTs/{f['dfsSstFileName']}" for f in json.loads(meta)["sstFiles"]}


def test_a_checkpoint_started_without_the_backend_is_backed_up_from_its_next_batch(
    agg_reference: Path, tmp_path: Path
) -> None:
    run_demo(tmp_path, 2, plain=True)  # Spark alone
    assert not (tmp_path / "blobs").exists() and not (tmp_path / "ckpt" / "_statebackend").exists()
    started_at = local_commit(tmp_path)
    run_demo(tmp_path, started_at + 2, conf={"spark.statebackend.retainCheckpoints": "3"})  # + the keys

    store = open_blob_store((tmp_path / "blobs").as_uri())
    history = open_checkpoint_log((tmp_path / "log").as_uri()).read_history(query_id_of(tmp_path))
    first = history[0]
    assert first.batch_id == started_at + 1, "the first batch run with the backend is checkpointed"
    version = first.batch_id + 1
    stores = {k: m for k, m in first.markers(BLOBSTORE_BACKEND).items() if k != DRIVER_STORE}
    assert sorted(stores) == ["0/0/default", "0/1/default"]
    for key, marker in stores.items():
        index = load_snapshot_index(store, marker)
        assert index.prev_snapshot_index_blob_id is None, f"{key}: the first snapshot has a diff base"
        assert index.metadata.version == version
        uploaded = {path for path, _ in index.dir_index.walk_files()}
        assert uploaded == version_files(tmp_path / "ckpt" / "state" / "0" / key.split("/")[1], version)
        assert all(store.exists(b) for b in index.dir_index.present_blob_ids())
    # Every file of those first snapshots was uploaded by them ("0 retained": no earlier snapshot).
    for key in stores:
        assert re.search(
            rf"snapshot v{version:012d} store {key}: \d+ file\(s\) .* 0 retained", sidecar_logs(tmp_path)
        )

    wipe_host(tmp_path)
    run_demo(tmp_path, REF_LAST)
    assert "restored query" in sidecar_logs(tmp_path)  # the state came back from the blob store
    assert_outputs_equal(tmp_path, agg_reference, REF_LAST)


def test_a_checkpoint_run_with_the_backend_continues_on_spark_alone(
    agg_reference: Path, tmp_path: Path
) -> None:
    run_demo(tmp_path, 2)
    assert durable_batch(tmp_path) >= 2
    # Nothing Spark keeps names the backend: it is not in the offset log's confs, the metadata, the
    # commits or the operator metadata...
    spark_files = [
        p for p in (tmp_path / "ckpt").rglob("*") if p.is_file() and "_statebackend" not in p.parts
    ]
    spark_files = [p for p in spark_files if p.suffix not in (".zip", ".sst", ".crc")]
    assert spark_files and not [p for p in spark_files if b"statebackend" in p.read_bytes()]
    # ...and nothing of ours is needed: the staging dir, the blob store and the log are gone.
    for gone in (tmp_path / "ckpt" / "_statebackend", tmp_path / "blobs", tmp_path / "log"):
        shutil.rmtree(gone)
    run_demo(tmp_path, REF_LAST, plain=True)
    assert not (tmp_path / "blobs").exists() and not (tmp_path / "ckpt" / "_statebackend").exists()
    assert_outputs_equal(tmp_path, agg_reference, REF_LAST)


def read_state(work: Path, *locations: str) -> dict[str, list[object]]:
    """tests/apps/read_state.py in its own driver: the rows each location's state store reader returns."""
    proc = subprocess.run(
        [sys.executable, str(APPS / "read_state.py"), "--work", str(work), *locations],
        cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"reader failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    found = dict(line.split(" ", 2)[1:] for line in proc.stdout.splitlines() if line.startswith("STATE "))
    return {loc: json.loads(rows) for loc, rows in found.items()}


def test_the_state_reader_restores_what_it_reads(agg_reference: Path, tmp_path: Path) -> None:
    run_demo(tmp_path, 3)
    batch = durable_batch(tmp_path)
    ckpt = str(tmp_path / "ckpt")
    reference = f"{agg_reference / 'ckpt'}@{batch}"  # the uninterrupted run's state after that batch

    # A location rebuilt by the operator tool but not yet run: logs and metadata, empty store dirs.
    wipe_host(tmp_path)
    cli = CliRunner().invoke(
        main,
        ["restore-checkpoint", "--checkpoint-location", ckpt, "--blob-url", (tmp_path / "blobs").as_uri(),
         "--log", (tmp_path / "log").as_uri()],
    )  # fmt: skip
    assert cli.exit_code == 0 and f"restored batch {batch}" in cli.output, cli.output
    store_dirs = sorted((tmp_path / "ckpt" / "state" / "0").glob("[0-9]*"))
    assert [p.name for p in store_dirs] == ["0", "1"] and not [f for d in store_dirs for f in d.glob("*.zip")]
    state = read_state(tmp_path, ckpt, reference)
    assert len(state[reference]) == 7  # every key of the query
    assert state[ckpt] == state[reference]

    # A wiped location, the reader alone: it rebuilds the location and restores the stores.
    wipe_host(tmp_path)
    state = read_state(tmp_path, ckpt, reference)
    assert state[ckpt] == state[reference]
    assert "restored query" in sidecar_logs(tmp_path)


HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ON_HDFS_PROVIDER = {"spark.sql.streaming.stateStore.providerClass": HDFS_PROVIDER}


def run_failing(work: Path, until: int, conf: dict[str, str]) -> str:
    """A demo_app run with the backend that must fail; returns its output."""
    args: list[str] = []
    for k, v in conf.items():
        args += ["--extra", f"{k}={v}"]
    proc = subprocess.run(
        app_command(work, "agg", until, args=tuple(args)), cwd=ROOT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc.stdout + proc.stderr


def test_another_provider_class_fails_the_application_at_start(tmp_path: Path) -> None:
    out = run_failing(tmp_path, 1, ON_HDFS_PROVIDER)
    refused = f"spark.sql.streaming.stateStore.providerClass={HDFS_PROVIDER} is not supported"
    assert refused in out, out[-4000:]
    assert not (tmp_path / "ckpt").exists(), "no query ran"


def test_a_checkpoint_of_the_hdfs_backed_provider_fails_its_first_commit_naming_it(tmp_path: Path) -> None:
    """Spark records the provider in the offset log, so a checkpoint started on the HDFS-backed provider
    keeps it when the backend is enabled; its first commit fails saying so, and Spark's files stay as
    they were (the run without the backend continues from them)."""
    run_demo(tmp_path, 1, plain=True, conf=ON_HDFS_PROVIDER)
    committed = local_commit(tmp_path)
    out = run_failing(tmp_path, committed + 2, {})
    assert "is written by Spark's HDFSBackedStateStoreProvider" in out, out[-4000:]
    assert "spark.statebackend.enabled=false" in out
    assert local_commit(tmp_path) == committed, "the refused batch was not committed"
    run_demo(tmp_path, committed + 2, plain=True, conf=ON_HDFS_PROVIDER)
    assert local_commit(tmp_path) == committed + 2
