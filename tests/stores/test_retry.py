"""RetryPolicy: retries what is transient with jittered, bounded backoff inside a total budget; never
retries what cannot succeed; gives up with an error naming the operation and the last failure."""

from __future__ import annotations

import errno
import time

import pytest

from spark_statebackend.errors import RetryBudgetExceededError
from spark_statebackend.stores.retry import RetryPolicy, default_is_retriable


class HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


class Flaky:
    def __init__(self, failures: list[BaseException], result: str = "done") -> None:
        self.failures = list(failures)
        self.calls = 0
        self.result = result

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.result


def test_transient_errors_are_retried_until_success() -> None:
    sleeps: list[float] = []
    policy = RetryPolicy(budget_seconds=60, initial_backoff=0.1, max_backoff=0.4, sleep=sleeps.append)
    fn = Flaky([ConnectionResetError(), TimeoutError(), HttpError(503), HttpError(429), HttpError(500)] * 2)
    assert policy.call(fn, describe="op") == "done"
    assert fn.calls == 11 and len(sleeps) == 10
    # Full jitter: each sleep lies in [0, min(max_backoff, initial * 2**n)].
    for n, s in enumerate(sleeps):
        assert 0 <= s <= min(0.4, 0.1 * 2**n) + 1e-9
    assert max(sleeps) <= 0.4


@pytest.mark.parametrize(
    "final", [HttpError(400), HttpError(403), HttpError(404), ValueError("bad"), HttpError(501)]
)
def test_final_errors_are_raised_at_once(final: BaseException) -> None:
    fn = Flaky([final])
    with pytest.raises(type(final)):
        RetryPolicy(sleep=lambda s: None).call(fn, describe="op")
    assert fn.calls == 1


def test_the_budget_bounds_the_total_time_and_the_error_is_clear() -> None:
    policy = RetryPolicy(budget_seconds=0.3, initial_backoff=0.01, max_backoff=0.05)
    fn = Flaky([HttpError(503)] * 10_000)
    started = time.monotonic()
    with pytest.raises(RetryBudgetExceededError) as info:
        policy.call(fn, describe="put blob 'x/y'")
    assert time.monotonic() - started < 0.3 + 0.2
    message = str(info.value)
    assert message.startswith("put blob 'x/y': still failing after") and "HTTP 503" in message
    assert (
        f"{fn.calls} attempts" in message and info.value.__cause__ is None and info.value.__suppress_context__
    )


def test_a_zero_budget_means_one_attempt() -> None:
    fn = Flaky([HttpError(503), HttpError(503)])
    with pytest.raises(RetryBudgetExceededError):
        RetryPolicy(budget_seconds=0, sleep=lambda s: None).call(fn, describe="op")
    assert fn.calls == 1


def test_the_default_classification() -> None:
    assert default_is_retriable(OSError(errno.ECONNRESET, "reset"))
    assert default_is_retriable(ConnectionRefusedError())
    assert not default_is_retriable(OSError(errno.ENOENT, "no file"))
    assert not default_is_retriable(PermissionError())
    assert default_is_retriable(HttpError(504)) and not default_is_retriable(HttpError(505))


def test_the_error_text_comes_only_from_describe_error() -> None:
    policy = RetryPolicy(
        budget_seconds=0.05,
        initial_backoff=0.01,
        max_backoff=0.01,
        describe_error=lambda e: "safe description",
    )
    with pytest.raises(RetryBudgetExceededError) as info:
        policy.call(Flaky([ConnectionError("https://x/?sig=SECRET")] * 1000), describe="op")
    assert "safe description" in str(info.value) and "SECRET" not in str(info.value)


def test_invalid_policies_are_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff=0)
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff=2, max_backoff=1)
