"""A checkpoint's blob-store markers: checked before anything uses them or writes them into a checkpoint.

A marker is the blob id of one store instance's SnapshotIndex; every one this package writes is
`indexes/<query>/<store>/<name>.json` (engine/blobs.py). Read from a checkpoint, a marker is data,
never an instruction: `load_marker_index` refuses one that is not of its query and store (by its
blob id and by the index's own metadata), or whose index is missing or not a valid SnapshotIndex.
`load_checkpoint_indexes` is the one way from a checkpoint to its stores' (marker, SnapshotIndex),
every marker through that guard: the committer, its cleanup, the diff bases of uploads, and both
restores (executor and driver) use it. An unusable marker is never used: the committer skips that
store's cleanup, the sidecar uploads its next snapshot whole, a restore refuses it (ERROR naming
query, store, version and blob). Before a checkpoint is written, `check_markers` checks every
reported marker ([C5] of runtime/__init__.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import partial

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointV2
from ..engine.blobs import SnapshotOwner, indexes_prefix, load_snapshot_index
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import BlobNotFoundError, CorruptIndexError, StateBackendError
from ..stores import BlobStore
from .reports import Report

_INDEX_NAME = re.compile(r"[A-Za-z0-9._=-]{1,255}\.json")


class UnusableMarkerError(StateBackendError):
    """A checkpoint's (or report's) blob-store marker names no usable SnapshotIndex of its store.

    Names the query, the store, where the marker was read (`source`: "checkpoint <id>", "upload report
    <blob>"; empty if unknown) and the marker's blob. `missing`: the marker's blob does not exist (a
    restore answers that `not_found`, anything else unusable `error`)."""

    def __init__(
        self,
        query_id: str,
        store_key: str,
        marker: str,
        problem: str,
        *,
        source: str = "",
        missing: bool = False,
    ) -> None:
        of = f" of {source}" if source else ""
        super().__init__(
            f"query {query_id} store {store_key}: marker {marker[:300]!r}{of} is unusable: {problem}"
        )
        self.query_id = query_id
        self.store_key = store_key
        self.marker = marker
        self.source = source
        self.missing = missing


def marker_shape_problem(query_id: str, store_key: str, marker: str) -> str | None:
    """Why `marker` cannot name a SnapshotIndex of store `store_key` of `query_id` by its blob id alone
    (every one this package writes is `indexes/<query>/<store>/<name>.json`, see BackupManager.upload);
    None if it can. No I/O: `load_marker_index` also loads and checks the index itself."""
    prefix = indexes_prefix(SnapshotOwner(query_id), store_key)
    if marker.startswith(prefix) and _INDEX_NAME.fullmatch(marker[len(prefix) :]):
        return None
    return f"not a SnapshotIndex blob id under {prefix}"


def load_marker_index(
    store: BlobStore, query_id: str, store_key: str, marker: str, *, source: str = ""
) -> SnapshotIndex:
    """The SnapshotIndex that `marker` (read from a checkpoint or report of `query_id`, `source` saying
    which) names for `store_key`. A checkpoint's markers: `load_checkpoint_indexes`.

    Raises UnusableMarkerError if the marker cannot be one of ours (every SnapshotIndex this package
    writes is `indexes/<query>/<store>/<name>.json`, see BackupManager.upload), if its blob is missing
    or not a valid SnapshotIndex, or if the index's metadata names another query or store: retrying
    cannot help. Other errors (the store unreachable) pass through unchanged: a later attempt may
    succeed."""
    problem = marker_shape_problem(query_id, store_key, marker)
    if problem is not None:
        raise UnusableMarkerError(query_id, store_key, marker, problem, source=source)
    try:
        index = load_snapshot_index(store, marker)
    except BlobNotFoundError as e:
        missing = e.blob_id == marker
        raise UnusableMarkerError(
            query_id, store_key, marker, str(e), source=source, missing=missing
        ) from None
    except CorruptIndexError as e:
        raise UnusableMarkerError(query_id, store_key, marker, str(e), source=source) from None
    # The blob id's shape is only where the index sits; the index says whose it is. A copy of another
    # query's (or store's) index put under this store's prefix must not restore that state here.
    owner = (index.metadata.query_id, index.metadata.store)
    if owner != (query_id, store_key):
        problem = f"its SnapshotIndex belongs to query {owner[0]} store {owner[1]}"
        raise UnusableMarkerError(query_id, store_key, marker, problem, source=source)
    return index


#: One store's snapshot as a checkpoint names it: its marker and the SnapshotIndex that marker names.
MarkedIndex = tuple[str, SnapshotIndex]


@dataclass(frozen=True)
class CheckpointIndexes:
    """The SnapshotIndexes of (some of) a checkpoint's stores (`load_checkpoint_indexes`): each store
    is in `usable` or in `unusable`, never both; each in store key order."""

    checkpoint: CheckpointV2
    usable: Mapping[str, MarkedIndex]
    unusable: Mapping[str, UnusableMarkerError]

    def require(self, key: str) -> MarkedIndex:
        """Store `key`'s (marker, SnapshotIndex); raises its UnusableMarkerError if its marker is
        unusable, KeyError if it was not loaded (the checkpoint has no marker for it)."""
        bad = self.unusable.get(key)
        if bad is not None:
            raise bad
        return self.usable[key]


def load_checkpoint_indexes(
    store: BlobStore,
    checkpoint: CheckpointV2,
    *,
    stores: Collection[str] | None = None,
    pool: TransferPool | None = None,
) -> CheckpointIndexes:
    """Each store's (marker, SnapshotIndex) as `checkpoint` names them: the one way from a checkpoint
    to its snapshots (module doc), every marker through `load_marker_index` (of the checkpoint's query
    and that store, a valid SnapshotIndex).

    `stores`: the stores wanted (None: every store the checkpoint has a blob-store marker for); one
    the checkpoint has no marker for is left out. The indexes load on `pool` when given (the caller's
    bounded TransferPool; never call this from one of that pool's own tasks), one after the other
    otherwise. An unusable marker is returned in `unusable` as its UnusableMarkerError, naming the
    query, store, checkpoint and blob, never raised: each caller decides what it means (skip the
    store, or refuse the restore). Other errors (the store unreachable) raise: a later attempt may
    succeed."""
    markers = checkpoint.markers(BLOBSTORE_BACKEND)
    wanted = sorted(markers if stores is None else (k for k in set(stores) if k in markers))
    source = f"checkpoint {checkpoint.checkpoint_id}"

    def load(key: str) -> SnapshotIndex | UnusableMarkerError:
        try:
            return load_marker_index(store, checkpoint.query_id, key, markers[key], source=source)
        except UnusableMarkerError as e:
            return e

    tasks = [partial(load, k) for k in wanted]
    loaded = pool.run_all(tasks) if pool is not None and len(tasks) > 1 else [t() for t in tasks]
    usable: dict[str, MarkedIndex] = {}
    unusable: dict[str, UnusableMarkerError] = {}
    for key, index in zip(wanted, loaded, strict=True):
        if isinstance(index, UnusableMarkerError):
            unusable[key] = index
        else:
            usable[key] = (markers[key], index)
    return CheckpointIndexes(checkpoint, usable, unusable)


def check_markers(
    store: BlobStore,
    pool: TransferPool,
    query_id: str,
    version: int,
    reports: Mapping[str, Report],
    previous: Mapping[str, str],
) -> tuple[list[str], int]:
    """Why the reported markers of `version` must not go into a checkpoint (empty: they may), and the
    bytes of the stores they snapshot.

    Each must name a SnapshotIndex of its store and query (load_marker_index) recording that version,
    and every file blob the snapshot added since the store's marker in `previous` (the latest
    checkpoint's) must exist. (Retained files are those of a snapshot a checkpoint already names, which
    cleanup never deletes.) Store unreachable: raises, and the caller tries again later."""

    def check(key: str, report: Report) -> list[str]:
        try:
            index = load_marker_index(store, query_id, key, report.marker)
        except UnusableMarkerError as e:
            return [str(e)]
        sizes[key] = index.dir_index.total_size()
        md = index.metadata
        wrong_version = md.version is not None and md.version != version
        if md.store != key or md.query_id != query_id or wrong_version:
            return [
                f"store {key}: marker {report.marker} is a snapshot of query {md.query_id} store "
                f"{md.store} version {md.version}, not of version {version}"
            ]
        known: set[str] = set()
        prev = previous.get(key)
        if prev is not None:
            try:
                prev_index = load_marker_index(store, query_id, key, prev)
                known = set(prev_index.dir_index.present_blob_ids())
            except UnusableMarkerError:
                known = set()
        added = [b for b in index.dir_index.present_blob_ids() if b not in known]
        missing = [b for b in added if not store.exists(b)]
        return [
            f"store {key}: snapshot {report.marker} names file blob {b!r}, which is missing" for b in missing
        ]

    sizes: dict[str, int] = {}
    found = pool.run_all([partial(check, k, r) for k, r in sorted(reports.items())])
    return [p for problems in found for p in problems], sum(sizes.values())
