"""Enabling the backend in a Spark application, and the driver-side restore of a checkpoint location.

A Spark job needs only conf keys (README "Using it"): the jar on `spark.jars`, the plugin on
`spark.plugins` and the `spark.statebackend.*` keys. The plugin (jvm-bridge StateBackendPlugin)
validates them at application start and installs the hooks; users keep Spark's own
RocksDBStateStoreProvider. `configure(builder_or_conf, ...)` is the PySpark convenience that sets
those keys (like delta-spark's `configure_spark_with_delta_pip`):

    spark.jars                                       + the shim jar shipped in this package
    spark.plugins                                    + dev.statebackend.spark.StateBackendPlugin
    spark.statebackend.sidecar.python                this Python (unless set)
    spark.statebackend.*                             validated (Settings.from_conf) before anything starts

and checks at once that the blob store and checkpoint log are reachable, that the jar exists, and
that the running pyspark is one the shim supports.

restore_checkpoint_location (the driver's half of "state restored automatically"; the JVM asks the
driver's sidecar to run it when a query starts on a checkpoint location, see jvm-bridge DriverHooks):
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
import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Mapping, MutableMapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoints.checkpoint import CheckpointId, CheckpointV2
from ..errors import ConfigError, RestoreError, StateBackendError
from .compat import check_pyspark_version
from .config import PREFIX, Settings

if TYPE_CHECKING:
    from ..checkpoints.logs import CheckpointLog
    from ..engine.transfer import TransferPool
    from ..stores import BlobStore

log = logging.getLogger("spark_statebackend.spark")  # name kept from the flat layout

PLUGIN_CLASS = "dev.statebackend.spark.StateBackendPlugin"
JAR_NAME = "spark-statebackend-bridge.jar"


def jar_path() -> Path:
    """The shim jar inside this package (built by `make jar`)."""
    return Path(__file__).parent.parent / "jars" / JAR_NAME


def _append(current: str | None, item: str) -> str:
    items = [x for x in (current or "").split(",") if x]
    if item not in items:
        items.append(item)
    return ",".join(items)


def spark_conf_for(existing: Mapping[str, str], **settings: str) -> dict[str, str]:
    """The spark.conf entries configure() adds to `existing` (a plain mapping of current entries).

    `settings` are spark.statebackend.* keys without the prefix, e.g. blobStore_url -> use the
    dotted form via `**{"blobStore.url": "..."}`."""
    check_pyspark_version()
    jar = jar_path()
    if not jar.is_file():
        raise ConfigError(
            "spark.jars",
            f"the shim jar {jar} is missing; build it with `make jar` (a wheel built by pip carries it)",
        )
    out: dict[str, str] = {
        "spark.jars": _append(existing.get("spark.jars"), str(jar)),
        "spark.plugins": _append(existing.get("spark.plugins"), PLUGIN_CLASS),
        PREFIX + "sidecar.python": existing.get(PREFIX + "sidecar.python", sys.executable),
    }
    for k, v in settings.items():
        out[PREFIX + k] = str(v)
    merged = {**existing, **out}
    conf = {k: v for k, v in merged.items() if k.startswith(PREFIX)}
    s = Settings.from_conf(conf)  # validates every key; fills URL defaults from the driver's cwd
    out[PREFIX + "blobStore.url"] = s.blob_url
    out[PREFIX + "checkpointLog.url"] = s.log_url
    return out


def check_services(settings: Settings) -> None:
    """Contact the blob store and the checkpoint log once; errors name the key and the URL."""
    from ..checkpoints.logs import open_checkpoint_log
    from ..stores import open_blob_store

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


def _store_dir_parts(key: str) -> tuple[str, ...]:
    """`state/<op>/<part>[/<store>]` of store instance key `<op>/<part>/<store>`, as path parts (Spark
    omits the default store's name). Raises ValueError for a key that is not one of Spark's."""
    from ..checkpoints.checkpoint import StoreInstance
    from ..engine.index import check_name

    inst = StoreInstance.parse(key)
    parts = ("state", str(inst.operator), str(inst.partition))
    if inst.store_name == "default":
        return parts
    return (*parts, check_name(inst.store_name, what="store name"))


def _latest_commit(root: Path) -> int:
    d = root / "commits"
    if not d.is_dir():
        return -1
    ids = [int(p.name) for p in d.iterdir() if p.name.isdigit()]
    return max(ids, default=-1)


def _shuffle_partitions(root: Path, batch: int) -> str | None:
    """`spark.sql.shuffle.partitions` as Spark recorded it in `offsets/<batch>` (its second line is the
    batch's metadata JSON), or None if that file is missing or unreadable."""
    import orjson

    try:
        lines = (root / "offsets" / str(batch)).read_bytes().splitlines()
        value = orjson.loads(lines[1])["conf"]["spark.sql.shuffle.partitions"]
    except (OSError, IndexError, KeyError, TypeError, orjson.JSONDecodeError):
        return None
    return str(value)


def _uncheckpointed_repartition(root: Path, durable: int, local: int) -> int | None:
    """The first batch after `durable` and up to `local` that Spark committed in `root` with other shuffle
    partitions than the batch before it: an offline state repartition (the only way they change on a
    checkpoint) that no checkpoint holds. None if there is none."""
    for batch in range(max(durable, 0) + 1, local + 1):
        if not (root / "commits" / str(batch)).is_file():
            continue
        before, now = _shuffle_partitions(root, batch - 1), _shuffle_partitions(root, batch)
        if before is not None and now is not None and before != now:
            return batch
    return None


def read_query_id(root: Path) -> str | None:
    """The query id in Spark's `<root>/metadata` file, or None if it is absent or unreadable."""
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
    from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
    from ..engine.restore import verify_snapshot

    markers = checkpoint.markers(BLOBSTORE_BACKEND)
    driver = markers.get(DRIVER_STORE)
    if driver is None:
        return [f"checkpoint {checkpoint.checkpoint_id} has no {DRIVER_STORE} snapshot"]
    report = verify_snapshot(store, pool, driver)
    problems = [f"{DRIVER_STORE} snapshot {driver}: {p}" for p in report.problems]

    def check_store(key: str, marker: str) -> list[str]:
        from ..engine.backup import load_snapshot_index

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


def restore_checkpoint_location(
    settings: Settings,
    location: str,
    *,
    mode: str = "start",
    store: BlobStore | None = None,
    checkpoint_log: CheckpointLog | None = None,
) -> str:
    """Make the local checkpoint location resume from the latest durable checkpoint (module doc).

    Returns what it did: 'fresh' (no checkpoint anywhere), 'current' (local files match the latest
    checkpoint, or no checkpoint is restorable and Spark's own files are used), or 'restored batch N'.
    `mode` "read" (a reader that is not a query: the state data source, offline repartition) leaves a
    location that has its `metadata` file as it is ('current'). `store` and `checkpoint_log`, when
    given, are used (and left open) instead of opening the configured ones.

    Reliability contract: when the latest checkpoint's snapshots are unusable (a SnapshotIndex or
    file blob missing or corrupt: `snapshot_problems`), the retained checkpoints are tried newest
    first; the first usable one is restored, an ERROR names every bad blob, and a copy of it (same
    batch, offsets and markers, a new checkpoint id) is written to the log so the committer and the
    executors' restores continue from it. If none is usable, Spark's own files are used when the
    checkpoint location has them (an ERROR says so); otherwise RestoreError is raised: a query is
    never started from wrong or empty state."""
    from ..checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
    from ..checkpoints.logs import open_checkpoint_log
    from ..checkpoints.reports import read_locator
    from ..common.nofollow import DirTree, move_tree_into
    from ..engine.backup import load_snapshot_index
    from ..engine.restore import RestoreManager
    from ..engine.transfer import TransferPool
    from ..stores import open_blob_store

    root = _local_path(location)
    if mode not in ("start", "read"):
        raise ValueError(f"mode {mode!r} is not 'start' or 'read'")
    if mode == "read" and (root / "metadata").is_file():
        return "current"
    owned = store is None, checkpoint_log is None
    if store is None:
        store = open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url")
    cplog = checkpoint_log or open_checkpoint_log(
        settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url"
    )
    try:
        qid = read_query_id(root) or read_locator(store, str(root), cplog.read_latest)  # [1]
        if qid is None:
            return "fresh"
        latest = cplog.read_latest(qid)  # [2]
        if latest is None:
            return "fresh"
        local = _latest_commit(root)
        if (root / "metadata").is_file() and local == latest.batch_id:
            return "current"
        repartitioned = _uncheckpointed_repartition(root, latest.batch_id, local)
        if (root / "metadata").is_file() and repartitioned is not None:
            # Rolling back to the latest checkpoint would silently undo the repartition: Spark's own
            # files, which hold it, are kept, and the committer starts the new partitioning with the
            # next checkpoint (Committer._partitioning_changed).
            log.warning(
                "query %s: checkpoint location %s was repartitioned offline at batch %d, after its latest "
                "durable checkpoint (batch %d), and that batch was never checkpointed (the application "
                "ended first, or ran without spark-statebackend); Spark resumes from its own files (batch "
                "%d) so the repartition is not undone",
                qid,
                root,
                repartitioned,
                latest.batch_id,
                local,
            )
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
            # Every store dir of the checkpoint, empty until its executor restores it: Spark's readers
            # find a stateful operator's partitions by listing state/<op>/ on the driver.
            for key in chosen.markers(BLOBSTORE_BACKEND):
                if key != DRIVER_STORE:
                    try:
                        tree.dir_fd(_store_dir_parts(key), create=True)
                    except ValueError as e:  # a key no Spark store has: data, never a path
                        log.error("query %s checkpoint %s: key %r: %s", qid, chosen.checkpoint_id, key, e)
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
        if owned[1]:
            cplog.close()
        if owned[0]:
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
    # Never across an offline repartition: an older partitioning must not come back.
    epoch = latest.repartitioned_at_batch
    history = [c for c in reversed(cplog.read_history(qid)) if c.checkpoint_id < latest.checkpoint_id]
    older = [c for c in history if c.repartitioned_at_batch == epoch]
    excluded = len(history) - len(older)
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
    if excluded:
        # Say why the retained ones were not tried: an operator would otherwise expect a fallback.
        why = (
            f"{excluded} older retained checkpoint(s) predate the offline state repartition at batch "
            f"{epoch} and are never restored (their partitioning is gone)"
        )
        log.error("query %s: %s", qid, why)
        rejected.append(why)
    return None, rejected


def _repoint(cplog: CheckpointLog, chosen: CheckpointV2, latest: CheckpointV2) -> None:
    """Write a copy of `chosen` (new id, after `latest`) so the log's latest is what Spark resumes from:
    the committer then counts its batch as the last committed and diffs against its snapshots, and
    executors find its markers. Re-running after a crash finds the copy usable and does nothing more."""
    copy = dataclasses.replace(
        chosen, checkpoint_id=CheckpointId.create(chosen.batch_id, after=latest.checkpoint_id)
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
