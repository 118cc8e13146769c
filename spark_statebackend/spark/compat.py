"""The one place that says which Spark this package works with, and checks the running one.

The JVM shim (jvm-bridge/) overrides and calls Spark internals that are the same in the 4.1, 4.2 and
4.3 release lines (docs/compatibility.md "Spark versions": the jar compiled against any of them is
byte-identical), so any patch release of those lines is supported and nothing else: pyproject.toml pins
`pyspark>=4.1.0,<4.4` (its [spark] extra), tools/build_jar.py compiles only against such jars, and
`check_pyspark_version()` runs at start (configure()). The JVM side checks the version and the members
it uses by reflection (SignatureCheck.java).

pyspark is needed only where configure() and status() run (the PySpark driver): the sidecars, the
start-up validation and the CLI never import it, so executors' Pythons need not have it.
"""

from __future__ import annotations

import re

from ..common.extras import needs_extra
from ..errors import ConfigError

#: (major, minor) of the Spark release lines the shim is built for, oldest first; keep in step with
#: SignatureCheck.SUPPORTED_LINES, tools/build_jar.py and the pin in pyproject.toml.
SUPPORTED_LINES: tuple[tuple[int, int], ...] = ((4, 1), (4, 2), (4, 3))
_NAMES = [f"{a}.{b}.x" for a, b in SUPPORTED_LINES]
SUPPORTED_TEXT = _NAMES[0] if len(_NAMES) == 1 else ", ".join(_NAMES[:-1]) + " or " + _NAMES[-1]
#: The pip requirement matching SUPPORTED_LINES (the lines are consecutive).
PIN = (
    f"pyspark>={SUPPORTED_LINES[0][0]}.{SUPPORTED_LINES[0][1]}.0,"
    f"<{SUPPORTED_LINES[-1][0]}.{SUPPORTED_LINES[-1][1] + 1}"
)

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.|$)")


def spark_supported(version: str) -> bool:
    """Whether a Spark/pyspark version string is in a supported release line (4.3.0, 4.2.1, 4.3.1.dev0)."""
    m = _VERSION.match(version.strip())
    return m is not None and (int(m.group(1)), int(m.group(2))) in SUPPORTED_LINES


def pyspark_version(who_needs: str) -> str:
    """The installed pyspark's version; ConfigError naming `pyspark` and the [spark] extra if it cannot
    be imported (`who_needs`: the caller and its verb, "configure() needs")."""
    try:
        import pyspark
    except ImportError as e:
        raise needs_extra("pyspark", who_needs, "spark", e) from None
    return str(pyspark.__version__)


def check_pyspark_version(version: str | None = None) -> str:
    """Raise ConfigError naming `pyspark` unless the running (or given) pyspark is supported (or, with no
    pyspark installed, naming the [spark] extra); return the version."""
    if version is None:
        version = pyspark_version("configure() needs")
    if not spark_supported(version):
        raise ConfigError(
            "pyspark",
            f"Spark {version} is not supported by this shim (built for {SUPPORTED_TEXT}); install {PIN}",
        )
    return version
