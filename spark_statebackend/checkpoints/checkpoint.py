"""Combined checkpoints (Samza's CheckpointV2): one record per micro-batch with the input offsets and
every store instance's state checkpoint marker, and its JSON serde.

Guarantees (the ids it is made of, and theirs: ids.py):
- `CheckpointV2` is an immutable value: its maps are immutable copies (`FrozenMap`, hashable,
  never None: an absent map is empty), so a caller mutating its own dict afterwards changes nothing.
- Serde: `to_json()` gives canonical bytes (sorted keys) with `"version": 2`; `from_json(data,
  source=...)` accepts exactly version 2, ignores fields it does not know (a newer writer adding a
  field does not break this reader), and raises `CorruptCheckpointError` naming `source` (topic,
  partition and offset, or file) for anything malformed. `from_json(x.to_json()) == x` always.

Marker formats (with the store instance key and the flat marker of ids.py):
- backend "blobstore": the payload is the blob id of the store's SnapshotIndex; backend "spark":
  Spark's own checkpoint location (defined by the committer; opaque here).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import CheckpointError
from .ids import (
    MAX_INT64,
    CheckpointId,
    FrozenMap,
    StateMarker,
    StoreInstance,
    batch_of_version,
    check_backend,
    check_query_id,
    version_of_batch,
)

__all__ = [
    "BLOBSTORE_BACKEND",
    "CHECKPOINT_VERSION",
    "DRIVER_STORE",
    "SPARK_BACKEND",
    "CheckpointId",
    "CheckpointV2",
    "CorruptCheckpointError",
    "FrozenMap",
    "StateMarker",
    "StoreInstance",
    "batch_of_version",
    "check_query_id",
    "version_of_batch",
]

CHECKPOINT_VERSION = 2
#: The layout of this project's fields inside a version-2 record. 2 adds `state_format`; a record
#: without `schema_version` is schema 1 (read with the defaults of the new fields).
CHECKPOINT_SCHEMA_VERSION = 2
BLOBSTORE_BACKEND = "blobstore"
SPARK_BACKEND = "spark"
#: The pseudo store instance whose blob-store marker is the snapshot of the driver's files of the
#: checkpoint location (metadata, sources, offsets/commits, operator metadata): what a driver on a new
#: host rebuilds the location from.
DRIVER_STORE = "_driver"

_JSON_KIND = {int: "an integer", str: "a string", dict: "an object"}


class CorruptCheckpointError(CheckpointError):
    """A checkpoint record is malformed or of an incompatible version; names where it came from."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"bad checkpoint record at {source}: {problem}")
        self.source = source
        self.problem = problem


def _frozen_offsets(offsets: Mapping[str, str]) -> FrozenMap[str, str]:
    if not isinstance(offsets, Mapping):
        raise TypeError(f"input_offsets must be a mapping, got {type(offsets).__name__}")
    for source, offset in offsets.items():
        if not isinstance(source, str) or not source:
            raise ValueError(
                f"input_offsets has a source description {source!r} that is not a non-empty string"
            )
        if not isinstance(offset, str):
            raise ValueError(f"input_offsets[{source!r}] is not a string of offset JSON")
        try:
            orjson.loads(offset)
        except orjson.JSONDecodeError:
            raise ValueError(f"input_offsets[{source!r}]={offset!r} is not valid JSON") from None
    return offsets if isinstance(offsets, FrozenMap) else FrozenMap(offsets)


def _frozen_markers(markers: Mapping[str, Mapping[str, str]]) -> FrozenMap[str, FrozenMap[str, str]]:
    if not isinstance(markers, Mapping):
        raise TypeError(f"state_checkpoint_markers must be a mapping, got {type(markers).__name__}")
    out: dict[str, FrozenMap[str, str]] = {}
    for backend, per_store in markers.items():
        check_backend(backend)
        if not isinstance(per_store, Mapping):
            raise ValueError(f"state_checkpoint_markers[{backend!r}] is not a mapping")
        for store, marker in per_store.items():
            if not isinstance(store, str) or not store:
                raise ValueError(
                    f"state_checkpoint_markers[{backend!r}] has a store key {store!r} that is empty"
                )
            if not isinstance(marker, str) or not marker:
                raise ValueError(
                    f"state_checkpoint_markers[{backend!r}][{store!r}] is not a non-empty string"
                )
        out[backend] = per_store if isinstance(per_store, FrozenMap) else FrozenMap(per_store)
    return FrozenMap(out)


@dataclass(frozen=True)
class CheckpointV2:
    """The combined checkpoint of one micro-batch of one query.

    input_offsets: source description -> end offset JSON text, exactly as Spark reports them.
    state_checkpoint_markers: backend -> {store instance key -> marker}.
    state_format (schema 2): how the state was written, for restores to check before they use it:
      "changelog_checkpointing" (bool: some store's snapshot replays changelogs, see the
      SnapshotIndex metadata), "repartitioned_at_batch" (int: the batch of the query's last offline
      state repartition, 0 if never; a checkpoint with another value has another partitioning).
    writer_app_id (schema 2): the identity of the application attempt whose committer wrote it
      (runtime/spool `app_identity`: the app id, plus the attempt when there is one; "" if unknown): a
      sidecar of an application that wrote a query's checkpoints and then sees one written by another
      identity (another application, or another attempt of it) has been fenced, and stops uploading for
      that query.
    `batch_id` is the checkpoint id's batch id (one fact, stored once)."""

    checkpoint_id: CheckpointId
    query_id: str
    query_name: str = ""
    input_offsets: Mapping[str, str] = FrozenMap()
    state_checkpoint_markers: Mapping[str, Mapping[str, str]] = FrozenMap()
    changelog_checkpointing: bool = False
    repartitioned_at_batch: int = 0
    writer_app_id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_id, CheckpointId):
            raise TypeError(f"checkpoint_id must be a CheckpointId, got {self.checkpoint_id!r}")
        check_query_id(self.query_id)
        if not isinstance(self.query_name, str):
            raise TypeError(f"query_name must be a string (empty for none), got {self.query_name!r}")
        if not isinstance(self.changelog_checkpointing, bool):
            raise TypeError("changelog_checkpointing must be a bool")
        if not isinstance(self.writer_app_id, str):
            raise TypeError("writer_app_id must be a string")
        if (
            isinstance(self.repartitioned_at_batch, bool)
            or not isinstance(self.repartitioned_at_batch, int)
            or self.repartitioned_at_batch < 0
        ):
            raise ValueError(
                f"repartitioned_at_batch must be an integer >= 0, got {self.repartitioned_at_batch!r}"
            )
        object.__setattr__(self, "input_offsets", _frozen_offsets(self.input_offsets))
        object.__setattr__(self, "state_checkpoint_markers", _frozen_markers(self.state_checkpoint_markers))

    @property
    def batch_id(self) -> int:
        return self.checkpoint_id.batch_id

    def markers(self, backend: str) -> Mapping[str, str]:
        """{store instance key -> marker} of one backend; empty if it has none."""
        return self.state_checkpoint_markers.get(backend, FrozenMap())

    def marker(self, backend: str, store: StoreInstance | str) -> str | None:
        """The marker of one store instance in one backend, or None."""
        key = store.key if isinstance(store, StoreInstance) else store
        return self.markers(backend).get(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "checkpoint_id": str(self.checkpoint_id),
            "query_id": self.query_id,
            "query_name": self.query_name,
            "batch_id": self.batch_id,
            "input_offsets": dict(self.input_offsets),
            "state_checkpoint_markers": {b: dict(m) for b, m in self.state_checkpoint_markers.items()},
            "schema_version": CHECKPOINT_SCHEMA_VERSION,
            "state_format": {
                "changelog_checkpointing": self.changelog_checkpointing,
                "repartitioned_at_batch": self.repartitioned_at_batch,
            },
            "writer_app_id": self.writer_app_id,
        }

    def to_json(self) -> bytes:
        """Canonical JSON bytes (sorted keys), the record value in every checkpoint log."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str) -> CheckpointV2:
        """Parse a record; `source` says where it came from and is named in every error."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise CorruptCheckpointError(source, f"not valid JSON ({e})") from None
        return cls.from_dict(doc, source=source)

    @classmethod
    def from_dict(cls, doc: Any, *, source: str) -> CheckpointV2:
        """Build from a decoded JSON object; unknown fields are ignored, anything else malformed raises
        CorruptCheckpointError naming `source`."""
        if not isinstance(doc, dict):
            raise CorruptCheckpointError(source, "the record is not a JSON object")
        version = doc.get("version")
        if type(version) is not int:
            raise CorruptCheckpointError(source, "field 'version' is missing or not an integer")
        if version != CHECKPOINT_VERSION:
            raise CorruptCheckpointError(
                source,
                f"version {version} is not {CHECKPOINT_VERSION}; this reader understands CheckpointV2 only",
            )

        def field(name: str, typ: type) -> Any:
            if name not in doc:
                raise CorruptCheckpointError(source, f"field {name!r} is missing")
            v = doc[name]
            if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
                raise CorruptCheckpointError(source, f"field {name!r} is not {_JSON_KIND[typ]}")
            return v

        try:
            checkpoint_id = CheckpointId.parse(field("checkpoint_id", str))
        except ValueError as e:
            raise CorruptCheckpointError(source, str(e)) from None
        batch_id = field("batch_id", int)
        if batch_id != checkpoint_id.batch_id:
            raise CorruptCheckpointError(
                source, f"batch_id {batch_id} differs from the batch id in checkpoint id {checkpoint_id}"
            )
        schema = doc.get("schema_version", 1)
        if type(schema) is not int or schema < 1:
            raise CorruptCheckpointError(source, f"schema_version {schema!r} is not a positive integer")
        fmt = doc.get("state_format", {}) if schema >= 2 else {}
        if not isinstance(fmt, dict):
            raise CorruptCheckpointError(source, "field 'state_format' is not an object")
        changelog = fmt.get("changelog_checkpointing", False)
        repartitioned = fmt.get("repartitioned_at_batch", 0)
        if not isinstance(changelog, bool):
            raise CorruptCheckpointError(source, "state_format.changelog_checkpointing is not a boolean")
        if type(repartitioned) is not int:
            raise CorruptCheckpointError(source, "state_format.repartitioned_at_batch is not an integer")
        writer = doc.get("writer_app_id", "") if schema >= 2 else ""
        if not isinstance(writer, str):
            raise CorruptCheckpointError(source, "field 'writer_app_id' is not a string")
        try:
            return cls(
                checkpoint_id=checkpoint_id,
                query_id=field("query_id", str),
                query_name=field("query_name", str),
                input_offsets=field("input_offsets", dict),
                state_checkpoint_markers=field("state_checkpoint_markers", dict),
                changelog_checkpointing=changelog,
                repartitioned_at_batch=repartitioned,
                writer_app_id=writer,
            )
        except (ValueError, TypeError) as e:
            raise CorruptCheckpointError(source, str(e)) from None

    def describe(self) -> str:
        """A multi-line human-readable rendering (used by the CLI)."""
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.checkpoint_id.millis / 1000))
        lines = [
            f"checkpoint {self.checkpoint_id}",
            f"  query:       {self.query_name or '(unnamed)'} ({self.query_id})",
            f"  batch:       {self.batch_id}",
            f"  created:     {ts}.{self.checkpoint_id.millis % 1000:03d}Z",
            f"  state:       {'changelog checkpointing' if self.changelog_checkpointing else 'snapshots'}"
            + (f", repartitioned at batch {b}" if (b := self.repartitioned_at_batch) else ""),
        ]
        lines.append("  input offsets:" + ("" if self.input_offsets else " (none)"))
        for source in sorted(self.input_offsets):
            lines.append(f"    {source}: {self.input_offsets[source]}")
        lines.append("  state checkpoint markers:" + ("" if self.state_checkpoint_markers else " (none)"))
        for backend in sorted(self.state_checkpoint_markers):
            lines.append(f"    {backend}:")
            per_store = self.state_checkpoint_markers[backend]
            for store in sorted(per_store, key=_store_sort_key):
                lines.append(f"      {store}: {per_store[store]}")
        return "\n".join(lines)


def _store_sort_key(key: str) -> tuple[int, int, str]:
    s = StoreInstance.parse_or_none(key)
    return (s.operator, s.partition, s.store_name) if s else (MAX_INT64, MAX_INT64, key)
