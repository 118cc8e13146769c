"""Restores go through the marker guard (issue 24): a checkpoint is data, never an instruction.

Every path from a checkpoint to its snapshots loads them with lifecycle/markers.py
`load_checkpoint_indexes`: a marker that names no SnapshotIndex of the checkpoint's query and store
(another query's snapshot, another store's, a blob that is not a SnapshotIndex) is never used. Here the
two restores, on a real sidecar, a local blob store and real files: the executor restore refuses such
a marker (answered `error`, an ERROR naming query, store, version, checkpoint and blob; nothing is
written, the store's dir keeps Spark's own files) and the driver-side restore rejects such a
checkpoint (falls back to a retained one, or refuses to start: never another query's state).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, DRIVER_STORE
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.errors import RestoreError
from spark_statebackend.lifecycle.markers import UnusableMarkerError, load_checkpoint_indexes
from spark_statebackend.spark.driver_restore import restore_checkpoint_location
from tests.sidecarrig import KEY, KEY_DIR, QID, Rig, build_rig, restore_request
from tests.trees import make_tree, read_tree

OTHER_QID = "0f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b"
OTHER_KEY = "0/1/default"


def _foreign_index(rig: Rig, query_id: str, key: str, version: int) -> str:
    """A real SnapshotIndex of `key` of `query_id` in the rig's blob store, with files that are not
    the rig's query's state."""
    files = {f"{version}.zip": b"not this store's state", f"{version - 1}.sst": b"foreign"}
    src = make_tree(rig.tmp / "foreign" / f"{query_id}-{key.replace('/', '_')}", files)
    return rig.sidecar.uploads.bases.manager(query_id).upload("x", {key: src}, versions={key: version})[key]


def _foreign_driver_index(rig: Rig, version: int) -> str:
    """A real `_driver` SnapshotIndex of another query: its own metadata, offsets and commits."""
    src = make_tree(
        rig.tmp / "foreign" / "driver",
        {
            "metadata": b'{"id":"%s"}\n' % OTHER_QID.encode(),
            "offsets": {str(version): b"OTHER QUERY OFFSETS"},
            "commits": {str(version): b"OTHER QUERY COMMITS"},
        },
    )
    markers = rig.sidecar.uploads.bases.manager(OTHER_QID).upload(
        "d", {DRIVER_STORE: src}, versions={DRIVER_STORE: version}
    )
    return markers[DRIVER_STORE]


def _other_query_chunk(rig: Rig) -> str:
    """A file chunk of another query: a real blob, not a SnapshotIndex."""
    marker = _foreign_index(rig, OTHER_QID, KEY, 4)
    return next(iter(load_snapshot_index(rig.store, marker).dir_index.present_blob_ids()))


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# ------------------------------------------------------------------------------------ executor restore


def _copied_under_this_store(rig: Rig) -> str:
    """Another query's real SnapshotIndex copied to a blob id of this store's own shape: only the
    index's metadata tells it apart."""
    foreign = _foreign_index(rig, OTHER_QID, KEY, 4)
    copy = f"indexes/{QID}/{KEY}/v000000000004-c0ffee.json"
    rig.store.put_bytes(copy, rig.store.get_bytes(foreign))
    return copy


FOREIGN = {
    "another query's index": lambda rig: _foreign_index(rig, OTHER_QID, KEY, 4),
    "another query's index under this store's name": _copied_under_this_store,
    "another store's index": lambda rig: _foreign_index(rig, QID, OTHER_KEY, 4),
    "another query's file chunk": _other_query_chunk,
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_executor_restore_refuses_a_marker_that_is_not_this_stores_snapshot(
    rig: Rig, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    marker = FOREIGN[kind](rig)
    cp = rig.checkpoint(3, {KEY: marker})  # batch 3: state version 4
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"3.zip": b"spark's own", "2.sst": b"s"})
    location, durable = read_tree(rig.location), rig.durable()

    with caplog.at_level(logging.ERROR, logger="spark_statebackend.sidecar"):
        status, message, files, _ = rig.sidecar.restores.restore(restore_request(rig, 4, dfs))

    # Before the guard: another query's (or store's) snapshot was restored into this store's dir.
    assert (status, files) == ("error", 0), message
    problem = "belongs to query" if "c0ffee" in marker else "not a SnapshotIndex blob id"
    for named in (QID, KEY, str(cp.checkpoint_id), marker, "version 4", problem):
        assert named in message, (named, message)
    logged = [m for m in _errors(caplog) if QID in m and KEY in m and marker in m and "version 4" in m]
    assert logged, _errors(caplog)
    # Nothing written anywhere: the store's dir keeps Spark's own files, no scratch dir is left, the
    # blob store and the checkpoint log are as they were.
    assert read_tree(rig.location) == location
    assert rig.durable() == durable


def test_executor_restore_of_a_missing_index_of_its_store_stays_not_found(rig: Rig) -> None:
    """A well-formed marker of this store whose SnapshotIndex is gone is `not_found`, as before."""
    marker = f"indexes/{QID}/{KEY}/v000000000004-deadbeef.json"
    cp = rig.checkpoint(3, {KEY: marker})
    dfs = make_tree(rig.location / "state" / KEY_DIR, {"3.zip": b"spark's own"})
    location = read_tree(rig.location)
    status, message, _, _ = rig.sidecar.restores.restore(restore_request(rig, 4, dfs))
    assert status == "not_found" and marker in message and str(cp.checkpoint_id) in message, message
    assert read_tree(rig.location) == location


# ------------------------------------------------------------------------------------ driver restore


def test_driver_restore_falls_back_past_a_driver_snapshot_of_another_query(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = _foreign_driver_index(rig, 3)
    bad = rig.checkpoint(3, {DRIVER_STORE: foreign})
    new_host = rig.tmp / "new-host" / "cp"
    make_tree(new_host, {"metadata": (rig.location / "metadata").read_bytes()})

    with caplog.at_level(logging.ERROR, logger="spark_statebackend.spark"):
        outcome = restore_checkpoint_location(rig.settings, str(new_host))

    # Before the guard: "restored batch 3", with the other query's offsets and commits.
    assert outcome == "restored batch 2"
    assert (new_host / "offsets" / "2").read_bytes() == b"offsets 2"
    assert not (new_host / "offsets" / "3").exists() and not (new_host / "commits" / "3").exists()
    assert all(b"OTHER QUERY" not in p.read_bytes() for p in new_host.rglob("*") if p.is_file())
    named = [m for m in _errors(caplog) if QID in m and DRIVER_STORE in m and str(bad.checkpoint_id) in m]
    assert any(foreign in m and "not a SnapshotIndex blob id" in m for m in named), _errors(caplog)


@pytest.mark.parametrize("key", [DRIVER_STORE, KEY])
def test_driver_restore_refuses_to_start_from_another_querys_snapshot(tmp_path: Path, key: str) -> None:
    """Nothing to fall back to (retainCheckpoints=1): the start is refused, naming the query, the store,
    the checkpoint and the blob, and nothing is written into the location."""
    rig = build_rig(tmp_path, batches=2, retain=1)
    try:
        foreign = (
            _foreign_driver_index(rig, 2) if key == DRIVER_STORE else _foreign_index(rig, OTHER_QID, key, 3)
        )
        bad = rig.checkpoint(2, {key: foreign})
        rig.sidecar.log.retain(QID, 1)
        new_host = tmp_path / "wiped" / "cp"
        make_tree(new_host, {"metadata": (rig.location / "metadata").read_bytes()})
        before = rig.durable()

        # Before the guard: "restored batch 2" from the other query's snapshot.
        with pytest.raises(RestoreError, match="refusing to start from wrong state") as e:
            restore_checkpoint_location(rig.settings, str(new_host))

        for named in (QID, key, str(bad.checkpoint_id), foreign, "not a SnapshotIndex blob id"):
            assert named in str(e.value), (named, str(e.value))
        assert sorted(os.listdir(new_host)) == ["metadata"]
        assert rig.durable() == before
    finally:
        rig.sidecar.close()


# ------------------------------------------------------------------------------------ the one function


def test_load_checkpoint_indexes_guards_every_marker_and_names_the_checkpoint(rig: Rig) -> None:
    foreign = _foreign_index(rig, OTHER_QID, KEY, 3)
    missing = f"indexes/{QID}/{OTHER_KEY}/v000000000003-deadbeef.json"
    cp = rig.checkpoint(2, {KEY: foreign, OTHER_KEY: missing})
    driver = cp.marker(BLOBSTORE_BACKEND, DRIVER_STORE)
    with TransferPool(2) as pool:
        found = load_checkpoint_indexes(rig.store, cp, pool=pool)
    assert set(found.usable) == {DRIVER_STORE} and set(found.unusable) == {KEY, OTHER_KEY}
    marker, index = found.require(DRIVER_STORE)
    assert marker == driver and index.metadata.query_id == QID
    bad = found.unusable[KEY]
    assert (bad.query_id, bad.store_key, bad.marker, bad.missing) == (QID, KEY, foreign, False)
    assert str(cp.checkpoint_id) in str(bad) and foreign in str(bad)
    assert found.unusable[OTHER_KEY].missing
    with pytest.raises(UnusableMarkerError, match=str(cp.checkpoint_id)):
        found.require(KEY)
    # Only the stores asked for, and none the checkpoint lacks.
    only = load_checkpoint_indexes(rig.store, cp, stores=[DRIVER_STORE, "9/9/none"])
    assert set(only.usable) == {DRIVER_STORE} and not only.unusable
