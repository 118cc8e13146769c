"""Optional dependencies: the cloud blob stores and the Kafka checkpoint log are pip extras.

    pip install 'spark-statebackend[azure]'   azure:// blob stores (azure-storage-blob, azure-identity)
    pip install 'spark-statebackend[s3]'      s3:// blob stores (boto3)
    pip install 'spark-statebackend[kafka]'   kafka:// checkpoint logs (confluent-kafka)
    pip install 'spark-statebackend[all]'     all of them

The file:// blob store and checkpoint log need none. A URL whose backend is not installed fails at
open time with `missing_extra`'s message, naming the key and the extra to install.
"""

from __future__ import annotations

from ..errors import ConfigError


def missing_extra(key: str, scheme: str, extra: str, error: ImportError) -> ConfigError:
    """The error for a `scheme` URL under `key` whose backend's import failed with `error`."""
    module = error.name or str(error)
    return ConfigError(
        key,
        f"{scheme} URLs need the [{extra}] extra, which is not installed (cannot import {module}): "
        f"pip install 'spark-statebackend[{extra}]'",
    )
