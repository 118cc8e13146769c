"""How an S3 (boto3) error is classified for stores/cloud/'s retries and errors: throttling and
server errors are transient, refused credentials `auth`, a missing key or bucket `not_found` or
`no_container`, a failed precondition `exists`; the codes S3 and S3-compatible servers use for each.
"""

from __future__ import annotations

import botocore.exceptions as bx
import urllib3

from .cloud import ErrorInfo, Scrubber
from .retry import RETRIABLE_STATUSES

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "ConditionalRequestConflict",
        "OperationAborted",
        "PriorRequestNotComplete",
        "IDPCommunicationError",
    }
)
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
        "AllAccessDisabled",
    }
)


def status_of(e: bx.ClientError) -> int:
    """The HTTP status of an S3 error response (0: none)."""
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def code_of(e: bx.ClientError) -> str:
    """The S3 error code of an error response ("" if none)."""
    return str(e.response.get("Error", {}).get("Code") or "")


def classify(exc: BaseException, scrub: Scrubber) -> ErrorInfo:
    """What kind of failure `exc` (raised by a boto3 call) is, for the shared retry and error
    handling of stores/cloud/; its text passed through `scrub` (no secret in it)."""
    if isinstance(exc, bx.ClientError):
        status, code = status_of(exc), code_of(exc)
        message = str(exc.response.get("Error", {}).get("Message") or "")
        text = scrub(f"HTTP {status} {code}" + (f": {message}" if message and message != code else ""))
        if code == "NoSuchBucket":
            return ErrorInfo("no_container", text)
        if code in ("NoSuchKey", "NotFound") or (status == 404 and code != "NoSuchUpload"):
            return ErrorInfo("not_found", text)
        if status == 412 or code == "PreconditionFailed":
            return ErrorInfo("exists", text)
        if code in _AUTH_CODES or status in (401, 403):
            return ErrorInfo("auth", text)
        if status == 416 or code == "InvalidRange":
            return ErrorInfo("range", text)
        if code in _TRANSIENT_CODES or status in RETRIABLE_STATUSES:
            return ErrorInfo("transient", text)
        return ErrorInfo("final", text)
    text = scrub(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError)):
        return ErrorInfo(
            "auth", text + " (boto3 looked in the options, env, shared files and instance roles)"
        )
    if isinstance(
        exc,
        (
            bx.HTTPClientError,
            bx.ConnectionError,
            bx.IncompleteReadError,
            urllib3.exceptions.HTTPError,
            ConnectionError,
            TimeoutError,
        ),
    ):
        return ErrorInfo("transient", text)
    return ErrorInfo("final", text)
