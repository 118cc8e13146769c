"""Start-up validation of an application's spark.statebackend.* keys, run by the JVM plugin.

    python -m spark_statebackend.spark.validate --conf FILE [--offline]

`FILE` is a JSON object of the application's `spark.statebackend.*` keys (the plugin writes it 0600 in
a private temporary directory and deletes it afterwards). Every key is validated (`Settings.from_conf`:
unknown keys and bad values are errors naming the key), then the blob store and the checkpoint log are
contacted (`check_services`: created if missing, validated, errors naming the key and the URL). Exit
status 0 with one line saying what was checked; 2 with the error on stderr when the configuration is
wrong or a service unusable (the plugin fails the application with that text, which names no secret).

`--offline` is an executor's check of its sidecar Python, run by the plugin before it starts the sidecar
(SidecarProcess.checkPython): the keys are validated, the sidecar's modules imported and the blob store
and checkpoint log opened (so a missing extra is named) but nothing is contacted or created. A Python
without this package cannot even start this module: the plugin reports that exit with the Python's path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from ..errors import StateBackendError
from ..settings import PREFIX, Settings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="spark_statebackend.spark.validate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--conf", required=True, type=Path, help="JSON file of spark.statebackend.* keys")
    ap.add_argument(
        "--offline", action="store_true", help="contact nothing: check that this Python can run a sidecar"
    )
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
        if settings.enabled and args.offline:
            _check_sidecar_python(settings)
        elif settings.enabled:
            check_services(settings)
    except StateBackendError as e:
        print(str(e), file=sys.stderr)
        return 2
    what = "can run a sidecar" if args.offline else "valid"
    print(
        f"{what}: Python {sys.executable}, blob store {settings.blob_url}, checkpoint log {settings.log_url}"
    )
    return 0


def _check_sidecar_python(settings: Settings) -> None:
    """Raise (ConfigError naming the key and the extra) unless this Python can run a sidecar for
    `settings`; opens the blob store and the checkpoint log without contacting them."""
    import importlib

    from ..checkpoints.logs import open_checkpoint_log
    from ..stores import open_blob_store

    # The sidecar's own imports: a dependency missing from this Python fails here, naming its module.
    importlib.import_module("spark_statebackend.runtime.sidecar")
    open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url").close()
    open_checkpoint_log(settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url").close()


if __name__ == "__main__":
    sys.exit(main())
