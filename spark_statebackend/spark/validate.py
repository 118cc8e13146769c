"""Start-up validation of an application's spark.statebackend.* keys, run by the JVM plugin.

    python -m spark_statebackend.spark.validate --conf FILE

`FILE` is a JSON object of the application's `spark.statebackend.*` keys (the plugin writes it 0600 in
a private temporary directory and deletes it afterwards). Every key is validated (`Settings.from_conf`:
unknown keys and bad values are errors naming the key), then the blob store and the checkpoint log are
contacted (`check_services`: created if missing, validated, errors naming the key and the URL). Exit
status 0 with one line saying what was checked; 2 with the error on stderr when the configuration is
wrong or a service unusable (the plugin fails the application with that text, which names no secret).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from ..errors import StateBackendError
from .config import PREFIX, Settings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="spark_statebackend.spark.validate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--conf", required=True, type=Path, help="JSON file of spark.statebackend.* keys")
    args = ap.parse_args(argv)
    try:
        conf = orjson.loads(args.conf.read_bytes())
        if not isinstance(conf, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        print(f"cannot read {args.conf}: {e}", file=sys.stderr)
        return 2
    # The running Spark's version is the JVM's business (SignatureCheck): the sidecar's Python need not
    # have pyspark at all.
    from .enable import check_services

    try:
        settings = Settings.from_conf({str(k): str(v) for k, v in conf.items() if str(k).startswith(PREFIX)})
        if settings.enabled:
            check_services(settings)
    except StateBackendError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"valid: blob store {settings.blob_url}, checkpoint log {settings.log_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
