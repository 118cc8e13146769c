"""Property tests on random directory trees: backup then restore is byte-identical; an unchanged
second backup uploads nothing new."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import LocalBlobStore
from tests.trees import make_tree, read_tree

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..")
)
contents = st.one_of(
    st.just(b""), st.binary(min_size=1, max_size=64), st.binary(min_size=3000, max_size=9000)
)
trees = st.recursive(
    st.dictionaries(names, contents, max_size=5),
    lambda children: st.dictionaries(names, st.one_of(contents, children, st.none()), max_size=4),
    max_leaves=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, chunk=st.sampled_from([1024, 4096, 1 << 20]), whole=st.booleans())
def test_backup_restore_round_trip_and_no_op_second_backup(tree: dict, chunk: int, whole: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="ssb-prop-"))
    try:
        src = make_tree(base / "src", tree)
        # whole: every file one blob, restored by the local fast path; else chunked and downloaded
        store = LocalBlobStore(base / "blobs", fsync=False, whole_files=whole)
        store.ensure_ready()
        with TransferPool(4) as pool:
            manager = BackupManager(store, pool, config=BackupConfig(chunk_size=chunk))
            first = manager.upload("cp-1", {"st": src})
            manager.cleanup(first)
            RestoreManager(store, pool).restore(first["st"], base / "dst")
            assert read_tree(base / "dst") == read_tree(src)
            files_before = {b.blob_id for b in store.list("files/")}
            second = manager.upload("cp-2", {"st": src})
            assert {b.blob_id for b in store.list("files/")} == files_before
            assert manager.metrics.value("ssb_backup_files_to_upload", query=manager.owner.query_id) == 0
            manager.cleanup(second)
            RestoreManager(store, pool).restore(second["st"], base / "dst2")
            assert read_tree(base / "dst2") == read_tree(src)
    finally:
        shutil.rmtree(base, ignore_errors=True)
