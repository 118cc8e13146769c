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

import logging
import re
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointV2, version_of_batch
from ..checkpoints.logs import CheckpointLog
from ..engine.blobs import SnapshotOwner, indexes_prefix, load_snapshot_index
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import BlobNotFoundError, CorruptIndexError, StateBackendError
from ..stores import BlobStore
from .reports import Report, read_reports

log = logging.getLogger("spark_statebackend.markers")  # as reports.py: the name of the flat layout

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


class VersionSnapshot(NamedTuple):
    """Where the snapshot of one store at one state version is named (`find_version_snapshot`): a
    retained checkpoint, or the upload report of a version newer than every checkpoint."""

    marker: str
    origin: CheckpointV2 | Report


def find_version_snapshot(
    store: BlobStore, cplog: CheckpointLog, query_id: str, key: str, version: int | None
) -> tuple[VersionSnapshot | None, str]:
    """The snapshot of store `key` of `query_id` at state `version` (None: the latest checkpoint's),
    and where it is named; or None and why not (naming query, store, version). The one way from a
    state version to its snapshot: executor restores ([E2] of runtime/__init__.py) and `export`
    (spark/export.py) use it.

    Taken from the latest checkpoint when it holds that version, else the newest retained checkpoint
    of it; a version newer than every checkpoint (Spark's files are never rolled back, spark/ [D3])
    from the newest upload report of it, whichever application uploaded it. Nothing is loaded or
    checked beyond a report's marker shape: `load_version_snapshot` takes it through the guard."""
    latest = cplog.read_latest(query_id)
    if version is None:
        if latest is None:
            return None, f"query {query_id} has no checkpoint"
        version = version_of_batch(latest.batch_id)
    if latest is not None and version_of_batch(latest.batch_id) == version:
        history = [latest]
    else:
        history = [c for c in cplog.read_history(query_id) if version_of_batch(c.batch_id) == version]
    if not history:
        have = "none"
        if latest is not None:
            have = f"batch {latest.batch_id} (version {version_of_batch(latest.batch_id)})"
        if latest is None or version > version_of_batch(latest.batch_id):
            return _reported_snapshot(store, query_id, key, version, have)
        return None, f"no retained checkpoint of query {query_id} holds version {version}; latest: {have}"
    marker = history[-1].marker(BLOBSTORE_BACKEND, key)
    if marker is None:
        return None, f"checkpoint {history[-1].checkpoint_id} has no blob-store marker for store {key}"
    return VersionSnapshot(marker, history[-1]), ""


def load_version_snapshot(store: BlobStore, query_id: str, key: str, found: VersionSnapshot) -> MarkedIndex:
    """The (marker, SnapshotIndex) that `found` names for store `key`, through the marker guard: never
    another query's or another store's snapshot, nor a blob that is not a SnapshotIndex. Raises
    UnusableMarkerError naming the query, store, origin and blob."""
    if isinstance(found.origin, CheckpointV2):
        return load_checkpoint_indexes(store, found.origin, stores=[key]).require(key)
    source = f"upload report {found.origin.blob_id}"
    return found.marker, load_marker_index(store, query_id, key, found.marker, source=source)


def _reported_snapshot(
    store: BlobStore, query_id: str, key: str, version: int, latest: str
) -> tuple[VersionSnapshot | None, str]:
    """The snapshot of store `key` at a `version` newer than every checkpoint of `query_id`, from the
    newest marker report of it (reports.py). Why: a task may load a version Spark committed that no
    checkpoint holds yet, on a host that does not have its files (an application restarted on other
    executors after a crash). Its upload, if it happened, is reported and its blobs carry the TTL
    until a checkpoint takes them. A report whose marker cannot name a SnapshotIndex of this store is
    never used."""
    report = read_reports(store, query_id, version).get(key)
    if report is None:
        return None, (
            f"no checkpoint or upload report of query {query_id} holds version {version}; latest "
            f"checkpoint: {latest}"
        )
    problem = marker_shape_problem(query_id, key, report.marker)
    if problem is not None:
        why = f"report {report.blob_id} of version {version} names marker {report.marker!r}: {problem}"
        log.error("restore query %s store %s: %s", query_id, key, why)
        return None, why
    log.warning(
        "restore query %s store %s version %d: no checkpoint holds it yet (latest: %s); restoring the "
        "snapshot %s that application %s reported (%s)",
        query_id,
        key,
        version,
        latest,
        report.marker,
        report.app_id or "unknown",
        report.blob_id,
    )
    return VersionSnapshot(report.marker, report), ""


def check_markers(
    store: BlobStore,
    pool: TransferPool,
    query_id: str,
    version: int,
    reports: Mapping[str, Report],
    previous: Mapping[str, str],
    *,
    known: MutableMapping[str, SnapshotIndex] | None = None,
) -> tuple[list[str], int]:
    """Why the reported markers of `version` must not go into a checkpoint (empty: they may), and the
    bytes of the stores they snapshot.

    Each must name a SnapshotIndex of its store and query (load_marker_index) recording that version,
    and every file blob the snapshot added since the store's marker in `previous` (the latest
    checkpoint's) must exist. (Retained files are those of a snapshot a checkpoint already names, which
    cleanup never deletes.) Store unreachable: raises, and the caller tries again later.

    `known` (marker -> its SnapshotIndex): indexes the caller checked or uploaded itself. A
    SnapshotIndex blob is written once under a unique name and never changed, so one found there is not
    fetched again: a marker of `previous` is taken as it is; a reported marker gets its shape checked
    and its blob's existence asked (a request without the body), and its index is checked as if loaded.
    Every reported marker's index is added to it (the next batch's `previous` are this batch's)."""

    def load(key: str, marker: str) -> SnapshotIndex:
        index = cached.get(marker)
        if index is None:
            return load_marker_index(store, query_id, key, marker)
        problem = marker_shape_problem(query_id, key, marker)
        if problem is None and not store.exists(marker):
            problem = "its SnapshotIndex blob is missing"
        if problem is not None:
            raise UnusableMarkerError(query_id, key, marker, problem, missing=problem.endswith("missing"))
        return index

    def check(key: str, report: Report) -> list[str]:
        try:
            index = load(key, report.marker)
        except UnusableMarkerError as e:
            return [str(e)]
        loaded[report.marker] = index
        sizes[key] = index.dir_index.total_size()
        md = index.metadata
        wrong_version = md.version is not None and md.version != version
        if md.store != key or md.query_id != query_id or wrong_version:
            return [
                f"store {key}: marker {report.marker} is a snapshot of query {md.query_id} store "
                f"{md.store} version {md.version}, not of version {version}"
            ]
        present: set[str] = set()
        prev = previous.get(key)
        if prev is not None:
            try:
                prev_index = cached.get(prev) or load_marker_index(store, query_id, key, prev)
                present = set(prev_index.dir_index.present_blob_ids())
            except UnusableMarkerError:
                present = set()
        added = [b for b in index.dir_index.present_blob_ids() if b not in present]
        missing = [b for b in added if not store.exists(b)]
        return [
            f"store {key}: snapshot {report.marker} names file blob {b!r}, which is missing" for b in missing
        ]

    sizes: dict[str, int] = {}
    cached: Mapping[str, SnapshotIndex] = dict(known) if known is not None else {}
    loaded: dict[str, SnapshotIndex] = {}  # filled by the pool's tasks, each its own key
    found = pool.run_all([partial(check, k, r) for k, r in sorted(reports.items())])
    if known is not None:
        known.update(loaded)
    return [p for problems in found for p in problems], sum(sizes.values())
