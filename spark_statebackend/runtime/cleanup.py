"""[C6] of runtime/__init__.py: the committer's cleanup after a checkpoint, and again at its start.

Cleanup removes the TTL of every blob the new snapshots reference, deletes the blobs of files removed
since the previous snapshots and the previous SnapshotIndex blobs (engine/ [B6]-[B7]), deletes the
marker reports of versions up to the checkpoint's and the batch plans up to its batch (lifecycle/plans.py:
its `_driver` snapshot holds what they held), and applies retention: the log's own retain() and,
with retainCheckpoints K > 1, lifecycle/retention.py (cleanup then deletes nothing itself: the blobs
only checkpoints that fell out of the last K referenced go).

It deletes blobs, so it runs only when the checkpoint was written AND the log's latest checkpoint is
still that one (`still_writer`); otherwise a newer writer owns the query (this committer is a zombie)
and nothing is deleted. Between that check and the deletes a newer writer can still write, but it
started from our checkpoint (it fences before it reads the latest), so it references only blobs of our
checkpoint's snapshots (which cleanup never deletes) and blobs it uploaded itself. A failure is logged
and retried with the next checkpoint's cleanup (the TTL keeps referenced blobs safe for blobTtl, far
longer than a commit interval), which follows each store's chain of snapshots back to the checkpoint
the failed one replaced, so what that one should have deleted goes too; it never un-commits anything.
A committer starting on a query re-runs it for the latest checkpoint (`at_start`, as Samza does),
skipping every store whose marker is unusable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointId, CheckpointV2, version_of_batch
from ..checkpoints.logs import CheckpointLog
from ..engine.backup import BackupManager
from ..engine.transfer import TransferPool
from ..lifecycle.markers import load_checkpoint_indexes
from ..lifecycle.plans import delete_plans
from ..lifecycle.reports import delete_reports
from ..lifecycle.retention import Retention
from ..stores import BlobStore

log = logging.getLogger("spark_statebackend.commit")  # the committer's, as before


class Cleanup:
    """Cleans up after the checkpoints one committer writes (module doc)."""

    def __init__(
        self, store: BlobStore, checkpoint_log: CheckpointLog, retain: int, retention: Retention | None
    ) -> None:
        self.store = store
        self.log = checkpoint_log
        self.retain = retain
        self.retention = retention  # K > 1 only; K = 1 is BackupManager.cleanup's job
        # query -> the markers a cleanup that failed was replacing: its [B6] may have made the blobs of
        # its own checkpoint permanent and its [B7] not deleted what that checkpoint replaced, so the
        # next cleanup follows each store's chain back to these instead of to that checkpoint's.
        self._since: dict[str, dict[str, str]] = {}

    def after_checkpoint(
        self,
        manager: BackupManager,
        checkpoint: CheckpointV2,
        previous: Mapping[str, str] | None,
        *,
        upgradable: bool,
    ) -> None:
        """After `checkpoint` of a batch, which replaces the checkpoint whose markers were `previous`.
        `upgradable`: the query checkpoints changelogs, so upgrade reports of older versions go too."""
        qid, batch_id = checkpoint.query_id, checkpoint.batch_id
        markers = checkpoint.markers(BLOBSTORE_BACKEND)
        # Stores whose last cleanup did not finish: back to the checkpoint that one replaced (_since).
        since = {**(previous or {}), **self._since.pop(qid, {})} or previous
        try:
            try:
                manager.cleanup(markers, delete_replaced=self.retention is None, previous=since)
            except Exception:
                self._since[qid] = dict(since or {})
                raise
            delete_reports(self.store, qid, version_of_batch(batch_id))
            delete_plans(self.store, qid, batch_id)  # the checkpoint's `_driver` snapshot covers them
            if upgradable:  # changelog checkpointing: upgrades of older versions are obsolete (this
                # version's may arrive yet, see the committer's maybe_refresh); other queries have none
                delete_reports(self.store, qid, version_of_batch(batch_id) - 1, upgrades=True)
            self._retain(manager, checkpoint)
        except Exception:
            log.exception(
                "query %s batch %d: cleanup failed; it is retried after the next checkpoint", qid, batch_id
            )

    def after_upgrade(
        self,
        manager: BackupManager,
        checkpoint: CheckpointV2,
        upgrades: Mapping[str, str],
        previous: Mapping[str, str],
    ) -> None:
        """After `checkpoint`, a new checkpoint of the same batch with the `upgrades` of `previous`."""
        try:
            manager.cleanup(upgrades, delete_replaced=self.retention is None, previous=previous)
            self._retain(manager, checkpoint)
        except Exception:
            log.exception(
                "query %s batch %d: cleanup after an upgrade failed; retried later",
                checkpoint.query_id,
                checkpoint.batch_id,
            )

    def _retain(self, manager: BackupManager, checkpoint: CheckpointV2) -> None:
        qid = checkpoint.query_id
        if self.retain >= 1:
            self.log.retain(qid, self.retain)
        if self.retention is not None:
            markers = checkpoint.markers(BLOBSTORE_BACKEND)
            self.retention.commit(qid, str(checkpoint.checkpoint_id), markers, manager)

    def at_start(self, latest: CheckpointV2, manager: BackupManager) -> None:
        """Run the cleanup again for the latest checkpoint, as Samza re-runs cleanup at start: a committer
        that died after the checkpoint write (or during its cleanup) left TTLs on referenced blobs and
        replaced blobs undeleted or permanent. The replaced checkpoint is read back from the log's
        history (`_replaced`). Idempotent; a failure is logged (the next checkpoint's cleanup covers
        the TTLs again)."""
        qid = latest.query_id
        try:
            found = load_checkpoint_indexes(self.store, latest, pool=manager.pool)
            for key, e in found.unusable.items():
                log.error(  # e names the query, the store, the latest checkpoint and the marker
                    "%s; cleanup of store %s skipped (nothing it names is deleted or made permanent; the "
                    "next checkpoint supersedes it)",
                    e,
                    key,
                )
            usable = {key: marker for key, (marker, _) in found.usable.items()}
            previous = self._replaced(latest, usable, manager.pool)
            manager.cleanup(usable, delete_replaced=self.retention is None, previous=previous)
            delete_reports(self.store, qid, version_of_batch(latest.batch_id))
            # upgrades of the versions older than the checkpoint's are obsolete
            delete_reports(self.store, qid, version_of_batch(latest.batch_id) - 1, upgrades=True)
            delete_plans(self.store, qid, latest.batch_id)
            if self.retention is None and self.retain >= 1:
                # The crash may have come before the log's own retain(): drop the replaced record too,
                # or the log would keep naming a checkpoint whose blobs now expire.
                self.log.retain(qid, self.retain)
        except Exception:
            log.exception("query %s: cleanup of checkpoint %s at start failed", qid, latest.checkpoint_id)

    def _replaced(
        self, latest: CheckpointV2, usable: Mapping[str, str], pool: TransferPool | None = None
    ) -> dict[str, str] | None:
        """The markers of the checkpoint `latest` replaced, for the stores whose replaced index is still
        a usable index of this query and store (its cleanup did not finish: the committer died between
        the write and its end; markers.load_checkpoint_indexes, on `pool` if given), so
        that cleanup deletes what the chain between them removed and puts a TTL back on what only the
        replaced checkpoint referenced (engine/backup.py). The log still has that record when the
        crash came before retain() (file log) or always (a Kafka topic before compaction); None when
        it has not, or cannot be read (the blobs are then left to gc, as before)."""
        qid = latest.query_id
        try:
            history = self.log.read_history(qid)
            ids = [cp.checkpoint_id for cp in history]
            at = ids.index(latest.checkpoint_id) if latest.checkpoint_id in ids else len(history)
            if at == 0:
                return None
            before = history[at - 1]
            wanted = [k for k, m in before.markers(BLOBSTORE_BACKEND).items() if usable.get(k, m) != m]
            # Data, never an instruction: cleanup gives what these indexes list a TTL again, so each must
            # be an index of this query and store (gone: its cleanup had finished).
            found = load_checkpoint_indexes(self.store, before, stores=wanted, pool=pool)
            replaced = {key: marker for key, (marker, _) in found.usable.items()}
            unusable = [str(e) for e in found.unusable.values()]
            if unusable:
                log.info(
                    "query %s: %d store(s) of the checkpoint %s replaced are left out of its cleanup at "
                    "start (their cleanup had finished, or the marker is not usable), e.g. %s",
                    qid,
                    len(unusable),
                    latest.checkpoint_id,
                    unusable[0],
                )
            return replaced
        except Exception as e:
            log.warning(
                "query %s: cannot read the checkpoint %s replaced (%s); blobs only it referenced are "
                "left to gc",
                qid,
                latest.checkpoint_id,
                e,
            )
            return None

    def still_writer(self, qid: str, checkpoint_id: CheckpointId, batch_id: int) -> bool:
        """True if the log's latest checkpoint of `qid` is `checkpoint_id`, the one just written.

        False means a newer writer committed after us (we are a zombie): cleanup must not run. A read
        failure also answers False: skipping one cleanup only delays deletes (the next one, or gc,
        catches up), deleting on a guess could lose a newer writer's blobs."""
        try:
            latest = self.log.read_latest(qid)
        except Exception as e:
            log.warning(
                "query %s batch %d: cannot re-read the latest checkpoint (%s); cleanup skipped",
                qid,
                batch_id,
                e,
            )
            return False
        if latest is not None and latest.checkpoint_id == checkpoint_id:
            return True
        log.error(
            "query %s batch %d: checkpoint %s was written but the log's latest is now %s: a newer driver "
            "owns the query (this one is a zombie); cleanup skipped, nothing deleted",
            qid,
            batch_id,
            checkpoint_id,
            latest.checkpoint_id if latest is not None else None,
        )
        return False
