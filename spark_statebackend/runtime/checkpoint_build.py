"""What goes into one batch's checkpoint ([C5] of runtime/__init__.py): the reported store markers,
the `_driver` snapshot of the checkpoint location's driver files uploaded beside them, the batch's
input offsets and the partitioning epoch. The committer (committer.py) decides when a batch is ready
and owns the commit point around it (the locator, the write, the cleanup); this module only assembles
the record, so nothing here writes to the checkpoint log.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointId, CheckpointV2
from ..checkpoints.logs import CheckpointLog
from ..lifecycle.reports import Report
from ..spark.location import driver_staging_dir, stage_driver_files
from .progress import ProgressEvent
from .query_state import QueryState


def build_checkpoint(
    q: QueryState,
    event: ProgressEvent,
    reports: Mapping[str, Report],
    *,
    checkpoint_log: CheckpointLog,
    spool_dir: Path | None,
    app_id: str,
) -> CheckpointV2:
    """The CheckpointV2 of batch `event` of query state `q`, whose every store reported (`reports`,
    checked), written by application `app_id`. Uploads the `_driver` snapshot (staged in the driver's
    spool dir `spool_dir`, never in the location: it may be deleted at stop) and updates
    `q.repartitioned_at` when this batch starts a new partitioning. Raises on a failure of the store
    or the log; the checkpoint itself is not written."""
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
    markers = {**store_markers, **driver_snapshot(q, event, spool_dir)}
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
    against the query's previous `_driver` snapshot; what a driver on a new host rebuilds the location
    from (spark/ [D4])."""
    staging = driver_staging_dir(spool_dir)  # never the location: it may be deleted at stop
    with tempfile.TemporaryDirectory(prefix=".driver-", dir=staging) as tmp:
        stage_driver_files(event.checkpoint_root, event.batch_id, Path(tmp))
        return q.manager.upload(
            f"b{event.batch_id:012d}", {DRIVER_STORE: Path(tmp)}, versions={DRIVER_STORE: event.batch_id}
        )
