"""Checkpoint retention for retainCheckpoints = K > 1: keep the last K checkpoints of a query
restorable and delete the blobs only the older ones referenced ("unshared blobs").

With K = 1 BackupManager.cleanup deletes, after each checkpoint, the blobs of files removed since the
previous snapshot and the previous SnapshotIndex (Samza's scheme): exactly the blobs the one retained
checkpoint does not reference. With K > 1 those blobs may still belong to an older retained
checkpoint, so the committer runs cleanup without deletes and, after the checkpoint log's own
retain(), calls `Retention.commit`, which

  [1] appends the new checkpoint to the query's retained list and cuts the list to the last K; the
      checkpoints cut off have "fallen" out of retention;
  [2] removes the TTL of every blob of every retained checkpoint not yet known permanent (normally
      only the new one; after a restart, or after a failed cleanup, also the older ones, so no
      retained checkpoint ever expires);
  [3] deletes closure(fallen) - closure(retained), where closure(checkpoint) is every SnapshotIndex
      blob it names plus every blob those indexes list as present.

What "the last K" is, per log kind: the retained list is what this committer wrote, seeded at start
from the log's read_history() (last K of it). The file log keeps exactly the last K records
(retain() deletes the rest), so list and log agree. A compacted Kafka topic keeps "at least the
latest" record per query: retain() cannot delete, and after compaction read_history() may return
only the latest, so a committer restarted on Kafka seeds a shorter list; blobs of checkpoints it
never learnt of are then left to `spark-statebackend gc` (gc.py), never deleted on a guess. Records
older than the last K may stay readable in Kafka until compaction, but their blobs are gone: only the
last K checkpoints are promised restorable.

Safety: [3] runs only when every retained checkpoint's indexes could be read; if one cannot (a
missing index is data loss and is reported), nothing is deleted and the fallen checkpoints are kept
in a pending list and retried with the next commit. A fallen checkpoint whose own index is missing
contributes only that index id (its file blobs are unknowable; gc sweeps them). Deleting a missing
blob succeeds, so a crash half-way is finished by the retry or by gc.

Not thread-safe: one committer thread calls it (Committer.poll runs on one thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from ..engine.backup import BackupManager
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import StateBackendError
from ..stores import BlobStore
from .reachability import snapshot_closure

log = logging.getLogger("spark_statebackend.retention")  # name kept from the flat layout


@dataclass
class RetainedCheckpoint:
    """One checkpoint the committer keeps: its id and blob-store markers (store -> index blob id)."""

    checkpoint_id: str
    markers: Mapping[str, str]
    permanent: bool = False  # step [2] done for every marker


@dataclass(frozen=True)
class RetentionResult:
    """What one Retention.commit did."""

    fallen: tuple[str, ...] = ()  # checkpoint ids that fell out of retention (and were processed)
    deleted: tuple[str, ...] = ()  # blob ids deleted
    made_permanent: tuple[str, ...] = ()  # checkpoint ids whose TTLs were removed now


@dataclass
class _QueryState:
    retained: list[RetainedCheckpoint] = field(default_factory=list)
    pending_fallen: list[RetainedCheckpoint] = field(default_factory=list)


class Retention:
    """The last `keep` checkpoints per query, and the deletes when older ones fall out (module doc)."""

    def __init__(
        self,
        store: BlobStore,
        pool: TransferPool,
        keep: int,
        *,
        timeout_seconds: float = 600.0,
    ) -> None:
        """Deletes run on `pool`, each batch bounded by `timeout_seconds`."""
        if keep < 2:
            raise ValueError(f"Retention is for retainCheckpoints > 1, got {keep} (1: BackupManager.cleanup)")
        self.store = store
        self.pool = pool
        self.keep = keep
        self.timeout = timeout_seconds
        self._queries: dict[str, _QueryState] = {}
        self._closures: dict[str, frozenset[str]] = {}  # marker -> closure; indexes are immutable

    def seeded(self, query_id: str) -> bool:
        return query_id in self._queries

    def seed(self, query_id: str, history: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Start tracking `query_id` with its retained checkpoints from the log, oldest first (only the
        last `keep` are taken). Their TTLs are removed with the next commit (they may come from a
        driver whose cleanup never ran)."""
        state = self._queries.setdefault(query_id, _QueryState())
        state.retained = [RetainedCheckpoint(cid, dict(m)) for cid, m in history][-self.keep :]

    def retained(self, query_id: str) -> list[str]:
        """Checkpoint ids currently retained for `query_id`, oldest first."""
        state = self._queries.get(query_id)
        return [c.checkpoint_id for c in state.retained] if state else []

    def commit(
        self, query_id: str, checkpoint_id: str, markers: Mapping[str, str], manager: BackupManager
    ) -> RetentionResult:
        """Record a newly written checkpoint and apply retention (module doc, steps [1]-[3]).

        `manager` is the query's BackupManager: it reads indexes (through its cache) and removes TTLs
        (cleanup with delete_replaced=False).

        Call only after the checkpoint write succeeded, this committer is still the query's writer,
        and the log's own retain() ran. Raises StateBackendError when a retained index cannot be read
        (nothing is deleted then)."""
        state = self._queries.setdefault(query_id, _QueryState())
        # [1]
        state.retained.append(RetainedCheckpoint(checkpoint_id, dict(markers)))
        if len(state.retained) > self.keep:
            state.pending_fallen.extend(state.retained[: -self.keep])
            del state.retained[: -self.keep]
        # [2] newest first: the new checkpoint matters most if a later step fails.
        made: list[str] = []
        failures: list[str] = []
        for cp in reversed(state.retained):
            if cp.permanent:
                continue
            try:
                manager.cleanup(cp.markers, delete_replaced=False)
            except StateBackendError as e:
                failures.append(f"checkpoint {cp.checkpoint_id}: {e}")
                continue
            cp.permanent = True
            made.append(cp.checkpoint_id)
        if not state.pending_fallen:
            if failures:
                raise StateBackendError(f"query {query_id}: removing TTLs failed: {'; '.join(failures)}")
            return RetentionResult(made_permanent=tuple(made))
        # [3]
        keep: set[str] = set()
        for cp in state.retained:
            for marker in cp.markers.values():
                # Raises on an unreadable index: never delete without the full keep set.
                keep |= self._closure(marker, manager.snapshot_index)
        drop: set[str] = set()
        for cp in state.pending_fallen:
            for store, marker in cp.markers.items():
                try:
                    drop |= self._closure(marker, manager.snapshot_index)
                except StateBackendError as e:
                    log.warning(
                        "query %s: index %s of store %s of fallen checkpoint %s unreadable (%s); its file "
                        "blobs are left to gc",
                        query_id,
                        marker,
                        store,
                        cp.checkpoint_id,
                        e,
                    )
                    drop.add(marker)
        to_delete = sorted(drop - keep)
        self.pool.run_all([partial(self.store.delete, b) for b in to_delete], timeout=self.timeout)
        fallen = tuple(cp.checkpoint_id for cp in state.pending_fallen)
        live = {m for cp in state.retained for m in cp.markers.values()}
        for cp in state.pending_fallen:
            for marker in cp.markers.values():
                if marker not in live:
                    self._closures.pop(marker, None)
        state.pending_fallen.clear()
        log.info(
            "query %s: %d checkpoint(s) fell out of retention (keep %d): %d unshared blob(s) deleted",
            query_id,
            len(fallen),
            self.keep,
            len(to_delete),
        )
        if failures:
            raise StateBackendError(f"query {query_id}: removing TTLs failed: {'; '.join(failures)}")
        return RetentionResult(fallen=fallen, deleted=tuple(to_delete), made_permanent=tuple(made))

    def _closure(self, marker: str, load_index: Callable[[str], SnapshotIndex]) -> frozenset[str]:
        c = self._closures.get(marker)
        if c is None:
            c = snapshot_closure(marker, load_index(marker))
            self._closures[marker] = c
        return c
