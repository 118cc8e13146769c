"""The JVM's spool writer (jvm-bridge SpoolDocuments.java) against the Python readers (runtime/spool
documents.py, runtime/progress.py): every document type the shim writes, run from the built jar, is
read by the Python side with every field as written, and nothing more or less."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from spark_statebackend.runtime.progress import read_progress_event
from spark_statebackend.runtime.spool.changelog_stream import ChangelogStream
from spark_statebackend.runtime.spool.documents import (
    SCHEMA_VERSION,
    CheckpointLocationRequest,
    PlanRequest,
    RestoreRequest,
    SnapshotEvent,
    read_any_request,
)
from spark_statebackend.runtime.spool.fields import SpoolFormatError
from spark_statebackend.spark.enable import jar_path
from tests.jobrig import spark_jars

QUERY = "3f1c2a4e-9b7d-4c1e-8a2f-0d6b5e4c3a21"
RUN = "b2a1c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"
#: Awkward but legal text: a space, non-ASCII, a quote, a backslash and a newline must survive.
ODD = 'é "q" \\ x\ny'
PROGRESS_JSON = orjson.dumps(
    {
        "id": QUERY,
        "runId": RUN,
        "name": ODD,
        "timestamp": "2026-01-02T03:04:05.678Z",
        "batchId": 7,
        "batchDuration": 12,
        "sources": [{"description": "rate", "endOffset": {"0": 41}}],
        "stateOperators": [{"numStateStoreInstances": 4}],
    }
).decode()

# Arguments in, documents out: each record of SpoolDocuments with typed values, written with the
# bytes Spool.writeJsonAtomically writes (SpoolDocuments.json), one file per case into args[0].
PROBE = """
import dev.statebackend.spark.SpoolDocuments;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;

public class SpoolDocumentsProbe {
  static Path out;

  static void write(String name, Map<String, Object> doc) throws Exception {
    Files.write(out.resolve(name + ".json"), SpoolDocuments.json(doc));
  }

  public static void main(String[] args) throws Exception {
    out = Paths.get(args[0]);
    Path root = Paths.get(args[1]);
    String odd = args[2];
    String progressJson = args[3];
    Path dfs = root.resolve("state/2/5/left");
    Path staged = Paths.get("/staging/app/2/5/left/9-abcd1234");
    write("snapshot", new SpoolDocuments.SnapshotEvent("QUERY", 8L, root, dfs, 2L, 5, "left", 9L, null, 6L,
        List.of(7L, 8L, 9L), false, staged, List.of("6.zip", "SSTs/a.sst", "7.changelog"), "exec 1",
        1700000000123L, 4567L, null).toJson());
    write("snapshot_awaited", new SpoolDocuments.SnapshotEvent(null, null, root, dfs, 0L, 0, "default", 1L,
        "uid-1", 1L, List.of(), true, staged, List.of("1_uid-1.zip"), "driver", 1L, 0L, "req-1").toJson());
    write("store", new SpoolDocuments.RestoreRequest("req-2", "QUERY", root, dfs, 2L, 5, "left", 9L, "uid-9",
        odd, "exec 1", 1700000000124L).toJson());
    write("store_latest", new SpoolDocuments.RestoreRequest("req-3", null, root, dfs, 0L, 0, "default", null,
        null, "", "exec 1", 5L).toJson());
    write("checkpoint_location", new SpoolDocuments.CheckpointLocationRequest("req-4", root, "start",
        "driver", 6L, true).toJson());
    write("plan", new SpoolDocuments.PlanRequest("req-5", "QUERY", root, 7L,
        ("v1\\n{\\"batchWatermarkMs\\":0}\\n" + odd).getBytes("UTF-8"), "driver", 7L).toJson());
    write("plan_unknown_query", new SpoolDocuments.PlanRequest("req-6", null, root, 0L, new byte[] {0, -1},
        "driver", 8L).toJson());
    write("progress", new SpoolDocuments.Progress("QUERY", "RUN", odd, 7L, root.toString(), null,
        progressJson, 9L).toJson());
    write("progress_remote", new SpoolDocuments.Progress("QUERY", "RUN", odd, 7L, root.toString(),
        "objfs://bucket/ckpt ü", progressJson, 9L).toJson());
    write("offline_commit", new SpoolDocuments.OfflineCommit(null, 3L, root, 10L).toJson());
    write("sidecar_given_up", new SpoolDocuments.SidecarGivenUpStatus(11L, odd).toJson());
    write("changelog_stream", new SpoolDocuments.ChangelogStream("QUERY", root, 2L, 5, "left", 9L,
        Paths.get("/staging/app/2/5/left/9-0badcafe"), "9_uid-9.changelog", "exec 1", 12L).toJson());
  }
}
""".replace("QUERY", QUERY).replace("RUN", RUN)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the dir of the documents the built jar wrote, the checkpoint root they name)."""
    if shutil.which("java") is None or spark_jars() is None:
        pytest.skip("needs java and pyspark")
    tmp = tmp_path_factory.mktemp("spool-documents")
    out, root = tmp / "out", tmp / "ckpt ü"
    out.mkdir()
    (root / "offsets").mkdir(parents=True)
    # offline_commit's reader counts the new partitioning's stores from offsets/<batch> (none: no state/).
    conf = {"conf": {"spark.sql.shuffle.partitions": "3"}}
    (root / "offsets" / "3").write_bytes(b"v1\n" + orjson.dumps(conf) + b"\n{}")
    (tmp / "SpoolDocumentsProbe.java").write_text(PROBE)
    classpath = f"{jar_path()}{os.pathsep}{spark_jars()}/*"
    args = [str(out), str(root), ODD, PROGRESS_JSON]
    proc = subprocess.run(
        ["java", "-cp", classpath, str(tmp / "SpoolDocumentsProbe.java"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out, root


def _doc(out: Path, name: str) -> bytes:
    return (out / f"{name}.json").read_bytes()


def test_snapshot_events_read_back_field_for_field(written: tuple[Path, Path]) -> None:
    out, root = written
    plain = SnapshotEvent.from_json(_doc(out, "snapshot"), "snapshot")
    assert plain == SnapshotEvent(
        query_id=QUERY,
        batch_id=8,
        checkpoint_root=root,
        dfs_dir=root / "state/2/5/left",
        operator=2,
        partition=5,
        store="left",
        version=9,
        spark_unique_id=None,
        staged_dir=Path("/staging/app/2/5/left/9-abcd1234"),
        files=("6.zip", "SSTs/a.sst", "7.changelog"),
        executor_id="exec 1",
        created_at_ms=1700000000123,
        stage_nanos=4567,
        schema_version=SCHEMA_VERSION,
        snapshot_version=6,
        changelog_versions=(7, 8, 9),
        upgrade=False,
        request_id=None,
    )
    awaited = SnapshotEvent.from_json(_doc(out, "snapshot_awaited"), "snapshot_awaited")
    assert (awaited.query_id, awaited.batch_id, awaited.spark_unique_id) == (None, None, "uid-1")
    assert (awaited.upgrade, awaited.request_id, awaited.changelog_versions) == (True, "req-1", ())
    for name, event in (("snapshot", plain), ("snapshot_awaited", awaited)):
        # The same fields as Python writes them: none missing, none extra (request_id only when awaited).
        assert orjson.loads(_doc(out, name)) == event.to_json(), name
    assert "request_id" not in orjson.loads(_doc(out, "snapshot"))


def test_requests_read_back_field_for_field(written: tuple[Path, Path]) -> None:
    out, root = written
    store = read_any_request(_doc(out, "store"), "store")
    assert store == RestoreRequest(
        request_id="req-2",
        query_id=QUERY,
        checkpoint_root=root,
        dfs_dir=root / "state/2/5/left",
        operator=2,
        partition=5,
        store="left",
        version=9,
        spark_unique_id="uid-9",
        executor_id="exec 1",
        created_at_ms=1700000000124,
        missing=ODD,
    )
    latest = read_any_request(_doc(out, "store_latest"), "store_latest")
    assert isinstance(latest, RestoreRequest)
    assert (latest.query_id, latest.version, latest.spark_unique_id, latest.missing) == (None, None, None, "")
    location = read_any_request(_doc(out, "checkpoint_location"), "checkpoint_location")
    assert location == CheckpointLocationRequest(
        request_id="req-4",
        checkpoint_root=root,
        mode="start",
        executor_id="driver",
        created_at_ms=6,
        restore_stores=True,
    )
    plan = read_any_request(_doc(out, "plan"), "plan")
    assert plan == PlanRequest(
        request_id="req-5",
        query_id=QUERY,
        checkpoint_root=root,
        batch_id=7,
        offsets=b'v1\n{"batchWatermarkMs":0}\n' + ODD.encode(),
        executor_id="driver",
        created_at_ms=7,
    )
    unknown = read_any_request(_doc(out, "plan_unknown_query"), "plan_unknown_query")
    assert isinstance(unknown, PlanRequest)
    assert (unknown.query_id, unknown.batch_id, unknown.offsets) == (None, 0, b"\x00\xff")
    parsed: dict[str, RestoreRequest | CheckpointLocationRequest | PlanRequest] = {
        "store": store,
        "store_latest": latest,
        "checkpoint_location": location,
        "plan": plan,
        "plan_unknown_query": unknown,
    }
    for name, req in parsed.items():
        # The same fields as Python writes them: none missing, none extra.
        assert orjson.loads(_doc(out, name)) == req.to_json(), name


def test_progress_documents_reach_the_committer(written: tuple[Path, Path]) -> None:
    out, root = written
    progress = read_progress_event(out / "progress.json", lambda _: pytest.fail("a progress names its query"))
    assert progress is not None and not progress.offline
    assert (progress.query_id, progress.query_name, progress.checkpoint_root) == (QUERY, ODD, root)
    assert (progress.batch_id, progress.state_store_instances) == (7, 4)
    assert progress.input_offsets == {"rate": '{"0":41}'}
    doc = orjson.loads(_doc(out, "progress"))
    assert doc == {
        "schema_version": SCHEMA_VERSION,
        "type": "progress",
        "query_id": QUERY,
        "run_id": RUN,
        "name": ODD,
        "batch_id": 7,
        "checkpoint_root": str(root),
        "progress_json": PROGRESS_JSON,
        "created_at_ms": 9,
    }

    assert progress.remote_location == "" and progress.location == str(root)

    # A remote location's batch: the root is its local mirror, the location is named beside it.
    remote = read_progress_event(out / "progress_remote.json", lambda _: pytest.fail("named"))
    assert remote is not None and remote.checkpoint_root == root
    assert remote.remote_location == remote.location == "objfs://bucket/ckpt ü"
    assert orjson.loads(_doc(out, "progress_remote"))["checkpoint_location"] == "objfs://bucket/ckpt ü"

    resolved: list[Path] = []

    def resolve(checkpoint_root: Path) -> str:
        resolved.append(checkpoint_root)
        return QUERY

    offline = read_progress_event(out / "offline_commit.json", resolve)
    assert resolved == [root], "a null query_id is resolved from the document's checkpoint root"
    assert offline is not None and offline.offline
    assert (offline.query_id, offline.batch_id, offline.checkpoint_root) == (QUERY, 3, root)
    assert set(orjson.loads(_doc(out, "offline_commit"))) == {
        "schema_version",
        "type",
        "query_id",
        "batch_id",
        "checkpoint_root",
        "created_at_ms",
    }


def test_the_given_up_status_is_an_upload_lag_status(written: tuple[Path, Path]) -> None:
    """status.json as the plugin writes it for a sidecar it gave up on: upload_lag.py's schema (lagging
    since then) plus the reason the JVM's commit gate names."""
    out, _ = written
    assert orjson.loads(_doc(out, "sidecar_given_up")) == {
        "schema_version": 1,
        "oldest_upload_staged_at_ms": 11,
        "updated_at_ms": 11,
        "sidecar": ODD,
    }


def test_changelog_stream_documents_read_back_field_for_field(written: tuple[Path, Path]) -> None:
    out, root = written
    doc = ChangelogStream.from_json(_doc(out, "changelog_stream"), "changelog_stream")
    assert doc == ChangelogStream(
        query_id=QUERY,
        checkpoint_root=root,
        operator=2,
        partition=5,
        store="left",
        version=9,
        staged_dir=Path("/staging/app/2/5/left/9-0badcafe"),
        file="9_uid-9.changelog",
        executor_id="exec 1",
        created_at_ms=12,
    )
    assert orjson.loads(_doc(out, "changelog_stream")) == doc.to_json()


@pytest.mark.parametrize("name", ["8.changelog", "9.zip", "../9.changelog", "9.changelog/x", "19.changelog"])
def test_a_changelog_stream_naming_another_file_is_refused(name: str) -> None:
    doc = ChangelogStream(QUERY, Path("/c"), 0, 0, "default", 9, Path("/s/app/0/0/default/9-x"), name, "e", 1)
    with pytest.raises(SpoolFormatError, match="is not the changelog of version 9"):
        ChangelogStream.from_json(orjson.dumps(doc.to_json()), "doc")
