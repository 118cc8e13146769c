"""Backup metrics in Spark's metrics system: after a few batches of a real query, a scrape of Spark's
own Prometheus servlet shows them, and `spark_statebackend.status()` agrees (issue 12). Their number
follows the queries, not the store instances (issue 22): a query with 8 shuffle partitions exposes
exactly the names one with 2 does, named after the query, and counters arrive as counters."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

DRIVER = r"""
import json, sys, time, urllib.request
from pathlib import Path
from pyspark.sql import SparkSession, functions as F
import spark_statebackend
from spark_statebackend.spark.query_status import FROM_SIDECAR

work, partitions, more = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
b = (
    SparkSession.builder.master("local[2]").appName("ssb-metrics")
    .config("spark.sql.shuffle.partitions", partitions)
    .config("spark.ui.enabled", "true").config("spark.ui.port", "0")
    .config("spark.ui.prometheus.enabled", "true")
    .config("spark.metrics.conf.*.sink.prometheusServlet.class",
            "org.apache.spark.metrics.sink.PrometheusServlet")
    .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
    .config("spark.local.dir", str(work / "local"))
)
spark_statebackend.configure(b, **{
    "blobStore.url": (work / "blobs").as_uri(), "checkpointLog.url": (work / "log").as_uri(),
    "spoolDir": str(work / "spool"), **more,
})
spark = b.getOrCreate()
rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 50).load()
agg = rows.groupBy((F.col("value") % 5).alias("k")).count()
q = (agg.writeStream.format("memory").queryName("counts").outputMode("complete")
     .option("checkpointLocation", str(work / "ckpt")).trigger(processingTime="200 milliseconds").start())
deadline = time.monotonic() + 240

def scrape():
    return urllib.request.urlopen(f"{spark.sparkContext.uiWebUrl}/metrics/prometheus").read().decode()

st = spark_statebackend.status(spark, q)
# Until the driver's sidecar has published its first sample for the query (once a second) status()
# answers from the checkpoint log (source FROM_LOG, its other figures -1): wait for the sidecar's.
while st.last_durable_batch < 2 or st.source != FROM_SIDECAR:
    assert time.monotonic() < deadline, f"no checkpoint of batch 2 in time: {st}"
    time.sleep(0.2)
    st = spark_statebackend.status(spark, q)
q.stop()

def durable_in(text):
    for line in text.splitlines():
        if "ssb_query_last_durable_batch" in line and not line.startswith("#"):
            return float(line.split()[-1])
    return -1.0

text = scrape()
# The metrics poll the sidecars every 2 s: wait until the scrape shows what status() already saw, and
# every kind of work the query did (backup, cleanup, commit).
kinds = ("ssb_backup_bytes_uploaded_total", "ssb_cleanup_seconds", "ssb_checkpoints_written_total")
while durable_in(text) < st.last_durable_batch or not all(k in text for k in kinds):
    assert time.monotonic() < deadline, "the metrics never reached Spark's metrics system"
    time.sleep(0.5)
    text = scrape()
print("STATUS " + json.dumps(st.__dict__))
print("QUERY " + str(q.id))
print("SCRAPE-BEGIN")
print(text)
print("SCRAPE-END")
spark.stop()
"""


def run_query(work: Path, partitions: int, **settings: str) -> tuple[dict[str, Any], str, str]:
    """Run a stateful query with `partitions` shuffle partitions (and spark.statebackend.`settings`)
    to batch 2 and return its status, its id and a scrape of Spark's Prometheus servlet."""
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(work), str(partitions), json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout
    status = json.loads(next(line[7:] for line in out.splitlines() if line.startswith("STATUS ")))
    qid = next(line[6:] for line in out.splitlines() if line.startswith("QUERY "))
    return status, qid, out[out.index("SCRAPE-BEGIN") : out.index("SCRAPE-END")]


def ssb_lines(scrape: str) -> dict[str, str]:
    """The scraped samples of this backend: metric name from `ssb_` on (Spark's servlet puts the app
    id, `driver` or the executor id and the plugin source before it) -> the whole line."""
    out: dict[str, str] = {}
    for line in scrape.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if not line.startswith("#") and "ssb_" in name:
            out[name[name.index("ssb_") :]] = line
    return out


def test_prometheus_scrape_after_a_few_batches_shows_the_backup_metrics(tmp_path: Path) -> None:
    status, qid, scrape = run_query(tmp_path, 2)

    def value(metric: str) -> float:
        """The value of the first scraped sample whose name contains `metric`."""
        for line in scrape.splitlines():
            name, _, rest = line.partition(" ")
            if metric in name and not line.startswith("#"):
                return float(rest.split()[-1])
        raise AssertionError(f"{metric} is not in Spark's Prometheus scrape:\n{scrape[:3000]}")

    assert re.search(r"plugin.*StateBackendPlugin", scrape), "published through the plugin's registry"
    # Per query, named by the query's name ("counts"), not its id.
    assert value("ssb_query_last_durable_batch_query_counts") >= 2
    assert value("ssb_checkpoints_written_total_query_counts") >= 3
    assert value("ssb_query_checkpoint_bytes_query_counts") > 0
    assert value("ssb_query_checkpoint_lag_seconds_query_counts") >= 0
    assert value("ssb_query_predicted_restore_seconds_query_counts") > 0, "from the measured upload rate"
    assert value("ssb_backup_bytes_uploaded_total_query_counts") > 0
    assert value("ssb_backup_snapshots_total_query_counts") >= 3 * 2  # two stores, three batches at least
    assert value("ssb_upload_lag_seconds") >= 0
    uuid = qid.replace("-", "_")
    assert not [n for n in ssb_lines(scrape) if uuid in n or "_store_" in n], "no query id, no store"
    # status() reads the same published figures.
    assert status["query_id"] == qid and status["last_durable_batch"] >= 2
    assert status["checkpoint_bytes"] > 0 and status["predicted_restore_seconds"] > 0
    assert status["checkpoints_written"] >= 3


def test_counters_reach_spark_as_counters(tmp_path: Path) -> None:
    """Spark's servlet labels each sample with its Dropwizard type: a counter is `type="counters"`."""
    _, _, scrape = run_query(tmp_path, 2)
    lines = ssb_lines(scrape)
    counters = {n: line for n, line in lines.items() if '"counters"' in line}
    for metric in (
        "ssb_checkpoints_written_total",
        "ssb_backup_bytes_uploaded_total",
        "ssb_backup_snapshots_total",
    ):
        assert [n for n in counters if n.startswith(metric)], f"{metric} is not a counter:\n{scrape[:3000]}"
    assert not [n for n in lines if n.startswith("ssb_query_last_durable_batch") and n in counters]


def test_metric_names_do_not_grow_with_the_shuffle_partitions(tmp_path: Path) -> None:
    """Spark's default 200 shuffle partitions must not mean thousands of metric names per query: the
    same query with 2 and with 8 partitions exposes the same names."""
    _, _, two = run_query(tmp_path / "two", 2)
    _, _, eight = run_query(tmp_path / "eight", 8)
    assert set(ssb_lines(two)) == set(ssb_lines(eight)), (
        f"only with 2: {sorted(set(ssb_lines(two)) - set(ssb_lines(eight)))[:20]}\n"
        f"only with 8: {sorted(set(ssb_lines(eight)) - set(ssb_lines(two)))[:20]}"
    )
    assert len(ssb_lines(two)) < 80, sorted(ssb_lines(two))


def test_per_store_metrics_behind_their_switch(tmp_path: Path) -> None:
    """metrics.perStore=true: the backup families also have a series per store instance (label
    `store`), named after the query and the store; the per-query figures stay as they were."""
    _, qid, scrape = run_query(tmp_path, 2, **{"metrics.perStore": "true"})
    lines = ssb_lines(scrape)
    # The store instances of the one stateful operator: <operator>/<partition>/<store name> -> 0_0_default
    for partition in (0, 1):
        store = f"_query_counts_store_0_{partition}_default"
        assert [n for n in lines if n.startswith("ssb_backup_snapshots_total" + store)], sorted(lines)
        assert [n for n in lines if n.startswith("ssb_backup_bytes_uploaded_total" + store)], sorted(lines)
    assert [n for n in lines if n.startswith("ssb_query_last_durable_batch_query_counts")]
    assert not [n for n in lines if n.startswith("ssb_query_") and "_store_" in n]
    assert not [n for n in lines if qid.replace("-", "_") in n]
