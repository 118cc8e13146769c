"""Files a restore writes and an upload reads are opened without following a symlink at their name: a
link planted there neither truncates nor fills a file elsewhere, nor feeds its target into a blob."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_statebackend.common.nofollow import open_new, open_regular
from spark_statebackend.engine.placing import kernel_copy
from spark_statebackend.errors import UnsafePathError


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(b"must stay as it is")
    return victim


def test_open_new_creates_or_empties_a_file(tmp_path: Path) -> None:
    f = tmp_path / "a"
    with open_new(f) as out:
        out.write(b"long contents")
    with open_new(f) as out:
        out.write(b"new")
    assert f.read_bytes() == b"new"


def test_open_new_refuses_a_symlink_and_leaves_its_target(tmp_path: Path, outside: Path) -> None:
    link = tmp_path / "restore" / "000123.sst"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"000123\.sst is a symlink; refusing to write"):
        open_new(link)
    assert outside.read_bytes() == b"must stay as it is"


def test_open_regular_reads_the_planned_inode_only(tmp_path: Path, outside: Path) -> None:
    f = tmp_path / "x"
    f.write_bytes(b"data")
    with open_regular(f, os.lstat(f).st_ino) as r:
        assert r.read() == b"data"
    link = tmp_path / "y"
    link.symlink_to(outside)
    with pytest.raises(UnsafePathError, match="is a symlink; refusing to read"):
        open_regular(link)


def test_a_kernel_copy_into_a_symlinked_name_is_refused(tmp_path: Path, outside: Path) -> None:
    src = tmp_path / "blob"
    src.write_bytes(b"sst bytes")
    dst = tmp_path / "restore" / "000123.sst"
    dst.parent.mkdir()
    dst.symlink_to(outside)
    with pytest.raises(UnsafePathError):
        kernel_copy(src, dst, 9)
    assert outside.read_bytes() == b"must stay as it is"
    dst.unlink()
    assert kernel_copy(src, dst, 9) and dst.read_bytes() == b"sst bytes"
