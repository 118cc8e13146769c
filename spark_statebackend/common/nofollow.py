"""Placing files inside a directory tree without ever following a symlink below its root.

Restore and cleanup write into directories other programs also write into (Spark's checkpoint
location, a store's directory). A symlink planted there (say `SSTs -> /elsewhere`) must not turn a
restore into a write outside the tree, and a stale file (or symlink) where a restored file belongs
must be replaced, not kept. Path-based calls (`Path.mkdir`, `os.replace(a, b)`) follow symlinks in
every component, so everything here works on directory file descriptors: each component below
`root` is opened with O_NOFOLLOW | O_DIRECTORY relative to its parent, and files are renamed into
those descriptors, so a symlink swapped in after the check is not followed either. `root` itself is
opened normally: it is the caller's (the user's) choice of location.

Errors are UnsafePathError naming the offending path; `move_tree_into` checks every target before it
creates or moves anything, so a refused merge leaves the destination as it was.

A target directory on another file system than the source (a mount point below the root: a store's
dir on a disk of its own) cannot take a rename (EXDEV): the file is then copied into a temporary name
beside its target (`.<name>.ssb-copy-<random>`, see `is_copy_temp`), synced, and renamed over it, so
the target name never holds a partial file either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import UnsafePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A symlink opened with O_NOFOLLOW | O_DIRECTORY fails with ELOOP (or ENOTDIR on some systems).
_NOT_A_DIR = frozenset({errno.ELOOP, errno.ENOTDIR})


def relative_parts(root: Path, path: Path) -> tuple[str, ...]:
    """The components of `path` below `root`, compared lexically (no symlink is resolved).

    Raises UnsafePathError if `path` is not `root` or below it, or has a '.' or '..' component."""
    parts = Path(os.path.normpath(path)).parts
    base = Path(os.path.normpath(root)).parts
    if parts[: len(base)] != base or any(p in (".", "..") for p in Path(path).parts):
        raise UnsafePathError(f"{path} is not inside {root}")
    return tuple(parts[len(base) :])


class DirTree:
    """Directory descriptors below one root, opened (and created) without following symlinks.

    Use as a context manager; every descriptor is closed on exit."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._fds: dict[tuple[str, ...], int] = {}

    def __enter__(self) -> DirTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def path(self, rel: Sequence[str]) -> Path:
        return self.root.joinpath(*rel)

    def dir_fd(self, rel: Sequence[str], *, create: bool) -> int | None:
        """The descriptor of root/rel; None if a component is missing and not `create`.

        Raises UnsafePathError naming the path if a component is a symlink or not a directory."""
        key = tuple(rel)
        fd = self._fds.get(key)
        if fd is not None:
            return fd
        if not key:
            try:
                if create:
                    self.root.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.root, _DIR_FLAGS)
            except FileNotFoundError:
                return None
        else:
            parent = self.dir_fd(key[:-1], create=create)
            if parent is None:
                return None
            fd = self._open_child(parent, key, create)
            if fd is None:
                return None
        self._fds[key] = fd
        return fd

    def _open_child(self, parent: int, key: tuple[str, ...], create: bool) -> int | None:
        name = key[-1]
        for _ in range(2):
            try:
                return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):  # created concurrently: the open decides
                    os.mkdir(name, dir_fd=parent)
            except OSError as e:
                if e.errno in _NOT_A_DIR:
                    raise UnsafePathError(
                        f"{self.path(key)} is a symlink or not a directory inside {self.root}; "
                        "refusing to follow it"
                    ) from None
                raise
        raise UnsafePathError(f"{self.path(key)} inside {self.root} cannot be opened as a directory")

    def check(self, rel: Sequence[str]) -> None:
        """Refuse if any existing component of root/rel is a symlink or not a directory (missing
        ones are fine and are not created)."""
        self.dir_fd(rel, create=False)


def _files(src: Path, order: Callable[[str], Any] | None = None) -> Iterator[tuple[tuple[str, ...], str]]:
    """(directory parts, file name) of every file under `src`, deepest directories first, so a
    directory's own files come after everything below it (a store's zip after its SSTs); within a
    directory sorted by `order` (default: by name)."""
    for dirpath, _dirnames, filenames in os.walk(src, topdown=False):
        rel = Path(dirpath).relative_to(src).parts
        for name in sorted(filenames, key=order):
            yield tuple(rel), name


def move_tree_into(
    src: Path,
    root: Path,
    into: Sequence[str] = (),
    *,
    before_place: Callable[[int, str], None] | None = None,
    order: Callable[[str], Any] | None = None,
    last: Sequence[str] = (),
) -> int:
    """Move every file of `src` to the same relative place under root/into, replacing whatever is
    there (a stale file, or a symlink: the link itself, never its target); return how many.

    Nothing below `root` is followed if it is a symlink: every target directory is opened (created
    if missing) and every target name checked before the first move, and UnsafePathError names the
    first symlink, or a directory where a file belongs (a symlink swapped in after that check is
    still not followed, but then the merge can stop halfway). Files move deepest directories first, so a
    directory's own files (a store's `<v>.zip`) arrive after what they refer to. `before_place(dir
    fd, name)` runs just before each file is placed (e.g. to drop a checksum side file). `order`: the
    sort key of the names within one directory (default: the name), i.e. which of them arrive last.
    `last`: top-level directories of `src` whose files move after every other file, in that order (a
    checkpoint location's `commits/`: a move cut short never leaves a commit without its offsets)."""
    base = tuple(into)
    files = list(_files(src, order))
    if last:
        files.sort(key=lambda f: last.index(f[0][0]) + 1 if f[0] and f[0][0] in last else 0)
    with DirTree(root) as tree:
        for rel, name in files:  # check every target before anything is created or moved
            fd = tree.dir_fd(base + rel, create=False)
            if fd is None:
                continue  # a directory to create: nothing in it to check
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{tree.path(base + rel) / name} is a directory where a file belongs")
        for rel, name in files:
            fd = tree.dir_fd(base + rel, create=True)
            assert fd is not None  # create=True
            if before_place is not None:
                before_place(fd, name)
            _place(src.joinpath(*rel, name), fd, name)
    return len(files)


#: Marks the temporary name of a file being copied into place across file systems (`_copy_into`).
_COPY_TEMP = ".ssb-copy-"


def is_copy_temp(name: str) -> bool:
    """Whether `name` is a temporary copy of ours (module doc) that a crash left behind: never one of
    Spark's files, so never snapshotted as one."""
    return name.startswith(".") and _COPY_TEMP in name


def _place(src: Path, dir_fd: int, name: str) -> None:
    """Move the file `src` to `name` in `dir_fd`, replacing what is there (never following it)."""
    try:
        os.replace(src, name, dst_dir_fd=dir_fd)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        _copy_into(src, dir_fd, name)  # another file system below the root (module doc)
        os.unlink(src)


def _copy_into(src: Path, dir_fd: int, name: str) -> None:
    """Copy the file `src` (mode and times too) into `dir_fd` as `name` through a synced temporary
    name, so `name` is the old file or the whole new one, even after a crash."""
    tmp = f".{name}{_COPY_TEMP}{uuid.uuid4().hex[:12]}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with open(src, "rb") as fin, open(os.open(tmp, flags, 0o600, dir_fd=dir_fd), "wb") as fout:
            copy_open_file(fin, fout)
            os.fsync(fout.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def copy_open_file(fin: BinaryIO, fout: BinaryIO) -> None:
    """Copy the open file `fin` into the new file `fout` with its permission bits and times (what
    shutil.copy2 does by path, here on descriptors opened without following a symlink)."""
    shutil.copyfileobj(fin, fout, 1 << 20)
    fout.flush()
    st = os.fstat(fin.fileno())
    os.fchmod(fout.fileno(), stat.S_IMODE(st.st_mode))
    os.utime(fout.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))


def remove_entry(dir_fd: int, name: str) -> bool:
    """Remove `name` in the directory `dir_fd`: a directory with everything below it, or a file or
    a symlink (the link itself, never its target); False if there was nothing. No symlink is followed."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)  # the fd-based rmtree: it never follows a symlink below
    else:
        os.unlink(name, dir_fd=dir_fd)
    return True


def remove_below(root: Path, rel: Sequence[str], *, create_parent: bool = False) -> bool:
    """Remove root/rel as `remove_entry` does; False if there was nothing (or its parent is missing, and
    not `create_parent`). Raises UnsafePathError naming a symlinked or non-directory component of its
    parent: nothing is followed below `root`."""
    with DirTree(root) as tree:
        fd = tree.dir_fd(rel[:-1], create=create_parent)
        return fd is not None and remove_entry(fd, rel[-1])


def walk_entries(
    top: Path, dir_fd: int, parts: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], int, os.DirEntry[str]]]:
    """(directory parts below `top`, that directory's descriptor, entry) of every entry that is not a
    directory (files, symlinks, others) below `top`, the directory open as `dir_fd`; a directory's
    own entries first, names sorted. Directories are descended opened with O_NOFOLLOW relative to
    their parent, so a symlink is an entry, never followed; a descriptor is valid only until the walk
    moves on, and at most one per level is open. A directory removed during the walk is skipped;
    one swapped for a symlink during it raises UnsafePathError naming it."""
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            yield parts, dir_fd, entry
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in _NOT_A_DIR:
                raise UnsafePathError(
                    f"{top.joinpath(*parts, entry.name)} became a symlink or not a directory; refusing to "
                    "follow it"
                ) from None
            raise
        try:
            yield from walk_entries(top, fd, (*parts, entry.name))
        finally:
            os.close(fd)


@contextmanager
def opened_file(dir_fd: int, name: str) -> Iterator[BinaryIO]:
    """`name` in the directory `dir_fd` opened for reading, never through a symlink (OSError: ELOOP)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        yield f


@contextmanager
def opened_dir(root: Path, rel: Sequence[str]) -> Iterator[int | None]:
    """The descriptor of root/rel opened without following symlinks below root (None if missing);
    closed on exit. Raises UnsafePathError naming a symlinked or non-directory component."""
    with DirTree(root) as tree:
        yield tree.dir_fd(rel, create=False)


def open_regular(path: Path, inode: int | None = None) -> BinaryIO:
    """`path` opened for reading if it is a regular file reached without a symlink at its last name
    and, given `inode`, the very file a caller looked at before (its lstat or a diff): a name swapped
    for a symlink, a FIFO or another file in between is refused, so an upload never reads bytes from
    outside the directory it was planned in. The caller closes the file.

    Raises UnsafePathError naming the path when refused; OSError (e.g. FileNotFoundError) otherwise."""
    # O_NONBLOCK: a FIFO swapped in must not block the open (it is refused below); on a regular file
    # the flag changes nothing.
    fd = _open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK, "read")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path} is not a regular file; refusing to read it")
        if inode is not None and st.st_ino != inode:
            raise UnsafePathError(
                f"{path} is no longer the file planned for upload (inode {st.st_ino}, expected {inode}); "
                "refusing to read it"
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_new(path: Path) -> BinaryIO:
    """`path` opened for writing, created or emptied, never through a symlink at its last name
    (UnsafePathError naming it): a name planted where a restore writes does not truncate or fill a
    file elsewhere. The caller closes the file."""
    return os.fdopen(_open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "write"), "wb")


def _open_nofollow(path: Path, flags: int, verb: str) -> int:
    """os.open of `path` with `flags`, O_NOFOLLOW and O_CLOEXEC (a created file 0666 less the umask, as
    open() makes it); a symlink at the name raises UnsafePathError saying it was not `verb`."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symlink; refusing to {verb} through it") from None
        raise
