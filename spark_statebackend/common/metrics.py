"""Metrics a user watches: what backup uploads and keeps, what restore downloads, how long, how fast.

Built on prometheus_client so every metric is readable from Python (`Metrics.value`) and renders in
the Prometheus text format (`Metrics.render`). Each Metrics object owns its registry: two managers in
one process (or two tests) never collide. Labels are `store` (the store instance key) or `query`.

Spark's metrics system sees them through the spool: each sidecar writes `samples()` to
`<spool dir>/metrics.json` every second (runtime/sidecar.py), and the JVM plugin registers one gauge
per sample in its metric registry (jvm-bridge SidecarMetrics), so JMX, Spark's Prometheus servlet and
every other Spark metrics sink show them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


class Metrics:
    """The metric families of backup, cleanup, restore and commit. All names start with `ssb_`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        lbl = ["store"]
        # backup: the last snapshot's diff
        self.files_to_upload = Gauge(
            "ssb_backup_files_to_upload", "Files the last diff found new", lbl, registry=r
        )
        self.bytes_to_upload = Gauge(
            "ssb_backup_bytes_to_upload", "Bytes the last diff found new", lbl, registry=r
        )
        self.files_retained = Gauge(
            "ssb_backup_files_retained", "Files reused from the previous snapshot", lbl, registry=r
        )
        self.bytes_retained = Gauge(
            "ssb_backup_bytes_retained", "Bytes reused from the previous snapshot", lbl, registry=r
        )
        self.files_removed = Gauge(
            "ssb_backup_files_removed", "Files gone since the previous snapshot", lbl, registry=r
        )
        self.bytes_removed = Gauge(
            "ssb_backup_bytes_removed", "Bytes gone since the previous snapshot", lbl, registry=r
        )
        self.files_uploaded = Counter("ssb_backup_files_uploaded", "Files uploaded", lbl, registry=r)
        self.bytes_uploaded = Counter("ssb_backup_bytes_uploaded", "Bytes uploaded", lbl, registry=r)
        self.snapshots = Counter("ssb_backup_snapshots", "Snapshots uploaded", lbl, registry=r)
        self.upload_errors = Counter(
            "ssb_backup_upload_errors", "Snapshot uploads that failed", lbl, registry=r
        )
        self.diff_seconds = Histogram(
            "ssb_backup_diff_seconds", "Time to diff a directory", lbl, buckets=_DURATION_BUCKETS, registry=r
        )
        self.upload_seconds = Histogram(
            "ssb_backup_upload_seconds",
            "Time to upload a snapshot (files and index)",
            lbl,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.upload_rate = Gauge(
            "ssb_backup_upload_rate_bytes_per_second",
            "Bytes per second of the last snapshot upload",
            lbl,
            registry=r,
        )
        # cleanup
        self.cleanup_seconds = Histogram(
            "ssb_cleanup_seconds",
            "Time to clean up after a checkpoint",
            lbl,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.blobs_deleted = Counter("ssb_cleanup_blobs_deleted", "Blobs deleted by cleanup", lbl, registry=r)
        self.ttls_removed = Counter(
            "ssb_cleanup_ttls_removed", "Blobs made permanent by cleanup", lbl, registry=r
        )
        # restore
        self.restore_files = Counter(
            "ssb_restore_files_downloaded", "Files downloaded by restore", lbl, registry=r
        )
        self.restore_bytes = Counter(
            "ssb_restore_bytes_downloaded", "Bytes downloaded by restore", lbl, registry=r
        )
        self.restore_files_reused = Counter(
            "ssb_restore_files_reused", "Identical local files restore kept", lbl, registry=r
        )
        self.restore_bytes_reused = Counter(
            "ssb_restore_bytes_reused", "Bytes of identical local files restore kept", lbl, registry=r
        )
        self.restore_seconds = Histogram(
            "ssb_restore_seconds", "Time to restore a snapshot", lbl, buckets=_DURATION_BUCKETS, registry=r
        )
        self.restore_rate = Gauge(
            "ssb_restore_rate_bytes_per_second", "Bytes per second of the last restore", lbl, registry=r
        )
        # commit (driver)
        self.checkpoint_lag = Histogram(
            "ssb_checkpoint_lag_seconds",
            "From the end of a micro-batch to its checkpoint being durable",
            ["query"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.checkpoints_written = Counter(
            "ssb_checkpoints_written", "Combined checkpoints written", ["query"], registry=r
        )
        self.last_checkpoint_lag = Gauge(
            "ssb_query_checkpoint_lag_seconds",
            "Checkpoint lag of the query's last checkpoint (end of its batch to durable)",
            ["query"],
            registry=r,
        )
        self.last_durable_batch = Gauge(
            "ssb_query_last_durable_batch",
            "The query's newest checkpointed micro-batch",
            ["query"],
            registry=r,
        )
        self.checkpoint_bytes = Gauge(
            "ssb_query_checkpoint_bytes",
            "Bytes of every file the query's latest checkpoint references (what a restore reads)",
            ["query"],
            registry=r,
        )
        self.predicted_restore_seconds = Gauge(
            "ssb_query_predicted_restore_seconds",
            "Predicted time to restore the query's latest checkpoint: its bytes over the measured restore "
            "rate (the upload rate until a restore has been measured; -1 before either)",
            ["query"],
            registry=r,
        )
        # sidecar
        self.upload_lag = Gauge(
            "ssb_upload_lag_seconds",
            "Age of this sidecar's oldest staged snapshot not uploaded yet (0: none)",
            registry=r,
        )
        self.last_restore_rate = Gauge(
            "ssb_restore_last_rate_bytes_per_second",
            "Bytes per second of this sidecar's last restore that downloaded anything",
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (`name` as rendered, e.g. 'ssb_backup_bytes_uploaded_total');
        0.0 if it was never set."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else float(v)

    def samples(self) -> list[dict[str, object]]:
        """Every current sample as {"name", "labels", "value"}: counters and gauges, and a histogram's
        `_sum` and `_count` (not its buckets). What the sidecar publishes for Spark's metrics system."""
        out: list[dict[str, object]] = []
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                out.append({"name": sample.name, "labels": dict(sample.labels), "value": float(sample.value)})
        return out

    def render(self) -> str:
        """All metrics in the Prometheus text exposition format."""
        return generate_latest(self.registry).decode("utf-8")
