"""Core-engine benchmarks on the local-directory store, each beside `cp -r` in the same run.

- backup and restore of a directory of 64 MiB files (default 2 GiB), ratio to `cp -r` (+ sync); the
  restore twice: by the local fast path (blob files hard-linked and verified) and by the download path
  every other store takes (chunks streamed, verified, written and fdatasynced);
- incremental backup of the unchanged directory;
- DirDiff of a 20,000-file tree against its own index;
- restore of 8 RocksDB-like store dirs (4 x 32 MiB SSTs + a small manifest each, about 1 GiB: the Spark
  benchmark's state) into empty dirs, one RestoreManager.restore per store as the sidecar runs them
  (4 at a time), from a local store on the destination's filesystem: per-store and total times.
Figures are printed and returned; nothing is asserted (speed targets live here, not in tests).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_statebackend.engine.backup import BackupConfig, BackupManager
from spark_statebackend.engine.diff import compute_diff
from spark_statebackend.engine.restore import RestoreManager
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.stores import LocalBlobStore

MiB = 1024 * 1024


class _DownloadOnly(LocalBlobStore):
    """The same blobs without local files: restore takes the download path, as from a remote store."""

    def local_path(self, blob_id: str) -> Path | None:
        return None


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def _sync() -> None:
    os.sync()


def bench_throughput(
    work: Path, total_mib: int = 2048, file_mib: int = 64, workers: int = 8
) -> dict[str, float]:
    src = work / "src"
    src.mkdir()
    block = os.urandom(MiB)
    for i in range(total_mib // file_mib):
        with open(src / f"{i:06d}.sst", "wb") as f:
            for j in range(file_mib):
                f.write(block[j:] + block[:j])  # distinct content per MiB, cheap to make
    _sync()
    nbytes = total_mib * MiB
    cp_s, _ = _timed(lambda: subprocess.run(["cp", "-r", str(src), str(work / "cp")], check=True))
    cp_sync_s, _ = _timed(_sync)
    shutil.rmtree(work / "cp")
    _sync()
    store = LocalBlobStore(work / "blobs", fsync=True)
    store.ensure_ready()
    with TransferPool(workers) as pool:
        manager = BackupManager(store, pool)
        backup_s, markers = _timed(lambda: manager.upload("cp-1", {"st": src}))
        manager.cleanup(markers)
        incr_s, _ = _timed(lambda: manager.upload("cp-2", {"st": src}))
        _sync()
        restore_s, _ = _timed(lambda: RestoreManager(store, pool).restore(markers["st"], work / "dst"))
        shutil.rmtree(work / "dst")
        _sync()
        streaming = _DownloadOnly(work / "blobs", fsync=True)
        download_s, _ = _timed(lambda: RestoreManager(streaming, pool).restore(markers["st"], work / "dst"))
    cp_total = cp_s + cp_sync_s
    return {
        "bytes": nbytes,
        "cp_r_seconds": cp_s,
        "cp_r_plus_sync_seconds": cp_total,
        "backup_seconds": backup_s,
        "restore_seconds": restore_s,
        "backup_mib_s": nbytes / MiB / backup_s,
        "restore_mib_s": nbytes / MiB / restore_s,
        "restore_download_path_seconds": download_s,
        "restore_download_path_mib_s": nbytes / MiB / download_s,
        "cp_r_mib_s": nbytes / MiB / cp_s,
        "cp_r_plus_sync_mib_s": nbytes / MiB / cp_total,
        "restore_vs_cp_r": cp_s / restore_s,
        "restore_vs_cp_r_plus_sync": cp_total / restore_s,
        "restore_download_path_vs_cp_r_plus_sync": cp_total / download_s,
        "incremental_unchanged_seconds": incr_s,
    }


def bench_diff(work: Path, files: int = 20_000) -> dict[str, float]:
    root = work / "many"
    for i in range(files):
        d = root / f"d{i % 100:03d}"
        if i < 100:
            d.mkdir(parents=True)
        (d / f"f{i:06d}").write_bytes(b"x" * (i % 512))
    store = LocalBlobStore(work / "blobs-diff", fsync=False)
    store.ensure_ready()
    with TransferPool(8) as pool:
        manager = BackupManager(store, pool, config=BackupConfig())
        manager.upload("cp-1", {"st": root})
        prev = manager._prev["st"][1].dir_index  # the diff base the next upload would use
    diff_s, diff = _timed(lambda: compute_diff(root, prev))
    assert diff.stats().files_retained == files
    return {"diff_files": files, "diff_seconds": diff_s}


def bench_store_restore(work: Path, stores: int = 8, files: int = 4, file_mib: int = 32) -> dict[str, float]:
    """Restore `stores` dirs of `files` x `file_mib` MiB SSTs each, 4 stores at a time on one pool (the
    sidecar's restore pool and transfer pool), page cache warm as in the Spark benchmark."""
    from concurrent.futures import ThreadPoolExecutor

    root = work / "stores"
    block = os.urandom(MiB)
    for s in range(stores):
        d = root / f"0/{s}/default"
        (d / "SSTs").mkdir(parents=True)
        for i in range(files):
            with open(d / "SSTs" / f"{s * files + i:06d}-{os.urandom(8).hex()}.sst", "wb") as f:
                for j in range(file_mib):
                    f.write(block[j + s :] + block[: j + s])
        (d / "1.zip").write_bytes(os.urandom(20_000))
    store = LocalBlobStore(work / "blobs-stores", fsync=True)
    store.ensure_ready()
    with TransferPool(8) as pool, ThreadPoolExecutor(4) as restorers:
        manager = BackupManager(store, pool)
        dirs = {f"0/{s}/default": root / f"0/{s}/default" for s in range(stores)}
        markers = manager.upload("cp-1", dirs)
        manager.cleanup(markers)
        _sync()
        rm = RestoreManager(store, pool)

        def one(key: str) -> float:
            return rm.restore(markers[key], work / "restored" / key).seconds

        total_s, per_store = _timed(lambda: list(restorers.map(one, sorted(markers))))
    return {
        "store_restore_stores": stores,
        "store_restore_bytes": stores * files * file_mib * MiB,
        "store_restore_total_seconds": total_s,
        "store_restore_sum_seconds": sum(per_store),
        "store_restore_max_seconds": max(per_store),
    }


def main(total_mib: int = 2048) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ssb-bench-", dir=os.environ.get("SSB_BENCH_DIR")) as tmp:
        work = Path(tmp)
        results = bench_throughput(work, total_mib=total_mib)
        results.update(bench_diff(work))
        results.update(bench_store_restore(work))
    return results


if __name__ == "__main__":
    import sys

    for k, v in main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048).items():
        print(f"{k:32} {v:12.3f}")
