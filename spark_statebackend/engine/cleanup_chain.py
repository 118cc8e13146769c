"""What cleanup's step [B7] deletes besides one snapshot's own removals (engine/__init__.py): the chain
of SnapshotIndexes from a checkpointed snapshot back to the previous checkpoint's, or, when that chain
does not reach it, what only the replaced checkpoint referenced (which then expires instead).

Pure planning over indexes read through `load` (BackupManager's cache, then the store); BackupManager
does the deleting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import StateBackendError
from .index import SnapshotIndex

log = logging.getLogger("spark_statebackend.backup")  # cleanup logs under backup's name, as it did

#: How many uploads a cleanup follows back to the previous checkpoint's snapshot (BackupManager.cleanup).
MAX_CLEANUP_CHAIN = 64

IndexLoader = Callable[[str], SnapshotIndex]


@dataclass(frozen=True)
class Replaced:
    """What a cleanup removes of the snapshots its checkpoint replaces: `delete` now, `expire` (give a
    TTL again) when the chain back to the previous checkpoint was not found."""

    delete: frozenset[str]
    expire: frozenset[str]


def replaced_blobs(
    load: IndexLoader,
    store_key: str,
    marker: str,
    index: SnapshotIndex,
    present: frozenset[str],
    stop: str | None,
) -> Replaced:
    """The blobs a checkpointed snapshot (`marker`, its `index`, referencing `present`) replaces: what
    it removed and its predecessor index; with `stop` (the previous checkpoint's marker, None: unknown)
    also what every upload between them removed and their indexes, or, when the chain of predecessors
    does not reach `stop`, what only `stop` referenced, to expire. Nothing in `present` is named."""
    delete = set(index.dir_index.removed_blob_ids()) - present
    prev = index.prev_snapshot_index_blob_id
    if prev is not None and prev not in present:
        delete.add(prev)
    expire: set[str] = set()
    if stop is not None and stop not in (prev, marker):
        chain = None if prev is None else chain_removals(load, store_key, prev, stop)
        if chain is not None:
            delete |= chain - present
        else:
            expire = replaced_closure(load, store_key, stop) - present
    return Replaced(frozenset(delete), frozenset(expire - delete))


def chain_removals(load: IndexLoader, store_key: str, first: str, stop: str) -> set[str] | None:
    """What the uploads from index `first` back to (excluding) index `stop` removed, plus their
    index blobs and `stop`; None when the chain does not reach `stop` within MAX_CLEANUP_CHAIN indexes
    or an index on it is unreadable (logged)."""
    found: set[str] = set()
    blob: str | None = first
    for _ in range(MAX_CLEANUP_CHAIN):
        if blob is None:
            break
        if blob == stop:
            return found | {stop}
        try:
            idx = load(blob)
        except StateBackendError as e:
            log.warning(
                "cleanup store %s: index %s between checkpoints is unreadable: %s", store_key, blob, e
            )
            break
        found.add(blob)
        found |= set(idx.dir_index.removed_blob_ids())
        blob = idx.prev_snapshot_index_blob_id
    return None


def replaced_closure(load: IndexLoader, store_key: str, marker: str) -> set[str]:
    """Every blob the replaced checkpoint's snapshot `marker` references; empty (with a warning: its
    blobs are left to gc) if its index cannot be read."""
    try:
        return {marker, *load(marker).dir_index.present_blob_ids()}
    except StateBackendError as e:
        log.warning(
            "cleanup store %s: the previous checkpoint's index %s is unreadable (%s); the blobs only "
            "it referenced are left to gc",
            store_key,
            marker,
            e,
        )
        return set()
