"""Disabling the backend without losing state (issue 22 item 2): `spark-statebackend export`, then the
same query on Spark's own RocksDB provider (spark.plugins unset).

Real Spark (local[2]) runs tests/apps/files_job.py: a file source with files arriving, dropDuplicates
on `id` (the state: every id seen) and a sink idempotent by batch id. A run with the backend processes
the first files and stops; the location's `state/` is wiped (a remote location keeps the stores only on
executors' disks and in the blob store); export writes the state back; a run without the backend then
processes files that repeat ids the first run saw. Its output must equal a reference run on Spark's
own provider throughout, batch by batch: an id seen before the switch is never emitted again (the
state came back), no batch Spark committed is run or planned again, every id comes out once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_statebackend.spark.location import latest_commit
from tests.paths import ROOT
from tests.system.test_exactly_once import add_files, durable_batch, run_job, sink_ids, spark_logs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

FIRST_FILES = 4


def add_repeats(work: Path, number: int, old: list[int], new: list[int]) -> None:
    """Input file `number`: ids the query has seen before (which dropDuplicates must drop) and new ones."""
    inp = work / "in"
    tmp = inp / f".{number}.tmp"
    tmp.write_text("".join(json.dumps({"id": r}) + "\n" for r in [*old, *new]))
    tmp.replace(inp / f"{number:03d}.json")


def second_phase_files(work: Path) -> None:
    """Files arriving after the switch: each repeats ids of the first phase and brings new ones."""
    add_repeats(work, FIRST_FILES, [0, 1, 1000, 3019], [90001, 90002])
    add_repeats(work, FIRST_FILES + 1, [2005, 90001], [90003])


def in_order(work: Path) -> None:
    """Give the input files distinct mtimes in their numbers' order: the file source takes them oldest
    first, one per batch, so both runs plan the same batches (files written within one clock tick
    would otherwise come in either order)."""
    for p in (work / "in").glob("*.json"):
        t = 1_700_000_000 + int(p.stem)
        os.utime(p, (t, t))


def outputs(work: Path) -> dict[str, list[int]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((work / "out").glob("*.json"))}


def export(work: Path) -> str:
    proc = subprocess.run(
        [
            sys.executable, "-m", "spark_statebackend.cli", "export",
            "--checkpoint-location", str(work / "ckpt"),
            "--blob-url", (work / "blobs").as_uri(),
            "--log", (work / "log").as_uri(),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"export failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_export_then_spark_without_the_backend_continues_exactly(tmp_path: Path) -> None:
    ref, work = tmp_path / "reference", tmp_path / "work"
    for w in (ref, work):
        add_files(w, 0, FIRST_FILES)
        in_order(w)
    run_job(ref, "--available-now", "--plain")
    run_job(work, "--available-now")
    ckpt = work / "ckpt"
    last = latest_commit(ckpt)
    assert last == FIRST_FILES - 1 and durable_batch(work) == last
    before = spark_logs(ckpt)

    # The stores exist only in the blob store now (as with a remote location's executors gone).
    shutil.rmtree(ckpt / "state")
    out = export(work)
    assert f"at state version {last + 1} (Spark runs batch {last + 1} next" in out
    assert sorted(p.name for p in (ckpt / "state" / "0").iterdir()) == ["0", "1", "_metadata"]
    assert (ckpt / "state" / "0" / "0" / f"{last + 1}.zip").is_file()

    for w in (ref, work):
        second_phase_files(w)
        in_order(w)
    run_job(ref, "--available-now", "--plain")
    run_job(work, "--available-now", "--plain")  # spark.plugins unset: Spark's own provider

    after = spark_logs(ckpt)
    assert {k: after.get(k) for k in before} == before, "entries Spark wrote were rewritten"
    assert latest_commit(ckpt) == latest_commit(ref / "ckpt") > last
    assert outputs(work) == outputs(ref), "the run after the export differs from Spark's own provider"
    got = sink_ids(work)
    assert len(got) == len(set(got)), f"ids emitted twice: {sorted({i for i in got if got.count(i) > 1})}"
    assert {90001, 90002, 90003} <= set(got)
