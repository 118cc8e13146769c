"""Restore's local fast path (restore.py [4]): whole-file blobs of a LocalBlobStore on the destination's
filesystem are hard-linked (read-only SSTs, for a process that cannot write through them) or
kernel-copied (everything else, and everything as root), always checksum-verified, never changing
the blob; every other case takes the download path.

Mode bits bind every user but root, so the link path is tested in a process they bind: when the
tests run as root, that scenario runs in a child process without capabilities (`as_unprivileged`)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import spark_statebackend.engine.restore as restore_mod
from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner, load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.engine.verify import verify_snapshot
from spark_statebackend.errors import ChecksumError
from spark_statebackend.stores import BlobStore, LocalBlobStore
from spark_statebackend.stores.local import BLOB_MODE
from tests.paths import ROOT
from tests.trees import make_tree, read_tree, restored_as

TREE = {
    "SSTs": {"000007-aa.sst": os.urandom(300_000), "000008-bb.sst": os.urandom(5_000)},
    "1.zip": os.urandom(2_000),
    "CURRENT": b"MANIFEST-000001\n",
    "empty.sst": b"",
}


class RemoteLikeStore(LocalBlobStore):
    """A local directory that, like every remote store, offers no local files."""

    def local_path(self, blob_id: str) -> Path | None:
        return None


@pytest.fixture
def pool():
    with TransferPool(4) as p:
        yield p


def backup(store: BlobStore, pool: TransferPool, src: Path) -> tuple[BackupManager, str]:
    m = BackupManager(store, pool, owner=SnapshotOwner("q"), config=BackupConfig(chunk_size=64 * 1024))
    markers = m.upload("cp-1", {"st": src})
    m.cleanup(markers)
    return m, markers["st"]


def blob_files(store: LocalBlobStore, marker: str) -> dict[str, Path]:
    """Snapshot path -> the blob file holding it (whole-file blobs)."""
    out = {}
    for rel, f in load_snapshot_index(store, marker).dir_index.walk_files():
        if f.blobs:
            (b,) = f.blobs
            path = store.local_path(b.blob_id)
            assert path is not None
            out[rel] = path
    return out


def inode_state(path: Path) -> tuple[int, int, int, int, bytes]:
    st = os.stat(path)
    return st.st_ino, stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size, path.read_bytes()


def links_blobs(store: LocalBlobStore) -> bool:
    """Whether restore may hard-link this store's blob files in this process: only if the process
    cannot write through a read-only file (not root / CAP_DAC_OVERRIDE)."""
    probe = store.root / "tmp" / "write-probe"
    probe.write_bytes(b"")
    os.chmod(probe, BLOB_MODE)
    try:
        return not os.access(probe, os.W_OK, effective_ids=True)
    finally:
        probe.unlink()


def as_unprivileged(scenario: Callable[[Path], None], work: Path) -> None:
    """Run `scenario(work)` in a process that mode bits bind: this one unless it is root, else a child
    process of the same uid with every capability dropped (util-linux `setpriv`): such a root is an
    ordinary owner, refused writes through a read-only mode like any user."""
    work.mkdir()
    if os.geteuid() != 0:
        scenario(work)
        return
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and util-linux setpriv (to drop capabilities) is not installed")
    code = f"from pathlib import Path; from {__name__} import {scenario.__name__} as s; "
    code += f"s(Path({str(work)!r}))"
    done = subprocess.run(
        [setpriv, "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c", code],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{scenario.__name__} without capabilities:\n{done.stdout}\n{done.stderr}"


def linked_scenario(work: Path) -> None:
    """As an unprivileged user: SSTs are linked read-only, other files copied, blobs untouched; a write
    through a linked name is refused; a later backup of the restored dir uploads nothing."""
    with TransferPool(4) as pool:
        store = LocalBlobStore(work / "blobs", fsync=True)
        store.ensure_ready()
        assert links_blobs(store)
        src = make_tree(work / "src", TREE)
        os.utime(src / "CURRENT", ns=(10**18, 10**18))
        _, marker = backup(store, pool, src)
        blobs = blob_files(store, marker)
        assert set(blobs) == {"SSTs/000007-aa.sst", "SSTs/000008-bb.sst", "1.zip", "CURRENT"}  # one blob each
        before = {rel: inode_state(p) for rel, p in blobs.items()}
        assert {rel: state[1] for rel, state in before.items()} == dict.fromkeys(blobs, BLOB_MODE)

        result = RestoreManager(store, pool).restore(marker, work / "dst")

        dst = work / "dst"
        ssts = ("SSTs/000007-aa.sst", "SSTs/000008-bb.sst")
        want = read_tree(src)
        for rel in ssts:  # a linked SST has the blob's mode: read-only, for the owner only
            sub, name = rel.split("/")
            data, _ = want[sub + "/"][name]  # type: ignore[index]
            want[sub + "/"][name] = (data, BLOB_MODE)  # type: ignore[index]
        assert read_tree(dst) == want
        assert (result.files_downloaded, result.files_linked) == (5, 2)
        for rel in ssts:
            assert os.stat(dst / rel).st_ino == before[rel][0]  # the blob's inode
            with pytest.raises(PermissionError):
                open(dst / rel, "ab").close()  # the open itself must fail
        for rel in ("1.zip", "CURRENT"):  # mutable kinds: a copy of their own, metadata from the index
            assert os.stat(dst / rel).st_ino != before[rel][0]
            assert os.stat(dst / rel).st_mtime_ns == os.stat(src / rel).st_mtime_ns
        assert {rel: inode_state(p) for rel, p in blobs.items()} == before  # mode, mtime, size, bytes

        # A new process (say a new executor) diffs the restored dir against the restored snapshot.
        listing = {b.blob_id: (b.size, b.modified_ms) for b in store.list("files/")}
        m = BackupManager(store, pool, owner=SnapshotOwner("q"))
        m.init({"st": marker})
        m.upload("cp-2", {"st": dst})
        assert m.metrics.value("ssb_backup_files_to_upload", query="q") == 0
        assert {b.blob_id: (b.size, b.modified_ms) for b in store.list("files/")} == listing


def test_ssts_are_linked_read_only_for_a_user_who_cannot_write_through_them(tmp_path: Path) -> None:
    as_unprivileged(linked_scenario, tmp_path / "work")


def old_store_scenario(work: Path) -> None:
    """As an unprivileged user: a store written by an older version (blobs 0444, directories 0755) is
    read, restored and linked as before, and its modes are left as they are."""
    with TransferPool(4) as pool:
        store = LocalBlobStore(work / "blobs", fsync=False)
        store.ensure_ready()
        src = make_tree(work / "src", TREE)
        _, marker = backup(store, pool, src)
        blobs = blob_files(store, marker)
        for dirpath, _, filenames in os.walk(store.root):
            os.chmod(dirpath, 0o755)
            in_blobs = Path(dirpath).relative_to(store.root).parts[:1] == ("blobs",)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o444 if in_blobs else 0o644)
        result = RestoreManager(store, pool).restore(marker, work / "dst")
        assert result.files_linked == 2  # 0644 SSTs link to 0444 blobs as before
        got = read_tree(work / "dst")
        assert got["SSTs/"] == {n: (d, 0o444) for n, d in TREE["SSTs"].items()}  # type: ignore[union-attr]
        m = BackupManager(store, pool, owner=SnapshotOwner("q"))
        m.init({"st": marker})
        m.upload("cp-2", {"st": work / "dst"})
        assert m.metrics.value("ssb_backup_files_to_upload", query="q") == 0
        assert {stat.S_IMODE(os.stat(p).st_mode) for p in blobs.values()} == {0o444}
        assert stat.S_IMODE(os.stat(store.root / "blobs").st_mode) == 0o755


def test_an_older_store_with_world_readable_blobs_still_restores_and_links(tmp_path: Path) -> None:
    as_unprivileged(old_store_scenario, tmp_path / "work")


def _modes(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(directory -> mode, file -> mode) of every entry under `root`, by relative path."""
    dirs, files = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            path = os.path.join(dirpath, name)
            dirs[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
        for name in filenames:
            path = os.path.join(dirpath, name)
            files[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
    return dirs, files


def test_blobs_and_directories_of_the_local_store_are_private_to_the_owner(tmp_path: Path) -> None:
    old_umask = os.umask(0)  # the most permissive umask: the store's own modes must hold regardless
    try:
        store = LocalBlobStore(tmp_path / "made" / "by" / "store", fsync=False)
        store.ensure_ready()
        store.put_bytes("a/b/put", b"x", ttl_seconds=60)
        store.create("a/created", b"y")
        existing = tmp_path / "mine"
        existing.mkdir(mode=0o755)
        LocalBlobStore(existing, fsync=False).put_bytes("c/put", b"z")
    finally:
        os.umask(old_umask)
    dirs, files = _modes(tmp_path)
    assert dirs.pop("mine") == 0o755  # a root the user made keeps its mode
    assert dirs and set(dirs.values()) == {0o700}, dirs  # made/, by/, store/, blobs/, meta/, tmp/, a/...
    blobs = {p: m for p, m in files.items() if "/blobs/" in f"/{p}"}
    assert len(blobs) == 3 and set(blobs.values()) == {0o400} == {BLOB_MODE}, blobs
    assert {m for p, m in files.items() if p not in blobs} == {0o600}, files  # metadata files


def test_a_write_chmod_or_touch_through_a_restored_file_never_changes_the_store(
    pool: TransferPool, tmp_path: Path
) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    _, marker = backup(store, pool, src)
    blobs = blob_files(store, marker)
    before = {rel: inode_state(p) for rel, p in blobs.items()}
    result = RestoreManager(store, pool).restore(marker, tmp_path / "dst")
    for rel in blobs:
        restored = tmp_path / "dst" / rel
        linked = os.stat(restored).st_ino == before[rel][0]
        try:
            with open(restored, "ab") as fh:
                fh.write(b"garbage")
        except PermissionError:
            assert linked, rel  # only a linked, read-only blob refuses it
        else:
            assert not linked, f"{rel}: written through a link to its blob"
            os.chmod(restored, 0o666)  # a copy of its own: nothing of this reaches the store
            os.utime(restored, ns=(1, 1))
    assert {rel: inode_state(p) for rel, p in blobs.items()} == before
    report = verify_snapshot(store, pool, marker)
    assert report.ok, report.problems
    assert result.files_linked == (2 if links_blobs(store) else 0)  # as root: nothing linked


def test_restored_files_survive_the_blob_being_deleted_or_replaced(
    pool: TransferPool, tmp_path: Path
) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    _, marker = backup(store, pool, src)
    RestoreManager(store, pool).restore(marker, tmp_path / "dst")
    index = load_snapshot_index(store, marker)
    ids = {rel: f.blobs[0].blob_id for rel, f in index.dir_index.walk_files() if f.blobs}
    store.put_bytes(ids["SSTs/000007-aa.sst"], b"overwritten")  # a put never writes into the inode
    store.delete(ids["SSTs/000008-bb.sst"])  # cleanup / GC / TTL sweep only remove the name
    assert restored_as(read_tree(tmp_path / "dst")) == restored_as(read_tree(src))


@pytest.mark.parametrize("name", ["SSTs/000007-aa.sst", "1.zip"])
def test_a_corrupt_blob_raises_naming_the_file_and_the_dest_is_untouched(
    name: str, pool: TransferPool, tmp_path: Path
) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    _, marker = backup(store, pool, src)
    blob = blob_files(store, marker)[name]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))  # bit rot in place (same size, same inode)
    os.chmod(blob, BLOB_MODE)
    work = tmp_path / "work"
    dst = make_tree(work / "dst", {"precious": b"p"})
    before = read_tree(dst)
    with pytest.raises(ChecksumError, match=name):
        RestoreManager(store, pool).restore(marker, dst)
    assert read_tree(dst) == before
    assert os.listdir(work) == ["dst"]  # the scratch dir holding the link is gone
    assert blob.read_bytes() == bytes(data)  # and the blob itself is left for verify / GC to report


def test_other_filesystem_takes_the_download_path(pool: TransferPool, tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp dir")
    root = shm / f"ssb-test-{os.getpid()}-{tmp_path.name}"
    try:
        store = LocalBlobStore(root, fsync=False)
        store.ensure_ready()
        src = make_tree(tmp_path / "src", TREE)
        _, marker = backup(store, pool, src)
        result = RestoreManager(store, pool).restore(marker, tmp_path / "dst")
        assert read_tree(tmp_path / "dst") == read_tree(src)
        assert (result.files_downloaded, result.files_linked) == (5, 0)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_a_store_without_local_files_takes_the_download_path(pool: TransferPool, tmp_path: Path) -> None:
    store = RemoteLikeStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    _, marker = backup(store, pool, src)
    result = RestoreManager(store, pool).restore(marker, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == read_tree(src)
    assert result.files_linked == 0
    for rel, path in blob_files(LocalBlobStore(tmp_path / "blobs"), marker).items():
        assert os.stat(tmp_path / "dst" / rel).st_ino != os.stat(path).st_ino


def test_a_mode_the_blob_does_not_have_is_copied_not_linked(pool: TransferPool, tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    os.chmod(src / "SSTs" / "000007-aa.sst", 0o400)
    _, marker = backup(store, pool, src)
    blob = blob_files(store, marker)["SSTs/000007-aa.sst"]
    os.chmod(blob, 0o444)  # as an older store made it: it grants others a read the file's mode does not
    mode = stat.S_IMODE(os.stat(blob).st_mode)
    result = RestoreManager(store, pool).restore(marker, tmp_path / "dst")
    assert (tmp_path / "dst" / "SSTs" / "000007-aa.sst").read_bytes() == TREE["SSTs"]["000007-aa.sst"]  # type: ignore[index]
    assert stat.S_IMODE(os.stat(tmp_path / "dst" / "SSTs" / "000007-aa.sst").st_mode) == 0o400  # on a copy
    assert result.files_linked == (1 if links_blobs(store) else 0)  # only the other SST, if any
    assert stat.S_IMODE(os.stat(blob).st_mode) == mode


def test_a_refused_link_falls_back_to_a_verified_copy(
    pool: TransferPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    _, marker = backup(store, pool, src)

    def refuse(src_path: object, dst_path: object) -> None:
        raise PermissionError(1, "Operation not permitted (protected_hardlinks)")

    monkeypatch.setattr(restore_mod.os, "link", refuse)
    result = RestoreManager(store, pool).restore(marker, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == read_tree(src)
    assert (result.files_downloaded, result.files_linked) == (5, 0)


def test_chunked_files_of_a_local_store_are_downloaded(pool: TransferPool, tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs", fsync=False, whole_files=False)
    store.ensure_ready()
    src = make_tree(tmp_path / "src", TREE)
    _, marker = backup(store, pool, src)  # 64 KiB chunks: 000007-aa.sst has 5 blobs
    result = RestoreManager(store, pool).restore(marker, tmp_path / "dst")
    assert (tmp_path / "dst" / "SSTs" / "000007-aa.sst").read_bytes() == TREE["SSTs"]["000007-aa.sst"]  # type: ignore[index]
    assert result.files_linked == (1 if links_blobs(store) else 0)  # 000008-bb.sst fits one chunk
