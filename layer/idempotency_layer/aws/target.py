"""Where requests go and as whom: what a credential and endpoint source (`environment`, `botocore_source`)
hands the client."""

from __future__ import annotations

import re
from collections import namedtuple
from urllib.parse import quote, urlsplit

__all__ = ["Credentials", "RequestTarget", "Target", "request_target", "without_dot_segments"]


TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NamedTuple

if TYPE_CHECKING:
    class _CredentialsFields(NamedTuple):
        access_key: str
        secret_key: str
        token: str | None
else:
    _CredentialsFields = namedtuple("Credentials", ("access_key", "secret_key", "token"))


class Credentials(_CredentialsFields):
    __slots__ = ()


if TYPE_CHECKING:
    class _TargetFields(NamedTuple):
        endpoint: str  # scheme://host[:port][/path]
        region: str
        # Called before every attempt: refreshable credentials (SnapStart's, a container's) change under a client.
        # None: there are none to sign with. It may raise: the source could not get them.
        credentials: Callable[[], Credentials | None]
        cafile: str | None = None  # for https: the CA bundle to trust (None: OpenSSL's defaults)
        proxy: str | None = None  # an http:// proxy URL
        tcp_keepalive: bool = False
        source: str = "environment"  # which source resolved it: "environment" or "botocore"
        # True when `credentials()` may wait on the network now (a refresh is due): the client then bounds it by
        # the attempt's time
        may_wait: Callable[[], bool] | None = None
else:
    _TargetFields = namedtuple("Target", (
        "endpoint",
        "region",
        "credentials",
        "cafile",
        "proxy",
        "tcp_keepalive",
        "source",
        "may_wait",
    ), defaults=(None, None, False, "environment", None))


class Target(_TargetFields):
    __slots__ = ()


# What urllib3 (which botocore sends through) leaves as it is in a request target: RFC 3986's pchar and "/", and
# in the query "?" too; any other byte is percent-encoded, and so is every "%" unless each one starts an escape.
_PATH_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/")
_QUERY_CHARS = _PATH_CHARS | {"?"}
_ESCAPE = re.compile(r"%[a-fA-F0-9]{2}")


if TYPE_CHECKING:
    class _RequestTargetFields(NamedTuple):
        wire: str  # the path and query on the request line
        signed_path: str  # their canonical forms in the SigV4 signature
        signed_query: str
else:
    _RequestTargetFields = namedtuple("RequestTarget", ("wire", "signed_path", "signed_query"))


class RequestTarget(_RequestTargetFields):
    """Where a POST to an endpoint goes, as botocore sends and signs it."""

    __slots__ = ()


def request_target(endpoint: str) -> RequestTarget:
    """The request target of a POST to `endpoint` (scheme://host[:port][/path][?query][#fragment]), byte for byte
    what botocore sends: the endpoint's path as it is ("/" when it has none), a trailing slash kept, its query
    kept, its fragment dropped, and characters outside a URL percent-encoded (urllib3's rule); signed as
    botocore's SigV4Auth signs a non-S3 request: the path without dot segments and empty segments,
    percent-encoded again but for "/" and "~", and the query's pairs sorted. A ';' in the last segment is refused
    (ValueError)."""
    parts = urlsplit(endpoint)
    path = parts.path or "/"
    if ";" in path.rpartition("/")[2]:
        # botocore sends urlparse's path, without the last segment's ";parameters", and signs urlsplit's, with them:
        # no request of its reaches such an endpoint signed, so there is no way of botocore's to follow.
        raise ValueError("the endpoint URL's last path segment holds ';', which botocore cuts from the path it "
                         "sends but signs: write it as %3B, or end the path with '/'")
    wire = _encoded(path, _PATH_CHARS)
    if parts.query:
        wire += "?" + _encoded(parts.query, _QUERY_CHARS)
    return RequestTarget(wire, quote(without_dot_segments(path), safe="/~"), _sorted_query(parts.query))


def _encoded(component: str, allowed: frozenset[str]) -> str:
    component, escapes = _ESCAPE.subn(lambda match: match.group(0).upper(), component)
    data = component.encode("utf-8", "surrogatepass")
    keep_percent = escapes == data.count(b"%")  # every "%" starts an escape: the component is encoded already
    out = []
    for byte in data:
        char = chr(byte)
        out.append(char if (char == "%" and keep_percent) or (byte < 128 and char in allowed) else f"%{byte:02X}")
    return "".join(out)


def without_dot_segments(path: str) -> str:
    # botocore.utils.remove_dot_segments: RFC 3986 5.2.4, and empty segments removed too (AWS services want it).
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and kept else ""
    return first + "/".join(kept) + last or "/"


def _sorted_query(query: str) -> str:
    # botocore's canonical query string of a URL's own query: its pairs, split at the first "=", sorted, as given.
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(f"{name}={value}" for name, value in pairs)
