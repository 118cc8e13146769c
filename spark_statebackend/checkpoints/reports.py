"""Marker reports and query locators: how sidecars tell the driver's committer what they uploaded.

Sidecars run on executors that share nothing with the driver but the blob store, so they report
through it: after uploading store instance S at state version V of query Q, a sidecar writes

    reports/<Q>/<V zero-padded>/<S>/<created ns>-<rand>.json   {"marker": <SnapshotIndex blob id>, ...}

The committer lists reports/<Q>/<V>/ until every store instance of the batch has reported (when
the same store reports twice for one version, e.g. a retried task, the newest report wins; reports
of another Spark application, a zombie's, are never taken), writes the checkpoint, and deletes the
reports. An upgrade (changelog checkpointing: version V uploaded again after Spark published a
snapshot that shortens its recipe, commit.py) is reported under upgrades/<Q>/<V zero-padded>/<S>/...
instead: a batch's commit never takes it, and deleting the reports of a checkpointed version never
removes one that arrived meanwhile; the committer reads every upgrade of its latest checkpoint's
version (`read_upgrades`) and deletes the ones it has seen. Reports are small and short-lived and
carry the blob TTL: the committer deletes them, and one whose batch never completes expires like the
upload it names.

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
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from ..engine.backup import blob_segment
from ..errors import BlobNotFoundError, RestoreError, StateBackendError
from ..stores import BlobStore

if TYPE_CHECKING:
    from .checkpoint import CheckpointV2


log = logging.getLogger("spark_statebackend.markers")  # name kept from the flat layout


@dataclass(frozen=True)
class Report:
    store: str
    version: int
    marker: str
    executor_id: str
    created_ns: int
    #: The snapshot replays changelogs (Spark's changelog checkpointing); False for reports of old writers.
    changelog: bool = False
    #: The Spark application whose sidecar uploaded it: a committer takes only its own application's
    #: reports, so a zombie application's executors can never get a snapshot into a checkpoint.
    app_id: str = ""
    #: The uploading sidecar's last measured restore and upload rates (bytes/s, 0: none yet): the
    #: committer predicts a query's restore time from them.
    restore_rate: float = 0.0
    upload_rate: float = 0.0
    #: A re-upload of the version after Spark published a snapshot that shortens its recipe (changelog
    #: checkpointing): the committer checkpoints it in place of the version's checkpointed snapshot.
    upgrade: bool = False
    #: The report's own blob.
    blob_id: str = ""


def store_key(operator: int, partition: int, store: str) -> str:
    """The store instance key used everywhere: '<operator>/<partition>/<store name>'."""
    return f"{operator}/{partition}/{store}"


def reports_prefix(query_id: str, version: int | None = None) -> str:
    base = f"reports/{blob_segment(query_id)}/"
    return base if version is None else f"{base}{version:012d}/"


def upgrades_prefix(query_id: str, version: int | None = None) -> str:
    base = f"upgrades/{blob_segment(query_id)}/"
    return base if version is None else f"{base}{version:012d}/"


def write_report(
    store: BlobStore,
    query_id: str,
    version: int,
    key: str,
    marker: str,
    executor_id: str,
    ttl_seconds: float | None = None,
    *,
    changelog: bool = False,
    app_id: str = "",
    restore_rate: float = 0.0,
    upload_rate: float = 0.0,
    upgrade: bool = False,
) -> str:
    """Publish that store instance `key` of `query_id` at `version` was uploaded as `marker` (`upgrade`:
    under upgrades/, module doc).

    With a TTL, a report no checkpoint ever consumes (its batch never completed) expires with the
    snapshot it names."""
    now = time.time_ns()
    prefix = (upgrades_prefix if upgrade else reports_prefix)(query_id, version)
    blob_id = f"{prefix}{blob_segment(key)}/{now:020d}-{uuid.uuid4().hex[:8]}.json"
    body = {
        "store": key,
        "version": version,
        "marker": marker,
        "executor_id": executor_id,
        "created_ns": now,
        "changelog": changelog,
        "app_id": app_id,
        "restore_rate": restore_rate,
        "upload_rate": upload_rate,
        "upgrade": upgrade,
    }
    store.put_bytes(blob_id, orjson.dumps(body), metadata={"kind": "marker-report"}, ttl_seconds=ttl_seconds)
    return blob_id


def read_reports(
    store: BlobStore, query_id: str, version: int, app_id: str | None = None
) -> dict[str, Report]:
    """The newest report per store instance for `version`; with `app_id`, the newest one written by that
    Spark application (reports of others, e.g. a zombie application's executors, are skipped)."""
    prefix = reports_prefix(query_id, version)
    by_key: dict[str, list[tuple[str, str]]] = {}
    for info in store.list(prefix):
        rel = info.blob_id[len(prefix) :]
        key, _, name = rel.rpartition("/")
        if key:
            by_key.setdefault(key, []).append((name, info.blob_id))
    out: dict[str, Report] = {}
    for candidates in by_key.values():
        for _, blob_id in sorted(candidates, reverse=True):
            report = _read_report(store, blob_id)
            if report is None:
                continue  # deleted by a concurrent cleanup: the batch is already committed
            if app_id is not None and report.app_id != app_id:
                log.warning(
                    "query %s version %d: report %s of store %s was written by application %r, not %r; "
                    "skipped",
                    query_id,
                    version,
                    blob_id,
                    report.store,
                    report.app_id,
                    app_id,
                )
                continue
            out[report.store] = report
            break
    return out


def read_upgrades(
    store: BlobStore, query_id: str, version: int, app_id: str | None = None
) -> list[Report]:
    """Every upgrade report of `version` (with `app_id`: of that application only), oldest first."""
    prefix = upgrades_prefix(query_id, version)
    found = sorted((info.blob_id for info in store.list(prefix)), key=lambda b: b.rpartition("/")[2])
    reports = [r for r in (_read_report(store, b) for b in found) if r is not None]
    return [r for r in reports if app_id is None or r.app_id == app_id]


def _read_report(store: BlobStore, blob_id: str) -> Report | None:
    """The report in `blob_id`; None if it is gone (a concurrent cleanup: its batch is committed)."""
    try:
        doc = orjson.loads(store.get_bytes(blob_id))
        return Report(
            doc["store"],
            int(doc["version"]),
            str(doc["marker"]),
            str(doc.get("executor_id", "")),
            int(doc.get("created_ns", 0)),
            doc.get("changelog") is True,
            str(doc.get("app_id", "")),
            float(doc.get("restore_rate", 0.0)),
            float(doc.get("upload_rate", 0.0)),
            doc.get("upgrade") is True,
            blob_id,
        )
    except BlobNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise StateBackendError(f"malformed marker report {blob_id!r}: {e}") from None


def delete_reports(store: BlobStore, query_id: str, up_to_version: int, *, upgrades: bool = False) -> int:
    """Delete every report (`upgrades`: every upgrade report) of `query_id` for versions <=
    up_to_version; return how many."""
    prefix = (upgrades_prefix if upgrades else reports_prefix)(query_id)
    n = 0
    for info in list(store.list(prefix)):
        head = info.blob_id[len(prefix) :].split("/", 1)[0]
        if head.isdigit() and int(head) <= up_to_version:
            store.delete(info.blob_id)
            n += 1
    return n


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
