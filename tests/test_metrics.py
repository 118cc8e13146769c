"""Metrics: readable from Python and rendered in the Prometheus text format, per store instance."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from spark_statebackend.common.metrics import Metrics
from spark_statebackend.engine.backup import BackupManager
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import LocalBlobStore

from .trees import make_tree


def test_backup_and_restore_metrics_render_in_prometheus_format(
    local_store: LocalBlobStore, tmp_path: Path
) -> None:
    metrics = Metrics()
    src = make_tree(tmp_path / "src", {"a.sst": os.urandom(5000), "b": b"x"})
    with TransferPool(2) as pool:
        manager = BackupManager(local_store, pool, metrics=metrics)
        markers = manager.upload("cp-1", {"0/1/default": src})
        manager.cleanup(markers)
        (src / "c").write_bytes(b"new")
        manager.upload("cp-2", {"0/1/default": src})
        RestoreManager(local_store, pool, metrics=metrics).restore(markers["0/1/default"], tmp_path / "dst")
    store = {"store": "0/1/default"}
    assert metrics.value("ssb_backup_files_to_upload", **store) == 1  # the last diff: only c
    assert metrics.value("ssb_backup_files_retained", **store) == 2
    assert metrics.value("ssb_backup_files_uploaded_total", **store) == 3
    assert metrics.value("ssb_backup_bytes_uploaded_total", **store) == 5004
    assert metrics.value("ssb_restore_bytes_downloaded_total", **store) == 5001
    assert metrics.value("ssb_cleanup_ttls_removed_total", **store) == 3  # 2 files + the index
    samples = {
        (s.name, s.labels.get("store")): s.value
        for family in text_string_to_metric_families(metrics.render())
        for s in family.samples
    }
    assert samples[("ssb_backup_bytes_uploaded_total", "0/1/default")] == 5004
    assert samples[("ssb_restore_seconds_count", "0/1/default")] == 1
    assert samples[("ssb_backup_upload_seconds_count", "0/1/default")] == 2
    assert Metrics().value("ssb_backup_bytes_uploaded_total", store="x") == 0.0  # registries are separate


def test_samples_and_query_status_read_the_same_figures() -> None:
    from spark_statebackend.spark.query_status import query_status

    m = Metrics()
    m.last_durable_batch.labels("q1").set(7)
    m.checkpoint_bytes.labels("q1").set(4096)
    m.predicted_restore_seconds.labels("q1").set(0.5)
    m.last_checkpoint_lag.labels("q1").set(0.25)
    m.checkpoints_written.labels("q1").inc(3)
    m.last_durable_batch.labels("q2").set(1)
    samples = m.samples()
    assert {"name": "ssb_query_last_durable_batch", "labels": {"query": "q1"}, "value": 7.0} in samples
    assert not [s for s in samples if str(s["name"]).endswith("_bucket")]
    st = query_status(samples, "q1")
    assert (st.last_durable_batch, st.checkpoint_bytes, st.checkpoints_written) == (7, 4096, 3)
    assert (st.predicted_restore_seconds, st.checkpoint_lag_seconds) == (0.5, 0.25)
    unknown = query_status(samples, "q3")
    assert unknown.last_durable_batch == -1 and unknown.predicted_restore_seconds == -1.0
