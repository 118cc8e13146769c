"""Index documents: round trips, schema versions, and hostile or malformed input."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from spark_statebackend.engine.checksum import crc_update, format_crc
from spark_statebackend.engine.index import (
    SCHEMA_VERSION,
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    SnapshotIndex,
    SnapshotMetadata,
)
from spark_statebackend.engine.index_codec import decode_snapshot_index, encode_snapshot_index
from spark_statebackend.errors import CorruptIndexError

META = FileMetadata(size=10, mtime_ns=1, ctime_ns=2, owner="u", group="g", permissions=0o644)


def _file(name: str = "a.sst", size: int = 10) -> FileIndex:
    meta = FileMetadata(size=size, mtime_ns=1, ctime_ns=2, owner="u", group="g", permissions=0o644)
    blobs = (FileBlob("files/q/s/b1", 0, size, "crc32c:00000001"),) if size else ()
    return FileIndex(
        name=name, blobs=blobs, metadata=meta, checksum="crc32c:00000001" if size else "crc32c:00000000"
    )


def _snapshot(root: DirIndex) -> SnapshotIndex:
    return SnapshotIndex(
        created_at_ms=123,
        metadata=SnapshotMetadata("cp-1", "q", "qid", "0/1/default", 0, 1, 2),
        dir_index=root,
        prev_snapshot_index_blob_id="indexes/qid/0/1/default/cp-0.json",
    )


def _envelope(doc: dict) -> bytes:
    """Wrap a raw document the way encode does, so tests reach the field validation."""
    body = orjson.dumps(doc)
    return b'{"index_checksum":"' + format_crc(crc_update(0, body)).encode() + b'","index":' + body + b"}"


def _doc(**overrides: object) -> dict:
    doc = orjson.loads(encode_snapshot_index(_snapshot(DirIndex("", files_present=(_file(),)))))["index"]
    doc.update(overrides)
    return doc


def test_round_trip_nested_tree() -> None:
    root = DirIndex(
        "",
        files_present=(_file("a"), _file("empty", 0)),
        files_removed=(_file("gone"),),
        subdirs_present=(
            DirIndex("sub", files_present=(_file("b"),), subdirs_present=(DirIndex("deeper"),)),
        ),
        subdirs_removed=(DirIndex("old", files_present=(_file("c"),)),),
    )
    snap = _snapshot(root)
    assert decode_snapshot_index(encode_snapshot_index(snap), "blob-x") == snap
    assert [p for p, _ in root.walk_files()] == ["a", "empty", "sub/b"]
    assert list(root.walk_dirs()) == ["sub", "sub/deeper"]


def test_newer_schema_version_is_rejected_naming_the_blob() -> None:
    with pytest.raises(CorruptIndexError, match=r"indexes/x\.json.*schema_version 99 is newer"):
        decode_snapshot_index(_envelope(_doc(schema_version=99)), "indexes/x.json")
    assert SCHEMA_VERSION == 2


def test_schema_1_documents_still_read_and_recipe_fields_round_trip() -> None:
    old = _doc(schema_version=1)
    old["metadata"].pop("snapshot_version", None)
    old["metadata"].pop("changelog_versions", None)
    old["metadata"].pop("spark_unique_id", None)
    index = decode_snapshot_index(_envelope(old), "indexes/old.json")
    assert index.schema_version == 1 and index.metadata.changelog_versions == ()
    assert index.metadata.snapshot_version is None
    new = dataclasses.replace(
        index,
        schema_version=SCHEMA_VERSION,
        metadata=dataclasses.replace(
            index.metadata, snapshot_version=10, changelog_versions=(11, 12), spark_unique_id="ab-12"
        ),
    )
    back = decode_snapshot_index(encode_snapshot_index(new), "indexes/new.json")
    assert back.metadata.changelog_versions == (11, 12) and back.metadata.snapshot_version == 10
    assert back.metadata.spark_unique_id == "ab-12"
    bad = _doc()
    bad["metadata"]["changelog_versions"] = [0]
    with pytest.raises(CorruptIndexError, match=r"indexes/bad\.json.*changelog_versions"):
        decode_snapshot_index(_envelope(bad), "indexes/bad.json")


@pytest.mark.parametrize(
    "name",
    ["..", ".", "", "a/b", "../../etc/passwd", "/abs", "a\\b", "nul\x00", "x" * 300],
)
def test_hostile_file_names_are_rejected(name: str) -> None:
    doc = _doc()
    doc["dir_index"]["files_present"][0]["name"] = name
    with pytest.raises(CorruptIndexError, match="blob-h"):
        decode_snapshot_index(_envelope(doc), "blob-h")


@pytest.mark.parametrize("name", ["..", "a/..", "/"])
def test_hostile_dir_names_are_rejected(name: str) -> None:
    doc = _doc()
    doc["dir_index"]["subdirs_present"] = [
        {"name": name, "files_present": [], "files_removed": [], "subdirs_present": [], "subdirs_removed": []}
    ]
    with pytest.raises(CorruptIndexError):
        decode_snapshot_index(_envelope(doc), "blob-d")


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("metadata", "size"), 1 << 60, "out of range"),
        (("metadata", "size"), -1, "out of range"),
        (("metadata", "size"), 11, "chunks cover 10 bytes"),
        (("metadata", "permissions"), 0o100000, "permissions"),
        (("blobs", 0, "offset"), 5, "starts at 5"),
        (("blobs", 0, "blob_id"), "../../etc", "segment"),
        (("blobs", 0, "size"), "10", "wrong type"),
        (("metadata", "owner"), None, "wrong type"),
        (("metadata", "inode"), "12", "wrong type"),
        (("metadata", "inode"), -1, "inode=-1 is out of range"),
    ],
)
def test_malformed_fields_name_the_problem(path: tuple, value: object, problem: str) -> None:
    doc = _doc()
    target = doc["dir_index"]["files_present"][0]
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(CorruptIndexError, match=problem):
        decode_snapshot_index(_envelope(doc), "blob-m")


def test_duplicate_names_and_file_dir_clash_rejected() -> None:
    doc = _doc()
    doc["dir_index"]["files_present"].append(doc["dir_index"]["files_present"][0])
    with pytest.raises(CorruptIndexError, match="twice"):
        decode_snapshot_index(_envelope(doc), "b")
    doc = _doc()
    doc["dir_index"]["subdirs_present"] = [
        {
            "name": "a.sst",
            "files_present": [],
            "files_removed": [],
            "subdirs_present": [],
            "subdirs_removed": [],
        }
    ]
    with pytest.raises(CorruptIndexError, match="both a file and a directory"):
        decode_snapshot_index(_envelope(doc), "b")


def test_nesting_bomb_rejected() -> None:
    inner: dict = {
        "name": "d",
        "files_present": [],
        "files_removed": [],
        "subdirs_present": [],
        "subdirs_removed": [],
    }
    for _ in range(100):
        inner = {
            "name": "d",
            "files_present": [],
            "files_removed": [],
            "subdirs_present": [inner],
            "subdirs_removed": [],
        }
    doc = _doc()
    doc["dir_index"]["subdirs_present"] = [inner]
    with pytest.raises(CorruptIndexError, match="nested deeper"):
        decode_snapshot_index(_envelope(doc), "b")


def test_every_single_flipped_byte_is_detected() -> None:
    data = encode_snapshot_index(_snapshot(DirIndex("", files_present=(_file("a"), _file("b")))))
    for i in range(len(data)):
        corrupt = bytearray(data)
        corrupt[i] ^= 0x01
        with pytest.raises(CorruptIndexError, match="blob-f"):
            decode_snapshot_index(bytes(corrupt), "blob-f")


def test_not_json_and_wrong_document_kinds() -> None:
    for data in (b"", b"garbage", b"[]", b'{"index_checksum":"crc32c:00000000","index":[]}'):
        with pytest.raises(CorruptIndexError, match="blob-j"):
            decode_snapshot_index(data, "blob-j")


def test_inode_round_trips_and_an_index_without_one_reads_as_none() -> None:
    with_inode = dataclasses.replace(_file(), metadata=dataclasses.replace(META, inode=4242))
    index = _snapshot(DirIndex("", files_present=(with_inode,)))
    assert decode_snapshot_index(encode_snapshot_index(index), "b") == index
    doc = orjson.loads(encode_snapshot_index(index))["index"]
    assert doc["schema_version"] == SCHEMA_VERSION == 2  # an optional field, not a new version
    del doc["dir_index"]["files_present"][0]["metadata"]["inode"]  # as written before inodes
    (f,) = decode_snapshot_index(_envelope(doc), "b").dir_index.files_present
    assert f.metadata.inode is None and f.metadata == dataclasses.replace(with_inode.metadata, inode=None)
    # Nothing is written for an unknown inode, so such an index encodes as before.
    assert "inode" not in orjson.dumps(_doc()["dir_index"]).decode()


def test_unknown_fields_are_ignored() -> None:
    doc = _doc(future_field={"x": 1})
    doc["dir_index"]["files_present"][0]["future"] = True
    assert decode_snapshot_index(_envelope(doc), "b").metadata.store == "0/1/default"


def test_removed_blob_ids_cover_removed_files_and_subtrees() -> None:
    root = DirIndex(
        "",
        files_present=(_file("keep"),),
        files_removed=(
            FileIndex("gone", (FileBlob("r1", 0, 10, "crc32c:00000001"),), META, "crc32c:00000001"),
        ),
        subdirs_present=(
            DirIndex(
                "s",
                files_removed=(
                    FileIndex("x", (FileBlob("r2", 0, 10, "crc32c:00000001"),), META, "crc32c:00000001"),
                ),
            ),
        ),
        subdirs_removed=(
            DirIndex(
                "old", files_present=(FileIndex("y", (FileBlob("r3", 0, 10, "crc32c:00000001"),), META, "c"),)
            ),
        ),
    )
    assert sorted(root.removed_blob_ids()) == ["r1", "r2", "r3"]
