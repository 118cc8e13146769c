"""Diff-base bookkeeping of a sidecar's uploads ([C3] of runtime/__init__.py): per query the
BackupManager that holds each store's diff base, and per store the state version that base is of.

Before each upload `refresh` makes every base at least as new as the query's latest checkpoint (the
reasons are in its doc), and it is where a sidecar learns that another application, or another attempt
of its own (`app_id` is the application identity, runtime/spool `app_identity`), has taken over a query
it had checkpointed (`Fenced`: a zombie uploads nothing more for it): it feeds every latest checkpoint it
reads to the sidecar's Ownership (runtime/ownership.py), which holds that rule.
"""

from __future__ import annotations

import logging
import time

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, version_of_batch
from ..checkpoints.logs import CheckpointLog
from ..common.metrics import Metrics
from ..engine.backup import BackupConfig, BackupManager
from ..engine.blobs import SnapshotOwner
from ..engine.transfer import TransferPool
from ..lifecycle.markers import load_checkpoint_indexes
from ..stores import BlobStore
from .ownership import Fenced, Ownership

__all__ = ["DiffBases", "Fenced"]  # Fenced: ownership.py's, raised by refresh

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar, as before


class DiffBases:
    """The diff bases of one sidecar's uploads (module doc). Used by the upload loop's thread only."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        pool: TransferPool,
        *,
        backup_config: BackupConfig,
        metrics: Metrics,
        app_id: str,
        commit_timeout_seconds: float,
        ownership: Ownership,
    ) -> None:
        """`ownership`: the sidecar process's (runtime/ownership.py), fed by `refresh`."""
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.backup_config = backup_config
        self.metrics = metrics
        self.app_id = app_id
        self.commit_timeout_seconds = commit_timeout_seconds
        self.ownership = ownership
        self._managers: dict[str, BackupManager] = {}
        self.bases: dict[tuple[str, str], int] = {}  # (query, store) -> version of the diff base
        self.base_uploaded_at: dict[tuple[str, str], float] = {}  # monotonic time this process uploaded it

    def manager(self, query_id: str) -> BackupManager:
        """The BackupManager of a query's snapshots (one per query; it holds each store's diff base)."""
        m = self._managers.get(query_id)
        if m is None:
            m = BackupManager(
                self.store,
                self.pool,
                owner=SnapshotOwner(query_id),
                config=self.backup_config,
                metrics=self.metrics,
            )
            self._managers[query_id] = m
        return m

    def uploaded(self, query_id: str, key: str, version: int) -> None:
        """Version `version` of store `key` was just uploaded: it is the store's diff base now."""
        self.bases[(query_id, key)] = version
        self.base_uploaded_at[(query_id, key)] = time.monotonic()

    def refresh(self, query_id: str, keys: list[str]) -> int:
        """Make every store's diff base at least as new as the latest checkpoint's snapshot; return the
        latest checkpoint's state version (0: none).

        A base of the committed version that is not the committed snapshot itself (this version was
        uploaded twice, e.g. by a task retried after an executor died, and the checkpoint took the
        other upload) is replaced by the committed one: cleanup deletes replaced blobs along the
        checkpointed chain only, so diffing against the other upload would leak the committed one.
        An upgrade of the committed snapshot (the same version re-uploaded, diffed against the committed
        one, after Spark published a snapshot that shortens its recipe) stays the base whether or not
        the committer has checkpointed it yet: cleanup follows the chain back to the checkpointed one
        (BackupManager.cleanup). So is a newer base that was uploaded more than commitTimeout ago and
        never checkpointed (its batch failed, or the store moved away and back): GC may delete its
        files once they are older than its grace, so new snapshots must not keep referring to them."""
        latest = self.log.read_latest(query_id)
        if latest is None:
            return 0
        self.metrics.name_query(query_id, latest.query_name)  # how this sidecar's metrics call it
        self.ownership.saw(latest)  # raises Fenced: a zombie uploads nothing more for the query
        committed_version = version_of_batch(latest.batch_id)
        manager = self.manager(query_id)
        stale = {}
        for key in keys:
            base = self.bases.get((query_id, key))
            marker = latest.marker(BLOBSTORE_BACKEND, key)
            uploaded_at = self.base_uploaded_at.get((query_id, key), 0.0)
            abandoned = (
                base is not None
                and base > committed_version
                and (time.monotonic() - uploaded_at > self.commit_timeout_seconds)
            )
            other_upload = (
                base == committed_version
                and manager.previous_marker(key) != marker
                and manager.previous_parent(key) != marker  # not an upgrade of the committed snapshot
            )
            if marker is not None and (base is None or base < committed_version or other_upload or abandoned):
                stale[key] = marker
        found = load_checkpoint_indexes(self.store, latest, stores=stale, pool=self.pool)
        for key in stale:
            unusable = found.unusable.get(key)
            if unusable is not None:
                # Data, not an instruction: never diff against it (cleanup would delete what it names
                # as "replaced"), nor against an older base (cleanup after the checkpoints since may
                # have deleted its files): this store's next snapshot is uploaded whole.
                log.error("%s; store %s is uploaded afresh with no diff base", unusable, key)
                manager.set_base(key, None)
            else:
                manager.set_base(key, found.usable[key])
            self.bases[(query_id, key)] = committed_version
        return committed_version
