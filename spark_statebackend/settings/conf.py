"""`Settings`: the typed, validated values of a spark.conf mapping, read through KEYS by
`Settings.from_conf`, with the checks that span keys (unknown keys, blobTtl's floor, the deprecated
restoreTimeoutMs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.crashpoints import CrashSpec
from ..common.units import deprecated_name as _deprecated
from ..common.units import format_duration, parse_legacy_ms
from ..errors import ConfigError
from ..lifecycle.gc import DEFAULT_GRACE_SECONDS
from .keys import (
    BLOB_OPTIONS,
    BLOB_TTL,
    BLOB_URL,
    CHECKSUM_ALL_FILES,
    CHUNK_SIZE,
    COMMIT_TIMEOUT,
    DRAIN_TIMEOUT,
    DURABLE_COMMIT,
    ENABLED,
    KEYS,
    LINK_SST_FILES,
    LOCAL_CHECKPOINT_FILE_MANAGER,
    LOG_OPTIONS,
    LOG_URL,
    MAX_COMMIT_DELAY,
    RESTORE_TIMEOUT,
    RETAIN_CHECKPOINTS,
    SIDECAR_MODE,
    SMALL_FILE_BYTES,
    SWEEP_INTERVAL,
    TEST_CRASH_AT,
    WORKERS,
)
from .types import PREFIX, Setting

#: gc's default grace (spark-statebackend gc --grace). blobTtl is checked against it at start: the TTL
#: must outlast the longest an upload can wait for its checkpoint plus this grace.
DEFAULT_GC_GRACE_SECONDS = DEFAULT_GRACE_SECONDS


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
    sidecar_mode: str
    local_checkpoint_file_manager: bool
    link_sst_files: bool
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
            sidecar_mode=SIDECAR_MODE.read(conf),
            local_checkpoint_file_manager=LOCAL_CHECKPOINT_FILE_MANAGER.read(conf),
            link_sst_files=LINK_SST_FILES.read(conf),
            test_crash_at=TEST_CRASH_AT.read(conf),
        )


def _refuse_unknown_keys(conf: Mapping[str, str]) -> None:
    known = {s.key for s in KEYS if not s.family} | {PREFIX + d for s in KEYS for d in s.deprecated}
    families = tuple(s.family for s in KEYS if s.family)
    for key in conf:
        if key.startswith(PREFIX) and key not in known and not key.startswith(families):
            raise ConfigError(key, "unknown key (see the README's configuration table)")


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
