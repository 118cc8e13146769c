"""Blob stores: the contract (`BlobStore`) and `open_blob_store`, which picks a backend by URL scheme.

file:///abs/path              LocalBlobStore, the embedded default
azure://<container>/<prefix>  AzureBlobStore (azure-storage-blob)
s3://<bucket>/<prefix>        S3BlobStore (boto3)
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

from ..config import file_url_path
from ..errors import ConfigError
from .base import BlobInfo, BlobStore, Opener, Sink
from .local import LocalBlobStore

__all__ = ["BlobInfo", "BlobStore", "LocalBlobStore", "Opener", "Sink", "open_blob_store"]

SCHEMES = ("file", "azure", "s3")


def open_blob_store(
    url: str, options: Mapping[str, str] | None = None, *, key: str = "blob URL"
) -> BlobStore:
    """Return the BlobStore for `url`. `options` carries backend settings (endpoint, retry budget...);
    `key` is the configuration key named in errors. Nothing is contacted until ensure_ready()."""
    opts = dict(options or {})
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        fsync = opts.get("fsync", "true").lower() not in ("false", "0", "no")
        whole = opts.get("whole_files", "true").lower() not in ("false", "0", "no")
        return LocalBlobStore(file_url_path(url, key), fsync=fsync, whole_files=whole)
    if scheme == "azure":
        from .azure import AzureBlobStore

        return AzureBlobStore.from_url(url, opts, key=key)
    if scheme == "s3":
        from .s3 import S3BlobStore

        return S3BlobStore.from_url(url, opts, key=key)
    raise ConfigError(
        key, f"unknown blob store URL scheme {parsed.scheme!r} in {url!r}; use one of {SCHEMES}"
    )
