"""The engine: one snapshot of one directory, up to a blob store (backup) and back (restore)."""
