"""Checkpoint locations on another Hadoop scheme (issue 22 item 2), with a file system that behaves
like an object store: tests/stubs/ObjectStoreFileSystem.java (`objfs://<bucket>/<key>`, no hard links,
no atomic rename, registered with `fs.objfs.impl`), compiled here with javac against pyspark's jars and
put on the driver's classpath. The job is tests/apps/agg_job.py run by spark-submit with conf keys only.

What is shown: Spark's metadata (`offsets/`, `commits/`, `metadata`, `sources/`, the operator
metadata) is written into the location by Spark, while no state store file ever reaches it: they
are in the host's local mirror (jvm-bridge RemoteLocations) and backed up to the blob store; a
driver on a new host (mirrors, Spark's local dirs and spool gone; the location, the blob store and
the checkpoint log kept) resumes after Spark's last commit, each store restored from the blob store,
with exactly the output of an uninterrupted run on Spark's own provider; a remote checkpoint Spark's
own provider started continues with the backend.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.demorig import durable_batch
from tests.jobrig import (
    OBJFS_CLASS,
    PLUGIN,
    REF_LAST,
    ROCKSDB,
    assert_outputs_equal,
    backend_conf,
    objfs_jar,
    spark_submit,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

LOCATION = "objfs://bucket/ckpt"
#: A state store dir's files, as a path below a location: state/<op>/<part>[/<store>]/<file>; not
#: Spark's state schema (`state/<op>/<part>/_metadata/schema`), which is metadata.
STATE_FILE = re.compile(r"state/\d+/\d+/(?!_)")


@pytest.fixture(scope="module")
def objfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The object store stub's jar."""
    if shutil.which("javac") is None:
        pytest.skip("javac is needed for the object store stub")
    return objfs_jar(tmp_path_factory.mktemp("objfs"))


def objfs_conf(work: Path, jar: Path) -> dict[str, str]:
    return {
        "spark.plugins": PLUGIN,
        **backend_conf(work, mirrorDir=str(work / "mirrors")),
        "spark.hadoop.fs.objfs.impl": OBJFS_CLASS,
        "spark.hadoop.fs.objfs.root": str(work / "objfs"),
        "spark.driver.extraClassPath": str(jar),
        "spark.executor.extraClassPath": str(jar),
    }


def remote_files(work: Path) -> list[str]:
    """Every file of the location `objfs://bucket/ckpt`, relative to it."""
    root = work / "objfs" / "bucket" / "ckpt"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def mirrored_state_files(work: Path) -> list[str]:
    """Every state store file in the host's mirrors (<mirrorDir>/<location hash>/state/...)."""
    mirrors = work / "mirrors"
    return sorted(
        p.relative_to(mirrors).as_posix()
        for p in mirrors.rglob("*")
        if p.is_file() and STATE_FILE.search(p.relative_to(mirrors).as_posix())
    )


def test_a_remote_location_keeps_state_local_and_a_new_host_restores_it(
    tmp_path: Path, objfs: Path, agg_reference: Path
) -> None:
    work = tmp_path
    conf = objfs_conf(work, objfs)
    first = spark_submit(work, 3, conf=conf, hold=True, app_args=["--checkpoint-location", LOCATION])
    assert first.returncode == 0, first.output[-4000:]
    assert first.first_batch == 0

    files = remote_files(work)
    for meta in ("metadata", "offsets/3", "commits/3", "state/0/0/_metadata/schema"):
        assert meta in files, (meta, files)
    assert any(f.startswith("state/0/_metadata/") for f in files), files  # operator metadata: Spark's
    assert not [f for f in files if STATE_FILE.search(f)], f"state files reached the location: {files}"
    assert not re.search(r"OBJFS create \S*/state/\d+/\d+/(?!_)", first.output)
    mirrored = mirrored_state_files(work)
    assert any(f.endswith(".zip") or f.endswith(".changelog") for f in mirrored), mirrored
    (mirror_root,) = {Path(f).parts[0] for f in mirrored}
    assert (work / "mirrors" / mirror_root / "location").read_text() == f"{LOCATION}\n"
    assert durable_batch(work) == 3

    # A new host: its mirrors, Spark's local dirs and the spool are gone; the location is durable.
    for name in ("mirrors", "local", "spool"):
        shutil.rmtree(work / name, ignore_errors=True)
    second = spark_submit(work, REF_LAST, conf=conf, app_args=["--checkpoint-location", LOCATION])
    assert second.returncode == 0, second.output[-4000:]
    assert second.first_batch == 4  # after Spark's last commit, from the remote location
    assert_outputs_equal(work, agg_reference, REF_LAST)
    assert not [f for f in remote_files(work) if STATE_FILE.search(f)]
    assert mirrored_state_files(work), "the stores were not restored into the new host's mirror"


def test_enabling_the_backend_continues_an_existing_remote_checkpoint(
    tmp_path: Path, objfs: Path, agg_reference: Path
) -> None:
    """A query that ran on the remote location with Spark's own provider alone (its state in the
    location) continues with the backend: each store's first load copies Spark's own files from the
    location into the mirror (the blob store has no checkpoint of it yet), the output equals the
    reference batch by batch, and from then on the state is backed up and never written remotely."""
    work = tmp_path
    plain = {k: v for k, v in objfs_conf(work, objfs).items() if not k.startswith("spark.statebackend.")}
    del plain["spark.plugins"]
    plain["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB
    before = spark_submit(work, 3, conf=plain, app_args=["--checkpoint-location", LOCATION])
    assert before.returncode == 0, before.output[-4000:]
    spark_state = [f for f in remote_files(work) if STATE_FILE.search(f)]
    assert spark_state, "Spark's own provider wrote no state into the location"

    after = spark_submit(
        work, REF_LAST, conf=objfs_conf(work, objfs), app_args=["--checkpoint-location", LOCATION]
    )
    assert after.returncode == 0, after.output[-4000:]
    assert after.first_batch == 4
    assert_outputs_equal(work, agg_reference, REF_LAST)
    # Version 4 (batch 3's) was only ever written into the location, by Spark's own provider: the
    # mirror has it because each store's first load copied Spark's files over.
    mirrored = mirrored_state_files(work)
    for part in (0, 1):
        assert any(re.search(rf"/state/0/{part}/4\.zip$", f) for f in mirrored), mirrored
    assert [f for f in remote_files(work) if STATE_FILE.search(f)] == spark_state  # nothing new remotely
    assert durable_batch(work) >= 4
