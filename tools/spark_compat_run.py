"""Try this checkout's shim on another Spark release, end to end, without touching any shared environment.

    python tools/spark_compat_run.py 4.2.1 [--dir DIR] [--mode v1|changelog-v2] [--compile-only]

Not part of the test suite (it downloads a pyspark, ~450 MB, and runs four Spark drivers): it is how
the "Spark versions" table of docs/compatibility.md was established, and how to re-check a new release. Steps,
each reusing what an earlier run left in DIR (default: ./spark-compat):

1. ``DIR/venv-<version>``: a new venv (this Python) with ``pyspark==<version>`` from PyPI and the
   package's runtime dependencies (the file:// blob store and checkpoint log need no cloud SDK).
2. ``DIR/src-<version>``: this checkout's committed tree (``git archive HEAD``), with the version gates
   (``SignatureCheck.SUPPORTED_LINES``, ``compat.SUPPORTED_LINES``, ``build_jar.SUPPORTED_SPARK``) set to the
   target's major.minor when it is not already supported. Only the gates: every other expectation of
   SignatureCheck still runs when the plugin starts, and a mismatch fails the first driver, listed.
3. The shim jar compiled against that pyspark's own jars (``SSB_SPARK_JARS``); a compile error is the
   answer for versions whose classes moved (e.g. 3.5 and 4.0: ``CheckpointFileManager`` is in
   ``org.apache.spark.sql.execution.streaming``), and the script stops there.
4. ``spark_statebackend.demo_app --shape agg``: a reference run on Spark's own provider (``--plain``) to
   batch LAST; a backed run to batch 2; the checkpoint location, Spark's local dirs and the spool are
   deleted (a new host); a backed run to batch LAST. It passes when the second backed run restored the
   driver's location and the stores from the blob store and its result equals the reference.

``--mode changelog-v2`` adds changelog checkpointing and checkpoint format v2 (lineage in changelog
headers, Spark's checksum manager writing ``.crc`` files) to the backed runs. Exit status 0 = pass.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAST = 6
# The core package's own dependencies, as declared (pyspark is installed at the version under test).
RUNTIME_DEPS: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
MODES = {
    "v1": [],
    "changelog-v2": [
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true",
        "spark.sql.streaming.stateStore.checkpointFormatVersion=2",
        "spark.sql.streaming.checkpoint.fileChecksum.enabled=true",
    ],
}


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload, no-any-return]


def make_venv(base: Path, version: str) -> Path:
    """DIR/venv-<version> with pyspark==version and the runtime dependencies; returns its python."""
    venv = base / f"venv-{version}"
    py = venv / "bin" / "python"
    if not py.is_file():
        sh([sys.executable, "-m", "venv", str(venv)])
    # A pyspark sdist already downloaded into DIR/dl (pip download pyspark==X --no-deps -d DIR/dl) is used.
    links = ["--find-links", str(base / "dl")] if (base / "dl").is_dir() else []
    sh([str(py), "-m", "pip", "install", "-q", *links, f"pyspark=={version}", *RUNTIME_DEPS])
    return py


def spark_jars(py: Path) -> Path:
    out = subprocess.run(
        [str(py), "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip()) / "jars"


def _gate(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text()
    new, n = re.subn(pattern, replacement, text, count=1, flags=re.M)
    if n != 1:
        raise SystemExit(f"{path}: version gate {pattern!r} not found; update this script")
    path.write_text(new)


def export_source(base: Path, version: str, py: Path, *, port: bool = False) -> Path:
    """DIR/src-<version>: the committed tree with the version gates opened for `version`'s line."""
    src = base / f"src-{version}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    major, minor = (int(x) for x in version.split(".")[:2])
    probe = f"from spark_statebackend.spark.compat import spark_supported as s; print(s({version!r}))"
    supported = subprocess.run(
        [str(py), "-c", probe], env={**os.environ, "PYTHONPATH": str(src)},
        check=True, capture_output=True, text=True,
    ).stdout.strip() == "True"  # fmt: skip
    if not supported:
        print(f"opening the version gates for {major}.{minor} in {src} (experiment only)")
        jvm = src / "jvm-bridge/src/dev/statebackend/spark/SignatureCheck.java"
        _gate(
            jvm,
            r"static final List<String> SUPPORTED_LINES = List\.of\([^)]*\);",
            f'static final List<String> SUPPORTED_LINES = List.of("{major}.{minor}");',
        )
        _gate(
            src / "spark_statebackend/spark/compat.py",
            r"^SUPPORTED_LINES: tuple\[tuple\[int, int\], \.\.\.\] = \(.*\)$",
            f"SUPPORTED_LINES: tuple[tuple[int, int], ...] = (({major}, {minor}),)",
        )
        _gate(
            src / "tools/build_jar.py",
            r"^SUPPORTED_SPARK = \(.*\)",
            f'SUPPORTED_SPARK = ("{major}.{minor}.",)',
        )
    if port and (major, minor) < (4, 1):
        port_to_legacy_packages(src, (major, minor))
    return src


def port_to_legacy_packages(src: Path, line: tuple[int, int]) -> None:
    """The mechanical part of a port to Spark 4.0 / 3.5 (docs/compatibility.md "Spark versions"),
    experiment only.

    Before 4.1 the checkpoint file managers lived in org.apache.spark.sql.execution.streaming (not
    .checkpointing) and so did StreamExecution and friends (not .runtime); CheckpointFileManager had
    no close(); there was no ChecksumCheckpointFileManager; before 4.0 no LineageItem (checkpoint
    format v2). Every other expectation of SignatureCheck is kept and checked at start.
    """
    print(f"porting {src} to the pre-4.1 package layout (experiment only)")
    java = src / "jvm-bridge" / "src" / "dev" / "statebackend" / "spark"
    for f in java.glob("*.java"):
        text = f.read_text()
        for moved in ("checkpointing", "runtime"):
            text = text.replace(
                f"org.apache.spark.sql.execution.streaming.{moved}.",
                "org.apache.spark.sql.execution.streaming.",
            )
        f.write_text(text)
    _gate(
        java / "StateBackendCheckpointFileManager.java",
        r"  @Override\n  public void close\(\) \{\n    delegate.close\(\);",
        "  public void close() {",
    )
    _gate(
        java / "LocalCheckpointFileManager.java",
        r"  @Override\n  public void close\(\) \{\n    if \(delegate != null\) delegate.close\(\);",
        "  public void close() {",
    )
    check = java / "SignatureCheck.java"
    _gate(check, r"^    e.add\(Expectation.constant\(CKPT \+ \"ChecksumCheckpointFileManager\$\".*\n.*\n", "")
    if line < (4, 0):
        _gate(
            check,
            r"^    e.add\(Expectation.callable\(STATE \+ \"StateStoreChangelogWriter\", "
            r"\"writeLineage\".*\n.*\n",
            "",
        )


def build(src: Path, py: Path, jars: Path) -> bool:
    env = {**os.environ, "SSB_SPARK_JARS": str(jars), "PYTHONPATH": str(src)}
    proc = subprocess.run([str(py), "tools/build_jar.py"], cwd=src, env=env, text=True, capture_output=True)
    print(proc.stdout + proc.stderr, flush=True)
    return proc.returncode == 0


def run_app(src: Path, py: Path, work: Path, until: int, *, plain: bool, extra: list[str]) -> None:
    cmd = [str(py), "-m", "spark_statebackend.demo_app", "--shape", "agg", "--work", str(work),
           "--until-batch", str(until)]  # fmt: skip
    if plain:
        cmd.append("--plain")
    for e in extra:
        cmd += ["--extra", e]
    env = {**os.environ, "PYTHONPATH": str(src)}
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=src, env=env, text=True, capture_output=True, timeout=600)
    (work.parent / f"{work.name}-{until}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"driver failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}")


def result(work: Path) -> list[list[int]]:
    """The agg query's state as of batch LAST (update mode: the newest row per key)."""
    outputs = {int(p.stem): json.loads(p.read_text()) for p in (work / "out").glob("*.json")}
    missing = set(range(LAST + 1)) - set(outputs)
    if missing:
        raise SystemExit(f"{work}: batches missing from the output: {sorted(missing)}")
    state: dict[int, list[int]] = {}
    for b in sorted(outputs):
        if b <= LAST:
            for row in outputs[b]:
                state[row[0]] = row
    return sorted(state.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("version", help="a pyspark release on PyPI, e.g. 4.2.1")
    ap.add_argument("--dir", type=Path, default=Path("spark-compat"))
    ap.add_argument("--mode", choices=sorted(MODES), default="v1")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument(
        "--port",
        action="store_true",
        help="apply the mechanical pre-4.1 port (package moves, close(), checksum class)",
    )
    args = ap.parse_args()
    base: Path = args.dir.resolve()
    base.mkdir(parents=True, exist_ok=True)
    py = make_venv(base, args.version)
    jars = spark_jars(py)
    src = export_source(base, args.version, py, port=args.port)
    if not build(src, py, jars):
        print(f"RESULT {args.version}: the shim does not compile against Spark {args.version}")
        return 1
    if args.compile_only:
        print(f"RESULT {args.version}: compiles")
        return 0
    runs = base / f"run-{args.version}-{args.mode}"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir()
    extra = MODES[args.mode]
    run_app(src, py, runs / "ref", LAST, plain=True, extra=[])
    run_app(src, py, runs / "ssb", 2, plain=False, extra=extra)
    for name in ("ckpt", "local", "spool"):  # what a new host has: none of them
        shutil.rmtree(runs / "ssb" / name)
    run_app(src, py, runs / "ssb", LAST, plain=False, extra=extra)
    logs = "".join(p.read_text() for p in (runs / "ssb" / "spool").rglob("sidecar.log"))
    restored_location = "(start): restored batch" in logs
    restored_stores = "restored query" in logs
    same = result(runs / "ref") == result(runs / "ssb")
    print(f"driver location restored: {restored_location}; stores restored: {restored_stores}; "
          f"result equals the reference: {same}  (logs: {runs})")  # fmt: skip
    ok = restored_location and restored_stores and same
    print(f"RESULT {args.version} {args.mode}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
