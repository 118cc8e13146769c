"""[C0] of runtime/__init__.py: the driver's sidecar stores each batch's plan before Spark publishes it.

The driver JVM (DriverHooks) sends a plan request (runtime/spool) while Spark's write of
`offsets/<M>` is open and publishes the file only once this answers "uploaded": the batch's plan is
then durable (checkpoints/plans.py: the blob, why it exists). The plan holds those bytes, `commits/<M-1>`
and the driver files Spark changed since the previous plan this sidecar stored for the location (all
of them after a restart of the sidecar), read without following a symlink.

Fenced like the uploads (runtime/diff_bases.py): once this application (its attempt identity) has
checkpointed the query, a checkpoint written by another identity means another application owns it
now, and no plan is stored any more (the answer is "error", so the old application's batch fails).

An outage of the blob store or the checkpoint log (which fencing reads) holds the batch, it does not
fail it: the request is retried with backoff, a WARNING naming query, batch, blob and cause at the
first failure and then every RETRY_LOG_SECONDS, until `retry_for` seconds (commitTimeout) after the JVM
asked, less RETRY_MARGIN_SECONDS so the answer arrives while the JVM still waits. As with uploads and
checkpoints, a query whose storage is down waits and fails only after commitTimeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..checkpoints.logs import CheckpointLog, CheckpointLogError
from ..checkpoints.plans import Plan, store_plan
from ..errors import BlobStoreError
from ..spark.config import PREFIX
from ..spark.location import FileSignature, read_plan_files
from ..stores import BlobStore
from . import spool as sp

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar

RETRY_FIRST_SECONDS = 0.2
RETRY_MAX_SECONDS = 5.0
RETRY_LOG_SECONDS = 30.0
RETRY_MARGIN_SECONDS = 5.0


class PlanStore:
    """Serves the plan requests of the driver's spool dir (module doc). Thread-safe."""

    def __init__(
        self,
        store: BlobStore,
        checkpoint_log: CheckpointLog,
        *,
        app_id: str,
        resolve_query_id: Callable[[Path], str | None],
        retry_for: float = 1800.0,
    ) -> None:
        """`retry_for`: seconds after a request that an outage may hold it (commitTimeout; module doc)."""
        self.retry_for = retry_for
        self._closed = threading.Event()  # close(): retries give up at once
        self.store = store
        self.log = checkpoint_log
        self.app_id = app_id
        self.resolve_query_id = resolve_query_id
        self._lock = threading.Lock()  # Spark plans one batch of a query at a time; this keeps `_sent` whole
        self._sent: dict[str, dict[str, FileSignature]] = {}  # real location -> files of its previous plan
        self._owned: set[str] = set()  # queries this application has checkpointed

    def close(self) -> None:
        """Stop retrying: a request held by an outage is answered "error" at once (the sidecar stops)."""
        self._closed.set()

    def serve(self, req: sp.PlanRequest) -> tuple[sp.RestoreStatus, str]:
        """Store the plan `req` describes; ("uploaded", the blob id) once it is stored (or was stored
        before with the same offsets), ("error", why naming query, batch and blob) if it is not. An
        outage of the blob store or the checkpoint log is retried until `retry_for` after the request
        (module doc); anything else is answered at once."""
        deadline = req.created_at_ms / 1000 + self.retry_for - RETRY_MARGIN_SECONDS
        delay, attempt, logged_at = RETRY_FIRST_SECONDS, 0, float("-inf")
        while True:
            attempt += 1
            try:
                return self._serve_once(req)
            except (BlobStoreError, CheckpointLogError) as e:
                cause = f"{type(e).__name__}: {e}"
                what = f"query {req.query_id or req.checkpoint_root} batch {req.batch_id}"
                if self._closed.is_set() or time.time() + delay > deadline:
                    why = (
                        f"{what}: the plan could not be stored after {attempt} attempt(s) within "
                        f"{PREFIX}commitTimeout ({self.retry_for:g} s): {cause}"
                    )
                    log.error("plan: %s", why)
                    return "error", why
                if time.monotonic() - logged_at >= RETRY_LOG_SECONDS:
                    logged_at = time.monotonic()
                    log.warning(
                        "plan: %s: storing its plan failed (attempt %d), retrying until %scommitTimeout; "
                        "the batch waits meanwhile: %s",
                        what,
                        attempt,
                        PREFIX,
                        cause,
                    )
                self._closed.wait(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)

    def _serve_once(self, req: sp.PlanRequest) -> tuple[sp.RestoreStatus, str]:
        """One attempt of `serve`; raises BlobStoreError / CheckpointLogError on an outage."""
        started = time.monotonic()
        qid = req.query_id or self.resolve_query_id(req.checkpoint_root)
        if qid is None:
            why = f"batch {req.batch_id}: no query is known for checkpoint location {req.checkpoint_root}"
            log.error("plan: %s", why)
            return "error", why
        owner = self._owner_if_fenced(qid)
        if owner is not None:
            why = (
                f"query {qid} batch {req.batch_id}: application {owner} now owns the query (its "
                f"checkpoints); application {self.app_id} was fenced and stores no plan for it"
            )
            log.error("plan: %s", why)
            return "error", why
        location = os.path.realpath(req.checkpoint_root)
        with self._lock:
            files, now, skipped = read_plan_files(
                req.checkpoint_root, req.batch_id, self._sent.get(location, {})
            )
            files[f"offsets/{req.batch_id}"] = req.offsets
            plan = Plan(qid, req.batch_id, files, app_id=self.app_id)
            blob_id, written = store_plan(self.store, plan)
            self._sent[location] = now
        if skipped:
            log.warning(
                "query %s batch %d: plan %s leaves out %s in %s: symlinks, never followed (none of Spark's "
                "files; the query's checkpoints fail while they are there)",
                qid,
                req.batch_id,
                blob_id,
                ", ".join(skipped),
                req.checkpoint_root,
            )
        log.debug(
            "query %s batch %d: plan %s %s (%d file(s), %d byte(s)) in %.1f ms",
            qid,
            req.batch_id,
            blob_id,
            "stored" if written else "already stored with these offsets",
            len(files),
            sum(len(v) for v in files.values()),
            (time.monotonic() - started) * 1000,
        )
        return "uploaded", blob_id

    def _owner_if_fenced(self, qid: str) -> str | None:
        """The identity that owns `qid` now if this application checkpointed it and another one has since.
        With the checkpoint log unreachable there is no new evidence: what was known holds, and the plan
        goes on (planning must not stop while the log is down; the checkpoints wait it out and the
        commit gate holds the query after maxCommitDelay, as without plans)."""
        try:
            latest = self.log.read_latest(qid)
        except CheckpointLogError as e:
            log.debug("plan: query %s: fencing not re-checked, the checkpoint log is unreachable: %s", qid, e)
            return None
        if latest is None:
            return None
        if self.app_id and latest.writer_app_id == self.app_id:
            self._owned.add(qid)
        elif latest.writer_app_id and qid in self._owned:
            return latest.writer_app_id
        return None
