"""Running real Spark jobs for the drop-in tests: the reference, spark-submit (Python and Java), outputs.

Every job here runs the same deterministic stateful query, demo_app's `agg` shape (rate-micro-batch,
100 rows per batch, grouped by value % 7 with count and sum, update mode), and writes each batch's
rows to `<work>/out/<batch id>.json`. So any mix of runs, restarts and restores over one checkpoint
can be compared batch by batch with one uninterrupted run on Spark's own RocksDB provider (the
reference, `tests/conftest.py::agg_reference`). The jobs:

- demo_app (`spark_statebackend/demo_app.py`): PySpark, the backend enabled with `configure()`;
- `tests/apps/agg_job.py`: PySpark that never imports spark_statebackend, for spark-submit;
- `tests/apps/AggJob.java`: the same as a JVM-only job, compiled here with javac against pyspark's jars.

The spark-submit jobs print `FIRST <id>` (the first batch the run executed: where it resumed) and,
with `hold`, wait after their last batch until the test has seen it checkpointed (`release`), so
the test knows exactly which checkpoint the next run must resume from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .demorig import ROOT, app_command, durable_batch
from .servers.process import wait_until

APPS = Path(__file__).resolve().parent / "apps"
PLUGIN = "dev.statebackend.spark.StateBackendPlugin"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: The reference runs batches 0..REF_LAST; no test compares beyond it.
REF_LAST = 7


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_jars() -> Path | None:
    """The jars of the installed pyspark (Spark's classpath), or None without pyspark or its jars."""
    try:
        jars = pyspark_home() / "jars"
    except ImportError:
        return None
    return jars if jars.is_dir() else None


def outputs(work: Path, last: int) -> dict[int, object]:
    """Each batch's output rows for batches 0..last (all must exist), as written by the job."""
    found = {int(p.stem): json.loads(p.read_text()) for p in (work / "out").glob("*.json")}
    missing = sorted(set(range(last + 1)) - set(found))
    assert not missing, f"no output for batches {missing} in {work / 'out'}"
    return {b: found[b] for b in range(last + 1)}


def assert_outputs_equal(work: Path, reference: Path, last: int) -> None:
    """Every batch 0..last produced exactly the reference's rows (an uninterrupted run on Spark's own
    provider). Stronger than comparing the final state: a restore from the wrong checkpoint shows in
    the first batch it runs."""
    got, want = outputs(work, last), outputs(reference, last)
    bad = [b for b in range(last + 1) if got[b] != want[b]]
    assert not bad, f"batches {bad} differ from the reference: {[(got[b], want[b]) for b in bad[:2]]}"


def run_reference(work: Path, last: int = REF_LAST) -> Path:
    """The uninterrupted run on Spark's own RocksDB provider, without the backend (demo_app --plain)."""
    run_demo(work, last, plain=True)
    return work


def run_demo(work: Path, until: int, *, plain: bool = False, conf: Mapping[str, str] | None = None) -> str:
    """One demo_app run of the `agg` job to batch `until` (the backend enabled with configure(), unless
    `plain`); with the backend it returns once that batch is checkpointed. Returns its stdout."""
    args = ["--plain"] if plain else []
    for k, v in (conf or {}).items():
        args += ["--extra", f"{k}={v}"]
    cmd = app_command(work, "agg", until, args=tuple(args))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def wipe_host(work: Path) -> None:
    """What a driver on a new host has: no checkpoint location, no Spark local dirs, no spool."""
    for name in ("ckpt", "local", "spool"):
        shutil.rmtree(work / name, ignore_errors=True)


def backend_conf(work: Path, **more: str) -> dict[str, str]:
    """The spark.statebackend.* keys of a job whose blob store and checkpoint log live under `work`."""
    conf = {
        "spark.statebackend.blobStore.url": (work / "blobs").as_uri(),
        "spark.statebackend.checkpointLog.url": (work / "log").as_uri(),
        "spark.statebackend.spoolDir": str(work / "spool"),
    }
    conf.update({f"spark.statebackend.{k}": v for k, v in more.items()})
    return conf


def job_env() -> dict[str, str]:
    """The environment of a spark-submit: pyspark's Spark, this Python for the driver and the sidecars
    (as a spark-submit user sets PYSPARK_PYTHON), and this checkout first on the Python path."""
    env = dict(os.environ)
    env["SPARK_HOME"] = str(pyspark_home())
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def java_job_jar(build_dir: Path) -> Path:
    """tests/apps/AggJob.java compiled with javac against pyspark's jars, as a jar for spark-submit."""
    return _javac_jar(APPS / "AggJob.java", build_dir, "aggjob.jar")


#: tests/stubs/ObjectStoreFileSystem.java: a Hadoop file system of scheme `objfs` that behaves like an
#: object store (no hard links, no atomic rename), keeping `objfs://<bucket>/<key>` under `fs.objfs.root`.
OBJFS_SOURCE = Path(__file__).resolve().parent / "stubs" / "ObjectStoreFileSystem.java"
OBJFS_CLASS = "ssbtest.ObjectStoreFileSystem"


def objfs_jar(build_dir: Path) -> Path:
    """tests/stubs/ObjectStoreFileSystem.java compiled with javac against pyspark's jars, as a jar to put
    on the driver's and executors' classpath (`spark.{driver,executor}.extraClassPath`)."""
    return _javac_jar(OBJFS_SOURCE, build_dir, "objfs.jar")


def _javac_jar(source: Path, build_dir: Path, name: str) -> Path:
    classes = build_dir / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    javac = shutil.which("javac")
    assert javac, f"javac is needed to compile {source.name}"
    subprocess.run(
        [javac, "--release", "17", "-cp", str(pyspark_home() / "jars" / "*"), "-d", str(classes),
         str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    jar = build_dir / name
    with zipfile.ZipFile(jar, "w") as z:
        for f in sorted(classes.rglob("*.class")):
            z.write(f, f.relative_to(classes).as_posix())
    return jar


@dataclass
class JobRun:
    """A finished spark-submit: its exit code and everything it printed."""

    returncode: int
    output: str

    @property
    def first_batch(self) -> int:
        """The first batch this run executed (where it resumed)."""
        found = re.findall(r"^FIRST (\d+)$", self.output, re.M)
        assert found, f"the job ran no batch:\n{self.output[-4000:]}"
        return int(found[0])


def spark_submit(
    work: Path,
    until: int,
    *,
    conf: Mapping[str, str],
    java_jar: Path | None = None,
    hold: bool = False,
    app_args: Sequence[str] = (),
    timeout: float = 600,
) -> JobRun:
    """Run the job (Python, or Java with `java_jar`) with pyspark's own bin/spark-submit, given only
    `--jars <the shim jar>` and `--conf` entries: nothing configure() would add.
    With `hold`, the run is released once its last batch `until` is checkpointed (durable_batch), so the
    next run has an exactly known checkpoint to resume from."""
    from spark_statebackend.spark import jar_path

    cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--master", "local[2]",
           "--jars", str(jar_path()), "--conf", f"spark.local.dir={work / 'local'}"]  # fmt: skip
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    if java_jar is not None:
        cmd += ["--class", "AggJob", str(java_jar), str(work), str(until), *(["--hold"] if hold else [])]
    else:
        cmd += [str(APPS / "agg_job.py"), "--work", str(work), "--until-batch", str(until)]
        cmd += [*(["--hold"] if hold else []), *app_args]
    log = work / f"submit-{len(list(work.glob('submit-*.log')))}.log"
    work.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=job_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            if hold:

                def checkpointed() -> bool:
                    assert proc.poll() is None, f"the job exited early:\n{log.read_text()[-4000:]}"
                    return durable_batch(work) >= until

                wait_until(checkpointed, timeout, f"checkpoint of batch {until}", interval=0.2)
                (work / "release").touch()
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return JobRun(proc.returncode, log.read_text(errors="replace"))
