"""The spool's documents (the protocol is in runtime/spool/__init__.py): snapshot events, restore,
checkpoint-location and plan requests, responses and the sidecar marker, each a frozen value with its JSON
serde. Parsing refuses, naming the file, anything malformed or of an unknown schema version (fields.py).
"""

from __future__ import annotations

import base64
import binascii
import builtins
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ...checkpoints.store_instance import StoreInstance
from .fields import Fields, SpoolFormatError, load_object

SCHEMA_VERSION = 2

#: "uploaded" answers a snapshot event the JVM waits for (durableCommit); the others a restore request.
RestoreStatus = Literal["restored", "not_found", "error", "uploaded"]
RESTORE_STATUSES: frozenset[str] = frozenset({"restored", "not_found", "error", "uploaded"})

REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")  # a request id is a safe file name token


def _store_version_json(doc: SnapshotEvent | RestoreRequest) -> dict[str, Any]:
    """The fields naming one version of one store and where Spark keeps it, as both a snapshot event
    and a restore request write them."""
    return {
        "checkpoint_root": str(doc.checkpoint_root),
        "dfs_dir": str(doc.dfs_dir),
        "operator": doc.operator,
        "partition": doc.partition,
        "store": doc.store,
        "version": doc.version,
        "spark_unique_id": doc.spark_unique_id,
    }


@dataclass(frozen=True)
class SnapshotEvent:
    """One committed store version, staged by the JVM as hard links in `staged_dir`."""

    query_id: str | None
    batch_id: int | None
    checkpoint_root: Path
    dfs_dir: Path
    operator: int
    partition: int
    store: str
    version: int
    spark_unique_id: str | None
    staged_dir: Path
    files: tuple[str, ...]
    executor_id: str
    created_at_ms: int
    stage_nanos: int
    schema_version: int = SCHEMA_VERSION
    #: The Spark snapshot the staged files start from (its zip and SSTs); 0: replayed from empty state.
    #: None in schema 1 events, which always staged exactly `<version>.zip`.
    snapshot_version: int | None = None
    #: Changelogs staged on top of the snapshot (changelog checkpointing), oldest first.
    changelog_versions: tuple[int, ...] = ()
    #: The version was staged before; Spark has since published a snapshot that shortens its recipe.
    upgrade: bool = False
    #: The committing task waits for this version to be uploaded and reported (durableCommit): the
    #: sidecar answers `responses/<request_id>.json` once it is ("uploaded") or never will be ("error").
    request_id: str | None = None

    @property
    def instance(self) -> StoreInstance:
        """The state store instance: (operator, partition, store)."""
        return StoreInstance(self.operator, self.partition, self.store)

    @property
    def zip_name(self) -> str:
        """Spark's name of this version's zip: `<v>.zip`, or `<v>_<id>.zip` in checkpoint format v2."""
        if self.spark_unique_id is None:
            return f"{self.version}.zip"
        return f"{self.version}_{self.spark_unique_id}.zip"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "snapshot",
            "query_id": self.query_id,
            "batch_id": self.batch_id,
            **_store_version_json(self),
            "staged_dir": str(self.staged_dir),
            "files": list(self.files),
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
            "stage_nanos": self.stage_nanos,
            "snapshot_version": self.snapshot_version,
            "changelog_versions": list(self.changelog_versions),
            "upgrade": self.upgrade,
            **({"request_id": self.request_id} if self.request_id is not None else {}),
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> SnapshotEvent:
        f = Fields(load_object(data, source), source)
        schema = f.schema()
        kind = f.str_("type")
        if kind != "snapshot":
            raise f.fail(f"type {kind!r} is not 'snapshot'")
        request_id = f.opt_str("request_id")
        if request_id is not None and not REQUEST_ID.match(request_id):
            raise f.fail(f"request_id {request_id!r} is not a safe file name token")
        return SnapshotEvent(
            query_id=f.opt_str("query_id"),
            batch_id=f.opt_int("batch_id"),
            checkpoint_root=f.abs_path("checkpoint_root"),
            dfs_dir=f.abs_path("dfs_dir"),
            operator=f.int_("operator"),
            partition=f.int_("partition"),
            store=f.str_("store"),
            version=f.int_("version", minimum=1),
            spark_unique_id=f.opt_str("spark_unique_id"),
            staged_dir=f.abs_path("staged_dir"),
            files=f.rel_paths("files"),
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            stage_nanos=f.int_("stage_nanos"),
            schema_version=schema,
            snapshot_version=f.opt_int("snapshot_version"),
            changelog_versions=f.int_list("changelog_versions", minimum=1),
            upgrade=f.bool_("upgrade", default=False),
            request_id=request_id,
        )


@dataclass(frozen=True)
class RestoreRequest:
    """The JVM asks for `version` of one store to be put back into `dfs_dir` before Spark loads it;
    `version` None: the latest version the query's checkpoints hold (a reader outside a micro-batch)."""

    request_id: str
    query_id: str | None
    checkpoint_root: Path
    dfs_dir: Path
    operator: int
    partition: int
    store: str
    version: int | None
    spark_unique_id: str | None
    executor_id: str
    created_at_ms: int
    missing: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def instance(self) -> StoreInstance:
        """The state store instance: (operator, partition, store)."""
        return StoreInstance(self.operator, self.partition, self.store)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "store",
            "request_id": self.request_id,
            "query_id": self.query_id,
            **_store_version_json(self),
            "missing": self.missing,
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> RestoreRequest:
        req = read_any_request(data, source)
        if not isinstance(req, RestoreRequest):
            raise SpoolFormatError(source, "not a store restore request")
        return req

    @staticmethod
    def _from_fields(f: Fields, request_id: str, schema: int) -> RestoreRequest:
        return RestoreRequest(
            request_id=request_id,
            query_id=f.opt_str("query_id"),
            checkpoint_root=f.abs_path("checkpoint_root"),
            dfs_dir=f.abs_path("dfs_dir"),
            operator=f.int_("operator"),
            partition=f.int_("partition"),
            store=f.str_("store"),
            version=f.int_("version", minimum=1) if schema == 1 else f.opt_int("version", minimum=1),
            spark_unique_id=f.opt_str("spark_unique_id"),
            missing=f.str_("missing", required=False, nonempty=False),
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            schema_version=schema,
        )


CheckpointLocationMode = Literal["start", "read"]


@dataclass(frozen=True)
class CheckpointLocationRequest:
    """The driver JVM asks for a query's checkpoint location to be made to resume from its latest
    durable checkpoint before Spark reads it (`mode` "start": a query starts on it, rebuild if missing,
    behind or ahead; "read": a reader that is not a query, rebuild only if it holds no files). Answered
    "restored" with what was done as the message, or "error" saying why the query must not start.
    `restore_stores`: this sidecar also serves the restores of the query's tasks (a local master runs
    them in the driver's JVM), so after a rebuild it restores the stores ahead of them."""

    request_id: str
    checkpoint_root: Path
    mode: CheckpointLocationMode
    executor_id: str
    created_at_ms: int
    schema_version: int = SCHEMA_VERSION
    restore_stores: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "checkpoint_location",
            "request_id": self.request_id,
            "checkpoint_root": str(self.checkpoint_root),
            "mode": self.mode,
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
            "restore_stores": self.restore_stores,
        }


@dataclass(frozen=True)
class PlanRequest:
    """The driver JVM is about to publish `offsets/<batch_id>` of the query on `checkpoint_root` and asks
    for the batch's plan to be stored first (runtime/ [C0]); `offsets` is the bytes it writes. Answered
    "uploaded" (message: the plan blob) once stored, or "error" saying why it is not."""

    request_id: str
    query_id: str | None
    checkpoint_root: Path
    batch_id: int
    offsets: builtins.bytes
    executor_id: str
    created_at_ms: int
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "plan",
            "request_id": self.request_id,
            "query_id": self.query_id,
            "checkpoint_root": str(self.checkpoint_root),
            "batch_id": self.batch_id,
            "offsets": base64.b64encode(self.offsets).decode("ascii"),
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
        }

    @staticmethod
    def _from_fields(f: Fields, request_id: str, schema: int) -> PlanRequest:
        try:
            offsets = base64.b64decode(f.str_("offsets"), validate=True)
        except binascii.Error as e:
            raise f.fail(f"offsets is not base64: {e}") from None
        return PlanRequest(
            request_id=request_id,
            query_id=f.opt_str("query_id"),
            checkpoint_root=f.abs_path("checkpoint_root"),
            batch_id=f.int_("batch_id"),
            offsets=offsets,
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            schema_version=schema,
        )


def read_any_request(
    data: bytes, source: str = "<bytes>"
) -> RestoreRequest | CheckpointLocationRequest | PlanRequest:
    """Parse a request file of any kind (`type` "store", the default, "checkpoint_location" or "plan")."""
    f = Fields(load_object(data, source), source)
    schema = f.schema()
    request_id = f.str_("request_id")
    if not REQUEST_ID.match(request_id):
        raise f.fail(f"request_id {request_id!r} is not a safe file name token")
    kind = f.str_("type", required=False) or "store"
    if kind == "store":
        return RestoreRequest._from_fields(f, request_id, schema)
    if kind == "checkpoint_location":
        mode = f.str_("mode")
        if mode not in ("start", "read"):
            raise f.fail(f"mode {mode!r} is not 'start' or 'read'")
        return CheckpointLocationRequest(
            request_id=request_id,
            checkpoint_root=f.abs_path("checkpoint_root"),
            mode=mode,  # type: ignore[arg-type]  # checked above
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            schema_version=schema,
            restore_stores=f.bool_("restore_stores", default=False),
        )
    if kind == "plan":
        return PlanRequest._from_fields(f, request_id, schema)
    raise f.fail(f"type {kind!r} is not 'store', 'checkpoint_location' or 'plan'")


@dataclass(frozen=True)
class RestoreResponse:
    """The sidecar's answer to one RestoreRequest."""

    request_id: str
    status: RestoreStatus
    message: str = ""
    files: int = 0
    bytes: int = 0
    duration_ms: int = 0

    def __post_init__(self) -> None:
        if self.status not in RESTORE_STATUSES:
            raise ValueError(f"status must be one of {sorted(RESTORE_STATUSES)}, not {self.status!r}")
        if not REQUEST_ID.match(self.request_id):
            raise ValueError(f"request_id {self.request_id!r} is not a safe file name token")

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "message": self.message,
            "files": self.files,
            "bytes": self.bytes,
            "duration_ms": self.duration_ms,
        }

    @staticmethod
    def from_json(data: builtins.bytes, source: str = "<bytes>") -> RestoreResponse:
        f = Fields(load_object(data, source), source)
        request_id = f.str_("request_id")
        status = f.str_("status")
        if status not in RESTORE_STATUSES:
            raise f.fail(f"status {status!r} is not one of {sorted(RESTORE_STATUSES)}")
        if not REQUEST_ID.match(request_id):
            raise f.fail(f"request_id {request_id!r} is not a safe file name token")
        return RestoreResponse(
            request_id=request_id,
            status=status,  # type: ignore[arg-type]  # checked against RESTORE_STATUSES above
            message=f.str_("message", required=False, nonempty=False),
            files=f.int_("files", required=False),
            bytes=f.int_("bytes", required=False),
            duration_ms=f.int_("duration_ms", required=False),
        )


@dataclass(frozen=True)
class SidecarMarker:
    """`sidecar.json`: tells the JVM which process serves this spool dir."""

    pid: int
    executor_id: str
    started_at_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "pid": self.pid,
            "started_at_ms": self.started_at_ms,
            "executor_id": self.executor_id,
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> SidecarMarker:
        f = Fields(load_object(data, source), source)
        f.schema()
        return SidecarMarker(
            pid=f.int_("pid", minimum=1),
            executor_id=f.str_("executor_id"),
            started_at_ms=f.int_("started_at_ms"),
        )
