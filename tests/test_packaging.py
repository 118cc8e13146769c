"""Packaging: optional backends as extras with a message naming the extra, the pyspark version check,
and a wheel built from a clean checkout that carries the jar (built from `git archive` of HEAD and
installed into a fresh virtualenv)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.errors import ConfigError


@pytest.fixture
def fresh_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Forget our backend modules so the next open_* imports them again (under the test's patches)."""
    for name in list(sys.modules):
        if name.startswith(("spark_statebackend.blobstore.", "spark_statebackend.checkpointlog.")) and (
            name.rsplit(".", 1)[1] in ("azure", "s3", "kafka", "_cloud")
        ):
            monkeypatch.delitem(sys.modules, name)
    yield monkeypatch


@pytest.mark.parametrize(
    ("missing", "url", "extra"),
    [
        ("azure.storage.blob", "azure://container/prefix", "azure"),
        ("boto3", "s3://bucket/prefix", "s3"),
    ],
)
def test_missing_blob_store_extra_is_named(
    fresh_imports: pytest.MonkeyPatch, missing: str, url: str, extra: str
) -> None:
    from spark_statebackend.blobstore import open_blob_store

    fresh_imports.setitem(sys.modules, missing, None)  # makes `import <missing>` raise ImportError
    with pytest.raises(ConfigError) as err:
        open_blob_store(url, {}, key="spark.statebackend.blobStore.url")
    assert err.value.key == "spark.statebackend.blobStore.url"
    assert f"need the [{extra}] extra" in str(err.value)
    assert f"pip install 'spark-statebackend[{extra}]'" in str(err.value)
    assert missing in str(err.value)


def test_missing_kafka_extra_is_named(fresh_imports: pytest.MonkeyPatch) -> None:
    from spark_statebackend.checkpointlog import open_checkpoint_log

    fresh_imports.setitem(sys.modules, "confluent_kafka", None)
    with pytest.raises(ConfigError, match=r"kafka:// URLs need the \[kafka\] extra") as err:
        open_checkpoint_log("kafka://127.0.0.1:9092/t", {}, key="--log")
    assert err.value.key == "--log"


def test_file_urls_need_no_extra(fresh_imports: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from spark_statebackend.blobstore import open_blob_store
    from spark_statebackend.checkpointlog import open_checkpoint_log

    for name in ("azure.storage.blob", "boto3", "confluent_kafka"):
        fresh_imports.setitem(sys.modules, name, None)
    assert open_blob_store((tmp_path / "b").as_uri()).url == (tmp_path / "b").as_uri()
    assert open_checkpoint_log((tmp_path / "l").as_uri()).url == (tmp_path / "l").as_uri()
