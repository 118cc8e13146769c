"""Tests of spark_statebackend/spark and the JVM shim: enabling, driver-side restore, real Spark hooks."""
