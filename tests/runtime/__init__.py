"""Tests of spark_statebackend/runtime: the sidecar, its spool, committer and upload/restore loops."""
