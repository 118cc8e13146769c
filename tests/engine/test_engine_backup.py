"""BackupManager contract (Samza test plan: init, upload, cleanup), run against every blob store backend."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner, load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import BlobStore
from tests.trees import make_tree

CHUNK = 64 * 1024


@pytest.fixture
def pool():
    with TransferPool(4, name="ssb-test-transfer") as p:
        yield p


def manager(store: BlobStore, pool: TransferPool, **kw: object) -> BackupManager:
    return BackupManager(
        store, pool, owner=SnapshotOwner("q1", "query one"), config=BackupConfig(chunk_size=CHUNK, **kw)
    )


def file_blobs(store: BlobStore) -> set[str]:
    return {b.blob_id for b in store.list("files/")}


def test_first_upload_with_no_checkpoint(blob_store: BlobStore, pool: TransferPool, tmp_path: Path) -> None:
    d = make_tree(tmp_path / "s", {"a.sst": os.urandom(3 * CHUNK + 5), "CURRENT": b"x", "sub": {"e": b""}})
    m = manager(blob_store, pool)
    m.init({})
    markers = m.upload("cp-1", {"0/0/default": d})
    idx = load_snapshot_index(blob_store, markers["0/0/default"])
    assert idx.prev_snapshot_index_blob_id is None
    assert idx.metadata.store == "0/0/default" and idx.metadata.operator == 0 and idx.metadata.partition == 0
    assert idx.metadata.query_id == "q1" and idx.metadata.checkpoint_id == "cp-1"
    sizes = {p: len(f.blobs) for p, f in idx.dir_index.walk_files()}
    # multi-chunk file (whole where the store keeps whole-file blobs), empty file has no blob
    chunks = 1 if blob_store.whole_file_blobs else 4
    assert sizes == {"CURRENT": 1, "a.sst": chunks, "sub/e": 0}
    assert len(file_blobs(blob_store)) == 1 + chunks
    assert m.metrics.value("ssb_backup_bytes_to_upload", query="q1") == 3 * CHUNK + 6


def test_subsequent_upload_is_incremental_and_links_previous(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {"1.sst": os.urandom(2000), "2.sst": os.urandom(2000), "MANIFEST": b"m1"})
    m = manager(blob_store, pool)
    first = m.upload("cp-1", {"st": d})["st"]
    m.cleanup({"st": first})
    before = file_blobs(blob_store)
    (d / "2.sst").unlink()
    (d / "3.sst").write_bytes(os.urandom(2000))
    (d / "MANIFEST").write_bytes(b"m2")
    second = m.upload("cp-2", {"st": d})["st"]
    idx = load_snapshot_index(blob_store, second)
    assert idx.prev_snapshot_index_blob_id == first
    new = file_blobs(blob_store) - before
    assert len(new) == 2  # 3.sst and MANIFEST only
    assert sorted(f.name for f in idx.dir_index.files_removed) == ["2.sst", "MANIFEST"]
    assert m.metrics.value("ssb_backup_files_retained", query="q1") == 1


def test_init_from_checkpoint_markers_makes_a_new_manager_incremental(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {"1.sst": os.urandom(5000)})
    first = manager(blob_store, pool).upload("cp-1", {"st": d})
    restarted = manager(blob_store, pool)
    restarted.init(first)
    before = file_blobs(blob_store)
    second = restarted.upload("cp-2", {"st": d})
    assert file_blobs(blob_store) == before  # nothing new uploaded after a restart
    assert load_snapshot_index(blob_store, second["st"]).prev_snapshot_index_blob_id == first["st"]


def test_unchanged_directory_uploads_no_file(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {"1.sst": os.urandom(5000), "s": {"x": b"1"}})
    m = manager(blob_store, pool)
    m.upload("cp-1", {"st": d})
    n = len(file_blobs(blob_store))
    m.upload("cp-2", {"st": d})
    assert len(file_blobs(blob_store)) == n
    assert m.metrics.value("ssb_backup_files_to_upload", query="q1") == 0


def test_multiple_stores_in_one_upload(blob_store: BlobStore, pool: TransferPool, tmp_path: Path) -> None:
    dirs = {f"0/{p}/default": make_tree(tmp_path / str(p), {"f": os.urandom(100 + p)}) for p in range(4)}
    markers = manager(blob_store, pool).upload("cp-1", dirs)
    assert set(markers) == set(dirs)
    assert len(set(markers.values())) == 4
    for key, marker in markers.items():
        assert load_snapshot_index(blob_store, marker).metadata.store == key


def test_uploaded_blobs_carry_a_ttl_until_cleanup(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {"a": os.urandom(100), "b": os.urandom(100)})
    m = manager(blob_store, pool, ttl_seconds=3600.0)
    marker = m.upload("cp-1", {"st": d})["st"]
    referenced = [*load_snapshot_index(blob_store, marker).dir_index.present_blob_ids(), marker]
    assert all(blob_store.stat(b).expires_at_ms is not None for b in referenced)
    m.cleanup({"st": marker})
    assert all(blob_store.stat(b).expires_at_ms is None for b in referenced)


def test_cleanup_deletes_removed_files_subdirs_and_previous_index(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    d = make_tree(
        tmp_path / "s", {"old.sst": os.urandom(300), "keep": os.urandom(300), "olddir": {"x": os.urandom(10)}}
    )
    m = manager(blob_store, pool)
    first = m.upload("cp-1", {"st": d})["st"]
    m.cleanup({"st": first})
    first_idx = load_snapshot_index(blob_store, first)
    old_blobs = {b.blob_id for p, f in first_idx.dir_index.walk_files() if p != "keep" for b in f.blobs}
    (d / "old.sst").unlink()
    (d / "olddir" / "x").unlink()
    (d / "olddir").rmdir()
    second = m.upload("cp-2", {"st": d})["st"]
    m.cleanup({"st": second})
    remaining = {b.blob_id for b in blob_store.list("")}
    assert not (old_blobs & remaining)
    assert first not in remaining
    assert remaining == {second, *load_snapshot_index(blob_store, second).dir_index.present_blob_ids()}


def test_cleanup_is_idempotent_and_survives_a_restart(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    d = make_tree(tmp_path / "s", {"a": os.urandom(100)})
    m = manager(blob_store, pool)
    first = m.upload("cp-1", {"st": d})["st"]
    m.cleanup({"st": first})
    (d / "a").write_bytes(os.urandom(100))
    second = m.upload("cp-2", {"st": d})
    m.cleanup(second)
    m.cleanup(second)  # again: deleting what is gone succeeds
    restarted = manager(blob_store, pool)  # a failed container restarting re-runs cleanup from the checkpoint
    restarted.init(second)
    restarted.cleanup(second)
    referenced = {second["st"], *load_snapshot_index(blob_store, second["st"]).dir_index.present_blob_ids()}
    assert {b.blob_id for b in blob_store.list("")} == referenced
    assert all(blob_store.stat(b).expires_at_ms is None for b in referenced)


def test_cleanup_of_a_missing_index_names_it(blob_store: BlobStore, pool: TransferPool) -> None:
    from spark_statebackend.errors import StateBackendError

    with pytest.raises(StateBackendError, match=r"indexes/q1/st/nope\.json"):
        manager(blob_store, pool).cleanup({"st": "indexes/q1/st/nope.json"})


def test_transfers_run_on_the_named_bounded_pool(blob_store: BlobStore, tmp_path: Path) -> None:
    seen: set[str] = set()
    original = blob_store.put

    def spy(*a: object, **kw: object) -> None:
        seen.add(threading.current_thread().name)
        original(*a, **kw)  # type: ignore[arg-type]

    blob_store.put = spy  # type: ignore[method-assign]
    d = make_tree(tmp_path / "s", {f"f{i}": os.urandom(10) for i in range(20)})
    with TransferPool(3, name="ssb-named") as p:
        manager(blob_store, p).upload("cp-1", {"st": d})
    assert seen and all(name.startswith("ssb-named") for name in seen)
    assert len(seen) <= 3
