"""Shared fixtures. Server fixtures live in tests/servers/ and are imported here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_statebackend.stores import LocalBlobStore
from tests.servers.tansu import kafka_broker, private_tansu, require_real_kafka  # noqa: F401 - fixtures
from tests.sidecarrig import GatedStore, Rig, build_rig

# blob_store / blob_store_url (every backend), backend, cloud_backend, azurite/seaweedfs/moto servers.
pytest_plugins = ["tests.servers.fixtures"]


@pytest.fixture
def local_store(tmp_path: Path) -> LocalBlobStore:
    """A ready local-directory blob store in a fresh temporary directory."""
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    return store


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A real sidecar with checkpoints of batches 0..2 on a local store (tests/sidecarrig.py Rig);
    a module that needs another one defines its own `rig`."""
    r = build_rig(tmp_path, batches=3, retain=3)
    try:
        yield r
    finally:
        r.sidecar.close()


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[Rig, GatedStore]]:
    """`rig` on a store whose SnapshotIndex reads wait for its gate (sidecarrig.GatedStore)."""
    store = GatedStore(tmp_path / "blobs")
    r = build_rig(tmp_path, batches=3, retain=3, store=store)
    try:
        yield r, store
    finally:
        store.gate.set()
        r.sidecar.close()


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where started servers write their logs."""
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def shim_jar() -> Path:
    """The JVM shim jar, rebuilt by `make jar` if a Java source changed (never reinstalls the venv)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    # -o: treat the venv stamp as up to date, so a newer pyproject.toml does not trigger a pip install.
    subprocess.run(["make", "-s", "-o", ".venv/.installed", "jar"], cwd=root, check=True, timeout=600)
    jar = root / "spark_statebackend" / "jars" / "spark-statebackend-bridge.jar"
    assert jar.is_file(), f"make jar did not produce {jar}"
    return jar


@pytest.fixture(scope="session")
def agg_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run of the `agg` job on Spark's own RocksDB provider without the backend,
    batches 0..jobrig.REF_LAST, shared by the drop-in tests (tests/jobrig.py)."""
    from .jobrig import run_reference

    return run_reference(tmp_path_factory.mktemp("agg-reference"))
