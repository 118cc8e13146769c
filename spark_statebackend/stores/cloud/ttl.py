"""TTL tagging of the cloud stores: a blob uploaded with a TTL expires unless a checkpoint's cleanup
removes its tag; the sweep deletes the expired ones.

The expiry time (epoch ms, zero-padded to 16 digits so that string order is time order) is a tag named
`ssb_expires_at_ms` (Azure blob index tags, S3 object tags); `remove_ttl` deletes the tag;
`sweep_expired` lists the prefix and deletes the blobs whose tag is in the past, each only if its tag
still holds the value listed (Azure checks it in the delete request itself, S3 re-reads it just
before). Cloud lifecycle rules work in whole days and need the management plane, so the sweep is ours.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import BlobNotFoundError

if TYPE_CHECKING:
    from .store import CloudBlobStore

log = logging.getLogger("spark_statebackend.blobstore")  # name kept from the flat layout

TTL_TAG = "ssb_expires_at_ms"


def expiry_tag_value(expires_at_ms: int) -> str:
    return f"{expires_at_ms:016d}"


def parse_expiry(tags: Mapping[str, str] | None) -> int | None:
    value = (tags or {}).get(TTL_TAG)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        # Not ours to interpret; a blob with a garbled expiry is kept rather than deleted.
        return None


def expires_at(ttl_seconds: float | None) -> int | None:
    return None if ttl_seconds is None else int((time.time() + ttl_seconds) * 1000)


def remove_ttl(store: CloudBlobStore[Any], blob_id: str) -> None:
    """BlobStore.remove_ttl: the TTL tag deleted, the other tags kept."""
    name = store._name(blob_id)
    tags = store._call(lambda: store._raw_get_tags(name), f"remove TTL of blob {blob_id!r}", blob_id)
    if TTL_TAG in tags:
        rest = {k: v for k, v in tags.items() if k != TTL_TAG}
        store._call(lambda: store._raw_set_tags(name, rest), f"remove TTL of blob {blob_id!r}", blob_id)


def set_ttl(store: CloudBlobStore[Any], blob_id: str, ttl_seconds: float) -> None:
    """BlobStore.set_ttl: the TTL tag written (expiry now + ttl_seconds), the other tags kept."""
    name = store._name(blob_id)
    what = f"set TTL of blob {blob_id!r}"
    tags = store._call(lambda: store._raw_get_tags(name), what, blob_id)
    tags[TTL_TAG] = expiry_tag_value(int((time.time() + ttl_seconds) * 1000))
    store._call(lambda: store._raw_set_tags(name, tags), what, blob_id)


def sweep_expired(
    store: CloudBlobStore[Any], now_ms: int | None = None, keep: Callable[[str], bool] | None = None
) -> int:
    """BlobStore.sweep_expired: every blob whose TTL tag is in the past, spared by `keep`, deleted only if
    its tag still holds the value listed."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    removed = 0
    for name, tags in _tagged(store, store._pages("")):
        blob_id = name[len(store.prefix) :]
        expiry = parse_expiry(tags)
        if expiry is None or expiry > now or (keep is not None and keep(blob_id)):
            continue
        value = tags[TTL_TAG]
        if store._call(
            lambda n=name, v=value: store._raw_delete_if_expired(n, v),  # type: ignore[misc]
            f"sweep: delete expired blob {blob_id!r}",
        ):
            log.info("swept expired blob %r (expired at %d)", blob_id, expiry)
            removed += 1
        else:
            log.info("sweep kept blob %r: its TTL changed since it was listed", blob_id)
    return removed


def _tagged(
    store: CloudBlobStore[Any], listing: Iterator[tuple[str, int, int, dict[str, str] | None]]
) -> Iterator[tuple[str, dict[str, str]]]:
    """(name, tags) for every listed blob; tags the listing lacked are read on the pool, one batch
    of at most 4 * max_concurrency at a time. A blob deleted meanwhile is skipped."""

    def read(name: str) -> dict[str, str] | None:
        blob_id = name[len(store.prefix) :]
        try:
            return store._call(
                lambda: store._raw_get_tags(name), f"sweep: read TTL of {blob_id!r}", blob_id
            )
        except BlobNotFoundError:
            return None

    batch: list[str] = []
    for name, _size, _modified, tags in listing:
        if tags is not None:
            yield name, tags
            continue
        batch.append(name)
        if len(batch) >= 4 * store.settings.max_concurrency:
            yield from (
                (n, t) for n, t in zip(batch, store.pool.map(read, batch), strict=True) if t is not None
            )
            batch = []
    yield from ((n, t) for n, t in zip(batch, store.pool.map(read, batch), strict=True) if t is not None)
