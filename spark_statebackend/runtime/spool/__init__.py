"""The spool: the file protocol between the JVM shim (jvm-bridge/) and the Python sidecar.

This docstring is the protocol's specification; `jvm-bridge/src/dev/statebackend/spark/Spool.java`
(the files), `SpoolDocuments.java` (every document the JVM writes, one record per type, mirroring
documents.py; tests/runtime/test_spool_documents.py reads each with the Python readers) and their callers
(`Stager.java`, `RestoreRequester.java`, `DriverHooks.java`, `ProgressSpoolListener.java`,
`SidecarProcess.java`) implement the JVM half and must stay in sync with it. The Python half: the
documents (documents.py, changelog_stream.py; read strictly by fields.py), the file operations
(files.py), one executor's spool directory (directory.py), the sidecar's waiting for new files
(wake.py); everything else is importable from here. Its place in the commit and restore paths:
runtime/__init__.py ([C2], [C5], [E1]-[E5]).

Where
-----
One spool directory per executor JVM::

    <spool root>/<app identity>/<executor id>/    executor_spool_dir(root, app_identity(...), executor_id)

- spool root: ``spark.statebackend.spoolDir``; default ``<java.io.tmpdir>/spark-statebackend-<user>/spool``,
  i.e. ``/tmp/spark-statebackend-<user>/spool`` on Linux unless the JVM runs with another
  ``-Djava.io.tmpdir`` (so set ``spoolDir`` explicitly when the Python side must compute the path itself).
- Private: every directory from the spool root down is 0700 and every file 0600 (the sidecar's conf holds
  secrets; requests decide what a sidecar writes); an existing directory on the way that is a symlink,
  belongs to another user or is group/other-writable is refused, naming it (jvm-bridge PrivateDirs).
- app identity (`app_identity`, the JVM's ``Conf.appIdentity``): one attempt of one application.
  ``spark.app.id`` when the cluster manager runs no attempts (everything but YARN cluster mode), else
  ``<spark.app.id>.attempt-<spark.app.attempt.id>``: every attempt of a YARN application keeps its app
  id, and a zombie executor of attempt 1 still running on a host must share neither a spool dir nor
  reports nor checkpoints with attempt 2. Marker reports (``app_id``) and checkpoints
  (``writer_app_id``) carry the identity under their old field names, so those of applications
  without attempts read as before; a committer takes only reports of its own identity, and a
  sidecar or committer that wrote a query's checkpoints is fenced once a checkpoint of another
  identity appears (runtime/committer.py: zombies).
- executor id: Spark's executor id, ``"driver"`` in local mode.
- Both path components are made path-safe by `sanitize_id`: every character outside
  ``[A-Za-z0-9._-]`` becomes ``_``; ``""``, ``"."`` and ``".."`` become ``"_"``.
- In local mode the driver's Python can ask the JVM:
  ``spark._jvm.dev.statebackend.spark.Conf.currentExecutorSpoolDir()``.

Inside it::

    events/<stem>.json            snapshot events, written by the JVM, consumed by the sidecar
    streams/<stem>.json           changelogs being written, written by the JVM (durableCommit), consumed
                                  by the sidecar (below)
    requests/<stem>.json          restore, checkpoint-location and plan requests, written by the JVM
    requests/claimed/<stem>.json  store restore requests the sidecar took to place files (see below)
    responses/<request_id>.json   restore responses, written by the sidecar, consumed by the JVM
    sidecar.json                  liveness marker, written by the sidecar at start
    sidecar-conf.json             conf for a process-mode sidecar, written by the JVM plugin
    sidecar.log                   stdout+stderr of a process-mode sidecar
    progress/<stem>.json          driver spool dir only: finished batches for the committer (below)
    status.json                   the sidecar's upload lag, overall and per query, read by the JVM's
                                  commit gate before each store commit (runtime/upload_lag.py)
    commit-gate.json              the commits the JVM's gate holds, while it holds any (CommitGate.java)
    driver-staging/               driver spool dir only: the committer's `_driver` snapshot, staged
                                  while it is uploaded (spark/location.py driver_staging_dir)

``<stem>`` is ``<20-digit epoch nanoseconds>-<uuid>``; names sort by creation (the JVM derives the
time from a monotonic clock and keeps it strictly increasing), so "oldest first" is a name sort.

Atomicity
---------
Every file is written under a hidden temporary name in its final directory (``.<name>.<uuid>.tmp``)
and renamed into place, so a reader never sees a partial file. Readers list only names matching
``<stem>.json`` (or open the one name they expect). The Python writer fsyncs the file and the
directory; the JVM writer does not (the spool is a live hand-off between two processes on one host,
and a host crash ends the app whose id names the spool dir).

The sidecar does not poll: it waits for ``events/``, ``requests/`` and ``progress/`` with inotify
(wake.py), woken by a file renamed into one of them or closed after writing there. A file that
appears any other way (a hard link), or on a file system that reports nothing, is seen within a
second (wake.py FALLBACK_SECONDS).

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
     "checkpoint_root": abs path, # the query's checkpoint location (parent of state/); for a location
                                  # on another Hadoop scheme its local mirror root on this host
     "dfs_dir": abs path,         # the store's dir, <checkpoint_root>/state/<op>/<part>[/<store>]
     "operator": int, "partition": int, "store": str,   # store is "default" for single-store operators
     "version": int,              # >= 1
     "spark_unique_id": str|null, # checkpoint format v2 id of this version (files are <v>_<id>.*)
     "snapshot_version": int,     # schema 2: the snapshot the staged files start from (0: none)
     "changelog_versions": [int], # schema 2: changelogs staged on top of it (changelog checkpointing)
     "upgrade": bool,             # optional (false): the version was staged before; Spark has since
                                  # published a snapshot that shortens its recipe (changelog
                                  # checkpointing): upload it even if the version is checkpointed
     "request_id": str,           # optional: the committing task waits for this version's upload
                                  # (spark.statebackend.durableCommit); answered in responses/ below
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

Changelog stream (durableCommit: a task opened the changelog writer of a version whose commit will
wait for its upload; runtime/changelog_streams.py)::

    {"schema_version": 2, "type": "changelog_stream", "query_id": str, "checkpoint_root": abs path,
     "operator": int, "partition": int, "store": str, "version": int (>= 1),
     "staged_dir": abs path,      # <staging>/<app id>/<op>/<part>/<store>/<version>-<random>/
     "file": str,                 # <version>.changelog or <version>_<id>.changelog, in staged_dir: a
                                  # hard link to the file Spark is writing (its temporary name)
     "executor_id": str, "created_at_ms": int}

The sidecar reads the linked file as it grows, never writes it, and deletes ``staged_dir`` and the
document once the version's upload took the stream or it was dropped.

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
     "mode": "start"|"read", "executor_id": "driver", "created_at_ms": int, "restore_stores": bool}

``restore_stores`` (optional, default false): the driver JVM also runs the query's tasks (a local
master), so the sidecar answering this request serves their store restores too; after a rebuild it
restores every store of the checkpoint ahead of them (runtime/restore_ahead.py).

Plan request (driver spool dir only; the driver JVM is about to publish ``offsets/<batch_id>`` of a
query, runtime/ [C0])::

    {"schema_version": 2, "type": "plan", "request_id": str, "query_id": str|null (from ``metadata``;
     null: resolved from checkpoint_root), "checkpoint_root": abs path, "batch_id": int,
     "offsets": base64 str (the bytes Spark writes), "executor_id": "driver", "created_at_ms": int}

Answered "uploaded" (message: the plan's blob id) once the plan is stored, or was stored before with
the same offsets; "error" (message: why, naming query, batch and blob) otherwise. The JVM waits up to
commitTimeout (and while the sidecar lives); on anything but "uploaded" Spark's offsets write fails.

Response (every kind of request, and a snapshot event with a ``request_id``), written to
``responses/<request_id>.json``::

    {"request_id": str, "status": "restored"|"not_found"|"error"|"uploaded", "message": str,
     "files": int, "bytes": int, "duration_ms": int}

A snapshot event's answer is "uploaded" (message: the marker) once the version's SnapshotIndex is
reported, or once a checkpoint holds the version already; "error" (message: why) when it never will be
(fenced, its location gone, its upload given up after commitTimeout). An event superseded by a newer
recipe of its version (an upgrade) is answered with the one that supersedes it. The JVM waits up to
commitTimeout (and while the sidecar lives); on anything but "uploaded" the commit fails and Spark
retries the task.

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
     "checkpoint_root", "progress_json", "created_at_ms",       # a micro-batch finished
     "checkpoint_location"?: str}   # only for a location on another Hadoop scheme: its name
                                    # (`s3a://bucket/path`); checkpoint_root is then the driver's local
                                    # mirror root of it (jvm-bridge RemoteLocations), and the committer
                                    # takes no `_driver` snapshot (the location is durable itself)
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

    <spark.statebackend.sidecar.python> -m spark_statebackend.runtime.sidecar --spool-dir <executor spool dir>
        --executor-id <id> --conf <executor spool dir>/sidecar-conf.json --jvm-pid <the JVM's pid>

``sidecar-conf.json`` holds every ``spark.statebackend.*`` key, ``spark.app.id`` and, when there is
one, ``spark.app.attempt.id`` (the sidecar's identity, `conf_app_identity`). The plugin sends
SIGTERM at executor shutdown (SIGKILL after 10 s); after a kill -9 of the JVM nobody does, so the
sidecar must watch its parent pid: it exits once its parent is no longer ``--jvm-pid`` (a JVM that died
before or while the sidecar started included).
"""

from __future__ import annotations

from .changelog_stream import ChangelogStream
from .directory import (
    EVENTS_DIR,
    REQUESTS_DIR,
    RESPONSES_DIR,
    SIDECAR_CONF,
    SIDECAR_LOG,
    SIDECAR_MARKER,
    SIDECAR_MODULE,
    STREAMS_DIR,
    Spool,
    app_identity,
    conf_app_identity,
    default_spool_root,
    executor_spool_dir,
    sanitize_id,
)
from .documents import (
    RESTORE_STATUSES,
    SCHEMA_VERSION,
    CheckpointLocationMode,
    CheckpointLocationRequest,
    PlanRequest,
    RestoreRequest,
    RestoreResponse,
    RestoreStatus,
    SidecarMarker,
    SnapshotEvent,
    read_any_request,
)
from .fields import READABLE_SCHEMA_VERSIONS, SpoolFormatError
from .files import (
    BAD_DIR,
    CLAIMED_DIR,
    atomic_write_bytes,
    atomic_write_json,
    claim,
    claimed,
    list_pending,
    new_file_stem,
    quarantine,
    read_event,
    read_request,
    read_response,
    remove,
)

__all__ = [
    "BAD_DIR",
    "CLAIMED_DIR",
    "EVENTS_DIR",
    "READABLE_SCHEMA_VERSIONS",
    "REQUESTS_DIR",
    "RESPONSES_DIR",
    "RESTORE_STATUSES",
    "SCHEMA_VERSION",
    "SIDECAR_CONF",
    "SIDECAR_LOG",
    "SIDECAR_MARKER",
    "SIDECAR_MODULE",
    "STREAMS_DIR",
    "ChangelogStream",
    "CheckpointLocationMode",
    "CheckpointLocationRequest",
    "PlanRequest",
    "RestoreRequest",
    "RestoreResponse",
    "RestoreStatus",
    "SidecarMarker",
    "SnapshotEvent",
    "Spool",
    "SpoolFormatError",
    "app_identity",
    "atomic_write_bytes",
    "atomic_write_json",
    "claim",
    "claimed",
    "conf_app_identity",
    "default_spool_root",
    "executor_spool_dir",
    "list_pending",
    "new_file_stem",
    "quarantine",
    "read_any_request",
    "read_event",
    "read_request",
    "read_response",
    "remove",
    "sanitize_id",
]
