"""Metrics a user watches: what backup uploads and keeps, what restore downloads, how long, how fast.

Built on prometheus_client: every metric renders in the Prometheus text format (`Metrics.render`). Each
Metrics object owns its registry: two managers in one process (or two tests) never collide.

By default cardinality follows the queries, never the store instances: a query with Spark's default
200 shuffle partitions has 200 store instances per stateful operator, and a metric per instance made
thousands of names per query. Every metric is either the sidecar's own (no label) or one query's
(label `query`, the query id), summed over its stores or a histogram over them. What one store did is
in the logs (INFO lines name the query, store, version and blob), and, behind the switch metrics.perStore
(`Metrics(per_store=True)`, off by default), in the backup and restore families labelled `query` and
`store` (the store instance key): one series per store instead of the query's sum. The committer's and
cleanup's families are per checkpoint, so per query either way.

Nothing reads the registry back on a hot path (collecting it walks every family): the figures the code
needs again (this sidecar's last restore rate here, each store's last upload rate in BackupManager) are
plain attributes set where they are measured. `value` is for tests.

Spark's metrics system sees them through the spool: each sidecar writes `samples()` to
`<spool dir>/metrics.json` every second (runtime/sidecar.py), and the JVM plugin registers one metric
per sample in its metric registry (jvm-bridge SidecarMetrics), so JMX, Spark's Prometheus servlet and
every other Spark metrics sink show them. A sample names its query by the query's name when it has one
(what users name dashboards by; stable across restarts), else by its id (`display_name`); the id is
kept beside it (`query_id`) for `status()`. A sample's `type` tells the plugin what to register:
counters (and a histogram's `_count`) as Dropwizard Counters, the rest as Gauges.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
_QUERY = ["query"]
_QUERY_STORE = ["query", "store"]


@dataclass(frozen=True)
class BackupFigures:
    """One query's backup metrics (the children of the `ssb_backup_*` families for its label)."""

    files_to_upload: Gauge
    bytes_to_upload: Gauge
    files_retained: Gauge
    bytes_retained: Gauge
    files_removed: Gauge
    bytes_removed: Gauge
    files_uploaded: Counter
    bytes_uploaded: Counter
    snapshots: Counter
    upload_errors: Counter
    diff_seconds: Histogram
    upload_seconds: Histogram
    upload_rate: Gauge


@dataclass(frozen=True)
class CleanupFigures:
    """One query's cleanup metrics."""

    seconds: Histogram
    blobs_deleted: Counter
    ttls_removed: Counter


@dataclass(frozen=True)
class RestoreFigures:
    """One query's restore metrics."""

    files: Counter
    bytes: Counter
    files_reused: Counter
    bytes_reused: Counter
    seconds: Histogram
    rate: Gauge


class Metrics:
    """The metric families of backup, cleanup, restore and commit. All names start with `ssb_`.

    Record through `backup`, `cleanup` and `restore` (one query's metrics, created together on first
    use so a query's set of names does not depend on what happened to it yet) or the per-query commit
    families with `.labels(query_id)`."""

    def __init__(self, registry: CollectorRegistry | None = None, *, per_store: bool = False) -> None:
        """Register every family in `registry` (None: a registry of this object's own). `per_store`
        (setting metrics.perStore): the backup and restore families are labelled by store instance too
        (`query`, `store`); off, by query alone."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self.per_store = per_store
        self._declare_backup(self.registry)
        self._declare_cleanup(self.registry)
        self._declare_restore(self.registry)
        self._declare_commit(self.registry)
        self._declare_sidecar(self.registry)
        #: Bytes per second of this sidecar's last restore that downloaded anything (0.0: none yet); what
        #: reports and the committer's prediction read, without collecting the registry.
        self.last_restore_rate = 0.0
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # query id -> its name, for the queries that have one
        self._named: dict[str, str] = {}  # name -> the query id that holds it
        self._backup: dict[tuple[str, ...], BackupFigures] = {}  # by their label values
        self._cleanup: dict[str, CleanupFigures] = {}
        self._restore: dict[tuple[str, ...], RestoreFigures] = {}

    # -- the families

    def _declare_backup(self, r: CollectorRegistry) -> None:
        """Backup (executors): the last diff of the query's stores this sidecar uploaded in one group."""
        qs = _QUERY_STORE if self.per_store else _QUERY  # the families one store's work feeds
        self.files_to_upload = Gauge(
            "ssb_backup_files_to_upload",
            "Files the last diff found new (sum over its stores)",
            qs,
            registry=r,
        )
        self.bytes_to_upload = Gauge(
            "ssb_backup_bytes_to_upload",
            "Bytes the last diff found new (sum over its stores)",
            qs,
            registry=r,
        )
        self.files_retained = Gauge(
            "ssb_backup_files_retained",
            "Files the last diff reused from the previous snapshots",
            qs,
            registry=r,
        )
        self.bytes_retained = Gauge(
            "ssb_backup_bytes_retained",
            "Bytes the last diff reused from the previous snapshots",
            qs,
            registry=r,
        )
        self.files_removed = Gauge(
            "ssb_backup_files_removed", "Files gone since the previous snapshots (last diff)", qs, registry=r
        )
        self.bytes_removed = Gauge(
            "ssb_backup_bytes_removed", "Bytes gone since the previous snapshots (last diff)", qs, registry=r
        )
        self.files_uploaded = Counter("ssb_backup_files_uploaded", "Files uploaded", qs, registry=r)
        self.bytes_uploaded = Counter("ssb_backup_bytes_uploaded", "Bytes uploaded", qs, registry=r)
        self.snapshots = Counter("ssb_backup_snapshots", "Store snapshots uploaded", qs, registry=r)
        self.upload_errors = Counter(
            "ssb_backup_upload_errors", "Store snapshots whose upload failed", qs, registry=r
        )
        self.diff_seconds = Histogram(
            "ssb_backup_diff_seconds",
            "Time to diff one store's directory",
            qs,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.upload_seconds = Histogram(
            "ssb_backup_upload_seconds",
            "Time to upload one version's snapshots of the query's stores here (files and indexes)",
            qs,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.upload_rate = Gauge(
            "ssb_backup_upload_rate_bytes_per_second",
            "Bytes per second of the query's last upload here (all its stores of one version)",
            qs,
            registry=r,
        )

    def _declare_cleanup(self, r: CollectorRegistry) -> None:
        """Cleanup (driver): per query."""
        q = _QUERY
        self.cleanup_seconds = Histogram(
            "ssb_cleanup_seconds",
            "Time to clean up after a checkpoint (all its stores)",
            q,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.blobs_deleted = Counter("ssb_cleanup_blobs_deleted", "Blobs deleted by cleanup", q, registry=r)
        self.ttls_removed = Counter(
            "ssb_cleanup_ttls_removed", "Blobs made permanent by cleanup", q, registry=r
        )

    def _declare_restore(self, r: CollectorRegistry) -> None:
        """Restore: per query."""
        qs = _QUERY_STORE if self.per_store else _QUERY  # the families one store's work feeds
        self.restore_files = Counter(
            "ssb_restore_files_downloaded", "Files downloaded by restore", qs, registry=r
        )
        self.restore_bytes = Counter(
            "ssb_restore_bytes_downloaded", "Bytes downloaded by restore", qs, registry=r
        )
        self.restore_files_reused = Counter(
            "ssb_restore_files_reused", "Identical local files restore kept", qs, registry=r
        )
        self.restore_bytes_reused = Counter(
            "ssb_restore_bytes_reused", "Bytes of identical local files restore kept", qs, registry=r
        )
        self.restore_seconds = Histogram(
            "ssb_restore_seconds",
            "Time to restore one store's snapshot",
            qs,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.restore_rate = Gauge(
            "ssb_restore_rate_bytes_per_second",
            "Bytes per second of the query's last store restore here",
            qs,
            registry=r,
        )

    def _declare_commit(self, r: CollectorRegistry) -> None:
        """Commit (driver): per query, and the query's latest checkpoint."""
        q = _QUERY
        self.checkpoint_lag = Histogram(
            "ssb_checkpoint_lag_seconds",
            "From the end of a micro-batch to its checkpoint being durable",
            q,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.checkpoints_written = Counter(
            "ssb_checkpoints_written", "Combined checkpoints written", q, registry=r
        )
        self.last_checkpoint_lag = Gauge(
            "ssb_query_checkpoint_lag_seconds",
            "Checkpoint lag of the query's last checkpoint (end of its batch to durable)",
            q,
            registry=r,
        )
        self.last_durable_batch = Gauge(
            "ssb_query_last_durable_batch",
            "The query's newest checkpointed micro-batch",
            q,
            registry=r,
        )
        self.checkpoint_bytes = Gauge(
            "ssb_query_checkpoint_bytes",
            "Bytes of every file the query's latest checkpoint references (what a restore reads)",
            q,
            registry=r,
        )
        self.predicted_restore_seconds = Gauge(
            "ssb_query_predicted_restore_seconds",
            "Predicted time to restore the query's latest checkpoint: its bytes over the measured restore "
            "rate (the upload rate until a restore has been measured; -1 before either)",
            q,
            registry=r,
        )

    def _declare_sidecar(self, r: CollectorRegistry) -> None:
        """The sidecar's own (no label)."""
        self.upload_lag = Gauge(
            "ssb_upload_lag_seconds",
            "Age of this sidecar's oldest staged snapshot not uploaded yet (0: none)",
            registry=r,
        )
        self.sidecar_restore_rate = Gauge(
            "ssb_restore_last_rate_bytes_per_second",
            "Bytes per second of this sidecar's last restore that downloaded anything",
            registry=r,
        )
        # every request this process made to the blob store, by kind (stores/counting.py)
        self.blob_requests = Counter(
            "ssb_blob_requests", "Blob-store requests by kind (op: put, get, list, ...)", ["op"], registry=r
        )
        # changelogSnapshotEvery (runtime/materializer.py), changelogStreamChunk (changelog_streams.py)
        self.changelog_snapshots = Counter(
            "ssb_changelog_snapshots", "Snapshot builds from changelogs by result", ["result"], registry=r
        )
        self.changelog_snapshot_seconds = Histogram(
            "ssb_changelog_snapshot_seconds", "Time to build one snapshot from changelogs", registry=r
        )
        self.changelog_stream_bytes = Counter(
            "ssb_changelog_stream_bytes", "Changelog bytes uploaded while Spark wrote them", registry=r
        )
        self.changelog_streams = Counter(
            "ssb_changelog_streams", "Changelog streams: used/dropped/short", ["result"], registry=r
        )

    # -- naming

    def name_query(self, query_id: str, name: str) -> None:
        """Record that `query_id` is called `name` ("" or None-like: no name; ignored). A name held by
        another query id (a new query reusing a stopped one's name) moves to `query_id`: the older one
        is published under its id from then on."""
        if not name:
            return
        with self._lock:
            if self._names.get(query_id) == name:
                return
            old = self._names.pop(query_id, None)
            if old is not None and self._named.get(old) == query_id:
                del self._named[old]
            holder = self._named.get(name)
            if holder is not None:
                self._names.pop(holder, None)
            self._names[query_id] = name
            self._named[name] = query_id

    def display_name(self, query_id: str) -> str:
        """How samples (and so Spark's metric names) call `query_id`: its name, else its id."""
        return self._names.get(query_id, query_id)

    # -- one query's figures

    def _labels(self, query_id: str, store: str) -> tuple[str, ...]:
        """The label values of a family one store's work feeds: (query, store) when per_store, else
        (query,): then every store of the query shares one series."""
        return (query_id, store) if self.per_store else (query_id,)

    def backup(self, query_id: str, name: str = "", store: str = "") -> BackupFigures:
        """The backup metrics of `query_id` (named `name`, if given); those of its store instance
        `store` (its key) when per_store, else the query's (`store` ignored)."""
        self.name_query(query_id, name)
        q = self._labels(query_id, store)
        f = self._backup.get(q)
        if f is None:
            f = BackupFigures(
                self.files_to_upload.labels(*q),
                self.bytes_to_upload.labels(*q),
                self.files_retained.labels(*q),
                self.bytes_retained.labels(*q),
                self.files_removed.labels(*q),
                self.bytes_removed.labels(*q),
                self.files_uploaded.labels(*q),
                self.bytes_uploaded.labels(*q),
                self.snapshots.labels(*q),
                self.upload_errors.labels(*q),
                self.diff_seconds.labels(*q),
                self.upload_seconds.labels(*q),
                self.upload_rate.labels(*q),
            )
            self._backup[q] = f
        return f

    def cleanup(self, query_id: str, name: str = "") -> CleanupFigures:
        """The cleanup metrics of `query_id` (named `name`, if given)."""
        self.name_query(query_id, name)
        f = self._cleanup.get(query_id)
        if f is None:
            q = query_id
            f = CleanupFigures(
                self.cleanup_seconds.labels(q), self.blobs_deleted.labels(q), self.ttls_removed.labels(q)
            )
            self._cleanup[query_id] = f
        return f

    def restore(self, query_id: str, name: str = "", store: str = "") -> RestoreFigures:
        """The restore metrics of `query_id` (named `name`, if given); those of its store instance
        `store` when per_store, else the query's (`store` ignored)."""
        self.name_query(query_id, name)
        q = self._labels(query_id, store)
        f = self._restore.get(q)
        if f is None:
            f = RestoreFigures(
                self.restore_files.labels(*q),
                self.restore_bytes.labels(*q),
                self.restore_files_reused.labels(*q),
                self.restore_bytes_reused.labels(*q),
                self.restore_seconds.labels(*q),
                self.restore_rate.labels(*q),
            )
            self._restore[q] = f
        return f

    def restored(self, rate: float) -> None:
        """This sidecar's last restore that downloaded anything ran at `rate` bytes per second."""
        self.last_restore_rate = rate
        self.sidecar_restore_rate.set(rate)

    # -- reading

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (`name` as rendered, e.g. 'ssb_backup_bytes_uploaded_total');
        0.0 if it was never set. Collects the whole registry: for tests, never on a hot path."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else float(v)

    def samples(self) -> list[dict[str, object]]:
        """Every current sample as {"name", "labels", "type", "value"}, plus "query_id" for a query's:
        counters and gauges, and a histogram's `_sum` and `_count` (not its buckets). `labels.query` is
        the query's `display_name`. `type` is "counter" for a counter and a histogram's `_count` (both
        only grow), "gauge" otherwise (a histogram's `_sum` too: fractional seconds). What the sidecar
        publishes for Spark's metrics system."""
        out: list[dict[str, object]] = []
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                counter = family.type == "counter" or sample.name.endswith("_count")
                labels = dict(sample.labels)
                doc: dict[str, object] = {
                    "name": sample.name,
                    "labels": labels,
                    "type": "counter" if counter else "gauge",
                    "value": float(sample.value),
                }
                query_id = labels.get("query")
                if query_id is not None:
                    labels["query"] = self.display_name(query_id)
                    doc["query_id"] = query_id
                out.append(doc)
        return out

    def render(self) -> str:
        """All metrics in the Prometheus text exposition format (label `query`: the query id)."""
        return generate_latest(self.registry).decode("utf-8")
