"""file:// URLs: the local path a `file:` blob store or checkpoint log URL names."""

from __future__ import annotations

from ..errors import ConfigError


def file_url_path(url: str, key: str) -> str:
    """The absolute path of a `file:///abs/path` URL; ConfigError naming `key` for any other form."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    if parsed.scheme.lower() != "file" or parsed.netloc not in ("", "localhost"):
        raise ConfigError(key, f"file URL must be file:///absolute/path, got {url!r}")
    path = unquote(parsed.path)
    if not path.startswith("/"):
        raise ConfigError(key, f"file URL must hold an absolute path, got {url!r}")
    return path
