"""The spool: the file protocol between the JVM shim (jvm-bridge/) and the Python sidecar.

This docstring is the protocol's specification; `jvm-bridge/src/dev/statebackend/spark/Spool.java`,
`Stager.java`, `RestoreRequester.java`, `DriverHooks.java`, `ProgressSpoolListener.java` and
`SidecarProcess.java` implement the JVM half and must stay in sync with it.

Where
-----
One spool directory per executor JVM::

    <spool root>/<app id>/<executor id>/          executor_spool_dir(root, app_id, executor_id)

- spool root: ``spark.statebackend.spoolDir``; default ``<java.io.tmpdir>/spark-statebackend-<user>/spool``,
  i.e. ``/tmp/spark-statebackend-<user>/spool`` on Linux unless the JVM runs with another
  ``-Djava.io.tmpdir`` (so set ``spoolDir`` explicitly when the Python side must compute the path itself).
- Private: every directory from the spool root down is 0700 and every file 0600 (the sidecar's conf holds
  secrets; requests decide what a sidecar writes); an existing directory on the way that is a symlink,
  belongs to another user or is group/other-writable is refused, naming it (jvm-bridge PrivateDirs).
- app id: ``spark.app.id``; executor id: Spark's executor id, ``"driver"`` in local mode.
- Both ids are made path-safe by `sanitize_id`: every character outside ``[A-Za-z0-9._-]`` becomes
  ``_``; ``""``, ``"."`` and ``".."`` become ``"_"``.
- In local mode the driver's Python can ask the JVM:
  ``spark._jvm.dev.statebackend.spark.Conf.currentExecutorSpoolDir()``.

Inside it::

    events/<stem>.json            snapshot events, written by the JVM, consumed by the sidecar
    requests/<stem>.json          restore and checkpoint-location requests, written by the JVM
    requests/claimed/<stem>.json  store restore requests the sidecar took to place files (see below)
    responses/<request_id>.json   restore responses, written by the sidecar, consumed by the JVM
    sidecar.json                  liveness marker, written by the sidecar at start
    sidecar-conf.json             conf for a process-mode sidecar, written by the JVM plugin
    sidecar.log                   stdout+stderr of a process-mode sidecar
    progress/<stem>.json          driver spool dir only: finished batches for the committer (below)

``<stem>`` is ``<20-digit epoch nanoseconds>-<uuid>``; names sort by creation (the JVM derives the
time from a monotonic clock and keeps it strictly increasing), so "oldest first" is a name sort.

Atomicity
---------
Every file is written under a hidden temporary name in its final directory (``.<name>.<uuid>.tmp``)
and renamed into place, so a reader never sees a partial file. Readers list only names matching
``<stem>.json`` (or open the one name they expect). The Python writer fsyncs the file and the
directory; the JVM writer does not (the spool is a live hand-off between two processes on one host,
and a host crash ends the app whose id names the spool dir).

Files (UTF-8 JSON objects; unknown fields are ignored; a missing or mistyped known field, or a
``schema_version`` other than 1 or 2, is a `SpoolFormatError` naming the file). The JVM writes schema 2;
schema 1 (no changelog checkpointing, no driver-side requests) is still read.
----------------------------------------------------------------------------------------------
Snapshot event (one per committed and staged store version)::

    {"schema_version": 2, "type": "snapshot",
     "query_id": str|null,        # TaskContext local property "sql.streaming.queryId"; null when the
                                  # task is not a micro-batch (offline repartition): the sidecar then
                                  # resolves it from checkpoint_root
     "batch_id": int|null,        # local property "streaming.sql.batchId"; batch N commits version N+1
     "checkpoint_root": abs path, # the query's checkpoint location (parent of state/)
     "dfs_dir": abs path,         # the store's dir, <checkpoint_root>/state/<op>/<part>[/<store>]
     "operator": int, "partition": int, "store": str,   # store is "default" for single-store operators
     "version": int,              # >= 1
     "spark_unique_id": str|null, # checkpoint format v2 id of this version (files are <v>_<id>.*)
     "snapshot_version": int,     # schema 2: the snapshot the staged files start from (0: none)
     "changelog_versions": [int], # schema 2: changelogs staged on top of it (changelog checkpointing)
     "upgrade": bool,             # optional (false): the version was staged before; Spark has since
                                  # published a snapshot that shortens its recipe (changelog
                                  # checkpointing): upload it even if the version is checkpointed
     "staged_dir": abs path,      # <staging>/<app id>/<op>/<part>/<store>/<version>-<random>/
     "files": [relative path],    # the staged files, relative to staged_dir (and to dfs_dir)
     "executor_id": str, "created_at_ms": int, "stage_nanos": int}

The staged dir mirrors the store's dir for exactly what Spark needs to load this version, its
"recipe" (jvm-bridge Recipe.java): the snapshot ``<s>.zip`` (v2: ``<s>_<id>.zip``) with every file its
metadata references (``SSTs/<name>.sst``, ``logs/<name>.log``), plus the changelogs ``<s+1..v>.changelog``
Spark replays on top (none without changelog checkpointing, where s = v), and Spark's ``<file>.crc``
checksums where it wrote them. Its files are hard links to Spark's own files: the sidecar must only
read and then delete them, never modify them in place. Restoring = copying them back into ``dfs_dir``
with the same relative paths.

Store restore request (the JVM is about to load a version whose files are missing in ``dfs_dir``)::

    {"schema_version": 2, "type": "store", "request_id": str (uuid), "query_id": str|null,
     "checkpoint_root": abs path, "dfs_dir": abs path, "operator": int, "partition": int, "store": str,
     "version": int (>= 1) | null,   # null: the latest checkpointed version (a task outside a
                                     # micro-batch, e.g. the state data source reader)
     "spark_unique_id": str|null, "missing": str (what was missing, for logs),
     "executor_id": str, "created_at_ms": int}

Checkpoint location request (driver spool dir only; the driver JVM is about to start a query on, or
read, a checkpoint location)::

    {"schema_version": 2, "type": "checkpoint_location", "request_id": str, "checkpoint_root": abs path,
     "mode": "start"|"read", "executor_id": "driver", "created_at_ms": int}

Response (both kinds), written to ``responses/<request_id>.json``::

    {"request_id": str, "status": "restored"|"not_found"|"error", "message": str,
     "files": int, "bytes": int, "duration_ms": int}

``message``, ``files``, ``bytes`` and ``duration_ms`` are optional (default "", 0, 0, 0). The JVM
waits up to ``spark.statebackend.restoreTimeout``, polling every 3 ms, and deletes the response after
reading it. For a store, on anything but "restored" it logs an error and lets Spark load from its own
checkpoint files (which fail loudly if absent). For a checkpoint location, anything but "restored"
fails the query's start with the message. When the JVM stops waiting without an answer it deletes its
request; a sidecar should skip a request whose file is gone, and remove a request only after writing
its response.

Driver progress documents (``<driver spool dir>/progress/<stem>.json``, written by the JVM listener
and by the driver hooks, consumed by the committer)::

    {"schema_version": 2, "type": "progress", "query_id", "run_id", "name", "batch_id",
     "checkpoint_root", "progress_json", "created_at_ms"}       # a micro-batch finished
    {"schema_version": 2, "type": "offline_commit", "query_id": str|null, "batch_id": int,
     "checkpoint_root", "created_at_ms"}   # commits/<batch> written with no query running: offline
                                           # state repartition's batch

Taking a request (no file is placed behind a JVM that gave up): the sidecar builds the restore in a
scratch dir, then, just before it places any file in ``dfs_dir``, (1) checks that the JVM still waits
(``created_at_ms`` + restoreTimeout, less min(2 s, restoreTimeout / 4), is still ahead; else it
answers "error" and places nothing) and (2) takes the request by renaming it to
``requests/claimed/<stem>.json``. If the rename finds no file, the JVM deleted it (gave up): nothing
is placed and nothing answered. A taken request is answered, then removed; a sidecar started after
its predecessor died serves the taken requests again (deadline check only). The one window left:
the JVM's deadline passing during the few renames after (2). JVM half, not implemented yet: when it
gives up and its delete finds the request already gone (the sidecar took it), wait a short bounded
grace for the response instead of loading at once.

Sidecar marker ``sidecar.json``: ``{"schema_version": 2, "pid": int, "started_at_ms": int,
"executor_id": str}``. While waiting, the JVM checks that this pid is alive; if no live sidecar is
registered for 30 s it stops waiting (and after that waits only 1 s per request until one appears).

Sidecar command (``spark.statebackend.sidecar.mode=process``, the default; the plugin starts one per
executor JVM and one for the driver, executor id ``driver``)::

    <spark.statebackend.sidecar.python> -m spark_statebackend.sidecar --spool-dir <executor spool dir>
        --executor-id <id> --conf <executor spool dir>/sidecar-conf.json --jvm-pid <the JVM's pid>

``sidecar-conf.json`` holds every ``spark.statebackend.*`` key and ``spark.app.id``. The plugin sends
SIGTERM at executor shutdown (SIGKILL after 10 s); after a kill -9 of the JVM nobody does, so the
sidecar must watch its parent pid: it exits once its parent is no longer ``--jvm-pid`` (a JVM that died
before or while the sidecar started included).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import orjson

from .durable import fsync_dir
from .errors import StateBackendError

SCHEMA_VERSION = 2
#: Spool documents this code reads: 1 (before changelog checkpointing and driver-side requests), 2.
READABLE_SCHEMA_VERSIONS = frozenset({1, 2})
EVENTS_DIR = "events"
REQUESTS_DIR = "requests"
RESPONSES_DIR = "responses"
CLAIMED_DIR = "claimed"
BAD_DIR = "bad"
SIDECAR_MARKER = "sidecar.json"
SIDECAR_CONF = "sidecar-conf.json"
SIDECAR_LOG = "sidecar.log"
SIDECAR_MODULE = "spark_statebackend.sidecar"

RestoreStatus = Literal["restored", "not_found", "error"]
RESTORE_STATUSES: frozenset[str] = frozenset({"restored", "not_found", "error"})

# Only finished files match: temporaries start with "." and end with ".tmp".
_STEM_FILE = re.compile(r"^\d{20}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.json$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_MAX_FILE_BYTES = 16 * 1024 * 1024  # a spool file is a few hundred bytes; more means it is not ours


class SpoolFormatError(StateBackendError):
    """A spool file is malformed, of an unknown schema version, or not what its name promises."""

    def __init__(self, source: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"bad spool file {os.fspath(source)!r}: {problem}")
        self.source = os.fspath(source)
        self.problem = problem


# --- paths -----------------------------------------------------------------------------------------


def sanitize_id(value: str) -> str:
    """The path-safe form of an app or executor id (same rule as the JVM's Conf.sanitizeId)."""
    s = _UNSAFE_ID_CHARS.sub("_", value)
    return "_" if s in ("", ".", "..") else s


def default_spool_root(java_tmpdir: str = "/tmp", user: str | None = None) -> Path:
    """The JVM's default spool root for a JVM of OS user `user` (default: this process' user) whose
    java.io.tmpdir is `java_tmpdir`: per user, because the spool is private (jvm-bridge PrivateDirs)."""
    import getpass

    return Path(java_tmpdir) / f"spark-statebackend-{sanitize_id(user or getpass.getuser())}" / "spool"


def executor_spool_dir(spool_root: str | os.PathLike[str], app_id: str, executor_id: str) -> Path:
    """`<spool root>/<app id>/<executor id>`, exactly as the JVM computes it."""
    return Path(spool_root).absolute() / sanitize_id(app_id) / sanitize_id(executor_id)


_stem_lock = threading.Lock()
_last_stamp = 0


def new_file_stem() -> str:
    """`<20-digit epoch ns>-<uuid4>`: unique, and strictly increasing within this process."""
    global _last_stamp
    with _stem_lock:
        _last_stamp = max(_last_stamp + 1, time.time_ns())
        stamp = _last_stamp
    return f"{stamp:020d}-{uuid.uuid4()}"


# --- validation helpers ----------------------------------------------------------------------------


class _Fields:
    """Typed access to one parsed JSON object; every failure names the file."""

    def __init__(self, obj: Mapping[str, Any], source: str) -> None:
        self.obj = obj
        self.source = source

    def fail(self, problem: str) -> SpoolFormatError:
        return SpoolFormatError(self.source, problem)

    def _get(self, name: str, required: bool) -> Any:
        if name not in self.obj:
            if required:
                raise self.fail(f"missing field {name!r}")
            return None
        return self.obj[name]

    def str_(self, name: str, *, required: bool = True, nonempty: bool = True) -> str:
        v = self._get(name, required)
        if v is None and not required:
            return ""
        if not isinstance(v, str) or (nonempty and not v):
            raise self.fail(f"field {name!r} must be a{' non-empty' if nonempty else ''} string, got {v!r}")
        return v

    def opt_str(self, name: str) -> str | None:
        v = self._get(name, False)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.fail(f"field {name!r} must be a string or null, got {v!r}")
        return v

    def int_(self, name: str, *, minimum: int = 0, required: bool = True, default: int = 0) -> int:
        v = self._get(name, required)
        if v is None and not required:
            return default
        # bool is an int subclass in Python; JSON true is not a number here
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise self.fail(f"field {name!r} must be an integer >= {minimum}, got {v!r}")
        return v

    def bool_(self, name: str, *, default: bool) -> bool:
        v = self._get(name, False)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(f"field {name!r} must be true or false, got {v!r}")
        return v

    def opt_int(self, name: str, *, minimum: int = 0) -> int | None:
        v = self._get(name, False)
        if v is None:
            return None
        return self.int_(name, minimum=minimum)

    def abs_path(self, name: str) -> Path:
        v = self.str_(name)
        if "\x00" in v or not os.path.isabs(v):
            raise self.fail(f"field {name!r} must be an absolute path, got {v!r}")
        return Path(v)

    def rel_paths(self, name: str) -> tuple[str, ...]:
        v = self._get(name, False)
        if v is None:
            return ()
        if not isinstance(v, list):
            raise self.fail(f"field {name!r} must be a list of relative paths, got {v!r}")
        out = []
        for item in v:
            if not isinstance(item, str) or not _is_safe_relative(item):
                raise self.fail(f"field {name!r} holds an unsafe or non-string path {item!r}")
            out.append(item)
        return tuple(out)

    def schema(self) -> int:
        version = self.int_("schema_version", minimum=0)
        if version not in READABLE_SCHEMA_VERSIONS:
            raise self.fail(f"schema_version {version} is not one of {sorted(READABLE_SCHEMA_VERSIONS)}")
        return version

    def int_list(self, name: str, *, minimum: int = 0) -> tuple[int, ...]:
        v = self._get(name, False)
        if v is None:
            return ()
        if not isinstance(v, list) or any(
            not isinstance(x, int) or isinstance(x, bool) or x < minimum for x in v
        ):
            raise self.fail(f"field {name!r} must be a list of integers >= {minimum}, got {v!r}")
        return tuple(v)


def _is_safe_relative(p: str) -> bool:
    """A relative path that stays inside its base: names are data, not paths."""
    if not p or "\x00" in p or "\\" in p or p.startswith("/"):
        return False
    parts = PurePosixPath(p).parts
    return all(part not in ("", ".", "..") for part in parts) and "/".join(parts) == p


def _load_object(data: bytes, source: str) -> dict[str, Any]:
    if len(data) > _MAX_FILE_BYTES:
        raise SpoolFormatError(source, f"{len(data)} bytes is too large for a spool file")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise SpoolFormatError(source, f"not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise SpoolFormatError(source, f"not a JSON object but {type(obj).__name__}")
    return obj


# --- documents -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotEvent:
    """One committed store version, staged by the JVM as hard links in `staged_dir`."""

    query_id: str | None
    batch_id: int | None
    checkpoint_root: Path
    dfs_dir: Path
    operator: int
    partition: int
    store: str
    version: int
    spark_unique_id: str | None
    staged_dir: Path
    files: tuple[str, ...]
    executor_id: str
    created_at_ms: int
    stage_nanos: int
    schema_version: int = SCHEMA_VERSION
    #: The Spark snapshot the staged files start from (its zip and SSTs); 0: replayed from empty state.
    #: None in schema 1 events, which always staged exactly `<version>.zip`.
    snapshot_version: int | None = None
    #: Changelogs staged on top of the snapshot (changelog checkpointing), oldest first.
    changelog_versions: tuple[int, ...] = ()
    #: The version was staged before; Spark has since published a snapshot that shortens its recipe.
    upgrade: bool = False

    @property
    def instance(self) -> tuple[int, int, str]:
        """The state store instance: (operator, partition, store)."""
        return (self.operator, self.partition, self.store)

    @property
    def zip_name(self) -> str:
        """Spark's name of this version's zip: `<v>.zip`, or `<v>_<id>.zip` in checkpoint format v2."""
        if self.spark_unique_id is None:
            return f"{self.version}.zip"
        return f"{self.version}_{self.spark_unique_id}.zip"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "snapshot",
            "query_id": self.query_id,
            "batch_id": self.batch_id,
            "checkpoint_root": str(self.checkpoint_root),
            "dfs_dir": str(self.dfs_dir),
            "operator": self.operator,
            "partition": self.partition,
            "store": self.store,
            "version": self.version,
            "spark_unique_id": self.spark_unique_id,
            "staged_dir": str(self.staged_dir),
            "files": list(self.files),
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
            "stage_nanos": self.stage_nanos,
            "snapshot_version": self.snapshot_version,
            "changelog_versions": list(self.changelog_versions),
            "upgrade": self.upgrade,
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> SnapshotEvent:
        f = _Fields(_load_object(data, source), source)
        schema = f.schema()
        kind = f.str_("type")
        if kind != "snapshot":
            raise f.fail(f"type {kind!r} is not 'snapshot'")
        return SnapshotEvent(
            query_id=f.opt_str("query_id"),
            batch_id=f.opt_int("batch_id"),
            checkpoint_root=f.abs_path("checkpoint_root"),
            dfs_dir=f.abs_path("dfs_dir"),
            operator=f.int_("operator"),
            partition=f.int_("partition"),
            store=f.str_("store"),
            version=f.int_("version", minimum=1),
            spark_unique_id=f.opt_str("spark_unique_id"),
            staged_dir=f.abs_path("staged_dir"),
            files=f.rel_paths("files"),
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            stage_nanos=f.int_("stage_nanos"),
            schema_version=schema,
            snapshot_version=f.opt_int("snapshot_version"),
            changelog_versions=f.int_list("changelog_versions", minimum=1),
            upgrade=f.bool_("upgrade", default=False),
        )


@dataclass(frozen=True)
class RestoreRequest:
    """The JVM asks for `version` of one store to be put back into `dfs_dir` before Spark loads it;
    `version` None: the latest version the query's checkpoints hold (a reader outside a micro-batch)."""

    request_id: str
    query_id: str | None
    checkpoint_root: Path
    dfs_dir: Path
    operator: int
    partition: int
    store: str
    version: int | None
    spark_unique_id: str | None
    executor_id: str
    created_at_ms: int
    missing: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def instance(self) -> tuple[int, int, str]:
        """The state store instance: (operator, partition, store)."""
        return (self.operator, self.partition, self.store)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "store",
            "request_id": self.request_id,
            "query_id": self.query_id,
            "checkpoint_root": str(self.checkpoint_root),
            "dfs_dir": str(self.dfs_dir),
            "operator": self.operator,
            "partition": self.partition,
            "store": self.store,
            "version": self.version,
            "spark_unique_id": self.spark_unique_id,
            "missing": self.missing,
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> RestoreRequest:
        req = read_any_request(data, source)
        if not isinstance(req, RestoreRequest):
            raise SpoolFormatError(source, "not a store restore request")
        return req

    @staticmethod
    def _from_fields(f: _Fields, request_id: str, schema: int) -> RestoreRequest:
        return RestoreRequest(
            request_id=request_id,
            query_id=f.opt_str("query_id"),
            checkpoint_root=f.abs_path("checkpoint_root"),
            dfs_dir=f.abs_path("dfs_dir"),
            operator=f.int_("operator"),
            partition=f.int_("partition"),
            store=f.str_("store"),
            version=f.int_("version", minimum=1) if schema == 1 else f.opt_int("version", minimum=1),
            spark_unique_id=f.opt_str("spark_unique_id"),
            missing=f.str_("missing", required=False, nonempty=False),
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            schema_version=schema,
        )


CheckpointLocationMode = Literal["start", "read"]


@dataclass(frozen=True)
class CheckpointLocationRequest:
    """The driver JVM asks for a query's checkpoint location to be made to resume from its latest
    durable checkpoint before Spark reads it (`mode` "start": a query starts on it, rebuild if missing,
    behind or ahead; "read": a reader that is not a query, rebuild only if it holds no files). Answered
    "restored" with what was done as the message, or "error" saying why the query must not start."""

    request_id: str
    checkpoint_root: Path
    mode: CheckpointLocationMode
    executor_id: str
    created_at_ms: int
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "checkpoint_location",
            "request_id": self.request_id,
            "checkpoint_root": str(self.checkpoint_root),
            "mode": self.mode,
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
        }


def read_any_request(data: bytes, source: str = "<bytes>") -> RestoreRequest | CheckpointLocationRequest:
    """Parse a request file of either kind (`type` "store", the default, or "checkpoint_location")."""
    f = _Fields(_load_object(data, source), source)
    schema = f.schema()
    request_id = f.str_("request_id")
    if not _REQUEST_ID.match(request_id):
        raise f.fail(f"request_id {request_id!r} is not a safe file name token")
    kind = f.str_("type", required=False) or "store"
    if kind == "store":
        return RestoreRequest._from_fields(f, request_id, schema)
    if kind == "checkpoint_location":
        mode = f.str_("mode")
        if mode not in ("start", "read"):
            raise f.fail(f"mode {mode!r} is not 'start' or 'read'")
        return CheckpointLocationRequest(
            request_id=request_id,
            checkpoint_root=f.abs_path("checkpoint_root"),
            mode=mode,  # type: ignore[arg-type]  # checked above
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            schema_version=schema,
        )
    raise f.fail(f"type {kind!r} is not 'store' or 'checkpoint_location'")


@dataclass(frozen=True)
class RestoreResponse:
    """The sidecar's answer to one RestoreRequest."""

    request_id: str
    status: RestoreStatus
    message: str = ""
    files: int = 0
    bytes: int = 0
    duration_ms: int = 0

    def __post_init__(self) -> None:
        if self.status not in RESTORE_STATUSES:
            raise ValueError(f"status must be one of {sorted(RESTORE_STATUSES)}, not {self.status!r}")
        if not _REQUEST_ID.match(self.request_id):
            raise ValueError(f"request_id {self.request_id!r} is not a safe file name token")

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "message": self.message,
            "files": self.files,
            "bytes": self.bytes,
            "duration_ms": self.duration_ms,
        }

    @staticmethod
    def from_json(data: builtins.bytes, source: str = "<bytes>") -> RestoreResponse:
        f = _Fields(_load_object(data, source), source)
        request_id = f.str_("request_id")
        status = f.str_("status")
        if status not in RESTORE_STATUSES:
            raise f.fail(f"status {status!r} is not one of {sorted(RESTORE_STATUSES)}")
        if not _REQUEST_ID.match(request_id):
            raise f.fail(f"request_id {request_id!r} is not a safe file name token")
        return RestoreResponse(
            request_id=request_id,
            status=status,  # type: ignore[arg-type]  # checked against RESTORE_STATUSES above
            message=f.str_("message", required=False, nonempty=False),
            files=f.int_("files", required=False),
            bytes=f.int_("bytes", required=False),
            duration_ms=f.int_("duration_ms", required=False),
        )


@dataclass(frozen=True)
class SidecarMarker:
    """`sidecar.json`: tells the JVM which process serves this spool dir."""

    pid: int
    executor_id: str
    started_at_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "pid": self.pid,
            "started_at_ms": self.started_at_ms,
            "executor_id": self.executor_id,
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> SidecarMarker:
        f = _Fields(_load_object(data, source), source)
        f.schema()
        return SidecarMarker(
            pid=f.int_("pid", minimum=1),
            executor_id=f.str_("executor_id"),
            started_at_ms=f.int_("started_at_ms"),
        )


# --- file operations -------------------------------------------------------------------------------


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Writes `data` to `path` so that readers see either no file or the whole file.

    The bytes go to a hidden temporary in the same directory (`.<name>.<uuid>.tmp`), are fsynced when
    `fsync`, and the temporary is renamed over `path`; then the directory is fsynced. An existing
    `path` is replaced atomically.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4()}.tmp"
    try:
        # 0600: spool files are this user's business only (the sidecar's conf holds secrets).
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if fsync:
        fsync_dir(target.parent)
    return target


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, fsync: bool = True) -> Path:
    """`atomic_write_bytes` of `obj` serialised with orjson."""
    return atomic_write_bytes(path, orjson.dumps(obj), fsync=fsync)


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read(_MAX_FILE_BYTES + 1)
    return data


def list_pending(directory: str | os.PathLike[str]) -> list[Path]:
    """Finished `<stem>.json` files directly in `directory`, oldest first; [] if it does not exist.

    Temporaries and claimed files are never listed, so a caller only ever sees whole files.
    """
    d = Path(directory)
    try:
        names = [e.name for e in os.scandir(d) if _STEM_FILE.match(e.name) and e.is_file()]
    except FileNotFoundError:
        return []
    return [d / n for n in sorted(names)]


def claim(path: str | os.PathLike[str]) -> Path | None:
    """Atomically moves a pending file into `<its dir>/claimed/`; None if it is already gone.

    A claimed file is out of `list_pending`; `claimed` lists them again after a crash, so work that
    was claimed but not finished can be redone (processing must be idempotent).
    """
    src = Path(path)
    dst_dir = src.parent / CLAIMED_DIR
    dst_dir.mkdir(exist_ok=True)
    dst = dst_dir / src.name
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return None
    return dst


def claimed(directory: str | os.PathLike[str]) -> list[Path]:
    """Files claimed in `directory` but not yet removed, oldest first."""
    return list_pending(Path(directory) / CLAIMED_DIR)


def quarantine(path: str | os.PathLike[str]) -> Path | None:
    """Moves a file that failed to parse into `<its dir>/bad/` (kept for diagnosis, out of every
    listing), so one bad file cannot stall a consumer; None if it is already gone."""
    src = Path(path)
    base = src.parent.parent if src.parent.name == CLAIMED_DIR else src.parent
    dst_dir = base / BAD_DIR
    dst_dir.mkdir(exist_ok=True)
    dst = dst_dir / src.name
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return None
    return dst


def remove(path: str | os.PathLike[str]) -> bool:
    """Deletes a processed spool file; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def read_event(path: str | os.PathLike[str]) -> SnapshotEvent:
    p = Path(path)
    return SnapshotEvent.from_json(_read_bytes(p), str(p))


def read_request(path: str | os.PathLike[str]) -> RestoreRequest | CheckpointLocationRequest:
    p = Path(path)
    return read_any_request(_read_bytes(p), str(p))


def read_response(path: str | os.PathLike[str]) -> RestoreResponse:
    p = Path(path)
    return RestoreResponse.from_json(_read_bytes(p), str(p))


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
    def responses_dir(self) -> Path:
        return self.dir / RESPONSES_DIR

    def response_path(self, request_id: str) -> Path:
        if not _REQUEST_ID.match(request_id):
            raise ValueError(f"request_id {request_id!r} is not a safe file name token")
        return self.responses_dir / f"{request_id}.json"

    def pending_events(self) -> list[Path]:
        """Event files not yet claimed or removed, oldest first."""
        return list_pending(self.events_dir)

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
        self, request: RestoreRequest | CheckpointLocationRequest, *, fsync: bool = True
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
            return SidecarMarker.from_json(_read_bytes(p), str(p))
        except FileNotFoundError:
            return None
