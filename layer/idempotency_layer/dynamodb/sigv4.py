"""AWS Signature Version 4, on hashlib and hmac only.

It signs what the client sends (a POST to an already canonical path, no query string) the way
botocore's SigV4Auth does: every header but the hop-by-hop ones and User-Agent is signed, values trimmed and
inner whitespace collapsed, the session token added as X-Amz-Security-Token before signing. The signing key
depends on the day only, so it is derived once per UTC day. tests/unit/test_dynamodb_sigv4.py compares the result
with botocore's SigV4Auth on generated requests and with AWS's published test suite. `presign` signs a GET in its
query string as botocore's presigner does: the Valkey store's IAM tokens for ElastiCache and MemoryDB
(tests/unit/test_valkey_parts.py compares them).
"""

from __future__ import annotations

import hmac
import time
from hashlib import sha256

__all__ = ["Signer"]

_ALGORITHM = "AWS4-HMAC-SHA256"
_EMPTY_SHA256 = sha256(b"").hexdigest()
# botocore's SIGNED_HEADERS_BLACKLIST: headers proxies may change, and User-Agent.
_UNSIGNED = frozenset(
    (
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-amzn-trace-id",
    )
)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), sha256).digest()


class Signer:
    """Signs requests for one set of credentials, region and service."""

    def __init__(self, access_key: str, secret_key: str, token: str | None, region: str, service: str) -> None:
        self._access_key = access_key
        self._secret = ("AWS4" + secret_key).encode("utf-8")
        self._token = token or None
        self._region = region
        self._service = service
        self._cached = ("", b"")  # (day, key): one tuple, so threads never see one day's key under another

    def _signing_key(self, day: str) -> bytes:
        cached_day, key = self._cached
        if day != cached_day:
            key = _hmac(_hmac(_hmac(_hmac(self._secret, day), self._region), self._service), "aws4_request")
            self._cached = (day, key)
        return key

    def sign(
        self,
        headers: dict[str, str],
        body: bytes,
        *,
        method: str = "POST",
        path: str = "/",
        query: str = "",
        now: float | None = None,
    ) -> dict[str, str]:
        """`headers` (which must hold Host) plus X-Amz-Date, X-Amz-Security-Token and Authorization.

        `path` and `query` are used as given: they must already be in canonical form.
        """
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        day = amz_date[:8]
        signed = {
            name: value
            for name, value in headers.items()
            if name.lower() not in ("authorization", "x-amz-date", "x-amz-security-token")
        }
        signed["X-Amz-Date"] = amz_date
        if self._token is not None:
            signed["X-Amz-Security-Token"] = self._token
        canonical: dict[str, str] = {}
        for name, value in signed.items():
            lower = name.lower()
            if lower not in _UNSIGNED:
                canonical[lower] = " ".join(value.split())
        names = sorted(canonical)
        signed_headers = ";".join(names)
        request = "\n".join(
            (
                method.upper(),
                path,
                query,
                "".join(f"{name}:{canonical[name]}\n" for name in names),
                signed_headers,
                sha256(body).hexdigest(),
            )
        )
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        to_sign = f"{_ALGORITHM}\n{amz_date}\n{scope}\n{sha256(request.encode('utf-8')).hexdigest()}"
        signature = hmac.new(self._signing_key(day), to_sign.encode("utf-8"), sha256).hexdigest()
        signed["Authorization"] = (
            f"{_ALGORITHM} Credential={self._access_key}/{scope}, SignedHeaders={signed_headers}, Signature={signature}"
        )
        return signed

    def presign(self, host: str, params: list[tuple[str, str]], expires: int, *, path: str = "/",
                now: float | None = None) -> str:
        """`host`, `path` and `params` as a GET signed in its query string (X-Amz-Expires `expires` seconds, only
        the Host header signed, an empty body), without a scheme: botocore's generate_presigned_url, less
        its `https://`."""
        from urllib.parse import quote

        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        day = amz_date[:8]
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        query = [*params, ("X-Amz-Algorithm", _ALGORITHM), ("X-Amz-Credential", f"{self._access_key}/{scope}"),
                 ("X-Amz-Date", amz_date), ("X-Amz-Expires", str(expires)), ("X-Amz-SignedHeaders", "host")]
        if self._token is not None:
            query.append(("X-Amz-Security-Token", self._token))
        encoded = [(quote(name, safe="-_.~"), quote(value, safe="-_.~")) for name, value in query]
        canonical = "&".join(f"{name}={value}" for name, value in sorted(encoded))
        request = "\n".join(("GET", path, canonical, f"host:{host}\n", "host", _EMPTY_SHA256))
        to_sign = f"{_ALGORITHM}\n{amz_date}\n{scope}\n{sha256(request.encode('utf-8')).hexdigest()}"
        signature = hmac.new(self._signing_key(day), to_sign.encode("utf-8"), sha256).hexdigest()
        query_string = "&".join(f"{name}={value}" for name, value in encoded)
        return f"{host}{path}?{query_string}&X-Amz-Signature={signature}"
