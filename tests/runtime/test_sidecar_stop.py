"""The sidecar's stop (SIGTERM from the plugin): the loops finish the turn they are in before the
process exits, within a bound. A checkpoint's cleanup runs after its batch is handed back, so `idle()`
alone let the process exit in the middle of it (a crash-point test in CI caught the replaced record
still naming blobs that expire)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings


class TurnInProgress:
    """Stands in for the commit loop: its first turn is a cleanup that goes on until the sidecar is
    told to stop, then takes `rest` more (an event the test may never set)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.entered = threading.Event()
        self.rest = threading.Event()
        self.finished = threading.Event()

    def commit_once(self) -> bool:
        if self.entered.is_set():
            return False
        self.entered.set()
        assert self.stop.wait(60), "the test never stopped the sidecar"
        if self.rest.wait(60):
            self.finished.set()
        return True

    def due_in(self) -> float | None:
        return None  # no timers: its thread waits for its wake (runtime/spool/wake.py)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[Sidecar, TurnInProgress]]:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
        }
    )
    s = Sidecar(sp.Spool(tmp_path / "spool"), "driver", settings)
    turn = TurnInProgress(s.stop_event)
    s.commits = turn  # type: ignore[assignment]  # the loop thread runs what start() finds here
    s.start()
    assert turn.entered.wait(30), "the commit loop never ran"
    yield s, turn
    turn.rest.set()
    s.close()


def test_stop_waits_for_the_turn_a_loop_is_in(sidecar: tuple[Sidecar, TurnInProgress]) -> None:
    s, turn = sidecar
    assert s.idle(), "nothing pending: the drain alone would have let the process exit here"
    turn.rest.set()  # the turn can end only once stop has been asked for (it waits for stop_event)
    assert s.stop(30) is True
    assert turn.finished.is_set(), "stop returned before the commit loop's turn ended"
    assert not any(t.is_alive() for t in s._threads)


def test_stop_gives_up_on_a_turn_past_its_bound_and_names_the_thread(
    sidecar: tuple[Sidecar, TurnInProgress], caplog: pytest.LogCaptureFixture
) -> None:
    s, turn = sidecar
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.sidecar"):
        assert s.stop(0.2) is False
    assert not turn.finished.is_set()
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("ssb-commit" in m and "driver" in m for m in warning), warning
