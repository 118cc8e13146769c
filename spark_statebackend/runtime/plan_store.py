"""[C0] of runtime/__init__.py: the driver's sidecar stores each batch's plan before Spark publishes it.

The driver JVM (DriverHooks) sends a plan request (runtime/spool) while Spark's write of
`offsets/<M>` is open and publishes the file only once this answers "uploaded": the batch's plan is
then durable (lifecycle/plans.py: the blob, why it exists). The plan holds those bytes, `commits/<M-1>`
and the driver files Spark changed since the previous plan this sidecar stored for the location (all
of them after a restart of the sidecar), read without following a symlink.

Fenced like the uploads and the checkpoints (runtime/ownership.py holds the rule): once this
application (its attempt identity) has checkpointed the query, a checkpoint written by another
identity means another application owns it now, and no plan is stored any more (the answer is
"error" naming query, batch, owner and checkpoint, so the old application's batch fails). The
evidence is what this sidecar's committer last read: the latest checkpoint it reads before each
checkpoint it writes, and the log refusing its write. A plan request never reads the checkpoint log
(it would stall while the log hangs, and the JVM waits for the plan before every batch: a frozen log
would fail the query on its plan, before the commit gate that names maxCommitDelay). The window that
leaves: a zombie driver whose committer has not tried to checkpoint since the new owner's first
checkpoint still stores plans. That is never a silent loss: a plan is never overwritten, so whichever
application stores batch M's plan second with other offsets gets an error naming query, batch and
blob (lifecycle/plans.py) and its batch fails; the zombie's next checkpoint attempt fences it, and
its plans stop.

An outage of the blob store (or of the checkpoint log, read only to find the query of a request
that names none) holds the batch, it does not fail it: the request is retried with backoff, a
WARNING naming query, batch, blob and cause at the first failure and then every RETRY_LOG_SECONDS,
until `retry_for` seconds (commitTimeout) after the JVM asked, less RETRY_MARGIN_SECONDS so the answer
arrives while the JVM still waits. As with uploads and checkpoints, a query whose storage is down
waits and fails only after commitTimeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..checkpoints.logs import CheckpointLogError
from ..errors import BlobStoreError
from ..lifecycle.plans import Plan, store_plan
from ..settings import PREFIX
from ..spark.location import FileSignature, read_plan_files
from ..stores import BlobStore
from . import spool as sp
from .ownership import Ownership

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
        *,
        ownership: Ownership,
        resolve_query_id: Callable[[Path], str | None],
        retry_for: float = 1800.0,
    ) -> None:
        """`ownership`: the sidecar process's (runtime/ownership.py), asked before each plan (no I/O);
        its identity is the one the plans carry. `retry_for`: seconds after a request that an outage
        may hold it (commitTimeout; module doc)."""
        self.retry_for = retry_for
        self._closed = threading.Event()  # close(): retries give up at once
        self.store = store
        self.ownership = ownership
        self.app_id = ownership.app_id
        self.resolve_query_id = resolve_query_id
        self._lock = threading.Lock()  # Spark plans one batch of a query at a time; this keeps `_sent` whole
        self._sent: dict[str, dict[str, FileSignature]] = {}  # real location -> files of its previous plan

    def close(self) -> None:
        """Stop retrying: a request held by an outage is answered "error" at once (the sidecar stops)."""
        self._closed.set()

    def serve(self, req: sp.PlanRequest) -> tuple[sp.RestoreStatus, str]:
        """Store the plan `req` describes; ("uploaded", the blob id) once it is stored (or was stored
        before with the same offsets), ("error", why naming query, batch and blob) if it is not. An
        outage of the blob store (or of the checkpoint log, module doc) is retried until `retry_for`
        after the request (module doc); anything else is answered at once."""
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
        """One attempt of `serve`; raises BlobStoreError on an outage (CheckpointLogError only while
        finding the query of a request that names none)."""
        started = time.monotonic()
        qid = req.query_id or self.resolve_query_id(req.checkpoint_root)
        if qid is None:
            why = f"batch {req.batch_id}: no query is known for checkpoint location {req.checkpoint_root}"
            log.error("plan: %s", why)
            return "error", why
        takeover = self.ownership.takeover(qid)  # no I/O: what this sidecar's committer last read
        if takeover is not None:
            why = (
                f"query {qid} batch {req.batch_id}: application {self.app_id} was fenced and stores no "
                f"plan for it ({takeover.describe(self.app_id)})"
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
