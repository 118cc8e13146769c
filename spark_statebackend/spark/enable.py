"""Enabling the backend in a Spark application: the conf keys a job sets, and `configure()`.

A Spark job needs only conf keys (README "Using it"): the jar on `spark.jars`, the plugin on
`spark.plugins` and the `spark.statebackend.*` keys. The plugin (jvm-bridge StateBackendPlugin)
validates them at application start ([S2] in spark/__init__.py) and installs the hooks; users keep
Spark's own RocksDBStateStoreProvider. `configure(builder_or_conf, ...)` is the PySpark convenience that
sets those keys ([S1]; like delta-spark's `configure_spark_with_delta_pip`):

    spark.jars                                       + the shim jar shipped in this package
    spark.plugins                                    + dev.statebackend.spark.StateBackendPlugin
    spark.statebackend.sidecar.driverPython          this Python, for the driver's sidecar (unless
                                                     sidecar.python or it is set); executors keep
                                                     Spark's choice (../settings.py: sidecar.python)
    spark.statebackend.*                             validated (Settings.from_conf) before anything starts

and checks at once that the blob store and checkpoint log are reachable, that the jar exists, and
that the running pyspark is one the shim supports.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, StateBackendError
from ..settings import PREFIX, Settings
from .compat import check_pyspark_version

PLUGIN_CLASS = "dev.statebackend.spark.StateBackendPlugin"
JAR_NAME = "spark-statebackend-bridge.jar"


def jar_path() -> Path:
    """The shim jar inside this package (built by `make jar`)."""
    return Path(__file__).parent.parent / "jars" / JAR_NAME


def _append(current: str | None, item: str) -> str:
    items = [x for x in (current or "").split(",") if x]
    if item not in items:
        items.append(item)
    return ",".join(items)


def spark_conf_for(existing: Mapping[str, str], **settings: str) -> tuple[dict[str, str], Settings]:
    """The spark.conf entries configure() adds to `existing` (a plain mapping of current entries), and
    the Settings they make together; raises ConfigError naming the key if any is bad.

    `settings` are spark.statebackend.* keys without the prefix, e.g. blobStore_url -> use the
    dotted form via `**{"blobStore.url": "..."}`."""
    check_pyspark_version()
    jar = jar_path()
    if not jar.is_file():
        raise ConfigError(
            "spark.jars",
            f"the shim jar {jar} is missing; build it with `make jar` (a wheel built by pip carries it)",
        )
    out: dict[str, str] = {
        "spark.jars": _append(existing.get("spark.jars"), str(jar)),
        "spark.plugins": _append(existing.get("spark.plugins"), PLUGIN_CLASS),
    }
    # This interpreter is the driver's, but executors have their own (an archive's venv, an image's):
    # only the driver's sidecar is pinned to it, executors resolve theirs as Spark does.
    if not existing.get(PREFIX + "sidecar.python", "").strip():
        out[PREFIX + "sidecar.driverPython"] = existing.get(PREFIX + "sidecar.driverPython") or sys.executable
    for k, v in settings.items():
        out[PREFIX + k] = str(v)
    merged = {**existing, **out}
    resolved = Settings.from_conf({k: v for k, v in merged.items() if k.startswith(PREFIX)})  # validates
    _check_default_locations(merged)
    # An unset URL stays unset in the conf: the plugin resolves its default on the driver once it knows
    # the master (StateBackendPlugin.defaultLocations), and refuses it for any master but local and
    # local-cluster.
    return out, resolved


#: The URL keys whose default is a directory under the driver's working directory.
_DEFAULTED_URLS = ("blobStore.url", "checkpointLog.url")


def _check_default_locations(conf: Mapping[str, str]) -> None:
    """Raise ConfigError when a URL is left to its default (a directory on the driver's disk) while
    `spark.master` names a master whose executors do not share that disk; the plugin refuses the same
    at start, this says it before the session is built. An unknown master is left to the plugin."""
    master = conf.get("spark.master", "").strip()
    if not master or master == "local" or master.startswith(("local[", "local-cluster[")):
        return
    for name in _DEFAULTED_URLS:
        if not conf.get(PREFIX + name, "").strip():
            raise ConfigError(
                PREFIX + name,
                f"is not set; with master {master} executors do not share the driver's disk, so the "
                "default (a directory under the driver's working directory) would leave each executor "
                "with a store of its own. Set it to a location every executor and the driver reach "
                "(s3://, azure://, or file:// on a shared file system)",
            )


def check_services(settings: Settings) -> None:
    """Contact the blob store and the checkpoint log once; errors name the key and the URL."""
    from ..checkpoints.logs import open_checkpoint_log
    from ..stores import open_blob_store

    store = open_blob_store(settings.blob_url, settings.blob_options, key=PREFIX + "blobStore.url")
    try:
        store.ensure_ready()
    except StateBackendError as e:
        raise ConfigError(PREFIX + "blobStore.url", f"blob store unusable: {e}") from None
    finally:
        store.close()
    cplog = open_checkpoint_log(settings.log_url, settings.log_options, key=PREFIX + "checkpointLog.url")
    try:
        cplog.create_resources()
    except StateBackendError as e:
        raise ConfigError(PREFIX + "checkpointLog.url", f"checkpoint log unusable: {e}") from None
    finally:
        cplog.close()


def configure(builder_or_conf: Any, *, check: bool = True, **settings: str) -> Any:
    """Enable spark-statebackend on a SparkSession.Builder, a SparkConf, or a dict of confs.

    Keyword arguments are spark.statebackend.* keys without the prefix, e.g.
    `configure(builder, **{"blobStore.url": "s3://bucket/state"})`. Returns the same object.
    With `check`, the blob store and the checkpoint log are contacted now, so a bad URL or an
    unreachable service fails here with a message naming the key."""
    existing = _entries(builder_or_conf)
    added, settings_now = spark_conf_for(existing, **settings)
    for k, v in added.items():
        _set(builder_or_conf, k, v)
    if check and settings_now.enabled:  # disabled: nothing is contacted or created, as at start
        check_services(settings_now)
    return builder_or_conf


def _entries(obj: Any) -> dict[str, str]:
    if isinstance(obj, Mapping):
        return {str(k): str(v) for k, v in obj.items()}
    if hasattr(obj, "_options"):  # SparkSession.Builder
        return {str(k): str(v) for k, v in obj._options.items()}
    if hasattr(obj, "getAll"):  # SparkConf
        return {str(k): str(v) for k, v in obj.getAll()}
    raise TypeError(
        f"configure() takes a SparkSession.Builder, a SparkConf or a dict, not {type(obj).__name__}"
    )


def _set(obj: Any, key: str, value: str) -> None:
    if isinstance(obj, MutableMapping):
        obj[key] = value
    elif hasattr(obj, "_options"):
        obj.config(key, value)
    else:
        obj.set(key, value)
