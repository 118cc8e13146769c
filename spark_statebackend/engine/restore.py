"""RestoreManager: recreate a directory exactly as a snapshot recorded it ([R1]-[R6] of
engine/__init__.py, which the code marks). Placing single files (the local fast path, permissions and
mtimes) is placing.py; verifying a snapshot without restoring it is verify.py."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..common.durable import fsync_dir
from ..common.metrics import Metrics
from ..common.nofollow import open_new, open_regular
from ..errors import CorruptIndexError, UnsafePathError
from ..stores import BlobStore
from .blobs import load_snapshot_index
from .checksum import file_checksum
from .diff import DiffOptions, are_same_file, file_metadata
from .index import DirIndex, FileBlob, FileIndex, SnapshotIndex
from .placing import apply_metadata, place_local, whole_local_blob
from .transfer import LockedProgress, NoProgress, Progress, TransferPool, download_chunk

log = logging.getLogger("spark_statebackend.restore")  # name kept from the flat layout


@dataclass(frozen=True)
class RestoreConfig:
    """`link`: whether the local fast path may hard-link blob files at all ([R4]; it also
    needs the conditions of placing.linkable); False always copies (in the kernel, verified)."""

    diff: DiffOptions = field(default_factory=DiffOptions)
    timeout_seconds: float = 30 * 60.0
    fsync: bool = True
    link: bool = True


@dataclass(frozen=True)
class RestoreResult:
    """What a restore did. `skipped`: the destination already held the snapshot. Files taken from the
    blob store count as downloaded; `files_linked` of them were hard-links to local blob files."""

    marker: str
    dest: Path
    files_downloaded: int
    bytes_downloaded: int
    files_reused: int
    bytes_reused: int
    skipped: bool
    seconds: float
    files_linked: int = 0


def _inside(root: Path, rel: str) -> Path:
    """root/rel, refusing anything that would resolve outside root."""
    target = root.joinpath(*rel.split("/"))
    root_real = os.path.realpath(root)
    if os.path.commonpath([root_real, os.path.realpath(target)]) != root_real:
        raise UnsafePathError(f"snapshot path {rel!r} would escape {root}")
    return target


def _regular_file(path: Path) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def is_identical(directory: Path, index: DirIndex, options: DiffOptions) -> bool:
    """Whether `directory` holds exactly the files and directories of `index` (diff rules per file)."""
    try:
        entries = {e.name: e for e in os.scandir(directory)}
    except OSError:
        return False
    files = {f.name: f for f in index.files_present}
    dirs = {d.name: d for d in index.subdirs_present}
    if set(entries) != set(files) | set(dirs):
        return False
    for name, f in files.items():
        st = _regular_file(Path(entries[name].path))
        if st is None or not are_same_file(Path(entries[name].path), file_metadata(st), f, options):
            return False
    for name, d in dirs.items():
        e = entries[name]
        if not e.is_dir(follow_symlinks=False) or not is_identical(Path(e.path), d, options):
            return False
    return True


class RestoreManager:
    """Restores snapshots into directories ([R1]-[R6]). Transfers run on `pool`."""

    def __init__(
        self,
        store: BlobStore,
        pool: TransferPool,
        *,
        config: RestoreConfig | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.config = config or RestoreConfig()
        self.metrics = metrics or Metrics()

    def restore(
        self,
        marker: str,
        dest: Path,
        *,
        reuse_dirs: Sequence[Path] = (),
        progress: Progress | None = None,
        index: SnapshotIndex | None = None,
    ) -> RestoreResult:
        """Make `dest` hold exactly the snapshot `marker` names ([R1]-[R6]: the guarantees).

        Raises BlobNotFoundError / CorruptIndexError / ChecksumError naming the blob or file."""
        started = time.monotonic()
        dest = Path(dest).absolute()
        snapshot = index if index is not None else load_snapshot_index(self.store, marker)  # [R1]
        store_key = snapshot.metadata.store
        opts = self.config.diff
        if _real_dir(dest) and is_identical(dest, snapshot.dir_index, opts):  # [R2]
            log.info("restore %s into %s: already identical, nothing downloaded", marker, dest)
            return RestoreResult(marker, dest, 0, 0, 0, 0, True, time.monotonic() - started)

        dest.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_siblings(dest)
        tmp = dest.parent / f".{dest.name}.restore-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            result = self._build(marker, snapshot, dest, tmp, reuse_dirs, progress)
            self._swap(dest, tmp, list(snapshot.dir_index.walk_dirs()))  # [R6]
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        meta = snapshot.metadata
        # per query (the store is in the log), or per store too with metrics.perStore
        f = self.metrics.restore(meta.query_id, meta.query_name, store_key)
        rate = result[1] / max(seconds, 1e-9)
        f.files.inc(result[0])
        f.bytes.inc(result[1])
        f.files_reused.inc(result[2])
        f.bytes_reused.inc(result[3])
        f.seconds.observe(seconds)
        f.rate.set(rate)
        if result[1] > 0:
            self.metrics.restored(rate)
        log.info(
            "restore %s (store %s) into %s: %d file(s) / %d byte(s) downloaded (%d hard-linked from the "
            "store), %d reused, in %.3fs",
            marker,
            store_key,
            dest,
            result[0],
            result[1],
            result[4],
            result[2],
            seconds,
        )
        return RestoreResult(
            marker, dest, result[0], result[1], result[2], result[3], False, seconds, files_linked=result[4]
        )

    def _remove_stale_siblings(self, dest: Path) -> None:
        for pattern in (f".{dest.name}.restore-*", f".{dest.name}.old-*"):
            for stale in dest.parent.glob(pattern):
                log.warning("removing %s left by an interrupted restore", stale)
                _remove(stale)

    def _find_reusable(self, rel: str, f: FileIndex, roots: Sequence[Path]) -> Path | None:
        for root in roots:
            try:
                candidate = _inside(root, rel)
            except UnsafePathError:
                continue
            st = _regular_file(candidate)
            if st is not None and are_same_file(candidate, file_metadata(st), f, self.config.diff):
                return candidate
        return None

    def _build(
        self,
        marker: str,
        snapshot: SnapshotIndex,
        dest: Path,
        tmp: Path,
        reuse_dirs: Sequence[Path],
        progress: Progress | None,
    ) -> tuple[int, int, int, int, int]:
        """Fill `tmp` ([R3]-[R5]); returns (files from the store, their bytes, files reused, their bytes,
        files hard-linked from a local store)."""
        prog = LockedProgress(progress or NoProgress())
        root = snapshot.dir_index
        for rel in root.walk_dirs():  # [R3]
            _inside(tmp, rel).mkdir(parents=True, exist_ok=True)
        roots = [dest, *reuse_dirs] if _real_dir(dest) else list(reuse_dirs)
        tmp_dev = os.stat(tmp).st_dev
        tasks: list[Callable[[], bool]] = []
        downloaded: list[tuple[Path, FileIndex]] = []  # chunked downloads: metadata applied in [R5]
        restored_files = restored_bytes = reused_files = reused_bytes = 0
        for rel, f in root.walk_files():
            if file_checksum([b.checksum for b in f.blobs]) != f.checksum:
                raise CorruptIndexError(
                    marker, f"file {rel!r}: chunk checksums do not add up to the file checksum"
                )
            target = _inside(tmp, rel)
            source = self._find_reusable(rel, f, roots)
            if source is not None:
                try:
                    os.link(source, target)
                except OSError:  # e.g. another filesystem: copied, through no symlink at either name
                    with open_regular(source) as fin, open_new(target) as fout:
                        shutil.copyfileobj(fin, fout, 1 << 20)
                reused_files += 1
                reused_bytes += f.metadata.size
                continue
            restored_files += 1
            restored_bytes += f.metadata.size
            local = whole_local_blob(self.store, f)
            if local is not None:  # one task places the whole file, metadata included
                place = partial(place_local, self.store, self.config, local, f, target, rel, tmp_dev, prog)
                tasks.append(place)
                continue
            with open_new(target) as out:
                out.truncate(f.metadata.size)
            downloaded.append((target, f))
            for b in f.blobs:
                tasks.append(partial(self._download_chunk, b, target, rel, prog))
        prog.start(restored_bytes)
        linked = sum(self.pool.run_all(tasks, timeout=self.config.timeout_seconds))  # [R4]

        for target, f in downloaded:  # [R5] data was synced chunk by chunk in [R4]
            apply_metadata(target, f)
        return restored_files, restored_bytes, reused_files, reused_bytes, linked

    def _download_chunk(self, blob: FileBlob, target: Path, rel: str, prog: Progress) -> bool:
        download_chunk(self.store, blob, target, rel, prog, sync=self.config.fsync)
        return False

    def _swap(self, dest: Path, tmp: Path, dirs: Sequence[str]) -> None:
        if self.config.fsync:  # the entries (links above all) must be durable before T becomes D
            for rel in (*dirs, ""):
                fsync_dir(_inside(tmp, rel) if rel else tmp)
        old = None
        if dest.exists() or dest.is_symlink():
            old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(dest, old)
        os.rename(tmp, dest)
        if self.config.fsync:
            fsync_dir(dest.parent)
        if old is not None:
            _remove(old)


def _real_dir(path: Path) -> bool:
    """Whether `path` is a directory itself, not a symlink to one: a restore never reads, reuses or
    writes through a symlinked destination (the swap replaces the link, never its target)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove(path: Path) -> None:
    """Remove a directory tree of ours, or the symlink (never its target) if `path` is one."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
