"""dynamodb.boto3_client, the escape hatch (`IDEMPOTENCY_TRANSPORT=boto3`): a plain boto3 client against the
same scripted server, its retries its own, its errors reshaped into DynamoDBError, bounded by a deadline on a
thread of its own only when its own timeouts could outlast it."""

from __future__ import annotations

import threading
import time

import pytest

from idempotency_layer.stores.dynamodb import DEADLINE, LAST_CHANCE_S, Deadline, DynamoDBError, make_transport
from idempotency_layer.stores.dynamodb.boto3_client import worst_case_s
from tests.support.scripted_dynamodb import OPTIONS, PREFIX, answer, failed_condition, server_error, throttle

PARAMS = {"TableName": "t", "Key": {"id": {"S": "k"}}}
ITEM = {"TableName": "t", "Item": {"id": {"S": "k"}}}


def boto3(**options):
    return make_transport("boto3", **{**OPTIONS, "read_timeout": 2, **options})


def test_boto3_counts_the_first_attempt_too(aws_env):
    t = boto3(max_attempts=4)
    assert t.client.meta.config.retries == {"total_max_attempts": 4, "mode": "standard"}


def test_boto3_transport_retries_against_the_same_server(scripted):
    # Its retries are boto3's own; the server's count shows max_attempts counting the first attempt.
    server = scripted(server_error(), server_error(), answer(body={"Item": {"id": {"S": "k"}}}))
    assert boto3(max_attempts=3).call("GetItem", PARAMS)["Item"] == {"id": {"S": "k"}}
    assert server.count == 3


def test_boto3_transport_gives_up_after_max_attempts(scripted):
    server = scripted(server_error())
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=2).call("GetItem", PARAMS)
    assert server.count == 2
    assert (caught.value.code, caught.value.status, caught.value.uncertain) == ("InternalServerError", 500, True)


def test_a_failed_condition_carries_the_old_item(scripted):
    old = {"id": {"S": "k"}, "status": {"S": "COMPLETED"}}
    server = scripted(failed_condition(old))
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=3).call("PutItem", ITEM)
    assert (caught.value.code, caught.value.item, caught.value.uncertain) == (
        "ConditionalCheckFailedException", old, False)
    assert server.count == 1


_FAILURES = [
    ("throttled", (throttle(),), False),
    ("refused", (answer(400, {"__type": PREFIX + "ValidationException", "message": "bad"}),), False),
    ("5xx", (server_error(),), True),
    ("5xx-then-throttled", (server_error(), throttle()), True),  # botocore does not say how earlier attempts ended
]


@pytest.mark.parametrize(("script", "uncertain"), [pytest.param(s, u, id=n) for n, s, u in _FAILURES])
def test_a_failure_says_whether_the_request_may_have_been_applied(scripted, script, uncertain):
    scripted(*script)
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=len(script), read_timeout=1).call("PutItem", ITEM)
    assert caught.value.uncertain is uncertain, caught.value


@pytest.mark.parametrize("body", [b"not json", b"", b"[1, 2]"])
def test_a_2xx_that_is_not_dynamodbs_json_is_never_a_success(scripted, body):
    # botocore reads such a 200 as an empty success: a claim that failed its condition would look taken.
    scripted(answer(body=body))
    with pytest.raises(DynamoDBError) as caught:
        boto3().call("PutItem", ITEM)
    assert caught.value.code == "ResponseParserError" and caught.value.uncertain
    assert f"{len(body)} bytes" in caught.value.message


@pytest.mark.parametrize("body", [b"[1, 2]", b'{"__type": 5, "message": 7}', b"\xff\xfe", b"Forbidden by proxy"])
def test_an_error_whose_body_cannot_be_read_may_have_been_applied(scripted, body):
    scripted(answer(500 if body != b"Forbidden by proxy" else 400, body))
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=2, read_timeout=1).call("PutItem", ITEM)
    assert caught.value.uncertain
    # A JSON object whose __type is no string is botocore's to trip on (a TypeError); the rest are refused first.
    assert caught.value.code == ("TypeError" if body.startswith(b"{") else "ResponseParserError")
    assert "Forbidden" not in caught.value.message  # a body is never quoted


def test_boto3_tripping_on_an_answer_may_have_been_applied(scripted):
    # botocore's retry check raises a bare ValueError on an x-amz-crc32 that is no integer (with one attempt
    # it takes the answer as it is); the request was applied.
    scripted(answer(crc=None, headers={"x-amz-crc32": "abc"}))
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=2, read_timeout=1).call("PutItem", ITEM)
    assert caught.value.uncertain and caught.value.code == "ValueError"
    assert "abc" not in caught.value.message


def test_connection_refused_is_not_uncertain_with_one_attempt(aws_env):
    from tests.support.scripted_dynamodb import unused_port

    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{unused_port()}")
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=1).call("GetItem", PARAMS)
    assert caught.value.code == "EndpointConnectionError" and not caught.value.uncertain
    # With retries, botocore does not say whether an earlier attempt got further.
    with pytest.raises(DynamoDBError) as caught:
        boto3(max_attempts=2).call("GetItem", PARAMS)
    assert caught.value.code == "EndpointConnectionError" and caught.value.uncertain


def test_https_verifies_against_the_configured_ca_bundle(scripted, aws_env, own_ca):
    server = scripted(answer(body={"Item": {}}), tls=own_ca["context"])
    aws_env.setenv("AWS_CA_BUNDLE", own_ca["ca"])
    assert boto3().call("GetItem", PARAMS)["Item"] == {} and server.count == 1


# -- the deadline ---------------------------------------------------------------------------------------------


def calling_threads(t) -> list[str]:
    """The names of the threads botocore sends each request from, recorded through its public event."""
    names: list[str] = []
    t.client.meta.events.register("before-send", lambda **kwargs: names.append(threading.current_thread().name))
    return names


@pytest.mark.parametrize("failing", [False, True], ids=["answer", "error"])
def test_a_deadline_bounds_the_boto3_transport(scripted, failing):
    server = scripted(server_error() if failing else answer(body={"Item": {}}, delay=3.0))
    t = boto3(read_timeout=5, max_attempts=1)
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", PARAMS, Deadline.after(0.3 if not failing else 5.0))
    # A call that ends in time hands back its own answer or error; one that does not, the deadline's.
    assert caught.value.code == ("InternalServerError" if failing else DEADLINE) and server.count == 1
    if not failing:
        assert caught.value.uncertain and "left" in caught.value.message  # still in flight: it may land
        assert time.monotonic() - started < 2.0  # the answer itself comes after 3 s
        assert t.call("GetItem", PARAMS)["Item"] == {}  # without a deadline it is waited for


def test_a_call_that_fits_before_its_deadline_needs_no_thread(scripted):
    scripted(answer(body={"Item": {}}))
    t = boto3(read_timeout=1, max_attempts=3)
    worst = worst_case_s(1, 1, 3)
    assert worst == 3 * 2 + (1 + 5) + (2 + 5) + 1  # backoff caps, each with a retry-after's 5 s, and a second
    threads = calling_threads(t)
    assert t.call("GetItem", PARAMS, Deadline.after(worst + 1))["Item"] == {}
    assert threads == [threading.current_thread().name]
    assert t.call("GetItem", PARAMS, Deadline.after(worst - 1))["Item"] == {}
    assert threads[1] == "idempotency-GetItem"  # its own timeouts could outlast the deadline: waited on a thread


def test_a_deadline_just_passed_still_gets_one_short_attempt(scripted):
    quick = scripted(answer(body={"Item": {}}))
    t = boto3(read_timeout=5, max_attempts=3)
    assert t.call("GetItem", PARAMS)["Item"] == {}  # warm: a client's first call does work of its own
    assert t.call("GetItem", PARAMS, Deadline(time.monotonic() - 0.01))["Item"] == {} and quick.count == 2
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", PARAMS, Deadline(time.monotonic() - LAST_CHANCE_S))  # its last chance is over
    assert caught.value.code == DEADLINE and not caught.value.uncertain and quick.count == 2
    slow = scripted(answer(body={"Item": {}}, delay=3.0))
    t = boto3(read_timeout=5, max_attempts=3)
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        t.call("GetItem", PARAMS, Deadline(started - 0.01))
    assert caught.value.code == DEADLINE and slow.count == 1 and caught.value.uncertain
    assert time.monotonic() - started < LAST_CHANCE_S + 1.5  # the answer itself comes after 3 s
