"""How requests reach DynamoDB: `lean` (the default) or `boto3`, behind one `Transport` interface.

`lean` speaks the DynamoDB JSON 1.0 protocol itself. In the plain Lambda zip case (static credentials and a
region in the environment, nothing that changes where or how requests go; `fast.plain_lambda`) it needs no
botocore at all: `fast` signs with `sigv4`, sends over kept-alive connections of its own and retries as
botocore's standard mode does. In every other case `botocore_transport.LeanTransport` borrows from botocore:
the credential provider chain, SigV4 signing, region and endpoint resolution (endpoint rule set, configured
endpoint URLs), CA bundle and proxy settings, error parsing, and the standard retry mode. Neither has the part
of a boto3 call that costs the CPU: the service model, parameter validation and (de)serialization by shape,
and the event hooks. `boto3` is a plain boto3 client, for anyone who wants exactly that.

Responses are what DynamoDB sent, parsed: `lean` leaves `B` values as the wire's base64 text where boto3
decodes them to bytes, and adds no `ResponseMetadata`. botocore is imported only when a path needs it.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

__all__ = ["DynamoDBError", "Transport", "make_transport"]

_CRC32_HEADER = "x-amz-crc32"
CHECK_FAILED = "ConditionalCheckFailedException"  # a condition refused: the one answer the store reads, not a failure

class DynamoDBError(Exception):
    """A DynamoDB request failed, after the transport's retries.

    `code` is the AWS error code, or for a failure before any answer the botocore exception's class name
    (`EndpointConnectionError`, `ConnectTimeoutError`, `ReadTimeoutError`, ...). `item` is the `Item` that came
    with a `ConditionalCheckFailedException` asked for `ReturnValuesOnConditionCheckFailure=ALL_OLD`.
    `status` is the HTTP status, None when no answer came. `uncertain` is True when the request may have been
    applied though the call failed: an attempt was sent and got no definite answer (a read timeout, a
    connection lost, a 5xx, a damaged reply), or its outcome is not known.
    """

    def __init__(
        self, operation: str, code: str, message: str, item: dict | None = None, status: int | None = None,
        uncertain: bool = False,
    ) -> None:
        super().__init__(operation, code, message)
        self.operation = operation
        self.code = code
        self.message = message
        self.item = item
        self.status = status
        self.uncertain = uncertain

    def __str__(self) -> str:
        return f"DynamoDB {self.operation} failed: {self.code}: {self.message}"


class Transport(Protocol):
    def call(self, operation: str, params: dict, deadline: float | None = None) -> dict:
        """One request, the transport's retries included. With `deadline` (a `time.monotonic()` value) the call
        gives up by then: no backoff runs past it, and every attempt's timeouts are cut so that it ends by
        `deadline + LAST_CHANCE_S` (see `_time_left`)."""


DEADLINE = "InvocationDeadline"  # the code of a call that ran out of the time it was given
# Near its deadline an attempt still gets this long, ending at most this long after the deadline: a write
# that usually takes milliseconds is worth making, and the time an attempt gets shrinks smoothly to nothing.
LAST_CHANCE_S = 0.1
# Answers that say a request was not applied, though no answer came: it never left (or never connected).
_NOT_SENT = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError", DEADLINE})


def _time_left(deadline: float) -> float | None:
    """Seconds an attempt starting now may take, or None: none may start. Every attempt ends by
    `deadline + LAST_CHANCE_S`."""
    left = deadline - time.monotonic()
    allowed = min(max(left, LAST_CHANCE_S), left + LAST_CHANCE_S)
    return allowed if allowed > 0 else None


def _out_of_time(operation: str, uncertain: bool = False) -> DynamoDBError:
    return DynamoDBError(operation, DEADLINE, "the invocation has no time left for this request",
                         uncertain=uncertain)


def worst_case_s(connect_timeout: float, read_timeout: float, max_attempts: int) -> float:
    """The longest a call may take: every attempt timing out, and the longest backoff between them
    (standard mode's cap doubles from 1 s to 20 s, and an `x-amz-retry-after` may add up to 5 s to each),
    with a second to spare. DNS lookups and credential refreshes have no timeout of their own."""
    backoff = sum(min(20.0, 2.0**i) + 5.0 for i in range(max_attempts - 1))
    return max_attempts * (connect_timeout + read_timeout) + backoff + 1.0


def _within(deadline: float, operation: str, call: Any) -> dict:
    """`call()` on a thread of its own, waited for until `deadline`: for clients whose per-request timeouts
    cannot be changed (botocore's own HTTP session, a boto3 client). A call still running then is left to
    finish on its own; the writes the cycle bounds this way are conditioned on the owner token, so landing
    late is harmless."""
    left = _time_left(deadline)
    if left is None:
        raise _out_of_time(operation)
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:  # handed to the waiting caller, raised there
            outcome.append((False, error))

    worker = threading.Thread(target=target, name=f"idempotency-{operation}", daemon=True)
    worker.start()
    worker.join(left)
    if not outcome:  # still in flight: it may land
        raise DynamoDBError(operation, DEADLINE, f"no answer within the {left:.2f} s the invocation had left",
                            uncertain=True)
    done, value = outcome[0]
    if not done:
        raise value
    return value


class UnsendableCredentials(ValueError):
    """A credential variable holds what cannot go into an HTTP header; the message names it, never its value."""


# What http.client refuses in a header value (botocore's requests then fail with the value in the message), or
# what would end the header and start another: refused at init instead, on every path.
_UNSENDABLE = re.compile(r"[\r\n\x00]|[^\x00-\xff]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # what os.environ makes of bytes that are not UTF-8


def check_sendable(environ: Mapping[str, str]) -> None:
    """Refuse credentials in the environment that would be sent in a header they could break (a CR or LF:
    header injection) or that cannot be sent (not Latin-1), naming the variable, never its value."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"):
        value = environ.get(name)
        if value and _UNSENDABLE.search(value):
            raise UnsendableCredentials(
                f"{name} holds a character that cannot be sent in an HTTP header (a carriage return, line feed, "
                "NUL, or one outside Latin-1); set it to the credential exactly as issued"
            )
    # The secret is never sent, but signing encodes it as UTF-8: bytes that are not UTF-8 (kept by Python as
    # lone surrogates) would fail every request with the secret inside the UnicodeEncodeError.
    # Looked for, not tried: a failed encode would keep the secret in the exception's context.
    secret = environ.get("AWS_SECRET_ACCESS_KEY")
    if secret and _SURROGATE.search(secret):
        raise UnsendableCredentials(
            "AWS_SECRET_ACCESS_KEY holds bytes that are not UTF-8, so no request could be signed with it; set it "
            "to the credential exactly as issued"
        )


def make_transport(
    kind: str, *, connect_timeout: float, read_timeout: float, max_attempts: int, fast: bool | None = None
) -> Transport:
    """Build the transport named by `kind` (`lean` or `boto3`). `max_attempts` counts the first attempt.

    `lean` is the botocore-free fast transport when the environment allows it (`fast=False` forces the
    botocore-based one, for tests and comparisons; `fast=True` requires the fast one).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
    options = {"connect_timeout": connect_timeout, "read_timeout": read_timeout, "max_attempts": max_attempts}
    if kind in ("lean", "boto3"):
        check_sendable(os.environ)  # on every path: botocore would fail each request, the value in its message
    if kind == "lean":
        if fast is not False:
            from .fast import FastTransport, plain_lambda

            plan = plain_lambda(os.environ)
            if plan is not None:
                return FastTransport(plan, **options)
            if fast:
                raise ValueError("the environment is not the plain Lambda case the fast transport serves")
        from .botocore_transport import LeanTransport

        return LeanTransport(**options)
    if kind == "boto3":
        from .botocore_transport import Boto3Transport

        return Boto3Transport(**options)
    raise ValueError(f"unknown transport {kind!r}: expected 'lean' or 'boto3'")


def _encode_default(value: Any) -> Any:
    # orjson calls this for what JSON lacks, and again on what it returns: B/BS values, SS/NS/BS given as sets.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"cannot send a {type(value).__name__} to DynamoDB")


def encode_body(params: dict) -> bytes:
    """The JSON 1.0 request body: the low-level request shape as is, binary values in base64."""
    return orjson.dumps(params, default=_encode_default)


def crc32_ok(headers: Any, body: bytes) -> bool:
    """DynamoDB's `x-amz-crc32` header, when present, is the CRC32 of the response body as sent."""
    expected = headers.get(_CRC32_HEADER)
    if expected is None:
        return True
    try:
        return zlib.crc32(body) == int(expected)
    except ValueError:
        return False


def decode_answer(operation: str, status: int, content: bytes) -> dict:
    """A 2xx answer's body. DynamoDB answers every request with a JSON object (`{}` at least); a body that is
    not one (empty, cut short, a proxy's page) may come from a request that was applied, but nothing says what
    it answered, so it is never read as a success: a claim it answered could be someone else's."""
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise DynamoDBError(operation, "ResponseParserError", unreadable(content), None, status, uncertain=True)
    return answer


def unreadable(body: bytes) -> str:
    """The message for an answer whose body is not DynamoDB's JSON (cut short, a proxy's page): its bytes may
    hold anything, a stored result included, and no message or log line carries content."""
    return f"an answer that is not DynamoDB's JSON ({len(body)} bytes, not shown)"


def json_object(body: bytes) -> bool:
    """Whether `body` is a JSON object, as every DynamoDB answer but an empty or HTML 5xx is."""
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False


def unreadable_error(status: int, body: bytes) -> bool:
    """Whether an error answer's body is not DynamoDB's JSON. An empty or HTML 5xx (a load balancer's) is read
    as botocore reads it, a 5xx; any other body that is not a JSON object was damaged or is not DynamoDB's."""
    stripped = body.strip()
    if status >= 500 and (not stripped or stripped.startswith(b"<")):
        return False
    return not json_object(body)


def condition_item(code: str, body: bytes) -> dict | None:
    """The old `Item` that DynamoDB returns with a failed condition, when asked for ALL_OLD."""
    if code != CHECK_FAILED:
        return None
    try:
        item = orjson.loads(body).get("Item")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return item if isinstance(item, dict) else None
