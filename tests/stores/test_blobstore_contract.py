"""The BlobStore contract (blobstore/base.py), checked on every backend with the same tests.

`blob_store` is parametrised over local, azurite, seaweedfs and moto (tests/servers/fixtures.py);
cloud stores use small block and chunk sizes here, so a few MiB cover staged blocks, multipart
parts and parallel ranged reads.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark_statebackend.cli import main
from spark_statebackend.errors import BlobExistsError, BlobNotFoundError, BlobStoreError
from spark_statebackend.stores import BlobStore

MiB = 1024 * 1024
# Over the S3 test part size (5 MiB) and many Azure test blocks / download chunks (1 MiB).
BIG = 11 * MiB + 12345


class RecordingSink:
    """Records every write, to prove bytes arrive in order and exactly once."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.buf += data
        self.writes += 1
        return len(data)


def _data(n: int, seed: int = 0) -> bytes:
    # Distinct 8-byte words, so a block delivered twice or out of order cannot compare equal.
    return b"".join((seed * 1_000_000_007 + i).to_bytes(8, "little") for i in range(n // 8 + 1))[:n]


def test_put_get_round_trip_small_and_multi_block(blob_store: BlobStore) -> None:
    small, big = _data(1000), _data(BIG, seed=1)
    blob_store.put_bytes("a/small", small)
    blob_store.put("a/big", lambda: io.BytesIO(big), len(big))
    assert blob_store.get_bytes("a/small") == small
    sink = RecordingSink()
    assert blob_store.get("a/big", sink) == len(big)
    assert bytes(sink.buf) == big
    assert blob_store.stat("a/big").size == len(big)


def test_ranged_reads(blob_store: BlobStore) -> None:
    data = _data(3 * MiB + 77, seed=2)
    blob_store.put_bytes("r", data)
    for offset, length in [(0, 10), (MiB - 5, 10), (123, 2 * MiB + 1000), (len(data) - 7, 7), (len(data), 0)]:
        assert blob_store.get_bytes("r", offset, length) == data[offset : offset + length], (offset, length)
    assert blob_store.get_bytes("r", 2 * MiB) == data[2 * MiB :]
    assert blob_store.get_bytes("r", len(data)) == b""


def test_reads_outside_the_blob_fail_clearly(blob_store: BlobStore) -> None:
    blob_store.put_bytes("short", b"0123456789")
    for offset, length in [(5, 6), (11, None), (11, 0), (20, 1)]:
        with pytest.raises(BlobStoreError, match="short") as info:
            blob_store.get_bytes("short", offset, length)
        assert not isinstance(info.value, BlobNotFoundError)


def test_empty_blob(blob_store: BlobStore) -> None:
    blob_store.put_bytes("empty", b"")
    assert blob_store.get_bytes("empty") == b""
    assert blob_store.get_bytes("empty", 0, 0) == b""
    assert blob_store.stat("empty").size == 0
    with pytest.raises(BlobStoreError):
        blob_store.get_bytes("empty", 0, 1)


def test_put_overwrites(blob_store: BlobStore) -> None:
    blob_store.put_bytes("o", b"first version")
    blob_store.put_bytes("o", b"second")
    assert blob_store.get_bytes("o") == b"second"


def test_short_source_fails_and_keeps_the_previous_blob(blob_store: BlobStore) -> None:
    old = _data(BIG, seed=3)
    blob_store.put("p", lambda: io.BytesIO(old), len(old))
    for claimed in (100, BIG):  # one request, and a block upload
        with pytest.raises(BlobStoreError, match="'p'"):
            blob_store.put("p", lambda: io.BytesIO(b"x" * 50), claimed)
    assert blob_store.get_bytes("p") == old


def test_metadata_round_trips(blob_store: BlobStore) -> None:
    meta = {"kind": "snapshot-index", "store": "op/0/default", "Odd-Key.x": "välue 100% ok"}
    blob_store.put_bytes("m", b"x", metadata=meta)
    assert dict(blob_store.stat("m").metadata) == meta


def test_create_is_exclusive(blob_store: BlobStore) -> None:
    blob_store.create("c/marker", b"one", metadata={"kind": "marker"})
    with pytest.raises(BlobExistsError) as info:
        blob_store.create("c/marker", b"two")
    assert info.value.blob_id == "c/marker"
    assert blob_store.get_bytes("c/marker") == b"one"


def test_missing_blobs(blob_store: BlobStore) -> None:
    with pytest.raises(BlobNotFoundError) as info:
        blob_store.get_bytes("nope/x")
    assert info.value.blob_id == "nope/x"
    with pytest.raises(BlobNotFoundError):
        blob_store.stat("nope/x")
    with pytest.raises(BlobNotFoundError):
        blob_store.remove_ttl("nope/x")
    assert not blob_store.exists("nope/x")
    blob_store.delete("nope/x")  # deleting a missing blob succeeds


def test_delete(blob_store: BlobStore) -> None:
    blob_store.put_bytes("d", b"x")
    assert blob_store.exists("d")
    blob_store.delete("d")
    blob_store.delete("d")
    assert not blob_store.exists("d")
    with pytest.raises(BlobNotFoundError):
        blob_store.get_bytes("d")


def test_delete_many_deletes_every_blob_named_in_requests_of_the_batch_size(blob_store: BlobStore) -> None:
    doomed = [f"dm/{i}" for i in range(7)]
    for b in [*doomed, "dm/kept"]:
        blob_store.put_bytes(b, b"x")
    # Several requests (7 blobs and 2 missing ones, 3 per request where the service batches), with
    # missing blobs among them: each is deleted as delete() would.
    if blob_store.delete_batch_size > 1:
        blob_store.delete_batch_size = 3
    blob_store.delete_many([*doomed, "dm/missing-1", "dm/missing-2"])
    assert [i.blob_id for i in blob_store.list("dm/")] == ["dm/kept"]
    blob_store.delete_many([])


def test_ttl_is_recorded_and_removed(blob_store: BlobStore) -> None:
    before = int(time.time() * 1000)
    blob_store.put_bytes("t", b"x", ttl_seconds=3600)
    expires = blob_store.stat("t").expires_at_ms
    assert expires is not None and before + 3_590_000 <= expires <= int(time.time() * 1000) + 3_600_000
    blob_store.remove_ttl("t")
    assert blob_store.stat("t").expires_at_ms is None
    blob_store.remove_ttl("t")  # already permanent: still fine
    blob_store.put_bytes("perm", b"x")
    assert blob_store.stat("perm").expires_at_ms is None


def test_set_ttl_makes_a_permanent_blob_expire_again(blob_store: BlobStore) -> None:
    """What cleanup does to the blobs of a checkpoint that is no longer retained when it cannot tell
    which of them an upload in flight still uses (BackupManager.cleanup)."""
    blob_store.put_bytes("e/was-referenced", b"kept bytes", metadata={"kind": "sst"})
    before = int(time.time() * 1000)
    blob_store.set_ttl("e/was-referenced", 600)
    info = blob_store.stat("e/was-referenced")
    assert info.expires_at_ms is not None and before + 590_000 <= info.expires_at_ms
    assert info.expires_at_ms <= int(time.time() * 1000) + 600_000
    assert info.metadata == {"kind": "sst"} and blob_store.get_bytes("e/was-referenced") == b"kept bytes"
    assert blob_store.sweep_expired(before) == 0
    assert blob_store.sweep_expired(before + 3600 * 1000) == 1
    assert not blob_store.exists("e/was-referenced")
    with pytest.raises(BlobNotFoundError):
        blob_store.set_ttl("e/was-referenced", 600)


def test_sweep_deletes_only_expired_blobs(blob_store: BlobStore) -> None:
    big = _data(BIG, seed=4)
    blob_store.put_bytes("s/expiring", b"1", ttl_seconds=60)
    blob_store.put("s/expiring-big", lambda: io.BytesIO(big), len(big), ttl_seconds=60)
    blob_store.put_bytes("s/later", b"2", ttl_seconds=7200)
    blob_store.put_bytes("s/permanent", b"3")
    blob_store.put_bytes("s/rescued", b"4", ttl_seconds=60)
    blob_store.remove_ttl("s/rescued")
    now = int(time.time() * 1000)
    assert blob_store.sweep_expired(now) == 0
    assert blob_store.sweep_expired(now + 3600 * 1000) == 2
    assert sorted(b.blob_id for b in blob_store.list("s/")) == ["s/later", "s/permanent", "s/rescued"]
    assert blob_store.sweep_expired(now + 3600 * 1000) == 0


def test_sweep_spares_expired_blobs_the_caller_keeps(blob_store: BlobStore) -> None:
    # GC passes the blobs a retained checkpoint references: they survive even with an expired TTL.
    for name in ("k/referenced", "k/orphan", "k/later"):
        blob_store.put_bytes(name, b"x", ttl_seconds=60 if name != "k/later" else 7200)
    asked: list[str] = []

    def keep(blob_id: str) -> bool:
        asked.append(blob_id)
        return blob_id == "k/referenced"

    assert blob_store.sweep_expired(int(time.time() * 1000) + 3600 * 1000, keep=keep) == 1
    assert sorted(asked) == ["k/orphan", "k/referenced"]  # asked about expired blobs only
    assert sorted(b.blob_id for b in blob_store.list("k/")) == ["k/later", "k/referenced"]


def test_list_by_prefix(blob_store: BlobStore) -> None:
    for name, size in [("x/1", 1), ("x/2", 22), ("x/sub/3", 333), ("xy", 4), ("y/1", 5)]:
        blob_store.put_bytes(name, b"z" * size)
    listed = {b.blob_id: b.size for b in blob_store.list("x/")}
    assert listed == {"x/1": 1, "x/2": 22, "x/sub/3": 333}
    assert {b.blob_id for b in blob_store.list("x")} == {"x/1", "x/2", "x/sub/3", "xy"}
    assert len(list(blob_store.list())) == 5


@pytest.mark.parametrize("bad", ["../escape", "/abs", "a//b", "a/./b", "sp ace", ""])
def test_bad_blob_ids_are_refused(blob_store: BlobStore, bad: str) -> None:
    with pytest.raises(BlobStoreError):
        blob_store.put_bytes(bad, b"x")


def test_parallel_use_from_many_threads(blob_store: BlobStore) -> None:
    blobs = {f"par/{i}": _data(200_000 + i * 50_000, seed=10 + i) for i in range(12)}
    threads: set[str] = set()

    def round_trip(item: tuple[str, bytes]) -> bool:
        threads.add(threading.current_thread().name)
        name, data = item
        blob_store.put(name, lambda: io.BytesIO(data), len(data), ttl_seconds=600)
        return blob_store.get_bytes(name) == data

    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="contract-test") as pool:
        assert all(pool.map(round_trip, blobs.items()))
    assert len(threads) > 1
    assert {b.blob_id for b in blob_store.list("par/")} == set(blobs)


def test_put_from_a_real_file(blob_store: BlobStore, tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "f.bin")
    data = _data(6 * MiB + 1, seed=5)
    with open(path, "wb") as f:
        f.write(data)
    blob_store.put("file", lambda: open(path, "rb"), len(data))  # noqa: SIM115 - the store closes it
    assert blob_store.get_bytes("file") == data


def test_cli_backup_restore_verify_on_every_backend(
    blob_store_url: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The snapshot commands with azure:// and s3:// URLs; endpoint and credentials come from the
    environment, as a user would set them (a real subprocess for the last command)."""
    url, env = blob_store_url
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.sst").write_bytes(_data(300_000, seed=7))
    (src / "d" / "b").write_bytes(b"small")
    runner = CliRunner(env=env)
    args = (
        ["--blob-url", url, "--option", "max_concurrency=2"]
        if not url.startswith("file:")
        else ["--blob-url", url]
    )
    result = runner.invoke(main, ["backup", str(src), "--store", "s1", "--chunk-size", "64KiB", *args])
    assert result.exit_code == 0, result.stderr
    marker = result.stdout.strip().splitlines()[-1]
    result = runner.invoke(main, ["restore", marker, "--dest", str(tmp_path / "dst"), *args])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "dst" / "a.sst").read_bytes() == (src / "a.sst").read_bytes()
    assert (tmp_path / "dst" / "d" / "b").read_bytes() == b"small"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "spark-statebackend"), "verify", marker, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ok: snapshot "), proc.stderr
    assert ": 2 file(s), " in proc.stdout
