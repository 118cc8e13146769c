"""BackupManager: incremental snapshot upload and post-checkpoint cleanup, after Samza's contract
([B1]-[B7] of engine/__init__.py, which the code marks)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..checkpoints.store_instance import StoreInstance
from ..common import crashpoints
from ..common.metrics import BackupFigures, Metrics
from ..errors import BlobNotFoundError, StateBackendError
from ..stores import BlobStore
from .blobs import (
    SnapshotOwner,
    blob_segment,
    files_prefix,
    indexes_prefix,
    load_snapshot_index,
)
from .diff import DiffOptions, DiffStats, DirDiff, LocalFile, build_dir_index, compute_diff
from .index import FileBlob, FileIndex, SnapshotIndex, SnapshotMetadata
from .index_codec import encode_snapshot_index
from .transfer import (
    DEFAULT_CHUNK_SIZE,
    LockedProgress,
    NoProgress,
    PlannedChunk,
    Progress,
    TransferPool,
    assemble_file_index,
    plan_file_upload,
    upload_chunk,
)

log = logging.getLogger("spark_statebackend.backup")  # name kept from the flat layout

DEFAULT_TTL_SECONDS = 7 * 24 * 3600.0
#: How many uploads a cleanup follows back to the previous checkpoint's snapshot (cleanup's doc).
MAX_CLEANUP_CHAIN = 64


@dataclass(frozen=True)
class BackupConfig:
    """Knobs of the backup path; defaults are the documented spark.conf defaults."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    diff: DiffOptions = field(default_factory=DiffOptions)
    ttl_seconds: float = DEFAULT_TTL_SECONDS
    timeout_seconds: float = 30 * 60.0


@dataclass(frozen=True)
class StoreUpload:
    """What the last upload of one store found and how fast it went (BackupManager.last_upload)."""

    stats: DiffStats
    #: bytes per second: the store's new bytes over the time its whole group (upload call) took
    rate: float


@dataclass(frozen=True)
class StoreRecipe:
    """What Spark needs to load a staged Spark store version (runtime/spool: the staged dir's recipe)."""

    snapshot_version: int | None = None
    changelog_versions: tuple[int, ...] = ()
    spark_unique_id: str | None = None


class BackupManager:
    """Uploads snapshots of store directories and cleans up after checkpoints ([B1]-[B7]).

    Thread-safety: upload and cleanup may run on different threads; the per-store state they share
    is guarded by one lock. The blob transfers run on `pool`, which the caller owns."""

    def __init__(
        self,
        store: BlobStore,
        pool: TransferPool,
        *,
        owner: SnapshotOwner | None = None,
        config: BackupConfig | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.owner = owner or SnapshotOwner()
        self.config = config or BackupConfig()
        self.metrics = metrics or Metrics()
        self._figures = self.metrics.backup(self.owner.query_id, self.owner.query_name)
        self._cleanup_figures = self.metrics.cleanup(self.owner.query_id, self.owner.query_name)
        self._lock = threading.Lock()
        self._prev: dict[str, tuple[str, SnapshotIndex]] = {}  # store -> (blob id, index): the diff base
        self._known: dict[str, SnapshotIndex] = {}  # blob id -> index this process uploaded or loaded
        self._permanent: dict[str, frozenset[str]] = {}  # store -> blob ids whose TTL is known removed
        self._last: dict[str, StoreUpload] = {}  # store -> its last successful upload

    # -- [B1]

    def init(self, markers: Mapping[str, str]) -> None:
        """Load the SnapshotIndex of each store's marker from the last checkpoint (empty: first run)."""
        items = list(markers.items())
        indexes = self.pool.run_all([partial(load_snapshot_index, self.store, bid) for _, bid in items])
        with self._lock:
            for (store_key, bid), index in zip(items, indexes, strict=True):
                self._prev[store_key] = (bid, index)
                self._known[bid] = index
        log.info("backup init: %d store(s) from the last checkpoint", len(items))

    def set_base(self, store_key: str, base: tuple[str, SnapshotIndex] | None) -> None:
        """Make the next upload of `store_key` diff against `base` (marker, its index), or upload every
        file of it afresh with no previous SnapshotIndex (None: the checkpointed marker is unusable)."""
        with self._lock:
            if base is None:
                self._prev.pop(store_key, None)
            else:
                self._prev[store_key] = base
                self._known[base[0]] = base[1]

    def previous_marker(self, store_key: str) -> str | None:
        """The marker the next upload of `store_key` diffs against, if any."""
        with self._lock:
            prev = self._prev.get(store_key)
        return prev[0] if prev else None

    def last_upload(self, store_key: str) -> StoreUpload | None:
        """What the last successful upload of `store_key` found and its rate; None before one. A plain
        lookup: the hot path reads this, never the metrics registry."""
        with self._lock:
            return self._last.get(store_key)

    def previous_parent(self, store_key: str) -> str | None:
        """The marker the diff base of `store_key` itself diffed against, if any."""
        with self._lock:
            prev = self._prev.get(store_key)
        return prev[1].prev_snapshot_index_blob_id if prev else None

    # -- [B2]..[B5]

    def upload(
        self,
        checkpoint_id: str,
        dirs: Mapping[str, Path],
        *,
        versions: Mapping[str, int] | None = None,
        recipes: Mapping[str, StoreRecipe] | None = None,
        progress: Progress | None = None,
    ) -> dict[str, str]:
        """Snapshot every directory in `dirs` (store key -> directory) and return the new markers.

        `versions` and `recipes` (store key -> what Spark needs to load the staged files) are recorded
        in each SnapshotIndex's metadata.

        Blocks the calling thread (which must not be a Spark task thread) at most
        config.timeout_seconds for the transfers. On error nothing already durable is touched; the
        blobs uploaded so far keep their TTL and expire."""
        prog = LockedProgress(progress or NoProgress())
        started = time.monotonic()
        diffs: dict[str, DirDiff] = {}
        diff_stats: dict[str, DiffStats] = {}
        prevs: dict[str, tuple[str, SnapshotIndex] | None] = {}
        for store_key, directory in dirs.items():
            with self._lock:
                prevs[store_key] = self._prev.get(store_key)
            prev = prevs[store_key]
            t0 = time.monotonic()
            diffs[store_key] = compute_diff(
                Path(directory), prev[1].dir_index if prev else None, self.config.diff
            )
            self._store_figures(store_key).diff_seconds.observe(time.monotonic() - t0)
            stats = diff_stats[store_key] = diffs[store_key].stats()
            log.info(
                "snapshot %s store %s: %d file(s) / %d byte(s) to upload, %d retained, %d removed",
                checkpoint_id,
                store_key,
                stats.files_added,
                stats.bytes_added,
                stats.files_retained,
                stats.files_removed,
            )

        self._diffed(diff_stats)

        # [B3] every chunk of every added file of every store, on the one bounded pool
        chunks: list[tuple[str, PlannedChunk]] = []
        added: dict[int, LocalFile] = {}
        for store_key, d in diffs.items():
            prefix = files_prefix(self.owner, store_key)
            for _, local in d.added_files():
                added[id(local)] = local
                size = local.metadata.size
                # A store whose blobs are local files keeps each file whole, so restore can link it.
                chunk_size = max(size, 1) if self.store.whole_file_blobs else self.config.chunk_size
                chunks.extend(
                    (store_key, c) for c in plan_file_upload(id(local), local.path, size, prefix, chunk_size)
                )
        ttl = self.config.ttl_seconds
        prog.start(sum(c.size for _, c in chunks))
        try:
            blobs = self.pool.run_all(
                [
                    partial(
                        upload_chunk, self.store, c, {"store": sk, "checkpoint": checkpoint_id}, ttl, prog
                    )
                    for sk, c in chunks
                ],
                timeout=self.config.timeout_seconds,
            )
        except Exception:
            self._failed(dirs)
            raise
        by_file: dict[int, list[FileBlob]] = {}
        for (_, c), b in zip(chunks, blobs, strict=True):
            by_file.setdefault(c.file_key, []).append(b)
        uploaded: dict[int, FileIndex] = {}
        for key, local in added.items():
            uploaded[key] = assemble_file_index(local.name, local.metadata, by_file.get(key, []))

        crashpoints.crash_point(crashpoints.BEFORE_INDEX_UPLOAD)  # test-only; a no-op unless armed
        # [B4] one SnapshotIndex per store
        new_indexes: dict[str, tuple[str, SnapshotIndex]] = {}
        for store_key, d in diffs.items():
            prev = prevs[store_key]
            inst = StoreInstance.parse_or_none(store_key)  # None: a CLI store, no Spark instance
            recipe = (recipes or {}).get(store_key, StoreRecipe())
            index = SnapshotIndex(
                created_at_ms=int(time.time() * 1000),
                metadata=SnapshotMetadata(
                    checkpoint_id=checkpoint_id,
                    query_name=self.owner.query_name,
                    query_id=self.owner.query_id,
                    store=store_key,
                    operator=inst.operator if inst else None,
                    partition=inst.partition if inst else None,
                    version=(versions or {}).get(store_key),
                    snapshot_version=recipe.snapshot_version,
                    changelog_versions=recipe.changelog_versions,
                    spark_unique_id=recipe.spark_unique_id,
                ),
                dir_index=build_dir_index(d, uploaded),
                prev_snapshot_index_blob_id=prev[0] if prev else None,
            )
            # The random suffix keeps a re-upload under the same checkpoint id (a retried or zombie
            # writer) from ever overwriting an index a checkpoint may already reference.
            suffix = uuid.uuid4().hex[:8]
            blob_id = f"{indexes_prefix(self.owner, store_key)}{blob_segment(checkpoint_id)}-{suffix}.json"
            new_indexes[store_key] = (blob_id, index)
        try:
            self.pool.run_all(
                [
                    partial(
                        self.store.put_bytes,
                        bid,
                        encode_snapshot_index(idx),
                        metadata={"kind": "snapshot-index"},
                        ttl_seconds=ttl,
                    )
                    for bid, idx in new_indexes.values()
                ],
                timeout=self.config.timeout_seconds,
            )
        except Exception:
            self._failed(dirs)
            raise

        # [B5]
        elapsed = max(time.monotonic() - started, 1e-9)
        with self._lock:
            for store_key, (bid, idx) in new_indexes.items():
                self._prev[store_key] = (bid, idx)
                self._known[bid] = idx
        with self._lock:
            for store_key, st in diff_stats.items():
                self._last[store_key] = StoreUpload(st, st.bytes_added / elapsed)
        for store_key in diffs:
            log.info(
                "snapshot %s store %s uploaded as %s", checkpoint_id, store_key, new_indexes[store_key][0]
            )
        for f, keys in self._by_figures(diff_stats):
            files = sum(diff_stats[k].files_added for k in keys)
            size = sum(diff_stats[k].bytes_added for k in keys)
            f.files_uploaded.inc(files)
            f.bytes_uploaded.inc(size)
            f.snapshots.inc(len(keys))
            f.upload_seconds.observe(elapsed)
            f.upload_rate.set(size / elapsed)
        return {store_key: bid for store_key, (bid, _) in new_indexes.items()}

    def _store_figures(self, store_key: str) -> BackupFigures:
        """The figures `store_key`'s work feeds: its own with metrics.perStore, else the query's."""
        if not self.metrics.per_store:
            return self._figures
        return self.metrics.backup(self.owner.query_id, self.owner.query_name, store_key)

    def _by_figures(self, store_keys: Iterable[str]) -> list[tuple[BackupFigures, list[str]]]:
        """The stores of one upload grouped by the figures they feed: one group, the query's, unless
        metrics are per store (then one per store)."""
        if not self.metrics.per_store:
            return [(self._figures, list(store_keys))]
        return [(self._store_figures(k), [k]) for k in store_keys]

    def _failed(self, store_keys: Iterable[str]) -> None:
        """The upload of `store_keys` failed: count their snapshots as upload errors."""
        for f, keys in self._by_figures(store_keys):
            f.upload_errors.inc(len(keys))

    def _diffed(self, stats: Mapping[str, DiffStats]) -> None:
        """The last-diff gauges: sums over the stores of one upload that feed the same figures (the
        query's; each store's own with metrics.perStore). Per store otherwise: the log."""
        for f, keys in self._by_figures(stats):
            group = [stats[k] for k in keys]
            f.files_to_upload.set(sum(s.files_added for s in group))
            f.bytes_to_upload.set(sum(s.bytes_added for s in group))
            f.files_retained.set(sum(s.files_retained for s in group))
            f.bytes_retained.set(sum(s.bytes_retained for s in group))
            f.files_removed.set(sum(s.files_removed for s in group))
            f.bytes_removed.set(sum(s.bytes_removed for s in group))

    # -- [B6]..[B7]

    def cleanup(
        self,
        markers: Mapping[str, str],
        *,
        delete_replaced: bool = True,
        previous: Mapping[str, str] | None = None,
    ) -> None:
        """Finish the commit of checkpointed markers (store key -> SnapshotIndex blob id); idempotent.

        `delete_replaced=False` runs step [B6] only: with more than one retained checkpoint
        (retainCheckpoints > 1) the blobs [B7] would delete may still be referenced by an older retained
        checkpoint, so the committer deletes them itself once no retained checkpoint references them
        (lifecycle/retention.py).

        `previous`: the markers of the checkpoint these replace. A snapshot need not diff against its
        store's previous checkpointed one: uploads no checkpoint took can lie between (a second upload
        of one version, e.g. a retried task, or an upgrade of a version whose recipe Spark shortened
        with a later snapshot). [B7] then follows the chain of previous indexes back to the previous
        checkpoint's marker and deletes, besides what this snapshot removed, what each upload in
        between removed and its index: all of it was in the previous checkpoint or in those uploads,
        and none of it is in this snapshot (a file once removed along a chain is never re-added under
        the same blob). Without `previous`, only this snapshot's removals and its direct predecessor
        index are deleted, as before.

        When the chain does not reach the previous checkpoint's marker (within MAX_CLEANUP_CHAIN
        indexes), this snapshot was diffed against a base that checkpoint never passed through: a store
        that moved to another executor and back while the committer lagged keeps its first executor's
        own older base. What only the previous checkpoint referenced is then in no chain this cleanup
        can follow, and it was made permanent when that checkpoint was written. It is given a TTL again
        (blobTtl) instead of being deleted: it is no longer retained, but an upload still in flight
        may have diffed against it; a checkpoint that references it removes the TTL again, and
        otherwise the TTL sweep deletes it like any upload no checkpoint took. Before, it stayed
        permanent with no checkpoint referencing it."""
        started = time.monotonic()
        for store_key, marker in markers.items():
            index = self._index(marker)
            present = frozenset([*index.dir_index.present_blob_ids(), marker])
            with self._lock:
                already = self._permanent.get(store_key, frozenset())
            to_keep = sorted(present - already)
            self.pool.run_all([partial(self.store.remove_ttl, b) for b in to_keep])
            crashpoints.crash_point(crashpoints.DURING_CLEANUP)  # test-only; a no-op unless armed
            self._cleanup_figures.ttls_removed.inc(len(to_keep))
            to_delete = set(index.dir_index.removed_blob_ids()) - present
            prev = index.prev_snapshot_index_blob_id
            if prev is not None and prev not in present:
                to_delete.add(prev)
            stop = (previous or {}).get(store_key)
            expire: set[str] = set()
            if stop is not None and stop not in (prev, marker) and delete_replaced:
                chain = None if prev is None else self._chain_removals(store_key, prev, stop)
                if chain is not None:
                    to_delete |= chain - present
                else:
                    expire = self._replaced_closure(store_key, stop) - present
            if not delete_replaced:
                to_delete.clear()
            self.pool.run_all([partial(self.store.delete, b) for b in sorted(to_delete)])
            self._cleanup_figures.blobs_deleted.inc(len(to_delete))
            expire -= to_delete
            if expire:
                self.pool.run_all([partial(self._expire, b) for b in sorted(expire)])
                log.warning(
                    "cleanup store %s: the chain of snapshots from %s does not reach the previous "
                    "checkpoint's %s; the %d blob(s) only that checkpoint referenced expire again after "
                    "blobTtl",
                    store_key,
                    prev,
                    stop,
                    len(expire),
                )
            with self._lock:
                self._permanent[store_key] = present
                if prev is not None:
                    self._known.pop(prev, None)
            log.info(
                "cleanup store %s marker %s: %d blob(s) made permanent, %d deleted",
                store_key,
                marker,
                len(to_keep),
                len(to_delete),
            )
        self._cleanup_figures.seconds.observe(time.monotonic() - started)

    def _chain_removals(self, store_key: str, first: str, stop: str) -> set[str] | None:
        """What the uploads from index `first` back to (excluding) index `stop` removed, plus their
        index blobs and `stop`; None when the chain does not reach `stop`."""
        found: set[str] = set()
        blob: str | None = first
        for _ in range(MAX_CLEANUP_CHAIN):
            if blob is None:
                break
            if blob == stop:
                return found | {stop}
            try:
                idx = self._index(blob)
            except StateBackendError as e:
                log.warning(
                    "cleanup store %s: index %s between checkpoints is unreadable: %s", store_key, blob, e
                )
                break
            found.add(blob)
            found |= set(idx.dir_index.removed_blob_ids())
            blob = idx.prev_snapshot_index_blob_id
        return None

    def _replaced_closure(self, store_key: str, marker: str) -> set[str]:
        """Every blob the replaced checkpoint's snapshot `marker` references; empty (with a warning:
        its blobs are left to gc) if its index cannot be read."""
        try:
            return {marker, *self._index(marker).dir_index.present_blob_ids()}
        except StateBackendError as e:
            log.warning(
                "cleanup store %s: the previous checkpoint's index %s is unreadable (%s); the blobs only "
                "it referenced are left to gc",
                store_key,
                marker,
                e,
            )
            return set()

    def _expire(self, blob_id: str) -> None:
        with contextlib.suppress(BlobNotFoundError):  # already gone: nothing left to expire
            self.store.set_ttl(blob_id, self.config.ttl_seconds)

    def remember_index(self, marker: str, index: SnapshotIndex) -> None:
        """Take `index` as what `marker` names without fetching it (a SnapshotIndex blob never changes
        once written): for an index this process wrote or checked itself, e.g. the committer's checked
        markers, which its cleanup then needs no request for."""
        with self._lock:
            self._known[marker] = index

    def snapshot_index(self, marker: str) -> SnapshotIndex:
        """The SnapshotIndex `marker` names, from this manager's cache or the store.

        Raises StateBackendError naming the blob when it is missing."""
        return self._index(marker)

    def _index(self, marker: str) -> SnapshotIndex:
        with self._lock:
            idx = self._known.get(marker)
        if idx is not None:
            return idx
        try:
            idx = load_snapshot_index(self.store, marker)
        except BlobNotFoundError:
            raise StateBackendError(
                f"cleanup: SnapshotIndex {marker!r} named by the checkpoint is missing from {self.store.url}"
            ) from None
        with self._lock:
            self._known[marker] = idx
        return idx
