"""What the shim does at a commit, for tests that drive a real sidecar's upload loop: hard-link (here:
write) a version's recipe into the staging dir and publish its snapshot event in the spool."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson

from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar

from .trees import make_tree


def stage_version(
    sidecar: Sidecar,
    root: Path,
    query_id: str,
    partition: int,
    version: int,
    *,
    staged_at_ms: int | None = None,
    snapshot: int | None = None,
    upgrade: bool = False,
    request_id: str | None = None,
) -> Path:
    """Stage `version` of store 0/`partition`/default of the checkpoint `root` (`snapshot`: that
    snapshot's zip and the changelogs after it; None: `<version>.zip` alone) and publish its event
    (`request_id`: the committing task waits for the upload, durableCommit); returns the staged dir."""
    start = version if snapshot is None else snapshot
    changelogs = list(range(start + 1, version + 1))
    files = {f"{start}.zip": b"zip %d of %d" % (start, partition)}
    files.update({f"{v}.changelog": b"log %d of %d" % (v, partition) for v in changelogs})
    staging = root / "_statebackend/staging/app/0" / str(partition) / "default"
    staged = make_tree(staging / f"{version}-{uuid.uuid4().hex[:8]}", files)
    doc = {
        "schema_version": sp.SCHEMA_VERSION,
        "type": "snapshot",
        "query_id": query_id,
        "batch_id": version - 1,
        "checkpoint_root": str(root),
        "dfs_dir": str(root / "state" / "0" / str(partition)),
        "operator": 0,
        "partition": partition,
        "store": "default",
        "version": version,
        "spark_unique_id": None,
        "staged_dir": str(staged),
        "files": sorted(files),
        "executor_id": "driver",
        "created_at_ms": int(time.time() * 1000) if staged_at_ms is None else staged_at_ms,
        "stage_nanos": 1,
        "snapshot_version": snapshot,
        "changelog_versions": changelogs,
        "upgrade": upgrade,
        **({"request_id": request_id} if request_id is not None else {}),
    }
    name = f"{time.time_ns():020d}-{uuid.uuid4()}.json"
    (sidecar.spool.events_dir / name).write_bytes(orjson.dumps(doc))
    return staged
