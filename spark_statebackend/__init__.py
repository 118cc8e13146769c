"""spark-statebackend: Samza-style blob-store backup and restore for Spark's RocksDB state store."""

from __future__ import annotations

__version__ = "0.1.0"
