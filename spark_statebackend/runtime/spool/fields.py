"""Reading the spool's JSON documents (documents.py) strictly: every failure is a SpoolFormatError
naming the file; names are data, so every path field must be absolute and every relative path stay
inside its base.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from ...errors import StateBackendError

#: Spool documents this code reads: 1 (before changelog checkpointing and driver-side requests), 2.
READABLE_SCHEMA_VERSIONS = frozenset({1, 2})
MAX_FILE_BYTES = 16 * 1024 * 1024  # a spool file is a few hundred bytes; more means it is not ours


class SpoolFormatError(StateBackendError):
    """A spool file is malformed, of an unknown schema version, or not what its name promises."""

    def __init__(self, source: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"bad spool file {os.fspath(source)!r}: {problem}")
        self.source = os.fspath(source)
        self.problem = problem


class Fields:
    """Typed access to one parsed JSON object; every failure names the file."""

    def __init__(self, obj: Mapping[str, Any], source: str) -> None:
        self.obj = obj
        self.source = source

    def fail(self, problem: str) -> SpoolFormatError:
        return SpoolFormatError(self.source, problem)

    def _get(self, name: str, required: bool) -> Any:
        if name not in self.obj:
            if required:
                raise self.fail(f"missing field {name!r}")
            return None
        return self.obj[name]

    def str_(self, name: str, *, required: bool = True, nonempty: bool = True) -> str:
        v = self._get(name, required)
        if v is None and not required:
            return ""
        if not isinstance(v, str) or (nonempty and not v):
            raise self.fail(f"field {name!r} must be a{' non-empty' if nonempty else ''} string, got {v!r}")
        return v

    def opt_str(self, name: str) -> str | None:
        v = self._get(name, False)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.fail(f"field {name!r} must be a string or null, got {v!r}")
        return v

    def int_(self, name: str, *, minimum: int = 0, required: bool = True, default: int = 0) -> int:
        v = self._get(name, required)
        if v is None and not required:
            return default
        # bool is an int subclass in Python; JSON true is not a number here
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise self.fail(f"field {name!r} must be an integer >= {minimum}, got {v!r}")
        return v

    def bool_(self, name: str, *, default: bool) -> bool:
        v = self._get(name, False)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(f"field {name!r} must be true or false, got {v!r}")
        return v

    def opt_int(self, name: str, *, minimum: int = 0) -> int | None:
        v = self._get(name, False)
        if v is None:
            return None
        return self.int_(name, minimum=minimum)

    def abs_path(self, name: str) -> Path:
        v = self.str_(name)
        if "\x00" in v or not os.path.isabs(v):
            raise self.fail(f"field {name!r} must be an absolute path, got {v!r}")
        return Path(v)

    def rel_paths(self, name: str) -> tuple[str, ...]:
        v = self._get(name, False)
        if v is None:
            return ()
        if not isinstance(v, list):
            raise self.fail(f"field {name!r} must be a list of relative paths, got {v!r}")
        out = []
        for item in v:
            if not isinstance(item, str) or not is_safe_relative(item):
                raise self.fail(f"field {name!r} holds an unsafe or non-string path {item!r}")
            out.append(item)
        return tuple(out)

    def schema(self) -> int:
        version = self.int_("schema_version", minimum=0)
        if version not in READABLE_SCHEMA_VERSIONS:
            raise self.fail(f"schema_version {version} is not one of {sorted(READABLE_SCHEMA_VERSIONS)}")
        return version

    def int_list(self, name: str, *, minimum: int = 0) -> tuple[int, ...]:
        v = self._get(name, False)
        if v is None:
            return ()
        if not isinstance(v, list) or any(
            not isinstance(x, int) or isinstance(x, bool) or x < minimum for x in v
        ):
            raise self.fail(f"field {name!r} must be a list of integers >= {minimum}, got {v!r}")
        return tuple(v)


def is_safe_relative(p: str) -> bool:
    """A relative path that stays inside its base: names are data, not paths."""
    if not p or "\x00" in p or "\\" in p or p.startswith("/"):
        return False
    parts = PurePosixPath(p).parts
    return all(part not in ("", ".", "..") for part in parts) and "/".join(parts) == p


def load_object(data: bytes, source: str) -> dict[str, Any]:
    if len(data) > MAX_FILE_BYTES:
        raise SpoolFormatError(source, f"{len(data)} bytes is too large for a spool file")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise SpoolFormatError(source, f"not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise SpoolFormatError(source, f"not a JSON object but {type(obj).__name__}")
    return obj
