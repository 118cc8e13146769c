"""A snapshot materialised from Spark's changelogs outside Spark (spark_statebackend/spark/materialize.py),
which Spark's own RocksDB provider then loads.

Spark runs in changelog mode with `minDeltasForSnapshot` beyond the run (tests/apps/changelog_job.py), so
it never flushes or checkpoints RocksDB on a task thread and writes changelogs only. `materialize` turns
them into `<v>.zip` + SSTs; the changelogs it consumed are then deleted, so the next run can only get its
state from those files: every id seen before must stay a duplicate (a lost or wrong state counts it
again, a file Spark rejects fails the run with CANNOT_LOAD_STATE_STORE)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_statebackend.common.nofollow import opened_dir
from spark_statebackend.errors import UnsafePathError
from spark_statebackend.spark.changelogs import ChangelogError, changelog_records, read_zip_metadata
from spark_statebackend.spark.materialize import base_snapshot, materialize

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "apps" / "changelog_job.py"


def _run(work: Path, *ranges: str) -> list[int]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    cmd = [sys.executable, str(JOB), "--work", str(work), *(a for r in ranges for a in ("--ids", r))]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-4000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("COUNTS "))
    counts: list[int] = json.loads(line.removeprefix("COUNTS "))
    return counts


def _drop_changelogs(store: Path, versions: range) -> None:
    for v in versions:
        (store / f"{v}.changelog").unlink()
        (store / f".{v}.changelog.crc").unlink(missing_ok=True)


def _base(store: Path, version: int) -> int:
    with opened_dir(store, ()) as fd, opened_dir(store, ("SSTs",)) as sst_fd:
        assert fd is not None
        return base_snapshot(fd, sst_fd, version)[0]


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_spark_loads_snapshots_materialised_from_its_changelogs(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    store = ckpt / "state" / "0" / "0"
    assert _run(tmp_path, "0:100", "50:150", "100:200") == [100, 50, 50]
    assert not list(store.glob("*.zip")), "Spark snapshotted on its own: minDeltasForSnapshot ignored"

    # From empty state and three changelogs; Spark then loads version 3 from this zip alone.
    zip3 = materialize(ckpt, store, 3, tmp_path / "scratch3")
    assert zip3 == store / "3.zip"
    assert read_zip_metadata(zip3, str(zip3))["numKeys"] == 200
    assert materialize(ckpt, store, 3, tmp_path / "scratch3b") is None  # there already: left alone
    _drop_changelogs(store, range(1, 4))
    assert _run(tmp_path, "150:250", "0:300") == [50, 50]

    # From our own zip and the two changelogs Spark wrote on top of it.
    assert _base(store, 5) == 3
    zip5 = materialize(ckpt, store, 5, tmp_path / "scratch5")
    assert zip5 is not None and read_zip_metadata(zip5, str(zip5))["numKeys"] == 300
    _drop_changelogs(store, range(4, 6))
    zip3.unlink()
    assert _run(tmp_path, "0:320") == [20]


def test_missing_changelog_is_named_and_nothing_is_published(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "2.changelog").write_bytes(b"")
    with pytest.raises(ChangelogError, match=r"1\.changelog missing"):
        materialize(tmp_path, store, 2, tmp_path / "scratch")
    assert not list(store.glob("*.zip"))


def test_truncated_changelog_is_named(tmp_path: Path) -> None:
    data = b"LZ4Block\x10" + (4).to_bytes(4, "little") * 2 + b"\0\0\0\0" + b"\0\0\0\x05"
    with pytest.raises(ChangelogError, match=r"1\.changelog: truncated"):
        list(changelog_records(data, "1.changelog"))


def test_a_symlinked_sst_dir_is_never_written_through(tmp_path: Path) -> None:
    store = tmp_path / "ckpt" / "state" / "0" / "0"
    store.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store / "SSTs").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="SSTs"):
        materialize(tmp_path / "ckpt", store, 1, tmp_path / "scratch")
    assert list(elsewhere.iterdir()) == [] and not list(store.glob("*.zip"))
