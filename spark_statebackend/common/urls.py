"""URLs of blob stores and checkpoint logs: the local path a `file:` URL names, and keeping credentials
out of them (`redact_url` for anything logged or put in an error, `refuse_userinfo` at every entry)."""

from __future__ import annotations

from ..errors import ConfigError

#: Where credentials go instead of a URL's userinfo, by scheme (docs/stores-and-logs.md,
#: "Blob store URLs and options" and "Checkpoint log", says more).
_CREDENTIALS_GO = {
    "s3": "the AWS SDK's standard chain (AWS_* environment, shared config files, SSO, instance "
    "and container roles) or the store options access_key_id + secret_access_key or profile",
    "azure": "DefaultAzureCredential (azure-identity, AZURE_* environment) or the store options "
    "connection_string or account_url, or the environment AZURE_STORAGE_CONNECTION_STRING",
    "kafka": "the checkpoint log options kafka.sasl.username / kafka.sasl.password (with "
    "kafka.security.protocol and kafka.sasl.mechanism)",
}


def redact_url(url: str) -> str:
    """`url` with its userinfo (`user:password@` before the host) replaced by `***`, so that it can be
    logged or put in an error. The one redaction of URLs in this package: use it wherever a URL that
    a user configured is shown.

    Works on malformed URLs too. A URL whose authority (after `scheme://`, up to the first '/') is
    empty or `localhost` has none: a local path may hold an '@'. Any other URL's userinfo is
    everything up to its last '@': a secret may hold a '/' (AWS secret keys do), and blob ids,
    buckets, containers, topics and host names never hold an '@'."""
    sep = url.find("://")
    body = sep + 3 if sep >= 0 else 0
    slash = url.find("/", body)
    if url[body : len(url) if slash < 0 else slash].lower() in ("", "localhost"):
        return url
    at = url.rfind("@", body)
    return url if at < 0 else url[:body] + "***" + url[at:]


def refuse_userinfo(url: str, key: str) -> None:
    """Raise ConfigError naming `key` if `url` holds userinfo (credentials), showing the URL redacted
    and saying where credentials go instead; return None for a URL without any."""
    shown = redact_url(url)
    if shown == url:
        return
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    where = _CREDENTIALS_GO.get(scheme, "the store's or log's options, or the SDK's standard chain")
    raise ConfigError(
        key,
        f"{shown!r} holds credentials before the host ('user:password@'), which would be shown in "
        f"logs, errors and the Spark UI; remove them from the URL and give them through {where}",
    )


def file_url_path(url: str, key: str) -> str:
    """The absolute path of a `file:///abs/path` URL; ConfigError naming `key` for any other form."""
    from urllib.parse import unquote, urlparse

    refuse_userinfo(url, key)
    parsed = urlparse(url)
    if parsed.scheme.lower() != "file" or parsed.netloc not in ("", "localhost"):
        raise ConfigError(key, f"file URL must be file:///absolute/path, got {redact_url(url)!r}")
    path = unquote(parsed.path)
    if not path.startswith("/"):
        raise ConfigError(key, f"file URL must hold an absolute path, got {redact_url(url)!r}")
    return path
