"""Checkpoint failures of the driver's committer per query ([C5] of runtime/__init__.py): what
`checkpoint-status.json` tells the shim's gate on Spark's commit log.

A query lags from the first time a checkpoint of it could not be written (a `_driver` snapshot that
cannot be taken, a checkpoint log that refuses the write, an unusable marker, a batch given up on after
commitTimeout because its stores never all reported) until a checkpoint of it is written; a batch
still waiting for its uploads is not a failure (the executors' gate holds upload lag). While it lags the
shim holds Spark's commit of the query's next batch once the lag passes maxCommitDelay and fails it
after commitTimeout with the last cause, instead of letting the query run on with no checkpoint
(jvm-bridge CommitGate, driver side: DriverHooks).

`checkpoint-status.json` (driver spool dir)::

    {"oldest_by_query": {query id: epoch ms},   # the query's first failure since its last checkpoint
     "cause_by_query": {query id: str}}         # the last reason a checkpoint of it was not written
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from . import spool as sp

STATUS_FILE = "checkpoint-status.json"


class CheckpointLag:
    """The committer's per-query checkpoint failures (module doc). Used by the committer's thread."""

    def __init__(self, spool_dir: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.status_file = spool_dir / STATUS_FILE if spool_dir is not None else None
        self.clock = clock
        self._since: dict[str, int] = {}  # query -> epoch ms its lag started
        self._cause: dict[str, str] = {}
        self._written: tuple[dict[str, int], dict[str, str]] | None = None

    def not_checkpointed(self, query_id: str, cause: str) -> None:
        """A checkpoint of `query_id` could not be written, for `cause` (the lag starts at the first)."""
        self._cause[query_id] = cause
        self._since.setdefault(query_id, int(self.clock() * 1000))

    def checkpointed(self, query_id: str) -> None:
        """A checkpoint of `query_id` was written: it no longer lags."""
        self._cause.pop(query_id, None)
        self._since.pop(query_id, None)

    def forget(self, query_id: str) -> None:
        """`query_id` is no longer this committer's (fenced): its commits are not held here."""
        self._since.pop(query_id, None)
        self._cause.pop(query_id, None)

    def lag_seconds(self, query_id: str) -> float:
        """How long `query_id` has lagged (0: not lagging)."""
        since = self._since.get(query_id)
        return 0.0 if since is None else max(0.0, self.clock() - since / 1000)

    def cause(self, query_id: str) -> str | None:
        return self._cause.get(query_id)

    def publish(self) -> None:
        """Write the status file if it changed (module doc); no file without a spool dir."""
        state = (dict(self._since), dict(self._cause))
        if self.status_file is None or state == self._written:
            return
        sp.atomic_write_json(self.status_file, {"oldest_by_query": state[0], "cause_by_query": state[1]})
        self._written = state
