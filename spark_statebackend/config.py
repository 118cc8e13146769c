"""Configuration: every setting is a spark.conf key under `spark.statebackend.`, validated at start.

`Settings.from_conf(conf)` reads a plain mapping (a SparkConf's getAll(), or a dict in tests) and
returns frozen, typed settings, or raises ConfigError naming the first bad key. KEYS is the single
list of keys with their defaults and meaning; the README table is written from it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .crashpoints import CrashSpec, parse_spec
from .errors import ConfigError

PREFIX = "spark.statebackend."

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(text: str, key: str) -> int:
    """'64MiB', '512k', '1048576' -> bytes; ConfigError naming `key` otherwise."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(key, f"{text!r} is not a size (e.g. 64MiB, 512k, 1048576)")
    unit = (m.group(2) or "").lower()[:1]
    value = int(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ConfigError(key, f"{text!r} must be positive")
    return value


def parse_duration(text: str, key: str) -> float:
    """'30s', '500ms', '7d', '60' (seconds) -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(key, f"{text!r} is not a duration (e.g. 500ms, 30s, 10min, 7d)")
    return float(m.group(1)) * _DUR_UNITS[(m.group(2) or "").lower()]


_JVM_DURATION = re.compile(r"^(\d+)(ms|s|m|min|h|d)$")


def parse_jvm_duration(text: str, key: str) -> float:
    """A duration the JVM shim reads too (Spark's getTimeAsMs), in seconds: a whole number with a unit.

    Stricter than parse_duration so that start-up refuses what the shim would refuse at the first
    commit ('2.0s') or read differently (a bare '60' is milliseconds to Spark)."""
    m = _JVM_DURATION.match(str(text).strip().lower())
    if not m:
        raise ConfigError(
            key,
            f"{text!r} is not a whole number with a unit (ms, s, m or min, h, d), e.g. 2s or 1500ms; the "
            "JVM shim reads this key with Spark's parser",
        )
    return parse_duration(m.group(1) + m.group(2), key)


def file_url_path(url: str, key: str) -> str:
    """The absolute path of a `file:///abs/path` URL; ConfigError naming `key` for any other form."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    if parsed.scheme.lower() != "file" or parsed.netloc not in ("", "localhost"):
        raise ConfigError(key, f"file URL must be file:///absolute/path, got {url!r}")
    path = unquote(parsed.path)
    if not path.startswith("/"):
        raise ConfigError(key, f"file URL must hold an absolute path, got {url!r}")
    return path


def parse_bool(text: str, key: str) -> bool:
    v = str(text).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ConfigError(key, f"{text!r} is not a boolean (true/false)")


def parse_int(text: str, key: str, minimum: int, maximum: int) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ConfigError(key, f"{text!r} is not a whole number") from None
    if not minimum <= v <= maximum:
        raise ConfigError(key, f"{v} is outside [{minimum}, {maximum}]")
    return v


@dataclass(frozen=True)
class Key:
    name: str
    default: str
    doc: str


KEYS: tuple[Key, ...] = (
    Key("enabled", "true", "Turn the backend on; false makes the provider behave exactly like Spark's."),
    Key(
        "blobStore.url",
        "file://<driver cwd>/spark-statebackend/blobs",
        "Where snapshots go: file:///abs/path, azure://<container>/<prefix> or s3://<bucket>/<prefix>. "
        "Must be reachable from every executor.",
    ),
    Key(
        "blobStore.options.<name>",
        "",
        "Backend options passed to the blob store (e.g. endpoint_url, retry_budget_seconds).",
    ),
    Key(
        "checkpointLog.url",
        "file://<driver cwd>/spark-statebackend/checkpoints",
        "Where combined checkpoints go: file:///abs/dir or kafka://host:port/topic.",
    ),
    Key("checkpointLog.options.<name>", "", "Checkpoint log options (e.g. replication_factor, timeouts)."),
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
    Key("blobTtl", "7d", "Uploaded blobs expire after this unless a checkpoint references them."),
    Key("maxCommitDelay", "60s", "How long a store's upload may lag before its next commit blocks."),
    Key("commitTimeout", "30min", "A checkpoint whose uploads take longer than this fails the query."),
    Key(
        "restoreTimeout",
        "10min",
        "How long an executor waits for a restore before falling back to Spark's files; the sidecar never "
        "places restored files once the wait is (nearly) over or the JVM has withdrawn its request. "
        "restoreTimeoutMs (whole milliseconds) overrides it, for the JVM and the sidecar alike.",
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
        "<java.io.tmpdir>/spark-statebackend/spool",
        "Event/request files between the JVM shim and the sidecar.",
    ),
    Key("hardLinkCheckpoint", "true", "Make Spark's own copies into a local checkpoint location hard links."),
    Key(
        "localCheckpointFileManager",
        "true",
        "For file: checkpoint locations, write Spark's checkpoint files with java.nio instead of Hadoop's "
        "local file system, which forks readlink/chmod processes on every atomic write (sets "
        "spark.sql.streaming.checkpointFileManagerClass unless you set it; other schemes are unchanged).",
    ),
    Key(
        "sidecar.mode",
        "process (set by configure())",
        "process: a Python sidecar per executor JVM (and one for the driver's committer) does uploads, "
        "restores and checkpoints. Unset, the shim starts no sidecar: set it with spark-submit.",
    ),
    Key("sidecar.python", "the driver's Python executable", "Python used to start executor sidecars."),
    Key(
        "test.crashAt",
        "",
        "Test only, never set in production: kill -9 a process at a named step, "
        "`<point>[@<n>][/<process>]` (see Reliability).",
    ),
)


def _restore_timeout(conf: Mapping[str, str], restore_timeout: str) -> float:
    """restoreTimeout in seconds as the JVM shim reads it: restoreTimeoutMs (whole milliseconds) wins
    over restoreTimeout. The sidecar must agree with the JVM: it places restored files only while the
    JVM still waits."""
    key = PREFIX + "restoreTimeoutMs"
    if key in conf:
        return parse_int(str(conf[key]), key, 0, 2**62) / 1000.0
    return parse_jvm_duration(restore_timeout, PREFIX + "restoreTimeout")


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
    blob_ttl_seconds: float = 7 * 86400.0
    max_commit_delay_seconds: float = 60.0
    commit_timeout_seconds: float = 1800.0
    restore_timeout_seconds: float = 600.0
    sweep_interval_seconds: float = 6 * 3600.0
    retain_checkpoints: int = 1
    hard_link_checkpoint: bool = True
    local_checkpoint_file_manager: bool = True
    test_crash_at: tuple[CrashSpec, ...] = ()  # test only (crashpoints.py); empty in production

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
            scheme = url.split("://", 1)[0].lower() if "://" in url else ""
            if scheme not in schemes:
                raise ConfigError(key, f"unknown URL scheme in {url!r}; use one of {', '.join(schemes)}")
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
            blob_ttl_seconds=parse_duration(get("blobTtl", "7d"), PREFIX + "blobTtl"),
            max_commit_delay_seconds=parse_jvm_duration(
                get("maxCommitDelay", "60s"), PREFIX + "maxCommitDelay"
            ),
            commit_timeout_seconds=parse_jvm_duration(
                get("commitTimeout", "30min"), PREFIX + "commitTimeout"
            ),
            restore_timeout_seconds=_restore_timeout(conf, get("restoreTimeout", "10min")),
            sweep_interval_seconds=parse_duration(get("sweepInterval", "6h"), PREFIX + "sweepInterval"),
            retain_checkpoints=parse_int(
                get("retainCheckpoints", "1"), PREFIX + "retainCheckpoints", 1, 10_000
            ),
            hard_link_checkpoint=parse_bool(get("hardLinkCheckpoint", "true"), PREFIX + "hardLinkCheckpoint"),
            local_checkpoint_file_manager=parse_bool(
                get("localCheckpointFileManager", "true"), PREFIX + "localCheckpointFileManager"
            ),
            test_crash_at=parse_spec(get("test.crashAt", ""), PREFIX + "test.crashAt"),
        )
