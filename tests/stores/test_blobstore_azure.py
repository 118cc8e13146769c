"""Azure-specific behaviour of AzureBlobStore against Azurite: staged blocks, TTL index tags, the
conditional sweep delete, parallel ranged reads, start-up validation and secret-free errors."""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from spark_statebackend.errors import BlobStoreError, ConfigError, RetryBudgetExceededError, StateBackendError
from spark_statebackend.stores import open_blob_store
from spark_statebackend.stores.azure import AzureBlobStore
from spark_statebackend.stores.cloud import TTL_TAG
from tests.faultproxy import FaultProxy
from tests.servers.azurite import Azurite
from tests.servers.fixtures import Backend, make_backend
from tests.servers.process import free_port

pytestmark = pytest.mark.services
MiB = 1024 * 1024


@pytest.fixture
def az(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend("azurite", request, tmp_path)
    yield b
    b.close()


@pytest.fixture
def sdk(azurite_server: Azurite) -> BlobServiceClient:
    """A plain SDK client, to look at what the store wrote."""
    return BlobServiceClient.from_connection_string(azurite_server.connection_string())


def _store(b: Backend, **overrides: str) -> AzureBlobStore:
    s = b.open(**overrides)
    assert isinstance(s, AzureBlobStore)
    return s


def _fake_key() -> str:
    return base64.b64encode(os.urandom(64)).decode()


def test_a_large_file_is_committed_from_staged_blocks_with_metadata_and_ttl(
    az: Backend, sdk: BlobServiceClient
) -> None:
    store = _store(az)
    data = os.urandom(5 * MiB + 17)
    store.put("big", lambda: io.BytesIO(data), len(data), metadata={"kind": "chunk"}, ttl_seconds=600)
    blob = sdk.get_blob_client(store.root, store.prefix + "big")
    committed, uncommitted = blob.get_block_list("all")
    assert len(committed) == 6 and not uncommitted
    assert blob.get_blob_properties().metadata == {"kind": "chunk"}
    tag = blob.get_blob_tags()[TTL_TAG]
    assert len(tag) == 16 and int(tag) == store.stat("big").expires_at_ms
    assert blob.download_blob().readall() == data


def test_remove_ttl_drops_only_our_tag(az: Backend, sdk: BlobServiceClient) -> None:
    store = _store(az)
    store.put_bytes("t", b"x", ttl_seconds=60)
    blob = sdk.get_blob_client(store.root, store.prefix + "t")
    blob.set_blob_tags({**blob.get_blob_tags(), "owner": "someone-else"})
    store.remove_ttl("t")
    assert blob.get_blob_tags() == {"owner": "someone-else"}


def test_the_sweep_delete_is_conditional_on_the_tag_it_saw(az: Backend, sdk: BlobServiceClient) -> None:
    store = _store(az)
    store.put_bytes("race", b"x", ttl_seconds=60)
    name = store.prefix + "race"
    # The TTL changed between the sweep's listing and its delete: the delete must not happen.
    assert store._raw_delete_if_expired(name, "0000000000000001") is False
    assert store.exists("race")
    seen = sdk.get_blob_client(store.root, name).get_blob_tags()[TTL_TAG]
    assert store._raw_delete_if_expired(name, seen) is True
    assert not store.exists("race")


def test_ranged_reads_run_in_parallel_on_the_named_pool(az: Backend) -> None:
    data = os.urandom(6 * MiB + 5)
    _store(az).put("r", lambda: io.BytesIO(data), len(data))
    with FaultProxy(az.server_port) as proxy:
        store = _store(az, max_concurrency="3", **az.via_port(proxy.port))
        before = set(threading.enumerate())
        assert store.get_bytes("r", 1000) == data[1000:]
        pool_threads = {
            t.name for t in set(threading.enumerate()) - before if not t.name.startswith("faultproxy")
        }
        # Several connections at once (an idle one would have been reused), from the named pool.
        assert proxy.stats.connections >= 2
    assert 2 <= len(pool_threads) <= 3 and all(n.startswith("ssb-azure-") for n in pool_threads)


def test_ensure_ready_creates_the_container(az: Backend, sdk: BlobServiceClient) -> None:
    name = f"ssb-new-{uuid.uuid4().hex[:12]}"
    container = sdk.get_container_client(name)
    assert not container.exists()
    store = az.open(f"azure://{name}/some/prefix")
    assert container.exists()
    store.ensure_ready()  # again: already there is fine
    store.put_bytes("x", b"1")
    assert [b.name for b in container.list_blobs()] == ["some/prefix/x"]


def _assert_secret_free(exc: BaseException, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    shown = "".join(traceback.format_exception(exc)) + repr(exc)
    assert secret not in shown
    assert all(secret not in r.getMessage() for r in caplog.records)


def test_a_wrong_account_key_fails_clearly_and_never_shows_the_key(
    az: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = _fake_key()
    store = open_blob_store(az.url, {**az.options, **az.wrong_secret(key)})
    with pytest.raises(BlobStoreError) as info:
        store.ensure_ready()
    message = str(info.value)
    assert "refused the credentials" in message and az.url in message and "127.0.0.1" in message
    assert "403" in message
    assert not isinstance(info.value, RetryBudgetExceededError)  # not retried: it cannot succeed
    _assert_secret_free(info.value, key, caplog)
    store.close()


@pytest.mark.parametrize("bad_key", ["not-base64!!", "c2VjcmV0a2V5"[:-1]])
def test_a_malformed_account_key_fails_at_once_naming_the_url_never_the_key(
    az: Backend, bad_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(binascii.Error):
        base64.b64decode(bad_key)  # what the SDK does with the key before signing each request
    started = time.monotonic()
    with pytest.raises(StateBackendError) as info:
        opts = {**az.options, **az.wrong_secret(bad_key), "retry_budget_seconds": "20"}
        store = open_blob_store(az.url, opts)
        try:
            store.ensure_ready()
        finally:
            store.close()
    assert time.monotonic() - started < 5  # not retried: it cannot succeed
    assert not isinstance(info.value, RetryBudgetExceededError)
    assert az.url in str(info.value) and "account key" in str(info.value).lower()
    _assert_secret_free(info.value, bad_key, caplog)


def test_a_request_the_sdk_cannot_sign_is_a_final_credentials_error(az: Backend) -> None:
    # Defence in depth behind the check above: whatever makes signing fail is never retried.
    from azure.storage.blob._shared.authentication import AzureSigningError

    store = _store(az)
    info = store._classify(AzureSigningError("Invalid base64-encoded string"))
    assert info.kind != "transient"
    assert not store.policy.is_retriable(AzureSigningError("Invalid base64-encoded string"))


def test_a_wrong_endpoint_fails_within_the_budget_naming_it(
    az: Backend, azurite_server: Azurite, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = free_port()
    store = open_blob_store(
        az.url,
        {**az.options, **az.via_port(port), "retry_budget_seconds": "0.5", "connect_timeout_seconds": "0.5"},
    )
    with pytest.raises(RetryBudgetExceededError) as info:
        store.ensure_ready()
    assert f"127.0.0.1:{port}" in str(info.value) and "Connection refused" in str(info.value)
    _assert_secret_free(info.value, azurite_server.connection_string().split("AccountKey=")[1][:40], caplog)
    store.close()


def test_a_sas_token_never_appears_in_errors(az: Backend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sig = base64.urlsafe_b64encode(os.urandom(24)).decode()
    url = f"http://127.0.0.1:{free_port()}/devstoreaccount1?sv=2024-01-01&sp=rwdl&sig={sig}"
    store = open_blob_store(az.url, {"account_url": url, "retry_budget_seconds": "0.3"})
    with pytest.raises(RetryBudgetExceededError) as info:
        store.put_bytes("x", b"1")
    _assert_secret_free(info.value, sig, caplog)
    store.close()


def test_the_environment_provides_the_account(
    az: Backend, azurite_server: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string())
    store = open_blob_store(az.url, {"max_concurrency": "2"})
    store.ensure_ready()
    store.put_bytes("env", b"ok")
    assert store.get_bytes("env") == b"ok"
    store.close()


def test_configuration_errors_name_the_problem_and_hide_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_URL", raising=False)
    with pytest.raises(ConfigError, match="AZURE_STORAGE_CONNECTION_STRING"):
        open_blob_store("azure://c0ntainer/p")
    key = _fake_key()
    with pytest.raises(ConfigError, match="malformed") as info:
        open_blob_store("azure://c0ntainer/p", {"connection_string": f"AccountKey={key};nonsense"})
    assert key not in str(info.value)
    cs = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=eA==;BlobEndpoint=http://127.0.0.1:1/a;"
    for url, opts, match in [
        ("azure://Bad_Name/p", {}, "container name"),
        ("azure://ok-name/p", {"blok_size": "1"}, "unknown option"),
        ("azure://ok-name/p", {"max_concurrency": "many"}, "max_concurrency"),
        ("azure://ok-name/p", {"block_size": "0"}, "block_size"),
        ("azure://ok-name/p?sig=x", {}, "query"),
        ("azure://ok-name/../p", {}, "prefix"),
    ]:
        with pytest.raises(ConfigError, match=match):
            open_blob_store(url, {"connection_string": cs, **opts})
