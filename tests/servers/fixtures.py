"""Pytest fixtures for blob stores on every backend, registered by tests/conftest.py (`pytest_plugins`).

- `blob_store`: a ready BlobStore, parametrised over `local`, `azurite`, `seaweedfs`, `moto`, each with
  a fresh unique prefix (a fresh directory for local). Any test taking it runs on every backend.
- `blob_store_url`: (url, env) for the same backends, for CLI tests run as subprocesses.
- `backend` / `cloud_backend`: the `Backend` behind them, to open more stores on the same place
  (other options, through the fault proxy, with wrong credentials).
- `azurite_server`, `seaweedfs_server`, `moto_server`: session-scoped servers, started on first use
  on free 127.0.0.1 ports and stopped by pid when the session ends.
Non-local parameters carry the `services` marker: `pytest -m "not services"` runs local only.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spark_statebackend.stores import BlobStore, open_blob_store

from .azurite import Azurite, run_azurite
from .s3 import S3Server, run_moto, run_seaweedfs

CLOUD_BACKENDS = ("azurite", "seaweedfs", "moto")
BACKENDS = ("local", *CLOUD_BACKENDS)
TEST_ROOT = "ssb-tests"  # the session's container (Azure) / bucket (S3); tests differ by prefix

# Small sizes so that a few MiB already exercise staged blocks, multipart parts and parallel ranges.
AZURE_TEST_OPTIONS = {"block_size": "1MiB", "download_chunk_size": "1MiB"}
S3_TEST_OPTIONS = {"block_size": "5MiB", "download_chunk_size": "1MiB"}
COMMON_TEST_OPTIONS = {
    "max_concurrency": "4",
    "retry_budget_seconds": "20",
    "retry_initial_backoff_seconds": "0.05",
    "retry_max_backoff_seconds": "1",
    "connect_timeout_seconds": "5",
    "read_timeout_seconds": "20",
}


@dataclass
class Backend:
    """One place to put blobs for one test: a backend, a unique URL, and how to open stores there."""

    name: str
    url: str
    options: dict[str, str]
    env: dict[str, str]
    #: Options for the same place reached through `port` (the fault proxy) instead of the server's.
    via_port: Callable[[int], dict[str, str]] = field(repr=False)
    #: Options for the same place with a wrong secret.
    wrong_secret: Callable[[str], dict[str, str]] = field(repr=False)
    server_port: int = 0
    _opened: list[BlobStore] = field(default_factory=list, repr=False)

    def open(self, url: str | None = None, ready: bool = True, **overrides: str) -> BlobStore:
        """A store at `url` (default: this backend's) with the test options plus `overrides`.
        Closed at the end of the test."""
        store = open_blob_store(url or self.url, {**self.options, **overrides})
        self._opened.append(store)
        if ready:
            store.ensure_ready()
        return store

    def sibling_url(self, suffix: str) -> str:
        """Another unique location next to this one."""
        return f"{self.url.rstrip('/')}-{suffix}"

    def close(self) -> None:
        for s in self._opened:
            s.close()


@pytest.fixture(scope="session")
def azurite_server(server_logs: Path) -> Iterator[Azurite]:
    with run_azurite(server_logs) as server:
        yield server


@pytest.fixture(scope="session")
def seaweedfs_server(server_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with run_seaweedfs(server_logs, tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="session")
def moto_server(server_logs: Path) -> Iterator[S3Server]:
    with run_moto(server_logs) as server:
        yield server


def _unique() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The Backend `name` for this test, starting its server if this is the first test to need it."""
    if name == "local":
        root = tmp_path / "blobs"
        return Backend(
            "local",
            root.as_uri(),
            {"fsync": "false"},
            {},
            via_port=lambda port: {"fsync": "false"},
            wrong_secret=lambda secret: {"fsync": "false"},
        )
    if name == "azurite":
        az: Azurite = request.getfixturevalue("azurite_server")
        opts = {**COMMON_TEST_OPTIONS, **AZURE_TEST_OPTIONS}
        return Backend(
            "azurite",
            f"azure://{TEST_ROOT}/{_unique()}",
            {**opts, "connection_string": az.connection_string()},
            {"AZURE_STORAGE_CONNECTION_STRING": az.connection_string()},
            via_port=lambda port: {"connection_string": az.connection_string(port=port)},
            wrong_secret=lambda secret: {"connection_string": az.connection_string(account_key=secret)},
            server_port=az.port,
        )
    s3: S3Server = request.getfixturevalue("seaweedfs_server" if name == "seaweedfs" else "moto_server")
    opts = {**COMMON_TEST_OPTIONS, **S3_TEST_OPTIONS}
    return Backend(
        name,
        f"s3://{TEST_ROOT}/{_unique()}",
        {**opts, **s3.options()},
        s3.env(),
        via_port=lambda port: s3.options(port=port),
        wrong_secret=lambda secret: s3.options(secret_key=secret),
        server_port=s3.port,
    )


def _params(names: tuple[str, ...]) -> list[object]:
    return [pytest.param(n, id=n, marks=() if n == "local" else (pytest.mark.services,)) for n in names]


@pytest.fixture(params=_params(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Every backend, one per parameter."""
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=_params(CLOUD_BACKENDS))
def cloud_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The cloud backends only (Azurite, SeaweedFS, moto)."""
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture
def blob_store(backend: Backend) -> BlobStore:
    """A ready BlobStore with a fresh unique prefix, on every backend."""
    return backend.open()


@pytest.fixture
def blob_store_url(backend: Backend) -> tuple[str, dict[str, str]]:
    """(url, env) of a fresh unique location on every backend: run the CLI with `env` added to the
    environment and `url` as its blob store (credentials and endpoint come from `env`)."""
    return backend.url, dict(backend.env)
