"""Prototype of issue 23 item 2 (tools/changelog_snapshot.py): a snapshot materialised from Spark's
changelogs outside Spark, which Spark's own RocksDB provider then loads.

Spark runs in changelog mode with `minDeltasForSnapshot` beyond the run (tests/apps/changelog_job.py), so
it never flushes or checkpoints RocksDB on a task thread and writes changelogs only. The prototype turns
them into `<v>.zip` + SSTs; the changelogs it consumed are then deleted, so the next run can only get its
state from those files: every id seen before must stay a duplicate (a lost or wrong state counts it
again, a file Spark rejects fails the run with CANNOT_LOAD_STATE_STORE)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "apps" / "changelog_job.py"


def _prototype() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "changelog_snapshot", ROOT / "tools" / "changelog_snapshot.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


cs = _prototype()


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


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_spark_loads_snapshots_materialised_from_its_changelogs(tmp_path: Path) -> None:
    store = tmp_path / "ckpt" / "state" / "0" / "0"
    assert _run(tmp_path, "0:100", "50:150", "100:200") == [100, 50, 50]
    assert not list(store.glob("*.zip")), "Spark snapshotted on its own: minDeltasForSnapshot ignored"

    # From empty state and three changelogs; Spark then loads version 3 from this zip alone.
    zip3 = cs.materialize(store, 3, tmp_path / "scratch3")
    assert zip3 == store / "3.zip"
    assert cs.read_metadata(zip3)["numKeys"] == 200
    _drop_changelogs(store, range(1, 4))
    assert _run(tmp_path, "150:250", "0:300") == [50, 50]

    # From our own zip and the two changelogs Spark wrote on top of it.
    assert cs.base_snapshot(store, 5) == 3
    zip5 = cs.materialize(store, 5, tmp_path / "scratch5")
    assert cs.read_metadata(zip5)["numKeys"] == 300
    _drop_changelogs(store, range(4, 6))
    zip3.unlink()
    assert _run(tmp_path, "0:320") == [20]


def test_missing_changelog_is_named_and_nothing_is_published(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "2.changelog").write_bytes(b"")
    with pytest.raises(cs.SnapshotError, match=r"1\.changelog missing"):
        cs.materialize(store, 2, tmp_path / "scratch")
    assert not list(store.glob("*.zip"))


def test_truncated_changelog_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "1.changelog"
    bad.write_bytes(b"LZ4Block\x10" + (4).to_bytes(4, "little") * 2 + b"\0\0\0\0" + b"\0\0\0\x05")
    with pytest.raises(cs.SnapshotError, match=r"1\.changelog: truncated"):
        list(cs.changelog_records(bad))
