"""The DynamoDB client the store talks to. Its modules are layers, each importing only those below it:

    make_transport (here)                                 the factory: which transport, from which source
      client             boto3_client                     the attempt loop / the boto3 escape hatch
      connection  sigv4  retry  wire                      HTTP on http.client, signing, retry rule, protocol
      environment  botocore_source  -> target             where requests go and as whom
      trust  deadline  errors                             TLS trust, the deadline rule, the error model

`lean` (the default) is `client.Client`: DynamoDB's JSON protocol signed by our own SigV4 and sent over
http.client, without botocore's service model, validation and event hooks. Its target (endpoint, region,
credentials, CA bundle, proxy) comes from the environment alone in the plain Lambda case, so no botocore is
imported, and from botocore's public APIs in every other case. `boto3` is a plain boto3 client. Responses are
what DynamoDB sent, parsed: `lean` leaves `B` values as the wire's base64 text where boto3 decodes them to
bytes, and adds no `ResponseMetadata`.
"""

from __future__ import annotations

import os

from ...deadline import LAST_CHANCE_S, Deadline
from .errors import CHECK_FAILED, DEADLINE, DynamoDBError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, Protocol
else:
    Protocol = object  # the interface's documentation at run time; structural for type checkers

__all__ = ["CHECK_FAILED", "DEADLINE", "LAST_CHANCE_S", "Deadline", "DynamoDBError", "Transport", "make_transport"]

KINDS = ("lean", "boto3")
SOURCES = ("environment", "botocore")


class Transport(Protocol):
    region: str
    endpoint: str

    def call(self, operation: str, params: dict, deadline: Deadline | None = None) -> dict:
        """One request, the transport's retries included; raises `DynamoDBError`. With `deadline` the call gives
        up by then: no backoff runs past it, and every attempt ends by what `Deadline.attempt_time` allows."""


def make_transport(
    kind: str, *, connect_timeout: float, read_timeout: float, max_attempts: int, source: str | None = None
) -> Transport:
    """Build the transport named by `kind` (`lean` or `boto3`). `max_attempts` counts the first attempt.

    `source` picks where a `lean` transport's target comes from: None (the default) takes the environment when
    `environment.plain_lambda` can read it and botocore otherwise; `environment` requires the first and
    `botocore` forces the second (tests and comparisons).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
    if kind not in KINDS:
        raise ValueError(f"unknown transport {kind!r}: expected 'lean' or 'boto3'")
    if source not in (None, *SOURCES):
        raise ValueError(f"unknown source {source!r}: expected one of {SOURCES}")
    from ...aws.environment import check_sendable
    from .environment import plain_lambda

    check_sendable(os.environ)  # on every path: botocore would fail each request, the value in its message
    options: dict[str, Any] = {"connect_timeout": connect_timeout, "read_timeout": read_timeout,
                               "max_attempts": max_attempts}
    if kind == "boto3":
        from .boto3_client import Boto3Transport

        return Boto3Transport(**options)
    target = None if source == "botocore" else plain_lambda(os.environ)
    if target is None:
        if source == "environment":
            raise ValueError("the environment is not the plain Lambda case the environment source serves")
        from .botocore_source import from_botocore

        target = from_botocore()
    from .client import Client

    return Client(target, **options)
