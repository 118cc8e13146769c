"""Index documents: what a snapshot of a store directory looks like in the blob store.

A SnapshotIndex describes one directory tree at one checkpoint: every file as a list of chunk blobs
(`FileBlob`) plus its metadata and checksum, every subdirectory recursively, and what was removed
since the previous snapshot (so cleanup knows which blobs to delete). It is stored as one JSON blob;
its blob id is the store's state checkpoint marker.

Its JSON form, and what parsing one guarantees, is index_codec.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

#: 2 adds the Spark recipe of a store snapshot (snapshot_version, changelog_versions, spark_unique_id)
#: for changelog checkpointing; documents of schema 1 are read with those fields at their defaults.
#: FileMetadata.inode is optional within schema 2: older code ignores the key and documents without
#: it read as inode None, so it needed no new version (a new version would make older code refuse
#: every index written after an upgrade).
SCHEMA_VERSION = 2

MAX_FILE_SIZE = 1 << 46  # 64 TiB: far beyond any RocksDB file; larger means a hostile document
MAX_DEPTH = 64
MAX_ENTRIES = 2_000_000


@dataclass(frozen=True)
class FileBlob:
    """One chunk of a file: bytes [offset, offset + size) of the file live in blob `blob_id`."""

    blob_id: str
    offset: int
    size: int
    checksum: str


@dataclass(frozen=True)
class FileMetadata:
    """What `areSameFile` compares besides content, and what restore re-applies (permissions, mtime).

    `inode`: the file's inode number when it was backed up (None in indexes written before it was
    recorded); with mtime_ns and ctime_ns it lets a stat-identity diff (diff.py) skip reading a file."""

    size: int
    mtime_ns: int
    ctime_ns: int
    owner: str
    group: str
    permissions: int
    inode: int | None = None


@dataclass(frozen=True)
class FileIndex:
    """A file: its name inside its directory, its chunks in order, metadata and whole-file checksum."""

    name: str
    blobs: tuple[FileBlob, ...]
    metadata: FileMetadata
    checksum: str


@dataclass(frozen=True)
class DirIndex:
    """A directory: files and subdirs present, and those removed since the previous snapshot."""

    name: str
    files_present: tuple[FileIndex, ...] = ()
    files_removed: tuple[FileIndex, ...] = ()
    subdirs_present: tuple[DirIndex, ...] = ()
    subdirs_removed: tuple[DirIndex, ...] = ()

    def walk_files(self, prefix: str = "") -> Iterator[tuple[str, FileIndex]]:
        """Yield (relative path with '/' separators, FileIndex) for every file present, recursively."""
        for f in self.files_present:
            yield prefix + f.name, f
        for d in self.subdirs_present:
            yield from d.walk_files(prefix + d.name + "/")

    def walk_dirs(self, prefix: str = "") -> Iterator[str]:
        """Yield the relative path of every subdirectory present, parents before children."""
        for d in self.subdirs_present:
            yield prefix + d.name
            yield from d.walk_dirs(prefix + d.name + "/")

    def present_blob_ids(self) -> Iterator[str]:
        """Every blob id referenced by a file present in this tree."""
        for _, f in self.walk_files():
            for b in f.blobs:
                yield b.blob_id

    def removed_blob_ids(self) -> Iterator[str]:
        """Every blob id of files and subdirs removed since the previous snapshot, recursively."""
        for f in self.files_removed:
            for b in f.blobs:
                yield b.blob_id
        for d in self.subdirs_removed:
            yield from d.present_blob_ids()
            yield from d.removed_blob_ids()
        for d in self.subdirs_present:
            yield from d.removed_blob_ids()

    def total_size(self) -> int:
        """Bytes of all files present."""
        return sum(f.metadata.size for _, f in self.walk_files())

    def file_count(self) -> int:
        """Number of files present."""
        return sum(1 for _ in self.walk_files())


@dataclass(frozen=True)
class SnapshotMetadata:
    """Who the snapshot belongs to. `store` is the store instance key ('<op>/<partition>/<name>' for
    Spark state stores, any safe name for the CLI); operator and partition are None outside Spark."""

    checkpoint_id: str
    query_name: str
    query_id: str
    store: str
    operator: int | None = None
    partition: int | None = None
    version: int | None = None
    #: Schema 2. The Spark snapshot (zip and SSTs) this store's files start from; 0: Spark replays
    #: from empty state; None: not recorded (schema 1, where it always equals `version`, or no Spark).
    snapshot_version: int | None = None
    #: Schema 2. The changelogs Spark replays on top of the snapshot to reach `version` (changelog
    #: checkpointing), oldest first; empty when the snapshot is the version itself.
    changelog_versions: tuple[int, ...] = ()
    #: Schema 2. Spark's checkpoint format v2 id of `version`, if it has one.
    spark_unique_id: str | None = None


@dataclass(frozen=True)
class SnapshotIndex:
    """The root document of one snapshot. Its blob id is the store's state checkpoint marker."""

    created_at_ms: int
    metadata: SnapshotMetadata
    dir_index: DirIndex
    prev_snapshot_index_blob_id: str | None = None
    schema_version: int = field(default=SCHEMA_VERSION)
