"""What the committer knows of one query's checkpoints (committer.py), shared with its upgrades."""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoints.checkpoint import CheckpointId
from ..engine.backup import BackupManager


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
    #: when no offline_commit told us (Committer._partitioning_changed)
    store_keys: frozenset[str] | None = None
    repartitioned_at: int = 0  # batch of its last offline repartition
    located: bool = False  # its locator was written by this committer
    wrote: bool = False  # this application has checkpointed it (committer.py: zombies)
    bytes: int = 0  # of the stores of its batch being committed
