"""Prototype (issue 23 item 2): materialise a RocksDB snapshot of a Spark state store from its changelogs,
off Spark's task thread, as files Spark's own load accepts.

    python tools/changelog_snapshot.py STORE_DIR VERSION [--scratch DIR]

In changelog mode Spark 4.3's `RocksDB.commit` flushes the memtable and takes a RocksDB checkpoint on the
task thread whenever `version - lastSnapshotVersion >= minDeltasForSnapshot` (`shouldCreateSnapshot`);
only the upload of that checkpoint is left to the maintenance thread. With `minDeltasForSnapshot` set
beyond any run's length Spark never does that, and something else must bound the changelogs a load
replays. This module is that something, for one store dir of a checkpoint location:

1. the base: the newest `<s>.zip` with s <= VERSION whose referenced `SSTs/` files are all present with
   their recorded sizes (none: empty state, s = 0);
2. a private RocksDB (rocksdict) opened on a copy of the base: the zip's entries and the SSTs hard-linked
   under their local names;
3. the changelogs s+1 .. VERSION applied in order (Spark's changelog formats v1-v4: put, delete, delete
   range; merge is refused, see below), written without a WAL, then flushed and checkpointed;
4. published as Spark publishes a version: new SSTs first (`SSTs/<local stem>-<uuid>.sst`, SSTs the base
   already had keep their names), then `<VERSION>.zip` (`metadata` "v1" + JSON, and RocksDB's CURRENT,
   MANIFEST, OPTIONS and log files), each written under a hidden name and renamed into place.

Not covered by the prototype (docs/changelog-snapshots.md): checkpoint format v2 names (`<v>_<id>.zip`),
merge records (transformWithState's list state under merge operator v2), Spark's own file checksums
(`fileChecksumEnabled`), codecs other than lz4, and wiring into the sidecar. The lz4 decoder is pure
Python (a few MB/s): fine for a prototype, not for 1 GiB of state.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import struct
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import Checkpoint, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

_ZIP = re.compile(r"(\d+)\.zip")
_CHANGELOG = re.compile(r"(\d+)\.changelog")
_LZ4_MAGIC = b"LZ4Block"
_LZ4_RAW, _LZ4_COMPRESSED = 0x10, 0x20
_PUT, _DELETE, _MERGE, _DELETE_RANGE, _EOF = 1, 16, 17, 32, 0
_HEADER = 8 + 1 + 4 + 4 + 4  # magic, token, compressed length, original length, checksum


class SnapshotError(Exception):
    """A store dir's files cannot be turned into a snapshot; the message names the store dir and file."""


@dataclass(frozen=True)
class Record:
    """One changelog record: `kind` is one of put/delete/delete_range/merge."""

    kind: str
    key: bytes
    value: bytes | None


def lz4_block_decompress(src: bytes, size: int) -> bytes:
    """Decompress one raw LZ4 block (the LZ4 block format) of `size` decompressed bytes."""
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        lit = token >> 4
        if lit == 15:
            while True:
                b = src[i]
                i += 1
                lit += b
                if b != 255:
                    break
        out += src[i : i + lit]
        i += lit
        if i >= n:
            break  # the last sequence has literals only
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        match = (token & 15) + 4
        if (token & 15) == 15:
            while True:
                b = src[i]
                i += 1
                match += b
                if b != 255:
                    break
        start = len(out) - offset
        if offset >= match:
            out += out[start : start + match]
        else:  # an overlapping match repeats the last `offset` bytes
            for k in range(match):
                out.append(out[start + k])
    if len(out) != size:
        raise SnapshotError(f"lz4 block decoded to {len(out)} bytes, expected {size}")
    return bytes(out)


def lz4_block_stream(data: bytes, name: str) -> bytes:
    """Decode lz4-java's `LZ4BlockOutputStream` framing (Spark's lz4 codec), blocks until the end mark."""
    out = io.BytesIO()
    pos = 0
    while pos < len(data):
        if data[pos : pos + 8] != _LZ4_MAGIC:
            raise SnapshotError(
                f"{name}: not an lz4 block stream at byte {pos} (only the lz4 codec is supported)"
            )
        token = data[pos + 8]
        clen, olen = struct.unpack_from("<ii", data, pos + 9)
        body = data[pos + _HEADER : pos + _HEADER + clen]
        pos += _HEADER + clen
        if olen == 0:
            continue  # end mark; a concatenated stream may follow
        method = token & 0xF0
        if method == _LZ4_RAW:
            out.write(body)
        elif method == _LZ4_COMPRESSED:
            out.write(lz4_block_decompress(body, olen))
        else:
            raise SnapshotError(f"{name}: unknown lz4 block method {method:#x} at byte {pos}")
    return out.getvalue()


def _take(buf: bytes, pos: int, n: int, name: str) -> tuple[bytes, int]:
    if n < 0 or pos + n > len(buf):
        raise SnapshotError(f"{name}: truncated at byte {pos}")
    return buf[pos : pos + n], pos + n


def _int(buf: bytes, pos: int, name: str) -> tuple[int, int]:
    raw, pos = _take(buf, pos, 4, name)
    return struct.unpack(">i", raw)[0], pos


def _record_v1(buf: bytes, pos: int, name: str) -> tuple[Record | None, int]:
    """Format v1: key length, key, value length (-1: a delete), value; a key length of -1 ends it."""
    klen, pos = _int(buf, pos, name)
    if klen == -1:
        return None, pos
    key, pos = _take(buf, pos, klen, name)
    vlen, pos = _int(buf, pos, name)
    if vlen == -1:
        return Record("delete", key, None), pos
    value, pos = _take(buf, pos, vlen, name)
    return Record("put", key, value), pos


def _record_v2(buf: bytes, pos: int, name: str) -> tuple[Record | None, int]:
    """Formats v2-v4: a record type byte, then key and value as in v1 (a range's end key as the value)."""
    kind_raw, pos = _take(buf, pos, 1, name)
    kind = kind_raw[0]
    if kind == _EOF:
        return None, pos
    if kind == _MERGE:
        raise SnapshotError(f"{name}: merge records are not supported by the prototype")
    kinds = {_PUT: "put", _DELETE: "delete", _DELETE_RANGE: "delete_range"}
    if kind not in kinds:
        raise SnapshotError(f"{name}: unknown record type {kind} at byte {pos - 1}")
    klen, pos = _int(buf, pos, name)
    key, pos = _take(buf, pos, klen, name)
    vlen, pos = _int(buf, pos, name)
    value: bytes | None = None
    if vlen >= 0:
        value, pos = _take(buf, pos, vlen, name)
    return Record(kinds[kind], key, value), pos


def changelog_records(path: Path) -> Iterator[Record]:
    """The records of one Spark changelog file, in order; raises SnapshotError naming the file when it is
    truncated (no end record) or holds what the prototype cannot apply."""
    name = str(path)
    buf = lz4_block_stream(path.read_bytes(), name)
    pos, read = 0, _record_v1
    # v2+ start with writeUTF("v<n>"); a v1 file starts with a key length, never 0x0002 'v' <digit>.
    if buf[:3] == b"\x00\x02v" and buf[3:4] in (b"2", b"3", b"4"):
        pos, read = 4, _record_v2
        if buf[3:4] != b"2":  # v3/v4: checkpoint format v2's lineage, writeUTF(<JSON>)
            (n,) = struct.unpack_from(">H", buf, pos)
            pos += 2 + n
    while True:
        record, pos = read(buf, pos, name)
        if record is None:
            return
        yield record


def read_metadata(zip_path: Path) -> dict[str, Any]:
    """The JSON of a snapshot zip's `metadata` entry (Spark's RocksDBCheckpointMetadata, "v1")."""
    with zipfile.ZipFile(zip_path) as zf:
        head, _, body = zf.read("metadata").decode().partition("\n")
    if head != "v1":
        raise SnapshotError(f"{zip_path}: metadata version {head!r}, expected v1")
    meta: dict[str, Any] = json.loads(body)
    return meta


def _complete(store_dir: Path, zip_path: Path) -> bool:
    try:
        meta = read_metadata(zip_path)
    except (OSError, zipfile.BadZipFile, ValueError, SnapshotError):
        return False
    for f in meta.get("sstFiles", []):
        p = store_dir / "SSTs" / f["dfsSstFileName"]
        if not p.is_file() or p.stat().st_size != f["sizeBytes"]:
            return False
    return not meta.get("logFiles")  # archived logs live in logs/: not handled by the prototype


def base_snapshot(store_dir: Path, version: int) -> int:
    """The newest complete `<s>.zip` with s <= `version` (0: none, start from empty state)."""
    found = [int(m.group(1)) for p in store_dir.iterdir() if (m := _ZIP.fullmatch(p.name))]
    for s in sorted((s for s in found if s <= version), reverse=True):
        if _complete(store_dir, store_dir / f"{s}.zip"):
            return s
    return 0


def _open_base(store_dir: Path, base: int, db_dir: Path) -> tuple[Rdict, dict[str, Any]]:
    db_dir.mkdir(parents=True)
    meta: dict[str, Any] = {}
    if base:
        zip_path = store_dir / f"{base}.zip"
        meta = read_metadata(zip_path)
        with zipfile.ZipFile(zip_path) as zf:
            for entry in zf.namelist():
                # Flat names only: an entry can never reach outside the scratch dir.
                if entry not in ("metadata", "", ".", "..") and "/" not in entry and "\\" not in entry:
                    (db_dir / entry).write_bytes(zf.read(entry))
        for f in meta.get("sstFiles", []):
            # RocksDB never rewrites an SST, so a link to Spark's file is safe to open and compact.
            os.link(store_dir / "SSTs" / f["dfsSstFileName"], db_dir / f["localFileName"])
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.lz4())  # Spark's default `compression`
    return Rdict(str(db_dir), opts), meta


def _apply(db: Rdict, path: Path) -> int:
    wb = WriteBatch(raw_mode=True)
    n = 0
    for r in changelog_records(path):
        if r.kind == "put":
            wb.put(r.key, r.value)
        elif r.kind == "delete":
            wb.delete(r.key)
        elif r.value is not None:
            wb.delete_range(r.key, r.value)
        else:
            raise SnapshotError(f"{path}: a delete range without an end key")
        n += 1
    db.write(wb)
    return n


def _count_keys(db: Rdict, meta: dict[str, Any]) -> tuple[int, int]:
    """(numKeys, numInternalKeys) as Spark records them: with virtual column families a key starts with
    its family's 2-byte id, and families whose name starts with `$` are Spark's internal ones."""
    mapping: dict[str, int] = meta.get("columnFamilyMapping") or {}
    internal = {struct.pack(">h", i) for name, i in mapping.items() if name.startswith("$")}
    total = internal_n = 0
    for key in db.keys():  # noqa: SIM118 - iterating an Rdict itself fails in raw mode
        total += 1
        if internal and isinstance(key, bytes) and key[:2] in internal:
            internal_n += 1
    return total - internal_n, internal_n


def _publish_file(src: Path, dst: Path) -> None:
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex}.tmp"
    shutil.copyfile(src, tmp)  # a copy, not a link: the scratch dir may be on another file system
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dst)


def materialize(store_dir: Path, version: int, scratch: Path) -> Path:
    """Write `<version>.zip` (and its new SSTs) into `store_dir` from Spark's newest complete snapshot at
    or below `version` and the changelogs after it; return the zip's path. `scratch` must not exist and
    should be on `store_dir`'s file system (the base's SSTs are hard-linked). Raises SnapshotError
    naming the file when a changelog is missing or unreadable; nothing is published then."""
    base = base_snapshot(store_dir, version)
    for v in range(base + 1, version + 1):
        if not (store_dir / f"{v}.changelog").is_file():
            raise SnapshotError(
                f"{store_dir}: {v}.changelog missing (base snapshot {base}, target {version})"
            )
    db, meta = _open_base(store_dir, base, scratch / "db")
    try:
        wo = WriteOptions()
        # The changelogs are the log and the checkpoint follows a flush, so no WAL. (rocksdict's stub
        # declares a method; at run time it is a property.)
        wo.disable_wal = True  # type: ignore[method-assign,assignment]
        db.set_write_options(wo)
        for v in range(base + 1, version + 1):
            _apply(db, store_dir / f"{v}.changelog")
        db.flush()
        num_keys, num_internal = _count_keys(db, meta)
        Checkpoint(db).create_checkpoint(str(scratch / "ckpt"))
    finally:
        db.close()
    return _publish(store_dir, version, scratch / "ckpt", meta, num_keys, num_internal)


def _publish(
    store_dir: Path, version: int, ckpt: Path, base_meta: dict[str, Any], num_keys: int, num_internal: int
) -> Path:
    known = {(f["localFileName"], f["sizeBytes"]): f["dfsSstFileName"] for f in base_meta.get("sstFiles", [])}
    (store_dir / "SSTs").mkdir(exist_ok=True)
    sst_files = []
    for p in sorted(ckpt.glob("*.sst")):
        size = p.stat().st_size
        dfs = known.get((p.name, size))
        if dfs is None:
            dfs = f"{p.stem}-{uuid.uuid4()}.sst"
            _publish_file(p, store_dir / "SSTs" / dfs)
        sst_files.append({"localFileName": p.name, "dfsSstFileName": dfs, "sizeBytes": size})
    meta = {
        "sstFiles": sst_files,
        "numKeys": num_keys,
        "numInternalKeys": num_internal,
        "columnFamilyMapping": base_meta.get("columnFamilyMapping", {}),
        "columnFamilyTypeMap": base_meta.get("columnFamilyTypeMap", {}),
        "maxColumnFamilyId": base_meta.get("maxColumnFamilyId", 0),
    }
    staged = ckpt.parent / f"{version}.zip"
    with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(ckpt.iterdir()):
            # rocksdict's own config file is no part of a RocksDB checkpoint Spark would make.
            if p.is_file() and p.suffix != ".sst" and p.name != "rocksdict-config.json":
                zf.write(p, p.name)
        zf.writestr("metadata", "v1\n" + json.dumps(meta, separators=(",", ":")))
    target = store_dir / f"{version}.zip"
    _publish_file(staged, target)  # last, as Spark publishes a version: its SSTs are all in place
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("store_dir", type=Path)
    ap.add_argument("version", type=int)
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args(argv)
    scratch = args.scratch or args.store_dir.parent / f".materialize-{uuid.uuid4().hex}"
    try:
        print(materialize(args.store_dir, args.version, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
