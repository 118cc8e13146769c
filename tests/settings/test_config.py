"""Configuration: every key validated with an error naming it (the table: test_config_table.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.common.urls import redact_url
from spark_statebackend.errors import ConfigError
from spark_statebackend.settings import PREFIX, Settings, parse_duration, parse_size
from spark_statebackend.stores import open_blob_store
from spark_statebackend.stores.cloud import parse_settings


def test_defaults(tmp_path: Path) -> None:
    s = Settings.from_conf({}, cwd=tmp_path)
    assert s.blob_url == (tmp_path / "spark-statebackend" / "blobs").as_uri()
    assert s.log_url == (tmp_path / "spark-statebackend" / "checkpoints").as_uri()
    assert (s.workers, s.chunk_size, s.small_file_bytes, s.retain_checkpoints) == (8, 64 << 20, 1 << 20, 1)
    assert (s.max_commit_delay_seconds, s.blob_ttl_seconds) == (60.0, 7 * 86400.0)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("blobStore.url", "ftp://x/y", "unknown URL scheme"),
        ("checkpointLog.url", "s3://b/p", "unknown URL scheme"),
        ("transfer.workers", "0", "outside"),
        ("transfer.workers", "many", "not a whole number"),
        ("chunkSize", "big", "not a size"),
        ("chunkSize", "0", "at least 1 B"),
        ("blobTtl", "forever", "not a duration"),
        # Read by the JVM shim too (Spark's parser): refused at start, not at the first commit.
        ("maxCommitDelay", "2.0s", "fractions are not accepted"),
        ("commitTimeout", "60", "has no unit"),
        ("restoreTimeout", "1.5min", "fractions are not accepted"),
        ("maxCommitDelay", "-1s", "must not be negative"),
        # Issue 11 item 7: a zero timeout or TTL, or a TTL inside commitTimeout + gc's grace.
        ("blobTtl", "0", "at least 1ms"),
        ("blobTtl", "6h", "at least spark.statebackend.commitTimeout"),
        ("commitTimeout", "0s", "at least 1ms"),
        ("restoreTimeout", "0", "at least 1ms"),
        ("restoreTimeoutMs", "0", "out of range"),
        ("restoreTimeoutMs", "10s", "not a whole number of milliseconds"),
        ("checksumAllFiles", "maybe", "not a boolean"),
        # The shim reads booleans as Spark does (true/false only): refuse what it would refuse.
        ("enabled", "yes", "not a boolean"),
        ("localCheckpointFileManager", "1", "not a boolean"),
        ("sidecar.mode", "proces", "expected one of process, none"),
        ("hardLinkCheckpoint", "true", "unknown key"),
        ("chunkSize", "1.5m", "fractions"),
        ("retainCheckpoints", "-1", "outside"),
        ("chunksize", "1MiB", "unknown key"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as err:
        Settings.from_conf({PREFIX + key: value})
    assert err.value.key == PREFIX + key


def test_units() -> None:
    assert (
        parse_size("64MiB", "k") == 64 << 20
        and parse_size("512k", "k") == 512 << 10
        and parse_size("7", "k") == 7
    )
    assert (
        parse_duration("500ms", "k") == 0.5
        and parse_duration("10min", "k") == 600
        and parse_duration("2d", "k") == 172800
    )


def test_blob_ttl_floor_follows_commit_timeout() -> None:
    ok = Settings.from_conf({PREFIX + "commitTimeout": "10s", PREFIX + "blobTtl": "370min"})
    assert ok.blob_ttl_seconds == 370 * 60 and ok.commit_timeout_seconds == 10
    with pytest.raises(ConfigError, match=r"i\.e\. 25h") as err:
        Settings.from_conf({PREFIX + "commitTimeout": "19h", PREFIX + "blobTtl": "1d"})
    assert err.value.key == PREFIX + "blobTtl"


def test_values_are_spark_grammar_case_insensitive() -> None:
    s = Settings.from_conf(
        {
            PREFIX + "maxCommitDelay": "1500MS",
            PREFIX + "commitTimeout": "2H",
            PREFIX + "chunkSize": "8MB",
            PREFIX + "enabled": "FALSE",
            PREFIX + "sidecar.mode": "Process",
        }
    )
    assert (s.max_commit_delay_seconds, s.commit_timeout_seconds, s.chunk_size, s.enabled) == (
        1.5,
        7200.0,
        8 << 20,
        False,
    )
    assert Settings.from_conf({PREFIX + "maxCommitDelay": "0"}).max_commit_delay_seconds == 0


def test_restore_timeout_ms_is_deprecated_but_read_like_the_shim(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        s = Settings.from_conf({PREFIX + "restoreTimeoutMs": "90000"})
    assert s.restore_timeout_seconds == 90.0  # the shim reads restoreTimeoutMs first; so do we now
    assert (
        Settings.from_conf(
            {PREFIX + "restoreTimeoutMs": "90000", PREFIX + "restoreTimeout": "90s"}
        ).restore_timeout_seconds
        == 90.0
    )
    with pytest.raises(ConfigError, match="contradicts") as err:
        Settings.from_conf({PREFIX + "restoreTimeoutMs": "90000", PREFIX + "restoreTimeout": "10min"})
    assert err.value.key == PREFIX + "restoreTimeoutMs"


def test_cloud_options_new_names_and_deprecated_ones(caplog: pytest.LogCaptureFixture) -> None:
    new = parse_settings(
        {
            "retry_budget": "2min",
            "read_timeout": "1500ms",
            "block_size": "16m",
            "retry_initial_backoff": "1ms",
        },
        "--blob-url",
        (),
    )
    assert (new.retry_budget_seconds, new.read_timeout_seconds, new.block_size) == (120.0, 1.5, 16 << 20)
    with caplog.at_level("WARNING"):
        old = parse_settings({"retry_budget_seconds": "0.5", "connect_timeout_seconds": "3"}, "k", ())
    assert (old.retry_budget_seconds, old.connect_timeout_seconds) == (0.5, 3.0)
    assert any("retry_budget_seconds is deprecated" in r.getMessage() for r in caplog.records)
    assert parse_settings({"retry_budget": "0"}, "k", ()).retry_budget_seconds == 0  # 0: no retries
    for opts, named in (
        ({"retry_budget": "30"}, "retry_budget"),  # no unit
        ({"read_timeout": "0s"}, "read_timeout"),
        ({"retry_budget": "1s", "retry_budget_seconds": "1"}, "retry_budget_seconds"),
        ({"block_size": "1.5m"}, "block_size"),
        ({"retry_budget_secs": "1"}, "options"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_settings(opts, "--blob-url", ())
        assert named in err.value.key, (opts, err.value)


def test_checkpoint_log_timeouts_new_names_and_deprecated_ones(tmp_path: Path) -> None:
    url = (tmp_path / "log").as_uri()
    assert open_checkpoint_log(url, {"timeout": "5s"})._timeout_s == 5.0  # type: ignore[attr-defined]
    assert open_checkpoint_log(url, {"timeout.ms": "2500"})._timeout_s == 2.5  # type: ignore[attr-defined]
    for opts, problem in (
        ({"timeout": "5000"}, "has no unit"),
        ({"timeout.ms": "5s"}, "not a whole number of milliseconds"),
        ({"timeout": "5s", "timeout.ms": "5000"}, "deprecated spelling of 'timeout'"),
    ):
        with pytest.raises(ConfigError, match=problem):
            open_checkpoint_log(url, opts)
    kafka = open_checkpoint_log("kafka://h:1/t", {"read.timeout": "2s", "transaction.timeout.ms": "5000"})
    assert (kafka.read_timeout_s, kafka.transaction_timeout_ms) == (2.0, 5000)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="at least 1000 ms"):
        open_checkpoint_log("kafka://h:1/t", {"transaction.timeout": "500ms"})


def test_unknown_file_store_options_are_refused(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    with pytest.raises(ConfigError, match=r"unknown option\(s\) fsnyc for a file:// store") as err:
        open_blob_store(url, {"fsnyc": "false"}, key="--blob-url")
    assert err.value.key == "--blob-url options"
    with pytest.raises(ConfigError, match="not a boolean") as err:
        open_blob_store(url, {"fsync": "flase"}, key="--blob-url")
    assert err.value.key == "--blob-url option fsync"
    store = open_blob_store(url, {"fsync": "false", "whole_files": "no"})
    assert (store.fsync, store.whole_file_blobs) == (False, False)  # type: ignore[attr-defined]
    assert not (tmp_path / "blobs").exists()  # opening creates nothing


def test_backend_options_pass_through() -> None:
    s = Settings.from_conf(
        {
            PREFIX + "blobStore.options.endpoint_url": "http://x",
            PREFIX + "checkpointLog.options.partitions": "3",
        }
    )
    assert s.blob_options == {"endpoint_url": "http://x"} and s.log_options == {"partitions": "3"}


def test_the_sidecar_reads_restore_timeout_as_the_jvm_does() -> None:
    # The sidecar places restored files only while the JVM still waits, so both must agree on the wait:
    # the deprecated restoreTimeoutMs (whole milliseconds) is read as the JVM reads it, and a
    # restoreTimeout that says otherwise is refused (Conf.java refuses the same pair).
    assert Settings.from_conf({PREFIX + "restoreTimeoutMs": "1500"}).restore_timeout_seconds == 1.5
    both = {PREFIX + "restoreTimeoutMs": "60000", PREFIX + "restoreTimeout": "2min"}
    with pytest.raises(ConfigError, match="contradicts"):
        Settings.from_conf(both)
    same = {PREFIX + "restoreTimeoutMs": "120000", PREFIX + "restoreTimeout": "2min"}
    assert Settings.from_conf(same).restore_timeout_seconds == 120.0
    assert Settings.from_conf({PREFIX + "restoreTimeout": "2min"}).restore_timeout_seconds == 120.0
    with pytest.raises(ConfigError, match="restoreTimeoutMs"):
        Settings.from_conf({PREFIX + "restoreTimeoutMs": "2s"})


#: An AWS-style secret key holds '/' and '+': the redaction must not stop at the first '/'.
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSECRETKEY"
CREDENTIAL_URLS = [
    ("blobStore.url", f"s3://AKIAIDNOTREAL:{SECRET}@bucket/prefix", "s3://***@bucket/prefix"),
    ("blobStore.url", f"azure://account:{SECRET}@container/p", "azure://***@container/p"),
    ("blobStore.url", f"file://user:{SECRET}@/x", "file://***@/x"),
    ("blobStore.url", f"ftp://user:{SECRET}@host/x", "ftp://***@host/x"),  # unknown scheme too
    ("checkpointLog.url", f"kafka://user:{SECRET}@broker:9092/topic", "kafka://***@broker:9092/topic"),
    ("checkpointLog.url", f"file://user:{SECRET}@localhost/x", "file://***@localhost/x"),
]


@pytest.mark.parametrize(("key", "url", "shown"), CREDENTIAL_URLS)
def test_credentials_in_a_url_are_refused_without_repeating_them(key: str, url: str, shown: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_conf({PREFIX + key: url})
    assert err.value.key == PREFIX + key
    message = str(err.value)
    assert shown in message and "credentials" in message, message
    assert SECRET not in message and "K7MDENG" not in message and "user" not in message.split(shown)[0]
    assert "AKIAIDNOTREAL" not in message


@pytest.mark.parametrize(("key", "url", "shown"), CREDENTIAL_URLS)
def test_open_refuses_credentials_in_a_url_naming_the_key(key: str, url: str, shown: str) -> None:
    opener = open_blob_store if key == "blobStore.url" else open_checkpoint_log
    with pytest.raises(ConfigError) as err:
        opener(url, {}, key="--the-flag")
    assert err.value.key == "--the-flag" and shown in str(err.value) and SECRET not in str(err.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("file:///data/a@b/c", "file:///data/a@b/c"),  # an '@' in a local path is not userinfo
        ("file://localhost/data/a@b", "file://localhost/data/a@b"),
        ("kafka://h1:9092,h2:9092/t", "kafka://h1:9092,h2:9092/t"),
        ("s3://KEY:SE/CR@ET@bucket/p", "s3://***@bucket/p"),  # up to the last '@'
        ("kafka://user@h:9092/t", "kafka://***@h:9092/t"),  # a user name alone is userinfo too
        ("S3://k:s@b", "S3://***@b"),
        ("user:secret@host:9092/topic", "***@host:9092/topic"),  # no scheme: the authority still
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
