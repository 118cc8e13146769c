"""The value types of a `spark.statebackend.*` key and `Setting`, the one declaration of a key that the
KEYS table (spark_statebackend/settings.py) is made of: how a key's spark.conf text is parsed, with its
bounds or allowed values, and how its README type cell reads. Every parse error is a ConfigError naming
the key and the bad value (never a secret: a URL is shown redacted).

Kept apart from settings.py so that the table is that module's one job; nothing here knows a key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..errors import ConfigError
from .crashpoints import CrashSpec, parse_spec
from .units import parse_duration_ms, parse_size
from .urls import redact_url, refuse_userinfo

PREFIX = "spark.statebackend."


def parse_bool(text: str, key: str) -> bool:
    """'true' or 'false', case-insensitive, as Spark (and the JVM shim) read booleans."""
    v = str(text).strip().lower()
    if v == "true":
        return True
    if v == "false":
        return False
    raise ConfigError(key, f"{text!r} is not a boolean: write true or false")


def parse_int(text: str, key: str, minimum: int, maximum: int) -> int:
    """A whole number in [minimum, maximum]; ConfigError naming `key` otherwise."""
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ConfigError(key, f"{text!r} is not a whole number") from None
    if not minimum <= v <= maximum:
        raise ConfigError(key, f"{v} is outside [{minimum}, {maximum}]")
    return v


def _one_of(text: str, key: str, allowed: tuple[str, ...]) -> str:
    v = text.strip().lower()
    if v not in allowed:
        raise ConfigError(key, f"expected one of {', '.join(allowed)}, got {text!r}")
    return v


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ValueType(Protocol[T_co]):
    """How a setting's text is read, with its bounds or allowed values (one object per setting)."""

    def parse(self, text: str, key: str) -> T_co:
        """The value of `text`; ConfigError naming `key` and the bad value if it is not one."""
        ...

    def describe(self) -> str:
        """The README's type cell (markdown)."""
        ...


@dataclass(frozen=True)
class Boolean:
    def parse(self, text: str, key: str) -> bool:
        return parse_bool(text, key)

    def describe(self) -> str:
        return "`true` or `false`"


@dataclass(frozen=True)
class WholeNumber:
    minimum: int
    maximum: int

    def parse(self, text: str, key: str) -> int:
        return parse_int(text, key, self.minimum, self.maximum)

    def describe(self) -> str:
        return f"whole number, {self.minimum} to {self.maximum}"


@dataclass(frozen=True)
class Duration:
    """Whole milliseconds (the JVM reads the same keys in milliseconds); `positive` refuses 0."""

    positive: bool = False

    def parse(self, text: str, key: str) -> int:
        return parse_duration_ms(text, key, positive=self.positive)

    def describe(self) -> str:
        return "duration, at least `1ms`" if self.positive else "duration"


@dataclass(frozen=True)
class Size:
    def parse(self, text: str, key: str) -> int:
        return parse_size(text, key)

    def describe(self) -> str:
        return "size"


@dataclass(frozen=True)
class OneOf:
    """One of `allowed`, case-insensitive; the value is lower-cased."""

    allowed: tuple[str, ...]

    def parse(self, text: str, key: str) -> str:
        return _one_of(text, key, self.allowed)

    def describe(self) -> str:
        names = [f"`{a}`" for a in self.allowed]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


@dataclass(frozen=True)
class Url:
    """A URL with one of `schemes` and no credentials in it (they would be logged)."""

    schemes: tuple[str, ...]

    def parse(self, text: str, key: str) -> str:
        refuse_userinfo(text, key)
        scheme = text.split("://", 1)[0].lower() if "://" in text else ""
        if scheme not in self.schemes:
            raise ConfigError(
                key, f"unknown URL scheme in {redact_url(text)!r}; use one of {', '.join(self.schemes)}"
            )
        return text

    def describe(self) -> str:
        return "URL: " + OneOf(tuple(f"{s}://" for s in self.schemes)).describe()


@dataclass(frozen=True)
class Text:
    """Any text; `what` names it in the README (path, class name, ...)."""

    what: str

    def parse(self, text: str, key: str) -> str:
        return text

    def describe(self) -> str:
        return self.what


@dataclass(frozen=True)
class CrashPoints:
    def parse(self, text: str, key: str) -> tuple[CrashSpec, ...]:
        return parse_spec(text, key)

    def describe(self) -> str:
        return "crash points"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One spark.statebackend.* key, declared once: everything else (Settings, validation, the README
    table, the check of Conf.java's defaults) is derived from it.

    `name` follows PREFIX; a name ending in `.<name>` declares a family of keys (backend options).
    `default` is what an unset key means, as spark.conf text; "" when an unset key means something
    computed at run time (said by `unset`, for the README) or nothing. `deprecated` lists older
    names (after PREFIX) still read."""

    name: str
    type: ValueType[T]
    default: str
    doc: str
    unset: str = ""
    deprecated: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The full spark.conf key (for a family: its pattern, with `<name>`)."""
        return PREFIX + self.name

    @property
    def family(self) -> str:
        """For a family of keys, the prefix every member starts with; "" for a single key."""
        return self.key[: -len("<name>")] if self.name.endswith(".<name>") else ""

    @property
    def shown_default(self) -> str:
        """The README's default: the default, else what an unset key means."""
        return self.default or self.unset

    def text(self, conf: Mapping[str, str], default: str | None = None) -> str:
        """The key's text in `conf`, else `default`, else the declared default."""
        return str(conf.get(self.key, self.default if default is None else default))

    def read(self, conf: Mapping[str, str], default: str | None = None) -> T:
        """The key's value in `conf` (unset: `default` if given, else the declared default), parsed by
        its type; ConfigError naming the key and the bad value."""
        return self.type.parse(self.text(conf, default), self.key)
