"""`spark-statebackend checkpoints`: latest and history, for file and Kafka logs, the empty-log message
(exit 0), JSON output, and one-line errors."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from spark_statebackend.checkpoints.checkpoint import CheckpointId, CheckpointV2
from spark_statebackend.checkpoints.logs import CheckpointLog, open_checkpoint_log
from spark_statebackend.cli import main
from tests.paths import ROOT
from tests.servers.tansu import KafkaBroker

KAFKA_OPTIONS = {"replication.factor": "1", "write.timeout.ms": "10000", "read.timeout.ms": "10000"}


def cp(query_id: str, batch: int) -> CheckpointV2:
    return CheckpointV2(
        CheckpointId(1_800_000_000_000 + batch, 123, batch),
        query_id,
        "wordcount",
        {"KafkaV2[Subscribe[words]]": orjson.dumps({"words": {"0": batch * 100}}).decode()},
        {
            "blobstore": {
                "0/0/default": f"indexes/{query_id}/{batch}.json",
                "0/1/default": f"indexes/b/{batch}.json",
            }
        },
    )


@pytest.fixture(params=["file", "kafka"])
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A URL of an empty, created log, and the options a writer needs for it."""
    if request.param == "file":
        url, opts = (tmp_path / "log").as_uri(), {}
    else:
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        topic = f"cli-{uuid.uuid4().hex[:10]}"
        url, opts = (
            f"kafka://{broker.bootstrap}/{topic}",
            {**KAFKA_OPTIONS, "transactional.id.prefix": f"{topic}-"},
        )
    log = open_checkpoint_log(url, opts)
    log.create_resources()
    log.close()
    return url, opts


def write(url: str, opts: dict[str, str], *cps: CheckpointV2) -> None:
    log: CheckpointLog = open_checkpoint_log(url, opts)
    with log:
        log.create_resources()
        for c in cps:
            log.write(c)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_latest_checkpoint_is_printed_readably(log_url: tuple[str, dict[str, str]]) -> None:
    url, opts = log_url
    write(url, opts, cp("q1", 0), cp("q1", 1), cp("q2", 0))
    code, out, err = run("checkpoints", "--log", url, "--query", "q1")
    assert code == 0, err
    assert out.startswith("checkpoint 1800000000001-000123-1\n")
    assert "  query:       wordcount (q1)" in out
    assert "  batch:       1" in out
    assert '    KafkaV2[Subscribe[words]]: {"words":{"0":100}}' in out
    assert "      0/0/default: indexes/q1/1.json" in out
    assert "1800000000000-000123-0" not in out  # only the latest


def test_history_prints_every_checkpoint_oldest_first(log_url: tuple[str, dict[str, str]]) -> None:
    url, opts = log_url
    write(url, opts, *(cp("q1", b) for b in range(3)))
    code, out, _ = run("checkpoints", "--log", url, "--query", "q1", "--history")
    assert code == 0
    heads = [line for line in out.splitlines() if line.startswith("checkpoint ")]
    assert heads == [f"checkpoint 18000000000{b:02d}-000123-{b}" for b in range(3)]


def test_json_lines(log_url: tuple[str, dict[str, str]]) -> None:
    url, opts = log_url
    written = [cp("q1", b) for b in range(2)]
    write(url, opts, *written)
    code, out, _ = run("checkpoints", "--log", url, "--query", "q1", "--history", "--json")
    assert code == 0
    assert [CheckpointV2.from_json(line, source="stdout") for line in out.splitlines()] == written
    assert orjson.loads(out.splitlines()[0])["version"] == 2


def test_empty_log_says_so_and_exits_0(log_url: tuple[str, dict[str, str]]) -> None:
    url, _ = log_url
    for extra in ((), ("--history",)):
        code, out, _ = run("checkpoints", "--log", url, "--query", "nobody", *extra)
        assert code == 0
        assert out.strip() == f"no checkpoints for query nobody in {url}"


def test_missing_log_is_not_created(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    # A missing directory is most likely a typo: say so (exit 1) rather than "no checkpoints".
    missing_dir = tmp_path / "never"
    code, _, err = run("checkpoints", "--log", missing_dir.as_uri(), "--query", "q1")
    assert code == 1 and err.startswith(f"error: --log: no checkpoint log at {missing_dir.as_uri()}")
    assert not missing_dir.exists()
    # A Kafka topic nobody created yet is an empty log (the first writer creates it).
    topic = f"cli-missing-{uuid.uuid4().hex[:8]}"
    url = f"kafka://{kafka_broker.bootstrap}/{topic}"
    code, out, _ = run("checkpoints", "--log", url, "--query", "q1", "--log-option", "read.timeout=5s")
    assert (code, out.strip()) == (0, f"no checkpoints for query q1 in {url}")
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    assert topic not in admin.list_topics(timeout=10).topics


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log", "ftp://x/y", "--query", "q1"], "error: --log: unknown checkpoint log URL scheme 'ftp'"),
        (["--log", "file:///tmp", "--query", "a/b"], "error: --query: query id 'a/b'"),
        (["--log", "kafka://h:1/t", "--query", "q1", "--option", "nope=1"], "error: --log option 'nope'"),
        (["--log", "kafka://h:1/t", "--query", "q1", "--option", "read.timeout=5"], "error: --log option"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, _, err = run("checkpoints", *args)
    assert code == 2
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1


def test_unreachable_kafka_fails_within_the_read_timeout() -> None:
    from tests.servers.process import free_port

    url = f"kafka://127.0.0.1:{free_port()}/ckpt"
    started = time.monotonic()
    code, _, err = run("checkpoints", "--log", url, "--query", "q1", "--option", "read.timeout=1s")
    assert time.monotonic() - started < 1.0 + 1.5
    assert code == 1
    assert err.startswith(f"error: checkpoint log {url}: cannot read metadata")


def test_console_script_entry_point(tmp_path: Path) -> None:
    url = (tmp_path / "log").as_uri()
    write(url, {}, cp("q1", 4))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from spark_statebackend.cli import main; main()",
            "checkpoints",
            "--log",
            url,
            "--query",
            "q1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("checkpoint 1800000000004-000123-4")
