#!/usr/bin/env python3
"""Stands in for `python -m spark_statebackend.sidecar` in the process-mode test.

Started by the JVM plugin as `<this script> -m spark_statebackend.sidecar --spool-dir D --executor-id E
--conf F`. It records its argv, pid and parent into D/fake_sidecar_started.json, answers nothing,
and on SIGTERM records D/fake_sidecar_stopped.json and exits. It also exits if its parent (the
executor JVM) disappears, so a failed test leaves no orphan. Standard library only.
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


def main() -> int:
    argv = sys.argv[1:]
    spool = Path(argv[argv.index("--spool-dir") + 1])
    ppid = os.getppid()
    try:
        parent = Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        parent = ""
    stopped = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        write(spool / "fake_sidecar_stopped.json", {"pid": os.getpid(), "signal": signum, "at": time.time()})
        stopped.set()

    signal.signal(signal.SIGTERM, on_term)
    write(
        spool / "fake_sidecar_started.json",
        {"argv": sys.argv, "pid": os.getpid(), "ppid": ppid, "parent_cmdline": parent, "cwd": os.getcwd()},
    )
    while not stopped.wait(0.2):
        if os.getppid() != ppid:  # the JVM died without stopping us
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
