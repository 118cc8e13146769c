"""Upload lag of a sidecar ([C1]/[C3] of runtime/__init__.py): what `status.json` tells the shim's
commit gate, and when a failed upload is tried again.

`status.json` holds the staging time of the oldest snapshot not yet uploaded: the one in flight, or one
whose upload failed and waits for its retry (or belongs to a query another application took over),
overall (`oldest_upload_staged_at_ms`, for the gauge and older shims) and per query
(`oldest_by_query`: {query id: ms}, only the lagging queries). The shim blocks the commit of a query's
store once that query's figure is older than maxCommitDelay and fails it after commitTimeout, so one
query's failing uploads never hold another query's commits. A status without `oldest_by_query` (the
plugin's, once it gave up restarting the sidecar: jvm-bridge SidecarProcess) holds every query. A
failed upload of a version is retried after RETRY_INITIAL_SECONDS, doubling up to RETRY_MAX_SECONDS.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from . import spool as sp

STATUS_FILE = "status.json"
RETRY_INITIAL_SECONDS = 0.5  # first retry of a failed upload; doubles up to RETRY_MAX_SECONDS
RETRY_MAX_SECONDS = 5.0

Store = tuple[str, str]  # (query, store instance key)
Group = tuple[str, int]  # (query, version): the snapshots of one version uploaded together


class UploadLag:
    """Lag and retry bookkeeping of one sidecar's uploads (module doc). Used by one thread."""

    def __init__(self, spool_dir: Path) -> None:
        self.status_file = spool_dir / STATUS_FILE
        # (query, store) -> staging time (epoch ms) of its oldest snapshot not yet uploaded: the lag the
        # shim's commit gate reads from status.json. Set when an upload fails, cleared when one succeeds.
        self._lagging: dict[Store, int] = {}
        self.oldest_staged_ms: int | None = None  # what status.json says, for the upload-lag gauge
        self._retry: dict[Group, tuple[int, float]] = {}  # (query, version) -> (failures, next try)

    def lagging(self, key: Store, staged_at_ms: int) -> None:
        """A snapshot of `key` staged at `staged_at_ms` is not uploaded and counts as lag."""
        self._lagging[key] = min(self._lagging.get(key, staged_at_ms), staged_at_ms)

    def caught_up(self, key: Store) -> None:
        """`key` has nothing staged waiting any more (uploaded, already checkpointed, given up on)."""
        self._lagging.pop(key, None)

    def keep_retries(self, groups: Iterable[Group]) -> None:
        """Forget the retries of every group but `groups` (the others were superseded)."""
        wanted = set(groups)
        self._retry = {g: r for g, r in self._retry.items() if g in wanted}

    def retry_due(self, group: Group, now: float) -> bool:
        """False while a failed upload of `group` waits for its retry (`now`: time.monotonic())."""
        retry = self._retry.get(group)
        return retry is None or now >= retry[1]

    def retry_in(self, group: Group, now: float) -> float:
        """Seconds until the retry of `group` is due (0: it is, or none waits; `now`: time.monotonic())."""
        retry = self._retry.get(group)
        return 0.0 if retry is None else max(0.0, retry[1] - now)

    def failed(self, group: Group) -> tuple[int, float]:
        """Another failed upload of `group`: (failures so far, seconds until its retry)."""
        failures = self._retry.get(group, (0, 0.0))[0] + 1
        delay = min(RETRY_INITIAL_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS)
        self._retry[group] = (failures, time.monotonic() + delay)
        return failures, delay

    def settled(self, group: Group) -> None:
        """`group` needs no retry (uploaded, or given up on)."""
        self._retry.pop(group, None)

    def publish(self, in_flight: tuple[str, int] | None = None) -> None:
        """status.json for the shim's commit gate (module doc): per query and overall, the staging time
        of the oldest snapshot not yet uploaded, in flight (`in_flight`: its query and staging time)
        or failed and waiting for a retry."""
        by_query: dict[str, int] = {}
        entries = [(qid, ms) for (qid, _), ms in self._lagging.items()]
        for qid, ms in [*entries, *([in_flight] if in_flight is not None else [])]:
            by_query[qid] = min(by_query.get(qid, ms), ms)
        self.oldest_staged_ms = min(by_query.values(), default=None)
        sp.atomic_write_json(
            self.status_file,
            {
                "schema_version": 1,
                "oldest_upload_staged_at_ms": self.oldest_staged_ms,
                "oldest_by_query": by_query,
                "updated_at_ms": int(time.time() * 1000),
            },
            fsync=False,
        )
