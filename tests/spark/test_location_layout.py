"""Checkpoint locations laid out across file systems, and symlinks in them (issue 21).

Layouts: a location that is a mount point (a Kubernetes persistent volume), a symlink to a directory on
another disk, or with `state/` on a file system of its own. The driver-side rebuild
(restore_checkpoint_location) and an executor restore work in each: their scratch dirs are inside the
location, and a file whose target dir is on another file system is copied into place. These tests
mount a real tmpfs in a private mount namespace (`unshare -m`, as root) and run the restore in that
namespace, in a subprocess (`_in_namespace`); the blob store and the checkpoint log stay outside.

Symlinks: a query does not start on a location with a symlink among Spark's files (the error names
it), and the committer's `_driver` snapshot never follows one planted after the start: that batch is
not checkpointed, an ERROR names the query, the location and the symlink, and nothing behind the link
is read.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark_statebackend.checkpoints.checkpoint import (
    DRIVER_STORE,
    CheckpointV2,
)
from spark_statebackend.checkpoints.logs import open_checkpoint_log
from spark_statebackend.common.nofollow import move_tree_into
from spark_statebackend.engine.transfer import TransferPool
from spark_statebackend.errors import UnsafePathError
from spark_statebackend.lifecycle.locators import write_locator
from spark_statebackend.runtime import spool as sp
from spark_statebackend.runtime.sidecar import Sidecar
from spark_statebackend.settings import PREFIX, Settings
from spark_statebackend.spark.driver_restore import restore_checkpoint_location
from spark_statebackend.spark.location import stage_driver_files
from spark_statebackend.stores import LocalBlobStore
from tests.commitrig import Driver, Executor
from tests.paths import ROOT
from tests.sidecarrig import KEY_DIR, QID, Rig, restore_request
from tests.trees import make_tree, read_tree

#: The Spark files of checkpoint batch 2 that `_with_driver_files` snapshots (beside `metadata`).
DRIVER_FILES: dict[str, bytes] = {
    "offsets/1": b"offsets 1",
    "offsets/2": b"offsets 2",
    "commits/1": b"commits 1",
    "commits/2": b"commits 2",
    "sources/0/0": b"v1\nsource file log 0",
    "state/0/_metadata/metadata": b"v1\noperator metadata",
}


# ------------------------------------------------------------------------------------ namespaces


def _require_mount_namespaces() -> None:
    """Skip, saying why, where a private mount namespace cannot be had (not root, no unshare(1), or
    mounts not permitted, as in a container without CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a tmpfs in a private mount namespace (unshare -m)")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare(1) and mount(8) (util-linux) to mount a tmpfs in a private namespace")
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "ssb-probe", "/mnt"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here (unshare -m ... mount tmpfs): {probe.stderr.strip()}")


def _in_namespace(mounts: list[Path], scenario: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run `scenario` (a function `_ns_<scenario>` of this module) in a subprocess with a private mount
    namespace where a fresh tmpfs is mounted at each of `mounts`; return what it printed (JSON). The
    mounts vanish with the subprocess."""
    code = "import sys, orjson; from tests.spark import test_location_layout as t; t._ns_main(sys.argv[1])"
    spec = orjson.dumps({"mounts": [str(m) for m in mounts], "scenario": scenario, "args": args}).decode()
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", code, spec],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"scenario {scenario} failed:\n{done.stdout}\n{done.stderr}"
    result: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result


def _ns_main(spec_json: str) -> None:
    """The subprocess's side of `_in_namespace`: mount, check each mount is one, run the scenario."""
    spec = orjson.loads(spec_json)
    for m in spec["mounts"]:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "ssb-test", m], check=True)
        assert os.stat(m).st_dev != os.stat(Path(m).parent).st_dev, f"{m} is not a mount point"
    result = globals()[f"_ns_{spec['scenario']}"](**spec["args"])
    print(orjson.dumps(result).decode(), flush=True)


def _listing(root: str) -> dict[str, str]:
    """Every entry below `root` (followed if `root` itself is a symlink): a file's text, 'dir/', or
    'symlink -> target'; never following a symlink below it."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(os.path.realpath(root)):
        rel = os.path.relpath(dirpath, os.path.realpath(root))
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            key = os.path.normpath(os.path.join(rel, name))
            if os.path.islink(path):
                out[key] = f"symlink -> {os.readlink(path)}"
            elif os.path.isdir(path):
                out[key + "/"] = "dir/"
            else:
                out[key] = Path(path).read_bytes().decode("latin-1")
    return out


def _ns_rebuild(conf: dict[str, str], location: str, prepare_dirs: list[str]) -> dict[str, Any]:
    """The driver-side rebuild (as the sidecar serves a query's start) of `location`."""
    for d in prepare_dirs:
        os.makedirs(d, exist_ok=True)
    outcome = restore_checkpoint_location(Settings.from_conf(conf), location)
    return {"outcome": outcome, "listing": _listing(location)}


def _ns_executor_restore(
    conf: dict[str, str], spool: str, request: dict[str, Any], prepare_dirs: list[str]
) -> dict[str, Any]:
    """A sidecar's restore of one store (runtime/store_restore.py) for `request` (a restore request's
    fields)."""
    for d in prepare_dirs:
        os.makedirs(d, exist_ok=True)
    sidecar = Sidecar(sp.Spool(Path(spool)), "driver", Settings.from_conf(conf))
    try:
        fields = {k: Path(v) if k in ("checkpoint_root", "dfs_dir") else v for k, v in request.items()}
        req = sp.RestoreRequest(**fields)  # type: ignore[arg-type]
        status, message, _, _ = sidecar.restores.restore(req)
    finally:
        sidecar.close()
    return {
        "status": status,
        "message": message,
        "store": _listing(request["dfs_dir"]),
        "location": _listing(request["checkpoint_root"]),
    }


# ------------------------------------------------------------------------------------ helpers


def _settings_conf(rig: Rig) -> dict[str, str]:
    """The rig's blob store and checkpoint log as conf keys, for a restore in another process."""
    return {
        PREFIX + "blobStore.url": (rig.tmp / "blobs").as_uri(),
        PREFIX + "checkpointLog.url": (rig.tmp / "log").as_uri(),
        PREFIX + "retainCheckpoints": "3",
    }


def _with_driver_files(rig: Rig) -> CheckpointV2:
    """Checkpoint batch 2 again with a `_driver` snapshot holding `DRIVER_FILES` too (sources, operator
    metadata), staged by stage_driver_files from the rig's location as the committer does."""
    for rel, data in DRIVER_FILES.items():
        (rig.location / rel).parent.mkdir(parents=True, exist_ok=True)
        (rig.location / rel).write_bytes(data)
    staged = rig.tmp / "driver-b2-full"
    assert stage_driver_files(rig.location, 2, staged) == len(DRIVER_FILES) + 1  # and `metadata`
    return rig.checkpoint(
        2,
        rig.sidecar.uploads.bases.manager(QID).upload(
            "b2x", {DRIVER_STORE: staged}, versions={DRIVER_STORE: 2}
        ),
    )


def _rebuilt_listing() -> dict[str, str]:
    """What a rebuild from `_with_driver_files`'s checkpoint leaves in an empty location."""
    listing = {rel: data.decode("latin-1") for rel, data in DRIVER_FILES.items()}
    listing["metadata"] = orjson.dumps({"id": QID}).decode() + "\n"
    for d in ("offsets", "commits", "sources", "sources/0", "state", "state/0", "state/0/_metadata"):
        listing[d + "/"] = "dir/"
    listing["state/0/0/"] = "dir/"  # the store dir, for its executor's restore
    listing["_statebackend/"] = "dir/"  # ours; the scratch dir in it is gone
    return listing


# ------------------------------------------------------------------------------------ layouts


def test_driver_rebuilds_a_location_that_is_a_mount_point(rig: Rig) -> None:
    """A new host's empty persistent volume: the location is the mount point. Its parent is on
    another file system, where the scratch dir used to be made: os.replace failed with EXDEV."""
    _require_mount_namespaces()
    _with_driver_files(rig)
    location = rig.tmp / "host2" / "cp"
    location.mkdir(parents=True)
    write_locator(rig.store, str(location), QID, "q")  # a wiped host finds its query by the locator
    got = _in_namespace(
        [location], "rebuild", {"conf": _settings_conf(rig), "location": str(location), "prepare_dirs": []}
    )
    assert got["outcome"] == "restored batch 2"
    assert got["listing"] == _rebuilt_listing()
    assert sorted(os.listdir(location.parent)) == ["cp"]  # nothing was made beside it


def test_driver_rebuilds_a_location_that_is_a_symlink_to_another_disk(rig: Rig) -> None:
    """The location is a symlink (the user's choice) to a directory on another file system: the
    rebuild writes into the symlink's target, and the symlink stays."""
    _require_mount_namespaces()
    _with_driver_files(rig)
    disk = rig.tmp / "disk2"
    disk.mkdir()
    location = rig.tmp / "host2" / "cp"
    location.parent.mkdir()
    location.symlink_to(disk / "cp", target_is_directory=True)
    write_locator(rig.store, str(location), QID, "q")
    got = _in_namespace(
        [disk],
        "rebuild",
        {"conf": _settings_conf(rig), "location": str(location), "prepare_dirs": [str(disk / "cp")]},
    )
    assert got["outcome"] == "restored batch 2"
    assert got["listing"] == _rebuilt_listing()
    assert location.is_symlink() and os.readlink(location) == str(disk / "cp")
    assert sorted(os.listdir(location.parent)) == ["cp"]


def test_driver_rebuilds_a_location_whose_state_dir_is_on_another_file_system(rig: Rig) -> None:
    """`state/` is a mount point inside the location: the operator metadata crosses file systems
    (copied into place); everything else is renamed."""
    _require_mount_namespaces()
    _with_driver_files(rig)
    location = rig.tmp / "host2" / "cp"
    (location / "state").mkdir(parents=True)
    write_locator(rig.store, str(location), QID, "q")
    got = _in_namespace(
        [location / "state"],
        "rebuild",
        {"conf": _settings_conf(rig), "location": str(location), "prepare_dirs": []},
    )
    assert got["outcome"] == "restored batch 2"
    assert got["listing"] == _rebuilt_listing()


def test_executor_restores_a_store_whose_parent_is_on_another_file_system(rig: Rig) -> None:
    _require_mount_namespaces()
    (rig.location / "state").mkdir()
    dfs = rig.location / "state" / KEY_DIR
    got = _in_namespace(
        [rig.location / "state"],
        "executor_restore",
        {
            "conf": _settings_conf(rig),
            "spool": str(rig.tmp / "spool-ns"),
            "request": _request_fields(rig, 3, dfs),
            "prepare_dirs": [str(dfs)],
        },
    )
    assert got["status"] == "restored", got["message"]
    assert got["store"] == {"3.zip": "zip 2", "2.sst": "s"}
    assert got["location"]["_statebackend/restore/"] == "dir/"
    assert not [
        k for k in got["location"] if k.startswith("_statebackend/restore/") and k != "_statebackend/restore/"
    ]


def test_executor_restores_into_a_location_that_is_a_symlink_to_another_disk(rig: Rig) -> None:
    _require_mount_namespaces()
    disk = rig.tmp / "disk2"
    disk.mkdir()
    location = rig.tmp / "host2" / "cp"
    location.parent.mkdir()
    location.symlink_to(disk / "cp", target_is_directory=True)
    dfs = location / "state" / KEY_DIR
    fields = _request_fields(rig, 3, dfs, checkpoint_root=str(location))
    got = _in_namespace(
        [disk],
        "executor_restore",
        {
            "conf": _settings_conf(rig),
            "spool": str(rig.tmp / "spool-ns"),
            "request": fields,
            "prepare_dirs": [str(disk / "cp"), str(dfs)],
        },
    )
    assert got["status"] == "restored", got["message"]
    assert got["store"] == {"3.zip": "zip 2", "2.sst": "s"}
    assert location.is_symlink() and sorted(os.listdir(location.parent)) == ["cp"]


def _request_fields(rig: Rig, version: int, dfs: Path, **over: object) -> dict[str, Any]:
    req = restore_request(rig, version, dfs, created_at_ms=int(time.time() * 1000))
    fields: dict[str, Any] = {
        "request_id": req.request_id,
        "query_id": req.query_id,
        "checkpoint_root": str(req.checkpoint_root),
        "dfs_dir": str(req.dfs_dir),
        "operator": req.operator,
        "partition": req.partition,
        "store": req.store,
        "version": req.version,
        "spark_unique_id": req.spark_unique_id,
        "executor_id": req.executor_id,
        "created_at_ms": req.created_at_ms,
    }
    fields.update(over)
    return fields


# ------------------------------------------------------------------------------------ symlinks

SECRET = b"someone else's secret, never to be read"


def _plant(location: Path, link: str, outside: Path) -> Path:
    """Make `location/link` a symlink to `outside` (a dir holding what Spark would find there) or, for
    a file's name, to the file `outside/secret`; returns the symlink."""
    planted = location / link
    planted.parent.mkdir(parents=True, exist_ok=True)
    if planted.is_dir() and not planted.is_symlink():
        shutil.rmtree(planted)
    elif planted.exists():
        planted.unlink()
    is_file = link in ("metadata", "offsets/1") or link.endswith(("/0", "/metadata"))
    planted.symlink_to(outside / "secret" if is_file else outside, target_is_directory=not is_file)
    return planted


def _start(rig: Rig, location: Path) -> sp.RestoreResponse:
    """The driver JVM's checkpoint-location request at a query's start, served by the real sidecar."""
    request = sp.CheckpointLocationRequest(
        request_id=str(uuid.uuid4()),
        checkpoint_root=location,
        mode="start",
        executor_id="driver",
        created_at_ms=int(time.time() * 1000),
    )
    rig.sidecar.restores.serve_request(rig.sidecar.spool.write_request(request, fsync=False))
    response = rig.sidecar.spool.take_response(request.request_id)
    assert response is not None
    return response


@pytest.mark.parametrize(
    "link",
    [
        "metadata",
        "offsets/1",
        "sources",
        "sources/0/0",
        "state/0/_metadata",
        "state/0/_metadata/metadata",
        "_statebackend",
    ],
)
def test_a_query_does_not_start_on_a_location_with_a_symlink(rig: Rig, link: str) -> None:
    """Before, the query started and every checkpoint then failed (or read through the link)."""
    make_tree(
        rig.location, {"sources": {"0": {"0": b"v1\n"}}, "state": {"0": {"_metadata": {"metadata": b"m"}}}}
    )
    outside = make_tree(rig.tmp / "outside", {"secret": SECRET, "0": {"0": b"v1\n"}, "metadata": b"m"})
    planted = _plant(rig.location, link, outside)
    before, before_outside, durable = read_tree(rig.location), read_tree(outside), rig.durable()
    response = _start(rig, rig.location)
    assert response.status == "error", response
    assert str(planted) in response.message and "is a symlink" in response.message
    assert f"checkpoint location {rig.location}" in response.message
    assert read_tree(rig.location) == before
    assert read_tree(outside) == before_outside
    assert rig.durable() == durable


def test_a_fresh_location_with_a_symlink_is_refused_too(rig: Rig) -> None:
    fresh = make_tree(rig.tmp / "fresh", {"offsets": {}})
    outside = make_tree(rig.tmp / "outside", {"secret": SECRET})
    (fresh / "sources").symlink_to(outside, target_is_directory=True)
    response = _start(rig, fresh)
    assert response.status == "error" and str(fresh / "sources") in response.message, response


def test_a_location_that_is_itself_a_symlink_starts(rig: Rig) -> None:
    """The location itself is the user's choice of where it lives: followed, and rebuilt in place."""
    link = rig.tmp / "link-to-cp"
    link.symlink_to(rig.location, target_is_directory=True)
    shutil.rmtree(rig.location / "commits")
    response = _start(rig, link)
    assert (response.status, response.message) == ("restored", "restored batch 2")
    assert sorted(os.listdir(rig.location / "commits")) == ["1", "2"]
    assert link.is_symlink()


@pytest.mark.parametrize("link", ["sources", "state/0/_metadata/metadata"])
def test_a_symlink_planted_after_the_start_fails_that_checkpoint_naming_it(
    tmp_path: Path, link: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The committer's `_driver` snapshot (stage_driver_files) never reads through a symlink: the batch
    is not checkpointed, with an ERROR naming the query, the checkpoint location and the symlink."""
    store = LocalBlobStore(tmp_path / "blobs", fsync=False)
    store.ensure_ready()
    cplog = open_checkpoint_log((tmp_path / "log").as_uri(), {"fsync": "false"})
    cplog.create_resources()
    qid = str(uuid.uuid4())
    with TransferPool(4, name="ssb-test-layout") as pool:
        executor = Executor(store, pool, qid, tmp_path / "exec")
        driver = Driver(store, cplog, pool, qid, tmp_path / "drv")
        make_tree(
            driver.ckpt, {"sources": {"0": {"0": b"v1\n"}}, "state": {"0": {"_metadata": {"metadata": b"m"}}}}
        )
        for b in range(2):
            executor.upload(b + 1)
            assert driver.finish_batch(b) == 1
        outside = make_tree(tmp_path / "outside", {"secret": SECRET, "0": {"0": SECRET}})
        planted = _plant(driver.ckpt, link, outside)
        executor.upload(3)
        with caplog.at_level(logging.ERROR, logger="spark_statebackend.commit"):
            assert driver.finish_batch(2) == 0
    latest = cplog.read_latest(qid)
    assert latest is not None and latest.batch_id == 1  # batch 2 is not checkpointed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    said = "\n".join(f"{r.getMessage()}\n{r.exc_text or ''}" for r in errors)
    assert qid in said and f"checkpoint location {driver.ckpt}" in said and f"{planted} is a symlink" in said
    for blob in (tmp_path / "blobs").rglob("*"):  # nothing behind the link was read into a snapshot
        assert not blob.is_file() or SECRET not in blob.read_bytes(), blob
    assert read_tree(outside) == {"secret": (SECRET, 0o644), "0/": {"0": (SECRET, 0o644)}}


def test_stage_driver_files_takes_sparks_files_and_nothing_of_ours(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "cp",
        {
            "metadata": b"id",
            "offsets": {"0": b"o0", "1": b"o1", "2": b"o2"},
            "commits": {"1": b"c1", "2": b"c2"},
            "sources": {"0": {"0": b"s", ".0.ssb-copy-0123456789ab": b"a crash's leftover copy"}},
            "state": {"0": {"_metadata": {"metadata": b"m"}, "0": {"1.zip": b"z"}}},
            "_statebackend": {"driver-restore": {"metadata": b"old"}, "restore": {"x": {"1.zip": b"z"}}},
        },
    )
    into = tmp_path / "into"
    assert stage_driver_files(root, 2, into) == 7
    assert read_tree(into) == {
        "metadata": (b"id", 0o644),
        "offsets/": {"1": (b"o1", 0o644), "2": (b"o2", 0o644)},
        "commits/": {"1": (b"c1", 0o644), "2": (b"c2", 0o644)},
        "sources/": {"0/": {"0": (b"s", 0o644)}},
        "state/": {"0/": {"_metadata/": {"metadata": (b"m", 0o644)}}},
    }


def test_stage_driver_files_never_follows_a_symlink(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "cp", {"metadata": b"id", "offsets": {}, "commits": {}})
    outside = make_tree(tmp_path / "outside", {"secret": SECRET})
    (root / "offsets" / "2").symlink_to(outside / "secret")
    into = tmp_path / "into"
    with pytest.raises(UnsafePathError, match="is a symlink") as e:
        stage_driver_files(root, 2, into)
    assert f"checkpoint location {root}" in str(e.value) and str(root / "offsets" / "2") in str(e.value)
    assert not any(p.is_file() and SECRET in p.read_bytes() for p in into.rglob("*"))


def test_a_rebuild_moves_commits_last(tmp_path: Path) -> None:
    """A rebuild cut short (a crash in the middle of the move) must leave the location behind its
    checkpoint, which the next start rebuilds again, never a `commits/<N>` without its `offsets/<N>`:
    Spark would take batch N for done. So the commit log's files move after every other file."""
    src = make_tree(
        tmp_path / "scratch",
        {
            "metadata": b"m",
            "commits": {"1": b"c1", "2": b"c2"},
            "offsets": {"1": b"o1", "2": b"o2"},
            "sources": {"0": {"2": b"s"}},
            "state": {"0": {"_metadata": {"metadata": b"x"}}},
        },
    )
    placed: list[str] = []
    root = tmp_path / "cp"
    root.mkdir()
    move_tree_into(src, root, before_place=lambda fd, name: placed.append(name), last=("commits",))
    assert placed[-2:] == ["1", "2"] and placed.count("1") == 2, placed  # commits/1, commits/2 at the end
    assert (root / "commits" / "2").read_bytes() == b"c2" and (root / "offsets" / "2").read_bytes() == b"o2"
