"""Secrets stay private (issue 11 item 5): the spool is 0700/0600 per user and application, a spool
root another user owns (or made group/other-writable) is refused, and Spark's UI redacts our keys.

Each case starts its own driver process (a Python process holds one SparkContext) with only the jar,
the plugin and spark.statebackend.* keys set, as spark-submit would.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_statebackend.spark import enable as ssb_spark

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession
conf = json.loads(sys.argv[1])
b = SparkSession.builder.master("local[1]").appName("ssb-secrets")
for k, v in conf.items():
    b = b.config(k, v)
try:
    spark = b.getOrCreate()
except Exception as e:  # what the application's start reports
    print("START-FAILED", str(e).replace("\n", " ")[:4000], flush=True)
    sys.exit(3)
sc = spark.sparkContext
print("STARTED", json.dumps({"app": sc.applicationId, "ui": sc.uiWebUrl}), flush=True)
spool = conf.get("spark.statebackend.spoolDir")
# While the application runs: its protocol files are removed when it stops.
if spool and conf.get("spark.statebackend.sidecar.mode") != "none":
    import os, stat, time
    deadline = time.monotonic() + 60
    conf_file = None
    while conf_file is None and time.monotonic() < deadline:
        conf_file = next(iter(__import__("glob").glob(f"{spool}/*/driver/sidecar-conf.json")), None)
        if conf_file is None:
            time.sleep(0.05)  # polling for a file another process writes; bounded by the deadline
    modes = {}
    for dirpath, dirs, files in os.walk(spool):
        for name in [*dirs, *files]:
            p = os.path.join(dirpath, name)
            modes[os.path.relpath(p, spool)] = stat.S_IMODE(os.lstat(p).st_mode)
    modes["."] = stat.S_IMODE(os.lstat(spool).st_mode)
    print("SPOOL", json.dumps(modes), flush=True)
    dirs = [os.path.relpath(os.path.join(d, n), spool) for d, ns, _ in os.walk(spool) for n in ns]
    print("SPOOLDIRS", json.dumps(dirs), flush=True)
if len(sys.argv) > 2:
    import urllib.request
    env = urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/environment").read()
    print("ENV", json.dumps(json.loads(env)), flush=True)
spark.stop()
"""


def run_driver(conf: dict[str, str], *, fetch_env: bool = False) -> tuple[int, str]:
    base = {
        "spark.jars": str(ssb_spark.jar_path()),
        "spark.plugins": ssb_spark.PLUGIN_CLASS,
        "spark.statebackend.sidecar.python": sys.executable,
    }
    args = [sys.executable, "-c", DRIVER, json.dumps({**base, **conf})] + (["env"] if fetch_env else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240)
    return proc.returncode, proc.stdout + proc.stderr


def urls(tmp_path: Path) -> dict[str, str]:
    return {
        "spark.statebackend.blobStore.url": (tmp_path / "blobs").as_uri(),
        "spark.statebackend.checkpointLog.url": (tmp_path / "log").as_uri(),
        "spark.statebackend.spoolDir": str(tmp_path / "spool"),
        "spark.ui.enabled": "false",
    }


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_spool_dirs_are_0700_and_the_sidecar_conf_0600(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    # A finished application's spool left 8 days ago (its executor killed before its shutdown hook):
    # pruned at the next start, with the conf holding its secrets.
    old = root / "app-20261101000000-0000"
    (old / "1").mkdir(mode=0o700, parents=True)
    root.chmod(0o700)
    old.chmod(0o700)
    (old / "1" / "sidecar-conf.json").write_text("{}")
    (old / "1" / "sidecar-conf.json").chmod(0o600)
    week_ago = time.time() - 8 * 24 * 3600
    for p in (old / "1" / "sidecar-conf.json", old / "1", old):
        os.utime(p, (week_ago, week_ago))
    code, out = run_driver(urls(tmp_path))
    assert code == 0, out[-3000:]
    [line] = [ln for ln in out.splitlines() if ln.startswith("SPOOL ")]
    modes: dict[str, int] = json.loads(line.removeprefix("SPOOL "))
    assert not old.exists(), "an application spool older than 7 days with no live sidecar is pruned"
    modes = {name: m for name, m in modes.items() if not name.startswith(old.name)}
    [app] = [p for p in root.iterdir() if p.is_dir()]
    conf_file = f"{app.name}/driver/sidecar-conf.json"
    assert conf_file in modes, sorted(modes)
    for d in (".", app.name, f"{app.name}/driver"):
        assert modes[d] == 0o700, f"{d} is {oct(modes[d])}"
    [line] = [ln for ln in out.splitlines() if ln.startswith("SPOOLDIRS ")]
    dirs = {name: modes[name] for name in json.loads(line.removeprefix("SPOOLDIRS ")) if name in modes}
    assert f"{app.name}/driver/events" in dirs, sorted(dirs)  # the sidecar's own dirs, too
    assert {name: oct(m) for name, m in dirs.items() if m != 0o700} == {}
    for name, m in modes.items():
        if name.endswith((".json", ".log")):
            assert m == 0o600, f"{name} is {oct(m)} while the application ran"
    # When the application stops, the file holding its secrets goes with it; the log stays.
    assert not (root / conf_file).exists()
    assert mode(root / app.name / "driver" / "sidecar.log") == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the directory to another user")
def test_a_spool_root_another_user_owns_is_refused_at_start(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)  # nobody: as if another local user had pre-created the path
    code, out = run_driver(urls(tmp_path))
    assert code != 0
    assert "START-FAILED" in out and f"spool directory {root} belongs to uid 65534" in out, out[-3000:]
    assert list(root.iterdir()) == [], "nothing was written into the other user's directory"


@pytest.mark.parametrize("case", ["world_writable", "symlinked_elsewhere"])
def test_a_spool_root_below_a_directory_others_can_write_is_refused(tmp_path: Path, case: str) -> None:
    """Whoever can write to the directory holding the spool root can rename the root away after the
    check and put a directory of theirs in its place (as another user pre-creating the default's
    /tmp/spark-statebackend-<user> would): refused at start, naming that directory."""
    holder = tmp_path / "holder"
    if case == "world_writable":
        holder.mkdir()
        holder.chmod(0o777)
    else:
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        holder.symlink_to(shared)
    code, out = run_driver({**urls(tmp_path), "spark.statebackend.spoolDir": str(holder / "spool")})
    assert code != 0
    assert "START-FAILED" in out, out[-3000:]
    # Through the symlink too: what counts is the directory the path leads to.
    above = f"{holder}, above the spool root {holder / 'spool'}, is writable by group or others"
    assert above in out, out[-3000:]
    assert not (holder / "spool").exists(), "nothing was created below it"


def test_a_group_writable_spool_root_is_refused_at_start(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    root.mkdir()
    root.chmod(0o777)
    code, out = run_driver(urls(tmp_path))
    assert code != 0
    assert "START-FAILED" in out, out[-3000:]
    assert f"spool directory {root} is writable by group or others" in out, out[-3000:]


def test_a_symlinked_spool_root_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "spool").symlink_to(elsewhere)
    code, out = run_driver(urls(tmp_path))
    assert code != 0
    assert "START-FAILED" in out and "is not a directory (a symlink or a file)" in out, out[-3000:]
    assert list(elsewhere.iterdir()) == []


def test_spark_ui_redacts_our_secret_keys(tmp_path: Path) -> None:
    secret = "AccountKey=c2VjcmV0LXZhbHVlLW5vdC1yZWFs"
    conf = {
        **urls(tmp_path),
        "spark.ui.enabled": "true",
        "spark.ui.port": "0",
        # No sidecars and no start-up contact: this test is about what Spark shows, not the store.
        "spark.statebackend.sidecar.mode": "none",
        "spark.statebackend.blobStore.url": "azure://container/prefix",
        "spark.statebackend.blobStore.options.connection_string": f"DefaultEndpointsProtocol=https;{secret}",
        "spark.statebackend.blobStore.options.access_key_id": "AKIDNOTREAL",
    }
    code, out = run_driver(conf, fetch_env=True)
    assert code == 0, out[-3000:]
    env_line = next(line for line in out.splitlines() if line.startswith("ENV "))
    props = dict(json.loads(env_line[4:])["sparkProperties"])
    assert secret not in env_line and "AKIDNOTREAL" not in env_line
    assert "redacted" in props["spark.statebackend.blobStore.options.connection_string"]
    assert "redacted" in props["spark.statebackend.blobStore.options.access_key_id"]
    assert props["spark.statebackend.blobStore.url"] == "azure://container/prefix"  # not a secret


def test_credentials_in_a_store_url_fail_the_start_without_being_shown(tmp_path: Path) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSECRETKEY"
    conf = {
        **urls(tmp_path),
        "spark.statebackend.blobStore.url": f"s3://AKIDNOTREAL:{secret}@bucket/prefix",
    }
    code, out = run_driver(conf)
    assert code != 0 and "START-FAILED" in out, out[-3000:]
    assert "spark.statebackend.blobStore.url" in out and "s3://***@bucket/prefix" in out, out[-3000:]
    # Nowhere in the driver's output (Spark's log included) before or after our validation.
    assert secret not in out and "K7MDENG" not in out and "AKIDNOTREAL" not in out
