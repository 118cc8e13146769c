"""The `spark-statebackend` command line: backup, restore, verify, snapshots, checkpoints, gc.

Errors exit non-zero with one clear line on stderr; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from .errors import StateBackendError


class _Group(click.Group):
    """Turns our errors into one line on stderr and exit code 1 (a traceback only with --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (StateBackendError, OSError, ValueError) as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Blob-store backup and restore of RocksDB state for Spark Structured Streaming."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# -- snapshot commands (core engine) --


class _Bar:
    """Progress on stderr with tqdm; silent when stderr is not a terminal unless forced."""

    def __init__(self, desc: str, enabled: bool | None) -> None:
        self._desc = desc
        self._enabled = enabled
        self._bar: Any = None

    def start(self, total_bytes: int) -> None:
        from tqdm import tqdm

        disable = None if self._enabled is None else not self._enabled
        self._bar = tqdm(
            total=total_bytes,
            desc=self._desc,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            disable=disable,
            leave=False,
        )

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(nbytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


_blob_url = click.option(
    "--blob-url", required=True, envvar="SSB_BLOB_URL", help="Blob store URL (file://, azure://, s3://)."
)
_store_options = click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Blob store option (e.g. endpoint_url=..., retry_budget_seconds=...); repeatable.",
)
_workers = click.option(
    "--workers", default=8, show_default=True, type=click.IntRange(1, 256), help="Parallel transfers."
)
_progress = click.option(
    "--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal)."
)


def _parse_options(items: tuple[str, ...], hint: str = "--option") -> dict[str, str]:
    """KEY=VALUE command-line items as a dict; a malformed item is a usage error naming `hint`."""
    opts: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=hint)
        opts[key] = value
    return opts


def _open_store(url: str, options: tuple[str, ...]) -> Any:
    from .blobstore import open_blob_store

    opts = _parse_options(options)
    store = open_blob_store(url, opts, key="--blob-url")
    store.ensure_ready()
    return store


def _latest_marker(store: Any, owner: Any, store_name: str) -> str | None:
    from .backup import indexes_prefix

    names = sorted(
        b.blob_id for b in store.list(indexes_prefix(owner, store_name)) if b.blob_id.endswith(".json")
    )
    return names[-1] if names else None


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_blob_url
@click.option(
    "--store", "store_name", required=True, help="Name the snapshots of this directory are tracked under."
)
@click.option(
    "--chunk-size", default="64MiB", show_default=True, help="Files larger than this are split (e.g. 8MiB)."
)
@click.option(
    "--ttl",
    "ttl_seconds",
    default=7 * 24 * 3600.0,
    show_default=True,
    type=float,
    help="Seconds before an uploaded blob expires unless the backup completes.",
)
@_workers
@_store_options
@_progress
def backup(
    directory: Path,
    blob_url: str,
    store_name: str,
    chunk_size: str,
    ttl_seconds: float,
    workers: int,
    options: tuple[str, ...],
    progress: bool | None,
) -> None:
    """Incrementally back up DIRECTORY; the last line of stdout is the new snapshot id."""
    import time as _time

    from .backup import BackupConfig, BackupManager, SnapshotOwner, blob_segment
    from .config import parse_size
    from .transfer import TransferPool

    if blob_segment(store_name) != store_name:
        raise click.BadParameter("use only letters, digits, '.', '_', '-', '=' and '/'", param_hint="--store")
    store = _open_store(blob_url, options)
    owner = SnapshotOwner()
    config = BackupConfig(chunk_size=parse_size(chunk_size, "--chunk-size"), ttl_seconds=ttl_seconds)
    bar = _Bar(f"backup {store_name}", progress)
    with TransferPool(workers) as pool:
        manager = BackupManager(store, pool, owner=owner, config=config)
        prev = _latest_marker(store, owner, store_name)
        if prev is not None:
            manager.init({store_name: prev})
        checkpoint_id = f"{_time.time_ns():020d}"
        try:
            markers = manager.upload(checkpoint_id, {store_name: directory}, progress=bar)
        finally:
            bar.close()
        # The CLI is its own committer: the new index is the checkpoint, so clean up right away.
        manager.cleanup(markers)
    m = manager.metrics
    click.echo(
        f"uploaded {int(m.value('ssb_backup_files_to_upload', store=store_name))} file(s), "
        f"{int(m.value('ssb_backup_bytes_to_upload', store=store_name))} byte(s); "
        f"retained {int(m.value('ssb_backup_files_retained', store=store_name))} file(s)",
        err=True,
    )
    click.echo(markers[store_name])


@main.command()
@click.argument("snapshot_id")
@_blob_url
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to restore into.",
)
@_workers
@_store_options
@_progress
def restore(
    snapshot_id: str, blob_url: str, dest: Path, workers: int, options: tuple[str, ...], progress: bool | None
) -> None:
    """Restore snapshot SNAPSHOT_ID into DEST (DEST ends up holding exactly the snapshot)."""
    from .restore import RestoreManager
    from .transfer import TransferPool

    store = _open_store(blob_url, options)
    bar = _Bar("restore", progress)
    with TransferPool(workers) as pool:
        try:
            result = RestoreManager(store, pool).restore(snapshot_id, dest, progress=bar)
        finally:
            bar.close()
    if result.skipped:
        click.echo(f"{dest} already holds snapshot {snapshot_id}; nothing downloaded")
    else:
        rate = result.bytes_downloaded / max(result.seconds, 1e-9) / 2**20
        click.echo(
            f"restored {result.files_downloaded} file(s), {result.bytes_downloaded} byte(s) "
            f"({result.files_reused} reused) into {dest} in {result.seconds:.2f}s ({rate:.1f} MiB/s)"
        )


@main.command()
@click.argument("snapshot_id")
@_blob_url
@_workers
@_store_options
def verify(snapshot_id: str, blob_url: str, workers: int, options: tuple[str, ...]) -> None:
    """Check that every blob of SNAPSHOT_ID exists and matches its checksum; writes nothing."""
    from .restore import verify_snapshot
    from .transfer import TransferPool

    store = _open_store(blob_url, options)
    with TransferPool(workers) as pool:
        report = verify_snapshot(store, pool, snapshot_id)
    for problem in report.problems:
        click.echo(f"problem: {problem}", err=True)
    if not report.ok:
        click.echo(f"error: snapshot {snapshot_id} has {len(report.problems)} problem(s)", err=True)
        sys.exit(1)
    click.echo(f"ok: {report.files} file(s), {report.blobs} blob(s), {report.bytes} byte(s) verified")


@main.command()
@_blob_url
@click.option("--store", "store_name", default=None, help="Only snapshots of this store.")
@_store_options
def snapshots(blob_url: str, store_name: str | None, options: tuple[str, ...]) -> None:
    """List the snapshots in the blob store with their sizes."""
    from .backup import blob_segment, load_snapshot_index

    store = _open_store(blob_url, options)
    rows = []
    for info in store.list("indexes/"):
        if not info.blob_id.endswith(".json"):
            continue
        try:
            idx = load_snapshot_index(store, info.blob_id)
        except StateBackendError as e:
            click.echo(f"warning: {e}", err=True)
            continue
        if store_name is not None and blob_segment(idx.metadata.store) != blob_segment(store_name):
            continue
        rows.append((idx.created_at_ms, info.blob_id, idx))
    if not rows:
        click.echo("no snapshots")
        return
    click.echo(f"{'created (UTC)':<20} {'store':<24} {'files':>7} {'bytes':>14}  snapshot id")
    import datetime as _dt

    for created, blob_id, idx in sorted(rows, key=lambda r: (r[0], r[1])):
        when = _dt.datetime.fromtimestamp(created / 1000, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        click.echo(
            f"{when:<20} {idx.metadata.store:<24} {idx.dir_index.file_count():>7} "
            f"{idx.dir_index.total_size():>14}  {blob_id}"
        )


@main.command("restore-checkpoint")
@click.option("--checkpoint-location", required=True, help="The query's local checkpoint location.")
@_blob_url
@click.option("--log", "log_url", required=True, help="Checkpoint log URL (file:// or kafka://).")
@_store_options
def restore_checkpoint(
    checkpoint_location: str, blob_url: str, log_url: str, options: tuple[str, ...]
) -> None:
    """Rebuild a checkpoint location from the latest durable checkpoint (run before spark-submit)."""
    from .config import PREFIX, Settings
    from .spark import restore_checkpoint_location

    conf = {PREFIX + "blobStore.url": blob_url, PREFIX + "checkpointLog.url": log_url}
    for key, value in _parse_options(options).items():
        conf[PREFIX + "blobStore.options." + key] = value
    click.echo(
        f"{checkpoint_location}: {restore_checkpoint_location(Settings.from_conf(conf), checkpoint_location)}"
    )


# -- checkpoints command (checkpoint log) --


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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record per line instead.")
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Checkpoint log option (e.g. read.timeout.ms=5000, kafka.security.protocol=SSL); repeatable.",
)
def checkpoints(log_url: str, query_id: str, history: bool, as_json: bool, options: tuple[str, ...]) -> None:
    """Print the latest (or every) combined checkpoint of a query. Read-only: creates nothing."""
    from .checkpoint import check_query_id
    from .checkpointlog import open_checkpoint_log

    opts = _parse_options(options)
    check_query_id(query_id)
    with open_checkpoint_log(log_url, opts, key="--log") as log:
        if history:
            found = log.read_history(query_id)
        else:
            latest = log.read_latest(query_id)
            found = [latest] if latest is not None else []
        if not found:
            click.echo(f"no checkpoints for query {query_id} in {log.url}")
            return
        for i, cp in enumerate(found):
            if as_json:
                click.echo(cp.to_json().decode())
            else:
                click.echo(("\n" if i else "") + cp.describe())


# -- gc command (blob store + checkpoint log) --


@main.command()
@_blob_url
@click.option(
    "--log",
    "log_url",
    required=True,
    envvar="SSB_CHECKPOINT_LOG",
    help="Checkpoint log URL whose retained checkpoints protect their blobs (kafka:// or file://).",
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
@click.option(
    "--log-option",
    "log_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Checkpoint log option (e.g. read.timeout.ms=5000); repeatable.",
)
def gc(
    blob_url: str,
    log_url: str,
    dry_run: bool,
    grace: str,
    workers: int,
    options: tuple[str, ...],
    log_options: tuple[str, ...],
) -> None:
    """Delete blobs no retained checkpoint of any query references, once older than --grace."""
    from .checkpointlog import open_checkpoint_log
    from .config import parse_duration
    from .gc import GarbageCollector
    from .transfer import TransferPool

    grace_seconds = parse_duration(grace, "--grace")
    opts = _parse_options(log_options, "--log-option")
    store = _open_store(blob_url, options)
    with open_checkpoint_log(log_url, opts, key="--log") as log, TransferPool(workers, name="ssb-gc") as pool:
        report = GarbageCollector(store, log, pool, grace_seconds=grace_seconds).run(dry_run=dry_run)
    if dry_run:
        for blob_id in report.garbage:
            click.echo(f"would delete {blob_id}")
    for problem in report.problems:
        click.echo(f"problem: {problem}", err=True)
    click.echo(("dry run: " if dry_run else "gc: ") + report.summary())
    if report.problems:
        sys.exit(1)
