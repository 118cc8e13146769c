"""Enabling the backend: configure() sets the Spark keys and fails at start, naming the key or the
version, on bad config, an unreachable blob store, a missing jar or an unsupported Spark."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest

import spark_statebackend
from spark_statebackend.errors import ConfigError
from spark_statebackend.spark import enable as ssb_spark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def urls(tmp_path: Path) -> dict[str, str]:
    return {"blobStore.url": (tmp_path / "b").as_uri(), "checkpointLog.url": (tmp_path / "l").as_uri()}


def test_configure_sets_the_spark_keys(tmp_path: Path) -> None:
    conf = {"spark.jars": "/opt/other.jar", "spark.plugins": "x.Plugin"}
    spark_statebackend.configure(conf, **urls(tmp_path))
    assert conf["spark.jars"].split(",") == ["/opt/other.jar", str(ssb_spark.jar_path())]
    assert conf["spark.plugins"] == f"x.Plugin,{ssb_spark.PLUGIN_CLASS}"
    # Drop-in: Spark's own provider stays; the plugin installs the hooks at application start.
    assert "spark.sql.streaming.stateStore.providerClass" not in conf
    assert "spark.sql.streaming.checkpointFileManagerClass" not in conf
    # Only the driver's sidecar is pinned to this Python; executors resolve theirs as Spark does
    # (tests/spark/test_sidecar_python.py).
    assert conf["spark.statebackend.sidecar.driverPython"] == sys.executable
    assert "spark.statebackend.sidecar.python" not in conf
    assert conf["spark.statebackend.blobStore.url"] == (tmp_path / "b").as_uri()
    assert (tmp_path / "b").is_dir() and (tmp_path / "l").is_dir()  # resources created at start
    again = dict(conf)
    spark_statebackend.configure(again, **urls(tmp_path))
    assert again == conf  # idempotent


def test_configure_keeps_a_sidecar_python_the_user_set(tmp_path: Path) -> None:
    conf = {"spark.statebackend.sidecar.python": "/opt/venv/bin/python"}
    spark_statebackend.configure(conf, **urls(tmp_path))
    assert conf["spark.statebackend.sidecar.python"] == "/opt/venv/bin/python"
    assert "spark.statebackend.sidecar.driverPython" not in conf, "sidecar.python already covers the driver"
    mine = {"spark.statebackend.sidecar.driverPython": "/driver/python"}
    spark_statebackend.configure(mine, **urls(tmp_path))
    assert mine["spark.statebackend.sidecar.driverPython"] == "/driver/python"


def test_an_unset_url_is_left_to_the_plugin_and_refused_for_a_cluster_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configure() once wrote the driver's file:// defaults into the conf, so the plugin's refusal of
    an unset URL on a non-local master never fired: on YARN each executor got a store of its own."""
    monkeypatch.chdir(tmp_path)
    conf = {"spark.master": "local[2]"}
    spark_statebackend.configure(conf)
    assert "spark.statebackend.blobStore.url" not in conf, "the plugin resolves the default at start"
    assert "spark.statebackend.checkpointLog.url" not in conf
    for master in ("yarn", "spark://host:7077", "k8s://https://api:443"):
        refused = rf"blobStore\.url: is not set; with master {re.escape(master)}"
        with pytest.raises(ConfigError, match=refused):
            spark_statebackend.configure({"spark.master": master})
    with pytest.raises(ConfigError, match=r"spark\.statebackend\.checkpointLog\.url: is not set"):
        spark_statebackend.configure(
            {"spark.master": "yarn", "spark.statebackend.blobStore.url": (tmp_path / "b").as_uri()}
        )
    shared = {"spark.master": "yarn", **{f"spark.statebackend.{k}": v for k, v in urls(tmp_path).items()}}
    spark_statebackend.configure(shared)  # set explicitly: fine on any master


def test_unknown_url_scheme_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"spark\.statebackend\.blobStore\.url: unknown URL scheme"):
        spark_statebackend.configure({}, **{**urls(tmp_path), "blobStore.url": "gs://bucket/x"})


def test_unreachable_blob_store_fails_at_start(tmp_path: Path) -> None:
    settings = {
        **urls(tmp_path),
        "blobStore.url": "s3://bucket/prefix",
        "blobStore.options.endpoint_url": f"http://127.0.0.1:{_free_port()}",
        "blobStore.options.retry_budget_seconds": "1",
        "blobStore.options.access_key_id": "AKIAEXAMPLE",
        "blobStore.options.secret_access_key": "not-a-real-secret",
    }
    with pytest.raises(ConfigError, match=r"spark\.statebackend\.blobStore\.url: blob store unusable") as err:
        spark_statebackend.configure({}, **settings)
    assert "not-a-real-secret" not in str(err.value)


def test_unreachable_kafka_log_fails_at_start(tmp_path: Path) -> None:
    settings = {
        **urls(tmp_path),
        "checkpointLog.url": f"kafka://127.0.0.1:{_free_port()}/checkpoints",
        "checkpointLog.options.admin.timeout.ms": "2000",
    }
    with pytest.raises(
        ConfigError, match=r"spark\.statebackend\.checkpointLog\.url: checkpoint log unusable"
    ):
        spark_statebackend.configure({}, **settings)


def test_missing_jar_names_spark_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssb_spark, "jar_path", lambda: tmp_path / "nope.jar")
    with pytest.raises(ConfigError, match=r"spark\.jars: the shim jar .*nope\.jar is missing"):
        spark_statebackend.configure({}, **urls(tmp_path))


def test_unsupported_spark_version_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", "4.0.5")
    with pytest.raises(ConfigError, match=r"Spark 4\.0\.5 is not supported"):
        spark_statebackend.configure({}, **urls(tmp_path))


def test_bad_value_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"spark\.statebackend\.transfer\.workers"):
        spark_statebackend.configure({}, **{**urls(tmp_path), "transfer.workers": "lots"})


def test_jvm_read_keys_are_validated_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"spark\.statebackend\.localCheckpointFileManager"):
        spark_statebackend.configure({}, **{**urls(tmp_path), "localCheckpointFileManager": "maybe"})
    with pytest.raises(ConfigError, match=r"spark\.statebackend\.sidecar\.mode"):
        spark_statebackend.configure({}, **{**urls(tmp_path), "sidecar.mode": "driver"})
