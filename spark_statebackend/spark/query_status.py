"""What a user asks of a running application: is my query backed up, how far, and how long would a
restore take? (`spark_statebackend.status(spark, query)`.)

The driver's sidecar runs the committer, so its metric samples (common/metrics.py, published every second to
`<driver spool dir>/metrics.json`, the same numbers Spark's metrics system shows) hold every query's
checkpoint figures. This module reads them. Until this application's committer has checkpointed a
query (right after a restart or a restore, before its first new batch is durable) they know nothing of
it: then the query's latest checkpoint is read from the checkpoint log instead (its batch only; it
never contacts the blob store). An application without the backend's plugin gets a ConfigError naming
the key to set, not py4j's TypeError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, StateBackendError
from ..settings import PREFIX, Settings
from .compat import pyspark_version
from .enable import PLUGIN_CLASS

METRICS_FILE = "metrics.json"

#: QueryStatus.source: figures the driver's sidecar published, or the checkpoint log's latest entry.
FROM_SIDECAR = "sidecar"
FROM_LOG = "checkpoint log"


@dataclass(frozen=True)
class QueryStatus:
    """One query's backup figures as the driver's committer last published them (-1: not known yet).

    last_durable_batch: the newest micro-batch whose combined checkpoint is durable.
    checkpoint_lag_seconds: from the end of that batch to its checkpoint being durable.
    checkpoint_bytes: bytes of every store file that checkpoint references (what a restore reads).
    predicted_restore_seconds: checkpoint_bytes over the measured restore rate (the upload rate until a
      restore has been measured).
    checkpoints_written: checkpoints this application wrote for the query.
    source: FROM_SIDECAR, or FROM_LOG when this application has not checkpointed the query yet and
      last_durable_batch is the latest checkpoint the log holds (the other figures are then -1, and
      checkpoints_written 0).
    """

    query_id: str
    last_durable_batch: int
    checkpoint_lag_seconds: float
    checkpoint_bytes: int
    predicted_restore_seconds: float
    checkpoints_written: int
    source: str = FROM_SIDECAR


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
    SparkSession), from its driver sidecar's latest published metrics (about a second old at most), or,
    before this application has checkpointed the query, from the latest checkpoint in the checkpoint
    log (source FROM_LOG). Without pyspark installed, ConfigError naming the [spark] extra; in an
    application without the backend (the plugin not on spark.plugins, or enabled=false), ConfigError
    naming the key to set."""
    pyspark_version("status() needs")
    query_id = str(query if isinstance(query, str) else query.id)
    conf = backend_conf(spark)
    found = query_status(read_samples(driver_spool_dir(spark)), query_id)
    if found.last_durable_batch >= 0:
        return found
    return latest_in_log(conf, query_id) or found


def backend_conf(spark: Any) -> dict[str, str]:
    """The spark.statebackend.* keys of the application of `spark`; ConfigError naming the key to set
    when the backend is not enabled in it (plugin missing from spark.plugins, or its jar not loaded, or
    spark.statebackend.enabled=false)."""
    conf = {str(k): str(v) for k, v in spark.sparkContext.getConf().getAll()}
    plugins = [p.strip() for p in conf.get("spark.plugins", "").split(",")]
    how = (
        f"set spark.plugins={PLUGIN_CLASS} and put the jar on spark.jars before the session starts "
        "(spark_statebackend.configure(builder) sets both)"
    )
    if PLUGIN_CLASS not in plugins:
        raise ConfigError(
            "spark.plugins",
            f"spark-statebackend is not enabled in this application (no {PLUGIN_CLASS}): {how}",
        )
    from py4j.java_gateway import JavaClass

    if not isinstance(spark._jvm.dev.statebackend.spark.Conf, JavaClass):
        raise ConfigError("spark.jars", f"the driver's JVM does not have spark-statebackend's jar: {how}")
    ours = {k: v for k, v in conf.items() if k.startswith(PREFIX)}
    if not Settings.from_conf(ours).enabled:
        raise ConfigError(
            PREFIX + "enabled", "is false in this application: no query is backed up (set it to true)"
        )
    return ours


def latest_in_log(conf: dict[str, str], query_id: str) -> QueryStatus | None:
    """The QueryStatus (source FROM_LOG) of the latest checkpoint the checkpoint log of `conf` (the
    application's spark.statebackend.* keys) holds for `query_id`, or None when it holds none."""
    from ..checkpoints.logs import open_checkpoint_log

    settings = Settings.from_conf(conf)
    with open_checkpoint_log(settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url") as log:
        latest = log.read_latest(query_id)
    if latest is None:
        return None
    return QueryStatus(
        query_id=query_id,
        last_durable_batch=latest.batch_id,
        checkpoint_lag_seconds=-1.0,
        checkpoint_bytes=-1,
        predicted_restore_seconds=-1.0,
        checkpoints_written=0,
        source=FROM_LOG,
    )
