"""Tests of spark_statebackend/checkpoints: checkpoint records, the logs and their fencing, store ids."""
