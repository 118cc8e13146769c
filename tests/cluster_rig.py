"""A multi-host Spark standalone cluster on one machine, for tests/system/test_multihost.py.

A master on 127.0.0.1 and two workers started with pyspark's own `bin/spark-class`, each worker on
its own loopback address (127.0.0.2, 127.0.0.3): with one address Spark treats the executors as one
host and reads the other's shuffle files straight off disk. Each "host" (the driver, each worker) runs
in a mount namespace of its own (`unshare -m`, root only) where its private directory is bind-mounted
at one shared path, `ClusterRig.mount`. So one absolute path (the checkpoint location, the Spark local
dirs, the spool, the worker's work dir, java.io.tmpdir, all under `mount`) means a different disk on
each host, as on a real cluster; the test reaches each host's files through its real directory
(`Host.real`) from the root namespace. Everything outside `mount` (the input files, the job's output)
is one shared disk.

A host is exactly the processes in its mount namespace: the worker daemon, the executor JVMs it
launched and their sidecars (they inherit the namespace, whatever process group or session they
choose). `kill_host` SIGKILLs all of them, as if the machine lost power; `wipe` deletes its disk;
`restart_worker` starts the worker again on a fresh empty directory (a new machine at the same
address); `kill_all` is the whole cluster losing power (the master too). Every process logs to
`<root>/logs/`; `dump_logs` gathers them (with the executors' logs from the work dirs) for a failure
message.

A ClusterRig started on the root of one that was closed is a whole new cluster at the same addresses
and the same `mount` (so the same checkpoint location path), sharing the old one's `<root>/logs/` and
anything the test keeps under `root` (input files, output): its logs and disks are numbered after the
old one's (`_generations_used`), so nothing of the old cluster is overwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from .demorig import ROOT
from .jobrig import ROCKSDB, pyspark_home
from .servers.process import free_port, port_open, wait_until

MASTER_HOST = "127.0.0.1"
DRIVER_HOST = "127.0.0.1"
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
#: What each host has under its private mount (created empty on a new host).
HOST_DIRS = ("work", "local", "tmp", "spool", "ckpt")
#: The shell run inside a new mount namespace: make the host's directory the shared path, then
#: become the host's process ($0 is a name for `ps`, $1 the real dir, $2 the mount point).
_ENTER_HOST = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


def multihost_skip_reason() -> str | None:
    """Why the rig cannot run here (None: it can): mount namespaces need root and util-linux's unshare."""
    if not sys.platform.startswith("linux"):
        return "the multi-host rig needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "the multi-host rig needs root (unshare -m and bind mounts give each host a private disk)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "the multi-host rig needs util-linux's unshare and mount"
    if shutil.which("java") is None:
        return "the multi-host rig needs java for Spark's standalone master and workers"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:  # root without CAP_SYS_ADMIN (e.g. an unprivileged container)
        return f"the multi-host rig needs mount namespaces: unshare -m failed: {probe.stderr.strip()}"
    return None


def _generations_used(root: Path) -> int:
    """The highest number a rig under `root` gave a log or a host's disk (0: none yet)."""
    numbers = [p.name.split("-", 1)[0] for p in (root / "logs").glob("*.log")]
    numbers += [p.name.rsplit("-", 1)[-1] for p in (root / "hosts").glob("*")]
    return max((int(n) for n in numbers if n.isdigit()), default=0)


def mount_ns(pid: int) -> str | None:
    """The mount namespace of `pid` ("mnt:[<inode>]"); None if it is gone (or a zombie)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_ns(ns: str) -> list[int]:
    """Every live process in mount namespace `ns`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and mount_ns(int(entry.name)) == ns:
            found.append(int(entry.name))
    return found


@dataclass
class Host:
    """One machine of the rig: a name, an address, its disk (`real`), and the processes it runs."""

    name: str
    address: str
    real: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: The mount namespace of the host's first process: membership of every later one.
    ns: str | None = None
    port: int = 0  # a worker's RPC port

    def processes(self) -> list[int]:
        return pids_in_ns(self.ns) if self.ns else []


class ClusterRig:
    """A standalone master and two workers, each worker a host with a private disk (module docstring).

    Use as a context manager: `with ClusterRig(root) as rig:`; leaving it kills every process it
    started (by pid and by namespace) and unmounts nothing (namespaces vanish with their processes)."""

    def __init__(self, root: Path, *, worker_memory: str = "1g") -> None:
        self.root = root
        self.mount = root / "mnt"  # the shared path; empty in the root namespace
        self.logs = root / "logs"
        self.worker_memory = worker_memory
        self.master_port = free_port()
        self.master_ui_port = free_port()
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[Host] = []
        self.drivers: list[Host] = []
        self._opened: list[IO[bytes]] = []
        self._generation = _generations_used(root)  # after an earlier rig's on the same root

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> ClusterRig:
        self.mount.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self.start_master()
            for i, address in enumerate(WORKER_HOSTS, start=1):
                self.workers.append(self._start_worker(f"worker{i}", address))
            self.wait_workers_alive()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every driver and worker (their whole host), then the master."""
        for host in [*self.drivers, *self.workers]:
            self.kill_host(host)
        if self.master is not None:
            self._stop(self.master)
        for f in self._opened:
            with contextlib.suppress(Exception):
                f.close()

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    def env(self, host: Host | None = None) -> dict[str, str]:
        """The environment of a Spark process of `host`: pyspark's Spark home, this venv's Python for
        PySpark and the sidecars, this checkout first on the Python path, the host's address."""
        env = dict(os.environ)
        env["SPARK_HOME"] = str(pyspark_home())
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env.pop("SPARK_CONF_DIR", None)
        if host is not None:
            env["SPARK_LOCAL_IP"] = host.address
            env["SPARK_LOCAL_DIRS"] = str(self.mount / "local")
            env["SPARK_WORKER_DIR"] = str(self.mount / "work")
            env["SPARK_DAEMON_JAVA_OPTS"] = f"-Djava.io.tmpdir={self.mount / 'tmp'}"
        return env

    def _log(self, name: str) -> IO[bytes]:
        self._generation += 1
        f = open(self.logs / f"{self._generation:02d}-{name}.log", "wb")  # noqa: SIM115 - closed in close()
        self._opened.append(f)
        return f

    def _new_disk(self, name: str) -> Path:
        """A fresh, empty private directory for host `name` (a new machine's disk)."""
        self._generation += 1
        real = self.root / "hosts" / f"{name}-{self._generation:02d}"
        for d in HOST_DIRS:
            (real / d).mkdir(parents=True, mode=0o700)
        real.chmod(0o700)
        return real

    def _spawn(
        self, host: Host, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
    ) -> None:
        """Start `argv` as the process of `host` (one per Host): in a new mount namespace, with the host's
        disk bound at `mount`; every process it starts stays in that namespace, i.e. on the host."""
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", _ENTER_HOST, f"ssb-{host.name}",
               str(host.real), str(self.mount), *argv]  # fmt: skip
        out = self._log(host.name)
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd, start_new_session=True
        )
        host.procs.append(proc)

        def entered() -> bool:
            assert proc.poll() is None, f"{host.name} exited ({proc.returncode}) at start: {self.tail(host)}"
            ns = mount_ns(proc.pid)
            return ns is not None and ns != mount_ns(os.getpid())

        wait_until(entered, 30, f"{host.name} to enter its mount namespace")
        if host.ns is None:
            host.ns = mount_ns(proc.pid)

    def start_master(self) -> None:
        cmd = [str(pyspark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
               "--host", MASTER_HOST, "--port", str(self.master_port),
               "--webui-port", str(self.master_ui_port)]  # fmt: skip
        env = self.env()
        env["SPARK_LOCAL_IP"] = MASTER_HOST
        self.master = subprocess.Popen(
            cmd, stdout=self._log("master"), stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

        def up() -> bool:
            assert self.master is not None and self.master.poll() is None, "the master exited at start"
            return port_open(self.master_port) and port_open(self.master_ui_port)

        wait_until(up, 90, "the Spark master", interval=0.2)

    def _start_worker(self, name: str, address: str) -> Host:
        host = Host(name, address, self._new_disk(name), port=free_port())
        cmd = [str(pyspark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
               "--host", address, "--port", str(host.port), "--webui-port", str(free_port()),
               "--cores", "1", "--memory", self.worker_memory,
               "--work-dir", str(self.mount / "work"), self.master_url]  # fmt: skip
        self._spawn(host, cmd, self.env(host))
        return host

    def master_state(self) -> dict[str, object]:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"http://{MASTER_HOST}:{self.master_ui_port}/json", timeout=5) as r:
            state: dict[str, object] = json.load(r)
            return state

    def worker_alive(self, host: Host) -> bool:
        """The master lists `host`'s current worker process (its address and port) as ALIVE."""
        try:
            workers = self.master_state().get("workers", [])
        except (OSError, ValueError):  # the web UI answers 404 until its pages are attached
            return False
        assert isinstance(workers, list)
        return any(
            w.get("host") == host.address and w.get("port") == host.port and w.get("state") == "ALIVE"
            for w in workers
        )

    def wait_workers_alive(self, timeout: float = 120) -> None:
        def alive() -> bool:
            for w in self.workers:
                assert w.procs and w.procs[-1].poll() is None, f"{w.name} exited: {self.tail(w)}"
            return all(self.worker_alive(w) for w in self.workers)

        wait_until(alive, timeout, "both workers to register with the master", interval=0.3)

    def worker(self, n: int) -> Host:
        """Worker `n` (1 or 2) as it is now."""
        return self.workers[n - 1]

    # -- drivers ---------------------------------------------------------------------------------

    def start_driver(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        disk: Path | None = None,
    ) -> Host:
        """Start `argv` (a spark-submit, or a Python driver) as the driver host `name`, on a fresh disk at
        `mount` (or on `disk`, an earlier driver's whose processes are gone: the same machine started
        again); its output goes to the rig's logs (`output()`)."""
        host = Host(name, DRIVER_HOST, disk if disk is not None else self._new_disk(name))
        self.drivers.append(host)
        full_env = self.env()
        full_env["SPARK_LOCAL_IP"] = DRIVER_HOST
        full_env.update(env or {})
        self._spawn(host, argv, full_env, cwd=self.root)
        return host

    def log_of(self, host: Host) -> Path:
        """The log of `host`'s newest process."""
        return sorted(self.logs.glob(f"*-{host.name}.log"))[-1]

    def output(self, host: Host) -> str:
        return self.log_of(host).read_text(errors="replace")

    def tail(self, host: Host, chars: int = 4000) -> str:
        with contextlib.suppress(IndexError, OSError):
            return self.output(host)[-chars:]
        return ""

    def wait(self, host: Host, timeout: float) -> int:
        """Wait for the host's main process to exit; its exit code (the host is killed on a timeout)."""
        proc = host.procs[-1]
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_host(host)
            raise

    # -- faults ----------------------------------------------------------------------------------

    def kill_host(self, host: Host, timeout: float = 30) -> list[int]:
        """SIGKILL every process of `host` (its namespace: daemon, executors, sidecars) and wait until
        all are gone. Returns the pids killed."""
        killed: list[int] = []

        def gone() -> bool:
            left = host.processes()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            for proc in host.procs:  # reap our own children so they leave /proc
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.01)
            return not left

        wait_until(gone, timeout, f"every process of {host.name} to die", interval=0.05)
        for proc in host.procs:
            self._stop(proc)
        return sorted(set(killed))

    def kill_all(self) -> None:
        """Every machine of the rig loses power: SIGKILL each driver host, each worker host (kill_host)
        and the master's process group. The drivers go first, so none reacts to a lost executor."""
        for host in [*self.drivers, *self.workers]:
            self.kill_host(host)
        if self.master is not None and self.master.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.master.pid, signal.SIGKILL)
            self.master.wait(timeout=30)

    def wipe(self, host: Host) -> None:
        """Lose `host`'s disk; its executor logs are kept under logs/ first (for failure messages)."""
        self._keep_executor_logs(host)
        shutil.rmtree(host.real, ignore_errors=True)

    def restart_worker(self, n: int) -> Host:
        """Start worker `n` again at its address, on a fresh empty disk and a new port (a replaced
        machine); returns once the master lists it ALIVE. The old one must have been killed."""
        old = self.worker(n)
        assert not old.processes(), f"{old.name} still runs"
        host = self._start_worker(old.name, old.address)
        self.workers[n - 1] = host
        wait_until(lambda: self.worker_alive(host), 120, f"{host.name} to register again", interval=0.3)
        return host

    def _stop(self, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
        """SIGTERM then SIGKILL the process group of one of our children, and reap it."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)

    # -- logs ------------------------------------------------------------------------------------

    def _keep_executor_logs(self, host: Host) -> None:
        for p in [*host.real.glob("work/*/*/std*"), *host.real.glob("spool/*/*/sidecar.log")]:
            dest = self.logs / "kept" / host.real.name / p.relative_to(host.real)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(p, dest)

    def dump_logs(self, chars: int = 3000) -> str:
        """The tail of every log of the rig: daemons, drivers, executors and sidecars (kept ones too)."""
        paths = sorted(self.logs.glob("*.log"))
        for host in [*self.workers, *self.drivers]:
            paths += sorted(host.real.glob("work/*/*/stderr")) + sorted(
                host.real.glob("spool/*/*/sidecar.log")
            )
        paths += sorted((self.logs / "kept").rglob("*")) if (self.logs / "kept").is_dir() else []
        parts = []
        for p in paths:
            if p.is_file():
                text = p.read_text(errors="replace")
                parts.append(f"===== {p} ({len(text)} chars) =====\n{text[-chars:]}")
        return "\n".join(parts)


def rig_conf(rig: ClusterRig, name: str) -> dict[str, str]:
    """The Spark settings of a job on the rig: a small cluster job, each host's files at `mount`, both
    executors registered before the first batch (so state partitions land on both hosts)."""
    tmpdir = f"-Djava.io.tmpdir={rig.mount / 'tmp'}"
    return {
        "spark.app.name": f"ssb-multihost-{name}",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": tmpdir,
        "spark.executor.extraJavaOptions": tmpdir,
        "spark.local.dir": str(rig.mount / "local"),
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "512m",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.ui.enabled": "false",
        "spark.executorEnv.PYTHONPATH": str(ROOT),  # the sidecars import this checkout
    }


@contextlib.contextmanager
def cluster_rig(root: Path) -> Iterator[ClusterRig]:
    """A ClusterRig under `root`, skipped where it cannot run (multihost_skip_reason)."""
    reason = multihost_skip_reason()
    if reason:
        pytest.skip(reason)
    with ClusterRig(root) as rig:
        yield rig
