"""Build hook: every wheel carries the JVM shim jar, compiled from jvm-bridge/src by tools/build_jar.py.

Everything else about the package is in pyproject.toml. Why a hook: the jar is a build product
(ignored by git), so a wheel built from a clean checkout used to ship without it and failed at
configure(). Now:
  - a wheel build (pip wheel / pip install / python -m build) compiles the jar into the wheel, or
    reuses an up-to-date one, and fails with a message saying what is missing (a JDK, or Spark 4.3's
    jars: SPARK_HOME, SSB_SPARK_JARS or an importable pyspark) rather than produce a wheel without it;
  - an editable install (make setup) builds it into the source tree if it can and otherwise only
    says so: `make jar` builds it right after, with the pyspark the install just brought.
pyspark is deliberately not a build requirement: it is a 450 MB source distribution that pip would
download and build in every isolated build environment just to lend javac its jars.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _jar_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ssb_build_jar", ROOT / "tools" / "build_jar.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class BuildPyWithJar(build_py):  # type: ignore[misc]  # setuptools ships no stubs here
    """build_py, then the shim jar into the built package (or, editable, into the source tree)."""

    def run(self) -> None:
        super().run()
        bj = _jar_builder()
        source_jar = ROOT / "spark_statebackend" / "jars" / bj.JAR_NAME
        if self.editable_mode:
            try:
                bj.build_jar(ROOT, source_jar, log=self.announce_info)
            except bj.BuildError as e:
                self.announce_info(f"spark-statebackend: jar not built now ({e}); run `make jar`")
            return
        target = Path(self.build_lib) / "spark_statebackend" / "jars" / bj.JAR_NAME
        if bj.up_to_date(source_jar, bj.java_sources(ROOT)):
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(source_jar), str(target))
            return
        try:
            bj.build_jar(ROOT, target, log=self.announce_info)
        except bj.BuildError as e:
            raise SystemExit(f"error: spark-statebackend: cannot build the JVM shim jar: {e}") from None

    def announce_info(self, msg: str) -> None:
        print(msg, file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWithJar})
