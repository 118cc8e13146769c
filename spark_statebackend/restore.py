"""RestoreManager: recreate a directory exactly as a snapshot recorded it; verify a snapshot in place.

The restore of snapshot S into directory D:

  [1] Fetch and parse S's SnapshotIndex. Names in it are data: the parser has already rejected
      separators, '..', absolute paths and duplicates; every target is also checked to lie inside
      the restore's own directory before anything is written.
  [2] If D already holds exactly S (same names, and every file the same by the diff rules), stop:
      nothing is downloaded.
  [3] Build the result in a fresh sibling directory T (same filesystem). Create every directory;
      for every file, hard-link an identical local file if D (or a reuse directory) has one, else
      create it at its final size and queue its chunks.
  [4] Download all queued chunks on the bounded pool, in parallel across files and chunks, each
      written at its offset and checksum-verified while written. The first error cancels the rest,
      removes T, and leaves D untouched.
  [5] Apply permissions and mtimes. Each chunk task fdatasyncs what it wrote (overlapping the other
      downloads), so a crash cannot leave a torn file that a later restore would trust by name and
      size.
  [6] Swap: D -> D.old, T -> D, remove D.old. Anything in D that is not in S is gone.

A crash during [3]-[5] leaves D as it was plus a stale T, removed by the next restore of D. A crash
inside [6] can leave D missing: the next restore then downloads everything. D is never half-written.
"""

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

from .backup import load_snapshot_index
from .blobstore import BlobStore
from .checksum import ChecksumSink, file_checksum, format_crc
from .diff import DiffOptions, are_same_file, file_metadata
from .errors import ChecksumError, CorruptIndexError, StateBackendError, UnsafePathError
from .index import DirIndex, FileIndex, SnapshotIndex
from .metrics import Metrics
from .transfer import LockedProgress, NoProgress, Progress, TransferPool, download_chunk

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreConfig:
    diff: DiffOptions = field(default_factory=DiffOptions)
    timeout_seconds: float = 30 * 60.0
    fsync: bool = True


@dataclass(frozen=True)
class RestoreResult:
    """What a restore did. `skipped`: the destination already held the snapshot."""

    marker: str
    dest: Path
    files_downloaded: int
    bytes_downloaded: int
    files_reused: int
    bytes_reused: int
    skipped: bool
    seconds: float


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
    """Restores snapshots into directories (module doc: the algorithm). Transfers run on `pool`."""

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
        """Make `dest` hold exactly the snapshot `marker` names; see the module doc for guarantees.

        Raises BlobNotFoundError / CorruptIndexError / ChecksumError naming the blob or file."""
        started = time.monotonic()
        dest = Path(dest).absolute()
        snapshot = index if index is not None else load_snapshot_index(self.store, marker)  # [1]
        store_key = snapshot.metadata.store
        opts = self.config.diff
        if dest.is_dir() and is_identical(dest, snapshot.dir_index, opts):  # [2]
            log.info("restore %s into %s: already identical, nothing downloaded", marker, dest)
            return RestoreResult(marker, dest, 0, 0, 0, 0, True, time.monotonic() - started)

        dest.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_siblings(dest)
        tmp = dest.parent / f".{dest.name}.restore-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            result = self._build(marker, snapshot, dest, tmp, reuse_dirs, progress)
            self._swap(dest, tmp)  # [6]
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        m = self.metrics
        m.restore_files.labels(store_key).inc(result[0])
        m.restore_bytes.labels(store_key).inc(result[1])
        m.restore_files_reused.labels(store_key).inc(result[2])
        m.restore_bytes_reused.labels(store_key).inc(result[3])
        m.restore_seconds.labels(store_key).observe(seconds)
        m.restore_rate.labels(store_key).set(result[1] / max(seconds, 1e-9))
        log.info(
            "restore %s (store %s) into %s: %d file(s) / %d byte(s) downloaded, %d reused, in %.3fs",
            marker,
            store_key,
            dest,
            result[0],
            result[1],
            result[2],
            seconds,
        )
        return RestoreResult(marker, dest, result[0], result[1], result[2], result[3], False, seconds)

    def _remove_stale_siblings(self, dest: Path) -> None:
        for pattern in (f".{dest.name}.restore-*", f".{dest.name}.old-*"):
            for stale in dest.parent.glob(pattern):
                log.warning("removing %s left by an interrupted restore", stale)
                shutil.rmtree(stale, ignore_errors=True)

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
    ) -> tuple[int, int, int, int]:
        prog = LockedProgress(progress or NoProgress())
        root = snapshot.dir_index
        for rel in root.walk_dirs():  # [3]
            _inside(tmp, rel).mkdir(parents=True, exist_ok=True)
        roots = [dest, *reuse_dirs] if dest.is_dir() else list(reuse_dirs)
        tasks: list[Callable[[], None]] = []
        downloaded: list[tuple[Path, FileIndex]] = []
        reused_files = reused_bytes = 0
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
                except OSError:
                    shutil.copyfile(source, target)
                reused_files += 1
                reused_bytes += f.metadata.size
                continue
            with open(target, "wb") as out:
                out.truncate(f.metadata.size)
            downloaded.append((target, f))
            for b in f.blobs:
                tasks.append(
                    partial(download_chunk, self.store, b, target, rel, prog, sync=self.config.fsync)
                )
        total = sum(f.metadata.size for _, f in downloaded)
        prog.start(total)
        self.pool.run_all(tasks, timeout=self.config.timeout_seconds)  # [4]

        for target, f in downloaded:  # [5] data was synced chunk by chunk in [4]
            os.chmod(target, f.metadata.permissions)
            os.utime(target, ns=(f.metadata.mtime_ns, f.metadata.mtime_ns))
        return len(downloaded), total, reused_files, reused_bytes

    def _swap(self, dest: Path, tmp: Path) -> None:
        old = None
        if dest.exists() or dest.is_symlink():
            old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(dest, old)
        os.rename(tmp, dest)
        if self.config.fsync:
            fd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class VerifyReport:
    """Result of verify(): problems is empty when every blob exists and every checksum matches."""

    marker: str
    files: int
    blobs: int
    bytes: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_snapshot(store: BlobStore, pool: TransferPool, marker: str) -> VerifyReport:
    """Read every blob of snapshot `marker` and check its checksum, writing nothing locally.

    A missing or corrupt index is reported as a problem too (never raised), so one call tells all."""
    try:
        snapshot = load_snapshot_index(store, marker)
    except StateBackendError as e:
        return VerifyReport(marker, 0, 0, 0, (str(e),))
    files = list(snapshot.dir_index.walk_files())

    def check(rel: str, f: FileIndex) -> list[str]:
        problems = []
        if file_checksum([b.checksum for b in f.blobs]) != f.checksum:
            problems.append(f"{rel}: chunk checksums do not add up to the file checksum")
        for b in f.blobs:
            sink = ChecksumSink()
            try:
                n = store.get(b.blob_id, sink, 0, b.size)
            except StateBackendError as e:
                problems.append(f"{rel}: {e}")
                continue
            actual = format_crc(sink.crc)
            if n != b.size:
                problems.append(f"{rel}: blob {b.blob_id!r} has {n} of {b.size} bytes")
            elif actual != b.checksum:
                problems.append(str(ChecksumError(rel, b.blob_id, b.checksum, actual)))
        return problems

    results = pool.run_all([partial(check, rel, f) for rel, f in files])
    problems = tuple(p for r in results for p in r)
    return VerifyReport(
        marker=marker,
        files=len(files),
        blobs=sum(len(f.blobs) for _, f in files),
        bytes=sum(f.metadata.size for _, f in files),
        problems=problems,
    )
