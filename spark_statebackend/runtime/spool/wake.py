"""Waiting for work: what the sidecar's loops block on between two turns, so an idle sidecar costs
nothing measurable (no polling loop) and still starts on new work within milliseconds.

A loop whose turn found nothing to do waits on its `Wake` until the first of:

- the JVM puts a file into a spool dir the loop serves (`SpoolWatch`: inotify; one instance and one
  thread, `ssb-spool-watch`, per sidecar). Only complete files wake a loop: one renamed into the dir
  (the protocol's atomic write) or closed after writing; hidden temporaries (``.<name>.tmp``) and
  subdirectories (``claimed/``, ``bad/``) never do;
- something in the process notifies it (`Wake.notify`): a restore slot came free, the sidecar is told
  to stop (`StopEvent`);
- the loop's own next timer is due: the timeout it passes (a retry's backoff, a batch hold running out,
  the committer's next look);
- FALLBACK_SECONDS passed: a missed event (an inotify queue overflow wakes every loop at once; a file
  system that reports none) delays work by at most that much.

A dir that cannot be watched (no inotify on this OS, the user's inotify instances or watches used up,
the dir missing) is polled every UNWATCHED_POLL_SECONDS instead, as before this module, with one
WARNING naming it; its watch is tried again every FALLBACK_SECONDS and, once back, the polling stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import weakref
from pathlib import Path

import inotify_simple

log = logging.getLogger("spark_statebackend.sidecar")  # the loops' logger

#: The longest a waiting loop sleeps without being woken: a missed event costs at most this long.
FALLBACK_SECONDS = 1.0
#: How often a loop looks into a dir that inotify does not watch (the old polling interval).
UNWATCHED_POLL_SECONDS = 0.02

_MASK = (
    inotify_simple.flags.MOVED_TO
    | inotify_simple.flags.CLOSE_WRITE
    | inotify_simple.flags.ONLYDIR
    | inotify_simple.flags.DONT_FOLLOW
    | inotify_simple.flags.EXCL_UNLINK
)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Wake:
    """What one loop blocks on between turns (module doc). Any thread, and a signal handler, may
    `notify()`; one thread at a time `wait()`s. A notification nobody waits for yet is kept: the next
    wait returns at once, so none is lost between a turn and the wait after it."""

    def __init__(self, fallback_seconds: float | None = None) -> None:
        """`fallback_seconds`: the longest wait (None: FALLBACK_SECONDS as it is now)."""
        self.fallback_seconds = FALLBACK_SECONDS if fallback_seconds is None else fallback_seconds
        #: False while a dir this loop serves is not watched (SpoolWatch): the wait is then a short poll.
        self.watched = True
        self._read, self._write = os.pipe()  # both close-on-exec (PEP 446)
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)
        # Closed once the wake is unreachable: a loop thread abandoned at stop may still wait on it.
        weakref.finalize(self, _close_fds, self._read, self._write)

    def fileno(self) -> int:
        """The descriptor that is readable while a notification is pending (to poll with others)."""
        return self._read

    def notify_fd(self) -> int:
        """The descriptor a byte written to wakes the waiter (non-blocking), e.g. for
        `signal.set_wakeup_fd`, which writes one whichever thread the kernel gave the signal to."""
        return self._write

    def notify(self) -> None:
        """Wake the waiting thread now, or make its next wait return at once."""
        with contextlib.suppress(BlockingIOError):  # the pipe is full: it is awake already
            os.write(self._write, b"\0")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until notified or `timeout` seconds passed (None: the caller has no timer), never
        longer than the fallback, nor than UNWATCHED_POLL_SECONDS while a dir of this loop is not
        watched. True if notified; the notification is used up."""
        limit = self.fallback_seconds if self.watched else min(self.fallback_seconds, UNWATCHED_POLL_SECONDS)
        seconds = limit if timeout is None else max(0.0, min(timeout, limit))
        if not self._poll.poll(seconds * 1000):
            return False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass
        return True


class StopEvent(threading.Event):
    """A threading.Event whose `set()` also notifies the wakes it was given (`add`), so a loop blocked
    in its wait sees the stop at once."""

    def __init__(self) -> None:
        super().__init__()
        self._wakes: tuple[Wake, ...] = ()

    def add(self, *wakes: Wake) -> None:
        """Notify `wakes` too when set (at once if set already)."""
        self._wakes += wakes
        if self.is_set():
            for wake in wakes:
                wake.notify()

    def set(self) -> None:
        super().set()
        for wake in self._wakes:
            wake.notify()


class SpoolWatch:
    """inotify watches on a sidecar's spool dirs, each waking the wakes of the loops that serve it
    (module doc), read by one thread (`ssb-spool-watch`). Dirs are added before `start`."""

    def __init__(self) -> None:
        self._wakes: dict[Path, list[Wake]] = {}  # dir -> the wakes it wakes
        self._watches: dict[int, Path] = {}  # watch descriptor -> dir (only the watched ones)
        self._refused: set[Path] = set()  # dirs whose watch failed (logged once each)
        self._inotify: inotify_simple.INotify | None = None
        self._stop = Wake()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, directory: Path, wake: Wake) -> None:
        """Wake `wake` whenever a complete file appears in `directory` (module doc)."""
        self._wakes.setdefault(directory, []).append(wake)

    def start(self) -> None:
        """Watch the dirs added so far, from the watch thread; without inotify, their loops poll."""
        try:
            self._inotify = inotify_simple.INotify()
        except (OSError, AttributeError) as e:  # another OS (no inotify_init1), or instances used up
            log.warning(
                "inotify is not available (%s): the sidecar looks into its spool dirs every %.0f ms "
                "instead of waiting for their files",
                e,
                UNWATCHED_POLL_SECONDS * 1000,
            )
            for wakes in self._wakes.values():
                for wake in wakes:
                    wake.watched = False
            return
        self._watch_missing()
        self._thread = threading.Thread(target=self._run, name="ssb-spool-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watch thread and release the inotify instance."""
        self._closed = True
        self._stop.notify()
        if self._thread is not None:
            self._thread.join(5.0)
            if self._thread.is_alive():
                return  # never close an fd a running thread may still read
        if self._inotify is not None:
            self._inotify.close()

    def _watch_missing(self) -> bool:
        """Try to watch every dir not watched yet; True if all are. Marks their wakes' `watched`."""
        assert self._inotify is not None
        watched = set(self._watches.values())
        for directory, wakes in self._wakes.items():
            if directory in watched:
                continue
            try:
                self._watches[self._inotify.add_watch(directory, _MASK)] = directory
            except OSError as e:  # missing, or max_user_watches used up
                if directory not in self._refused:
                    self._refused.add(directory)
                    log.warning(
                        "cannot watch spool dir %s (%s): it is looked into every %.0f ms until it can",
                        directory,
                        e,
                        UNWATCHED_POLL_SECONDS * 1000,
                    )
                for wake in wakes:
                    wake.watched = False
                continue
            if directory in self._refused:
                self._refused.discard(directory)
                log.info("spool dir %s is watched again", directory)
            for wake in wakes:
                if not wake.watched:
                    wake.notify()  # whatever arrived while it was not watched is looked at now
                wake.watched = True
        return len(self._watches) == len(self._wakes)

    def _run(self) -> None:
        assert self._inotify is not None
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._stop.fileno(), select.POLLIN)
        while not self._closed:
            try:
                all_watched = self._watch_missing()
                poller.poll(None if all_watched else FALLBACK_SECONDS * 1000)
                if not self._closed:
                    self._dispatch(self._inotify.read(timeout=0))
            except Exception:  # never leave the loops without their wake-ups: they fall back to polls
                log.exception("the spool watch failed; the loops look into their dirs every second")
                for wakes in self._wakes.values():
                    for wake in wakes:
                        wake.notify()
                self._stop.wait(FALLBACK_SECONDS)

    def _dispatch(self, events: list[inotify_simple.Event]) -> None:
        flags = inotify_simple.flags
        woken: set[int] = set()
        for event in events:
            if event.mask & flags.Q_OVERFLOW:  # events were lost: every loop looks
                woken.update(self._watches)
            elif event.mask & flags.IGNORED:  # the dir went (deleted, unmounted): watched again later
                directory = self._watches.pop(event.wd, None)
                for wake in self._wakes.get(directory, []) if directory is not None else []:
                    wake.watched = False
                    wake.notify()
            elif not event.mask & flags.ISDIR and not event.name.startswith("."):
                woken.add(event.wd)
        for wd in woken:
            directory = self._watches.get(wd)
            for wake in self._wakes.get(directory, []) if directory is not None else []:
                wake.notify()
