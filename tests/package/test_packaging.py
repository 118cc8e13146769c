"""Packaging: optional backends and pyspark as extras with a message naming the extra (the sidecar,
the validator and the CLI run without pyspark), the pyspark version check, and a wheel built from a
clean checkout that carries the jar (built from `git archive` of HEAD and installed into a fresh
virtualenv)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from spark_statebackend.errors import ConfigError
from tests.paths import ROOT
from tests.servers.process import wait_until


@pytest.fixture
def fresh_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Forget our backend modules so the next open_* imports them again (under the test's patches)."""
    for name in list(sys.modules):
        if name.startswith(("spark_statebackend.stores.", "spark_statebackend.checkpoints.logs.")) and (
            name.rsplit(".", 1)[1] in ("azure", "s3", "kafka", "_cloud")
        ):
            monkeypatch.delitem(sys.modules, name)
    yield monkeypatch


@pytest.mark.parametrize(
    ("missing", "url", "extra"),
    [
        ("azure.storage.blob", "azure://container/prefix", "azure"),
        ("boto3", "s3://bucket/prefix", "s3"),
    ],
)
def test_missing_blob_store_extra_is_named(
    fresh_imports: pytest.MonkeyPatch, missing: str, url: str, extra: str
) -> None:
    from spark_statebackend.stores import open_blob_store

    fresh_imports.setitem(sys.modules, missing, None)  # makes `import <missing>` raise ImportError
    with pytest.raises(ConfigError) as err:
        open_blob_store(url, {}, key="spark.statebackend.blobStore.url")
    assert err.value.key == "spark.statebackend.blobStore.url"
    assert f"need the [{extra}] extra" in str(err.value)
    assert f"pip install 'spark-statebackend[{extra}]'" in str(err.value)
    assert missing in str(err.value)


def test_missing_kafka_extra_is_named(fresh_imports: pytest.MonkeyPatch) -> None:
    from spark_statebackend.checkpoints.logs import open_checkpoint_log

    fresh_imports.setitem(sys.modules, "confluent_kafka", None)
    with pytest.raises(ConfigError, match=r"kafka:// URLs need the \[kafka\] extra") as err:
        open_checkpoint_log("kafka://127.0.0.1:9092/t", {}, key="--log")
    assert err.value.key == "--log"


def test_file_urls_need_no_extra(fresh_imports: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.stores import open_blob_store

    for name in ("azure.storage.blob", "boto3", "confluent_kafka"):
        fresh_imports.setitem(sys.modules, name, None)
    assert open_blob_store((tmp_path / "b").as_uri()).url == (tmp_path / "b").as_uri()
    assert open_checkpoint_log((tmp_path / "l").as_uri()).url == (tmp_path / "l").as_uri()


# -- pyspark only where configure() and status() run -----------------------------------------------------

#: A sitecustomize that makes importing pyspark or py4j fail, as on an executor without them.
_NO_PYSPARK = """
import sys

class _NoPySpark:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "py4j"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _NoPySpark())
"""


@pytest.fixture
def no_pyspark_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a Python process in which pyspark and py4j cannot be imported."""
    site = tmp_path / "no-pyspark"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_NO_PYSPARK)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    blocked = subprocess.run(
        [sys.executable, "-c", "import py4j"], env=env, capture_output=True, text=True, timeout=60
    )
    assert blocked.returncode != 0 and "blocked by the test" in blocked.stderr, blocked.stderr
    return env


def test_the_cli_and_the_validator_run_without_pyspark(
    no_pyspark_env: dict[str, str], tmp_path: Path
) -> None:
    """Executors' Pythons run the sidecar and `spark-statebackend`; neither may need pyspark."""
    cli = Path(sys.executable).parent / "spark-statebackend"
    env = no_pyspark_env
    helped = subprocess.run([str(cli), "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "restore-checkpoint" in helped.stdout, helped.stderr
    data = tmp_path / "data"
    data.mkdir()
    (data / "000001.sst").write_bytes(os.urandom(3 << 20))  # three 1 MiB chunks
    blobs = ["--blob-url", (tmp_path / "blobs").as_uri(), "--store", "s"]
    for command in (["backup", *blobs, "--chunk-size", "1m", str(data)], ["verify", *blobs, "latest"]):
        ran = subprocess.run([str(cli), *command], env=env, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, (command, ran.stderr)
    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps(_file_urls(tmp_path)))
    valid = subprocess.run(
        [sys.executable, "-m", "spark_statebackend.spark.validate", "--conf", str(conf)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert valid.returncode == 0, valid.stderr
    assert valid.stdout.startswith("valid: Python ") and ", blob store file:" in valid.stdout, valid.stdout


def _file_urls(tmp_path: Path) -> dict[str, str]:
    return {
        "spark.statebackend.blobStore.url": (tmp_path / "blobs").as_uri(),
        "spark.statebackend.checkpointLog.url": (tmp_path / "log").as_uri(),
    }


def test_the_sidecar_runs_without_pyspark(no_pyspark_env: dict[str, str], tmp_path: Path) -> None:
    """A driver's sidecar (the committer too) starts, writes its liveness marker and stops on SIGTERM."""
    from spark_statebackend.runtime.spool import Spool

    conf = tmp_path / "sidecar-conf.json"
    conf.write_text(json.dumps(_file_urls(tmp_path)))
    spool = Spool(tmp_path / "spool")
    args = ["--spool-dir", str(spool.dir), "--executor-id", "driver", "--conf", str(conf)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_statebackend.runtime.sidecar", *args, "--jvm-pid", str(os.getpid())],
        env=no_pyspark_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: spool.read_sidecar_marker() is not None or proc.poll() is not None, 120, "the sidecar"
        )
        assert proc.poll() is None, proc.communicate()[1]
        marker = spool.read_sidecar_marker()
        assert marker is not None and marker.pid == proc.pid
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "pyspark" not in err and "py4j" not in err, err


@pytest.mark.parametrize("call", ["configure", "status"])
def test_configure_and_status_without_pyspark_name_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, call: str
) -> None:
    import spark_statebackend

    monkeypatch.setitem(sys.modules, "pyspark", None)  # makes `import pyspark` raise ImportError
    with pytest.raises(ConfigError) as err:
        if call == "configure":
            spark_statebackend.configure({}, check=False, **{"blobStore.url": (tmp_path / "b").as_uri()})
        else:
            spark_statebackend.status(object(), "query-id")
    assert err.value.key == "pyspark"
    assert f"{call}() needs the [spark] extra, which is not installed (cannot import pyspark)" in str(
        err.value
    )
    assert "pip install 'spark-statebackend[spark]'" in str(err.value)


# -- the supported Spark version, in one place ---------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("4.3.0", True),
        ("4.3.2", True),  # a patch release no longer forces a downgrade (was pyspark==4.3.0)
        ("4.3.1.dev0", True),
        ("4.3", True),
        ("4.2.1", True),  # 4.1 and 4.2 run the same shim (docs/compatibility.md "Spark versions")
        ("4.2.0", True),
        ("4.1.4", True),
        ("4.1.0", True),
        ("4.30.0", False),
        ("4.4.0", False),
        ("4.0.5", False),  # the checkpoint file manager's package moved in 4.1: needs a port
        ("3.5.1", False),
        ("", False),
    ],
)
def test_supported_spark_versions(version: str, ok: bool) -> None:
    from spark_statebackend.spark.compat import check_pyspark_version, spark_supported

    assert spark_supported(version) is ok
    if ok:
        assert check_pyspark_version(version) == version
    else:
        with pytest.raises(
            ConfigError, match=r"not supported by this shim \(built for 4\.1\.x, 4\.2\.x or 4\.3\.x\)"
        ) as err:
            check_pyspark_version(version)
        assert err.value.key == "pyspark"
        assert f"Spark {version} is not supported" in str(err.value)
        assert "install pyspark>=4.1.0,<4.4" in str(err.value)


def test_pyproject_pins_the_same_range() -> None:
    import tomllib

    root = ROOT
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    from spark_statebackend.spark.compat import PIN

    assert PIN == "pyspark>=4.1.0,<4.4"
    assert project["optional-dependencies"]["spark"] == [PIN]
    # Executors run the sidecar without pyspark: the core package does not pull it in, [all] does.
    assert not [d for d in project["dependencies"] if d.startswith(("pyspark", "py4j"))]
    assert "spark" in project["optional-dependencies"]["all"][0]


# -- building the jar -----------------------------------------------------------------------------------


def _build_jar_module() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ssb_build_jar_test", ROOT / "tools" / "build_jar.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_jar_build_without_spark_jars_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bj = _build_jar_module()
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("SSB_SPARK_JARS", str(tmp_path / "nowhere"))
    monkeypatch.setitem(sys.modules, "pyspark", None)  # no importable pyspark either
    with pytest.raises(bj.BuildError, match="no Spark jars to compile the JVM shim against") as err:
        bj.build_jar(ROOT, tmp_path / "out.jar", log=lambda _m: None)
    assert "SSB_SPARK_JARS=" in str(err.value) and "SPARK_HOME" in str(err.value)
    assert not (tmp_path / "out.jar").exists()


def test_jar_build_refuses_other_spark_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bj = _build_jar_module()
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core_2.13-4.4.0.jar").write_bytes(b"")
    monkeypatch.setenv("SSB_SPARK_JARS", str(jars))
    if shutil.which("javac") is None:
        pytest.skip("needs javac")
    with pytest.raises(
        bj.BuildError, match=r"Spark 4\.4\.0; the JVM shim is written for Spark 4\.1\.x or 4\.2\.x or 4\.3\.x"
    ):
        bj.build_jar(ROOT, tmp_path / "out.jar", log=lambda _m: None)


def test_an_up_to_date_jar_is_reused_without_a_toolchain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bj = _build_jar_module()
    out = tmp_path / "out.jar"
    out.write_bytes(b"built earlier")
    newest = max(p.stat().st_mtime for p in bj.java_sources(ROOT))
    os.utime(out, (newest + 10, newest + 10))
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert bj.build_jar(ROOT, out, log=lambda _m: None) == out and out.read_bytes() == b"built earlier"
    os.utime(out, (newest - 10, newest - 10))  # a source changed since: must compile, cannot
    with pytest.raises(bj.BuildError, match="javac not found"):
        bj.build_jar(ROOT, out, log=lambda _m: None)


# -- a wheel from a clean checkout ----------------------------------------------------------------------

CHECK = r"""
import pathlib, sys, zipfile
import spark_statebackend, spark_statebackend.spark as s
site = pathlib.Path(sys.argv[1])
assert pathlib.Path(spark_statebackend.__file__).is_relative_to(site), spark_statebackend.__file__
jar = s.jar_path()
assert jar.is_file() and jar.is_relative_to(site), jar
names = set(zipfile.ZipFile(jar).namelist())
assert "dev/statebackend/spark/StateBackendCheckpointFileManager.class" in names, sorted(names)[:5]
conf = {}
urls = {"blobStore.url": sys.argv[2], "checkpointLog.url": sys.argv[3]}
spark_statebackend.configure(conf, check=False, **urls)
assert conf["spark.jars"] == str(jar), conf
print("ok", jar)
"""


def _git_head_archive(dest: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


@pytest.mark.slow
def test_wheel_from_a_clean_checkout_carries_the_jar_and_configures(tmp_path: Path) -> None:
    """A wheel built from `git archive HEAD` (no jar: it is ignored by git) used to ship without the
    jar, so configure() failed after `pip install`. Build it as pip does (isolated build
    environment; the Spark jars come from SSB_SPARK_JARS, here the pyspark this suite runs on),
    install it into a fresh virtualenv and call configure() there.

    The fresh venv gets our wheel alone (--no-deps) and borrows its dependencies from this
    environment through a .pth path entry: installing pyspark (a 450 MB sdist) again would take
    minutes. Its metadata is checked instead (the wheel's Requires-Dist)."""
    if shutil.which("javac") is None:
        pytest.skip("needs javac")
    import pyspark

    src = tmp_path / "src"
    _git_head_archive(src)
    assert not (src / "spark_statebackend" / "jars").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env["SSB_SPARK_JARS"] = str(Path(pyspark.__file__).parent / "jars")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
        check=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("spark_statebackend-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "spark_statebackend/jars/spark-statebackend-bridge.jar" in names
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
    requires = [
        ln.removeprefix("Requires-Dist: ") for ln in meta.splitlines() if ln.startswith("Requires-Dist: ")
    ]
    assert 'pyspark<4.4,>=4.1.0; extra == "spark"' in requires
    assert not [r for r in requires if r.startswith(("pyspark", "py4j")) and "extra ==" not in r]
    # Apache-2.0, like this package (the LGPL crc32c package it replaced is gone).
    assert "google-crc32c>=1.9" in requires and not [r for r in requires if r.startswith("crc32c")]
    # changelogSnapshotEvery's builds (spark/materialize.py) read lz4 and write RocksDB themselves.
    assert "rocksdict>=0.3.29" in requires and "lz4>=4.3" in requires
    assert not [r for r in requires if r.startswith(("boto3", "azure", "confluent")) and "extra ==" not in r]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    vpy = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(vpy),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
        env=env,
    )
    site = Path(
        subprocess.run(
            [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    ours = Path(pyspark.__file__).parent.parent  # this environment's site-packages
    (site / "zz_borrowed_dependencies.pth").write_text(f"{ours}\n")
    proc = subprocess.run(
        [str(vpy), "-c", CHECK, str(site), (tmp_path / "b").as_uri(), (tmp_path / "l").as_uri()],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok ")
    version = subprocess.run(
        [str(venv / "bin" / "spark-statebackend"), "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert version.returncode == 0 and version.stdout.startswith("spark-statebackend, version "), (
        version.stderr
    )
