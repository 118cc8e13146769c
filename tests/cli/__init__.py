"""Tests of spark_statebackend/cli: the spark-statebackend command line."""
