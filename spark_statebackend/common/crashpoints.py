"""Test-only crash points: kill -9 this process at a named step of the commit or restore lifecycle.

Off unless `spark.statebackend.test.crashAt` is set (never set it in production); the crash tests
(tests/runtime/test_crashpoints.py, tests/system/test_spark_crashpoints.py) use it to prove that a
crash at every step loses and leaks nothing.

    spark.statebackend.test.crashAt = <entry>[,<entry>...]
    <entry>   = <point>[@<n>][/<process>]

- `<point>`: one of POINTS (below). `after_staging` is in the JVM shim (SnapshotStager: after a
  committed version is hard-linked and its event published); the others are in this package.
- `@<n>`: crash at the n-th time this process reaches the point (default 1).
- `/<process>`: only in that process: `driver` (the PySpark driver's Python process), `sidecar` (any
  sidecar), `sidecar-<executor id>` (e.g. `sidecar-driver`, the driver's sidecar, which also serves
  the executor in local mode), `jvm` (any JVM) or `jvm-<executor id>`. Default: any process.

A process arms the points with `arm()` (the sidecar at start, the driver before a query starts); the
JVM reads the key itself (CrashPoints.java, same grammar). With a `once_dir` (the application attempt's
spool dir `<spool root>/<app identity>/`, shared by every sidecar and executor JVM of the attempt on this
host; runtime/spool `app_identity`), each point fires at most once per application attempt: the
crashing process first creates
`<once_dir>/test-crash-fired/<point>` exclusively, so a restarted sidecar or a relaunched executor
does not crash again. The kill is SIGKILL of the process itself (the JVM: Runtime.halt(137)): no
finally block, atexit handler or shutdown hook runs, as with a real kill -9.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

KEY = "spark.statebackend.test.crashAt"
FIRED_DIR = "test-crash-fired"

AFTER_STAGING = "after_staging"
DURING_FILE_UPLOAD = "during_file_upload"
BEFORE_INDEX_UPLOAD = "before_index_upload"
BEFORE_CHECKPOINT_WRITE = "before_checkpoint_write"
AFTER_CHECKPOINT_WRITE = "after_checkpoint_write"
DURING_CLEANUP = "during_cleanup"
DURING_RESTORE = "during_restore"

#: Every crash point, in commit-lifecycle order, with where it is.
POINTS: dict[str, str] = {
    AFTER_STAGING: "JVM shim: a committed version is staged and its event published",
    DURING_FILE_UPLOAD: "BackupManager.upload: after a file chunk is uploaded, others pending or in flight",
    BEFORE_INDEX_UPLOAD: "BackupManager.upload: every file uploaded, the SnapshotIndex not yet",
    BEFORE_CHECKPOINT_WRITE: "Committer: every marker and the _driver snapshot uploaded, no checkpoint yet",
    AFTER_CHECKPOINT_WRITE: "Committer: the checkpoint is written, cleanup has not started",
    DURING_CLEANUP: "BackupManager.cleanup: a store's TTLs removed, its replaced blobs not yet deleted",
    DURING_RESTORE: "RestoreManager.restore: after a chunk is downloaded, before the swap into place",
}
JVM_POINTS = frozenset({AFTER_STAGING})


@dataclass(frozen=True)
class CrashSpec:
    """One armed crash: at the `nth` hit of `point` in a process matching `process` (None: any)."""

    point: str
    nth: int = 1
    process: str | None = None

    def matches(self, process: str) -> bool:
        """Whether a process named `process` (e.g. 'sidecar-0', 'driver', 'jvm-1') is targeted."""
        if self.process is None or self.process == process:
            return True
        return self.process in ("sidecar", "jvm") and process.startswith(self.process + "-")


def parse_spec(text: str, key: str = KEY) -> tuple[CrashSpec, ...]:
    """Parse the key's value (module doc); ConfigError naming `key` on anything malformed."""
    specs = []
    for raw in str(text).split(","):
        entry = raw.strip()
        if not entry:
            continue
        rest, _, process = entry.partition("/")
        point, _, nth_text = rest.partition("@")
        point = point.strip()
        if point not in POINTS:
            raise ConfigError(key, f"unknown crash point {point!r}; one of {', '.join(POINTS)}")
        nth = 1
        if nth_text:
            if not nth_text.strip().isdigit() or int(nth_text) < 1:
                raise ConfigError(key, f"{entry!r}: the hit count after '@' must be a whole number >= 1")
            nth = int(nth_text)
        proc = process.strip() or None
        if proc is not None:
            ok = proc in ("driver", "sidecar", "jvm") or (
                proc.split("-", 1)[0] in ("sidecar", "jvm") and len(proc.split("-", 1)) == 2
            )
            if not ok:
                raise ConfigError(
                    key, f"{entry!r}: process must be driver, sidecar[-<executor id>] or jvm[-<executor id>]"
                )
            if (point in JVM_POINTS) != proc.startswith("jvm"):
                raise ConfigError(key, f"{entry!r}: {point} is never reached in process {proc!r}")
        specs.append(CrashSpec(point, nth, proc))
    return tuple(specs)


_lock = threading.Lock()
_armed: tuple[CrashSpec, ...] = ()  # empty: every crash_point() is a no-op (the production case)
_process = ""
_once_dir: Path | None = None
_hits: Counter[str] = Counter()


def arm(specs: tuple[CrashSpec, ...] | str, *, process: str, once_dir: Path | None = None) -> None:
    """Arm this process (named `process`, see CrashSpec.matches) with `specs`; hit counts restart at 0.

    Entries for other processes are ignored. An empty spec disarms."""
    global _armed, _process, _once_dir
    parsed = parse_spec(specs) if isinstance(specs, str) else specs
    with _lock:
        _armed = tuple(s for s in parsed if s.matches(process) and s.point not in JVM_POINTS)
        _process = process
        _once_dir = once_dir
        _hits.clear()


def disarm() -> None:
    arm((), process="")


def armed() -> tuple[CrashSpec, ...]:
    return _armed


def crash_point(name: str) -> None:
    """Reaching step `name`: kill -9 this process if an armed spec says this is the hit to crash at."""
    if not _armed:  # not under test: one global read
        return
    with _lock:
        _hits[name] += 1
        hit = _hits[name]
        due = any(s.point == name and s.nth == hit for s in _armed)
        if not due:
            return
        if _once_dir is not None:
            fired = _once_dir / FIRED_DIR
            try:
                fired.mkdir(parents=True, exist_ok=True)
                os.close(os.open(fired / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                return  # another process of this application crashed here already
        sys.stderr.write(
            f"spark-statebackend TEST CRASH POINT {name} (hit {hit}) "
            f"in {_process} pid {os.getpid()}: kill -9\n"
        )
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
