"""A checkpoint's blob-store markers: checked before anything uses them or writes them into a checkpoint.

A marker is the blob id of one store instance's SnapshotIndex; every one this package writes is
`indexes/<query>/<store>/<name>.json` (engine/blobs.py). Read from a checkpoint, a marker is data,
never an instruction: `load_marker_index` refuses one that is not of its query and store, or whose
index is missing or not a valid SnapshotIndex (the committer then skips that store's cleanup, the
sidecar uploads its next snapshot whole). Before a checkpoint is written, `check_markers` checks every
reported marker ([C5] of runtime/__init__.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial

from ..engine.blobs import SnapshotOwner, indexes_prefix, load_snapshot_index
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import BlobNotFoundError, CorruptIndexError, StateBackendError
from ..stores import BlobStore
from .reports import Report

_INDEX_NAME = re.compile(r"[A-Za-z0-9._=-]{1,255}\.json")


class UnusableMarkerError(StateBackendError):
    """A checkpoint's blob-store marker names no usable SnapshotIndex of its store."""

    def __init__(self, query_id: str, store_key: str, marker: str, problem: str) -> None:
        super().__init__(
            f"query {query_id} store {store_key}: marker {marker[:300]!r} is unusable: {problem}"
        )
        self.query_id = query_id
        self.store_key = store_key
        self.marker = marker


def marker_shape_problem(query_id: str, store_key: str, marker: str) -> str | None:
    """Why `marker` cannot name a SnapshotIndex of store `store_key` of `query_id` by its blob id alone
    (every one this package writes is `indexes/<query>/<store>/<name>.json`, see BackupManager.upload);
    None if it can. No I/O: `load_marker_index` also loads and checks the index itself."""
    prefix = indexes_prefix(SnapshotOwner(query_id), store_key)
    if marker.startswith(prefix) and _INDEX_NAME.fullmatch(marker[len(prefix) :]):
        return None
    return f"not a SnapshotIndex blob id under {prefix}"


def load_marker_index(store: BlobStore, query_id: str, store_key: str, marker: str) -> SnapshotIndex:
    """The SnapshotIndex that `marker` (read from a checkpoint of `query_id`) names for `store_key`.

    Raises UnusableMarkerError if the marker cannot be one of ours (every SnapshotIndex this package
    writes is `indexes/<query>/<store>/<name>.json`, see BackupManager.upload), or if its blob is missing
    or not a valid SnapshotIndex: retrying cannot help. Other errors (the store unreachable) pass
    through unchanged: a later attempt may succeed."""
    problem = marker_shape_problem(query_id, store_key, marker)
    if problem is not None:
        raise UnusableMarkerError(query_id, store_key, marker, problem)
    try:
        return load_snapshot_index(store, marker)
    except (BlobNotFoundError, CorruptIndexError) as e:
        raise UnusableMarkerError(query_id, store_key, marker, str(e)) from None


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
