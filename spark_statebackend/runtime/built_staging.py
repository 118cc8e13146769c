"""A snapshot the sidecar built from changelogs (materializer.py), staged as an upgrade of its version.

With durableCommit, a commit returns once its version is uploaded. The first commit whose recipe starts
from a built `<v>.zip` would upload that snapshot's SSTs (a whole store) inside its wait, on Spark's
task thread, unless they are uploaded before. So, once a build has published `<v>.zip`, the sidecar
stages version v again with the recipe `<v>.zip` and its SSTs, as an upgrade, exactly as the JVM
stages a snapshot Spark's maintenance thread published (StoreHooks.upgrade): the upload loop uploads
it between commits, diffed against the version's batch upload, and reports it as an upgrade
(upgrades.py then checkpoints it in place of the batch's marker); the next commit's recipe, diffed
against it, uploads its changelog alone.

The staged dir is where the JVM stages by default, `<location>/_statebackend/staging/<app>/<op>/<part>/
<store>/<v>-<random>/` (on the store dir's file system whatever `stagingDir` says, so the files are
hard links; MirrorCleaner sees it as pending), created and filled without following a symlink, from a
complete snapshot only (the zip's SSTs plain names, each present with its size). Staging that fails is a
WARNING and costs only time: the zip is in the store dir, and the next commit's recipe uploads it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from pathlib import Path

from ..common.nofollow import DirTree, relative_parts, remove_below
from ..errors import StateBackendError
from ..spark.changelogs import SST_DIR, ChangelogError, complete_snapshot
from ..spark.location import STAGING_PARTS
from . import spool as sp

log = logging.getLogger("spark_statebackend.materialize")


def stage_built_snapshot(
    spool: sp.Spool, app_id: str, query_id: str, uploaded: sp.SnapshotEvent
) -> Path | None:
    """Stage `<v>.zip` of `uploaded`'s store (v = its version, just built) and its SSTs as an upgrade
    event of version v in `spool` (module doc); the event's path, or None when it could not be staged
    (logged, the staged dir removed)."""
    ev = uploaded
    zip_name = f"{ev.version}.zip"
    stage_rel = (
        *STAGING_PARTS,
        sp.sanitize_id(app_id),
        str(ev.operator),
        str(ev.partition),
        sp.sanitize_id(ev.store),
        f"{ev.version}-{uuid.uuid4().hex}",
    )
    staged = ev.checkpoint_root.joinpath(*stage_rel)
    try:
        with DirTree(ev.checkpoint_root) as tree:
            files = _link_recipe(tree, relative_parts(ev.checkpoint_root, ev.dfs_dir), zip_name, stage_rel)
        event = dataclasses.replace(
            ev,
            query_id=query_id,
            batch_id=ev.version - 1,
            snapshot_version=ev.version,
            changelog_versions=(),
            upgrade=True,
            request_id=None,
            staged_dir=staged,
            files=tuple(files),
            created_at_ms=int(time.time() * 1000),
            stage_nanos=0,
        )
        return spool.write_event(event)
    except (OSError, StateBackendError) as e:  # ChangelogError, UnsafePathError
        log.warning(
            "query %s store %s version %d: the snapshot built from its changelogs could not be staged for "
            "upload before the next commit (%s); that commit uploads it instead",
            query_id,
            ev.instance.key,
            ev.version,
            e,
        )
        _remove(ev.checkpoint_root, stage_rel)
        return None


def _link_recipe(
    tree: DirTree, store_rel: tuple[str, ...], zip_name: str, stage_rel: tuple[str, ...]
) -> list[str]:
    """Hard-link `zip_name` and every SST its metadata names from the store dir into the staged dir
    (created); the linked paths, relative to both. ChangelogError unless the snapshot is complete
    (spark/materialize.py `complete_snapshot`: plain SST names, each present with its size)."""
    store_fd = tree.dir_fd(store_rel, create=False)
    if store_fd is None:
        raise ChangelogError(f"{tree.path(store_rel)}: no such store dir")
    sst_rel = (*store_rel, SST_DIR)
    meta = complete_snapshot(store_fd, tree.dir_fd(sst_rel, create=False), zip_name)
    if meta is None:
        raise ChangelogError(
            f"{tree.path((*store_rel, zip_name))}: unreadable, or an SST it names is missing or of "
            "another size"
        )
    ssts = [s["dfsSstFileName"] for s in meta.get("sstFiles", [])]
    staged_fd = tree.dir_fd(stage_rel, create=True)
    assert staged_fd is not None  # created
    os.link(zip_name, zip_name, src_dir_fd=store_fd, dst_dir_fd=staged_fd, follow_symlinks=False)
    if ssts:
        src, dst = tree.dir_fd(sst_rel, create=False), tree.dir_fd((*stage_rel, SST_DIR), create=True)
        for name in ssts:
            os.link(name, name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
    return [zip_name, *(f"{SST_DIR}/{name}" for name in ssts)]


def _remove(root: Path, rel: tuple[str, ...]) -> None:
    """Remove a staged dir that was not handed over, never through a symlink below `root`."""
    try:
        remove_below(root, rel)
    except (OSError, StateBackendError) as e:  # a symlink on the way: nothing was created through it
        log.warning("cannot remove the staged dir %s: %s", root.joinpath(*rel), e)
