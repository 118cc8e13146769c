"""Azure Blob Storage backend (azure-storage-blob): `azure://<container>/<prefix>`.

Blobs are block blobs named `<prefix><blob id>` in `<container>`. Small blobs are one Put Blob;
larger ones are staged as blocks in parallel and committed with Put Block List, so readers keep
seeing the previous blob until the commit (see stores/cloud/ for the shared algorithms). Reads are
parallel ranged GETs delivered in order. The TTL is the blob index tag `ssb_expires_at_ms`; the
sweep deletes with an `x-ms-if-tags` condition, so a blob whose TTL was removed after it was listed
is never deleted.

The account, first match wins:
    option `connection_string`, option `account_url` (+ DefaultAzureCredential from azure-identity),
    env AZURE_STORAGE_CONNECTION_STRING, env AZURE_STORAGE_ACCOUNT_URL (+ DefaultAzureCredential).
Prefer the environment for secrets: a connection string in Spark conf shows in the Spark UI
(Spark's default redaction pattern does not match `connection_string`).

Options (all strings; durations and sizes in Spark's grammar, see common/units.py):
    connection_string, account_url
    retry_budget (120s), retry_initial_backoff (200ms), retry_max_backoff (10s),
    connect_timeout (10s), read_timeout (60s), max_concurrency (8),
    block_size (8m: larger blobs are staged in blocks this big), download_chunk_size (8m).
    Deprecated spellings, one more release: retry_budget_seconds, retry_initial_backoff_seconds,
    retry_max_backoff_seconds, connect_timeout_seconds, read_timeout_seconds (a bare number of seconds).

The SDK's own retries are off (`retry_total=0`): the shared RetryPolicy is the only one, so its
budget means what it says. Errors and logs never show the account key or SAS token.
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import re
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import requests
import urllib3
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobBlock, BlobServiceClient, ContainerClient
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

try:  # what azure-core mounts itself (larger socket reads); private, so fall back to requests' own
    from azure.core.pipeline.transport._bigger_block_size_http_adapters import (
        BiggerBlockSizeHTTPAdapter as _Adapter,
    )
except ImportError:  # pragma: no cover - depends on the azure-core version
    _Adapter = HTTPAdapter  # type: ignore[misc,assignment]

from ..errors import ConfigError
from .cloud import (
    TTL_TAG,
    CloudBlobStore,
    CloudSettings,
    ErrorInfo,
    Scrubber,
    expiry_tag_value,
    parse_settings,
    split_url,
)
from .retry import RETRIABLE_STATUSES

_BACKEND_OPTIONS = ("connection_string", "account_url")
_CONTAINER_NAME = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_MAX_BLOCKS = 50_000


def _ms(dt: datetime | None) -> int:
    return int(dt.timestamp() * 1000) if dt else 0


def _conn_field(conn: str, field: str) -> str | None:
    for part in conn.split(";"):
        k, sep, v = part.partition("=")
        if sep and k.strip().lower() == field.lower():
            return v.strip()
    return None


def _check_account_key(account_key: str | None, url: str, where: str) -> None:
    """Refuse an AccountKey the SDK could not sign any request with (it base64-decodes the key for
    every request, and a failure there would otherwise surface only as each request fails). The
    message names the URL and never the key."""
    if account_key is None:
        return
    try:
        base64.b64decode(account_key.encode("utf-8"))
    except ValueError:  # binascii.Error
        raise ConfigError(
            where,
            f"the AccountKey in the Azure connection string for {url} is not valid base64, so no request "
            "could be signed; check the account key (its value is not shown)",
        ) from None


class AzureBlobStore(CloudBlobStore[str]):
    """BlobStore on an Azure Blob Storage container (or Azurite); see the module docstring."""

    scheme = "azure"
    delete_batch_size = 256  # a blob batch's limit

    def __init__(
        self,
        service: BlobServiceClient,
        container: str,
        prefix: str,
        settings: CloudSettings,
        scrub: Scrubber,
    ) -> None:
        endpoint = urllib.parse.urlsplit(service.primary_endpoint)._replace(query="", fragment="").geturl()
        super().__init__(root=container, prefix=prefix, settings=settings, scrub=scrub, endpoint=endpoint)
        self._service = service
        self._container: ContainerClient = service.get_container_client(container)

    @classmethod
    def from_url(
        cls, url: str, options: Mapping[str, str] | None = None, *, key: str = "blob URL"
    ) -> AzureBlobStore:
        """Build the store from `azure://<container>/<prefix>` and options; contacts nothing."""
        opts = dict(options or {})
        container, prefix = split_url(url, "azure", key, "container")
        if not _CONTAINER_NAME.match(container):
            raise ConfigError(
                key, f"{container!r} is not a valid Azure container name (3-63 of a-z, 0-9 and single '-')"
            )
        settings = parse_settings(opts, key, _BACKEND_OPTIONS)
        # One connection per worker plus a few for metadata calls; requests' default pool is 10.
        session = requests.Session()
        adapter = _Adapter(
            pool_connections=4,
            pool_maxsize=settings.max_concurrency + 4,
            max_retries=Retry(total=False, redirect=False, raise_on_status=False),
        )
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        client_kwargs: dict[str, Any] = {
            "session": session,
            "retry_total": 0,
            "connection_timeout": settings.connect_timeout_seconds,
            "read_timeout": settings.read_timeout_seconds,
            "max_single_put_size": settings.block_size,
            "max_block_size": settings.block_size,
            "max_single_get_size": settings.download_chunk_size,
            "max_chunk_get_size": settings.download_chunk_size,
        }
        conn = opts.get("connection_string")
        account_url = opts.get("account_url")
        source = "option connection_string" if conn else "option account_url"
        if not conn and not account_url:
            conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
            account_url = os.environ.get("AZURE_STORAGE_ACCOUNT_URL")
            source = "AZURE_STORAGE_CONNECTION_STRING" if conn else "AZURE_STORAGE_ACCOUNT_URL"
        if conn:
            secrets = [_conn_field(conn, "AccountKey"), _conn_field(conn, "SharedAccessSignature"), conn]
            _check_account_key(_conn_field(conn, "AccountKey"), url, f"{key} ({source})")
            try:
                service = BlobServiceClient.from_connection_string(conn, **client_kwargs)
            except (ValueError, TypeError):
                # The SDK's message may quote the string, which holds the key: never show it.
                raise ConfigError(
                    f"{key} ({source})", "the Azure connection string is malformed (its value is not shown)"
                ) from None
        elif account_url:
            parsed = urllib.parse.urlsplit(account_url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ConfigError(
                    f"{key} ({source})", "account URL must look like https://<account>.blob.core.windows.net"
                )
            secrets = [parsed.query] if parsed.query else []
            credential: Any = None
            if not parsed.query:  # a SAS in the URL is a credential already
                from azure.identity import DefaultAzureCredential

                credential = DefaultAzureCredential()
            service = BlobServiceClient(account_url, credential=credential, **client_kwargs)
        else:
            raise ConfigError(
                key,
                "no Azure account: set option connection_string or account_url, or the environment "
                "variable AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL",
            )
        cred = getattr(service, "credential", None)
        secrets.append(getattr(cred, "account_key", None))
        return cls(service, container, prefix, settings, Scrubber(secrets))

    # ---- start

    def ensure_ready(self) -> None:
        """Create the container if missing, then list under the prefix to prove read access."""

        def check() -> None:
            try:
                self._container.get_container_properties()
                return
            except ResourceNotFoundError:
                pass
            with contextlib.suppress(ResourceExistsError):  # created concurrently by another instance
                self._container.create_container()

        self._call(check, f"check container {self.root!r}")
        self._call(lambda: self._raw_list_page(self.prefix, None, 1), f"list container {self.root!r}")

    def close(self) -> None:
        super().close()
        self._service.close()

    # ---- errors

    def _classify(self, exc: BaseException) -> ErrorInfo:
        if isinstance(exc, HttpResponseError):
            status = exc.status_code
            raw_code = getattr(exc, "error_code", None)
            code = str(getattr(raw_code, "value", raw_code) or "")
            first_line = str(exc.message or exc.reason or "").split("\n", 1)[0]
            text = self._scrub(
                f"HTTP {status} {code}: {first_line}" if status else f"{type(exc).__name__}: {exc}"
            )
            if status is None and isinstance(exc, ClientAuthenticationError):
                # Raised before anything is sent (AzureSigningError: the account key cannot sign a
                # request): no retry can fix the key, so this must not count as transport trouble.
                return ErrorInfo("bad_credentials", text)
            if status is None:
                # Transport trouble wrapped as a response error (broken chunked stream, decoding).
                return ErrorInfo("transient", text)
            if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
                return ErrorInfo("auth", text)
            if status == 404:
                return ErrorInfo("no_container" if code == "ContainerNotFound" else "not_found", text)
            if (status == 409 and code == "BlobAlreadyExists") or status == 412:
                return ErrorInfo("exists", text)
            if status == 416:
                return ErrorInfo("range", text)
            if status in RETRIABLE_STATUSES:
                return ErrorInfo("transient", text)
            return ErrorInfo("final", text)
        text = self._scrub(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, ClientAuthenticationError):
            return ErrorInfo("auth", text)
        if isinstance(
            exc,
            (
                ServiceRequestError,
                ServiceResponseError,
                requests.RequestException,
                urllib3.exceptions.HTTPError,
                ConnectionError,
                TimeoutError,
            ),
        ):
            return ErrorInfo("transient", text)
        return ErrorInfo("final", text)

    # ---- primitives

    def _blob(self, name: str) -> Any:
        return self._container.get_blob_client(name)

    @staticmethod
    def _tags(expires_ms: int | None) -> dict[str, str] | None:
        return None if expires_ms is None else {TTL_TAG: expiry_tag_value(expires_ms)}

    def _raw_put(self, name: str, data: bytes, metadata: dict[str, str], expires_ms: int | None) -> None:
        self._blob(name).upload_blob(
            data, length=len(data), overwrite=True, metadata=metadata, tags=self._tags(expires_ms)
        )

    def _raw_create(self, name: str, data: bytes, metadata: dict[str, str]) -> None:
        self._blob(name).upload_blob(data, length=len(data), overwrite=False, metadata=metadata)

    def _block_size_for(self, size: int) -> int:
        return max(self.settings.block_size, math.ceil(size / _MAX_BLOCKS))

    def _raw_begin_blocks(self, name: str, metadata: dict[str, str], expires_ms: int | None) -> str:
        # Block ids are per upload, so two uploads of one name never commit each other's blocks.
        return uuid.uuid4().hex

    def _raw_stage_block(self, name: str, upload: str, index: int, data: bytes) -> str:
        block_id = base64.b64encode(f"{upload}-{index:06d}".encode()).decode()
        self._blob(name).stage_block(block_id, data, length=len(data))
        return block_id

    def _raw_commit_blocks(
        self, name: str, upload: str, staged: Sequence[str], metadata: dict[str, str], expires_ms: int | None
    ) -> None:
        self._blob(name).commit_block_list(
            [BlobBlock(block_id=b) for b in staged], metadata=metadata, tags=self._tags(expires_ms)
        )

    def _raw_abort_blocks(self, name: str, upload: str) -> None:
        # Uncommitted blocks cannot be deleted on their own; the service drops them after 7 days.
        return None

    def _raw_open_range(self, name: str, start: int, end: int) -> tuple[int, Iterator[bytes]]:
        downloader = self._blob(name).download_blob(offset=start, length=end - start, max_concurrency=1)
        props = downloader.properties
        content_range = getattr(props, "content_range", None)
        total = int(content_range.rsplit("/", 1)[1]) if content_range else int(props.size)
        return total, downloader.chunks()

    def _raw_delete(self, name: str) -> None:
        try:
            self._blob(name).delete_blob(delete_snapshots="include")
        except ResourceNotFoundError as e:
            if self._classify(e).kind == "no_container":
                raise

    def _raw_delete_batch(self, names: Sequence[str]) -> list[str]:
        answers = self._container.delete_blobs(*names, delete_snapshots="include", raise_on_any_failure=False)
        # A missing blob is deleted; anything else (a missing container included) goes to _raw_delete.
        return [
            n
            for n, r in zip(names, answers, strict=True)
            if r.status_code != 202 and r.headers.get("x-ms-error-code") != "BlobNotFound"
        ]

    def _raw_delete_if_expired(self, name: str, tag_value: str) -> bool:
        try:
            self._blob(name).delete_blob(
                delete_snapshots="include", if_tags_match_condition=f"\"{TTL_TAG}\" = '{tag_value}'"
            )
        except ResourceNotFoundError:
            return False
        except HttpResponseError as e:
            if e.status_code == 412:  # the TTL was removed or changed after the listing
                return False
            raise
        return True

    def _raw_get_tags(self, name: str) -> dict[str, str]:
        return dict(self._blob(name).get_blob_tags() or {})

    def _raw_set_tags(self, name: str, tags: dict[str, str]) -> None:
        self._blob(name).set_blob_tags(tags)

    def _raw_stat(self, name: str) -> tuple[int, int, dict[str, str], dict[str, str] | None]:
        props = self._blob(name).get_blob_properties()
        tags: dict[str, str] | None = {} if not props.tag_count else None
        return int(props.size), _ms(props.last_modified), dict(props.metadata or {}), tags

    def _raw_list_page(
        self, name_prefix: str, token: str | None, page_size: int = 5000
    ) -> tuple[list[tuple[str, int, int, dict[str, str] | None]], str | None]:
        pages = self._container.list_blobs(
            name_starts_with=name_prefix or None, include=["tags"], results_per_page=page_size
        ).by_page(continuation_token=token)
        try:
            page = next(pages)
        except StopIteration:
            return [], None
        items: list[tuple[str, int, int, dict[str, str] | None]] = [
            (b.name, int(b.size), _ms(b.last_modified), dict(b.tags or {})) for b in page
        ]
        following: str | None = getattr(pages, "continuation_token", None)
        return items, following
