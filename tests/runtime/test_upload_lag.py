"""A sidecar whose uploads fail keeps counting them as lag (issue 6).

The shim's commit gate (CommitGate.java) blocks a store's commit once `status.json` says the oldest
snapshot not yet uploaded was staged more than maxCommitDelay ago, and fails it after commitTimeout.
An upload that failed used to drop its snapshot and clear the status, so with the checkpoint log or
the blob store down for longer than one attempt the query ran on without backups (one batch per
failed attempt). Now a failed upload keeps its snapshot, is retried with backoff, and keeps its
staging time in `status.json` until it succeeds, a newer version supersedes it, or commitTimeout has
passed since it was staged. The fault here is real: the Kafka checkpoint broker (Tansu) is frozen with
SIGSTOP, as a network partition would leave it, and thawed with SIGCONT (its topics live in memory).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson

from spark_statebackend.lifecycle.reports import read_reports
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.runtime.upload_lag import STATUS_FILE
from spark_statebackend.settings import PREFIX, Settings
from tests.servers.process import ServerProcess, freeze, wait_until
from tests.staging import stage_version

QID = "5a1c0e2b-7d44-4c8e-9b1a-3f6e2d7c8a90"


def _sidecar(tmp: Path, bootstrap: str, commit_timeout: str) -> Sidecar:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": f"kafka://{bootstrap}/ssb-lag-{time.time_ns()}",
            PREFIX + "checkpointLog.options.replication.factor": "1",
            PREFIX + "checkpointLog.options.read.timeout.ms": "1000",
            PREFIX + "commitTimeout": commit_timeout,
        }
    )
    sidecar = Sidecar(sp.Spool(tmp / "spool"), "driver", settings)
    sidecar.store.ensure_ready()
    sidecar.log.create_resources()
    sidecar.spool.events_dir.mkdir(parents=True, exist_ok=True)
    return sidecar


def _stage(sidecar: Sidecar, tmp: Path, version: int, staged_at_ms: int) -> Path:
    """What the shim does at a commit: hard-link the version into staging, publish an event."""
    return stage_version(sidecar, tmp / "cp", QID, 0, version, staged_at_ms=staged_at_ms)


def _lag_since(sidecar: Sidecar) -> int | None:
    value = orjson.loads((sidecar.spool.dir / STATUS_FILE).read_bytes())["oldest_upload_staged_at_ms"]
    assert value is None or isinstance(value, int)
    return value


def test_a_failed_upload_stays_lag_and_is_retried_until_the_log_returns(
    tmp_path: Path, private_tansu: ServerProcess
) -> None:
    sidecar = _sidecar(tmp_path, f"127.0.0.1:{private_tansu.port}", "10min")
    try:
        staged_at = int(time.time() * 1000)
        staged = _stage(sidecar, tmp_path, 3, staged_at)
        # The checkpoint log is unreachable: the diff-base check fails.
        freeze(private_tansu.pid)
        assert sidecar.uploads.upload_once()
        assert _lag_since(sidecar) == staged_at, "the failed snapshot must still count as lag"
        assert staged.is_dir() and len(sp.claimed(sidecar.spool.events_dir)) == 1  # kept for a retry
        assert not sidecar.uploads.upload_once(), "retried at once instead of after a backoff"
        wait_until(sidecar.uploads.upload_once, 10, "the second (failing) attempt")
        assert _lag_since(sidecar) == staged_at and not read_reports(sidecar.store, QID, 3)

        os.kill(private_tansu.pid, signal.SIGCONT)
        retried = lambda: sidecar.uploads.upload_once() and bool(read_reports(sidecar.store, QID, 3))  # noqa: E731
        wait_until(retried, 30, "the retried upload")
        assert _lag_since(sidecar) is None
        assert not staged.exists() and not sp.claimed(sidecar.spool.events_dir)
    finally:
        sidecar.close()


def test_a_newer_version_supersedes_a_failed_one_but_not_its_lag(
    tmp_path: Path, private_tansu: ServerProcess
) -> None:
    sidecar = _sidecar(tmp_path, f"127.0.0.1:{private_tansu.port}", "10min")
    try:
        first = int(time.time() * 1000)
        old = _stage(sidecar, tmp_path, 3, first)
        freeze(private_tansu.pid)
        assert sidecar.uploads.upload_once()
        assert _lag_since(sidecar) == first and not read_reports(sidecar.store, QID, 3)
        _stage(sidecar, tmp_path, 4, first + 500)
        os.kill(private_tansu.pid, signal.SIGCONT)
        # Version 4 supersedes 3 and is uploaded (the thawed broker may need more than one attempt).
        uploaded = lambda: sidecar.uploads.upload_once() and bool(read_reports(sidecar.store, QID, 4))  # noqa: E731
        wait_until(uploaded, 30, "the upload of version 4")
        assert (
            not old.exists()
            and read_reports(sidecar.store, QID, 4)
            and not read_reports(sidecar.store, QID, 3)
        )
        assert _lag_since(sidecar) is None
    finally:
        sidecar.close()


def test_a_failed_upload_is_given_up_after_commit_timeout(
    tmp_path: Path, private_tansu: ServerProcess
) -> None:
    """Past commitTimeout the shim has failed the commits waiting on it: the snapshot is dropped and
    stops counting as lag, so a restarted query is not blocked by it."""
    sidecar = _sidecar(tmp_path, f"127.0.0.1:{private_tansu.port}", "2s")
    try:
        staged = _stage(sidecar, tmp_path, 3, int(time.time() * 1000) - 5000)
        freeze(private_tansu.pid)
        assert sidecar.uploads.upload_once()
        assert _lag_since(sidecar) is None
        assert not staged.exists() and not sp.claimed(sidecar.spool.events_dir)
    finally:
        os.kill(private_tansu.pid, signal.SIGCONT)
        sidecar.close()
