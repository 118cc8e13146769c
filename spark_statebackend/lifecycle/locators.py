"""Query locators: how a driver whose checkpoint location is gone finds its query again.

A locator maps a checkpoint location to its query id, so a driver whose checkpoint location is gone
(a new host) can still find the query's checkpoints: Spark would otherwise invent a new query id.
Every query seen committing from a path has its own entry,

    queries/<checkpoint key>/<query id>.json   {"checkpoint_root", "query_id", "query_name", "seen_at_ms"}

written (again) by each committer that starts on the query, before its first checkpoint. One
blob per query, never read-modified-written, so two committers cannot lose each other's entry.
The same local path can be used by two queries on one shared store (two hosts, two applications),
or reused after the user wiped a checkpoint; `read_locator` tells these apart by time and refuses to
guess when it cannot (see there). Entries of the first version (queries/<checkpoint key>.json, one
query, overwritten by the last writer) are still read, as claimed at time 0.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from ..checkpoints.checkpoint import CheckpointV2
from ..engine.blobs import blob_segment
from ..errors import BlobNotFoundError, RestoreError, StateBackendError
from ..stores import BlobStore


def _locator_key(checkpoint_root: str) -> str:
    """The key of a checkpoint location (hashed: paths are not blob-id safe)."""
    return hashlib.sha256(checkpoint_root.rstrip("/").encode()).hexdigest()[:32]


def locator_id(checkpoint_root: str, query_id: str) -> str:
    """Blob id of the locator entry of `query_id` for a checkpoint location."""
    return f"queries/{_locator_key(checkpoint_root)}/{blob_segment(query_id)}.json"


def _legacy_locator_id(checkpoint_root: str) -> str:
    return f"queries/{_locator_key(checkpoint_root)}.json"


@dataclass(frozen=True)
class LocatorEntry:
    """One query seen committing from a checkpoint location, and when it last claimed it."""

    query_id: str
    query_name: str
    seen_at_ms: int


def write_locator(
    store: BlobStore, checkpoint_root: str, query_id: str, query_name: str, seen_at_ms: int | None = None
) -> None:
    """Record that `query_id` commits from `checkpoint_root` (now, or at `seen_at_ms`)."""
    body = {
        "checkpoint_root": checkpoint_root.rstrip("/"),
        "query_id": query_id,
        "query_name": query_name,
        "seen_at_ms": int(time.time() * 1000) if seen_at_ms is None else seen_at_ms,
    }
    store.put_bytes(
        locator_id(checkpoint_root, query_id), orjson.dumps(body), metadata={"kind": "query-locator"}
    )


def locator_entries(store: BlobStore, checkpoint_root: str) -> list[LocatorEntry]:
    """Every query recorded for `checkpoint_root`, oldest claim first (one entry per query id).

    Raises StateBackendError naming the blob for an entry that is not ours (malformed)."""
    root = checkpoint_root.rstrip("/")
    prefix = f"queries/{_locator_key(checkpoint_root)}/"
    blob_ids = [i.blob_id for i in store.list(prefix) if i.blob_id.endswith(".json")]
    newest: dict[str, LocatorEntry] = {}
    for blob_id in [*blob_ids, _legacy_locator_id(checkpoint_root)]:
        try:
            doc = orjson.loads(store.get_bytes(blob_id))
        except BlobNotFoundError:
            continue
        except orjson.JSONDecodeError as e:
            raise StateBackendError(f"malformed query locator {blob_id!r} for {root!r}: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("query_id"), str):
            raise StateBackendError(f"malformed query locator {blob_id!r} for {root!r}: no query_id")
        if doc.get("checkpoint_root", root) != root:
            continue  # another path with the same hash prefix: not ours to use
        seen = doc.get("seen_at_ms", 0)
        entry = LocatorEntry(
            doc["query_id"], str(doc.get("query_name") or ""), seen if isinstance(seen, int) else 0
        )
        old = newest.get(entry.query_id)
        if old is None or entry.seen_at_ms > old.seen_at_ms:
            newest[entry.query_id] = entry
    return sorted(newest.values(), key=lambda e: (e.seen_at_ms, e.query_id))


def read_locator(
    store: BlobStore, checkpoint_root: str, latest: Callable[[str], CheckpointV2 | None]
) -> str | None:
    """The query id to resume at `checkpoint_root`, or None (start fresh).

    `latest(query id)` is the query's latest checkpoint in the log. A query is live on the path if it
    has a checkpoint written at or after the newest claim of the path by any other query (a later
    claim by another query without later checkpoints of this one means the path was taken over;
    its own claims do not count, so a committer that re-claimed and died before checkpointing never
    hides its query; checkpoints and claims compare by the committers' wall clocks). Exactly one
    live query: its id. None: nobody (e.g. the path was wiped and its new query has not
    checkpointed yet). More than one: the path is used by several live queries (two hosts or
    applications on one shared store); RestoreError names the path and the queries, so the driver
    fails to start instead of restoring another query's state."""
    entries = locator_entries(store, checkpoint_root)
    live: list[tuple[LocatorEntry, CheckpointV2]] = []
    for e in entries:
        cp = latest(e.query_id)
        others = max((o.seen_at_ms for o in entries if o.query_id != e.query_id), default=-1)
        if cp is not None and cp.checkpoint_id.millis >= others:
            live.append((e, cp))
    if len(live) <= 1:
        return live[0][0].query_id if live else None
    described = "; ".join(
        f"{e.query_id} (name {e.query_name!r}, claimed the path at {_iso(e.seen_at_ms)}, latest "
        f"checkpoint {cp.checkpoint_id} at {_iso(cp.checkpoint_id.millis)})"
        for e, cp in live
    )
    raise RestoreError(
        f"checkpoint location {checkpoint_root.rstrip('/')!r} is claimed by {len(live)} live queries on "
        f"this blob store: {described}; refusing to guess whose state to restore. Give each query its "
        "own checkpoint location, or restore the 'metadata' file (the query id) of the one to resume, "
        f"or delete the locator entries queries/{_locator_key(checkpoint_root)}/<query id>.json of the "
        "queries that no longer use this path"
    )


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
