"""Enabling the backend in a Spark application, and the driver-side restore of a checkpoint location.

`configure(builder_or_conf, ...)` sets what a user would otherwise set by hand (the keys are listed in
the README, so spark-submit users can pass them with --conf instead):

    spark.jars                                       + the shim jar shipped in this package
    spark.sql.streaming.stateStore.providerClass
                                                     dev.statebackend.spark.StateBackendRocksDBStateStoreProvider
    spark.plugins                                    + dev.statebackend.spark.StateBackendPlugin
    spark.sql.streaming.streamingQueryListeners      + dev.statebackend.spark.ProgressSpoolListener
    spark.sql.streaming.checkpointFileManagerClass   dev.statebackend.spark.LocalCheckpointFileManager
                                                     (unless set; see localCheckpointFileManager)
    spark.statebackend.*                             validated (Settings.from_conf) before anything starts

and checks, at once, that the blob store and checkpoint log are reachable, that the jar exists, and
that the running pyspark is the version the shim was built for. It also wraps
DataStreamWriter.start/toTable so that `restore_checkpoint_location` runs before every query starts.

restore_checkpoint_location (the driver's half of "state restored automatically"):
  [1] find the query id: the local `metadata` file, else the locator the committer wrote for this
      checkpoint location (a driver on a new host has no local files, and Spark would invent a new id);
  [2] read the query's latest CheckpointV2 (batch N);
  [3] if the local checkpoint location is missing, behind N, or ahead of N, restore the `_driver`
      snapshot of checkpoint N (metadata, sources, offsets/commits N-1..N, operator metadata and
      schemas) and drop local offsets/commits after N, so Spark resumes with batch N+1. Executors then
      find the state of version N+1 missing and ask their sidecar to restore it from the blob store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Mapping, MutableMapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import CheckpointId, CheckpointV2
from .config import PREFIX, Settings
from .errors import ConfigError, RestoreError, StateBackendError

if TYPE_CHECKING:
    from .blobstore import BlobStore
    from .checkpointlog import CheckpointLog
    from .transfer import TransferPool

log = logging.getLogger(__name__)

PROVIDER_CLASS = "dev.statebackend.spark.StateBackendRocksDBStateStoreProvider"
PLUGIN_CLASS = "dev.statebackend.spark.StateBackendPlugin"
LISTENER_CLASS = "dev.statebackend.spark.ProgressSpoolListener"
CHECKPOINT_FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
CHECKPOINT_FILE_MANAGER_CLASS = "dev.statebackend.spark.LocalCheckpointFileManager"
SUPPORTED_SPARK = "4.3."
JAR_NAME = "spark-statebackend-bridge.jar"


def jar_path() -> Path:
    """The shim jar inside this package (built by `make jar`)."""
    return Path(__file__).parent / "jars" / JAR_NAME


def _append(current: str | None, item: str) -> str:
    items = [x for x in (current or "").split(",") if x]
    if item not in items:
        items.append(item)
    return ",".join(items)


def spark_conf_for(existing: Mapping[str, str], **settings: str) -> dict[str, str]:
    """The spark.conf entries configure() adds to `existing` (a plain mapping of current entries).

    `settings` are spark.statebackend.* keys without the prefix, e.g. blobStore_url -> use the
    dotted form via `**{"blobStore.url": "..."}`."""
    import pyspark

    if not pyspark.__version__.startswith(SUPPORTED_SPARK):
        raise ConfigError(
            "pyspark",
            f"Spark {pyspark.__version__} is not supported by this shim (built for {SUPPORTED_SPARK}x)",
        )
    jar = jar_path()
    if not jar.is_file():
        raise ConfigError("spark.jars", f"the shim jar {jar} is missing; build it with `make jar`")
    out: dict[str, str] = {
        "spark.jars": _append(existing.get("spark.jars"), str(jar)),
        "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASS,
        "spark.plugins": _append(existing.get("spark.plugins"), PLUGIN_CLASS),
        "spark.sql.streaming.streamingQueryListeners": _append(
            existing.get("spark.sql.streaming.streamingQueryListeners"), LISTENER_CLASS
        ),
        PREFIX + "sidecar.mode": existing.get(PREFIX + "sidecar.mode", "process"),
        PREFIX + "sidecar.python": existing.get(PREFIX + "sidecar.python", sys.executable),
    }
    for k, v in settings.items():
        out[PREFIX + k] = str(v)
    merged = {**existing, **out}
    conf = {k: v for k, v in merged.items() if k.startswith(PREFIX)}
    s = Settings.from_conf(conf)  # validates every key; fills URL defaults from the driver's cwd
    out[PREFIX + "blobStore.url"] = s.blob_url
    out[PREFIX + "checkpointLog.url"] = s.log_url
    if s.local_checkpoint_file_manager and s.enabled and not existing.get(CHECKPOINT_FILE_MANAGER_KEY):
        out[CHECKPOINT_FILE_MANAGER_KEY] = CHECKPOINT_FILE_MANAGER_CLASS
    if (
        merged.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "false").lower()
        == "true"
    ):
        raise ConfigError(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
            "changelog checkpointing is not supported by spark-statebackend yet; set it to false",
        )
    return out


def check_services(settings: Settings) -> None:
    """Contact the blob store and the checkpoint log once; errors name the key and the URL."""
    from .blobstore import open_blob_store
    from .checkpointlog import open_checkpoint_log

    store = open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url")
    try:
        store.ensure_ready()
    except StateBackendError as e:
        raise ConfigError(PREFIX + "blobStore.url", f"blob store unusable: {e}") from None
    finally:
        store.close()
    cplog = open_checkpoint_log(settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url")
    try:
        cplog.create_resources()
    except StateBackendError as e:
        raise ConfigError(PREFIX + "checkpointLog.url", f"checkpoint log unusable: {e}") from None
    finally:
        cplog.close()


def configure(builder_or_conf: Any, *, check: bool = True, **settings: str) -> Any:
    """Enable spark-statebackend on a SparkSession.Builder, a SparkConf, or a dict of confs.

    Keyword arguments are spark.statebackend.* keys without the prefix, e.g.
    `configure(builder, **{"blobStore.url": "s3://bucket/state"})`. Returns the same object.
    With `check`, the blob store and the checkpoint log are contacted now, so a bad URL or an
    unreachable service fails here with a message naming the key."""
    existing = _entries(builder_or_conf)
    added = spark_conf_for(existing, **settings)
    for k, v in added.items():
        _set(builder_or_conf, k, v)
    if check:
        check_services(
            Settings.from_conf({k: v for k, v in {**existing, **added}.items() if k.startswith(PREFIX)})
        )
    install_start_hook()
    return builder_or_conf


def _entries(obj: Any) -> dict[str, str]:
    if isinstance(obj, Mapping):
        return {str(k): str(v) for k, v in obj.items()}
    if hasattr(obj, "_options"):  # SparkSession.Builder
        return {str(k): str(v) for k, v in obj._options.items()}
    if hasattr(obj, "getAll"):  # SparkConf
        return {str(k): str(v) for k, v in obj.getAll()}
    raise TypeError(
        f"configure() takes a SparkSession.Builder, a SparkConf or a dict, not {type(obj).__name__}"
    )


def _set(obj: Any, key: str, value: str) -> None:
    if isinstance(obj, MutableMapping):
        obj[key] = value
    elif hasattr(obj, "_options"):
        obj.config(key, value)
    else:
        obj.set(key, value)


# ---------------------------------------------------------------------------------------------------
# driver-side restore


def _local_path(location: str) -> Path:
    if location.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(location).path))
    if "://" in location:
        raise ConfigError(
            "checkpointLocation", f"{location!r}: only local checkpoint locations are supported"
        )
    return Path(location).absolute()


def _latest_commit(root: Path) -> int:
    d = root / "commits"
    if not d.is_dir():
        return -1
    ids = [int(p.name) for p in d.iterdir() if p.name.isdigit()]
    return max(ids, default=-1)


def _read_query_id(root: Path) -> str | None:
    import orjson

    meta = root / "metadata"
    if not meta.is_file():
        return None
    try:
        qid = orjson.loads(meta.read_bytes().splitlines()[0]).get("id")
    except (orjson.JSONDecodeError, IndexError, AttributeError):
        return None
    return qid if isinstance(qid, str) else None


def snapshot_problems(store: BlobStore, pool: TransferPool, checkpoint: CheckpointV2) -> list[str]:
    """Why `checkpoint` cannot be restored from the blob store (empty: it can), each naming the blob.

    The `_driver` snapshot is verified in full (every blob read and checksummed: it is small); every
    store snapshot's SnapshotIndex must load and every file blob it references must exist. Never
    raises for a missing, corrupt or hostile blob: that is reported as a problem."""
    from .commit import BLOBSTORE_BACKEND, DRIVER_STORE
    from .restore import verify_snapshot

    markers = checkpoint.markers(BLOBSTORE_BACKEND)
    driver = markers.get(DRIVER_STORE)
    if driver is None:
        return [f"checkpoint {checkpoint.checkpoint_id} has no {DRIVER_STORE} snapshot"]
    report = verify_snapshot(store, pool, driver)
    problems = [f"{DRIVER_STORE} snapshot {driver}: {p}" for p in report.problems]

    def check_store(key: str, marker: str) -> list[str]:
        from .backup import load_snapshot_index

        try:
            index = load_snapshot_index(store, marker)
            missing = [b for b in index.dir_index.present_blob_ids() if not store.exists(b)]
        except StateBackendError as e:
            return [f"store {key} snapshot {marker}: {e}"]
        return [f"store {key} snapshot {marker}: file blob {b!r} not found" for b in missing]

    stores = sorted((k, m) for k, m in markers.items() if k != DRIVER_STORE)
    for found in pool.run_all([partial(check_store, k, m) for k, m in stores]):
        problems.extend(found)
    return problems


def restore_checkpoint_location(settings: Settings, location: str) -> str:
    """Make the local checkpoint location resume from the latest durable checkpoint (module doc).

    Returns what it did: 'fresh' (no checkpoint anywhere), 'current' (local files match the latest
    checkpoint, or no checkpoint is restorable and Spark's own files are used), or 'restored batch N'.

    Reliability contract: when the latest checkpoint's snapshots are unusable (a SnapshotIndex or
    file blob missing or corrupt: `snapshot_problems`), the retained checkpoints are tried newest
    first; the first usable one is restored, an ERROR names every bad blob, and a copy of it (same
    batch, offsets and markers, a new checkpoint id) is written to the log so the committer and the
    executors' restores continue from it. If none is usable, Spark's own files are used when the
    checkpoint location has them (an ERROR says so); otherwise RestoreError is raised: a query is
    never started from wrong or empty state."""
    from .backup import load_snapshot_index
    from .blobstore import open_blob_store
    from .checkpointlog import open_checkpoint_log
    from .commit import BLOBSTORE_BACKEND, DRIVER_STORE
    from .markers import read_locator
    from .nofollow import DirTree, move_tree_into
    from .restore import RestoreManager
    from .transfer import TransferPool

    root = _local_path(location)
    store = open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url")
    cplog = open_checkpoint_log(settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url")
    try:
        qid = _read_query_id(root) or read_locator(store, str(root), cplog.read_latest)  # [1]
        if qid is None:
            return "fresh"
        latest = cplog.read_latest(qid)  # [2]
        if latest is None:
            return "fresh"
        local = _latest_commit(root)
        if (root / "metadata").is_file() and local == latest.batch_id:
            return "current"
        if latest.marker(BLOBSTORE_BACKEND, DRIVER_STORE) is None:
            log.error(
                "query %s checkpoint %s has no driver snapshot; Spark resumes from its own files",
                qid,
                latest.checkpoint_id,
            )
            return "current"
        scratch = root.parent / f".{root.name}.ssb-driver-restore"
        with TransferPool(settings.workers, name="ssb-driver-restore") as pool:  # [3]
            chosen, rejected = _first_usable(store, pool, cplog, qid, latest)
            if chosen is None:
                if (root / "metadata").is_file() and local >= 0:
                    log.error(
                        "query %s: no retained checkpoint is restorable (%s); Spark resumes from its own "
                        "files in %s (batch %d)",
                        qid,
                        "; ".join(rejected),
                        root,
                        local,
                    )
                    return "current"
                raise RestoreError(
                    f"query {qid}: no retained checkpoint is restorable and {root} has no Spark checkpoint "
                    f"files to fall back to; refusing to start from wrong state: {'; '.join(rejected)}"
                )
            marker = chosen.marker(BLOBSTORE_BACKEND, DRIVER_STORE)
            assert marker is not None  # snapshot_problems rejects a checkpoint without one
            RestoreManager(store, pool).restore(marker, scratch, index=load_snapshot_index(store, marker))
        n = chosen.batch_id
        if chosen is not latest:
            _repoint(cplog, chosen, latest)

        # Nothing below the checkpoint location is followed if it is a symlink (nofollow.py): a
        # planted `offsets -> /elsewhere` would make this write or delete outside it. The move checks
        # every target before it changes anything, so a refusal leaves the location as it was.
        def drop_crc(dir_fd: int, name: str) -> None:
            # Hadoop's checksum of the file we replace would no longer match.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f".{name}.crc", dir_fd=dir_fd)

        try:
            move_tree_into(scratch, root, before_place=drop_crc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        dropped = []
        with DirTree(root) as tree:
            for sub in ("offsets", "commits"):
                fd = tree.dir_fd((sub,), create=False)
                if fd is None:
                    continue
                for name in os.listdir(fd):
                    num = name.lstrip(".").removesuffix(".crc")
                    if num.isdigit() and int(num) > n:
                        os.unlink(name, dir_fd=fd)  # a symlink itself, never its target
                        dropped.append(f"{sub}/{name}")
        log.warning(
            "query %s: checkpoint location %s rebuilt from checkpoint %s (batch %d; local was at %d%s)",
            qid,
            root,
            chosen.checkpoint_id,
            n,
            local,
            f", dropped {', '.join(dropped)}" if dropped else "",
        )
        return f"restored batch {n}"
    finally:
        cplog.close()
        store.close()


def _first_usable(
    store: BlobStore, pool: TransferPool, cplog: CheckpointLog, qid: str, latest: CheckpointV2
) -> tuple[CheckpointV2 | None, list[str]]:
    """The newest restorable checkpoint of `qid` (latest first, then the retained history newest
    first) and, for each one rejected before it, why (logged as an ERROR naming the bad blobs)."""
    rejected: list[str] = []
    problems = snapshot_problems(store, pool, latest)
    if not problems:
        return latest, rejected
    older = [c for c in reversed(cplog.read_history(qid)) if c.checkpoint_id < latest.checkpoint_id]
    for cp in [latest, *older]:
        if cp is not latest:
            problems = snapshot_problems(store, pool, cp)
        if not problems:
            log.error(
                "query %s: falling back to checkpoint %s (batch %d); newer checkpoints are unusable: %s",
                qid,
                cp.checkpoint_id,
                cp.batch_id,
                "; ".join(rejected),
            )
            return cp, rejected
        why = f"checkpoint {cp.checkpoint_id} (batch {cp.batch_id}): {', '.join(problems)}"
        log.error("query %s: %s", qid, why)
        rejected.append(why)
    return None, rejected


def _repoint(cplog: CheckpointLog, chosen: CheckpointV2, latest: CheckpointV2) -> None:
    """Write a copy of `chosen` (new id, after `latest`) so the log's latest is what Spark resumes from:
    the committer then counts its batch as the last committed and diffs against its snapshots, and
    executors find its markers. Re-running after a crash finds the copy usable and does nothing more."""
    copy = CheckpointV2(
        checkpoint_id=CheckpointId.create(chosen.batch_id, after=latest.checkpoint_id),
        query_id=chosen.query_id,
        query_name=chosen.query_name,
        input_offsets=chosen.input_offsets,
        state_checkpoint_markers=chosen.state_checkpoint_markers,
    )
    cplog.acquire_writer(chosen.query_id)
    cplog.write(copy)
    log.error(
        "query %s: checkpoint %s written as a copy of %s (batch %d), replacing the unusable latest %s",
        chosen.query_id,
        copy.checkpoint_id,
        chosen.checkpoint_id,
        chosen.batch_id,
        latest.checkpoint_id,
    )


_HOOKED = False


def install_start_hook() -> None:
    """Run restore_checkpoint_location before DataStreamWriter.start/toTable (idempotent)."""
    global _HOOKED
    if _HOOKED:
        return
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    orig_option, orig_options = DataStreamWriter.option, DataStreamWriter.options
    orig_start, orig_to_table = DataStreamWriter.start, DataStreamWriter.toTable

    def option(self: Any, key: str, value: Any) -> Any:
        if key.lower() == "checkpointlocation":
            self._ssb_checkpoint = str(value)
        return orig_option(self, key, value)

    def options(self: Any, **opts: Any) -> Any:
        for k, v in opts.items():
            if k.lower() == "checkpointlocation":
                self._ssb_checkpoint = str(v)
        return orig_options(self, **opts)

    def before_start(self: Any, query_name: str | None, opts: Mapping[str, Any]) -> None:
        spark = self._spark
        conf = dict(spark.sparkContext.getConf().getAll())
        settings = Settings.from_conf({k: v for k, v in conf.items() if k.startswith(PREFIX)})
        if not settings.enabled:
            return
        location = opts.get("checkpointLocation") or getattr(self, "_ssb_checkpoint", None)
        if location is None:
            default = spark.conf.get("spark.sql.streaming.checkpointLocation", None)
            if default and query_name:
                location = f"{default.rstrip('/')}/{query_name}"
        if location is None:
            log.warning("spark-statebackend: query without a checkpoint location cannot be restored")
            return
        if settings.test_crash_at:  # test only (crashpoints.py): never set in production
            from . import crashpoints

            crashpoints.arm(settings.test_crash_at, process="driver")
        outcome = restore_checkpoint_location(settings, str(location))
        log.info("spark-statebackend: checkpoint location %s: %s", location, outcome)

    def start(
        self: Any,
        path: Any = None,
        format: Any = None,
        outputMode: Any = None,
        partitionBy: Any = None,
        queryName: Any = None,
        **opts: Any,
    ) -> Any:
        before_start(self, queryName or getattr(self, "_ssb_query_name", None), opts)
        return orig_start(self, path, format, outputMode, partitionBy, queryName, **opts)

    def to_table(
        self: Any,
        tableName: str,
        format: Any = None,
        outputMode: Any = None,
        partitionBy: Any = None,
        queryName: Any = None,
        **opts: Any,
    ) -> Any:
        before_start(self, queryName or getattr(self, "_ssb_query_name", None), opts)
        return orig_to_table(self, tableName, format, outputMode, partitionBy, queryName, **opts)

    orig_query_name = DataStreamWriter.queryName

    def query_name(self: Any, name: str) -> Any:
        self._ssb_query_name = name
        return orig_query_name(self, name)

    DataStreamWriter.option = option  # type: ignore[method-assign]
    DataStreamWriter.options = options  # type: ignore[method-assign]
    DataStreamWriter.start = start  # type: ignore[method-assign]
    DataStreamWriter.toTable = to_table  # type: ignore[method-assign]
    DataStreamWriter.queryName = query_name  # type: ignore[method-assign, assignment]
    _HOOKED = True
