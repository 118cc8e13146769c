"""Fault injection against real servers: a TCP proxy (tests/faultproxy.py) between client and server
answers 503, stalls, resets connections mid-request or mid-response, and loses answers.

Shown here, on Azurite and SeaweedFS: uploads and restores (blob level and through the engine's
BackupManager/RestoreManager) complete through transient faults; a fault that outlasts the retry
budget fails with a clear error naming the blob; a failed upload never harms the previous blob or
snapshot; a retried put re-opens its input; a create whose answer was lost is not an error.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.engine.verify import verify_snapshot
from spark_statebackend.errors import BlobExistsError, RetryBudgetExceededError, StateBackendError
from spark_statebackend.stores import BlobStore
from tests.faultproxy import FaultProxy
from tests.servers.fixtures import Backend, make_backend
from tests.trees import make_tree, read_tree

MiB = 1024 * 1024
BIG = 11 * MiB + 3  # several Azure test blocks, three S3 test parts, many 1 MiB download ranges
SMALL = 900_000  # one request on both (under the 1 MiB Azure test block)


@pytest.fixture(params=[pytest.param(n, id=n, marks=pytest.mark.services) for n in ("azurite", "seaweedfs")])
def real_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture
def proxy(real_backend: Backend) -> Iterator[FaultProxy]:
    with FaultProxy(real_backend.server_port) as p:
        yield p


def through(b: Backend, proxy: FaultProxy, **overrides: str) -> BlobStore:
    """A store on the same location as `b`, reached through the proxy."""
    return b.open(**b.via_port(proxy.port), **overrides)


class CountingOpener:
    """An opener that counts its calls and checks that every stream it handed out was closed."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.streams: list[BinaryIO] = []

    def __call__(self) -> BinaryIO:
        s = io.BytesIO(self.data)
        self.streams.append(s)
        return s

    @property
    def calls(self) -> int:
        return len(self.streams)

    def all_closed(self) -> bool:
        return all(s.closed for s in self.streams)


def _data(n: int) -> bytes:
    return os.urandom(n)


def test_upload_completes_through_503s(real_backend: Backend, proxy: FaultProxy) -> None:
    store = through(real_backend, proxy)
    direct = real_backend.open()
    big, small = _data(BIG), _data(SMALL)
    proxy.answer_503(seconds=0.8)
    store.put("u/big", lambda: io.BytesIO(big), len(big), ttl_seconds=600)
    proxy.answer_503(seconds=0.5)
    store.put_bytes("u/small", small)
    assert proxy.stats.answered_503 >= 2
    assert direct.get_bytes("u/big") == big
    assert direct.get_bytes("u/small") == small
    assert direct.stat("u/big").expires_at_ms is not None


def test_a_retried_put_reopens_its_input(real_backend: Backend, proxy: FaultProxy) -> None:
    store = through(real_backend, proxy)
    direct = real_backend.open()
    small = CountingOpener(_data(SMALL))
    proxy.cut_upstream_after(200_000, times=1)
    store.put("r/small", small, SMALL)
    assert proxy.stats.cuts == 1
    assert small.calls == 2 and small.all_closed()
    assert direct.get_bytes("r/small") == small.data

    big = CountingOpener(_data(BIG))
    proxy.cut_upstream_after(300_000, times=2)
    store.put("r/big", big, BIG)
    assert proxy.stats.cuts == 3
    assert big.calls >= 2 and big.all_closed()  # one front-to-back read, then one per retried block
    assert direct.get_bytes("r/big") == big.data


def test_restore_resumes_through_dropped_connections(real_backend: Backend, proxy: FaultProxy) -> None:
    data = _data(BIG)
    real_backend.open().put("d/big", lambda: io.BytesIO(data), len(data))
    store = through(real_backend, proxy)
    writes: list[bytes] = []

    class Sink:
        def write(self, b: bytes) -> int:
            writes.append(bytes(b))
            return len(b)

    proxy.cut_downstream_after(300_000, times=3)
    assert store.get("d/big", Sink()) == len(data)
    assert proxy.stats.cuts == 3
    assert b"".join(writes) == data  # in order, each byte once


def test_a_stall_shorter_than_the_budget_is_ridden_out(real_backend: Backend, proxy: FaultProxy) -> None:
    data = _data(SMALL)
    real_backend.open().put_bytes("s/x", data)
    store = through(real_backend, proxy, read_timeout_seconds="0.5", connect_timeout_seconds="0.5")
    assert store.get_bytes("s/x") == data  # the pool has a warm connection now
    proxy.stall(seconds=1.2)
    started = time.monotonic()
    assert store.get_bytes("s/x") == data
    assert time.monotonic() - started >= 0.5
    assert proxy.stats.stalled_connections >= 1


@pytest.mark.parametrize("fault", ["503", "refuse", "stall"])
def test_a_fault_outlasting_the_budget_fails_clearly(
    real_backend: Backend, proxy: FaultProxy, fault: str
) -> None:
    real_backend.open().put_bytes("f/existing", b"x" * 1000)
    store = through(
        real_backend,
        proxy,
        retry_budget_seconds="1.0",
        read_timeout_seconds="0.5",
        connect_timeout_seconds="0.5",
    )
    {"503": proxy.answer_503, "refuse": proxy.refuse, "stall": proxy.stall}[fault]()
    for op, blob_id in [
        (lambda: store.put_bytes("f/new", b"y" * 1000), "f/new"),
        (lambda: store.get_bytes("f/existing"), "f/existing"),
    ]:
        started = time.monotonic()
        with pytest.raises(RetryBudgetExceededError) as info:
            op()
        elapsed = time.monotonic() - started
        message = str(info.value)
        assert blob_id in message and real_backend.url in message and "retry budget 1s" in message
        assert elapsed < 1.0 + 0.5 + 3  # the budget, one attempt's timeout, scheduling slack
    if fault == "503":
        assert "503" in message


def test_a_failed_upload_keeps_the_previous_blob(real_backend: Backend, proxy: FaultProxy) -> None:
    direct = real_backend.open()
    old, new = _data(BIG), _data(BIG)
    direct.put("k/blob", lambda: io.BytesIO(old), len(old))
    store = through(real_backend, proxy, retry_budget_seconds="1.0")
    proxy.cut_upstream_after(300_000, times=10**6)  # every connection dies mid-block, for good
    with pytest.raises(StateBackendError, match="k/blob"):
        store.put("k/blob", lambda: io.BytesIO(new), len(new))
    assert proxy.stats.cuts >= 1
    proxy.heal()
    assert direct.get_bytes("k/blob") == old


def test_a_create_whose_answer_was_lost_succeeds_once(real_backend: Backend, proxy: FaultProxy) -> None:
    store = through(real_backend, proxy)
    proxy.lose_response(rb"^PUT \S*/c/marker[ ?]", times=1)
    store.create("c/marker", b"marker-1")
    assert proxy.stats.lost_responses == 1
    assert real_backend.open().get_bytes("c/marker") == b"marker-1"
    with pytest.raises(BlobExistsError):
        store.create("c/marker", b"marker-1")


@pytest.fixture
def s3_proxy_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Backend, FaultProxy]]:
    b = make_backend("seaweedfs", request, tmp_path)
    with FaultProxy(b.server_port) as p:
        yield b, p
    b.close()


@pytest.mark.services
def test_s3_lost_answer_to_a_multipart_completion(s3_proxy_backend: tuple[Backend, FaultProxy]) -> None:
    b, proxy = s3_proxy_backend
    store = through(b, proxy)
    data = _data(BIG)
    proxy.lose_response(rb"^POST \S*uploadId=", times=1)
    store.put("mp/big", lambda: io.BytesIO(data), len(data))
    assert proxy.stats.lost_responses == 1
    assert b.open().get_bytes("mp/big") == data


# ---- the engine through faults


def _tree(root: Path, n: int, size: int, seed: str) -> Path:
    return make_tree(
        root, {f"{seed}-{i}.sst": os.urandom(size) for i in range(n)} | {"CURRENT": seed.encode()}
    )


def test_engine_backup_and_restore_through_faults(
    real_backend: Backend, proxy: FaultProxy, tmp_path: Path
) -> None:
    store = through(real_backend, proxy)
    src = _tree(tmp_path / "state", 6, 700_000, "a")
    config = BackupConfig(chunk_size=2 * MiB)
    with TransferPool(4, name="fault-test") as pool:
        manager = BackupManager(store, pool, config=config)
        proxy.answer_503(seconds=0.5)
        markers = manager.upload("cp-1", {"st": src})
        proxy.cut_upstream_after(200_000, times=2)
        (src / "b-1.sst").write_bytes(os.urandom(1_500_000))
        markers = manager.upload("cp-2", {"st": src})
        manager.cleanup(markers)
        proxy.cut_downstream_after(250_000, times=3)
        RestoreManager(store, pool).restore(markers["st"], tmp_path / "restored")
        assert verify_snapshot(store, pool, markers["st"]).ok
    assert read_tree(tmp_path / "restored") == read_tree(src)
    assert proxy.stats.answered_503 >= 1 and proxy.stats.cuts >= 3


def test_engine_failed_upload_never_harms_the_previous_snapshot(
    real_backend: Backend, proxy: FaultProxy, tmp_path: Path
) -> None:
    store = through(real_backend, proxy, retry_budget_seconds="1.0")
    src = _tree(tmp_path / "state", 4, 500_000, "a")
    with TransferPool(4, name="fault-test") as pool:
        manager = BackupManager(store, pool, config=BackupConfig(chunk_size=2 * MiB))
        first = manager.upload("cp-1", {"st": src})
        manager.cleanup(first)
        before = read_tree(src)
        for i in range(4):
            (src / f"b-{i}.sst").write_bytes(os.urandom(600_000))
        (src / "a-0.sst").unlink()
        proxy.answer_503()  # outlasts the budget
        with pytest.raises(StateBackendError):
            manager.upload("cp-2", {"st": src})
        proxy.heal()
        direct = real_backend.open()
        assert verify_snapshot(direct, pool, first["st"]).ok
        RestoreManager(direct, pool).restore(first["st"], tmp_path / "restored")
    assert read_tree(tmp_path / "restored") == before
