#!/usr/bin/env python3
"""Stands in for `python -m spark_statebackend.runtime.sidecar` in the process-mode test.

Started by the JVM plugin as `<this script> -m spark_statebackend.runtime.sidecar --spool-dir D
--executor-id E --conf F`. It records its argv, pid and parent into D/fake_sidecar_started.json,
registers as D's live
sidecar, answers checkpoint-location requests "restored" (a fresh location), plan requests and snapshot
events a task waits for (durableCommit) "uploaded", and store requests "not_found", uploads nothing
(the events stay for the test to read), and on SIGTERM records D/fake_sidecar_stopped.json and
exits. It also exits if its parent (the executor JVM) disappears, so a failed test leaves no orphan.
Run as `-m spark_statebackend.spark.validate` (the plugin's start-up check) it accepts any
configuration. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def write(path: Path, obj: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


STATUS = {"checkpoint_location": "restored", "plan": "uploaded"}


def answer_requests(spool: Path, answered: set[str]) -> None:
    requests = spool / "requests"
    for req in sorted(requests.glob("[0-9]*.json")) if requests.is_dir() else []:
        doc = json.loads(req.read_text())
        respond(spool, doc["request_id"], STATUS.get(doc.get("type"), "not_found"))
        req.unlink()
    events = spool / "events"
    for ev in sorted(events.glob("[0-9]*.json")) if events.is_dir() else []:
        request_id = json.loads(ev.read_text()).get("request_id")
        if request_id and request_id not in answered:  # a committing task waits for its upload
            answered.add(request_id)
            respond(spool, request_id, "uploaded")


def respond(spool: Path, request_id: str, status: str) -> None:
    write(
        spool / "responses" / f"{request_id}.json",
        {"request_id": request_id, "status": status, "message": "fake"},
    )


def main() -> int:
    argv = sys.argv[1:]
    if argv[:2] == ["-m", "spark_statebackend.spark.validate"]:
        return 0
    spool = Path(argv[argv.index("--spool-dir") + 1])
    (spool / "responses").mkdir(parents=True, exist_ok=True)
    ppid = os.getppid()
    try:
        parent = Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        parent = ""
    stopped = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        # The events the JVM staged for us (the plugin removes the spool's protocol files once we exit).
        events = [json.loads(p.read_text()) for p in sorted((spool / "events").glob("[0-9]*.json"))]
        write(
            spool / "fake_sidecar_stopped.json",
            {"pid": os.getpid(), "signal": signum, "at": time.time(), "events": events},
        )
        stopped.set()

    signal.signal(signal.SIGTERM, on_term)
    conf_file = Path(argv[argv.index("--conf") + 1])
    write(
        spool / "fake_sidecar_started.json",
        {
            "argv": sys.argv,
            "pid": os.getpid(),
            "ppid": ppid,
            "parent_cmdline": parent,
            "cwd": os.getcwd(),
            "conf": json.loads(conf_file.read_text()),  # the plugin deletes the file at stop (secrets)
            "conf_mode": oct(conf_file.stat().st_mode & 0o777),
        },
    )
    write(
        spool / "sidecar.json",
        {
            "schema_version": 2,
            "pid": os.getpid(),
            "started_at_ms": time.time_ns() // 10**6,
            "executor_id": spool.name,
        },
    )
    answered: set[str] = set()
    while not stopped.wait(0.05):
        answer_requests(spool, answered)
        if os.getppid() != ppid:  # the JVM died without stopping us
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
