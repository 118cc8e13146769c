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
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
) -> int:
    """Move every file of `src` to the same relative place under root/into, replacing whatever is
    there (a stale file, or a symlink: the link itself, never its target); return how many.

    Nothing below `root` is followed if it is a symlink: every target directory is opened (created
    if missing) and every target name checked before the first move, and UnsafePathError names the
    first symlink, or a directory where a file belongs (a symlink swapped in after that check is
    still not followed, but then the merge can stop halfway). Files move deepest directories first, so a
    directory's own files (a store's `<v>.zip`) arrive after what they refer to. `before_place(dir
    fd, name)` runs just before each file is placed (e.g. to drop a checksum side file). `order`: the
    sort key of the names within one directory (default: the name), i.e. which of them arrive last."""
    base = tuple(into)
    files = list(_files(src, order))
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
            os.replace(src.joinpath(*rel, name), name, dst_dir_fd=fd)
    return len(files)


@contextmanager
def opened_dir(root: Path, rel: Sequence[str]) -> Iterator[int | None]:
    """The descriptor of root/rel opened without following symlinks below root (None if missing);
    closed on exit. Raises UnsafePathError naming a symlinked or non-directory component."""
    with DirTree(root) as tree:
        yield tree.dir_fd(rel, create=False)
