"""What a user asks of a running application: is my query backed up, how far, and how long would a
restore take? (`spark_statebackend.status(spark, query)`.)

The driver's sidecar runs the committer, so its metric samples (common/metrics.py, published every second to
`<driver spool dir>/metrics.json`, the same numbers Spark's metrics system shows) hold every query's
checkpoint figures. This module reads them; it never contacts the blob store or the checkpoint log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import StateBackendError
from .compat import pyspark_version

METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class QueryStatus:
    """One query's backup figures as the driver's committer last published them (-1: not known yet).

    last_durable_batch: the newest micro-batch whose combined checkpoint is durable.
    checkpoint_lag_seconds: from the end of that batch to its checkpoint being durable.
    checkpoint_bytes: bytes of every store file that checkpoint references (what a restore reads).
    predicted_restore_seconds: checkpoint_bytes over the measured restore rate (the upload rate until a
      restore has been measured).
    checkpoints_written: checkpoints this application wrote for the query.
    """

    query_id: str
    last_durable_batch: int
    checkpoint_lag_seconds: float
    checkpoint_bytes: int
    predicted_restore_seconds: float
    checkpoints_written: int


def driver_spool_dir(spark: Any) -> Path:
    """This application's driver spool dir, as the JVM computes it (needs the plugin's jar)."""
    return Path(str(spark._jvm.dev.statebackend.spark.Conf.currentDriverSpoolDir()))


def read_samples(spool_dir: Path) -> list[dict[str, Any]]:
    """The samples a sidecar last published in `spool_dir` ([] before its first publication)."""
    try:
        doc = orjson.loads((spool_dir / METRICS_FILE).read_bytes())
    except FileNotFoundError:
        return []
    except orjson.JSONDecodeError as e:
        raise StateBackendError(f"malformed metrics file {spool_dir / METRICS_FILE}: {e}") from None
    samples = doc.get("samples") if isinstance(doc, dict) else None
    return [s for s in samples if isinstance(s, dict)] if isinstance(samples, list) else []


def query_status(samples: list[dict[str, Any]], query_id: str) -> QueryStatus:
    """The QueryStatus of `query_id` in a sidecar's published samples."""

    def value(name: str, default: float = -1.0) -> float:
        for s in samples:
            # A query's samples carry its id as `query_id`; their `query` label is its name if it has
            # one (common/metrics.py). A sidecar of an earlier release put the id in the label.
            if s.get("name") == name and s.get("query_id", (s.get("labels") or {}).get("query")) == query_id:
                v = s.get("value")
                if isinstance(v, int | float):
                    return float(v)
        return default

    return QueryStatus(
        query_id=query_id,
        last_durable_batch=int(value("ssb_query_last_durable_batch")),
        checkpoint_lag_seconds=value("ssb_query_checkpoint_lag_seconds"),
        checkpoint_bytes=int(value("ssb_query_checkpoint_bytes")),
        predicted_restore_seconds=value("ssb_query_predicted_restore_seconds"),
        checkpoints_written=int(value("ssb_checkpoints_written_total", 0.0)),
    )


def status(spark: Any, query: Any) -> QueryStatus:
    """The backup status of `query` (a StreamingQuery or its id) in the application of `spark` (a
    SparkSession), from its driver sidecar's latest published metrics (about a second old at most).
    Without pyspark installed, ConfigError naming the [spark] extra."""
    pyspark_version("status() needs")
    query_id = str(query if isinstance(query, str) else query.id)
    return query_status(read_samples(driver_spool_dir(spark)), query_id)
