"""File names that are data: one safe path component, or an error saying why not.

A name read from an index, a checkpoint or a plan (a file of a snapshot, a store's name, a part of a
plan's path) is data, never a path: joined under a directory it must stay one level below it. The
engine's index parser and the code that builds indexes from local names, the store instance's directory
(checkpoints/store_instance.py) and the batch plans (lifecycle/plans.py) all check names here.
"""

from __future__ import annotations

#: The longest file name (in UTF-8 bytes) common file systems (ext4, XFS, APFS) take.
MAX_NAME_BYTES = 255


def check_name(name: str, *, what: str = "name") -> str:
    """Return `name` if it is a safe single path component, else raise ValueError saying why."""
    if not isinstance(name, str):
        raise ValueError(f"{what} is not a string: {name!r}")
    if name in ("", ".", ".."):
        raise ValueError(f"{what} {name!r} is not a file name")
    if "/" in name or "\\" in name or "\x00" in name:
        raise ValueError(f"{what} {name!r} contains a path separator or NUL")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise ValueError(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return name
