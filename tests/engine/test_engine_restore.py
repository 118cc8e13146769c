"""RestoreManager and verify contract (Samza test plan: restore items, corruption, missing blobs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner, load_snapshot_index
from spark_statebackend.engine.index import (
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    SnapshotIndex,
    SnapshotMetadata,
)
from spark_statebackend.engine.index_codec import encode_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.engine.verify import verify_snapshot
from spark_statebackend.errors import BlobNotFoundError, ChecksumError, CorruptIndexError, UnsafePathError
from spark_statebackend.stores import BlobStore
from spark_statebackend.stores.local import BLOB_MODE
from tests.trees import make_tree, read_tree, restored_as

CHUNK = 64 * 1024

TREE = {
    "000001.sst": os.urandom(3 * CHUNK + 17),  # multi-chunk
    "CURRENT": b"MANIFEST-000001\n",
    "empty-file": b"",
    "empty-dir": None,
    "sub": {"nested": {"deep.log": os.urandom(1000), "empty-sub": None}, "x": b"x"},
}


@pytest.fixture
def pool():
    with TransferPool(4) as p:
        yield p


def backup(store: BlobStore, pool: TransferPool, d: Path, cp: str = "cp-1", key: str = "st") -> str:
    return BackupManager(store, pool, owner=SnapshotOwner("q"), config=BackupConfig(chunk_size=CHUNK)).upload(
        cp, {key: d}
    )[key]


def test_restore_on_a_new_host_recreates_the_tree_exactly(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", TREE)
    os.chmod(src / "CURRENT", 0o600)
    marker = backup(blob_store, pool, src)
    result = RestoreManager(blob_store, pool).restore(marker, tmp_path / "dst")
    want = read_tree(src)
    if result.files_linked:  # linked from a read-only blob: the blob's mode
        data, _ = want["000001.sst"]  # type: ignore[misc]
        want["000001.sst"] = (data, BLOB_MODE)
    assert read_tree(tmp_path / "dst") == want  # bytes, empty files/dirs, nesting, permissions
    assert (result.files_downloaded, result.files_reused, result.skipped) == (5, 0, False)
    assert result.bytes_downloaded == sum(len(v) for v in (TREE["000001.sst"], TREE["CURRENT"])) + 1001
    assert (tmp_path / "dst" / "CURRENT").stat().st_mtime_ns == (src / "CURRENT").stat().st_mtime_ns
    sst = (tmp_path / "dst" / "000001.sst").stat()
    blobs = load_snapshot_index(blob_store, marker).dir_index.files_present[0].blobs
    blob_file = blob_store.local_path(blobs[0].blob_id) if len(blobs) == 1 else None  # one whole blob
    # A local store's read-only blob is linked unless this process writes through it anyway (root).
    if blob_file is None or os.access(blob_file, os.W_OK, effective_ids=True):
        assert result.files_linked == 0
        assert sst.st_mtime_ns == (src / "000001.sst").stat().st_mtime_ns
        assert blob_file is None or os.stat(blob_file).st_ino != sst.st_ino
    else:  # hard-linked from the local store: the inode (and mtime) are the blob's, untouched
        assert result.files_linked == 1
        assert os.stat(blob_file).st_ino == sst.st_ino


def test_identical_local_directory_downloads_nothing(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", TREE)
    marker = backup(blob_store, pool, src)
    rm = RestoreManager(blob_store, pool)
    rm.restore(marker, tmp_path / "dst")
    again = rm.restore(marker, tmp_path / "dst")
    assert again.skipped and again.bytes_downloaded == 0
    assert rm.metrics.value("ssb_restore_files_downloaded_total", query="q") == 5


def test_non_identical_directory_reuses_identical_files_and_removes_the_rest(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", TREE)
    marker = backup(blob_store, pool, src)
    dst = make_tree(
        tmp_path / "dst",
        {"000001.sst": TREE["000001.sst"], "CURRENT": b"stale!!", "junk": b"j", "jdir": {"k": b"k"}},
    )
    os.utime(dst / "000001.sst", ns=(1, 1))
    result = RestoreManager(blob_store, pool).restore(marker, dst)
    assert read_tree(dst) == read_tree(src)
    assert result.files_reused == 1 and result.bytes_reused == len(TREE["000001.sst"])
    assert result.files_downloaded == 4


def test_reuse_dirs_supply_identical_files(blob_store: BlobStore, pool: TransferPool, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", TREE)
    marker = backup(blob_store, pool, src)
    older = make_tree(tmp_path / "older-checkpoint", {"000001.sst": TREE["000001.sst"]})
    result = RestoreManager(blob_store, pool).restore(marker, tmp_path / "dst", reuse_dirs=[older])
    assert result.files_reused == 1
    assert read_tree(tmp_path / "dst") == read_tree(src)


def test_restore_of_an_incremental_snapshot(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", TREE)
    m = BackupManager(blob_store, pool, config=BackupConfig(chunk_size=CHUNK))
    m.cleanup(m.upload("cp-1", {"st": src}))
    (src / "CURRENT").write_bytes(b"MANIFEST-000002\n")
    (src / "000002.sst").write_bytes(os.urandom(5000))
    (src / "empty-file").unlink()
    second = m.upload("cp-2", {"st": src})
    m.cleanup(second)
    RestoreManager(blob_store, pool).restore(second["st"], tmp_path / "dst")
    assert restored_as(read_tree(tmp_path / "dst")) == restored_as(read_tree(src))


def corrupt(store: BlobStore, blob_id: str, at: int = 0) -> bytes:
    data = store.get_bytes(blob_id)
    flipped = bytearray(data)
    flipped[at % len(flipped)] ^= 0xFF
    store.put_bytes(blob_id, bytes(flipped))
    return data


def test_a_flipped_byte_in_any_blob_fails_restore_and_verify(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", {"a.sst": os.urandom(2 * CHUNK), "b": b"bee"})
    marker = backup(blob_store, pool, src)
    idx = load_snapshot_index(blob_store, marker)
    names = {b.blob_id: path for path, f in idx.dir_index.walk_files() for b in f.blobs}
    rm = RestoreManager(blob_store, pool)
    for blob_id in [*names, marker]:
        original = corrupt(blob_store, blob_id, at=len(blob_id))
        expected = ChecksumError if blob_id in names else CorruptIndexError
        with pytest.raises(expected) as err:
            rm.restore(marker, tmp_path / "dst")
        assert names.get(blob_id, marker) in str(err.value)
        report = verify_snapshot(blob_store, pool, marker)
        assert not report.ok and names.get(blob_id, marker) in report.problems[0]
        blob_store.put_bytes(blob_id, original)
        assert not (tmp_path / "dst").exists()  # a failed restore leaves nothing behind
    assert verify_snapshot(blob_store, pool, marker).ok


def test_failed_restore_leaves_the_existing_directory_untouched(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    src = make_tree(work / "src", {"a": os.urandom(500), "b": os.urandom(500)})
    marker = backup(blob_store, pool, src)
    dst = make_tree(work / "dst", {"precious": b"p"})
    before = read_tree(dst)
    blob_id = next(iter(load_snapshot_index(blob_store, marker).dir_index.present_blob_ids()))
    blob_store.delete(blob_id)
    with pytest.raises(BlobNotFoundError, match=blob_id):
        RestoreManager(blob_store, pool).restore(marker, dst)
    assert read_tree(dst) == before
    assert sorted(os.listdir(work)) == ["dst", "src"]  # no temp dir left behind
    report = verify_snapshot(blob_store, pool, marker)
    assert not report.ok and blob_id in report.problems[0]


def test_missing_index_fails_clearly(blob_store: BlobStore, pool: TransferPool, tmp_path: Path) -> None:
    with pytest.raises(BlobNotFoundError, match=r"indexes/q/none\.json"):
        RestoreManager(blob_store, pool).restore("indexes/q/none.json", tmp_path / "dst")
    assert not verify_snapshot(blob_store, pool, "indexes/q/none.json").ok


def test_hostile_index_never_writes_outside_the_destination(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    blob_store.put_bytes("files/evil", b"owned")
    meta = FileMetadata(5, 0, 0, "u", "g", 0o644)
    from spark_statebackend.engine.checksum import crc_update, format_crc

    evil = FileIndex(
        "x",
        (FileBlob("files/evil", 0, 5, format_crc(crc_update(0, b"owned"))),),
        meta,
        format_crc(crc_update(0, b"owned")),
    )
    good = SnapshotIndex(0, SnapshotMetadata("cp", "", "q", "st"), DirIndex("", files_present=(evil,)))
    data = encode_snapshot_index(good)
    # Re-sign a document whose name escapes, the way an attacker with write access to the store could.
    for hostile in ("../escaped", "/tmp/escaped", "a/../../escaped"):
        import orjson

        body = orjson.loads(data)["index"]
        body["dir_index"]["files_present"][0]["name"] = hostile
        raw = orjson.dumps(body)
        blob_store.put_bytes(
            "indexes/evil.json",
            b'{"index_checksum":"' + format_crc(crc_update(0, raw)).encode() + b'","index":' + raw + b"}",
        )
        with pytest.raises(CorruptIndexError, match=r"indexes/evil\.json"):
            RestoreManager(blob_store, pool).restore("indexes/evil.json", tmp_path / "dst")
        assert not (tmp_path / "escaped").exists() and not Path("/tmp/escaped").exists()


def test_reuse_never_follows_a_symlink_out_of_the_destination(
    blob_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", {"f": b"secret-size"})
    marker = backup(blob_store, pool, src)
    outside = make_tree(tmp_path / "outside", {"f": b"secret-size"})
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(outside / "f", dst / "f")
    result = RestoreManager(blob_store, pool).restore(marker, dst)
    assert result.files_reused == 0
    assert not (dst / "f").is_symlink() and (dst / "f").read_bytes() == b"secret-size"
    assert (outside / "f").read_bytes() == b"secret-size"


def test_unsafe_path_helper_rejects_escape(tmp_path: Path) -> None:
    from spark_statebackend.engine.restore import _inside

    (tmp_path / "root").mkdir()
    os.symlink("/", tmp_path / "root" / "up")
    with pytest.raises(UnsafePathError):
        _inside(tmp_path / "root", "up/etc")


def test_setuid_setgid_and_sticky_bits_asked_for_by_an_index_are_never_restored(
    local_store: BlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    # An index is data: whoever can write the blob store must not hand out privileges on restore.
    src = make_tree(tmp_path / "src", {"run": b"#!/bin/sh\n", "grp": b"g", "dir-ish": b"d", "1.sst": b"s"})
    for name, mode in (("run", 0o4755), ("grp", 0o2750), ("dir-ish", 0o1777), ("1.sst", 0o6644)):
        os.chmod(src / name, mode)
    marker = backup(local_store, pool, src)
    index = load_snapshot_index(local_store, marker)
    asked = {f.name: f.metadata.permissions for f in index.dir_index.files_present}
    assert asked["run"] & 0o7000 and asked["1.sst"] & 0o7000  # the index does ask for them
    RestoreManager(local_store, pool).restore(marker, tmp_path / "dst")
    got = {name: os.stat(tmp_path / "dst" / name).st_mode & 0o7777 for name in asked}
    assert {name: mode & 0o7000 for name, mode in got.items()} == dict.fromkeys(asked, 0)
    # 0o511: the bits a linked SST keeps of its mode (it has the blob's, 0400; engine/placing.py).
    assert {name: mode & 0o511 for name, mode in got.items()} == {n: m & 0o511 for n, m in asked.items()}
