"""Changelogs uploaded while Spark writes them (runtime/changelog_streams.py): the chunks go up as the
file grows, the upload of the committed version takes them as the start of its changelog when the
staged file is the very file they were read from, and restores the exact bytes; anything else uploads
the whole changelog. A real local blob store and real files, written and linked as the JVM does (the
writer's temporary file, hard-linked into a staging dir, renamed into place at close); no Spark: the
Spark test in tests/system/test_spark_changelog.py runs the JVM half.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.common.metrics import Metrics
from spark_statebackend.engine.backup import BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner, load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.changelog_streams import ChangelogStreams
from spark_statebackend.stores.local import LocalBlobStore

QID = "6f1c2f0e-0000-4000-8000-000000000003"
KEY = "0/3/default"
CHUNK = 1024


class Rig:
    """One store's dir, its staging area, a spool and a ChangelogStreams over a local blob store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / "ckpt" / "state" / "0" / "3"
        self.store_dir.mkdir(parents=True)
        self.staging = root / "ckpt" / "_statebackend" / "staging" / "app" / "0" / "3" / "default"
        self.spool = sp.Spool(root / "spool")
        self.spool.streams_dir.mkdir(parents=True)
        self.blobs = LocalBlobStore(root / "blobs", fsync=False)
        self.blobs.ensure_ready()
        self.metrics = Metrics()
        self.streams = ChangelogStreams(
            self.spool, self.blobs, self.metrics, chunk_size=CHUNK, ttl_seconds=3600.0, max_age_seconds=600.0
        )

    def open_writer(self, version: int, tag: str = "w") -> Path:
        """Spark opens `<version>.changelog` (its temporary file) and the JVM publishes a stream of it."""
        writing = self.store_dir / f".{version}.changelog.{tag}.tmp"
        writing.touch()
        link_dir = self.staging / f"{version}-s{tag}"
        link_dir.mkdir(parents=True)
        os.link(writing, link_dir / f"{version}.changelog")
        doc = sp.ChangelogStream(
            QID, self.root / "ckpt", 0, 3, "default", version, link_dir, f"{version}.changelog", "driver", 1
        )
        sp.atomic_write_json(self.spool.streams_dir / f"{sp.new_file_stem()}.json", doc.to_json())
        return writing

    def commit(self, writing: Path, version: int, *, same_file: bool = True) -> sp.SnapshotEvent:
        """The writer's close renames the file into place; the JVM stages it (a hard link) and publishes
        the event. `same_file=False`: the staged file is a copy (another inode)."""
        final = self.store_dir / f"{version}.changelog"
        os.replace(writing, final)
        staged = self.staging / f"{version}-c0ffee"
        staged.mkdir(parents=True)
        if same_file:
            os.link(final, staged / final.name)
        else:
            shutil.copyfile(final, staged / final.name)
        return sp.SnapshotEvent(
            QID, version - 1, self.root / "ckpt", self.store_dir, 0, 3, "default", version, None, staged,
            (final.name,), "driver", 1, 0, snapshot_version=0, changelog_versions=(version,),
        )  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.streams.close()


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    with TransferPool(2) as p:
        yield p


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _stream_blob_ids(blobs: LocalBlobStore) -> list[str]:
    return sorted(b.blob_id for b in blobs.list(f"files/{QID}/{KEY}/"))


def test_complete_chunks_go_up_while_written_and_the_commit_uploads_only_the_rest(
    rig: Rig, pool: TransferPool, tmp_path: Path
) -> None:
    data = os.urandom(3 * CHUNK + 500)
    writing = rig.open_writer(5)
    _append(writing, data[:2500])
    assert rig.streams.turn()
    assert len(_stream_blob_ids(rig.blobs)) == 2  # 2 complete chunks; the partial third waits
    assert rig.streams.due_in() is not None  # a stream is open: its sizes are looked at
    _append(writing, data[2500:])
    rig.streams.turn()
    assert len(_stream_blob_ids(rig.blobs)) == 3
    assert rig.metrics.value("ssb_changelog_stream_bytes_total") == 3 * CHUNK

    ev = rig.commit(writing, 5)
    taken = rig.streams.take(QID, ev)
    assert [p.end for p in taken.values()] == [3 * CHUNK]
    assert rig.streams.due_in() is None  # nothing open: the thread waits for documents only
    assert not (rig.staging / "5-sw").exists() and rig.spool.pending_streams() == []
    assert rig.metrics.value("ssb_changelog_streams_total", result="used") == 1

    manager = BackupManager(rig.blobs, pool, owner=SnapshotOwner(QID))
    marker = manager.upload("v5", {KEY: ev.staged_dir}, uploaded={KEY: taken})[KEY]
    index = load_snapshot_index(rig.blobs, marker)
    (_, f) = next(index.dir_index.walk_files())
    assert [b.blob_id for b in f.blobs[:3]] == [b.blob_id for b in taken["5.changelog"].blobs]
    assert (f.blobs[-1].offset, f.blobs[-1].size) == (3 * CHUNK, 500)  # only the rest went up now
    RestoreManager(rig.blobs, pool).restore(marker, tmp_path / "restored")
    assert (tmp_path / "restored" / "5.changelog").read_bytes() == data


def test_a_staged_changelog_that_is_not_the_streamed_file_uploads_whole(
    rig: Rig, pool: TransferPool, tmp_path: Path
) -> None:
    data = os.urandom(2 * CHUNK + 1)
    writing = rig.open_writer(4)
    _append(writing, data)
    rig.streams.turn()
    ev = rig.commit(writing, 4, same_file=False)
    assert rig.streams.take(QID, ev) == {}
    assert rig.metrics.value("ssb_changelog_streams_total", result="dropped") == 1
    marker = BackupManager(rig.blobs, pool, owner=SnapshotOwner(QID)).upload("v4", {KEY: ev.staged_dir})[KEY]
    (_, f) = next(load_snapshot_index(rig.blobs, marker).dir_index.walk_files())
    assert len(f.blobs) == 1  # whole, as every file of a local store
    RestoreManager(rig.blobs, pool).restore(marker, tmp_path / "restored")
    assert (tmp_path / "restored" / "4.changelog").read_bytes() == data


def test_streams_of_older_versions_and_late_documents_are_dropped(rig: Rig) -> None:
    old = rig.open_writer(6, "old")  # a failed attempt's writer: never committed
    _append(old, os.urandom(CHUNK))
    rig.streams.turn()
    writing = rig.open_writer(7)
    _append(writing, os.urandom(CHUNK + 1))
    rig.streams.turn()
    rig.streams.take(QID, rig.commit(writing, 7))
    assert not (rig.staging / "6-sold").exists() and not (rig.staging / "7-sw").exists()
    late = rig.open_writer(7, "late")  # a document the thread reads after version 7 went up
    _append(late, os.urandom(CHUNK))
    rig.streams.turn()
    assert not (rig.staging / "7-slate").exists() and rig.spool.pending_streams() == []
    assert rig.streams.due_in() is None


def test_a_stream_whose_link_is_a_symlink_or_outside_staging_is_not_read(rig: Rig, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(4 * CHUNK))
    link_dir = rig.staging / "8-sym"
    link_dir.mkdir(parents=True)
    (link_dir / "8.changelog").symlink_to(secret)
    doc = sp.ChangelogStream(QID, rig.root / "ckpt", 0, 3, "default", 8, link_dir, "8.changelog", "driver", 1)
    sp.atomic_write_json(rig.spool.streams_dir / f"{sp.new_file_stem()}.json", doc.to_json())
    outside = sp.ChangelogStream(QID, rig.root / "ckpt", 0, 3, "default", 8, tmp_path, "8.changelog", "d", 1)
    bad = sp.atomic_write_json(rig.spool.streams_dir / f"{sp.new_file_stem()}.json", outside.to_json())
    rig.streams.turn()
    assert _stream_blob_ids(rig.blobs) == []  # nothing of the secret went up
    assert secret.exists() and tmp_path.is_dir()  # the hostile document's dir was not removed
    assert (rig.spool.streams_dir / sp.BAD_DIR / bad.name).exists()  # quarantined, named in the log
    assert not link_dir.exists()


def test_streaming_off_drops_documents_and_uploads_nothing(rig: Rig) -> None:
    off = ChangelogStreams(
        rig.spool, rig.blobs, rig.metrics, chunk_size=0, ttl_seconds=1.0, max_age_seconds=1.0
    )
    writing = rig.open_writer(2)
    _append(writing, os.urandom(3 * CHUNK))
    off.turn()
    assert _stream_blob_ids(rig.blobs) == [] and rig.spool.pending_streams() == []


def test_a_stream_whose_writer_was_cancelled_is_dropped_at_once(rig: Rig) -> None:
    """A cancelled writer (a failed or killed task): Spark deletes its file and the shim the link
    (StoreHooks.Watched.cancel); the stream goes at the next look, so the executor no longer counts as
    writing (the builds' wait) and nothing of it is held on disk."""
    writing = rig.open_writer(3)
    _append(writing, os.urandom(CHUNK + 10))
    rig.streams.turn()
    assert rig.streams.writing()
    writing.unlink()
    shutil.rmtree(rig.staging / "3-sw")
    assert rig.streams.turn()
    assert not rig.streams.writing() and rig.spool.pending_streams() == []
    assert rig.metrics.value("ssb_changelog_streams_total", result="dropped") == 1


def test_a_changelog_under_one_chunk_goes_up_whole_at_its_commit(rig: Rig) -> None:
    writing = rig.open_writer(2)
    _append(writing, os.urandom(CHUNK - 1))
    rig.streams.turn()
    assert rig.streams.take(QID, rig.commit(writing, 2)) == {}
    assert _stream_blob_ids(rig.blobs) == []
    assert rig.metrics.value("ssb_changelog_streams_total", result="short") == 1
