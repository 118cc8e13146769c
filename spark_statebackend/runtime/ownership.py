"""Who owns a query: the one home of the fencing rule of a sidecar process (runtime/committer.py:
zombies).

The rule: once this application (its identity, runtime/spool `app_identity`: the app id plus its
attempt if it has one) has seen a checkpoint of a query written by itself, a latest checkpoint
written by another identity means another application, or another attempt, owns the query now, and
this one was fenced for good: its committer writes no checkpoint of it, its uploads stop, its driver
sidecar stores no plan of it.

One sidecar process builds one Ownership (runtime/sidecar.py) and hands it to its committer, its
upload loop's DiffBases and its restore loop's PlanStore. The committer and DiffBases feed it every
latest checkpoint they read from the checkpoint log anyway (`saw`), the committer also each
checkpoint it writes (`wrote`) and the log refusing its write (`refused`); PlanStore only asks
(`takeover`), which never touches the log, so a plan request is answered at the blob store's pace
even while the checkpoint log hangs. What it knows is therefore as fresh as the last checkpoint read
of the query by this process: the driver's committer reads one before every checkpoint it writes.

Zombies (SAMZA-2787: a paused old driver waking up beside a new one, a whole old application, or an old
attempt of the same application, whose executors YARN may leave running beside the next attempt's):
every writer of a query's shared state is fenced. An application is told apart by its identity, its app
id plus its attempt if it has one (runtime/spool `app_identity`). Marker reports carry the identity of
the sidecar that wrote them and a committer takes only its own identity's; every marker is checked
before the write (its SnapshotIndex loads, is of this query, store and version, and every file it added
since the store's checkpointed snapshot exists); each checkpoint records its writer's identity, and a
committer (or sidecar) of an application that had checkpointed a query and then sees a checkpoint
written by another identity (another application, or another attempt) stops for good (the sidecar
uploads nothing more for that query and counts its snapshots as lag, so that application's commits
block, and its driver sidecar stores no more plans of it). That rule, and what the sidecar process knows
of it, live in one place (ownership.py), which the committer (committer.py) feeds. A fenced write
(CheckpointFencedError) raises, drops the query's pending batches and stops this committer from ever
committing the query again; if a newer writer got in after our write, cleanup is skipped (cleanup.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..checkpoints.checkpoint import CheckpointV2
from ..checkpoints.logs import CheckpointFencedError


@dataclass(frozen=True)
class Takeover:
    """The evidence that another identity owns a query now: `owner` wrote its checkpoint
    `checkpoint_id` after this application had checkpointed the query. Both are "" when no checkpoint
    showed it but the checkpoint log itself refused this writer (`cause`: how, in words)."""

    query_id: str
    owner: str
    checkpoint_id: str
    cause: str = ""

    def describe(self, app_id: str) -> str:
        """The evidence in words, naming query, owner and checkpoint (for logs and errors)."""
        if not self.owner:
            return (
                f"query {self.query_id}: the checkpoint log refused a checkpoint of this application "
                f"({app_id}), a newer writer holds the query: {self.cause}"
            )
        return (
            f"query {self.query_id}: checkpoint {self.checkpoint_id} was written by application "
            f"{self.owner} after this application ({app_id}) had checkpointed it; {self.owner} owns "
            f"the query now"
        )


class Fenced(CheckpointFencedError):
    """A checkpoint read shows that another identity took over a query this application had
    checkpointed (`takeover`); a CheckpointFencedError, so the committer's handling applies."""

    def __init__(self, takeover: Takeover, app_id: str) -> None:
        super().__init__(takeover.describe(app_id))
        self.takeover = takeover

    @property
    def query_id(self) -> str:
        return self.takeover.query_id

    @property
    def owner(self) -> str:
        return self.takeover.owner

    @property
    def checkpoint_id(self) -> str:
        return self.takeover.checkpoint_id


class Ownership:
    """What one sidecar process knows of who owns its queries (module doc). Thread-safe: the
    committer, upload and restore threads share one instance; no method does any I/O."""

    def __init__(self, app_id: str) -> None:
        """`app_id`: this application attempt's identity; "" (no identity) never owns a query, so it
        is never fenced either."""
        self.app_id = app_id
        self._lock = threading.Lock()
        self._owned: set[str] = set()  # queries a checkpoint of this identity was seen for
        self._lost: dict[str, Takeover] = {}  # fenced queries: for good

    def saw(self, latest: CheckpointV2 | None) -> None:
        """Learn from a query's latest checkpoint, just read from the checkpoint log (None: the query
        has none, which teaches nothing). Raises Fenced if it was written by another identity after
        this one had checkpointed the query, or if the query was taken over before (for good: from
        then on `takeover` names the first evidence, whatever is read later)."""
        if latest is None:
            return
        qid, writer = latest.query_id, latest.writer_app_id
        with self._lock:
            lost = self._lost.get(qid)
            if lost is None:
                if self.app_id and writer == self.app_id:
                    self._owned.add(qid)
                    return
                if not writer or qid not in self._owned:
                    return
                lost = self._lost[qid] = Takeover(qid, writer, str(latest.checkpoint_id))
        raise Fenced(lost, self.app_id)

    def wrote(self, checkpoint: CheckpointV2) -> None:
        """This process just wrote `checkpoint` to the log: its identity owns that query now."""
        if checkpoint.writer_app_id and checkpoint.writer_app_id == self.app_id:
            with self._lock:
                self._owned.add(checkpoint.query_id)

    def refused(self, query_id: str, cause: str) -> None:
        """The checkpoint log refused this writer of `query_id` (CheckpointFencedError of a write: a
        newer writer holds it), which no checkpoint read may have shown: the query is taken over
        for good all the same. Evidence recorded before stays."""
        with self._lock:
            self._lost.setdefault(query_id, Takeover(query_id, "", "", cause))

    def takeover(self, query_id: str) -> Takeover | None:
        """The evidence that another identity owns `query_id` now, None if this process knows of none.
        Never reads the checkpoint log: a takeover no checkpoint read of this process has seen yet is
        not known here (module doc)."""
        with self._lock:
            return self._lost.get(query_id)
