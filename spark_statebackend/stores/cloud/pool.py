"""A cloud store's bounded I/O pool and its store-wide limit on blocks and ranges held in memory."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class IoPool:
    """`workers` threads named `thread_name`-n (the executor is created on first use) and
    2 * `workers` buffers: `take()` one before holding a block or range in memory, `give()` it back
    after. `take(block=False)` lets a reader that already holds buffers deliver one instead of
    waiting, which is what keeps ordered reads deadlock-free."""

    def __init__(self, workers: int, thread_name: str) -> None:
        self._workers = workers
        self._thread_name = thread_name
        self._buffers = threading.BoundedSemaphore(2 * workers)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The thread pool, created on first use."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix=self._thread_name
                )
            return self._executor

    def take(self, block: bool = True) -> bool:
        """Reserve one buffer; False only if `block` is False and none is free."""
        return self._buffers.acquire(blocking=block)

    def give(self) -> None:
        """Return a buffer reserved by take()."""
        self._buffers.release()

    def close(self) -> None:
        """Shut the pool down (queued tasks cancelled, running ones awaited); a later use makes a new one."""
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None
