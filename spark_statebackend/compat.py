"""The one place that says which Spark this package works with, and checks the running one.

The JVM shim (jvm-bridge/) overrides and calls Spark 4.3 internals, so any 4.3.x patch release is
supported and nothing else: pyproject.toml pins `pyspark>=4.3.0,<4.4`, tools/build_jar.py compiles
only against 4.3.x jars, and `check_pyspark_version()` runs at start (configure()). The JVM side checks
the members it uses by reflection (SignatureCheck.java).
"""

from __future__ import annotations

import re

from .errors import ConfigError

#: (major, minor) of the Spark release line the shim is built for.
SUPPORTED_SPARK = (4, 3)
SUPPORTED_TEXT = f"{SUPPORTED_SPARK[0]}.{SUPPORTED_SPARK[1]}.x"

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.|$)")


def spark_supported(version: str) -> bool:
    """Whether a Spark/pyspark version string is in the supported release line (4.3.0, 4.3.2, 4.3.1.dev0)."""
    m = _VERSION.match(version.strip())
    return m is not None and (int(m.group(1)), int(m.group(2))) == SUPPORTED_SPARK


def check_pyspark_version(version: str | None = None) -> str:
    """Raise ConfigError naming `pyspark` unless the running (or given) pyspark is 4.3.x; return it."""
    if version is None:
        import pyspark

        version = str(pyspark.__version__)
    if not spark_supported(version):
        raise ConfigError(
            "pyspark",
            f"Spark {version} is not supported by this shim (built for {SUPPORTED_TEXT}); "
            f"install pyspark>={SUPPORTED_SPARK[0]}.{SUPPORTED_SPARK[1]}.0,<{SUPPORTED_SPARK[0]}."
            f"{SUPPORTED_SPARK[1] + 1}",
        )
    return version
