"""A version's uploads wait for the rest of its batch on the executor (batch_hold.BatchHold): the
sidecar no longer reads, writes and fsyncs a batch's first stores while the same host's task threads
still flush the others. Real sidecar, local blob store, file checkpoint log."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.lifecycle.reports import read_reports, read_upgrades
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.batch_hold import BATCH_HOLD_SECONDS
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from tests.staging import stage_version

QID = "0b7e4c1a-52d9-4f61-8a3e-9c2d1e6f7a80"


def _sidecar(tmp: Path, max_commit_delay: str = "60s") -> Sidecar:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp / "log").as_uri(),
            PREFIX + "maxCommitDelay": max_commit_delay,
        }
    )
    sidecar = Sidecar(sp.Spool(tmp / "spool"), "driver", settings)
    sidecar.store.ensure_ready()
    sidecar.log.create_resources()
    sidecar.spool.events_dir.mkdir(parents=True, exist_ok=True)
    return sidecar


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = _sidecar(tmp_path)
    yield s
    s.close()


def _stage(
    sidecar: Sidecar,
    partition: int,
    version: int,
    *,
    age_s: float = 0.0,
    snapshot: int | None = None,
    upgrade: bool = False,
) -> None:
    root = sidecar.spool.dir.parent / "cp"
    at_ms = int((time.time() - age_s) * 1000)
    stage_version(
        sidecar, root, QID, partition, version, staged_at_ms=at_ms, snapshot=snapshot, upgrade=upgrade
    )


def _reported(sidecar: Sidecar, version: int) -> set[str]:
    return set(read_reports(sidecar.store, QID, version))


def _batch(sidecar: Sidecar, version: int, partitions: range) -> None:
    for p in partitions:
        _stage(sidecar, p, version)
    assert sidecar.uploads.upload_once()
    assert _reported(sidecar, version) == {f"0/{p}/default" for p in partitions}


def test_a_version_waits_for_the_rest_of_its_batch_then_goes_up_in_one_group(sidecar: Sidecar) -> None:
    _batch(sidecar, 1, range(3))  # the first batch: nothing known yet, uploaded at once
    _stage(sidecar, 0, 2)
    _stage(sidecar, 1, 2)
    assert not sidecar.uploads.upload_once(), "partition 2 has not committed version 2 yet"
    assert _reported(sidecar, 2) == set()
    assert len(sidecar.spool.pending_events() + sp.claimed(sidecar.spool.events_dir)) == 2, "kept, not lost"
    _stage(sidecar, 2, 2)
    assert sidecar.uploads.upload_once()
    assert _reported(sidecar, 2) == {"0/0/default", "0/1/default", "0/2/default"}


def test_a_store_that_moved_away_holds_the_version_no_longer_than_the_bound(sidecar: Sidecar) -> None:
    _batch(sidecar, 1, range(2))
    _stage(sidecar, 0, 2, age_s=BATCH_HOLD_SECONDS + 0.5)  # partition 1 now commits on another executor
    assert sidecar.uploads.upload_once()
    assert _reported(sidecar, 2) == {"0/0/default"}


def test_a_batch_whose_stores_keep_arriving_is_held_past_the_quiet_bound_but_not_past_the_limit(
    sidecar: Sidecar,
) -> None:
    """A snapshot batch's commits flush one store after another: the first store staged longer ago than
    BATCH_HOLD_SECONDS does not release the version while the others keep coming; half of
    maxCommitDelay (30 s here) after the first does."""
    _batch(sidecar, 1, range(3))
    _stage(sidecar, 0, 2, age_s=BATCH_HOLD_SECONDS + 1)
    _stage(sidecar, 1, 2)  # staged just now: partition 2 is still flushing
    assert not sidecar.uploads.upload_once(), "the batch's stores are still arriving"
    assert _reported(sidecar, 2) == set()
    _stage(sidecar, 2, 2)
    assert sidecar.uploads.upload_once()
    assert _reported(sidecar, 2) == {"0/0/default", "0/1/default", "0/2/default"}
    _stage(sidecar, 0, 3, age_s=31)
    _stage(sidecar, 1, 3)
    assert sidecar.uploads.upload_once(), (
        "a hold never reaches half of maxCommitDelay (the commit gate's bound)"
    )
    assert _reported(sidecar, 3) == {"0/0/default", "0/1/default"}


def test_sparks_snapshot_published_during_a_batch_waits_for_that_batch(sidecar: Sidecar) -> None:
    """Changelog checkpointing: Spark's maintenance thread publishes snapshots whenever its timer fires.
    Uploading one (a whole snapshot's SSTs) while this host's task threads still commit a batch slowed
    those commits (the bench's changelog p99: the snapshot batch's last flushes 2.6x slower), so an
    upgrade waits for the batch being committed, of its own version or a later one. Once its store has
    staged the later version (whose recipe has the snapshot), the upgrade is not uploaded at all."""
    _batch(sidecar, 1, range(3))
    _batch(sidecar, 2, range(3))
    _stage(sidecar, 0, 3, snapshot=2)
    _stage(sidecar, 1, 2, snapshot=2, upgrade=True)  # version 2's snapshot, during batch 3
    assert not sidecar.uploads.upload_once(), "batch 3 is being committed here"
    _stage(sidecar, 0, 3, snapshot=3, upgrade=True)  # version 3's own snapshot, during batch 3
    assert not sidecar.uploads.upload_once(), "partitions 1 and 2 have not committed version 3 yet"
    assert _reported(sidecar, 3) == set() and read_upgrades(sidecar.store, QID, 2) == []
    _stage(sidecar, 1, 3, snapshot=2)
    _stage(sidecar, 2, 3, snapshot=2)
    assert sidecar.uploads.upload_once()
    reports = read_reports(sidecar.store, QID, 3)
    assert set(reports) == {"0/0/default", "0/1/default", "0/2/default"}
    assert read_upgrades(sidecar.store, QID, 2) == [], "superseded by version 3, which holds the snapshot"
    assert read_upgrades(sidecar.store, QID, 3) == [], "0/0's snapshot of 3 is its batch report"

    def files(store: str) -> set[str]:
        index = load_snapshot_index(sidecar.store, reports[store].marker)
        return {name for name, _ in index.dir_index.walk_files()}

    assert files("0/0/default") == {"3.zip"}
    assert files("0/1/default") == {"2.zip", "3.changelog"}
    assert not sidecar.spool.pending_events() and not sp.claimed(sidecar.spool.events_dir)


def test_sparks_snapshot_waits_for_a_batch_no_longer_than_the_limit(sidecar: Sidecar) -> None:
    _batch(sidecar, 1, range(2))
    _batch(sidecar, 2, range(2))
    _stage(sidecar, 1, 2, snapshot=2, upgrade=True, age_s=31)
    _stage(sidecar, 0, 3, snapshot=2)  # batch 3 still being committed: partition 1 has not yet
    assert sidecar.uploads.upload_once(), "half of maxCommitDelay (30 s) after it was published"
    assert [r.store for r in read_upgrades(sidecar.store, QID, 2)] == ["0/1/default"]
    assert _reported(sidecar, 3) == set(), "batch 3 itself still waits for partition 1"


def test_a_store_this_executor_gained_never_holds_a_version(sidecar: Sidecar) -> None:
    _batch(sidecar, 1, range(1))
    _stage(sidecar, 0, 2)
    _stage(sidecar, 1, 2)
    assert sidecar.uploads.upload_once()
    assert _reported(sidecar, 2) == {"0/0/default", "0/1/default"}


def test_a_version_after_a_skipped_one_is_not_held(sidecar: Sidecar) -> None:
    _batch(sidecar, 1, range(2))
    _stage(sidecar, 0, 3)  # version 2 never reached this sidecar: nothing to wait for
    assert sidecar.uploads.upload_once()
    assert _reported(sidecar, 3) == {"0/0/default"}


def test_max_commit_delay_zero_holds_nothing(tmp_path: Path) -> None:
    s = _sidecar(tmp_path, max_commit_delay="0")
    try:
        _batch(s, 1, range(2))
        _stage(s, 0, 2)
        assert s.uploads.upload_once(), "every commit waits for the previous upload: a hold would stall it"
        assert _reported(s, 2) == {"0/0/default"}
    finally:
        s.close()


def test_sparks_snapshot_of_a_version_not_uploaded_yet_goes_up_as_the_batchs_own(sidecar: Sidecar) -> None:
    """Changelog checkpointing: Spark's maintenance publishes the snapshot of version 2 while the
    batch's changelog recipe of it still waits (held, or behind a slow upload). The snapshot wins, and
    it must be reported as the batch's report: an upgrade report alone left the committer waiting for
    ever for that store (the bench's `batch 9 was not checkpointed within 300 s`)."""
    _batch(sidecar, 1, range(2))
    _stage(sidecar, 0, 2, snapshot=1)
    _stage(sidecar, 0, 2, snapshot=2, upgrade=True)
    _stage(sidecar, 1, 2, snapshot=1)
    assert sidecar.uploads.upload_once()
    reports = read_reports(sidecar.store, QID, 2)
    assert set(reports) == {"0/0/default", "0/1/default"}
    names = {
        name
        for name, _ in load_snapshot_index(
            sidecar.store, reports["0/0/default"].marker
        ).dir_index.walk_files()
    }
    assert names == {"2.zip"}, "the snapshot's recipe, not the changelog one"
    assert not sidecar.spool.pending_events() and not sp.claimed(sidecar.spool.events_dir)


def test_sparks_snapshot_alone_is_the_batchs_report_only_where_that_report_is_missing(
    sidecar: Sidecar,
) -> None:
    """The batch's own event went with a sidecar that died (its claimed event lost to the snapshot
    before the crash): the snapshot left alone in the spool is the batch's report for that store. Where
    the batch's report exists, the snapshot stays an upgrade (the committer checkpoints it later)."""
    _batch(sidecar, 1, range(2))
    _stage(sidecar, 1, 2, snapshot=1)
    _stage(sidecar, 0, 2, snapshot=1)
    assert sidecar.uploads.upload_once()
    _stage(sidecar, 1, 2, snapshot=2, upgrade=True)  # reported already: an upgrade
    assert sidecar.uploads.upload_once()
    assert [r.store for r in read_upgrades(sidecar.store, QID, 2)] == ["0/1/default"]
    _stage(sidecar, 0, 3, snapshot=3, upgrade=True)  # no report of version 3 for 0/0: the batch's
    _stage(sidecar, 1, 3, snapshot=1)
    assert sidecar.uploads.upload_once()
    assert set(read_reports(sidecar.store, QID, 3)) == {"0/0/default", "0/1/default"}
    assert read_upgrades(sidecar.store, QID, 3) == []


def test_a_held_batchs_events_are_read_once_whatever_the_turns(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every turn looks at every claimed event while a batch is held (each staged store wakes the loop):
    an event is read from its file once, not at every turn, so a batch of n stores costs n reads."""
    reads: list[Path] = []
    real = sp.read_event

    def counted(path: str | os.PathLike[str]) -> sp.SnapshotEvent:
        reads.append(Path(path))
        return real(path)

    _batch(sidecar, 1, range(4))
    monkeypatch.setattr(sp, "read_event", counted)
    for p in range(3):  # partition 3 has not committed version 2: each turn leaves the batch held
        _stage(sidecar, p, 2)
        assert not sidecar.uploads.upload_once()
    assert len(reads) == 3 and len(set(reads)) == 3, reads
    _stage(sidecar, 3, 2)
    assert sidecar.uploads.upload_once()
    assert len(reads) == 4
    assert _reported(sidecar, 2) == {f"0/{p}/default" for p in range(4)}
