"""The pieces of one new snapshot, built from its diff: the chunks its added files are uploaded as and
their FileIndexes once uploaded ([B3] of engine/__init__.py), and its SnapshotIndex with the blob id
it is stored under ([B4]). Pure: BackupManager (backup.py) runs the transfers and keeps the state.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..checkpoints.store_instance import StoreInstance
from .blobs import SnapshotOwner, blob_segment, files_prefix, indexes_prefix
from .diff import DirDiff, LocalFile
from .index import DirIndex, FileBlob, FileIndex, SnapshotIndex, SnapshotMetadata
from .transfer import PlannedChunk, assemble_file_index, plan_file_upload


class Recipe(Protocol):
    """What Spark needs to load a staged store version, as a SnapshotIndex records it (backup.py's
    StoreRecipe)."""

    @property
    def snapshot_version(self) -> int | None: ...
    @property
    def changelog_versions(self) -> tuple[int, ...]: ...
    @property
    def spark_unique_id(self) -> str | None: ...


@dataclass(frozen=True)
class ChunkPlan:
    """Every chunk of every added file of one upload's stores, as (store key, chunk), and the added
    files by `id()` of their LocalFile (the key build_dir_index looks them up by)."""

    chunks: list[tuple[str, PlannedChunk]]
    added: dict[int, LocalFile]

    def file_indexes(self, blobs: Sequence[FileBlob]) -> dict[int, FileIndex]:
        """The FileIndex of each added file, from `blobs`: the uploaded chunks, in `chunks`' order."""
        by_file: dict[int, list[FileBlob]] = {}
        for (_, c), b in zip(self.chunks, blobs, strict=True):
            by_file.setdefault(c.file_key, []).append(b)
        return {
            key: assemble_file_index(local.name, local.metadata, by_file.get(key, []))
            for key, local in self.added.items()
        }


def plan_chunks(owner: SnapshotOwner, diffs: Mapping[str, DirDiff], chunk_size: int | None) -> ChunkPlan:
    """The chunks the added files of `diffs` (store key -> its diff) are uploaded as, under each store's
    files folder; `chunk_size` None keeps each file in one blob (a store whose blobs are local files)."""
    chunks: list[tuple[str, PlannedChunk]] = []
    added: dict[int, LocalFile] = {}
    for store_key, d in diffs.items():
        prefix = files_prefix(owner, store_key)
        for _, local in d.added_files():
            added[id(local)] = local
            size = local.metadata.size
            per_chunk = max(size, 1) if chunk_size is None else chunk_size
            chunks.extend(
                (store_key, c) for c in plan_file_upload(id(local), local.path, size, prefix, per_chunk)
            )
    return ChunkPlan(chunks, added)


def new_snapshot_index(
    owner: SnapshotOwner,
    checkpoint_id: str,
    store_key: str,
    dir_index: DirIndex,
    prev: tuple[str, SnapshotIndex] | None,
    version: int | None,
    recipe: Recipe,
) -> tuple[str, SnapshotIndex]:
    """The new SnapshotIndex of `store_key` (diffed against `prev`, its marker and index; None: none)
    and the fresh blob id it goes to."""
    inst = StoreInstance.parse_or_none(store_key)  # None: a CLI store, no Spark instance
    index = SnapshotIndex(
        created_at_ms=int(time.time() * 1000),
        metadata=SnapshotMetadata(
            checkpoint_id=checkpoint_id,
            query_name=owner.query_name,
            query_id=owner.query_id,
            store=store_key,
            operator=inst.operator if inst else None,
            partition=inst.partition if inst else None,
            version=version,
            snapshot_version=recipe.snapshot_version,
            changelog_versions=recipe.changelog_versions,
            spark_unique_id=recipe.spark_unique_id,
        ),
        dir_index=dir_index,
        prev_snapshot_index_blob_id=prev[0] if prev else None,
    )
    # The random suffix keeps a re-upload under the same checkpoint id (a retried or zombie
    # writer) from ever overwriting an index a checkpoint may already reference.
    suffix = uuid.uuid4().hex[:8]
    return f"{indexes_prefix(owner, store_key)}{blob_segment(checkpoint_id)}-{suffix}.json", index
