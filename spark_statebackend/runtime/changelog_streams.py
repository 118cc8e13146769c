"""Changelogs uploaded while Spark writes them, so that a durable commit (durableCommit, changelog
checkpointing) waits only for the last part of its changelog instead of all of it.

1. When a task opens a changelog writer (`<v>.changelog`, `<v>_<id>.changelog`) and its commit will wait
   for the upload, the JVM hard-links the file being written (Spark's temporary name, written by our
   local checkpoint file manager) as `<staging>/<app>/<op>/<part>/<store>/<v>-<random>/<name>` and writes
   a `streams/` document into the spool (spool/documents.py ChangelogStream; Stager.java `stream`).
2. `ChangelogStreams.turn` (the sidecar's `ssb-stream` thread) opens each new stream once, records the
   file's inode, and uploads every complete `changelogStreamChunk` of every open stream, in order,
   one chunk at a time, with the blob TTL like every upload; the last, partial chunk never (the file
   may still grow). While a stream is open the thread looks at the sizes every POLL_SECONDS; with none
   open it waits for the next document (inotify), so an idle sidecar costs nothing.
3. The upload loop, before it uploads version v of a store, `take`s the stream of that version: the
   thread lets go of it (after the chunk in flight, if any), and if the staged `<name>` is the very
   inode the chunks were read from (Spark's close renamed the file into place; a changelog is written
   front to back and never rewritten), those chunks are the start of the file and only the rest goes
   up (engine/new_snapshot.py UploadedPrefix). Anything else (another inode: a retried task's file,
   a file manager that writes elsewhere) uploads the whole file, as without streams.
4. A stream no upload takes (its task failed or was retried, or its version was superseded) is dropped
   once a newer version of its store is taken, or commitTimeout after it was opened: its link goes, and
   its chunks, referenced by nothing, keep their TTL and are deleted by the TTL sweep.

Metrics: ssb_changelog_stream_bytes (bytes up before their commit) and ssb_changelog_streams by result:
used (step 3), short (the changelog stayed under one chunk: nothing went up early), dropped (step 4, or
another inode). Nothing here is needed for correctness: a stream that fails in any way is dropped with a
WARNING, and its version's upload reads the whole changelog from the staged copy as before.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..common.metrics import Metrics
from ..engine.blobs import SnapshotOwner, files_prefix
from ..engine.index import FileBlob
from ..engine.new_snapshot import UploadedPrefix
from ..engine.transfer import NoProgress, PlannedChunk, new_blob_id, upload_chunk
from ..stores import BlobStore
from . import spool as sp
from .staged_events import check_staging_dir

log = logging.getLogger("spark_statebackend.sidecar")  # the loops log as the sidecar

#: How often the sizes of open streams are looked at (only while one is open).
POLL_SECONDS = 0.02
#: The longest `take` waits for the chunk in flight of the stream it takes.
TAKE_TIMEOUT_SECONDS = 60.0


@dataclass
class _Stream:
    """One open stream: its document, the file's identity, and the chunks uploaded so far."""

    doc: sp.ChangelogStream
    source: Path  # the document's file, removed when the stream goes
    dev: int
    ino: int
    opened_at: float  # monotonic
    blobs: list[FileBlob] = field(default_factory=list)
    end: int = 0  # bytes [0, end) are uploaded
    taken: bool = False  # guarded by lock: no chunk of it goes up any more
    claimed: bool = False  # guarded by ChangelogStreams._lock: a `take` handles it (never dropped as stale)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while a chunk of it goes up


class ChangelogStreams:
    """The open changelog streams of one spool dir (module doc). `turn` runs on one thread; `take` may
    be called from another (the upload loop's)."""

    def __init__(
        self,
        spool: sp.Spool,
        store: BlobStore,
        metrics: Metrics,
        *,
        chunk_size: int,
        ttl_seconds: float,
        max_age_seconds: float,
    ) -> None:
        """`chunk_size` 0: streaming is off, documents are dropped as they come. `max_age_seconds`: a
        stream no upload took is dropped this long after it was opened (commitTimeout)."""
        self.spool = spool
        self.store = store
        self.metrics = metrics
        self.chunk_size = chunk_size
        self.ttl_seconds = ttl_seconds
        self.max_age_seconds = max_age_seconds
        self._lock = threading.Lock()  # guards _open and _taken
        self._open: dict[tuple[str, str, int], _Stream] = {}  # (query, store key, version) -> stream
        self._taken: dict[tuple[str, str], int] = {}  # (query, store key) -> newest version taken
        self._read: set[Path] = set()  # documents read already (their streams are open); this thread's

    def writing(self) -> bool:
        """Whether a changelog is being written here (a stream is open)."""
        with self._lock:
            return bool(self._open)

    def due_in(self) -> float | None:
        """Seconds until the next look at the open streams; None while none is open (module doc)."""
        with self._lock:
            return POLL_SECONDS if self._open else None

    def turn(self) -> bool:
        """Open the new documents' streams, upload every complete chunk of every open stream, drop the
        stale ones; True if anything was done."""
        busy = self._open_new()
        with self._lock:
            streams = list(self._open.values())
        now = time.monotonic()
        for s in streams:
            if self._stale(s, now):
                self._drop(s, "no upload took it")
                busy = True
                continue
            busy |= self._advance(s)
        return busy

    def take(self, query_id: str, ev: sp.SnapshotEvent) -> dict[str, UploadedPrefix]:
        """The uploaded prefixes of the changelog files of staged `ev` (relative path -> prefix), for
        BackupManager.upload: those of the open streams of `ev`'s store whose file is a staged one
        (module doc, step 3; a version skipped for a newer one has its changelog in the newer recipe).
        Every stream of `ev`'s store up to its version stops here."""
        key = ev.instance.key
        with self._lock:
            newest = max(self._taken.get((query_id, key), 0), ev.version)
            self._taken[(query_id, key)] = newest
            mine = [s for k, s in self._open.items() if k[0] == query_id and k[1] == key and k[2] <= newest]
            for s in mine:
                s.claimed = True
        out: dict[str, UploadedPrefix] = {}
        for s in mine:
            if not s.lock.acquire(timeout=TAKE_TIMEOUT_SECONDS):
                log.warning(
                    "query %s store %s version %d: the changelog stream's chunk in flight took over %.0fs; "
                    "the whole changelog is uploaded",
                    query_id,
                    key,
                    s.doc.version,
                    TAKE_TIMEOUT_SECONDS,
                )
                s.taken = True  # the thread uploads no more of it after its chunk
                self._remove(s, "dropped")
                continue
            try:
                s.taken = True
                prefix = self._prefix_for(s, ev)
            finally:
                s.lock.release()
            self._remove(s, "used" if prefix is not None else "dropped" if s.blobs else "short")
            if prefix is not None:
                out[s.doc.file] = prefix
                log.info(
                    "query %s store %s version %d: %d byte(s) of %s were uploaded while Spark wrote it",
                    query_id,
                    key,
                    ev.version,
                    prefix.end,
                    s.doc.file,
                )
        return out

    def close(self) -> None:
        """Drop every open stream (the sidecar stops)."""
        with self._lock:
            streams = list(self._open.values())
        for s in streams:
            self._remove(s, "dropped")

    # -- the thread's

    def _open_new(self) -> bool:
        busy = False
        pending = self.spool.pending_streams()
        self._read &= set(pending)
        for path in pending:
            if path in self._read:
                continue
            busy = True
            try:
                doc = sp.ChangelogStream.from_json(path.read_bytes(), str(path))
                check_staging_dir(doc.staged_dir, doc.instance, doc.version, doc.query_id, path)
            except FileNotFoundError:
                continue
            except (sp.SpoolFormatError, OSError) as e:
                log.error("bad changelog stream document %s: %s", path, e)
                sp.quarantine(path)
                continue
            if self.chunk_size <= 0:
                self._forget(doc, path)
                continue
            k = (doc.query_id, doc.instance.key, doc.version)
            with self._lock:
                superseded = self._taken.get(k[:2], 0) >= doc.version
            try:
                st = os.lstat(doc.path)
            except OSError as e:
                st = None
                why = str(e)
            if superseded or st is None or not stat.S_ISREG(st.st_mode):
                if not superseded:
                    log.warning(
                        "query %s store %s version %d: changelog stream %s is not a regular file (%s); "
                        "the changelog is uploaded at its commit",
                        doc.query_id,
                        doc.instance.key,
                        doc.version,
                        doc.path,
                        why if st is None else "a link or special file",
                    )
                self._forget(doc, path)
                continue
            stream = _Stream(doc, path, st.st_dev, st.st_ino, time.monotonic())
            self._read.add(path)
            with self._lock:
                old = self._open.pop(k, None)
                self._open[k] = stream
            if old is not None:  # a retried task's writer of the same version: only the newest counts
                self._remove(old, "dropped")
        return busy

    def _stale(self, s: _Stream, now: float) -> bool:
        with self._lock:
            if s.claimed:
                return False
            taken = self._taken.get((s.doc.query_id, s.doc.instance.key), 0)
        return taken >= s.doc.version or now - s.opened_at > self.max_age_seconds

    def _advance(self, s: _Stream) -> bool:
        """Upload every complete chunk of `s` there is now; True if one went up."""
        busy = False
        while True:
            with s.lock:
                if s.taken:
                    return busy
                try:
                    st = os.lstat(s.doc.path)
                except OSError:
                    st = None
                if st is None or (st.st_dev, st.st_ino) != (s.dev, s.ino):
                    # Gone (its task cancelled the writer and a cleanup took the dir) or replaced.
                    s.taken = True
                    break
                if st.st_size - s.end < self.chunk_size:
                    return busy
                try:
                    s.blobs.append(self._upload(s, s.end, self.chunk_size))
                except Exception as e:  # the commit uploads the whole changelog: nothing is lost
                    log.warning(
                        "query %s store %s version %d: streaming %s failed at byte %d (%s); the changelog "
                        "is uploaded at its commit",
                        s.doc.query_id,
                        s.doc.instance.key,
                        s.doc.version,
                        s.doc.file,
                        s.end,
                        e,
                    )
                    s.taken = True
                    break
                s.end += self.chunk_size
                self.metrics.changelog_stream_bytes.inc(self.chunk_size)
                busy = True
        self._drop(s, "its file is gone or failed")
        return True

    def _upload(self, s: _Stream, offset: int, size: int) -> FileBlob:
        prefix = files_prefix(SnapshotOwner(s.doc.query_id), s.doc.instance.key)
        chunk = PlannedChunk(0, s.doc.path, new_blob_id(prefix), offset, size, s.ino)
        meta = {"store": s.doc.instance.key, "checkpoint": f"v{s.doc.version:012d}", "stream": "1"}
        return upload_chunk(self.store, chunk, meta, self.ttl_seconds, NoProgress())

    # -- either thread's

    def _prefix_for(self, s: _Stream, ev: sp.SnapshotEvent) -> UploadedPrefix | None:
        """The prefix `s` uploaded, if the staged changelog of `ev` is the file it read (same inode, not
        shorter); None otherwise."""
        if not s.blobs or s.doc.file not in ev.files:
            return None
        try:
            st = os.lstat(ev.staged_dir / s.doc.file)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (s.dev, s.ino) or st.st_size < s.end:
            return None
        return UploadedPrefix(s.ino, tuple(s.blobs))

    def _drop(self, s: _Stream, why: str) -> None:
        log.info(
            "query %s store %s version %d: changelog stream dropped (%s); %d streamed byte(s) expire "
            "with their TTL",
            s.doc.query_id,
            s.doc.instance.key,
            s.doc.version,
            why,
            s.end,
        )
        self._remove(s, "dropped")

    def _remove(self, s: _Stream, result: str) -> None:
        with self._lock:
            k = (s.doc.query_id, s.doc.instance.key, s.doc.version)
            if self._open.get(k) is not s:
                return
            del self._open[k]
        self.metrics.changelog_streams.labels(result).inc()
        self._forget(s.doc, s.source)

    @staticmethod
    def _forget(doc: sp.ChangelogStream, source: Path) -> None:
        """Remove a stream's link dir (never through a symlink: rmtree refuses one) and its document."""
        shutil.rmtree(doc.staged_dir, ignore_errors=True)
        sp.remove(source)
