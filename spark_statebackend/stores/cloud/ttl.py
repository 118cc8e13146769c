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

from ...errors import BlobNotFoundError
from .calls import Calls
from .options import CloudSettings
from .pool import IoPool

log = logging.getLogger("spark_statebackend.blobstore")  # name kept from the flat layout

TTL_TAG = "ssb_expires_at_ms"

#: One listed blob: (name, size, modified ms, tags or None if the listing did not carry them).
Listed = tuple[str, int, int, dict[str, str] | None]


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


class TtlKeeper:
    """BlobStore.remove_ttl, set_ttl and sweep_expired for a cloud store, over its tag primitives (the
    CloudBlobStore._raw_* of the same names: get_tags, set_tags, delete_if_expired), each run through
    `calls`."""

    def __init__(
        self,
        *,
        calls: Calls,
        io: IoPool,
        settings: CloudSettings,
        prefix: str,
        listing: Callable[[str], Iterator[Listed]],
        get_tags: Callable[[str], dict[str, str]],
        set_tags: Callable[[str, dict[str, str]], None],
        delete_if_expired: Callable[[str, str], bool],
    ) -> None:
        """`prefix` is the store's name prefix (a blob id is a name without it); `listing(blob id
        prefix)` lists the store's blobs, already retried."""
        self._calls = calls
        self._io = io
        self._batch = 4 * settings.max_concurrency
        self._prefix = prefix
        self._listing = listing
        self._get_tags = get_tags
        self._set_tags = set_tags
        self._delete_if_expired = delete_if_expired

    def remove_ttl(self, blob_id: str, name: str) -> None:
        """BlobStore.remove_ttl of `blob_id`, stored as `name`: the TTL tag deleted, the other tags kept."""
        what = f"remove TTL of blob {blob_id!r}"
        tags = self._calls.call(lambda: self._get_tags(name), what, blob_id)
        if TTL_TAG in tags:
            rest = {k: v for k, v in tags.items() if k != TTL_TAG}
            self._calls.call(lambda: self._set_tags(name, rest), what, blob_id)

    def set_ttl(self, blob_id: str, name: str, ttl_seconds: float) -> None:
        """BlobStore.set_ttl of `blob_id`, stored as `name`: the TTL tag written (expiry now +
        ttl_seconds), the other tags kept."""
        what = f"set TTL of blob {blob_id!r}"
        tags = self._calls.call(lambda: self._get_tags(name), what, blob_id)
        tags[TTL_TAG] = expiry_tag_value(int((time.time() + ttl_seconds) * 1000))
        self._calls.call(lambda: self._set_tags(name, tags), what, blob_id)

    def sweep_expired(self, now_ms: int | None = None, keep: Callable[[str], bool] | None = None) -> int:
        """BlobStore.sweep_expired: every blob whose TTL tag is in the past, spared by `keep`, deleted
        only if its tag still holds the value listed."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed = 0
        for name, tags in self._tagged(self._listing("")):
            blob_id = name[len(self._prefix) :]
            expiry = parse_expiry(tags)
            if expiry is None or expiry > now or (keep is not None and keep(blob_id)):
                continue
            value = tags[TTL_TAG]
            if self._calls.call(
                lambda n=name, v=value: self._delete_if_expired(n, v),  # type: ignore[misc]
                f"sweep: delete expired blob {blob_id!r}",
            ):
                log.info("swept expired blob %r (expired at %d)", blob_id, expiry)
                removed += 1
            else:
                log.info("sweep kept blob %r: its TTL changed since it was listed", blob_id)
        return removed

    def _tagged(self, listing: Iterator[Listed]) -> Iterator[tuple[str, dict[str, str]]]:
        """(name, tags) for every listed blob; tags the listing lacked are read on the pool, one batch
        of at most 4 * max_concurrency at a time. A blob deleted meanwhile is skipped."""

        def read(name: str) -> dict[str, str] | None:
            blob_id = name[len(self._prefix) :]
            try:
                return self._calls.call(
                    lambda: self._get_tags(name), f"sweep: read TTL of {blob_id!r}", blob_id
                )
            except BlobNotFoundError:
                return None

        batch: list[str] = []
        for name, _size, _modified, tags in listing:
            if tags is not None:
                yield name, tags
                continue
            batch.append(name)
            if len(batch) >= self._batch:
                yield from (
                    (n, t)
                    for n, t in zip(batch, self._io.executor.map(read, batch), strict=True)
                    if t is not None
                )
                batch = []
        yield from (
            (n, t) for n, t in zip(batch, self._io.executor.map(read, batch), strict=True) if t is not None
        )
