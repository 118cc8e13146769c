"""Unit tests of the spool protocol's Python half (spark_statebackend.runtime.spool)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_statebackend.checkpoints.store_instance import StoreInstance
from spark_statebackend.runtime import spool
from spark_statebackend.runtime.spool import (
    RestoreRequest,
    RestoreResponse,
    SidecarMarker,
    SnapshotEvent,
    Spool,
    SpoolFormatError,
)


def make_event(tmp_path: Path, version: int = 3, **overrides: object) -> SnapshotEvent:
    fields: dict[str, object] = {
        "query_id": "6f1c2f0e-0000-4000-8000-000000000001",
        "batch_id": version - 1,
        "checkpoint_root": tmp_path / "ckpt",
        "dfs_dir": tmp_path / "ckpt" / "state" / "0" / "1",
        "operator": 0,
        "partition": 1,
        "store": "default",
        "version": version,
        "spark_unique_id": None,
        "staged_dir": tmp_path / "staging" / "app" / "0" / "1" / "default" / f"{version}-abcd1234",
        "files": (f"{version}.zip", "SSTs/000008-aaaa.sst"),
        "executor_id": "driver",
        "created_at_ms": 1_700_000_000_000,
        "stage_nanos": 12345,
    }
    fields.update(overrides)
    return SnapshotEvent(**fields)  # type: ignore[arg-type]


def make_request(tmp_path: Path, **overrides: object) -> RestoreRequest:
    fields: dict[str, object] = {
        "request_id": "0b7e4a52-9f0a-4c43-a0a5-5a8f9b6f1e11",
        "query_id": None,
        "checkpoint_root": tmp_path / "ckpt",
        "dfs_dir": tmp_path / "ckpt" / "state" / "0" / "0",
        "operator": 0,
        "partition": 0,
        "store": "default",
        "version": 4,
        "spark_unique_id": "5b1e-id",
        "executor_id": "3",
        "created_at_ms": 1_700_000_000_001,
        "missing": "4_5b1e-id.zip is absent",
    }
    fields.update(overrides)
    return RestoreRequest(**fields)  # type: ignore[arg-type]


# --- paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("local-1700000000000", "local-1700000000000"),
        ("app-20240101120000-0001", "app-20240101120000-0001"),
        ("application_1_0001", "application_1_0001"),
        ("driver", "driver"),
        ("a/b", "a_b"),
        ("..", "_"),
        (".", "_"),
        ("", "_"),
        ("spark:ex 1", "spark_ex_1"),
    ],
)
def test_sanitize_id_matches_the_jvm_rule(raw: str, safe: str) -> None:
    assert spool.sanitize_id(raw) == safe


@given(st.text())
def test_sanitize_id_never_escapes(raw: str) -> None:
    s = spool.sanitize_id(raw)
    assert s not in ("", ".", "..")
    assert "/" not in s and "\x00" not in s
    assert Path("/root", s).parent == Path("/root")


def test_executor_spool_dir_layout(tmp_path: Path) -> None:
    assert spool.executor_spool_dir(tmp_path, "local-1", "driver") == tmp_path / "local-1" / "driver"
    assert spool.executor_spool_dir(tmp_path, "app/../x", "0") == tmp_path / "app_.._x" / "0"
    assert spool.default_spool_root(user="ann") == Path("/tmp/spark-statebackend-ann/spool")
    assert spool.default_spool_root("/x", user="a/b") == Path("/x/spark-statebackend-a_b/spool")
    s = Spool.for_executor(tmp_path, "app-1", "7")
    assert s.events_dir == tmp_path / "app-1" / "7" / "events"
    assert s.response_path("abc-1") == tmp_path / "app-1" / "7" / "responses" / "abc-1.json"


def test_file_stems_sort_by_creation() -> None:
    stems = [spool.new_file_stem() for _ in range(2000)]
    assert stems == sorted(stems)
    assert len(set(stems)) == len(stems)
    assert all(len(s.split("-", 1)[0]) == 20 for s in stems)


# --- round trips -----------------------------------------------------------------------------------


def test_event_round_trip(tmp_path: Path) -> None:
    s = Spool(tmp_path / "spool")
    event = make_event(tmp_path, spark_unique_id="c0ffee", batch_id=None, query_id=None)
    path = s.write_event(event)
    assert s.pending_events() == [path]
    assert spool.read_event(path) == event
    assert event.zip_name == "3_c0ffee.zip"
    assert make_event(tmp_path).zip_name == "3.zip"
    assert event.instance == StoreInstance(0, 1, "default")


def test_request_and_response_round_trip(tmp_path: Path) -> None:
    s = Spool(tmp_path / "spool")
    req = make_request(tmp_path)
    path = s.write_request(req)
    assert s.pending_requests() == [path]
    assert spool.read_request(path) == req

    resp = RestoreResponse(req.request_id, "restored", "ok", files=3, bytes=4096, duration_ms=12)
    rpath = s.write_response(resp)
    assert rpath.name == f"{req.request_id}.json"
    assert s.take_response(req.request_id) == resp
    assert not rpath.exists(), "taking a response consumes it"
    assert s.take_response(req.request_id) is None


def test_response_optional_fields_default(tmp_path: Path) -> None:
    data = orjson.dumps({"request_id": "r-1", "status": "not_found", "extra": [1]})
    assert RestoreResponse.from_json(data) == RestoreResponse("r-1", "not_found")


def test_sidecar_marker_round_trip(tmp_path: Path) -> None:
    s = Spool(tmp_path / "spool")
    assert s.read_sidecar_marker() is None
    s.write_sidecar_marker("5")
    marker = s.read_sidecar_marker()
    assert marker is not None and marker.pid == os.getpid() and marker.executor_id == "5"
    assert s.remove_sidecar_marker()
    assert s.read_sidecar_marker() is None


def test_unknown_fields_are_ignored(tmp_path: Path) -> None:
    event = make_event(tmp_path)
    doc = event.to_json() | {"future_field": {"x": 1}, "another": None}
    assert SnapshotEvent.from_json(orjson.dumps(doc)) == event


def test_jvm_written_event_parses(tmp_path: Path) -> None:
    """A document byte-for-byte as SnapshotStager.java writes it (LinkedHashMap order, Jackson)."""
    raw = (
        b'{"schema_version":1,"type":"snapshot","query_id":"q","batch_id":0,'
        b'"checkpoint_root":"/c","dfs_dir":"/c/state/0/0","operator":0,"partition":0,'
        b'"store":"default","version":1,"spark_unique_id":null,"staged_dir":"/c/_statebackend/staging/a/0/0/default/1-1a2b3c4d",'
        b'"files":["1.zip","SSTs/000008-d1db.sst"],"executor_id":"driver","created_at_ms":1,"stage_nanos":2}'
    )
    e = SnapshotEvent.from_json(raw)
    assert e.version == 1 and e.files == ("1.zip", "SSTs/000008-d1db.sst") and e.batch_id == 0


# --- malformed files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("dfs_dir"), "missing field 'dfs_dir'"),
        (lambda d: d.update(version=0), "'version' must be an integer >= 1"),
        (lambda d: d.update(version=True), "'version' must be an integer"),
        (lambda d: d.update(operator="0"), "'operator' must be an integer"),
        (lambda d: d.update(schema_version=3), "schema_version 3 is not one of [1, 2]"),
        (lambda d: d.pop("schema_version"), "missing field 'schema_version'"),
        (lambda d: d.update(type="commit"), "type 'commit' is not 'snapshot'"),
        (lambda d: d.update(staged_dir="relative/dir"), "'staged_dir' must be an absolute path"),
        (lambda d: d.update(files=["../../etc/passwd"]), "unsafe or non-string path"),
        (lambda d: d.update(files=["/abs.sst"]), "unsafe or non-string path"),
        (lambda d: d.update(files=["SSTs//x.sst"]), "unsafe or non-string path"),
        (lambda d: d.update(files="1.zip"), "must be a list"),
        (lambda d: d.update(query_id=5), "'query_id' must be a string or null"),
        (lambda d: d.update(store=""), "'store' must be a non-empty string"),
    ],
)
def test_malformed_event_names_the_file(tmp_path: Path, mutate, problem: str) -> None:  # type: ignore[no-untyped-def]
    doc = make_event(tmp_path).to_json()
    mutate(doc)
    path = spool.atomic_write_json(tmp_path / "events" / f"{spool.new_file_stem()}.json", doc)
    with pytest.raises(SpoolFormatError) as info:
        spool.read_event(path)
    assert str(path) in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not JSON"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object but list"),
        (b'"text"', "not a JSON object but str"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_unparseable_files_name_the_file(tmp_path: Path, data: bytes, problem: str) -> None:
    path = spool.atomic_write_bytes(tmp_path / "x.json", data)
    for reader in (spool.read_event, spool.read_request, spool.read_response):
        with pytest.raises(SpoolFormatError) as info:
            reader(path)
        assert str(path) in str(info.value) and problem in str(info.value)


def test_malformed_requests_and_responses(tmp_path: Path) -> None:
    bad_id = make_request(tmp_path).to_json() | {"request_id": "../../x"}
    with pytest.raises(SpoolFormatError, match="not a safe file name token"):
        RestoreRequest.from_json(orjson.dumps(bad_id), "req.json")
    with pytest.raises(SpoolFormatError, match="status 'done' is not one of"):
        RestoreResponse.from_json(b'{"request_id":"r","status":"done"}', "resp.json")
    with pytest.raises(SpoolFormatError, match="'files' must be an integer >= 0"):
        RestoreResponse.from_json(b'{"request_id":"r","status":"error","files":-1}', "resp.json")
    with pytest.raises(ValueError, match="status must be one of"):
        RestoreResponse("r", "done")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="safe file name"):
        Spool(tmp_path).response_path("a/b")
    with pytest.raises(SpoolFormatError, match="'pid' must be an integer >= 1"):
        SidecarMarker.from_json(b'{"schema_version":1,"pid":0,"executor_id":"1","started_at_ms":1}')


def test_quarantine_moves_a_bad_file_out_of_the_listing(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    good = s.write_event(make_event(tmp_path, version=1))
    bad = spool.atomic_write_bytes(s.events_dir / f"{spool.new_file_stem()}.json", b"garbage")
    with pytest.raises(SpoolFormatError):
        list(s.iter_events())
    moved = spool.quarantine(bad)
    assert moved == s.events_dir / "bad" / bad.name and moved.read_bytes() == b"garbage"
    assert [p for p, _ in s.iter_events()] == [good]
    assert spool.quarantine(bad) is None


# --- listing, ordering, claiming -------------------------------------------------------------------


def test_pending_lists_oldest_first_and_only_finished_files(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    paths = [s.write_event(make_event(tmp_path, version=v), fsync=False) for v in range(1, 30)]
    # Things a reader must never pick up: temporaries, foreign files, a directory with a matching name.
    (s.events_dir / f".{spool.new_file_stem()}.json.1234.tmp").write_bytes(b'{"half')
    (s.events_dir / "notes.txt").write_text("x")
    (s.events_dir / f"{spool.new_file_stem()}.json.tmp").write_text("x")
    (s.events_dir / f"{spool.new_file_stem()}.json").mkdir()
    assert s.pending_events() == paths
    assert [e.version for _, e in s.iter_events()] == list(range(1, 30))
    assert spool.list_pending(tmp_path / "does-not-exist") == []


def test_claim_and_remove(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    first = s.write_event(make_event(tmp_path, version=1))
    second = s.write_event(make_event(tmp_path, version=2))
    claimed = spool.claim(first)
    assert claimed is not None and claimed.exists() and not first.exists()
    assert s.pending_events() == [second]
    assert spool.claimed(s.events_dir) == [claimed]
    assert spool.claim(first) is None, "a second claim finds nothing"
    assert spool.read_event(claimed).version == 1
    assert spool.remove(claimed) and not spool.remove(claimed)
    assert spool.claimed(s.events_dir) == []


def test_concurrent_claims_are_exclusive(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    paths = [s.write_event(make_event(tmp_path, version=v), fsync=False) for v in range(1, 201)]
    won: list[list[Path]] = [[], []]

    def worker(i: int) -> None:
        for p in paths:
            c = spool.claim(p)
            if c is not None:
                won[i].append(c)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(won[0] + won[1]) == sorted(s.events_dir / "claimed" / p.name for p in paths)


# --- atomicity -------------------------------------------------------------------------------------


def test_no_partially_written_file_is_ever_listed(tmp_path: Path) -> None:
    """A writer publishes large events while a reader lists and parses everything it sees."""
    s = Spool(tmp_path)
    big = tuple(f"SSTs/{i:06d}-{'x' * 40}.sst" for i in range(3000))  # ~150 KB per file
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: set[Path] = set()

    def reader() -> None:
        try:
            while not stop.is_set():
                for p in s.pending_events():
                    assert spool.read_event(p).files == big
                    seen.add(p)
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        written = [
            s.write_event(make_event(tmp_path, version=v, files=big), fsync=False) for v in range(1, 41)
        ]
    finally:
        stop.set()
        t.join(timeout=60)
    assert not errors, errors[0]
    assert not t.is_alive()
    assert s.pending_events() == written
    assert not [n for n in os.listdir(s.events_dir) if n.endswith(".tmp")], "no temporaries left behind"


def test_atomic_write_replaces_whole_files(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    spool.atomic_write_json(target, {"a": 1})
    spool.atomic_write_json(target, {"a": 2, "b": "x" * 10000})
    assert orjson.loads(target.read_bytes()) == {"a": 2, "b": "x" * 10000}
    assert os.listdir(target.parent) == ["f.json"]


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.json"

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(spool.files.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        spool.atomic_write_json(target, {"a": 1})
    assert os.listdir(tmp_path) == [], "neither the target nor the temporary is left"
