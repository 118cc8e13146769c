"""What a cloud store makes of an SDK error: its kind (retry or not, which of our errors) and a
description with every secret removed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorInfo:
    """What a backend makes of an SDK exception. `text` must already be free of secrets."""

    #: "not_found" | "no_container" | "exists" | "auth" (refused by the service) | "bad_credentials"
    #: (unusable before anything is sent, e.g. a key that cannot sign) | "range" | "transient" | "final"
    kind: str
    text: str


_URL_QUERY = re.compile(r"(https?://[^\s'\"?]*)\?[^\s'\"]*")
_SECRET_FIELDS = re.compile(
    r"(AccountKey|SharedAccessSignature|sig|Signature|aws_secret_access_key|SecretAccessKey|"
    r"X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|x-amz-security-token)=([^;&\s,'\"]+)",
    re.IGNORECASE,
)


class Scrubber:
    """Removes secrets from text meant for errors and logs: URL query strings (SAS tokens, presigned
    signatures), key=value pairs that name a secret, and the literal secrets the store was given."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first, so a secret that contains another is removed whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str, limit: int = 300) -> str:
        text = _URL_QUERY.sub(r"\1?<redacted>", text)
        text = _SECRET_FIELDS.sub(r"\1=<redacted>", text)
        for s in self._secrets:
            text = text.replace(s, "<redacted>")
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


class RangeOutside(Exception):
    """A ranged read started at or beyond the end of the blob (HTTP 416); the primitives' "range"."""
