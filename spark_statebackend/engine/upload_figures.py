"""The figures one query's uploads feed (common/metrics.py has the families): the query's sums by
default, each store's own with metrics.perStore. BackupManager (backup.py) records every diff, upload
and failure here, so which figures a store's work feeds is decided in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..common.metrics import BackupFigures, Metrics
from .blobs import SnapshotOwner
from .diff import DiffStats


class UploadFigures:
    """The backup figures of `owner`'s stores in `metrics`. Any thread (the families are)."""

    def __init__(self, metrics: Metrics, owner: SnapshotOwner) -> None:
        self.metrics = metrics
        self.owner = owner
        self._query = metrics.backup(owner.query_id, owner.query_name)

    def of(self, store_key: str) -> BackupFigures:
        """The figures `store_key`'s work feeds: its own with metrics.perStore, else the query's."""
        if not self.metrics.per_store:
            return self._query
        return self.metrics.backup(self.owner.query_id, self.owner.query_name, store_key)

    def groups(self, store_keys: Iterable[str]) -> list[tuple[BackupFigures, list[str]]]:
        """The stores of one upload grouped by the figures they feed: one group, the query's, unless
        metrics are per store (then one per store)."""
        if not self.metrics.per_store:
            return [(self._query, list(store_keys))]
        return [(self.of(k), [k]) for k in store_keys]

    def failed(self, store_keys: Iterable[str]) -> None:
        """The upload of `store_keys` failed: count their snapshots as upload errors."""
        for f, keys in self.groups(store_keys):
            f.upload_errors.inc(len(keys))

    def diffed(self, stats: Mapping[str, DiffStats]) -> None:
        """The last-diff gauges: sums over the stores of one upload that feed the same figures (the
        query's; each store's own with metrics.perStore). Per store otherwise: the log."""
        for f, keys in self.groups(stats):
            group = [stats[k] for k in keys]
            f.files_to_upload.set(sum(s.files_added for s in group))
            f.bytes_to_upload.set(sum(s.bytes_added for s in group))
            f.files_retained.set(sum(s.files_retained for s in group))
            f.bytes_retained.set(sum(s.bytes_retained for s in group))
            f.files_removed.set(sum(s.files_removed for s in group))
            f.bytes_removed.set(sum(s.bytes_removed for s in group))

    def uploaded(self, stats: Mapping[str, DiffStats], elapsed: float) -> None:
        """The stores of `stats` were uploaded together in `elapsed` seconds."""
        for f, keys in self.groups(stats):
            size = sum(stats[k].bytes_added for k in keys)
            f.files_uploaded.inc(sum(stats[k].files_added for k in keys))
            f.bytes_uploaded.inc(size)
            f.snapshots.inc(len(keys))
            f.upload_seconds.observe(elapsed)
            f.upload_rate.set(size / elapsed)
