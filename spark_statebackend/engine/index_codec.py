"""The JSON form of a SnapshotIndex (index.py): `encode_snapshot_index`, `decode_snapshot_index`.

Guarantees:
- Every document carries `schema_version`. A newer version than this code knows, or any malformed
  field, raises `CorruptIndexError` naming the blob it came from; nothing is guessed.
- Names read back are data, not paths: a name containing a path separator, NUL, '.', '..' or an
  empty name (except the root's) is rejected at parse time, before any caller sees it.
- The stored form is an envelope `{"index_checksum":"crc32c:<hex>","index":<document>}` whose checksum
  covers the exact bytes of the document, so a single flipped byte anywhere in an index blob is
  detected (a flip inside a name or size would otherwise still parse).
- Sizes and chunk layouts are checked: chunks tile the file exactly, sizes are non-negative and
  bounded, nesting depth and entry count are bounded, so a hostile document cannot make a restore
  allocate or write without limit.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..common.names import check_name
from ..errors import CorruptIndexError
from ..stores.base import check_blob_id
from .checksum import crc_update, format_crc
from .index import (
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_FILE_SIZE,
    SCHEMA_VERSION,
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    SnapshotIndex,
    SnapshotMetadata,
)

# ---------------------------------------------------------------------------------------------------
# Serde


def _blob_to_dict(b: FileBlob) -> dict[str, Any]:
    return {"blob_id": b.blob_id, "offset": b.offset, "size": b.size, "checksum": b.checksum}


def _file_to_dict(f: FileIndex) -> dict[str, Any]:
    m = f.metadata
    meta: dict[str, Any] = {
        "size": m.size,
        "mtime_ns": m.mtime_ns,
        "ctime_ns": m.ctime_ns,
        "owner": m.owner,
        "group": m.group,
        "permissions": m.permissions,
    }
    if m.inode is not None:  # optional (index.py SCHEMA_VERSION): absent reads back as None
        meta["inode"] = m.inode
    return {
        "name": f.name,
        "blobs": [_blob_to_dict(b) for b in f.blobs],
        "metadata": meta,
        "checksum": f.checksum,
    }


def _dir_to_dict(d: DirIndex) -> dict[str, Any]:
    return {
        "name": d.name,
        "files_present": [_file_to_dict(f) for f in d.files_present],
        "files_removed": [_file_to_dict(f) for f in d.files_removed],
        "subdirs_present": [_dir_to_dict(s) for s in d.subdirs_present],
        "subdirs_removed": [_dir_to_dict(s) for s in d.subdirs_removed],
    }


def encode_snapshot_index(index: SnapshotIndex) -> bytes:
    """Serialize a SnapshotIndex to its JSON form (UTF-8 bytes)."""
    m = index.metadata
    doc = {
        "schema_version": index.schema_version,
        "created_at_ms": index.created_at_ms,
        "metadata": {
            "checkpoint_id": m.checkpoint_id,
            "query_name": m.query_name,
            "query_id": m.query_id,
            "store": m.store,
            "operator": m.operator,
            "partition": m.partition,
            "version": m.version,
            "snapshot_version": m.snapshot_version,
            "changelog_versions": list(m.changelog_versions),
            "spark_unique_id": m.spark_unique_id,
        },
        "dir_index": _dir_to_dict(index.dir_index),
        "prev_snapshot_index_blob_id": index.prev_snapshot_index_blob_id,
    }
    body = orjson.dumps(doc)
    return _ENVELOPE_HEAD + format_crc(crc_update(0, body)).encode() + _ENVELOPE_MID + body + b"}"


_ENVELOPE_HEAD = b'{"index_checksum":"'
_ENVELOPE_MID = b'","index":'
_ENVELOPE_CRC_LEN = len("crc32c:00000000")


def _open_envelope(data: bytes, p: _Parser) -> bytes:
    head_len = len(_ENVELOPE_HEAD)
    mid_at = head_len + _ENVELOPE_CRC_LEN
    if (
        not data.startswith(_ENVELOPE_HEAD)
        or data[mid_at : mid_at + len(_ENVELOPE_MID)] != _ENVELOPE_MID
        or not data.endswith(b"}")
    ):
        raise p.fail("not a SnapshotIndex envelope (truncated, corrupt, or not an index)")
    stored = data[head_len:mid_at].decode("ascii", "replace")
    body = data[mid_at + len(_ENVELOPE_MID) : -1]
    actual = format_crc(crc_update(0, body))
    if stored != actual:
        raise p.fail(f"index checksum mismatch: stored {stored}, computed {actual}")
    return body


class _Parser:
    """Strict reader of one document; every failure becomes CorruptIndexError naming the source."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.entries = 0

    def fail(self, problem: str) -> CorruptIndexError:
        return CorruptIndexError(self.source, problem)

    def obj(self, v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(f"{where} is not an object")
        return v

    def get(self, d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
        if key not in d:
            raise self.fail(f"{where}.{key} is missing")
        v = d[key]
        # bool is an int in Python; a JSON true where a number belongs is still malformed.
        if isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
            raise self.fail(f"{where}.{key} has the wrong type")
        if not isinstance(v, typ):
            raise self.fail(f"{where}.{key} has the wrong type")
        return v

    def size(self, d: dict[str, Any], key: str, where: str) -> int:
        v: int = self.get(d, key, int, where)
        if v < 0 or v > MAX_FILE_SIZE:
            raise self.fail(f"{where}.{key}={v} is out of range")
        return v

    def inode(self, d: dict[str, Any], where: str) -> int | None:
        """The optional inode number: absent (older indexes) is None; present must be an int >= 0."""
        if d.get("inode") is None:
            return None
        v: int = self.get(d, "inode", int, where)
        if v < 0:
            raise self.fail(f"{where}.inode={v} is out of range")
        return v

    def name(self, v: Any, where: str) -> str:
        try:
            return check_name(v, what=where)
        except ValueError as e:
            raise self.fail(str(e)) from None

    def count(self) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise self.fail(f"more than {MAX_ENTRIES} entries")

    def blob(self, v: Any, where: str) -> FileBlob:
        d = self.obj(v, where)
        blob_id = self.get(d, "blob_id", str, where)
        try:
            check_blob_id(blob_id)
        except ValueError as e:
            raise self.fail(f"{where}: {e}") from None
        return FileBlob(
            blob_id=blob_id,
            offset=self.size(d, "offset", where),
            size=self.size(d, "size", where),
            checksum=self.get(d, "checksum", str, where),
        )

    def file(self, v: Any, where: str) -> FileIndex:
        self.count()
        d = self.obj(v, where)
        name = self.name(self.get(d, "name", str, where), f"{where}.name")
        where = f"{where}[{name}]"
        blobs_raw = self.get(d, "blobs", list, where)
        blobs = tuple(self.blob(b, f"{where}.blobs[{i}]") for i, b in enumerate(blobs_raw))
        md = self.obj(self.get(d, "metadata", dict, where), f"{where}.metadata")
        meta = FileMetadata(
            size=self.size(md, "size", f"{where}.metadata"),
            mtime_ns=self.get(md, "mtime_ns", int, f"{where}.metadata"),
            ctime_ns=self.get(md, "ctime_ns", int, f"{where}.metadata"),
            owner=self.get(md, "owner", str, f"{where}.metadata"),
            group=self.get(md, "group", str, f"{where}.metadata"),
            permissions=self.get(md, "permissions", int, f"{where}.metadata"),
            inode=self.inode(md, f"{where}.metadata"),
        )
        if not 0 <= meta.permissions <= 0o7777:
            raise self.fail(f"{where}.metadata.permissions={meta.permissions} is out of range")
        expected = 0
        for i, b in enumerate(blobs):
            if b.offset != expected:
                raise self.fail(f"{where}.blobs[{i}] starts at {b.offset}, expected {expected}")
            expected += b.size
        if expected != meta.size:
            raise self.fail(f"{where}: chunks cover {expected} bytes but the file has {meta.size}")
        return FileIndex(name=name, blobs=blobs, metadata=meta, checksum=self.get(d, "checksum", str, where))

    def dir(self, v: Any, where: str, depth: int, root: bool = False) -> DirIndex:
        if depth > MAX_DEPTH:
            raise self.fail(f"directories nested deeper than {MAX_DEPTH}")
        self.count()
        d = self.obj(v, where)
        raw_name = self.get(d, "name", str, where)
        name = raw_name if root and raw_name == "" else self.name(raw_name, f"{where}.name")
        where = f"{where}/{name}" if name else where

        def files(key: str) -> tuple[FileIndex, ...]:
            items = self.get(d, key, list, where)
            out = tuple(self.file(x, f"{where}.{key}") for x in items)
            names = [f.name for f in out]
            if len(set(names)) != len(names):
                raise self.fail(f"{where}.{key} lists a name twice")
            return out

        def dirs(key: str) -> tuple[DirIndex, ...]:
            items = self.get(d, key, list, where)
            out = tuple(self.dir(x, f"{where}.{key}", depth + 1) for x in items)
            names = [s.name for s in out]
            if len(set(names)) != len(names):
                raise self.fail(f"{where}.{key} lists a name twice")
            return out

        result = DirIndex(
            name=name,
            files_present=files("files_present"),
            files_removed=files("files_removed"),
            subdirs_present=dirs("subdirs_present"),
            subdirs_removed=dirs("subdirs_removed"),
        )
        clash = {f.name for f in result.files_present} & {s.name for s in result.subdirs_present}
        if clash:
            raise self.fail(f"{where}: {sorted(clash)[0]!r} is both a file and a directory")
        return result


def decode_snapshot_index(data: bytes, source: str) -> SnapshotIndex:
    """Parse a SnapshotIndex; `source` (usually the blob id) is named in any error.

    Raises CorruptIndexError for malformed JSON, missing or mistyped fields, unsafe names, chunk
    layouts that do not tile the file, and schema versions newer than SCHEMA_VERSION."""
    p = _Parser(source)
    body = _open_envelope(bytes(data), p)
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise p.fail(f"not valid JSON ({e})") from None
    doc = p.obj(raw, "document")
    version = p.get(doc, "schema_version", int, "document")
    if version > SCHEMA_VERSION:
        raise p.fail(f"schema_version {version} is newer than this version understands ({SCHEMA_VERSION})")
    if version < 1:
        raise p.fail(f"schema_version {version} is not valid")
    md = p.obj(p.get(doc, "metadata", dict, "document"), "metadata")

    def opt_int(key: str) -> int | None:
        v = md.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise p.fail(f"metadata.{key} has the wrong type")
        return v

    changelogs = md.get("changelog_versions", [])
    if not isinstance(changelogs, list) or any(
        isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in changelogs
    ):
        raise p.fail("metadata.changelog_versions must be a list of versions")
    uid = md.get("spark_unique_id")
    if uid is not None and not isinstance(uid, str):
        raise p.fail("metadata.spark_unique_id has the wrong type")
    metadata = SnapshotMetadata(
        checkpoint_id=p.get(md, "checkpoint_id", str, "metadata"),
        query_name=p.get(md, "query_name", str, "metadata"),
        query_id=p.get(md, "query_id", str, "metadata"),
        store=p.get(md, "store", str, "metadata"),
        operator=opt_int("operator"),
        partition=opt_int("partition"),
        version=opt_int("version"),
        snapshot_version=opt_int("snapshot_version"),
        changelog_versions=tuple(changelogs),
        spark_unique_id=uid,
    )
    prev = doc.get("prev_snapshot_index_blob_id")
    if prev is not None:
        if not isinstance(prev, str):
            raise p.fail("prev_snapshot_index_blob_id has the wrong type")
        try:
            check_blob_id(prev)
        except ValueError as e:
            raise p.fail(f"prev_snapshot_index_blob_id: {e}") from None
    return SnapshotIndex(
        schema_version=version,
        created_at_ms=p.get(doc, "created_at_ms", int, "document"),
        metadata=metadata,
        dir_index=p.dir(p.get(doc, "dir_index", dict, "document"), "dir_index", 0, root=True),
        prev_snapshot_index_blob_id=prev,
    )
