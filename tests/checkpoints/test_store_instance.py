"""The one home of the store instance (checkpoints/store_instance.py: key, parse, its dir in a checkpoint
location) and of "batch N commits state version N+1" (checkpoints/ids.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import batch_of_version, version_of_batch
from spark_statebackend.checkpoints.store_instance import MAX_INT64, StoreInstance
from spark_statebackend.engine.backup import BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner, load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.runtime.spool import RestoreRequest, SnapshotEvent
from spark_statebackend.stores import open_blob_store


@pytest.mark.parametrize(
    "inst",
    [
        StoreInstance(0, 0, "default"),
        StoreInstance(1, 199, "left-keyToNumValues"),
        StoreInstance(2, 7, "a/b/c"),  # a store name containing the separator
        StoreInstance(MAX_INT64, 0, "x"),
    ],
)
def test_key_and_parse_round_trip(inst: StoreInstance) -> None:
    assert StoreInstance.parse(inst.key) == inst
    assert StoreInstance.parse_or_none(inst.key) == inst
    assert str(inst) == inst.key


def test_a_store_name_with_a_slash_keeps_operator_and_partition() -> None:
    inst = StoreInstance.parse("3/4/x/y")
    assert (inst.operator, inst.partition, inst.store_name) == (3, 4, "x/y")
    assert inst.key == "3/4/x/y"


@pytest.mark.parametrize(
    "key", ["", "st", "_driver", "0/0", "0/0/", "a/0/x", "0/-1/x", "00/0/x", "9223372036854775808/0/x"]
)
def test_keys_of_no_instance(key: str) -> None:
    assert StoreInstance.parse_or_none(key) is None
    with pytest.raises(ValueError, match="store instance key"):
        StoreInstance.parse(key)


def test_dir_in_a_checkpoint_location() -> None:
    assert StoreInstance(0, 5, "default").dir_parts() == ("state", "0", "5")
    assert StoreInstance(1, 0, "right-keyWithIndexToValue").dir_parts() == (
        "state",
        "1",
        "0",
        "right-keyWithIndexToValue",
    )


@pytest.mark.parametrize("name", ["a/b", "..", "."])
def test_a_name_that_is_no_path_component_has_no_dir(name: str) -> None:
    with pytest.raises(ValueError, match="store name"):
        StoreInstance(0, 0, name).dir_parts()


def test_spool_documents_name_their_instance(tmp_path: Path) -> None:
    common: dict[str, object] = {
        "query_id": "q",
        "checkpoint_root": tmp_path,
        "dfs_dir": tmp_path / "state" / "2" / "3" / "s",
        "operator": 2,
        "partition": 3,
        "store": "s",
        "version": 5,
        "spark_unique_id": None,
        "executor_id": "driver",
        "created_at_ms": 0,
    }
    event = SnapshotEvent(
        batch_id=4,
        staged_dir=tmp_path / "st",
        files=("5.zip",),
        stage_nanos=0,
        **common,  # type: ignore[arg-type]
    )
    request = RestoreRequest(request_id="r1", **common)  # type: ignore[arg-type]
    assert event.instance == request.instance == StoreInstance(2, 3, "s")
    assert event.instance.key == "2/3/s"
    assert tmp_path.joinpath(*event.instance.dir_parts()) == event.dfs_dir


def test_snapshot_metadata_of_a_store_name_with_a_slash(tmp_path: Path) -> None:
    # The engine fills a snapshot's operator and partition from the key, as `parse` reads it; a CLI store
    # (no instance key) gets none.
    d = tmp_path / "dir"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    store = open_blob_store((tmp_path / "blobs").as_uri())
    with TransferPool(2, name="ssb-test-transfer") as pool:
        m = BackupManager(store, pool, owner=SnapshotOwner("q1"))
        markers = m.upload("cp-1", {"3/4/x/y": d, "plain": d})
    md = load_snapshot_index(store, markers["3/4/x/y"]).metadata
    assert (md.store, md.operator, md.partition) == ("3/4/x/y", 3, 4)
    cli = load_snapshot_index(store, markers["plain"]).metadata
    assert (cli.operator, cli.partition) == (None, None)


@pytest.mark.parametrize("batch", [0, 1, 41])
def test_batch_n_commits_version_n_plus_one(batch: int) -> None:
    assert version_of_batch(batch) == batch + 1
    assert batch_of_version(version_of_batch(batch)) == batch
