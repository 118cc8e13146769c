"""The store instance: one state store of one partition of one stateful operator, the unit every snapshot,
marker, report and restore is kept per. `StoreInstance` is the one home of its forms:

- key `<operator>/<partition>/<store name>` (`key`): the key of a checkpoint's marker maps, of marker
  reports, and the `<store>` of blob folders (blobs.py). `parse` splits on the first two '/' only, so
  it inverts `key` for every instance, a store name containing '/' included (`parse(i.key) == i`);
  it accepts nothing `key` cannot produce (no signs, no leading zeros, no empty store name).
- `parse_or_none`: the same, None for a key that names no instance (the command line's own store names,
  the committer's `_driver` pseudo store).
- its dir in a Spark checkpoint location (`dir_parts`): `state/<operator>/<partition>[/<store name>]`,
  Spark omitting the default store's name. A store name that is not one safe path component has no dir
  there (ValueError): a name from a checkpoint is data, never a path.

It lives with the checkpoint model (checkpoints/, below the engine), so that the engine (which fills a
snapshot's operator and partition from the key), the checkpoint's marker maps, lifecycle/, spark/ and
runtime/ all share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..common.names import check_name

MAX_INT64 = (1 << 63) - 1
#: Spark's name of a stateful operator's only store; its dir is the partition's own.
DEFAULT_STORE_NAME = "default"
_UINT_RE = re.compile(r"0|[1-9][0-9]{0,18}")


@dataclass(frozen=True, order=True)
class StoreInstance:
    """One state store instance of a query: (operator id, partition id, store name)."""

    operator: int
    partition: int
    store_name: str

    def __post_init__(self) -> None:
        for name, value in (("operator", self.operator), ("partition", self.partition)):
            if type(value) is not int or not 0 <= value <= MAX_INT64:
                raise ValueError(f"StoreInstance.{name}={value!r} must be a non-negative int")
        if not isinstance(self.store_name, str) or not self.store_name:
            raise ValueError(f"StoreInstance.store_name={self.store_name!r} must be a non-empty string")

    @property
    def key(self) -> str:
        """`<operator>/<partition>/<store name>`, the key in a checkpoint's marker maps."""
        return f"{self.operator}/{self.partition}/{self.store_name}"

    @classmethod
    def parse(cls, key: str) -> StoreInstance:
        """Parse `<operator>/<partition>/<store name>`; the store name may itself contain '/'. Raises
        ValueError naming the key for anything `key` cannot produce."""
        found = cls.parse_or_none(key)
        if found is None:
            raise ValueError(
                f"store instance key {key!r} is not of the form <operator>/<partition>/<store name>"
            )
        return found

    @classmethod
    def parse_or_none(cls, key: str) -> StoreInstance | None:
        """The instance `key` names (as `parse`), or None when it names none."""
        parts = key.split("/", 2) if isinstance(key, str) else []
        if len(parts) != 3 or not _UINT_RE.fullmatch(parts[0]) or not _UINT_RE.fullmatch(parts[1]):
            return None
        operator, partition = int(parts[0]), int(parts[1])
        if operator > MAX_INT64 or partition > MAX_INT64 or not parts[2]:
            return None
        return cls(operator, partition, parts[2])

    def dir_parts(self) -> tuple[str, ...]:
        """The store's dir in a Spark checkpoint location as path parts: `state/<op>/<part>` for the
        default store, else `state/<op>/<part>/<store name>`. Raises ValueError when the store name is
        not one safe path component (it contains '/', or is '.' or '..')."""
        parts = ("state", str(self.operator), str(self.partition))
        if self.store_name == DEFAULT_STORE_NAME:
            return parts
        return (*parts, check_name(self.store_name, what="store name"))

    def __str__(self) -> str:
        return self.key
