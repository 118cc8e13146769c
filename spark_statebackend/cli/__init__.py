"""The `spark-statebackend` command line: backup, restore, verify, snapshots, forget, checkpoints, gc.

Conventions (README "Command line"):
- Exit codes: 0 success; 1 the command failed (unreachable or missing store, snapshot not found, I/O
  error, refused destination); 2 usage error (unknown flag, malformed value, unknown option, bad URL,
  ambiguous snapshot id); 3 the command ran and found problems (verify: damaged snapshot; gc: some
  blobs kept because an index is unreadable, or deletes failed); 130 interrupted. Errors are one line
  on stderr; `--debug` shows the traceback instead.
- Read-only commands (restore's reads, verify, snapshots, checkpoints, forget --dry-run, gc --dry-run)
  never create a blob store or checkpoint log: a file:// URL naming a missing directory fails (a typo
  must not look like an empty store). `backup` creates its store on first use.
- `--json` prints JSON Lines on stdout: one object per snapshot or checkpoint for listings, one object
  for a report. Progress bars go to stderr, only on a terminal, never with --quiet or --json.
- Durations and sizes use Spark's grammar (units.py): --ttl 7d, --grace 6h, --chunk-size 64m.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import threading
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import orjson

from .. import __version__
from ..errors import ConfigError, StateBackendError

if TYPE_CHECKING:
    from ..checkpoints.gc import GcReport
    from ..checkpoints.snapshots import Snapshot
    from ..stores import BlobStore

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3
EXIT_INTERRUPTED = 130

#: Beside a restored directory DIR: `.DIR.ssb-restore.json` records which store DIR was restored
#: from, so the next restore of that store may replace DIR's contents without --force. It lives
#: outside DIR because DIR must hold exactly the snapshot.
RESTORE_MARKER_SUFFIX = ".ssb-restore.json"


class _Group(click.Group):
    """Turns our errors into one line on stderr and the documented exit codes (module doc)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except ConfigError as e:  # a bad flag, option, URL or snapshot id: the user must fix the line
            _fail(ctx, e, EXIT_USAGE)
        except (StateBackendError, OSError, ValueError) as e:
            _fail(ctx, e, EXIT_ERROR)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


def _fail(ctx: click.Context, error: Exception, code: int) -> NoReturn:
    if ctx.obj and ctx.obj.get("debug"):
        raise error
    click.echo(f"error: {error}", err=True)
    sys.exit(code)


@click.group(cls=_Group)
@click.version_option(__version__, "--version", prog_name="spark-statebackend")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars and no summaries on stderr.")
@click.pass_context
def main(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """Blob-store backup and restore of RocksDB state for Spark Structured Streaming.

    Exit codes: 0 ok, 1 failed, 2 usage error, 3 problems found (verify, gc), 130 interrupted."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["quiet"] = quiet
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# -- shared options and helpers ---------------------------------------------------------------------


_blob_url = click.option(
    "--blob-url", required=True, envvar="SSB_BLOB_URL", help="Blob store URL (file://, azure://, s3://)."
)
_store_options = click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Blob store option (e.g. endpoint_url=..., retry_budget=2min); repeatable.",
)
_log_options = click.option(
    "--log-option",
    "log_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Checkpoint log option (e.g. read.timeout=5s); repeatable.",
)
_workers = click.option(
    "--workers", default=8, show_default=True, type=click.IntRange(1, 256), help="Parallel transfers."
)
_progress = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal; never with --quiet or --json).",
)
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON Lines instead of text.")
_store_filter = click.option(
    "--store", "store_name", default=None, help="Only snapshots of this store (resolves 'latest')."
)
_query_filter = click.option(
    "--query", "query", default=None, help="Only snapshots of this query id (CLI backups: cli)."
)


def _quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.obj and ctx.obj.get("quiet"))


def _bar_enabled(flag: bool | None, as_json: bool) -> bool | None:
    """False (off), True (on) or None (tqdm decides: on only when stderr is a terminal)."""
    if as_json or _quiet():
        return False
    return flag


def _info(text: str) -> None:
    """A summary line on stderr (stdout carries results), silenced by --quiet."""
    if not _quiet():
        click.echo(text, err=True)


def _emit_json(obj: Mapping[str, Any]) -> None:
    click.echo(orjson.dumps(obj).decode())


def _utc(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


class _Bar:
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


class _GcBar:
    """gc's phases (gc.GcProgress) as one tqdm bar each."""

    def __init__(self, enabled: bool | None) -> None:
        self._enabled = enabled
        self._bar: _Bar | None = None

    def phase(self, name: str, total: int | None, unit: str) -> None:
        self.close()
        self._bar = _Bar(f"gc: {name}", self._enabled, unit)
        self._bar.start(total)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _parse_options(items: tuple[str, ...], hint: str = "--option") -> dict[str, str]:
    """KEY=VALUE command-line items as a dict; a malformed item is a usage error naming `hint`."""
    opts: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=hint)
        opts[key] = value
    return opts


def _require_file_dir(url: str, flag: str, what: str) -> None:
    """For a file:// URL: its directory must exist. Read-only commands create nothing, so a
    mistyped path fails here instead of looking like an empty store or log."""
    from urllib.parse import urlparse

    from ..common.urls import file_url_path

    if urlparse(url).scheme.lower() != "file":
        return
    path = Path(file_url_path(url, flag))
    if not path.is_dir():
        raise StateBackendError(
            f"{flag}: no {what} at {url}: {path} is not a directory (this command creates nothing; "
            "check the URL)"
        )


def _open_store(url: str, options: tuple[str, ...], *, create: bool = False) -> BlobStore:
    """The blob store at `url`. `create` (backup) makes it if missing; otherwise nothing is created."""
    from ..stores import open_blob_store

    store = open_blob_store(url, _parse_options(options), key="--blob-url")
    if create:
        store.ensure_ready()
    else:
        _require_file_dir(url, "--blob-url", "blob store")
    return store


def _resolve(store: BlobStore, ref: str, store_name: str | None, query: str | None) -> Snapshot:
    from ..checkpoints.snapshots import resolve

    return resolve(store, ref, store_name=store_name, query=query, key="SNAPSHOT")


def _check_query(query: str | None, flag: str = "--query") -> None:
    if query is None:
        return
    from ..checkpoints.checkpoint import check_query_id

    try:
        check_query_id(query)
    except ValueError as e:
        raise ConfigError(flag, str(e)) from None


# -- backup ------------------------------------------------------------------------------------------


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_blob_url
@click.option(
    "--store", "store_name", required=True, help="Name the snapshots of this directory are tracked under."
)
@click.option(
    "--chunk-size", default="64m", show_default=True, help="Files larger than this are split (e.g. 8m)."
)
@click.option(
    "--ttl",
    default="7d",
    show_default=True,
    help="An uploaded blob expires after this unless the backup completes (e.g. 12h, 7d).",
)
@_workers
@_store_options
@_progress
@_json
def backup(
    directory: Path,
    blob_url: str,
    store_name: str,
    chunk_size: str,
    ttl: str,
    workers: int,
    options: tuple[str, ...],
    progress: bool | None,
    as_json: bool,
) -> None:
    """Incrementally back up DIRECTORY; the last line of stdout is the new snapshot's blob id.

    Every snapshot is kept until `forget` removes it (and `gc` its blobs)."""
    import time as _time

    from ..checkpoints.snapshots import list_snapshots, parse_snapshot_blob_id
    from ..common.units import parse_duration, parse_size
    from ..engine.backup import BackupConfig, BackupManager, SnapshotOwner, blob_segment
    from ..engine.transfer import TransferPool

    if blob_segment(store_name) != store_name:
        raise click.BadParameter("use only letters, digits, '.', '_', '-', '=' and '/'", param_hint="--store")
    config = BackupConfig(
        chunk_size=parse_size(chunk_size, "--chunk-size"),
        ttl_seconds=parse_duration(ttl, "--ttl", positive=True),
    )
    store = _open_store(blob_url, options, create=True)
    owner = SnapshotOwner()
    bar = _Bar(f"backup {store_name}", _bar_enabled(progress, as_json))
    with TransferPool(workers) as pool:
        manager = BackupManager(store, pool, owner=owner, config=config)
        previous = list_snapshots(store, query=owner.query_id, store_name=store_name)
        if previous:  # the newest snapshot is the diff base: only new or changed files go up
            manager.init({store_name: max(previous, key=lambda s: (s.label, s.blob_id)).blob_id})
        checkpoint_id = f"{_time.time_ns():020d}"
        try:
            markers = manager.upload(checkpoint_id, {store_name: directory}, progress=bar)
        finally:
            bar.close()
        # The CLI is its own committer: the new index is the checkpoint, so its blobs become
        # permanent now. Nothing is deleted: older snapshots stay restorable until `forget`.
        manager.cleanup(markers, delete_replaced=False)
    m = manager.metrics
    counts = {
        k: int(m.value(f"ssb_backup_{k}", store=store_name))
        for k in ("files_to_upload", "bytes_to_upload", "files_retained", "bytes_retained")
    }
    snap = parse_snapshot_blob_id(markers[store_name])
    short = snap.short_id if snap is not None else ""
    if as_json:
        _emit_json(
            {
                "snapshot_id": short,
                "blob_id": markers[store_name],
                "store": store_name,
                "files_uploaded": counts["files_to_upload"],
                "bytes_uploaded": counts["bytes_to_upload"],
                "files_retained": counts["files_retained"],
                "bytes_retained": counts["bytes_retained"],
            }
        )
        return
    from ..common.units import format_size

    _info(
        f"snapshot {short} of store {store_name}: uploaded {counts['files_to_upload']} file(s) "
        f"({format_size(counts['bytes_to_upload'])}), retained {counts['files_retained']} file(s) "
        f"({format_size(counts['bytes_retained'])})"
    )
    click.echo(markers[store_name])


# -- restore -----------------------------------------------------------------------------------------


def _restore_marker(dest: Path) -> Path:
    return dest.parent / f".{dest.name}{RESTORE_MARKER_SUFFIX}"


def _check_dest(dest: Path, snap: Snapshot, index: Any, force: bool) -> None:
    """Refuse to replace a non-empty DEST that is neither a previous restore of the same store
    (its marker says so) nor already this snapshot, unless --force: restore makes DEST hold
    exactly the snapshot, deleting whatever else is there."""
    from ..engine.diff import DiffOptions
    from ..engine.restore import is_identical

    if not dest.exists():
        return
    if not dest.is_dir():
        raise StateBackendError(f"--dest: {dest} exists and is not a directory")
    if force or next(dest.iterdir(), None) is None:
        return
    try:
        marker = orjson.loads(_restore_marker(dest).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        marker = None
    if isinstance(marker, dict) and (marker.get("query"), marker.get("store")) == snap.key():
        return
    if is_identical(dest, index.dir_index, DiffOptions()):
        return
    raise StateBackendError(
        f"--dest: {dest} is not empty and is not a previous restore of store {snap.store}; restore "
        "would delete everything in it that is not in the snapshot. Pass --force to replace its "
        "contents, or choose an empty directory"
    )


def _write_restore_marker(dest: Path, snap: Snapshot, blob_url: str) -> None:
    import time as _time

    target = _restore_marker(dest)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(
        orjson.dumps(
            {
                "query": snap.query,
                "store": snap.store,
                "snapshot": snap.blob_id,
                "blob_url": blob_url,
                "restored_at_ms": int(_time.time() * 1000),
            }
        )
    )
    os.replace(tmp, target)


@main.command()
@click.argument("snapshot")
@_blob_url
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to restore into (made to hold exactly the snapshot).",
)
@_store_filter
@_query_filter
@click.option(
    "--force",
    is_flag=True,
    help="Replace the contents of a non-empty DEST that no restore of this store made.",
)
@_workers
@_store_options
@_progress
@_json
def restore(
    snapshot: str,
    blob_url: str,
    dest: Path,
    store_name: str | None,
    query: str | None,
    force: bool,
    workers: int,
    options: tuple[str, ...],
    progress: bool | None,
    as_json: bool,
) -> None:
    """Restore SNAPSHOT (an id or prefix, 'latest', or a blob id) into DEST.

    DEST ends up holding exactly the snapshot. A non-empty DEST is replaced only if a previous
    restore of the same store made it (or it already holds the snapshot), or with --force."""
    from ..common.units import format_size
    from ..engine.backup import load_snapshot_index
    from ..engine.restore import RestoreManager
    from ..engine.transfer import TransferPool

    _check_query(query)
    store = _open_store(blob_url, options)
    snap = _resolve(store, snapshot, store_name, query)
    index = load_snapshot_index(store, snap.blob_id)
    dest = dest.absolute()
    _check_dest(dest, snap, index, force)
    bar = _Bar("restore", _bar_enabled(progress, as_json))
    with TransferPool(workers) as pool:
        try:
            result = RestoreManager(store, pool).restore(snap.blob_id, dest, progress=bar, index=index)
        finally:
            bar.close()
    _write_restore_marker(dest, snap, store.url)
    if as_json:
        _emit_json(
            {
                "snapshot_id": snap.short_id,
                "blob_id": snap.blob_id,
                "dest": str(dest),
                "skipped": result.skipped,
                "files_downloaded": result.files_downloaded,
                "bytes_downloaded": result.bytes_downloaded,
                "files_reused": result.files_reused,
                "bytes_reused": result.bytes_reused,
                "seconds": round(result.seconds, 3),
            }
        )
    elif result.skipped:
        click.echo(f"{dest} already holds snapshot {snap.short_id}; nothing downloaded")
    else:
        rate = result.bytes_downloaded / max(result.seconds, 1e-9)
        click.echo(
            f"restored snapshot {snap.short_id}: {result.files_downloaded} file(s), "
            f"{format_size(result.bytes_downloaded)} ({result.files_reused} reused) into {dest} in "
            f"{result.seconds:.2f}s ({format_size(rate)}/s)"
        )


# -- verify ------------------------------------------------------------------------------------------


@main.command()
@click.argument("snapshot")
@_blob_url
@_store_filter
@_query_filter
@_workers
@_store_options
@_progress
@_json
def verify(
    snapshot: str,
    blob_url: str,
    store_name: str | None,
    query: str | None,
    workers: int,
    options: tuple[str, ...],
    progress: bool | None,
    as_json: bool,
) -> None:
    """Read every blob of SNAPSHOT and check every checksum; writes nothing. Exit 3 if damaged."""
    from ..common.units import format_size
    from ..engine.restore import verify_snapshot
    from ..engine.transfer import TransferPool

    _check_query(query)
    store = _open_store(blob_url, options)
    snap = _resolve(store, snapshot, store_name, query)
    bar = _Bar(f"verify {snap.short_id}", _bar_enabled(progress, as_json))
    with TransferPool(workers) as pool:
        try:
            report = verify_snapshot(store, pool, snap.blob_id, progress=bar)
        finally:
            bar.close()
    if as_json:
        _emit_json(
            {
                "snapshot_id": snap.short_id,
                "blob_id": snap.blob_id,
                "ok": report.ok,
                "files": report.files,
                "blobs": report.blobs,
                "bytes": report.bytes,
                "problems": list(report.problems),
            }
        )
    else:
        for problem in report.problems:
            click.echo(f"problem: {problem}", err=True)
        if report.ok:
            click.echo(
                f"ok: snapshot {snap.short_id}: {report.files} file(s), {report.blobs} blob(s), "
                f"{format_size(report.bytes)} verified"
            )
        else:
            click.echo(f"error: snapshot {snap.short_id} has {len(report.problems)} problem(s)", err=True)
    if not report.ok:
        sys.exit(EXIT_PROBLEMS)


# -- snapshots ---------------------------------------------------------------------------------------


@main.command()
@_blob_url
@_store_filter
@_query_filter
@_workers
@_store_options
@_json
def snapshots(
    blob_url: str,
    store_name: str | None,
    query: str | None,
    workers: int,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """List the snapshots in the blob store, oldest first, with short ids and sizes."""
    from ..checkpoints.snapshots import list_snapshots, load_indexes
    from ..common.units import format_size
    from ..engine.transfer import TransferPool

    _check_query(query)
    store = _open_store(blob_url, options)
    with TransferPool(workers) as pool:
        loaded, problems = load_indexes(
            store, pool, list_snapshots(store, query=query, store_name=store_name)
        )
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    rows = sorted(loaded, key=lambda s: (s.created_ms, s.blob_id))
    if as_json:
        for s in rows:
            assert s.index is not None
            _emit_json(
                {
                    "snapshot_id": s.short_id,
                    "full_id": s.full_id,
                    "blob_id": s.blob_id,
                    "query": s.query,
                    "store": s.index.metadata.store,
                    "created_ms": s.created_ms,
                    "created": _dt.datetime.fromtimestamp(s.created_ms / 1000, _dt.UTC).isoformat(),
                    "files": s.index.dir_index.file_count(),
                    "bytes": s.index.dir_index.total_size(),
                    "checkpoint_id": s.index.metadata.checkpoint_id,
                }
            )
        return
    if not rows:
        click.echo("no snapshots")
        return
    qwidth = max(len("query"), *(len(s.query) for s in rows))
    swidth = max(len("store"), *(len(s.store) for s in rows))
    click.echo(
        f"{'id':<8}  {'created (UTC)':<19}  {'query':<{qwidth}}  {'store':<{swidth}}  "
        f"{'files':>7}  {'size':>10}"
    )
    for s in rows:
        assert s.index is not None
        click.echo(
            f"{s.short_id:<8}  {_utc(s.created_ms):<19}  {s.query:<{qwidth}}  {s.store:<{swidth}}  "
            f"{s.index.dir_index.file_count():>7}  {format_size(s.index.dir_index.total_size()):>10}"
        )
    click.echo(f"{len(rows)} snapshot(s)")


# -- forget ------------------------------------------------------------------------------------------


@main.command()
@click.argument("snapshot_ids", nargs=-1, metavar="[SNAPSHOT]...")
@_blob_url
@click.option("--keep-last", type=int, default=None, help="Keep the N newest snapshots of each store.")
@click.option(
    "--keep-within",
    default=None,
    metavar="DURATION",
    help="Keep every snapshot taken within DURATION of its store's newest one (e.g. 30d).",
)
@click.option("--store", "store_name", default=None, help="Only snapshots of this store.")
@click.option("--dry-run", is_flag=True, help="Remove nothing; print what would be removed.")
@_workers
@_store_options
@_json
def forget(
    snapshot_ids: tuple[str, ...],
    blob_url: str,
    keep_last: int | None,
    keep_within: str | None,
    store_name: str | None,
    dry_run: bool,
    workers: int,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """Remove CLI snapshots a policy no longer keeps (or the SNAPSHOTs named); `gc` then deletes
    the blobs no remaining snapshot uses. --keep-last and --keep-within always keep a store's
    newest snapshot."""
    from ..checkpoints.snapshots import CLI_QUERY, list_snapshots, load_indexes, plan_forget
    from ..common.units import parse_duration_ms
    from ..engine.transfer import TransferPool

    if keep_last is None and keep_within is None and not snapshot_ids:
        raise click.UsageError("give --keep-last N, --keep-within DURATION or snapshot ids to forget")
    if keep_last is not None and keep_last < 1:
        raise click.BadParameter(f"must be at least 1, got {keep_last}", param_hint="--keep-last")
    within_ms = parse_duration_ms(keep_within, "--keep-within") if keep_within is not None else None
    store = _open_store(blob_url, options)
    named = [_resolve(store, ref, store_name, None) for ref in snapshot_ids]
    with TransferPool(workers) as pool:
        candidates = list_snapshots(store, query=CLI_QUERY, store_name=store_name)
        if named and keep_last is None and within_ms is None:  # ids only: just their stores
            stores = {s.key() for s in named}
            candidates = [s for s in candidates if s.key() in stores]
        loaded, problems = load_indexes(store, pool, candidates)
        for problem in problems:
            click.echo(f"warning: {problem} (left as it is)", err=True)
        loaded_ids = {s.blob_id for s in loaded}
        missing = [s for s in named if s.query == CLI_QUERY and s.blob_id not in loaded_ids]
        if missing:
            raise StateBackendError(f"snapshot {missing[0].blob_id} not found (or unreadable) in {store.url}")
        plan = plan_forget(
            [*loaded, *(s for s in named if s.query != CLI_QUERY)],
            keep_last=keep_last,
            keep_within_ms=within_ms,
            remove_ids=[s.blob_id for s in named],
        )
        if not dry_run and plan.remove:
            pool.run_all([partial(store.delete, s.blob_id) for s in plan.remove])
    if as_json:
        _emit_json(
            {
                "dry_run": dry_run,
                "keep": [_snap_json(s) for s in plan.keep],
                "remove": [_snap_json(s) for s in plan.remove],
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    for s in plan.remove:
        click.echo(f"{verb} {s.short_id}  {_utc(s.created_ms)}  {s.store}  {s.blob_id}")
    click.echo(
        f"{'dry run: ' if dry_run else ''}kept {len(plan.keep)} snapshot(s), {verb} {len(plan.remove)}"
        + (
            "; run `spark-statebackend gc` to delete their unshared blobs"
            if plan.remove and not dry_run
            else ""
        )
    )


def _snap_json(s: Snapshot) -> dict[str, Any]:
    return {
        "snapshot_id": s.short_id,
        "blob_id": s.blob_id,
        "query": s.query,
        "store": s.store,
        "created_ms": s.created_ms,
    }


# -- restore-checkpoint ------------------------------------------------------------------------------


@main.command("restore-checkpoint")
@click.option("--checkpoint-location", required=True, help="The query's local checkpoint location.")
@_blob_url
@click.option("--log", "log_url", required=True, help="Checkpoint log URL (file:// or kafka://).")
@_store_options
@_log_options
def restore_checkpoint(
    checkpoint_location: str,
    blob_url: str,
    log_url: str,
    options: tuple[str, ...],
    log_options: tuple[str, ...],
) -> None:
    """Rebuild a checkpoint location from the latest durable checkpoint (run before spark-submit)."""
    from ..spark.config import PREFIX, Settings
    from ..spark.driver_restore import restore_checkpoint_location

    conf = {PREFIX + "blobStore.url": blob_url, PREFIX + "checkpointLog.url": log_url}
    for key, value in _parse_options(options).items():
        conf[PREFIX + "blobStore.options." + key] = value
    for key, value in _parse_options(log_options, "--log-option").items():
        conf[PREFIX + "checkpointLog.options." + key] = value
    click.echo(
        f"{checkpoint_location}: {restore_checkpoint_location(Settings.from_conf(conf), checkpoint_location)}"
    )


# -- checkpoints (checkpoint log) --------------------------------------------------------------------


@main.command()
@click.option(
    "--log",
    "log_url",
    required=True,
    envvar="SSB_CHECKPOINT_LOG",
    help="Checkpoint log URL: kafka://host:port/topic or file:///dir.",
)
@click.option("--query", "query_id", required=True, help="Query id (Spark's persistent query id).")
@click.option("--history", is_flag=True, help="Print every retained checkpoint, oldest first.")
@_json
@click.option(
    "--option",
    "--log-option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Checkpoint log option (e.g. read.timeout=5s, kafka.security.protocol=SSL); repeatable.",
)
def checkpoints(log_url: str, query_id: str, history: bool, as_json: bool, options: tuple[str, ...]) -> None:
    """Print the latest (or every) combined checkpoint of a query. Read-only: creates nothing."""
    from ..checkpoints.logs import open_checkpoint_log

    opts = _parse_options(options)
    _check_query(query_id)
    with open_checkpoint_log(log_url, opts, key="--log") as log:
        _require_file_dir(log_url, "--log", "checkpoint log")
        if history:
            found = log.read_history(query_id)
        else:
            latest = log.read_latest(query_id)
            found = [latest] if latest is not None else []
        if not found:
            if not as_json:
                click.echo(f"no checkpoints for query {query_id} in {log.url}")
            return
        for i, cp in enumerate(found):
            if as_json:
                click.echo(cp.to_json().decode())
            else:
                click.echo(("\n" if i else "") + cp.describe())


# -- gc (blob store + checkpoint log) ----------------------------------------------------------------


@main.command()
@_blob_url
@click.option(
    "--log",
    "log_url",
    default=None,
    envvar="SSB_CHECKPOINT_LOG",
    help="Checkpoint log whose retained checkpoints protect their queries' blobs (kafka:// or file://). "
    "Without it only CLI snapshots are collected and every query's blobs are kept.",
)
@click.option("--dry-run", is_flag=True, help="Delete nothing; list what would be deleted.")
@click.option(
    "--grace",
    default="6h",
    show_default=True,
    help="Only unreferenced blobs older than this are deleted (keep it above commitTimeout+maxCommitDelay).",
)
@_workers
@_store_options
@_log_options
@_progress
@_json
def gc(
    blob_url: str,
    log_url: str | None,
    dry_run: bool,
    grace: str,
    workers: int,
    options: tuple[str, ...],
    log_options: tuple[str, ...],
    progress: bool | None,
    as_json: bool,
) -> None:
    """Delete blobs no kept CLI snapshot and no retained checkpoint references, once older than --grace.

    Exit 3 if some blobs were kept because of a problem (an unreadable index, a failed delete)."""
    import contextlib

    from ..checkpoints.gc import GarbageCollector
    from ..checkpoints.logs import open_checkpoint_log
    from ..common.units import parse_duration
    from ..engine.transfer import TransferPool

    grace_seconds = parse_duration(grace, "--grace")
    opts = _parse_options(log_options, "--log-option")
    store = _open_store(blob_url, options)
    bar = _GcBar(_bar_enabled(progress, as_json))
    with contextlib.ExitStack() as stack:
        log = None
        if log_url is not None:
            log = stack.enter_context(open_checkpoint_log(log_url, opts, key="--log"))
            _require_file_dir(log_url, "--log", "checkpoint log")
        elif opts:
            raise click.BadParameter("given without --log", param_hint="--log-option")
        pool = stack.enter_context(TransferPool(workers, name="ssb-gc"))
        try:
            report = GarbageCollector(store, log, pool, grace_seconds=grace_seconds).run(
                dry_run=dry_run, progress=bar
            )
        finally:
            bar.close()
    _print_gc(report, as_json)
    if report.problems:
        sys.exit(EXIT_PROBLEMS)


def _print_gc(report: GcReport, as_json: bool) -> None:
    if as_json:
        _emit_json(
            {
                "dry_run": report.dry_run,
                "grace_seconds": report.grace_seconds,
                "blobs_scanned": report.blobs_scanned,
                "referenced": report.referenced,
                "deleted": report.deleted,
                "bytes_freed": report.bytes_freed,
                "kept_for_grace": report.kept_for_grace,
                "kept_other": report.kept_other,
                "queries": list(report.queries),
                "queries_without_checkpoints": list(report.queries_without_checkpoints),
                "garbage": list(report.garbage),
                "garbage_bytes": report.garbage_bytes,
                "problems": list(report.problems),
            }
        )
        return
    if report.dry_run:
        for blob_id in report.garbage:
            click.echo(f"would delete {blob_id}")
    for problem in report.problems:
        click.echo(f"problem: {problem}", err=True)
    click.echo(("dry run: " if report.dry_run else "gc: ") + report.summary())
