"""The JVM shim against real Spark 4.3 queries on Spark's own RocksDBStateStoreProvider: staging on
commit, restore before load, the commit gate, the signature check and the sidecar plugin.

One local[2] session serves the module (Spark sessions are expensive); the local-cluster test runs in
its own Python process because a process holds only one SparkContext. Every query is the same small
deterministic aggregation: rate-micro-batch with 20 rows per batch, grouped by value % 5, so after n
batches every key has count 4n, and batch b commits state version b + 1 of both shuffle partitions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark_statebackend.runtime import spool
from spark_statebackend.runtime.spool import RestoreResponse, SnapshotEvent, Spool
from tests.stubs.restore_stub import RestoreStub, copy_back, not_found

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark.errors import StreamingQueryException  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from tests.paths import TESTS  # noqa: E402

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STUBS = TESTS / "stubs"
ROWS_PER_BATCH = 20
KEYS = 5


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Polls `condition` until truthy; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def spool_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spool")


@pytest.fixture(scope="module")
def spark(shim_jar: Path, spool_root: Path) -> Iterator[SparkSession]:
    active = SparkSession.getActiveSession()
    if active is not None:  # another module's session would carry the wrong jars and conf
        active.stop()
    session = (
        SparkSession.builder.master("local[2]")
        .appName("test_shim")
        .config("spark.jars", str(shim_jar))
        .config("spark.plugins", "dev.statebackend.spark.StateBackendPlugin")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)  # Spark's own: the drop-in
        .config("spark.statebackend.sidecar.mode", "none")  # the tests answer the spool themselves
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.statebackend.spoolDir", str(spool_root))
        .config("spark.statebackend.restoreTimeoutMs", "60000")
        .config("spark.statebackend.maxCommitDelay", "1s")
        .config("spark.statebackend.commitTimeout", "6s")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def executor_spool(spark: SparkSession, spool_root: Path) -> Spool:
    """The local executor's spool dir, computed in Python and checked against the JVM's view."""
    app_id = spark.sparkContext.applicationId
    path = spool.executor_spool_dir(spool_root, app_id, "driver")
    assert spark._jvm.dev.statebackend.spark.Conf.currentExecutorSpoolDir() == str(path)  # type: ignore[union-attr]
    return Spool(path)


def run_batches(
    spark: SparkSession, checkpoint: Path, batches: int, fmt: int = 1
) -> tuple[str, dict[int, int]]:
    """Runs `batches` availableNow micro-batches of the test query; returns (query id, counts)."""
    spark.conf.set("spark.sql.streaming.stateStore.checkpointFormatVersion", str(fmt))
    name = f"counts_{checkpoint.parent.name}_{time.monotonic_ns()}"
    rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH).load()
    agg = rows.groupBy((F.col("value") % KEYS).alias("k")).count()
    query_id = ""
    for _ in range(batches):
        q = (
            agg.writeStream.format("memory")
            .queryName(name)
            .outputMode("complete")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(180), "query did not finish"
        query_id = q.id
    counts = {r["k"]: r["count"] for r in spark.table(name).collect()}
    return query_id, counts


def expected_counts(batches: int) -> dict[int, int]:
    return {k: batches * ROWS_PER_BATCH // KEYS for k in range(KEYS)}


def events_for(s: Spool, checkpoint: Path) -> list[SnapshotEvent]:
    return [e for _, e in s.iter_events() if e.checkpoint_root == checkpoint]


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def referenced_files(zip_path: Path) -> set[str]:
    """What Spark's metadata inside a version zip references, as paths relative to the store dir."""
    with zipfile.ZipFile(zip_path) as zf:
        version_line, _, body = zf.read("metadata").decode().partition("\n")
    assert version_line == "v1"
    meta = orjson.loads(body)
    return {f"SSTs/{f['dfsSstFileName']}" for f in meta.get("sstFiles", [])} | {
        f"logs/{f['dfsLogFileName']}" for f in meta.get("logFiles", [])
    }


# --- signature check -------------------------------------------------------------------------------


def test_signature_check_passes_on_this_spark(spark: SparkSession) -> None:
    check = spark._jvm.dev.statebackend.spark.SignatureCheck  # type: ignore[union-attr]
    check.verify()
    assert check.sparkVersion() == pyspark.__version__
    assert pyspark.__version__.split(".")[:2] in (["4", "1"], ["4", "2"], ["4", "3"])


def test_signature_mismatch_names_the_spark_version(spark: SparkSession) -> None:
    from py4j.protocol import Py4JJavaError

    check = spark._jvm.dev.statebackend.spark.SignatureCheck  # type: ignore[union-attr]
    state = "org.apache.spark.sql.execution.streaming.state."
    with pytest.raises(Py4JJavaError) as info:  # an older load(long, boolean) signature
        check.verifyMethod(state + "RocksDB", "load", state + "RocksDB", "long, boolean")
    message = str(info.value.java_exception.getMessage())
    assert f"running Spark {pyspark.__version__}" in message
    assert "RocksDB#load(long, boolean): no such method" in message
    assert "found public org.apache.spark.sql.execution.streaming.state.RocksDB" in message, message
    with pytest.raises(Py4JJavaError) as info:
        check.verifyMethod(state + "NoSuchProvider", "createRocksDB", "void", "")
    assert f"Spark {pyspark.__version__}" in str(info.value.java_exception.getMessage())
    assert "class not found" in str(info.value.java_exception.getMessage())


# --- staging ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [1, 2], ids=["ckpt-format-v1", "ckpt-format-v2"])
def test_every_commit_is_staged_as_hard_links(
    spark: SparkSession, executor_spool: Spool, tmp_path: Path, fmt: int
) -> None:
    checkpoint = tmp_path / "ckpt"
    query_id, counts = run_batches(spark, checkpoint, 3, fmt)
    assert counts == expected_counts(3)

    events = events_for(executor_spool, checkpoint)
    assert sorted((e.partition, e.version) for e in events) == [(p, v) for p in (0, 1) for v in (1, 2, 3)]
    app = spool.sanitize_id(spark.sparkContext.applicationId)
    for e in events:
        assert (e.query_id, e.batch_id, e.operator, e.store, e.executor_id) == (
            query_id,
            e.version - 1,
            0,
            "default",
            "driver",
        )
        assert e.dfs_dir == checkpoint / "state" / "0" / str(e.partition)
        assert (e.spark_unique_id is None) == (fmt == 1)
        assert (
            e.staged_dir.parent
            == checkpoint / "_statebackend" / "staging" / app / "0" / str(e.partition) / "default"
        )
        assert e.staged_dir.name.startswith(f"{e.version}-")
        assert e.stage_nanos > 0

        # Exactly the version's zip, Spark's checksum of it (if written) and what its metadata references.
        expected = {e.zip_name} | referenced_files(e.dfs_dir / e.zip_name)
        if (e.dfs_dir / f"{e.zip_name}.crc").exists():
            expected.add(f"{e.zip_name}.crc")
        assert files_under(e.staged_dir) == expected == set(e.files)
        for rel in expected:
            assert (e.staged_dir / rel).samefile(e.dfs_dir / rel), f"{rel} is not a hard link"

    # The plugin installed our checkpoint file manager; Spark's provider stayed.
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.sql.streaming.checkpointFileManagerClass") == (
        "dev.statebackend.spark.StateBackendCheckpointFileManager"
    )
    offsets = (checkpoint / "offsets" / "2").read_text().splitlines()[1]
    assert orjson.loads(offsets)["conf"]["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB
    # localCheckpointFileManager: zips, offsets and commits were written by java.nio (no Hadoop .crc
    # side files) and no temp file was left behind; linkSstFiles: the SSTs were hard-linked from Spark's
    # local dir, not copied by Hadoop's checksummed file system (which writes a .crc beside each).
    written = [f for d in ("state", "offsets", "commits") for f in (checkpoint / d).rglob("*") if f.is_file()]
    assert [f for f in written if f.parent.name == "SSTs" and f.suffix == ".sst"]
    assert written and not [f for f in written if f.name.startswith(".")]

    if fmt == 2:  # the ids we report are the ones Spark committed to its commit log
        commit = (checkpoint / "commits" / "2").read_text().split("\n", 1)[1]
        committed = [ids[0] for ids in orjson.loads(commit)["stateUniqueIds"]["0"]]
        latest = {e.partition: e.spark_unique_id for e in events if e.version == 3}
        assert committed == [latest[0], latest[1]]


LINKING_FS = "dev.statebackend.spark.LinkingLocalFileSystem"


def test_sst_copies_between_the_local_dir_and_a_store_dir_are_hard_links(
    spark: SparkSession, tmp_path: Path
) -> None:
    jvm = spark._jvm  # type: ignore[union-attr]
    hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[union-attr]
    assert hadoop_conf.get("fs.file.impl") == LINKING_FS  # the conf Spark hands its state stores
    assert hadoop_conf.get("fs.file.impl.disable.cache") == "true"

    def hpath(p: Path) -> Any:
        return jvm.org.apache.hadoop.fs.Path(str(p))

    fs = hpath(tmp_path).getFileSystem(hadoop_conf)
    assert fs.getClass().getName() == LINKING_FS
    store = tmp_path / "ckpt" / "state" / "0" / "1"
    local = tmp_path / "local"
    local.mkdir()
    sst = local / "000012.sst"
    sst.write_bytes(b"s" * 4096)

    # RocksDBFileManager's save (copyFromLocalFile) and load (copyToLocalFile): links, no .crc.
    saved = store / "SSTs" / "000012-6f1c.sst"
    fs.copyFromLocalFile(hpath(sst), hpath(saved))
    assert saved.samefile(sst) and sorted(p.name for p in saved.parent.iterdir()) == [saved.name]
    loaded = tmp_path / "work" / "000012.sst"
    fs.copyToLocalFile(hpath(saved), hpath(loaded))
    assert loaded.samefile(saved) and sorted(p.name for p in loaded.parent.iterdir()) == [loaded.name]

    def copied(src: Path, dst: Path, load: bool = True) -> bool:
        (fs.copyToLocalFile if load else fs.copyFromLocalFile)(hpath(src), hpath(dst))
        assert dst.read_bytes() == src.read_bytes() and not dst.is_symlink()
        return not dst.samefile(src)

    # Everything else is Hadoop's copy: a store dir's other files, an SST outside a store dir, ...
    log = store / "logs" / "000010-aa.log"
    log.parent.mkdir()
    log.write_bytes(b"log")
    assert copied(log, tmp_path / "work" / "000010.log")
    elsewhere = tmp_path / "other" / "SSTs" / "x.sst"
    assert copied(sst, elsewhere, load=False)
    # ... a symlink in the location (a link to it would point Spark's local file out of the location),
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"not state")
    (store / "SSTs" / "000013-ee.sst").symlink_to(secret)
    assert copied(store / "SSTs" / "000013-ee.sst", tmp_path / "work" / "000013.sst")
    # ... a file Hadoop checksummed (its copy verifies the .crc), an existing target (overwritten).
    out = fs.create(hpath(store / "SSTs" / "000014-dd.sst"))
    out.write(bytearray(b"c" * 1000))
    out.close()
    assert (store / "SSTs" / ".000014-dd.sst.crc").exists()
    assert copied(store / "SSTs" / "000014-dd.sst", tmp_path / "work" / "000014.sst")
    taken = tmp_path / "work" / "000015.sst"
    taken.write_bytes(b"old")
    assert copied(saved, taken)


def test_local_checkpoint_file_manager_writes_atomically(spark: SparkSession, tmp_path: Path) -> None:
    jvm = spark._jvm  # type: ignore[union-attr]
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    root = tmp_path / "ckpt"
    fm = jvm.dev.statebackend.spark.LocalCheckpointFileManager(jvm.org.apache.hadoop.fs.Path(str(root)), conf)
    assert fm.isNio() and fm.isLocal()
    assert fm.createCheckpointDirectory().toString() == root.as_uri().replace("file:///", "file:/")
    target = jvm.org.apache.hadoop.fs.Path(str(root / "offsets" / "0"))

    def write(data: bytes, overwrite: bool) -> None:
        out = fm.createAtomic(target, overwrite)
        out.write(bytearray(data))
        assert not (root / "offsets" / "0").exists() or (root / "offsets" / "0").read_bytes() != data
        out.close()

    write(b"first", overwrite=False)
    assert (root / "offsets" / "0").read_bytes() == b"first"
    with pytest.raises(Exception, match=r"org\.apache\.hadoop\.fs\.FileAlreadyExistsException"):
        write(b"second", overwrite=False)  # what Spark's metadata log relies on to detect a racing writer
    assert (root / "offsets" / "0").read_bytes() == b"first"
    write(b"third", overwrite=True)
    assert (root / "offsets" / "0").read_bytes() == b"third"
    cancelled = fm.createAtomic(jvm.org.apache.hadoop.fs.Path(str(root / "offsets" / "1")), False)
    cancelled.write(bytearray(b"partial"))
    cancelled.cancel()
    assert sorted(p.name for p in (root / "offsets").iterdir()) == ["0"]  # no temp file, no side files

    stream = fm.open(target)
    assert bytes(bytearray(stream.readAllBytes())) == b"third"
    stream.close()
    listed = fm.list(jvm.org.apache.hadoop.fs.Path(str(root / "offsets")))
    assert [st.getPath().getName() for st in listed] == ["0"]
    assert fm.exists(target)
    fm.delete(target)
    fm.delete(target)  # deleting what is gone is not an error
    assert not fm.exists(target)


def test_a_location_on_an_unwrapped_scheme_loads_and_is_refused_at_query_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A scheme mapped to the local file system through fs.<scheme>.impl is not a file: location. Our
    manager loads on it (it used to ask FileSystem.getScheme(), which RawLocalFileSystem does not
    implement, so Spark failed with CANNOT_LOAD_CHECKPOINT_FILE_MANAGER); where a query starts it
    refuses it, naming the location and the scheme, before anything is created, when the conf does not
    name the plugin's MirroringFileSystem for the scheme (set after the application started): Spark
    would write the state's SSTs into the location and no commit could be backed up."""
    jvm = spark._jvm  # type: ignore[union-attr]
    conf = jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    conf.set("fs.ssbtest.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
    location = jvm.org.apache.hadoop.fs.Path(f"ssbtest://{tmp_path}/ckpt")
    assert not jvm.dev.statebackend.spark.LocalCheckpointFileManager(location, conf).isNio()  # Spark's own
    fm = jvm.dev.statebackend.spark.StateBackendCheckpointFileManager(location, conf)
    with pytest.raises(
        Exception,
        match=rf"checkpoint location ssbtest:{tmp_path}/ckpt is on the Hadoop scheme 'ssbtest', whose file "
        "system the plugin did not wrap",
    ):
        fm.createCheckpointDirectory()
    assert not (tmp_path / "ckpt").exists()


# --- restore ---------------------------------------------------------------------------------------


def lose_store_files(checkpoint: Path) -> None:
    """Deletes both stores' dirs (zips, SSTs and the schema file); keeps offsets, commits, metadata and
    the operator metadata under state/0/_metadata, which Spark's driver reads before any task runs
    (an empty or missing state/ fails the restart with STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY
    on the driver, before any store loads)."""
    for p in (0, 1):
        shutil.rmtree(checkpoint / "state" / "0" / str(p))
    assert (checkpoint / "state" / "0" / "_metadata").is_dir()


def save_staged(events: list[SnapshotEvent], blob: Path) -> dict[tuple[str, int], Path]:
    """Copies every staged dir (as an uploader would), keyed like restore requests."""
    saved = {}
    for e in events:
        dst = blob / f"{e.partition}-{e.version}"
        shutil.copytree(e.staged_dir, dst)
        saved[(str(e.dfs_dir), e.version)] = dst
    return saved


@pytest.mark.parametrize("fmt", [1, 2], ids=["ckpt-format-v1", "ckpt-format-v2"])
def test_restore_before_load_continues_exactly(
    spark: SparkSession, executor_spool: Spool, tmp_path: Path, fmt: int
) -> None:
    checkpoint = tmp_path / "ckpt"
    query_id, _ = run_batches(spark, checkpoint, 3, fmt)
    events = events_for(executor_spool, checkpoint)
    saved = save_staged(events, tmp_path / "blob")
    for path, _ in list(executor_spool.iter_events()):
        spool.remove(path)

    lose_store_files(checkpoint)
    with RestoreStub(executor_spool.dir, copy_back(saved)) as stub:
        restarted_id, counts = run_batches(spark, checkpoint, 1, fmt)

    assert counts == expected_counts(4), "state must continue exactly, as if never lost"
    assert restarted_id == query_id
    assert sorted((r.partition, r.version) for r in stub.requests) == [(0, 3), (1, 3)]
    v3_ids = {e.partition: e.spark_unique_id for e in events if e.version == 3}
    for r in stub.requests:
        assert (r.query_id, r.operator, r.store, r.executor_id) == (query_id, 0, "default", "driver")
        assert r.checkpoint_root == checkpoint and r.dfs_dir == checkpoint / "state" / "0" / str(r.partition)
        # In format v2 the id is known only when Spark's first read names the file; either way the
        # sidecar restores the checkpointed version, whose files carry the committed ids.
        assert r.spark_unique_id in (None, v3_ids[r.partition])
        assert str(r.dfs_dir) in r.missing and "3" in r.missing
    # The request files are answered and gone; the responses were consumed by the JVM.
    assert executor_spool.pending_requests() == []
    assert not list(executor_spool.responses_dir.glob("*.json"))
    # The restarted query staged its next version.
    assert sorted((e.partition, e.version) for e in events_for(executor_spool, checkpoint)) == [
        (0, 4),
        (1, 4),
    ]


def test_restore_not_found_fails_loudly(spark: SparkSession, executor_spool: Spool, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    run_batches(spark, checkpoint, 2)
    lose_store_files(checkpoint)
    with RestoreStub(executor_spool.dir, not_found) as stub, pytest.raises(StreamingQueryException) as info:
        run_batches(spark, checkpoint, 1)
    assert "CANNOT_LOAD_STATE_STORE" in str(info.value), str(info.value)[:2000]
    assert stub.requests and {r.version for r in stub.requests} == {2}
    assert executor_spool.pending_requests() == []


def _lagging_upload(s: Spool, staged_ms_ago: int) -> None:
    """Make the sidecar's status say its oldest upload in flight was staged that long ago."""
    staged = int(time.time() * 1000) - staged_ms_ago
    spool.atomic_write_json(
        s.dir / "status.json", {"schema_version": 1, "oldest_upload_staged_at_ms": staged}
    )


def test_commit_blocks_while_an_upload_lags_beyond_max_commit_delay(
    spark: SparkSession, executor_spool: Spool, tmp_path: Path
) -> None:
    import threading

    checkpoint = tmp_path / "ckpt"
    run_batches(spark, checkpoint, 1)
    before = len(events_for(executor_spool, checkpoint))
    _lagging_upload(executor_spool, staged_ms_ago=5_000)  # older than maxCommitDelay=1s
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(run_batches(spark, checkpoint, 1)), daemon=True)
    runner.start()
    gate = executor_spool.dir / "commit-gate.json"
    try:
        wait_for(gate.exists, 60, "a commit to block on the lagging upload")
        assert len(events_for(executor_spool, checkpoint)) == before  # nothing staged while blocked
        gate_doc = orjson.loads(gate.read_bytes())
        assert gate_doc["version"] == 2 and gate_doc["store"].startswith("0/")
    finally:
        spool.atomic_write_json(executor_spool.dir / "status.json", {"oldest_upload_staged_at_ms": None})
    runner.join(timeout=120)
    assert not runner.is_alive() and result, "the commit was not released once the upload finished"
    assert result[0][1] == expected_counts(2)  # type: ignore[index]
    assert not gate.exists()
    assert len(events_for(executor_spool, checkpoint)) == before + 2  # both partitions staged version 2


def test_commit_fails_after_commit_timeout_when_the_upload_never_finishes(
    spark: SparkSession, executor_spool: Spool, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "ckpt"
    run_batches(spark, checkpoint, 1)
    _lagging_upload(executor_spool, staged_ms_ago=60_000)
    try:
        with pytest.raises(StreamingQueryException) as info:
            run_batches(spark, checkpoint, 1)
    finally:
        (executor_spool.dir / "status.json").unlink()
    # Spark wraps the commit failure (CANNOT_COMMIT); ours is the cause, in the JVM stack trace.
    messages, cause = [str(info.value)], getattr(info.value, "_origin", None)
    while cause is not None:  # the JVM Throwable and its causes
        messages.append(str(cause.getMessage()))
        cause = cause.getCause()
    trace = "\n".join(messages)
    assert "CANNOT_COMMIT" in trace and "spark.statebackend.commitTimeout" in trace, trace[:3000]
    assert not (executor_spool.dir / "commit-gate.json").exists()


def test_the_commit_gate_holds_only_the_lagging_querys_commits(
    spark: SparkSession, executor_spool: Spool, tmp_path: Path
) -> None:
    """`status.json` says which queries lag (`oldest_by_query`, runtime/upload_lag.py): the gate holds a
    store's commit only on its own query's lag, and holds every query on a status without per-query
    figures (the plugin's once it gave up restarting the sidecar). Two queries blocked at once share
    `commit-gate.json`: one let go leaves it listing the other, and it goes with the last (issue 21)."""
    import threading

    status = executor_spool.dir / "status.json"
    old = int(time.time() * 1000) - 5_000  # older than maxCommitDelay=1s
    live_conf = spark._jsc.sc().conf()  # type: ignore[union-attr]  # the SparkConf SparkEnv reads
    live_conf.set("spark.statebackend.commitTimeout", "120s")  # both stay blocked while the test looks
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # one store per query: both block at once
    spool.atomic_write_json(status, {"schema_version": 1, "oldest_upload_staged_at_ms": old})
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            results[name] = run_batches(spark, tmp_path / name / "ckpt", 1)
        except Exception as e:  # the assertion below names it
            results[name] = e

    threads = {n: threading.Thread(target=run, args=(n,), daemon=True) for n in ("x", "y")}
    gate = executor_spool.dir / "commit-gate.json"

    def waiting() -> list[dict[str, Any]]:
        try:
            doc = orjson.loads(gate.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return []
        return list(doc.get("waiting", []))

    try:
        for t in threads.values():
            t.start()
        wait_for(lambda: len({w["query_id"] for w in waiting()}) == 2, 90, "both queries' commits blocked")
        _, qid_y = (w["query_id"] for w in waiting())
        # Only y lags now (the other's uploads caught up): x's commit goes through, y's stays held.
        spool.atomic_write_json(status, {"oldest_upload_staged_at_ms": old, "oldest_by_query": {qid_y: old}})
        wait_for(lambda: [w["query_id"] for w in waiting()] == [qid_y], 30, "x's commit let go, y's held")
        assert gate.exists() and orjson.loads(gate.read_bytes())["query_id"] == qid_y
        wait_for(lambda: sum(isinstance(r, tuple) for r in results.values()) == 1, 60, "x's batch to finish")
        assert [w["query_id"] for w in waiting()] == [qid_y], "y's commit went through on x's release"
    finally:
        spool.atomic_write_json(status, {"oldest_upload_staged_at_ms": None, "oldest_by_query": {}})
        for t in threads.values():
            t.join(timeout=120)
        live_conf.set("spark.statebackend.commitTimeout", "6s")
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert all(isinstance(r, tuple) and r[1] == expected_counts(1) for r in results.values()), results
    assert not gate.exists()


def test_jvm_request_round_trip_and_bounded_wait(spark: SparkSession, tmp_path: Path) -> None:
    requester = spark._jvm.dev.statebackend.spark.RestoreRequester  # type: ignore[union-attr]
    d = tmp_path / "spool"

    def answer(r: spool.RestoreRequest) -> RestoreResponse:
        status = "restored" if r.version == 7 else "error"
        return RestoreResponse(r.request_id, status, f"v{r.version}", files=2, bytes=10, duration_ms=1)

    with RestoreStub(d, answer, executor_id="test") as stub:
        assert (
            requester.requestForTest(str(d), 7, 30000, 30000) == "RESTORED: v7 files=2 bytes=10 duration_ms=1"
        )
        assert requester.requestForTest(str(d), 8, 30000, 30000) == "ERROR: sidecar: error: v8"
    assert [r.version for r in stub.requests] == [7, 8]
    assert stub.requests[0].dfs_dir == Path("/nonexistent/ckpt/state/0/0")

    # A live sidecar that never answers: the wait ends at the timeout and the request is withdrawn.
    Spool(d).write_sidecar_marker("test")
    started = time.monotonic()
    assert requester.requestForTest(str(d), 9, 300, 30000) == "TIMEOUT: no response within 300 ms"
    assert time.monotonic() - started < 10
    assert Spool(d).pending_requests() == []

    # No live sidecar (a marker naming an exited process, then no marker): the wait ends after the grace.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    Spool(d).write_sidecar_marker("test", pid=dead.pid)
    assert requester.requestForTest(str(d), 10, 60000, 300).startswith(
        "NO_SIDECAR: no live sidecar registered"
    )
    Spool(d).remove_sidecar_marker()
    assert requester.requestForTest(str(d), 11, 60000, 300).startswith("NO_SIDECAR")
    assert Spool(d).pending_requests() == []


def test_an_application_attempt_has_spool_dirs_and_an_identity_of_its_own(
    spark: SparkSession, executor_spool: Spool, spool_root: Path
) -> None:
    """spark.app.attempt.id (set by SparkContext under YARN cluster mode) goes into the identity the JVM
    names spool dirs by and hands the sidecar; the JVM and Python agree on it."""
    conf = spark._jvm.dev.statebackend.spark.Conf  # type: ignore[union-attr]
    app_id = spark.sparkContext.applicationId
    assert conf.current().appIdentityOrNull() == app_id  # no attempts in local mode: the app id itself
    assert "spark.app.attempt.id" not in dict(conf.current().sidecarConf())
    for odd in ("2", " 3 ", "../4", ""):
        assert conf.appIdentity(app_id, odd) == spool.app_identity(app_id, odd)
    live_conf = spark._jsc.sc().conf()  # the SparkConf SparkEnv reads
    live_conf.set("spark.app.attempt.id", "2")
    try:
        identity = spool.app_identity(app_id, "2")
        assert identity == f"{app_id}.attempt-2" == conf.current().appIdentityOrNull()
        attempt_dir = str(spool.executor_spool_dir(spool_root, identity, "driver"))
        assert conf.currentExecutorSpoolDir() == attempt_dir != str(executor_spool.dir)
        assert conf.currentDriverSpoolDir() == attempt_dir
        sidecar_conf = dict(conf.current().sidecarConf())
        assert sidecar_conf["spark.app.id"] == app_id and sidecar_conf["spark.app.attempt.id"] == "2"
        assert spool.conf_app_identity(sidecar_conf) == identity
    finally:
        live_conf.remove("spark.app.attempt.id")
    assert conf.currentExecutorSpoolDir() == str(executor_spool.dir)


def test_disabled_shim_is_exactly_sparks_provider(
    spark: SparkSession, executor_spool: Spool, tmp_path: Path
) -> None:
    """spark.statebackend.enabled=false: the hooks pass everything through; same results."""
    live_conf = spark._jsc.sc().conf()  # type: ignore[union-attr]  # the SparkConf SparkEnv reads
    live_conf.set("spark.statebackend.enabled", "false")
    try:
        checkpoint = tmp_path / "ckpt"
        _, counts = run_batches(spark, checkpoint, 2)
    finally:
        live_conf.set("spark.statebackend.enabled", "true")
    assert counts == expected_counts(2)
    assert events_for(executor_spool, checkpoint) == []
    assert not (checkpoint / "_statebackend").exists()


# --- process-mode sidecar on local-cluster ---------------------------------------------------------


def test_local_cluster_starts_and_stops_the_sidecars(shim_jar: Path, tmp_path: Path) -> None:
    """Run as attempt 2 of its application (spark.app.attempt.id, as under YARN cluster mode): the driver
    and every executor place their spool dirs under the attempt's identity, and tell their sidecars."""
    spool_root = tmp_path / "spool"
    checkpoint = tmp_path / "ckpt"
    fake = STUBS / "fake_sidecar.py"
    assert os.access(fake, os.X_OK)
    proc = subprocess.run(
        [sys.executable, str(STUBS / "local_cluster_job.py"), str(shim_jar), str(spool_root), str(checkpoint),
         str(fake), "2"],
        capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {int(k): v for k, v in result["counts"].items()} == expected_counts(1)
    app_id = spool.app_identity(result["app_id"], "2")
    assert app_id == f"{result['app_id']}.attempt-2"
    # Nothing under the bare app id: a zombie of another attempt on this host never shares a spool dir.
    assert sorted(p.name for p in spool_root.iterdir()) == [spool.sanitize_id(app_id)]

    # One sidecar per executor JVM, plus the driver's own (the committer and driver-side restores).
    spool_dirs = sorted(p.name for p in (spool_root / spool.sanitize_id(app_id)).iterdir())
    assert spool_dirs == ["0", "1", "driver"]
    executors = ["0", "1"]
    for executor_id in spool_dirs:
        d = spool.executor_spool_dir(spool_root, app_id, executor_id)
        started = json.loads((d / "fake_sidecar_started.json").read_text())
        assert started["argv"] == [
            str(fake), "-m", "spark_statebackend.runtime.sidecar", "--spool-dir", str(d),
            "--executor-id", executor_id, "--conf", str(d / "sidecar-conf.json"),
            "--jvm-pid", str(started["ppid"]),
        ]  # fmt: skip
        parent = "SparkSubmit" if executor_id == "driver" else "CoarseGrainedExecutorBackend"
        assert parent in started["parent_cmdline"], f"the {parent} JVM is the parent"
        conf = started["conf"]
        assert started["conf_mode"] == "0o600"
        assert conf["spark.app.id"] == result["app_id"] and conf["spark.app.attempt.id"] == "2"
        assert spool.conf_app_identity(conf) == app_id
        assert conf["spark.statebackend.sidecar.mode"] == "process"
        assert conf["spark.statebackend.spoolDir"] == str(spool_root)
        assert (d / "sidecar.log").exists()
        # Spark's stop shut the plugins down, which stopped the sidecars with SIGTERM.
        wait_for(
            lambda d=d: (d / "fake_sidecar_stopped.json").exists(),
            60,
            f"sidecar of executor {executor_id} to stop",
        )
        assert json.loads((d / "fake_sidecar_stopped.json").read_text())["signal"] == 15
        wait_for(lambda pid=started["pid"]: not _alive(pid), 30, f"sidecar pid {started['pid']} to exit")
        # Then the plugin (or the executor's shutdown hook) removed the conf, which holds secrets.
        wait_for(lambda d=d: not (d / "sidecar-conf.json").exists(), 30, f"{d} to be cleaned")

    # The executors staged their store versions into their own spool dirs (what each fake sidecar saw
    # there when it was stopped; the plugin then removed the protocol files, keeping the logs).
    events = [
        SnapshotEvent.from_json(orjson.dumps(doc))
        for x in executors
        for doc in json.loads(
            (spool.executor_spool_dir(spool_root, app_id, x) / "fake_sidecar_stopped.json").read_text()
        )["events"]
    ]
    assert sorted(e.partition for e in events) == [0, 1]
    assert {e.executor_id for e in events} <= {"0", "1"}
    assert all(e.version == 1 and e.staged_dir.is_dir() for e in events)
    for x in spool_dirs:
        left = {p.name for p in spool.executor_spool_dir(spool_root, app_id, x).iterdir()}
        assert not left & {"events", "requests", "responses", "progress", "sidecar-conf.json"}, left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
