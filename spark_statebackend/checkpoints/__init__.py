"""Checkpoints: what makes uploaded snapshots durable (CheckpointV2 in a checkpoint log, marker
reports, locators) and what keeps or collects their blobs (cleanup's retention, gc, the TTL sweep)."""
