"""Azurite (the Azure Storage emulator, npm azurite@3.35.0), blob service only, on 127.0.0.1.

Started as a child process on a free port with `--skipApiVersionCheck` (the SDK speaks a newer API
version than Azurite knows), in memory, and stopped by pid. Where a Docker engine answers, the
testcontainers AzuriteContainer is used instead (`docker_available()`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .process import ServerProcess, docker_available, free_port, port_open, wait_until

REPO = Path(__file__).resolve().parents[2]
AZURITE_BIN = REPO / ".azurite" / "node_modules" / ".bin" / "azurite-blob"

ACCOUNT = "devstoreaccount1"
#: Azurite's well-known development key (public, documented by Microsoft; not a secret).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(blob_endpoint: str, account_key: str = ACCOUNT_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={account_key};"
        f"BlobEndpoint={blob_endpoint};"
    )


@dataclass(frozen=True)
class Azurite:
    """A running Azurite: where it listens and how to connect."""

    host: str
    port: int

    @property
    def blob_endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/{ACCOUNT}"

    def connection_string(self, *, port: int | None = None, account_key: str = ACCOUNT_KEY) -> str:
        """The connection string, optionally through another port (the fault proxy) or with another key."""
        return connection_string(f"http://{self.host}:{port or self.port}/{ACCOUNT}", account_key)


@contextlib.contextmanager
def run_azurite(log_dir: Path) -> Iterator[Azurite]:
    """Start Azurite, yield it, stop it (by pid, or the container)."""
    if docker_available():
        # Not exercised on the reference machine (no Docker engine there); same version and flags.
        from testcontainers.core.container import DockerContainer

        container = (
            DockerContainer("mcr.microsoft.com/azure-storage/azurite:3.35.0")
            .with_command("azurite-blob --blobHost 0.0.0.0 --inMemoryPersistence --skipApiVersionCheck")
            .with_exposed_ports(10000)
        )
        with container:
            host, port = container.get_container_host_ip(), int(container.get_exposed_port(10000))
            wait_until(lambda: port_open(port, host), 60, "Azurite container")
            yield Azurite(host, port)
        return
    if not AZURITE_BIN.exists():
        raise RuntimeError(f"Azurite is not installed at {AZURITE_BIN}; run `make setup`")
    port = free_port()
    server = ServerProcess(
        "azurite",
        [
            str(AZURITE_BIN),
            "--blobHost", "127.0.0.1",
            "--blobPort", str(port),
            "--inMemoryPersistence",
            # In-memory extents may use up to this many MB (the 1 GiB benchmark needs room for two copies).
            "--extentMemoryLimit", "4096",
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
        ],
        port,
        log_dir,
    )  # fmt: skip
    try:
        yield Azurite("127.0.0.1", port)
    finally:
        server.stop()
