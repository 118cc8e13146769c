"""A real sidecar with checkpoints on a local blob store and a file checkpoint log (`Rig`, `build_rig`),
and the spool documents tests hand it: restore requests, snapshot events, progress events.

The `rig` and `gated` fixtures (tests/conftest.py) build one; a test module needing another shape
calls `build_rig` itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import orjson

from spark_statebackend.checkpoints.checkpoint import (
    BLOBSTORE_BACKEND,
    DRIVER_STORE,
    CheckpointId,
    CheckpointV2,
)
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from spark_statebackend.stores import BlobStore, LocalBlobStore, Sink

from .trees import make_tree

QID = "7d2a9c41-0b3e-4f5a-8c6d-1e2f3a4b5c6d"
KEY = "0/0/default"
KEY_DIR = "0/0"  # state/<operator>/<partition>


@dataclass
class Rig:
    """A real Sidecar on a local blob store and a file checkpoint log, with checkpoints of batches
    0..n-1 (state versions 1..n) whose snapshots are the store dir and the `_driver` files."""

    tmp: Path
    settings: Settings
    sidecar: Sidecar
    location: Path
    checkpoints: list[CheckpointV2]

    @property
    def store(self):  # type: ignore[no-untyped-def]
        return self.sidecar.store

    def blob_path(self, blob_id: str) -> Path:
        return self.tmp / "blobs" / "blobs" / blob_id

    def index_of(self, batch: int, key: str = KEY) -> str:
        marker = self.checkpoints[batch].marker(BLOBSTORE_BACKEND, key)
        assert marker is not None
        return marker

    def file_blob(self, batch: int, name: str) -> str:
        index = load_snapshot_index(self.store, self.index_of(batch))
        return next(f.blobs[0].blob_id for rel, f in index.dir_index.walk_files() if rel == name)

    def checkpoint(self, batch: int, markers: dict[str, str]) -> CheckpointV2:
        """Write checkpoint `batch`: the latest checkpoint's markers with `markers` over them."""
        latest = self.checkpoints[-1]
        cp = CheckpointV2(
            CheckpointId.create(batch, after=latest.checkpoint_id),
            QID,
            state_checkpoint_markers={BLOBSTORE_BACKEND: {**latest.markers(BLOBSTORE_BACKEND), **markers}},
        )
        self.sidecar.log.write(cp)
        self.checkpoints.append(cp)
        return cp

    def durable(self) -> tuple[list[tuple[str, int, int | None]], list[tuple[str, int]]]:
        """Everything durable: the blob store listing (id, size, expiry) and the log's history."""
        blobs = sorted((b.blob_id, b.size, b.expires_at_ms) for b in self.store.list(""))
        history = [(str(c.checkpoint_id), c.batch_id) for c in self.sidecar.log.read_history(QID)]
        return blobs, history


def rig_settings(tmp: Path, retain: int) -> Settings:
    return Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp / "log").as_uri(),
            PREFIX + "retainCheckpoints": str(retain),
        }
    )


def build_rig(tmp: Path, batches: int, retain: int, store: BlobStore | None = None) -> Rig:
    settings = rig_settings(tmp, retain)
    sidecar = Sidecar(sp.Spool(tmp / "spool"), "driver", settings, store=store)
    sidecar.store.ensure_ready()
    sidecar.log.create_resources()
    location = tmp / "cp"
    make_tree(location, {"metadata": orjson.dumps({"id": QID}) + b"\n"})
    manager = sidecar.uploads.bases.manager(QID)
    checkpoints: list[CheckpointV2] = []
    last: CheckpointId | None = None
    for n in range(batches):
        make_tree(location, {"offsets": {str(n): b"offsets %d" % n}, "commits": {str(n): b"commits %d" % n}})
        store_dir = make_tree(tmp / "state" / f"v{n + 1}", {f"{n + 1}.zip": b"zip %d" % n, f"{n}.sst": b"s"})
        driver_dir = tmp / "driver" / f"b{n}"
        make_tree(driver_dir, {"metadata": (location / "metadata").read_bytes()})
        for sub in ("offsets", "commits"):  # as stage_driver_files: entries N-1 and N
            for k in range(max(0, n - 1), n + 1):
                make_tree(driver_dir, {sub: {str(k): (location / sub / str(k)).read_bytes()}})
        markers = manager.upload(
            f"b{n}", {KEY: store_dir, DRIVER_STORE: driver_dir}, versions={KEY: n + 1, DRIVER_STORE: n}
        )
        last = CheckpointId.create(n, after=last)
        cp = CheckpointV2(
            last, QID, input_offsets={"src": str(n)}, state_checkpoint_markers={BLOBSTORE_BACKEND: markers}
        )
        sidecar.log.write(cp)
        sidecar.log.retain(QID, retain)
        manager.cleanup(markers, delete_replaced=retain == 1)
        checkpoints.append(cp)
    return Rig(tmp, settings, sidecar, location, checkpoints)


def restore_request(rig: Rig, version: int, dfs_dir: Path, **over: object) -> sp.RestoreRequest:
    fields: dict[str, object] = {
        "request_id": f"r{version}",
        "query_id": QID,
        "checkpoint_root": rig.location,
        "dfs_dir": dfs_dir,
        "operator": 0,
        "partition": 0,
        "store": "default",
        "version": version,
        "spark_unique_id": None,
        "executor_id": "driver",
        "created_at_ms": 0,
    }
    fields.update(over)
    return sp.RestoreRequest(**fields)  # type: ignore[arg-type]


def snapshot_event(rig: Rig, staged: Path, **over: object) -> bytes:
    doc: dict[str, object] = {
        "schema_version": sp.SCHEMA_VERSION,
        "type": "snapshot",
        "query_id": QID,
        "batch_id": 3,
        "checkpoint_root": str(rig.location),
        "dfs_dir": str(rig.location / "state" / KEY_DIR),
        "operator": 0,
        "partition": 0,
        "store": "default",
        "version": 4,
        "spark_unique_id": None,
        "staged_dir": str(staged),
        "files": ["4.zip"],
        "executor_id": "driver",
        "created_at_ms": 0,
        "stage_nanos": 1,
    }
    doc.update(over)
    return orjson.dumps(doc)


def progress_doc(rig: Rig, **over: object) -> dict[str, object]:
    progress: dict[str, object] = {
        "id": QID,
        "batchId": 3,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "sources": [],
        "stateOperators": [{"numStateStoreInstances": 1}],
    }
    progress.update(over)
    return {"type": "progress", "checkpoint_root": str(rig.location), "progress_json": orjson.dumps(progress)}


def progress_bytes(rig: Rig, doc_over: dict[str, object] | None = None, **progress_over: object) -> bytes:
    doc = progress_doc(rig, **progress_over)
    doc["progress_json"] = bytes(doc["progress_json"]).decode()  # type: ignore[call-overload]
    doc.update(doc_over or {})
    return orjson.dumps(doc)


STAGING = Path("_statebackend/staging/app/0/0/default")


class GatedStore(LocalBlobStore):
    """The real local store, except that reading a SnapshotIndex waits for `gate` (open by default):
    lets a test hold restores in flight for as long as it needs, without sleeping."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Semaphore(0)

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        if blob_id.startswith("indexes/") and not self.gate.is_set():
            self.waiting.release()
            assert self.gate.wait(60), "the test never opened the gate"
        return super().get(blob_id, sink, offset, length)
