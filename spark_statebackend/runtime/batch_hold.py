"""Whether a staged version's uploads wait for the rest of its batch ([C3] of runtime/__init__.py).

The upload loop (upload_loop.py) asks `BatchHold` each turn. A version's uploads wait for the rest of
the batch on this executor: while a store this sidecar uploaded at the previous version has not staged
this one, as long as the batch's stores keep arriving (the newest staged less than BATCH_HOLD_SECONDS
ago) and for at most half of maxCommitDelay
since the first, so the commit gate never waits for a hold. Uploading the first store of a batch at
once made the sidecar read, write and fsync while the same host's task threads were still flushing the
batch's other stores (Spark's snapshot commits), and those flushes, on the task thread, were what
slowed. Spark's snapshots published meanwhile (upgrades: a whole snapshot's SSTs, the largest uploads
there are) wait too, whatever their version: Spark's maintenance thread publishes them whenever its
timer fires, in the middle of a batch too. Once the batch's last store is staged (a store moved to another
executor: once the stores stop arriving) the whole version goes up in one group. Nothing is lost
meanwhile: Spark's own files hold the version, and the checkpoint only comes later.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import spool as sp

#: How long after the newest store of a batch a version's uploads still wait for the rest (module doc):
#: a batch's stores are staged one after another as its tasks commit, so this runs out only when a
#: store moved to another executor (or a task took longer than this between two commits).
BATCH_HOLD_SECONDS = 2.0


class BatchHold:
    """Which stores of a query this sidecar uploaded at its latest version (module doc), and so which
    staged versions wait for the rest of their batch: while a store of the previous version has not
    staged this one, until none has been staged for `quiet_seconds`, and never longer than
    `limit_seconds` after the first. Spark's snapshots (upgrades) of the query wait meanwhile."""

    def __init__(self, limit_seconds: float) -> None:
        self.limit_seconds = limit_seconds
        self.quiet_seconds = min(BATCH_HOLD_SECONDS, limit_seconds)
        self._last: dict[str, tuple[int, frozenset[str]]] = {}  # query -> (version, store keys)

    def held(
        self, groups: dict[tuple[str, int], list[tuple[Path, sp.SnapshotEvent]]]
    ) -> set[tuple[str, int]]:
        """Which of `groups` (query id, version -> its staged events) wait this turn."""
        if self.limit_seconds <= 0:
            return set()
        now = time.time()
        held = {key for key, items in groups.items() if self._batch_arriving(key, items, now)}
        busy = {qid for qid, _ in held}
        held |= {
            (qid, version)
            for (qid, version), items in groups.items()
            if qid in busy
            and all(ev.upgrade for _, ev in items)
            and now - _first_s(items) < self.limit_seconds
        }
        return held

    def _batch_arriving(
        self, key: tuple[str, int], items: list[tuple[Path, sp.SnapshotEvent]], now: float
    ) -> bool:
        query_id, version = key
        last = self._last.get(query_id)
        if last is None or last[0] != version - 1:
            return False  # nothing known of the previous batch here (first batch, restarted sidecar)
        if not last[1] - {ev.instance.key for _, ev in items}:
            return False  # the whole batch is staged
        newest = max(ev.created_at_ms for _, ev in items) / 1000
        return now - newest < self.quiet_seconds and now - _first_s(items) < self.limit_seconds

    def release_in(self, items: list[tuple[Path, sp.SnapshotEvent]], now: float) -> float:
        """Seconds until a held group of `items` may be let go by time alone (`now`: epoch seconds):
        its stores stopped arriving for `quiet_seconds`, or `limit_seconds` since its first. Whatever
        else lets it go (its batch's last store staged) is a new event, which wakes the loop itself."""
        newest = max(ev.created_at_ms for _, ev in items) / 1000
        ends = (newest + self.quiet_seconds, _first_s(items) + self.limit_seconds)
        return min((end - now for end in ends if end > now), default=0.0)

    def uploaded(self, query_id: str, version: int, keys: set[str]) -> None:
        """`keys` of `version` of `query_id` were uploaded in its batch (never an upgrade's)."""
        if not keys:
            return
        last = self._last.get(query_id)
        if last is None or version > last[0]:
            self._last[query_id] = (version, frozenset(keys))
        elif version == last[0]:
            self._last[query_id] = (version, last[1] | keys)


def _first_s(items: list[tuple[Path, sp.SnapshotEvent]]) -> float:
    """When the first of `items` was staged (epoch seconds)."""
    return min(ev.created_at_ms for _, ev in items) / 1000
