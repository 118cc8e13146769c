"""The spool's changelog stream document (the protocol is in runtime/spool/__init__.py): a changelog Spark
is writing, which the sidecar uploads while it grows (runtime/changelog_streams.py). Parsing refuses,
naming the file, anything malformed, of an unknown schema version, or naming a file that is not the
changelog of the document's version (fields.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...checkpoints.store_instance import StoreInstance
from .documents import SCHEMA_VERSION
from .fields import Fields, load_object


@dataclass(frozen=True)
class ChangelogStream:
    """A changelog Spark is writing, hard-linked by the JVM as `staged_dir/file` while it grows, so the
    sidecar uploads its bytes before the commit (runtime/changelog_streams.py)."""

    query_id: str
    checkpoint_root: Path
    operator: int
    partition: int
    store: str
    version: int
    staged_dir: Path
    file: str
    executor_id: str
    created_at_ms: int
    schema_version: int = SCHEMA_VERSION

    @property
    def instance(self) -> StoreInstance:
        """The state store instance: (operator, partition, store)."""
        return StoreInstance(self.operator, self.partition, self.store)

    @property
    def path(self) -> Path:
        """The hard link to the changelog being written."""
        return self.staged_dir / self.file

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "type": "changelog_stream",
            "query_id": self.query_id,
            "checkpoint_root": str(self.checkpoint_root),
            "operator": self.operator,
            "partition": self.partition,
            "store": self.store,
            "version": self.version,
            "staged_dir": str(self.staged_dir),
            "file": self.file,
            "executor_id": self.executor_id,
            "created_at_ms": self.created_at_ms,
        }

    @staticmethod
    def from_json(data: bytes, source: str = "<bytes>") -> ChangelogStream:
        f = Fields(load_object(data, source), source)
        schema = f.schema()
        kind = f.str_("type")
        if kind != "changelog_stream":
            raise f.fail(f"type {kind!r} is not 'changelog_stream'")
        version = f.int_("version", minimum=1)
        name = f.str_("file")
        m = _CHANGELOG_NAME.match(name)
        if m is None or int(m.group(1)) != version:
            raise f.fail(f"file {name!r} is not the changelog of version {version}")
        return ChangelogStream(
            query_id=f.str_("query_id"),
            checkpoint_root=f.abs_path("checkpoint_root"),
            operator=f.int_("operator"),
            partition=f.int_("partition"),
            store=f.str_("store"),
            version=version,
            staged_dir=f.abs_path("staged_dir"),
            file=name,
            executor_id=f.str_("executor_id"),
            created_at_ms=f.int_("created_at_ms"),
            schema_version=schema,
        )


#: Spark's changelog names: `<v>.changelog`, `<v>_<id>.changelog` (checkpoint format v2).
_CHANGELOG_NAME = re.compile(r"^([0-9]+)(_[A-Za-z0-9-]+)?\.changelog$")
