"""Restore throughput from real local servers, beside the best raw parallel download of the same bytes.

For Azurite and SeaweedFS, started here on 127.0.0.1 (as the tests do) and stopped by pid:
  [1] back up a directory of 64 MiB files (default 1 GiB) with BackupManager (upload figure too);
  [2] restore it with RestoreManager (checksums verified while writing, files fsynced);
  [3] download the very same blobs with the same SDK, tuned for speed, into files that are then
      fsynced too: Azure `download_blob(max_concurrency=N).readinto(file)`, S3 boto3's transfer
      manager `download_fileobj` with TransferConfig(max_concurrency=N, 8 MiB parts), each both blob
      after blob and several blobs at once; the best of these is "raw".
The figure of merit is restore MiB/s / raw MiB/s (goal >= 0.9). Every measurement is repeated and
the best run kept, for ours and for raw alike. Nothing is asserted here; figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spark_statebackend.engine.backup import BackupManager
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import BlobStore, open_blob_store
from tests.servers.azurite import run_azurite
from tests.servers.s3 import run_moto, run_seaweedfs

MiB = 1024 * 1024
WORKERS = 8  # restore pool, store max_concurrency and the raw downloads' concurrency alike
REPEATS = 2


def _make_source(root: Path, total_mib: int, file_mib: int = 64) -> Path:
    root.mkdir(parents=True)
    block = os.urandom(MiB)
    for i in range(total_mib // file_mib):
        with open(root / f"{i:06d}.sst", "wb") as f:
            for j in range(file_mib):
                f.write(block[j:] + block[:j])
    return root


def _best(fn: Callable[[], Any], cleanup: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        cleanup()
        os.sync()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    cleanup()
    return best


def _fsync_all(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _bench_store(
    label: str,
    store: BlobStore,
    work: Path,
    src: Path,
    raw_variants: dict[str, Callable[[list[tuple[str, int]], Path], None]],
) -> dict[str, float]:
    nbytes = sum(p.stat().st_size for p in src.iterdir())
    dst, raw_dir = work / f"{label}-dst", work / f"{label}-raw"

    def clear() -> None:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.rmtree(raw_dir, ignore_errors=True)

    with TransferPool(WORKERS, name=f"bench-{label}") as pool:
        t0 = time.perf_counter()
        markers = BackupManager(store, pool).upload("cp-1", {"st": src})
        upload_s = time.perf_counter() - t0
        index = load_snapshot_index(store, markers["st"])
        blobs = [(b.blob_id, b.size) for _, f in index.dir_index.walk_files() for b in f.blobs]
        restore_s = _best(lambda: RestoreManager(store, pool).restore(markers["st"], dst), clear)
    out = {
        f"{label}_bytes": float(nbytes),
        f"{label}_upload_mib_s": nbytes / MiB / upload_s,
        f"{label}_restore_mib_s": nbytes / MiB / restore_s,
    }
    best_raw = 0.0
    for name, download in raw_variants.items():

        def run(download: Callable[[list[tuple[str, int]], Path], None] = download) -> None:
            raw_dir.mkdir()
            download(blobs, raw_dir)
            _fsync_all(list(raw_dir.iterdir()))

        seconds = _best(run, clear)
        out[f"{label}_raw_{name}_mib_s"] = nbytes / MiB / seconds
        best_raw = max(best_raw, nbytes / MiB / seconds)
    out[f"{label}_raw_best_mib_s"] = best_raw
    out[f"{label}_restore_vs_raw"] = out[f"{label}_restore_mib_s"] / best_raw
    return out


def _in_parallel(
    fn: Callable[[str, int, Path], None], workers: int
) -> Callable[[list[tuple[str, int]], Path], None]:
    def run(blobs: list[tuple[str, int]], dest: Path) -> None:
        with ThreadPoolExecutor(workers, thread_name_prefix="bench-raw") as ex:
            list(ex.map(lambda b: fn(b[0], b[1], dest), blobs))

    return run


def _sequential(fn: Callable[[str, int, Path], None]) -> Callable[[list[tuple[str, int]], Path], None]:
    def run(blobs: list[tuple[str, int]], dest: Path) -> None:
        for blob_id, size in blobs:
            fn(blob_id, size, dest)

    return run


def _out(dest: Path, blob_id: str) -> Path:
    return dest / blob_id.replace("/", "_")


def bench_azurite(work: Path, src: Path, log_dir: Path) -> dict[str, float]:
    from azure.storage.blob import BlobServiceClient

    with run_azurite(log_dir) as az:
        cs = az.connection_string()
        store = open_blob_store(
            "azure://bench/restore", {"connection_string": cs, "max_concurrency": str(WORKERS)}
        )
        store.ensure_ready()
        # The SDK's defaults (4 MiB chunks after a 32 MiB first GET, 10 pooled connections), and the
        # SDK tuned like our store (8 MiB GETs, a connection per worker): raw is the best of them.
        import requests
        from requests.adapters import HTTPAdapter

        session = requests.Session()
        session.mount("http://", HTTPAdapter(pool_maxsize=WORKERS * 2 + 4))
        default = BlobServiceClient.from_connection_string(cs).get_container_client("bench")
        client = BlobServiceClient.from_connection_string(
            cs, session=session, max_single_get_size=8 * MiB, max_chunk_get_size=8 * MiB
        ).get_container_client("bench")

        def one(conc: int, c: Any = client) -> Callable[[str, int, Path], None]:
            def dl(blob_id: str, size: int, dest: Path) -> None:
                with open(_out(dest, blob_id), "wb") as f:
                    c.get_blob_client("restore/" + blob_id).download_blob(max_concurrency=conc).readinto(f)

            return dl

        try:
            return _bench_store(
                "azurite",
                store,
                work,
                src,
                {
                    f"sdk_defaults_max_concurrency_{WORKERS}_sequential": _sequential(one(WORKERS, default)),
                    f"download_blob_max_concurrency_{WORKERS}_sequential": _sequential(one(WORKERS)),
                    f"download_blob_{WORKERS}_blobs_at_once": _in_parallel(one(1), WORKERS),
                    f"download_blob_max_concurrency_2_x_{WORKERS // 2}_blobs": _in_parallel(
                        one(2), WORKERS // 2
                    ),
                },
            )
        finally:
            store.close()
            client.close()
            default.close()


def s3_client(server: Any) -> Any:
    """A boto3 client of `server` (tests/servers/s3.py) with a connection per raw download thread."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint(),
        region_name="us-east-1",
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=Config(max_pool_connections=WORKERS * 2 + 4),
    )


def s3_raw_variants(
    client: Any, bucket: str, key_prefix: str
) -> dict[str, Callable[[list[tuple[str, int]], Path], None]]:
    """The raw downloads of blobs `<key_prefix><blob id>` of `bucket` to race against our restore: boto3's
    transfer manager (8 MiB parts) blob after blob, several blobs at once, and in between."""
    from boto3.s3.transfer import TransferConfig

    def one(conc: int) -> Callable[[str, int, Path], None]:
        cfg = TransferConfig(max_concurrency=conc, multipart_chunksize=8 * MiB, multipart_threshold=8 * MiB)

        def dl(blob_id: str, size: int, dest: Path) -> None:
            with open(_out(dest, blob_id), "wb") as f:
                client.download_fileobj(bucket, key_prefix + blob_id, f, Config=cfg)

        return dl

    return {
        f"transfer_manager_max_concurrency_{WORKERS}_sequential": _sequential(one(WORKERS)),
        f"transfer_manager_{WORKERS}_blobs_at_once": _in_parallel(one(1), WORKERS),
        f"transfer_manager_max_concurrency_2_x_{WORKERS // 2}_blobs": _in_parallel(one(2), WORKERS // 2),
    }


def _bench_s3(label: str, server: Any, work: Path, src: Path) -> dict[str, float]:
    opts = {**server.options(), "max_concurrency": str(WORKERS)}
    store = open_blob_store("s3://bench/restore", opts)
    store.ensure_ready()
    client = s3_client(server)
    try:
        return _bench_store(label, store, work, src, s3_raw_variants(client, "bench", "restore/"))
    finally:
        store.close()
        client.close()


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ssb-cloud-bench-", dir=os.environ.get("SSB_BENCH_DIR")) as tmp:
        yield Path(tmp)


def main(
    total_mib: int | None = None, services: tuple[str, ...] = ("azurite", "seaweedfs")
) -> dict[str, float]:
    """Run the benchmark (1 GiB unless SSB_CLOUD_BENCH_MIB says otherwise) and return its figures."""
    total = total_mib or int(os.environ.get("SSB_CLOUD_BENCH_MIB", "1024"))
    results: dict[str, float] = {}
    with _workdir() as work:
        src = _make_source(work / "src", total)
        logs = work / "logs"
        if "azurite" in services:
            results.update(bench_azurite(work, src, logs))
        if "seaweedfs" in services:
            with run_seaweedfs(logs, work / "seaweedfs") as server:
                results.update(_bench_s3("seaweedfs", server, work, src))
        if "moto" in services:
            with run_moto(logs) as server:
                results.update(_bench_s3("moto", server, work, src))
    return results


if __name__ == "__main__":
    import sys

    for k, v in main(int(sys.argv[1]) if len(sys.argv) > 1 else None).items():
        print(f"{k:64} {v:12.3f}")
