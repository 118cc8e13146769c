"""Marker reports: how sidecars tell the driver's committer what they uploaded ([C4] of runtime/__init__.py).

Sidecars run on executors that share nothing with the driver but the blob store, so they report
through it: after uploading store instance S at state version V of query Q, a sidecar writes

    reports/<Q>/<V zero-padded>/<S>/<created ns>-<rand>.json   {"marker": <SnapshotIndex blob id>, ...}

The committer lists reports/<Q>/<V>/ until every store instance of the batch has reported (when
the same store reports twice for one version, e.g. a retried task, the newest report wins; reports
of another Spark application, a zombie's, are never taken), writes the checkpoint, and deletes the
reports. A report its own sidecar wrote it learns in memory (`write_report`'s `on_written`), and
when those cover the batch it needs no list (runtime/committer.py, "Costs"). An upgrade (changelog
checkpointing: version V uploaded again after Spark published a snapshot that shortens its recipe,
runtime/upgrades.py) is reported under upgrades/<Q>/<V zero-padded>/<S>/... instead: a batch's
commit never takes it, and deleting the reports of a checkpointed version never removes one that
arrived meanwhile; the committer reads every upgrade of its latest checkpoint's version
(`read_upgrades`) and deletes the ones it has seen. Reports are small and short-lived and
carry the blob TTL: the committer deletes them, and one whose batch never completes expires like the
upload it names.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

import orjson

from ..engine.blobs import blob_segment
from ..errors import BlobNotFoundError, StateBackendError
from ..stores import BlobStore

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
    #: The identity of the application attempt whose sidecar uploaded it (runtime/spool `app_identity`:
    #: the app id, plus the attempt when there is one): a committer takes only its own identity's reports,
    #: so the executors of a zombie application, or of an earlier attempt of the same application, can
    #: never get a snapshot into a checkpoint. Reports of applications without attempts hold the app id.
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
    on_written: Callable[[Report], None] | None = None,
) -> str:
    """Publish that store instance `key` of `query_id` at `version` was uploaded as `marker` (`upgrade`:
    under upgrades/, module doc); return the report's blob id.

    With a TTL, a report no checkpoint ever consumes (its batch never completed) expires with the
    snapshot it names. `on_written(report)` is called once it is stored, with the Report as a reader
    would read it back: how a committer in the same process learns it without fetching it."""
    now = time.time_ns()
    prefix = (upgrades_prefix if upgrade else reports_prefix)(query_id, version)
    blob_id = f"{prefix}{blob_segment(key)}/{now:020d}-{uuid.uuid4().hex[:8]}.json"
    report = Report(
        store=key,
        version=version,
        marker=marker,
        executor_id=executor_id,
        created_ns=now,
        changelog=changelog,
        app_id=app_id,
        restore_rate=restore_rate,
        upload_rate=upload_rate,
        upgrade=upgrade,
        blob_id=blob_id,
    )
    # The document is the Report's fields in their order, less its own blob id (`_read_report`).
    body = {k: v for k, v in dataclasses.asdict(report).items() if k != "blob_id"}
    store.put_bytes(blob_id, orjson.dumps(body), metadata={"kind": "marker-report"}, ttl_seconds=ttl_seconds)
    if on_written is not None:
        on_written(report)
    return blob_id


def read_reports(
    store: BlobStore,
    query_id: str,
    version: int,
    app_id: str | None = None,
    *,
    cache: MutableMapping[str, Report] | None = None,
) -> dict[str, Report]:
    """The newest report per store instance for `version`; with `app_id` (an application identity), the
    newest one written by that application attempt (reports of others, e.g. a zombie application's or an
    earlier attempt's executors, are skipped).

    `cache` (report blob id -> Report): the reports a caller that lists the same version again and again
    (the committer, while a batch's stores report) has read already. A report blob is written once under
    a unique name and never changed, so one listed again is taken from there, not fetched again; each
    one fetched is added. One list request per call, then one get per report not seen before."""
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
            report = cache.get(blob_id) if cache is not None else None
            if report is None:
                report = _read_report(store, blob_id)
                if report is None:
                    continue  # deleted by a concurrent cleanup: the batch is already committed
                if cache is not None:
                    cache[blob_id] = report
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


def read_upgrades(store: BlobStore, query_id: str, version: int, app_id: str | None = None) -> list[Report]:
    """Every upgrade report of `version` (with `app_id`: of that application identity only), oldest first."""
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
    doomed = []
    for info in list(store.list(prefix)):
        head = info.blob_id[len(prefix) :].split("/", 1)[0]
        if head.isdigit() and int(head) <= up_to_version:
            doomed.append(info.blob_id)
    store.delete_many(doomed)  # one request per delete_batch_size reports, not one each
    return len(doomed)
