"""The example spark-defaults.conf files in conf/ stay true: each, with its placeholders filled for a
real server (Azurite, SeaweedFS, Tansu), passes the start-up validation the plugin runs (every key
checked, the blob store and checkpoint log contacted), and the file:// one runs a real streaming job
through spark-submit --properties-file with nothing else set."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pyspark
import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.spark import enable as ssb_spark
from tests.paths import ROOT
from tests.servers.azurite import Azurite
from tests.servers.s3 import S3Server
from tests.servers.tansu import KafkaBroker

CONF = ROOT / "conf"


def parse(text: str) -> dict[str, str]:
    """spark-defaults.conf: `key<whitespace>value` lines, `#` comments (Spark's own reader's rules)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        out[key] = value.strip()
    return out


def fill(name: str, values: dict[str, str]) -> dict[str, str]:
    text = (CONF / name).read_text()
    for placeholder, value in values.items():
        text = text.replace(f"<{placeholder}>", value)
    left = re.findall(r"<[^>]+>", text)
    assert not left, f"{name}: placeholders the test does not fill: {left}"
    return parse(text)


def validate(conf: dict[str, str], tmp_path: Path, env: dict[str, str] | None = None) -> None:
    """What the plugin runs at application start (StateBackendPlugin.validateInPython)."""
    f = tmp_path / f"conf-{uuid.uuid4().hex[:6]}.json"
    f.write_text(json.dumps({k: v for k, v in conf.items() if k.startswith("spark.statebackend.")}))
    proc = subprocess.run(
        [
            conf["spark.statebackend.sidecar.python"],
            "-m",
            "spark_statebackend.spark.validate",
            "--conf",
            str(f),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("valid: Python ") and ", blob store " in proc.stdout, proc.stdout


def common(tmp_path: Path) -> dict[str, str]:
    return {"jar": str(ssb_spark.jar_path()), "python": sys.executable, "shared dir": str(tmp_path)}


def test_every_example_is_listed_and_enables_the_plugin_only() -> None:
    files = sorted(p.name for p in CONF.glob("spark-defaults.*.conf"))
    assert files == [
        "spark-defaults.azure.conf",
        "spark-defaults.file.conf",
        "spark-defaults.kafka.conf",
        "spark-defaults.s3.conf",
    ]
    readme = (CONF / "README.md").read_text()
    for name in files:
        assert f"`{name}`" in readme
        conf = parse((CONF / name).read_text())
        assert conf["spark.plugins"] == ssb_spark.PLUGIN_CLASS
        # The drop-in: nothing pins a class of ours into a query's checkpoint.
        assert "spark.sql.streaming.stateStore.providerClass" not in conf


@pytest.mark.services
def test_azure_example_validates_against_azurite(azurite_server: Azurite, tmp_path: Path) -> None:
    conf = fill(
        "spark-defaults.azure.conf",
        {
            **common(tmp_path),
            "container": f"ex-{uuid.uuid4().hex[:8]}",
            "prefix": "state",
            "connection string": azurite_server.connection_string(),
        },
    )
    validate(conf, tmp_path)


@pytest.mark.services
def test_s3_example_validates_against_seaweedfs(seaweedfs_server: S3Server, tmp_path: Path) -> None:
    conf = fill(
        "spark-defaults.s3.conf",
        {
            **common(tmp_path),
            "bucket": f"ex-{uuid.uuid4().hex[:8]}",
            "prefix": "state",
            "region": "us-east-1",
            "endpoint url": seaweedfs_server.endpoint(),
        },
    )
    creds = {k: v for k, v in seaweedfs_server.env().items() if k.startswith("AWS_") and "ENDPOINT" not in k}
    validate(conf, tmp_path, env=creds)


@pytest.mark.services
def test_kafka_example_validates_against_tansu_and_seaweedfs(
    kafka_broker: KafkaBroker, seaweedfs_server: S3Server, tmp_path: Path
) -> None:
    conf = fill(
        "spark-defaults.kafka.conf",
        {
            **common(tmp_path),
            "bucket": f"ex-{uuid.uuid4().hex[:8]}",
            "prefix": "state",
            "region": "us-east-1",
            "endpoint url": seaweedfs_server.endpoint(),
            "bootstrap servers": kafka_broker.bootstrap,
            "topic": f"ex-{uuid.uuid4().hex[:8]}",
            "replication factor": "1",
        },
    )
    creds = {k: v for k, v in seaweedfs_server.env().items() if k.startswith("AWS_") and "ENDPOINT" not in k}
    validate(conf, tmp_path, env=creds)


JOB = r"""
import sys
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.master("local[2]").appName("ssb-conf-example").getOrCreate()
rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 20).load()
q = (rows.groupBy((F.col("value") % 3).alias("k")).count().writeStream.format("noop")
     .outputMode("update").option("checkpointLocation", sys.argv[1]).trigger(availableNow=True).start())
q.awaitTermination(180)
print("QUERY", q.id, flush=True)
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_file_example_runs_a_job_with_spark_submit_and_nothing_else(tmp_path: Path) -> None:
    conf = fill("spark-defaults.file.conf", common(tmp_path))
    validate(conf, tmp_path)
    props = tmp_path / "spark-defaults.conf"
    props.write_text("".join(f"{k} {v}\n" for k, v in conf.items()))
    job = tmp_path / "job.py"
    job.write_text(JOB)
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(submit), "--properties-file", str(props), "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.statebackend.spoolDir={tmp_path / 'spool'}", str(job), str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    qid = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("QUERY "))
    log = open_checkpoint_log(conf["spark.statebackend.checkpointLog.url"])
    latest = log.read_latest(qid)
    assert latest is not None and latest.batch_id >= 0, "the job's batch was checkpointed"
    assert latest.markers("blobstore"), "with its state markers"
