"""Export into a checkpoint location on any Hadoop file system (`s3a://`, `abfss://`, `hdfs://`, ...),
through the JVM's Hadoop FileSystem of a running SparkSession: export.py's steps on a local copy.

  [H1] Spark's files the export decides by are copied down into a local scratch dir: `metadata`, the
       newest `commits/` entry L and `offsets/` entries L and L+1 (what Spark resumes from).
  [H2] `export_state` runs on the scratch dir ([X1]-[X5]): the state of version L+1 of every store,
       checksum-verified, and any driver file the location lacks (a new location: all of them).
  [H3] a store dir of the location holding state files is refused, naming it, unless `force`;
       then every file of the scratch dir the location lacks (and, with `force`, the stores' files)
       is copied up, `commits/` last, so a copy cut short never leaves a commit without its state or
       offsets. A file Spark has in the location is never replaced (its `offsets/`, `commits/`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..checkpoints.checkpoint import StoreInstance
from ..settings import PREFIX, Settings
from .export import ExportError, ExportResult, export_state


def export_to_hadoop(
    spark: Any, location: str, *, query_id: str | None = None, force: bool = False, **settings: str
) -> ExportResult:
    """Write the query's state into the checkpoint `location` (any Hadoop file system URI the session's
    Hadoop configuration reaches) in Spark's own layout, so the query runs on without the backend
    (module doc, [H1]-[H3]; export.py for what is written and why).

    `settings`: the backend's settings as `configure()` takes them (`**{"blobStore.url": ...,
    "checkpointLog.url": ...}`), read from the session's conf (spark.statebackend.*) when not given.
    Raises ExportError (export.py) naming the query, store, version and blob, or the store dirs that
    already hold files."""
    conf = {k: v for k, v in spark.sparkContext.getConf().getAll() if k.startswith(PREFIX)}
    conf.update({PREFIX + k: v for k, v in settings.items()})
    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(location)
    fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
    with tempfile.TemporaryDirectory(prefix="ssb-export-") as tmp:
        local = Path(tmp) / "location"
        local.mkdir(mode=0o700)
        _copy_down(jvm, fs, root, local)  # [H1]
        result = export_state(Settings.from_conf(conf), str(local), query_id=query_id, force=True)  # [H2]
        _copy_up(jvm, fs, root, local, result, force)  # [H3]
    return result


def _child(jvm: Any, root: Any, rel: str) -> Any:
    return jvm.org.apache.hadoop.fs.Path(root, rel)


def _entries(fs: Any, root: Any, jvm: Any, sub: str) -> list[int]:
    """The batch ids in `<root>/<sub>/` (Spark's offsets or commits), ascending."""
    d = _child(jvm, root, sub)
    if not fs.exists(d):
        return []
    return sorted(int(s.getPath().getName()) for s in fs.listStatus(d) if s.getPath().getName().isdigit())


def _copy_down(jvm: Any, fs: Any, root: Any, local: Path) -> None:
    """[H1]: the location's `metadata` and the newest commit's entries into `local`."""
    wanted = ["metadata"]
    commits = _entries(fs, root, jvm, "commits")
    if commits:
        last = commits[-1]
        wanted += [f"commits/{last}", f"offsets/{last}"]
        if last + 1 in _entries(fs, root, jvm, "offsets"):
            wanted.append(f"offsets/{last + 1}")
    for rel in wanted:
        src = _child(jvm, root, rel)
        if fs.exists(src):
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            fs.copyToLocalFile(False, src, jvm.org.apache.hadoop.fs.Path(str(local / rel)), True)


def _copy_up(jvm: Any, fs: Any, root: Any, local: Path, result: ExportResult, force: bool) -> None:
    """[H3]: the stores' files, and every other file the location lacks; `commits/` last."""
    store_dirs = ["/".join(StoreInstance.parse(s.key).dir_parts()) for s in result.stores]
    busy = [d for d in store_dirs if _holds_state(fs, _child(jvm, root, d))]
    if busy and not force:
        raise ExportError(
            f"query {result.query_id}: {len(busy)} store dir(s) of {root} already hold files "
            f"({', '.join(busy[:5])}); pass force=True to write over their files"
        )
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda rel: rel.startswith("commits/"))
    for rel in files:
        in_store = any(rel.startswith(d + "/") and "/_" not in rel[len(d) :] for d in store_dirs)
        dst = _child(jvm, root, rel)
        if in_store or not fs.exists(dst):
            fs.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(str(local / rel)), dst)


def _holds_state(fs: Any, d: Any) -> bool:
    """Whether a store dir holds state files (entries named `_*` are Spark's driver files)."""
    return bool(fs.exists(d)) and any(not s.getPath().getName().startswith("_") for s in fs.listStatus(d))
