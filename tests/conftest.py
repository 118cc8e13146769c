"""Shared fixtures. Server fixtures live in tests/servers/ and are imported here."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_statebackend.blobstore import LocalBlobStore


@pytest.fixture
def local_store(tmp_path: Path) -> LocalBlobStore:
    """A ready local-directory blob store in a fresh temporary directory."""
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    return store


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where started servers write their logs."""
    return tmp_path_factory.mktemp("server-logs")
