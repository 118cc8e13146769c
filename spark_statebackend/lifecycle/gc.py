"""Garbage collection of the blob store: delete blobs no retained checkpoint references.

Normal operation leaves garbage behind: uploads of batches that were never checkpointed (a crash, a
commit timeout, a fenced zombie), blobs of checkpoints that fell out of retention while cleanup
failed, marker reports of batches that never completed, whole queries dropped from the log. TTLs
expire most of it eventually (`blobTtl`, 7 days); `spark-statebackend gc` reclaims it sooner and
also catches what has no TTL left.

Run (GarbageCollector.run):
  [1] list every blob. Blobs under files/<q>/, indexes/<q>/, reports/<q>/ and upgrades/<q>/ belong to
      query q;
      everything else (queries/ locators, plans/ batch plans, which only the committer's cleanup
      deletes once a checkpoint covers them, anything this package did not write) is always kept.
  [2] mark, per query q: every blob reachable from q's retained checkpoints in the log
      (read_history: each blob-store marker, i.e. a SnapshotIndex blob, plus every blob of a file
      present in that index), plus the same closure of the newest SnapshotIndex of each store of q
      (the diff base a sidecar may still be building its next snapshot on, even if its own batch was
      never checkpointed). A query with no checkpoint in the log is left alone by [3]-[5] (a query of
      another log, a wrong --log URL): GC never deletes by age on an empty answer; only the TTL sweep
      [6] deletes its blobs, once their own TTL has passed. Without a log at all every query is left
      alone, by [6] too: a checkpoint whose cleanup never ran (its blobs still carry their upload TTL)
      would otherwise lose its blobs to a gc that could not see it.
      CLI backups (query segment `cli`, CLI_QUERY) have no checkpoints: there every
      SnapshotIndex present is a kept snapshot (`spark-statebackend forget` deletes the index of a
      snapshot it no longer keeps), so the mark is the closure of every index of `cli`.
  [3] candidates: the query blobs not marked whose modification time is older than `grace`.
  [4] re-read every candidate query's checkpoints and newest indexes and mark again (a checkpoint
      written since [2] may reference blobs [2] did not see referenced); drop what is now marked.
  [5] delete the remaining candidates (on the TransferPool, bounded by a timeout), unless dry_run.
  [6] the TTL sweep over the whole store (`sweep`, unless dry_run): every blob whose TTL has passed
      is deleted (uploads of a query that never checkpointed, reports, anything of a query this log
      does not know: the TTL is their only owner) except the ones [2]/[4] marked and every blob of a
      query kept whole for a problem. A marked blob found with an expired TTL (its checkpoint's
      cleanup never ran) keeps existing: its TTL is removed and an ERROR names the query and blob.
      The committer runs the same sweep periodically (runtime/sweeper.py, `sweepInterval`).

Why this never deletes a blob a retained checkpoint references, even while queries commit:
  - A blob referenced by a checkpoint that was retained during [2] or [4] is marked.
  - A checkpoint written after [4] references (a) blobs uploaded for it, and (b) blobs retained from
    its diff base. (a) are younger than the grace: a checkpoint is written at most commitTimeout
    (30 min) plus maxCommitDelay (60 s) after its uploads began, far less than the 6 h default grace,
    so they were never candidates. (b) belong to the store's previous checkpointed snapshot (marked
    in [2]/[4] because it was retained then) or to the newest snapshot the store uploaded since
    (marked by the newest-index rule).
  - The remaining race window is therefore only: an upload that takes longer than the grace, a
    diff base that is neither retained nor its store's newest index (a sidecar still diffing
    against an uncheckpointed snapshot after a newer one of the same store was uploaded, which the
    sidecar's one-upload-per-store loop does not do), or clocks skewed by more than the grace (ages
    compare the store's modification time with this process's clock). A longer grace closes the
    first and the last; nothing here can close the second, which is also exactly when the blobs'
    TTL would expire them anyway.
  - The sweep [6] deletes only blobs whose TTL has passed (uploaded more than blobTtl ago and never
    made permanent) and spares everything [2]/[4] marked. A checkpoint written after that mark
    references blobs uploaded for it (younger than blobTtl: not expired) or its diff base (marked).
  - An index the latest checkpoint names that cannot be read is reported as a problem and its query
    is left alone for this run (keep-all), after one re-read of the log (the checkpoint may just have
    fallen out of retention and been cleaned up, which is not a problem). An older record (on Kafka,
    history compaction has not dropped yet) protects its blobs only while its index is permanent (the
    committer keeps retained checkpoints permanent, retainCheckpoints > 1); one whose index is gone
    is logged, and one whose index carries a TTL again was replaced: neither keeps any blob. Likewise
    an unreadable index of a CLI snapshot keeps every blob of `cli`.
  - CLI snapshots: a blob is deleted only if no index of `cli` listed in [2] or [4] references it.
    A backup running meanwhile uploads its new files (younger than the grace) and then its index;
    the files it keeps come from its diff base, the newest index of its store, which `forget`'s
    policies never remove. Forgetting a store's newest snapshot by id while a backup of that store
    runs is the one way to lose a file the new snapshot keeps (docs/cli.md says not to).
A log that cannot be read aborts the run before anything is deleted (CheckpointLogError).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from ..checkpoints.logs import CheckpointLog
from ..common.units import format_duration, format_size
from ..engine.transfer import TransferPool
from ..errors import BlobNotFoundError, StateBackendError
from ..stores import BlobInfo, BlobStore
from .reachability import Marker, query_of

log = logging.getLogger("spark_statebackend.gc")  # name kept from the flat layout

#: Default grace period. It must exceed the longest time from a blob's upload to the checkpoint that
#: first references it: commitTimeout (default 30 min) + maxCommitDelay (60 s) + the upload itself.
#: Six hours is an order of magnitude above that, tolerates hours of clock skew and stalled uploads,
#: and is still far below blobTtl (7 days), so GC reclaims space long before the TTL would
#: (Settings.from_conf refuses a blobTtl below commitTimeout plus this grace).
DEFAULT_GRACE_SECONDS = 6 * 3600.0


class GcProgress(Protocol):
    """What a GC run reports as it goes (the CLI draws bars from it). `advance` may be called from
    the pool's threads."""

    def phase(self, name: str, total: int | None, unit: str) -> None:
        """A new phase begins: 'list' (blobs, total unknown), 'mark' (indexes to read), 'delete'."""

    def advance(self, n: int = 1) -> None:
        """`n` more units of the current phase are done."""


class _NoGcProgress:
    def phase(self, name: str, total: int | None, unit: str) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass(frozen=True)
class GcReport:
    """What one GC run found and did. In a dry run `deleted` and `bytes_freed` are 0 and `garbage`
    lists what a real run would delete."""

    dry_run: bool
    grace_seconds: float
    blobs_scanned: int
    referenced: int  # blobs present that a retained checkpoint or a newest index references
    deleted: int
    bytes_freed: int
    kept_for_grace: int  # unreferenced but younger than the grace
    kept_other: int  # locators, unknown prefixes, queries without checkpoints or with problems
    queries: tuple[str, ...]
    queries_without_checkpoints: tuple[str, ...]
    garbage: tuple[str, ...]  # deleted (or, in a dry run, to delete) blob ids, sorted
    garbage_bytes: int
    problems: tuple[str, ...] = field(default_factory=tuple)
    swept: int = 0  # expired blobs the TTL sweep deleted ([6]; none in a dry run)
    ttl_removed: tuple[str, ...] = ()  # referenced blobs the sweep found expired and made permanent
    with_log: bool = True  # False: no checkpoint log given, every query's blobs were kept whole

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        freed = self.garbage_bytes if self.dry_run else self.bytes_freed
        count = len(self.garbage) if self.dry_run else self.deleted
        return (
            f"scanned {self.blobs_scanned} blob(s) of {len(self.queries)} quer(ies): "
            f"{self.referenced} referenced, {verb} {count} ({format_size(freed)}), "
            f"{self.kept_for_grace} kept for the {format_duration(self.grace_seconds)} grace, "
            f"{self.kept_other} other kept"
            + self._without_summary()
            + ("; TTL sweep not run (dry run)" if self.dry_run else f"; TTL sweep deleted {self.swept}")
            + (
                f", made {len(self.ttl_removed)} referenced blob(s) with an expired TTL permanent"
                if self.ttl_removed
                else ""
            )
        )

    def _without_summary(self) -> str:
        n = len(self.queries_without_checkpoints)
        if not n:
            return ""
        if not self.with_log:
            return f" ({n} quer(ies) kept whole: no checkpoint log given)"
        return f" ({n} quer(ies) without checkpoints: only their expired blobs are swept)"


@dataclass(frozen=True)
class SweepReport:
    """What one TTL sweep ([6]) did: expired blobs deleted, referenced ones made permanent instead."""

    swept: int
    ttl_removed: tuple[str, ...]
    problems: tuple[str, ...]


@dataclass
class _Tally:
    """What one gc pass counts while it marks and rechecks (GcReport's figures)."""

    kept_other: int = 0
    referenced: int = 0
    kept_for_grace: int = 0
    problems: list[str] = field(default_factory=list)
    marked: dict[str, set[str]] = field(default_factory=dict)
    kept_whole: set[str] = field(default_factory=set)  # queries with a problem: nothing deleted or swept
    without: list[str] = field(default_factory=list)


class GarbageCollector:
    """Deletes unreferenced blobs older than a grace period (module doc: the algorithm and why it is
    safe while queries commit). Only reads the checkpoint log: it never acquires a writer."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog | None,
        pool: TransferPool,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
        timeout_seconds: float = 600.0,
        before_recheck: Callable[[], None] | None = None,
    ) -> None:
        """`checkpoint_log` None: no query has checkpoints, so only CLI snapshots are collected and
        every query's blobs are left alone. `clock` gives seconds since the epoch (compared with the
        store's modification times);
        `timeout_seconds` bounds each batch of index reads and deletes; `before_recheck` runs between
        [3] and [4] (a seam for tests that commit during a GC)."""
        if grace_seconds < 0:
            raise ValueError(f"grace must not be negative, got {grace_seconds}")
        self.store = store
        self.log = checkpoint_log
        self.pool = pool
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.timeout = timeout_seconds
        self._before_recheck = before_recheck
        self._progress: GcProgress = _NoGcProgress()
        self._marker = Marker(
            store, checkpoint_log, pool, timeout_seconds=timeout_seconds, progress=self._progress
        )

    def run(self, *, dry_run: bool = False, progress: GcProgress | None = None) -> GcReport:
        """One GC pass over the whole store; see the module doc. Raises CheckpointLogError (nothing
        deleted) if the log cannot be read. `progress` hears of each phase and step."""
        self._progress = progress or _NoGcProgress()
        self._marker.progress = self._progress
        cutoff_ms = int((self.clock() - self.grace_seconds) * 1000)
        listing = self._list()
        t = _Tally()
        by_query: dict[str, list[BlobInfo]] = {}
        for info in listing:
            q = query_of(info.blob_id)
            if q is None:
                t.kept_other += 1
            else:
                by_query.setdefault(q, []).append(info)
        candidates = self._mark(by_query, cutoff_ms, t)
        if self._before_recheck is not None:
            self._before_recheck()
        garbage = self._recheck(candidates, t)
        deleted, freed = self._delete_garbage(garbage, t) if not dry_run and garbage else (0, 0)  # [5]
        sweep = SweepReport(0, (), ())
        if not dry_run:  # [6]
            sweep = self._sweep(set().union(*t.marked.values()), t.kept_whole)
            t.problems.extend(sweep.problems)
        report = GcReport(
            dry_run=dry_run,
            grace_seconds=self.grace_seconds,
            blobs_scanned=len(listing),
            referenced=t.referenced,
            deleted=deleted,
            bytes_freed=freed,
            kept_for_grace=t.kept_for_grace,
            kept_other=t.kept_other,
            queries=tuple(sorted(by_query)),
            queries_without_checkpoints=tuple(t.without),
            garbage=tuple(i.blob_id for i in garbage),
            garbage_bytes=sum(i.size for i in garbage),
            problems=tuple(t.problems),
            swept=sweep.swept,
            ttl_removed=sweep.ttl_removed,
            with_log=self.log is not None,
        )
        log.info("gc of %s: %s", self.store.url, report.summary())
        return report

    def _list(self) -> list[BlobInfo]:
        """[1] Every blob of the store, counted on the progress."""
        self._progress.phase("list", None, "blob")
        listing = []
        for info in self.store.list(""):
            listing.append(info)
            self._progress.advance()
        return listing

    def _mark(
        self, by_query: Mapping[str, list[BlobInfo]], cutoff_ms: int, t: _Tally
    ) -> dict[str, list[BlobInfo]]:
        """[2], [3] Mark what each query's checkpoints reference; the unreferenced blobs older than
        `cutoff_ms` of the queries that could be marked, by query (the rest is counted in `t`)."""
        candidates: dict[str, list[BlobInfo]] = {}
        for q in sorted(by_query):
            mark = self._marker.mark(q, by_query[q])
            t.problems.extend(mark.problems)
            if not mark.has_checkpoints:
                t.without.append(q)
            if mark.referenced is None:
                t.kept_other += len(by_query[q])
                if mark.has_checkpoints or self.log is None:
                    t.kept_whole.add(q)  # without a log no query's checkpoints are known: none is swept
                continue
            t.marked[q] = mark.referenced
            for info in by_query[q]:
                if info.blob_id in mark.referenced:
                    t.referenced += 1
                elif info.modified_ms >= cutoff_ms:
                    t.kept_for_grace += 1
                else:
                    candidates.setdefault(q, []).append(info)
        return candidates

    def _recheck(self, candidates: Mapping[str, list[BlobInfo]], t: _Tally) -> list[BlobInfo]:
        """[4] Mark each candidate's query again from a fresh listing of its indexes; the candidates
        still unreferenced (the garbage), by blob id."""
        garbage: list[BlobInfo] = []
        for q in sorted(candidates):
            fresh = list(self.store.list(f"indexes/{q}/"))
            mark = self._marker.mark(q, fresh)
            t.problems.extend(mark.problems)
            if mark.referenced is None:
                t.kept_other += len(candidates[q])
                t.kept_whole.add(q)
                continue
            t.marked[q] |= mark.referenced
            for info in candidates[q]:
                if info.blob_id in mark.referenced:
                    t.referenced += 1  # referenced by a checkpoint written during this run
                else:
                    garbage.append(info)
        garbage.sort(key=lambda i: i.blob_id)
        return garbage

    def _delete_garbage(self, garbage: list[BlobInfo], t: _Tally) -> tuple[int, int]:
        """[5] Delete `garbage`; (blobs deleted, bytes freed), each failure a problem in `t`."""
        deleted = freed = 0
        self._progress.phase("delete", len(garbage), "blob")
        results = self.pool.run_all(
            [partial(self._delete, info.blob_id) for info in garbage], timeout=self.timeout
        )
        for info, error in zip(garbage, results, strict=True):
            if error is None:
                deleted += 1
                freed += info.size
            else:
                t.problems.append(error)
        return deleted, freed

    def sweep(self) -> SweepReport:
        """The TTL sweep alone ([1], [2], [6]): delete every expired blob of the whole store except
        what a retained checkpoint or a newest index references (module doc). What the committer runs
        periodically; it deletes nothing by age, so it needs no grace. Raises CheckpointLogError
        (nothing deleted) if the log cannot be read."""
        by_query: dict[str, list[BlobInfo]] = {}
        for info in self.store.list(""):
            q = query_of(info.blob_id)
            if q is not None:
                by_query.setdefault(q, []).append(info)
        referenced: set[str] = set()
        kept_whole: set[str] = set()
        problems: list[str] = []
        for q in sorted(by_query):
            mark = self._marker.mark(q, by_query[q])
            problems.extend(mark.problems)
            if mark.referenced is not None:
                referenced |= mark.referenced
            elif mark.has_checkpoints:
                kept_whole.add(q)
        report = self._sweep(referenced, kept_whole)
        return SweepReport(report.swept, report.ttl_removed, (*problems, *report.problems))

    def _sweep(self, referenced: set[str], kept_whole: set[str]) -> SweepReport:
        """[6]: sweep_expired sparing `referenced` blobs and every blob of the `kept_whole` queries;
        then remove the TTL of each referenced blob the sweep found expired."""
        expired_referenced: list[str] = []

        def keep(blob_id: str) -> bool:
            if query_of(blob_id) in kept_whole:
                return True
            if blob_id in referenced:
                expired_referenced.append(blob_id)
                return True
            return False

        swept = self.store.sweep_expired(int(self.clock() * 1000), keep=keep)
        made_permanent: list[str] = []
        problems: list[str] = []
        for blob_id in sorted(expired_referenced):
            try:
                self.store.remove_ttl(blob_id)
            except BlobNotFoundError:
                continue  # its checkpoint fell out of retention and was cleaned up meanwhile
            except StateBackendError as e:
                problems.append(f"removing the expired TTL of referenced blob {blob_id} failed: {e}")
                continue
            made_permanent.append(blob_id)
            log.error(
                "gc sweep: blob %s of query %s is referenced by a retained checkpoint (or is a newest "
                "index) but its TTL had expired (that checkpoint's cleanup never ran); TTL removed",
                blob_id,
                query_of(blob_id),
            )
        log.info("TTL sweep of %s: %d expired blob(s) deleted", self.store.url, swept)
        return SweepReport(swept, tuple(made_permanent), tuple(problems))

    def _delete(self, blob_id: str) -> str | None:
        try:
            self.store.delete(blob_id)
        except StateBackendError as e:
            return f"deleting {blob_id} failed: {e}"
        finally:
            self._progress.advance()
        return None
