"""DirDiff: what changed between a local directory and the DirIndex of its previous snapshot.

The comparison follows Samza's DirDiffUtil.areSameFile: two files are the same when name, size,
owner, group and permission bits match, and, for files of at most `small_file_bytes` (default
1 MiB), the full checksum matches. Larger files (RocksDB SSTs, immutable once written) compare by
name and size only unless `checksum_all_files` is set. Timestamps are ignored on purpose: a restored
file gets a new ctime, and that must not force a re-upload. For immutable kinds of file
(`immutable_patterns`, RocksDB SSTs by default) the write bits and the group and other read bits are
not compared: nothing ever writes into one, and a restore may hard-link it from a blob file that is
read-only and private to its owner (engine/placing.py, [R4]; LocalBlobStore's blobs are 0400, 0444
in older stores), so a 0644 SST restored as 0400 or 0444 is the same file and is not uploaded again.

`stat_identity` (the CLI's backup of arbitrary directories, where a file larger than
`small_file_bytes` may be rewritten in place at the same size): such a file is taken as unchanged
without reading it only if its size, mtime, ctime and inode number all equal those its FileIndex
recorded (as restic does); otherwise its checksum is compared, and a file whose content turns out
unchanged is retained with its metadata refreshed, so it is not read again next time. The Spark
runtime leaves it off: staged SSTs are immutable hard links whose ctime changes whenever a link is
made or removed, so stat identity would read every SST on every upload.

Only regular files and directories can be snapshotted; a symlink or special file is an error that
names it, never silently skipped (a skipped file would be a lost file on restore).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import grp
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..common.names import check_name
from ..errors import StateBackendError
from .checksum import local_file_checksum
from .index import DirIndex, FileIndex, FileMetadata

DEFAULT_SMALL_FILE_BYTES = 1024 * 1024

#: Files nothing ever writes into once created: RocksDB only reads and unlinks its SSTs. CURRENT,
#: MANIFEST, OPTIONS, logs and Spark's zips are not in it.
DEFAULT_IMMUTABLE_PATTERNS: tuple[str, ...] = ("*.sst",)

_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH

#: Permission bits not compared for immutable kinds of file (module doc): a hard link of a read-only,
#: owner-private blob file lacks them.
IMMUTABLE_IGNORED_BITS = _WRITE_BITS | stat.S_IRGRP | stat.S_IROTH


@dataclass(frozen=True)
class DiffOptions:
    """How files are compared. `small_file_bytes`: files up to this size are also compared by checksum.
    `checksum_all_files`: every file is (restic's --force; the CLI's backup --reread).
    `immutable_patterns`: fnmatch patterns of file names whose write bits and group and other read
    bits are not compared (module doc); restore hard-links only these from a local blob store.
    `stat_identity`: a larger file is read unless size, mtime, ctime and inode match (module doc)."""

    small_file_bytes: int = DEFAULT_SMALL_FILE_BYTES
    checksum_all_files: bool = False
    immutable_patterns: tuple[str, ...] = DEFAULT_IMMUTABLE_PATTERNS
    stat_identity: bool = False

    def is_immutable(self, name: str) -> bool:
        """Whether a file called `name` is of a kind nothing writes into after creating it."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.immutable_patterns)

    def ignored_bits(self, name: str) -> int:
        """The permission bits not compared for a file called `name` (module doc)."""
        return IMMUTABLE_IGNORED_BITS if self.is_immutable(name) else 0


@dataclass(frozen=True)
class LocalFile:
    """A local file to upload: where it is and what its metadata is now."""

    name: str
    path: Path
    metadata: FileMetadata


@dataclass(frozen=True)
class DiffStats:
    files_added: int
    bytes_added: int
    files_retained: int
    bytes_retained: int
    files_removed: int
    bytes_removed: int
    subdirs_added: int
    subdirs_removed: int


@dataclass(frozen=True)
class DirDiff:
    """The diff of one directory; subdirs_added hold DirDiffs whose files are all added."""

    name: str
    files_added: tuple[LocalFile, ...] = ()
    files_retained: tuple[FileIndex, ...] = ()
    files_removed: tuple[FileIndex, ...] = ()
    subdirs_added: tuple[DirDiff, ...] = ()
    subdirs_retained: tuple[DirDiff, ...] = ()
    subdirs_removed: tuple[DirIndex, ...] = ()

    def added_files(self, prefix: str = "") -> Iterator[tuple[str, LocalFile]]:
        """Every file to upload, as (relative path, LocalFile), recursively."""
        for f in self.files_added:
            yield prefix + f.name, f
        for d in (*self.subdirs_added, *self.subdirs_retained):
            yield from d.added_files(prefix + d.name + "/")

    def stats(self) -> DiffStats:
        fa = ba = fr = br = fx = bx = da = dx = 0
        stack: list[DirDiff] = [self]
        while stack:
            d = stack.pop()
            fa += len(d.files_added)
            ba += sum(f.metadata.size for f in d.files_added)
            fr += len(d.files_retained)
            br += sum(f.metadata.size for f in d.files_retained)
            fx += len(d.files_removed)
            bx += sum(f.metadata.size for f in d.files_removed)
            da += len(d.subdirs_added)
            dx += len(d.subdirs_removed)
            for removed in d.subdirs_removed:
                for _, f in removed.walk_files():
                    fx += 1
                    bx += f.metadata.size
            stack.extend(d.subdirs_added)
            stack.extend(d.subdirs_retained)
        return DiffStats(fa, ba, fr, br, fx, bx, da, dx)


@lru_cache(maxsize=256)
def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@lru_cache(maxsize=256)
def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def file_metadata(st: os.stat_result) -> FileMetadata:
    """FileMetadata of a stat result."""
    return FileMetadata(
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
        owner=_user(st.st_uid),
        group=_group(st.st_gid),
        permissions=stat.S_IMODE(st.st_mode),
        inode=st.st_ino,
    )


def same_stat(local: FileMetadata, recorded: FileMetadata) -> bool:
    """Whether size, mtime, ctime and inode number all equal the recorded ones (an index written
    before inodes were recorded never matches: the file is read once, then recorded)."""
    if recorded.inode is None:
        return False
    now = (local.size, local.mtime_ns, local.ctime_ns, local.inode)
    return now == (recorded.size, recorded.mtime_ns, recorded.ctime_ns, recorded.inode)


def are_same_file(local_path: Path, local: FileMetadata, remote: FileIndex, options: DiffOptions) -> bool:
    """Samza's areSameFile (see module doc); `remote.name` is assumed equal to the local name."""
    rm = remote.metadata
    if local.size != rm.size or local.owner != rm.owner or local.group != rm.group:
        return False
    ignored = options.ignored_bits(remote.name)
    if local.permissions & ~ignored != rm.permissions & ~ignored:
        return False
    if (
        options.checksum_all_files
        or local.size <= options.small_file_bytes
        or (options.stat_identity and not same_stat(local, rm))
    ):
        layout = [(b.offset, b.size) for b in remote.blobs]
        try:
            return local_file_checksum(local_path, layout) == remote.checksum
        except OSError:
            return False
    return True


def _scan(path: Path) -> tuple[dict[str, tuple[Path, os.stat_result]], dict[str, Path]]:
    files: dict[str, tuple[Path, os.stat_result]] = {}
    dirs: dict[str, Path] = {}
    with os.scandir(path) as it:
        for entry in it:
            try:
                check_name(entry.name, what=f"file name in {path}")
            except ValueError as e:
                raise StateBackendError(str(e)) from None
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                files[entry.name] = (Path(entry.path), st)
            elif stat.S_ISDIR(st.st_mode):
                dirs[entry.name] = Path(entry.path)
            else:
                raise StateBackendError(
                    f"{entry.path}: not a regular file or directory; snapshots hold only those"
                )
    return files, dirs


def compute_diff(local_dir: Path, previous: DirIndex | None, options: DiffOptions | None = None) -> DirDiff:
    """Diff `local_dir` (recursively) against the previous snapshot's DirIndex (None: nothing before).

    The top-level DirDiff is named '' (a snapshot's root directory has no name of its own)."""
    return _diff(local_dir, previous, options or DiffOptions(), name="")


def _diff(local_dir: Path, previous: DirIndex | None, options: DiffOptions, name: str) -> DirDiff:
    if not local_dir.is_dir():
        raise StateBackendError(f"{local_dir}: not a directory")
    files, dirs = _scan(local_dir)
    prev_files = {f.name: f for f in previous.files_present} if previous else {}
    prev_dirs = {d.name: d for d in previous.subdirs_present} if previous else {}

    added: list[LocalFile] = []
    retained: list[FileIndex] = []
    for fname in sorted(files):
        path, st = files[fname]
        meta = file_metadata(st)
        old = prev_files.get(fname)
        if old is not None and are_same_file(path, meta, old, options):
            # Stat identity records the file as it is now, so an unchanged file read this time
            # (new ctime or inode, e.g. after a restore) is not read again next time.
            retained.append(dataclasses.replace(old, metadata=meta) if options.stat_identity else old)
        else:
            added.append(LocalFile(fname, path, meta))
    # A file replaced by a changed version is both added (new content) and removed (old blobs).
    retained_names = {f.name for f in retained}
    removed = [f for n, f in sorted(prev_files.items()) if n not in retained_names]

    sub_added: list[DirDiff] = []
    sub_retained: list[DirDiff] = []
    for dname in sorted(dirs):
        old_dir = prev_dirs.get(dname)
        sub = _diff(dirs[dname], old_dir, options, dname)
        (sub_retained if old_dir is not None else sub_added).append(sub)
    sub_removed = [d for n, d in sorted(prev_dirs.items()) if n not in dirs]
    # A previous file that is now a directory (or the reverse) is covered: its name is absent
    # from the matching kind's listing, so it lands in removed on one side and added on the other.
    return DirDiff(
        name=name,
        files_added=tuple(added),
        files_retained=tuple(retained),
        files_removed=tuple(removed),
        subdirs_added=tuple(sub_added),
        subdirs_retained=tuple(sub_retained),
        subdirs_removed=tuple(sub_removed),
    )


def build_dir_index(diff: DirDiff, uploaded: dict[int, FileIndex]) -> DirIndex:
    """The new DirIndex for a diff once its added files are uploaded.

    `uploaded` maps id(LocalFile) of every added file to its FileIndex."""
    present = sorted(
        [*diff.files_retained, *(uploaded[id(f)] for f in diff.files_added)], key=lambda f: f.name
    )
    subdirs = sorted(
        (build_dir_index(d, uploaded) for d in (*diff.subdirs_added, *diff.subdirs_retained)),
        key=lambda d: d.name,
    )
    return DirIndex(
        name=diff.name,
        files_present=tuple(present),
        files_removed=diff.files_removed,
        subdirs_present=tuple(subdirs),
        subdirs_removed=diff.subdirs_removed,
    )
