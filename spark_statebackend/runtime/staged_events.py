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
from ..checkpoints.store_instance import StoreInstance
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
        for path in self.spool.unfinished_events():
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


def recency(ev: sp.SnapshotEvent) -> tuple[int, int, int]:
    """Which of two staged events of one store wins: the newer version; for one version the recipe
    from the newer snapshot (an upgrade), then the one staged last (a retried task)."""
    snapshot = ev.version if ev.snapshot_version is None else ev.snapshot_version
    return (ev.version, snapshot, ev.created_at_ms)


def log_gone(path: Path, ev: sp.SnapshotEvent, gone: Path) -> None:
    """Say that staged event `path` is dropped because `gone` (gone_path) no longer exists."""
    location_gone = gone == ev.checkpoint_root
    # The location deleted: its query stopped and its state went with it on purpose. Our staged dir
    # gone under a location that is still there: a version of a live query is lost to the backup.
    log.log(
        logging.WARNING if location_gone else logging.ERROR,
        "query %s store %s version %d: the %s %s no longer exists%s; this staged snapshot is dropped, "
        "NOT backed up (event %s)",
        ev.query_id,
        ev.instance.key,
        ev.version,
        "checkpoint location" if location_gone else "staged dir",
        gone,
        " (deleted with its stopped query)" if location_gone else "",
        path.name,
    )


def check_staged_layout(ev: sp.SnapshotEvent, source: Path) -> sp.SnapshotEvent:
    """Return `ev` if its query id is usable and its staged dir has the shim's layout,
    `.../<op>/<part>/<store>/<version>-<rand>` (runtime/spool), else raise SpoolFormatError. The sidecar
    uploads that dir and then deletes it, so an event naming any other directory (a hostile or
    corrupt one) must be refused before either."""
    check_staging_dir(ev.staged_dir, ev.instance, ev.version, ev.query_id, source)
    return ev


def check_staging_dir(
    d: Path, instance: StoreInstance, version: int, query_id: str | None, source: Path
) -> None:
    """Raise SpoolFormatError, naming `source`, unless `query_id` (None: none) is usable and `d` is a
    staging dir of version `version` of `instance`: `.../<op>/<part>/<store>/<version>-<rand>`, the
    layout the shim stages a version and streams a changelog into (check_staged_layout)."""
    parts = d.parts
    ok = (
        len(parts) >= 5
        and ".." not in parts
        and d.name.startswith(f"{version}-")
        and len(d.name) > len(f"{version}-")
        and parts[-2] == sp.sanitize_id(instance.store_name)
        and parts[-3] == str(instance.partition)
        and parts[-4] == str(instance.operator)
    )
    if query_id is not None:
        try:
            check_query_id(query_id)
        except ValueError as e:
            raise sp.SpoolFormatError(source, str(e)) from None
    if not ok:
        raise sp.SpoolFormatError(
            source,
            f"staged_dir {str(d)!r} is not a staging dir of store {instance.key} version "
            f"{version} (<staging>/<app>/<op>/<part>/<store>/<version>-<random>); refused",
        )
