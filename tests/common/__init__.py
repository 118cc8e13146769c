"""Tests of spark_statebackend/common (units and other shared helpers)."""
