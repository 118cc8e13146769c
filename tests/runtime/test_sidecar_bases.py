"""The sidecar's diff base never outlives commitTimeout unless a checkpoint references it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointId, CheckpointV2
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from tests.trees import make_tree

QID = "3f1c7e52-6a70-4a8e-9d0c-2b6f0c1d9e11"
KEY = "0/0/default"


@pytest.mark.parametrize(("age_seconds", "reset"), [(30.0, True), (0.0, False)])
def test_an_uncheckpointed_base_older_than_commit_timeout_is_reset(
    tmp_path: Path, age_seconds: float, reset: bool
) -> None:
    settings = Settings.from_conf(
        {
            PREFIX + "blobStore.url": (tmp_path / "blobs").as_uri(),
            PREFIX + "checkpointLog.url": (tmp_path / "log").as_uri(),
            PREFIX + "commitTimeout": "10s",
        }
    )
    sidecar = Sidecar(sp.Spool(tmp_path / "spool"), "driver", settings)
    try:
        sidecar.store.ensure_ready()
        sidecar.log.create_resources()
        d = make_tree(tmp_path / "v3", {"1.sst": b"one"})
        manager = sidecar.uploads.bases.manager(QID)
        committed = manager.upload("v3", {KEY: d})[KEY]
        sidecar.log.write(
            CheckpointV2(
                CheckpointId.create(2), QID, state_checkpoint_markers={BLOBSTORE_BACKEND: {KEY: committed}}
            )
        )
        (d / "2.sst").write_bytes(b"two")
        newer = manager.upload("v5", {KEY: d})[KEY]  # its batch never got checkpointed
        sidecar.uploads.bases.bases[(QID, KEY)] = 5
        sidecar.uploads.bases.base_uploaded_at[(QID, KEY)] = time.monotonic() - age_seconds
        assert sidecar.uploads.bases.refresh(QID, [KEY]) == 3
        assert manager.previous_marker(KEY) == (committed if reset else newer)
    finally:
        sidecar.close()
