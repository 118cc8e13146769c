"""`make bench`: runs every benchmark module and prints its figures (nothing is asserted)."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

MODULES = [
    "benchmarks.engine",
    "benchmarks.cloud_restore",
    "benchmarks.spark_commit",
    "benchmarks.amplification",
    "benchmarks.idle_sidecar",
]


def main() -> None:
    out: dict[str, object] = {}
    only = sys.argv[1:]
    for name in MODULES:
        if only and name.rsplit(".", 1)[-1] not in only:
            continue
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            print(f"== {name}: not available ({e})")
            continue
        print(f"== {name}", flush=True)
        t0 = time.time()
        res = mod.main()
        out[name] = res
        for k, v in res.items():
            print(f"  {k:40} {v:14.3f}" if isinstance(v, float) else f"  {k:40} {v}")
        print(f"  ({time.time() - t0:.0f}s)", flush=True)
    Path("bench-results").mkdir(exist_ok=True)
    Path("bench-results/latest.json").write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
