"""DynamoDB's JSON 1.0 protocol: the request body, and what an answer says.

Pure functions of bytes, no I/O: `encode_body` makes a request's body, `answer_error` reads an answer that is
not a success into the `DynamoDBError` it stands for (CRC32 checked first: a damaged answer is not parsed),
and `decode_answer` reads a success. Error codes and messages are what botocore's JSON parser gives, but that no
message quotes a body (it may hold a stored result): a code that is no exception's name gives the status instead,
a message that is not text is not shown, and a message is kept to one line of at most 300 characters.
"""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import Mapping

import orjson

from .errors import CHECK_FAILED, DynamoDBError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CONTENT_TYPE", "TARGET_PREFIX", "answer_error", "decode_answer", "encode_body", "parse_error"]

TARGET_PREFIX = "DynamoDB_20120810."  # X-Amz-Target is this and the operation's name
CONTENT_TYPE = "application/x-amz-json-1.0"
CRC32_HEADER = "x-amz-crc32"
CHECKSUM_ERROR = "ChecksumError"
PARSER_ERROR = "ResponseParserError"


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


def crc32_ok(headers: Mapping[str, str], body: bytes) -> bool:
    """DynamoDB's `x-amz-crc32` header, when present, is the CRC32 of the response body as sent."""
    expected = headers.get(CRC32_HEADER)
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
        raise DynamoDBError(operation, PARSER_ERROR, unreadable(content), None, status, uncertain=True)
    return answer


def answer_error(operation: str, status: int, headers: Mapping[str, str], body: bytes) -> DynamoDBError | None:
    """The error an answer stands for, or None: a 2xx whose CRC32 (when given) matches. `uncertain` is set
    for this answer alone: a damaged answer, a 5xx, or an error body that is not DynamoDB's JSON (a 400 cut
    short may have answered a claim that landed) say nothing of whether the request was applied."""
    if not crc32_ok(headers, body):
        return DynamoDBError(
            operation, CHECKSUM_ERROR,
            f"Checksum crc32 failed, expected checksum {headers.get(CRC32_HEADER)} did not match calculated "
            f"checksum: {zlib.crc32(body)}",
            None, status, uncertain=True,
        )
    if status < 300:
        return None
    code, message, parsed = _error_fields(status, body)
    # A failed condition's code came from the JSON object's __type: checked no further (a replay's answer
    # carries the whole record).
    damaged = code != CHECK_FAILED and unreadable_error(status, body, is_object=parsed is not None)
    item = parsed.get("Item") if code == CHECK_FAILED and parsed is not None else None
    return DynamoDBError(operation, code, message, item if isinstance(item, dict) else None, status,
                         uncertain=status >= 500 or damaged)


def parse_error(status: int, body: bytes) -> tuple[str, str]:
    """(code, message) of a non-2xx answer, as botocore's JSON parser gives them.

    `__type` without its `com.amazonaws.dynamodb.v20120810#` prefix, `message` or `Message`; an empty or HTML
    5xx body (a load balancer's) gives the status as code and its reason as message.
    """
    code, message, _ = _error_fields(status, body)
    return code, message


def _error_fields(status: int, body: bytes) -> tuple[str, str, dict | None]:
    """`parse_error`'s (code, message), and the body's JSON object when it is one as sent (strict UTF-8, so an
    item taken from it is exactly what DynamoDB stored), else None."""
    stripped = body.strip()
    if status >= 500 and (not stripped or stripped.startswith(b"<html>")):
        from http import HTTPStatus  # only for such answers

        try:
            return str(status), HTTPStatus(status).phrase, None
        except ValueError:
            return str(status), "", None
    parsed: Any = {}
    exact = None
    if body:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            # As botocore reads it: the body decoded with replacements; the message, never an item, may come of it.
            try:
                parsed = orjson.loads(body.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:  # botocore takes the body as the message; it may hold a stored result
                parsed = {"message": unreadable(body)}
        else:
            exact = parsed if isinstance(parsed, dict) else None
        if not isinstance(parsed, dict):
            parsed = {}
    message = parsed.get("message", parsed.get("Message", ""))
    code = parsed.get("__type", str(status))
    if not isinstance(code, str):
        code = str(status)
    if ":" in code:
        code = code.split(":", 1)[0]
    if "#" in code:
        code = code.rsplit("#", 1)[1]
    if not _CODE.fullmatch(code):  # no AWS error code looks so: it may carry anything, and is not passed on
        code = str(status)
    # A message that is not text (an object, a list) may quote anything, a stored result included.
    return code, _clean(message) if isinstance(message, str) else _NOT_TEXT, exact


_MESSAGE_CHARS = 300
_CODE = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # what an error code (an exception's name) is made of
_NOT_TEXT = "a message that is not text (not shown)"


def _clean(message: str) -> str:
    """DynamoDB's own message names the problem (never an item's values); it is kept on one line and cut short,
    so a broken or hostile peer cannot fill or forge log lines with it."""
    if len(message) <= _MESSAGE_CHARS and message.isprintable():  # DynamoDB's own, as a rule: as it is
        return message
    cut = message[:_MESSAGE_CHARS]
    cleaned = "".join(c if c.isprintable() else " " for c in cut)
    return cleaned + ("..." if len(message) > _MESSAGE_CHARS else "")


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


def unreadable_error(status: int, body: bytes, is_object: bool | None = None) -> bool:
    """Whether an error answer's body is not DynamoDB's JSON. An empty or HTML 5xx (a load balancer's) is read
    as botocore reads it, a 5xx; any other body that is not a JSON object was damaged or is not DynamoDB's.
    `is_object`: whether the body is a JSON object, when the caller parsed it already."""
    stripped = body.strip()
    if status >= 500 and (not stripped or stripped.startswith(b"<")):
        return False
    return not (json_object(body) if is_object is None else is_object)
