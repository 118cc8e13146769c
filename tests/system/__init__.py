"""Whole-system tests: end to end with real Spark, crash points, outages, exactly-once, chaos, multi-host."""
