"""Two attempts of one application are fenced from each other like two applications (issue 21).

On YARN (cluster mode) every attempt of an application keeps its `spark.app.id`, and an executor of
attempt 1 may still run beside attempt 2's. Each side here is a real sidecar built from the conf its
JVM would hand it (`spark.app.id`, `spark.app.attempt.id` and the `spark.statebackend.*` keys), in
the spool dir of its own attempt, on one local blob store and one file checkpoint log; what the shim
does at a commit (stage a version, publish its event) is tests/staging.py, and a finished batch is
handed to the committer as the JVM listener's progress event would be.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
from spark_statebackend.checkpoints.logs import CheckpointFencedError
from spark_statebackend.lifecycle.reports import read_reports
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX
from tests.staging import stage_version

APP = "application_1700000000000_0001"
QID = "8d0b6c1e-2f4a-4b7e-9c35-61a2e4f0d7b3"
STORE = "0/0/default"


def _conf(tmp: Path, attempt: str | None) -> dict[str, str]:
    conf = {
        PREFIX + "blobStore.url": (tmp / "blobs").as_uri(),
        PREFIX + "checkpointLog.url": (tmp / "log").as_uri(),
        PREFIX + "checkpointLog.options.fsync": "false",
        "spark.app.id": APP,
    }
    if attempt is not None:
        conf["spark.app.attempt.id"] = attempt
    return conf


SidecarOf = Callable[[str, str], Sidecar]


@pytest.fixture
def sidecar_of(tmp_path: Path) -> Iterator[SidecarOf]:
    """`sidecar_of(attempt, executor_id)`: the sidecar of that executor of that attempt (the driver's,
    executor id "driver", runs the attempt's committer), in its attempt's spool dir."""
    made: list[Sidecar] = []

    def make(attempt: str, executor_id: str) -> Sidecar:
        conf = _conf(tmp_path, attempt)
        identity = sp.conf_app_identity(conf)
        sidecar = Sidecar.from_conf(
            sp.Spool(sp.executor_spool_dir(tmp_path / "spool", identity, executor_id)), executor_id, conf
        )
        made.append(sidecar)
        sidecar.store.ensure_ready()
        sidecar.log.create_resources()
        sidecar.spool.events_dir.mkdir(parents=True, exist_ok=True)
        return sidecar

    try:
        yield make
    finally:
        for s in made:
            s.close()


def _finish_batch(sidecar: Sidecar, root: Path, batch_id: int) -> int:
    """Spark finished `batch_id` on checkpoint location `root` (one store instance): its driver files,
    then the progress event to the sidecar's committer, polled once; returns the batches committed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(f'{{"id":"{QID}"}}\n')
    for sub in ("offsets", "commits"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / str(batch_id)).write_text(f"v1\n{batch_id}\n")
    sidecar.committer.submit(
        ProgressEvent(
            query_id=QID,
            query_name="attempts",
            checkpoint_root=root,
            batch_id=batch_id,
            input_offsets={"src": str(batch_id)},
            state_store_instances=1,
            batch_end_ms=int(time.time() * 1000),
        )
    )
    return sidecar.committer.poll()


def _upload(sidecar: Sidecar, root: Path, version: int) -> Path:
    """The shim of `sidecar`'s attempt committed `version` of the store: stage it, let the sidecar
    upload it; returns the staged dir (gone once the sidecar is done with it)."""
    staged = stage_version(sidecar, root, QID, 0, version)
    assert sidecar.uploads.upload_once()
    return staged


def test_each_attempt_has_an_identity_and_spool_dir_of_its_own(tmp_path: Path) -> None:
    # Without attempts (every cluster manager but YARN's cluster mode) the identity is the app id, so
    # spool dirs, reports and checkpoints are exactly what they were before attempts were told apart.
    assert sp.conf_app_identity(_conf(tmp_path, None)) == APP
    assert sp.conf_app_identity(_conf(tmp_path, " ")) == APP
    assert sp.app_identity("", "2") == ""
    first, second = (sp.conf_app_identity(_conf(tmp_path, a)) for a in ("1", "2"))
    assert (first, second) == (f"{APP}.attempt-1", f"{APP}.attempt-2")
    root = tmp_path / "spool"
    dirs = {sp.executor_spool_dir(root, identity, "1") for identity in (APP, first, second)}
    assert len(dirs) == 3 and all(d.parent.parent == root.absolute() for d in dirs)
    # An attempt id is made path-safe: the identity stays one path component.
    odd = sp.app_identity(APP, "../2")
    assert "/" not in odd and sp.sanitize_id(odd) == odd


def test_a_later_attempt_never_takes_an_earlier_attempts_reports(
    sidecar_of: SidecarOf, tmp_path: Path
) -> None:
    old, new = sidecar_of("1", "driver"), sidecar_of("2", "driver")
    assert (old.app_id, new.app_id) == (f"{APP}.attempt-1", f"{APP}.attempt-2")
    assert old.spool.dir != new.spool.dir
    root = tmp_path / "cp"

    # A zombie executor of attempt 1 uploads version 1 of the store: its report carries attempt 1.
    _upload(old, root, 1)
    (zombie,) = read_reports(old.store, QID, 1).values()
    assert zombie.app_id == f"{APP}.attempt-1"

    # Attempt 2 finished batch 0 (state version 1): the zombie's report is not its executors'.
    assert _finish_batch(new, root, 0) == 0
    assert new.log.read_latest(QID) is None

    # Its own executor's upload of version 1 is what goes into the checkpoint.
    _upload(new, root, 1)
    assert new.committer.poll() == 1
    latest = new.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 0
    assert latest.writer_app_id == f"{APP}.attempt-2"
    assert latest.marker(BLOBSTORE_BACKEND, STORE) != zombie.marker


def test_an_earlier_attempt_is_fenced_once_a_later_one_has_checkpointed(
    sidecar_of: SidecarOf, tmp_path: Path
) -> None:
    old, new = sidecar_of("1", "driver"), sidecar_of("2", "driver")
    root = tmp_path / "cp"
    # Attempt 1 checkpoints batch 0; its executor uploads version 2, against that checkpoint.
    _upload(old, root, 1)
    assert _finish_batch(old, root, 0) == 1
    _upload(old, root, 2)

    # Attempt 2 takes over and checkpoints batch 1 from its own upload of version 2.
    _upload(new, root, 2)
    assert _finish_batch(new, root, 1) == 1
    latest = new.log.read_latest(QID)
    assert latest is not None and latest.writer_app_id == f"{APP}.attempt-2"

    # Attempt 1's executor, which had uploaded against its own attempt's checkpoint, uploads nothing
    # more for the query: no report, and the staged version is dropped (its commits block on the lag).
    staged = _upload(old, root, 3)
    assert read_reports(old.store, QID, 3) == {}
    assert not staged.exists()

    # Another executor of attempt 1 (it never saw a checkpoint of its own attempt) still reports
    # version 3; attempt 1's committer sees attempt 2's checkpoint before it writes: fenced for good.
    other = sidecar_of("1", "1")
    _upload(other, root, 3)
    (late,) = read_reports(old.store, QID, 3).values()
    assert late.app_id == f"{APP}.attempt-1"
    with pytest.raises(CheckpointFencedError, match=f"{APP}.attempt-2"):
        _finish_batch(old, root, 2)
    assert QID in old.committer.fenced

    # Attempt 2 goes on checkpointing, from its own uploads only.
    _upload(new, root, 3)
    assert _finish_batch(new, root, 2) == 1
    latest = new.log.read_latest(QID)
    assert latest is not None and latest.batch_id == 2 and latest.writer_app_id == f"{APP}.attempt-2"
    assert latest.marker(BLOBSTORE_BACKEND, STORE) != late.marker
