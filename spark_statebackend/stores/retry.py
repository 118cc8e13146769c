"""Retrying remote calls: exponential backoff with full jitter, bounded by a total time budget.

One `RetryPolicy` is shared by everything a blob store (or any other remote client) does:

    policy = RetryPolicy(budget_seconds=60, is_retriable=my_classifier, describe_error=my_renderer)
    result = policy.call(lambda: client.get(...), describe="get blob 'a/b' from azure://c/p")

Contract of `call(fn, describe=...)`:
- `fn` is called until it returns; its result is returned.
- An exception for which `is_retriable(exc)` is false propagates at once, unchanged (the caller
  translates it): an authentication failure or a bad request cannot succeed by trying again.
- A retriable exception (throttling, 5xx, timeouts, connection resets) is followed by a sleep drawn
  uniformly from [0, min(max_backoff, initial_backoff * 2**n)] ("full jitter", so many clients that
  failed together do not retry together), then another call.
- No attempt starts once `budget_seconds` have passed since the first one (counting the coming
  sleep); then `RetryBudgetExceededError` is raised, naming `describe`, the number of attempts, the
  time spent and the last error as rendered by `describe_error`. The original exception is not
  chained (`from None`): SDK messages may carry URLs with SAS tokens or signatures, and
  `describe_error` is the one place that decides what of an error is safe to show.
- The budget bounds how long one request keeps failing. One attempt can still last as long as the
  client's own connect/read timeouts, so the worst case is budget + one attempt's timeout; clients
  must therefore set finite timeouts and disable their SDK's own retries (else the two multiply).
- Each retry is logged at WARNING on logger `spark_statebackend.stores.retry` with `describe`.

`fn` must be safe to call again after a failure: a put re-opens its input, a ranged read resumes
from the last byte it kept. The policy is stateless and thread-safe; share one instance freely.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_random_exponential,
)

from ..errors import RetryBudgetExceededError

log = logging.getLogger("spark_statebackend.retry")  # name kept from the flat layout

T = TypeVar("T")

#: HTTP statuses that mean "try again later": request timeout, throttling and server-side trouble.
#: 501 (not implemented) and 505 (HTTP version) are 5xx yet can never succeed on a retry.
RETRIABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 507, 509, 598, 599})

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETRESET,
    }
)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK exception carries, if any (azure-core: status_code; others: status)."""
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    return None


def default_is_retriable(exc: BaseException) -> bool:
    """Network-level trouble and retriable HTTP statuses; everything else is final."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    status = status_of(exc)
    return status is not None and status in RETRIABLE_STATUSES


def default_describe_error(exc: BaseException) -> str:
    """Exception type and HTTP status only: safe for any exception, since no message text is shown."""
    status = status_of(exc)
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status is not None else "")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry with exponential backoff and full jitter within a total time budget; see the module doc.

    `sleep` is injectable so tests can observe the backoff without waiting for it."""

    budget_seconds: float = 120.0
    initial_backoff: float = 0.2
    max_backoff: float = 10.0
    is_retriable: Callable[[BaseException], bool] = default_is_retriable
    describe_error: Callable[[BaseException], str] = default_describe_error
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def __post_init__(self) -> None:
        if self.budget_seconds < 0 or self.initial_backoff <= 0 or self.max_backoff < self.initial_backoff:
            raise ValueError(
                "retry policy needs budget_seconds >= 0 and 0 < initial_backoff <= max_backoff, got "
                f"{self.budget_seconds}, {self.initial_backoff}, {self.max_backoff}"
            )

    def call(self, fn: Callable[[], T], *, describe: str) -> T:
        """Call `fn` until it succeeds, a final error occurs, or the budget is spent (see module doc)."""
        started = time.monotonic()

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            wait = state.upcoming_sleep
            log.warning(
                "retrying %s in %.2fs (attempt %d failed: %s)",
                describe,
                wait,
                state.attempt_number,
                self.describe_error(exc) if exc else "?",
            )

        retrying = Retrying(
            sleep=self.sleep,
            stop=stop_before_delay(self.budget_seconds),
            wait=wait_random_exponential(multiplier=self.initial_backoff, max=self.max_backoff),
            retry=retry_if_exception(self.is_retriable),
            before_sleep=log_retry,
            reraise=False,
        )
        try:
            return retrying(fn)
        except RetryError as e:
            last = e.last_attempt.exception()
            elapsed = time.monotonic() - started
            raise RetryBudgetExceededError(
                f"{describe}: still failing after {e.last_attempt.attempt_number} attempts over "
                f"{elapsed:.1f}s (retry budget {self.budget_seconds:g}s); last error: "
                f"{self.describe_error(last) if last else '?'}"
            ) from None
