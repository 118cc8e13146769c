"""Finished micro-batches, as the committer receives them ([C5] of runtime/__init__.py).

The JVM's query listener (jvm-bridge ProgressSpoolListener) writes one `progress` document per finished
batch into the driver's spool dir (`progress/`), and the driver hooks an `offline_commit` document when
offline state repartition writes `commits/<batch>` (runtime/spool: "Driver progress documents"). The
commit loop reads each into a `ProgressEvent` (`read_progress_event`) and hands it to the committer.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..checkpoints.checkpoint import check_query_id
from ..errors import StateBackendError
from ..spark.location import state_instances


@dataclass(frozen=True)
class ProgressEvent:
    """What the JVM listener reports for one finished micro-batch of one query."""

    query_id: str
    query_name: str
    checkpoint_root: Path
    batch_id: int
    input_offsets: Mapping[str, str]
    state_store_instances: int
    batch_end_ms: int
    raw: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the spool file it came from: removed once the batch is checkpointed or dropped
    #: A batch written by offline state repartition (no query ran it): its offsets are the previous
    #: checkpoint's, and it starts a new partitioning (CheckpointV2.repartitioned_at_batch).
    offline: bool = False
    #: A checkpoint location on another Hadoop scheme, by name (`s3a://bucket/path`); empty for a
    #: local one. Its `checkpoint_root` is then the driver's local mirror root of it (jvm-bridge
    #: RemoteLocations): Spark's metadata is in the location itself, which is durable, so no `_driver`
    #: snapshot is taken of it.
    remote_location: str = ""

    @property
    def location(self) -> str:
        """The checkpoint location's name as query locators key it: the remote location, else the
        local path."""
        return self.remote_location or str(self.checkpoint_root)

    @staticmethod
    def offline_commit(doc: Mapping[str, Any], source: str) -> ProgressEvent:
        """Build from an `offline_commit` spool document (runtime/spool): `commits/<batch>` was written
        while no query ran on the checkpoint root, i.e. by offline state repartition. The number of
        store instances of the new partitioning is read from the checkpoint root (`state_instances`).
        Raises StateBackendError naming `source` for anything malformed."""
        try:
            root = str(doc["checkpoint_root"])
            if not os.path.isabs(root) or "\x00" in root:
                raise ValueError(f"checkpoint_root {root!r} is not an absolute path")
            query_id = check_query_id(doc["query_id"])
            batch_id = doc["batch_id"]
            if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
                raise ValueError(f"batch_id {batch_id!r} must be an integer >= 0")
            return ProgressEvent(
                query_id=query_id,
                query_name="",
                checkpoint_root=Path(root),
                batch_id=batch_id,
                input_offsets={},
                state_store_instances=state_instances(Path(root), batch_id),
                batch_end_ms=int(time.time() * 1000),
                raw=doc,
                source=source,
                offline=True,
            )
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise StateBackendError(f"malformed offline commit {source}: {e!r}") from None

    @staticmethod
    def from_progress_json(
        progress: Mapping[str, Any], checkpoint_root: str, source: str, remote_location: str = ""
    ) -> ProgressEvent:
        """Build from a StreamingQueryProgress as JSON (`progress.json()` in Spark); `remote_location`:
        the name of a checkpoint location on another Hadoop scheme (`<scheme>://...`), else empty.

        Raises StateBackendError naming `source` for anything malformed or hostile: a missing or
        unusable query id (it becomes a log key), a negative batch id or instance count, a
        checkpoint root that is not an absolute path, a remote location that is not a URI."""
        try:
            if not isinstance(progress, Mapping):
                raise TypeError(f"the progress is not a JSON object but {type(progress).__name__}")
            offsets = {}
            for s in progress.get("sources") or []:
                end = s.get("endOffset")
                offsets[str(s["description"])] = end if isinstance(end, str) else orjson.dumps(end).decode()
            instances = sum(
                int(op.get("numStateStoreInstances", 0)) for op in progress.get("stateOperators") or []
            )
            ts = progress.get("timestamp")
            start_ms = _parse_iso_ms(ts) if isinstance(ts, str) else int(time.time() * 1000)
            end_ms = start_ms + int(progress.get("batchDuration", 0))
            query_id = check_query_id(progress["id"])
            batch_id = int(progress["batchId"])
            if batch_id < 0 or instances < 0:
                raise ValueError(f"batchId {batch_id} and numStateStoreInstances {instances} must be >= 0")
            if not os.path.isabs(checkpoint_root) or "\x00" in checkpoint_root:
                raise ValueError(f"checkpoint_root {checkpoint_root!r} is not an absolute path")
            if remote_location and not _REMOTE_RE.fullmatch(remote_location):
                raise ValueError(f"checkpoint_location {remote_location!r} is not <scheme>://...")
            return ProgressEvent(
                query_id=query_id,
                query_name=str(progress.get("name") or ""),
                checkpoint_root=Path(checkpoint_root),
                batch_id=batch_id,
                input_offsets=offsets,
                state_store_instances=instances,
                batch_end_ms=end_ms,
                raw=progress,
                source=source,
                remote_location=remote_location,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # AttributeError: another JSON type where an object belongs, e.g. "sources": [1].
            raise StateBackendError(f"malformed progress event {source}: {e!r}") from None


#: A remote checkpoint location's name as the JVM writes it (RemoteLocations.name): a scheme other
#: than file, `://`, no control characters.
_REMOTE_RE = re.compile(r"(?!file:)[a-z][a-z0-9+.-]*://[^\x00-\x1f]*")


def _parse_iso_ms(ts: str) -> int:
    return int(dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


def read_progress_event(path: Path, resolve_query_id: Callable[[Path], str | None]) -> ProgressEvent | None:
    """The ProgressEvent in spool file `path` (a finished micro-batch, or an offline commit whose
    query id, if absent, `resolve_query_id` finds from its checkpoint root), or None for a file of
    another type (skipped).

    Raises StateBackendError naming `path` for anything else: unreadable, not JSON, JSON that is not
    an object (the file, or its `progress_json`), a missing or mistyped field."""
    try:
        doc = orjson.loads(path.read_bytes())
        if not isinstance(doc, dict):
            raise TypeError(f"not a JSON object but {type(doc).__name__}")
        if doc.get("type") == "offline_commit":
            if doc.get("query_id") is None and isinstance(doc.get("checkpoint_root"), str):
                doc["query_id"] = resolve_query_id(Path(doc["checkpoint_root"]))
            return ProgressEvent.offline_commit(doc, str(path))
        if doc.get("type") != "progress":
            return None
        progress = orjson.loads(doc["progress_json"])
        if not isinstance(progress, dict):
            raise TypeError(f"progress_json is not a JSON object but {type(progress).__name__}")
        root = doc["checkpoint_root"]
        if not isinstance(root, str):
            raise TypeError(f"checkpoint_root is not a string but {type(root).__name__}")
        remote = doc.get("checkpoint_location") or ""
        if not isinstance(remote, str):
            raise TypeError(f"checkpoint_location is not a string but {type(remote).__name__}")
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise StateBackendError(f"malformed progress event {path}: {e!r}") from None
    return ProgressEvent.from_progress_json(progress, root, str(path), remote)
