"""What goes into one batch's checkpoint ([C5] of runtime/__init__.py): the reported store markers,
the `_driver` snapshot of the checkpoint location's driver files uploaded beside them, the batch's
input offsets and the partitioning epoch, and the timing of each checkpoint's steps for its log line.
The committer (committer.py) decides when a batch is ready and owns the commit point around it (the
locator, the write, the cleanup); this module only assembles the record, so nothing here writes to the
checkpoint log.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointId, CheckpointV2
from ..checkpoints.logs import CheckpointLog
from ..lifecycle.reports import Report
from ..spark.location import driver_staging_dir, stage_driver_files
from .progress import ProgressEvent
from .query_state import QueryState

log = logging.getLogger("spark_statebackend.commit")  # the committer's logger: these are its steps


def build_checkpoint(
    q: QueryState,
    event: ProgressEvent,
    reports: Mapping[str, Report],
    driver_markers: Mapping[str, str],
    *,
    checkpoint_log: CheckpointLog,
    app_id: str,
) -> CheckpointV2:
    """The CheckpointV2 of batch `event` of query state `q`, whose every store reported (`reports`,
    checked), with its `_driver` snapshot's marker (`driver_markers`: `driver_snapshot`'s), written by
    application `app_id`. Updates `q.repartitioned_at` when this batch starts a new partitioning.
    Raises on a failure of the log; the checkpoint itself is not written."""
    qid = event.query_id
    store_markers = {k: r.marker for k, r in reports.items()}
    input_offsets: Mapping[str, str] = event.input_offsets
    if event.offline:
        # Offline repartition re-plans no input: its batch has the offsets of the batch before it.
        prev = checkpoint_log.read_latest(qid)
        input_offsets = prev.input_offsets if prev is not None else {}
        q.repartitioned_at = event.batch_id
    elif q.partitioning_changed(event.query_id, event.batch_id, store_markers):
        q.repartitioned_at = event.batch_id
    markers = {**store_markers, **driver_markers}
    return CheckpointV2(
        checkpoint_id=CheckpointId.create(event.batch_id, after=q.last_id),
        query_id=qid,
        query_name=event.query_name or q.name,
        input_offsets=input_offsets,
        state_checkpoint_markers={BLOBSTORE_BACKEND: markers},
        changelog_checkpointing=any(r.changelog for r in reports.values()),
        repartitioned_at_batch=q.repartitioned_at,
        writer_app_id=app_id,
    )


def driver_snapshot(q: QueryState, event: ProgressEvent, spool_dir: Path | None) -> dict[str, str]:
    """{`_driver`: marker}: the driver's files of `event`'s checkpoint location at its batch, uploaded
    against the query's previous `_driver` snapshot (staged in the driver's spool dir `spool_dir`,
    never in the location: it may be deleted at stop); what a driver on a new host rebuilds the
    location from (spark/ [D4]). Empty for a remote location (`ProgressEvent.remote_location`): it is
    durable itself, Spark's metadata stays there and nothing rebuilds it (spark/ [D1])."""
    if event.remote_location:
        return {}
    staging = driver_staging_dir(spool_dir)  # never the location: it may be deleted at stop
    with tempfile.TemporaryDirectory(prefix=".driver-", dir=staging) as tmp:
        stage_driver_files(event.checkpoint_root, event.batch_id, Path(tmp))
        return q.manager.upload(
            f"b{event.batch_id:012d}", {DRIVER_STORE: Path(tmp)}, versions={DRIVER_STORE: event.batch_id}
        )


def settled(future: Future[dict[str, str]]) -> None:
    """Wait for a `_driver` snapshot no checkpoint will name (its batch was not checkpointed): the
    next one must not upload beside it. Its failure is the next attempt's to see."""
    try:
        future.result()
    except Exception:
        log.debug("a _driver snapshot no checkpoint names failed", exc_info=True)


class Stages:
    """When each step of one checkpoint ended, from its batch's end (Spark's progress: timestamp +
    batchDuration), as its log line states them: where a checkpoint's lag goes."""

    def __init__(self, event: ProgressEvent, seen_at: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._end = event.batch_end_ms / 1000
        self._marks: list[tuple[str, float]] = [("progress handed over", seen_at), ("reported", clock())]

    def mark(self, step: str) -> None:
        """`step` ended now."""
        self._marks.append((step, self._clock()))

    def __str__(self) -> str:
        return ", ".join(f"{step} +{at - self._end:.3f}s" for step, at in self._marks)
