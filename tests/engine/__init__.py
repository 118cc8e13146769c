"""Tests of spark_statebackend/engine: diff, index, backup, restore, checksums and transfers."""
