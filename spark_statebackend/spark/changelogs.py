"""Reading Spark's RocksDB state store files: the changelogs of changelog checkpointing, and the snapshot
zips' metadata (spark/materialize.py builds a snapshot from them).

A changelog `<v>.changelog` is lz4-java's `LZ4BlockOutputStream` framing (Spark's default state store
codec, `spark.sql.streaming.stateStore.compression.codec=lz4`) around a record stream:
- format v1 (checkpoint format v1 without column families): key length, key, value length (-1: a
  delete), value; a key length of -1 ends it;
- formats v2-v4: `writeUTF("v<n>")`, for v3/v4 (checkpoint format v2) a `writeUTF` lineage, then
  records of a type byte (put 1, delete 16, merge 17, delete range 32, end 0), a key and a value as in v1
  (a range's end key in the value).
Merge records (transformWithState's list state) need RocksDB's string-append operator with Spark's
delimiter, which rocksdict does not offer: they are refused, naming the file.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import lz4.block
import orjson

from ..common.nofollow import opened_file
from ..errors import StateBackendError

#: Where a store dir keeps the SSTs its zips reference (Spark's RocksDBFileManager).
SST_DIR = "SSTs"
_LZ4_MAGIC = b"LZ4Block"
_LZ4_RAW, _LZ4_COMPRESSED = 0x10, 0x20
_HEADER = 8 + 1 + 4 + 4 + 4  # magic, token, compressed length, original length, checksum
_PUT, _DELETE, _MERGE, _DELETE_RANGE, _EOF = 1, 16, 17, 32, 0


class ChangelogError(StateBackendError):
    """A store's files cannot be read or turned into a snapshot; the message names the file."""


@dataclass(frozen=True)
class Record:
    """One changelog record: `kind` is put, delete or delete_range (`value`: the range's end key)."""

    kind: str
    key: bytes
    value: bytes | None


def lz4_block_stream(data: bytes, name: str) -> bytes:
    """Decode lz4-java's block framing, blocks until the end mark (concatenated streams included)."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 8] != _LZ4_MAGIC or pos + _HEADER > len(data):
            raise ChangelogError(
                f"{name}: not an lz4 block stream at byte {pos} (only the lz4 codec is read)"
            )
        token = data[pos + 8]
        clen, olen = struct.unpack_from("<ii", data, pos + 9)
        body = data[pos + _HEADER : pos + _HEADER + clen]
        if clen < 0 or len(body) != clen:
            raise ChangelogError(f"{name}: truncated lz4 block at byte {pos}")
        pos += _HEADER + clen
        if olen == 0:
            continue  # the end mark
        method = token & 0xF0
        if method == _LZ4_RAW:
            out.append(body)
        elif method == _LZ4_COMPRESSED:
            try:
                out.append(lz4.block.decompress(body, uncompressed_size=olen))
            except lz4.block.LZ4BlockError as e:
                raise ChangelogError(f"{name}: corrupt lz4 block before byte {pos}: {e}") from None
        else:
            raise ChangelogError(f"{name}: unknown lz4 block method {method:#x} before byte {pos}")
    return b"".join(out)


def _take(buf: bytes, pos: int, n: int, name: str) -> tuple[bytes, int]:
    if n < 0 or pos + n > len(buf):
        raise ChangelogError(f"{name}: truncated at byte {pos}")
    return buf[pos : pos + n], pos + n


def _int(buf: bytes, pos: int, name: str) -> tuple[int, int]:
    raw, pos = _take(buf, pos, 4, name)
    value: int = struct.unpack(">i", raw)[0]
    return value, pos


def _record_v1(buf: bytes, pos: int, name: str) -> tuple[Record | None, int]:
    klen, pos = _int(buf, pos, name)
    if klen == -1:
        return None, pos
    key, pos = _take(buf, pos, klen, name)
    vlen, pos = _int(buf, pos, name)
    if vlen == -1:
        return Record("delete", key, None), pos
    value, pos = _take(buf, pos, vlen, name)
    return Record("put", key, value), pos


_KINDS = {_PUT: "put", _DELETE: "delete", _DELETE_RANGE: "delete_range"}


def _record_v2(buf: bytes, pos: int, name: str) -> tuple[Record | None, int]:
    kind_raw, pos = _take(buf, pos, 1, name)
    kind = kind_raw[0]
    if kind == _EOF:
        return None, pos
    if kind == _MERGE:
        raise ChangelogError(f"{name}: merge records (transformWithState's list state) are not supported")
    if kind not in _KINDS:
        raise ChangelogError(f"{name}: unknown record type {kind} at byte {pos - 1}")
    klen, pos = _int(buf, pos, name)
    key, pos = _take(buf, pos, klen, name)
    vlen, pos = _int(buf, pos, name)
    value: bytes | None = None
    if vlen >= 0:
        value, pos = _take(buf, pos, vlen, name)
    return Record(_KINDS[kind], key, value), pos


def changelog_records(data: bytes, name: str) -> Iterator[Record]:
    """The records of one Spark changelog file's bytes `data`, in order. Raises ChangelogError naming
    the file `name` when it is truncated (no end record), not lz4, or holds a record not applied here."""
    buf = lz4_block_stream(data, name)
    pos, read = 0, _record_v1
    # v2+ start with writeUTF("v<n>"); a v1 file starts with a key length, never 0x0002 'v' <digit>.
    if buf[:3] == b"\x00\x02v" and buf[3:4] in (b"2", b"3", b"4"):
        pos, read = 4, _record_v2
        if buf[3:4] != b"2":  # v3/v4: checkpoint format v2's lineage, writeUTF(<JSON>)
            if len(buf) < pos + 2:
                raise ChangelogError(f"{name}: truncated at byte {pos}")
            (n,) = struct.unpack_from(">H", buf, pos)
            pos += 2 + n
    while True:
        record, pos = read(buf, pos, name)
        if record is None:
            return
        yield record


def read_zip_metadata(source: Path | BinaryIO, name: str) -> dict[str, Any]:
    """The JSON of a snapshot zip's `metadata` entry (Spark's RocksDBCheckpointMetadata, "v1"), read
    from `source` (a path, or the open zip). Raises ChangelogError naming the zip `name` when it is
    unreadable or of another version."""
    try:
        with zipfile.ZipFile(source) as zf:
            head, _, body = zf.read("metadata").decode().partition("\n")
        meta = orjson.loads(body)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise ChangelogError(f"{name}: unreadable snapshot metadata: {e}") from None
    if head != "v1" or not isinstance(meta, dict):
        raise ChangelogError(f"{name}: metadata version {head!r}, expected v1")
    return meta


def complete_snapshot(store_fd: int, sst_fd: int | None, name: str) -> dict[str, Any] | None:
    """The metadata of zip `name` in the store dir `store_fd` if every SST it references is a plain
    file name present in `SST_DIR` (`sst_fd`, None: missing) with its recorded size, else None. Nothing
    is followed: the zip is opened, and each SST looked at, without following a symlink."""
    try:
        with opened_file(store_fd, name) as f:
            meta = read_zip_metadata(f, name)
    except (OSError, ChangelogError):
        return None
    for sst in meta.get("sstFiles", []):
        sst_name = sst.get("dfsSstFileName") if isinstance(sst, dict) else None
        if sst_fd is None or not isinstance(sst_name, str) or not _plain(sst_name):
            return None
        try:
            st = os.stat(sst_name, dir_fd=sst_fd, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size != sst.get("sizeBytes"):
            return None
    return None if meta.get("logFiles") else meta  # archived WAL files: never in Spark's own zips here


def _plain(name: str) -> bool:
    """A file name of one component: no separator, not `.` or `..`, no NUL."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")
