"""Driving demo_app (spark_statebackend/demo_app.py) runs in real Spark and checking what they leave:
the command line of a driver run, its results, its newest durable batch, and the blob store being
exactly what the retained checkpoints reference.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.gc import GarbageCollector
from spark_statebackend.lifecycle.plans import plan_batches, plan_id
from spark_statebackend.stores import BlobStore, open_blob_store

ROOT = Path(__file__).resolve().parent.parent
LAST = 6  # a run goes through batches 0..LAST unless told otherwise


def app_command(
    work: Path, shape: str, until: int, *, master: str = "local[2]", args: tuple[str, ...] = ()
) -> list[str]:
    """The command line of one driver run (spark_statebackend/demo_app.py)."""
    return [
        sys.executable, "-m", "spark_statebackend.demo_app", "--shape", shape, "--work", str(work),
        "--until-batch", str(until), "--master", master, *args,
    ]  # fmt: skip


def durable_batch(work: Path) -> int:
    """The newest checkpointed batch of the query under work/log; -1 before the first checkpoint."""
    log_dir = work / "log"
    if not log_dir.is_dir():
        return -1
    cplog = open_checkpoint_log(log_dir.as_uri())
    latest = [cplog.read_latest(q.name) for q in log_dir.iterdir() if q.is_dir()]
    return max((c.batch_id for c in latest if c is not None), default=-1)


def result(work: Path, shape: str, last: int = LAST) -> object:
    """The query's result as of batch `last`, whatever restarts happened (see demo_app)."""
    outputs = {int(p.stem): json.loads(p.read_text()) for p in (work / "out").glob("*.json")}
    assert set(range(last + 1)) <= set(outputs), (
        f"batches missing: {sorted(set(range(last + 1)) - set(outputs))}"
    )
    if shape == "agg":  # update mode: the newest row per key is the state
        state: dict[int, list[object]] = {}
        for b in sorted(outputs):
            if b <= last:
                for row in outputs[b]:
                    state[row[0]] = row
        return sorted(state.values())
    return sorted(tuple(r) for b, rows in outputs.items() if b <= last for r in rows)


def wipe_local_state(work: Path) -> None:
    """What a new host has: no checkpoint location, no Spark local dirs, no spool."""
    for name in ("ckpt", "local", "spool"):
        shutil.rmtree(work / name, ignore_errors=True)


def query_id_of(work: Path) -> str:
    qdirs = [p.name for p in (work / "log").iterdir() if p.is_dir()]
    assert len(qdirs) == 1, qdirs
    return qdirs[0]


def referenced_blobs(store: BlobStore, log_url: str, query_id: str) -> set[str]:
    cplog = open_checkpoint_log(log_url)
    refs: set[str] = set()
    for cp in cplog.read_history(query_id):
        for marker in cp.markers(BLOBSTORE_BACKEND).values():
            refs.add(marker)
            refs.update(load_snapshot_index(store, marker).dir_index.present_blob_ids())
    return refs


def assert_blob_store_exact(work: Path, log_url: str | None = None) -> None:
    """After cleanup the store holds exactly what retained checkpoints reference, plus the query's
    locator and the plans of batches Spark planned after the latest checkpoint (permanent until a
    checkpoint covers them, lifecycle/plans.py); anything else still carries a TTL and goes at the
    sweep. A plan a checkpoint covers is gone."""
    store = open_blob_store((work / "blobs").as_uri())
    qid = query_id_of(work)
    url = log_url or (work / "log").as_uri()
    refs = referenced_blobs(store, url, qid)
    latest = open_checkpoint_log(url).read_latest(qid)
    assert latest is not None, f"no checkpoint of {qid}"
    covered = [b for b in plan_batches(store, qid) if b <= latest.batch_id]
    assert not covered, f"plans of batches {covered} outlived checkpoint {latest.batch_id} that covers them"
    refs |= {plan_id(qid, b) for b in plan_batches(store, qid)}
    present = {b.blob_id for b in store.list("")}
    extra = {b for b in present - refs if not b.startswith("queries/")}
    assert refs <= present, f"referenced blobs missing: {sorted(refs - present)[:5]}"
    assert all(store.stat(b).expires_at_ms is not None for b in extra), sorted(extra)[:5]
    store.sweep_expired(now_ms=int(time.time() * 1000) + 30 * 86400 * 1000)
    left = {b.blob_id for b in store.list("") if not b.blob_id.startswith("queries/")}
    assert left == refs


def assert_exact_after_gc(work: Path) -> None:
    """GC (no grace) deletes none of the blobs the retained checkpoints reference; after it and the
    TTL sweep the store holds exactly those (assert_blob_store_exact)."""
    store = open_blob_store((work / "blobs").as_uri())
    log_url = (work / "log").as_uri()
    refs = referenced_blobs(store, log_url, query_id_of(work))
    with TransferPool(2) as pool:
        GarbageCollector(store, open_checkpoint_log(log_url), pool, grace_seconds=0).run()
    missing = refs - {b.blob_id for b in store.list("")}
    assert not missing, f"GC deleted referenced blobs: {sorted(missing)[:5]}"
    assert_blob_store_exact(work)
