"""S3-specific behaviour of S3BlobStore against SeaweedFS (a real server that checks signatures) and
moto: multipart uploads and their abort, TTL object tags, bucket creation, credentials and endpoint
from the standard chain, and clear, secret-free errors for wrong credentials and endpoints."""

from __future__ import annotations

import io
import logging
import os
import secrets
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_statebackend.errors import BlobStoreError, ConfigError, RetryBudgetExceededError
from spark_statebackend.stores import open_blob_store
from spark_statebackend.stores.cloud import TTL_TAG
from spark_statebackend.stores.s3 import S3BlobStore
from tests.servers.fixtures import Backend, make_backend
from tests.servers.process import free_port
from tests.servers.s3 import S3Server

pytestmark = pytest.mark.services
MiB = 1024 * 1024


@pytest.fixture(params=["seaweedfs", "moto"])
def s3(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Backend, S3Server]]:
    b = make_backend(request.param, request, tmp_path)
    server = request.getfixturevalue("seaweedfs_server" if request.param == "seaweedfs" else "moto_server")
    yield b, server
    b.close()


@pytest.fixture
def seaweed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Backend, S3Server]]:
    b = make_backend("seaweedfs", request, tmp_path)
    yield b, request.getfixturevalue("seaweedfs_server")
    b.close()


def _store(b: Backend, **overrides: str) -> S3BlobStore:
    s = b.open(**overrides)
    assert isinstance(s, S3BlobStore)
    return s


def test_a_large_file_is_a_multipart_upload_with_metadata_and_ttl(s3: tuple[Backend, S3Server]) -> None:
    b, server = s3
    store = _store(b)
    client: Any = server.client()
    data = os.urandom(11 * MiB + 1)
    store.put("big", lambda: io.BytesIO(data), len(data), metadata={"kind": "chunk"}, ttl_seconds=600)
    head = client.head_object(Bucket=store.root, Key=store.prefix + "big")
    assert head["ETag"].strip('"').endswith("-3") and head["Metadata"] == {"kind": "chunk"}
    tags = client.get_object_tagging(Bucket=store.root, Key=store.prefix + "big")["TagSet"]
    assert [t["Key"] for t in tags] == [TTL_TAG] and int(tags[0]["Value"]) == store.stat("big").expires_at_ms
    assert client.get_object(Bucket=store.root, Key=store.prefix + "big")["Body"].read() == data


def test_a_failed_multipart_upload_is_aborted(s3: tuple[Backend, S3Server]) -> None:
    b, server = s3
    store = _store(b)
    client: Any = server.client()
    with pytest.raises(BlobStoreError, match="source ended"):
        store.put("short", lambda: io.BytesIO(b"x" * (6 * MiB)), 12 * MiB)
    uploads = client.list_multipart_uploads(Bucket=store.root, Prefix=store.prefix).get("Uploads", [])
    assert uploads == []
    assert not store.exists("short")


def test_remove_ttl_drops_only_our_tag(s3: tuple[Backend, S3Server]) -> None:
    b, server = s3
    store = _store(b)
    client: Any = server.client()
    store.put_bytes("t", b"x", ttl_seconds=60)
    key = store.prefix + "t"
    tag_set = client.get_object_tagging(Bucket=store.root, Key=key)["TagSet"]
    client.put_object_tagging(
        Bucket=store.root, Key=key, Tagging={"TagSet": [*tag_set, {"Key": "owner", "Value": "other"}]}
    )
    store.remove_ttl("t")
    assert client.get_object_tagging(Bucket=store.root, Key=key)["TagSet"] == [
        {"Key": "owner", "Value": "other"}
    ]
    store.put_bytes("u", b"x", ttl_seconds=60)
    store.remove_ttl("u")
    assert client.get_object_tagging(Bucket=store.root, Key=store.prefix + "u")["TagSet"] == []


def test_the_sweep_keeps_a_blob_whose_ttl_changed_since_the_listing(s3: tuple[Backend, S3Server]) -> None:
    store = _store(s3[0])
    store.put_bytes("race", b"x", ttl_seconds=60)
    assert store._raw_delete_if_expired(store.prefix + "race", "0000000000000001") is False
    assert store.exists("race")


def test_ensure_ready_creates_the_bucket(s3: tuple[Backend, S3Server]) -> None:
    b, server = s3
    client: Any = server.client()
    bucket = f"ssb-new-{uuid.uuid4().hex[:12]}"
    assert bucket not in {x["Name"] for x in client.list_buckets()["Buckets"]}
    store = b.open(f"s3://{bucket}/p")
    assert bucket in {x["Name"] for x in client.list_buckets()["Buckets"]}
    store.ensure_ready()
    store.put_bytes("x", b"1")
    assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["p/x"]


def test_the_standard_chain_provides_endpoint_and_credentials(
    s3: tuple[Backend, S3Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, server = s3
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    store = open_blob_store(b.url, {"max_concurrency": "2"})
    store.ensure_ready()
    store.put_bytes("env", b"ok")
    assert store.get_bytes("env") == b"ok"
    store.close()


def _assert_secret_free(exc: BaseException, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    shown = "".join(traceback.format_exception(exc)) + repr(exc)
    assert secret not in shown
    assert all(secret not in r.getMessage() for r in caplog.records)


def test_a_wrong_secret_fails_clearly_and_is_never_shown(
    seaweed: tuple[Backend, S3Server], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    b, _ = seaweed
    secret = "wrong-" + secrets.token_urlsafe(24)
    store = open_blob_store(b.url, {**b.options, **b.wrong_secret(secret)})
    with pytest.raises(BlobStoreError) as info:
        store.ensure_ready()
    message = str(info.value)
    assert "refused the credentials" in message and b.url in message and "403" in message
    assert not isinstance(info.value, RetryBudgetExceededError)
    _assert_secret_free(info.value, secret, caplog)
    with pytest.raises(BlobStoreError, match="refused the credentials") as info:
        store.put_bytes("x", b"1")
    _assert_secret_free(info.value, secret, caplog)
    store.close()


def test_no_credentials_at_all_fails_clearly(
    s3: tuple[Backend, S3Server], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    b, server = s3
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = open_blob_store(b.url, {"endpoint_url": server.endpoint(), "region": "us-east-1"})
    with pytest.raises(BlobStoreError, match="credentials") as info:
        store.ensure_ready()
    assert not isinstance(info.value, RetryBudgetExceededError)
    store.close()


def test_a_wrong_endpoint_fails_within_the_budget_naming_it(
    seaweed: tuple[Backend, S3Server], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    b, server = seaweed
    port = free_port()
    store = open_blob_store(
        b.url,
        {**b.options, **b.via_port(port), "retry_budget_seconds": "0.5", "connect_timeout_seconds": "0.5"},
    )
    with pytest.raises(RetryBudgetExceededError) as info:
        store.ensure_ready()
    assert f"127.0.0.1:{port}" in str(info.value)
    _assert_secret_free(info.value, server.secret_key, caplog)
    store.close()


def test_configuration_errors_name_the_problem() -> None:
    base = {"endpoint_url": "http://127.0.0.1:1", "access_key_id": "a", "secret_access_key": "b"}
    for url, opts, match in [
        ("s3://Bad_Bucket/p", {}, "bucket name"),
        ("s3://ok-bucket/p", {"block_size": "4MiB"}, "block_size"),
        ("s3://ok-bucket/p", {"secret_access_key": ""}, "go together"),
        ("s3://ok-bucket/p", {"addressing_style": "sideways"}, "addressing_style"),
        ("s3://ok-bucket/p", {"endpoint_url": "ftp://x"}, "endpoint_url"),
        ("s3://ok-bucket/p", {"retry_budget_seconds": "-1"}, "retry_budget_seconds"),
        ("s3://ok-bucket/p", {"regoin": "x"}, "unknown option"),
        ("s3:///p", {}, "s3://<bucket>"),
    ]:
        with pytest.raises(ConfigError, match=match):
            open_blob_store(url, {**base, **opts})
