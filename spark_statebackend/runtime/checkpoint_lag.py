"""Checkpoint lag of the driver's committer per query ([C5] of runtime/__init__.py): what
`checkpoint-status.json` tells the shim's gate on Spark's commit log.

A query's lag starts when a batch of it is handed to the committer while every earlier one is
checkpointed, and ends only when a checkpoint covers every batch handed over before it. A batch the
committer gives up on (its stores never all reported, an unusable marker, a `_driver` snapshot that
cannot be taken, a checkpoint log that refuses the write) does not end it: the lag keeps growing, so a
query whose checkpoints keep failing is held at Spark's commit of its next batch once the lag passes
maxCommitDelay, and fails after commitTimeout with the cause, instead of running on with no checkpoint
(jvm-bridge CommitGate, driver side: DriverHooks).

`checkpoint-status.json` (driver spool dir)::

    {"oldest_by_query": {query id: epoch ms},   # when the query's lag started; only lagging queries
     "cause_by_query": {query id: str}}         # the last reason a checkpoint of it was not written
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from . import spool as sp

STATUS_FILE = "checkpoint-status.json"


class CheckpointLag:
    """The committer's per-query checkpoint lag (module doc). Thread-safe for one writer thread;
    `published` reads what was last written."""

    def __init__(self, spool_dir: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.status_file = spool_dir / STATUS_FILE if spool_dir is not None else None
        self.clock = clock
        self._since: dict[str, int] = {}  # query -> epoch ms its lag started
        self._cause: dict[str, str] = {}
        self._written: tuple[dict[str, int], dict[str, str]] | None = None

    def handed_over(self, query_id: str, at: float) -> None:
        """A batch of `query_id` was handed to the committer at `at` (epoch seconds)."""
        self._since.setdefault(query_id, int(at * 1000))

    def not_checkpointed(self, query_id: str, cause: str) -> None:
        """A checkpoint of `query_id` could not be written, for `cause` (kept until one is)."""
        self._cause[query_id] = cause
        self._since.setdefault(query_id, int(self.clock() * 1000))

    def checkpointed(self, query_id: str, oldest_waiting: float | None) -> None:
        """A checkpoint of `query_id` was written; `oldest_waiting`: when the oldest batch handed over
        after it was (epoch seconds), None if none waits."""
        self._cause.pop(query_id, None)
        if oldest_waiting is None:
            self._since.pop(query_id, None)
        else:
            self._since[query_id] = int(oldest_waiting * 1000)

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
