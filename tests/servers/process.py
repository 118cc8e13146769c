"""Start a server as a child process on 127.0.0.1, wait until its port answers, stop it by pid.

No sleeps as synchronisation: readiness is a TCP connect that succeeds, polled until a deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `predicate` until it is true; raise TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def docker_available() -> bool:
    """True where a Docker engine answers (a laptop, other CI): fixtures may use testcontainers there.

    Set SSB_TESTCONTAINERS=0 to force local processes, =1 to force containers."""
    forced = os.environ.get("SSB_TESTCONTAINERS")
    if forced is not None:
        return forced == "1"
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of `pid` is in the stopped state ('T' in /proc/<pid>/task/<tid>/stat)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):
            # "<tid> (<comm>) <state> ...": comm may hold spaces and parentheses; the state follows the
            # last ')'.
            states.append(stat.read_text().rpartition(")")[2].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and return once every one of its threads has stopped. kill() only queues the
    signal: on a loaded machine a thread can still answer a request that arrives right after it."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: _all_threads_stopped(pid), timeout, f"process {pid} to stop")


class ServerProcess:
    """A server child process; `stop()` sends SIGTERM to its process group, then SIGKILL."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        port: int,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 60.0,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.log_path = log_dir / f"{name}-{port}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            wait_until(
                lambda: self._check_alive() and port_open(port), ready_timeout, f"{name} on port {port}"
            )
        except BaseException:
            self.stop()
            raise

    def _check_alive(self) -> bool:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready:\n{tail}")
        return True

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        self._log.close()
