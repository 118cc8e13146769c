"""Typed reading of a checkpoint log's string options; unknown or malformed options fail at open time,
naming the option and the configuration key it belongs to."""

from __future__ import annotations

from collections.abc import Mapping

from ...common.units import deprecated_name, parse_duration_ms, parse_legacy_ms
from ...errors import ConfigError


class Options:
    """Reads options out of a string map; `finish()` rejects any option nobody asked for."""

    def __init__(self, options: Mapping[str, str], key: str) -> None:
        self._opts = dict(options)
        self._used: set[str] = set()
        self._declared: list[str] = []
        self._key = key

    def _err(self, name: str, problem: str) -> ConfigError:
        return ConfigError(f"{self._key} option {name!r}", problem)

    def _declare(self, name: str) -> None:
        self._used.add(name)
        self._declared.append(name)

    def string(self, name: str, default: str) -> str:
        self._declare(name)
        return str(self._opts.get(name, default))

    def integer(self, name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        self._declare(name)
        raw = self._opts.get(name)
        if raw is None:
            return default
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise self._err(name, f"{raw!r} is not an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
            raise self._err(name, f"{value} is out of range (must be {bound})")
        return value

    def duration_ms(
        self, name: str, default: str, *, legacy_ms: str | None = None, minimum_ms: int = 1
    ) -> int:
        """Option `name` as whole milliseconds, in Spark's duration grammar (common/units.py), at least
        `minimum_ms`; `default` is a duration text. `legacy_ms` is the option's deprecated name whose
        value is a bare number of milliseconds: still read for one release, with a warning; giving
        both names is an error."""
        self._declare(name)
        if legacy_ms is not None:
            self._used.add(legacy_ms)
        raw = self._opts.get(name)
        if legacy_ms is not None and legacy_ms in self._opts:
            if raw is not None:
                raise self._err(
                    legacy_ms, f"deprecated spelling of {name!r}, which is also set; keep only {name!r}"
                )
            deprecated_name(f"{self._key} option {legacy_ms!r}", repr(name), default)
            value = parse_legacy_ms(self._opts[legacy_ms], f"{self._key} option {legacy_ms!r}", minimum=1)
            name = legacy_ms
        else:
            value = parse_duration_ms(default if raw is None else raw, f"{self._key} option {name!r}")
        if value < minimum_ms:
            raise self._err(name, f"{value} ms is out of range (must be at least {minimum_ms} ms)")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        self._declare(name)
        raw = self._opts.get(name)
        if raw is None:
            return default
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise self._err(name, f"{raw!r} is not a boolean (true/false)")

    def prefixed(self, prefix: str) -> dict[str, str]:
        """Every option starting with `prefix`, with the prefix removed (pass-through settings)."""
        self._declared.append(prefix + "*")
        out = {}
        for name, value in self._opts.items():
            if name.startswith(prefix):
                self._used.add(name)
                out[name[len(prefix) :]] = str(value)
        return out

    def finish(self) -> None:
        unknown = sorted(set(self._opts) - self._used)
        if unknown:
            raise self._err(
                unknown[0], f"unknown option; known options: {', '.join(self._declared) or 'none'}"
            )
