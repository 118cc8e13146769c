"""What the committer has read, or been told, of the blob store's write-once blobs (committer.py module
doc: costs): the upload reports of each pending batch and, per query, the SnapshotIndexes of the markers
it checked or its own process uploaded. Report and index blobs are written once under unique names and
never changed, so one read (or written here) is never fetched again; this module only remembers them
and forgets them once a checkpoint no longer needs them. The committer decides what is checkpointed.

Costs: a batch's reports are listed at every poll while it waits for them, but each report blob is
fetched once (they are written once under unique names), and not at all when this sidecar's own upload
loop wrote it (Committer.uploaded_here, `told` here: the driver's stores, and with a local master all of
them); the SnapshotIndexes of the previous checkpoint's markers, which `check_markers` diffs each new
snapshot against, are not fetched again when this committer checked them itself, nor a new marker's
index uploaded here (only its blob's existence is asked); when this sidecar wrote every report of a
batch (a local master) the reports are not even listed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from ..checkpoints.checkpoint import version_of_batch
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..lifecycle.markers import check_markers
from ..lifecycle.reports import Report, read_reports
from ..stores import BlobStore
from .progress import ProgressEvent
from .query_state import QueryState

log = logging.getLogger("spark_statebackend.commit")  # the committer's: these are its reads


class CommitReads:
    """The reports and indexes the committer of application `app_id` knows, over `store`. Any thread."""

    def __init__(self, store: BlobStore, pool: TransferPool, app_id: str) -> None:
        self.store = store
        self.pool = pool
        self.app_id = app_id
        self._lock = threading.Lock()
        # (query, batch) -> report blob id -> Report; query -> marker -> SnapshotIndex
        self._reports: dict[tuple[str, int], dict[str, Report]] = {}
        self._indexes: dict[str, dict[str, SnapshotIndex]] = {}

    def told(self, query_id: str, report: Report, index: SnapshotIndex) -> None:
        """This process's own upload loop wrote `report` of `query_id`, naming `index`."""
        with self._lock:
            self._reports.setdefault((query_id, report.version - 1), {})[report.blob_id] = report
            self._indexes.setdefault(query_id, {})[report.marker] = index

    def batch_reports(self, q: QueryState, event: ProgressEvent) -> tuple[dict[str, Report], int]:
        """The reports batch `event` of query `q` is checkpointed with so far, and how many it needs.

        A batch of a stateful query (its latest checkpoint names stores) whose progress counts no
        state store instance ran none: Spark skipped executing it because the sink had the batch
        already (the file sink's log, on a re-run after a restart), so its state is the version an
        earlier run committed, which Spark loads next from its files or, on a new host, a restore
        takes from the newest upload report of it (lifecycle/markers.py). Its checkpoint names those
        same reports, whichever application of the query wrote them: naming no store, it would leave
        that version restorable from nothing, and what the version replaced never deleted."""
        if event.state_store_instances or event.offline or not q.store_keys:
            return self.reports(event.query_id, event.batch_id, event.state_store_instances), (
                event.state_store_instances
            )
        version = version_of_batch(event.batch_id)
        with self._lock:
            cache = self._reports.setdefault((event.query_id, event.batch_id), {})
        found = read_reports(self.store, event.query_id, version, cache=cache)
        carried = {k: r for k, r in found.items() if k in q.store_keys}
        if len(carried) == len(q.store_keys):
            log.info(
                "query %s batch %d ran none of its %d state store instances (the sink had the batch "
                "already); its checkpoint names the version %d an earlier run uploaded: %s",
                event.query_id,
                event.batch_id,
                len(carried),
                version,
                ", ".join(sorted({r.app_id or "unknown" for r in carried.values()})),
            )
        return carried, len(q.store_keys)

    def reports(self, query_id: str, batch_id: int, instances: int) -> dict[str, Report]:
        """The newest report of each store instance of `batch_id` (lifecycle/reports.py). When this
        sidecar's own upload loop wrote one for every one of the batch's `instances` (a local master:
        all of them run here), those are the batch's, and the store is not listed: no other process of
        this application uploads its stores, and another application's reports are never taken."""
        if not instances:
            return {}
        with self._lock:
            cache = self._reports.setdefault((query_id, batch_id), {})
            seen = list(cache.values())
        newest: dict[str, Report] = {}
        for report in seen:
            if report.app_id == self.app_id and (
                report.store not in newest or report.created_ns > newest[report.store].created_ns
            ):
                newest[report.store] = report
        if len(newest) >= instances:
            return newest
        version = version_of_batch(batch_id)
        return read_reports(self.store, query_id, version, app_id=self.app_id, cache=cache)

    def check(
        self,
        q: QueryState,
        query_id: str,
        version: int,
        reports: Mapping[str, Report],
        previous: Mapping[str, str],
    ) -> list[str]:
        """Why the reported markers of `version` must not go into a checkpoint whose predecessor has
        the markers `previous` (lifecycle/markers.check_markers, given the indexes known here; empty:
        they may). Sets `q.bytes`; the indexes it loaded become known, and the checked ones the
        query's BackupManager's (its cleanup then needs no fetch). Store unreachable: raises."""
        with self._lock:
            known = dict(self._indexes.get(query_id, {}))  # a copy: the upload loop may add to ours
        problems, q.bytes = check_markers(
            self.store, self.pool, query_id, version, reports, previous, known=known
        )
        with self._lock:
            self._indexes.setdefault(query_id, {}).update(known)  # with the ones it loaded
        for report in reports.values():
            if report.marker in known:
                q.manager.remember_index(report.marker, known[report.marker])
        return problems

    def checkpointed(self, query_id: str, batch_id: int, markers: Mapping[str, str]) -> None:
        """Checkpoint `batch_id` of `query_id` was written with `markers`: of the indexes known, keep
        its own (the next batch's `previous`) and those of later versions (uploaded meanwhile), and
        forget the reports of it and of every batch before it."""
        current = set(markers.values())
        with self._lock:
            known = self._indexes.get(query_id, {})
            self._indexes[query_id] = {
                m: i
                for m, i in known.items()
                if m in current or (i.metadata.version or 0) > version_of_batch(batch_id)
            }
            for key in [k for k in self._reports if k[0] == query_id and k[1] <= batch_id]:
                del self._reports[key]

    def dropped(self, query_id: str, batch_id: int) -> None:
        """Batch `batch_id` of `query_id` is no longer pending: forget its reports."""
        with self._lock:
            self._reports.pop((query_id, batch_id), None)

    def forget(self, query_id: str) -> None:
        """`query_id` is never committed here again (fenced): forget all of it."""
        with self._lock:
            self._indexes.pop(query_id, None)
            for key in [k for k in self._reports if k[0] == query_id]:
                del self._reports[key]
