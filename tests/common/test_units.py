"""Durations and sizes: Spark's grammar (units.py), checked against Spark's own parser in the jar."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from spark_statebackend.common import units
from spark_statebackend.common.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_duration_ms,
    parse_size,
)
from spark_statebackend.errors import ConfigError
from tests.jobrig import spark_jars

DURATIONS_OK = {
    "60s": 60_000,
    " 60S ": 60_000,
    "007s": 7_000,
    "500ms": 500,
    "1500us": 1,  # truncated to whole milliseconds, as Spark converts
    "500us": 0,
    "10m": 600_000,
    "10min": 600_000,
    "10MIN": 600_000,
    "1h": 3_600_000,
    "1H": 3_600_000,
    "7d": 604_800_000,
    "0": 0,
    "0s": 0,
}
# Spark refuses these too (bad form or unit).
DURATIONS_SPARK_REFUSES = ["1.5s", "2.0s", "5 s", "+5s", "1y", "1w", "60sec", "", "s", "10 min"]
# Spark reads these (bare numbers in the key's unit, negatives); we refuse them on purpose.
DURATIONS_STRICTER = ["60", "60000", "-5s"]

SIZES_OK = {
    "64": 64,
    "64b": 64,
    "64k": 64 << 10,
    "64kb": 64 << 10,
    "64KiB": 64 << 10,
    "64ki": 64 << 10,
    "64m": 64 << 20,
    "64MiB": 64 << 20,
    "64mB": 64 << 20,
    " 2m ": 2 << 20,
    "1g": 1 << 30,
    "1gib": 1 << 30,
    "1t": 1 << 40,
    "1tb": 1 << 40,
    "1p": 1 << 50,
    "1pib": 1 << 50,
    "8191p": 8191 << 50,
}
SIZES_REFUSED = ["1.5m", "2 m", "-1", "1e", "1eb", "1ib", "lots", "8192p", "9223372036854775808"]


@pytest.mark.parametrize(("text", "ms"), DURATIONS_OK.items())
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text, "k") == ms
    assert parse_duration(text, "k") == ms / 1000


@pytest.mark.parametrize("text", DURATIONS_SPARK_REFUSES + DURATIONS_STRICTER)
def test_bad_durations_name_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration_ms(text, "spark.statebackend.someKey")
    assert err.value.key == "spark.statebackend.someKey"


def test_duration_messages_say_what_to_write() -> None:
    with pytest.raises(ConfigError, match=r"'60' has no unit; write e\.g\. 60s or 60ms"):
        parse_duration_ms("60", "k")
    with pytest.raises(ConfigError, match="fractions are not accepted"):
        parse_duration_ms("1.5s", "k")
    with pytest.raises(ConfigError, match="unknown unit 'y'"):
        parse_duration_ms("1y", "k")
    with pytest.raises(ConfigError, match="must not be negative"):
        parse_duration_ms("-5s", "k")
    with pytest.raises(ConfigError, match="at least 1ms"):
        parse_duration_ms("0s", "k", positive=True)
    with pytest.raises(ConfigError, match="at least 1ms"):
        parse_duration_ms("999us", "k", positive=True)


@pytest.mark.parametrize(("text", "nbytes"), SIZES_OK.items())
def test_sizes(text: str, nbytes: int) -> None:
    assert parse_size(text, "k") == nbytes


@pytest.mark.parametrize("text", SIZES_REFUSED)
def test_bad_sizes_name_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_size(text, "--chunk-size")
    assert err.value.key == "--chunk-size"


def test_size_minimum() -> None:
    with pytest.raises(ConfigError, match="at least 1 B"):
        parse_size("0", "k")
    assert parse_size("0", "k", minimum=0) == 0


def test_formatting_round_trips() -> None:
    assert [format_size(n) for n in (0, 512, 1536, 64 << 20, 3 << 30)] == [
        "0 B",
        "512 B",
        "1.5 KiB",
        "64 MiB",
        "3 GiB",
    ]
    for seconds, text in ((21600, "6h"), (1800, "30min"), (1.5, "1500ms"), (0, "0s"), (86400 * 7, "7d")):
        assert format_duration(seconds) == text
        assert parse_duration(text, "k") == seconds


def test_deprecated_name_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    units._warned.discard("old.name.ms")
    with caplog.at_level(logging.WARNING, logger="spark_statebackend.units"):
        units.deprecated_name("old.name.ms", "old.name", "30s")
        units.deprecated_name("old.name.ms", "old.name", "30s")
    hits = [r.getMessage() for r in caplog.records if "old.name.ms" in r.getMessage()]
    assert len(hits) == 1 and "use old.name with a unit instead (e.g. 30s)" in hits[0]


# -- the same table through Spark's own parser --------------------------------------------------------

PROBE = """
import org.apache.spark.network.util.JavaUtils;
public class UnitsProbe {
  public static void main(String[] args) {
    for (String a : args) {
      String kind = a.substring(0, 1), text = a.substring(2);
      try {
        long v = kind.equals("t") ? JavaUtils.timeStringAsMs(text) : JavaUtils.byteStringAsBytes(text);
        System.out.println(v);
      } catch (RuntimeException e) {
        System.out.println("ERR");
      }
    }
  }
}
"""


@pytest.mark.skipif(shutil.which("java") is None or spark_jars() is None, reason="needs java and pyspark")
def test_spark_reads_every_value_we_accept_the_same_way(tmp_path: Path) -> None:
    """What we accept, Spark accepts with the same value; what Spark refuses, we refuse. (Our only
    differences are refusals: bare non-zero durations and negatives.)"""
    (tmp_path / "UnitsProbe.java").write_text(PROBE)
    cases = [("t", t) for t in [*DURATIONS_OK, *DURATIONS_SPARK_REFUSES, *DURATIONS_STRICTER]] + [
        ("b", s) for s in [*SIZES_OK, *SIZES_REFUSED]
    ]
    proc = subprocess.run(
        ["java", "-cp", f"{spark_jars()}/*", str(tmp_path / "UnitsProbe.java")]
        + [f"{k}:{v}" for k, v in cases],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    spark = proc.stdout.splitlines()
    assert len(spark) == len(cases), proc.stderr
    for (kind, text), theirs in zip(cases, spark, strict=True):
        parse = (
            (lambda t: parse_duration_ms(t, "k"))
            if kind == "t"
            else (lambda t: parse_size(t, "k", minimum=0))
        )
        try:
            ours: str = str(parse(text))
        except ConfigError:
            ours = "ERR"
        if kind == "t" and text in DURATIONS_STRICTER:
            assert (ours, theirs != "ERR") == ("ERR", True), text  # Spark reads it; we refuse on purpose
        else:
            assert ours == theirs, f"{text!r}: ours {ours}, Spark's {theirs}"
