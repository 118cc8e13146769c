"""transformWithState backed up every batch and restored exactly after losing every local file.

Each run is its own driver process (tests/stubs/tws_app.py: per API a ProcessingTime query with
ValueState, ListState, MapState, TTL on a value, a list and a map, and processing-time timers, and an
EventTime query with event-time timers). A test runs it with the backend to batch STOP_AT, stops or
kill -9s it, wipes what a new host would not have (checkpoint locations, spark.local.dir, the spool),
runs it again to LAST and checks:
  (a) the output of every batch equals an uninterrupted run on Spark's own provider, compared per
      state kind, so a failure names the kind (value, list, map, ttl, ptimer, etimer);
  (b) every store of both queries came back from the blob store (the sidecar's 'restored query ...');
  (c) every batch was checkpointed (CheckpointV2 in the file log, which keeps them all here), and each
      checkpoint's `_driver` snapshot holds transformWithState's operator metadata
      (`state/0/_metadata/v2/*`) and every state schema file it names (`state/0/_stateSchema/**`):
      a restarted query cannot plan without them.
The reference is sanity-checked too: state written before the wipe must show in later batches, so an
empty restore could not match it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from spark_statebackend.blobstore import open_blob_store
from spark_statebackend.checkpointlog import open_checkpoint_log
from spark_statebackend.commit import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.restore import RestoreManager
from spark_statebackend.transfer import TransferPool

from .servers.process import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
STOP_AT = 2  # the first run stops (or dies) once this batch is checkpointed
LAST = 4
KINDS = {"proc": ("value", "list", "map", "ttl", "ptimer"), "event": ("etimer",)}
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true"
# The file log keeps every checkpoint, so (c) can see each batch's.
KEEP_ALL = "spark.statebackend.retainCheckpoints=1000"


def tws_command(work: Path, api: str, until: int, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "tests.stubs.tws_app", "--api", api, "--work", str(work),
        "--until-batch", str(until), *args,
    ]  # fmt: skip


def run_tws(work: Path, api: str, until: int, *args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        tws_command(work, api, until, *args), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc.stdout


def outputs(work: Path, query: str) -> dict[int, list[list[str]]]:
    """Batch id -> output rows of `query`, batches 0..LAST (each must be there)."""
    got = {int(p.stem): json.loads(p.read_text()) for p in (work / "out" / query).glob("*.json")}
    missing = sorted(set(range(LAST + 1)) - set(got))
    assert not missing, f"{query}: no output for batches {missing}"
    return {b: rows for b, rows in got.items() if b <= LAST}


def by_kind(out: dict[int, list[list[str]]], kind: str) -> dict[int, list[list[str]]]:
    return {b: [r for r in rows if r[1] == kind] for b, rows in out.items()}


def query_ids(work: Path) -> dict[str, str]:
    """Query name (e.g. row_proc) -> query id, from the checkpoint log's latest records."""
    cplog = open_checkpoint_log((work / "log").as_uri())
    ids = {}
    for d in (work / "log").iterdir():
        latest = cplog.read_latest(d.name) if d.is_dir() else None
        if latest is not None:
            ids[latest.query_name.removeprefix("tws_")] = d.name
    return ids


def durable(work: Path) -> dict[str, int]:
    """Query name -> its newest checkpointed batch."""
    if not (work / "log").is_dir():
        return {}
    cplog = open_checkpoint_log((work / "log").as_uri())
    out = {}
    for name, qid in query_ids(work).items():
        latest = cplog.read_latest(qid)
        out[name] = latest.batch_id if latest is not None else -1
    return out


def wipe_local_state(work: Path) -> None:
    """What a new host has: no checkpoint locations, no Spark local dirs, no spool."""
    for name in ("ckpt", "local", "spool"):
        shutil.rmtree(work / name, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both APIs' queries run uninterrupted to LAST on Spark's own provider (one driver)."""
    work = tmp_path_factory.mktemp("tws-reference")
    run_tws(work, "both", LAST, "--plain")
    return work


def test_reference_carries_state_across_the_restart_point(reference: Path) -> None:
    """Every kind's output after STOP_AT depends on state written up to STOP_AT, so a query that lost
    its state (or restarted empty) could not reproduce the reference."""
    after = STOP_AT + 1
    for api in ("row", "pandas"):
        proc = outputs(reference, f"{api}_proc")
        docs = [(r[1], json.loads(r[2])) for r in proc[after]]
        counts = [d["count"] for kind, d in docs if kind == "value"]
        assert counts and max(counts) > 1, proc[after]
        assert any(len(d["events"]) > 1 for kind, d in docs if kind == "list")
        assert any(len(d["sums"]) > 1 for kind, d in docs if kind == "map")
        ttl = [d for kind, d in docs if kind == "ttl"]
        assert any(d["long_value"] is not None and d["long_list"] and d["long_map"] for d in ttl), ttl
        # 1 ms TTL: gone by the next batch, in every batch.
        assert all(d["short_value"] is None and not d["short_list"] and not d["short_map"] for d in ttl)
        fired = [d["fired"] for kind, d in docs if kind == "ptimer" and "fired" in d]
        assert fired and max(fired) > 1, proc[after]  # fired before the restart point, and now again
        assert any(d.get("registered", 0) >= 1 for kind, d in docs if kind == "ptimer")  # the day-long one
        event = outputs(reference, f"{api}_event")
        expired = [json.loads(r[2]) for b in range(after, LAST + 1) for r in event[b] if "expired" in r[2]]
        # Timers registered before the restart point (event time of batch b: (b+1) s) fire after it.
        assert any(e["expired"] <= (STOP_AT + 1) * 1000 + 500 for e in expired), event
    # The two APIs run the same logic: their outputs agree (so each is a check of the other).
    for kind in ("proc", "event"):
        assert outputs(reference, f"row_{kind}") == outputs(reference, f"pandas_{kind}")


def assert_same_output(work: Path, reference: Path, api: str) -> None:
    for qkind, kinds in KINDS.items():
        query = f"{api}_{qkind}"
        got, want = outputs(work, query), outputs(reference, query)
        wrong = []
        for kind in kinds:
            g, w = by_kind(got, kind), by_kind(want, kind)
            bad = [b for b in sorted(w) if g[b] != w[b]]
            if bad:
                wrong.append(f"{kind} from batch {bad[0]}: got {g[bad[0]]}, want {w[bad[0]]}")
        assert not wrong, f"{query}: output differs from Spark's own provider: " + "; ".join(wrong)
        assert got == want  # and nothing else (no row of an unknown kind)


def assert_restored_from_blob_store(work: Path, before_wipe: dict[str, int], api: str) -> None:
    """Both stores (partitions 0 and 1) of each query were restored, at the version the restarted
    query loaded first (the last checkpointed batch before the wipe, plus one)."""
    logs = "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))
    ids = query_ids(work)
    for qkind in KINDS:
        query = f"{api}_{qkind}"
        version = before_wipe[query] + 1
        for partition in (0, 1):
            pattern = rf"restored query {ids[query]} store 0/{partition}/default version {version} from "
            assert re.search(pattern, logs), f"{query}: store 0/{partition} version {version} not restored"


def assert_every_batch_checkpointed_with_tws_driver_files(work: Path, api: str) -> None:
    cplog = open_checkpoint_log((work / "log").as_uri())
    store = open_blob_store((work / "blobs").as_uri())
    ids = query_ids(work)
    with TransferPool(2, name="test-tws") as pool, tempfile.TemporaryDirectory() as tmp:
        restorer = RestoreManager(store, pool)
        for qkind in KINDS:
            query = f"{api}_{qkind}"
            history = cplog.read_history(ids[query])
            batches = [c.batch_id for c in history]
            assert batches == sorted(set(batches)), f"{query}: checkpoints out of order: {batches}"
            assert set(range(LAST + 1)) <= set(batches), f"{query}: batches checkpointed: {batches}"
            for cp in history:
                markers = cp.markers(BLOBSTORE_BACKEND)
                assert set(markers) == {DRIVER_STORE, "0/0/default", "0/1/default"}, sorted(markers)
                dest = Path(tmp) / query / str(cp.batch_id)
                restorer.restore(markers[DRIVER_STORE], dest)
                where = f"{query} checkpoint of batch {cp.batch_id}: _driver snapshot"
                op_meta = sorted((dest / "state" / "0" / "_metadata" / "v2").glob("[0-9]*"))
                assert op_meta, f"{where} has no state/0/_metadata/v2/*"
                schemas = set()
                for meta in op_meta:
                    doc: Any = json.loads(meta.read_text().split("\n", 1)[1])
                    assert doc["operatorInfo"]["operatorName"].startswith("transformWithState"), doc
                    for info in doc["stateStoreInfo"]:
                        schemas.update(info["stateSchemaFilePaths"])
                assert schemas, f"{where}: operator metadata names no state schema"
                ckpt = (work / "ckpt" / query).as_uri().removeprefix("file://")
                for uri in schemas:
                    rel = uri.removeprefix("file:").removeprefix(ckpt).lstrip("/")
                    assert rel.startswith("state/0/_stateSchema/"), (where, uri)
                    assert (dest / rel).is_file(), f"{where} lacks the schema file {rel} its metadata names"


@pytest.mark.parametrize(
    "api,enable,stop,extra",
    [
        pytest.param("row", "configure", "stop", (), id="row-configure-stop"),
        pytest.param("pandas", "conf-only", "kill-9", (), id="pandas-confkeys-kill9"),
        pytest.param("row", "configure", "stop", ("--extra", CHANGELOG), id="row-changelog-stop"),
    ],
)
def test_tws_restored_exactly_after_losing_all_local_state(
    api: str, enable: str, stop: str, extra: tuple[str, ...], reference: Path, tmp_path: Path
) -> None:
    args = ("--extra", KEEP_ALL, *extra, *(("--conf-only",) if enable == "conf-only" else ()))
    queries = {f"{api}_{q}" for q in KINDS}
    if stop == "stop":
        out = run_tws(tmp_path, api, STOP_AT, *args)
        assert out.count("CHECKPOINTED") == len(queries), out
    else:
        run_log = tmp_path / "killed-run.log"  # outside what the wipe removes
        proc = subprocess.Popen(
            # Each query stops after batch STOP_AT + 1 (the first one started runs ahead); the driver
            # is killed once both have STOP_AT durable, often while the slower one is mid-batch.
            tws_command(tmp_path, api, STOP_AT + 1, *args, "--stay"),
            cwd=ROOT,
            stdout=run_log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def both_durable() -> bool:
                assert proc.poll() is None, f"the driver exited early:\n{run_log.read_text()[-6000:]}"
                d = durable(tmp_path)
                return set(d) == queries and min(d.values()) >= STOP_AT

            wait_until(both_durable, 400, f"checkpoints of batch {STOP_AT}")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # driver JVM, Python workers and sidecar together
            proc.wait(timeout=30)
    before_wipe = durable(tmp_path)
    # Batches after the restart point must run after the wipe, or there is nothing to compare.
    assert max(before_wipe.values()) < LAST, before_wipe
    wipe_local_state(tmp_path)
    out = run_tws(tmp_path, api, LAST, *args)
    assert out.count("CHECKPOINTED") == len(queries), out
    assert_same_output(tmp_path, reference, api)
    assert_restored_from_blob_store(tmp_path, before_wipe, api)
    assert_every_batch_checkpointed_with_tws_driver_files(tmp_path, api)
