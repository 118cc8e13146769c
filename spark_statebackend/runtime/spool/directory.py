"""One executor's spool directory (runtime/spool/__init__.py: "Where"): its path, its subdirectories
and files, and the `Spool` that reads and writes them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from .documents import (
    REQUEST_ID,
    CheckpointLocationRequest,
    PlanRequest,
    RestoreRequest,
    RestoreResponse,
    SidecarMarker,
    SnapshotEvent,
)
from .files import (
    atomic_write_json,
    claimed,
    list_pending,
    new_file_stem,
    read_bytes,
    read_event,
    read_response,
    remove,
)

EVENTS_DIR = "events"
REQUESTS_DIR = "requests"
RESPONSES_DIR = "responses"
STREAMS_DIR = "streams"
SIDECAR_MARKER = "sidecar.json"
SIDECAR_CONF = "sidecar-conf.json"
SIDECAR_LOG = "sidecar.log"
SIDECAR_MODULE = "spark_statebackend.runtime.sidecar"

APP_ID_KEY = "spark.app.id"
APP_ATTEMPT_ID_KEY = "spark.app.attempt.id"
ATTEMPT_SEPARATOR = ".attempt-"

_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def sanitize_id(value: str) -> str:
    """The path-safe form of an app or executor id (same rule as the JVM's Conf.sanitizeId)."""
    s = _UNSAFE_ID_CHARS.sub("_", value)
    return "_" if s in ("", ".", "..") else s


def app_identity(app_id: str, attempt_id: str | None = None) -> str:
    """The identity of an application attempt (module doc of runtime/spool, "Where"): `app_id` when there
    is no attempt (empty or None), else `<app_id>.attempt-<attempt id>`, the attempt id made path-safe;
    "" when `app_id` is "" (unknown). The same rule as the JVM's Conf.appIdentity."""
    attempt = (attempt_id or "").strip()
    if not app_id or not attempt:
        return app_id
    return f"{app_id}{ATTEMPT_SEPARATOR}{sanitize_id(attempt)}"


def conf_app_identity(conf: Mapping[str, object]) -> str:
    """The application identity a sidecar's conf (`sidecar-conf.json`: `spark.app.id` and, when the
    cluster manager runs attempts, `spark.app.attempt.id`) names; "" if it names no application."""
    attempt = conf.get(APP_ATTEMPT_ID_KEY)
    return app_identity(str(conf.get(APP_ID_KEY, "")), None if attempt is None else str(attempt))


def default_spool_root(java_tmpdir: str = "/tmp", user: str | None = None) -> Path:
    """The JVM's default spool root for a JVM of OS user `user` (default: this process' user) whose
    java.io.tmpdir is `java_tmpdir`: per user, because the spool is private (jvm-bridge PrivateDirs)."""
    import getpass

    return Path(java_tmpdir) / f"spark-statebackend-{sanitize_id(user or getpass.getuser())}" / "spool"


def executor_spool_dir(spool_root: str | os.PathLike[str], app_id: str, executor_id: str) -> Path:
    """`<spool root>/<app identity>/<executor id>`, exactly as the JVM computes it; `app_id` is the
    application identity (`app_identity`: the app id itself for an application without attempts)."""
    return Path(spool_root).absolute() / sanitize_id(app_id) / sanitize_id(executor_id)


class Spool:
    """One executor's spool directory (see the module docstring for the layout)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    @staticmethod
    def for_executor(spool_root: str | os.PathLike[str], app_id: str, executor_id: str) -> Spool:
        return Spool(executor_spool_dir(spool_root, app_id, executor_id))

    @property
    def events_dir(self) -> Path:
        return self.dir / EVENTS_DIR

    @property
    def requests_dir(self) -> Path:
        return self.dir / REQUESTS_DIR

    @property
    def streams_dir(self) -> Path:
        return self.dir / STREAMS_DIR

    @property
    def responses_dir(self) -> Path:
        return self.dir / RESPONSES_DIR

    def response_path(self, request_id: str) -> Path:
        if not REQUEST_ID.match(request_id):
            raise ValueError(f"request_id {request_id!r} is not a safe file name token")
        return self.responses_dir / f"{request_id}.json"

    def pending_events(self) -> list[Path]:
        """Event files not yet claimed or removed, oldest first."""
        return list_pending(self.events_dir)

    def unfinished_events(self) -> list[Path]:
        """Event files not uploaded yet: those the sidecar claimed, then those pending, oldest first each."""
        return claimed(self.events_dir) + self.pending_events()

    def pending_streams(self) -> list[Path]:
        """Changelog stream documents not yet taken, oldest first."""
        return list_pending(self.streams_dir)

    def pending_requests(self) -> list[Path]:
        """Restore requests still awaited by the JVM, oldest first."""
        return list_pending(self.requests_dir)

    def iter_events(self) -> Iterator[tuple[Path, SnapshotEvent]]:
        """(path, parsed event) for each pending event, oldest first; a bad file raises SpoolFormatError."""
        for p in self.pending_events():
            try:
                yield p, read_event(p)
            except FileNotFoundError:
                continue  # removed between listing and reading

    def write_event(self, event: SnapshotEvent, *, fsync: bool = True) -> Path:
        """Publishes an event as the JVM would (used by tests and tools)."""
        return atomic_write_json(self.events_dir / f"{new_file_stem()}.json", event.to_json(), fsync=fsync)

    def write_request(
        self, request: RestoreRequest | CheckpointLocationRequest | PlanRequest, *, fsync: bool = True
    ) -> Path:
        """Writes a restore request as the JVM would (used by tests and tools)."""
        return atomic_write_json(
            self.requests_dir / f"{new_file_stem()}.json", request.to_json(), fsync=fsync
        )

    def write_response(self, response: RestoreResponse, *, fsync: bool = True) -> Path:
        """Answers a restore request; the JVM picks the file up within ~20 ms."""
        return atomic_write_json(self.response_path(response.request_id), response.to_json(), fsync=fsync)

    def take_response(self, request_id: str) -> RestoreResponse | None:
        """Reads and deletes the response to `request_id` if present (what the JVM does)."""
        p = self.response_path(request_id)
        try:
            resp = read_response(p)
        except FileNotFoundError:
            return None
        remove(p)
        return resp

    def write_sidecar_marker(self, executor_id: str, pid: int | None = None) -> Path:
        """Registers the calling process (or `pid`) as this spool dir's live sidecar."""
        marker = SidecarMarker(pid=pid if pid is not None else os.getpid(), executor_id=executor_id)
        return atomic_write_json(self.dir / SIDECAR_MARKER, marker.to_json())

    def remove_sidecar_marker(self) -> bool:
        return remove(self.dir / SIDECAR_MARKER)

    def read_sidecar_marker(self) -> SidecarMarker | None:
        p = self.dir / SIDECAR_MARKER
        try:
            return SidecarMarker.from_json(read_bytes(p), str(p))
        except FileNotFoundError:
            return None
