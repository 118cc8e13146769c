"""Backup metrics in Spark's metrics system: after a few batches of a real query, a scrape of Spark's
own Prometheus servlet shows them, and `spark_statebackend.status()` agrees (issue 12)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420)]

DRIVER = r"""
import json, sys, time, urllib.request
from pathlib import Path
from pyspark.sql import SparkSession, functions as F
import spark_statebackend

work = Path(sys.argv[1])
b = (
    SparkSession.builder.master("local[2]").appName("ssb-metrics")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.ui.enabled", "true").config("spark.ui.port", "0")
    .config("spark.ui.prometheus.enabled", "true")
    .config("spark.metrics.conf.*.sink.prometheusServlet.class",
            "org.apache.spark.metrics.sink.PrometheusServlet")
    .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
    .config("spark.local.dir", str(work / "local"))
)
spark_statebackend.configure(b, **{
    "blobStore.url": (work / "blobs").as_uri(), "checkpointLog.url": (work / "log").as_uri(),
    "spoolDir": str(work / "spool"),
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
while st.last_durable_batch < 2:
    assert time.monotonic() < deadline, f"no checkpoint of batch 2 in time: {st}"
    time.sleep(0.2)
    st = spark_statebackend.status(spark, q)
q.stop()
pattern = "ssb_query_last_durable_batch_query_" + str(q.id).replace("-", "_")

def durable_in(text):
    for line in text.splitlines():
        if pattern in line and not line.startswith("#"):
            return float(line.split()[-1])
    return -1.0

text = scrape()
# The gauges poll the sidecars every 2 s: wait until the scrape shows what status() already saw.
while durable_in(text) < st.last_durable_batch or "ssb_backup_bytes_uploaded_total" not in text:
    assert time.monotonic() < deadline, "the gauges never reached Spark's metrics system"
    time.sleep(0.5)
    text = scrape()
print("STATUS " + json.dumps(st.__dict__))
print("QUERY " + str(q.id))
print("SCRAPE-BEGIN")
print(text)
print("SCRAPE-END")
spark.stop()
"""


def test_prometheus_scrape_after_a_few_batches_shows_the_backup_metrics(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout
    status = json.loads(next(line[7:] for line in out.splitlines() if line.startswith("STATUS ")))
    qid = next(line[6:] for line in out.splitlines() if line.startswith("QUERY "))
    scrape = out[out.index("SCRAPE-BEGIN") : out.index("SCRAPE-END")]

    def value(metric: str) -> float:
        """The value of the first scraped sample whose name contains `metric` (Spark's servlet puts the
        app id, `driver` and the plugin source into the name)."""
        for line in scrape.splitlines():
            name, _, rest = line.partition(" ")
            if metric in name and not line.startswith("#"):
                return float(rest.split()[-1])
        raise AssertionError(f"{metric} is not in Spark's Prometheus scrape:\n{scrape[:3000]}")

    q = qid.replace("-", "_")
    assert re.search(r"plugin.*StateBackendPlugin", scrape), "published through the plugin's registry"
    assert value(f"ssb_query_last_durable_batch_query_{q}") >= 2
    assert value(f"ssb_checkpoints_written_total_query_{q}") >= 3
    assert value(f"ssb_query_checkpoint_bytes_query_{q}") > 0
    assert value(f"ssb_query_checkpoint_lag_seconds_query_{q}") >= 0
    assert value(f"ssb_query_predicted_restore_seconds_query_{q}") > 0, "from the measured upload rate"
    assert value("ssb_backup_bytes_uploaded_total_store_0_0_default") > 0
    assert value("ssb_upload_lag_seconds") >= 0
    # status() reads the same published figures.
    assert status["query_id"] == qid and status["last_durable_batch"] >= 2
    assert status["checkpoint_bytes"] > 0 and status["predicted_restore_seconds"] > 0
    assert status["checkpoints_written"] >= 3
