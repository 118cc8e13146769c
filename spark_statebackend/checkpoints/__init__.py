"""Checkpoints: the combined checkpoint and the checkpoint log that holds them.

A combined checkpoint (CheckpointV2, checkpoint.py; the ids it is made of, ids.py) records one
micro-batch: its input offsets and every store instance's marker, the blob id of the store's
SnapshotIndex. The checkpoint log (logs/: a directory or a compacted Kafka topic) holds them, one
writer per query, fencing zombies. The store instance a marker is kept per (StoreInstance,
store_instance.py) lives here too, for every layer above. This package is the model and its log only:
it reads and writes no blob and imports nothing of stores/ or engine/ (it sits below the engine). What
keeps or collects the blobs a checkpoint references is lifecycle/ ([L1]-[L5]).
"""
