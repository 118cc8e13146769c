"""The sidecar's commit loop ([C5]-[C6] of runtime/__init__.py), on its thread `ssb-commit`: batch
progress events the JVM listener writes into `progress/` -> the Committer (committer.py).

Only the driver's spool dir receives them, so only the driver's sidecar commits; an executor's commit
loop finds nothing. An event stays claimed, not removed, until its batch is checkpointed or dropped
(`progress_done`): a sidecar started after its predecessor died submits the claimed events again first.
Each turn also lets the committer start the periodic TTL sweep and look for upgraded snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import StateBackendError
from . import spool as sp
from .committer import Committer
from .progress import ProgressEvent, read_progress_event

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before

PROGRESS_DIR = "progress"
#: While batches are pending, how often the committer looks for their stores' marker reports: other
#: hosts' sidecars write them to the blob store, where no spool watch sees them arrive.
PENDING_POLL_SECONDS = 0.02


class CommitLoop:
    """Feeds one spool dir's progress events to a committer (module doc). Runs on one thread."""

    def __init__(
        self, progress_dir: Path, committer: Committer, resolve_query_id: Callable[[Path], str | None]
    ) -> None:
        self.progress_dir = progress_dir
        self.committer = committer
        self.resolve_query_id = resolve_query_id
        self._recovered = False  # the claimed events of a dead predecessor are submitted first, once

    def due_in(self) -> float | None:
        """Seconds until the committer has work that no new progress event announces (its loop waits at
        most that long for one; runtime/spool/wake.py): PENDING_POLL_SECONDS while batches wait for
        their reports, else its next look for upgraded snapshots; None if neither. The periodic sweep,
        minutes apart, is started at most the wait's fallback late."""
        if self.committer.pending():
            return PENDING_POLL_SECONDS
        return self.committer.upgrades.next_look_in(self.committer.clock())

    def commit_once(self) -> bool:
        """Hand new progress events to the committer, then let it commit what it can.

        An event is claimed, not removed, until its batch is checkpointed or dropped (`progress_done`):
        a sidecar that starts after a crash submits its predecessor's claimed events again first."""
        busy = False
        paths = sp.list_pending(self.progress_dir)
        if not self._recovered:
            paths = sp.claimed(self.progress_dir) + paths
            self._recovered = True
        for path in paths:
            busy = True
            claimed = path if path.parent.name == sp.CLAIMED_DIR else sp.claim(path)
            if claimed is None:
                continue
            try:
                event = read_progress_event(claimed, self.resolve_query_id)
            except StateBackendError as e:
                # Quarantined and skipped: one bad file must never hold up the events after it.
                log.error("bad progress event %s: %s", claimed, e)
                sp.quarantine(claimed)
                continue
            if event is None:
                sp.remove(claimed)
            else:
                self.committer.submit(event)
        self.committer.maybe_sweep()  # only starts it, on its own thread, when due
        busy = self.committer.maybe_refresh() > 0 or busy  # upgraded snapshots of checkpointed versions
        if self.committer.pending():
            return self.committer.poll() > 0 or busy
        return busy


def progress_done(event: ProgressEvent) -> None:
    """The committer is done with `event` (checkpointed, superseded or given up on): its spool file goes."""
    if event.source:
        sp.remove(event.source)
