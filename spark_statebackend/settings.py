"""Configuration: every setting is a spark.conf key under `spark.statebackend.`, validated at start.

KEYS declares each key once (a `Setting`: name, type with its bounds or allowed values, default,
meaning); nothing else writes a default. `Settings.from_conf(conf)` reads a plain mapping (a
SparkConf's getAll(), or a dict in tests) through KEYS and returns frozen, typed settings, or raises
ConfigError naming the first bad key and its value. `markdown_table()` renders KEYS as the README's
configuration table (tools/config_table.py prints it). The JVM shim (Conf.java) parses the keys it
reads itself, since it runs without Python; tests/settings/test_config_table.py checks its defaults are these.
The value types a key is declared with, and `Setting` itself, are common/setting_types.py (exported
here too); this module is the table and what is read through it, long because the table is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common.crashpoints import CrashSpec
from .common.setting_types import (
    PREFIX,
    Boolean,
    CrashPoints,
    Duration,
    OneOf,
    Setting,
    Size,
    Text,
    Url,
    ValueType,
    WholeNumber,
    parse_bool,
    parse_int,
)
from .common.units import deprecated_name as _deprecated
from .common.units import format_duration, parse_duration, parse_legacy_ms, parse_size
from .errors import ConfigError
from .lifecycle.gc import DEFAULT_GRACE_SECONDS

__all__ = [
    "DEFAULT_GC_GRACE_SECONDS",
    "KEYS",
    "PREFIX",
    "Boolean",
    "CrashPoints",
    "Duration",
    "OneOf",
    "Setting",
    "Settings",
    "Size",
    "Text",
    "Url",
    "ValueType",
    "WholeNumber",
    "markdown_table",
    "parse_bool",
    "parse_duration",
    "parse_int",
    "parse_size",
]


#: gc's default grace (spark-statebackend gc --grace). blobTtl is checked against it at start: the TTL
#: must outlast the longest an upload can wait for its checkpoint plus this grace.
DEFAULT_GC_GRACE_SECONDS = DEFAULT_GRACE_SECONDS


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
CHANGELOG_SNAPSHOT_EVERY = Setting(
    "changelogSnapshotEvery",
    WholeNumber(0, 100_000),
    "0",
    "Changelog checkpointing only: every this many versions of a store, its sidecar builds the store's "
    "RocksDB snapshot from Spark's changelogs, off Spark's task thread, so loads and restores replay at "
    "most this many changelogs; set Spark's `minDeltasForSnapshot` above it and Spark no longer "
    "flushes RocksDB on the task thread (docs/changelog-snapshots.md). 0: off, Spark's own snapshots.",
)
CHANGELOG_STREAM_CHUNK = Setting(
    "changelogStreamChunk",
    Size(),
    "1MiB",
    "Changelog checkpointing with `durableCommit`: while a task writes a store's changelog, its "
    "sidecar uploads it in blobs of this size, so the commit waits only for the rest "
    "(runtime/changelog_streams.py). Larger: fewer requests (one PUT per chunk) for a longer wait at "
    "the commit. 0: off, the whole changelog goes up at the commit.",
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
MIRROR_DIR = Setting(
    "mirrorDir",
    Text("path"),
    "",
    "Checkpoint locations on another Hadoop scheme (`s3a://`, `abfss://`, `gs://`, `hdfs://`, ...): "
    "where each host keeps their state stores' files (one private dir per location, `state/` inside), "
    "backed up to the blob store like a `file:` location's; Spark's metadata stays in the location. "
    "Local disk; losing it costs a restore from the blob store.",
    unset="<java.io.tmpdir>/spark-statebackend-<user>/mirrors",
)
MIRROR_RETENTION = Setting(
    "mirrorRetention",
    Duration(positive=True),
    "7d",
    "A mirror (`mirrorDir`) no process on its host has used for this long is removed when a driver or "
    "executor with the plugin starts there, unless a running JVM holds it or a staged version in it "
    "(or in a `stagingDir` it was used with) still waits for its upload; its state is in the blob "
    "store, so a later use restores it. Must be positive.",
)
REMOTE_SCHEMES = Setting(
    "remoteSchemes",
    Text("comma-separated schemes"),
    "",
    "Hadoop schemes whose checkpoint locations get local state (the plugin wraps `fs.<scheme>.impl`), "
    "beside s3a, s3, gs, abfs, abfss, wasb, wasbs, hdfs, viewfs, webhdfs, oss and every scheme you set "
    "`fs.<scheme>.impl` for; each only when its file system class exists. A query on a scheme not "
    "wrapped fails at start naming it.",
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
METRICS_PER_STORE = Setting(
    "metrics.perStore",
    Boolean(),
    "false",
    "Also label the backup and restore metrics by store instance (`query` and `store` labels): one "
    "series per stateful operator and shuffle partition, so thousands with Spark's default 200 "
    "partitions. false: one series per query (docs/operations.md).",
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
    CHANGELOG_SNAPSHOT_EVERY,
    CHANGELOG_STREAM_CHUNK,
    STAGING_DIR,
    SPOOL_DIR,
    MIRROR_DIR,
    MIRROR_RETENTION,
    REMOTE_SCHEMES,
    LOCAL_CHECKPOINT_FILE_MANAGER,
    LINK_SST_FILES,
    DELEGATE_FILE_MANAGER,
    SIDECAR_MODE,
    SIDECAR_PYTHON,
    SIDECAR_DRIVER_PYTHON,
    METRICS_PER_STORE,
    TEST_CRASH_AT,
)


def markdown_table() -> str:
    """The configuration table: a row per KEYS entry, in its order, with links relative to the repository
    (tools/config_table.py prints it with links relative to docs/; tests/settings/test_config_table.py
    checks docs/configuration.md holds exactly that)."""
    rows = ["| key | default | type | meaning |", "|---|---|---|---|"]
    for s in KEYS:
        cells = [f"`{s.key}`", f"`{s.shown_default}`" if s.shown_default else "", s.type.describe(), s.doc]
        rows.append("|" + "|".join(f" {c} " if c else " " for c in cells) + "|")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class Settings:
    """Typed, validated settings; build with from_conf (KEYS declares each one's default)."""

    enabled: bool
    blob_url: str
    blob_options: Mapping[str, str]
    log_url: str
    log_options: Mapping[str, str]
    workers: int
    chunk_size: int
    small_file_bytes: int
    checksum_all_files: bool
    durable_commit: bool
    blob_ttl_seconds: float
    max_commit_delay_seconds: float
    commit_timeout_seconds: float
    restore_timeout_seconds: float
    sweep_interval_seconds: float
    drain_timeout_seconds: float
    retain_checkpoints: int
    changelog_snapshot_every: int
    changelog_stream_chunk: int
    sidecar_mode: str
    local_checkpoint_file_manager: bool
    link_sst_files: bool
    metrics_per_store: bool
    test_crash_at: tuple[CrashSpec, ...]  # test only (common/crashpoints.py); empty in production

    @staticmethod
    def from_conf(conf: Mapping[str, str], cwd: Path | None = None) -> Settings:
        """Validate every spark.statebackend.* key of `conf`; unknown keys under the prefix are errors
        (a typo must not silently fall back to a default). `cwd` resolves the URLs' defaults (the
        driver's working directory); ConfigError naming the first bad key and its value."""
        base = Path(cwd or os.getcwd()).absolute()
        _refuse_unknown_keys(conf)
        blob_url = BLOB_URL.read(conf, default=_under_cwd(BLOB_URL, base))
        log_url = LOG_URL.read(conf, default=_under_cwd(LOG_URL, base))
        blob_ttl_ms = BLOB_TTL.read(conf)
        max_commit_delay_ms = MAX_COMMIT_DELAY.read(conf)
        commit_timeout_ms = COMMIT_TIMEOUT.read(conf)
        restore_timeout_ms = _restore_timeout_ms(conf)
        _check_blob_ttl(conf, blob_ttl_ms, commit_timeout_ms)
        return Settings(
            enabled=ENABLED.read(conf),
            blob_url=blob_url,
            blob_options=_options(conf, BLOB_OPTIONS),
            log_url=log_url,
            log_options=_options(conf, LOG_OPTIONS),
            workers=WORKERS.read(conf),
            chunk_size=CHUNK_SIZE.read(conf),
            small_file_bytes=SMALL_FILE_BYTES.read(conf),
            checksum_all_files=CHECKSUM_ALL_FILES.read(conf),
            durable_commit=DURABLE_COMMIT.read(conf),
            blob_ttl_seconds=blob_ttl_ms / 1000.0,
            max_commit_delay_seconds=max_commit_delay_ms / 1000.0,
            commit_timeout_seconds=commit_timeout_ms / 1000.0,
            restore_timeout_seconds=restore_timeout_ms / 1000.0,
            sweep_interval_seconds=SWEEP_INTERVAL.read(conf) / 1000.0,
            drain_timeout_seconds=DRAIN_TIMEOUT.read(conf) / 1000.0,
            retain_checkpoints=RETAIN_CHECKPOINTS.read(conf),
            changelog_snapshot_every=CHANGELOG_SNAPSHOT_EVERY.read(conf),
            changelog_stream_chunk=CHANGELOG_STREAM_CHUNK.read(conf),
            sidecar_mode=SIDECAR_MODE.read(conf),
            local_checkpoint_file_manager=LOCAL_CHECKPOINT_FILE_MANAGER.read(conf),
            link_sst_files=LINK_SST_FILES.read(conf),
            metrics_per_store=METRICS_PER_STORE.read(conf),
            test_crash_at=TEST_CRASH_AT.read(conf),
        )


def _refuse_unknown_keys(conf: Mapping[str, str]) -> None:
    known = {s.key for s in KEYS if not s.family} | {PREFIX + d for s in KEYS for d in s.deprecated}
    families = tuple(s.family for s in KEYS if s.family)
    for key in conf:
        if key.startswith(PREFIX) and key not in known and not key.startswith(families):
            raise ConfigError(key, "unknown key (see docs/configuration.md in spark-statebackend)")


def _options(conf: Mapping[str, str], family: Setting[Any]) -> dict[str, str]:
    p = family.family
    return {k[len(p) :]: str(v) for k, v in conf.items() if k.startswith(p)}


_DRIVER_CWD = "file://<driver cwd>/"


def _under_cwd(setting: Setting[str], base: Path) -> str:
    """The URL `setting.unset` names (file://<driver cwd>/<path>), resolved against `base`."""
    if not setting.unset.startswith(_DRIVER_CWD):
        raise ValueError(f"{setting.key}: its unset value {setting.unset!r} is not under {_DRIVER_CWD}")
    return base.joinpath(*setting.unset[len(_DRIVER_CWD) :].split("/")).as_uri()


def _check_blob_ttl(conf: Mapping[str, str], blob_ttl_ms: int, commit_timeout_ms: int) -> None:
    # An upload's blobs carry the TTL until the checkpoint that references them is cleaned up,
    # which can take up to commitTimeout; gc's grace assumes the same window. A TTL inside
    # commitTimeout + grace lets the TTL sweep delete blobs a checkpoint is about to reference.
    floor_ms = commit_timeout_ms + int(DEFAULT_GC_GRACE_SECONDS * 1000)
    if blob_ttl_ms < floor_ms:
        raise ConfigError(
            BLOB_TTL.key,
            f"{BLOB_TTL.text(conf)!r} must be at least {COMMIT_TIMEOUT.key} "
            f"({format_duration(commit_timeout_ms / 1000)}) plus gc's grace "
            f"({format_duration(DEFAULT_GC_GRACE_SECONDS)}), i.e. "
            f"{format_duration(floor_ms / 1000)}: uploads expiring before their checkpoint "
            "references them would be lost",
        )


def _restore_timeout_ms(conf: Mapping[str, str]) -> int:
    """restoreTimeout, or the deprecated restoreTimeoutMs (a number of milliseconds), which the JVM
    shim reads first: both set to different values would make the shim and the sidecar disagree."""
    new_key = RESTORE_TIMEOUT.key
    [old_name] = RESTORE_TIMEOUT.deprecated
    old_key = PREFIX + old_name
    new = RESTORE_TIMEOUT.read(conf)
    if old_key not in conf:
        return new
    _deprecated(old_key, new_key, RESTORE_TIMEOUT.default)
    old = parse_legacy_ms(conf[old_key], old_key, minimum=1)
    if new_key in conf and new != old:
        raise ConfigError(
            old_key,
            f"{old} ms contradicts {new_key}={conf[new_key]!r}; set only {new_key}",
        )
    return old
