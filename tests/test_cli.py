"""The spark-statebackend snapshot commands, run as a user would (a real subprocess for one path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from spark_statebackend.cli import main

from .trees import make_tree, read_tree


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_backup_incremental_restore_verify_snapshots(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a.sst": os.urandom(300_000), "b": b"small", "d": {"e": b""}})
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1", "--chunk-size", "64KiB")
    assert code == 0, err
    first = out.strip().splitlines()[-1]
    assert first.startswith("indexes/cli/s1/") and "uploaded 3 file(s)" in err
    (src / "b").write_bytes(b"changed")
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1")
    second = out.strip().splitlines()[-1]
    assert code == 0 and second != first and "uploaded 1 file(s)" in err and "retained 2" in err

    code, out, _ = run("snapshots", "--blob-url", url)
    assert code == 0 and second in out and first not in out  # the CLI cleans up the replaced snapshot
    code, out, _ = run("snapshots", "--blob-url", url, "--store", "other")
    assert code == 0 and out.strip() == "no snapshots"

    code, out, err = run("restore", second, "--blob-url", url, "--dest", str(tmp_path / "dst"))
    assert code == 0, err
    assert read_tree(tmp_path / "dst") == read_tree(src)
    code, out, _ = run("restore", second, "--blob-url", url, "--dest", str(tmp_path / "dst"))
    assert "nothing downloaded" in out

    code, out, _ = run("verify", second, "--blob-url", url)
    assert code == 0 and out.startswith("ok: 3 file(s)")


def test_verify_reports_corruption_with_nonzero_exit(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"hello world"})
    _, out, _ = run("backup", str(src), "--blob-url", url, "--store", "s")
    snap = out.strip().splitlines()[-1]
    blob = next((tmp_path / "blobs" / "blobs" / "files").rglob("*"))
    while blob.is_dir():
        blob = next(blob.iterdir())
    blob.write_bytes(b"hellO world")
    code, _, err = run("verify", snap, "--blob-url", url)
    assert code == 1 and "checksum mismatch for a" in err
    code, _, err = run("restore", snap, "--blob-url", url, "--dest", str(tmp_path / "d"))
    assert code == 1 and err.startswith("error: checksum mismatch for a")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    code, _, err = run("backup", str(tmp_path), "--blob-url", "ftp://x/y", "--store", "s")
    assert code == 1 and "unknown blob store URL scheme 'ftp'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(
        "restore", "indexes/none.json", "--blob-url", (tmp_path / "b").as_uri(), "--dest", str(tmp_path / "d")
    )
    assert code == 1 and "blob 'indexes/none.json' not found" in err
    code, _, err = run("backup", str(tmp_path), "--blob-url", (tmp_path / "b").as_uri(), "--store", "../x")
    assert code == 2 and "--store" in err
    code, _, err = run(
        "restore", "../../etc/passwd", "--blob-url", (tmp_path / "b").as_uri(), "--dest", str(tmp_path / "d")
    )
    assert code == 1 and "segment" in err


def test_console_script_with_debug_shows_traceback(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "spark-statebackend"
    proc = subprocess.run(
        [str(exe), "--debug", "verify", "x.json", "--blob-url", "file:relative"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "absolute path" in proc.stderr
