"""Metrics: per sidecar or per query (sums and histograms over its stores), never per store instance, so
their number follows the queries and not Spark's shuffle partitions (issue 22); rendered in the
Prometheus text format, published as samples named after the query with their type; and never read
back from the registry on a hot path."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_statebackend.checkpoints.logs.file import FileCheckpointLog
from spark_statebackend.common.metrics import Metrics
from spark_statebackend.engine.backup import BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.reports import read_reports
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.runtime.spool import Spool
from spark_statebackend.settings import PREFIX, Settings
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import Driver, Executor
from tests.staging import stage_version
from tests.trees import make_tree

QID = "6f1d2c3b-4a5e-4f60-9b7c-8d9e0a1b2c3d"


def test_backup_and_restore_metrics_render_per_query_in_prometheus_format(
    local_store: LocalBlobStore, tmp_path: Path
) -> None:
    metrics = Metrics()
    a = make_tree(tmp_path / "a", {"a.sst": os.urandom(5000), "b": b"x"})
    b = make_tree(tmp_path / "b", {"c.sst": os.urandom(300)})
    with TransferPool(2) as pool:
        manager = BackupManager(local_store, pool, owner=SnapshotOwner(QID, "counts"), metrics=metrics)
        markers = manager.upload("cp-1", {"0/0/default": a, "0/1/default": b})
        manager.cleanup(markers)
        (a / "c").write_bytes(b"new")
        manager.upload("cp-2", {"0/0/default": a, "0/1/default": b})
        RestoreManager(local_store, pool, metrics=metrics).restore(markers["0/0/default"], tmp_path / "dst")
    q = {"query": QID}
    assert metrics.value("ssb_backup_files_to_upload", **q) == 1  # the last diff: only c, of both stores
    assert metrics.value("ssb_backup_files_retained", **q) == 3
    assert metrics.value("ssb_backup_files_uploaded_total", **q) == 4
    assert metrics.value("ssb_backup_bytes_uploaded_total", **q) == 5304
    assert metrics.value("ssb_backup_snapshots_total", **q) == 4  # store snapshots
    assert metrics.value("ssb_restore_bytes_downloaded_total", **q) == 5001
    assert metrics.value("ssb_cleanup_ttls_removed_total", **q) == 5  # 3 files + 2 indexes
    assert metrics.last_restore_rate > 0
    last = manager.last_upload("0/0/default")
    assert last is not None and last.stats.files_added == 1 and last.rate > 0
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render())
        for s in family.samples
    }
    assert samples[("ssb_backup_bytes_uploaded_total", (("query", QID),))] == 5304
    assert samples[("ssb_restore_seconds_count", (("query", QID),))] == 1
    assert samples[("ssb_backup_upload_seconds_count", (("query", QID),))] == 2  # one per upload call
    assert samples[("ssb_backup_diff_seconds_count", (("query", QID),))] == 4  # one per store diff
    assert not [k for k in samples if any(label == "store" for label, _ in k[1])], "no store label"
    assert Metrics().value("ssb_backup_bytes_uploaded_total", **q) == 0.0  # registries are separate


def _published_names(stores: int, tmp_path: Path, per_store: bool = False) -> set[tuple[str, str]]:
    """The (name, labels) of every sample after uploading, cleaning up and restoring `stores` stores."""
    metrics = Metrics(per_store=per_store)
    store = LocalBlobStore(tmp_path / f"blobs-{stores}", fsync=False)
    store.ensure_ready()
    dirs = {
        f"0/{p}/default": make_tree(tmp_path / f"s{stores}-{p}", {"1.sst": os.urandom(100)})
        for p in range(stores)
    }
    with TransferPool(2) as pool:
        manager = BackupManager(store, pool, owner=SnapshotOwner(QID, "counts"), metrics=metrics)
        markers = manager.upload("cp-1", dirs)
        manager.cleanup(markers)
        restorer = RestoreManager(store, pool, metrics=metrics)
        for key, marker in markers.items():
            restorer.restore(marker, tmp_path / f"dst-{stores}" / key)
    metrics.checkpoints_written.labels(QID).inc()
    metrics.last_durable_batch.labels(QID).set(0)
    return {(str(s["name"]), repr(sorted(dict(s["labels"]).items()))) for s in metrics.samples()}  # type: ignore[call-overload]


def test_the_samples_of_a_query_do_not_grow_with_its_stores(tmp_path: Path) -> None:
    """Spark's default 200 shuffle partitions are 200 store instances per operator: the published
    samples (what Spark's metrics system registers one metric each for) must not follow them."""
    two = _published_names(2, tmp_path)
    eight = _published_names(8, tmp_path)
    assert two == eight
    assert len(two) < 50, sorted(two)


def test_per_store_metrics_label_the_backup_and_restore_families_by_store_instance(tmp_path: Path) -> None:
    """metrics.perStore: each store instance's series beside the query label; the committer's and
    cleanup's figures (one per checkpoint, not per store) stay per query."""
    two = _published_names(2, tmp_path / "on", per_store=True)
    per_store = {n for n, labels in two if "'store'" in labels}
    assert {
        "ssb_backup_snapshots_total",
        "ssb_backup_bytes_uploaded_total",
        "ssb_backup_diff_seconds_count",
        "ssb_backup_upload_seconds_count",
        "ssb_restore_bytes_downloaded_total",
        "ssb_restore_seconds_count",
    } <= per_store
    for store in ("0/0/default", "0/1/default"):
        labels = repr(sorted({"query": "counts", "store": store}.items()))
        assert ("ssb_backup_snapshots_total", labels) in two
        assert ("ssb_restore_bytes_downloaded_total", labels) in two
    assert not {n for n in per_store if n.startswith(("ssb_query_", "ssb_checkpoint", "ssb_cleanup_"))}
    eight = _published_names(8, tmp_path / "on", per_store=True)
    assert len(eight) - len(two) == 6 * len(per_store)  # one sample per store for each such name
    assert len(_published_names(2, tmp_path / "off")) < len(two)  # off: the query's sums alone


def test_per_store_figures_are_each_stores_own(local_store: LocalBlobStore, tmp_path: Path) -> None:
    metrics = Metrics(per_store=True)
    a = make_tree(tmp_path / "a", {"a.sst": os.urandom(5000), "b": b"x"})
    b = make_tree(tmp_path / "b", {"c.sst": os.urandom(300)})
    with TransferPool(2) as pool:
        manager = BackupManager(local_store, pool, owner=SnapshotOwner(QID, "counts"), metrics=metrics)
        manager.upload("cp-1", {"0/0/default": a, "0/1/default": b})
        (b / "d").write_bytes(b"new")
        manager.upload("cp-2", {"0/0/default": a, "0/1/default": b})

    def value(name: str, store: str) -> float:
        return metrics.value(name, query=QID, store=store)

    assert value("ssb_backup_bytes_uploaded_total", "0/0/default") == 5001
    assert value("ssb_backup_bytes_uploaded_total", "0/1/default") == 303
    assert value("ssb_backup_snapshots_total", "0/0/default") == 2
    assert value("ssb_backup_files_to_upload", "0/0/default") == 0  # its last diff found nothing new
    assert value("ssb_backup_files_to_upload", "0/1/default") == 1  # d
    assert value("ssb_backup_upload_seconds_count", "0/1/default") == 2
    assert metrics.value("ssb_backup_bytes_uploaded_total", query=QID) == 0.0  # no per-query series


def test_samples_name_the_query_and_say_which_are_counters() -> None:
    m = Metrics()
    m.backup(QID, "counts").bytes_uploaded.inc(10)
    m.backup(QID).upload_seconds.observe(0.5)
    m.last_durable_batch.labels("other-id").set(3)
    m.upload_lag.set(1.5)
    by_name = {(s["name"], dict(s["labels"]).get("query")): s for s in m.samples()}  # type: ignore[call-overload]
    uploaded = by_name[("ssb_backup_bytes_uploaded_total", "counts")]
    assert uploaded == {
        "name": "ssb_backup_bytes_uploaded_total",
        "labels": {"query": "counts"},  # the name: what dashboards are made by
        "type": "counter",
        "value": 10.0,
        "query_id": QID,  # for status()
    }
    assert by_name[("ssb_backup_upload_seconds_count", "counts")]["type"] == "counter"
    assert by_name[("ssb_backup_upload_seconds_sum", "counts")]["type"] == "gauge"  # fractional seconds
    assert by_name[("ssb_query_last_durable_batch", "other-id")]["type"] == "gauge"  # no name: the id
    assert by_name[("ssb_upload_lag_seconds", None)] == {
        "name": "ssb_upload_lag_seconds",
        "labels": {},
        "type": "gauge",
        "value": 1.5,
    }
    # A new query reusing the name takes it; the older one is published under its id again.
    m.backup("newer-id", "counts")
    names = {(s["name"], dict(s["labels"])["query"]) for s in m.samples() if s.get("query_id")}  # type: ignore[call-overload]
    assert ("ssb_backup_bytes_uploaded_total", QID) in names
    assert ("ssb_backup_bytes_uploaded_total", "counts") in names  # newer-id's, at 0


def test_samples_and_query_status_read_the_same_figures() -> None:
    from spark_statebackend.spark.query_status import query_status

    m = Metrics()
    m.name_query("q1", "counts")
    m.last_durable_batch.labels("q1").set(7)
    m.checkpoint_bytes.labels("q1").set(4096)
    m.predicted_restore_seconds.labels("q1").set(0.5)
    m.last_checkpoint_lag.labels("q1").set(0.25)
    m.checkpoints_written.labels("q1").inc(3)
    m.last_durable_batch.labels("q2").set(1)
    samples = m.samples()
    assert {
        "name": "ssb_query_last_durable_batch",
        "labels": {"query": "counts"},
        "type": "gauge",
        "value": 7.0,
        "query_id": "q1",
    } in samples
    assert not [s for s in samples if str(s["name"]).endswith("_bucket")]
    st = query_status(samples, "q1")  # by id, whatever the label says
    assert (st.last_durable_batch, st.checkpoint_bytes, st.checkpoints_written) == (7, 4096, 3)
    assert (st.predicted_restore_seconds, st.checkpoint_lag_seconds) == (0.5, 0.25)
    assert query_status(samples, "q2").last_durable_batch == 1
    unknown = query_status(samples, "q3")
    assert unknown.last_durable_batch == -1 and unknown.predicted_restore_seconds == -1.0
    # A sidecar of an earlier release labelled by id and published no query_id.
    old = [{"name": "ssb_query_last_durable_batch", "labels": {"query": "q1"}, "value": 4.0}]
    assert query_status(old, "q1").last_durable_batch == 4


def _count_collects(metrics: Metrics, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count how often `metrics`' registry is collected (get_sample_value collects it too)."""
    calls = [0]
    collect = metrics.registry.collect

    def counting() -> Iterator[object]:
        calls[0] += 1
        return collect()  # type: ignore[return-value]

    monkeypatch.setattr(metrics.registry, "collect", counting)
    return lambda: calls[0]


def test_the_upload_loop_reports_rates_without_reading_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A py-spy profile at 200 partitions: 85% of the upload loop's CPU went to collecting the whole
    registry twice per store (the rates each report carries). They are plain attributes now."""
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
        }
    )
    sidecar = Sidecar(Spool(tmp_path / "spool"), "exec-1", settings)
    try:
        sidecar.store.ensure_ready()
        sidecar.log.create_resources()
        sidecar.spool.events_dir.mkdir(parents=True, exist_ok=True)
        sidecar.metrics.restored(1234.0)  # as if this sidecar had restored something
        collects = _count_collects(sidecar.metrics, monkeypatch)
        for p in range(8):
            stage_version(sidecar, tmp_path / "cp", QID, p, 1, staged_at_ms=int(time.time() * 1000) - 10_000)
        assert sidecar.uploads.upload_once()
        reports = read_reports(sidecar.store, QID, 1)
        assert set(reports) == {f"0/{p}/default" for p in range(8)}
        assert all(r.restore_rate == 1234.0 and r.upload_rate > 0 for r in reports.values())
        assert collects() == 0
    finally:
        sidecar.close()


def test_the_committer_predicts_restores_without_reading_the_registry(
    local_store: LocalBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TransferPool(4) as pool:
        log = FileCheckpointLog(tmp_path / "log")
        log.create_resources()
        executor = Executor(local_store, pool, QID, tmp_path / "exec")
        driver = Driver(local_store, log, pool, QID, tmp_path / "driver")
        driver.committer.metrics.restored(1000.0)
        collects = _count_collects(driver.committer.metrics, monkeypatch)
        executor.upload(1)
        assert driver.finish_batch(0) == 1
        m = driver.committer.metrics
        monkeypatch.undo()
        assert collects() == 0
    assert m.value("ssb_query_last_durable_batch", query=QID) == 0
    predicted = m.value("ssb_query_predicted_restore_seconds", query=QID)
    assert predicted == pytest.approx(m.value("ssb_query_checkpoint_bytes", query=QID) / 1000.0)
    assert {s["labels"]["query"] for s in m.samples() if s.get("query_id") == QID} == {"rig"}  # type: ignore[index]
