"""What a query's blobs are kept for: the blobs its retained checkpoints reference, plus its newest
SnapshotIndex of each store; for CLI snapshots, every index present ([2] and [4] of gc.py).

The closure of a marker (a SnapshotIndex blob id) is the index blob itself and every blob of a file
present in it (`snapshot_closure`); retention (retention.py) and gc mark with the same closure. An
index the latest checkpoint names that cannot be read makes `Marker.mark` answer "keep all" for the
query, after one re-read of the log (the checkpoint may just have fallen out of retention and been
cleaned up, which is not a problem). Of older records only those whose index is permanent are
retained (retainCheckpoints K > 1): a compacted Kafka topic returns records older than the retained
ones until it compacts (retain() cannot delete there), and cleanup deleted their indexes or gave their
blobs a TTL again when newer checkpoints replaced them. A missing index of an older record is logged
and protects nothing; keeping the whole query for those made gc delete nothing of any live query on
Kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointV2, check_query_id
from ..checkpoints.logs import CheckpointLog
from ..engine.blobs import CLI_QUERY, load_snapshot_index
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import BlobNotFoundError, CorruptIndexError, StateBackendError
from ..stores import BlobInfo, BlobStore

log = logging.getLogger("spark_statebackend.gc")  # name kept from the flat layout

#: The blob folders whose second segment is the query they belong to.
QUERY_PREFIXES = ("files/", "indexes/", "reports/", "upgrades/")


def snapshot_closure(marker: str, index: SnapshotIndex) -> frozenset[str]:
    """Every blob a checkpoint marker keeps alive: the SnapshotIndex blob itself and every blob of a
    file present in it. (The index's prev_snapshot_index link is not followed: restore never reads
    it, and cleanup treats the previous index as replaced.)"""
    return frozenset([marker, *index.dir_index.present_blob_ids()])


def checkpoint_markers(history: Iterable[CheckpointV2]) -> set[str]:
    """Every blob-store marker of these checkpoints."""
    return {m for cp in history for m in cp.markers(BLOBSTORE_BACKEND).values()}


def query_of(blob_id: str) -> str | None:
    """The query segment of a blob under files/, indexes/, reports/ or upgrades/, else None."""
    for prefix in QUERY_PREFIXES:
        if blob_id.startswith(prefix):
            q, sep, rest = blob_id[len(prefix) :].partition("/")
            return q if q and sep and rest else None
    return None


def newest_indexes(infos: Iterable[BlobInfo], query: str) -> list[str]:
    """The newest SnapshotIndex blob(s) of every store of `query`: all indexes of a store that share
    its highest checkpoint label (names are `<label>-<rand>.json`, labels zero-padded and ordered)."""
    prefix = f"indexes/{query}/"
    by_store: dict[str, list[tuple[str, str]]] = {}
    for info in infos:
        bid = info.blob_id
        if not bid.startswith(prefix) or not bid.endswith(".json"):
            continue
        store_dir, _, name = bid.rpartition("/")
        label = name[: -len(".json")].rpartition("-")[0] or name
        by_store.setdefault(store_dir, []).append((label, bid))
    out: list[str] = []
    for entries in by_store.values():
        top = max(label for label, _ in entries)
        out.extend(bid for label, bid in entries if label == top)
    return sorted(out)


@dataclass
class Mark:
    """The result of marking one query: its referenced set, or None = keep everything of it."""

    referenced: set[str] | None
    has_checkpoints: bool
    problems: list[str]


class MarkProgress(Protocol):
    """Told of the indexes to read (gc's 'mark' phase) and of each one read; may be called from the
    pool's threads."""

    def phase(self, name: str, total: int | None, unit: str) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class Marker:
    """Marks the blobs a query's checkpoints (or CLI snapshots) keep (module doc). Each index is read
    once per Marker (indexes are immutable)."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog | None,
        pool: TransferPool,
        *,
        timeout_seconds: float,
        progress: MarkProgress,
    ) -> None:
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.timeout = timeout_seconds
        self.progress = progress
        self._closures: dict[str, frozenset[str]] = {}  # index blob id -> closure (indexes are immutable)

    def _history(self, q: str) -> list[CheckpointV2] | None:
        """The retained checkpoints of query segment `q`, or None if `q` cannot be a query id."""
        try:
            check_query_id(q)
        except ValueError:
            return None
        return self.log.read_history(q) if self.log is not None else []

    def mark(self, q: str, index_infos: Iterable[BlobInfo]) -> Mark:
        """Mark query `q` ([2]/[4]): closure of its retained checkpoints and newest indexes; for CLI
        snapshots, of every index present."""
        history = self._history(q)
        if q == CLI_QUERY:
            return self._mark_cli(index_infos, history or [])
        if not history:
            return Mark(None, False, [])
        newest = newest_indexes(index_infos, q)
        referenced: set[str] = set()
        missing = self._add_closures(referenced, self._retained_markers(history))
        if missing:
            # Maybe the checkpoint naming it just fell out of retention and cleanup deleted its index:
            # re-read; only an index the latest checkpoint names is a problem. Older records whose
            # indexes are gone are history a compacted Kafka topic has not dropped yet (retain() cannot
            # delete there): cleanup deleted those indexes when a newer checkpoint replaced theirs.
            # Keeping the whole query for them would make gc delete nothing of a live query on Kafka.
            fresh = self._history(q) or []
            still = checkpoint_markers(fresh[-1:])
            lost = sorted(m for m in missing if m in still)
            gone = sorted((missing.keys() & checkpoint_markers(fresh)) - still)
            if gone and not lost:
                log.warning(
                    "gc: query %s: %d older checkpoint record(s) name SnapshotIndexes that no longer exist "
                    "(e.g. %s): those checkpoints cannot be restored and protect no blob (on a compacted "
                    "Kafka topic: records older than the latest, whose indexes cleanup deleted when a newer "
                    "checkpoint replaced them)",
                    q,
                    len(gone),
                    gone[0],
                )
            if lost:
                problems = [
                    f"query {q}: SnapshotIndex {m} named by a retained checkpoint is unreadable "
                    f"({missing[m]}); the query's blobs are all kept"
                    for m in lost
                ]
                for p in problems:
                    log.error("gc: %s", p)
                return Mark(None, True, problems)
        # Newest indexes that vanished meanwhile were replaced by newer uploads: nothing to protect.
        self._add_closures(referenced, newest)
        return Mark(referenced, True, [])

    def _retained_markers(self, history: list[CheckpointV2]) -> set[str]:
        """The markers whose closures a query's history keeps: every marker of the latest checkpoint,
        and those of older records whose index is permanent. The committer removes the TTL of every
        retained checkpoint's blobs (retainCheckpoints K > 1 keeps older ones permanent) and gives a
        replaced checkpoint's blobs a TTL again or deletes them, so an older record whose index carries
        a TTL (or is gone) is out of retention: a Kafka topic returns it until compaction. Marking it
        would keep its blobs past their TTL and make the sweep report them as expired references."""
        latest = checkpoint_markers(history[-1:])
        older = sorted(checkpoint_markers(history[:-1]) - latest)
        if not older:
            return latest
        stats = self.pool.run_all([partial(self._permanent, m) for m in older], timeout=self.timeout)
        return latest | {m for m, permanent in zip(older, stats, strict=True) if permanent is not False}

    def _permanent(self, marker: str) -> bool | None:
        """False if the index `marker` carries a TTL; True if permanent; None if it cannot be told (gone,
        or the store failed: _add_closures then reports or skips it as before)."""
        try:
            return self.store.stat(marker).expires_at_ms is None
        except StateBackendError:
            return None

    def _mark_cli(self, index_infos: Iterable[BlobInfo], history: list[CheckpointV2]) -> Mark:
        """CLI snapshots: every index present is a snapshot nobody forgot, so all are marked. An
        unreadable one (not merely deleted since the listing, by forget) keeps all of `cli`."""
        prefix = f"indexes/{CLI_QUERY}/"
        indexes = sorted(
            i.blob_id for i in index_infos if i.blob_id.startswith(prefix) and i.blob_id.endswith(".json")
        )
        referenced: set[str] = set()
        retained = checkpoint_markers(history)
        missing = self._add_closures(referenced, [*indexes, *retained])
        lost = sorted(m for m, why in missing.items() if self.store.exists(m) or m in retained)
        if lost:
            problems = [
                f"query {CLI_QUERY}: SnapshotIndex {m} is unreadable ({missing[m]}); the CLI snapshots' "
                "blobs are all kept"
                for m in lost
            ]
            for p in problems:
                log.error("gc: %s", p)
            return Mark(None, True, problems)
        return Mark(referenced, True, [])

    def _add_closures(self, into: set[str], markers: Iterable[str]) -> dict[str, str]:
        """Add the closure of each marker to `into`; return {marker: why} for unreadable ones."""
        wanted = list(markers)
        todo = sorted({m for m in wanted if m not in self._closures})
        if todo:
            self.progress.phase("mark", len(todo), "index")
        loaded = self.pool.run_all([partial(self._load, m) for m in todo], timeout=self.timeout)
        missing: dict[str, str] = {}
        for marker, result in zip(todo, loaded, strict=True):
            if isinstance(result, str):
                missing[marker] = result
            else:
                self._closures[marker] = result
        for m in wanted:
            c = self._closures.get(m)
            if c is not None:
                into |= c
        return missing

    def _load(self, marker: str) -> frozenset[str] | str:
        try:
            return snapshot_closure(marker, load_snapshot_index(self.store, marker))
        except (BlobNotFoundError, CorruptIndexError) as e:
            return str(e)
        finally:
            self.progress.advance()
