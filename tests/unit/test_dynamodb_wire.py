"""dynamodb.wire: the JSON 1.0 request body, error parsing (against botocore's JSONParser), what an answer says
(CRC32 first, non-JSON answers never a success, the uncertain flag) and the failed condition's item."""

from __future__ import annotations

import base64
import zlib

import orjson
import pytest
from botocore.parsers import JSONParser
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.stores.dynamodb import wire
from idempotency_layer.stores.dynamodb.errors import CHECK_FAILED, DynamoDBError
from tests.support.scripted_dynamodb import PREFIX


def botocore_error(status: int, body: bytes) -> tuple[str, str]:
    """(code, message) as botocore's JSON protocol parser reads a DynamoDB error answer, its message then kept
    to one line of at most 300 characters, as the layer keeps it."""
    error = JSONParser().parse({"status_code": status, "headers": {}, "body": body}, None)["Error"]
    message = error["Message"]
    one_line = "".join(c if c.isprintable() else " " for c in message[:300]) + ("..." if len(message) > 300 else "")
    return error["Code"], one_line


# -- the request body -----------------------------------------------------------------------------------------


def test_body_is_the_request_shape_with_binary_in_base64():
    params = {
        "TableName": "t",
        "Item": {
            "id": {"S": "k"},
            "n": {"N": "12.50"},
            "b": {"B": b"\x00\xff zip"},
            "ba": {"B": bytearray(b"\x01")},
            "mv": {"B": memoryview(b"\x02")},
            "bs": {"BS": {b"\x03"}},
            "ss": {"SS": frozenset({"x"})},
        },
    }
    body = orjson.loads(wire.encode_body(params))
    item = body["Item"]
    assert item["id"] == {"S": "k"} and item["n"] == {"N": "12.50"}
    assert base64.b64decode(item["b"]["B"]) == b"\x00\xff zip"
    assert item["ba"] == {"B": "AQ=="} and item["mv"] == {"B": "Ag=="}
    assert item["bs"] == {"BS": ["Aw=="]} and item["ss"] == {"SS": ["x"]}
    # Nothing copied into or changed in the caller's params.
    assert params["Item"]["b"]["B"] == b"\x00\xff zip"


def test_body_refuses_what_dynamodb_cannot_take():
    with pytest.raises(TypeError, match="complex"):
        wire.encode_body({"Item": {"x": {"N": 1j}}})


# -- error parsing: botocore's JSON parser --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        (400, {"__type": PREFIX + "ResourceNotFoundException", "message": "no table"}, "ResourceNotFoundException",
         "no table"),
        (400, {"__type": PREFIX + "ValidationException", "Message": "bad"}, "ValidationException", "bad"),
        (400, {"__type": "ThrottlingException"}, "ThrottlingException", ""),
        (500, {"__type": PREFIX + "InternalServerError", "message": "oops"}, "InternalServerError", "oops"),
    ],
)
def test_error_code_and_message_from_the_json_body(status, body, code, message):
    assert wire.parse_error(status, orjson.dumps(body)) == (code, message)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"__type":"' + PREFIX.encode() + b'ThrottlingException","message":"Rate exceeded"}'),
        (400, b'{"__type":"ValidationException","Message":"bad"}'),
        (400, b'{"__type":"X:http://internal","message":"m"}'),
        (400, b""),
        (500, b""),
        (503, b"<html><body>Service Unavailable</body></html>"),
        (502, b"  "),
        (500, b'{"__type":"' + PREFIX.encode() + b'InternalServerError"}'),
        (413, b"{}"),
    ],
)
def test_error_parsing_is_botocores(status, body):
    assert wire.parse_error(status, body) == botocore_error(status, body)


@pytest.mark.parametrize(("status", "body"), [(503, b"<html><body>Service Unavailable</body></html>"), (502, b"")])
def test_an_html_or_empty_5xx_gets_the_status_as_code(status, body):
    code, message = wire.parse_error(status, body)
    assert code == str(status) and message in ("Service Unavailable", "Bad Gateway")


def test_a_body_that_is_not_json_is_never_quoted():
    # botocore makes such a body the message; ours never carries a body (it may hold a stored result).
    assert botocore_error(403, b"Forbidden by proxy") == ("403", "Forbidden by proxy")
    code, message = wire.parse_error(403, b"Forbidden by proxy")
    assert code == "403" and "Forbidden" not in message and "18 bytes" in message
    assert wire.parse_error(400, b"not json") == ("400", "an answer that is not DynamoDB's JSON (8 bytes, not shown)")


def test_a_json_body_that_is_no_object_gives_the_status():
    assert wire.parse_error(400, b"[1,2]") == ("400", "")  # botocore would fail on a list


_codes = st.sampled_from(["ThrottlingException", "ValidationException", CHECK_FAILED, "X", "Some.Thing"])


@settings(max_examples=200, deadline=None)
@given(
    status=st.sampled_from([400, 403, 413, 429, 500, 503]),
    prefix=st.sampled_from(["", PREFIX, "aws.protocoltests#"]),
    code=_codes,
    suffix=st.sampled_from(["", ":http://internal.amazon.com/coral/", ":x"]),
    message_key=st.sampled_from([None, "message", "Message"]),
    message=st.text(max_size=30),
    extra=st.dictionaries(st.sampled_from(["Item", "other"]), st.integers(-9, 9), max_size=2),
)
def test_every_dynamodb_shaped_error_is_parsed_as_botocore_parses_it(status, prefix, code, suffix, message_key,
                                                                      message, extra):
    body = {"__type": prefix + code + suffix, **extra}
    if message_key is not None:
        body[message_key] = message
    data = orjson.dumps(body)
    assert wire.parse_error(status, data) == botocore_error(status, data)


# -- what an answer says --------------------------------------------------------------------------------------


def crc(body: bytes, flip: int = 0) -> dict[str, str]:
    return {"x-amz-crc32": str(zlib.crc32(body) ^ flip)}


def test_crc32():
    body = b'{"Item": {}}'
    assert wire.crc32_ok({}, body)
    assert wire.crc32_ok(crc(body), body)
    assert not wire.crc32_ok(crc(body, 1), body)
    for header in ("garbage", "0xcbf43926", "", "1, 1"):
        assert not wire.crc32_ok({"x-amz-crc32": header}, body)


def test_a_2xx_with_a_matching_or_no_checksum_is_a_success():
    body = b'{"Item": {"b": {"B": "AAE="}}}'
    assert wire.answer_error("GetItem", 200, crc(body), body) is None
    assert wire.answer_error("GetItem", 200, {}, body) is None
    assert wire.decode_answer("GetItem", 200, body) == {"Item": {"b": {"B": "AAE="}}}  # B stays base64 text


@pytest.mark.parametrize("status", [200, 400, 500])
def test_a_damaged_answer_is_a_checksum_error_that_may_have_been_applied(status):
    body = orjson.dumps({"__type": PREFIX + CHECK_FAILED, "message": "m", "Item": {"id": {"S": "secret"}}})
    error = wire.answer_error("PutItem", status, crc(body, 1), body)
    assert isinstance(error, DynamoDBError)
    assert (error.code, error.status, error.uncertain, error.item) == ("ChecksumError", status, True, None)
    assert "secret" not in str(error)  # not parsed, not quoted


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b"null", b'"s"', b'{"cut": ', b"\xff\xfe"])
def test_a_2xx_that_is_not_a_json_object_is_never_a_success(body):
    # A claim answered by something nothing can read may have landed; it must not look taken or free.
    with pytest.raises(DynamoDBError) as caught:
        wire.decode_answer("PutItem", 200, body)
    error = caught.value
    assert (error.code, error.status, error.uncertain) == ("ResponseParserError", 200, True)
    assert f"{len(body)} bytes" in error.message


@pytest.mark.parametrize(
    ("status", "body", "code", "uncertain"),
    [
        (400, throttled := orjson.dumps({"__type": PREFIX + "ThrottlingException", "message": "m"}),
         "ThrottlingException", False),  # refused: not applied
        (400, orjson.dumps({"__type": PREFIX + "ValidationException"}), "ValidationException", False),
        (500, orjson.dumps({"__type": PREFIX + "InternalServerError"}), "InternalServerError", True),  # says nothing
        (503, b"", "503", True),  # a load balancer's empty 5xx
        (502, b"<html>Bad Gateway</html>", "502", True),
        (400, b"not json", "400", True),  # a 400 cut short may have answered a claim that landed
        (400, b'{"__type": "ThrottlingEx', "400", True),
        (400, b"[1, 2]", "400", True),
        (500, b"[1, 2]", "500", True),
        (500, b'{"__type": 5, "message": 7}', "500", True),
        (400, throttled[:-1], "400", True),
    ],
)
def test_an_error_answer_says_whether_the_request_may_have_been_applied(status, body, code, uncertain):
    error = wire.answer_error("PutItem", status, crc(body), body)
    assert (error.code, error.status, error.uncertain) == (code, status, uncertain)
    assert error.operation == "PutItem" and error.item is None


def test_a_failed_condition_is_certain_and_carries_its_item():
    old = {"id": {"S": "k"}, "status": {"S": "COMPLETED"}, "result": {"B": "AAE="}}
    body = orjson.dumps({"__type": PREFIX + CHECK_FAILED, "message": "The conditional request failed", "Item": old})
    error = wire.answer_error("PutItem", 400, crc(body), body)
    assert (error.code, error.message, error.item, error.uncertain) == (
        CHECK_FAILED, "The conditional request failed", old, False)
    assert "COMPLETED" not in str(error)  # the record is carried, never quoted


def _item(status: int, body: bytes) -> dict | None:
    return wire.answer_error("PutItem", status, {}, body).item


def test_the_item_comes_only_with_a_failed_condition_and_exactly_as_sent():
    old = {"id": {"S": "k"}, "b": {"B": "AAE="}}
    body = orjson.dumps({"__type": PREFIX + CHECK_FAILED, "message": "m", "Item": old})
    assert _item(400, body) == old
    assert _item(400, b'{"__type": "x"}') is None
    assert _item(400, body.replace(CHECK_FAILED.encode(), b"ValidationException")) is None
    assert _item(400, b"not json") is None
    assert _item(400, b"[1]") is None
    assert _item(400, b'{"__type": "ConditionalCheckFailedException", "Item": [1]}') is None
    # A body that is not UTF-8 gives botocore's code and message, never an item with replaced characters.
    damaged = body.replace(b'"k"', b'"\xff"')
    assert _item(400, damaged) is None
    assert wire.answer_error("PutItem", 400, {}, damaged).code == CHECK_FAILED


def test_dynamodbs_own_message_is_kept_on_one_line_and_cut_short():
    # A hostile review put text of its own in the message of an error answer: it reaches errors and logs, so it
    # is kept to one line of at most 300 characters.
    body = orjson.dumps({"__type": PREFIX + "ValidationException", "message": "bad\r\nFAKE LOG LINE" + "x" * 1000})
    error = wire.answer_error("PutItem", 400, {}, body)
    assert error.code == "ValidationException"
    assert "\n" not in error.message and "\r" not in error.message
    assert error.message.startswith("bad  FAKE LOG LINE") and len(error.message) == 303
    short = orjson.dumps({"__type": PREFIX + "ResourceNotFoundException", "message": "Requested resource not found"})
    assert wire.answer_error("GetItem", 400, {}, short).message == "Requested resource not found"


@pytest.mark.parametrize("code", [
    "ValidationException\n[ERROR] forged line SECRET" + "z" * 2000,
    "X\r\nSet-Cookie: m",
    "Throttling Exception",
    "",
    "é",
])
def test_an_error_code_that_is_no_exceptions_name_is_the_status(code):
    # A hostile review's broken endpoint put lines of its own, and body content, in `__type`: it reached errors
    # and logs uncut. A code that is no exception's name is not passed on.
    body = orjson.dumps({"__type": PREFIX + code, "message": "short"})
    error = wire.answer_error("PutItem", 400, {}, body)
    assert error.code == "400" and error.message == "short" and not error.uncertain
    assert "SECRET" not in str(error) and "\n" not in str(error) and "Cookie" not in str(error)


@pytest.mark.parametrize("message", [{"Item": {"result": {"S": "SECRET-RESULT"}}}, ["SECRET-RESULT"], 7, None])
def test_a_message_that_is_not_text_is_not_shown(message):
    body = orjson.dumps({"__type": PREFIX + "ValidationException", "message": message})
    error = wire.answer_error("PutItem", 400, {}, body)
    assert error.code == "ValidationException"
    assert error.message == "a message that is not text (not shown)" and "SECRET" not in str(error)
