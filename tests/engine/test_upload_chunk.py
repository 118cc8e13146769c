"""A chunk upload reads only the file it was planned from: never through a symlink swapped in after the
diff (or the stream's lstat), never a FIFO (without blocking), never another file put under the name."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from spark_statebackend.engine.checksum import checksum_range
from spark_statebackend.engine.transfer import NoProgress, PlannedChunk, upload_chunk
from spark_statebackend.errors import UnsafePathError
from spark_statebackend.stores import open_blob_store


def _chunk(path: Path, inode: int | None, blob_id: str = "files/a") -> PlannedChunk:
    return PlannedChunk(0, path, blob_id, 2, 5, inode)


def _get(store_url: str, blob_id: str) -> bytes:
    out = io.BytesIO()
    open_blob_store(store_url).get(blob_id, out)
    return out.getvalue()


@pytest.fixture
def planned(tmp_path: Path) -> tuple[Path, int, str]:
    src = tmp_path / "staged"
    src.mkdir()
    f = src / "9.changelog"
    f.write_bytes(b"0123456789")
    return f, os.lstat(f).st_ino, (tmp_path / "store").as_uri()


def test_the_planned_file_is_uploaded_with_the_checksum_of_its_range(planned: tuple[Path, int, str]) -> None:
    f, ino, url = planned
    blob = upload_chunk(open_blob_store(url), _chunk(f, ino), {}, None, NoProgress())
    assert _get(url, "files/a") == b"23456"
    assert (blob.offset, blob.size, blob.checksum) == (2, 5, checksum_range(f, 2, 5))


def test_a_symlink_swapped_in_after_planning_is_not_read(
    planned: tuple[Path, int, str], tmp_path: Path
) -> None:
    f, ino, url = planned
    secret = tmp_path / "secret"
    secret.write_bytes(b"do not upload me")
    f.unlink()
    f.symlink_to(secret)
    store = open_blob_store(url)
    for inode in (ino, None):  # refused by the name alone, whatever the caller knew
        with pytest.raises(UnsafePathError, match=r"9\.changelog is a symlink"):
            upload_chunk(store, _chunk(f, inode), {}, None, NoProgress())
    assert not store.exists("files/a")


def test_another_file_under_the_planned_name_is_not_read(planned: tuple[Path, int, str]) -> None:
    f, ino, url = planned
    other = f.with_name("other")
    other.write_bytes(b"abcdefghij")
    os.replace(other, f)
    store = open_blob_store(url)
    with pytest.raises(UnsafePathError, match=rf"no longer the file planned for upload .*expected {ino}"):
        upload_chunk(store, _chunk(f, ino), {}, None, NoProgress())
    assert not store.exists("files/a")


def test_a_fifo_under_the_name_is_refused_without_blocking(planned: tuple[Path, int, str]) -> None:
    f, _ino, url = planned
    f.unlink()
    os.mkfifo(f)  # no writer: an open that waited for one would hang here
    with pytest.raises(UnsafePathError, match="not a regular file"):
        upload_chunk(open_blob_store(url), _chunk(f, None), {}, None, NoProgress())
