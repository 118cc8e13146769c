"""Zombie drivers (SAMZA-2787): an old committer that wakes up beside a new one for the same query must
neither commit nor delete anything the new one references. Real logs, one real local blob store."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointV2
from spark_statebackend.checkpoints.logs import CheckpointFencedError, CheckpointLog, open_checkpoint_log
from spark_statebackend.checkpoints.logs.file import FileCheckpointLog
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import Driver, Executor, assert_restorable, closure
from tests.servers.tansu import KafkaBroker

Opener = Callable[[], CheckpointLog]


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    with TransferPool(4, name="ssb-test-zombies") as p:
        yield p


@pytest.fixture(params=["file", "kafka"])
def open_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens independent instances (one per driver) of one checkpoint log."""
    opened: list[CheckpointLog] = []
    if request.param == "file":
        url, opts = (tmp_path / "log").as_uri(), {"fsync": "false"}
    else:
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        topic = f"zombie-{uuid.uuid4().hex[:10]}"
        url = f"kafka://{broker.bootstrap}/{topic}"
        opts = {
            "replication.factor": "1",
            "transactional.id.prefix": f"test-{topic}-",
            "write.timeout.ms": "10000",
            "read.timeout.ms": "10000",
            "admin.timeout.ms": "10000",
        }

    def make() -> CheckpointLog:
        log = open_checkpoint_log(url, opts)
        log.create_resources()
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def listing(store: LocalBlobStore) -> set[str]:
    return {b.blob_id for b in store.list("")}


def test_fenced_zombie_commits_nothing_deletes_nothing(
    open_log: Opener, local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    qid = str(uuid.uuid4())
    old_exec = Executor(local_store, pool, qid, tmp_path / "old-exec", seed=1, app_id="app-old")
    old = Driver(local_store, open_log(), pool, qid, tmp_path / "old", app_id="app-old")
    for b in range(3):
        old_exec.upload(b + 1)
        assert old.finish_batch(b) == 1

    # The old driver pauses; a new driver for the same query starts, restores, and commits batch 3.
    new_log = open_log()
    new_exec = Executor(local_store, pool, qid, tmp_path / "new-exec", seed=2, app_id="app-new")
    latest = new_log.read_latest(qid)
    assert latest is not None and latest.batch_id == 2
    new_exec.take_over(latest, pool)
    new = Driver(local_store, new_log, pool, qid, tmp_path / "new", app_id="app-new")
    new_exec.upload(4)
    assert new.finish_batch(3) == 1
    before = listing(local_store)
    new_refs = closure(local_store, [new_log.read_latest(qid)])  # type: ignore[list-item]

    # The old driver wakes up: its executor uploads version 5, its committer tries batch 4.
    old_exec.upload(5)
    with pytest.raises(CheckpointFencedError):
        old.finish_batch(4)
    assert qid in old.committer.fenced
    # Its sidecar process knows (runtime/ownership.py): its plans of the query stop too. The file log
    # shows the new driver's checkpoint; Kafka refuses the zombie's writer before any read.
    takeover = old.committer.ownership.takeover(qid)
    assert takeover is not None and takeover.owner in ("app-new", ""), takeover
    after = listing(local_store)
    assert before <= after, f"the zombie deleted {sorted(before - after)}"
    assert new_refs <= after
    # It stays out: a later batch is not even queued.
    assert old.finish_batch(5) == 0 and old.committer.pending() == 0

    # The new driver carries on; every checkpoint it keeps restores exactly.
    for b in range(4, 7):
        new_exec.upload(b + 1)
        assert new.finish_batch(b) == 1
    history = new_log.read_history(qid)
    assert history[-1].batch_id == 6
    assert all(not old_marker_in(cp, old_exec) for cp in history if cp.batch_id >= 3)
    # retainCheckpoints=1: the latest is the one promised restorable (Kafka may still show older ones).
    expected = {**old_exec.expected, **new_exec.expected}
    assert_restorable(local_store, pool, history[-1], expected, tmp_path / "restored")


def old_marker_in(cp: CheckpointV2, executor: Executor) -> bool:
    """Whether `cp` names a snapshot the (zombie) executor uploaded after the takeover."""
    zombie = {m for (_, v), m in executor.markers.items() if v >= 4}
    return bool(zombie & set(cp.markers(BLOBSTORE_BACKEND).values()))


class PausingLog(FileCheckpointLog):
    """A real file log that runs `after_write` once, right after a successful write: the moment a
    driver pauses between its checkpoint write and its cleanup."""

    after_write: Callable[[], None] | None = None

    def write(self, checkpoint: CheckpointV2) -> None:
        super().write(checkpoint)
        hook, self.after_write = self.after_write, None
        if hook is not None:
            hook()


def test_zombie_whose_write_landed_skips_cleanup_once_a_newer_driver_committed(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    qid = str(uuid.uuid4())
    root = tmp_path / "log"
    old_log = PausingLog(root, {"fsync": "false"})
    old_log.create_resources()
    old_exec = Executor(local_store, pool, qid, tmp_path / "old-exec", seed=3, app_id="app-old")
    old = Driver(local_store, old_log, pool, qid, tmp_path / "old", app_id="app-old")
    for b in range(2):
        old_exec.upload(b + 1)
        assert old.finish_batch(b) == 1
    new_state: dict[str, object] = {}

    def new_driver_takes_over() -> None:
        new_log = FileCheckpointLog(root, {"fsync": "false"})
        new_exec = Executor(local_store, pool, qid, tmp_path / "new-exec", seed=4, app_id="app-new")
        latest = new_log.read_latest(qid)
        assert latest is not None and latest.batch_id == 2  # the old driver's write landed
        new_exec.take_over(latest, pool)
        new = Driver(local_store, new_log, pool, qid, tmp_path / "new", app_id="app-new")
        new_exec.upload(4)
        assert new.finish_batch(3) == 1
        new_state.update(log=new_log, exec=new_exec, blobs=listing(local_store), cleanups=cleanups())

    def cleanups() -> float:
        """How much cleanup work the OLD committer has done (TTL removals and deletes, all stores)."""
        m = old.committer.metrics
        return sum(
            m.value(name, query=qid)
            for name in ("ssb_cleanup_ttls_removed_total", "ssb_cleanup_blobs_deleted_total")
        )

    assert cleanups() > 0  # the metric this test relies on does count the old driver's cleanups
    old_log.after_write = new_driver_takes_over
    old_exec.upload(3)
    with caplog.at_level(logging.ERROR, logger="spark_statebackend.commit"):
        assert old.finish_batch(2) == 1  # written, then paused; the new driver committed meanwhile
    assert any("zombie" in r.getMessage() for r in caplog.records)
    # The old driver's cleanup did not run at all, and it deleted nothing.
    assert cleanups() == new_state["cleanups"]
    assert new_state["blobs"] <= listing(local_store)  # type: ignore[operator]
    new_log = new_state["log"]
    assert isinstance(new_log, FileCheckpointLog)
    latest = new_log.read_latest(qid)
    assert latest is not None and latest.batch_id == 3
    new_exec = new_state["exec"]
    assert isinstance(new_exec, Executor)
    assert_restorable(
        local_store, pool, latest, {**old_exec.expected, **new_exec.expected}, tmp_path / "restored"
    )
    # And the old driver is fenced from now on.
    old_exec.upload(5)
    with pytest.raises(CheckpointFencedError):
        old.finish_batch(4)
