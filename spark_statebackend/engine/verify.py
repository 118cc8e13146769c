"""Verifying a snapshot in place: every blob read and checksummed, nothing written locally (the CLI's
`verify`, and the driver-side restore's check of a `_driver` snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..errors import BlobNotFoundError, BlobStoreError, ChecksumError, StateBackendError
from ..stores import BlobStore
from .blobs import load_snapshot_index
from .checksum import ChecksumSink, file_checksum, format_crc
from .index import FileIndex, SnapshotIndex
from .transfer import LockedProgress, NoProgress, Progress, TransferPool


@dataclass(frozen=True)
class VerifyReport:
    """Result of verify(): problems is empty when every blob exists and every checksum matches."""

    marker: str
    files: int
    blobs: int
    bytes: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_snapshot(
    store: BlobStore,
    pool: TransferPool,
    marker: str,
    *,
    progress: Progress | None = None,
    index: SnapshotIndex | None = None,
    outage_raises: bool = False,
) -> VerifyReport:
    """Read every blob of snapshot `marker` and check its checksum, writing nothing locally.

    A missing or corrupt index is reported as a problem too (never raised), so one call tells all.
    `progress` is started with the snapshot's total blob bytes and advanced as each blob is read.
    `index`: the SnapshotIndex `marker` names, already loaded (a checkpoint's, through the marker
    guard of lifecycle/markers.py); None: loaded here. `outage_raises`: a blob the store fails to
    read for any cause but its absence (unreachable, retry budget spent) raises that BlobStoreError
    instead of counting as a problem, for callers that must not take an outage for a bad snapshot."""
    try:
        snapshot = index if index is not None else load_snapshot_index(store, marker)
    except StateBackendError as e:
        return VerifyReport(marker, 0, 0, 0, (str(e),))
    files = list(snapshot.dir_index.walk_files())
    prog = LockedProgress(progress or NoProgress())
    prog.start(sum(b.size for _, f in files for b in f.blobs))

    def check(rel: str, f: FileIndex) -> list[str]:
        problems = []
        if file_checksum([b.checksum for b in f.blobs]) != f.checksum:
            problems.append(f"{rel}: chunk checksums do not add up to the file checksum")
        for b in f.blobs:
            sink = ChecksumSink()
            try:
                n = store.get(b.blob_id, sink, 0, b.size)
            except StateBackendError as e:
                if outage_raises and isinstance(e, BlobStoreError) and not isinstance(e, BlobNotFoundError):
                    raise
                problems.append(f"{rel}: {e}")
                continue
            finally:
                prog.advance(b.size)
            actual = format_crc(sink.crc)
            if n != b.size:
                problems.append(f"{rel}: blob {b.blob_id!r} has {n} of {b.size} bytes")
            elif actual != b.checksum:
                problems.append(str(ChecksumError(rel, b.blob_id, b.checksum, actual)))
        return problems

    results = pool.run_all([partial(check, rel, f) for rel, f in files])
    problems = tuple(p for r in results for p in r)
    return VerifyReport(
        marker=marker,
        files=len(files),
        blobs=sum(len(f.blobs) for _, f in files),
        bytes=sum(f.metadata.size for _, f in files),
        problems=problems,
    )
