"""DirDiff between a local directory and the previous snapshot's DirIndex."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from spark_statebackend.engine.checksum import checksum_range, chunk_layout
from spark_statebackend.engine.diff import DiffOptions, compute_diff, file_metadata
from spark_statebackend.engine.index import DirIndex, FileBlob
from spark_statebackend.engine.transfer import assemble_file_index
from spark_statebackend.errors import StateBackendError
from tests.trees import make_tree


def index_of(root: Path, chunk: int = 1 << 20) -> DirIndex:
    """A DirIndex describing `root` as it is now (what a finished upload would have recorded)."""

    def build(d: Path, name: str) -> DirIndex:
        files, dirs = [], []
        for e in sorted(os.scandir(d), key=lambda e: e.name):
            if e.is_dir():
                dirs.append(build(Path(e.path), e.name))
            else:
                st = os.stat(e.path)
                blobs = [
                    FileBlob(f"b/{e.name}/{off}", off, n, checksum_range(e.path, off, n))
                    for off, n in chunk_layout(st.st_size, chunk)
                ]
                files.append(assemble_file_index(e.name, file_metadata(st), blobs))
        return DirIndex(name, files_present=tuple(files), subdirs_present=tuple(dirs))

    return build(root, "")


def test_first_snapshot_adds_everything(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"a": b"1", "s": {"b": b"22", "t": {"c": b""}}, "e": None})
    diff = compute_diff(root, None)
    assert sorted(p for p, _ in diff.added_files()) == ["a", "s/b", "s/t/c"]
    st = diff.stats()
    assert (st.files_added, st.bytes_added, st.files_retained, st.subdirs_added) == (3, 3, 0, 3)  # e, s, s/t


def test_unchanged_tree_retains_everything(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"a": b"1" * 5000, "s": {"b": b"22"}})
    diff = compute_diff(root, index_of(root))
    assert list(diff.added_files()) == []
    st = diff.stats()
    assert (st.files_retained, st.files_removed, st.bytes_retained) == (2, 0, 5002)


def test_added_changed_and_removed_files_and_dirs(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "d", {"keep": b"k", "change": b"v1", "gone": b"g", "olddir": {"x": b"x"}, "s": {"y": b"y"}}
    )
    prev = index_of(root)
    (root / "change").write_bytes(b"v2")  # same size, small: caught by checksum
    (root / "gone").unlink()
    (root / "olddir" / "x").unlink()
    (root / "olddir").rmdir()
    (root / "new").write_bytes(b"n")
    (root / "s" / "z").write_bytes(b"z")
    diff = compute_diff(root, prev)
    assert sorted(p for p, _ in diff.added_files()) == ["change", "new", "s/z"]
    assert sorted(f.name for f in diff.files_removed) == ["change", "gone"]
    assert [d.name for d in diff.subdirs_removed] == ["olddir"]
    assert [f.name for f in diff.files_retained] == ["keep"]
    assert diff.stats().files_removed == 3  # change, gone, olddir/x


def test_large_files_compare_by_name_and_size_unless_asked(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"big.sst": b"a" * 4096})
    prev = index_of(root)
    (root / "big.sst").write_bytes(b"b" * 4096)
    small_limit = DiffOptions(small_file_bytes=1024)
    assert list(compute_diff(root, prev, small_limit).added_files()) == []
    forced = DiffOptions(small_file_bytes=1024, checksum_all_files=True)
    assert [p for p, _ in compute_diff(root, prev, forced).added_files()] == ["big.sst"]


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Overwrite `path`'s bytes through its inode (same size), then put its mtime back: only ctime
    tells."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_stat_identity_reads_a_large_file_whose_ctime_or_inode_changed(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"big.bin": b"a" * 4096, "same.bin": b"c" * 4096})
    prev = index_of(root)
    options = DiffOptions(small_file_bytes=1024, stat_identity=True)
    assert list(compute_diff(root, prev, options).added_files()) == []
    _rewrite_in_place(root / "big.bin", b"b" * 4096)  # size and mtime as recorded
    runtime = DiffOptions(small_file_bytes=1024)  # the Spark runtime's diff: by size only
    assert list(compute_diff(root, prev, runtime).added_files()) == []
    assert [p for p, _ in compute_diff(root, prev, options).added_files()] == ["big.bin"]
    # Same bytes under a new inode (a restore, a copy): read, found unchanged, recorded as it is now.
    os.rename(root / "same.bin", root / "old")
    (root / "same.bin").write_bytes((root / "old").read_bytes())
    (root / "old").unlink()
    diff = compute_diff(root, prev, options)
    (kept,) = diff.files_retained
    assert kept.name == "same.bin" and kept.metadata.inode == os.stat(root / "same.bin").st_ino
    assert kept.blobs == next(f for f in prev.files_present if f.name == "same.bin").blobs


def test_stat_identity_reads_every_file_of_an_index_without_inodes(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"big.bin": b"a" * 4096})
    prev = index_of(root)
    old = prev.files_present[0]
    prev = DirIndex("", files_present=(replace(old, metadata=replace(old.metadata, inode=None)),))
    _rewrite_in_place(root / "big.bin", b"b" * 4096)
    os.utime(root / "big.bin", ns=(old.metadata.mtime_ns, old.metadata.mtime_ns))
    options = DiffOptions(small_file_bytes=1024, stat_identity=True)
    assert [p for p, _ in compute_diff(root, prev, options).added_files()] == ["big.bin"]


def test_permission_change_counts_as_changed(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"f": b"data"})
    prev = index_of(root)
    os.chmod(root / "f", 0o600)
    assert [p for p, _ in compute_diff(root, prev).added_files()] == ["f"]


def test_write_and_group_other_read_bits_of_immutable_files_are_not_compared(tmp_path: Path) -> None:
    # A restore hard-links SSTs from read-only blob files, owner-private (0400) or, in older local
    # stores, 0444: a 0644 SST restored as either is the same SST.
    root = make_tree(tmp_path / "d", {"000001.sst": b"s" * 10, "CURRENT": b"c"})
    prev = index_of(root)
    os.chmod(root / "000001.sst", 0o444)
    os.chmod(root / "CURRENT", 0o444)
    diff = compute_diff(root, prev)
    assert [f.name for f in diff.files_retained] == ["000001.sst"]
    assert [f.name for f in diff.files_added] == ["CURRENT"]  # a mutable kind: its mode is compared
    os.chmod(root / "000001.sst", 0o400)
    assert [f.name for f in compute_diff(root, prev).files_added] == ["CURRENT"]
    os.chmod(root / "000001.sst", 0o044)  # the owner's read bit still counts
    assert [f.name for f in compute_diff(root, prev).files_added] == ["000001.sst", "CURRENT"]
    os.chmod(root / "000001.sst", 0o744)  # and so does any execute bit
    assert [f.name for f in compute_diff(root, prev).files_added] == ["000001.sst", "CURRENT"]
    strict = DiffOptions(immutable_patterns=())
    os.chmod(root / "000001.sst", 0o444)
    assert [f.name for f in compute_diff(root, prev, strict).files_added] == ["000001.sst", "CURRENT"]


def test_file_replaced_by_directory(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"x": b"file"})
    prev = index_of(root)
    (root / "x").unlink()
    make_tree(root / "x", {"inner": b"i"})
    diff = compute_diff(root, prev)
    assert [f.name for f in diff.files_removed] == ["x"]
    assert [d.name for d in diff.subdirs_added] == ["x"]


def test_symlink_is_an_error_naming_it(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "d", {"f": b"1"})
    os.symlink("/etc/passwd", root / "link")
    with pytest.raises(StateBackendError, match=r"link.*not a regular file"):
        compute_diff(root, None)


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StateBackendError, match="not a directory"):
        compute_diff(tmp_path / "nope", None)
