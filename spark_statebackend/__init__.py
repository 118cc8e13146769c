"""spark-statebackend: Samza-style blob-store backup and restore for Spark's RocksDB state store."""

from __future__ import annotations

__version__ = "0.1.0"


def configure(builder_or_conf: object, *, check: bool = True, **settings: str) -> object:
    """Enable spark-statebackend on a SparkSession.Builder, SparkConf or dict (see spark.configure)."""
    from .spark.enable import configure as _configure

    return _configure(builder_or_conf, check=check, **settings)


def status(spark: object, query: object) -> object:
    """The backup status of a streaming query of this application (see query_status.status)."""
    from .spark.query_status import status as _status

    return _status(spark, query)
