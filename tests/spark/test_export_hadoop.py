"""`export_to_hadoop` (spark/hadoop_export.py): export through the JVM's Hadoop FileSystem of a real
SparkSession (Spark's own provider, no plugin), into `file:` URIs (Hadoop's LocalFileSystem, with its
checksum files). The blob store and log are the rig's (tests/sidecarrig.py: checkpoints of batches 0..2,
store 0/0/default holding `<v>.zip` and `<v-1>.sst` at version v).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.spark.export import ExportError
from spark_statebackend.spark.hadoop_export import export_to_hadoop
from tests.sidecarrig import KEY, QID, Rig

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402


@pytest.fixture(scope="module")
def spark(shim_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    active = SparkSession.getActiveSession()
    if active is not None:  # another module's session would carry the plugin
        active.stop()
    local = tmp_path_factory.mktemp("hadoop-export-local")
    session = (
        SparkSession.builder.master("local[1]")
        .appName("test_export_hadoop")
        # The jar without the plugin (Spark's own provider): the first session of this pytest process
        # may launch its JVM, whose classpath later modules' sessions (with the plugin) share.
        .config("spark.jars", str(shim_jar))
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(local))
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()


def settings(rig: Rig) -> dict[str, str]:
    return {"blobStore.url": (rig.tmp / "blobs").as_uri(), "checkpointLog.url": (rig.tmp / "log").as_uri()}


def test_export_into_the_querys_location_writes_the_stores_and_keeps_sparks_files(
    spark: SparkSession, rig: Rig
) -> None:
    before = {p.name: p.read_bytes() for p in (rig.location / "commits").iterdir()}
    result = export_to_hadoop(spark, rig.location.as_uri(), **settings(rig))
    assert (result.query_id, result.batch, result.version) == (QID, 2, 3)
    assert [s.key for s in result.stores] == [KEY]
    store_dir = rig.location / "state" / "0" / "0"
    assert (store_dir / "3.zip").read_bytes() == b"zip 2" and (store_dir / "2.sst").read_bytes() == b"s"
    assert {p.name: p.read_bytes() for p in (rig.location / "commits").iterdir()} == before

    with pytest.raises(ExportError, match=r"1 store dir\(s\) of .* already hold files \(state/0/0\)"):
        export_to_hadoop(spark, rig.location.as_uri(), **settings(rig))
    (store_dir / "3.zip").write_bytes(b"not this")
    export_to_hadoop(spark, rig.location.as_uri(), force=True, **settings(rig))
    assert (store_dir / "3.zip").read_bytes() == b"zip 2"


def test_export_into_a_new_location_writes_sparks_files_too(
    spark: SparkSession, rig: Rig, tmp_path: Path
) -> None:
    target = tmp_path / "remote" / "ckpt"
    result = export_to_hadoop(spark, target.as_uri(), query_id=QID, **settings(rig))
    assert result.version == 3
    assert (target / "metadata").read_bytes() == (rig.location / "metadata").read_bytes()
    assert (target / "commits" / "2").read_bytes() == b"commits 2"
    assert (target / "offsets" / "2").read_bytes() == b"offsets 2"
    assert (target / "state" / "0" / "0" / "3.zip").read_bytes() == b"zip 2"
