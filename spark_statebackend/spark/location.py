"""A query's checkpoint location as Spark writes it: what the driver side reads and snapshots.

Spark's files: `metadata` (the query id), `sources/`, `offsets/<batch>` (its second line holds the
batch's conf, with `spark.sql.shuffle.partitions`), `commits/<batch>`, and under `state/<op>/` the
operator metadata (`_metadata/`, state schemas) beside each store's dir `<part>[/<store>]`. Ours, under
`_statebackend/`: the JVM's `staging/` (stagingDir's default), the committer's `driver-staging/`, the
sidecar's `restore/` scratch dirs.

What the committer snapshots as the `_driver` store (`stage_driver_files`, runtime/committer.py),
what the driver-side restore rebuilds ([D3]-[D5] in spark/__init__.py), and how a checkpoint root is
tied to its query (`find_query_id`, [D2]).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import orjson

from ..checkpoints.checkpoint import CheckpointV2, StoreInstance
from ..checkpoints.locators import read_locator
from ..engine.index import check_name
from ..errors import ConfigError
from ..stores import BlobStore


def local_path(location: str) -> Path:
    """The local directory of a checkpoint location (a path or a `file:` URL); ConfigError for any
    other scheme: only local checkpoint locations are supported."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    if "://" in location:
        raise ConfigError(
            "checkpointLocation", f"{location!r}: only local checkpoint locations are supported"
        )
    return Path(location).absolute()


def store_dir_parts(key: str) -> tuple[str, ...]:
    """`state/<op>/<part>[/<store>]` of store instance key `<op>/<part>/<store>`, as path parts (Spark
    omits the default store's name). Raises ValueError for a key that is not one of Spark's."""
    inst = StoreInstance.parse(key)
    parts = ("state", str(inst.operator), str(inst.partition))
    if inst.store_name == "default":
        return parts
    return (*parts, check_name(inst.store_name, what="store name"))


def latest_commit(root: Path) -> int:
    """The newest batch id in `<root>/commits/`, -1 if none."""
    d = root / "commits"
    if not d.is_dir():
        return -1
    ids = [int(p.name) for p in d.iterdir() if p.name.isdigit()]
    return max(ids, default=-1)


def shuffle_partitions(root: Path, batch: int) -> str | None:
    """`spark.sql.shuffle.partitions` as Spark recorded it in `offsets/<batch>` (its second line is the
    batch's metadata JSON), or None if that file is missing or unreadable."""
    try:
        lines = (root / "offsets" / str(batch)).read_bytes().splitlines()
        value = orjson.loads(lines[1])["conf"]["spark.sql.shuffle.partitions"]
    except (OSError, IndexError, KeyError, TypeError, orjson.JSONDecodeError):
        return None
    return str(value)


def uncheckpointed_repartition(root: Path, durable: int, local: int) -> int | None:
    """The first batch after `durable` and up to `local` that Spark committed in `root` with other shuffle
    partitions than the batch before it: an offline state repartition (the only way they change on a
    checkpoint) that no checkpoint holds. None if there is none."""
    for batch in range(max(durable, 0) + 1, local + 1):
        if not (root / "commits" / str(batch)).is_file():
            continue
        before, now = shuffle_partitions(root, batch - 1), shuffle_partitions(root, batch)
        if before is not None and now is not None and before != now:
            return batch
    return None


def read_query_id(root: Path) -> str | None:
    """The query id in Spark's `<root>/metadata` file, or None if it is absent or unreadable."""
    meta = root / "metadata"
    if not meta.is_file():
        return None
    try:
        qid = orjson.loads(meta.read_bytes().splitlines()[0]).get("id")
    except (orjson.JSONDecodeError, IndexError, AttributeError):
        return None
    return qid if isinstance(qid, str) else None


def find_query_id(
    root: Path, store: BlobStore, read_latest: Callable[[str], CheckpointV2 | None]
) -> str | None:
    """The query a checkpoint root belongs to: Spark's `metadata` file there (on the driver's host),
    else the locator the committer wrote to the blob store (`read_latest` reads a query's latest
    checkpoint from the log); None if neither knows it."""
    return read_query_id(root) or read_locator(store, str(root), read_latest)


def stage_driver_files(checkpoint_root: Path, batch_id: int, into: Path) -> int:
    """Hard-link (or copy) the driver-side files a restart needs for batch `batch_id` into `into`.

    Taken: `metadata`, `sources/**`, `offsets/{N-1,N}`, `commits/{N-1,N}` (Spark reads the
    second-latest offsets at restart), and under `state/` every path with a component starting with
    '_' (operator metadata, state schemas). Store data (zips, SSTs, changelogs) is not: executors
    back it up per store instance. Returns the number of files staged."""
    count = 0

    def take(src: Path) -> None:
        nonlocal count
        rel = src.relative_to(checkpoint_root)
        dst = into / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        count += 1

    meta = checkpoint_root / "metadata"
    if meta.is_file():
        take(meta)
    for sub in ("sources",):
        base = checkpoint_root / sub
        if base.is_dir():
            for p in sorted(base.rglob("*")):
                if p.is_file():
                    take(p)
    for sub in ("offsets", "commits"):
        for n in (batch_id - 1, batch_id):
            p = checkpoint_root / sub / str(n)
            if n >= 0 and p.is_file():
                take(p)
    state = checkpoint_root / "state"
    if state.is_dir():
        for p in sorted(state.rglob("*")):
            rel_parts = p.relative_to(state).parts
            if p.is_file() and any(part.startswith("_") for part in rel_parts[:-1]):
                take(p)
    return count


def state_instances(checkpoint_root: Path, batch_id: int) -> int:
    """How many state store instances commit version batch_id+1 of the query at `checkpoint_root`:
    for every stateful operator (`state/<op>/`), the store names its newest operator metadata lists
    (v2 `_metadata/v2/<batch>`, else v1 `_metadata/metadata`), times the batch's shuffle partitions
    (`spark.sql.shuffle.partitions` in `offsets/<batch_id>`, which offline repartition rewrites).
    Raises ValueError naming the file when one is missing or malformed."""
    offsets = checkpoint_root / "offsets" / str(batch_id)
    lines = offsets.read_bytes().splitlines()
    if len(lines) < 2:
        raise ValueError(f"{offsets}: no metadata line")
    partitions = int(orjson.loads(lines[1])["conf"]["spark.sql.shuffle.partitions"])
    total = 0
    state = checkpoint_root / "state"
    for op in sorted(p for p in state.iterdir() if p.name.isdigit()) if state.is_dir() else []:
        meta_dir = op / "_metadata"
        v2 = meta_dir / "v2"
        batches = [p for p in v2.iterdir() if p.name.isdigit()] if v2.is_dir() else []
        meta = max(batches, key=lambda p: int(p.name)) if batches else meta_dir / "metadata"
        body = meta.read_bytes().split(b"\n", 1)
        if len(body) < 2:
            raise ValueError(f"{meta}: no operator metadata")
        stores = {str(info["storeName"]) for info in orjson.loads(body[1])["stateStoreInfo"]}
        if not stores:
            raise ValueError(f"{meta}: lists no state store")
        total += len(stores) * partitions
    return total


def driver_staging_dir(checkpoint_root: Path) -> Path:
    """A directory on the checkpoint location's filesystem (hard links need one)."""
    d = checkpoint_root / "_statebackend" / "driver-staging"
    d.mkdir(parents=True, exist_ok=True)
    return d
