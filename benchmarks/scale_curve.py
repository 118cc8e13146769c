"""The recovery scale curve (issue 23, item 1): how a restart behaves as live state grows, each size and
store count beside Spark's own RocksDB provider in one run.

For each point (state size x store count), on the workload of benchmarks/spark_commit.py (dropDuplicates
over 10 batches of 1 KB rows, default mode, Spark's RocksDB provider on both sides, `stores` shuffle
partitions = state store instances), with about SIZE GiB of live state built by a real Spark query:
- Spark's provider alone, and ours with a `file://` blob store and, if asked, an S3 one (SeaweedFS on
  127.0.0.1, tests/servers/s3.py), each run to batch 9 (spark_commit's `_first_run`);
- restarts to the first batch, interleaved round by round (spark_commit's `bench_mode`): with state and
  without (a new query on the same source), so state's share = with - without. Spark's restart keeps
  its checkpoint location (its only copy) with empty local dirs; ours on the same host likewise, on a
  wiped host (checkpoint location, local dirs and spool gone: the driver's files and every store come
  from the blob store), and for `file://` on a wiped host with root's capabilities too (every SST
  copied instead of hard-linked: module doc of spark_commit, Identity). From S3: a wiped host, once;
- the restore rate of the latest checkpoint's stores (all of them, RESTORE_WORKERS at a time on one
  transfer pool, as a sidecar runs them; best of cloud_restore.REPEATS) beside the best raw parallel
  transfer of the very same blob bytes into fsynced files: for `file://` a parallel copy (and our
  restore three ways: as a Spark user, where SSTs are hard-linked; as root, where they are copied; and
  by the download path every remote store takes), for S3 boto3's transfer manager
  (cloud_restore.s3_raw_variants). Spark's own rate is the live state over its state's share.

Figures go to `<out>.json` (every figure of every point, with the load average before and after each)
and `<out>.png` (needs matplotlib, the `bench` extra). Nothing is asserted.

    python -m benchmarks.scale_curve --sizes 1,4 --stores 8,64 --kinds file,s3

Each option has an environment twin: SSB_SCALE_SIZES_GIB, SSB_SCALE_STORES, SSB_SCALE_KINDS,
SSB_SCALE_RESTARTS, SSB_SCALE_OUT, SSB_SCALE_TRIGGER_S; SSB_BENCH_DIR says where the (large) work
directories go. Everything written under it is removed at the end of each point.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import spark_commit as sc
from benchmarks.cloud_restore import REPEATS, WORKERS, _best, _fsync_all, _in_parallel, _out
from benchmarks.engine import _DownloadOnly

MiB = 1024 * 1024
GiB = 1024 * MiB
#: spark_commit's workload: 10 batches of 100k rows of 1 KB make about 1 GiB of live RocksDB state.
ROWS_PER_GIB = 100_000
S3_BUCKET = "ssb-scale"
#: Raw copies of local blob files: one file after another, and several files at once.
COPY_THREADS = (1, 4, WORKERS)
RawVariants = dict[str, Callable[[list[tuple[str, int]], Path], None]]


# ------------------------------------------------------------------------------------------- restore


def _snapshot(store: Any, log_url: str, query_id: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The markers of the query's latest checkpoint, and every blob (id, size) their indexes name."""
    from spark_statebackend.checkpoints.checkpoint import BLOBSTORE_BACKEND
    from spark_statebackend.checkpoints.logs import open_checkpoint_log
    from spark_statebackend.engine.blobs import load_snapshot_index

    latest = open_checkpoint_log(log_url).read_latest(query_id)
    if latest is None:
        raise RuntimeError(f"no checkpoint of query {query_id} in {log_url}")
    markers = sorted(m for k, m in latest.markers(BLOBSTORE_BACKEND).items() if not k.startswith("_"))
    blobs = []
    for marker in markers:
        index = load_snapshot_index(store, marker)
        blobs += [(b.blob_id, b.size) for _, f in index.dir_index.walk_files() for b in f.blobs]
    return markers, blobs


def _restore_all(store: Any, markers: list[str], dest: Path) -> int:
    """Restores every marker into its own dir under `dest`, RESTORE_WORKERS at a time on one transfer pool
    of WORKERS (as a sidecar does); returns the bytes taken from the blob store."""
    from spark_statebackend.engine.restore import RestoreManager
    from spark_statebackend.engine.transfer import TransferPool
    from spark_statebackend.runtime.restore_loop import RESTORE_WORKERS

    with TransferPool(WORKERS, name="scale-restore") as pool, ThreadPoolExecutor(RESTORE_WORKERS) as each:
        manager = RestoreManager(store, pool)
        results = list(each.map(lambda i: manager.restore(markers[i], dest / str(i)), range(len(markers))))
    return sum(r.bytes_downloaded for r in results)


def _time_restore(store: Any, markers: list[str], dest: Path) -> float:
    """Best-of-REPEATS seconds of _restore_all into an empty `dest`."""
    return _best(lambda: _restore_all(store, markers, dest), lambda: shutil.rmtree(dest, ignore_errors=True))


def _time_raw(variants: RawVariants, blobs: list[tuple[str, int]], dest: Path) -> dict[str, float]:
    """Best-of-REPEATS seconds of each raw transfer of `blobs` into fsynced files in an empty `dest`."""
    out = {}
    for name, download in variants.items():

        def run(download: Callable[[list[tuple[str, int]], Path], None] = download) -> None:
            dest.mkdir(parents=True)
            download(blobs, dest)
            _fsync_all(list(dest.iterdir()))

        out[name] = _best(run, lambda: shutil.rmtree(dest, ignore_errors=True))
    return out


def _copy_variants(store: Any) -> RawVariants:
    """Raw parallel copies of local blob files (the kernel's copy_file_range through shutil)."""

    def copy(blob_id: str, size: int, dest: Path) -> None:
        shutil.copyfile(store.local_path(blob_id), _out(dest, blob_id))

    return {f"copy_{n}_files_at_once": _in_parallel(copy, n) for n in COPY_THREADS}


def _rates(prefix: str, nbytes: int, ours: dict[str, float], raw: dict[str, float]) -> dict[str, float]:
    """MiB/s of each timing, the best raw one, and each of ours over it."""
    out = {f"{prefix}_restore_bytes": float(nbytes)}
    for name, seconds in {**ours, **{f"raw_{k}": v for k, v in raw.items()}}.items():
        out[f"{prefix}_{name}_mib_s"] = nbytes / MiB / seconds
    best = max(nbytes / MiB / s for s in raw.values())
    out[f"{prefix}_raw_best_mib_s"] = best
    for name in ours:
        out[f"{prefix}_{name}_vs_raw"] = out[f"{prefix}_{name}_mib_s"] / best
    return out


def probe_file(spec: dict[str, Any]) -> dict[str, float]:
    """In a process of its own (run as a Spark user would, or as root: spark_commit._identity): our
    restore from the local blob store `spec["blobs"]` of query `spec["query_id"]`'s latest checkpoint in
    `spec["log"]`, into `spec["dest"]`; with `spec["all"]` also the download path and the raw copies."""
    from spark_statebackend.stores import LocalBlobStore

    store = LocalBlobStore(Path(spec["blobs"]), fsync=True)
    markers, blobs = _snapshot(store, Path(spec["log"]).as_uri(), spec["query_id"])
    dest = Path(spec["dest"])
    ours = {spec["name"]: _time_restore(store, markers, dest)}
    raw: dict[str, float] = {}
    if spec["all"]:
        ours["restore_download_path"] = _time_restore(
            _DownloadOnly(Path(spec["blobs"]), fsync=True), markers, dest
        )
        raw = _time_raw(_copy_variants(store), blobs, dest)
    return {"bytes": float(sum(n for _, n in blobs)), "stores": float(len(markers)), **ours, **raw}


def _file_restore(c: sc._Config, query_id: str) -> dict[str, float]:
    """The file:// rates, from the state the run saved (its blob store and checkpoint log)."""
    figures: dict[str, float] = {}
    for name, privileged in (("restore", False), ("restore_as_root", True)):
        spec = {
            "blobs": str(c.work / "saved" / "blobs"), "log": str(c.work / "saved" / "log"),
            "query_id": query_id, "dest": str(c.work / "probe"), "name": name, "all": not privileged,
        }  # fmt: skip
        if name == "restore_as_root" and not sc._identity(False):
            continue  # not root: there is no other identity to measure
        argv = [*sc._identity(privileged), sys.executable, "-m", "benchmarks.scale_curve", "--probe"]
        done = subprocess.run(
            [*argv, json.dumps(spec)], capture_output=True, text=True, timeout=3600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"restore probe {name} failed:\n{done.stderr[-4000:]}")
        figures.update(json.loads(done.stdout.strip().splitlines()[-1]))
    nbytes = int(figures.pop("bytes"))
    stores = figures.pop("stores")
    raw = {k: figures.pop(k) for k in list(figures) if k.startswith("copy_")}
    return {"ours_file_snapshot_stores": stores, **_rates("ours_file", nbytes, figures, raw)}


def _s3_restore(c: sc._Config, query_id: str, server: Any) -> dict[str, float]:
    """The S3 rates, from the run's bucket, in this process (nothing is hard-linked from S3)."""
    from benchmarks.cloud_restore import s3_client, s3_raw_variants
    from spark_statebackend.stores import open_blob_store

    assert c.blob_url is not None
    store = open_blob_store(c.blob_url, {**server.options(), "max_concurrency": str(WORKERS)})
    client = s3_client(server)
    try:
        markers, blobs = _snapshot(store, (c.work / "log").as_uri(), query_id)
        ours = {"restore": _time_restore(store, markers, c.work / "probe")}
        key_prefix = c.blob_url.removeprefix(f"s3://{S3_BUCKET}/").rstrip("/") + "/"
        raw = _time_raw(s3_raw_variants(client, S3_BUCKET, key_prefix), blobs, c.work / "probe")
    finally:
        store.close()
        client.close()
    return _rates("ours_s3", sum(n for _, n in blobs), ours, raw)


def _query_id(c: sc._Config) -> str:
    return str(sc._progress(c.work, "run")[0]["id"])


# --------------------------------------------------------------------------------------------- points


def _configs(root: Path, stores: int, kinds: list[str], point: str) -> list[sc._Config]:
    configs = [sc._Config(root, "spark", False, False, partitions=stores)]
    if "file" in kinds:
        # No URL: the run's own directory, which its restarts reset (a URL makes a config "remote").
        configs.append(sc._Config(root, "ours_file", True, False, partitions=stores))
    if "s3" in kinds:
        url = f"s3://{S3_BUCKET}/{point}"
        configs.append(sc._Config(root, "ours_s3", True, False, partitions=stores, blob_url=url))
    return configs


#: (label, state's-share figure in spark_commit's names) of each restart with state, Spark's first.
SHARES = (
    ("Spark's provider, its restart (same host)", "spark_state_share"),
    ("ours, same host", "ours_file_samehost_state_share"),
    ("ours, wiped host, file://", "ours_file_state_share"),
    ("ours, wiped host as root, file:// (SSTs copied)", "ours_file_root_state_share"),
    ("ours, wiped host, S3 (SeaweedFS)", "ours_s3_state_share"),
)
#: The headline share: the median over rounds of (with state - without), both timed from start().
SHARE_BASE = "paired_start_to_first_batch_s"


def _derived(out: dict[str, float]) -> None:
    """The figures the issue names, from the raw ones: live state, Spark's effective restore rate (live
    state over its state's share), and each of ours over Spark's."""
    live = out.get("ours_file_restore_bytes") or out.get("ours_s3_restore_bytes")
    out["live_state_bytes"] = float(live or out.get("spark_state_dir_bytes", 0.0))
    out["live_state_gib"] = out["live_state_bytes"] / GiB
    spark_share = out.get(f"spark_state_share_{SHARE_BASE}", float("nan"))
    if spark_share > 0:
        out["spark_restart_state_mib_s"] = out["live_state_bytes"] / MiB / spark_share
        for kind in ("ours_file", "ours_s3"):
            if f"{kind}_restore_mib_s" in out:
                out[f"{kind}_restore_vs_spark_restart"] = (
                    out[f"{kind}_restore_mib_s"] / out["spark_restart_state_mib_s"]
                )
        for _, name in SHARES[1:]:
            if f"{name}_{SHARE_BASE}" in out:
                out[f"{name}_vs_spark"] = out[f"{name}_{SHARE_BASE}"] / spark_share


def run_point(root: Path, size_gib: float, stores: int, kinds: list[str], rounds: int,
              evidence: Path, server: Any) -> dict[str, float]:  # fmt: skip
    """One point of the curve (module doc); every byte it wrote under `root` is gone when it returns."""
    point = f"{size_gib:g}gib-{stores}stores"
    rows = max(1, round(size_gib * ROWS_PER_GIB))
    out: dict[str, float] = {"size_gib": size_gib, "stores": float(stores), "rows_per_batch": float(rows)}
    out["load1_before"], out["load5_before"], _ = os.getloadavg()
    t0 = time.monotonic()
    configs = _configs(root, stores, kinds, point)

    def measure(configs: list[sc._Config]) -> None:
        for c in configs:
            if c.name == "ours_file":
                out.update(_file_restore(c, _query_id(c)))
            elif c.name == "ours_s3":
                out.update(_s3_restore(c, _query_id(c), server))

    sc.bench_mode(root, configs, rows, out, rounds=rounds, evidence=evidence / point, before_cleanup=measure)
    out["wall_s"] = time.monotonic() - t0
    out["load1_after"], out["load5_after"], _ = os.getloadavg()
    _derived(out)
    return out


# ------------------------------------------------------------------------------------------------ plot


def plot(results: dict[str, Any], png: Path) -> None:
    """Two panels over live state: state's share of a restart to the first batch, and restore rates
    beside the raw transfers and Spark's effective rate; one line style per store count."""
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    points = results["points"]
    fig, (share_ax, rate_ax) = plt.subplots(1, 2, figsize=(13, 5.2))
    styles = ("-", "--", ":", "-.")
    rates = (
        ("ours, file:// (SSTs hard-linked)", "ours_file_restore_mib_s"),
        ("ours, file:// as root (copied)", "ours_file_restore_as_root_mib_s"),
        ("ours, file:// download path", "ours_file_restore_download_path_mib_s"),
        ("raw parallel copy, file://", "ours_file_raw_best_mib_s"),
        ("ours, S3", "ours_s3_restore_mib_s"),
        ("raw boto3 download, S3", "ours_s3_raw_best_mib_s"),
        ("Spark's restart (live state / its share)", "spark_restart_state_mib_s"),
    )
    for i, stores in enumerate(sorted({int(p["stores"]) for p in points})):
        mine = sorted((p for p in points if int(p["stores"]) == stores), key=lambda p: p["live_state_gib"])
        style = styles[i % len(styles)]
        for j, (label, name) in enumerate(SHARES):
            _line(share_ax, mine, f"{name}_{SHARE_BASE}", f"{label}, {stores} stores", style, f"C{j}")
        for j, (label, name) in enumerate(rates):
            _line(rate_ax, mine, name, f"{label}, {stores} stores", style, f"C{j}")
    share_ax.set(xlabel="live state (GiB)", ylabel="s", title="state's share of restart to first batch")
    share_ax.axhline(0, color="grey", linewidth=0.5)
    rate_ax.set(xlabel="live state (GiB)", ylabel="MiB/s", title="restore rate", yscale="log")
    for ax in (share_ax, rate_ax):
        ax.legend(fontsize=6.5)
        ax.grid(alpha=0.3)
    loads = [p[k] for p in points for k in ("load1_before", "load1_after")]
    fig.suptitle(
        f"Recovery scale curve, {results['host']}, {results['started']}, load average "
        f"{min(loads):.1f}-{max(loads):.1f}\n{results['command']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _line(ax: Any, points: list[dict[str, Any]], key: str, label: str, style: str, color: str) -> None:
    xy = [(p["live_state_gib"], p[key]) for p in points if key in p]
    if xy:
        ax.plot(*zip(*xy, strict=True), style, marker="o", label=label, color=color)


# ------------------------------------------------------------------------------------------------ main


def _args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.scale_curve", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("--sizes", default=env("SSB_SCALE_SIZES_GIB", "1"), help="GiB of live state, e.g. 1,4")
    ap.add_argument("--stores", default=env("SSB_SCALE_STORES", "8"), help="store counts, e.g. 8,64")
    ap.add_argument("--kinds", default=env("SSB_SCALE_KINDS", "file,s3"), help="blob stores: file, s3")
    ap.add_argument("--restarts", type=int, default=int(env("SSB_SCALE_RESTARTS", "2")),
                    help="rounds of restarts with and without state (S3: one)")  # fmt: skip
    ap.add_argument("--trigger-s", type=float, default=float(env("SSB_SCALE_TRIGGER_S", "2")),
                    help="trigger interval while the state is built")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path(env("SSB_SCALE_OUT", "docs/scale-curve")),
                    help="writes OUT.json and OUT.png")  # fmt: skip
    ap.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one restore probe (probe_file)
    return ap.parse_args(argv)


@contextmanager
def _s3_server(kinds: list[str], root: Path) -> Iterator[Any]:
    """SeaweedFS on 127.0.0.1 if S3 is asked for, with the drivers' AWS_* environment pointing at it
    (so no secret is on any command line or in any Spark conf); stopped by pid, its data removed."""
    if "s3" not in kinds:
        yield None
        return
    from tests.servers.s3 import run_seaweedfs

    with run_seaweedfs(root / "server-logs", root / "seaweedfs") as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs every point of the curve, writes OUT.json (and OUT.png with matplotlib), returns the results."""
    args = _args(argv)
    # The drivers run in sessions of their own: turn SIGTERM into an exception, so the running one is
    # killed on the way out (spark_commit._run) and the work directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.probe:
        print(json.dumps(probe_file(json.loads(args.probe))))
        return {}
    sizes = [float(x) for x in args.sizes.split(",") if x]
    stores = [int(x) for x in args.stores.split(",") if x]
    kinds = [x for x in args.kinds.split(",") if x]
    if unknown := set(kinds) - {"file", "s3"}:
        raise SystemExit(f"unknown blob store kind(s) {sorted(unknown)}: file and s3 are measured")
    os.environ["SSB_BENCH_TRIGGER_S"] = f"{args.trigger_s:g}"
    os.environ.pop("SSB_BENCH_BLOB_URL", None)  # each config names its own store here
    results: dict[str, Any] = {
        "command": "python -m benchmarks.scale_curve " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{os.cpu_count()} cores, {_ram_gib():.0f} GiB RAM",
        "restore_repeats": REPEATS,
        "points": [],
    }
    evidence = Path(os.environ.get("SSB_BENCH_RESULTS", "bench-results")) / "scale_curve"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        tmp = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="ssb-scale-", dir=os.environ.get("SSB_BENCH_DIR"))
            )
        )
        server = stack.enter_context(_s3_server(kinds, tmp))
        for size in sizes:
            for n in stores:
                results["points"].append(run_point(tmp, size, n, kinds, args.restarts, evidence, server))
                _write(results, args.out)  # a point at a time: a run cut short keeps what it measured
    results["finished"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    _write(results, args.out)
    return results


def _write(results: dict[str, Any], out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    try:
        plot(results, out.with_suffix(".png"))
    except ModuleNotFoundError as e:
        print(f"no plot ({e}): install the bench extra, pip install -e '.[bench]'", file=sys.stderr)


def _ram_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB


if __name__ == "__main__":
    figures = main()
    for point in figures.get("points", []):
        print(f"== {point['size_gib']:g} GiB, {point['stores']:.0f} stores")
        for k, v in point.items():
            print(f"  {k:64} {v:14.3f}")
