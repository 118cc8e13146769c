"""The numbers a user watches per query once a checkpoint is durable ([C5] of runtime/__init__.py;
common/metrics.py has the families): checkpoint lag, the last durable batch, the checkpoint's size and
how long a restore of it would take. Kept apart from the committer (committer.py) because the restore
prediction mixes rates across queries (the newest any executor measured), which is no part of the
commit protocol.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..common.metrics import Metrics
from ..lifecycle.reports import Report
from .query_state import QueryState


class CommitMetrics:
    """Records each checkpoint the committer writes into `metrics`. One per committer, on its thread."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._restore_rate = 0.0  # bytes/s of the newest restore its executors measured (0: none)
        self._upload_rate = 0.0

    def checkpoint_written(
        self,
        q: QueryState,
        qid: str,
        query_name: str,
        batch_id: int,
        lag: float,
        reports: Mapping[str, Report],
    ) -> None:
        """Checkpoint `batch_id` of query `qid` (named `query_name`) is durable, `lag` seconds after its
        batch ended; `reports` are its stores' upload reports (their measured rates)."""
        m = self.metrics
        m.name_query(qid, query_name)
        m.checkpoint_lag.labels(qid).observe(lag)
        m.checkpoints_written.labels(qid).inc()
        m.last_durable_batch.labels(qid).set(batch_id)
        m.last_checkpoint_lag.labels(qid).set(lag)
        restore = max((r.restore_rate for r in reports.values()), default=0.0)
        upload = max((r.upload_rate for r in reports.values()), default=0.0)
        own = m.last_restore_rate  # a plain attribute: collecting the registry here cost O(stores)
        self._restore_rate = max(restore, own) or self._restore_rate
        self._upload_rate = upload or self._upload_rate
        m.checkpoint_bytes.labels(qid).set(q.bytes)
        rate = self._restore_rate or self._upload_rate
        m.predicted_restore_seconds.labels(qid).set(q.bytes / rate if rate > 0 else -1.0)
