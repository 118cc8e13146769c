"""The spool's file operations (runtime/spool/__init__.py: "Atomicity"): whole files only, claimed
by a rename, quarantined when they do not parse, oldest first by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from ...common.durable import fsync_dir
from .documents import (
    CheckpointLocationRequest,
    PlanRequest,
    RestoreRequest,
    RestoreResponse,
    SnapshotEvent,
    read_any_request,
)
from .fields import MAX_FILE_BYTES

CLAIMED_DIR = "claimed"
BAD_DIR = "bad"

# Only finished files match: temporaries start with "." and end with ".tmp".
_STEM_FILE = re.compile(r"^\d{20}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.json$")


_stem_lock = threading.Lock()
_last_stamp = 0


def new_file_stem() -> str:
    """`<20-digit epoch ns>-<uuid4>`: unique, and strictly increasing within this process."""
    global _last_stamp
    with _stem_lock:
        _last_stamp = max(_last_stamp + 1, time.time_ns())
        stamp = _last_stamp
    return f"{stamp:020d}-{uuid.uuid4()}"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Writes `data` to `path` so that readers see either no file or the whole file.

    The bytes go to a hidden temporary in the same directory (`.<name>.<uuid>.tmp`), are fsynced when
    `fsync`, and the temporary is renamed over `path`; then the directory is fsynced. An existing
    `path` is replaced atomically.
    """
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4()}.tmp"
    try:
        # 0600: spool files are this user's business only (the sidecar's conf holds secrets).
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if fsync:
        fsync_dir(target.parent)
    return target


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, fsync: bool = True) -> Path:
    """`atomic_write_bytes` of `obj` serialised with orjson."""
    return atomic_write_bytes(path, orjson.dumps(obj), fsync=fsync)


def read_bytes(path: Path) -> bytes:
    """The bytes of spool file `path`, read up to one byte past the largest a spool file may be."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    return data


def list_pending(directory: str | os.PathLike[str]) -> list[Path]:
    """Finished `<stem>.json` files directly in `directory`, oldest first; [] if it does not exist.

    Temporaries and claimed files are never listed, so a caller only ever sees whole files.
    """
    d = Path(directory)
    try:
        names = [e.name for e in os.scandir(d) if _STEM_FILE.match(e.name) and e.is_file()]
    except FileNotFoundError:
        return []
    return [d / n for n in sorted(names)]


def claim(path: str | os.PathLike[str]) -> Path | None:
    """Atomically moves a pending file into `<its dir>/claimed/`; None if it is already gone.

    A claimed file is out of `list_pending`; `claimed` lists them again after a crash, so work that
    was claimed but not finished can be redone (processing must be idempotent).
    """
    src = Path(path)
    return _move_into(src, src.parent / CLAIMED_DIR)


def claimed(directory: str | os.PathLike[str]) -> list[Path]:
    """Files claimed in `directory` but not yet removed, oldest first."""
    return list_pending(Path(directory) / CLAIMED_DIR)


def quarantine(path: str | os.PathLike[str]) -> Path | None:
    """Moves a file that failed to parse into `<its dir>/bad/` (kept for diagnosis, out of every
    listing), so one bad file cannot stall a consumer; None if it is already gone."""
    src = Path(path)
    base = src.parent.parent if src.parent.name == CLAIMED_DIR else src.parent
    return _move_into(src, base / BAD_DIR)


def _move_into(src: Path, dst_dir: Path) -> Path | None:
    """Atomically renames `src` into `dst_dir` (created 0700 if missing), keeping its name; the new
    path, or None if `src` is already gone (another consumer moved or removed it)."""
    dst_dir.mkdir(mode=0o700, exist_ok=True)
    dst = dst_dir / src.name
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return None
    return dst


def remove(path: str | os.PathLike[str]) -> bool:
    """Deletes a processed spool file; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def read_event(path: str | os.PathLike[str]) -> SnapshotEvent:
    p = Path(path)
    return SnapshotEvent.from_json(read_bytes(p), str(p))


def read_request(path: str | os.PathLike[str]) -> RestoreRequest | CheckpointLocationRequest | PlanRequest:
    p = Path(path)
    return read_any_request(read_bytes(p), str(p))


def read_response(path: str | os.PathLike[str]) -> RestoreResponse:
    p = Path(path)
    return RestoreResponse.from_json(read_bytes(p), str(p))
