"""A query's checkpoint location as Spark writes it: what the driver side reads and snapshots.

Spark's files: `metadata` (the query id), `sources/`, `offsets/<batch>` (its second line holds the
batch's conf, with `spark.sql.shuffle.partitions`), `commits/<batch>`, and under `state/<op>/` the
operator metadata (`_metadata/`, state schemas) beside each store's dir `<part>[/<store>]`. Ours, under
`_statebackend/`: the JVM's `staging/` (stagingDir's default, where the sidecar also stages the
snapshots it builds; each staged dir goes once the sidecar uploaded or dropped it, leaving the empty
`staging/<app>/<op>/<part>/<store>/` dirs), the sidecar's `restore/` scratch dirs (at a store's restore)
and `materialize/` ones (while it builds a snapshot from changelogs), and the driver-side restore's
`driver-restore/` (while it rebuilds the location): inside the location, so on its file system whatever
its layout (a mount point, a symlink to another disk), and files move from there into place by rename.
Spark never reads `_statebackend/` and `stage_driver_files` never takes anything from it. The
committer's `_driver` snapshot is staged in the driver's spool dir (`driver_staging_dir`), so nothing of
ours is written into a location after its query stopped and its owner may delete it at once.

What the committer snapshots as the `_driver` store (`stage_driver_files`, runtime/checkpoint_build.py),
what a batch plan holds (`read_plan_files`, runtime/plan_store.py), what the driver-side restore
rebuilds ([D3]-[D5] in spark/__init__.py), and how a checkpoint root is tied to its query
(`find_query_id`, [D2]).

Symlinks: Spark writes none in a checkpoint location. A query does not start on a location with one
among Spark's files (`check_no_symlinks`), and `stage_driver_files` never follows one (a checkpoint
could read, and a restore write, outside the location): one planted after the start fails that
checkpoint naming it. A batch plan (`read_plan_files`) leaves it out, never followed. The location
itself may be a symlink (where its user chose to keep it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

import orjson

from ..checkpoints.checkpoint import CheckpointV2
from ..common.nofollow import DirTree, copy_open_file, is_copy_temp, walk_entries
from ..errors import ConfigError, UnsafePathError
from ..lifecycle.locators import read_locator
from ..stores import BlobStore


def local_path(location: str) -> Path:
    """The local directory of a checkpoint location (a path or a `file:` URL); ConfigError for any
    other scheme: only local checkpoint locations are supported."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    if "://" in location:
        raise ConfigError(
            "checkpointLocation", f"{location!r}: only local checkpoint locations are supported"
        )
    return Path(location).absolute()


def latest_commit(root: Path) -> int:
    """The newest batch id in `<root>/commits/`, -1 if none."""
    return latest_entry(root, "commits")


def latest_entry(root: Path, log: str) -> int:
    """The newest batch id in `<root>/<log>/` (`offsets` or `commits`), -1 if none."""
    d = root / log
    if not d.is_dir():
        return -1
    ids = [int(p.name) for p in d.iterdir() if p.name.isdigit()]
    return max(ids, default=-1)


def read_query_id(root: Path) -> str | None:
    """The query id in Spark's `<root>/metadata` file, or None if it is absent or unreadable."""
    meta = root / "metadata"
    if not meta.is_file():
        return None
    try:
        qid = orjson.loads(meta.read_bytes().splitlines()[0]).get("id")
    except (orjson.JSONDecodeError, IndexError, AttributeError):
        return None
    return qid if isinstance(qid, str) else None


def find_query_id(
    root: Path, store: BlobStore, read_latest: Callable[[str], CheckpointV2 | None]
) -> str | None:
    """The query a checkpoint root belongs to: Spark's `metadata` file there (on the driver's host),
    else the locator the committer wrote to the blob store (`read_latest` reads a query's latest
    checkpoint from the log); None if neither knows it."""
    return read_query_id(root) or read_locator(store, str(root), read_latest)


def stage_driver_files(checkpoint_root: Path, batch_id: int, into: Path) -> int:
    """Hard-link (or copy) the driver-side files a restart needs for batch `batch_id` into `into`.

    Taken: `metadata`, `sources/**`, `offsets/{N-1,N}`, `commits/{N-1,N}` (Spark reads the
    second-latest offsets at restart), and under `state/` every path with a component starting with
    '_' (operator metadata, state schemas). Store data (zips, SSTs, changelogs) is not: executors
    back it up per store instance. Returns the number of files staged.

    No symlink is followed (module doc): a symlink among those files or on the way to them (anywhere
    in `sources/` or `state/`) raises UnsafePathError naming it and the checkpoint location, and
    nothing is taken through it. A temporary copy of ours that a crash left (`is_copy_temp`) is not
    one of Spark's files and is skipped."""
    count = 0

    def take(parts: tuple[str, ...], dir_fd: int, name: str) -> None:
        nonlocal count
        dst = into.joinpath(*parts, name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(checkpoint_root, parts, dir_fd, name, dst)
        count += 1

    logs = [(sub, n) for sub in ("offsets", "commits") for n in (batch_id - 1, batch_id)]
    _visit_driver_files(checkpoint_root, logs, take)
    return count


#: A driver file's signature in a plan's bookkeeping: (size, mtime ns, inode).
FileSignature = tuple[int, int, int]


def read_plan_files(
    checkpoint_root: Path, batch_id: int, sent: Mapping[str, FileSignature]
) -> tuple[dict[str, bytes], dict[str, FileSignature], list[str]]:
    """The driver files of batch `batch_id`'s plan (runtime/ [C0]): `commits/<N-1>` and every file of
    `metadata`, `sources/**` and `state/**/_*` (what `stage_driver_files` takes) whose signature differs
    from the one in `sent` (what the previous plan held), as {relative path: bytes}; the signatures of
    all those files now; and the symlinks among them, skipped, never followed (none of Spark's files: a
    planted one fails the query's checkpoints, and the commit gate stops it, module doc)."""
    files: dict[str, bytes] = {}
    now: dict[str, FileSignature] = {}
    skipped: list[str] = []
    last_commit = f"commits/{batch_id - 1}"

    def take(parts: tuple[str, ...], dir_fd: int, name: str) -> None:
        rel = "/".join((*parts, name))
        listed = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if rel != last_commit and sent.get(rel) == (listed.st_size, listed.st_mtime_ns, listed.st_ino):
            now[rel] = sent[rel]  # unchanged: not even opened (Spark keeps ~100 source log files)
            return
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePathError(f"checkpoint location {checkpoint_root}: {rel} is a symlink") from None
            raise
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            now[rel] = (st.st_size, st.st_mtime_ns, st.st_ino)
            files[rel] = f.read()

    def symlink(parts: tuple[str, ...]) -> None:
        skipped.append("/".join(parts))

    logs = [("commits", batch_id - 1)] if batch_id > 0 else []
    _visit_driver_files(checkpoint_root, logs, take, on_symlink=symlink)
    return files, now, skipped


def _visit_driver_files(
    checkpoint_root: Path,
    logs: Sequence[tuple[str, int]],
    take: Callable[[tuple[str, ...], int, str], None],
    *,
    on_symlink: Callable[[tuple[str, ...]], None] | None = None,
) -> None:
    """Call `take(dir parts, dir fd, name)` for each driver file of a checkpoint location: `metadata`,
    every file of `sources/**`, the log entries `logs` ((`offsets`|`commits`, batch); a negative batch
    or a missing entry is skipped) and every file under `state/` with a component starting with '_'.
    Nothing is followed: a symlink among them or on the way raises UnsafePathError (`stage_driver_files`),
    or with `on_symlink` is passed to it (its path parts) and skipped with whatever lies below it."""

    def refuse(parts: tuple[str, ...]) -> bool:  # False: skipped
        if on_symlink is not None:
            on_symlink(parts)
            return False
        raise UnsafePathError(
            f"checkpoint location {checkpoint_root}: {checkpoint_root.joinpath(*parts)} is a symlink; "
            "its driver files are not snapshotted through it (a checkpoint never follows a symlink in "
            "its location) and this batch is not checkpointed. Replace it with the file or directory "
            "it points to"
        )

    def one(dir_fd: int, parts: tuple[str, ...]) -> None:  # a file Spark names: taken unless missing
        kind = _kind(dir_fd, parts[-1])
        if kind == "symlink":
            refuse(parts)
        elif kind == "file":
            take(parts[:-1], dir_fd, parts[-1])

    def subdir(sub: str) -> int | None:  # one of Spark's dirs at the top: never a symlink
        if _kind(top, sub) == "symlink":
            refuse((sub,))
            return None
        return tree.dir_fd((sub,), create=False)

    def walk(sub: str, wanted: Callable[[tuple[str, ...]], bool]) -> None:
        fd = subdir(sub)
        if fd is None:
            return
        for parts, dir_fd, entry in walk_entries(checkpoint_root / sub, fd):
            if entry.is_symlink():
                refuse((sub, *parts, entry.name))
                continue
            if entry.is_file(follow_symlinks=False) and not is_copy_temp(entry.name) and wanted(parts):
                take((sub, *parts), dir_fd, entry.name)

    tree = DirTree(checkpoint_root)
    with tree:
        opened = tree.dir_fd((), create=False)
        if opened is None:
            return
        top = opened
        one(top, ("metadata",))
        walk("sources", lambda parts: True)
        for sub, n in logs:
            fd = subdir(sub)
            if fd is not None and n >= 0:
                one(fd, (sub, str(n)))
        walk("state", lambda parts: any(part.startswith("_") for part in parts))


def _link_or_copy(root: Path, parts: tuple[str, ...], dir_fd: int, name: str, dst: Path) -> None:
    """Hard-link the regular file `name` of `dir_fd` (root/parts/name) to `dst`, else copy it with its
    mode and times; a symlink (swapped in since it was listed) raises UnsafePathError, never followed."""
    path = root.joinpath(*parts, name)
    try:
        os.link(name, dst, src_dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        pass  # another file system, a link refused (protected_hardlinks, EMLINK): copy it
    else:
        if stat.S_ISLNK(os.lstat(dst).st_mode):  # linkat without AT_SYMLINK_FOLLOW links a link itself
            dst.unlink()
            raise UnsafePathError(f"checkpoint location {root}: {path} is a symlink; not snapshotted")
        return
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(
                f"checkpoint location {root}: {path} is a symlink; not snapshotted"
            ) from None
        raise
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        copy_open_file(fin, fout)


#: Spark's own files and directories at the top of a checkpoint location (module doc).
SPARK_TOP = ("metadata", "offsets", "commits", "sources", "state")
#: Ours, under the location: `_statebackend/` and the scratch dirs in it (module doc); directories of
#: the location, never symlinks out of it.
OURS_DIR = "_statebackend"
OURS_SUBDIRS = ("restore", "driver-restore")
#: The driver-side restore's scratch dir, relative to the location (module doc).
DRIVER_RESTORE_PARTS = (OURS_DIR, "driver-restore")
#: The JVM's staging root when `stagingDir` is unset (jvm-bridge ExecutorEnv.stagingRoot); the sidecar
#: stages the snapshots it builds there too (runtime/built_staging.py).
STAGING_PARTS = (OURS_DIR, "staging")
#: The sidecar's snapshot builds' scratch dirs (runtime/materializer.py).
MATERIALIZE_PARTS = (OURS_DIR, "materialize")


def check_no_symlinks(checkpoint_root: Path) -> None:
    """Refuse a checkpoint location with a symlink among Spark's files (`SPARK_TOP` and everything
    below them) or as one of our dirs (`OURS_DIR`, `OURS_SUBDIRS`): UnsafePathError naming every such
    symlink and saying why. Nothing is followed; the location itself may be a symlink. A location that
    does not exist yet passes."""
    found: list[str] = []
    with DirTree(checkpoint_root) as tree:
        top = tree.dir_fd((), create=False)
        if top is None:
            return
        for name in SPARK_TOP:
            kind = _kind(top, name)
            if kind == "symlink":
                found.append(str(checkpoint_root / name))
            elif kind == "dir":
                fd = tree.dir_fd((name,), create=False)
                assert fd is not None  # a directory, just checked
                base = checkpoint_root / name
                found += [
                    str(base.joinpath(*p, e.name)) for p, _, e in walk_entries(base, fd) if e.is_symlink()
                ]
        kind = _kind(top, OURS_DIR)
        if kind == "symlink":
            found.append(str(checkpoint_root / OURS_DIR))
        elif kind == "dir":
            ours = tree.dir_fd((OURS_DIR,), create=False)
            assert ours is not None  # a directory, just checked
            found += [
                str(checkpoint_root / OURS_DIR / n) for n in OURS_SUBDIRS if _kind(ours, n) == "symlink"
            ]
    if found:
        raise UnsafePathError(
            f"checkpoint location {checkpoint_root}: {', '.join(found)} "
            f"{'is a symlink' if len(found) == 1 else 'are symlinks'}; spark-statebackend snapshots Spark's "
            "files there at every checkpoint and restores into them, and never follows a symlink inside a "
            "checkpoint location (it could read or write outside it), so the query does not start. Replace "
            "each with the file or directory it points to; to keep a checkpoint location on another disk, "
            "make the location itself a symlink or a mount point"
        )


def _kind(dir_fd: int, name: str) -> str | None:
    """'symlink', 'dir', 'file' (a regular one), 'other' or None (missing): `name` in the dir `dir_fd`."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "symlink"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def state_instances(checkpoint_root: Path, batch_id: int) -> int:
    """How many state store instances commit version batch_id+1 of the query at `checkpoint_root`:
    for every stateful operator (`state/<op>/`), the store names its newest operator metadata lists
    (v2 `_metadata/v2/<batch>`, else v1 `_metadata/metadata`), times the batch's shuffle partitions
    (`spark.sql.shuffle.partitions` in `offsets/<batch_id>`, which offline repartition rewrites).
    Raises ValueError naming the file when one is missing or malformed."""
    offsets = checkpoint_root / "offsets" / str(batch_id)
    lines = offsets.read_bytes().splitlines()
    if len(lines) < 2:
        raise ValueError(f"{offsets}: no metadata line")
    partitions = int(orjson.loads(lines[1])["conf"]["spark.sql.shuffle.partitions"])
    total = 0
    state = checkpoint_root / "state"
    for op in sorted(p for p in state.iterdir() if p.name.isdigit()) if state.is_dir() else []:
        meta_dir = op / "_metadata"
        v2 = meta_dir / "v2"
        batches = [p for p in v2.iterdir() if p.name.isdigit()] if v2.is_dir() else []
        meta = max(batches, key=lambda p: int(p.name)) if batches else meta_dir / "metadata"
        body = meta.read_bytes().split(b"\n", 1)
        if len(body) < 2:
            raise ValueError(f"{meta}: no operator metadata")
        stores = {str(info["storeName"]) for info in orjson.loads(body[1])["stateStoreInfo"]}
        if not stores:
            raise ValueError(f"{meta}: lists no state store")
        total += len(stores) * partitions
    return total


DRIVER_STAGING_DIR = "driver-staging"


def driver_staging_dir(spool_dir: Path | None) -> Path | None:
    """Where the committer stages a query's `_driver` snapshot (`stage_driver_files`): the private (0700)
    `driver-staging/` of the driver's spool dir `spool_dir`, created if missing; None without one (the
    caller then uses a private temporary dir). Never the checkpoint location: a committer finishing a
    stopped query's last batch must not write into a location its owner is deleting. Its files are hard
    links when the spool shares the location's file system, else copies (they are small). Raises
    OSError if the path exists as anything but a directory (a symlink included)."""
    if spool_dir is None:
        return None
    d = spool_dir / DRIVER_STAGING_DIR
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(d).st_mode):
        raise NotADirectoryError(f"{d}: not a directory (a symlink?); refusing to stage into it")
    return d
