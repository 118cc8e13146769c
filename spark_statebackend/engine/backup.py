"""BackupManager: incremental snapshot upload and post-checkpoint cleanup, after Samza's contract
([B1]-[B7] of engine/__init__.py, which the code marks)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..common import crashpoints
from ..common.metrics import Metrics
from ..errors import BlobNotFoundError, StateBackendError
from ..stores import BlobStore
from .blobs import (
    SnapshotOwner,
    load_snapshot_index,
)
from .cleanup_chain import Replaced, replaced_blobs
from .diff import DiffOptions, DiffStats, DirDiff, build_dir_index, compute_diff
from .index import FileIndex, SnapshotIndex
from .index_codec import encode_snapshot_index
from .new_snapshot import UploadedPrefix, new_snapshot_index, plan_chunks
from .transfer import (
    DEFAULT_CHUNK_SIZE,
    LockedProgress,
    NoProgress,
    Progress,
    TransferPool,
    upload_chunk,
)
from .upload_figures import UploadFigures

log = logging.getLogger("spark_statebackend.backup")  # name kept from the flat layout

DEFAULT_TTL_SECONDS = 7 * 24 * 3600.0


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
        self._figures = UploadFigures(self.metrics, self.owner)
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
        uploaded: Mapping[str, Mapping[str, UploadedPrefix]] | None = None,
    ) -> dict[str, str]:
        """Snapshot every directory in `dirs` (store key -> directory) and return the new markers.

        `versions` and `recipes` (store key -> what Spark needs to load the staged files) are recorded
        in each SnapshotIndex's metadata. `uploaded` (store key -> relative path -> prefix): the start
        of a file to upload that is in the blob store already (new_snapshot.plan_chunks): only its
        rest goes up.

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
            diffs[store_key], diff_stats[store_key] = self._diff(
                checkpoint_id, store_key, Path(directory), prevs[store_key]
            )
        self._figures.diffed(diff_stats)
        files = self._upload_files(checkpoint_id, diffs, prog, uploaded or {})
        crashpoints.crash_point(crashpoints.BEFORE_INDEX_UPLOAD)  # test-only; a no-op unless armed
        # [B4] one SnapshotIndex per store
        new_indexes = {
            store_key: new_snapshot_index(
                self.owner,
                checkpoint_id,
                store_key,
                build_dir_index(d, files),
                prevs[store_key],
                (versions or {}).get(store_key),
                (recipes or {}).get(store_key, StoreRecipe()),
            )
            for store_key, d in diffs.items()
        }
        with self._counting_failure(dirs):
            self._put_indexes(new_indexes)
        self._uploaded(checkpoint_id, new_indexes, diff_stats, max(time.monotonic() - started, 1e-9))
        return {store_key: bid for store_key, (bid, _) in new_indexes.items()}

    def _diff(
        self, checkpoint_id: str, store_key: str, directory: Path, prev: tuple[str, SnapshotIndex] | None
    ) -> tuple[DirDiff, DiffStats]:
        """[B2] `directory` against the previous snapshot `prev` (None: every file is new), logged."""
        t0 = time.monotonic()
        diff = compute_diff(directory, prev[1].dir_index if prev else None, self.config.diff)
        self._figures.of(store_key).diff_seconds.observe(time.monotonic() - t0)
        stats = diff.stats()
        # "new", not "to upload": a changelog streamed while written is mostly up already (logged before)
        log.info(
            "snapshot %s store %s: %d file(s) / %d byte(s) new, %d retained, %d removed",
            checkpoint_id,
            store_key,
            stats.files_added,
            stats.bytes_added,
            stats.files_retained,
            stats.files_removed,
        )
        return diff, stats

    @contextlib.contextmanager
    def _counting_failure(self, store_keys: Iterable[str]) -> Iterator[None]:
        """Count an exception out of the block as failed uploads of the stores `store_keys`, and
        re-raise it."""
        try:
            yield
        except Exception:
            self._figures.failed(store_keys)
            raise

    def _upload_files(
        self,
        checkpoint_id: str,
        diffs: Mapping[str, DirDiff],
        prog: LockedProgress,
        uploaded: Mapping[str, Mapping[str, UploadedPrefix]],
    ) -> dict[int, FileIndex]:
        """[B3] Every chunk of every added file of every store (less the prefixes `uploaded` already),
        on the one bounded pool; the FileIndex of each added file, by `id()` of its LocalFile (what
        build_dir_index looks up)."""
        # A store whose blobs are local files keeps each file whole, so restore can link it (a file
        # streamed while written is the exception: its prefix is chunks already).
        chunk_size = None if self.store.whole_file_blobs else self.config.chunk_size
        plan = plan_chunks(self.owner, diffs, chunk_size, uploaded)
        ttl = self.config.ttl_seconds
        prog.start(sum(c.size for _, c in plan.chunks))
        tasks = [
            partial(upload_chunk, self.store, c, {"store": sk, "checkpoint": checkpoint_id}, ttl, prog)
            for sk, c in plan.chunks
        ]
        with self._counting_failure(diffs):
            blobs = self.pool.run_all(tasks, timeout=self.config.timeout_seconds)
        return plan.file_indexes(blobs)

    def _put_indexes(self, new_indexes: Mapping[str, tuple[str, SnapshotIndex]]) -> None:
        """[B4] Store the new SnapshotIndexes (blob id, index) with the upload's TTL."""
        self.pool.run_all(
            [
                partial(
                    self.store.put_bytes,
                    bid,
                    encode_snapshot_index(idx),
                    metadata={"kind": "snapshot-index"},
                    ttl_seconds=self.config.ttl_seconds,
                )
                for bid, idx in new_indexes.values()
            ],
            timeout=self.config.timeout_seconds,
        )

    def _uploaded(
        self,
        checkpoint_id: str,
        new_indexes: Mapping[str, tuple[str, SnapshotIndex]],
        diff_stats: Mapping[str, DiffStats],
        elapsed: float,
    ) -> None:
        """[B5] The new indexes become the stores' diff bases; the upload's figures and log lines."""
        with self._lock:
            for store_key, (bid, idx) in new_indexes.items():
                self._prev[store_key] = (bid, idx)
                self._known[bid] = idx
            for store_key, st in diff_stats.items():
                self._last[store_key] = StoreUpload(st, st.bytes_added / elapsed)
        for store_key, (bid, _) in new_indexes.items():
            log.info("snapshot %s store %s uploaded as %s", checkpoint_id, store_key, bid)
        self._figures.uploaded(diff_stats, elapsed)

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

        When the chain does not reach the previous checkpoint's marker (within cleanup_chain.MAX_CLEANUP_CHAIN
        indexes), this snapshot was diffed against a base that checkpoint never passed through: a store
        that moved to another executor and back while the committer lagged keeps its first executor's
        own older base. What only the previous checkpoint referenced is then in no chain this cleanup
        can follow, and it was made permanent when that checkpoint was written. It is given a TTL again
        (blobTtl) instead of being deleted: it is no longer retained, but an upload still in flight
        may have diffed against it; a checkpoint that references it removes the TTL again, and
        otherwise the TTL sweep deletes it like any upload no checkpoint took. Before, it stayed
        permanent with no checkpoint referencing it."""
        started = time.monotonic()
        deletes: list[tuple[str, str | None, str | None, Replaced]] = []
        for store_key, marker in markers.items():
            index = self._index(marker)
            present = frozenset([*index.dir_index.present_blob_ids(), marker])
            kept = self._make_permanent(store_key, present)
            replaced = (
                replaced_blobs(
                    self._index, store_key, marker, index, present, (previous or {}).get(store_key)
                )
                if delete_replaced
                else Replaced(frozenset(), frozenset())
            )
            deletes.append(
                (store_key, index.prev_snapshot_index_blob_id, (previous or {}).get(store_key), replaced)
            )
            with self._lock:
                self._permanent[store_key] = present
                if index.prev_snapshot_index_blob_id is not None:
                    self._known.pop(index.prev_snapshot_index_blob_id, None)
            log.info(
                "cleanup store %s marker %s: %d blob(s) made permanent, %d to delete",
                store_key,
                marker,
                kept,
                len(replaced.delete),
            )
        # [B7] after every store's [B6]: the deletes of all stores go in as few requests as the
        # store takes (one DeleteObjects per 1000 blobs on S3), not one request per blob.
        self._delete_replaced(deletes)
        self._cleanup_figures.seconds.observe(time.monotonic() - started)

    def _make_permanent(self, store_key: str, present: frozenset[str]) -> int:
        """[B6] Remove the TTL of the blobs in `present` not already made permanent for `store_key` by
        an earlier cleanup in this process; how many that was."""
        with self._lock:
            already = self._permanent.get(store_key, frozenset())
        to_keep = sorted(present - already)
        self.pool.run_all([partial(self.store.remove_ttl, b) for b in to_keep])
        crashpoints.crash_point(crashpoints.DURING_CLEANUP)  # test-only; a no-op unless armed
        self._cleanup_figures.ttls_removed.inc(len(to_keep))
        return len(to_keep)

    def _delete_replaced(self, deletes: list[tuple[str, str | None, str | None, Replaced]]) -> None:
        """[B7] Delete every `replaced.delete` of `deletes` (store key, its snapshot's previous index,
        the previous checkpoint's marker, what it replaced), then give each `replaced.expire` a TTL
        again (logged: the chain from the previous index did not reach the previous checkpoint's)."""
        doomed = sorted(b for *_, replaced in deletes for b in replaced.delete)
        self.store.delete_many(doomed)
        self._cleanup_figures.blobs_deleted.inc(len(doomed))
        for store_key, prev, stop, replaced in deletes:
            if not replaced.expire:
                continue
            self.pool.run_all([partial(self._expire, b) for b in sorted(replaced.expire)])
            log.warning(
                "cleanup store %s: the chain of snapshots from %s does not reach the previous "
                "checkpoint's %s; the %d blob(s) only that checkpoint referenced expire again after "
                "blobTtl",
                store_key,
                prev,
                stop,
                len(replaced.expire),
            )

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
