"""TransferPool: a bounded queue with back-pressure. At most workers + queue_size tasks are submitted and
unfinished at once, across callers; run_all takes tasks from its iterable only as slots free, stops
taking them after a failure, and every wait is bounded by its timeout."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from spark_statebackend.engine.transfer import TransferPool

WORKERS = 2
QUEUE = 2 * WORKERS  # the default queue_size


class Tasks:
    """A lazy stream of tasks that counts how many the pool has taken and how many finished."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n = n
        self.fail_at = fail_at
        self.taken = 0
        self.started = 0
        self.finished = 0
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[Callable[[], int]]:
        for i in range(self.n):
            self.taken += 1
            yield partial(self.work, i)

    def work(self, i: int) -> int:
        with self.lock:
            self.started += 1
        if i == self.fail_at:
            raise OSError(f"task {i} failed")
        assert self.release.wait(60), "never released"
        with self.lock:
            self.finished += 1
        return i


def test_run_all_takes_tasks_only_as_slots_free() -> None:
    tasks = Tasks(100)
    with TransferPool(WORKERS, name="ssb-test-bounded") as pool:
        # Nothing finishes: the caller fills the slots, takes one more task and waits for a slot, in
        # vain, until its timeout; it never takes another (it used to queue all 100 at once).
        with pytest.raises(TimeoutError, match="ssb-test-bounded"):
            pool.run_all(tasks, timeout=1.0)
        assert tasks.taken == WORKERS + QUEUE + 1
        tasks.release.set()
    more = Tasks(100)
    more.release.set()
    with TransferPool(WORKERS, name="ssb-test-bounded") as pool:
        assert pool.run_all(more, timeout=60) == list(range(100))  # back-pressure, not a limit
    assert more.finished == 100


def test_run_all_stops_taking_tasks_after_a_failure() -> None:
    tasks = Tasks(100, fail_at=0)
    tasks.release.set()
    pool = TransferPool(WORKERS, name="ssb-test-bounded")
    with pool, pytest.raises(OSError, match="task 0 failed"):
        pool.run_all(tasks, timeout=60)
    assert tasks.taken <= WORKERS + QUEUE + 1  # not the 100 it used to queue before failing
    assert tasks.finished == tasks.started - 1  # none is left running (the others were cancelled)


def test_slots_are_shared_by_every_caller_and_a_wait_for_one_is_bounded() -> None:
    blocked = Tasks(WORKERS + QUEUE)
    with TransferPool(WORKERS, name="ssb-test-bounded") as pool:
        futures = [pool.submit(task, timeout=5) for task in blocked]
        assert pool.try_submit(lambda: 0) is None  # full: another caller is told at once
        with pytest.raises(TimeoutError, match=r"ssb-test-bounded: no free slot within 0.2s"):
            pool.submit(lambda: 0, timeout=0.2)
        blocked.release.set()
        assert [f.result(timeout=60) for f in futures] == list(range(WORKERS + QUEUE))
        extra = pool.submit(lambda: 7, timeout=60)  # the slots came back
        assert extra.result(timeout=60) == 7
