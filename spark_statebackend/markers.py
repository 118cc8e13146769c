"""Marker reports and query locators: how sidecars tell the driver's committer what they uploaded.

Sidecars run on executors that share nothing with the driver but the blob store, so they report
through it: after uploading store instance S at state version V of query Q, a sidecar writes

    reports/<Q>/<V zero-padded>/<S>/<created ns>-<rand>.json   {"marker": <SnapshotIndex blob id>, ...}

The committer lists reports/<Q>/<V>/ until every store instance of the batch has reported (when
the same store reports twice for one version, e.g. a retried task, the newest report wins), writes
the checkpoint, and deletes the reports. Reports are small and short-lived and carry the blob TTL: the
committer deletes them, and one whose batch never completes expires like the upload it names.

A locator, queries/<checkpoint key>.json, maps a checkpoint location to its query id, so a driver
whose checkpoint location is gone (a new host) can still find the query's checkpoints: Spark would
otherwise invent a new query id.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass

import orjson

from .backup import blob_segment
from .blobstore import BlobStore
from .errors import BlobNotFoundError, StateBackendError


@dataclass(frozen=True)
class Report:
    store: str
    version: int
    marker: str
    executor_id: str
    created_ns: int
    #: The snapshot replays changelogs (Spark's changelog checkpointing); False for reports of old writers.
    changelog: bool = False


def store_key(operator: int, partition: int, store: str) -> str:
    """The store instance key used everywhere: '<operator>/<partition>/<store name>'."""
    return f"{operator}/{partition}/{store}"


def reports_prefix(query_id: str, version: int | None = None) -> str:
    base = f"reports/{blob_segment(query_id)}/"
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
) -> str:
    """Publish that store instance `key` of `query_id` at `version` was uploaded as `marker`.

    With a TTL, a report no checkpoint ever consumes (its batch never completed) expires with the
    snapshot it names."""
    now = time.time_ns()
    blob_id = f"{reports_prefix(query_id, version)}{blob_segment(key)}/{now:020d}-{uuid.uuid4().hex[:8]}.json"
    body = {
        "store": key,
        "version": version,
        "marker": marker,
        "executor_id": executor_id,
        "created_ns": now,
        "changelog": changelog,
    }
    store.put_bytes(blob_id, orjson.dumps(body), metadata={"kind": "marker-report"}, ttl_seconds=ttl_seconds)
    return blob_id


def read_reports(store: BlobStore, query_id: str, version: int) -> dict[str, Report]:
    """The newest report per store instance for `version`."""
    prefix = reports_prefix(query_id, version)
    newest: dict[str, tuple[str, str]] = {}
    for info in store.list(prefix):
        rel = info.blob_id[len(prefix) :]
        key, _, name = rel.rpartition("/")
        if key and (key not in newest or name > newest[key][1]):
            newest[key] = (info.blob_id, name)
    out: dict[str, Report] = {}
    for blob_id, _ in newest.values():
        try:
            doc = orjson.loads(store.get_bytes(blob_id))
            out[doc["store"]] = Report(
                doc["store"],
                int(doc["version"]),
                str(doc["marker"]),
                str(doc.get("executor_id", "")),
                int(doc.get("created_ns", 0)),
                doc.get("changelog") is True,
            )
        except BlobNotFoundError:
            continue  # deleted by a concurrent cleanup: the batch is already committed
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise StateBackendError(f"malformed marker report {blob_id!r}: {e}") from None
    return out


def delete_reports(store: BlobStore, query_id: str, up_to_version: int) -> int:
    """Delete every report of `query_id` for versions <= up_to_version; return how many."""
    prefix = reports_prefix(query_id)
    n = 0
    for info in list(store.list(prefix)):
        head = info.blob_id[len(prefix) :].split("/", 1)[0]
        if head.isdigit() and int(head) <= up_to_version:
            store.delete(info.blob_id)
            n += 1
    return n


def locator_id(checkpoint_root: str) -> str:
    """Blob id of the locator of a checkpoint location (hashed: paths are not blob-id safe)."""
    normalized = checkpoint_root.rstrip("/")
    digest = hashlib.sha256(normalized.encode()).hexdigest()[:32]
    return f"queries/{digest}.json"


def write_locator(store: BlobStore, checkpoint_root: str, query_id: str, query_name: str) -> None:
    body = {"checkpoint_root": checkpoint_root.rstrip("/"), "query_id": query_id, "query_name": query_name}
    store.put_bytes(locator_id(checkpoint_root), orjson.dumps(body), metadata={"kind": "query-locator"})


def read_locator(store: BlobStore, checkpoint_root: str) -> str | None:
    """The query id last committed from `checkpoint_root`, if any."""
    try:
        doc = orjson.loads(store.get_bytes(locator_id(checkpoint_root)))
    except BlobNotFoundError:
        return None
    except orjson.JSONDecodeError as e:
        raise StateBackendError(f"malformed query locator for {checkpoint_root!r}: {e}") from None
    qid = doc.get("query_id") if isinstance(doc, dict) else None
    return qid if isinstance(qid, str) else None
