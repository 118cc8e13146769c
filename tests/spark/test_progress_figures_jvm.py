"""jvm-bridge ProgressFigures, the JVM half of the backend's figures in a query's progress (issue 22
item 5), against the Python half: it picks each query's figures out of a sidecar's published samples
exactly as `status()` does (spark/query_status.py), and adds them to a progress's observedMetrics without
touching the query's own observed metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark_statebackend.common.metrics import Metrics
from spark_statebackend.spark.enable import jar_path
from spark_statebackend.spark.query_status import METRICS_FILE, query_status, read_samples
from tests.jobrig import spark_jars

NAMED = "6f1d2c3b-4a5e-4f60-9b7c-8d9e0a1b2c3d"
UNNAMED = "0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9"
UNKNOWN = "00000000-0000-0000-0000-000000000000"

PROBE = """
import dev.statebackend.spark.ProgressFigures;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.Map;
import java.util.UUID;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.SinkProgress;
import org.apache.spark.sql.streaming.SourceProgress;
import org.apache.spark.sql.streaming.StateOperatorProgress;
import org.apache.spark.sql.streaming.StreamingQueryProgress;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

public class ProgressFiguresProbe {
  static StreamingQueryProgress progress(String observedName) {
    Map<String, Row> observed = new HashMap<>();
    observed.put(observedName, new GenericRowWithSchema(new Object[] {5L},
        new StructType().add("rows", DataTypes.LongType, false)));
    return new StreamingQueryProgress(UUID.randomUUID(), UUID.randomUUID(), "q", "2026-11-26T00:00:00.000Z",
        3L, 10L, new HashMap<>(), new HashMap<>(), new StateOperatorProgress[0], new SourceProgress[0],
        new SinkProgress("memory"), observed);
  }

  public static void main(String[] args) {
    for (int i = 1; i < args.length; i++) {
      System.out.println("READ " + args[i] + " " + ProgressFigures.read(Paths.get(args[0]), args[i]).json());
    }
    System.out.println("NOFILE " + ProgressFigures.read(Paths.get(args[0], "missing"), args[1]).json());
    Row figures = ProgressFigures.read(Paths.get(args[0]), args[1]);
    StreamingQueryProgress theirs = progress("mine");
    System.out.println("ADDED " + ProgressFigures.addTo(theirs, figures) + " " + theirs.json());
    StreamingQueryProgress clash = progress(ProgressFigures.NAME);
    System.out.println("CLASH " + ProgressFigures.addTo(clash, figures) + " " + clash.json());
  }
}
"""


def publish(spool: Path) -> None:
    """What a driver's sidecar publishes (runtime/sidecar.py): a named and an unnamed query's figures."""
    m = Metrics()
    m.name_query(NAMED, "counts")
    m.last_durable_batch.labels(NAMED).set(7)
    m.last_checkpoint_lag.labels(NAMED).set(0.25)
    m.checkpoint_bytes.labels(NAMED).set(4096)
    m.predicted_restore_seconds.labels(NAMED).set(0.5)
    m.checkpoints_written.labels(NAMED).inc(3)
    m.last_durable_batch.labels(UNNAMED).set(2)
    m.checkpoints_written.labels(UNNAMED).inc()
    m.backup(NAMED).bytes_uploaded.inc(100)
    m.upload_lag.set(1.5)
    spool.mkdir()
    (spool / METRICS_FILE).write_bytes(orjson.dumps({"schema_version": 1, "samples": m.samples()}))


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """(the probe's output lines by their first word(s), the spool dir it read)."""
    if shutil.which("java") is None or spark_jars() is None:
        pytest.skip("needs java and pyspark")
    tmp = tmp_path_factory.mktemp("progress-figures")
    publish(tmp / "spool")
    (tmp / "ProgressFiguresProbe.java").write_text(PROBE)
    proc = subprocess.run(
        [
            "java",
            "-cp",
            f"{jar_path()}{os.pathsep}{spark_jars()}/*",
            str(tmp / "ProgressFiguresProbe.java"),
            str(tmp / "spool"),
            NAMED,
            UNNAMED,
            UNKNOWN,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "READ":
            qid, _, rest = rest.partition(" ")
            tag = f"READ {qid}"
        out[tag] = rest
    return out, tmp / "spool"


def as_status(figures: dict[str, Any]) -> dict[str, Any]:
    """The JVM's figures under QueryStatus's names (the fields both have)."""
    return {
        "last_durable_batch": figures["lastDurableBatch"],
        "checkpoint_lag_seconds": figures["checkpointLagSeconds"],
        "checkpoint_bytes": figures["checkpointBytes"],
        "predicted_restore_seconds": figures["predictedRestoreSeconds"],
        "checkpoints_written": figures["checkpointsWritten"],
    }


@pytest.mark.parametrize("query_id", [NAMED, UNNAMED, UNKNOWN])
def test_the_jvm_reads_the_figures_status_reads(probe: tuple[dict[str, str], Path], query_id: str) -> None:
    out, spool = probe
    figures = json.loads(out[f"READ {query_id}"])
    status = query_status(read_samples(spool), query_id).__dict__
    assert as_status(figures) == {k: status[k] for k in as_status(figures)}
    assert figures["uploadLagSeconds"] == 1.5  # the sidecar's own sample, no query label


def test_no_metrics_file_means_nothing_known_yet(probe: tuple[dict[str, str], Path]) -> None:
    figures = json.loads(probe[0]["NOFILE"])
    assert figures == {
        "lastDurableBatch": -1,
        "checkpointLagSeconds": -1.0,
        "uploadLagSeconds": -1.0,
        "checkpointBytes": -1,
        "predictedRestoreSeconds": -1.0,
        "checkpointsWritten": 0,
    }


def test_the_figures_join_the_querys_own_observed_metrics(probe: tuple[dict[str, str], Path]) -> None:
    added, _, progress = probe[0]["ADDED"].partition(" ")
    observed = json.loads(progress)["observedMetrics"]
    assert added == "true"
    assert observed["mine"] == {"rows": 5}  # the query's own, kept
    assert observed["statebackend"]["lastDurableBatch"] == 7
    assert observed["statebackend"]["checkpointsWritten"] == 3


def test_a_query_observing_a_metric_of_that_name_keeps_its_own(probe: tuple[dict[str, str], Path]) -> None:
    added, _, progress = probe[0]["CLASH"].partition(" ")
    assert added == "false"
    assert json.loads(progress)["observedMetrics"] == {"statebackend": {"rows": 5}}
