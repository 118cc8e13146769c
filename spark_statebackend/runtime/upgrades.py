"""Upgrades (changelog checkpointing): checkpointing a batch again once Spark has shortened its recipe.

Spark commits version v by writing its changelog and uploads snapshots later, on its maintenance
thread, so a checkpointed recipe (snapshot s plus changelogs s+1..v) can become longer than what Spark
itself would replay from its own files once it has published a newer snapshot (up to v itself). The
shim then stages version v again with the shorter recipe and the sidecar uploads it, diffed against its
previous upload of the store, as an upgrade report of version v (lifecycle/reports.py: upgrades/,
never taken by a batch's own commit). While batch N = v-1 is the query's latest checkpoint and no newer
batch is pending, the committer's `maybe_refresh` (called by the commit loop) reads those reports, for
at most REFRESH_WINDOW_SECONDS after the checkpoint, polling with a backoff (`Upgrades`): for each
store it follows the upgrades of version v from the checkpointed marker (an upgrade's SnapshotIndex
diffs against the checkpointed one, or against an earlier upgrade that does: `follow_upgrades`), and
the last one replaces the store's marker in a new checkpoint of batch N (same offsets, a new checkpoint
id: `upgraded`), written, fenced and cleaned up like any other ([C5]-[C6] of runtime/__init__.py); the
reports it read are deleted. So a restore never replays more changelogs than Spark would after a
restart from its own files, once the upload of Spark's newest snapshot has landed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointId, CheckpointV2, version_of_batch
from ..checkpoints.logs import CheckpointFencedError, CheckpointLog
from ..common.metrics import Metrics
from ..engine.transfer import TransferPool
from ..lifecycle.markers import UnusableMarkerError, load_marker_index
from ..lifecycle.reports import Report, read_upgrades
from ..stores import BlobStore
from .cleanup import Cleanup
from .query_state import QueryState

log = logging.getLogger("spark_statebackend.commit")  # the committer's, as before

#: How long after a changelog-mode checkpoint the committer looks for upgraded snapshots of its version
#: (module doc: Spark's maintenance thread uploads a snapshot within a maintenance interval, 60 s by
#: default), and the first and longest gap between two looks.
REFRESH_WINDOW_SECONDS = 600.0
REFRESH_FIRST_POLL_SECONDS = 0.25
REFRESH_MAX_POLL_SECONDS = 10.0


@dataclass
class UpgradeWindow:
    """A changelog-mode checkpoint whose snapshots Spark may still shorten (module doc)."""

    checkpoint: CheckpointV2
    changelog: dict[str, bool]  # store -> its checkpointed snapshot replays changelogs
    until: float
    next_poll: float
    gap: float = REFRESH_FIRST_POLL_SECONDS


class Upgrades:
    """The upgrades of one committer's queries (module doc): the latest checkpoint of each query whose
    upgrades are still looked for, when to look, and the checkpoints written with them."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        pool: TransferPool,
        *,
        app_id: str,
        metrics: Metrics,
        cleanup: Cleanup,
    ) -> None:
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.app_id = app_id
        self.metrics = metrics
        self.cleanup = cleanup
        self.windows: dict[str, UpgradeWindow] = {}  # query -> its latest checkpoint, if upgradable

    def watch(self, checkpoint: CheckpointV2, changelog: dict[str, bool], now: float) -> None:
        """Look for upgrades of `checkpoint` (now the query's latest) from now on."""
        self.windows[checkpoint.query_id] = UpgradeWindow(
            checkpoint,
            changelog,
            until=now + REFRESH_WINDOW_SECONDS,
            next_poll=now + REFRESH_FIRST_POLL_SECONDS,
        )

    def forget(self, query_id: str) -> None:
        self.windows.pop(query_id, None)

    def watched(self, query_id: str) -> bool:
        return query_id in self.windows

    def next_look_in(self, now: float) -> float | None:
        """Seconds until the next look is due (0: now), None if no window is open."""
        return min((max(0.0, up.next_poll - now) for up in self.windows.values()), default=None)

    def due(self, now: float, fenced: Collection[str]) -> list[tuple[str, UpgradeWindow]]:
        """The windows to look into now (their next look is scheduled with a doubling gap); windows
        that ended, or of a query this committer was fenced from, are dropped."""
        out = []
        for qid, up in list(self.windows.items()):
            if now < up.next_poll:
                continue
            if now > up.until or qid in fenced:
                self.windows.pop(qid, None)
                continue
            up.next_poll = now + up.gap
            up.gap = min(up.gap * 2, REFRESH_MAX_POLL_SECONDS)
            out.append((qid, up))
        return out

    def refresh_due(
        self,
        now: float,
        fenced: Collection[str],
        queries: Mapping[str, QueryState],
        newer_pending: Callable[[str, int], bool],
        on_fenced: Callable[[str, int, CheckpointFencedError], None],
    ) -> int:
        """`refresh` each window due at `now` (`due`), except one whose query has a batch newer than
        its checkpoint pending (`newer_pending(query, batch)`); how many checkpoints were written. A
        fenced write calls `on_fenced(query, batch, error)` and forgets the window; any other failure
        is logged and retried at the next look."""
        written = 0
        for qid, up in self.due(now, fenced):
            try:
                if not newer_pending(qid, up.checkpoint.batch_id):
                    written += self.refresh(up, queries[qid])
            except CheckpointFencedError as e:
                on_fenced(qid, up.checkpoint.batch_id, e)
                self.forget(qid)
            except Exception:
                log.exception(
                    "query %s batch %d: looking for upgraded snapshots failed", qid, up.checkpoint.batch_id
                )
        return written

    def refresh(self, up: UpgradeWindow, q: QueryState) -> int:
        """Checkpoint the upgrades reported for `up`'s version, if any; how many checkpoints were
        written (0 or 1). The reports read are deleted. Raises CheckpointFencedError."""
        cp = up.checkpoint
        qid = cp.query_id
        reports = read_upgrades(self.store, qid, version_of_batch(cp.batch_id), app_id=self.app_id)
        if not reports:
            return 0
        upgrades, changelog = follow_upgrades(self.store, qid, up, reports)
        written = 0
        if upgrades:
            written = self._write(up, q, upgrades, changelog)
        # Every report read is used or can never be (its parent is no snapshot of this checkpoint's chain).
        self.pool.run_all([partial(self.store.delete, r.blob_id) for r in reports])
        return written

    def _write(
        self, up: UpgradeWindow, q: QueryState, upgrades: dict[str, str], changelog: dict[str, bool]
    ) -> int:
        """[C5]-[C6] for a new checkpoint of `up`'s batch with the upgraded snapshots."""
        cp = up.checkpoint
        qid = cp.query_id
        current = dict(cp.markers(BLOBSTORE_BACKEND))
        checkpoint = upgraded(cp, upgrades, changelog, after=q.last_id)
        self.log.write(checkpoint)  # raises CheckpointFencedError (see Committer.maybe_refresh)
        q.last_id = checkpoint.checkpoint_id
        q.last_markers = dict(checkpoint.markers(BLOBSTORE_BACKEND))
        up.checkpoint = checkpoint
        up.changelog = changelog
        self.metrics.checkpoints_written.labels(qid).inc()
        log.info(
            "query %s batch %d: checkpoint %s written with the upgraded snapshot(s) of %s (Spark published a "
            "newer snapshot of version %d after its commit, or the sidecar built one from its changelogs)",
            qid,
            cp.batch_id,
            checkpoint.checkpoint_id,
            ", ".join(sorted(upgrades)),
            version_of_batch(cp.batch_id),
        )
        if self.cleanup.still_writer(qid, checkpoint.checkpoint_id, cp.batch_id):
            self.cleanup.after_upgrade(q.manager, checkpoint, upgrades, current)
        return 1


def follow_upgrades(
    store: BlobStore, qid: str, up: UpgradeWindow, reports: Sequence[Report]
) -> tuple[dict[str, str], dict[str, bool]]:
    """The upgraded markers of `up`'s checkpoint (store -> the last upgrade of a chain from its
    checkpointed marker) and whether each store's snapshot then replays changelogs. An upgrade report
    whose SnapshotIndex is unusable is logged and ignored."""
    cp = up.checkpoint
    version = version_of_batch(cp.batch_id)
    current = dict(cp.markers(BLOBSTORE_BACKEND))
    after: dict[tuple[str, str], Report] = {}  # (store, the marker it diffs against) -> the upgrade
    for r in reports:
        try:
            index = load_marker_index(store, qid, r.store, r.marker)
        except UnusableMarkerError as e:
            log.error("query %s batch %d: upgrade report %s: %s; ignored", qid, cp.batch_id, r.blob_id, e)
            continue
        parent = index.prev_snapshot_index_blob_id
        if index.metadata.version == version and parent is not None:
            after[(r.store, parent)] = r  # the later of two uploads on one parent wins
    upgrades: dict[str, str] = {}
    changelog = dict(up.changelog)
    for key, marker in current.items():
        m = marker
        for _ in range(len(reports)):  # a chain of upgrades from the checkpointed snapshot
            step = after.get((key, m))
            if step is None:
                break
            m = step.marker
            changelog[key] = step.changelog
        if m != marker:
            upgrades[key] = m
    return upgrades, changelog


def upgraded(
    cp: CheckpointV2, upgrades: Mapping[str, str], changelog: Mapping[str, bool], after: CheckpointId | None
) -> CheckpointV2:
    """A new checkpoint of `cp`'s batch (same offsets, a new id after `after`) with the upgraded markers."""
    markers = {**cp.markers(BLOBSTORE_BACKEND), **upgrades}
    return dataclasses.replace(
        cp,
        checkpoint_id=CheckpointId.create(cp.batch_id, after=after),
        state_checkpoint_markers={**cp.state_checkpoint_markers, BLOBSTORE_BACKEND: markers},
        changelog_checkpointing=any(changelog.values()),
    )
