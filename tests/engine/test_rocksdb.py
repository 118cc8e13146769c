"""A real RocksDB store (rocksdict): checkpoint, back up, change, compact, back up again, restore both.

The second backup must send only the SST files the change created plus RocksDB's small metadata
files; both restored directories must open and hold exactly what was written."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import AccessType, Checkpoint, Options, Rdict, WriteBatch

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import BlobStore

N_KEYS = 200_000


def _value(i: int, gen: int) -> bytes:
    return f"value-{gen}-{i}-".encode() * 3


def _write(db: Rdict, keys: range, gen: int) -> None:
    wb = WriteBatch(raw_mode=True)
    for i in keys:
        wb.put(b"key-%08d" % i, _value(i, gen))
    db.write(wb)


def _read_all(path: Path) -> dict[bytes, bytes]:
    opts = Options(raw_mode=True)
    db = Rdict(str(path), opts, access_type=AccessType.read_only())
    try:
        return {k: v for k, v in db.items()}
    finally:
        db.close()


@pytest.mark.timeout(300)
def test_rocksdb_incremental_backup_and_restore(blob_store: BlobStore, tmp_path: Path) -> None:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(tmp_path / "live"), opts)
    expected: dict[bytes, bytes] = {}
    for start in range(0, N_KEYS, 50_000):  # several flushes -> several SSTs
        _write(db, range(start, start + 50_000), 0)
        db.flush()
    expected.update({b"key-%08d" % i: _value(i, 0) for i in range(N_KEYS)})
    Checkpoint(db).create_checkpoint(str(tmp_path / "cp1"))
    expected_1 = dict(expected)

    with TransferPool(4) as pool:
        manager = BackupManager(blob_store, pool, config=BackupConfig(chunk_size=1 << 20))
        restorer = RestoreManager(blob_store, pool)
        first = manager.upload("cp-1", {"0/0/default": tmp_path / "cp1"})["0/0/default"]
        manager.cleanup({"0/0/default": first})
        idx1 = load_snapshot_index(blob_store, first)
        restorer.restore(first, tmp_path / "restored1")

        _write(db, range(0, N_KEYS, 7), 1)  # updates
        for i in range(3, N_KEYS, 11):  # deletes
            del db[b"key-%08d" % i]
        db.flush()
        db.compact_range(None, None)
        for i in range(0, N_KEYS, 7):
            expected[b"key-%08d" % i] = _value(i, 1)
        for i in range(3, N_KEYS, 11):
            expected.pop(b"key-%08d" % i, None)
        Checkpoint(db).create_checkpoint(str(tmp_path / "cp2"))
        db.close()

        second = manager.upload("cp-2", {"0/0/default": tmp_path / "cp2"})["0/0/default"]
        idx2 = load_snapshot_index(blob_store, second)
        # A retained file keeps the previous snapshot's FileIndex (same blobs); anything else was sent.
        sent = {f.name for f in idx2.dir_index.files_present if f not in idx1.dir_index.files_present}
        cp1_ssts = {p.name for p in (tmp_path / "cp1").glob("*.sst")}
        cp2_ssts = {p.name for p in (tmp_path / "cp2").glob("*.sst")}
        new_ssts = cp2_ssts - cp1_ssts
        assert new_ssts, "the change must have produced new SST files"
        assert new_ssts <= sent
        small = sent - new_ssts
        assert small and all(not n.endswith(".sst") for n in small)
        assert all((tmp_path / "cp2" / n).stat().st_size < 1 << 20 for n in small)
        assert not (sent & (cp1_ssts & cp2_ssts)), "SSTs shared by both checkpoints are not re-sent"
        assert manager.metrics.value("ssb_backup_files_to_upload", query=manager.owner.query_id) == len(sent)
        manager.cleanup({"0/0/default": second})
        restorer.restore(second, tmp_path / "restored2")

    assert _read_all(tmp_path / "restored1") == expected_1
    assert _read_all(tmp_path / "restored2") == expected
