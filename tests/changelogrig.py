"""Changelog checkpointing in demo_app runs: the Spark conf that turns it on with frequent snapshots
(`CHANGELOG`), and what the latest checkpoint of such a query must hold (`assert_backed_up_in_changelog_mode`:
each store's recipe is exactly Spark's files for its version).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

import orjson

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE, CheckpointV2
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.checksum import local_file_checksum
from spark_statebackend.engine.index import SnapshotIndex
from spark_statebackend.stores import open_blob_store

from .demorig import query_id_of

CHANGELOG = {
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.maintenanceInterval": "100ms",
}


VERSION_FILE = re.compile(r"(\d+)(?:_([0-9A-Za-z-]+))?\.(zip|changelog)")


def conf_args(flag: str, conf: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(a for k, v in conf.items() for a in (flag, f"{k}={v}"))


def latest_checkpoint(work: Path) -> CheckpointV2:
    cp = open_checkpoint_log((work / "log").as_uri()).read_latest(query_id_of(work))
    assert cp is not None, "no checkpoint"
    return cp


def store_dir(work: Path, key: str) -> Path:
    op, part, name = key.split("/", 2)
    d = work / "ckpt" / "state" / op / part
    return d if name == "default" else d / name


def referenced_files(zip_path: Path) -> set[str]:
    """What Spark's `metadata` inside a snapshot zip references, relative to the store dir."""
    with zipfile.ZipFile(zip_path) as zf:
        version_line, _, body = zf.read("metadata").decode().partition("\n")
    assert version_line == "v1", zip_path
    meta = orjson.loads(body)
    return {f"SSTs/{f['dfsSstFileName']}" for f in meta.get("sstFiles", [])} | {
        f"logs/{f['dfsLogFileName']}" for f in meta.get("logFiles", [])
    }


def assert_recipe_is_sparks_files(index: SnapshotIndex, spark_dir: Path, fmt: int) -> None:
    """The files a store's SnapshotIndex holds are exactly what Spark needs to load its version from
    its own checkpoint dir: the snapshot zip of `snapshot_version` and what its metadata references,
    the changelogs `snapshot_version+1..version` (format v2: the ones named by the version's lineage,
    ending with the version's own id), the `.crc` of each where Spark wrote one; each byte-identical
    to Spark's file."""
    md = index.metadata
    files = dict(index.dir_index.walk_files())
    parsed = {n: VERSION_FILE.fullmatch(n) for n in files}
    zips = {n: m for n, m in parsed.items() if m and m.group(3) == "zip"}
    logs = {n: m for n, m in parsed.items() if m and m.group(3) == "changelog"}
    assert all((m.group(2) is not None) == (fmt == 2) for m in [*zips.values(), *logs.values()]), sorted(
        files
    )
    assert md.snapshot_version is not None and md.version is not None
    assert list(md.changelog_versions) == list(range(md.snapshot_version + 1, md.version + 1)), md
    assert sorted(int(m.group(1)) for m in logs.values()) == list(md.changelog_versions), sorted(files)
    if fmt == 2:
        own = f"{md.version}_{md.spark_unique_id}.changelog"
        assert own in logs, (own, sorted(files))
    expected = set(logs)
    if md.snapshot_version > 0:
        assert [int(m.group(1)) for m in zips.values()] == [md.snapshot_version], sorted(files)
        (zip_name,) = zips
        expected |= {zip_name} | referenced_files(spark_dir / zip_name)
    else:
        assert not zips, sorted(files)
    expected |= {f"{n}.crc" for n in set(zips) | set(logs) if (spark_dir / f"{n}.crc").exists()}
    assert set(files) == expected, (sorted(files), sorted(expected))
    for rel, f in files.items():
        local = spark_dir / rel
        layout = [(b.offset, b.size) for b in f.blobs]
        assert local.stat().st_size == f.metadata.size, rel
        assert local_file_checksum(local, layout) == f.checksum, f"{rel} differs from Spark's file"


def assert_backed_up_in_changelog_mode(work: Path, *, fmt: int = 1, replays: bool = True) -> CheckpointV2:
    """Every store's SnapshotIndex (schema 2) in the latest checkpoint records the recipe of the
    checkpointed version and holds exactly Spark's files for it. `replays`: each recipe replays
    changelogs, and the checkpoint says so (False: a store may also restore from a snapshot of the
    version itself, which Spark publishes after some commits, so this depends on where a run stops)."""
    cp = latest_checkpoint(work)
    assert cp.changelog_checkpointing or not replays, cp
    store = open_blob_store((work / "blobs").as_uri())
    markers = {k: m for k, m in cp.markers(BLOBSTORE_BACKEND).items() if k != DRIVER_STORE}
    assert markers, cp
    for key, marker in sorted(markers.items()):
        index = load_snapshot_index(store, marker)
        md = index.metadata
        assert index.schema_version == 2
        assert md.version == cp.batch_id + 1, (key, md)
        assert md.changelog_versions or not replays, f"store {key}: no changelog recorded: {md}"
        assert (md.spark_unique_id is not None) == (fmt == 2), (key, md)
        assert_recipe_is_sparks_files(index, store_dir(work, key), fmt)
    return cp
