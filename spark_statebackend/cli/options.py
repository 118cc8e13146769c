"""What the commands share: options, output (JSON Lines, summaries, progress bars) and opening stores."""

from __future__ import annotations

import datetime as _dt
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from ..errors import ConfigError, StateBackendError

if TYPE_CHECKING:
    from ..lifecycle.snapshots import Snapshot
    from ..stores import BlobStore

blob_url_option = click.option(
    "--blob-url", required=True, envvar="SSB_BLOB_URL", help="Blob store URL (file://, azure://, s3://)."
)
store_options = click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Blob store option (e.g. endpoint_url=..., retry_budget=2min); repeatable.",
)
log_options = click.option(
    "--log-option",
    "log_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Checkpoint log option (e.g. read.timeout=5s); repeatable.",
)
workers_option = click.option(
    "--workers", default=8, show_default=True, type=click.IntRange(1, 256), help="Parallel transfers."
)
progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal; never with --quiet or --json).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON Lines instead of text.")
store_filter = click.option(
    "--store", "store_name", default=None, help="Only snapshots of this store (resolves 'latest')."
)
query_filter = click.option(
    "--query", "query", default=None, help="Only snapshots of this query id (CLI backups: cli)."
)


def quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.obj and ctx.obj.get("quiet"))


def bar_enabled(flag: bool | None, as_json: bool) -> bool | None:
    """False (off), True (on) or None (tqdm decides: on only when stderr is a terminal)."""
    if as_json or quiet():
        return False
    return flag


def info(text: str) -> None:
    """A summary line on stderr (stdout carries results), silenced by --quiet."""
    if not quiet():
        click.echo(text, err=True)


def emit_json(obj: Mapping[str, Any]) -> None:
    click.echo(orjson.dumps(obj).decode())


def utc(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


class Bar:
    """A tqdm bar on stderr for byte transfers (the transfer.Progress protocol); thread-safe."""

    def __init__(self, desc: str, enabled: bool | None, unit: str = "B") -> None:
        self._desc = desc
        self._enabled = enabled
        self._unit = unit
        self._bar: Any = None
        self._lock = threading.Lock()

    def start(self, total: int | None) -> None:
        from tqdm import tqdm

        self.close()
        self._bar = tqdm(
            total=total,
            desc=self._desc,
            unit=self._unit,
            unit_scale=self._unit == "B",
            unit_divisor=1024,
            file=sys.stderr,
            disable=None if self._enabled is None else not self._enabled,
            leave=False,
        )

    def advance(self, n: int = 1) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.update(n)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


class GcBar:
    """gc's phases (gc.GcProgress) as one tqdm bar each."""

    def __init__(self, enabled: bool | None) -> None:
        self._enabled = enabled
        self._bar: Bar | None = None

    def phase(self, name: str, total: int | None, unit: str) -> None:
        self.close()
        self._bar = Bar(f"gc: {name}", self._enabled, unit)
        self._bar.start(total)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def parse_options(items: tuple[str, ...], hint: str = "--option") -> dict[str, str]:
    """KEY=VALUE command-line items as a dict; a malformed item is a usage error naming `hint`."""
    opts: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=hint)
        opts[key] = value
    return opts


def require_file_dir(url: str, flag: str, what: str) -> None:
    """For a file:// URL: its directory must exist. Read-only commands create nothing, so a
    mistyped path fails here instead of looking like an empty store or log."""
    from urllib.parse import urlparse

    from ..common.urls import file_url_path, redact_url

    if urlparse(url).scheme.lower() != "file":
        return
    path = Path(file_url_path(url, flag))
    if not path.is_dir():
        raise StateBackendError(
            f"{flag}: no {what} at {redact_url(url)}: {path} is not a directory (this command creates "
            "nothing; check the URL)"
        )


def open_store(url: str, options: tuple[str, ...], *, create: bool = False) -> BlobStore:
    """The blob store at `url`. `create` (backup) makes it if missing; otherwise nothing is created."""
    from ..stores import open_blob_store

    store = open_blob_store(url, parse_options(options), key="--blob-url")
    if create:
        store.ensure_ready()
    else:
        require_file_dir(url, "--blob-url", "blob store")
    return store


def resolve_snapshot(store: BlobStore, ref: str, store_name: str | None, query: str | None) -> Snapshot:
    from ..lifecycle.snapshots import resolve

    return resolve(store, ref, store_name=store_name, query=query, key="SNAPSHOT")


def check_query(query: str | None, flag: str = "--query") -> None:
    if query is None:
        return
    from ..checkpoints.checkpoint import check_query_id

    try:
        check_query_id(query)
    except ValueError as e:
        raise ConfigError(flag, str(e)) from None
