"""Configuration: every key validated with an error naming it; the README documents every key."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_statebackend.config import KEYS, PREFIX, Settings, parse_duration, parse_size
from spark_statebackend.errors import ConfigError

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


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
        ("chunkSize", "0", "positive"),
        ("blobTtl", "forever", "not a duration"),
        # Read by the JVM shim too (Spark's parser): refused at start, not at the first commit.
        ("maxCommitDelay", "2.0s", "whole number with a unit"),
        ("commitTimeout", "60", "whole number with a unit"),
        ("restoreTimeout", "1.5min", "whole number with a unit"),
        ("checksumAllFiles", "maybe", "not a boolean"),
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


def test_backend_options_pass_through() -> None:
    s = Settings.from_conf(
        {
            PREFIX + "blobStore.options.endpoint_url": "http://x",
            PREFIX + "checkpointLog.options.partitions": "3",
        }
    )
    assert s.blob_options == {"endpoint_url": "http://x"} and s.log_options == {"partitions": "3"}


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_readme_documents_every_key_with_its_default(key) -> None:  # type: ignore[no-untyped-def]
    line = next((ln for ln in README.splitlines() if ln.startswith(f"| `{PREFIX}{key.name}`")), None)
    assert line is not None, f"{key.name} is missing from the README's configuration table"
    if key.default:
        assert f"`{key.default}`" in line


def test_the_sidecar_reads_restore_timeout_as_the_jvm_does() -> None:
    # The sidecar places restored files only while the JVM still waits, so both must agree on the wait:
    # the JVM's restoreTimeoutMs (whole milliseconds) wins over restoreTimeout.
    assert Settings.from_conf({PREFIX + "restoreTimeoutMs": "1500"}).restore_timeout_seconds == 1.5
    both = {PREFIX + "restoreTimeoutMs": "60000", PREFIX + "restoreTimeout": "2min"}
    assert Settings.from_conf(both).restore_timeout_seconds == 60.0
    assert Settings.from_conf({PREFIX + "restoreTimeout": "2min"}).restore_timeout_seconds == 120.0
    with pytest.raises(ConfigError, match="restoreTimeoutMs"):
        Settings.from_conf({PREFIX + "restoreTimeoutMs": "2s"})
