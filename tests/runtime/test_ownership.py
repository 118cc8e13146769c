"""Who owns a query (runtime/ownership.py): the fencing rule of a sidecar process, fed with checkpoints
read from a real file checkpoint log, and shared by the loops of a real Sidecar."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import CheckpointId, CheckpointV2
from spark_statebackend.checkpoints.logs import CheckpointFencedError, CheckpointLog, open_checkpoint_log
from spark_statebackend.lifecycle.plans import read_plan
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.ownership import Fenced, Ownership, Takeover
from spark_statebackend.runtime.sidecar import Sidecar
from tests.sidecarrig import KEY, QID, Rig

OTHER = "6b7f2a40-0000-4000-8000-00000000beef"


class Writer:
    """Writes checkpoints of one query into a real file checkpoint log, each by a given identity."""

    def __init__(self, log: CheckpointLog, query_id: str = QID) -> None:
        self.log = log
        self.query_id = query_id
        self.last: CheckpointId | None = None
        self.batch = 0

    def write(self, app_id: str) -> CheckpointV2:
        self.last = CheckpointId.create(self.batch, after=self.last)
        cp = CheckpointV2(self.last, self.query_id, writer_app_id=app_id)
        self.log.write(cp)
        self.batch += 1
        return cp

    def latest(self) -> CheckpointV2 | None:
        return self.log.read_latest(self.query_id)


@pytest.fixture
def writer(tmp_path: Path) -> Writer:
    log = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    log.create_resources()
    return Writer(log)


def test_another_identity_fences_only_after_this_one_has_checkpointed(writer: Writer) -> None:
    ownership = Ownership("app-1")
    ownership.saw(None)  # no checkpoint yet: nothing learnt
    writer.write("app-0")  # an earlier application's: this one takes over, it is not fenced
    ownership.saw(writer.latest())
    assert ownership.takeover(QID) is None
    writer.write("app-1")
    ownership.saw(writer.latest())
    assert ownership.takeover(QID) is None
    theirs = writer.write("app-2")
    with pytest.raises(Fenced) as raised:
        ownership.saw(writer.latest())
    assert isinstance(raised.value, CheckpointFencedError)  # the committer's handling applies
    assert raised.value.takeover == Takeover(QID, "app-2", str(theirs.checkpoint_id))
    for said in (QID, "app-2", str(theirs.checkpoint_id), "app-1"):
        assert said in str(raised.value), raised.value
    assert ownership.takeover(QID) == raised.value.takeover
    assert ownership.takeover(OTHER) is None  # per query


def test_fenced_is_for_good_and_keeps_the_first_evidence(writer: Writer) -> None:
    ownership = Ownership("app-1")
    writer.write("app-1")
    ownership.saw(writer.latest())
    first = writer.write("app-2")
    with pytest.raises(Fenced):
        ownership.saw(writer.latest())
    writer.write("app-1")  # a zombie's write that landed late teaches nothing
    with pytest.raises(Fenced) as raised:
        ownership.saw(writer.latest())
    assert raised.value.checkpoint_id == str(first.checkpoint_id)
    writer.write("app-3")
    with pytest.raises(Fenced) as raised:
        ownership.saw(writer.latest())
    assert raised.value.owner == "app-2"


def test_its_own_write_makes_it_the_owner(writer: Writer) -> None:
    ownership = Ownership("app-1")
    ownership.wrote(writer.write("app-1"))  # what the committer records after its write
    writer.write("app-2")
    with pytest.raises(Fenced):
        ownership.saw(writer.latest())


def test_no_identity_never_owns_and_is_never_fenced(writer: Writer) -> None:
    ownership = Ownership("")
    ownership.wrote(writer.write(""))
    ownership.saw(writer.latest())
    writer.write("app-2")
    ownership.saw(writer.latest())
    assert ownership.takeover(QID) is None


def test_a_refused_write_fences_without_a_checkpoint(writer: Writer) -> None:
    """The checkpoint log refused this writer (a Kafka writer's epoch): no checkpoint read showed the
    takeover, the query is lost all the same, and a later read keeps it lost."""
    ownership = Ownership("app-1")
    ownership.refused(QID, "producer fenced by a newer transactional writer")
    takeover = ownership.takeover(QID)
    assert takeover is not None and takeover.owner == ""
    said = takeover.describe("app-1")
    assert QID in said and "app-1" in said and "producer fenced" in said
    writer.write("app-1")
    with pytest.raises(Fenced):
        ownership.saw(writer.latest())


def test_threads_agree_on_one_takeover(writer: Writer) -> None:
    """The committer, upload and restore threads share one instance: concurrent reads of the same
    takeover all raise it, and every reader sees the same evidence."""
    ownership = Ownership("app-1")
    ownership.wrote(writer.write("app-1"))
    writer.write("app-2")
    latest = writer.latest()
    assert latest is not None
    raised: list[Takeover] = []
    lock = threading.Lock()

    def read() -> None:
        for n in range(200):
            try:
                # a later copy of the same record after the first: never replaces the first evidence
                ownership.saw(latest if n % 2 else dataclasses.replace(latest, writer_app_id="app-3"))
            except Fenced as e:
                with lock:
                    raised.append(e.takeover)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(raised) == 8 * 200
    assert len(set(raised)) == 1 and ownership.takeover(QID) == raised[0]


def test_one_sidecar_shares_one_ownership_between_its_loops(rig: Rig, tmp_path: Path) -> None:
    """The upload loop's diff-base check reads a checkpoint of another application after this one's:
    from then on the same sidecar's plan store refuses the query's plans, with no read of its own."""
    sidecar = Sidecar(sp.Spool(tmp_path / "spool-app-1"), "driver", rig.settings, app_id="app-1")
    try:
        ownership = sidecar.ownership
        assert sidecar.committer.ownership is ownership
        assert sidecar.uploads.bases.ownership is ownership
        assert sidecar.restores.plans.ownership is ownership
        latest = rig.checkpoints[-1]
        ours = dataclasses.replace(
            latest, checkpoint_id=CheckpointId.create(3, after=latest.checkpoint_id), writer_app_id="app-1"
        )
        sidecar.log.write(ours)
        sidecar.uploads.bases.refresh(QID, [KEY])
        theirs = dataclasses.replace(
            ours, checkpoint_id=CheckpointId.create(4, after=ours.checkpoint_id), writer_app_id="app-2"
        )
        sidecar.log.write(theirs)
        with pytest.raises(Fenced):
            sidecar.uploads.bases.refresh(QID, [KEY])
        request = sp.PlanRequest("p5", QID, rig.location, 5, b"offsets 5", "driver", 0)
        status, message = sidecar.restores.plans.serve(request)
    finally:
        sidecar.close()
    assert status == "error"
    for said in (f"query {QID} batch 5", "app-2", str(theirs.checkpoint_id), "fenced"):
        assert said in message, message
    assert read_plan(rig.store, QID, 5) is None
