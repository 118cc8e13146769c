"""Garbage collection: deletes exactly the unreferenced blobs older than the grace, never a blob a
retained checkpoint references, also while a committer commits. Real stores, logs and uploads."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND, CheckpointId, CheckpointV2
from spark_statebackend.checkpoints.logs import CheckpointLog
from spark_statebackend.checkpoints.logs.file import FileCheckpointLog
from spark_statebackend.cli import main
from spark_statebackend.common.units import format_size
from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.blobs import SnapshotOwner
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.lifecycle.gc import DEFAULT_GRACE_SECONDS, GarbageCollector
from spark_statebackend.lifecycle.reports import write_report
from spark_statebackend.runtime.committer import Committer
from spark_statebackend.runtime.progress import ProgressEvent
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import CHUNK, STORES, Driver, Executor, age, assert_restorable, closure, file_log
from tests.servers.process import wait_until
from tests.trees import make_tree, read_tree, restored_as

OLD = DEFAULT_GRACE_SECONDS + 3600  # seconds: older than the default grace


@pytest.fixture
def pool() -> Iterator[TransferPool]:
    with TransferPool(4, name="ssb-test-gc") as p:
        yield p


def listing(store: LocalBlobStore) -> dict[str, int]:
    return {b.blob_id: b.size for b in store.list("")}


class World:
    """Several queries with checkpoints (K = 1, 2, 3) on one log, plus every kind of garbage."""

    def __init__(self, store: LocalBlobStore, pool: TransferPool, root: Path, seed: int) -> None:
        rng = random.Random(seed)
        self.store = store
        self.log = file_log(root / "log")
        self.executors: dict[str, Executor] = {}
        self.garbage: set[str] = set()
        for i, keep in enumerate((1, 2, 3)):
            qid = str(uuid.UUID(int=rng.getrandbits(128)))
            ex = Executor(store, pool, qid, root / f"exec{i}", seed=seed * 10 + i)
            drv = Driver(store, self.log, pool, qid, root / f"drv{i}", retain=keep)
            b = 0
            for _ in range(rng.randint(keep + 1, keep + 4)):
                if rng.random() < 0.3:
                    # A batch that never got checkpointed (a failed commit): its upload is garbage
                    # once the next upload supersedes it, except what later snapshots retain.
                    ex.upload(b + 1, report=False)
                    b += 1
                ex.upload(b + 1)
                assert drv.finish_batch(b) == 1
                b += 1
            # A stale re-upload of an old version (a retried task): never checkpointed, not newest.
            stale = BackupManager(
                store, pool, owner=SnapshotOwner(qid), config=BackupConfig(chunk_size=CHUNK)
            )
            d = make_tree(root / f"stale{i}", {"x.sst": rng.randbytes(2 * CHUNK), "CURRENT": b"x"})
            stale_marker = stale.upload("v000000000000", {STORES[0]: d})[STORES[0]]
            self.garbage.add(stale_marker)
            # Chunks of an upload that died before its index, and a report of a batch never finished.
            for _ in range(rng.randint(1, 3)):
                bid = f"files/{qid}/{STORES[1]}/{uuid.uuid4()}"
                store.put_bytes(bid, rng.randbytes(rng.randint(1, 999)))
            write_report(store, qid, 999, STORES[0], stale_marker, "exec-9")
            self.executors[qid] = ex
        # A CLI backup (query "cli": no checkpoints in this log) and a blob of someone else's.
        cli = BackupManager(store, pool, owner=SnapshotOwner())
        cli_dir = make_tree(root / "cli", {"a": rng.randbytes(500)})
        self.cli_marker = cli.upload("00000000000000000001", {"mine": cli_dir})["mine"]
        store.put_bytes("other/not-ours.bin", b"keep me")

    def histories(self) -> dict[str, list[CheckpointV2]]:
        return {q: self.log.read_history(q) for q in self.executors}

    def referenced(self) -> set[str]:
        return set().union(*(closure(self.store, h) for h in self.histories().values()))

    def unreferenced(self) -> set[str]:
        """Blobs of queries with checkpoints that no retained checkpoint references (the oracle)."""
        qs = tuple(self.executors)
        return {
            b
            for b in listing(self.store)
            if b.split("/")[0] in ("files", "indexes", "reports") and b.split("/")[1] in qs
        } - self.referenced()

    def assert_all_restorable(self, pool: TransferPool, dest: Path) -> None:
        for q, history in self.histories().items():
            assert history, f"query {q} lost its checkpoints"
            for cp in history:
                assert_restorable(self.store, pool, cp, self.executors[q].expected, dest / q)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gc_deletes_exactly_the_old_unreferenced_blobs(
    seed: int, local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    world = World(local_store, pool, tmp_path, seed)
    rng = random.Random(seed)
    unreferenced = world.unreferenced()
    assert world.garbage <= unreferenced and len(unreferenced) > 3
    young = set(rng.sample(sorted(unreferenced), k=len(unreferenced) // 3))
    age(local_store, set(listing(local_store)) - young, OLD)
    before = listing(local_store)
    referenced = world.referenced()

    report = GarbageCollector(local_store, world.log, pool).run()

    expected = unreferenced - young
    assert set(report.garbage) == expected
    assert report.deleted == len(expected) and report.bytes_freed == sum(before[b] for b in expected)
    assert report.kept_for_grace == len(young)
    # CLI snapshots (query "cli") are kept until `forget` removes their index: all referenced.
    cli_blobs = {b for b in before if b.split("/")[1] == "cli"}
    assert report.referenced == len(referenced) + len(cli_blobs) and len(cli_blobs) == 2
    assert report.blobs_scanned == len(before)
    assert report.queries_without_checkpoints == ()
    assert not report.problems
    assert set(listing(local_store)) == set(before) - expected
    world.assert_all_restorable(pool, tmp_path / "restored")
    # The CLI backup is untouched, as is the foreign blob.
    assert cli_blobs <= set(listing(local_store)) and local_store.exists("other/not-ours.bin")
    # Idempotent: once the young garbage ages too, it goes, and nothing else.
    age(local_store, young, OLD)
    again = GarbageCollector(local_store, world.log, pool).run()
    assert set(again.garbage) == young and again.kept_for_grace == 0
    world.assert_all_restorable(pool, tmp_path / "restored2")


def test_dry_run_deletes_nothing_and_lists_what_a_real_run_deletes(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    world = World(local_store, pool, tmp_path, seed=4)
    age(local_store, listing(local_store), OLD)
    before = listing(local_store)
    dry = GarbageCollector(local_store, world.log, pool).run(dry_run=True)
    assert listing(local_store) == before
    assert dry.dry_run and dry.deleted == 0 and dry.bytes_freed == 0
    assert set(dry.garbage) == world.unreferenced() and dry.garbage_bytes > 0
    real = GarbageCollector(local_store, world.log, pool).run()
    assert real.garbage == dry.garbage and real.bytes_freed == dry.garbage_bytes


def test_grace_protects_in_flight_uploads(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    qid = str(uuid.uuid4())
    log = file_log(tmp_path / "log")
    ex = Executor(local_store, pool, qid, tmp_path / "exec")
    drv = Driver(local_store, log, pool, qid, tmp_path / "drv")
    ex.upload(1)
    assert drv.finish_batch(0) == 1
    age(local_store, listing(local_store), OLD)
    # An upload in flight: chunks are durable, its index and checkpoint are not written yet.
    in_flight = {f"files/{qid}/{STORES[0]}/{uuid.uuid4()}" for _ in range(3)}
    for b in in_flight:
        local_store.put_bytes(b, b"chunk", ttl_seconds=3600)
    report = GarbageCollector(local_store, log, pool).run()
    assert report.deleted == 0 and report.kept_for_grace == len(in_flight)
    assert all(local_store.exists(b) for b in in_flight)
    # Once older than the grace (here: a clock 7 h ahead) they are garbage.
    later = GarbageCollector(local_store, log, pool, clock=lambda: time.time() + OLD).run()
    assert set(later.garbage) == in_flight
    assert not any(local_store.exists(b) for b in in_flight)
    cp = log.read_latest(qid)
    assert cp is not None
    assert_restorable(local_store, pool, cp, ex.expected, tmp_path / "restored")


def test_checkpoint_written_during_gc_protects_its_blobs(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    qid = str(uuid.uuid4())
    log = file_log(tmp_path / "log")
    ex = Executor(local_store, pool, qid, tmp_path / "exec")
    drv = Driver(local_store, log, pool, qid, tmp_path / "drv")
    ex.upload(1)
    assert drv.finish_batch(0) == 1
    # Version 2 uploaded but not yet checkpointed, and then version 3 (so 2 is not the newest).
    v2 = ex.upload(2, report=False)
    ex.upload(3, report=False)
    age(local_store, listing(local_store), OLD)
    only_v2 = closure(local_store, [_checkpoint(qid, 1, v2)]) - closure(local_store, log.read_history(qid))
    dry = GarbageCollector(local_store, log, pool).run(dry_run=True)
    assert only_v2 & set(dry.garbage), "the scenario must put blobs of version 2 at risk"

    def commit_version_2() -> None:  # the committer writes checkpoint(v2) while GC runs
        writer = file_log(tmp_path / "log")
        writer.write(_checkpoint(qid, 1, v2))

    report = GarbageCollector(local_store, log, pool, before_recheck=commit_version_2).run()
    assert not (only_v2 & set(report.garbage))
    assert all(local_store.exists(b) for b in only_v2)
    latest = log.read_latest(qid)
    assert latest is not None and latest.batch_id == 1
    for key, marker in v2.items():
        dest = tmp_path / "r" / key.replace("/", "_")
        RestoreManager(local_store, pool).restore(marker, dest)
        assert restored_as(read_tree(dest)) == restored_as(ex.expected[marker])


def _checkpoint(qid: str, batch: int, markers: dict[str, str]) -> CheckpointV2:
    return CheckpointV2(
        checkpoint_id=CheckpointId.create(batch),
        query_id=qid,
        input_offsets={"src": str(batch)},
        state_checkpoint_markers={BLOBSTORE_BACKEND: markers},
    )


def test_newest_index_of_a_store_protects_its_uncheckpointed_diff_base(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """A batch whose checkpoint failed leaves an upload the sidecar still diffs against: the next
    snapshot retains its files. GC must not delete them, however old."""
    qid = str(uuid.uuid4())
    log = file_log(tmp_path / "log")
    ex = Executor(local_store, pool, qid, tmp_path / "exec")
    drv = Driver(local_store, log, pool, qid, tmp_path / "drv")
    ex.upload(1)
    assert drv.finish_batch(0) == 1
    ex.upload(2, report=False)  # batch 1's checkpoint never happens
    age(local_store, listing(local_store), OLD)
    report = GarbageCollector(local_store, log, pool).run()
    assert not [b for b in report.garbage if b.startswith(("files/", "indexes/"))], report.garbage
    ex.upload(3)  # diffs against version 2
    assert drv.finish_batch(2) == 1
    latest = log.read_latest(qid)
    assert latest is not None
    assert_restorable(local_store, pool, latest, ex.expected, tmp_path / "restored")


def test_gc_while_a_committer_commits(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """GC runs again and again (grace 2 s: an upload is checkpointed within milliseconds here) while
    another thread commits changing directories, with K = 2 and some batches never checkpointed.
    Afterwards every retained checkpoint restores byte-identically, and GC did delete garbage."""
    GRACE = 2.0
    qid = str(uuid.uuid4())
    log = file_log(tmp_path / "log")
    gc_log = file_log(tmp_path / "log")  # GC's own reader, as the CLI would have
    ex = Executor(local_store, pool, qid, tmp_path / "exec", seed=9)
    drv = Driver(local_store, log, pool, qid, tmp_path / "drv", retain=2)
    done = threading.Event()
    errors: list[BaseException] = []
    runs: list[int] = []

    def commit_loop() -> None:
        try:
            for b in range(60):
                if b % 5 == 4:
                    ex.upload(b + 1, report=False)  # a batch whose checkpoint never happens
                    continue
                ex.upload(b + 1)
                assert drv.finish_batch(b) == 1
                if b % 15 == 14:
                    latest = log.read_latest(qid)
                    assert latest is not None
                    assert_restorable(local_store, pool, latest, ex.expected, tmp_path / f"mid{b}")
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def gc_loop() -> None:
        with TransferPool(2, name="ssb-test-gc-loop") as gc_pool:
            collector = GarbageCollector(local_store, gc_log, gc_pool, grace_seconds=GRACE)
            try:
                while not done.is_set():
                    runs.append(collector.run().deleted)
            except BaseException as e:
                errors.append(e)

    committer = threading.Thread(target=commit_loop, name="test-committer")
    gc_thread = threading.Thread(target=gc_loop, name="test-gc")
    committer.start()
    gc_thread.start()
    committer.join(timeout=60)
    done.set()
    gc_thread.join(timeout=30)
    assert not committer.is_alive() and not gc_thread.is_alive()
    assert not errors, errors
    assert len(runs) >= 3, f"GC ran only {len(runs)} time(s) during the commits"
    # Let the last garbage age past the grace, then collect it: GC deleted something over the run.
    wait_until(
        lambda: time.time() * 1000 - max(b.modified_ms for b in local_store.list("")) > GRACE * 1000 + 100,
        10,
        "ageing",
    )
    runs.append(GarbageCollector(local_store, gc_log, pool, grace_seconds=GRACE).run().deleted)
    assert sum(runs) > 0
    history = log.read_history(qid)
    assert [c.batch_id for c in history] == [57, 58]  # batch 59 is one that never got checkpointed
    for cp in history:
        assert_restorable(local_store, pool, cp, ex.expected, tmp_path / "final")


def test_missing_index_of_a_retained_checkpoint_is_a_problem_and_keeps_the_query(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    qid = str(uuid.uuid4())
    log = file_log(tmp_path / "log")
    ex = Executor(local_store, pool, qid, tmp_path / "exec")
    drv = Driver(local_store, log, pool, qid, tmp_path / "drv")
    ex.upload(1)
    assert drv.finish_batch(0) == 1
    garbage = f"files/{qid}/{STORES[0]}/{uuid.uuid4()}"
    local_store.put_bytes(garbage, b"orphan")
    lost = ex.markers[(STORES[0], 1)]
    local_store.delete(lost)
    age(local_store, listing(local_store), OLD)
    report = GarbageCollector(local_store, log, pool).run()
    assert report.deleted == 0 and local_store.exists(garbage)
    assert len(report.problems) == 1 and lost in report.problems[0] and qid in report.problems[0]


class _UncompactedLog(FileCheckpointLog):
    """A log that, like a Kafka topic before compaction, keeps every record: retain() deletes nothing."""

    def retain(self, query_id: str, keep_last: int) -> int:
        super(FileCheckpointLog, self).retain(query_id, keep_last)  # the base only checks keep_last
        return 0


def _uncompacted_query(
    store: LocalBlobStore, pool: TransferPool, root: Path, *, batches: int
) -> tuple[str, CheckpointLog, Executor]:
    """A query whose committer (retainCheckpoints 1) checkpointed `batches` batches on an
    _UncompactedLog: every record stays, the blobs of all but the latest were cleaned up."""
    qid = str(uuid.uuid4())
    log = _UncompactedLog(root / "log", {"fsync": "false"}, key="test log")
    log.create_resources()
    ex = Executor(store, pool, qid, root / "exec")
    drv = Driver(store, log, pool, qid, root / "drv")
    for b in range(batches):
        ex.upload(b + 1)
        assert drv.finish_batch(b) == 1
    return qid, log, ex


def test_older_records_whose_indexes_cleanup_deleted_do_not_stop_gc(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """On a compacted Kafka topic older records stay readable until compaction, but cleanup deleted
    their indexes when the next checkpoint replaced them. gc used to count each as an unreadable index
    of a retained checkpoint and keep the whole query: on Tansu it deleted nothing of a live query."""
    qid, log, ex = _uncompacted_query(local_store, pool, tmp_path, batches=4)
    history = log.read_history(qid)
    assert [c.batch_id for c in history] == [0, 1, 2, 3]
    assert not local_store.exists(next(iter(history[0].markers(BLOBSTORE_BACKEND).values())))
    garbage = f"files/{qid}/{STORES[1]}/{uuid.uuid4()}"
    local_store.put_bytes(garbage, b"orphan")
    age(local_store, listing(local_store), OLD)
    report = GarbageCollector(local_store, log, pool).run()
    assert report.problems == ()
    assert garbage in report.garbage and not local_store.exists(garbage)
    assert_restorable(local_store, pool, history[-1], ex.expected, tmp_path / "after")
    # The latest checkpoint's own index still counts: losing it keeps the query whole.
    lost = next(iter(history[-1].markers(BLOBSTORE_BACKEND).values()))
    local_store.delete(lost)
    again = GarbageCollector(local_store, log, pool).run()
    assert len(again.problems) == 1 and lost in again.problems[0]


def test_an_older_record_whose_blobs_carry_a_ttl_again_protects_nothing(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """Cleanup gives the blobs only a replaced checkpoint referenced a TTL again when it cannot follow
    the chain to them; on an uncompacted topic that checkpoint's record stays readable. gc must treat
    it as out of retention: marking it kept its blobs past their TTL, and the sweep then made them
    permanent again with an ERROR about an expired reference."""
    qid, log, ex = _uncompacted_query(local_store, pool, tmp_path, batches=2)
    replaced = log.read_history(qid)[-1]
    # The next checkpoint (its executors' stores uploaded anew, the driver's snapshot unchanged).
    newer = {**replaced.markers(BLOBSTORE_BACKEND), **ex.upload(3, report=False)}
    log.write(CheckpointV2(CheckpointId.create(2), qid, state_checkpoint_markers={BLOBSTORE_BACKEND: newer}))
    only_replaced = closure(local_store, [replaced]) - closure(local_store, log.read_history(qid)[-1:])
    assert only_replaced
    for blob in only_replaced:
        local_store.set_ttl(blob, 3600)
    age(local_store, listing(local_store), OLD)
    report = GarbageCollector(local_store, log, pool).run()
    assert report.problems == () and report.ttl_removed == ()
    assert only_replaced <= set(report.garbage)
    assert not any(local_store.exists(b) for b in only_replaced)
    assert all(local_store.exists(b) for b in closure(local_store, log.read_history(qid)[-1:]))


def test_cli_gc_dry_run_then_real_run(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    world = World(local_store, pool, tmp_path, seed=5)
    age(local_store, listing(local_store), OLD)
    expected = world.unreferenced()
    args = ["gc", "--blob-url", local_store.url, "--log", (tmp_path / "log").as_uri()]
    before = listing(local_store)
    dry = CliRunner().invoke(main, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert {
        line.split()[-1] for line in dry.output.splitlines() if line.startswith("would delete")
    } == expected
    assert f"would delete {len(expected)} " in dry.output
    assert listing(local_store) == before
    real = CliRunner().invoke(main, [*args, "--grace", "6h"])
    assert real.exit_code == 0, real.output
    assert f"deleted {len(expected)} ({format_size(sum(before[b] for b in expected))})" in real.output
    assert set(listing(local_store)) == set(before) - expected
    world.assert_all_restorable(pool, tmp_path / "restored")


def test_cli_gc_with_a_log_that_knows_no_query_deletes_nothing(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    World(local_store, pool, tmp_path, seed=6)
    age(local_store, listing(local_store), OLD)
    before = listing(local_store)
    empty = tmp_path / "empty-log"
    empty.mkdir()
    result = CliRunner().invoke(
        main, ["gc", "--blob-url", local_store.url, "--log", empty.as_uri(), "--grace", "0s"]
    )
    assert result.exit_code == 0, result.output
    assert "deleted 0 " in result.output
    assert "3 quer(ies) without checkpoints: only their expired blobs are swept" in result.output
    assert listing(local_store) == before
    bad = CliRunner().invoke(
        main, ["gc", "--blob-url", local_store.url, "--log", empty.as_uri(), "--grace", "x"]
    )
    assert bad.exit_code != 0 and "--grace" in bad.output


EXPIRED = 8 * 24 * 3600.0  # seconds: past the default blobTtl (7 days)


def _orphan_and_unclean(
    store: LocalBlobStore, pool: TransferPool, root: Path
) -> tuple[CheckpointLog, Executor, Executor, CheckpointV2]:
    """Query A: a checkpoint written without its cleanup (every blob it references still carries
    its upload TTL). Query B: uploads and reports, never checkpointed (the TTL is their only owner)."""
    log = file_log(root / "log")
    a = Executor(store, pool, str(uuid.uuid4()), root / "a")
    markers = a.upload(1)
    cp = _checkpoint(a.query_id, 0, markers)
    log.write(cp)
    b = Executor(store, pool, str(uuid.uuid4()), root / "b")
    b.upload(1)
    b.upload(2)
    return log, a, b, cp


def _query_blobs_of(store: LocalBlobStore, qid: str) -> set[str]:
    return {i.blob_id for p in ("files/", "indexes/", "reports/") for i in store.list(f"{p}{qid}/")}


def test_gc_without_a_log_keeps_every_querys_blobs_expired_ones_too(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    """docs/operations.md: without --log only CLI snapshots are collected and every query's blobs are kept. A
    checkpoint whose cleanup never ran still has its upload TTLs; a gc that cannot see the checkpoint
    must not sweep them once they pass (it did: query A lost its only checkpoint's blobs)."""
    _, a, b, cp = _orphan_and_unclean(local_store, pool, tmp_path)
    queries = _query_blobs_of(local_store, a.query_id) | _query_blobs_of(local_store, b.query_id)
    local_store.put_bytes("other/expired.bin", b"x", ttl_seconds=60)

    report = GarbageCollector(local_store, None, pool, clock=lambda: time.time() + EXPIRED).run()

    assert queries <= set(listing(local_store)), "a query's blob was deleted without its log"
    assert not local_store.exists("other/expired.bin"), "the sweep still runs over what no query owns"
    assert "2 quer(ies) kept whole: no checkpoint log given" in report.summary()
    assert_restorable(local_store, pool, cp, a.expected, tmp_path / "restored")


def test_gc_sweeps_expired_blobs_of_the_whole_store_and_never_a_referenced_one(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    log, a, b, cp = _orphan_and_unclean(local_store, pool, tmp_path)
    referenced = closure(local_store, [cp])
    assert all(local_store.stat(x).expires_at_ms is not None for x in referenced)  # cleanup never ran
    orphans = _query_blobs_of(local_store, b.query_id)
    assert orphans and all(local_store.stat(x).expires_at_ms is not None for x in orphans)
    local_store.put_bytes("other/expired.bin", b"x", ttl_seconds=60)
    local_store.put_bytes("other/kept.bin", b"y")

    report = GarbageCollector(local_store, log, pool, clock=lambda: time.time() + EXPIRED).run()

    assert _query_blobs_of(local_store, b.query_id) == set()  # a query without checkpoints: swept
    assert not local_store.exists("other/expired.bin") and local_store.exists("other/kept.bin")
    assert report.swept >= len(orphans) + 1
    assert set(report.ttl_removed) == referenced  # kept, and made permanent
    assert all(local_store.stat(x).expires_at_ms is None for x in referenced)
    assert b.query_id in report.queries_without_checkpoints and not report.problems
    assert_restorable(local_store, pool, cp, a.expected, tmp_path / "restored")
    dry = GarbageCollector(local_store, log, pool, clock=lambda: time.time() + EXPIRED).run(dry_run=True)
    assert dry.swept == 0 and "TTL sweep not run" in dry.summary()


def test_the_committer_sweeps_periodically_on_its_own_thread(
    local_store: LocalBlobStore, pool: TransferPool, tmp_path: Path
) -> None:
    log, a, b, cp = _orphan_and_unclean(local_store, pool, tmp_path)
    referenced = closure(local_store, [cp])
    orphans = _query_blobs_of(local_store, b.query_id)
    now = [time.time()]
    committer = Committer(local_store, log, pool, clock=lambda: now[0], sweep_interval_seconds=3600)
    assert committer.maybe_sweep() is None  # no query yet: an executor sidecar's committer never sweeps
    ckpt = make_tree(tmp_path / "ckpt", {"metadata": f'{{"id":"{a.query_id}"}}\n'.encode()})
    committer.submit(ProgressEvent(a.query_id, "rig", ckpt, 1, {}, 2, int(now[0] * 1000)))
    committer.poll()  # learns query A (its batch 1 waits for reports)
    assert committer.maybe_sweep() is None  # the first sweep is due 10 minutes after the first query
    now[0] += EXPIRED
    sweep = committer.maybe_sweep()
    assert sweep is not None
    assert committer.maybe_sweep() is None  # one at a time, and the next is an interval away
    report = sweep.result(timeout=60)
    assert _query_blobs_of(local_store, b.query_id) == set()
    # (the committer's start re-ran the latest checkpoint's cleanup, which removed their TTLs)
    assert report.swept == len(orphans) and report.ttl_removed == ()
    assert all(local_store.exists(x) and local_store.stat(x).expires_at_ms is None for x in referenced)
    assert_restorable(local_store, pool, cp, a.expected, tmp_path / "restored")
    now[0] += 3600
    again = committer.maybe_sweep()
    assert again is not None and again.result(timeout=60).swept == 0
    committer.close()
    off = Committer(local_store, log, pool, clock=lambda: now[0], sweep_interval_seconds=0)
    off.submit(ProgressEvent(a.query_id, "rig", ckpt, 1, {}, 2, int(now[0] * 1000)))
    off.poll()
    now[0] += EXPIRED
    assert off.maybe_sweep() is None
