"""A snapshot of a Spark state store built from its changelogs, outside Spark (setting
`changelogSnapshotEvery`; docs/changelog-snapshots.md).

In changelog checkpointing mode Spark's `RocksDB.commit` flushes the memtable and checkpoints RocksDB on
the task thread every `minDeltasForSnapshot` versions. With that set beyond a run's length, Spark never
does, and this module bounds what a load replays instead, for one store dir of a checkpoint location:

1. nothing if `<v>.zip` is there already (Spark's own forced snapshot, or an earlier run of ours);
2. the base: the newest `<s>.zip` with s <= v whose `SSTs/` files are all present with their recorded
   sizes (none: empty state, s = 0); the changelogs s+1 .. v must all be there;
3. a private RocksDB (rocksdict, lz4 as Spark's default) in a scratch dir on the location's file system,
   opened on the base: the zip's entries, and its SSTs hard-linked under their local names (RocksDB
   never rewrites an SST);
4. the changelogs applied in order (spark/changelogs.py) without a WAL, then flushed and checkpointed;
   numKeys / numInternalKeys counted as Spark records them; the base's column family maps carried over
   (every family change forces a snapshot of Spark's own);
5. published as Spark publishes a version: the new SSTs (`SSTs/<local stem>-<uuid>.sst`; the base's
   unchanged ones keep their names), then `<v>.zip`, each synced, moved in without following a symlink
   below the checkpoint location (common/nofollow.py).
The next commit's recipe (jvm-bridge Recipe) then starts from that zip, so restores replay at most
`changelogSnapshotEvery` changelogs, and Spark's own maintenance keeps or deletes the files like its own.

Checkpoint format v1 names only (`<v>.zip`, `<v>.changelog`); format v2 is left to Spark. Run as
`python -m spark_statebackend.spark.materialize ROOT STORE_DIR VERSION SCRATCH` (the sidecar does, in a
process of its own: runtime/materializer.py); exit 0 having printed the zip (or `exists`), 2 with the
reason on stderr.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import orjson
from rocksdict import Checkpoint, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from ..common.nofollow import move_tree_into, opened_dir, opened_file, relative_parts
from ..errors import StateBackendError
from .changelogs import SST_DIR, ChangelogError, changelog_records, complete_snapshot

_ZIP = re.compile(r"(\d+)\.zip")
#: rocksdict's own config file is no part of a RocksDB checkpoint Spark would make.
_NOT_IN_ZIP = ("rocksdict-config.json",)


def base_snapshot(store_fd: int, sst_fd: int | None, version: int) -> tuple[int, dict[str, Any]]:
    """(s, its metadata) of the newest complete `<s>.zip` with s <= `version`; (0, {}) for none."""
    found = [int(m.group(1)) for n in os.listdir(store_fd) if (m := _ZIP.fullmatch(n))]
    for s in sorted((s for s in found if s <= version), reverse=True):
        meta = complete_snapshot(store_fd, sst_fd, f"{s}.zip")
        if meta is not None:
            return s, meta
    return 0, {}


def _open_base(store_fd: int, sst_fd: int | None, base: int, meta: dict[str, Any], db_dir: Path) -> Rdict:
    db_dir.mkdir(parents=True)
    if base:
        with opened_file(store_fd, f"{base}.zip") as f, zipfile.ZipFile(f) as zf:
            for entry in zf.namelist():
                # Flat names only: an entry can never reach outside the scratch dir.
                if entry not in ("metadata", "", ".", "..") and "/" not in entry and "\\" not in entry:
                    (db_dir / entry).write_bytes(zf.read(entry))
        for sst in meta.get("sstFiles", []):
            local = db_dir / sst["localFileName"]
            os.link(sst["dfsSstFileName"], local, src_dir_fd=sst_fd, follow_symlinks=False)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.lz4())  # Spark's default `compression`
    return Rdict(str(db_dir), opts)


def _apply(db: Rdict, store_fd: int, name: str, shown: Path) -> None:
    with opened_file(store_fd, name) as f:
        data = f.read()
    wb = WriteBatch(raw_mode=True)
    for r in changelog_records(data, str(shown)):
        if r.kind == "put":
            wb.put(r.key, r.value)
        elif r.kind == "delete":
            wb.delete(r.key)
        elif r.value is not None:
            wb.delete_range(r.key, r.value)
        else:
            raise ChangelogError(f"{shown}: a delete range without an end key")
    db.write(wb)


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


def materialize(root: Path, store_dir: Path, version: int, scratch: Path) -> Path | None:
    """Write `<version>.zip` (and its new SSTs) into `store_dir`, below checkpoint location `root`, from
    the newest complete snapshot at or below `version` and the changelogs after it (module doc); the zip,
    or None when it was there already. `scratch` must not exist, on `root`'s file system; the caller
    removes it. Raises ChangelogError naming the file when a changelog is missing or unreadable, and
    UnsafePathError for a symlink below `root`: nothing is published then."""
    rel = relative_parts(root, store_dir)
    with opened_dir(root, rel) as store_fd, opened_dir(root, (*rel, SST_DIR)) as sst_fd:
        if store_fd is None:
            raise ChangelogError(f"{store_dir}: no such store dir")
        if f"{version}.zip" in os.listdir(store_fd):
            return None
        base, meta = base_snapshot(store_fd, sst_fd, version)
        names = set(os.listdir(store_fd))
        for v in range(base + 1, version + 1):
            if f"{v}.changelog" not in names:
                raise ChangelogError(
                    f"{store_dir}: {v}.changelog missing (base snapshot {base}, target {version})"
                )
        db = _open_base(store_fd, sst_fd, base, meta, scratch / "db")
        try:
            wo = WriteOptions()
            # The changelogs are the log and the checkpoint follows a flush: no WAL. (rocksdict's stub
            # declares a method; at run time it is a property.)
            wo.disable_wal = True  # type: ignore[method-assign,assignment]
            db.set_write_options(wo)
            for v in range(base + 1, version + 1):
                _apply(db, store_fd, f"{v}.changelog", store_dir / f"{v}.changelog")
            db.flush()
            counts = _count_keys(db, meta)
            Checkpoint(db).create_checkpoint(str(scratch / "ckpt"))
        finally:
            db.close()
    out = scratch / "out"
    _stage(scratch / "ckpt", out, version, meta, counts)
    move_tree_into(out, root, rel)  # SSTs/ first (deepest first), then the zip
    return store_dir / f"{version}.zip"


def _stage(ckpt: Path, out: Path, version: int, base_meta: dict[str, Any], counts: tuple[int, int]) -> None:
    """Lay out in `out` what goes into the store dir: `SSTs/` with the snapshot's new SSTs and
    `<version>.zip`, every file synced."""
    known = {(f["localFileName"], f["sizeBytes"]): f["dfsSstFileName"] for f in base_meta.get("sstFiles", [])}
    (out / SST_DIR).mkdir(parents=True)
    sst_files = []
    for p in sorted(ckpt.glob("*.sst")):
        size = p.stat().st_size
        dfs = known.get((p.name, size))
        if dfs is None:
            dfs = f"{p.stem}-{uuid.uuid4()}.sst"
            os.link(p, out / SST_DIR / dfs)
            _sync(out / SST_DIR / dfs)
        sst_files.append({"localFileName": p.name, "dfsSstFileName": dfs, "sizeBytes": size})
    meta = {
        "sstFiles": sst_files,
        "numKeys": counts[0],
        "numInternalKeys": counts[1],
        "columnFamilyMapping": base_meta.get("columnFamilyMapping", {}),
        "columnFamilyTypeMap": base_meta.get("columnFamilyTypeMap", {}),
        "maxColumnFamilyId": base_meta.get("maxColumnFamilyId", 0),
    }
    zip_path = out / f"{version}.zip"
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(ckpt.iterdir()):
            if p.is_file() and p.suffix != ".sst" and p.name not in _NOT_IN_ZIP:
                zf.write(p, p.name)
        zf.writestr("metadata", "v1\n" + orjson.dumps(meta).decode())
    _sync(zip_path)


def _sync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def main(argv: list[str] | None = None) -> int:
    """`ROOT STORE_DIR VERSION SCRATCH` (module doc); the caller removes the scratch dir (the sidecar
    does, without following a symlink, also after a build it had to kill)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or not args[2].isdigit():
        print(f"usage: python -m {__name__} ROOT STORE_DIR VERSION SCRATCH", file=sys.stderr)
        return 2
    root, store_dir, version, scratch = Path(args[0]), Path(args[1]), int(args[2]), Path(args[3])
    try:
        made = materialize(root, store_dir, version, scratch)
    except (StateBackendError, OSError) as e:  # ChangelogError, UnsafePathError
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(made if made is not None else "exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
