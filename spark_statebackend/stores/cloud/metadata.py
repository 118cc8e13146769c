"""Blob metadata as both clouds accept it: keys lower-case identifiers, values printable ASCII, any
str -> str mapping encoded reversibly."""

from __future__ import annotations

import base64
import contextlib
import re
import urllib.parse
from collections.abc import Mapping

_PLAIN_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_ENCODED = "x_"
# Printable ASCII minus '%': anything else in a value is percent-encoded (headers are ASCII).
_SAFE_VALUE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def encode_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """Metadata as both clouds accept it: keys are lower-case identifiers (Azure requires C#
    identifiers, S3 lower-cases), values printable ASCII. Other keys and values are encoded
    reversibly, so any str -> str mapping round-trips."""
    out: dict[str, str] = {}
    for k, v in (metadata or {}).items():
        if _PLAIN_KEY.match(k) and not k.startswith(_ENCODED):
            name = k
        else:
            name = _ENCODED + base64.b32encode(k.encode()).decode().rstrip("=").lower()
        out[name] = urllib.parse.quote(v, safe=_SAFE_VALUE)
    return out


def decode_metadata(raw: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (raw or {}).items():
        name = k.lower()
        if name.startswith(_ENCODED):
            b32 = name[len(_ENCODED) :].upper()
            # A key that merely looks encoded (someone else's) is kept as it is.
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                name = base64.b32decode(b32 + "=" * (-len(b32) % 8)).decode()
        out[name] = urllib.parse.unquote(v)
    return out
