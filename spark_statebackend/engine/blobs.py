"""Where a snapshot's blobs live, and whose they are.

    files/<query>/<store>/<uuid>                        a file's chunks (engine/transfer.py names them)
    indexes/<query>/<store>/<label>-<rand>.json         a SnapshotIndex: the store's marker

`<query>` is the SnapshotOwner's query id (`cli` for `spark-statebackend backup`), `<store>` the store
instance key `<op>/<partition>/<name>` (checkpoints/store_instance.py; or the CLI's store name), each
made blob-id safe by `blob_segment`. The blob store's other folders (reports/, upgrades/, queries/,
plans/) are lifecycle/'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..stores import BlobStore
from .index import SnapshotIndex
from .index_codec import decode_snapshot_index

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")


#: The query segment of `spark-statebackend backup` snapshots: they belong to no Spark query.
CLI_QUERY = "cli"


@dataclass(frozen=True)
class SnapshotOwner:
    """Who snapshots belong to: names the blobs and fills SnapshotMetadata."""

    query_id: str = CLI_QUERY
    query_name: str = ""


def blob_segment(text: str) -> str:
    """Make `text` usable as one blob-id path segment ('/'-separated store keys keep their slashes)."""
    parts = [(_UNSAFE.sub("_", p) or "_") for p in text.split("/")]
    return "/".join("_" if p in (".", "..") else p for p in parts)


def files_prefix(owner: SnapshotOwner, store: str) -> str:
    """Blob folder of a store's file chunks."""
    return f"files/{blob_segment(owner.query_id)}/{blob_segment(store)}"


def indexes_prefix(owner: SnapshotOwner, store: str | None = None) -> str:
    """Blob folder of a query's (or one store's) SnapshotIndex blobs."""
    base = f"indexes/{blob_segment(owner.query_id)}"
    return f"{base}/{blob_segment(store)}/" if store is not None else f"{base}/"


def load_snapshot_index(store: BlobStore, blob_id: str) -> SnapshotIndex:
    """Fetch and parse a SnapshotIndex; errors name the blob."""
    return decode_snapshot_index(store.get_bytes(blob_id), blob_id)
