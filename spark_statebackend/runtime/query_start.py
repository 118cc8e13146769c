"""How the committer (committer.py) starts on a query it has not seen in this process: what it learns
from the checkpoint log before its first checkpoint of it.

A committer starting on a query (e.g. its sidecar restarted after a kill -9) fences earlier writers, re-
runs the cleanup of the query's latest checkpoint and counts that batch as committed, so a crash between
the write and the end of its cleanup leaves neither TTLs on referenced blobs nor replaced blobs behind.
An unusable marker in that latest checkpoint (hostile or foreign blob id, missing or corrupt
SnapshotIndex; lifecycle/markers.py) is data, never an instruction: the committer logs an ERROR naming
the query, the checkpoint, the store and the marker, skips that store's cleanup (nothing the marker
names is deleted, made permanent or used as a diff base: a bad `_driver` marker makes the next `_driver`
snapshot a full upload) and goes on committing the query's next batches, whose markers come from fresh
uploads, so the next checkpoint supersedes the bad one. Blobs only the bad checkpoint kept are left to
their TTL and `gc`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND
from ..checkpoints.logs import CheckpointLog
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig, BackupManager
from ..engine.blobs import SnapshotOwner
from ..engine.transfer import TransferPool
from ..lifecycle.retention import Retention
from ..stores import BlobStore
from .cleanup import Cleanup
from .progress import ProgressEvent
from .query_state import QueryState
from .upgrades import Upgrades


class QueryStart:
    """Starts the committer's QueryState of each query, with the committer's collaborators."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        pool: TransferPool,
        *,
        backup_config: BackupConfig,
        metrics: Metrics,
        retention: Retention | None,
        upgrades: Upgrades,
        cleanup: Cleanup,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.backup_config = backup_config
        self.metrics = metrics
        self.retention = retention
        self.upgrades = upgrades
        self.cleanup = cleanup
        self.clock = clock

    def start(self, event: ProgressEvent, register: Callable[[QueryState], None]) -> QueryState:
        """The state of `event`'s query, learnt from the log (module doc): earlier writers fenced,
        retention seeded, the latest checkpoint's upgrades watched; `register(state)` is called before
        the latest checkpoint's cleanup is redone (a failing cleanup leaves the query registered).
        Raises on a failure of the log or the store (the committer retries at its next poll)."""
        owner = SnapshotOwner(event.query_id, event.query_name)
        q = QueryState(
            BackupManager(self.store, self.pool, owner=owner, config=self.backup_config, metrics=self.metrics)
        )
        self.log.acquire_writer(event.query_id)  # fence earlier drivers before anything is read
        latest = self.log.read_latest(event.query_id)
        if self.retention is not None:
            history = self.log.read_history(event.query_id)
            self.retention.seed(
                event.query_id, [(str(c.checkpoint_id), c.markers(BLOBSTORE_BACKEND)) for c in history]
            )
        if latest is not None:
            if latest.changelog_checkpointing:
                changelog = dict.fromkeys(latest.markers(BLOBSTORE_BACKEND), True)
                self.upgrades.watch(latest, changelog, self.clock())
            q.learn(latest, self.store)
        register(q)
        if latest is not None:
            self.cleanup.at_start(latest, q.manager)
        return q
