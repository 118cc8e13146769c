"""The options every cloud store accepts (docs/stores-and-logs.md "Blob store URLs and options"), and
its URL form."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...common.units import (
    deprecated_name,
    format_duration,
    format_size,
    parse_duration,
    parse_legacy_seconds,
    parse_size,
)
from ...common.urls import redact_url, refuse_userinfo
from ...errors import ConfigError
from ..base import check_blob_id

MiB = 1024 * 1024


@dataclass(frozen=True)
class CloudSettings:
    """Options every cloud store accepts (see docs/stores-and-logs.md, "Blob store URLs and options")."""

    retry_budget_seconds: float = 120.0
    retry_initial_backoff_seconds: float = 0.2
    retry_max_backoff_seconds: float = 10.0
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0
    max_concurrency: int = 8
    block_size: int = 8 * MiB
    download_chunk_size: int = 8 * MiB


#: Duration options: name -> (deprecated name whose value is a bare number of seconds, zero allowed).
_DURATION_OPTIONS: dict[str, tuple[str, bool]] = {
    "retry_budget": ("retry_budget_seconds", True),  # 0: no retries
    "retry_initial_backoff": ("retry_initial_backoff_seconds", False),
    "retry_max_backoff": ("retry_max_backoff_seconds", False),
    "connect_timeout": ("connect_timeout_seconds", False),
    "read_timeout": ("read_timeout_seconds", False),
}
_SIZE_OPTIONS = ("block_size", "download_chunk_size")
_COMMON_OPTIONS = (*_DURATION_OPTIONS, *_SIZE_OPTIONS, "max_concurrency")
_LEGACY_OPTIONS = {old: new for new, (old, _) in _DURATION_OPTIONS.items()}


def parse_settings(
    options: Mapping[str, str], key: str, backend_keys: Iterable[str], *, min_block_size: int = 1
) -> CloudSettings:
    """Read the common options; reject unknown ones (a typo must not silently mean a default).

    Durations and sizes use Spark's grammar (common/units.py: `retry_budget=2min`, `block_size=8m`); the
    deprecated `*_seconds` names still take a bare number of seconds, with a warning."""
    known = set(_COMMON_OPTIONS) | set(_LEGACY_OPTIONS) | set(backend_keys)
    unknown = sorted(set(options) - known)
    if unknown:
        listed = sorted(set(_COMMON_OPTIONS) | set(backend_keys))
        raise ConfigError(
            f"{key} options", f"unknown option(s) {', '.join(unknown)}; known: {', '.join(listed)}"
        )
    values: dict[str, Any] = {}
    for name, (old, zero_ok) in _DURATION_OPTIONS.items():
        field_name = f"{name}_seconds"
        if name in options and old in options:
            raise ConfigError(
                f"{key} option {old}", f"deprecated spelling of {name}, which is also set; keep only {name}"
            )
        if name in options:
            values[field_name] = parse_duration(options[name], f"{key} option {name}", positive=not zero_ok)
        elif old in options:
            example = format_duration(getattr(CloudSettings(), field_name))
            deprecated_name(f"{key} option {old}", name, example)
            values[field_name] = parse_legacy_seconds(
                options[old], f"{key} option {old}", positive=not zero_ok
            )
    for name in _SIZE_OPTIONS:
        if name in options:
            values[name] = parse_size(options[name], f"{key} option {name}")
    if "max_concurrency" in options:
        raw = str(options["max_concurrency"])
        try:
            values["max_concurrency"] = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{key} option max_concurrency", f"{raw!r} is not a whole number") from None
        if values["max_concurrency"] < 1:
            raise ConfigError(f"{key} option max_concurrency", f"must be positive, got {raw!r}")
    settings = CloudSettings(**values)
    if settings.block_size < min_block_size:
        raise ConfigError(
            f"{key} option block_size", f"must be at least {format_size(min_block_size)} for this store"
        )
    if settings.retry_max_backoff_seconds < settings.retry_initial_backoff_seconds:
        raise ConfigError(f"{key} option retry_max_backoff", "must be >= retry_initial_backoff")
    return settings


def split_url(url: str, scheme: str, key: str, what: str) -> tuple[str, str]:
    """`scheme://<root>/<prefix>` -> (root, prefix), the prefix normalised to '' or 'a/b/'. A URL
    holding credentials is refused (common/urls.py): the root would carry them into every message."""
    refuse_userinfo(url, key)
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme.lower() != scheme or not parsed.netloc:
        raise ConfigError(key, f"expected {scheme}://<{what}>/<prefix>, got {redact_url(url)!r}")
    if parsed.query or parsed.fragment or parsed.params:
        raise ConfigError(
            key, f"{scheme} URL must not have a query or fragment: put options in the options map"
        )
    prefix = parsed.path.strip("/")
    if prefix:
        try:
            check_blob_id(prefix)
        except ValueError as e:
            raise ConfigError(key, f"bad prefix in {redact_url(url)!r}: {e}") from None
        prefix += "/"
    return parsed.netloc, prefix
