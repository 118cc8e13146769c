"""What a checkpoint costs the committer in blob-store requests (runtime/committer.py, "Costs"): a
pending batch's reports are fetched once however often it is polled, the previous checkpoint's
SnapshotIndexes are not fetched again, and every request is counted (stores/counting.py). Real
uploads into a real local blob store, a real Committer on a real checkpoint log (tests/commitrig.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.common.metrics import Metrics
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.reports import Report, read_reports, reports_prefix, write_report
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.stores import BlobInfo, LocalBlobStore, Sink
from spark_statebackend.stores.counting import CountingBlobStore

from ..commitrig import STORES, Driver, Executor
from ..sidecarrig import KEY, STAGING, build_rig, progress_bytes, snapshot_event
from ..sidecarrig import QID as RIG_QID
from ..trees import make_tree

QID = "0f0e0d0c-0b0a-4909-8807-060504030201"


class RecordingStore(LocalBlobStore):
    """The local store, remembering which blobs were read (`got`) and which prefixes listed."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.got: list[str] = []
        self.listed: list[str] = []

    def get(self, blob_id: str, sink: Sink, offset: int = 0, length: int | None = None) -> int:
        self.got.append(blob_id)
        return super().get(blob_id, sink, offset, length)

    def list(self, prefix: str = "") -> Iterator[BlobInfo]:
        self.listed.append(prefix)
        return super().list(prefix)


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    p = TransferPool(4)
    yield p
    p.close()


def _rig(tmp_path: Path, pool: TransferPool) -> tuple[RecordingStore, Executor, Driver]:
    store = RecordingStore(tmp_path / "blobs")
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri())
    cplog.create_resources()
    return (
        store,
        Executor(store, pool, QID, tmp_path / "ex"),
        Driver(store, cplog, pool, QID, tmp_path / "dr"),
    )


def _submit(driver: Driver, batch_id: int) -> None:
    for sub in ("offsets", "commits"):
        (driver.ckpt / sub).mkdir(exist_ok=True)
        (driver.ckpt / sub / str(batch_id)).write_text(f"v1\n{batch_id}\n")
    driver.committer.submit(
        ProgressEvent(
            query_id=QID,
            query_name="rig",
            checkpoint_root=driver.ckpt,
            batch_id=batch_id,
            input_offsets={"src": str(batch_id)},
            state_store_instances=len(STORES),
            batch_end_ms=int(time.time() * 1000),
        )
    )


def test_a_pending_batch_fetches_each_report_once(tmp_path: Path, pool: TransferPool) -> None:
    """While a batch waits for its last store, every poll lists its reports again, but a report read
    at one poll is not fetched at the next: a report blob never changes."""
    store, executor, driver = _rig(tmp_path, pool)
    executor.upload(1, STORES[:1])  # one of the batch's two stores has reported
    _submit(driver, 0)
    prefix = reports_prefix(QID, 1)
    polls = 5
    for _ in range(polls):
        assert driver.committer.poll() == 0  # still waiting for the second store
    assert store.listed.count(prefix) == polls
    assert len([b for b in store.got if b.startswith(prefix)]) == 1, store.got
    executor.upload(1, STORES[1:])
    assert driver.committer.poll() == 1
    latest = driver.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 0
    assert {k: m for k, m in latest.markers(BLOBSTORE_BACKEND).items() if k in STORES} == {
        s: executor.markers[(s, 1)] for s in STORES
    }
    # Two reports in all, each fetched once.
    assert len([b for b in store.got if b.startswith(prefix)]) == len(STORES)


def test_the_previous_checkpoints_indexes_are_not_fetched_again(tmp_path: Path, pool: TransferPool) -> None:
    """The markers a batch's snapshots are diffed against are the previous checkpoint's, which this
    committer checked itself: their SnapshotIndexes are not fetched again. Every new marker still is."""
    store, executor, driver = _rig(tmp_path, pool)
    executor.upload(1)
    _submit(driver, 0)
    assert driver.committer.poll() == 1
    first = [executor.markers[(s, 1)] for s in STORES]
    executor.upload(2)
    store.got.clear()
    _submit(driver, 1)
    assert driver.committer.poll() == 1
    latest = driver.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 1
    # Checked before the write: every new marker was loaded (its index is valid and of this store).
    for s in STORES:
        assert executor.markers[(s, 2)] in store.got
    # The previous checkpoint's were not (nor by its cleanup, which remembers what it loaded itself).
    assert not [b for b in store.got if b in first], store.got


def test_every_request_is_counted_by_kind(tmp_path: Path) -> None:
    """CountingBlobStore counts each call once under its kind and passes it on unchanged."""
    metrics = Metrics(CollectorRegistry())
    store = CountingBlobStore(LocalBlobStore(tmp_path / "blobs"), metrics.blob_requests)
    store.ensure_ready()
    store.put_bytes("a/one", b"1", ttl_seconds=60)
    store.create("a/two", b"22")
    assert store.get_bytes("a/two") == b"22"
    assert sorted(b.blob_id for b in store.list("a/")) == ["a/one", "a/two"]
    assert store.exists("a/one") and store.stat("a/two").size == 2
    store.remove_ttl("a/one")
    store.delete("a/one")
    assert not store.exists("a/one")
    counts = {
        s["labels"]["op"]: s["value"]  # type: ignore[index]
        for s in metrics.samples()
        if s["name"] == "ssb_blob_requests_total"
    }
    assert counts == {
        "put": 2.0, "get": 1.0, "list": 1.0, "delete": 1.0, "head": 3.0, "ttl": 1.0, "sweep": 0.0,
    }  # fmt: skip


def _upload_here(executor: Executor, driver: Driver, version: int) -> dict[str, str]:
    """What the driver's sidecar does with a local master: its own upload loop uploads and reports the
    stores, and tells its committer (UploadLoop.reported_here -> Committer.uploaded_here)."""
    for s in STORES:
        executor.mutate(s, version)
    dirs = {s: executor.dir(s) for s in STORES}
    markers = executor.manager.upload(f"v{version:012d}", dirs, versions=dict.fromkeys(dirs, version))

    def tell(report: Report) -> None:
        driver.committer.uploaded_here(QID, report, executor.manager.snapshot_index(report.marker))

    for s, m in markers.items():
        write_report(
            executor.store, QID, version, s, m, "driver", 3600, app_id=executor.app_id, on_written=tell
        )
    return markers


def test_reports_and_indexes_uploaded_here_are_not_fetched(tmp_path: Path, pool: TransferPool) -> None:
    """The committer takes what its own sidecar's upload loop just wrote from memory: neither the
    reports nor the new SnapshotIndexes are fetched, and the checkpoint names exactly those markers."""
    store, executor, driver = _rig(tmp_path, pool)
    first = _upload_here(executor, driver, 1)
    _submit(driver, 0)
    assert driver.committer.poll() == 1
    markers = _upload_here(executor, driver, 2)
    store.got.clear()
    _submit(driver, 1)
    assert driver.committer.poll() == 1
    latest = driver.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 1
    assert {k: m for k, m in latest.markers(BLOBSTORE_BACKEND).items() if k in STORES} == markers
    fetched = [
        b for b in store.got if b.startswith(reports_prefix(QID)) or b in {*markers.values(), *first.values()}
    ]
    assert fetched == [], fetched


def test_an_index_uploaded_here_but_gone_is_not_checkpointed(tmp_path: Path, pool: TransferPool) -> None:
    """Known from memory is not known to be in the store: a SnapshotIndex the upload loop wrote and that
    is gone since (deleted, expired) keeps its batch out of the checkpoint log, as a fetched one would."""
    store, executor, driver = _rig(tmp_path, pool)
    markers = _upload_here(executor, driver, 1)
    store.delete(markers[STORES[0]])
    _submit(driver, 0)
    assert driver.committer.poll() == 0
    assert driver.log.read_latest(QID) is None


def test_the_driver_sidecar_hands_its_reports_to_its_committer(tmp_path: Path) -> None:
    """A real driver sidecar (local master: it uploads the stores and commits): the batch's report
    and SnapshotIndex its upload loop wrote reach its committer in memory, and the checkpoint of the
    batch is written without fetching either."""
    store = RecordingStore(tmp_path / "blobs")
    rig = build_rig(tmp_path, 3, 1, store=store)
    staged = make_tree(rig.location / STAGING / "4-0001", {"4.zip": b"zip 4", "3.sst": b"s3"})
    events = rig.sidecar.spool.events_dir
    events.mkdir(parents=True, exist_ok=True)
    (events / _spool_name()).write_bytes(snapshot_event(rig, staged, files=["4.zip", "3.sst"]))
    assert rig.sidecar.uploads.upload_once()
    (marker,) = (r.marker for r in read_reports(store, RIG_QID, 4).values())
    progress = rig.sidecar.progress_dir
    progress.mkdir(parents=True, exist_ok=True)
    make_tree(rig.location, {"offsets": {"3": b"o3"}, "commits": {"3": b"c3"}})
    (progress / _spool_name()).write_bytes(progress_bytes(rig, batchId=3))
    store.got.clear()
    rig.sidecar.commits.commit_once()
    latest = rig.sidecar.log.read_latest(RIG_QID)
    assert latest is not None and latest.batch_id == 3
    assert latest.marker(BLOBSTORE_BACKEND, KEY) == marker
    fetched = [b for b in store.got if b.startswith(reports_prefix(RIG_QID)) or b == marker]
    assert fetched == [], fetched


def _spool_name() -> str:
    """A file name the spool lists (`<20 digits>-<uuid>.json`, runtime/spool)."""
    return f"{time.time_ns():020d}-{uuid.uuid4()}.json"


def test_reports_all_written_here_are_not_listed(tmp_path: Path, pool: TransferPool) -> None:
    """With a local master every store's report of a batch was written by the committer's own sidecar:
    the batch is checkpointed from those without listing the store's reports of the version."""
    store, executor, driver = _rig(tmp_path, pool)
    markers = _upload_here(executor, driver, 1)
    _submit(driver, 0)
    assert driver.committer.poll() == 1
    latest = driver.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 0
    assert {k: m for k, m in latest.markers(BLOBSTORE_BACKEND).items() if k in STORES} == markers
    assert reports_prefix(QID, 1) not in store.listed, store.listed


class DriverGatedStore(RecordingStore):
    """Asking whether a SnapshotIndex of a state store exists waits (at most GATE_SECONDS) until a blob
    of the `_driver` snapshot was put: the marker checks can only end early if that snapshot goes up
    beside them."""

    GATE_SECONDS = 5.0

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.driver_put = threading.Event()
        self.waited_out = False

    def put(self, blob_id: str, *args: Any, **kwargs: Any) -> None:
        super().put(blob_id, *args, **kwargs)
        if f"/{DRIVER_STORE}/" in blob_id:
            self.driver_put.set()

    def exists(self, blob_id: str) -> bool:
        of_a_state_store = blob_id.startswith("indexes/") and f"/{DRIVER_STORE}/" not in blob_id
        if of_a_state_store and not self.driver_put.wait(self.GATE_SECONDS):
            self.waited_out = True
            self.driver_put.set()  # once is enough to tell
        return super().exists(blob_id)


def test_the_driver_snapshot_goes_up_while_the_markers_are_checked(
    tmp_path: Path, pool: TransferPool
) -> None:
    store = DriverGatedStore(tmp_path / "blobs")
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri())
    cplog.create_resources()
    executor = Executor(store, pool, QID, tmp_path / "ex")
    driver = Driver(store, cplog, pool, QID, tmp_path / "dr")
    _upload_here(executor, driver, 1)
    _submit(driver, 0)
    assert driver.committer.poll() == 1
    assert not store.waited_out, "the markers were checked before the _driver snapshot went up"
    latest = cplog.read_latest(QID)
    assert latest is not None and latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE) is not None


class BatchDeletingStore(LocalBlobStore):
    """The local store as a store whose service deletes many blobs per request (S3's DeleteObjects):
    records each batch delete_many asks for and each single delete."""

    delete_batch_size = 1000

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.batches: list[list[str]] = []
        self.singles: list[str] = []

    def delete(self, blob_id: str) -> None:
        self.singles.append(blob_id)
        super().delete(blob_id)

    def delete_many(self, blob_ids: Iterable[str]) -> None:
        ids = list(blob_ids)
        self.batches.append(ids)
        for b in ids:
            super().delete(b)


def test_a_checkpoints_cleanup_deletes_every_stores_blobs_in_one_request(
    tmp_path: Path, pool: TransferPool
) -> None:
    """What a checkpoint replaced, in every store, goes in one batch delete (not a request per blob and
    store); the batch's reports in another: requests scale with what changed, not with the stores."""
    store = BatchDeletingStore(tmp_path / "blobs")
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri())
    cplog.create_resources()
    executor = Executor(store, pool, QID, tmp_path / "ex")
    driver = Driver(store, cplog, pool, QID, tmp_path / "dr")
    executor.upload(1)
    _submit(driver, 0)
    assert driver.committer.poll() == 1
    first = {s: executor.markers[(s, 1)] for s in STORES}
    executor.upload(2)
    store.batches.clear()
    _submit(driver, 1)
    assert driver.committer.poll() == 1
    assert store.singles == []
    replaced = [b for b in store.batches if set(first.values()) <= set(b)]
    # One request held both stores' replaced indexes (and the files the new snapshots removed).
    assert len(replaced) == 1, store.batches
    assert not any(store.exists(m) for m in first.values())
    reports = [b for b in store.batches if b and all(x.startswith(reports_prefix(QID)) for x in b)]
    assert len(reports) == 1 and len(reports[0]) == len(STORES), store.batches


def test_a_batch_delete_counts_one_request_per_batch(tmp_path: Path) -> None:
    """delete_many counts as the requests the store makes: one per `delete_batch_size` blobs."""
    metrics = Metrics(CollectorRegistry())
    store = CountingBlobStore(BatchDeletingStore(tmp_path / "blobs"), metrics.blob_requests)
    store.ensure_ready()
    for i in range(3):
        store.inner.put_bytes(f"b/{i}", b"x")
    store.delete_batch_size = 2
    store.delete_many(f"b/{i}" for i in range(3))
    assert list(store.list("b/")) == []
    deletes = [
        s["value"]
        for s in metrics.samples()
        if s["name"] == "ssb_blob_requests_total" and s["labels"]["op"] == "delete"  # type: ignore[index]
    ]
    assert deletes == [2.0]
