"""transformWithState backed up every batch and restored exactly after losing every local file.

Each run is its own driver process (tests/stubs/tws_app.py): per API (the Row API and
transformWithStateInPandas) one query with two transformWithState operators, a ProcessingTime one
(ValueState, ListState, MapState, TTL on a value, a list and a map, processing-time timers) and an
EventTime one (event-time timers). A test runs both APIs' queries with the backend to batch STOP_AT,
stops or kill -9s the driver, wipes what a new host would not have (checkpoint locations,
spark.local.dir, the spool), runs them again to LAST and checks, per API:
  (a) the restarted driver ran exactly the batches after the last checkpointed one, and the output
      of every batch equals an uninterrupted run on Spark's own provider, compared per state kind, so
      a failure names the API and the kind (value, list, map, ttl, ptimer, etimer);
  (b) every store (2 operators x 2 partitions) came back from the blob store at the version the
      restarted query loaded (the sidecar's 'restored query ...');
  (c) every batch was checkpointed (CheckpointV2 in the file log, which keeps them all here), and each
      checkpoint's `_driver` snapshot holds both operators' metadata (`state/<op>/_metadata/v2/*`) and
      every state schema file it names (`state/<op>/_stateSchema/**`): a restarted query cannot plan
      without them.
The two cases: configure() and a clean stop with Spark's default (no changelog checkpointing); conf
keys only (spark.jars, spark.plugins, spark.statebackend.*) and kill -9 with changelog checkpointing
on (transformWithState forces a snapshot, 1.zip, when it creates its column families; later versions
are changelogs on top of it). One driver runs both APIs so the file stays within a few minutes (every
driver start pays the JVM, the sidecar and transformWithState's Python planning workers).
The reference is sanity-checked too: state written before the wipe shows in later batches, so an
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
import time
from pathlib import Path
from typing import Any

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import open_blob_store
from tests.paths import ROOT
from tests.servers.process import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

STOP_AT = 2  # the first run stops (or dies) once this batch is checkpointed
LAST = 4
APIS = ("row", "pandas")  # query names too
KINDS = ("value", "list", "map", "ttl", "ptimer", "etimer")  # operator 0: all but etimer
STORES = {f"{op}/{p}/default" for op in (0, 1) for p in (0, 1)}
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true"
# The file log keeps every checkpoint, so (c) can see each batch's.
KEEP_ALL = "spark.statebackend.retainCheckpoints=1000"


def tws_command(work: Path, until: int, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "tests.stubs.tws_app", "--api", "both", "--work", str(work),
        "--until-batch", str(until), *args,
    ]  # fmt: skip


def run_tws(work: Path, until: int, *args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        tws_command(work, until, *args), cwd=ROOT, capture_output=True, text=True, timeout=timeout
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
    """Query name (row, pandas) -> query id, from the checkpoint log's latest records."""
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
    run_tws(work, LAST, "--plain")
    return work


def test_reference_carries_state_across_the_restart_point(reference: Path) -> None:
    """Every kind's output after STOP_AT depends on state written up to STOP_AT, so a query that lost
    its state (or restarted empty) could not reproduce the reference."""
    after = STOP_AT + 1
    for api in APIS:
        out = outputs(reference, api)
        docs = [(r[1], json.loads(r[2])) for r in out[after]]
        counts = [d["count"] for kind, d in docs if kind == "value"]
        assert counts and max(counts) > 1, out[after]
        assert any(len(d["events"]) > 1 for kind, d in docs if kind == "list")
        assert any(len(d["sums"]) > 1 for kind, d in docs if kind == "map")
        ttl = [d for kind, d in docs if kind == "ttl"]
        assert any(d["long_value"] is not None and d["long_list"] and d["long_map"] for d in ttl), ttl
        # 1 ms TTL: gone by the next batch, in every batch.
        assert all(d["short_value"] is None and not d["short_list"] and not d["short_map"] for d in ttl)
        fired = [d["fired"] for kind, d in docs if kind == "ptimer" and "fired" in d]
        assert fired and max(fired) > 1, out[after]  # fired before the restart point, and now again
        assert any(d.get("registered", 0) >= 1 for kind, d in docs if kind == "ptimer")  # the day-long one
        expired = [json.loads(r[2]) for b in range(after, LAST + 1) for r in out[b] if r[1] == "etimer"]
        # Timers registered up to the restart point (event time of batch b: (b+1) s) fire after it.
        assert any(e.get("expired", 1e18) <= (STOP_AT + 1) * 1000 + 500 for e in expired), expired
    # The two APIs run the same logic: their outputs agree (so each is a check of the other).
    assert outputs(reference, "row") == outputs(reference, "pandas")


def assert_same_output(work: Path, reference: Path) -> None:
    for api in APIS:
        got, want = outputs(work, api), outputs(reference, api)
        wrong = []
        for kind in KINDS:
            g, w = by_kind(got, kind), by_kind(want, kind)
            bad = [b for b in sorted(w) if g[b] != w[b]]
            if bad:
                wrong.append(f"{kind} from batch {bad[0]}: got {g[bad[0]]}, want {w[bad[0]]}")
        assert not wrong, f"{api}: output differs from Spark's own provider: " + "; ".join(wrong)
        assert got == want  # and nothing else (no row of an unknown kind)


def assert_resumed_after(work: Path, before_wipe: dict[str, int], restarted_ns: int) -> None:
    """The restarted driver ran exactly the batches after the last checkpointed one: a query that
    started over from batch 0 would write the same output (its input is the same), so (a) alone
    cannot tell a restore from a fresh start."""
    for api in APIS:
        rerun = [
            b
            for b in range(LAST + 1)
            if (work / "out" / api / f"{b}.json").stat().st_mtime_ns >= restarted_ns
        ]
        assert rerun == list(range(before_wipe[api] + 1, LAST + 1)), (api, before_wipe, rerun)


def assert_restored_from_blob_store(work: Path, before_wipe: dict[str, int]) -> None:
    """Every store of each query was restored at the version the restarted query loaded first (the
    last checkpointed batch before the wipe, plus one)."""
    logs = "".join(p.read_text() for p in (work / "spool").rglob("sidecar.log"))
    ids = query_ids(work)
    for api in APIS:
        version = before_wipe[api] + 1
        for store in sorted(STORES):
            pattern = rf"restored query {ids[api]} store {store} version {version} from "
            assert re.search(pattern, logs), f"{api}: store {store} version {version} not restored"


def assert_every_batch_checkpointed_with_tws_driver_files(work: Path, changelog: bool) -> None:
    cplog = open_checkpoint_log((work / "log").as_uri())
    store = open_blob_store((work / "blobs").as_uri())
    ids = query_ids(work)
    with TransferPool(2, name="test-tws") as pool, tempfile.TemporaryDirectory() as tmp:
        restorer = RestoreManager(store, pool)
        for api in APIS:
            history = cplog.read_history(ids[api])
            batches = [c.batch_id for c in history]
            assert batches == sorted(set(batches)), f"{api}: checkpoints out of order: {batches}"
            assert set(range(LAST + 1)) <= set(batches), f"{api}: batches checkpointed: {batches}"
            for cp in history:
                markers = cp.markers(BLOBSTORE_BACKEND)
                assert set(markers) == {DRIVER_STORE, *STORES}, sorted(markers)
                # Changelog mode: version 1 is the snapshot transformWithState forces when it creates
                # its column families; every later version replays changelogs on top of it.
                assert cp.changelog_checkpointing == (changelog and cp.batch_id >= 1), cp
                dest = Path(tmp) / api / str(cp.batch_id)
                restorer.restore(markers[DRIVER_STORE], dest)
                for op in (0, 1):
                    assert_operator_files(dest, work / "ckpt" / api, op, f"{api} batch {cp.batch_id}")


def assert_operator_files(snapshot: Path, location: Path, op: int, what: str) -> None:
    """`snapshot` (a restored `_driver` snapshot of checkpoint location `location`) holds operator
    `op`'s transformWithState metadata and every state schema file that metadata names."""
    where = f"{what}: _driver snapshot, operator {op}"
    op_meta = sorted((snapshot / "state" / str(op) / "_metadata" / "v2").glob("[0-9]*"))
    assert op_meta, f"{where}: no state/{op}/_metadata/v2/*"
    schemas = set()
    for meta in op_meta:
        doc: Any = json.loads(meta.read_text().split("\n", 1)[1])
        assert doc["operatorInfo"]["operatorName"].startswith("transformWithState"), doc
        for info in doc["stateStoreInfo"]:
            schemas.update(info["stateSchemaFilePaths"])
    assert schemas, f"{where}: the operator metadata names no state schema"
    for uri in schemas:
        # Absolute URIs of the location the query ran at (a restore must go back to the same path).
        rel = Path(uri.removeprefix("file:")).relative_to(location)
        assert rel.parts[:3] == ("state", str(op), "_stateSchema"), (where, uri)
        assert (snapshot / rel).is_file(), f"{where}: lacks the schema file {rel} its metadata names"


@pytest.mark.parametrize(
    "enable,stop,changelog",
    [
        pytest.param("configure", "stop", False, id="configure-stop"),
        pytest.param("conf-keys", "kill-9", True, id="confkeys-kill9-changelog"),
    ],
)
def test_tws_restored_exactly_after_losing_all_local_state(
    enable: str, stop: str, changelog: bool, reference: Path, tmp_path: Path
) -> None:
    args = ["--extra", KEEP_ALL]
    if changelog:
        args += ["--extra", CHANGELOG]
    if enable == "conf-keys":
        args.append("--conf-only")
    if stop == "stop":
        out = run_tws(tmp_path, STOP_AT, *args)
        assert out.count("CHECKPOINTED") == len(APIS), out
    else:
        run_log = tmp_path / "killed-run.log"  # outside what the wipe removes
        with run_log.open("w") as log_file:
            proc = subprocess.Popen(
                # Each query stops after batch STOP_AT + 1 (the first one started runs ahead); the
                # driver is killed once both have STOP_AT durable, often while one is mid-batch.
                tws_command(tmp_path, STOP_AT + 1, *args, "--stay"),
                cwd=ROOT,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:

            def both_durable() -> bool:
                assert proc.poll() is None, f"the driver exited early:\n{run_log.read_text()[-6000:]}"
                d = durable(tmp_path)
                return set(d) == set(APIS) and min(d.values()) >= STOP_AT

            wait_until(both_durable, 400, f"checkpoints of batch {STOP_AT}")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # driver JVM, Python workers and sidecar together
            proc.wait(timeout=30)
    before_wipe = durable(tmp_path)
    # Batches after the restart point must run after the wipe, or there is nothing to compare.
    assert max(before_wipe.values()) < LAST, before_wipe
    wipe_local_state(tmp_path)
    restarted_ns = time.time_ns()
    out = run_tws(tmp_path, LAST, *args)
    assert out.count("CHECKPOINTED") == len(APIS), out
    assert_resumed_after(tmp_path, before_wipe, restarted_ns)
    assert_same_output(tmp_path, reference)
    assert_restored_from_blob_store(tmp_path, before_wipe)
    assert_every_batch_checkpointed_with_tws_driver_files(tmp_path, changelog)
    if changelog:  # the mode was on: Spark wrote changelogs (after the restored snapshot 1.zip)
        for api in APIS:
            for op in (0, 1):
                logs = list((tmp_path / "ckpt" / api / "state" / str(op)).rglob("*.changelog"))
                assert logs, f"{api} operator {op}: no changelog written with changelog checkpointing on"
