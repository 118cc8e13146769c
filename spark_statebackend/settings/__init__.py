"""Configuration: every setting is a spark.conf key under `spark.statebackend.`, validated at start.

KEYS declares each key once (a `Setting`: name, type with its bounds or allowed values, default,
meaning); nothing else writes a default. `Settings.from_conf(conf)` reads a plain mapping (a
SparkConf's getAll(), or a dict in tests) through KEYS and returns frozen, typed settings, or raises
ConfigError naming the first bad key and its value. `markdown_table()` renders KEYS as the README's
configuration table (tools/config_table.py prints it). The JVM shim (Conf.java) parses the keys it
reads itself, since it runs without Python; tests/test_config_table.py checks its defaults are these.

The package: types.py holds the value types and `Setting`, keys.py the declarations (KEYS) and the
table, conf.py `Settings` with the checks that span keys; this module exports their API.
"""

from ..common.units import parse_duration, parse_size
from .conf import DEFAULT_GC_GRACE_SECONDS, Settings
from .keys import KEYS, markdown_table
from .types import (
    PREFIX,
    Boolean,
    CrashPoints,
    Duration,
    OneOf,
    Setting,
    Size,
    Text,
    Url,
    ValueType,
    WholeNumber,
    parse_bool,
    parse_int,
)

__all__ = [
    "DEFAULT_GC_GRACE_SECONDS",
    "KEYS",
    "PREFIX",
    "Boolean",
    "CrashPoints",
    "Duration",
    "OneOf",
    "Setting",
    "Settings",
    "Size",
    "Text",
    "Url",
    "ValueType",
    "WholeNumber",
    "markdown_table",
    "parse_bool",
    "parse_duration",
    "parse_int",
    "parse_size",
]
