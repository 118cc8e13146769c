"""Build the JVM shim jar (spark_statebackend/jars/spark-statebackend-bridge.jar) from jvm-bridge/src.

One implementation for both ways the jar gets built:
  - the package build (setup.py's build_py), so a wheel built from a clean checkout carries the jar;
  - `make jar` (python tools/build_jar.py), for a development checkout.

The sources compile against the Spark jars of a supported Spark line (4.1.x, 4.2.x or 4.3.x: the same
class files from each); no Maven repository is used. Where those jars come from, first match wins:
  SSB_SPARK_JARS   a directory holding Spark's jars (spark-core_2.13-4.3.*.jar, ...)
  SPARK_HOME       a Spark distribution: $SPARK_HOME/jars
  pyspark          an importable pyspark's bundled jars (pyspark/jars)
and `javac` is $JAVA_HOME/bin/javac or the one on PATH (JDK 17 or newer; classes target 17).

If the jar exists and is newer than every Java source it is reused, so an installed toolchain is
only needed when a source changed. Otherwise a missing javac or missing Spark jars fail the build
with a message saying what to install or set (BuildError).

The jar is written reproducibly (sorted entries, fixed timestamps) and atomically.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

JAR_NAME = "spark-statebackend-bridge.jar"
SUPPORTED_SPARK = ("4.1.", "4.2.", "4.3.")  # spark_statebackend/spark/compat.py SUPPORTED_LINES
_SPARK_CORE = re.compile(r"spark-core_[0-9.]+-(?P<version>[0-9][^/]*)\.jar$")
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # zip timestamps: the same sources give the same bytes


class BuildError(Exception):
    """The jar cannot be built here; the message says why and what to do."""


def java_sources(root: Path) -> list[Path]:
    """Every .java file under <root>/jvm-bridge/src, sorted."""
    return sorted((root / "jvm-bridge" / "src").rglob("*.java"))


def find_spark_jars() -> Path:
    """The directory of Spark jars to compile against (module doc: the search order)."""
    tried = []
    env = os.environ.get("SSB_SPARK_JARS")
    if env:
        tried.append(f"SSB_SPARK_JARS={env}")
        if Path(env).is_dir():
            return Path(env)
    home = os.environ.get("SPARK_HOME")
    if home:
        tried.append(f"SPARK_HOME={home} (jars/)")
        if (Path(home) / "jars").is_dir():
            return Path(home) / "jars"
    try:
        import pyspark  # optional: only the last fallback needs it

        jars = Path(pyspark.__file__).parent / "jars"
        tried.append(f"pyspark {pyspark.__version__} at {jars}")
        if jars.is_dir():
            return jars
    except ImportError:
        tried.append("an importable pyspark (none in this build environment)")
    raise BuildError(
        "no Spark jars to compile the JVM shim against; tried "
        + "; ".join(tried)
        + ". Set SPARK_HOME to a Spark 4.3 distribution (a pyspark>=4.1,<4.4 package directory works), "
        "or SSB_SPARK_JARS to a directory of its jars, or build with --no-build-isolation in an "
        "environment that has pyspark 4.1 to 4.3 installed"
    )


def spark_version(jars: Path) -> str:
    """The Spark version of a jars directory, from its spark-core jar's name."""
    for jar in sorted(jars.glob("spark-core_*.jar")):
        m = _SPARK_CORE.search(jar.name)
        if m:
            return m.group("version")
    raise BuildError(f"{jars} holds no spark-core_<scala>-<version>.jar: not a directory of Spark jars")


def find_javac() -> str:
    """javac from JAVA_HOME or PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        raise BuildError(
            "javac not found (JAVA_HOME unset or without bin/javac, and none on PATH): install a "
            "JDK 17 or newer to build the JVM shim"
        )
    return found


def up_to_date(jar: Path, sources: list[Path]) -> bool:
    """Whether `jar` exists and is newer than every source."""
    if not jar.is_file():
        return False
    built = jar.stat().st_mtime
    return all(src.stat().st_mtime <= built for src in sources)


def build_jar(root: Path, out: Path, *, log: object = None) -> Path:
    """Make `out` hold the shim jar compiled from `root`'s Java sources; return `out`.

    Reuses an up-to-date `out`. Raises BuildError when it must compile and cannot."""
    say = log if callable(log) else (lambda msg: print(msg, file=sys.stderr))
    sources = java_sources(root)
    if not sources:
        raise BuildError(f"no Java sources under {root / 'jvm-bridge' / 'src'}")
    if up_to_date(out, sources):
        say(f"spark-statebackend: {out} is up to date")
        return out
    javac = find_javac()
    jars = find_spark_jars()
    version = spark_version(jars)
    if not version.startswith(SUPPORTED_SPARK):
        raise BuildError(
            f"the Spark jars in {jars} are Spark {version}; the JVM shim is written for Spark "
            + " or ".join(f"{line}x" for line in SUPPORTED_SPARK)
        )
    say(f"spark-statebackend: compiling {len(sources)} Java sources against Spark {version} ({jars})")
    with tempfile.TemporaryDirectory(prefix="ssb-jar-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [
            javac,
            "--release",
            "17",
            "-nowarn",
            "-d",
            str(classes),
            "-cp",
            f"{jars}/*",
            *map(str, sources),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"javac failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            manifest = zipfile.ZipInfo("META-INF/MANIFEST.MF", _FIXED_TIME)
            zf.writestr(
                manifest, f"Manifest-Version: 1.0\nCreated-By: spark-statebackend (Spark {version})\n\n"
            )
            for cls in sorted(classes.rglob("*.class")):
                info = zipfile.ZipInfo(cls.relative_to(classes).as_posix(), _FIXED_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, cls.read_bytes())
        os.replace(partial, out)
    say(f"spark-statebackend: built {out}")
    return out


def main() -> int:
    """`python tools/build_jar.py [OUT]`: build the jar of this checkout (default: into the package)."""
    root = Path(__file__).resolve().parent.parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "spark_statebackend" / "jars" / JAR_NAME
    try:
        build_jar(root, out)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
