"""What the upload loop (upload_loop.py) checks of a staged snapshot event before it trusts the paths
the event names ([C2]-[C3] of runtime/__init__.py). An event is written by the JVM, but the sidecar
uploads its staged dir and then deletes it, so a dir of any other shape (a hostile or corrupt event) is
refused before either; and a snapshot whose checkpoint location or staged dir is gone can never be
uploaded, which is decided by looking at those paths, never from an upload's error.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..checkpoints.checkpoint import check_query_id
from . import spool as sp


def gone_path(ev: sp.SnapshotEvent) -> Path | None:
    """The first of `ev`'s checkpoint root and staged dir that is no longer a directory (missing, or a
    path component is not a directory), else None. A path that cannot be checked for another reason
    (permissions, I/O) is not gone: its upload is tried, and retried if it fails."""
    for d in (ev.checkpoint_root, ev.staged_dir):
        try:
            if not stat.S_ISDIR(os.stat(d).st_mode):
                return d
        except (FileNotFoundError, NotADirectoryError):
            return d
        except OSError:
            return None
    return None


def check_staged_layout(ev: sp.SnapshotEvent, source: Path) -> sp.SnapshotEvent:
    """Return `ev` if its query id is usable and its staged dir has the shim's layout,
    `.../<op>/<part>/<store>/<version>-<rand>` (runtime/spool), else raise SpoolFormatError. The sidecar
    uploads that dir and then deletes it, so an event naming any other directory (a hostile or
    corrupt one) must be refused before either."""
    d = ev.staged_dir
    parts = d.parts
    ok = (
        len(parts) >= 5
        and ".." not in parts
        and d.name.startswith(f"{ev.version}-")
        and len(d.name) > len(f"{ev.version}-")
        and parts[-2] == sp.sanitize_id(ev.store)
        and parts[-3] == str(ev.partition)
        and parts[-4] == str(ev.operator)
    )
    if ev.query_id is not None:
        try:
            check_query_id(ev.query_id)
        except ValueError as e:
            raise sp.SpoolFormatError(source, str(e)) from None
    if not ok:
        raise sp.SpoolFormatError(
            source,
            f"staged_dir {str(d)!r} is not a staging dir of store {ev.instance.key} version "
            f"{ev.version} (<staging>/<app>/<op>/<part>/<store>/<version>-<random>); refused",
        )
    return ev
