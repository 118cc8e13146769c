"""What every layer shares: units (Spark's grammar for durations and sizes), durable file-system writes,
file:// URLs, file names that are data (one safe path component), symlink-safe placing of files, the
test-only crash points every step of the commit and restore paths names, metrics, optional extras.
Nothing here knows about Spark, snapshots or checkpoints.
"""
