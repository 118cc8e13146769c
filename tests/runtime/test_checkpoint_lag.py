"""A query whose checkpoints keep failing is never left running without them (issue 21, deliverable 3).

The driver's committer publishes, per query, when its checkpoints began to fail and the last cause in
`checkpoint-status.json` (runtime/checkpoint_lag.py); the shim holds Spark's commit of the query's next
batch once that lag passes maxCommitDelay and fails it after commitTimeout naming the cause (jvm-bridge
CommitGate.awaitCheckpoints; with real Spark in test_exactly_once.py). Here: a real Committer on a local
blob store and a file log, fed the way the commit loop feeds it (tests/commitrig.py).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import orjson

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.runtime.checkpoint_lag import STATUS_FILE
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import Driver, Executor
from tests.trees import make_tree


def status(spool: Path) -> dict[str, dict[str, object]]:
    return orjson.loads((spool / STATUS_FILE).read_bytes())  # type: ignore[no-any-return]


def rig(tmp_path: Path, pool: TransferPool, **driver: object) -> tuple[str, Executor, Driver, Path]:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    cplog.create_resources()
    qid = str(uuid.uuid4())
    spool = tmp_path / "spool"
    spool.mkdir()
    executor = Executor(store, pool, qid, tmp_path / "exec")
    return qid, executor, Driver(store, cplog, pool, qid, tmp_path / "drv", spool_dir=spool, **driver), spool  # type: ignore[arg-type]


def test_a_query_lags_from_its_first_failed_checkpoint_until_one_is_written(tmp_path: Path) -> None:
    """Batches waiting for their uploads are not a failure; a checkpoint that cannot be written is, and
    the lag runs from the first one until a checkpoint of the query is written."""
    with TransferPool(4, name="ssb-test-lag") as pool:
        qid, executor, driver, spool = rig(tmp_path, pool)
        for b in range(2):
            executor.upload(b + 1)
            assert driver.finish_batch(b) == 1
        assert qid not in status(spool)["oldest_by_query"]

        outside = make_tree(tmp_path / "outside", {"f": b"x"})
        (driver.ckpt / "sources").mkdir()
        (driver.ckpt / "sources" / "link").symlink_to(outside / "f")
        executor.upload(3)
        assert driver.finish_batch(2) == 0  # the _driver snapshot refuses the symlink
        first = status(spool)
        since = first["oldest_by_query"][qid]
        assert isinstance(since, int) and since > 0
        assert "is a symlink" in str(first["cause_by_query"][qid])
        executor.upload(4)
        assert driver.finish_batch(3) == 0
        assert status(spool)["oldest_by_query"][qid] == since  # from the first failure: it only grows

        (driver.ckpt / "sources" / "link").unlink()
        executor.upload(5)
        assert driver.finish_batch(4) == 3  # the pending batches 2 and 3, then 4
        after = status(spool)
        assert qid not in after["oldest_by_query"] and qid not in after["cause_by_query"]


def test_a_batch_given_up_on_keeps_its_query_lagging(tmp_path: Path) -> None:
    """A batch whose stores never all report is dropped after commitTimeout; that must not end the lag
    (the query would otherwise run on with no checkpoint and nothing holding it)."""
    now = [1_000_000.0]
    with TransferPool(4, name="ssb-test-lag") as pool:
        qid, executor, driver, spool = rig(tmp_path, pool)
        driver.committer.clock = lambda: now[0]
        driver.committer.lag.clock = driver.committer.clock
        driver.committer.commit_timeout = 10.0
        executor.upload(1, ["0/0/default"])  # one of the two stores reports
        assert driver.finish_batch(0) == 0
        assert qid not in status(spool)["oldest_by_query"]  # waiting for uploads is not a failure
        now[0] += 11
        assert driver.committer.poll() == 0 and driver.committer.pending() == 0  # given up on
        s = status(spool)
        assert s["oldest_by_query"][qid] == 1_000_011_000
        assert "only 1 of 2" in str(s["cause_by_query"][qid])


def test_a_batch_whose_location_was_deleted_is_dropped_without_lag(tmp_path: Path) -> None:
    """The query stopped and its location was deleted (Spark's temporary location): nothing is left
    to checkpoint or to hold, and the drain at stop does not wait for it."""
    with TransferPool(4, name="ssb-test-lag") as pool:
        qid, executor, driver, spool = rig(tmp_path, pool)
        executor.upload(1)
        root = driver.ckpt
        shutil.rmtree(root)
        driver.committer.submit(
            ProgressEvent(qid, "rig", root, 0, {}, state_store_instances=2, batch_end_ms=0)
        )
        assert driver.committer.poll() == 0 and driver.committer.pending() == 0
        assert qid not in status(spool)["oldest_by_query"]
        assert not root.exists()
