"""Blob stores: the contract (`BlobStore`) and `open_blob_store`, which picks a backend by URL scheme.

file:///abs/path              LocalBlobStore, the embedded default (local.py)
azure://<container>/<prefix>  AzureBlobStore (azure-storage-blob; azure.py)
s3://<bucket>/<prefix>        S3BlobStore (boto3; s3.py)

The contract every backend implements is base.py's; the Azure and S3 stores share one implementation
of it (cloud/: retried primitives, block uploads [P1]-[P3], ordered ranged reads [G1]-[G3], TTL tags)
and one retry policy (retry.py). The stores know nothing of snapshots: engine/ names their blobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

from ..common.extras import missing_extra
from ..common.urls import file_url_path, redact_url, refuse_userinfo
from ..errors import ConfigError
from .base import BlobInfo, BlobStore, Opener, Sink
from .local import LocalBlobStore

__all__ = ["BlobInfo", "BlobStore", "LocalBlobStore", "Opener", "Sink", "open_blob_store"]

SCHEMES = ("file", "azure", "s3")

#: Options of a file:// store: name -> default. Unknown names are refused like the cloud stores' are.
FILE_OPTIONS = {"fsync": True, "whole_files": True}


def open_blob_store(
    url: str, options: Mapping[str, str] | None = None, *, key: str = "blob URL"
) -> BlobStore:
    """Return the BlobStore for `url`. `options` carries backend settings (endpoint, retry budget...);
    `key` is the configuration key named in errors. Nothing is contacted until ensure_ready().

    A URL holding credentials (`s3://KEY:SECRET@bucket`) is refused with a ConfigError that shows it
    redacted (common/urls.py): credentials go in the SDKs' chains or the options."""
    refuse_userinfo(url, key)
    opts = dict(options or {})
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        path = file_url_path(url, key)
        flags = _file_options(opts, key)
        return LocalBlobStore(path, fsync=flags["fsync"], whole_files=flags["whole_files"])
    if scheme == "azure":
        try:
            from .azure import AzureBlobStore
        except ImportError as e:
            raise missing_extra(key, "azure://", "azure", e) from None
        return AzureBlobStore.from_url(url, opts, key=key)
    if scheme == "s3":
        try:
            from .s3 import S3BlobStore
        except ImportError as e:
            raise missing_extra(key, "s3://", "s3", e) from None
        return S3BlobStore.from_url(url, opts, key=key)
    raise ConfigError(
        key, f"unknown blob store URL scheme {parsed.scheme!r} in {redact_url(url)!r}; use one of {SCHEMES}"
    )


def _file_options(opts: Mapping[str, str], key: str) -> dict[str, bool]:
    """The file:// store's options as booleans; an unknown option or a value other than true/false
    (1/0, yes/no) is a ConfigError naming it (a typo must not silently mean the default)."""
    unknown = sorted(set(opts) - set(FILE_OPTIONS))
    if unknown:
        raise ConfigError(
            f"{key} options",
            f"unknown option(s) {', '.join(unknown)} for a file:// store; known: {', '.join(FILE_OPTIONS)}",
        )
    out = dict(FILE_OPTIONS)
    for name, raw in opts.items():
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes"):
            out[name] = True
        elif text in ("false", "0", "no"):
            out[name] = False
        else:
            raise ConfigError(f"{key} option {name}", f"{raw!r} is not a boolean (true/false)")
    return out
