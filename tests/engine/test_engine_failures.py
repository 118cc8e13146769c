"""Partial failures and concurrency: every future completes, a failed upload harms nothing durable.

The store here is a real LocalBlobStore whose put can be told to fail on its n-th call: a unit-test
stand-in for a blob store outage (the fault-proxy tests cover real servers)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.engine.verify import verify_snapshot
from spark_statebackend.errors import BlobStoreError
from spark_statebackend.stores import LocalBlobStore
from tests.servers.process import wait_until
from tests.trees import make_tree, read_tree, restored_as


class FailingStore(LocalBlobStore):
    """Fails the put whose ordinal is in `fail_on`, and counts puts in flight."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.fail_on: set[int] = set()
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self.gate: threading.Event | None = None

    def put(self, blob_id, opener, size, *, metadata=None, ttl_seconds=None):  # type: ignore[no-untyped-def]
        with self._lock:
            self.calls += 1
            n = self.calls
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                self.gate.wait(timeout=10)
            if n in self.fail_on:
                raise BlobStoreError(f"injected failure on put #{n} ({blob_id})")
            super().put(blob_id, opener, size, metadata=metadata, ttl_seconds=ttl_seconds)
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest.fixture
def store(tmp_path: Path) -> FailingStore:
    s = FailingStore(tmp_path / "blobs")
    s.ensure_ready()
    return s


def test_failed_upload_completes_every_future_and_keeps_the_previous_snapshot(
    store: FailingStore, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {f"{i}.sst": os.urandom(1000) for i in range(10)})
    with TransferPool(4) as pool:
        m = BackupManager(store, pool)
        first = m.upload("cp-1", {"st": d})
        m.cleanup(first)
        snapshot_before = read_tree(d)
        for i in range(10, 30):
            (d / f"{i}.sst").write_bytes(os.urandom(1000))
        store.fail_on = {store.calls + 5}
        with pytest.raises(BlobStoreError, match="injected failure"):
            m.upload("cp-2", {"st": d})
        assert store.in_flight == 0  # nothing is left running once upload has raised
        assert m.metrics.value("ssb_backup_upload_errors_total", query=m.owner.query_id) == 1
        assert verify_snapshot(store, pool, first["st"]).ok
        RestoreManager(store, pool).restore(first["st"], tmp_path / "restored")
    assert restored_as(read_tree(tmp_path / "restored")) == restored_as(snapshot_before)
    # The failed attempt's blobs are unreferenced and still carry their TTL: they expire.
    referenced = {first["st"], *load_snapshot_index(store, first["st"]).dir_index.present_blob_ids()}
    orphans = [b.blob_id for b in store.list("") if b.blob_id not in referenced]
    assert orphans and all(store.stat(b).expires_at_ms is not None for b in orphans)
    assert store.sweep_expired(now_ms=int(time.time() * 1000) + 8 * 24 * 3600 * 1000) == len(orphans)
    assert {b.blob_id for b in store.list("")} == referenced


def test_a_failure_after_the_index_upload_fails_and_the_next_upload_recovers(
    store: FailingStore, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {"a": os.urandom(100)})
    with TransferPool(2) as pool:
        m = BackupManager(store, pool)
        store.fail_on = {2}  # put #1 is the file, #2 the index
        with pytest.raises(BlobStoreError):
            m.upload("cp-1", {"st": d})
        assert m.previous_marker("st") is None  # the failed snapshot never becomes a diff base
        markers = m.upload("cp-2", {"st": d})
        m.cleanup(markers)
        assert verify_snapshot(store, pool, markers["st"]).ok


def test_pool_concurrency_is_bounded(store: FailingStore, tmp_path: Path) -> None:
    d = make_tree(tmp_path / "s", {f"{i}": os.urandom(100) for i in range(40)})
    with TransferPool(3) as pool:
        BackupManager(store, pool).upload("cp-1", {"st": d})
    assert 1 <= store.max_in_flight <= 3


def test_upload_times_out_instead_of_blocking_forever(store: FailingStore, tmp_path: Path) -> None:
    d = make_tree(tmp_path / "s", {"a": b"1", "b": b"2"})
    store.gate = threading.Event()
    with TransferPool(2) as pool:
        m = BackupManager(store, pool, config=BackupConfig(timeout_seconds=0.2))
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError, match="did not finish within"):
                m.upload("cp-1", {"st": d})
        finally:
            store.gate.set()
        assert time.monotonic() - started < 9  # the timeout fired, not the gate's own 10s
        wait_until(lambda: store.in_flight == 0, 10, "the stuck puts to end once released")


def test_run_all_returns_results_in_order_and_propagates_the_first_error() -> None:
    with TransferPool(4) as pool:
        assert pool.run_all([lambda i=i: i * i for i in range(20)]) == [i * i for i in range(20)]

        def boom() -> int:
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            pool.run_all([lambda: 1, boom, lambda: 3])
        assert pool.run_all([]) == []
