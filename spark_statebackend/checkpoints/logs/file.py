"""The embedded default checkpoint log: an append-only log of files per query in a local (or shared
POSIX) directory. A crash at any instant, kill -9 included, never leaves a torn record, and a newer
writer of a query fences every older one.

Layout: `<root>/<query id>/<seq, 20 digits>.json`, seq = 0, 1, 2, ... with no gaps except where
retain() deleted old records. A record is either a checkpoint (the CheckpointV2 JSON, byte for byte
what the Kafka log stores as the value) or a writer fence (`{"kind": "writer-fence", ...}`).
Names starting with '.' are temporary files and are never read.

Writing a record (every step refers back here):
  [1] write the bytes to a fresh temporary file `.tmp-<random>.json` in the query's directory and
      fsync it, so its content is complete on disk before any reader can see a name for it;
  [2] list the directory; check every record after the last one this writer has seen: a writer
      fence newer than this writer's own means it was fenced -> CheckpointFencedError;
  [3] hard-link the temporary file to `<max seq + 1>.json`. link(2) fails if the name exists, so two
      writers can never both claim a slot (rename(2) would silently replace, hence link); on
      EEXIST go back to [2];
  [4] fsync the directory, so the new name survives power loss; then unlink the temporary file.
A crash before [3] leaves at most a temporary file (ignored, swept by retain()); after [3] the
record is whole because [1] synced it first.

Fencing: acquire_writer() appends a writer fence record. Because a writer only ever links slot
`max + 1` after reading every slot up to `max` (step [2]), no record can land after a fence unless
its writer saw that fence first: once a newer writer's fence is in the log, an older writer's next
write fails, and a write racing with the fence either lands before it (so the newer writer, which
reads after acquiring, sees it) or fails. This needs exclusive link(2) and a coherent directory
listing: true for local file systems and NFSv3+ (link is atomic there); not for object-store
mounts (s3fs, blobfuse), which this log does not support.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...common.durable import fsync_dir
from ..checkpoint import CheckpointV2, CorruptCheckpointError, check_query_id
from ._options import Options
from .base import CheckpointFencedError, CheckpointLog, CheckpointLogError

_RECORD_RE = re.compile(r"([0-9]{20})\.json")
_FENCE_KIND = "writer-fence"
_TEMP_PREFIX = ".tmp-"
_STALE_TEMP_SECONDS = 3600.0


@dataclass(frozen=True)
class _Fence:
    writer_id: str
    description: str


@dataclass
class _WriterState:
    """What one writer of one query knows: its fence slot, the highest slot it has checked, and
    the slots it wrote itself (so it never re-reads them)."""

    fence_seq: int
    observed_upto: int
    own: set[int] = field(default_factory=set)
    fenced_by: str | None = None


def _record_name(seq: int) -> str:
    return f"{seq:020d}.json"


class FileCheckpointLog(CheckpointLog):
    """Checkpoint log in a directory; see the module docstring for the protocol and guarantees.

    Options: `fsync` (default true; false only for tests on throwaway data), `timeout` (default 30s:
    bound on how long a write keeps retrying a contended slot; deprecated spelling `timeout.ms`)."""

    #: Test hook: called with the name of each write stage ("temp-written", "temp-synced", "linked",
    #: "dir-synced"); a crash test blocks or dies there. None in production.
    _stage_hook: Callable[[str], None] | None = None

    def __init__(
        self,
        root: str | os.PathLike[str],
        options: Mapping[str, str] | None = None,
        *,
        key: str = "checkpoint log URL",
    ) -> None:
        opts = Options(options or {}, key)
        self._fsync = opts.boolean("fsync", True)
        self._timeout_s = opts.duration_ms("timeout", "30s", legacy_ms="timeout.ms") / 1000.0
        opts.finish()
        self.root = Path(os.path.abspath(root))
        self.url = self.root.as_uri()
        self._lock = threading.Lock()
        self._writers: dict[str, _WriterState] = {}
        self._writer_id = uuid.uuid4().hex

    # -- resources ------------------------------------------------------------------------------

    def create_resources(self) -> None:
        with self._lock:
            if not self.root.is_dir():
                self.root.mkdir(parents=True, exist_ok=True)
                self._sync_dir(self.root.parent)
        self.validate_resources()

    def validate_resources(self) -> None:
        """The root must be a writable directory on a file system with exclusive hard links."""
        if not self.root.is_dir():
            raise CheckpointLogError(f"checkpoint log {self.url}: directory {self.root} does not exist")
        probe = self.root / f"{_TEMP_PREFIX}probe-{uuid.uuid4().hex}"
        linked = probe.with_name(probe.name + ".link")
        try:
            probe.write_bytes(b"probe")
            os.link(probe, linked)
            try:
                os.link(probe, linked)
            except FileExistsError:
                pass
            else:
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: link(2) does not fail on an existing name"
                )
        except OSError as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: directory is not writable or lacks hard links ({e})"
            ) from e
        finally:
            for p in (probe, linked):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()

    # -- writing --------------------------------------------------------------------------------

    def acquire_writer(self, query_id: str) -> None:
        check_query_id(query_id)
        with self._lock:
            state = self._writers.get(query_id)
            if state is not None and state.fenced_by is not None:
                raise self._fenced(query_id, state, "acquiring the writer")
            if state is None:
                self._acquire(query_id)

    def _acquire(self, query_id: str) -> _WriterState:
        fence = orjson.dumps(
            {
                "kind": _FENCE_KIND,
                "writer_id": self._writer_id,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "created_at_ms": time.time_ns() // 1_000_000,
            }
        )
        deadline = time.monotonic() + self._timeout_s
        seq = self._append(query_id, fence, None, deadline, what="writer fence")
        state = _WriterState(fence_seq=seq, observed_upto=seq, own={seq})
        self._writers[query_id] = state
        return state

    def write(self, checkpoint: CheckpointV2) -> None:
        with self._lock:
            deadline = time.monotonic() + self._timeout_s
            state = self._writers.get(checkpoint.query_id)
            if state is None:
                state = self._acquire(checkpoint.query_id)
            self._append(
                checkpoint.query_id,
                checkpoint.to_json(),
                state,
                deadline,
                what=f"checkpoint {checkpoint.checkpoint_id}",
            )

    def _append(
        self, query_id: str, data: bytes, state: _WriterState | None, deadline: float, what: str
    ) -> int:
        qdir = self.root / query_id
        if not qdir.is_dir():
            if not self.root.is_dir():
                raise CheckpointLogError(
                    f"checkpoint log {self.url}: directory {self.root} does not exist "
                    "(create_resources() creates it)"
                )
            qdir.mkdir(exist_ok=True)
            self._sync_dir(self.root)
        if state is not None and state.fenced_by is not None:
            raise self._fenced(query_id, state, what)
        tmp = qdir / f"{_TEMP_PREFIX}{uuid.uuid4().hex}.json"
        try:
            # [1] complete, synced content before any record name points at it.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                self._hook("temp-written")
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self._hook("temp-synced")
            while True:
                # [2] everything up to max must have been seen (and be no newer fence) before [3].
                seqs = self._list(qdir)
                top = seqs[-1] if seqs else -1
                if state is not None:
                    self._check_not_fenced(query_id, qdir, seqs, state, what)
                # [3] exclusive claim of the next slot.
                try:
                    os.link(tmp, qdir / _record_name(top + 1))
                except FileExistsError:
                    if time.monotonic() > deadline:
                        raise CheckpointLogError(
                            f"checkpoint log {self.url}: {what} for query {query_id} not written: "
                            f"slot contention did not clear within {self._timeout_s:.1f}s"
                        ) from None
                    continue
                self._hook("linked")
                # [4] make the name durable.
                self._sync_dir(qdir)
                self._hook("dir-synced")
                if state is not None:
                    state.observed_upto = top + 1
                    state.own.add(top + 1)
                return top + 1
        except OSError as e:
            raise CheckpointLogError(
                f"checkpoint log {self.url}: {what} for query {query_id} not written: {e}"
            ) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _check_not_fenced(
        self, query_id: str, qdir: Path, seqs: list[int], state: _WriterState, what: str
    ) -> None:
        for seq in seqs:
            if seq <= state.observed_upto or seq in state.own:
                continue
            try:
                record = self._decode(qdir / _record_name(seq), query_id)
            except FileNotFoundError:
                continue
            if isinstance(record, _Fence) and seq > state.fence_seq:
                state.fenced_by = f"{record.description} (record {qdir / _record_name(seq)})"
                raise self._fenced(query_id, state, what)
            state.observed_upto = max(state.observed_upto, seq)

    def _fenced(self, query_id: str, state: _WriterState, what: str) -> CheckpointFencedError:
        return CheckpointFencedError(
            f"checkpoint log {self.url}: {what} for query {query_id} NOT written: this writer was fenced "
            f"by a newer writer {state.fenced_by}; another driver owns the query now"
        )

    # -- reading --------------------------------------------------------------------------------

    def read_latest(self, query_id: str) -> CheckpointV2 | None:
        check_query_id(query_id)
        qdir = self.root / query_id
        with self._lock:
            for seq in reversed(self._list(qdir)):
                try:
                    record = self._decode(qdir / _record_name(seq), query_id)
                except FileNotFoundError:
                    continue  # deleted by a concurrent retain(): an older record
                if isinstance(record, CheckpointV2):
                    return record
        return None

    def read_history(self, query_id: str) -> list[CheckpointV2]:
        check_query_id(query_id)
        qdir = self.root / query_id
        out: list[CheckpointV2] = []
        with self._lock:
            for seq in self._list(qdir):
                try:
                    record = self._decode(qdir / _record_name(seq), query_id)
                except FileNotFoundError:
                    continue
                if isinstance(record, CheckpointV2):
                    out.append(record)
        return out

    def retain(self, query_id: str, keep_last: int) -> int:
        """Delete all checkpoints but the newest `keep_last`, all writer fences but the newest, and
        temporary files older than an hour. The newest record is never deleted, so sequence numbers
        never repeat; deleting older fences is safe because the newest fence alone fences every
        older writer."""
        super().retain(query_id, keep_last)
        check_query_id(query_id)
        qdir = self.root / query_id
        deleted = 0
        with self._lock:
            seqs = self._list(qdir)
            if not seqs:
                return 0
            kinds: list[tuple[int, bool]] = []  # (seq, is_checkpoint)
            for seq in seqs:
                with contextlib.suppress(FileNotFoundError):
                    kinds.append(
                        (seq, isinstance(self._decode(qdir / _record_name(seq), query_id), CheckpointV2))
                    )
            checkpoints = [s for s, is_cp in kinds if is_cp]
            fences = [s for s, is_cp in kinds if not is_cp]
            keep = set(checkpoints[-keep_last:]) | set(fences[-1:]) | {seqs[-1]}
            for seq, is_cp in kinds:
                if seq not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        (qdir / _record_name(seq)).unlink()
                        deleted += is_cp
            now = time.time()
            for entry in os.scandir(qdir):
                if entry.name.startswith(_TEMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        if now - entry.stat().st_mtime > _STALE_TEMP_SECONDS:
                            os.unlink(entry.path)
            self._sync_dir(qdir)
        return deleted

    # -- helpers --------------------------------------------------------------------------------

    def _list(self, qdir: Path) -> list[int]:
        """Sequence numbers of the records in `qdir`, ascending; temporary files are not records."""
        try:
            names = os.listdir(qdir)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CheckpointLogError(f"checkpoint log {self.url}: cannot list {qdir}: {e}") from e
        return sorted(int(m.group(1)) for n in names if (m := _RECORD_RE.fullmatch(n)))

    def _decode(self, path: Path, query_id: str) -> CheckpointV2 | _Fence:
        """Read one record; FileNotFoundError passes through (a concurrent retain)."""
        source = f"file {path}"
        data = path.read_bytes()
        try:
            doc: Any = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise CorruptCheckpointError(source, f"not valid JSON ({e})") from None
        if isinstance(doc, dict) and doc.get("kind") == _FENCE_KIND:
            writer = doc.get("writer_id")
            if not isinstance(writer, str):
                raise CorruptCheckpointError(source, "writer fence without a writer_id")
            return _Fence(writer, f"{doc.get('pid')}@{doc.get('host')} (writer {writer})")
        checkpoint = CheckpointV2.from_dict(doc, source=source)
        if checkpoint.query_id != query_id:
            raise CorruptCheckpointError(
                source, f"record is for query {checkpoint.query_id!r} but sits in the log of {query_id!r}"
            )
        return checkpoint

    def _sync_dir(self, path: Path) -> None:
        if self._fsync:
            fsync_dir(path)

    def _hook(self, stage: str) -> None:
        hook = type(self)._stage_hook
        if hook is not None:
            hook(stage)
