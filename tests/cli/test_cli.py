"""The spark-statebackend snapshot commands, run as a user would (a real subprocess for one path):
history kept until forget + gc, short ids and `latest`, JSON output, exit codes, the restore
destination guard, read-only commands that create nothing, progress bars."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from spark_statebackend import __version__
from spark_statebackend.cli import main
from spark_statebackend.cli.snapshots import RESTORE_MARKER_SUFFIX
from spark_statebackend.common.units import format_size
from spark_statebackend.engine.blobs import load_snapshot_index
from spark_statebackend.stores import LocalBlobStore
from tests.trees import make_tree, read_tree


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def backup(url: str, src: Path, store: str = "s1", *extra: str) -> str:
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", store, *extra)
    assert code == 0, err
    return out.strip().splitlines()[-1]


def short(blob_id: str) -> str:
    return hashlib.sha256(blob_id.encode()).hexdigest()[:8]


def store_at(url: str) -> LocalBlobStore:
    return LocalBlobStore(Path(url.removeprefix("file://")), fsync=False)


def blobs(url: str) -> set[str]:
    return {b.blob_id for b in store_at(url).list("")}


def test_backup_incremental_restore_verify_snapshots(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a.sst": os.urandom(300_000), "b": b"small", "d": {"e": b""}})
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1", "--chunk-size", "64KiB")
    assert code == 0, err
    first = out.strip().splitlines()[-1]
    assert first.startswith("indexes/cli/s1/") and "uploaded 3 file(s)" in err and short(first) in err
    (src / "b").write_bytes(b"changed")
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1")
    second = out.strip().splitlines()[-1]
    assert code == 0 and second != first and "uploaded 1 file(s)" in err and "retained 2" in err

    code, out, _ = run("snapshots", "--blob-url", url)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["id", "created", "(UTC)", "query", "store", "files", "size"]
    assert [ln.split()[0] for ln in lines[1:3]] == [short(first), short(second)]  # oldest first
    assert lines[1].split()[3:6] == ["cli", "s1", "3"] and lines[1].endswith(format_size(300_005))
    assert lines[-1] == "2 snapshot(s)"
    code, out, _ = run("snapshots", "--blob-url", url, "--store", "other")
    assert code == 0 and out.strip() == "no snapshots"

    code, out, err = run("restore", second, "--blob-url", url, "--dest", str(tmp_path / "dst"))
    assert code == 0, err
    assert read_tree(tmp_path / "dst") == read_tree(src)
    code, out, _ = run("restore", second, "--blob-url", url, "--dest", str(tmp_path / "dst"))
    assert "nothing downloaded" in out

    code, out, _ = run("verify", second, "--blob-url", url)
    assert code == 0 and out.startswith(f"ok: snapshot {short(second)}: 3 file(s)")


def test_second_backup_keeps_the_first_until_forget_and_gc(tmp_path: Path) -> None:
    """Issue 11 item 2: a second backup used to delete the first snapshot (the CLI ran the
    post-checkpoint cleanup), so an id printed earlier no longer restored."""
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(
        tmp_path / "src",
        {"keep.sst": os.urandom(50_000), "gone.sst": os.urandom(40_000), "CURRENT": b"v1", "d": {}},
    )
    v1 = read_tree(src)
    first = backup(url, src)
    (src / "gone.sst").unlink()
    (src / "new.sst").write_bytes(os.urandom(30_000))
    (src / "CURRENT").write_bytes(b"v2")
    v2 = read_tree(src)
    second = backup(url, src)

    for snap, expected in ((first, v1), (second, v2)):
        dest = tmp_path / f"restore-{short(snap)}"
        code, _, err = run("restore", short(snap), "--blob-url", url, "--dest", str(dest))
        assert code == 0, err
        assert read_tree(dest) == expected  # byte-identical, modes included
    code, out, _ = run("snapshots", "--blob-url", url, "--json")
    listed = [orjson.loads(line) for line in out.splitlines()]
    assert [s["blob_id"] for s in listed] == [first, second]

    store = store_at(url)
    idx1, idx2 = load_snapshot_index(store, first), load_snapshot_index(store, second)
    only_first = ({first} | set(idx1.dir_index.present_blob_ids())) - set(idx2.dir_index.present_blob_ids())
    assert len(only_first) == 3  # its index, gone.sst and the old CURRENT
    before = blobs(url)

    code, out, _ = run("forget", "--blob-url", url, "--keep-last", "1", "--dry-run")
    assert code == 0 and f"would remove {short(first)}" in out and blobs(url) == before
    code, out, _ = run("forget", "--blob-url", url, "--keep-last", "1")
    assert code == 0 and f"removed {short(first)}" in out and "kept 1 snapshot(s), removed 1" in out
    assert blobs(url) == before - {first}  # forget removes the index only; gc does the rest
    code, out, _ = run("gc", "--blob-url", url, "--grace", "0", "--dry-run")
    assert code == 0
    assert {ln.split()[-1] for ln in out.splitlines() if ln.startswith("would delete")} == only_first - {
        first
    }
    code, out, err = run("gc", "--blob-url", url, "--grace", "0")
    assert code == 0, err
    assert blobs(url) == before - only_first
    dest = tmp_path / "after-gc"
    code, _, err = run("restore", "latest", "--blob-url", url, "--dest", str(dest))
    assert code == 0, err
    assert read_tree(dest) == v2
    code, out, _ = run("verify", second, "--blob-url", url)
    assert code == 0, out
    code, _, err = run("restore", first, "--blob-url", url, "--dest", str(tmp_path / "x"))
    assert code == 1 and f"blob '{first}' not found" in err


def test_gc_keeps_young_blobs_and_a_running_backup(tmp_path: Path) -> None:
    """A forgotten snapshot's blobs younger than the grace stay (a backup may still be writing)."""
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"one"})
    backup(url, src)
    (src / "a").write_bytes(b"two")
    backup(url, src)
    assert run("forget", "--blob-url", url, "--keep-last", "1")[0] == 0
    before = blobs(url)
    code, out, _ = run("gc", "--blob-url", url, "--json")  # default grace: 6h
    report = orjson.loads(out)
    assert code == 0 and report["deleted"] == 0 and report["kept_for_grace"] == 1
    assert blobs(url) == before


def test_forget_keep_within_ids_and_refusals(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"0"})
    ids = []
    for i in range(4):
        (src / "a").write_bytes(str(i).encode())
        ids.append(backup(url, src, "s1"))
    other = backup(url, src, "s2")
    code, out, _ = run("forget", "--blob-url", url, "--keep-within", "1h", "--dry-run", "--json")
    plan = orjson.loads(out)
    assert code == 0 and plan["remove"] == [] and len(plan["keep"]) == 5  # all within an hour
    code, out, _ = run("forget", "--blob-url", url, "--keep-last", "2", "--store", "s1", "--json")
    plan = orjson.loads(out)
    assert code == 0 and [s["blob_id"] for s in plan["remove"]] == ids[:2]
    assert {s["blob_id"] for s in plan["keep"]} == set(ids[2:])  # s2 untouched by --store s1
    code, out, _ = run("forget", ids[2], "--blob-url", url)
    assert code == 0 and f"removed {short(ids[2])}" in out
    code, out, _ = run("snapshots", "--blob-url", url, "--json")
    assert [orjson.loads(ln)["blob_id"] for ln in out.splitlines()] == [ids[3], other]
    code, _, err = run("forget", "--blob-url", url)
    assert code == 2 and "give --keep-last N, --keep-within DURATION or snapshot ids" in err
    code, _, err = run("forget", "--blob-url", url, "--keep-within", "1.5h")
    assert code == 2 and "--keep-within" in err and "fractions" in err
    code, _, err = run("forget", "--blob-url", url, "--keep-last", "0")
    assert code == 2 and "--keep-last" in err
    # A Spark query's snapshots follow retainCheckpoints: forget refuses them.
    spark_index = "indexes/3f2504e0-4f89-11d3-9a0c-0305e82c3301/0/0/default/00000000000001-00000000.json"
    store_at(url).put_bytes(spark_index, b"{}")
    code, _, err = run("forget", spark_index, "--blob-url", url)
    assert code == 2 and "belongs to Spark query 3f2504e0" in err and store_at(url).exists(spark_index)


def _colliding_names(n: int = 2) -> list[str]:
    """Snapshot blob ids whose ids share their first 4 hex digits (found by trying names)."""
    seen: dict[str, list[str]] = {}
    for i in itertools.count():
        blob_id = f"indexes/cli/s9/{i:020d}-0000abcd.json"
        group = seen.setdefault(short(blob_id)[:4], [])
        group.append(blob_id)
        if len(group) == n:
            return group
    raise AssertionError("unreachable")


def test_short_ids_latest_and_ambiguity(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"x"})
    s1 = backup(url, src, "s1")
    s2 = backup(url, src, "s2")
    code, out, _ = run("verify", short(s1)[:4], "--blob-url", url)  # a 4-digit prefix is enough
    assert code == 0 and short(s1) in out
    code, out, _ = run("verify", "latest", "--blob-url", url, "--store", "s2")
    assert code == 0 and short(s2) in out
    code, _, err = run("verify", "latest", "--blob-url", url)
    assert code == 2 and "'latest' is ambiguous: 2 stores have snapshots (s1, s2)" in err
    code, _, err = run("verify", "latest", "--blob-url", url, "--store", "nope")
    assert code == 1 and "no snapshots of store nope" in err
    code, _, err = run("verify", "abc", "--blob-url", url)
    assert code == 2 and "at least 4 hex digits" in err
    unused = next(p for p in ("0000", "1111", "2222") if not any(short(s).startswith(p) for s in (s1, s2)))
    code, _, err = run("verify", unused, "--blob-url", url)
    assert code == 1 and f"no snapshot id starts with {unused}" in err
    a, b = _colliding_names()
    for blob_id in (a, b):
        store_at(url).put_bytes(blob_id, b"{}")  # resolving reads names only
    code, _, err = run("restore", short(a)[:4], "--blob-url", url, "--dest", str(tmp_path / "d"))
    assert code == 2 and f"snapshot id prefix '{short(a)[:4]}' is ambiguous: it matches 2" in err
    assert short(a) in err and short(b) in err and not (tmp_path / "d").exists()


def test_restore_refuses_a_non_empty_destination_it_did_not_make(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a.sst": b"state", "CURRENT": b"1"})
    snap = backup(url, src)
    unrelated = make_tree(tmp_path / "home", {"thesis.tex": b"years of work"})
    code, _, err = run("restore", snap, "--blob-url", url, "--dest", str(unrelated))
    assert code == 1 and "is not empty and is not a previous restore of store s1" in err
    assert "--force" in err and read_tree(unrelated) == {"thesis.tex": (b"years of work", 0o644)}
    # A previous restore of the same store may be replaced (that is what restore is for) ...
    dest = tmp_path / "state"
    assert run("restore", snap, "--blob-url", url, "--dest", str(dest))[0] == 0
    (dest / "LOCK").write_bytes(b"")  # the store ran on
    code, _, err = run("restore", snap, "--blob-url", url, "--dest", str(dest))
    assert code == 0, err
    assert read_tree(dest) == read_tree(src)
    # ... but not by another store's snapshot.
    other = backup(url, make_tree(tmp_path / "src2", {"x": b"y"}), "s2")
    code, _, err = run("restore", other, "--blob-url", url, "--dest", str(dest))
    assert code == 1 and "not a previous restore of store s2" in err and read_tree(dest) == read_tree(src)
    # --force replaces anything.
    code, _, err = run("restore", snap, "--blob-url", url, "--dest", str(unrelated), "--force")
    assert code == 0, err
    assert read_tree(unrelated) == read_tree(src)
    code, _, err = run("restore", snap, "--blob-url", url, "--dest", str(src / "a.sst"))
    assert code == 2 and "is a file" in err


BIG = 2 * 1024 * 1024  # above smallFileBytes (1 MiB): not checksummed by the size-only diff


def rewrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes of `path` through its inode (same size, same inode), then put its atime and
    mtime back as a tool that preserves timestamps would: only ctime tells."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_ino == st.st_ino


def test_backup_finds_a_large_file_changed_in_place_at_the_same_size(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"data.bin": os.urandom(BIG), "small": b"s"})
    first = backup(url, src)
    rewrite_in_place(src / "data.bin", BIG // 2, b"changed in place")
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1", "--json")
    assert code == 0, err
    assert (orjson.loads(out)["files_uploaded"], orjson.loads(out)["files_retained"]) == (1, 1)
    code, _, err = run("restore", "latest", "--blob-url", url, "--dest", str(tmp_path / "dst"))
    assert code == 0, err
    assert read_tree(tmp_path / "dst") == read_tree(src)
    # The first snapshot still holds the old bytes (nothing was written through its blobs).
    assert run("restore", first, "--blob-url", url, "--dest", str(tmp_path / "old"))[0] == 0
    assert (tmp_path / "old" / "data.bin").read_bytes() != (src / "data.bin").read_bytes()


def test_backup_of_a_restored_directory_uploads_nothing(tmp_path: Path) -> None:
    # Restored files have new inodes and ctimes: read once, found unchanged, recorded as they are.
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"data.bin": os.urandom(BIG), "d": {"small": b"s"}})
    backup(url, src)
    assert run("restore", "latest", "--blob-url", url, "--dest", str(tmp_path / "dst"))[0] == 0
    for _ in range(2):
        code, out, err = run("backup", str(tmp_path / "dst"), "--blob-url", url, "--store", "s1", "--json")
        assert code == 0, err
        assert (orjson.loads(out)["files_uploaded"], orjson.loads(out)["files_retained"]) == (0, 2)
    index = load_snapshot_index(store_at(url), orjson.loads(out)["blob_id"])
    (big,) = (f for f in index.dir_index.files_present if f.name == "data.bin")
    assert big.metadata.inode == os.stat(tmp_path / "dst" / "data.bin").st_ino


def test_backup_reread_reads_files_whose_stat_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change that keeps size, mtime, ctime and inode (a filesystem with coarse timestamps, a
    rewrite within one tick) is found only by reading: --reread does."""
    import spark_statebackend.engine.diff as diff_mod

    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"data.bin": os.urandom(BIG)})
    backup(url, src)
    rewrite_in_place(src / "data.bin", 0, b"same stat")
    monkeypatch.setattr(diff_mod, "same_stat", lambda local, recorded: True)  # the tick that hides it
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1", "--json")
    assert code == 0 and orjson.loads(out)["files_uploaded"] == 0, err
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1", "--json", "--reread")
    assert code == 0 and orjson.loads(out)["files_uploaded"] == 1, err


def test_restore_repairs_a_file_damaged_in_place_at_the_same_size(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"data.bin": os.urandom(BIG), "CURRENT": b"MANIFEST-1\n"})
    backup(url, src)
    dest = tmp_path / "dst"
    assert run("restore", "latest", "--blob-url", url, "--dest", str(dest))[0] == 0
    rewrite_in_place(dest / "data.bin", BIG - 4, b"rot!")
    code, out, err = run("restore", "latest", "--blob-url", url, "--dest", str(dest), "--json")
    assert code == 0, err
    result = orjson.loads(out)
    assert result["skipped"] is False and (result["files_downloaded"], result["files_reused"]) == (1, 1)
    assert read_tree(dest) == read_tree(src)
    code, out, _ = run("restore", "latest", "--blob-url", url, "--dest", str(dest))
    assert code == 0 and "already holds snapshot" in out  # now it does
    # Without the marker of a previous restore, a damaged copy is not taken for the snapshot either.
    (tmp_path / f".dst{RESTORE_MARKER_SUFFIX}").unlink()
    rewrite_in_place(dest / "data.bin", 0, b"rot!")
    code, _, err = run("restore", "latest", "--blob-url", url, "--dest", str(dest))
    assert code == 1 and "is not empty and is not a previous restore" in err


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (
            ["backup", "{tmp}", "--store", "s", "--blob-url", "s3://AKIDNOTREAL:{secret}@bucket/p"],
            "s3://***@",
        ),
        (["snapshots", "--blob-url", "file://me:{secret}@/srv/blobs"], "file://***@/srv/blobs"),
        (
            ["checkpoints", "--log", "kafka://me:{secret}@broker:9092/t", "--query", "q"],
            "kafka://***@broker:9092/t",
        ),
    ],
    ids=["backup", "snapshots", "checkpoints"],
)
def test_credentials_in_a_url_are_a_usage_error_that_does_not_repeat_them(
    tmp_path: Path, argv: list[str], shown: str
) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSECRETKEY"
    code, out, err = run(*(a.format(tmp=tmp_path, secret=secret) for a in argv))
    assert code == 2 and shown in err and "credentials" in err, err
    assert secret not in out + err and "K7MDENG" not in out + err and "AKIDNOTREAL" not in out + err
    assert os.listdir(tmp_path) == []  # nothing created, nothing written


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshots"],
        ["verify", "latest"],
        ["restore", "latest", "--dest", "{tmp}/dest"],
        ["forget", "--keep-last", "1", "--dry-run"],
        ["forget", "--keep-last", "1"],
        ["gc", "--dry-run"],
        ["gc"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_read_only_commands_on_a_missing_store_fail_and_create_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    missing = tmp_path / "typo" / "blobs"
    args = [a.format(tmp=tmp_path) for a in argv]
    code, _, err = run(*args, "--blob-url", missing.as_uri())
    assert code == 1
    assert err == f"error: --blob-url: no blob store at {missing.as_uri()}: {missing} is not a directory " + (
        "(this command creates nothing; check the URL)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_read_only_commands_on_a_missing_log_fail_and_create_nothing(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    backup(url, make_tree(tmp_path / "src", {"a": b"x"}))
    missing = tmp_path / "no-such-log"
    code, _, err = run("gc", "--blob-url", url, "--log", missing.as_uri(), "--dry-run")
    assert code == 1 and f"--log: no checkpoint log at {missing.as_uri()}" in err
    code, _, err = run("checkpoints", "--log", missing.as_uri(), "--query", "q1")
    assert code == 1 and f"--log: no checkpoint log at {missing.as_uri()}" in err
    assert not missing.exists()


def test_json_everywhere(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"hello", "b": b"world!"})
    code, out, err = run("backup", str(src), "--blob-url", url, "--store", "s1", "--json")
    made = orjson.loads(out)
    assert code == 0 and err == "" and made["files_uploaded"] == 2 and made["bytes_uploaded"] == 11
    assert made["snapshot_id"] == short(made["blob_id"])
    code, out, _ = run("snapshots", "--blob-url", url, "--json")
    (row,) = [orjson.loads(line) for line in out.splitlines()]
    assert (row["snapshot_id"], row["store"], row["files"], row["bytes"]) == (
        made["snapshot_id"],
        "s1",
        2,
        11,
    )
    code, out, _ = run("verify", "latest", "--blob-url", url, "--json")
    assert orjson.loads(out) == {
        "snapshot_id": made["snapshot_id"],
        "blob_id": made["blob_id"],
        "ok": True,
        "files": 2,
        "blobs": 2,
        "bytes": 11,
        "problems": [],
    }
    code, out, _ = run("restore", "latest", "--blob-url", url, "--dest", str(tmp_path / "d"), "--json")
    assert orjson.loads(out)["files_downloaded"] == 2
    code, out, _ = run("gc", "--blob-url", url, "--dry-run", "--grace", "0", "--json")
    report = orjson.loads(out)
    assert code == 0 and report["dry_run"] is True and report["garbage"] == [] and report["referenced"] == 3
    code, out, _ = run("snapshots", "--blob-url", url, "--store", "none", "--json")
    assert code == 0 and out == ""  # an empty listing is no lines, not prose


def test_exit_codes(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"hello world"})
    snap = backup(url, src)
    usage = [
        ["backup", str(src), "--blob-url", url, "--store", "s", "--ttl", "3600"],  # no unit
        ["backup", str(src), "--blob-url", url, "--store", "s", "--chunk-size", "1.5m"],
        ["backup", str(src), "--blob-url", url, "--store", "../x"],
        ["backup", str(src), "--blob-url", "ftp://x/y", "--store", "s"],
        ["backup", str(src), "--blob-url", url, "--store", "s", "--option", "fsnyc=false"],
        ["gc", "--blob-url", url, "--grace", "6 hours"],
        ["gc", "--blob-url", url, "--log-option", "timeout=5s"],
        ["verify", "../../etc/passwd", "--blob-url", url],
        ["verify", "indexes/none.json", "--blob-url", url],
        ["snapshots", "--blob-url", url, "--query", "a/b"],
        ["snapshots", "--no-such-flag"],
    ]
    for argv in usage:
        code, _, err = run(*argv)
        assert code == 2, (argv, err)
    code, _, err = run("backup", str(src), "--blob-url", url, "--store", "s", "--ttl", "3600")
    assert err.strip() == "error: --ttl: '3600' has no unit; write e.g. 3600s or 3600ms " + (
        "(a bare number means seconds to some readers and milliseconds to others, so a unit is required)"
    )
    code, _, err = run("verify", "indexes/cli/s1/missing-00000000.json", "--blob-url", url)
    assert code == 3 and "not found" in err  # verify reports a missing index as a problem
    code, _, err = run(
        "restore", "indexes/cli/s1/missing-00000000.json", "--blob-url", url, "--dest", str(tmp_path / "d")
    )
    assert code == 1 and "blob 'indexes/cli/s1/missing-00000000.json' not found" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"spark-statebackend, version {__version__}"
    assert run("verify", snap, "--blob-url", url)[0] == 0


def test_verify_reports_corruption_with_exit_3(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"hello world"})
    snap = backup(url, src)
    blob = next(p for p in (tmp_path / "blobs" / "blobs" / "files").rglob("*") if p.is_file())
    blob.write_bytes(b"hellO world")
    code, _, err = run("verify", snap, "--blob-url", url)
    assert (
        code == 3 and "checksum mismatch for a" in err and f"snapshot {short(snap)} has 1 problem(s)" in err
    )
    code, _, err = run("restore", snap, "--blob-url", url, "--dest", str(tmp_path / "d"))
    assert code == 1 and err.startswith("error: checksum mismatch for a")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_progress_bars_on_verify_and_gc_only_when_asked_and_never_with_json_or_quiet(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    snap = backup(url, make_tree(tmp_path / "src", {"a": os.urandom(100_000), "b": b"x"}))
    # CliRunner's stderr is not a terminal: no bar unless forced with --progress.
    assert "verify" not in run("verify", snap, "--blob-url", url)[2]
    err = run("verify", snap, "--blob-url", url, "--progress")[2]
    assert f"verify {short(snap)}" in err and "97.7k" in err  # the bar counts the snapshot's bytes
    err = run("gc", "--blob-url", url, "--dry-run", "--progress")[2]
    assert "gc: list" in err and "gc: mark" in err
    for argv in (
        ["verify", snap, "--blob-url", url, "--progress", "--json"],
        ["-q", "verify", snap, "--blob-url", url, "--progress"],
        ["gc", "--blob-url", url, "--dry-run", "--progress", "--json"],
    ):
        code, _, err = run(*argv)
        assert code == 0 and err == "", (argv, err)


def test_console_script_with_debug_shows_traceback(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "spark-statebackend"
    proc = subprocess.run(
        [str(exe), "--debug", "verify", "x.json", "--blob-url", "file:relative"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "absolute path" in proc.stderr


def test_restore_checkpoint_passes_log_options(tmp_path: Path) -> None:
    blobs_url = (tmp_path / "blobs").as_uri()
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    base = [
        "restore-checkpoint",
        "--checkpoint-location",
        str(tmp_path / "cp"),
        "--blob-url",
        blobs_url,
        "--log",
        log_dir.as_uri(),
    ]
    code, _, err = run(*base, "--log-option", "nope=1")
    assert code == 2 and "spark.statebackend.checkpointLog.url option 'nope': unknown option" in err
    code, _, err = run(*base, "--log-option", "timeout=5")
    assert code == 2 and "'5' has no unit" in err
    code, out, err = run(*base, "--log-option", "timeout=5s", "--log-option", "fsync=false")
    assert code == 0, err
    assert out.strip() == f"{tmp_path / 'cp'}: fresh"


def test_gc_keeps_every_cli_blob_when_a_cli_index_is_unreadable(tmp_path: Path) -> None:
    url = (tmp_path / "blobs").as_uri()
    src = make_tree(tmp_path / "src", {"a": b"one", "b": b"kept"})
    first = backup(url, src)
    (src / "a").write_bytes(b"two")
    second = backup(url, src)
    assert run("forget", first, "--blob-url", url)[0] == 0  # a's first version is now garbage
    (tmp_path / "blobs" / "blobs" / Path(second)).write_bytes(b"{not json")
    before = blobs(url)
    code, out, err = run("gc", "--blob-url", url, "--grace", "0")
    assert code == 3 and f"SnapshotIndex {second} is unreadable" in err and "deleted 0 " in out
    assert blobs(url) == before
