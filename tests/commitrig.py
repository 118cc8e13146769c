"""A driver + executor rig for GC, retention and zombie tests: real BackupManager uploads of real
directories, marker reports, a real Committer on a real checkpoint log, restores with RestoreManager.

An `Executor` plays a sidecar (uploads a store version, reports its marker); `Driver` plays the
driver sidecar (a Committer fed ProgressEvents). `expected` remembers every uploaded version's tree,
so any checkpoint can be restored and compared byte for byte.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointV2
from spark_statebackend.checkpoints.logs import CheckpointLog, open_checkpoint_log
from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner, load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.reachability import snapshot_closure
from spark_statebackend.lifecycle.reports import write_report
from spark_statebackend.runtime.committer import Committer
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.stores import BlobStore, LocalBlobStore

from .trees import read_tree, restored_as

CHUNK = 16 * 1024
STORES = ("0/0/default", "0/1/default")


class Executor:
    """A sidecar's upload path for one query: mutates each store's directory per version, uploads it
    and reports the marker. Remembers every version's tree in `expected[(store, version)]`."""

    def __init__(
        self,
        store: BlobStore,
        pool: TransferPool,
        query_id: str,
        root: Path,
        seed: int = 0,
        app_id: str = "app-1",
    ) -> None:
        self.app_id = app_id
        self.store = store
        self.query_id = query_id
        self.root = root
        self.rng = random.Random(seed)
        self.manager = BackupManager(
            store, pool, owner=SnapshotOwner(query_id, "rig"), config=BackupConfig(chunk_size=CHUNK)
        )
        self.expected: dict[str, dict[str, object]] = {}  # marker -> the tree it must restore to
        self.markers: dict[tuple[str, int], str] = {}
        for s in STORES:
            d = self.dir(s)
            d.mkdir(parents=True, exist_ok=True)
            # Long-lived files: referenced by every snapshot from the first to the last.
            (d / "base.sst").write_bytes(self.rng.randbytes(3 * CHUNK + 7))
            (d / "CURRENT").write_bytes(b"MANIFEST-1\n")

    def dir(self, store_key: str) -> Path:
        return self.root / store_key.replace("/", "_")

    def mutate(self, store_key: str, version: int) -> None:
        """One RocksDB-like commit: a new SST, maybe an old one compacted away, a changed MANIFEST."""
        d = self.dir(store_key)
        (d / f"{version:06d}.sst").write_bytes(self.rng.randbytes(self.rng.randint(100, 2 * CHUNK)))
        ssts = sorted(p for p in d.glob("0*.sst"))
        if len(ssts) > 3 and self.rng.random() < 0.7:
            ssts[self.rng.randrange(len(ssts) - 1)].unlink()
        (d / "CURRENT").write_bytes(f"MANIFEST-{version}\n".encode())
        sub = d / "archive"
        if version % 3 == 0:
            sub.mkdir(exist_ok=True)
            (sub / f"log-{version}").write_bytes(self.rng.randbytes(50))
        elif version % 5 == 0 and sub.exists():
            shutil.rmtree(sub)

    def upload(self, version: int, stores: Iterable[str] = STORES, *, report: bool = True) -> dict[str, str]:
        """Mutate and upload `stores` at `version`; report the markers unless report=False."""
        stores = list(stores)
        trees = {}
        for s in stores:
            self.mutate(s, version)
            trees[s] = read_tree(self.dir(s))
        markers = self.manager.upload(
            f"v{version:012d}", {s: self.dir(s) for s in stores}, versions=dict.fromkeys(stores, version)
        )
        for s, m in markers.items():
            self.markers[(s, version)] = m
            self.expected[m] = trees[s]
            if report:
                write_report(
                    self.store, self.query_id, version, s, m, "exec-1", ttl_seconds=3600, app_id=self.app_id
                )
        return markers

    def take_over(self, checkpoint: CheckpointV2, restore_pool: TransferPool) -> None:
        """Become the executor of a new driver: restore every store of `checkpoint` into this
        executor's directories and diff the next uploads against it (what a restarted sidecar does)."""
        markers = {k: m for k, m in checkpoint.markers(BLOBSTORE_BACKEND).items() if k in STORES}
        restorer = RestoreManager(self.store, restore_pool)
        for key, marker in markers.items():
            restorer.restore(marker, self.dir(key))
        self.manager.init(markers)


class Driver:
    """A Committer on `checkpoint_log` for one query, with a checkpoint location of its own."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        pool: TransferPool,
        query_id: str,
        root: Path,
        retain: int = 1,
        app_id: str = "app-1",
        spool_dir: Path | None = None,
    ) -> None:
        self.query_id = query_id
        self.log = checkpoint_log
        self.ckpt = root / "ckpt"
        self.ckpt.mkdir(parents=True, exist_ok=True)
        (self.ckpt / "metadata").write_text(f'{{"id":"{query_id}"}}\n')
        self.committer = Committer(
            store, checkpoint_log, pool, retain_checkpoints=retain, app_id=app_id, spool_dir=spool_dir
        )

    def finish_batch(self, batch_id: int, instances: int = len(STORES)) -> int:
        """Spark finished `batch_id`: write its offsets/commits files, submit, poll once."""
        for sub in ("offsets", "commits"):
            (self.ckpt / sub).mkdir(exist_ok=True)
            (self.ckpt / sub / str(batch_id)).write_text(f"v1\n{batch_id}\n")
        self.committer.submit(
            ProgressEvent(
                query_id=self.query_id,
                query_name="rig",
                checkpoint_root=self.ckpt,
                batch_id=batch_id,
                input_offsets={"src": str(batch_id)},
                state_store_instances=instances,
                batch_end_ms=int(time.time() * 1000),
            )
        )
        return self.committer.poll()


def file_log(path: Path) -> CheckpointLog:
    """A file checkpoint log in `path`, without fsync (a test's log), its resources created."""
    log = open_checkpoint_log(path.as_uri(), {"fsync": "false"})
    log.create_resources()
    return log


def closure(store: BlobStore, checkpoints: Iterable[CheckpointV2]) -> set[str]:
    """Every blob the checkpoints reference (the oracle tests compare GC and retention against)."""
    out: set[str] = set()
    for cp in checkpoints:
        for marker in cp.markers(BLOBSTORE_BACKEND).values():
            out |= snapshot_closure(marker, load_snapshot_index(store, marker))
    return out


def query_blobs(store: BlobStore) -> set[str]:
    return {b.blob_id for p in ("files/", "indexes/") for b in store.list(p)}


def assert_restorable(
    store: BlobStore, pool: TransferPool, cp: CheckpointV2, expected: Mapping[str, object], dest: Path
) -> None:
    """Restore every store of `cp` and compare it byte for byte with what was uploaded; the _driver
    snapshot must restore too. `expected`: marker -> tree (Executor.expected, or several merged)."""
    restorer = RestoreManager(store, pool)
    for key, marker in cp.markers(BLOBSTORE_BACKEND).items():
        target = dest / f"b{cp.batch_id}" / key.replace("/", "_")
        restorer.restore(marker, target)
        if key == DRIVER_STORE:
            assert (target / "offsets" / str(cp.batch_id)).is_file(), f"{cp.checkpoint_id}: no offsets"
            continue
        assert restored_as(read_tree(target)) == restored_as(expected[marker]), (
            f"checkpoint {cp.checkpoint_id} store {key} ({marker}) restored differently"
        )


def age(store: LocalBlobStore, blob_ids: Iterable[str], seconds: float) -> None:
    """Make blobs look `seconds` old (the local store's modification time is the file's mtime)."""
    t = time.time() - seconds
    for b in blob_ids:
        os.utime(store.root / "blobs" / b, (t, t))
