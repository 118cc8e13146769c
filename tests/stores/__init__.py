"""Tests of spark_statebackend/stores: the BlobStore contract on every backend, S3/Azure, retries, faults."""
