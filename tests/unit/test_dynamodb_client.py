"""dynamodb.client: the attempt loop against a scripted local DynamoDB, on both sources of its target (`lean`:
the environment alone, `lean-botocore`: botocore), as tests/conftest.py's build_transport names them.

Backoffs are pinned (`random=`) and recorded instead of waited (`sleep=`), so the retry rule's waits are exact.
"""

from __future__ import annotations

import os
import socket
import time
import zlib

import orjson
import pytest

from idempotency_layer.aws.target import Credentials
from idempotency_layer.stores.dynamodb import DEADLINE, LAST_CHANCE_S, Deadline, DynamoDBError, make_transport
from idempotency_layer.stores.dynamodb.botocore_source import from_botocore
from idempotency_layer.stores.dynamodb.client import Client
from idempotency_layer.stores.dynamodb.environment import plain_lambda
from tests.support.scripted_dynamodb import (
    OPTIONS,
    PREFIX,
    SOURCES,
    Sleeps,
    answer,
    failed_condition,
    server_error,
    throttle,
    unused_port,
)


@pytest.fixture(params=list(SOURCES))
def source(request):
    return SOURCES[request.param]


def lean(source: str, **options) -> Client:
    """A Client on the target `source` resolves from the environment now; the backoff at the top of its range."""
    target = plain_lambda(os.environ) if source == "environment" else from_botocore()
    assert target is not None and target.source == source
    return Client(target, **{**OPTIONS, "random": lambda: 1.0, **options})


def soon(seconds: float = 0.3) -> Deadline:
    return Deadline.after(seconds)


# -- the request ----------------------------------------------------------------------------------------------


def test_the_wire_request(scripted, aws_env, source):
    aws_env.setenv("AWS_SESSION_TOKEN", "tok")
    server = scripted(answer(body={"Item": {"b": {"B": "AAE="}}}))
    params = {"TableName": "t", "Key": {"id": {"S": "k"}}, "ConsistentRead": True}
    assert lean(source).call("GetItem", params) == {"Item": {"b": {"B": "AAE="}}}  # B as the wire's base64
    headers = server.headers(0)
    assert headers["x-amz-target"] == "DynamoDB_20120810.GetItem"
    assert headers["content-type"] == "application/x-amz-json-1.0"
    assert headers["host"] == server.endpoint.split("://")[1]
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "/eu-west-1/dynamodb/aws4_request" in headers["authorization"]
    assert ("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target,"
            in headers["authorization"])
    assert headers["x-amz-security-token"] == "tok"
    assert headers["accept-encoding"] == "identity"  # no compressed answer: the CRC32 is of the body as sent
    assert "user-agent" in headers
    assert server.paths == ["/"]
    assert orjson.loads(server.requests[0][1]) == params


def test_the_legacy_token_is_the_one_botocore_sends(scripted, aws_env, source):
    aws_env.setenv("AWS_SESSION_TOKEN", "s")
    aws_env.setenv("AWS_SECURITY_TOKEN", "l")
    server = scripted(answer())
    lean(source).call("GetItem", {})
    assert server.headers(0)["x-amz-security-token"] == "l"


def test_each_attempt_is_signed_afresh(scripted, source):
    server = scripted(throttle(), answer())
    lean(source, max_attempts=2, sleep=lambda s: time.sleep(1.1)).call("PutItem", {})
    dates = [server.headers(i)["x-amz-date"] for i in range(2)]
    assert dates[0] != dates[1]  # a re-sent request carries its own X-Amz-Date, as botocore signs each attempt


# -- retries --------------------------------------------------------------------------------------------------


def test_throttled_twice_then_success(scripted, source):
    server = scripted(throttle(), throttle(), answer(body={"Item": {}}))
    sleeps = Sleeps()
    assert lean(source, max_attempts=3, sleep=sleeps).call("GetItem", {}) == {"Item": {}}
    assert server.count == 3 and sleeps == [1.0, 2.0]  # a throttle's backoff: from 1 s, doubling


def test_throttled_until_attempts_run_out(scripted, source):
    server = scripted(throttle())
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=3, sleep=sleeps).call("PutItem", {"TableName": "t", "Item": {}})
    assert server.count == 3 and len(sleeps) == 2
    error = caught.value
    assert (error.operation, error.code, error.message, error.status, error.uncertain) == (
        "PutItem", "ThrottlingException", "Rate exceeded", 400, False)


def test_server_errors_retry_then_succeed(scripted, source):
    server = scripted(server_error(), answer(body={"Attributes": {"n": {"N": "2"}}}))
    sleeps = Sleeps()
    result = lean(source, max_attempts=2, sleep=sleeps).call("UpdateItem", {"TableName": "t", "Key": {}})
    assert result == {"Attributes": {"n": {"N": "2"}}} and server.count == 2
    assert sleeps == [pytest.approx(0.025)]  # DynamoDB's base for transient errors


def test_attempts_run_out(scripted, source):
    server = scripted(server_error())
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=3, sleep=Sleeps()).call("PutItem", {})
    assert server.count == 3
    assert (caught.value.code, caught.value.status, caught.value.message) == (
        "InternalServerError", 500, "Internal server error")


def test_a_failed_condition_is_not_retried_and_carries_the_old_item(scripted, source):
    old = {"id": {"S": "k"}, "status": {"S": "COMPLETED"}}
    server = scripted(failed_condition(old))
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=3, sleep=sleeps).call("PutItem", {"TableName": "t", "Item": {}})
    assert server.count == 1 and sleeps == []
    error = caught.value
    assert (error.code, error.item, error.status, error.uncertain) == ("ConditionalCheckFailedException", old, 400,
                                                                       False)


def test_a_damaged_body_is_retried(scripted, source):
    server = scripted(answer(body={"Item": {"v": {"S": "x"}}}, crc=12345), answer(body={"Item": {"v": {"S": "x"}}}))
    assert lean(source, max_attempts=2, sleep=Sleeps()).call("GetItem", {})["Item"] == {"v": {"S": "x"}}
    assert server.count == 2


def test_a_body_damaged_every_time_is_a_checksum_error(scripted, source):
    server = scripted(answer(crc=12345))
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=2, sleep=Sleeps()).call("GetItem", {})
    assert server.count == 2 and caught.value.code == "ChecksumError" and caught.value.uncertain


@pytest.mark.parametrize("header", ["0xcbf43926", "", "1, 1", "abc"])
def test_a_crc32_header_that_is_no_integer_is_a_mismatch_and_retried(scripted, source, header):
    # botocore's own retry check would raise ValueError on it; it is a damaged answer like any other.
    server = scripted(answer(crc=None, headers={"x-amz-crc32": header}), answer(body={"Item": {}}))
    assert lean(source, max_attempts=2, sleep=Sleeps()).call("GetItem", {}) == {"Item": {}} and server.count == 2
    scripted(answer(crc=None, headers={"x-amz-crc32": header}))
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=2, sleep=Sleeps()).call("GetItem", {})
    assert caught.value.code == "ChecksumError" and caught.value.uncertain


def test_a_response_without_crc_is_accepted(scripted, source):
    scripted(answer(body={"Item": {}}, crc=None))
    assert lean(source).call("GetItem", {}) == {"Item": {}}


def test_read_timeout_is_retried_then_reported(scripted, source):
    server = scripted(answer(delay=0.6))
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        lean(source, read_timeout=0.2, max_attempts=2, sleep=sleeps).call("GetItem", {})
    assert server.count == 2 and len(sleeps) == 1
    assert caught.value.code == "ReadTimeoutError" and caught.value.status is None and caught.value.uncertain


def test_connection_refused_is_retried_and_was_never_applied(aws_env, source):
    port = unused_port()
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{port}")
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=3, sleep=sleeps).call("GetItem", {})
    assert caught.value.code == "EndpointConnectionError" and not caught.value.uncertain
    assert f"127.0.0.1:{port}" in caught.value.message
    assert len(sleeps) == 2  # three attempts


def test_connections_are_kept_alive(scripted, source):
    server = scripted(answer())
    client = lean(source)
    for _ in range(5):
        client.call("GetItem", {})
    assert server.count == 5 and len(server.peers) == 1


# -- whether a failure may have been applied ------------------------------------------------------------------

_FAILURES = [
    ("throttled", (throttle(),), False),  # refused: not applied
    ("refused", (answer(400, {"__type": PREFIX + "ValidationException", "message": "bad"}),), False),
    ("5xx", (server_error(),), True),  # a 5xx says nothing of whether it was applied
    ("5xx-then-throttled", (server_error(), throttle()), True),  # an earlier attempt of the call may have been
    ("5xx-then-failed-condition", (server_error(), failed_condition()), True),
    ("damaged", (answer(crc=1),), True),
    ("unreadable-400", (answer(400, b"not json"),), True),  # a 400 cut short may have answered a claim
]


@pytest.mark.parametrize(("script", "uncertain"), [pytest.param(s, u, id=n) for n, s, u in _FAILURES])
def test_a_failure_says_whether_the_request_may_have_been_applied(scripted, source, script, uncertain):
    scripted(*script)
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=len(script), sleep=Sleeps()).call("PutItem", {"TableName": "t"})
    assert caught.value.uncertain is uncertain, caught.value


def test_an_answer_that_cannot_be_read_may_have_been_applied_and_is_not_retried(scripted, source):
    server = scripted(answer(body=b"not json"))
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=3, sleep=Sleeps()).call("PutItem", {})
    assert caught.value.code == "ResponseParserError" and caught.value.uncertain and server.count == 1


@pytest.mark.parametrize("body", [b"[1, 2]", b'{"__type": 5, "message": 7}', b"\xff\xfe"])
def test_a_5xx_whose_body_cannot_be_read_is_retried_and_may_have_been_applied(scripted, source, body):
    server = scripted(answer(500, body))
    with pytest.raises(DynamoDBError) as caught:
        lean(source, max_attempts=2, sleep=Sleeps()).call("PutItem", {"TableName": "t"})
    assert caught.value.uncertain and caught.value.code == "500" and server.count == 2


# -- credentials ----------------------------------------------------------------------------------------------


def test_no_credentials_is_a_dynamodb_error_raised_without_retry(scripted, aws_env, source):
    server = scripted(answer())
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    target = from_botocore()  # the environment source does not serve an environment without credentials
    assert plain_lambda(os.environ) is None
    sleeps = Sleeps()
    with pytest.raises(DynamoDBError) as caught:
        Client(target, **{**OPTIONS, "max_attempts": 3, "sleep": sleeps}).call("GetItem", {})
    assert caught.value.code == "NoCredentialsError" and not caught.value.uncertain
    assert server.count == 0 and sleeps == []


def test_credentials_the_source_cannot_get_are_an_error_before_sending(scripted):
    server = scripted(answer())
    target = plain_lambda(os.environ)

    def broken():
        raise RuntimeError("the container credentials endpoint did not answer")

    with pytest.raises(DynamoDBError) as caught:
        Client(target._replace(credentials=broken), **OPTIONS).call("GetItem", {})
    assert caught.value.code == "RuntimeError" and not caught.value.uncertain and server.count == 0


def test_what_a_failed_credential_source_said_is_not_quoted(scripted):
    # A hostile review's container credentials endpoint answered 500 with a body of its own, which reached the
    # layer's log lines through botocore's message.
    server = scripted(answer())

    def broken():
        raise RuntimeError("Received non 200 response 500 from container metadata: INTERNAL-SECRET-500-BODY")

    with pytest.raises(DynamoDBError) as caught:
        Client(plain_lambda(os.environ)._replace(credentials=broken), **OPTIONS).call("GetItem", {})
    assert "SECRET" not in str(caught.value) and caught.value.code == "RuntimeError" and server.count == 0


@pytest.mark.parametrize("deadline", [True, False], ids=["with a deadline", "without"])
def test_a_credential_refresh_that_waits_gets_the_attempts_time_and_sends_nothing(scripted, deadline):
    # A hostile review's slow container credentials endpoint held a completion 9 to 21 s past a 5 s deadline:
    # botocore's refresh has timeouts of its own, not the invocation's.
    server = scripted(answer())
    target = plain_lambda(os.environ)
    stuck = target._replace(credentials=lambda: time.sleep(5) or target.credentials(), may_wait=lambda: True)
    client = Client(stuck, **{**OPTIONS, "connect_timeout": 0.3, "read_timeout": 0.3})
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        client.call("UpdateItem", {}, soon(0.4) if deadline else None)
    assert caught.value.code == DEADLINE and not caught.value.uncertain and server.count == 0
    assert time.monotonic() - started < 3.0  # the attempt's time (0.4 s or 0.6 s), not the refresh's 5 s
    # Credentials that need no refresh are got directly, at no cost.
    ready = target._replace(may_wait=lambda: False)
    assert Client(ready, **OPTIONS).call("GetItem", {}) == {}


@pytest.mark.parametrize("bad", [("AKID\r\nX-Injected: 1", None), ("AKID", "tok\u043a"), ("AKID", "t\x00")])
def test_credentials_a_source_gives_that_cannot_go_in_a_header_are_refused_before_sending(scripted, bad):
    # The environment's are refused at build (below); botocore's (a profile, a container endpoint) arrive later.
    server = scripted(answer())
    target = plain_lambda(os.environ)
    access, token = bad
    odd = target._replace(credentials=lambda: Credentials(access, "secret", token))
    with pytest.raises(DynamoDBError) as caught:
        Client(odd, **OPTIONS).call("GetItem", {})
    assert caught.value.code == "UnsendableCredentials" and not caught.value.uncertain and server.count == 0
    assert "Injected" not in str(caught.value) and "tok" not in str(caught.value)


@pytest.mark.parametrize(("name", "value"), [
    ("AWS_SESSION_TOKEN", "tok\r\nX-Injected: 1"),
    ("AWS_SECURITY_TOKEN", "legacy\r"),
    ("AWS_ACCESS_KEY_ID", "AKID\r\nX-Injected: 1"),
    ("AWS_SESSION_TOKEN", "t\u20acken"),  # not Latin-1: http.client could not encode it
    ("AWS_SECRET_ACCESS_KEY", "secret\udcffvalue"),  # not UTF-8: no request could be signed
])
@pytest.mark.parametrize("kind", [*SOURCES, "boto3"])
def test_credentials_that_cannot_be_sent_are_refused_at_build(scripted, aws_env, kind, name, value):
    server = scripted(answer())
    aws_env.setenv(name, value)
    source = {"source": SOURCES[kind]} if kind in SOURCES else {}
    with pytest.raises(ValueError) as caught:
        make_transport("boto3" if kind == "boto3" else "lean", **source, **OPTIONS)
    message = str(caught.value)
    assert name in message and value not in message and "X-Injected" not in message
    assert "secret" not in message.replace("AWS_SECRET_ACCESS_KEY", "") and caught.value.__context__ is None
    assert server.count == 0


# -- TLS: the CA bundle each source resolves ------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"])
def test_https_verifies_against_the_configured_ca_bundle(scripted, aws_env, own_ca, source, setting):
    server = scripted(answer(body={"Item": {}}), tls=own_ca["context"])
    aws_env.setenv(setting, own_ca["ca"])
    client = lean(source, read_timeout=2)
    assert client.target.cafile == own_ca["ca"]
    assert client.call("GetItem", {}) == {"Item": {}} and client.call("GetItem", {}) == {"Item": {}}
    assert server.count == 2 and len(server.peers) == 1  # kept alive over TLS


def test_https_refuses_a_certificate_the_bundle_does_not_trust(scripted, aws_env, own_ca, source):
    server = scripted(answer(), tls=own_ca["context"])
    aws_env.setenv("AWS_CA_BUNDLE", own_ca["other"])
    with pytest.raises(DynamoDBError) as caught:
        lean(source).call("GetItem", {})
    assert caught.value.code == "SSLError" and "CERTIFICATE_VERIFY_FAILED" in caught.value.message
    assert not caught.value.uncertain  # the handshake failed: nothing was sent
    assert server.count == 0


# -- a deadline cuts a call short -----------------------------------------------------------------------------
# Each test's server answers well within the client's own timeouts, so only the deadline can stop the call.


def test_a_deadline_cuts_the_read_timeout(scripted, source):
    server = scripted(answer(body={"Item": {}}, delay=3.0))
    client = lean(source, read_timeout=5, max_attempts=3, sleep=Sleeps())
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        client.call("UpdateItem", {"TableName": "t"}, soon())
    assert caught.value.code == "ReadTimeoutError" and caught.value.uncertain
    assert time.monotonic() - started < 2.0  # not the 3 s answer, nor the 5 s read timeout
    assert server.count == 1  # no retry once the deadline passed
    assert client.call("GetItem", {}) == {"Item": {}}  # without one, the same server is waited for


def test_a_deadline_just_passed_still_gets_one_short_attempt(scripted, source):
    # A completion that usually takes milliseconds is worth trying; one that is slow is not waited for.
    quick = scripted(answer(body={"Item": {}}))
    client = lean(source, read_timeout=5, max_attempts=3, sleep=Sleeps())
    assert client.call("GetItem", {})["Item"] == {}
    assert client.call("GetItem", {}, Deadline(time.monotonic() - 0.01))["Item"] == {} and quick.count == 2
    with pytest.raises(DynamoDBError) as caught:
        client.call("GetItem", {}, Deadline(time.monotonic() - LAST_CHANCE_S))  # its last chance is over
    assert caught.value.code == DEADLINE and not caught.value.uncertain and quick.count == 2  # nothing sent
    slow = scripted(answer(body={"Item": {}}, delay=3.0))
    client = lean(source, read_timeout=5, max_attempts=3, sleep=Sleeps())
    started = time.monotonic()
    with pytest.raises(DynamoDBError) as caught:
        client.call("GetItem", {}, Deadline(started - 0.01))
    assert caught.value.code == "ReadTimeoutError" and slow.count == 1
    assert caught.value.uncertain  # sent, and no answer came
    assert time.monotonic() - started < LAST_CHANCE_S + 1.5  # ended by deadline + LAST_CHANCE_S, not the 3 s answer


def test_no_backoff_runs_past_the_deadline(scripted, source):
    server = scripted(throttle())
    sleeps = Sleeps()
    client = lean(source, max_attempts=5, sleep=sleeps)  # a throttle's first backoff: 1 s
    with pytest.raises(DynamoDBError) as caught:
        client.call("UpdateItem", {}, soon(0.5))
    assert caught.value.code == "ThrottlingException" and server.count == 1 and sleeps == []
    with pytest.raises(DynamoDBError):
        client.call("UpdateItem", {})  # without a deadline the same backoffs are waited out
    assert sleeps == [1.0, 2.0, 4.0, 8.0] and server.count == 6


def test_a_backoff_that_overslept_the_deadline_ends_the_call_uncertain(scripted, source):
    # The backoff fit, but the wait itself ran long (a frozen sandbox): no attempt may start, and the 5xx
    # before it keeps the call uncertain.
    server = scripted(server_error(), answer())
    client = lean(source, max_attempts=3, sleep=lambda seconds: time.sleep(0.5))
    with pytest.raises(DynamoDBError) as caught:
        client.call("PutItem", {}, soon(0.2))
    assert caught.value.code == DEADLINE and caught.value.uncertain and server.count == 1


def test_a_deadline_cuts_the_connect_timeout(aws_env, source):
    # A listener whose accept queue is full: the kernel drops further SYNs, so a connect waits for its timeout.
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
            fillers.append(filler)
        aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{listener.getsockname()[1]}")
        client = lean(source, connect_timeout=30, read_timeout=30, max_attempts=3, sleep=Sleeps())
        started = time.monotonic()
        with pytest.raises(DynamoDBError) as caught:
            client.call("UpdateItem", {}, soon(0.3))
        assert caught.value.code == "ConnectTimeoutError" and not caught.value.uncertain
        assert time.monotonic() - started < 15  # far below the 30 s the client was configured with
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


# -- through a proxy (the botocore source) --------------------------------------------------------------------


def test_through_a_proxy(scripted, aws_env):
    # The scripted server plays the HTTP proxy: it gets the absolute URL, and the Host of the real endpoint.
    proxy = scripted(answer(body={"Item": {}}))
    aws_env.setenv("HTTP_PROXY", proxy.endpoint)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://dynamodb.invalid:8000")
    client = make_transport("lean", **OPTIONS)
    assert client.target.source == "botocore" and client.target.proxy == proxy.endpoint
    assert client.call("GetItem", {}) == {"Item": {}}
    assert proxy.paths == ["http://dynamodb.invalid:8000/"]
    headers = proxy.headers(0)
    assert headers["host"] == "dynamodb.invalid:8000" and "host" in headers["authorization"]
    with pytest.raises(DynamoDBError) as caught:  # the deadline cuts it too: no thread, the same timeouts
        proxy.script[:] = [answer(delay=1.5)]
        client.call("GetItem", {}, soon())
    assert caught.value.code == "ReadTimeoutError"


def test_crc_of_what_was_sent(scripted, source):
    # The client hands the CRC32 check the body as it came: one byte changed in transit is caught.
    data = orjson.dumps({"Item": {"v": {"S": "x"}}})
    server = scripted(answer(body=data, crc=zlib.crc32(data.replace(b"x", b"y"))))
    with pytest.raises(DynamoDBError) as caught:
        lean(source).call("GetItem", {})
    assert caught.value.code == "ChecksumError" and server.count == 1
