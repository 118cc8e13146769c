"""What the upload loop (upload_loop.py) checks of a staged snapshot event before it trusts the paths
the event names ([C2]-[C3] of runtime/__init__.py). An event is written by the JVM, but the sidecar
uploads its staged dir and then deletes it, so a dir of any other shape (a hostile or corrupt event) is
refused before either; and a snapshot whose checkpoint location or staged dir is gone can never be
uploaded, which is decided by looking at those paths, never from an upload's error.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..checkpoints.checkpoint import check_query_id
from ..errors import StateBackendError
from . import spool as sp

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar


class ClaimedEvents:
    """A spool's snapshot events, claimed, each read and checked once. A claimed file never changes (its
    name, a stamp and a UUID, is never reused), and the upload loop looks at every claimed event at each
    turn while a batch is held: reading each once keeps a batch of n stores at n reads, not n^2/2 (at 200
    stores about a sixth of the sidecar's time went to reading the same events again)."""

    def __init__(self, spool: sp.Spool, executor_id: str) -> None:
        self.spool = spool
        self.executor_id = executor_id
        self._read: dict[Path, sp.SnapshotEvent] = {}

    def take(self) -> list[tuple[Path, sp.SnapshotEvent]]:
        """Every pending event claimed, and with the ones claimed before, each with its event checked by
        check_staged_layout, oldest first. One that cannot be read or is refused is logged at ERROR and
        quarantined, so it cannot stall the loop."""
        events: list[tuple[Path, sp.SnapshotEvent]] = []
        for path in sp.claimed(self.spool.events_dir) + self.spool.pending_events():
            claimed = path if path.parent.name == sp.CLAIMED_DIR else sp.claim(path)
            if claimed is None:
                continue
            ev = self._read.get(claimed)
            if ev is None:
                try:
                    ev = check_staged_layout(sp.read_event(claimed), claimed)
                except (StateBackendError, OSError) as e:
                    log.error("sidecar %s: bad snapshot event %s: %s", self.executor_id, claimed, e)
                    sp.quarantine(claimed)
                    continue
            events.append((claimed, ev))
        self._read = dict(events)  # only those still claimed: the others were uploaded or discarded
        return events


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
