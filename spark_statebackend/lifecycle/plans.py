"""Batch plans: what Spark planned for a batch, durable before the batch runs (runtime/ [C0]).

The combined checkpoint lags Spark: when a driver host dies, Spark may have written `offsets/<N+1>`,
`commits/<N+1>` and `offsets/<N+2>` after the latest checkpoint N, and a sink idempotent by batch id may
hold their output. A location rebuilt from N alone makes Spark plan N+1 again with other input and the
sink skip it: records lost. So each plan is stored, synchronously, before Spark publishes its offsets
(jvm-bridge DriverHooks asks the driver's sidecar), as one immutable blob per query and batch,

    plans/<Q>/<batch zero-padded>.json   {"schema_version": 1, "query_id", "batch_id", "app_id",
                                          "created_ms", "files": {<relative path>: <base64 bytes>}}

`files` holds `offsets/<M>` (the bytes Spark is writing), `commits/<M-1>` and every other driver file
Spark changed since the previous plan this sidecar stored (`sources/**`, `metadata`, `state/**/_*`:
spark/location.py `read_plan_files`). A plan is never overwritten: storing it again with the same
`offsets/<M>` (Spark re-ran a planned batch) is a no-op, with other offsets a PlanConflictError. The
driver-side restore places the plans after its checkpoint (spark/ [D4]); the committer's cleanup deletes
the plans its checkpoint covers (runtime/ [C6]). `app_id` is the writer's application identity
(runtime/spool `app_identity`), for the record; a fenced writer stores none (runtime/plan_store.py).
Plans carry no TTL: only a checkpoint makes one obsolete, and `gc` keeps everything under `plans/`.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field

import orjson

from ..common.names import check_name
from ..engine.blobs import blob_segment
from ..errors import BlobExistsError, BlobNotFoundError, StateBackendError
from ..stores import BlobStore

PLAN_SCHEMA = 1


class PlanConflictError(StateBackendError):
    """A plan of that batch is stored already with other offsets: Spark planned the batch again."""


@dataclass(frozen=True)
class Plan:
    """One batch's plan: Spark's driver files as they were when it published `offsets/<batch_id>`."""

    query_id: str
    batch_id: int
    files: dict[str, bytes]
    app_id: str = ""
    created_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    @property
    def offsets(self) -> bytes | None:
        """The bytes of `offsets/<batch_id>`, the plan itself."""
        return self.files.get(f"offsets/{self.batch_id}")

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "schema_version": PLAN_SCHEMA,
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "app_id": self.app_id,
                "created_ms": self.created_ms,
                "files": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(self.files.items())},
            }
        )

    @staticmethod
    def decode(data: bytes, blob_id: str) -> Plan:
        """The plan in `data`; StateBackendError naming `blob_id` if it is malformed or names a file that
        is not one of Spark's driver files of a checkpoint location (data, never a path to follow)."""
        try:
            doc = orjson.loads(data)
            if doc["schema_version"] != PLAN_SCHEMA:
                raise ValueError(f"schema_version {doc['schema_version']!r} is not {PLAN_SCHEMA}")
            files = {str(k): base64.b64decode(v, validate=True) for k, v in doc["files"].items()}
            plan = Plan(
                str(doc["query_id"]), int(doc["batch_id"]), files, str(doc["app_id"]), int(doc["created_ms"])
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, binascii.Error) as e:
            raise StateBackendError(f"malformed batch plan {blob_id!r}: {e}") from None
        bad = [p for p in files if not is_plan_path(p)]
        if bad or plan.offsets is None:
            why = f"names {bad[0]!r}" if bad else f"has no offsets/{plan.batch_id}"
            raise StateBackendError(f"batch plan {blob_id!r} {why}; it is not a plan this package wrote")
        return plan


def is_plan_path(rel: str) -> bool:
    """Whether `rel` may be a file of a plan: a safe relative path to `metadata`, an `offsets/<n>` or
    `commits/<n>` entry, a file under `sources/`, or one under `state/` below a component starting with
    '_' (operator metadata, state schemas: never store data)."""
    parts = rel.split("/")
    try:
        for part in parts:
            check_name(part)
    except ValueError:
        return False
    if parts == ["metadata"]:
        return True
    if parts[0] in ("offsets", "commits"):
        return len(parts) == 2 and parts[1].isdigit()
    if parts[0] == "sources":
        return len(parts) >= 2
    return parts[0] == "state" and any(p.startswith("_") for p in parts[1:-1])


def plans_prefix(query_id: str) -> str:
    """The blob folder of a query's plans."""
    return f"plans/{blob_segment(query_id)}/"


def plan_id(query_id: str, batch_id: int) -> str:
    """The blob id of `query_id`'s plan of `batch_id`."""
    return f"{plans_prefix(query_id)}{batch_id:012d}.json"


def store_plan(store: BlobStore, plan: Plan) -> tuple[str, bool]:
    """Store `plan` unless its blob exists; (blob id, True if written, False if it was there with the
    same offsets). PlanConflictError naming query, batch and blob if it was there with other offsets."""
    blob_id = plan_id(plan.query_id, plan.batch_id)
    try:
        store.create(blob_id, plan.encode(), metadata={"kind": "batch-plan"})
        return blob_id, True
    except BlobExistsError:
        pass
    existing = read_plan(store, plan.query_id, plan.batch_id)
    if existing is not None and existing.offsets == plan.offsets:
        return blob_id, False
    if existing is None:  # deleted between the two calls: a checkpoint covers the batch now
        return blob_id, False
    raise PlanConflictError(
        f"query {plan.query_id} batch {plan.batch_id}: plan {blob_id} holds other offsets than the ones "
        f"Spark is writing now (stored by application {existing.app_id or 'unknown'}); Spark planned this "
        "batch again, which would make a sink idempotent by batch id skip records. Was the checkpoint "
        "location rebuilt from an older checkpoint, or does another application run this query?"
    )


def read_plan(store: BlobStore, query_id: str, batch_id: int) -> Plan | None:
    """`query_id`'s plan of `batch_id`, None if there is none; StateBackendError naming a malformed one."""
    blob_id = plan_id(query_id, batch_id)
    try:
        data = store.get_bytes(blob_id)
    except BlobNotFoundError:
        return None
    plan = Plan.decode(data, blob_id)
    if plan.query_id != query_id or plan.batch_id != batch_id:
        raise StateBackendError(
            f"batch plan {blob_id!r} is of query {plan.query_id} batch {plan.batch_id}, not of its name"
        )
    return plan


def plan_batches(store: BlobStore, query_id: str) -> list[int]:
    """The batches `query_id` has plans of, ascending."""
    prefix = plans_prefix(query_id)
    found = []
    for info in store.list(prefix):
        name = info.blob_id[len(prefix) :].removesuffix(".json")
        if name.isdigit():
            found.append(int(name))
    return sorted(found)


def delete_plans(store: BlobStore, query_id: str, up_to_batch: int) -> int:
    """Delete `query_id`'s plans of batches <= `up_to_batch` (a checkpoint covers them); return how many."""
    doomed = [plan_id(query_id, b) for b in plan_batches(store, query_id) if b <= up_to_batch]
    store.delete_many(doomed)
    return len(doomed)
