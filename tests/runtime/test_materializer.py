"""Snapshots built from changelogs after an upload (runtime/materializer.py, spark/materialize.py): the
changelogs here are written in Spark's format by `_changelog` (lz4-java block framing around Spark's
record formats), the build runs for real (a child process, rocksdict); the Spark tests in
tests/system/ prove Spark loads what it builds."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Any

import lz4.block
import orjson
import pytest

from spark_statebackend.common.metrics import Metrics
from spark_statebackend.runtime.materializer import Materializer
from spark_statebackend.runtime.spool import SnapshotEvent
from spark_statebackend.spark.changelogs import ChangelogError, Record, changelog_records
from tests.runtime.test_spool import make_event

QID = "6f1c2f0e-0000-4000-8000-000000000001"


def _frame(payload: bytes, compress: bool) -> bytes:
    """One lz4-java block (compressed or raw) and the end mark, as LZ4BlockOutputStream writes them."""
    body = lz4.block.compress(payload, store_size=False) if compress else payload
    token = 0x20 if compress else 0x10
    block = b"LZ4Block" + bytes([token]) + struct.pack("<iii", len(body), len(payload), 0) + body
    return block + b"LZ4Block" + bytes([0x10]) + struct.pack("<iii", 0, 0, 0)


def spark_changelog(
    records: list[tuple[str, bytes, bytes | None]], *, v2: bool, compress: bool = True
) -> bytes:
    """Records in Spark's changelog format (v1 or v2), lz4-java framed as Spark writes them."""
    out = bytearray(b"\x00\x02v2" if v2 else b"")
    for kind, key, value in records:
        if v2:
            out += bytes([{"put": 1, "delete": 16, "delete_range": 32}[kind]])
        out += struct.pack(">i", len(key)) + key
        out += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    out += b"\x00" if v2 else struct.pack(">i", -1)
    return _frame(bytes(out), compress)


def test_every_record_kind_of_both_formats_is_read() -> None:
    recs = [("put", b"a", b"1"), ("put", b"b", b"2"), ("delete", b"a", None), ("delete_range", b"c", b"e")]
    assert list(changelog_records(spark_changelog(recs, v2=True), "v2")) == [Record(*r) for r in recs]
    v1 = [("put", b"k", b"v"), ("delete", b"k", None)]
    assert list(changelog_records(spark_changelog(v1, v2=False, compress=False), "v1")) == [
        Record(*r) for r in v1
    ]
    with pytest.raises(ChangelogError, match=r"7\.changelog: merge records"):
        list(changelog_records(_frame(b"\x00\x02v2\x11" + b"\x00" * 8, True), "7.changelog"))
    with pytest.raises(ChangelogError, match=r"x\.changelog: not an lz4 block stream"):
        list(changelog_records(b"gzip?", "x.changelog"))


def _metadata(zip_path: Path) -> dict[str, object]:
    with zipfile.ZipFile(zip_path) as zf:
        head, _, body = zf.read("metadata").decode().partition("\n")
    assert head == "v1"
    meta: dict[str, object] = orjson.loads(body)
    return meta


def test_a_build_after_an_upload_publishes_the_snapshot_and_counts_it(tmp_path: Path) -> None:
    ev = make_event(tmp_path, version=3, snapshot_version=0, changelog_versions=(1, 2, 3))
    store = ev.dfs_dir
    store.mkdir(parents=True)
    (store / "1.changelog").write_bytes(spark_changelog([("put", b"a", b"1"), ("put", b"b", b"2")], v2=False))
    (store / "2.changelog").write_bytes(
        spark_changelog([("put", b"c", b"3"), ("delete", b"a", None)], v2=False)
    )
    (store / "3.changelog").write_bytes(spark_changelog([("put", b"d", b"4")], v2=False))
    metrics = Metrics()
    m = Materializer(3, metrics)
    try:
        assert m.offer(QID, make_event(tmp_path, version=3, changelog_versions=(2, 3))) is None  # too few
        assert m.offer(QID, make_event(tmp_path, version=3, spark_unique_id="x")) is None  # format v2
        future = m.offer(QID, ev)
        assert future is not None
        future.result(timeout=120)
        meta = _metadata(store / "3.zip")
        assert meta["numKeys"] == 3 and meta["sstFiles"], meta  # b, c, d
        for sst in meta["sstFiles"]:  # type: ignore[attr-defined]
            assert (store / "SSTs" / sst["dfsSstFileName"]).stat().st_size == sst["sizeBytes"]
        assert metrics.value("ssb_changelog_snapshots_total", result="built") == 1
        # Offered again (the zip is there): nothing is rebuilt.
        again = m.offer(QID, ev)
        assert again is not None
        again.result(timeout=120)
        assert metrics.value("ssb_changelog_snapshots_total", result="exists") == 1
        assert not list((ev.checkpoint_root / "_statebackend" / "materialize").iterdir())
    finally:
        m.close()


def _build_once(every: int, ev: SnapshotEvent, **kwargs: Any) -> tuple[Metrics, Materializer]:
    """A Materializer (`kwargs`: its other arguments) offered `ev` once, its build waited for, then
    closed; its metrics and itself."""
    metrics = Metrics()
    m = Materializer(every, metrics, **kwargs)
    try:
        future = m.offer(QID, ev)
        assert future is not None
        future.result(timeout=120)
    finally:
        m.close()
    return metrics, m


def test_a_build_that_cannot_run_is_logged_and_publishes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ev = make_event(tmp_path, version=2, snapshot_version=0, changelog_versions=(1, 2))
    ev.dfs_dir.mkdir(parents=True)
    (ev.dfs_dir / "2.changelog").write_bytes(spark_changelog([("put", b"a", b"1")], v2=True))  # 1 is missing
    metrics, m = _build_once(2, ev)
    assert metrics.value("ssb_changelog_snapshots_total", result="failed") == 1
    assert not list(ev.dfs_dir.glob("*.zip"))
    warning = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert QID in warning and "store 0/1/default version 2" in warning and "1.changelog missing" in warning
    assert m.offer(QID, ev) is None  # closed


def test_a_symlinked_build_dir_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    ev = make_event(tmp_path, version=1, snapshot_version=0, changelog_versions=(1,))
    ev.dfs_dir.mkdir(parents=True)
    (ev.dfs_dir / "1.changelog").write_bytes(spark_changelog([("put", b"a", b"1")], v2=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ev.checkpoint_root / "_statebackend").symlink_to(elsewhere)
    metrics, _ = _build_once(1, ev)
    assert metrics.value("ssb_changelog_snapshots_total", result="failed") == 1
    assert list(elsewhere.iterdir()) == [] and not list(ev.dfs_dir.glob("*.zip"))


def test_a_build_starts_only_once_the_executor_has_finished_committing(tmp_path: Path) -> None:
    """`busy` (the upload loop's `committing`) holds a build back: the child starts only after busy()
    said False, so the build's CPU, disk writes and upgrade upload stay out of the commits."""
    ev = make_event(tmp_path, version=1, snapshot_version=0, changelog_versions=(1,))
    ev.dfs_dir.mkdir(parents=True)
    (ev.dfs_dir / "1.changelog").write_bytes(spark_changelog([("put", b"a", b"1")], v2=False))
    answers = iter([True, True, False])
    asked: list[bool] = []  # what busy() answered, in order
    built_after: list[int] = []  # how many answers there were when the build ended

    def busy() -> bool:
        asked.append(next(answers, False))
        return asked[-1]

    _build_once(1, ev, on_built=lambda *_: built_after.append(len(asked)), busy=busy)
    assert asked == [True, True, False] and built_after == [3]  # asked until not busy, then built
    assert (ev.dfs_dir / "1.zip").exists()
