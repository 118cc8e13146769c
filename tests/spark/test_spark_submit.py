"""spark-submit with conf keys only: no configure(), a driver that never imports spark_statebackend.

Every job here is run by pyspark's own bin/spark-submit with `--jars <shim jar>`, `--conf
spark.plugins=...StateBackendPlugin` and `--conf spark.statebackend.*` keys (tests/jobrig.py): the
PySpark job tests/apps/agg_job.py and the JVM-only tests/apps/AggJob.java (what Scala, Java and SQL
jobs get). What is shown:
- a bad, unknown or unreachable configuration fails spark-submit at application start, naming the key
  (and the URL), never printing a secret; so does a checkpoint root on a Hadoop scheme without a file
  system, and a query on such a location fails before its first batch with nothing left behind;
- a driver started where the checkpoint location is behind or missing from the latest durable
  checkpoint resumes exactly from that checkpoint (the first batch it runs is the one after it), and
  one started where the location is ahead of it continues from Spark's own files (the batch after
  Spark's last commit: nothing Spark planned is planned again, README "Exactly once"); each produces
  exactly the reference's output; one checkpoint passes between the PySpark and the Java job;
- a query the blob store knows never starts from scratch: when the rebuild is impossible the start
  fails saying why.
"""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.logs import open_checkpoint_log
from tests.demorig import durable_batch, query_id_of
from tests.jobrig import (
    PLUGIN,
    REF_LAST,
    assert_outputs_equal,
    backend_conf,
    java_job_jar,
    spark_submit,
    wipe_host,
)
from tests.servers.process import free_port

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

LOCAL_FS = "org.apache.hadoop.fs.RawLocalFileSystem"
SECRET = "not-a-real-secret-7f3a"


def plugin_conf(work: Path, **more: str) -> dict[str, str]:
    return {"spark.plugins": PLUGIN, **backend_conf(work, **more)}


def local_commit(work: Path) -> int:
    """The newest batch Spark committed in the local checkpoint location."""
    return max((int(p.name) for p in (work / "ckpt" / "commits").iterdir() if p.name.isdigit()), default=-1)


def assert_nothing_ran(work: Path, output: str) -> None:
    assert "FIRST" not in output, output[-3000:]
    assert not list((work / "out").glob("*.json"))


# -- (a) the application does not start on a bad configuration ----------------------------------------

BAD_CONFIGS = {
    "unknown key": (
        {"blobStore.urll": "file:///tmp/typo"},
        ["spark.statebackend.blobStore.urll"],
    ),
    "bad value of a key the JVM reads": (
        {"maxCommitDelay": "60"},
        ["spark.statebackend.maxCommitDelay", "60"],
    ),
    "unreachable blob store": (
        {
            "blobStore.url": "s3://ssb-bucket/prefix",
            "blobStore.options.endpoint_url": "http://127.0.0.1:{port}",
            "blobStore.options.retry_budget": "1s",
            "blobStore.options.access_key_id": "AKIAEXAMPLE",
            "blobStore.options.secret_access_key": SECRET,
        },
        ["spark.statebackend.blobStore.url", "s3://ssb-bucket/prefix"],
    ),
    "unreachable checkpoint log": (
        {
            "checkpointLog.url": "kafka://127.0.0.1:{port}/ssb-checkpoints",
            "checkpointLog.options.admin.timeout": "2s",
        },
        ["spark.statebackend.checkpointLog.url", "kafka://127.0.0.1:{port}/ssb-checkpoints"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_configuration_fails_spark_submit_naming_the_key(case: str, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    settings, expected = BAD_CONFIGS[case]
    conf = plugin_conf(tmp_path, **{k: v.format(port=port) for k, v in settings.items()})
    run = spark_submit(tmp_path, 1, conf=conf)
    assert run.returncode != 0, run.output[-3000:]
    # The exception's headline (what a user reads first) names the key, and the URL where one is at fault.
    headline = next(line for line in run.output.splitlines() if "IllegalArgumentException: " in line)
    for text in expected:
        assert text.format(port=port) in headline, (text, run.output[-3000:])
    assert SECRET not in run.output
    assert_nothing_ran(tmp_path, run.output)


def test_a_checkpoint_root_on_a_scheme_without_a_file_system_fails_the_application(tmp_path: Path) -> None:
    """spark.sql.streaming.checkpointLocation (every query's default root) on a Hadoop scheme whose file
    system the plugin cannot wrap (no class for it): the application fails at start naming the key, the
    scheme and what to do, before any query. (Remote schemes that have a class run:
    tests/spark/test_remote_location.py.)"""
    root = "nosuchfs://bucket/root"
    conf = {**plugin_conf(tmp_path), "spark.sql.streaming.checkpointLocation": root}
    run = spark_submit(tmp_path, 1, conf=conf)
    assert run.returncode != 0
    assert (
        f"spark.sql.streaming.checkpointLocation={root} is on the Hadoop scheme 'nosuchfs', whose file "
        "system the plugin did not wrap" in run.output
    ), run.output[-3000:]
    assert "spark.statebackend.remoteSchemes" in run.output
    assert "spark.statebackend.enabled=false" in run.output  # what to do instead
    assert_nothing_ran(tmp_path, run.output)


def test_a_query_on_a_scheme_without_a_file_system_fails_before_its_first_batch(tmp_path: Path) -> None:
    """A query whose checkpoint location is on a Hadoop scheme without a file system fails when it
    starts, with nothing left half-done: no request to the sidecar, nothing in the blob store or the
    checkpoint log."""
    location = "nosuchfs://bucket/ckpt"
    run = spark_submit(tmp_path, 1, conf=plugin_conf(tmp_path), app_args=["--checkpoint-location", location])
    assert run.returncode != 0
    assert 'No FileSystem for scheme "nosuchfs"' in run.output, run.output[-3000:]
    assert_nothing_ran(tmp_path, run.output)
    assert not [p for p in (tmp_path / "spool").rglob("requests/*") if p.is_file()]
    assert not (tmp_path / "blobs" / "blobs").is_dir() or not any((tmp_path / "blobs" / "blobs").iterdir())
    assert not any((tmp_path / "log").iterdir())


# -- (b) a restarted driver resumes from the latest durable checkpoint ---------------------------------


def test_jobs_resume_from_the_durable_checkpoint_wherever_the_location_stands(
    agg_reference: Path, tmp_path: Path
) -> None:
    """One checkpoint, run in turn by the PySpark job and the Java job, each time from a different local
    situation; a run on a location behind or wiped must resume right after the latest durable
    checkpoint (its first batch), one on a location ahead of it right after Spark's last commit, and
    every batch's output must be the reference's."""
    work = tmp_path / "work"
    java = java_job_jar(tmp_path / "java")
    conf = plugin_conf(work)

    run = spark_submit(work, 1, conf=conf, hold=True)  # PySpark, backend on
    assert run.returncode == 0, run.output[-4000:]
    durable = durable_batch(work)
    old_copy = tmp_path / "ckpt-old"
    shutil.copytree(work / "ckpt", old_copy, symlinks=True)

    # Ahead: the Java job with the backend switched off runs batches the blob store never sees.
    run = spark_submit(work, durable + 2, conf={**conf, "spark.statebackend.enabled": "false"}, java_jar=java)
    assert run.returncode == 0, run.output[-4000:]
    ahead = local_commit(work)
    assert durable_batch(work) == durable and ahead >= durable + 2
    run = spark_submit(work, ahead + 1, conf=conf, hold=True)  # PySpark
    assert run.returncode == 0, run.output[-4000:]
    assert run.first_batch == ahead + 1, "ahead: Spark's own files were not continued (rolled back?)"
    durable = durable_batch(work)

    # Behind: an older copy of the location (taken before the last two checkpoints).
    shutil.rmtree(work / "ckpt")
    shutil.copytree(old_copy, work / "ckpt", symlinks=True)
    assert local_commit(work) < durable
    run = spark_submit(work, durable + 1, conf=conf, java_jar=java, hold=True)
    assert run.returncode == 0, run.output[-4000:]
    assert run.first_batch == durable + 1, "behind: did not resume from the durable checkpoint"
    durable = durable_batch(work)

    # Empty: a new host, for each job.
    for java_jar in (None, java):
        wipe_host(work)
        run = spark_submit(work, durable + 1, conf=conf, java_jar=java_jar, hold=True)
        assert run.returncode == 0, run.output[-4000:]
        assert run.first_batch == durable + 1, f"wiped ({'Java' if java_jar else 'PySpark'}): wrong resume"
        durable = durable_batch(work)
    assert_outputs_equal(work, agg_reference, min(durable, REF_LAST))


# -- (c) a query the blob store knows never starts from scratch ----------------------------------------


def test_a_known_query_does_not_start_when_its_location_cannot_be_rebuilt(tmp_path: Path) -> None:
    """The blob store knows the query, the host is new, and the rebuild is impossible: the start fails
    saying why, and no batch runs (a silent start from scratch would rerun batch 0 on empty state)."""
    conf = plugin_conf(tmp_path)
    run = spark_submit(tmp_path, 0, conf=conf, hold=True)
    assert run.returncode == 0, run.output[-4000:]
    qid = query_id_of(tmp_path)
    latest = open_checkpoint_log((tmp_path / "log").as_uri()).read_latest(qid)
    assert latest is not None
    driver_index = latest.marker("blobstore", "_driver")
    assert driver_index is not None
    shutil.rmtree(tmp_path / "out")

    # 1. The _driver snapshot of the latest (and only) checkpoint is gone from the blob store.
    blob = tmp_path / "blobs" / "blobs" / driver_index
    aside = tmp_path / "driver-index.aside"
    blob.rename(aside)
    wipe_host(tmp_path)
    run = spark_submit(tmp_path, 2, conf=conf)
    assert run.returncode != 0
    assert "no retained checkpoint is restorable" in run.output, run.output[-4000:]
    assert f"blob '{driver_index}' not found" in run.output
    assert_nothing_ran(tmp_path, run.output)
    assert not (tmp_path / "ckpt").exists()
    aside.rename(blob)

    # 2. The driver's sidecar cannot run (its Python passes the start-up validation, then every
    # sidecar it starts exits at once).
    wrapper = tmp_path / "python-without-sidecar"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *spark_statebackend.runtime.sidecar*) echo "test: no sidecar here" >&2; exit 1;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    wipe_host(tmp_path)
    run = spark_submit(tmp_path, 2, conf={**conf, "spark.statebackend.sidecar.python": str(wrapper)})
    assert run.returncode != 0
    assert "cannot make checkpoint location" in run.output and "NO_SIDECAR" in run.output, run.output[-4000:]
    assert "the driver's sidecar is not running: see " in run.output  # where to look
    assert_nothing_ran(tmp_path, run.output)
    assert not (tmp_path / "ckpt").exists()
