"""A stateful streaming query on a multi-host Spark standalone cluster (tests/cluster_rig.py): the
driver and two workers, each a host with a private disk and its own loopback address, the blob store
on SeaweedFS (S3) and the checkpoint log on Tansu (Kafka).

The job (tests/apps/multihost_job.py) reads text files that the test writes while it runs, one file
per batch, so batch b of every run reads the same file; it aggregates per key and writes each batch's
rows to a shared directory by batch id. Each scenario is compared batch by batch with the same job on
Spark's own RocksDB provider without the backend, run once on the same rig (`reference`):

- steady: backend on, no fault; every batch's output is the reference's, and the blob store and the
  Kafka log hold a checkpoint of the query;
- host lost: once a few batches are committed, worker 2's host dies (SIGKILL of its worker daemon,
  its executor JVM and its sidecar, then its disk wiped, and a new worker on a fresh disk at the same
  address); the query must go on with exactly the reference's output. Three points of the batch
  cycle, each made deterministic (with durableCommit=false, the opt-out, a host lost after a task
  commit fails the query: the README's documented limit, not tested here):
  - during a durable commit (the default): worker 2's sidecar is frozen first (SIGSTOP), so the
    task's commit waits for an upload the frozen sidecar never does: Spark never took the version for
    committed, and retries the task on another host once this one dies;
  - after a durable commit (the default): a user's stuck listener holds the listener bus, so the
    checkpoint log falls two batches behind Spark's commits; then the host dies. Each version it
    committed was uploaded before its commit returned, and the tasks retried on the other hosts
    restore them from their upload reports;
  - between batches: the input stops, the query runs out of files and its last batch is checkpointed,
    then the host dies; the stores it held are restored from the blob store on the other hosts;
- a new driver host: the driver's host dies while Spark's commits and plans run ahead of the Kafka
  log, its disk wiped, and the job is submitted again on a fresh driver host: the location is rebuilt
  from the latest checkpoint and the stored plans, and Spark re-runs the batches it planned;
- a whole new cluster: on a cluster of the test's own, once a few batches are committed and
  checkpointed, every host dies at once (driver, master, both workers: SIGKILL) and every disk is
  wiped; a second, fresh cluster (new master, workers and driver host, empty disks; the same blob
  store, Kafka log, checkpoint location path and input directory, still fed) runs the job again: the
  location is rebuilt from the checkpoint, the executors restore every store from the blob store, and
  the output is the reference's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.stores import open_blob_store
from tests.cluster_rig import ClusterRig, Host, cluster_rig, rig_conf
from tests.jobrig import APPS, PLUGIN, pyspark_home
from tests.servers.fixtures import TEST_ROOT
from tests.servers.process import freeze, wait_until
from tests.servers.s3 import S3Server
from tests.servers.tansu import KafkaBroker

pytestmark = [pytest.mark.spark, pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(600)]

FILES = 12  # input files = batches 0..FILES-1
ROWS_PER_FILE = 200
LOOKAHEAD = 2  # files written ahead of the driver's last committed batch
KILL_AFTER = 2  # committed batches before worker 2's host is killed
RUN_TIMEOUT_S = 240
BLOB_OPTIONS = {
    "retry_budget": "60s",
    "retry_initial_backoff": "50ms",
    "retry_max_backoff": "1s",
    "connect_timeout": "5s",
    "read_timeout": "20s",
    "max_concurrency": "4",
}
LOG_OPTIONS = {"replication.factor": "1", "read.timeout": "5s", "write.timeout": "5s", "admin.timeout": "10s"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRig]:
    """A master and two workers for the module; skipped with the reason where it cannot run."""
    with cluster_rig(tmp_path_factory.mktemp("cluster")) as r:
        yield r


@contextlib.contextmanager
def logs_on_failure(rig: ClusterRig) -> Iterator[None]:
    """Print every log of the rig (captured by pytest, shown with the failure) when the block fails."""
    try:
        yield
    except BaseException:
        print(rig.dump_logs())
        raise


# -- the job -------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One spark-submit of the job on the rig: its driver host and its directories."""

    name: str
    rig: ClusterRig
    driver: Host
    input: Path
    out: Path

    @property
    def checkpoint(self) -> Path:
        """The checkpoint location as the driver sees it on its own disk (from the root namespace)."""
        return self.driver.real / "ckpt" / self.name

    def committed(self) -> int:
        """The newest batch the driver committed (-1: none)."""
        commits = self.checkpoint / "commits"
        names = [p.name for p in commits.iterdir()] if commits.is_dir() else []
        return max((int(n) for n in names if n.isdigit()), default=-1)

    def output(self) -> str:
        return self.rig.output(self.driver)

    def query_id(self) -> str:
        found = re.findall(r"^QUERY (\S+)$", self.output(), re.M)
        assert found, f"the job printed no query id:\n{self.output()[-3000:]}"
        return str(found[0])

    def app_id(self) -> str:
        """The application id (the spool's directory on each host)."""
        state = self.rig.master_state()
        apps = [a for key in ("activeapps", "completedapps") for a in state.get(key, [])]  # type: ignore[attr-defined]
        ids = [a["id"] for a in apps if a.get("name") == f"ssb-multihost-{self.name}"]
        assert len(ids) == 1, apps
        return str(ids[0])


def write_input(input_dir: Path, i: int) -> None:
    """Input file i: ROWS_PER_FILE integers, renamed into place (the source skips dot files), with a
    modification time that orders it after file i-1 (the file source takes files oldest first)."""
    lines = "".join(f"{i * 1000 + j * 7}\n" for j in range(ROWS_PER_FILE))
    tmp = input_dir / f".part-{i:04d}.tmp"
    tmp.write_text(lines)
    stamp = 1_700_000_000 + i
    os.utime(tmp, (stamp, stamp))
    tmp.rename(input_dir / f"part-{i:04d}.txt")


class Feeder:
    """Writes the input files while the job runs: file i once the driver committed batch i-LOOKAHEAD-1,
    so files keep arriving in the middle of the query rather than all being there at its start.
    `pause()` stops the arrivals (the query then runs no batch once it has read every file written)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.written = 0
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"feeder-{run.name}", daemon=True)

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._running.set()
        self._thread.join(timeout=10)

    def pause(self) -> None:
        """Write no more files until `resume()`; returns once no write is under way."""
        self._running.clear()
        with self._lock:  # a write that began before the clear has finished
            pass

    def resume(self) -> None:
        self._running.set()

    def _loop(self) -> None:
        while self.written < FILES and not self._stop.is_set():
            self._running.wait()
            with self._lock:
                due = self._running.is_set() and self.written <= self.run.committed() + LOOKAHEAD + 1
                if due:
                    write_input(self.run.input, self.written)
                    self.written += 1
            if not due:
                self._stop.wait(0.05)


def backend_conf(rig: ClusterRig, s3: S3Server, broker: KafkaBroker) -> tuple[dict[str, str], str, str]:
    """(conf keys, blob store URL, checkpoint log URL) of a run with the backend on S3 and Kafka."""
    from spark_statebackend.spark import jar_path

    unique = uuid.uuid4().hex[:12]
    blob_url = f"s3://{TEST_ROOT}/multihost-{unique}"
    log_url = f"kafka://{broker.bootstrap}/ssb-multihost-{unique}"
    conf = {
        "spark.jars": str(jar_path()),
        "spark.plugins": PLUGIN,
        "spark.statebackend.blobStore.url": blob_url,
        "spark.statebackend.checkpointLog.url": log_url,
        "spark.statebackend.spoolDir": str(rig.mount / "spool"),
        "spark.statebackend.sidecar.python": sys.executable,
        # A failed application's driver sidecar waits this long for uploads that can no longer come
        # (the default, 60 s, would be most of a failed run's time).
        "spark.statebackend.drainTimeout": "15s",
    }
    for k, v in {**BLOB_OPTIONS, **s3.options()}.items():
        conf[f"spark.statebackend.blobStore.options.{k}"] = v
    for k, v in LOG_OPTIONS.items():
        conf[f"spark.statebackend.checkpointLog.options.{k}"] = v
    return conf, blob_url, log_url


def submit(
    rig: ClusterRig, name: str, conf: dict[str, str], host: str | None = None, app_args: tuple[str, ...] = ()
) -> Run:
    """Start the job as driver host `host` (default: `name`) against the rig's master (files not
    written yet; for a run submitted before, on another host: its input and output are kept), with
    `app_args` added to the job's arguments."""
    base = rig.root / "runs" / name
    run_input, out = base / "input", base / "out"
    run_input.mkdir(parents=True, exist_ok=True)
    cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--master", rig.master_url]
    for k, v in {**rig_conf(rig, name), **conf}.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += [str(APPS / "multihost_job.py"), "--input", str(run_input), "--out", str(out),
            "--checkpoint-location", str(rig.mount / "ckpt" / name), "--files", str(FILES),
            *app_args]  # fmt: skip
    driver = rig.start_driver(host or name, cmd)
    return Run(name, rig, driver, run_input, out)


def outputs(out: Path) -> dict[int, list[list[int]]]:
    """Each batch's rows as the job wrote them, batches 0..FILES-1 (all must be there)."""
    found = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    missing = sorted(set(range(FILES)) - set(found))
    assert not missing, f"no output for batches {missing} in {out}"
    return found


def final_state(batches: dict[int, list[list[int]]]) -> dict[int, list[int]]:
    """The newest row per key after the last batch (update mode): count and sum of every input row."""
    state: dict[int, list[int]] = {}
    for b in sorted(batches):
        for row in batches[b]:
            state[row[0]] = row
    return state


def expected_state() -> dict[int, list[int]]:
    """What exactly-once processing of every input file gives, computed from the inputs alone."""
    state: dict[int, list[int]] = {}
    for i in range(FILES):
        for j in range(ROWS_PER_FILE):
            v = i * 1000 + j * 7
            k, c, s = state.get(v % 13, [v % 13, 0, 0])
            state[v % 13] = [k, c + 1, s + v]
    return state


def finish(run: Run, feeder: Feeder) -> int:
    """Wait for the job to exit (it stops after the last file's batch); its exit code."""
    with feeder:
        return run.rig.wait(run.driver, RUN_TIMEOUT_S)


def failure_cause(run: Run) -> str:
    """What failed the query: the first state store error (else the job's own failure line) in the
    driver log, and the first restore error a surviving executor's sidecar logged."""
    out = run.output()
    cause = out[-1500:]
    for pattern in (r"^.*CANNOT_LOAD_STATE_STORE.*$", r"^QUERY FAILED.*$", r"^.*Exception.*$"):
        found = re.search(pattern, out, re.M)
        if found:
            cause = found.group(0)[:800]
            break
    for log in sorted(run.rig.root.glob("hosts/worker*/spool/*/*/sidecar.log")):
        found = re.search(r"^.* ERROR .*restore.*$", log.read_text(errors="replace"), re.M)
        if found:
            host = log.relative_to(run.rig.root).parts[1]
            return f"{cause}\nthe sidecar of executor {log.parent.name} on {host}: {found.group(0)[:600]}"
    return cause


@pytest.fixture(scope="module")
def reference(rig: ClusterRig) -> dict[int, list[list[int]]]:
    """The job on Spark's own RocksDB provider, no backend, no fault, on the same rig."""
    started = time.monotonic()
    with logs_on_failure(rig):
        run = submit(rig, "reference", {})
        code = finish(run, Feeder(run))
        assert code == 0, f"the reference run exited {code}: {failure_cause(run)}"
        batches = outputs(run.out)
        assert final_state(batches) == expected_state()
    print(f"reference run: {time.monotonic() - started:.0f}s")
    return batches


def assert_same_as_reference(run: Run, reference: dict[int, list[list[int]]]) -> None:
    got = outputs(run.out)
    bad = [b for b in range(FILES) if got[b] != reference[b]]
    assert not bad, f"batches {bad} differ from the reference: {[(got[b], reference[b]) for b in bad[:2]]}"
    assert final_state(got) == expected_state()


def assert_checkpointed(run: Run, s3: S3Server, blob_url: str, log_url: str) -> int:
    """The Kafka log has a checkpoint of the query whose every store marker is in the blob store;
    returns its batch."""
    qid = run.query_id()
    latest = open_checkpoint_log(log_url, LOG_OPTIONS).read_latest(qid)
    assert latest is not None, f"no checkpoint of query {qid} in {log_url}"
    markers = latest.markers(BLOBSTORE_BACKEND)
    stores = {k for k in markers if not k.startswith("_")}
    assert len(stores) == 4, f"checkpoint of batch {latest.batch_id} has stores {sorted(markers)}"
    store = open_blob_store(blob_url, {**BLOB_OPTIONS, **s3.options()})
    try:
        for marker in markers.values():
            load_snapshot_index(store, marker)  # raises naming the blob if it is missing
    finally:
        store.close()
    return latest.batch_id


# -- scenarios -----------------------------------------------------------------------------------------


def test_steady_run_matches_spark_own_provider(
    rig: ClusterRig,
    reference: dict[int, list[list[int]]],
    seaweedfs_server: S3Server,
    kafka_broker: KafkaBroker,
) -> None:
    started = time.monotonic()
    with logs_on_failure(rig):
        conf, blob_url, log_url = backend_conf(rig, seaweedfs_server, kafka_broker)
        run = submit(rig, "steady", conf)
        code = finish(run, Feeder(run))
        assert code == 0, f"the application exited {code}: {failure_cause(run)}"
        assert_same_as_reference(run, reference)
        for n in (1, 2):  # the state really is spread over both hosts
            stores_on(rig.worker(n), run)
        batch = assert_checkpointed(run, seaweedfs_server, blob_url, log_url)
        print(f"steady run: {time.monotonic() - started:.0f}s, last checkpoint: batch {batch}")


def snapshot_events(spool: Path) -> dict[str, dict[str, object]]:
    """The snapshot events waiting in the spool dirs under `spool` (the JVM wrote them; the sidecar
    has not taken them): file name -> document."""
    found: dict[str, dict[str, object]] = {}
    for p in spool.glob("*/*/events/*.json"):
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(p.read_text())
            if doc.get("type") == "snapshot":
                found[p.name] = doc
    return found


def thaw_sidecar(host: Host, app_id: str) -> None:
    """SIGCONT the sidecar that freeze_sidecar stopped on `host`."""
    for marker in host.real.glob(f"spool/{app_id}/*/sidecar.json"):
        os.kill(int(json.loads(marker.read_text())["pid"]), signal.SIGCONT)


def freeze_sidecar(host: Host, app_id: str) -> int:
    """SIGSTOP the sidecar of the executor on `host`; its pid."""
    markers = list(host.real.glob(f"spool/{app_id}/*/sidecar.json"))
    assert len(markers) == 1, f"{host.name}: sidecars {markers}"
    pid = int(json.loads(markers[0].read_text())["pid"])
    assert pid in host.processes(), f"the sidecar {pid} is not on {host.name}"
    freeze(pid)
    return pid


def between_batches(run: Run, feeder: Feeder, victim: Host, log_url: str) -> str:
    """Stop the input, wait until the query has run every batch it has files for and the checkpoint
    log holds the last of them (every state version is uploaded): no task runs. Returns what happened."""
    feeder.pause()
    cplog = open_checkpoint_log(log_url, LOG_OPTIONS)
    qid = run.query_id()

    def idle_and_checkpointed() -> bool:
        last = feeder.written - 1
        if run.committed() < last:
            return False
        latest = cplog.read_latest(qid)
        return latest is not None and latest.batch_id >= last

    wait_until(idle_and_checkpointed, 120, "every batch so far checkpointed", interval=0.3)
    return f"between batches: batch {run.committed()} was the last and is checkpointed"


def during_a_durable_commit(run: Run, feeder: Feeder, victim: Host, log_url: str) -> str:
    """durableCommit=true: freeze the victim's sidecar and wait for its executor to commit a state
    version (a new snapshot event that stays in its spool): that task's commit now waits for an upload
    that will never happen on this host, so Spark never took the version for committed. Returns what
    happened."""
    freeze_sidecar(victim, run.app_id())
    before = set(snapshot_events(victim.real / "spool"))

    def new_event() -> dict[str, object] | None:
        fresh = {n: d for n, d in snapshot_events(victim.real / "spool").items() if n not in before}
        return fresh[min(fresh)] if fresh else None

    wait_until(lambda: new_event() is not None, 120, f"a task commit on {victim.name}")
    event = new_event()
    assert event is not None and event.get("request_id"), f"the commit does not wait for its upload: {event}"
    return (
        f"while its executor's commit of version {event['version']} of state partition {event['partition']} "
        f"in batch {event['batch_id']} waited for its upload"
    )


def after_a_durable_commit(run: Run, feeder: Feeder, victim: Host, log_url: str) -> str:
    """durableCommit (the default): a user's stuck listener holds up the listener bus (slow_file), so
    the committer gets no batch and the checkpoint log falls behind; wait until the driver has
    committed two batches past the latest checkpoint: the versions the victim committed in them exist
    on its disk and, uploaded before each commit returned, in the blob store, but in no checkpoint.
    (Freezing the driver's sidecar would stop the query instead: it stores each batch's plan before
    Spark publishes its offsets.) Returns what happened."""
    slow_file(run).touch()
    cplog = open_checkpoint_log(log_url, LOG_OPTIONS)

    def durable() -> int:
        latest = cplog.read_latest(run.query_id())
        return -1 if latest is None else latest.batch_id

    wait_until(lambda: run.committed() >= durable() + 2, 180, "two batches committed past the checkpoint")
    return (
        f"after batch {run.committed()} was committed with durableCommit (the latest checkpoint is batch "
        f"{durable()}: a stuck listener holds the committer back)"
    )


def slow_file(run: Run) -> Path:
    """While this file exists the job's listener is stuck on a progress event (the bus waits)."""
    return run.rig.root / "runs" / run.name / "slow"


KILL_POINTS = {
    "between_batches": between_batches,
    "after_a_durable_commit": after_a_durable_commit,
    "during_a_durable_commit": during_a_durable_commit,
}


# With durableCommit=false (the opt-out) a version its task committed may exist only on the lost host, so
# the query fails (README, Limitations); these are the default's kill points.
@pytest.mark.parametrize("point", ["between_batches", "after_a_durable_commit", "during_a_durable_commit"])
def test_worker_host_lost(
    point: str,
    rig: ClusterRig,
    reference: dict[int, list[list[int]]],
    seaweedfs_server: S3Server,
    kafka_broker: KafkaBroker,
) -> None:
    """Worker 2's host dies at `point` of the batch cycle: its worker daemon, executor JVM and sidecar
    get SIGKILL, its disk is wiped, and a new worker starts on a fresh disk at its address. The query
    must go on and finish with exactly the reference's output."""
    started = time.monotonic()
    with logs_on_failure(rig):
        conf, _, log_url = backend_conf(rig, seaweedfs_server, kafka_broker)
        name = f"kill-{point}"
        app_args = ("--slow-while", str(rig.root / "runs" / name / "slow"))
        run = submit(rig, name, conf, app_args=app_args if point == "after_a_durable_commit" else ())
        with Feeder(run) as feeder:
            wait_until(lambda: run.committed() >= KILL_AFTER, RUN_TIMEOUT_S, f"batch {KILL_AFTER} committed")
            victim = rig.worker(2)
            when = KILL_POINTS[point](run, feeder, victim, log_url)
            held = stores_on(victim, run)
            killed = rig.kill_host(victim)
            rig.wipe(victim)
            print(f"killed {victim.name} (pids {killed}) {when}")
            killed_at = run.committed()
            rig.restart_worker(2)
            feeder.resume()
            if point == "after_a_durable_commit":
                # The listener stays stuck (the checkpoint behind) until a batch after the kill has
                # run, so its tasks restored the lost host's versions from their upload reports.
                wait_until(
                    lambda: run.committed() > killed_at + 1 or run.driver.procs[-1].poll() is not None,
                    RUN_TIMEOUT_S,
                    f"batch {killed_at + 2} committed after the kill",
                )
                slow_file(run).unlink()
            code = rig.wait(run.driver, RUN_TIMEOUT_S)
        print(f"kill run ({point}): {time.monotonic() - started:.0f}s, exit code {code}")
        assert code == 0, (
            f"the application exited {code} after worker 2's host was lost {when}: {failure_cause(run)}"
        )
        assert_same_as_reference(run, reference)
        if point == "between_batches":  # every version was checkpointed: executors restored them
            assert_restored_elsewhere(run, held)
        if point == "after_a_durable_commit":  # versions no checkpoint held came from upload reports
            assert_restored_elsewhere(run, held)
            assert "no checkpoint holds it yet" in sidecar_logs(run), "no version was restored from a report"


def stores_on(host: Host, run: Run) -> list[str]:
    """The state stores ("<op>/<partition>") whose files `host` has for the run's query."""
    state = host.real / "ckpt" / run.name / "state"
    stores = [f"{p.parent.name}/{p.name}" for p in state.glob("*/*") if p.name.isdigit()]
    assert stores, f"{host.name} holds no state store of {run.name}: the kill tests nothing"
    return sorted(stores)


def assert_restored_elsewhere(run: Run, stores: list[str]) -> None:
    """A sidecar on a host that is still up (worker 1, the new worker 2) restored each of `stores`
    from the blob store."""
    logs = sidecar_logs(run)
    qid = run.query_id()
    missing = [s for s in stores if f"restored query {qid} store {s}/" not in logs]
    assert not missing, f"stores {missing} of the lost host were never restored from the blob store"


def sidecar_logs(run: Run) -> str:
    """Every worker sidecar's log of the rig (kept when a host is wiped)."""
    return "".join(
        p.read_text(errors="replace") for p in run.rig.root.glob("hosts/worker*/spool/*/*/sidecar.log")
    )


def test_a_new_driver_host_re_runs_what_spark_planned(
    rig: ClusterRig,
    reference: dict[int, list[list[int]]],
    seaweedfs_server: S3Server,
    kafka_broker: KafkaBroker,
) -> None:
    """The driver's host dies (SIGKILL of spark-submit and the driver's sidecar, its disk wiped) while
    Spark has committed a batch the checkpoint log does not hold yet and planned the next one; the job
    is submitted again on a new driver host. The location is rebuilt from the latest checkpoint and the
    batch plans stored since (runtime/ [C0], spark/ [D4]), so Spark re-runs the batches it planned with
    the files it gave them: every batch's output is the reference's. Without the plans Spark plans
    those batches again, and one of them reads several files."""
    started = time.monotonic()
    with logs_on_failure(rig):
        conf, _, log_url = backend_conf(rig, seaweedfs_server, kafka_broker)
        run = submit(rig, "new-driver", conf)
        cplog = open_checkpoint_log(log_url, LOG_OPTIONS)
        with Feeder(run) as feeder:
            wait_until(lambda: run.committed() >= KILL_AFTER, RUN_TIMEOUT_S, f"batch {KILL_AFTER} committed")
            qid = run.query_id()

            def ahead() -> bool:  # Spark's commit and plan after the log's latest checkpoint
                committed, latest = run.committed(), cplog.read_latest(qid)
                offsets = run.checkpoint / "offsets"
                planned = max((int(p.name) for p in offsets.iterdir() if p.name.isdigit()), default=-1)
                return latest is not None and latest.batch_id < committed < planned

            wait_until(ahead, RUN_TIMEOUT_S, "Spark's commit and plan ahead of the checkpoint log")
            feeder.pause()
            old = run.driver
            rig.kill_host(old)
            durable = cplog.read_latest(qid)
            assert durable is not None
            committed = run.committed()
            rig.wipe(old)
            print(f"killed {old.name} at batch {committed} committed, {durable.batch_id} checkpointed")
            run.driver = submit(rig, run.name, conf, host="new-driver-2").driver
            feeder.resume()
            code = rig.wait(run.driver, RUN_TIMEOUT_S)
        print(f"new driver host run: {time.monotonic() - started:.0f}s, exit code {code}")
        assert code == 0, f"the application on the new driver host exited {code}: {failure_cause(run)}"
        assert_same_as_reference(run, reference)
        logs = "".join(
            p.read_text(errors="replace") for p in run.driver.real.glob("spool/*/driver/sidecar.log")
        )
        assert f"plans of batches {durable.batch_id + 1}.." in logs, "the rebuild placed no plans"


@pytest.mark.timeout(900)  # two clusters start and run one after the other (and the reference first)
def test_a_whole_new_cluster_resumes_from_the_blob_store_and_the_log(
    reference: dict[int, list[list[int]]],
    seaweedfs_server: S3Server,
    kafka_broker: KafkaBroker,
    tmp_path: Path,
) -> None:
    """Once a few batches are committed and checkpointed, every host of a cluster of the test's own dies
    at once (the driver's, both workers' and the master: SIGKILL, `kill_all`) and every disk is wiped.
    A second, fresh cluster on the same root (a new master, new workers and a new driver host on empty
    disks; the same addresses, checkpoint location path, blob store, Kafka log and input directory,
    which the test keeps feeding) runs the job again: the driver rebuilds the location from the latest
    checkpoint ([D1]-[D5]), the executors restore every store from the blob store ([E1]-[E5]), and every
    batch's output is the reference's."""
    started = time.monotonic()
    name = "new-cluster"
    root = tmp_path / "cluster"
    with contextlib.ExitStack() as cleanup:
        first = cleanup.enter_context(cluster_rig(root))
        with logs_on_failure(first):
            conf, _, log_url = backend_conf(first, seaweedfs_server, kafka_broker)
            cplog = open_checkpoint_log(log_url, LOG_OPTIONS)
            cleanup.callback(cplog.close)
            run = submit(first, name, conf)
            feeder = cleanup.enter_context(Feeder(run))

            def checkpointed() -> bool:
                return run.committed() >= KILL_AFTER and cplog.read_latest(run.query_id()) is not None

            wait_until(checkpointed, RUN_TIMEOUT_S, f"batch {KILL_AFTER} committed and a checkpoint logged")
            qid = run.query_id()
            held = sorted({*stores_on(first.worker(1), run), *stores_on(first.worker(2), run)})
            feeder.pause()  # its reads of the driver's disk would race the wipe
            first.kill_all()
            committed, durable = run.committed(), cplog.read_latest(qid)
            assert durable is not None
            for host in [*first.drivers, *first.workers]:
                first.wipe(host)
            print(f"killed the whole cluster at batch {committed} committed, {durable.batch_id} checkpointed")
        first.close()

        second = cleanup.enter_context(cluster_rig(root))
        with logs_on_failure(second):
            assert second.mount == first.mount, "the new cluster has another checkpoint location path"
            run.rig = second
            run.driver = submit(second, name, conf, host=f"{name}-driver-2").driver
            feeder.resume()
            code = second.wait(run.driver, RUN_TIMEOUT_S)
            print(f"whole new cluster run: {time.monotonic() - started:.0f}s, exit code {code}")
            assert code == 0, f"the application on the new cluster exited {code}: {failure_cause(run)}"
            assert_same_as_reference(run, reference)
            assert run.query_id() == qid, "the new cluster ran another query"
            driver_log = "".join(
                p.read_text(errors="replace") for p in run.driver.real.glob("spool/*/driver/sidecar.log")
            )
            rebuilt = (
                f"query {qid}: checkpoint location {second.mount / 'ckpt' / name} rebuilt from checkpoint "
                f"{durable.checkpoint_id} (batch {durable.batch_id}; local was at -1)"
            )
            assert rebuilt in driver_log, (
                f"the driver's location was not rebuilt from the blob store: {rebuilt}"
            )
            found = re.search(r"^FIRST (\d+)$", run.output(), re.M)
            assert found, "the job on the new cluster ran no batch"
            first_batch = int(found.group(1))
            assert durable.batch_id < first_batch <= committed + 1, (
                f"the new cluster ran batch {first_batch} first (checkpoint {durable.batch_id}, "
                f"committed {committed})"
            )
            assert_restored_elsewhere(run, held)  # every store, on the new cluster's workers
