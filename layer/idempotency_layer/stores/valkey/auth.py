"""What the Valkey store's new connections authenticate with (AUTH), one source of three:

- the user and password in IDEMPOTENCY_VALKEY_URL (or none);
- IDEMPOTENCY_VALKEY_SECRET: a password read from Secrets Manager with the function's role (boto3, the runtime's),
  at the first connection, and read again when the server refuses it (a rotated secret);
- IDEMPOTENCY_VALKEY_IAM: an IAM authentication token for ElastiCache or MemoryDB, the URL's user as its `User`,
  signed with the function's credentials by the layer's own SigV4 (`aws.sigv4.Signer.presign`, checked
  against botocore's presigner), valid 15 minutes, a new one made for connections after 10.
"""

from __future__ import annotations

import json
import os
import threading
import time

from .client import ValkeyError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

    from ...config import Valkey

TOKEN_SECONDS = 900  # what ElastiCache and MemoryDB accept as a token's lifetime
TOKEN_REUSE_S = 600  # a token serves new connections this long, so none is used near its end
_TRANSIENT = frozenset({"ThrottlingException", "InternalServiceError", "ServiceUnavailable", "RequestTimeout"})
_SERVICE = {"elasticache": "elasticache", "elasticache-serverless": "elasticache", "memorydb": "memorydb"}


class Auth:
    def __init__(self, url: Valkey, *, connect_timeout: float, read_timeout: float) -> None:
        self.url = url
        self.timeouts = (connect_timeout, read_timeout)
        self._lock = threading.Lock()
        self._secret: tuple[str | None, str] | None = None  # (user, password) read from Secrets Manager
        self._token: tuple[float, str] | None = None  # (made at, token)

    def credentials(self) -> tuple[str | None, str | None]:
        """(user, password) for AUTH; (None, None): send no AUTH."""
        url = self.url
        if url.secret is not None:
            with self._lock:
                if self._secret is None:
                    self._secret = self._read_secret()
                user, password = self._secret
            return user or url.username, password
        if url.iam is not None:
            with self._lock:
                if self._token is None or time.monotonic() - self._token[0] > TOKEN_REUSE_S:
                    self._token = (time.monotonic(), self._sign())
                return url.username, self._token[1]
        return url.username, url.password

    def refused(self) -> bool:
        """The server refused the credentials: whether another attempt may get different ones (a secret read
        again, a new token)."""
        with self._lock:
            again = self._secret is not None or self._token is not None
            self._secret = self._token = None
        return again

    def _sign(self) -> str:
        from ...aws.sigv4 import Signer

        url = self.url
        assert url.iam is not None and url.cache is not None and url.username is not None
        access, secret, token = _credentials()
        params = [("Action", "connect"), ("User", url.username)]
        if url.iam == "elasticache-serverless":
            params.append(("ResourceType", "ServerlessCache"))
        signer = Signer(access, secret, token, os.environ.get("AWS_REGION", ""), _SERVICE[url.iam])
        return signer.presign(url.cache, params, TOKEN_SECONDS)

    def _read_secret(self) -> tuple[str | None, str]:
        secret = self.url.secret
        try:
            import boto3
            from botocore.config import Config

            connect, read = self.timeouts
            client = boto3.client("secretsmanager", region_name=os.environ.get("AWS_REGION") or None, config=Config(
                connect_timeout=connect, read_timeout=read, retries={"mode": "standard", "max_attempts": 2}))
            value = client.get_secret_value(SecretId=secret).get("SecretString")
        except Exception as error:  # botocore's and boto3's own errors: the code, never the value
            code = getattr(error, "response", {}).get("Error", {}).get("Code") or type(error).__name__
            # Secrets Manager could not be reached or was busy: like a server that does not answer (checked again
            # before the first claim). Anything else (no such secret, no access, no credentials) is definite.
            transient = code in _TRANSIENT or "Timeout" in code or "Connection" in code
            raise ValkeyError(f"the Valkey password could not be read from Secrets Manager secret {secret!r}: "
                              f"{code}", code=None if transient else "SECRET") from None
        return _parse(secret, value)


def _parse(secret: str | None, value: Any) -> tuple[str | None, str]:
    """A secret's text: a JSON object with `password` (and `username`, as ElastiCache's rotation keeps them), or
    the password itself."""
    if not isinstance(value, str) or not value:
        raise ValkeyError(f"Secrets Manager secret {secret!r} has no SecretString", code="SECRET")
    if value.lstrip().startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError:
            fields = None
        if not isinstance(fields, dict) or not isinstance(fields.get("password"), str):
            raise ValkeyError(f"Secrets Manager secret {secret!r} holds a JSON object without a text `password`",
                              code="SECRET")
        user = fields.get("username")
        return (user if isinstance(user, str) and user else None), fields["password"]
    return None, value


def _credentials() -> tuple[str, str, str | None]:
    """The function's credentials: Lambda's environment, else botocore's chain."""
    from ...aws.environment import function_credentials

    found = function_credentials(os.environ)
    if found is None:
        raise ValkeyError("IDEMPOTENCY_VALKEY_IAM: no AWS credentials to sign the token with", code="SECRET")
    return found
