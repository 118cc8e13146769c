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
      Local fast path: a file stored as one whole blob of a store that keeps blobs as local files
      (LocalBlobStore) on T's filesystem is not copied through Python. Its task hard-links the blob
      file into T, or else copies it in the kernel (copy_file_range, a reflink where the filesystem
      can), then reads it back from the page cache and verifies its CRC32C against the index: a
      corrupt blob raises ChecksumError naming the file like a download would, and only T (removed)
      ever held it. Anything else (missing or resized blob, another filesystem, a link refused)
      takes the download path, which raises its errors.
      A link shares the blob's inode, so a write, chmod or touch through the restored name would
      change the blob in the store. A blob is linked only if all of these hold (`_linkable`): the
      file is of an immutable kind (`DiffOptions.immutable_patterns`, RocksDB SSTs by default); the
      blob file has no write bit (LocalBlobStore creates blobs 0444); this process cannot write
      through it all the same (`access(W_OK)` with the effective ids: root and CAP_DAC_OVERRIDE
      can, so as root every blob is copied); its owner and group are the file's, and its mode is
      the file's but for the write bits (the diff does not compare those for immutable files). A
      file whose index asks for a mode that is more private than the blob's is copied.
  [5] Apply permissions (setuid, setgid and sticky bits masked off: an index is data and never
      grants privileges) and mtimes to every file written here. This package never chmods or
      touches a linked file: its inode is the blob's, and changing it would change the blob (the
      mtime is the blob's age for GC's grace), so it keeps the blob's read-only mode and mtime. The
      diff ignores mtimes, and the write bits of immutable files, so a later backup uploads nothing.
      Each task fdatasyncs what it wrote (overlapping the other transfers), so a crash cannot leave
      a torn file that a later restore would trust by name and size; a linked file is synced only if
      the store did not sync it at put().
  [6] Fsync T's directories, then swap: D -> D.old, T -> D, fsync D's parent, remove D.old.
      Anything in D that is not in S is gone. A D that is a symlink is never followed: it is not
      compared in [2] nor reused in [3], and the swap replaces the link itself.

A crash during [3]-[5] leaves D as it was plus a stale T, removed by the next restore of D. A crash
inside [6] can leave D missing: the next restore then downloads everything. D is never half-written.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..common import crashpoints
from ..common.durable import fsync_dir
from ..common.metrics import Metrics
from ..errors import ChecksumError, CorruptIndexError, StateBackendError, UnsafePathError
from ..stores import BlobStore
from .backup import load_snapshot_index
from .checksum import ChecksumSink, crc_update, file_checksum, format_crc
from .diff import DiffOptions, are_same_file, file_metadata
from .index import DirIndex, FileBlob, FileIndex, SnapshotIndex
from .transfer import LockedProgress, NoProgress, Progress, TransferPool, download_chunk

log = logging.getLogger("spark_statebackend.restore")  # name kept from the flat layout


#: Permission bits a restore applies from an index: rwx for user, group and others, never setuid,
#: setgid or sticky (an index is data; a hostile one must not hand out privileges).
RESTORED_MODE_MASK = 0o777

_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class RestoreConfig:
    """`link`: whether the local fast path may hard-link blob files at all (module doc [4]; it also
    needs the conditions of `_linkable`); False always copies (in the kernel, verified)."""

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
        if _real_dir(dest) and is_identical(dest, snapshot.dir_index, opts):  # [2]
            log.info("restore %s into %s: already identical, nothing downloaded", marker, dest)
            return RestoreResult(marker, dest, 0, 0, 0, 0, True, time.monotonic() - started)

        dest.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_siblings(dest)
        tmp = dest.parent / f".{dest.name}.restore-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            result = self._build(marker, snapshot, dest, tmp, reuse_dirs, progress)
            self._swap(dest, tmp, list(snapshot.dir_index.walk_dirs()))  # [6]
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
        if result[1] > 0:
            m.last_restore_rate.set(result[1] / max(seconds, 1e-9))
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
        """Fill `tmp` ([3]-[5]); returns (files from the store, their bytes, files reused, their bytes,
        files hard-linked from a local store)."""
        prog = LockedProgress(progress or NoProgress())
        root = snapshot.dir_index
        for rel in root.walk_dirs():  # [3]
            _inside(tmp, rel).mkdir(parents=True, exist_ok=True)
        roots = [dest, *reuse_dirs] if _real_dir(dest) else list(reuse_dirs)
        tmp_dev = os.stat(tmp).st_dev
        tasks: list[Callable[[], bool]] = []
        downloaded: list[tuple[Path, FileIndex]] = []  # chunked downloads: metadata applied in [5]
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
                except OSError:
                    shutil.copyfile(source, target)
                reused_files += 1
                reused_bytes += f.metadata.size
                continue
            restored_files += 1
            restored_bytes += f.metadata.size
            local = self._whole_local_blob(f)
            if local is not None:  # one task places the whole file, metadata included
                tasks.append(partial(self._place_local, local, f, target, rel, tmp_dev, prog))
                continue
            with open(target, "wb") as out:
                out.truncate(f.metadata.size)
            downloaded.append((target, f))
            for b in f.blobs:
                tasks.append(partial(self._download_chunk, b, target, rel, prog))
        prog.start(restored_bytes)
        linked = sum(self.pool.run_all(tasks, timeout=self.config.timeout_seconds))  # [4]

        for target, f in downloaded:  # [5] data was synced chunk by chunk in [4]
            _apply_metadata(target, f)
        return restored_files, restored_bytes, reused_files, reused_bytes, linked

    def _download_chunk(self, blob: FileBlob, target: Path, rel: str, prog: Progress) -> bool:
        download_chunk(self.store, blob, target, rel, prog, sync=self.config.fsync)
        return False

    def _whole_local_blob(self, f: FileIndex) -> Path | None:
        """The local file of `f`'s blob if `f` is stored as one whole blob in a store that has one."""
        if len(f.blobs) != 1 or f.blobs[0].offset != 0 or f.blobs[0].size != f.metadata.size:
            return None
        return self.store.local_path(f.blobs[0].blob_id)

    def _linkable(self, name: str, blob_path: Path, st: os.stat_result, f: FileIndex) -> bool:
        """Whether the blob file `blob_path` (stat `st`) may become file `f` by a hard link (module doc
        [4]): an immutable kind of file, a read-only blob this process cannot write through anyway,
        whose owner, group and mode (but for the write bits) already are the file's."""
        if not (self.config.link and self.config.diff.is_immutable(name)):
            return False
        if st.st_mode & _WRITE_BITS:
            return False  # e.g. a blob written before blobs were made read-only
        have, want = file_metadata(st), f.metadata
        if (have.owner, have.group) != (want.owner, want.group):
            return False
        if have.permissions != want.permissions & RESTORED_MODE_MASK & ~_WRITE_BITS:
            return False
        # Last, as it is a system call: root (CAP_DAC_OVERRIDE) writes through mode 0444.
        return not os.access(blob_path, os.W_OK, effective_ids=True)

    def _place_local(
        self, blob_path: Path, f: FileIndex, target: Path, rel: str, tmp_dev: int, prog: Progress
    ) -> bool:
        """[4] local fast path for one file (module doc); True if it was hard-linked."""
        blob = f.blobs[0]
        try:
            st = os.stat(blob_path)
        except OSError:
            st = None  # missing: the download path raises BlobNotFoundError naming it
        usable = (
            st is not None and stat.S_ISREG(st.st_mode) and st.st_size == blob.size and st.st_dev == tmp_dev
        )
        if st is not None and usable and self._linkable(target.name, blob_path, st, f):
            try:
                os.link(blob_path, target)
            except OSError:  # EMLINK, EPERM (protected_hardlinks), deleted meanwhile: copy instead
                pass
            else:
                # Verify the inode now linked (not the name, which a put could have replaced).
                sync = self.config.fsync and not self.store.local_files_durable
                _verify_placed(target, rel, blob, sync=sync)
                prog.advance(blob.size)
                crashpoints.crash_point(crashpoints.DURING_RESTORE)  # test-only, as in download_chunk
                return True
        if usable and _kernel_copy(blob_path, target, blob.size):
            _verify_placed(target, rel, blob, sync=self.config.fsync)  # what landed in T
            prog.advance(blob.size)
            crashpoints.crash_point(crashpoints.DURING_RESTORE)  # test-only, as in download_chunk
        else:  # the download path: its errors (BlobNotFoundError, ChecksumError) name the blob
            with open(target, "wb") as out:
                out.truncate(f.metadata.size)
            download_chunk(self.store, blob, target, rel, prog, sync=self.config.fsync)
        _apply_metadata(target, f)
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


def _apply_metadata(target: Path, f: FileIndex) -> None:
    """Permissions (within RESTORED_MODE_MASK) and mtime from the index, on a file this restore wrote
    (never on a linked blob)."""
    os.chmod(target, f.metadata.permissions & RESTORED_MODE_MASK)
    os.utime(target, ns=(f.metadata.mtime_ns, f.metadata.mtime_ns))


def _verify_placed(target: Path, rel: str, blob: FileBlob, *, sync: bool) -> None:
    """Verify the file now at `target` against `blob` (_verify_fd) and, with `sync`, fdatasync it."""
    fd = os.open(target, os.O_RDONLY)
    try:
        _verify_fd(fd, rel, blob)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _verify_fd(fd: int, rel: str, blob: FileBlob) -> None:
    """Check that the file open as `fd` holds exactly `blob` (size and CRC32C), reading it through an
    mmap of the page cache (crc32c releases the GIL, so files verify in parallel).

    Raises ChecksumError naming `rel` and the blob, or StateBackendError for a wrong size."""
    size = os.fstat(fd).st_size
    if size != blob.size:
        raise StateBackendError(f"{rel}: blob {blob.blob_id!r} delivered {size} of {blob.size} bytes")
    crc = 0
    if size:
        with (
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ) as mm,
            memoryview(mm) as view,
        ):
            crc = crc_update(0, view)
    actual = format_crc(crc)
    if actual != blob.checksum:
        raise ChecksumError(rel, blob.blob_id, blob.checksum, actual)


# Fault the whole mapping in at once (Linux) instead of one page fault per 4 KiB while checksumming.
_MAP_POPULATE: int = getattr(mmap, "MAP_POPULATE", 0)

# copy_file_range refusing this pair of files (kernel, filesystem): fall back to a download.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM})


def _kernel_copy(src: Path, dst: Path, size: int) -> bool:
    """Copy `size` bytes of `src` into a new `dst` with copy_file_range (a reflink on filesystems that
    share extents, an in-kernel copy elsewhere). False if the kernel refuses the pair (nothing useful
    written, or no copy_file_range on this OS); other errors (ENOSPC, EIO) raise."""
    if not hasattr(os, "copy_file_range"):
        return False
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        done = 0
        while done < size:
            try:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), size - done, done, done)
            except OSError as e:
                if e.errno in _NO_KERNEL_COPY and done == 0:
                    return False
                raise
            if n == 0:
                break  # the source shrank: verification reports the size
            done += n
    return True


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


def verify_snapshot(
    store: BlobStore, pool: TransferPool, marker: str, *, progress: Progress | None = None
) -> VerifyReport:
    """Read every blob of snapshot `marker` and check its checksum, writing nothing locally.

    A missing or corrupt index is reported as a problem too (never raised), so one call tells all.
    `progress` is started with the snapshot's total blob bytes and advanced as each blob is read."""
    try:
        snapshot = load_snapshot_index(store, marker)
    except StateBackendError as e:
        return VerifyReport(marker, 0, 0, 0, (str(e),))
    files = list(snapshot.dir_index.walk_files())
    prog = LockedProgress(progress or NoProgress())
    prog.start(sum(b.size for _, f in files for b in f.blobs))

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
            finally:
                prog.advance(b.size)
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
