"""A cleanup that fails between [B6] and [B7] (engine/__init__.py) is made good by the next one
(runtime/cleanup.py): the failed cleanup made its checkpoint's blobs permanent but deleted nothing of
what that checkpoint replaced, so the next cleanup follows the chain back past it. The real Committer,
BackupManager and a local blob store whose deletes fail on demand; no Spark."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.errors import BlobStoreError
from spark_statebackend.stores import LocalBlobStore
from tests.runtime.test_upgrades import KEY, OTHER, Rig


class FailingDeletes(LocalBlobStore):
    """A local blob store whose batch deletes ([B7]) fail while `failing` is set."""

    failing = False

    def delete_many(self, blob_ids: Iterable[str]) -> None:
        if self.failing:
            raise BlobStoreError("injected: the blob store refused the deletes")
        super().delete_many(blob_ids)


def test_the_cleanup_after_a_failed_one_deletes_what_that_one_left(tmp_path: Path) -> None:
    store = FailingDeletes(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    with TransferPool(4) as pool:
        rig = Rig(store, pool, tmp_path)
        first = rig.commit_version(1, 1)
        assert rig.finish_batch(0) == 1
        rig.commit_version(2, 2)
        store.failing = True
        assert rig.finish_batch(1) == 1  # written; its cleanup failed after [B6]
        store.failing = False
        assert all(store.exists(m) for m in first.values())  # version 1's snapshots are left, permanent
        assert all(store.stat(m).expires_at_ms is None for m in first.values())
        rig.commit_version(3, 3)
        assert rig.finish_batch(2) == 1
        rig.assert_exact()  # nothing of version 1 or 2 is left
        assert set(rig.latest().markers("blobstore")) >= {KEY, OTHER}
