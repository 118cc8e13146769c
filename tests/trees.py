"""Helpers that build and compare real directory trees for the engine tests."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from spark_statebackend.engine.diff import IMMUTABLE_IGNORED_BITS

Tree = Mapping[str, "bytes | Tree | None"]
"""name -> bytes (a file), a nested mapping (a directory), or None (an empty directory)."""


def make_tree(root: Path, tree: Tree) -> Path:
    """Create `tree` under `root` (created if missing) and return root."""
    root.mkdir(parents=True, exist_ok=True)
    for name, value in tree.items():
        path = root / name
        if isinstance(value, bytes):
            path.write_bytes(value)
        else:
            make_tree(path, value or {})
    return root


def read_tree(root: Path) -> dict[str, object]:
    """The inverse of make_tree: every file's bytes and every directory, with permission bits; a
    symlink is ("symlink", its target), never followed."""
    out: dict[str, object] = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_symlink():
            out[entry.name] = ("symlink", os.readlink(entry.path))
        elif entry.is_dir(follow_symlinks=False):
            out[entry.name + "/"] = read_tree(Path(entry.path))
        else:
            out[entry.name] = (Path(entry.path).read_bytes(), os.stat(entry.path).st_mode & 0o7777)
    return out


def restored_as(tree: dict[str, object]) -> dict[str, object]:
    """`tree` (read_tree) as a restore may legitimately recreate it: an SST hard-linked from a local
    store's read-only, owner-private blob has the blob's mode, without write bits and group and
    other read bits (engine/placing.py; only where the process cannot write through a read-only
    mode, so never as root). Apply to both sides of a comparison."""
    out: dict[str, object] = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            out[name] = restored_as(value)
        elif isinstance(value, tuple) and name.endswith(".sst") and isinstance(value[1], int):
            out[name] = (value[0], value[1] & ~IMMUTABLE_IGNORED_BITS)
        else:
            out[name] = value
    return out
