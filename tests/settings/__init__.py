"""Tests of spark_statebackend/settings: configuration keys, their table, and the example conf files."""
