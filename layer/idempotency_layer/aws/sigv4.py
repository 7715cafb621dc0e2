"""AWS Signature Version 4, on hashlib and hmac only.

It signs what the client sends (a POST to an already canonical path, no query string) the way botocore's
SigV4Auth does: every header but the hop-by-hop ones and User-Agent is signed, values trimmed and inner whitespace
collapsed, the session token added as X-Amz-Security-Token before signing.

What does not change between requests is worked out once: the signing key once per UTC day, `X-Amz-Date` once a
second, and per distinct method, path and headers (up to _PLANS) the canonical header block around the date and
the signed-header list, so a request costs two SHA-256 and one HMAC over strings joined around its date and body
hash. tests/unit/test_dynamodb_sigv4.py compares the result with botocore's SigV4Auth on generated sequences of
requests and with AWS's published test suite. `presign` signs a GET in its query string as botocore's presigner
does: the Valkey store's IAM tokens for ElastiCache and MemoryDB (tests/unit/test_valkey_parts.py compares them).
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


_PLANS = 64  # distinct (method, path, query, headers) kept per signer: the DynamoDB client has one per operation
_SKIPPED = ("authorization", "x-amz-date", "x-amz-security-token")  # replaced on every signing


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.digest(key, text.encode("utf-8"), "sha256")


class _Plan:
    """What signing one set of headers for one method and path always gives: the headers to send (before the
    date, token and Authorization), the canonical request up to the date and from it to the body's hash, and the
    signed-header list."""

    __slots__ = ("after", "before", "headers", "signed_headers")

    def __init__(self, headers: dict[str, str], token: str | None, method: str, path: str, query: str) -> None:
        signed = {name: value for name, value in headers.items() if name.lower() not in _SKIPPED}
        self.headers = signed.copy()
        signed["X-Amz-Date"] = ""
        if token is not None:
            signed["X-Amz-Security-Token"] = token
        canonical: dict[str, str] = {}
        for name, value in signed.items():
            lower = name.lower()
            if lower not in _UNSIGNED:
                canonical[lower] = " ".join(value.split())
        names = sorted(canonical)
        at = names.index("x-amz-date")
        self.signed_headers = ";".join(names)
        self.before = "\n".join((method.upper(), path, query, "")) + "".join(
            f"{name}:{canonical[name]}\n" for name in names[:at]) + "x-amz-date:"
        self.after = "\n" + "".join(f"{name}:{canonical[name]}\n" for name in names[at + 1:]) + "\n" + \
            self.signed_headers + "\n"


class Signer:
    """Signs requests for one set of credentials, region and service."""

    def __init__(self, access_key: str, secret_key: str, token: str | None, region: str, service: str) -> None:
        self._access_key = access_key
        self._secret = ("AWS4" + secret_key).encode("utf-8")
        self._token = token or None
        self._region = region
        self._service = service
        self._cached = ("", b"")  # (day, key): one tuple, so threads never see one day's key under another
        self._second = (-1, "")  # (whole second, its X-Amz-Date), one tuple for the same reason
        self._plans: dict[tuple, _Plan] = {}

    def _amz_date(self, now: float | None) -> str:
        second = int(time.time() if now is None else now)
        cached_second, amz_date = self._second
        if second != cached_second:
            amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
            self._second = (second, amz_date)
        return amz_date

    def _plan(self, headers: dict[str, str], method: str, path: str, query: str) -> _Plan:
        index = (method, path, query, *headers.items())
        plan = self._plans.get(index)
        if plan is None:
            if len(self._plans) >= _PLANS:  # many paths (S3 objects): start over rather than grow
                self._plans.clear()
            plan = self._plans[index] = _Plan(headers, self._token, method, path, query)
        return plan

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
        amz_date = self._amz_date(now)
        day = amz_date[:8]
        plan = self._plan(headers, method, path, query)
        request = f"{plan.before}{amz_date}{plan.after}{sha256(body).hexdigest()}"
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        to_sign = f"{_ALGORITHM}\n{amz_date}\n{scope}\n{sha256(request.encode('utf-8')).hexdigest()}"
        signature = hmac.digest(self._signing_key(day), to_sign.encode("utf-8"), "sha256").hex()
        signed = plan.headers.copy()
        signed["X-Amz-Date"] = amz_date
        if self._token is not None:
            signed["X-Amz-Security-Token"] = self._token
        signed["Authorization"] = (
            f"{_ALGORITHM} Credential={self._access_key}/{scope}, SignedHeaders={plan.signed_headers}, "
            f"Signature={signature}"
        )
        return signed

    def presign(self, host: str, params: list[tuple[str, str]], expires: int, *, path: str = "/",
                now: float | None = None) -> str:
        """`host`, `path` and `params` as a GET signed in its query string (X-Amz-Expires `expires` seconds, only
        the Host header signed, an empty body), without a scheme: botocore's generate_presigned_url, less
        its `https://`."""
        from urllib.parse import quote

        amz_date = self._amz_date(now)
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
        signature = hmac.digest(self._signing_key(day), to_sign.encode("utf-8"), "sha256").hex()
        query_string = "&".join(f"{name}={value}" for name, value in encoded)
        return f"{host}{path}?{query_string}&X-Amz-Signature={signature}"
