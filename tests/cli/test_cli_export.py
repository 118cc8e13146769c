"""`spark-statebackend export` (spark/export.py) on a real local blob store and file checkpoint log:
the layout it writes (Spark's own: `state/<op>/<part>/...` at the version of the location's newest
commit, the driver files of a new directory), and its refusals and errors (a store dir holding files,
a missing or corrupt blob, a batch Spark's commit log does not end at, a symlink, an unknown query).

The rig (tests/sidecarrig.py) has checkpoints of batches 0..2; store 0/0/default holds `<v>.zip` and
`<v-1>.sst` at version v, and the `_driver` snapshots hold `metadata`, `offsets/` and `commits/`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
from click.testing import CliRunner

from spark_statebackend.checkpoints.checkpoint import DRIVER_STORE
from spark_statebackend.cli import main
from spark_statebackend.lifecycle.reports import write_report
from spark_statebackend.spark.location import stage_driver_files
from tests.sidecarrig import KEY, QID, Rig
from tests.trees import make_tree, read_tree, restored_as


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def export(rig: Rig, location: Path, *extra: str) -> tuple[int, str, str]:
    return run(
        "export",
        "--checkpoint-location",
        str(location),
        "--blob-url",
        (rig.tmp / "blobs").as_uri(),
        "--log",
        (rig.tmp / "log").as_uri(),
        *extra,
    )


def store_files(location: Path) -> dict[str, object]:
    return restored_as(read_tree(location / "state" / "0" / "0"))


def mode(data: bytes) -> tuple[bytes, int]:
    return data, 0o644


def test_export_writes_the_version_of_the_newest_commit_in_sparks_layout(rig: Rig) -> None:
    # The rig's location has Spark's metadata, offsets and commits 0..2 and no store files (a remote
    # location's state lives on executors' disks): batch 3 loads version 3, the checkpoint of batch 2.
    code, out, err = export(rig, rig.location, "--json")
    assert code == 0, err
    doc = orjson.loads(out)
    assert (doc["query"], doc["batch"], doc["version"]) == (QID, 2, 3)
    assert [s["store"] for s in doc["stores"]] == [KEY]
    assert doc["stores"][0]["snapshot"] == rig.index_of(2)
    assert store_files(rig.location) == restored_as({"3.zip": mode(b"zip 2"), "2.sst": mode(b"s")})
    assert not (rig.location / "_statebackend").exists()  # nothing of ours left: Spark's layout only


def test_export_into_a_new_directory_rebuilds_sparks_driver_files(rig: Rig, tmp_path: Path) -> None:
    target = tmp_path / "new-location"
    code, out, err = export(rig, target, "--query", QID)
    assert code == 0, err
    assert "1 store(s) at state version 3 (Spark runs batch 3 next" in out
    assert (target / "metadata").read_bytes() == (rig.location / "metadata").read_bytes()
    assert sorted(os.listdir(target / "commits")) == ["1", "2"]  # the _driver snapshot's N-1, N
    assert (target / "offsets" / "2").read_bytes() == b"offsets 2"
    assert store_files(target) == restored_as({"3.zip": mode(b"zip 2"), "2.sst": mode(b"s")})
    assert sorted(os.listdir(target)) == ["commits", "metadata", "offsets", "state"]


def test_a_store_dir_holding_files_is_refused_unless_forced(rig: Rig) -> None:
    make_tree(rig.location / "state" / "0" / "0", {"3.zip": b"spark's own"})
    code, _, err = export(rig, rig.location)
    assert code == 1
    assert f"query {QID}: 1 store dir(s) already hold files ({rig.location / 'state' / '0' / '0'})" in err
    assert "--force" in err
    assert (rig.location / "state" / "0" / "0" / "3.zip").read_bytes() == b"spark's own"
    code, _, err = export(rig, rig.location, "--force")
    assert code == 0, err
    assert (rig.location / "state" / "0" / "0" / "3.zip").read_bytes() == b"zip 2"


def test_a_corrupt_blob_fails_naming_query_store_version_and_blob(rig: Rig) -> None:
    blob = rig.file_blob(2, "3.zip")
    path = rig.blob_path(blob)
    os.chmod(path, 0o600)
    path.write_bytes(b"zip X")  # same size, other bytes: only the checksum tells
    code, _, err = export(rig, rig.location)
    assert code == 1
    assert f"query {QID} store {KEY} version 3" in err and blob in err
    assert not (rig.location / "state" / "0" / "0").exists() or not os.listdir(rig.location / "state/0/0")


def test_a_missing_blob_fails_naming_it_and_writes_no_store(rig: Rig) -> None:
    blob = rig.file_blob(2, "2.sst")
    rig.blob_path(blob).unlink()
    code, _, err = export(rig, rig.location)
    assert code == 1
    assert f"query {QID} store {KEY} version 3" in err and blob in err
    assert not (rig.location / "state" / "0" / "0").exists() or not os.listdir(rig.location / "state/0/0")


def test_a_batch_spark_committed_after_the_checkpoint_comes_from_its_upload_report(rig: Rig) -> None:
    # Spark committed batch 3 here (version 4) and no checkpoint holds it yet: its upload report does.
    make_tree(rig.location, {"offsets": {"3": b"offsets 3"}, "commits": {"3": b"commits 3"}})
    code, _, err = export(rig, rig.location)
    assert code == 1 and f"query {QID} store {KEY} version 4: no checkpoint or upload report" in err
    v4 = make_tree(rig.tmp / "state" / "v4", {"4.zip": b"zip 3", "3.sst": b"s"})
    marker = rig.sidecar.uploads.bases.manager(QID).upload("b3", {KEY: v4}, versions={KEY: 4})[KEY]
    write_report(rig.store, QID, 4, KEY, marker, "executor-1")
    code, out, err = export(rig, rig.location, "--batch", "3")
    assert code == 0, err
    assert "state version 4 (Spark runs batch 4 next" in out
    assert store_files(rig.location) == restored_as({"4.zip": mode(b"zip 3"), "3.sst": mode(b"s")})


def test_a_batch_other_than_the_newest_commit_is_refused(rig: Rig) -> None:
    code, _, err = export(rig, rig.location, "--batch", "1")
    assert code == 1
    assert "resumes after batch 2 (its commit log)" in err and "exporting batch 1" in err
    assert not (rig.location / "state").exists()


def test_a_symlink_among_sparks_files_is_refused(rig: Rig, tmp_path: Path) -> None:
    outside = make_tree(tmp_path / "outside", {"0": b"not spark's"})
    os.symlink(outside, rig.location / "state")
    code, _, err = export(rig, rig.location)
    assert code == 1 and str(rig.location / "state") in err and "symlink" in err
    assert sorted(os.listdir(outside)) == ["0"]


def test_an_unknown_query_is_an_error(rig: Rig, tmp_path: Path) -> None:
    code, _, err = export(rig, tmp_path / "elsewhere")
    assert code == 1 and "no query is known for" in err and "give the query id" in err
    code, _, err = export(rig, rig.location, "--query", "not-this-one")
    assert code == 1 and f"belongs to query {QID}, not to query not-this-one" in err


def _checkpoint_with_operator_metadata(rig: Rig) -> None:
    """Checkpoint batch 2 again with a `_driver` snapshot that holds operator metadata too, staged from
    the location as the committer does (stage_driver_files)."""
    make_tree(rig.location, {"state": {"0": {"_metadata": {"metadata": b"v1\noperator metadata"}}}})
    staged = rig.tmp / "driver-b2-full"
    stage_driver_files(rig.location, 2, staged)
    rig.checkpoint(
        2,
        rig.sidecar.uploads.bases.manager(QID).upload(
            "b2x", {DRIVER_STORE: staged}, versions={DRIVER_STORE: 2}
        ),
    )


def test_operator_metadata_missing_from_a_wiped_state_dir_comes_back(rig: Rig) -> None:
    _checkpoint_with_operator_metadata(rig)
    shutil.rmtree(rig.location / "state")
    code, _, err = export(rig, rig.location)
    assert code == 0, err
    assert (rig.location / "state" / "0" / "_metadata" / "metadata").read_bytes() == b"v1\noperator metadata"
    assert store_files(rig.location) == restored_as({"3.zip": mode(b"zip 2"), "2.sst": mode(b"s")})


def test_operator_metadata_spark_has_is_never_replaced(rig: Rig) -> None:
    _checkpoint_with_operator_metadata(rig)
    (rig.location / "state" / "0" / "_metadata" / "metadata").write_bytes(b"v1\nspark's newer metadata")
    code, _, err = export(rig, rig.location)
    assert code == 0, err
    assert (rig.location / "state/0/_metadata/metadata").read_bytes() == b"v1\nspark's newer metadata"


def test_sparks_own_files_in_a_store_dir_do_not_count_as_state(rig: Rig) -> None:
    # Spark keeps partition 0's state schema in the store dir (`state/<op>/0/_metadata/schema`).
    make_tree(rig.location / "state" / "0" / "0", {"_metadata": {"schema": b"v1\nschema"}})
    code, _, err = export(rig, rig.location)
    assert code == 0, err
    assert (rig.location / "state/0/0/_metadata/schema").read_bytes() == b"v1\nschema"
    assert (rig.location / "state/0/0/3.zip").read_bytes() == b"zip 2"


def test_a_store_without_an_upload_report_fails_the_export_even_when_others_have_one(rig: Rig) -> None:
    make_tree(rig.location, {"offsets": {"3": b"offsets 3"}, "commits": {"3": b"commits 3"}})
    other = "0/1/default"  # reported; the checkpoint's own store 0/0/default is not
    v4 = make_tree(rig.tmp / "state" / "other-v4", {"4.zip": b"zip 3"})
    marker = rig.sidecar.uploads.bases.manager(QID).upload("b3", {other: v4}, versions={other: 4})[other]
    write_report(rig.store, QID, 4, other, marker, "executor-1")
    code, _, err = export(rig, rig.location)
    assert code == 1 and f"query {QID} store {KEY} version 4: no checkpoint or upload report" in err
    assert not (rig.location / "state").exists()
