"""Making a directory's entries durable.

A rename, link or create is on stable storage only once the directory holding the name is fsynced;
the local blob store, the restore swap, the spool and the file checkpoint log all rely on that.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path | str) -> None:
    """fsync the directory `path`, so the entries created, renamed or removed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
