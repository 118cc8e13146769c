"""What every layer shares: units, durable file system writes, symlink-safe placing, crash points,
metrics, optional extras. Nothing here knows about Spark, snapshots or checkpoints."""
