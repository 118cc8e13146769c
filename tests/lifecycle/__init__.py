"""Tests of spark_statebackend/lifecycle: garbage collection, retention, batch plans and the marker guard."""
