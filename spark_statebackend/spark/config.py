"""Configuration: every setting is a spark.conf key under `spark.statebackend.`, validated at start.

`Settings.from_conf(conf)` reads a plain mapping (a SparkConf's getAll(), or a dict in tests) and
returns frozen, typed settings, or raises ConfigError naming the first bad key. KEYS is the single
list of keys with their defaults and meaning; the README table is written from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoints.gc import DEFAULT_GRACE_SECONDS
from ..common.crashpoints import CrashSpec, parse_spec
from ..common.units import deprecated_name as _deprecated
from ..common.units import format_duration, parse_duration, parse_duration_ms, parse_legacy_ms, parse_size
from ..common.urls import redact_url, refuse_userinfo
from ..errors import ConfigError

__all__ = [
    "DEFAULT_GC_GRACE_SECONDS",
    "KEYS",
    "PREFIX",
    "Key",
    "Settings",
    "parse_bool",
    "parse_duration",
    "parse_int",
    "parse_size",
]

PREFIX = "spark.statebackend."

#: gc's default grace (spark-statebackend gc --grace). blobTtl is checked against it at start: the TTL
#: must outlast the longest an upload can wait for its checkpoint plus this grace.
DEFAULT_GC_GRACE_SECONDS = DEFAULT_GRACE_SECONDS


def parse_bool(text: str, key: str) -> bool:
    """'true' or 'false', case-insensitive, as Spark (and the JVM shim) read booleans."""
    v = str(text).strip().lower()
    if v == "true":
        return True
    if v == "false":
        return False
    raise ConfigError(key, f"{text!r} is not a boolean: write true or false")


def parse_int(text: str, key: str, minimum: int, maximum: int) -> int:
    """A whole number in [minimum, maximum]; ConfigError naming `key` otherwise."""
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ConfigError(key, f"{text!r} is not a whole number") from None
    if not minimum <= v <= maximum:
        raise ConfigError(key, f"{v} is outside [{minimum}, {maximum}]")
    return v


def _one_of(text: str, key: str, allowed: tuple[str, ...]) -> str:
    v = text.strip().lower()
    if v not in allowed:
        raise ConfigError(key, f"expected one of {', '.join(allowed)}, got {text!r}")
    return v


@dataclass(frozen=True)
class Key:
    name: str
    default: str
    doc: str


KEYS: tuple[Key, ...] = (
    Key("enabled", "true", "Turn the backend on; false installs no hook: Spark runs exactly as without it."),
    Key(
        "blobStore.url",
        "file://<driver cwd>/spark-statebackend/blobs",
        "Where snapshots go: file:///abs/path, azure://<container>/<prefix> or s3://<bucket>/<prefix>. "
        "Must be reachable from every executor.",
    ),
    Key(
        "blobStore.options.<name>",
        "",
        "Backend options passed to the blob store (e.g. endpoint_url, retry_budget).",
    ),
    Key(
        "checkpointLog.url",
        "file://<driver cwd>/spark-statebackend/checkpoints",
        "Where combined checkpoints go: file:///abs/dir or kafka://host:port/topic.",
    ),
    Key(
        "checkpointLog.options.<name>",
        "",
        "Checkpoint log options (e.g. replication.factor, read.timeout).",
    ),
    Key(
        "transfer.workers",
        "8",
        "Parallel blob transfers per process (upload and restore pool size); at most twice as many more "
        "wait in its queue, further work waits for a slot.",
    ),
    Key("chunkSize", "64MiB", "Files larger than this are uploaded as several blobs."),
    Key("smallFileBytes", "1MiB", "Files up to this size are compared by checksum when diffing."),
    Key(
        "checksumAllFiles",
        "false",
        "Compare large files by checksum too (they are immutable SSTs by default).",
    ),
    Key(
        "blobTtl",
        "7d",
        "Uploaded blobs expire after this unless a checkpoint references them. At least "
        "commitTimeout plus gc's grace (6h).",
    ),
    Key(
        "maxCommitDelay",
        "60s",
        "How long a store's upload may lag before its next commit blocks (0: every commit waits for "
        "the previous upload), and a query's checkpoints before Spark's commit of its next batch blocks "
        "(driver).",
    ),
    Key(
        "durableCommit",
        "true",
        "true: a store's commit returns only once its version is uploaded and reported, so a lost "
        "executor host loses no state version Spark committed (a task retried elsewhere restores it); "
        "the commit waits for the upload (at most commitTimeout). false: the upload follows the commit "
        "asynchronously (commits are faster, docs/benchmarks.md), and a host lost before it fails the "
        "query until a restart.",
    ),
    Key(
        "commitTimeout",
        "30min",
        "A commit blocked by either lag for longer than this fails the query, naming the cause; a batch "
        "whose uploads take longer is not checkpointed. Must be positive.",
    ),
    Key(
        "restoreTimeout",
        "10min",
        "How long an executor waits for a restore before falling back to Spark's files, and a query "
        "start for its checkpoint location; the sidecar never places restored files once the wait is "
        "(nearly) over or the JVM has withdrawn its request. Must be positive. (Deprecated spelling: "
        "restoreTimeoutMs, a number of milliseconds.)",
    ),
    Key(
        "drainTimeout",
        "60s",
        "At application or executor stop, how long the stop may take to hand over the batches Spark's "
        "listener bus still holds (driver) and for a sidecar to finish uploading and checkpointing the "
        "micro-batches already done (so a job that stops, e.g. availableNow, keeps its last checkpoint); "
        "one budget for both; 0: stop at once.",
    ),
    Key(
        "sweepInterval",
        "6h",
        "How often the driver's committer runs the TTL sweep over the whole blob store: blobs whose "
        "blobTtl has passed are deleted unless a retained checkpoint references them. 0 turns it off "
        "(spark-statebackend gc sweeps too).",
    ),
    Key(
        "retainCheckpoints",
        "1",
        "Checkpoints kept per query; older ones are deleted with their unshared blobs.",
    ),
    Key(
        "stagingDir",
        "<checkpoint location>/_statebackend/staging",
        "Where the shim hard-links committed snapshots; must be on the checkpoint location's filesystem.",
    ),
    Key(
        "spoolDir",
        "<java.io.tmpdir>/spark-statebackend-<user>/spool",
        "Event/request files between the JVM shim and the sidecar (private: 0700 dirs, 0600 files).",
    ),
    Key(
        "localCheckpointFileManager",
        "true",
        "For file: checkpoint locations, write Spark's checkpoint files with java.nio instead of Hadoop's "
        "local file system, which forks readlink/chmod processes on every atomic write (sets "
        "spark.sql.streaming.checkpointFileManagerClass unless you set it; other schemes are unchanged).",
    ),
    Key(
        "linkSstFiles",
        "true",
        "For file: checkpoint locations, Spark's RocksDB state store hard-links its SST files between its "
        "local dir and the checkpoint location instead of copying them (sets fs.file.impl unless you set "
        "it; needs both on one file system, else it copies as before).",
    ),
    Key(
        "sidecar.mode",
        "process",
        "process: the plugin starts a Python sidecar per executor JVM and one for the driver (uploads, "
        "restores, checkpoints). none: no sidecar (only for tests that serve the spool themselves).",
    ),
    Key(
        "sidecar.python",
        "the Python Spark gives PySpark in the same process (see sidecar.driverPython for the driver)",
        "Python that runs the sidecars and the start-up validation (spark-statebackend and the extras "
        "of the URLs installed), on the driver and every executor. Unset, each process resolves it as "
        "Spark resolves its own Python: an executor takes spark.pyspark.python, else PYSPARK_PYTHON, "
        "else, with a local-cluster master (its executors run on the driver's host), sidecar.driverPython, "
        "else python3 (so a venv shipped with --archives and named by spark.pyspark.python serves the "
        "sidecars too); the driver takes sidecar.driverPython, else spark.pyspark.driver.python, "
        "spark.pyspark.python, PYSPARK_DRIVER_PYTHON, PYSPARK_PYTHON, python3. An executor whose Python "
        "cannot run the sidecar fails at start naming the Python and where it came from (the JVM's "
        "Conf.sidecarPython is the one home of this rule).",
    ),
    Key(
        "sidecar.driverPython",
        "the Python configure() runs in",
        "The driver's sidecar Python when sidecar.python is unset; configure() sets it to its own "
        "interpreter, which is the driver's whatever spark.pyspark.python names for the executors. "
        "Used by executors only under a local-cluster master, whose executors share the driver's host, "
        "when nothing else names their Python.",
    ),
    Key(
        "checkpointFileManager.delegate",
        "",
        "Set by the plugin: the spark.sql.streaming.checkpointFileManagerClass you had configured, which "
        "spark-statebackend's manager wraps (set it yourself only to change that).",
    ),
    Key(
        "test.crashAt",
        "",
        "Test only, never set in production: kill -9 a process at a named step, "
        "`<point>[@<n>][/<process>]` (see Reliability).",
    ),
)


@dataclass(frozen=True)
class Settings:
    """Typed, validated settings; build with from_conf."""

    enabled: bool = True
    blob_url: str = ""
    blob_options: Mapping[str, str] = field(default_factory=dict)
    log_url: str = ""
    log_options: Mapping[str, str] = field(default_factory=dict)
    workers: int = 8
    chunk_size: int = 64 * 1024**2
    small_file_bytes: int = 1024**2
    checksum_all_files: bool = False
    durable_commit: bool = True
    blob_ttl_seconds: float = 7 * 86400.0
    max_commit_delay_seconds: float = 60.0
    commit_timeout_seconds: float = 1800.0
    restore_timeout_seconds: float = 600.0
    sweep_interval_seconds: float = 6 * 3600.0
    drain_timeout_seconds: float = 60.0
    retain_checkpoints: int = 1
    sidecar_mode: str = "process"
    local_checkpoint_file_manager: bool = True
    link_sst_files: bool = True
    test_crash_at: tuple[CrashSpec, ...] = ()  # test only (common/crashpoints.py); empty in production

    @staticmethod
    def from_conf(conf: Mapping[str, str], cwd: Path | None = None) -> Settings:
        """Validate every spark.statebackend.* key of `conf`; unknown keys under the prefix are errors
        (a typo must not silently fall back to a default)."""
        base = Path(cwd or os.getcwd()).absolute()

        def get(name: str, default: str) -> str:
            return str(conf.get(PREFIX + name, default))

        # restoreTimeoutMs: the JVM shim's millisecond spelling of restoreTimeout.
        known = {PREFIX + k.name for k in KEYS if "<" not in k.name} | {PREFIX + "restoreTimeoutMs"}
        for key in conf:
            if not key.startswith(PREFIX):
                continue
            if (
                key in known
                or key.startswith(PREFIX + "blobStore.options.")
                or key.startswith(PREFIX + "checkpointLog.options.")
            ):
                continue
            raise ConfigError(key, "unknown key (see the README's configuration table)")

        def options(prefix: str) -> dict[str, str]:
            p = PREFIX + prefix
            return {k[len(p) :]: str(v) for k, v in conf.items() if k.startswith(p)}

        blob_url = get("blobStore.url", (base / "spark-statebackend" / "blobs").as_uri())
        log_url = get("checkpointLog.url", (base / "spark-statebackend" / "checkpoints").as_uri())
        for key, url, schemes in (
            (PREFIX + "blobStore.url", blob_url, ("file", "azure", "s3")),
            (PREFIX + "checkpointLog.url", log_url, ("file", "kafka")),
        ):
            refuse_userinfo(url, key)
            scheme = url.split("://", 1)[0].lower() if "://" in url else ""
            if scheme not in schemes:
                raise ConfigError(
                    key, f"unknown URL scheme in {redact_url(url)!r}; use one of {', '.join(schemes)}"
                )
        blob_ttl_ms = parse_duration_ms(get("blobTtl", "7d"), PREFIX + "blobTtl", positive=True)
        max_commit_delay_ms = parse_duration_ms(get("maxCommitDelay", "60s"), PREFIX + "maxCommitDelay")
        commit_timeout_ms = parse_duration_ms(
            get("commitTimeout", "30min"), PREFIX + "commitTimeout", positive=True
        )
        restore_timeout_ms = _restore_timeout_ms(conf)
        # An upload's blobs carry the TTL until the checkpoint that references them is cleaned up,
        # which can take up to commitTimeout; gc's grace assumes the same window. A TTL inside
        # commitTimeout + grace lets the TTL sweep delete blobs a checkpoint is about to reference.
        floor_ms = commit_timeout_ms + int(DEFAULT_GC_GRACE_SECONDS * 1000)
        if blob_ttl_ms < floor_ms:
            raise ConfigError(
                PREFIX + "blobTtl",
                f"{get('blobTtl', '7d')!r} must be at least {PREFIX}commitTimeout "
                f"({format_duration(commit_timeout_ms / 1000)}) plus gc's grace "
                f"({format_duration(DEFAULT_GC_GRACE_SECONDS)}), i.e. "
                f"{format_duration(floor_ms / 1000)}: uploads expiring before their checkpoint "
                "references them would be lost",
            )
        return Settings(
            enabled=parse_bool(get("enabled", "true"), PREFIX + "enabled"),
            blob_url=blob_url,
            blob_options=options("blobStore.options."),
            log_url=log_url,
            log_options=options("checkpointLog.options."),
            workers=parse_int(get("transfer.workers", "8"), PREFIX + "transfer.workers", 1, 512),
            chunk_size=parse_size(get("chunkSize", "64MiB"), PREFIX + "chunkSize"),
            small_file_bytes=parse_size(get("smallFileBytes", "1MiB"), PREFIX + "smallFileBytes"),
            checksum_all_files=parse_bool(get("checksumAllFiles", "false"), PREFIX + "checksumAllFiles"),
            durable_commit=parse_bool(get("durableCommit", "true"), PREFIX + "durableCommit"),
            blob_ttl_seconds=blob_ttl_ms / 1000.0,
            max_commit_delay_seconds=max_commit_delay_ms / 1000.0,
            commit_timeout_seconds=commit_timeout_ms / 1000.0,
            restore_timeout_seconds=restore_timeout_ms / 1000.0,
            sweep_interval_seconds=parse_duration_ms(get("sweepInterval", "6h"), PREFIX + "sweepInterval")
            / 1000.0,
            drain_timeout_seconds=parse_duration_ms(get("drainTimeout", "60s"), PREFIX + "drainTimeout")
            / 1000.0,
            retain_checkpoints=parse_int(
                get("retainCheckpoints", "1"), PREFIX + "retainCheckpoints", 1, 10_000
            ),
            sidecar_mode=_one_of(
                get("sidecar.mode", "process"), PREFIX + "sidecar.mode", ("process", "none")
            ),
            local_checkpoint_file_manager=parse_bool(
                get("localCheckpointFileManager", "true"), PREFIX + "localCheckpointFileManager"
            ),
            link_sst_files=parse_bool(get("linkSstFiles", "true"), PREFIX + "linkSstFiles"),
            test_crash_at=parse_spec(get("test.crashAt", ""), PREFIX + "test.crashAt"),
        )


def _restore_timeout_ms(conf: Mapping[str, str]) -> int:
    """restoreTimeout, or the deprecated restoreTimeoutMs (a number of milliseconds), which the JVM
    shim reads first: both set to different values would make the shim and the sidecar disagree."""
    new_key, old_key = PREFIX + "restoreTimeout", PREFIX + "restoreTimeoutMs"
    new = parse_duration_ms(conf[new_key], new_key, positive=True) if new_key in conf else None
    if old_key not in conf:
        return new if new is not None else 600_000
    _deprecated(old_key, new_key, "10min")
    old = parse_legacy_ms(conf[old_key], old_key, minimum=1)
    if new is not None and new != old:
        raise ConfigError(
            old_key,
            f"{old} ms contradicts {new_key}={conf[new_key]!r}; set only {new_key}",
        )
    return old
