"""Durations and sizes: one grammar for every key, option and flag, Spark's own.

Spark reads durations with `JavaUtils.timeStringAs` and sizes with `JavaUtils.byteStringAs`
(spark-common-utils-java; the JVM shim reads its keys with `SparkConf.getTimeAsMs`, which uses it).
This module is our own implementation of the same grammar, so a value the Python side accepts means
exactly what it means to the JVM. The rules, as Spark 4.3.0 applies them (checked against the jar by
tests/common/test_units.py when a JVM is available):

  - the text is trimmed and lower-cased, then must be a whole number followed directly by a unit:
    no fraction ("1.5s" is refused), no space between number and unit ("5 s" is refused), no "+";
  - duration units: us, ms, s, m or min, h, d (case-insensitive; no "y", "w" or "sec");
    sub-millisecond amounts are truncated to whole milliseconds, as Spark converts to milliseconds;
  - size units, all binary multiples: b; k, ki, kb, kib (1024); m, mi, mb, mib; g, gi, gb, gib;
    t, ti, tb, tib; p, pi, pb, pib (case-insensitive, so 64MiB = 64m = 64MB = 67108864 bytes);
  - values must fit a signed 64-bit long (Spark's own limit).

Where we are stricter than Spark (never looser, so nothing we accept reads differently on the JVM):

  - a duration needs a unit; only a bare "0" is accepted. Spark reads a bare number in the key's own
    unit (milliseconds for every key the shim reads, seconds for some of Spark's own keys), which is
    how `maxCommitDelay=60` once meant 60 s to the sidecar and 60 ms to the shim;
  - negative durations are refused (Spark's pattern allows a minus sign; no setting here has a use
    for one);
  - a bare size is bytes, as in byteStringAsBytes.

Keys whose *name* carries the unit (`*_seconds`, `*.ms`, `restoreTimeoutMs`) are deprecated: they
keep their old meaning (a bare number in that unit) for one release, with a warning naming the new
key (see `deprecated_name`).
"""

from __future__ import annotations

import logging
import re
import threading

from ..errors import ConfigError

log = logging.getLogger("spark_statebackend.units")  # name kept from the flat layout

LONG_MAX = 2**63 - 1

_NUMBER_UNIT = re.compile(r"(-?[0-9]+)([a-z]+)?")
_FRACTION = re.compile(r"-?[0-9]+\.[0-9]+[a-z]*")

#: Microseconds per duration unit (Spark's timeSuffixes).
DURATION_UNITS: dict[str, int] = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}

#: Bytes per size unit (Spark's byteSuffixes: every spelling is a binary multiple).
SIZE_UNITS: dict[str, int] = {"b": 1}
for _power, _letter in enumerate("kmgtp", start=1):
    for _spelling in (_letter, _letter + "i", _letter + "b", _letter + "ib"):
        SIZE_UNITS[_spelling] = 1024**_power

DURATION_HELP = "a whole number with a unit: us, ms, s, m or min, h, d (e.g. 500ms, 30s, 10min, 7d)"
SIZE_HELP = "a whole number of bytes, or with a binary unit: k, m, g, t, p (e.g. 512k, 64m, 64MiB, 1g)"


def parse_duration_ms(text: object, key: str, *, positive: bool = False) -> int:
    """Whole milliseconds of a duration in Spark's grammar (module doc), for the setting named `key`.

    A unit is required except for "0". `positive` refuses zero. Raises ConfigError naming `key` and
    saying what is wrong; never returns a negative number."""
    raw = str(text)
    lower = raw.strip().lower()
    m = _NUMBER_UNIT.fullmatch(lower)
    if m is None:
        if _FRACTION.fullmatch(lower):
            raise ConfigError(key, f"{raw!r}: fractions are not accepted; write {DURATION_HELP}")
        raise ConfigError(key, f"{raw!r} is not a duration; write {DURATION_HELP}")
    number, unit = int(m.group(1)), m.group(2)
    if abs(number) > LONG_MAX:
        raise ConfigError(key, f"{raw!r} is too large")
    if unit is None:
        if number != 0:
            raise ConfigError(
                key,
                f"{raw!r} has no unit; write e.g. {number}s or {number}ms (a bare number means seconds "
                "to some readers and milliseconds to others, so a unit is required)",
            )
        unit = "ms"
    if unit not in DURATION_UNITS:
        raise ConfigError(key, f"{raw!r}: unknown unit {unit!r}; write {DURATION_HELP}")
    if number < 0:
        raise ConfigError(key, f"{raw!r} must not be negative")
    # Spark converts with TimeUnit: truncation below a millisecond, saturation at Long.MAX_VALUE.
    ms = min(number * DURATION_UNITS[unit] // 1000, LONG_MAX)
    if positive and ms == 0:
        raise ConfigError(key, f"{raw!r} must be at least 1ms")
    return ms


def parse_duration(text: object, key: str, *, positive: bool = False) -> float:
    """Seconds of a duration in Spark's grammar (see parse_duration_ms; whole milliseconds)."""
    return parse_duration_ms(text, key, positive=positive) / 1000.0


def parse_size(text: object, key: str, *, minimum: int = 1) -> int:
    """Bytes of a size in Spark's grammar (module doc; a bare number is bytes), at least `minimum`.

    Raises ConfigError naming `key`."""
    raw = str(text)
    lower = raw.strip().lower()
    m = _NUMBER_UNIT.fullmatch(lower)
    if m is None or m.group(1).startswith("-"):
        if _FRACTION.fullmatch(lower):
            raise ConfigError(key, f"{raw!r}: fractions are not accepted; write {SIZE_HELP}")
        raise ConfigError(key, f"{raw!r} is not a size; write {SIZE_HELP}")
    unit = m.group(2) or "b"
    if unit not in SIZE_UNITS:
        raise ConfigError(key, f"{raw!r}: unknown unit {unit!r}; write {SIZE_HELP}")
    value = int(m.group(1)) * SIZE_UNITS[unit]
    if value > LONG_MAX:
        raise ConfigError(key, f"{raw!r} is too large")
    if value < minimum:
        raise ConfigError(key, f"{raw!r} must be at least {format_size(minimum)}")
    return value


def format_size(nbytes: int | float) -> str:
    """Human-readable binary size: '0 B', '512 B', '1.5 KiB', '64 MiB', '2.1 GiB'."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}".replace(".0 ", " ")
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_duration(seconds: float) -> str:
    """A duration in the grammar above, in the largest unit that divides it: 6h, 30min, 1500ms, 0s."""
    us = round(seconds * 1_000_000)
    if us == 0:
        return "0s"
    for unit in ("d", "h", "min", "s", "ms"):
        size = DURATION_UNITS[unit]
        if us % size == 0:
            return f"{us // size}{unit}"
    return f"{us}us"


# -- deprecated names whose unit is in the name ------------------------------------------------------

_warned: set[str] = set()
_warned_lock = threading.Lock()


def deprecated_name(old: str, new: str, example: str) -> None:
    """Log, once per process and name, that `old` is deprecated in favour of `new` (e.g. '30s')."""
    with _warned_lock:
        if old in _warned:
            return
        _warned.add(old)
    log.warning(
        "%s is deprecated and will be removed in the next release: use %s with a unit instead (e.g. %s)",
        old,
        new,
        example,
    )


def parse_legacy_seconds(text: object, key: str, *, positive: bool = True) -> float:
    """A deprecated `*_seconds` value: a plain (possibly fractional) number of seconds, as before."""
    raw = str(text)
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(key, f"{raw!r} is not a number of seconds") from None
    if value != value or value in (float("inf"), float("-inf")):  # NaN or infinite
        raise ConfigError(key, f"{raw!r} is not a number of seconds")
    if value < 0 or (positive and value == 0):
        raise ConfigError(key, f"must be {'positive' if positive else 'at least 0'}, got {raw!r}")
    return value


def parse_legacy_ms(text: object, key: str, *, minimum: int = 1) -> int:
    """A deprecated `*.ms` / `*Ms` value: a whole number of milliseconds, as before."""
    raw = str(text)
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(key, f"{raw!r} is not a whole number of milliseconds") from None
    if value < minimum:
        raise ConfigError(key, f"{value} is out of range (must be >= {minimum})")
    return value
