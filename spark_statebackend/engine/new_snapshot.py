"""The pieces of one new snapshot, built from its diff: the chunks its added files are uploaded as and
their FileIndexes once uploaded ([B3] of engine/__init__.py), and its SnapshotIndex with the blob id
it is stored under ([B4]). Pure: BackupManager (backup.py) runs the transfers and keeps the state.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    #: chunks of added files uploaded before this upload (UploadedPrefix), by the file's key
    uploaded: dict[int, tuple[FileBlob, ...]] = field(default_factory=dict)

    def file_indexes(self, blobs: Sequence[FileBlob]) -> dict[int, FileIndex]:
        """The FileIndex of each added file, from `blobs` (the uploaded chunks, in `chunks`' order) and
        the chunks uploaded before."""
        by_file: dict[int, list[FileBlob]] = {key: list(pre) for key, pre in self.uploaded.items()}
        for (_, c), b in zip(self.chunks, blobs, strict=True):
            by_file.setdefault(c.file_key, []).append(b)
        return {
            key: assemble_file_index(local.name, local.metadata, by_file.get(key, []))
            for key, local in self.added.items()
        }


@dataclass(frozen=True)
class UploadedPrefix:
    """Bytes [0, end) of a file to upload, uploaded already (a changelog streamed while Spark wrote it,
    runtime/changelog_streams.py) as `blobs`, contiguous from offset 0, of the file whose inode is
    `inode`."""

    inode: int
    blobs: tuple[FileBlob, ...]

    @property
    def end(self) -> int:
        """The offset the rest of the file starts at."""
        return sum(b.size for b in self.blobs)

    def start_of(self, local: LocalFile) -> bool:
        """Whether these blobs are the start of `local`: read from the same inode, not past its end."""
        return bool(self.blobs) and self.inode == local.metadata.inode and self.end <= local.metadata.size


def plan_chunks(
    owner: SnapshotOwner,
    diffs: Mapping[str, DirDiff],
    chunk_size: int | None,
    uploaded: Mapping[str, Mapping[str, UploadedPrefix]] | None = None,
) -> ChunkPlan:
    """The chunks the added files of `diffs` (store key -> its diff) are uploaded as, under each store's
    files folder; `chunk_size` None keeps each file in one blob (a store whose blobs are local files).
    `uploaded` (store key -> relative path -> prefix): a file whose start is uploaded already uploads
    only its rest, if it is still the file the prefix was read from (same inode, not shorter)."""
    chunks: list[tuple[str, PlannedChunk]] = []
    added: dict[int, LocalFile] = {}
    prefixes: dict[int, tuple[FileBlob, ...]] = {}
    for store_key, d in diffs.items():
        prefix = files_prefix(owner, store_key)
        mine = (uploaded or {}).get(store_key, {})
        for rel, local in d.added_files():
            added[id(local)] = local
            size = local.metadata.size
            pre = mine.get(rel)
            start = 0
            if pre is not None and pre.start_of(local):
                prefixes[id(local)] = pre.blobs
                start = pre.end
            per_chunk = max(size - start, 1) if chunk_size is None else chunk_size
            chunks.extend(
                (store_key, c)
                for c in plan_file_upload(
                    id(local), local.path, size, prefix, per_chunk, start, local.metadata.inode
                )
            )
    return ChunkPlan(chunks, added, prefixes)


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
