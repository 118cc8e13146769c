"""Commands on Spark queries' checkpoints: restore-checkpoint, checkpoints (read the log), gc."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from . import options as opt
from .app import EXIT_PROBLEMS, main

if TYPE_CHECKING:
    from ..lifecycle.gc import GcReport
    from ..settings import Settings


@main.command("restore-checkpoint")
@click.option("--checkpoint-location", required=True, help="The query's local checkpoint location.")
@opt.blob_url_option
@click.option("--log", "log_url", required=True, help="Checkpoint log URL (file:// or kafka://).")
@opt.store_options
@opt.log_options
def restore_checkpoint(
    checkpoint_location: str,
    blob_url: str,
    log_url: str,
    options: tuple[str, ...],
    log_options: tuple[str, ...],
) -> None:
    """Rebuild a checkpoint location from the latest durable checkpoint (run before spark-submit)."""
    from ..spark.driver_restore import restore_checkpoint_location

    settings = _settings(blob_url, log_url, options, log_options)
    click.echo(f"{checkpoint_location}: {restore_checkpoint_location(settings, checkpoint_location)}")


def _settings(
    blob_url: str, log_url: str, options: tuple[str, ...], log_options: tuple[str, ...]
) -> Settings:
    """The Settings a Spark application with these blob store and checkpoint log flags would have."""
    from ..settings import PREFIX, Settings

    conf = {PREFIX + "blobStore.url": blob_url, PREFIX + "checkpointLog.url": log_url}
    for key, value in opt.parse_options(options).items():
        conf[PREFIX + "blobStore.options." + key] = value
    for key, value in opt.parse_options(log_options, "--log-option").items():
        conf[PREFIX + "checkpointLog.options." + key] = value
    return Settings.from_conf(conf)


# -- export (back to Spark's own layout) -------------------------------------------------------------


@main.command("export")
@click.option(
    "--checkpoint-location",
    required=True,
    help="The local checkpoint location to write (the query's own, or a new directory with --query).",
)
@opt.blob_url_option
@click.option(
    "--log",
    "log_url",
    required=True,
    envvar="SSB_CHECKPOINT_LOG",
    help="Checkpoint log URL (file:// or kafka://).",
)
@click.option(
    "--query",
    "query_id",
    default=None,
    help="Query id (default: the location's `metadata`, else the query checkpointed for its path).",
)
@click.option(
    "--batch",
    type=click.IntRange(0),
    default=None,
    help="The batch whose state to export: must be the location's newest commit (the default).",
)
@click.option("--force", is_flag=True, help="Write over the files of store dirs that already hold some.")
@opt.store_options
@opt.log_options
@opt.json_option
def export(
    checkpoint_location: str,
    blob_url: str,
    log_url: str,
    query_id: str | None,
    batch: int | None,
    force: bool,
    options: tuple[str, ...],
    log_options: tuple[str, ...],
    as_json: bool,
) -> None:
    """Write a query's state into a checkpoint location in Spark's own layout, so the query runs on
    without the backend (Spark's RocksDB provider, spark.plugins unset) and loses nothing.

    The location keeps (or gets, from the latest durable checkpoint and the batch plans after it)
    Spark's offsets and commits; every store gets the state version of the location's newest commit,
    every blob checksum-verified. A store dir that already holds files is refused unless --force."""
    from ..spark.export import export_state

    opt.check_query(query_id)
    settings = _settings(blob_url, log_url, options, log_options)
    opt.require_file_dir(blob_url, "--blob-url", "blob store")
    opt.require_file_dir(log_url, "--log", "checkpoint log")
    result = export_state(settings, checkpoint_location, query_id=query_id, batch=batch, force=force)
    if as_json:
        opt.emit_json(
            {
                "query": result.query_id,
                "location": checkpoint_location,
                "batch": result.batch,
                "version": result.version,
                "driver": result.driver,
                "stores": [
                    {"store": s.key, "snapshot": s.marker, "files": s.files, "bytes": s.bytes}
                    for s in result.stores
                ],
            }
        )
        return
    click.echo(
        f"{checkpoint_location}: query {result.query_id}: {len(result.stores)} store(s) at state version "
        f"{result.version} (Spark runs batch {result.batch + 1} next; driver files: {result.driver})"
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
@opt.json_option
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

    opts = opt.parse_options(options)
    opt.check_query(query_id)
    with open_checkpoint_log(log_url, opts, key="--log") as log:
        opt.require_file_dir(log_url, "--log", "checkpoint log")
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
@opt.blob_url_option
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
@opt.workers_option
@opt.store_options
@opt.log_options
@opt.progress_option
@opt.json_option
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

    from ..checkpoints.logs import open_checkpoint_log
    from ..common.units import parse_duration
    from ..engine.transfer import TransferPool
    from ..lifecycle.gc import GarbageCollector

    grace_seconds = parse_duration(grace, "--grace")
    opts = opt.parse_options(log_options, "--log-option")
    store = opt.open_store(blob_url, options)
    bar = opt.GcBar(opt.bar_enabled(progress, as_json))
    with contextlib.ExitStack() as stack:
        log = None
        if log_url is not None:
            log = stack.enter_context(open_checkpoint_log(log_url, opts, key="--log"))
            opt.require_file_dir(log_url, "--log", "checkpoint log")
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
        opt.emit_json(
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
