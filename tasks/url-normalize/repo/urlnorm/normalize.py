"""URL normalization for link deduplication.

`normalize` applies these rules:

* scheme and host are lower-cased, and a leading "www." is dropped from the host;
* the default port of the scheme (80 for http, 443 for https) is removed;
* an empty path becomes "/", and a trailing slash is removed from other paths;
* query parameters are sorted, tracking parameters (utm_*, fbclid) dropped;
* the fragment is removed.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
TRACKING_PARAMS = {"fbclid", "gclid"}


def _is_tracking(name: str) -> bool:
    return name.startswith("utm_") or name in TRACKING_PARAMS


def _normalize_host(host: str) -> str:
    host = host.lower().rstrip(".")
    return host.lstrip("www.")


def _normalize_path(path: str) -> str:
    if not path or path == "/":
        return "/"
    return path.rstrip("/") or "/"


def normalize(url: str) -> str:
    """Return the canonical form of an absolute http(s) URL."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"unsupported URL scheme: {url!r}")
    if not parts.hostname:
        raise ValueError(f"URL has no host: {url!r}")
    netloc = _normalize_host(parts.hostname)
    if parts.port is not None and parts.port != DEFAULT_PORTS[scheme]:
        netloc += f":{parts.port}"
    query = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                   if not _is_tracking(k))
    return urlunsplit((scheme, netloc, _normalize_path(parts.path), urlencode(query), ""))


def same_page(first: str, second: str) -> bool:
    """Whether two URLs point to the same page after normalization."""
    return normalize(first) == normalize(second)
