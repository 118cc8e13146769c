"""How a cloud store sends a request: one primitive run under the shared RetryPolicy (stores/retry.py),
and whatever escapes it translated into our errors, described without secrets (errors.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...errors import BlobExistsError, BlobNotFoundError, BlobStoreError, StateBackendError
from ..retry import RetryPolicy
from .errors import ErrorInfo, RangeOutside
from .options import CloudSettings

T = TypeVar("T")


class Calls:
    """Runs a store's primitives: retried while the backend classifies the error "transient", then
    translated into BlobNotFoundError, BlobExistsError or a BlobStoreError naming the store and what
    failed. Thread-safe; one per store."""

    def __init__(
        self,
        *,
        classify: Callable[[BaseException], ErrorInfo],
        settings: CloudSettings,
        url: str,
        endpoint: str,
        root: str,
        root_word: str,
    ) -> None:
        """`classify` is the backend's reading of an SDK exception; `url`, `endpoint` and `root` (a
        `root_word`: container or bucket) are named in errors and must hold no secret."""
        self._classify = classify
        self._url = url
        self._endpoint = endpoint
        self._root = root
        self._root_word = root_word
        #: The shared retry policy; also used bare where an error must not be translated.
        self.policy = RetryPolicy(
            budget_seconds=settings.retry_budget_seconds,
            initial_backoff=settings.retry_initial_backoff_seconds,
            max_backoff=settings.retry_max_backoff_seconds,
            is_retriable=lambda e: self.kind(e).kind == "transient",
            describe_error=lambda e: self.kind(e).text,
        )

    def call(self, fn: Callable[[], T], what: str, blob_id: str | None = None) -> T:
        """Run one primitive under the retry policy; translate what escapes into our errors. Our own
        errors and RangeOutside pass unchanged; `blob_id` (if given) makes "not found" and "exists"
        the errors naming that blob."""
        try:
            return self.policy.call(fn, describe=f"{what} ({self._url} at {self._endpoint})")
        except (StateBackendError, RangeOutside):
            raise
        except Exception as e:
            raise self._translate(e, what, blob_id) from None

    def kind(self, exc: BaseException) -> ErrorInfo:
        """The backend's classification, except that our own errors are always final."""
        if isinstance(exc, RangeOutside):
            return ErrorInfo("range", "range outside the blob")
        if isinstance(exc, StateBackendError):
            return ErrorInfo("final", str(exc))
        return self._classify(exc)

    def _translate(self, exc: BaseException, what: str, blob_id: str | None) -> BlobStoreError:
        info = self.kind(exc)
        if info.kind == "not_found" and blob_id is not None:
            return BlobNotFoundError(blob_id, self._url)
        if info.kind == "exists" and blob_id is not None:
            return BlobExistsError(blob_id)
        if info.kind == "no_container":
            return BlobStoreError(
                f"{what}: the {self._root_word} {self._root!r} does not exist at {self._endpoint} "
                f"({info.text}); ensure_ready() creates it"
            )
        if info.kind == "bad_credentials":
            return BlobStoreError(
                f"{what}: the credentials for {self._url} cannot be used to sign a request to "
                f"{self._endpoint} ({info.text}); check the account key (its value is not shown)"
            )
        if info.kind == "auth":
            return BlobStoreError(
                f"{what}: {self._endpoint} refused the credentials for {self._url} ({info.text}); "
                "check the account, keys and permissions"
            )
        return BlobStoreError(f"{what} ({self._url}) failed: {info.text}")
