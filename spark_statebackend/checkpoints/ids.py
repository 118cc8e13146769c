"""The ids a combined checkpoint is made of: query ids, checkpoint ids, store instance keys, flat
state markers, and the immutable map the checkpoint holds them in (checkpoint.py: CheckpointV2).

Guarantees:
- `CheckpointId` is unique and ordered: ordered by time (epoch millis, then a sub-millisecond
  part, as Samza's `millis-nanos` id), then by batch id; `CheckpointId.create` never issues the
  same or a smaller id twice in one process and, given the query's previous id, never one smaller
  than that (a clock stepping back cannot reorder a query's checkpoints). Its string form
  `<millis>-<nanos, 6 digits>-<batch id>` is stable, and `CheckpointId.parse` accepts exactly what
  `str()` produces. There is no placeholder id: every checkpoint has a real one.
- store instance key: `<operator>/<partition>/<store name>` (`StoreInstance`, whose home is
  store_instance.py beside this: the engine names blobs by it); parsed by splitting on the first two '/'
  only, so a store name containing '/' still parses.
- batch N commits state version N+1 (Spark's stores start empty at version 0): `version_of_batch` and
  `batch_of_version` are the one statement of that relation.
- flat marker: `<backend>:<payload>` (`StateMarker`); parsed by splitting on the first ':' only, so
  a payload containing ':' (a URL, a path) still parses.
- `FrozenMap` is an immutable, hashable copy of a mapping.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .store_instance import MAX_INT64, StoreInstance

__all__ = [
    "MAX_INT64",
    "CheckpointId",
    "FrozenMap",
    "StateMarker",
    "StoreInstance",
    "batch_of_version",
    "check_backend",
    "check_query_id",
    "version_of_batch",
]

# Spark query ids are UUIDs; anything safe as a file name, a Kafka key and a transactional.id suffix
# is accepted so that the CLI and tests can use readable ids.
_QUERY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_BACKEND_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_CHECKPOINT_ID_RE = re.compile(r"(0|[1-9][0-9]{0,18})-([0-9]{6})-(0|[1-9][0-9]{0,18})")


def version_of_batch(batch_id: int) -> int:
    """The state version micro-batch `batch_id` commits: batch N commits version N+1."""
    return batch_id + 1


def batch_of_version(version: int) -> int:
    """The micro-batch that commits state `version` (the inverse of `version_of_batch`)."""
    return version - 1


def check_query_id(query_id: str) -> str:
    """Return `query_id` if it is usable as a log key (1-200 chars of [A-Za-z0-9._-], not starting
    with '.', '_' or '-'), else raise ValueError saying why."""
    if not isinstance(query_id, str) or not _QUERY_ID_RE.fullmatch(query_id):
        raise ValueError(
            f"query id {query_id!r} must be 1-200 characters of [A-Za-z0-9._-] "
            "starting with a letter or digit"
        )
    return query_id


K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """An immutable, hashable copy of a mapping. Equal to any mapping with the same items."""

    __slots__ = ("_d", "_hash")

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        self._d: dict[K, V] = dict(items or {})
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._d[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._d == other._d
        if isinstance(other, Mapping):
            return self._d == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._d.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def to_dict(self) -> dict[K, Any]:
        """A plain (mutable) dict copy, nested FrozenMaps converted too."""
        return {k: (v.to_dict() if isinstance(v, FrozenMap) else v) for k, v in self._d.items()}


_id_lock = threading.Lock()
_last_issued: tuple[int, int] = (0, 0)  # (millis, nanos) of the last id this process created


@dataclass(frozen=True, order=True)
class CheckpointId:
    """Unique, ordered id of one combined checkpoint. Ordered by (millis, nanos, batch_id).

    `millis` is epoch milliseconds, `nanos` the sub-millisecond part in nanoseconds (0..999999),
    `batch_id` Spark's micro-batch id whose commit this checkpoint records."""

    millis: int
    nanos: int
    batch_id: int

    def __post_init__(self) -> None:
        for name, value, hi in (
            ("millis", self.millis, MAX_INT64),
            ("nanos", self.nanos, 999_999),
            ("batch_id", self.batch_id, MAX_INT64),
        ):
            if type(value) is not int or not 0 <= value <= hi:
                raise ValueError(f"CheckpointId.{name}={value!r} must be an int in [0, {hi}]")

    @classmethod
    def create(
        cls,
        batch_id: int,
        *,
        after: CheckpointId | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> CheckpointId:
        """A new id for `batch_id` from the wall clock, strictly greater in time than every id this
        process created before and than `after` (pass the query's latest checkpoint id)."""
        global _last_issued
        with _id_lock:
            t = divmod(clock_ns(), 1_000_000)
            floor = _last_issued
            if after is not None and (after.millis, after.nanos) > floor:
                floor = (after.millis, after.nanos)
            if t <= floor:
                # Clock did not advance (or stepped back): take the next nanosecond after the floor.
                t = divmod(floor[0] * 1_000_000 + floor[1] + 1, 1_000_000)
            _last_issued = max(_last_issued, t)
            return cls(t[0], t[1], batch_id)

    @classmethod
    def parse(cls, text: str) -> CheckpointId:
        """Parse exactly the form `str()` produces; raise ValueError otherwise (no whitespace, no
        signs, no leading zeros, exactly six sub-millisecond digits)."""
        m = _CHECKPOINT_ID_RE.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise ValueError(
                f"checkpoint id {text!r} is not of the form <millis>-<nanos:6 digits>-<batch id>"
            )
        millis, nanos, batch = (int(g) for g in m.groups())
        if millis > MAX_INT64 or batch > MAX_INT64:
            raise ValueError(f"checkpoint id {text!r} is out of range")
        return cls(millis, nanos, batch)

    def __str__(self) -> str:
        return f"{self.millis}-{self.nanos:06d}-{self.batch_id}"


@dataclass(frozen=True)
class StateMarker:
    """A state checkpoint marker tagged with its backend; flat form `<backend>:<payload>`."""

    backend: str
    payload: str

    def __post_init__(self) -> None:
        check_backend(self.backend)
        if not isinstance(self.payload, str) or not self.payload:
            raise ValueError(f"marker payload {self.payload!r} must be a non-empty string")

    @classmethod
    def parse(cls, text: str) -> StateMarker:
        """Parse `<backend>:<payload>`, splitting on the first ':' only."""
        parts = text.split(":", 1) if isinstance(text, str) else []
        if len(parts) != 2:
            raise ValueError(f"state marker {text!r} is not of the form <backend>:<payload>")
        return cls(parts[0], parts[1])

    def __str__(self) -> str:
        return f"{self.backend}:{self.payload}"


def check_backend(backend: str) -> str:
    """Return `backend` if it is a usable backend name, else raise ValueError."""
    if not isinstance(backend, str) or not _BACKEND_RE.fullmatch(backend):
        raise ValueError(f"backend name {backend!r} must match [a-z][a-z0-9_-]{{0,63}}")
    return backend
