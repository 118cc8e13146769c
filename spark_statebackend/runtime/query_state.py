"""What the committer knows of one query's checkpoints (committer.py), shared with its upgrades, and
how it learns that from the query's latest checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointId, CheckpointV2
from ..engine.backup import BackupManager
from ..lifecycle.markers import load_checkpoint_indexes
from ..stores import BlobStore

log = logging.getLogger("spark_statebackend.commit")  # the committer's, as before


@dataclass
class QueryState:
    """What a committer knows of one query's checkpoints, learnt from the log when it first sees the
    query and kept up to date with every checkpoint it writes."""

    manager: BackupManager  # the `_driver` snapshots' diff base, and every cleanup of the query
    committed: int = -1  # last committed batch id
    last_id: CheckpointId | None = None
    last_markers: dict[str, str] | None = None  # blob-store markers of the latest checkpoint
    name: str = ""  # the query's name from its checkpoints
    #: the state store instances of the latest checkpoint: a different set is a new partitioning, even
    #: when no offline_commit told us (partitioning_changed)
    store_keys: frozenset[str] | None = None
    repartitioned_at: int = 0  # batch of its last offline repartition
    located: bool = False  # its locator was written by this committer
    bytes: int = 0  # of the stores of its batch being committed

    def learn(self, latest: CheckpointV2, store: BlobStore) -> None:
        """Take what the query's `latest` checkpoint says (a committer first seeing the query): its
        batch, markers, name and partitioning, and its `_driver` snapshot as the next one's diff base,
        read from `store` through the marker guard (an unusable one is logged: the next `_driver`
        snapshot is then uploaded in full)."""
        self.last_id = latest.checkpoint_id
        self.last_markers = dict(latest.markers(BLOBSTORE_BACKEND))
        self.repartitioned_at = latest.repartitioned_at_batch
        self.store_keys = instance_keys(latest.markers(BLOBSTORE_BACKEND))
        self.name = latest.query_name
        self.committed = latest.batch_id
        driver = load_checkpoint_indexes(store, latest, stores=[DRIVER_STORE])
        for e in driver.unusable.values():
            log.error("%s; the next %s snapshot is uploaded in full", e, DRIVER_STORE)
        if DRIVER_STORE in driver.usable:
            self.manager.set_base(DRIVER_STORE, driver.usable[DRIVER_STORE])

    def partitioning_changed(self, query_id: str, batch_id: int, store_markers: Mapping[str, str]) -> bool:
        """True if batch `batch_id` has other state store instances than the query's latest checkpoint.

        Spark commits every store instance of every stateful operator in every batch, so the set only
        changes with the number of shuffle partitions: an offline repartition whose own batch was
        never checkpointed (the application exited before the committer got to it, or it ran without
        the backend). This batch then starts the new partitioning (repartitioned_at_batch), so no
        fallback restore can bring the old one back."""
        prev = self.store_keys
        keys = instance_keys(store_markers)
        if prev is None or not prev or not keys or keys == prev:
            return False
        log.warning(
            "query %s batch %d: %d state store instances where its latest checkpoint has %d: the query was "
            "repartitioned without that being checkpointed; its new partitioning starts at this batch, and "
            "no restore goes back to an earlier checkpoint",
            query_id,
            batch_id,
            len(keys),
            len(prev),
        )
        return True


def instance_keys(markers: Mapping[str, str]) -> frozenset[str]:
    """The state store instances a checkpoint's blob-store markers cover (not the `_driver` files)."""
    return frozenset(k for k in markers if k != DRIVER_STORE)
