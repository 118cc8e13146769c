"""The randomized fault run (benchmarks/chaos.py, `make chaos`): its fault plan comes from the seed alone,
its output checks notice a lost or a duplicated record (by batch for the rate queries; by record id in
the committed output of the file queries, reading only what `_spark_metadata` lists, and their state),
and a short run on real Spark (every kind of fault at least once, a restart on a wiped host and a
clean stop among them) loses nothing and leaves the blob store exact.
"""

from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path

import pytest

from benchmarks import chaos


def faults(seed: int, n: int = 100, gap: tuple[float, float] = (2.0, 12.0)) -> list[chaos.Fault]:
    return list(itertools.islice(chaos.plan(seed, gap), n))


def test_the_seed_fixes_the_fault_plan() -> None:
    assert faults(1234) == faults(1234)
    assert faults(1234) != faults(1235)
    # Nothing else feeds the plan: drawing it again after other random use gives the same faults.
    import random

    random.seed(99)
    assert faults(1234, gap=(2.0, 6.0)) == faults(1234, gap=(2.0, 6.0))


def test_every_round_holds_every_kind_and_parameters_stay_in_bounds() -> None:
    plan = faults(11, 10 * len(chaos.ROUND), gap=(2.0, 6.0))
    for start in range(0, len(plan), len(chaos.ROUND)):
        kinds = collections.Counter(f.kind for f in plan[start : start + len(chaos.ROUND)])
        assert kinds == collections.Counter(chaos.ROUND)
    assert [f.n for f in plan] == list(range(1, len(plan) + 1))
    assert next(f for f in plan if f.kind == "driver_kill").wiped, "the first driver kill wipes the host"
    assert any(f.kind == "driver_kill" and not f.wiped for f in plan)
    assert {f.how for f in plan if f.kind == "clean_stop"} == {"quit", "sigterm"}
    assert {f.wiped for f in plan if f.kind == "clean_stop"} == {True, False}
    for f in plan:
        assert 2.0 <= f.delay <= 6.0
        if f.kind in chaos.DURATIONS:
            lo, hi = chaos.DURATIONS[f.kind]
            assert lo <= f.seconds <= hi


def test_the_rig_plan_adds_host_losses_to_every_round() -> None:
    plan = list(itertools.islice(chaos.plan(5, (2.0, 6.0), rig=True), 4 * len(chaos.RIG_ROUND)))
    for start in range(0, len(plan), len(chaos.RIG_ROUND)):
        kinds = collections.Counter(f.kind for f in plan[start : start + len(chaos.RIG_ROUND)])
        assert kinds == collections.Counter(chaos.RIG_ROUND) and kinds["host_loss"] == 2
    assert set(chaos.RIG_KINDS) == {f.kind for f in plan}
    assert "host_loss" not in {f.kind for f in faults(5, 4 * len(chaos.ROUND))}


def test_only_plans_after_the_latest_checkpoint_are_kept() -> None:
    present = {
        "plans/q1/000000000004.json",
        "plans/q1/000000000005.json",
        "plans/q1/000000000006.json",
        "plans/q2/000000000009.json",
        "files/q1/x",
    }
    assert chaos.pending_plans(present, "q1", 4) == {
        "plans/q1/000000000005.json",
        "plans/q1/000000000006.json",
    }
    assert chaos.pending_plans(present, "q2", 9) == set()


def test_pick_is_deterministic_for_a_candidate_list() -> None:
    cands = ["sidecar-0", "sidecar-1", "sidecar-driver"]
    assert [chaos.pick(cands, x) for x in (0.0, 0.34, 0.67, 0.999999)] == [*cands, cands[-1]]


def test_the_output_check_counts_lost_and_extra_records(tmp_path: Path) -> None:
    def write(root: Path, batches: dict[int, list[list[int]]]) -> None:
        (root / "agg").mkdir(parents=True)
        for b, rows in batches.items():
            (root / "agg" / f"{b}.json").write_text(json.dumps(rows))

    write(tmp_path / "ref", {0: [[1, 1], [2, 1]], 1: [[1, 2]], 2: [[3, 1]]})
    write(tmp_path / "same", {0: [[2, 1], [1, 1]], 1: [[1, 2]], 2: [[3, 1]]})
    write(tmp_path / "bad", {0: [[1, 1], [2, 1], [2, 1]], 2: [[3, 2]]})
    same = chaos.compare_outputs(tmp_path / "same", tmp_path / "ref", {"agg": 2})
    assert same == {"records_compared": 4, "records_lost": 0, "records_extra": 0, "first_mismatch": None}
    bad = chaos.compare_outputs(tmp_path / "bad", tmp_path / "ref", {"agg": 2})
    # batch 0 has a duplicate, batch 1 is missing, batch 2 has a different row
    assert (bad["records_lost"], bad["records_extra"]) == (2, 2)
    assert bad["first_mismatch"]["batch"] == 0 and bad["first_mismatch"]["extra"] == [[2, 1]]
    files_ok = {"ok": True}
    assert not chaos.passed({"incidents": [], "output": bad, "files": files_ok, "blobs": {"ok": True}})
    assert chaos.passed({"incidents": [], "output": same, "files": files_ok, "blobs": {"ok": True}})
    assert not chaos.passed({"incidents": [], "output": same, "files": {"ok": False}, "blobs": {"ok": True}})


def write_sink_log(sink: Path, entries: dict[str, list[tuple[str, str]]]) -> None:
    """A `_spark_metadata` log as Spark's file sink writes it: name -> [(action, part file)]."""
    (sink / "_spark_metadata").mkdir(parents=True)
    for name, files in entries.items():
        lines = ["v1"] + [
            json.dumps({"path": (sink / f).as_uri(), "size": 1, "isDir": False, "action": a})
            for a, f in files
        ]
        (sink / "_spark_metadata" / name).write_text("\n".join(lines))


def write_records(path: Path, records: list[tuple[int, int]]) -> None:
    path.write_text("".join(json.dumps({"id": i, "key": k}) + "\n" for i, k in records))


def test_the_files_check_reads_only_committed_output_and_counts_by_record(tmp_path: Path) -> None:
    expected = {i: i % 2 for i in range(8)}
    sink, fb = tmp_path / "files_sink", tmp_path / "files_fb"
    sink.mkdir()
    fb.mkdir()
    write_records(sink / "p0", [(0, 0), (1, 1)])
    write_records(sink / "p1", [(2, 0), (3, 1)])
    write_records(sink / "p2", [(4, 0), (5, 1)])
    write_records(sink / "p3", [(6, 0), (7, 1)])
    write_records(sink / "stray", [(0, 0), (6, 0)])  # a part file no batch committed: not output
    write_records(sink / "old", [(9, 1)])  # committed, then deleted by a compaction: not output
    write_sink_log(
        sink,
        {
            "0": [("add", "p0"), ("add", "old")],  # older than the compact file: not read
            "1.compact": [("add", "p0"), ("add", "p1"), ("add", "old")],
            "2": [("add", "p2"), ("delete", "old")],
            "3": [("add", "p3")],
        },
    )
    rows = {0: [[0, [0, 2], 2, 2], [1, [1, 3], 2, 4]], 1: [[0, [4, 6], 4, 12], [1, [5, 7], 4, 16]]}
    for b, r in rows.items():
        (fb / f"{b}.json").write_text(json.dumps(r))
    good = chaos.check_files(tmp_path, expected)
    assert good["ok"] and (good["records_lost"], good["records_extra"]) == (0, 0), good
    assert good["files_sink"]["committed_files"] == 4

    # The sink's batch 3 skipped (a batch planned again with other files), foreachBatch's batch 1 written
    # by a run whose state had lost batch 0 (counts start again), and a record of key 1 twice.
    (sink / "_spark_metadata" / "3").write_text("v1")
    rows[1] = [[0, [4, 6], 2, 10], [1, [5, 7, 7], 5, 23]]
    (fb / "1.json").write_text(json.dumps(rows[1]))
    bad = chaos.check_files(tmp_path, expected)
    assert not bad["ok"]
    assert (bad["files_sink"]["records_lost"], bad["files_sink"]["first_lost"]) == (2, [6, 7])
    assert (bad["files_fb"]["records_lost"], bad["files_fb"]["records_extra"]) == (0, 1)
    state = bad["files_fb"]["state"]
    assert state["inconsistent_rows"] == 1 and state["first_inconsistent"][0]["key"] == 0
    assert state["final_state_wrong"] == {
        0: {"got": [2, 10], "reference": [4, 12]},
        1: {"got": [5, 23], "reference": [4, 16]},
    }
    assert (bad["records_lost"], bad["records_extra"]) == (2, 1)


#: Seed 65 injects every kind within its first 7 faults: first a driver kill (on a wiped host, as every
#: first driver kill is), then a clean stop by SIGTERM to the driver's JVM with a restart on the same
#: host, then an executor kill, a sidecar kill, a stall, a broker freeze and a 503 storm.
SHORT_SEED = 65


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_short_chaos_run_loses_nothing_and_leaves_the_blob_store_exact(tmp_path: Path) -> None:
    opts = chaos.Options(seed=SHORT_SEED, minutes=1.0, work=tmp_path / "chaos", gap=(2.0, 6.0))
    report = chaos.Chaos(opts).run()
    path = chaos.write_report(report, opts)
    brief = (
        f"report {path}: "
        + json.dumps({k: v for k, v in report.items() if k not in ("fault_log",)}, default=str)[:6000]
    )
    assert report["incidents"] == [], brief
    assert all(report["faults"][k] >= 1 for k in chaos.KINDS), brief
    assert report["restarts"]["wiped"] >= 1 and report["restarts"]["wiped_verification"] == 1, brief
    out = report["output"]
    assert out["records_compared"] > 0, brief
    assert (out["records_lost"], out["records_extra"], out["first_mismatch"]) == (0, 0, None), brief
    files = report["files"]
    assert files["records_expected"] > 0 and files["files_fb"]["state"]["keys"] > 0, brief
    assert (files["records_lost"], files["records_extra"]) == (0, 0) and files["ok"], brief
    blobs = report["blobs"]
    assert blobs["ok"] and blobs["referenced"] > 0 and not blobs["gc_deleted_referenced"], brief
    assert report["passed"], brief
