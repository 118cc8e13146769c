"""Commands on the list of snapshots in a blob store: snapshots (list), forget (remove by policy)."""

from __future__ import annotations

import datetime as _dt
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from ..errors import StateBackendError
from . import options as opt
from .app import main

if TYPE_CHECKING:
    from ..lifecycle.snapshots import Snapshot


@main.command()
@opt.blob_url_option
@opt.store_filter
@opt.query_filter
@opt.workers_option
@opt.store_options
@opt.json_option
def snapshots(
    blob_url: str,
    store_name: str | None,
    query: str | None,
    workers: int,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """List the snapshots in the blob store, oldest first, with short ids and sizes."""
    from ..common.units import format_size
    from ..engine.transfer import TransferPool
    from ..lifecycle.snapshots import list_snapshots, load_indexes

    opt.check_query(query)
    store = opt.open_store(blob_url, options)
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
            opt.emit_json(
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
            f"{s.short_id:<8}  {opt.utc(s.created_ms):<19}  {s.query:<{qwidth}}  {s.store:<{swidth}}  "
            f"{s.index.dir_index.file_count():>7}  {format_size(s.index.dir_index.total_size()):>10}"
        )
    click.echo(f"{len(rows)} snapshot(s)")


# -- forget ------------------------------------------------------------------------------------------


@main.command()
@click.argument("snapshot_ids", nargs=-1, metavar="[SNAPSHOT]...")
@opt.blob_url_option
@click.option("--keep-last", type=int, default=None, help="Keep the N newest snapshots of each store.")
@click.option(
    "--keep-within",
    default=None,
    metavar="DURATION",
    help="Keep every snapshot taken within DURATION of its store's newest one (e.g. 30d).",
)
@click.option("--store", "store_name", default=None, help="Only snapshots of this store.")
@click.option("--dry-run", is_flag=True, help="Remove nothing; print what would be removed.")
@opt.workers_option
@opt.store_options
@opt.json_option
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
    from ..common.units import parse_duration_ms
    from ..engine.transfer import TransferPool
    from ..lifecycle.snapshots import CLI_QUERY, list_snapshots, load_indexes, plan_forget

    if keep_last is None and keep_within is None and not snapshot_ids:
        raise click.UsageError("give --keep-last N, --keep-within DURATION or snapshot ids to forget")
    if keep_last is not None and keep_last < 1:
        raise click.BadParameter(f"must be at least 1, got {keep_last}", param_hint="--keep-last")
    within_ms = parse_duration_ms(keep_within, "--keep-within") if keep_within is not None else None
    store = opt.open_store(blob_url, options)
    named = [opt.resolve_snapshot(store, ref, store_name, None) for ref in snapshot_ids]
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
        opt.emit_json(
            {
                "dry_run": dry_run,
                "keep": [_snap_json(s) for s in plan.keep],
                "remove": [_snap_json(s) for s in plan.remove],
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    for s in plan.remove:
        click.echo(f"{verb} {s.short_id}  {opt.utc(s.created_ms)}  {s.store}  {s.blob_id}")
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
