"""Executors run their sidecars with their own Python (issue 22 item 3), with real Spark on a
local-cluster master (executor JVMs apart from the driver's, as on a cluster):

- configure() pins only the driver's sidecar to the Python it runs in; an executor takes the Python
  Spark gives its PySpark workers (spark.pyspark.python here, as with a venv shipped by --archives);
  the JVM's rule (Conf.sidecarPython) is checked case by case through py4j;
- an executor whose Python cannot run the sidecar (no spark-statebackend in it) fails at its start,
  naming the Python, the key it came from, the key to set and the sidecar log: the application fails
  within minutes instead of restarting the sidecar and blocking commits until commitTimeout.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import TESTS

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

JOB = TESTS / "stubs" / "sidecar_python_job.py"


def wrapper(path: Path, calls: Path, *python_flags: str) -> Path:
    """An executable that records its argv in `calls`, then runs this venv's Python (with flags)."""
    flags = " ".join(python_flags)
    path.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {sys.executable} {flags} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run_job(tmp_path: Path, conf: dict[str, str], timeout: float) -> str:
    args = {
        "master": "local-cluster[1,1,1024]",
        "conf": {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.executor.cores": "1",
            **conf,
        },
        "ssb": {
            "blobStore.url": (tmp_path / "blobs").as_uri(),
            "checkpointLog.url": (tmp_path / "log").as_uri(),
            "spoolDir": str(tmp_path / "spool"),
        },
        "checkpoint": str(tmp_path / "ckpt"),
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    proc = subprocess.run(
        [sys.executable, str(JOB), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=env,
    )
    return proc.stdout + proc.stderr


def line(out: str, prefix: str) -> str:
    found = [ln[len(prefix) + 1 :] for ln in out.splitlines() if ln.startswith(prefix + " ")]
    assert found, f"no {prefix} line in:\n{out[-5000:]}"
    return found[-1]


def test_executors_take_spark_pyspark_python_and_the_driver_keeps_configures(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    python = wrapper(tmp_path / "executor-python", calls)
    out = run_job(tmp_path, {"spark.pyspark.python": str(python)}, timeout=400)
    assert json.loads(line(out, "QUERY-OK")) == {str(k): 4 for k in range(5)}  # one batch of 20 rows
    recorded = calls.read_text().splitlines() if calls.exists() else []
    # The executor checked its Python, then ran its sidecar with it; the driver never used it.
    assert any("spark_statebackend.spark.validate" in c and "--offline" in c for c in recorded), recorded
    assert any("spark_statebackend.runtime.sidecar" in c and "--executor-id 0" in c for c in recorded), (
        recorded
    )
    assert not any("--executor-id driver" in c for c in recorded), recorded

    rules = json.loads(line(out, "RULES"))
    py3 = "python3"
    expected = [
        # nothing set: Spark's default on both sides
        {"driver": py3, "executor": py3},
        # environment only: each side its own variable first
        {"driver": "/env/driver-py", "executor": "/env/py"},
        # spark.pyspark.python wins over the environment, on both sides (spark-submit's order)
        {"driver": "./environment/bin/python", "executor": "./environment/bin/python"},
        {"driver": "/d/py", "executor": "./environment/bin/python"},
        # configure()'s Python is the driver's: the executors' archive path never reaches the driver
        {"driver": "/configure/py", "executor": "./environment/bin/python"},
        # an explicit sidecar.python is used everywhere
        {"driver": "/explicit/py", "executor": "/explicit/py"},
        # local-cluster: executors on the driver's host take configure()'s Python; a cluster's do not
        {"driver": "/configure/py", "executor": "/configure/py"},
        {"driver": "/configure/py", "executor": py3},
    ]
    assert [{side: r[side][0] for side in r} for r in rules] == expected
    assert rules[2]["executor"][1] == "spark.pyspark.python"
    assert rules[1]["executor"][1] == "environment variable PYSPARK_PYTHON"


def test_an_executor_python_without_the_package_fails_at_executor_start(tmp_path: Path) -> None:
    """-I -S: this venv's interpreter without its site-packages, i.e. without spark-statebackend.
    Without the check the sidecar died at once, was restarted five times, and the first commit waited
    for commitTimeout (30 min): this run's own timeout is the bound."""
    calls = tmp_path / "calls.txt"
    python = wrapper(tmp_path / "bare-python", calls, "-I", "-S")
    conf = {"spark.pyspark.python": str(python), "spark.deploy.maxExecutorRetries": "1"}
    out = run_job(tmp_path, conf, timeout=300)
    assert "QUERY-OK" not in out, out[-5000:]
    message = (
        f"executor 0 cannot run its sidecar: Python '{python}' (from spark.pyspark.python) exited with code"
    )
    assert message in out, out[-8000:]
    assert "No module named spark_statebackend" in out or "No module named 'spark_statebackend'" in out
    log = tmp_path / "spool"
    assert "set spark.statebackend.sidecar.python" in out
    assert f"Sidecar log: {log}" in out and "/0/sidecar.log" in out
    recorded = calls.read_text().splitlines()
    assert not any("spark_statebackend.runtime.sidecar" in c for c in recorded), "no sidecar was started"


def test_the_offline_check_validates_and_imports_but_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an executor runs before its sidecar (validate.py --offline), in this process."""
    from spark_statebackend.spark import validate

    blobs, log = tmp_path / "blobs", tmp_path / "log"
    conf = tmp_path / "conf.json"
    keys = {
        "spark.statebackend.blobStore.url": blobs.as_uri(),
        "spark.statebackend.checkpointLog.url": log.as_uri(),
    }
    conf.write_text(json.dumps(keys))
    assert validate.main(["--conf", str(conf), "--offline"]) == 0
    assert f"can run a sidecar: Python {sys.executable}" in capsys.readouterr().out
    assert not blobs.exists() and not log.exists(), "an executor's check contacts and creates nothing"
    conf.write_text(json.dumps({**keys, "spark.statebackend.sidecar.pyhton": "typo"}))
    assert validate.main(["--conf", str(conf), "--offline"]) == 2
    assert "spark.statebackend.sidecar.pyhton: unknown key" in capsys.readouterr().err
