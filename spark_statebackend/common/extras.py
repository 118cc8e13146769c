"""Optional dependencies: pyspark, the cloud blob stores and the Kafka checkpoint log are pip extras.

    pip install 'spark-statebackend[spark]'   configure() and status() in a PySpark driver (pyspark)
    pip install 'spark-statebackend[azure]'   azure:// blob stores (azure-storage-blob, azure-identity)
    pip install 'spark-statebackend[s3]'      s3:// blob stores (boto3)
    pip install 'spark-statebackend[kafka]'   kafka:// checkpoint logs (confluent-kafka)
    pip install 'spark-statebackend[all]'     all of them

The sidecars, the start-up validation, the CLI and the file:// blob store and checkpoint log need
none. A URL whose backend is not installed fails at open time with `missing_extra`'s message, and
configure() or status() without pyspark with `needs_extra`'s, naming the key and the extra to install.
"""

from __future__ import annotations

from ..errors import ConfigError


def missing_extra(key: str, scheme: str, extra: str, error: ImportError) -> ConfigError:
    """The error for a `scheme` URL under `key` whose backend's import failed with `error`."""
    return needs_extra(key, f"{scheme} URLs need", extra, error)


def needs_extra(key: str, who_needs: str, extra: str, error: ImportError) -> ConfigError:
    """The error under `key` for `who_needs` (a subject and its verb: "configure() needs") when the
    import of `extra`'s package failed with `error`; it names the module and the pip command."""
    module = error.name or str(error)
    return ConfigError(
        key,
        f"{who_needs} the [{extra}] extra, which is not installed (cannot import {module}): "
        f"pip install 'spark-statebackend[{extra}]'",
    )
