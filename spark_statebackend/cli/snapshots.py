"""Commands on one snapshot of a directory: backup, restore, verify."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from ..errors import StateBackendError
from . import options as opt
from .app import EXIT_PROBLEMS, main

if TYPE_CHECKING:
    from ..engine.backup import BackupConfig, StoreUpload
    from ..engine.diff import DiffOptions
    from ..lifecycle.snapshots import Snapshot
    from ..stores import BlobStore

#: Beside a restored directory DIR: `.DIR.ssb-restore.json` records which store DIR was restored
#: from, so the next restore of that store may replace DIR's contents without --force. It lives
#: outside DIR because DIR must hold exactly the snapshot.
RESTORE_MARKER_SUFFIX = ".ssb-restore.json"


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@opt.blob_url_option
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
@click.option(
    "--reread",
    is_flag=True,
    help="Read every file and compare its checksum, even one whose size, mtime, ctime and inode are "
    "unchanged since the previous snapshot.",
)
@opt.workers_option
@opt.store_options
@opt.progress_option
@opt.json_option
def backup(
    directory: Path,
    blob_url: str,
    store_name: str,
    chunk_size: str,
    ttl: str,
    reread: bool,
    workers: int,
    options: tuple[str, ...],
    progress: bool | None,
    as_json: bool,
) -> None:
    """Incrementally back up DIRECTORY; the last line of stdout is the new snapshot's blob id.

    A file is taken as unchanged without reading it only if its size, mtime, ctime and inode number
    are those the previous snapshot recorded (files up to 1 MiB are always read); any other file is
    read and uploaded if its content changed. --reread reads every file. Every snapshot is kept until
    `forget` removes it (and `gc` its blobs)."""
    from ..common.units import parse_duration, parse_size
    from ..engine.backup import BackupConfig
    from ..engine.blobs import blob_segment
    from ..engine.diff import DiffOptions

    if blob_segment(store_name) != store_name:
        raise click.BadParameter("use only letters, digits, '.', '_', '-', '=' and '/'", param_hint="--store")
    config = BackupConfig(
        chunk_size=parse_size(chunk_size, "--chunk-size"),
        ttl_seconds=parse_duration(ttl, "--ttl", positive=True),
        # Arbitrary directories may be rewritten in place at the same size: stat identity (diff.py).
        diff=DiffOptions(stat_identity=True, checksum_all_files=reread),
    )
    store = opt.open_store(blob_url, options, create=True)
    bar = opt.Bar(f"backup {store_name}", opt.bar_enabled(progress, as_json))
    marker, last = _upload_snapshot(store, store_name, directory, config, workers, bar)
    _report_backup(store_name, marker, last, as_json)


def _upload_snapshot(
    store: BlobStore, store_name: str, directory: Path, config: BackupConfig, workers: int, bar: opt.Bar
) -> tuple[str, StoreUpload]:
    """Upload a snapshot of `directory` as store `store_name`, diffed against its newest snapshot, and
    make it permanent (the CLI is its own committer); its marker and what the upload found. Closes
    `bar`."""
    import time as _time

    from ..engine.backup import BackupManager
    from ..engine.blobs import SnapshotOwner
    from ..engine.transfer import TransferPool
    from ..lifecycle.snapshots import list_snapshots

    owner = SnapshotOwner()
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
    last = manager.last_upload(store_name)
    if last is None:  # cannot happen: upload() returned its marker
        raise StateBackendError(f"store {store_name}: no upload recorded for snapshot {markers[store_name]}")
    return markers[store_name], last


def _report_backup(store_name: str, marker: str, last: StoreUpload, as_json: bool) -> None:
    """Print what the backup of `store_name` to snapshot `marker` did: a JSON document, or a line to
    stderr and the marker as the last line of stdout."""
    from ..common.units import format_size
    from ..lifecycle.snapshots import parse_snapshot_blob_id

    snap = parse_snapshot_blob_id(marker)
    short = snap.short_id if snap is not None else ""
    stats = last.stats
    if as_json:
        opt.emit_json(
            {
                "snapshot_id": short,
                "blob_id": marker,
                "store": store_name,
                "files_uploaded": stats.files_added,
                "bytes_uploaded": stats.bytes_added,
                "files_retained": stats.files_retained,
                "bytes_retained": stats.bytes_retained,
            }
        )
        return
    opt.info(
        f"snapshot {short} of store {store_name}: uploaded {stats.files_added} file(s) "
        f"({format_size(stats.bytes_added)}), retained {stats.files_retained} file(s) "
        f"({format_size(stats.bytes_retained)})"
    )
    click.echo(marker)


# -- restore -----------------------------------------------------------------------------------------


def _restore_marker(dest: Path) -> Path:
    return dest.parent / f".{dest.name}{RESTORE_MARKER_SUFFIX}"


def _verifying_diff() -> DiffOptions:
    """How restore compares what DEST holds with the snapshot: every file by its checksum, so that a
    file damaged in place at the same size is restored again, never taken as current."""
    from ..engine.diff import DiffOptions

    return DiffOptions(checksum_all_files=True)


def _check_dest(dest: Path, snap: Snapshot, index: Any, force: bool) -> None:
    """Refuse to replace a non-empty DEST that is neither a previous restore of the same store
    (its marker says so) nor already this snapshot, unless --force: restore makes DEST hold
    exactly the snapshot, deleting whatever else is there."""
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
    if is_identical(dest, index.dir_index, _verifying_diff()):
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
@opt.blob_url_option
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to restore into (made to hold exactly the snapshot).",
)
@opt.store_filter
@opt.query_filter
@click.option(
    "--force",
    is_flag=True,
    help="Replace the contents of a non-empty DEST that no restore of this store made.",
)
@opt.workers_option
@opt.store_options
@opt.progress_option
@opt.json_option
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
    restore of the same store made it (or it already holds the snapshot), or with --force. Files
    already in DEST are kept only if their checksums match the snapshot's."""
    from ..common.units import format_size
    from ..engine.blobs import load_snapshot_index
    from ..engine.restore import RestoreConfig, RestoreManager
    from ..engine.transfer import TransferPool

    opt.check_query(query)
    store = opt.open_store(blob_url, options)
    snap = opt.resolve_snapshot(store, snapshot, store_name, query)
    index = load_snapshot_index(store, snap.blob_id)
    dest = dest.absolute()
    _check_dest(dest, snap, index, force)
    bar = opt.Bar("restore", opt.bar_enabled(progress, as_json))
    with TransferPool(workers) as pool:
        try:
            manager = RestoreManager(store, pool, config=RestoreConfig(diff=_verifying_diff()))
            result = manager.restore(snap.blob_id, dest, progress=bar, index=index)
        finally:
            bar.close()
    _write_restore_marker(dest, snap, store.url)
    if as_json:
        opt.emit_json(
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
@opt.blob_url_option
@opt.store_filter
@opt.query_filter
@opt.workers_option
@opt.store_options
@opt.progress_option
@opt.json_option
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
    from ..engine.transfer import TransferPool
    from ..engine.verify import verify_snapshot

    opt.check_query(query)
    store = opt.open_store(blob_url, options)
    snap = opt.resolve_snapshot(store, snapshot, store_name, query)
    bar = opt.Bar(f"verify {snap.short_id}", opt.bar_enabled(progress, as_json))
    with TransferPool(workers) as pool:
        try:
            report = verify_snapshot(store, pool, snap.blob_id, progress=bar)
        finally:
            bar.close()
    if as_json:
        opt.emit_json(
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
