"""KEYS: the declaration of every spark.statebackend.* key (a `Setting` each: name, type, default,
meaning), in the README's order, and `markdown_table()`, which renders them as the README's table.
"""

from __future__ import annotations

from typing import Any

from .types import Boolean, CrashPoints, Duration, OneOf, Setting, Size, Text, Url, WholeNumber

ENABLED = Setting(
    "enabled",
    Boolean(),
    "true",
    "Turn the backend on; false installs no hook: Spark runs exactly as without it.",
)
BLOB_URL = Setting(
    "blobStore.url",
    Url(("file", "azure", "s3")),
    "",
    "Where snapshots go: file:///abs/path, azure://<container>/<prefix> or s3://<bucket>/<prefix>. "
    "Must be reachable from every executor. The default is for `local` and `local-cluster` masters "
    "only (resolved once on the driver); with any other master it must be set, or the application "
    "fails at start saying why.",
    unset="file://<driver cwd>/spark-statebackend/blobs",
)
BLOB_OPTIONS = Setting(
    "blobStore.options.<name>",
    Text("text (per option)"),
    "",
    "Backend options passed to the blob store (e.g. endpoint_url, retry_budget).",
)
LOG_URL = Setting(
    "checkpointLog.url",
    Url(("file", "kafka")),
    "",
    "Where combined checkpoints go: file:///abs/dir or kafka://host:port/topic. Executors read it "
    "too: like the blob store, its default is for `local` and `local-cluster` masters only.",
    unset="file://<driver cwd>/spark-statebackend/checkpoints",
)
LOG_OPTIONS = Setting(
    "checkpointLog.options.<name>",
    Text("text (per option)"),
    "",
    "Checkpoint log options (e.g. replication.factor, read.timeout).",
)
WORKERS = Setting(
    "transfer.workers",
    WholeNumber(1, 512),
    "8",
    "Parallel blob transfers per process (upload and restore pool size); at most twice as many more "
    "wait in its queue, further work waits for a slot.",
)
CHUNK_SIZE = Setting(
    "chunkSize",
    Size(),
    "64MiB",
    "Files larger than this are uploaded as several blobs (not to a `file://` store, which keeps "
    "every file whole so restore can hard-link it; see its `whole_files` option).",
)
SMALL_FILE_BYTES = Setting(
    "smallFileBytes",
    Size(),
    "1MiB",
    "Files up to this size are compared by checksum when diffing.",
)
CHECKSUM_ALL_FILES = Setting(
    "checksumAllFiles",
    Boolean(),
    "false",
    "Compare large files by checksum too (they are immutable SSTs by default).",
)
BLOB_TTL = Setting(
    "blobTtl",
    Duration(positive=True),
    "7d",
    "Uploaded blobs expire after this unless a checkpoint references them. At least `commitTimeout` "
    "plus gc's grace (6h), else refused at start.",
)
MAX_COMMIT_DELAY = Setting(
    "maxCommitDelay",
    Duration(),
    "60s",
    "How long a store's upload may lag before its next commit blocks (`0`: every commit waits for the "
    "previous upload), and a query's checkpoints before Spark's commit of its next batch blocks "
    "(driver). A version's uploads wait for the rest of its batch on the executor for at most half of "
    'this ("Commit" in docs/how-it-works.md).',
)
DURABLE_COMMIT = Setting(
    "durableCommit",
    Boolean(),
    "true",
    "true (the safe default): a store's commit returns only once its version is uploaded and "
    "reported, so a lost executor host loses no state version Spark committed (a task retried "
    "elsewhere restores it from its upload report); the commit waits for the upload, at most "
    '`commitTimeout` ("Exactly once"). false: the upload follows the commit asynchronously (faster '
    "commits), and a host lost before it fails the query until a restart.",
)
COMMIT_TIMEOUT = Setting(
    "commitTimeout",
    Duration(positive=True),
    "30min",
    "A commit blocked by either lag for longer than this fails the query, naming the cause; a batch "
    "whose uploads take longer is not checkpointed. Must be positive.",
)
RESTORE_TIMEOUT = Setting(
    "restoreTimeout",
    Duration(positive=True),
    "10min",
    "How long an executor waits for a restore before falling back to Spark's files, and a query start "
    "for its checkpoint location; the sidecar never places restored files once the wait is (nearly) "
    "over or the JVM has withdrawn its request. Must be positive. (Deprecated spelling, still read "
    "for this release: `restoreTimeoutMs`, a number of milliseconds.)",
    # The JVM shim's millisecond spelling; _restore_timeout_ms reads it as the shim does.
    deprecated=("restoreTimeoutMs",),
)
DRAIN_TIMEOUT = Setting(
    "drainTimeout",
    Duration(),
    "60s",
    "At application or executor stop, how long the stop may take to hand over the batches Spark's "
    "listener bus still holds (driver) and for a sidecar to finish uploading and checkpointing the "
    "micro-batches already done, and the cleanup after its last checkpoint (so a job that stops, e.g. "
    "availableNow, keeps its last checkpoint); one budget for both; 0: stop at once.",
)
SWEEP_INTERVAL = Setting(
    "sweepInterval",
    Duration(),
    "6h",
    "How often the driver's committer runs the TTL sweep over the whole blob store: blobs whose "
    "blobTtl has passed are deleted unless a retained checkpoint references them. 0 turns it off "
    "(spark-statebackend gc sweeps too).",
)
RETAIN_CHECKPOINTS = Setting(
    "retainCheckpoints",
    WholeNumber(1, 10_000),
    "1",
    "Checkpoints kept per query; older ones are deleted with their unshared blobs.",
)
STAGING_DIR = Setting(
    "stagingDir",
    Text("path"),
    "",
    "Where the shim hard-links committed snapshots; must be on the checkpoint location's filesystem.",
    unset="<checkpoint location>/_statebackend/staging",
)
SPOOL_DIR = Setting(
    "spoolDir",
    Text("path"),
    "",
    "Event/request files between the JVM shim and the sidecar, one dir per application and executor. "
    "Private: dirs 0700, files 0600 (the sidecar's conf holds every key, secrets included); an "
    "existing dir on the way that another user owns, that is a symlink or group/other-writable fails "
    "the application's start naming it.",
    unset="<java.io.tmpdir>/spark-statebackend-<user>/spool",
)
LOCAL_CHECKPOINT_FILE_MANAGER = Setting(
    "localCheckpointFileManager",
    Boolean(),
    "true",
    "For `file:` checkpoint locations, write Spark's checkpoint files with java.nio instead of "
    "Hadoop's local file system, which forks `readlink`/`chmod` processes on every atomic write "
    "(other schemes, or false: Spark's own manager).",
)
LINK_SST_FILES = Setting(
    "linkSstFiles",
    Boolean(),
    "true",
    "For `file:` checkpoint locations, Spark's RocksDB state store hard-links its SST files between "
    "its local dir (`spark.local.dir`) and the checkpoint location instead of copying them, when it "
    "saves a version and when it loads one (the plugin sets `fs.file.impl` and "
    "`fs.file.impl.disable.cache` for the sessions, unless you set `fs.file.impl` yourself: then "
    "yours is kept and SSTs are copied). Both must be on one file system, else Spark copies as before "
    "(logged once). SSTs are immutable once written; see jvm-bridge/README.md.",
)
DELEGATE_FILE_MANAGER = Setting(
    "checkpointFileManager.delegate",
    Text("class name"),
    "",
    "Set by the plugin: the `spark.sql.streaming.checkpointFileManagerClass` you had configured, "
    "which spark-statebackend's manager wraps (set it yourself only to change that).",
)
SIDECAR_MODE = Setting(
    "sidecar.mode",
    OneOf(("process", "none")),
    "process",
    "process: the plugin starts a Python sidecar per executor JVM and one for the driver (uploads, "
    "restores, checkpoints). none: no sidecar (only for tests that serve the spool themselves).",
)
SIDECAR_PYTHON = Setting(
    "sidecar.python",
    Text("executable"),
    "",
    "Python that runs the sidecars and the start-up validation (spark-statebackend and the extras of "
    "its URLs installed). Unset: executors take spark.pyspark.python, else PYSPARK_PYTHON, else "
    "python3; the driver as in "
    "[configuration.md](docs/configuration.md#which-python-runs-the-sidecars).",
    # The rule's one home is the JVM's Conf.sidecarPython (docs/configuration.md tells it in full).
    unset="the Python Spark gives PySpark in the same process (see sidecar.driverPython for the driver)",
)
SIDECAR_DRIVER_PYTHON = Setting(
    "sidecar.driverPython",
    Text("executable"),
    "",
    "The driver's sidecar Python when sidecar.python is unset; configure() sets it. Executors use it "
    "only under a local-cluster master (the driver's host) when nothing else names their Python.",
    unset="the Python configure() runs in",
)
TEST_CRASH_AT = Setting(
    "test.crashAt",
    CrashPoints(),
    "",
    "Test only, never set in production: kill -9 a process at a named step of the commit or restore "
    "lifecycle, `<point>[@<n>][/<process>]` (see docs/reliability.md).",
)

#: Every key, in the README's order: the one declaration of each key's type, default and meaning.
KEYS: tuple[Setting[Any], ...] = (
    ENABLED,
    BLOB_URL,
    BLOB_OPTIONS,
    LOG_URL,
    LOG_OPTIONS,
    WORKERS,
    CHUNK_SIZE,
    SMALL_FILE_BYTES,
    CHECKSUM_ALL_FILES,
    BLOB_TTL,
    MAX_COMMIT_DELAY,
    DURABLE_COMMIT,
    COMMIT_TIMEOUT,
    RESTORE_TIMEOUT,
    DRAIN_TIMEOUT,
    SWEEP_INTERVAL,
    RETAIN_CHECKPOINTS,
    STAGING_DIR,
    SPOOL_DIR,
    LOCAL_CHECKPOINT_FILE_MANAGER,
    LINK_SST_FILES,
    DELEGATE_FILE_MANAGER,
    SIDECAR_MODE,
    SIDECAR_PYTHON,
    SIDECAR_DRIVER_PYTHON,
    TEST_CRASH_AT,
)


def markdown_table() -> str:
    """The README's configuration table: a row per KEYS entry, in its order (tools/config_table.py
    prints it; tests/test_config_table.py checks the README holds exactly this)."""
    rows = ["| key | default | type | meaning |", "|---|---|---|---|"]
    for s in KEYS:
        cells = [f"`{s.key}`", f"`{s.shown_default}`" if s.shown_default else "", s.type.describe(), s.doc]
        rows.append("|" + "|".join(f" {c} " if c else " " for c in cells) + "|")
    return "\n".join(rows) + "\n"
