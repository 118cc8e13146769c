"""CheckpointId, CheckpointV2 and their serde: ordering, uniqueness, strict parsing, immutability,
forward compatibility (unknown fields ignored) and errors that name where a record came from."""

from __future__ import annotations

import dataclasses
import pickle
import re
import threading

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_statebackend.checkpoints.checkpoint import (
    CheckpointId,
    CheckpointV2,
    CorruptCheckpointError,
    FrozenMap,
    StateMarker,
    StoreInstance,
    check_query_id,
)

MAX = (1 << 63) - 1

ids = st.builds(
    CheckpointId,
    millis=st.integers(0, MAX),
    nanos=st.integers(0, 999_999),
    batch_id=st.integers(0, MAX),
)
query_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
json_texts = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
).map(lambda v: orjson.dumps(v).decode())
backends = st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)
nonempty = st.text(min_size=1, max_size=30)
checkpoints = st.builds(
    CheckpointV2,
    checkpoint_id=ids,
    query_id=query_ids,
    query_name=st.text(max_size=20),
    input_offsets=st.dictionaries(nonempty, json_texts, max_size=4),
    state_checkpoint_markers=st.dictionaries(
        backends, st.dictionaries(nonempty, nonempty, max_size=4), max_size=3
    ),
)


def sample(batch: int = 3, **kw: object) -> CheckpointV2:
    args: dict[str, object] = {
        "checkpoint_id": CheckpointId(1_700_000_000_123, 456_789, batch),
        "query_id": "4f3c-query",
        "query_name": "wordcount",
        "input_offsets": {"KafkaV2[Subscribe[in]]": '{"in":{"0":42}}'},
        "state_checkpoint_markers": {
            "blobstore": {"0/0/default": "indexes/q/0-0-default/1.json"},
            "spark": {"0/0/default": "4"},
        },
    }
    args.update(kw)
    return CheckpointV2(**args)  # type: ignore[arg-type]


# -- CheckpointId -------------------------------------------------------------------------------


@given(ids)
def test_checkpoint_id_string_round_trip(cid: CheckpointId) -> None:
    assert CheckpointId.parse(str(cid)) == cid


@given(ids, ids)
def test_checkpoint_id_order_is_time_then_batch(a: CheckpointId, b: CheckpointId) -> None:
    assert (a < b) == ((a.millis, a.nanos, a.batch_id) < (b.millis, b.nanos, b.batch_id))


def test_checkpoint_id_string_form_is_stable() -> None:
    assert str(CheckpointId(1_700_000_000_123, 45, 7)) == "1700000000123-000045-7"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1700000000123-000045",  # no batch id
        "1700000000123-45-7",  # nanos not 6 digits
        "1700000000123-0000045-7",
        "01700000000123-000045-7",  # leading zero
        "1700000000123-000045-07",
        "-1-000045-7",
        "+1-000045-7",
        " 1-000045-7",
        "1-000045-7 ",
        "1-000045-7\n",
        "1_000-000045-7",
        "1-000045-7-8",
        "9223372036854775808-000000-0",  # > int64
        "1-000045-9223372036854775808",
        "١-000045-7",  # non-ASCII digit
        "null",
    ],
)
def test_checkpoint_id_parse_is_strict(text: str) -> None:
    with pytest.raises(ValueError, match="checkpoint id"):
        CheckpointId.parse(text)


@given(st.text(max_size=40))
def test_checkpoint_id_parse_accepts_only_canonical_text(text: str) -> None:
    try:
        cid = CheckpointId.parse(text)
    except ValueError:
        return
    assert str(cid) == text


def test_checkpoint_id_rejects_out_of_range_fields() -> None:
    for args in ((-1, 0, 0), (0, 1_000_000, 0), (0, 0, -1), (0, 0, True), (0.5, 0, 0)):
        with pytest.raises(ValueError):
            CheckpointId(*args)  # type: ignore[arg-type]


def test_there_is_no_placeholder_id() -> None:
    with pytest.raises(TypeError):
        CheckpointId()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        CheckpointV2(checkpoint_id=None, query_id="q")  # type: ignore[arg-type]


def test_create_is_strictly_increasing_even_when_the_clock_stalls_or_steps_back() -> None:
    times = iter([5_000_000_000_000, 5_000_000_000_000, 4_000_000_000_000, 5_000_000_000_001])
    made = [CheckpointId.create(i, clock_ns=lambda: next(times)) for i in range(4)]
    assert made == sorted(made)
    assert len({(c.millis, c.nanos) for c in made}) == 4
    assert [c.batch_id for c in made] == [0, 1, 2, 3]


def test_create_after_a_previous_id_from_a_faster_clock() -> None:
    future = CheckpointId(9_000_000_000_000, 999_999, 41)
    nxt = CheckpointId.create(42, after=future)
    assert nxt > future
    assert (nxt.millis, nxt.nanos) == (9_000_000_000_001, 0)


def test_create_is_unique_across_threads() -> None:
    results: list[list[CheckpointId]] = [[] for _ in range(4)]

    def make(slot: list[CheckpointId]) -> None:
        for i in range(500):
            slot.append(CheckpointId.create(i))

    threads = [threading.Thread(target=make, args=(r,), name=f"ckpt-id-{i}") for i, r in enumerate(results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    every = [c for r in results for c in r]
    assert len({(c.millis, c.nanos) for c in every}) == 2000
    for r in results:
        assert r == sorted(r)


# -- store instance keys and flat markers ------------------------------------------------------


def test_store_instance_key_round_trip_and_separator_in_store_name() -> None:
    s = StoreInstance(1, 0, "left-keyToNumValues")
    assert s.key == "1/0/left-keyToNumValues"
    assert StoreInstance.parse(s.key) == s
    odd = StoreInstance.parse("2/7/a/b/c")
    assert odd == StoreInstance(2, 7, "a/b/c")
    assert StoreInstance.parse(odd.key) == odd


@pytest.mark.parametrize("key", ["", "0/0", "0/0/", "a/0/x", "0/-1/x", "00/0/x", "0 /0/x"])
def test_store_instance_parse_is_strict(key: str) -> None:
    with pytest.raises(ValueError):
        StoreInstance.parse(key)


def test_state_marker_payload_may_contain_the_separator() -> None:
    m = StateMarker.parse("blobstore:indexes/q:1/x:y.json")
    assert m == StateMarker("blobstore", "indexes/q:1/x:y.json")
    assert StateMarker.parse(str(m)) == m
    for bad in ("", "blobstore", "blobstore:", ":x", "Blob:x"):
        with pytest.raises(ValueError):
            StateMarker.parse(bad)


def test_query_id_rules() -> None:
    assert check_query_id("2f7b0c3e-1d4a-4c51-9d0e-6b1f2a3c4d5e")
    for bad in ("", ".hidden", "-x", "a/b", "a b", "x" * 201, "ü"):
        with pytest.raises(ValueError):
            check_query_id(bad)


# -- CheckpointV2 -----------------------------------------------------------------------------


@given(checkpoints)
def test_json_round_trip_is_exact(cp: CheckpointV2) -> None:
    data = cp.to_json()
    back = CheckpointV2.from_json(data, source="test")
    assert back == cp
    assert hash(back) == hash(cp)
    assert back.to_json() == data


def test_json_layout() -> None:
    doc = orjson.loads(sample().to_json())
    assert doc == {
        "version": 2,
        "checkpoint_id": "1700000000123-456789-3",
        "query_id": "4f3c-query",
        "query_name": "wordcount",
        "batch_id": 3,
        "input_offsets": {"KafkaV2[Subscribe[in]]": '{"in":{"0":42}}'},
        "state_checkpoint_markers": {
            "blobstore": {"0/0/default": "indexes/q/0-0-default/1.json"},
            "spark": {"0/0/default": "4"},
        },
        "schema_version": 2,
        "state_format": {"changelog_checkpointing": False, "repartitioned_at_batch": 0},
        "writer_app_id": "",
    }


def test_schema_1_records_still_read_and_state_format_round_trips() -> None:
    old = orjson.loads(sample().to_json())
    del old["schema_version"], old["state_format"], old["writer_app_id"]
    back = CheckpointV2.from_json(orjson.dumps(old), source="schema-1")
    assert back == sample() and not back.changelog_checkpointing and back.repartitioned_at_batch == 0
    cp = CheckpointV2(
        checkpoint_id=sample().checkpoint_id,
        query_id="4f3c-query",
        changelog_checkpointing=True,
        repartitioned_at_batch=7,
    )
    again = CheckpointV2.from_json(cp.to_json(), source="x")
    assert again.changelog_checkpointing and again.repartitioned_at_batch == 7
    bad = orjson.loads(cp.to_json())
    bad["state_format"]["repartitioned_at_batch"] = "7"
    with pytest.raises(CorruptCheckpointError, match=r"bad-record.*repartitioned_at_batch"):
        CheckpointV2.from_json(orjson.dumps(bad), source="bad-record")


def test_maps_are_immutable_copies_and_never_none() -> None:
    offsets = {"src": "1"}
    markers = {"blobstore": {"0/0/s": "m"}}
    cp = sample(input_offsets=offsets, state_checkpoint_markers=markers)
    offsets["src"] = "2"
    markers["blobstore"]["0/0/s"] = "changed"
    markers["other"] = {}
    assert cp.input_offsets == {"src": "1"}
    assert cp.state_checkpoint_markers == {"blobstore": {"0/0/s": "m"}}
    assert isinstance(cp.state_checkpoint_markers["blobstore"], FrozenMap)
    with pytest.raises(TypeError):
        cp.input_offsets["src"] = "3"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.query_id = "other"  # type: ignore[misc]
    bare = CheckpointV2(CheckpointId(1, 0, 0), "q")
    assert bare.input_offsets == {} and bare.state_checkpoint_markers == {}
    assert bare.markers("blobstore") == {}
    assert bare.marker("blobstore", "0/0/x") is None
    assert cp.marker("blobstore", StoreInstance(0, 0, "s")) == "m"


def test_equal_values_hash_equal_and_work_as_keys() -> None:
    a, b = sample(), sample()
    assert a == b and hash(a) == hash(b)
    assert len({a, b, sample(batch=4)}) == 2


def test_checkpoints_survive_pickling() -> None:
    cp = sample()
    back = pickle.loads(pickle.dumps(cp))
    assert back == cp and hash(back) == hash(cp)
    assert isinstance(back.state_checkpoint_markers["blobstore"], FrozenMap)


def test_invalid_values_are_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        sample(input_offsets={"src": "{not json"})
    with pytest.raises(ValueError, match="backend"):
        sample(state_checkpoint_markers={"Blob Store": {"0/0/x": "m"}})
    with pytest.raises(ValueError, match="non-empty"):
        sample(state_checkpoint_markers={"blobstore": {"0/0/x": ""}})
    with pytest.raises(ValueError, match="query id"):
        sample(query_id="a/b")


def test_unknown_fields_are_ignored() -> None:
    doc = orjson.loads(sample().to_json())
    doc["written_by"] = "spark-statebackend 9.0"
    doc["future"] = {"nested": [1, 2, 3]}
    cp = CheckpointV2.from_json(orjson.dumps(doc), source="test")
    assert cp == sample()


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("version"), "'version' is missing"),
        (lambda d: d.update(version=3), "version 3 is not 2"),
        (lambda d: d.update(version="2"), "'version' is missing or not an integer"),
        (lambda d: d.pop("checkpoint_id"), "'checkpoint_id' is missing"),
        (lambda d: d.update(checkpoint_id="1-2-3"), "checkpoint id '1-2-3'"),
        (lambda d: d.update(batch_id=4), "differs from the batch id"),
        (lambda d: d.update(batch_id=True), "'batch_id' is not an integer"),
        (lambda d: d.update(query_id=None), "'query_id' is not a string"),
        (lambda d: d.update(query_id="a b"), "query id 'a b'"),
        (lambda d: d.update(input_offsets=[]), "'input_offsets' is not an object"),
        (lambda d: d.update(input_offsets={"s": 5}), "not a string of offset JSON"),
        (lambda d: d.update(state_checkpoint_markers={"blobstore": "x"}), "is not a mapping"),
        (lambda d: d.update(state_checkpoint_markers={"blobstore": {"0/0/x": 1}}), "non-empty string"),
    ],
)
def test_malformed_records_name_their_source(mutate: object, problem: str) -> None:
    doc = orjson.loads(sample().to_json())
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(CorruptCheckpointError) as info:
        CheckpointV2.from_json(orjson.dumps(doc), source="kafka topic ckpt partition 0 offset 17")
    assert "kafka topic ckpt partition 0 offset 17" in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'"text"'])
def test_non_objects_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError, match=re.escape("file /x/00000000000000000003.json")):
        CheckpointV2.from_json(data, source="file /x/00000000000000000003.json")


def test_describe_is_readable() -> None:
    text = sample().describe()
    assert "checkpoint 1700000000123-456789-3" in text
    assert "wordcount (4f3c-query)" in text
    assert "batch:       3" in text
    assert '    KafkaV2[Subscribe[in]]: {"in":{"0":42}}' in text
    assert "      0/0/default: indexes/q/0-0-default/1.json" in text
