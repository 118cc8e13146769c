"""What the plugin decides at application start, before any session exists: the default locations
of the blob store and checkpoint log are for one-host masters only (issue 12: safe defaults)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_statebackend.spark import enable as ssb_spark

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession
master, conf = sys.argv[1], json.loads(sys.argv[2])
b = SparkSession.builder.master(master).appName("ssb-plugin-start")
for k, v in conf.items():
    b = b.config(k, v)
try:
    spark = b.getOrCreate()
except Exception as e:
    print("START-FAILED", str(e).replace("\n", " ")[:4000], flush=True)
    sys.exit(3)
print("CONF " + json.dumps(dict(spark.sparkContext.getConf().getAll())), flush=True)
spark.stop()
"""


def start(master: str, cwd: Path, **conf: str) -> tuple[int, str]:
    base = {
        "spark.jars": str(ssb_spark.jar_path()),
        "spark.plugins": ssb_spark.PLUGIN_CLASS,
        "spark.statebackend.sidecar.python": sys.executable,
        "spark.statebackend.spoolDir": str(cwd / "spool"),
        "spark.ui.enabled": "false",
    }
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, master, json.dumps({**base, **conf})],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_local_master_gets_the_defaults_resolved_once_on_the_driver(tmp_path: Path) -> None:
    code, out = start("local[1]", tmp_path)
    assert code == 0, out[-3000:]
    conf = json.loads(next(line[5:] for line in out.splitlines() if line.startswith("CONF ")))
    assert conf["spark.statebackend.blobStore.url"] == (tmp_path / "spark-statebackend" / "blobs").as_uri()
    assert (
        conf["spark.statebackend.checkpointLog.url"]
        == (tmp_path / "spark-statebackend" / "checkpoints").as_uri()
    )


def test_a_cluster_master_without_a_blob_store_url_fails_at_start_saying_why(tmp_path: Path) -> None:
    # No master runs at this address: the plugin decides before Spark ever connects to it.
    code, out = start("spark://127.0.0.1:9", tmp_path)
    assert code != 0
    assert "START-FAILED" in out, out[-3000:]
    assert "spark.statebackend.blobStore.url is not set; with master spark://127.0.0.1:9" in out
    assert "executors do not share the driver's disk" in out
    assert not (tmp_path / "spark-statebackend").exists(), "nothing was created under the driver's cwd"


LINKING_FS = "dev.statebackend.spark.LinkingLocalFileSystem"


def _conf(out: str) -> dict[str, str]:
    line = next(line for line in out.splitlines() if line.startswith("CONF "))
    found: dict[str, str] = json.loads(line[5:])
    return found


@pytest.mark.parametrize(
    ("extra", "installed"),
    [
        ({}, True),
        ({"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem"}, False),
        ({"fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem"}, False),
        ({"spark.statebackend.linkSstFiles": "false"}, False),
    ],
    ids=["default", "user-fs-spark-hadoop-key", "user-fs-bare-key", "switched-off"],
)
def test_the_linking_file_system_is_installed_unless_the_user_chose_one(
    tmp_path: Path, extra: dict[str, str], installed: bool
) -> None:
    code, out = start("local[1]", tmp_path, **extra)
    assert code == 0, out[-3000:]
    conf = _conf(out)
    if installed:
        assert conf["fs.file.impl"] == LINKING_FS
        assert conf["fs.file.impl.disable.cache"] == "true"
    else:
        assert conf.get("fs.file.impl") != LINKING_FS
        assert "fs.file.impl.disable.cache" not in conf
        for key, value in extra.items():  # the user's choice is left exactly as it was
            assert conf[key] == value


def test_a_bad_link_sst_files_value_fails_the_start_naming_the_key(tmp_path: Path) -> None:
    code, out = start("local[1]", tmp_path, **{"spark.statebackend.linkSstFiles": "sometimes"})
    assert code != 0 and "START-FAILED" in out, out[-3000:]
    assert "spark.statebackend.linkSstFiles" in out
