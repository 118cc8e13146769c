"""A small stateful query on a local-cluster master, enabled with configure(), for the sidecar Python
tests (tests/spark/test_sidecar_python.py).

Run as `python sidecar_python_job.py '<json>'` with {"master", "conf": raw Spark keys, "ssb":
spark.statebackend.* keys without the prefix, "checkpoint"}. Prints `RULES <json>` (what the JVM's
Conf.sidecarPython picks for a few confs and environments, driver and executor), then `QUERY-OK
<json counts>` or `QUERY-FAILED <error>`, and `ELAPSED <seconds>` of the query. Its own process: a
Python process holds one SparkContext.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import spark_statebackend

#: (conf, environment) pairs whose resolution the test checks, on the driver and on an executor.
RULE_CASES: list[tuple[dict[str, str], dict[str, str]]] = [
    ({}, {}),
    ({}, {"PYSPARK_PYTHON": "/env/py", "PYSPARK_DRIVER_PYTHON": "/env/driver-py"}),
    ({"spark.pyspark.python": "./environment/bin/python"}, {"PYSPARK_PYTHON": "/env/py"}),
    (
        {"spark.pyspark.python": "./environment/bin/python", "spark.pyspark.driver.python": "/d/py"},
        {},
    ),
    (
        {
            "spark.pyspark.python": "./environment/bin/python",
            "spark.statebackend.sidecar.driverPython": "/configure/py",
        },
        {"PYSPARK_DRIVER_PYTHON": "/env/driver-py"},
    ),
    (
        {
            "spark.statebackend.sidecar.python": "/explicit/py",
            "spark.statebackend.sidecar.driverPython": "/configure/py",
            "spark.pyspark.python": "./environment/bin/python",
        },
        {"PYSPARK_PYTHON": "/env/py"},
    ),
    # a local-cluster master's executors share the driver's host: configure()'s Python, not python3
    (
        {
            "spark.master": "local-cluster[2,1,1024]",
            "spark.statebackend.sidecar.driverPython": "/configure/py",
        },
        {},
    ),
    # ... but never on a cluster's own hosts
    (
        {"spark.master": "spark://h:7077", "spark.statebackend.sidecar.driverPython": "/configure/py"},
        {},
    ),
]


def rules(spark: SparkSession) -> list[dict[str, Any]]:
    jvm = spark._jvm
    out = []
    for conf, env in RULE_CASES:
        sc = jvm.org.apache.spark.SparkConf(False)
        for k, v in conf.items():
            sc.set(k, v)
        jenv = jvm.java.util.HashMap()
        for k, v in env.items():
            jenv.put(k, v)
        c = jvm.dev.statebackend.spark.Conf.of(sc)
        out.append(
            {"driver": list(c.sidecarPython(jenv, True)), "executor": list(c.sidecarPython(jenv, False))}
        )
    return out


def main() -> None:
    args = json.loads(sys.argv[1])
    builder = SparkSession.builder.master(args["master"]).appName("ssb-sidecar-python")
    for k, v in args["conf"].items():
        builder = builder.config(k, v)
    spark_statebackend.configure(builder, **args["ssb"])
    spark = builder.getOrCreate()
    print("RULES " + json.dumps(rules(spark)), flush=True)
    started = time.monotonic()
    try:
        rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 20).load()
        agg = rows.groupBy((F.col("value") % 5).alias("k")).count()
        q = (
            agg.writeStream.format("memory")
            .queryName("counts")
            .outputMode("complete")
            .option("checkpointLocation", args["checkpoint"])
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        counts = {r["k"]: r["count"] for r in spark.table("counts").collect()}
        print("QUERY-OK " + json.dumps(counts), flush=True)
    except Exception as e:  # the test reads what failed
        print("QUERY-FAILED " + str(e).replace("\n", " ")[:4000], flush=True)
    finally:
        print(f"ELAPSED {time.monotonic() - started:.1f}", flush=True)
        try:
            spark.stop()
        except Exception as e:
            print("STOP-FAILED " + str(e).replace("\n", " ")[:500], flush=True)


if __name__ == "__main__":
    main()
