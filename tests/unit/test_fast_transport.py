# ruff: noqa: F811 - the fixtures imported from test_transport are used as parameters
"""The fast transport without DynamoDB: the signer against botocore's SigV4Auth and AWS's test suite, retry
decisions and the quota against botocore's standard mode, error parsing against botocore's parser, when the
fast path is chosen, and the HTTP sender against a scripted server (keep-alive, dead connections, threads)."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer import botocore_transport, fast
from idempotency_layer.botocore_transport import LeanTransport
from idempotency_layer.fast import FastTransport, Retry, plain_lambda
from idempotency_layer.sigv4 import Signer
from idempotency_layer.transport import DynamoDBError, make_transport
from tests.unit.test_transport import (  # noqa: F401 - fixtures
    Answer,
    Sleeps,
    answer,
    aws_env,
    certificate,
    scripted,
    server_error,
    serving,
    throttle,
)

SUITE = Path(__file__).parent.parent / "data" / "aws4_testsuite"
LAYER = Path(__file__).resolve().parents[2] / "layer"


@pytest.fixture(autouse=True)
def _no_ca_bundle(monkeypatch):
    # This machine may set one for everything; with it, an https endpoint is left to botocore (tested below).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)


# -- the signer ----------------------------------------------------------------------------------------------


def botocore_sign(access, secret, token, region, service, url, headers, body, when):
    from unittest import mock

    from botocore import auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
    with mock.patch.object(auth, "get_current_datetime", lambda: when):
        botocore_transport._SigV4Auth(Credentials(access, secret, token), service, region).add_auth(request)
    return request.headers


header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    access=st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=20),
    secret=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40),
    token=st.one_of(st.none(), header_text),
    region=st.sampled_from(["us-east-1", "eu-west-1", "ap-southeast-2", "cn-north-1", "us-gov-west-1", "local"]),
    host=st.sampled_from(["dynamodb.eu-west-1.amazonaws.com", "127.0.0.1:8000", "localhost:4566", "ddb.example"]),
    operation=st.sampled_from(["PutItem", "GetItem", "UpdateItem", "DeleteItem"]),
    body=st.binary(max_size=300),
    seconds=st.integers(0, 4_102_444_800),
    extra=st.dictionaries(st.sampled_from(["X-Custom", "user-agent", "X-Amzn-Trace-Id"]), header_text, max_size=2),
)
def test_the_signature_is_botocores(access, secret, token, region, host, operation, body, seconds, extra):
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "Host": host,
        "X-Amz-Target": f"DynamoDB_20120810.{operation}",
        **extra,
    }
    ours = Signer(access, secret, token, region, "dynamodb").sign(headers, body, now=seconds)
    theirs = botocore_sign(access, secret, token, region, "dynamodb", f"http://{host}/", headers, body, when)
    for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
        assert ours.get(name) == theirs.get(name), name


def test_the_signing_key_is_derived_once_a_day(monkeypatch):
    signer = Signer("AKID", "secret", None, "eu-west-1", "dynamodb")
    calls = []
    real = __import__("idempotency_layer.sigv4", fromlist=["_hmac"])._hmac
    monkeypatch.setattr("idempotency_layer.sigv4._hmac", lambda *a: calls.append(a) or real(*a))
    for second in range(0, 3600, 60):
        signer.sign({"Host": "h"}, b"", now=1_700_000_000 + second)
    assert len(calls) == 4  # date, region, service, aws4_request: once
    signer.sign({"Host": "h"}, b"", now=1_700_000_000 + 86_400)
    assert len(calls) == 8


def suite_cases():
    return sorted(path.stem for path in SUITE.glob("*.req"))


@pytest.mark.parametrize("case", suite_cases())
def test_aws_signature_v4_test_suite(case):
    raw = (SUITE / f"{case}.req").read_bytes().decode()
    head, _, body = raw.partition("\n\n")
    request_line, *lines = head.split("\n")
    method, target, _ = request_line.split(" ")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name] = value
    creq = (SUITE / f"{case}.creq").read_text()
    token = None
    for line in creq.split("\n"):
        if line.startswith("x-amz-security-token:"):
            token = line.partition(":")[2]
    amz_date = headers.pop("X-Amz-Date")
    headers.pop("X-Amz-Security-Token", None)  # the signer adds it from the credentials, as botocore does
    when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    signer = Signer("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token, "us-east-1", "service")
    signed = signer.sign(headers, body.encode(), method=method, path=target, now=when.timestamp())
    assert signed["X-Amz-Date"] == amz_date
    assert signed["Authorization"] == (SUITE / f"{case}.authz").read_text()


def test_the_suite_has_the_cases_we_rely_on():
    assert {"post-vanilla", "get-vanilla-with-session-token", "post-sts-header-before", "post-header-key-sort"} <= set(
        suite_cases()
    )


# -- retry decisions -----------------------------------------------------------------------------------------

OUTCOMES = [
    (200, None, False, False),
    (400, "ThrottlingException", False, False),
    (400, "ProvisionedThroughputExceededException", False, False),
    (400, "RequestLimitExceeded", False, False),
    (400, "ConditionalCheckFailedException", False, False),
    (400, "ValidationException", False, False),
    (400, "ResourceNotFoundException", False, False),
    (400, "ReplicatedWriteConflictException", False, False),
    (400, "TransactionConflictException", False, False),
    (400, "RequestTimeout", False, False),
    (429, "SomethingNew", False, False),
    (429, "ResourceNotFoundException", False, False),
    (429, "ReplicatedWriteConflictException", False, False),
    (500, "InternalServerError", False, False),
    (503, "503", False, False),
    (502, "502", False, False),
    (504, "504", False, False),
    (None, None, True, False),  # no answer
    (200, None, False, True),  # damaged body
    (500, "InternalServerError", False, True),
]


def botocore_decision(policy, operation, attempt, outcome, request_context, retry_after):
    from botocore.exceptions import EndpointConnectionError

    status, code, failed_send, crc_bad = outcome
    response = None
    if status is not None:
        headers = {} if retry_after is None else {"x-amz-retry-after": retry_after}
        body = b"{}"
        if crc_bad:
            headers["x-amz-crc32"] = str(zlib.crc32(body) ^ 1)
        response = Answer(status, body, headers)
    parsed = None if code is None or crc_bad else {"Error": {"Code": code, "Message": ""}}
    exc = EndpointConnectionError(endpoint_url="http://x", error="refused") if failed_send else None
    context = policy.context(
        operation, attempt, request_context, http_response=response, parsed_response=parsed, caught_exception=exc
    )
    return policy.delay(context)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_attempts=st.integers(1, 10),
    calls=st.lists(
        st.tuples(
            st.sampled_from(["PutItem", "GetItem", "UpdateItem", "DeleteItem"]),
            st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=10),
            st.sampled_from([None, "1500", "-1", "x", "30000"]),
        ),
        min_size=1,
        max_size=60,
    ),
    jitter=st.floats(0, 1),
)
def test_retry_decisions_and_quota_are_botocores(max_attempts, calls, jitter):
    theirs = botocore_transport._RetryPolicy(max_attempts, random=lambda: jitter)
    ours = Retry(max_attempts, random=lambda: jitter)
    for operation, outcomes, retry_after in calls:
        request_context: dict = {}
        taken = 0
        for attempt, outcome in enumerate(outcomes, start=1):
            status, code, failed_send, crc_bad = outcome
            if status is not None and status < 300 and not crc_bad:
                theirs.succeeded(request_context, Answer(status))
                ours.succeeded(taken)
                break
            expected = botocore_decision(theirs, operation, attempt, outcome, request_context, retry_after)
            headers = None if status is None else {"x-amz-retry-after": retry_after} if retry_after else {}
            got = ours.delay(
                operation,
                attempt,
                status=status,
                code=None if crc_bad else code,
                headers=headers,
                failed_send=failed_send,
                crc_mismatch=crc_bad,
            )
            assert (got is None) == (expected is None), (operation, attempt, outcome)
            if got is None:
                break
            assert got[0] == pytest.approx(expected)
            taken = got[1]
        assert ours.capacity == theirs._quota._quota.available_capacity


def test_the_quota_stops_retries_after_sustained_failure():
    retry = Retry(10, random=lambda: 0.0)
    granted = sum(retry.delay("GetItem", 1, status=500, code="InternalServerError") is not None for _ in range(100))
    assert granted == 500 // 14


def test_the_modeled_errors_are_botocores_dynamodb_model():
    from botocore.loaders import create_loader

    model = create_loader().load_service_model("dynamodb", "service-2")
    for operation, errors in fast.MODELED_ERRORS.items():
        shapes = model["operations"][operation].get("errors", [])
        assert {shape["shape"] for shape in shapes} == errors
        retryable = {s["shape"] for s in shapes if model["shapes"][s["shape"]].get("retryable") is not None}
        assert retryable == fast.RETRYABLE_MODELED.get(operation, set())


PREFIX = "com.amazonaws.dynamodb.v20120810#"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"__type":"' + PREFIX.encode() + b'ThrottlingException","message":"Rate exceeded"}'),
        (400, b'{"__type":"ValidationException","Message":"bad"}'),
        (400, b'{"__type":"X:http://internal","message":"m"}'),
        (400, b"not json"),
        (400, b""),
        (400, b"[1,2]"),
        (500, b""),
        (503, b"<html><body>Service Unavailable</body></html>"),
        (502, b"  "),
        (500, b'{"__type":"' + PREFIX.encode() + b'InternalServerError"}'),
        (413, b"{}"),
    ],
)
def test_error_parsing_is_botocores(status, body):
    if body == b"[1,2]":
        assert fast.parse_error(status, body) == ("400", "")  # botocore would fail on a list
        return
    parsed = botocore_transport.parse_error(status, {}, body)["Error"]
    if body == b"not json":  # botocore makes the body the message; ours never carries a body (it may hold a result)
        assert fast.parse_error(status, body) == (parsed["Code"], "an answer that is not DynamoDB's JSON (8 bytes, "
                                                  "not shown)")
        return
    assert fast.parse_error(status, body) == (parsed["Code"], parsed["Message"])


# -- when the fast path is taken -----------------------------------------------------------------------------

LAMBDA = {
    "AWS_ACCESS_KEY_ID": "AKID",
    "AWS_SECRET_ACCESS_KEY": "s",
    "AWS_SESSION_TOKEN": "t",
    "AWS_REGION": "eu-west-1",
}


def plan(tmp_path, **env):
    merged = {"AWS_CONFIG_FILE": str(tmp_path / "none"), **LAMBDA, **env}
    return plain_lambda({k: v for k, v in merged.items() if v is not None})


def test_the_lambda_environment_is_the_fast_path(tmp_path):
    from botocore.httpsession import get_cert_path

    got = plan(tmp_path)
    # https: the CA bundle botocore would use (certifi's when it imports, else botocore's own).
    assert got == fast.Plan("AKID", "s", "t", "eu-west-1", "https://dynamodb.eu-west-1.amazonaws.com",
                            get_cert_path(True))
    assert plan(tmp_path, AWS_SESSION_TOKEN=None).token is None
    assert plan(tmp_path, AWS_SESSION_TOKEN=None, AWS_SECURITY_TOKEN="legacy").token == "legacy"
    assert plan(tmp_path, AWS_SECURITY_TOKEN="legacy").token == "legacy"  # botocore reads it first
    assert plan(tmp_path, AWS_REGION=None, AWS_DEFAULT_REGION="us-west-2").region == "us-west-2"
    # botocore's order: AWS_DEFAULT_REGION first.
    assert plan(tmp_path, AWS_DEFAULT_REGION="us-west-2").region == "us-west-2"
    assert plan(tmp_path, AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:8000").endpoint == "http://127.0.0.1:8000"
    assert plan(tmp_path, AWS_ENDPOINT_URL="https://ddb.local/").endpoint == "https://ddb.local"
    assert plan(tmp_path, AWS_ENDPOINT_URL_DYNAMODB="").endpoint.startswith("https://dynamodb.")
    assert plan(tmp_path, AWS_SESSION_TOKEN="", AWS_SECURITY_TOKEN="").token is None  # empty: unset, for botocore too
    assert plan(tmp_path, IDEMPOTENCY_TRANSPORT="boto3") is not None  # make_transport decides on the kind
    # A CA bundle does not matter to an http endpoint; for https it is the one trusted.
    assert plan(tmp_path, AWS_CA_BUNDLE="/ca.pem", AWS_ENDPOINT_URL="http://127.0.0.1:8000").cafile is None
    assert plan(tmp_path, AWS_CA_BUNDLE="/ca.pem").cafile == "/ca.pem"
    assert plan(tmp_path, AWS_CA_BUNDLE="/a.pem", REQUESTS_CA_BUNDLE="/r.pem").cafile == "/a.pem"
    assert plan(tmp_path, REQUESTS_CA_BUNDLE="/r.pem").cafile == "/r.pem"
    assert plan(tmp_path, AWS_CA_BUNDLE="", REQUESTS_CA_BUNDLE="/r.pem").cafile == "/r.pem"


@pytest.mark.parametrize(
    "env",
    [
        {"AWS_ACCESS_KEY_ID": None},
        {"AWS_SECRET_ACCESS_KEY": ""},
        {"AWS_REGION": None},
        {"AWS_PROFILE": "dev"},
        {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"},
        {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/creds"},
        {"AWS_CONTAINER_AUTHORIZATION_TOKEN": "x"},
        {"AWS_WEB_IDENTITY_TOKEN_FILE": "/token"},
        {"AWS_CREDENTIAL_EXPIRATION": "2030-01-01T00:00:00Z"},
        {"AWS_USE_FIPS_ENDPOINT": "true"},
        {"AWS_USE_FIPS_ENDPOINT": "false"},  # botocore reads it; left to botocore whatever it says
        {"AWS_USE_DUALSTACK_ENDPOINT": "true"},
        {"AWS_ACCOUNT_ID": "123456789012"},
        {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
        # Set at all, even empty: botocore reads it (an empty AWS_PROFILE is a profile it cannot find).
        {"AWS_PROFILE": ""},
        {"HTTPS_PROXY": ""},
        {"AWS_USE_FIPS_ENDPOINT": ""},
        # Values botocore takes as they are, white space and all, and so reads otherwise or refuses.
        {"AWS_ACCESS_KEY_ID": " AKID"},
        {"AWS_SECRET_ACCESS_KEY": "s "},
        {"AWS_SESSION_TOKEN": " "},
        {"AWS_SECURITY_TOKEN": "t\t"},
        {"AWS_REGION": " eu-west-1"},
        {"AWS_DEFAULT_REGION": " "},
        {"AWS_ENDPOINT_URL_DYNAMODB": " http://127.0.0.1:8000"},
        {"AWS_ENDPOINT_URL": " "},
        {"AWS_CA_BUNDLE": " /ca.pem"},
        {"AWS_CA_BUNDLE": ""},  # botocore's clients refuse an empty one; its lean path falls back to certifi
        {"REQUESTS_CA_BUNDLE": ""},
        {"AWS_REGION": "-eu-west-1"},
        {"HTTPS_PROXY": "http://proxy:3128"},
        {"https_proxy": "http://proxy:3128"},
        {"HTTP_PROXY": "http://proxy:3128"},
        {"AWS_REGION": "cn-north-1"},
        {"AWS_REGION": "us-gov-west-1"},
        {"AWS_REGION": "us-iso-east-1"},
        {"AWS_REGION": "us-isob-east-1"},
        {"AWS_REGION": "eu-isoe-west-1"},
        {"AWS_REGION": "nowhere"},
        {"AWS_REGION": "eu-west-1.evil.com/"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "ftp://x"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://x/path"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://user@x"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://[::1]:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://x:notaport"},
        # Proxy variables in any case, as urllib.request.getproxies_environment reads them for botocore.
        {"Https_Proxy": "http://proxy:3128"},
        {"HTTP_proxy": "http://proxy:3128"},
        {"all_PROXY": "http://proxy:3128"},
        # Hosts botocore refuses (or, for the last two, reads its own way): botocore says what is wrong.
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://my_ddb:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://a..b:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://-a.b:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://dynamod\u00e9.local:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://\u0661\u0662\u0663:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://local\nhost:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://local\thost:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://" + "a" * 64 + ".b:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://dynamodb.local.:8000"},
        # botocore settings that change where or how requests go.
        {"AWS_DATA_PATH": "/somewhere"},
        {"BOTOCORE_TCP_KEEPALIVE": "true"},
    ],
)
def test_every_other_environment_is_botocores(tmp_path, env):
    assert plan(tmp_path, **env) is None


def test_no_proxy_alone_keeps_the_fast_path(tmp_path):
    assert plan(tmp_path, NO_PROXY="169.254.169.254", no_proxy="localhost") is not None


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("aZ09-._\u00e9\u0131\u0661:@/[]\n"), min_size=1, max_size=20))
def test_every_endpoint_the_fast_path_takes_botocore_takes_as_is(host):
    # The fast path sends only to URLs botocore would accept, and to the same host and port.
    from urllib.parse import urlsplit

    from botocore.utils import is_valid_endpoint_url

    url = f"http://{host}"
    ours = fast._plain_url(url)
    if ours is not None:
        assert is_valid_endpoint_url(url)
        theirs = urlsplit(url)
        assert ours == f"http://{theirs.hostname}" + ("" if theirs.port is None else f":{theirs.port}")


def test_a_config_file_is_botocores(tmp_path):
    (tmp_path / "config").write_text("[default]\nregion = eu-west-1\n")
    assert plan(tmp_path, AWS_CONFIG_FILE=str(tmp_path / "config")) is None
    (tmp_path / "empty").write_text("")
    assert plan(tmp_path, AWS_CONFIG_FILE=str(tmp_path / "empty")) is not None
    assert plan(tmp_path, AWS_CONFIG_FILE=os.devnull) is not None


@pytest.mark.parametrize(("variable", "default"), [("AWS_CONFIG_FILE", "config"),
                                                   ("AWS_SHARED_CREDENTIALS_FILE", "credentials")])
def test_a_config_or_credentials_file_is_found_as_botocore_finds_it(tmp_path, monkeypatch, variable, default):
    # botocore expands variables and `~` in both paths, and reads settings such as endpoint_url and ca_bundle
    # from the credentials file's profiles too; so must the check that sends it there.
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cfg").write_text("[default]\nendpoint_url = https://elsewhere.example\n")
    assert plan(tmp_path, **{variable: "~/cfg"}) is None
    assert plan(tmp_path, **{variable: "$HOME/cfg"}) is None
    (tmp_path / "empty").write_text("")
    assert plan(tmp_path, **{variable: str(tmp_path / "empty")}) is not None
    (tmp_path / ".aws").mkdir()
    merged = {k: v for k, v in LAMBDA.items() if v is not None}
    assert plain_lambda(merged) is not None
    (tmp_path / ".aws" / default).write_text("[default]\nendpoint_url = https://elsewhere.example\n")
    assert plain_lambda(merged) is None  # the default ~/.aws/<file>
    # Set but empty, botocore reads no file; nor one it cannot read, such as a directory.
    assert plain_lambda({**merged, variable: ""}) is not None
    assert plain_lambda({**merged, variable: str(tmp_path)}) is not None


def test_a_credentials_file_endpoint_is_honoured_on_the_botocore_path(aws_env, tmp_path):
    # The case a hostile review found: botocore takes endpoint_url from ~/.aws/credentials.
    aws_env.setenv("HOME", str(tmp_path))
    aws_env.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    aws_env.delenv("AWS_CONFIG_FILE", raising=False)
    aws_env.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\nendpoint_url = http://127.0.0.1:9\n")
    t = make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1)
    assert not isinstance(t, FastTransport) and t.endpoint == "http://127.0.0.1:9"


@pytest.mark.parametrize("tokens", [{"AWS_SESSION_TOKEN": "s"}, {"AWS_SECURITY_TOKEN": "l", "AWS_SESSION_TOKEN": "s"}])
def test_the_session_token_is_the_one_botocore_sends(scripted, monkeypatch, tokens):
    server = scripted(answer())
    for name, value in tokens.items():
        monkeypatch.setenv(name, value)
    for transport in (quick(), make_transport("lean", fast=False, connect_timeout=1, read_timeout=1, max_attempts=1)):
        transport.call("GetItem", {})
    fast_headers, botocore_headers = ({k.lower(): v for k, v in h.items()} for h, _ in server.requests)
    assert fast_headers["x-amz-security-token"] == botocore_headers["x-amz-security-token"]


def test_make_transport_picks_the_path(aws_env, tmp_path):
    assert isinstance(make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1), FastTransport)
    forced = make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1, fast=False)
    assert isinstance(forced, LeanTransport)
    aws_env.setenv("AWS_USE_FIPS_ENDPOINT", "true")
    fips = make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1)
    assert isinstance(fips, LeanTransport) and fips.endpoint == "https://dynamodb-fips.eu-west-1.amazonaws.com"
    with pytest.raises(ValueError):
        make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1, fast=True)


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-2", "ap-southeast-5", "il-central-1", "mx-central-1",
                                    "ca-west-1", "me-south-1", "af-south-1", "sa-east-1", "us-west-2"])
def test_the_regional_endpoint_is_botocores(aws_env, region):
    aws_env.setenv("AWS_DEFAULT_REGION", region)
    ours = make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1)
    theirs = make_transport("lean", connect_timeout=1, read_timeout=1, max_attempts=1, fast=False)
    assert isinstance(ours, FastTransport) and ours.endpoint == theirs.endpoint


# -- the wire ------------------------------------------------------------------------------------------------


def quick(**kwargs):
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 1, **kwargs}
    transport = make_transport("lean", fast=True, **{k: v for k, v in options.items() if k != "sleep"})
    if "sleep" in kwargs:
        transport._sleep = kwargs["sleep"]
    return transport


def test_the_wire_request(scripted):
    server = scripted(answer(body={"Item": {"b": {"B": "AAE="}}}))
    params = {"TableName": "t", "Key": {"id": {"S": "k"}}, "ConsistentRead": True}
    assert quick().call("GetItem", params) == {"Item": {"b": {"B": "AAE="}}}
    headers = {k.lower(): v for k, v in server.requests[0][0].items()}
    assert headers["x-amz-target"] == "DynamoDB_20120810.GetItem"
    assert headers["content-type"] == "application/x-amz-json-1.0"
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "/eu-west-1/dynamodb/aws4_request" in headers["authorization"]
    assert "SignedHeaders=content-type;host;x-amz-date;x-amz-target," in headers["authorization"]
    assert server.paths == ["/"]


def test_throttled_twice_then_success_and_the_failed_condition(scripted):
    server = scripted(throttle(), throttle(), answer(body={"Item": {}}))
    sleeps = Sleeps()
    assert quick(max_attempts=3, sleep=sleeps).call("GetItem", {}) == {"Item": {}}
    assert server.count == 3 and len(sleeps) == 2 and sleeps[1] <= 2.0


def test_attempts_run_out(scripted):
    server = scripted(server_error())
    with pytest.raises(DynamoDBError) as caught:
        quick(max_attempts=3, sleep=Sleeps()).call("PutItem", {})
    assert server.count == 3
    assert (caught.value.code, caught.value.status, caught.value.message) == (
        "InternalServerError", 500, "Internal server error")


def test_a_failed_condition_carries_the_old_item_and_is_not_retried(scripted):
    item = {"id": {"S": "k"}, "status": {"S": "COMPLETED"}}
    server = scripted(answer(400, {"__type": PREFIX + "ConditionalCheckFailedException", "message": "failed",
                                   "Item": item}))
    with pytest.raises(DynamoDBError) as caught:
        quick(max_attempts=3, sleep=Sleeps()).call("PutItem", {})
    assert server.count == 1 and caught.value.item == item and caught.value.code == "ConditionalCheckFailedException"


def test_connections_are_kept_alive_and_pooled_across_threads(scripted):
    server = scripted(answer(delay=0.05))
    transport = quick(connect_timeout=5)  # the scripted server's listen backlog is 5: SYNs past it wait 1 s
    for _ in range(5):
        transport.call("GetItem", {})
    assert len(server.peers) == 1
    barrier = threading.Barrier(10)
    errors = []

    def work():
        try:
            barrier.wait(5)
            for _ in range(3):
                transport.call("GetItem", {})
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors and server.count == 35
    assert transport._http.opened <= 10 and len(server.peers) <= 10


# -- imports -------------------------------------------------------------------------------------------------


def test_the_fast_path_imports_no_botocore(tmp_path):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(LAYER), "HOME": str(tmp_path), **LAMBDA,
           "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:9"}
    code = (
        "import sys; from idempotency_layer.transport import make_transport; "
        "t = make_transport('lean', connect_timeout=1, read_timeout=1, max_attempts=1); "
        "print(type(t).__name__); print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    kind, modules = out.splitlines()
    assert kind == "FastTransport"
    assert not {m for m in modules.split() if m.split(".")[0] in ("botocore", "boto3", "urllib3", "s3transfer")}


# -- the HTTP/1.1 reader -------------------------------------------------------------------------------------


def request_length(reader) -> int | None:
    """Read one request's head from `reader`: its Content-Length, or None when the client closed first."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = reader.read(1)
        if not byte:
            return None
        head += byte
    return int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])


class RawServer:
    """Answers each request with the next canned bytes; closes the connection after it when told to."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while self.answers:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with client:
                reader = client.makefile("rb")
                while self.answers:
                    length = request_length(reader)
                    if length is None:
                        break
                    reader.read(length)
                    data, close = self.answers.pop(0)
                    client.sendall(data)
                    if close:
                        client.shutdown(socket.SHUT_RDWR)  # the reader holds the socket open otherwise
                        break

    def close(self):
        self._listener.close()


def raw(status_line, headers, body, close=False):
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"{status_line}\r\n{head}\r\n").encode() + body, close


@pytest.fixture
def raw_server(aws_env):
    yield from serving(aws_env, lambda *answers: RawServer(answers))


def test_chunked_interim_and_closing_answers(raw_server):
    body = b'{"Item":{"id":{"S":"k"}}}'
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (5, body[:5], len(body) - 5, body[5:])
    server = raw_server(
        raw("HTTP/1.1 200 OK", {"Transfer-Encoding": "chunked", "x-amz-crc32": zlib.crc32(body)}, chunked),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + raw("HTTP/1.1 200 OK", {"Content-Length": len(body)}, body)[0], False),
        raw("HTTP/1.1 200 OK", {"Content-Length": len(body), "Connection": "close"}, body, close=True),
        raw("HTTP/1.1 200 OK", {"Content-Length": len(body)}, body),
    )
    transport = quick()
    for _ in range(4):
        assert transport.call("GetItem", {}) == {"Item": {"id": {"S": "k"}}}
    assert server.connections == 2 and transport._http.opened == 2  # a new one after "Connection: close"


def test_answers_http_client_reads_are_read_alike(raw_server):
    # A repeated identical Content-Length, a folded header (obs-fold), a chunked answer closed right after its
    # last chunk: http.client, under botocore, takes each as the answer it is.
    body = b'{"Item":{}}'
    crc = zlib.crc32(body)
    raw_server(
        raw("HTTP/1.1 200 OK", {"Content-Length": f"{len(body)}, {len(body)}"}, body),
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nx-amz-crc32:\r\n %d\r\n\r\n%s" % (len(body), crc, body), False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n" % (len(body), body), True),
    )
    transport = quick()
    for _ in range(3):
        assert transport.call("GetItem", {}) == {"Item": {}}
    with pytest.raises(DynamoDBError):  # a folded CRC that does not match is still checked
        raw_server((b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nx-amz-crc32:\r\n %d\r\n\r\n%s"
                    % (len(body), crc ^ 1, body), True))
        quick().call("GetItem", {})


def test_the_request_asks_for_no_content_encoding(scripted):
    server = scripted(answer(body={}))
    quick().call("GetItem", {})
    headers = {k.lower(): v for k, v in server.requests[0][0].items()}
    assert headers["accept-encoding"] == "identity"  # as http.client sends it for botocore


def test_an_answer_without_length_is_read_to_the_close(raw_server):
    raw_server(raw("HTTP/1.0 200 OK", {}, b'{"a":1}', close=True), raw("HTTP/1.0 200 OK", {}, b"{}", close=True))
    transport = quick()
    assert transport.call("GetItem", {}) == {"a": 1}
    assert transport.call("GetItem", {}) == {}


@pytest.mark.parametrize(
    "answer",
    [
        raw("garbage", {}, b"", close=True),
        raw("HTTP/1.1 200 OK", {"Content-Length": 50}, b"{}", close=True),
        raw("HTTP/1.1 200 OK", {"Transfer-Encoding": "chunked"}, b"zz\r\n", close=True),
        (b"", True),
        # Statuses http.client refuses: never taken for a success.
        raw("HTTP/1.1 0 OK", {"Content-Length": 2}, b"{}", close=True),
        raw("HTTP/1.1 99 OK", {"Content-Length": 2}, b"{}", close=True),
        raw("HTTP/1.1 020 OK", {"Content-Length": 2}, b"{}", close=True),
        raw("HTTP/1.1 2000 OK", {"Content-Length": 2}, b"{}", close=True),
        raw("HTTP/1.1 +20 OK", {"Content-Length": 2}, b"{}", close=True),
        raw("HTTP/1.1 200 OK", {"Content-Length": "2, 3"}, b"{}", close=True),  # which one?
    ],
)
def test_a_broken_answer_on_a_new_connection_is_a_closed_connection(raw_server, answer):
    raw_server(answer)
    with pytest.raises(DynamoDBError) as caught:
        quick().call("GetItem", {})
    assert caught.value.code == "ConnectionClosedError" and caught.value.status is None


def test_https_with_a_trusted_certificate_keeps_its_connection(scripted, certificate):
    import ssl

    cert, context = certificate
    server = scripted(answer(body={"Item": {}}), tls=context)
    transport = quick()
    transport._http._context = ssl.create_default_context(cafile=str(cert))  # as the system CAs would trust it
    for _ in range(3):
        assert transport.call("GetItem", {}) == {"Item": {}}
    assert server.count == 3 and len(server.peers) == 1 and transport._http.opened == 1
    headers = {k.lower(): v for k, v in server.requests[0][0].items()}
    assert headers["host"] == server.endpoint.split("://")[1]


# -- what the HTTP client keeps, and what it answers with ----------------------------------------------------


def test_bytes_after_an_answer_are_never_taken_as_the_next_ones(raw_server):
    # The first answer comes with a second one glued behind it in the same write. Kept in a read buffer, that
    # second answer would be taken as the reply to the next request: a wrong answer, not an error.
    good = b'{"Item":{"id":{"S":"first"}}}'
    smuggled = raw("HTTP/1.1 200 OK", {"Content-Length": 29}, b'{"Item":{"id":{"S":"wrong"}}}')[0]
    second = b'{"Item":{"id":{"S":"second"}}}'
    server = raw_server(
        (raw("HTTP/1.1 200 OK", {"Content-Length": len(good)}, good)[0] + smuggled, False),
        raw("HTTP/1.1 200 OK", {"Content-Length": len(second)}, second),
    )
    transport = quick()
    assert transport.call("GetItem", {}) == {"Item": {"id": {"S": "first"}}}
    assert transport.call("GetItem", {}) == {"Item": {"id": {"S": "second"}}}
    assert transport._http.opened == 2 and server.connections == 2  # the out-of-step connection was dropped


def test_bytes_arriving_on_an_idle_connection_make_it_unusable(raw_server):
    body = b"{}"
    server = raw_server(raw("HTTP/1.1 200 OK", {"Content-Length": 2}, body), raw("HTTP/1.1 200 OK", {}, b"{}"))
    transport = quick()
    assert transport.call("GetItem", {}) == {}
    (idle,) = transport._http._idle
    idle.buf += b"HTTP/1.1 200 OK\r\n"  # as if read along with the last answer
    assert transport._http._take() is None  # dropped, not handed out
    assert server.connections == 1


class EarlyAnswerServer:
    """Like DynamoDB's front end for a request it refuses on sight: a body over `limit` bytes gets a 400 as soon
    as the headers are read, and the connection is closed with the body unread (the client sees a reset);
    smaller requests are read whole and answered 200, kept alive. Counts requests by the size announced."""

    def __init__(self, limit: int, answer: bytes, tls=None):
        self.limit = limit
        self.answer = answer
        self.sizes: list[int] = []
        self._tls = tls  # a server TLS context: https
        self._listener = socket.create_server(("127.0.0.1", 0))
        scheme = "https" if tls else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._tls is not None:
                try:
                    client = self._tls.wrap_socket(client, server_side=True)
                except OSError:
                    client.close()
                    continue
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client):
        reader = client.makefile("rb")
        try:
            while True:
                length = request_length(reader)
                if length is None:
                    return
                self.sizes.append(length)
                if length > self.limit:
                    client.sendall(self.answer)
                    return  # closed with the body unread
                reader.read(length)
                client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        except OSError:
            return
        finally:
            reader.close()
            client.close()

    def close(self):
        self._listener.close()


TOO_LARGE = (b'{"__type":"' + PREFIX.encode()
             + b'ValidationException","message":"Item size has exceeded the maximum allowed size"}')
TOO_LARGE_ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(TOO_LARGE), TOO_LARGE)


@pytest.fixture
def early_server(aws_env):
    yield from serving(aws_env, lambda limit=64 * 1024: EarlyAnswerServer(limit, TOO_LARGE_ANSWER))


def test_an_answer_sent_before_the_body_was_read_is_the_answer(early_server):
    server = early_server()
    transport = quick(max_attempts=3, sleep=Sleeps())
    with pytest.raises(DynamoDBError) as caught:
        transport.call("UpdateItem", {"Value": {"S": "x" * (8 * 1024 * 1024)}})
    assert (caught.value.code, caught.value.status) == ("ValidationException", 400)
    assert "size has exceeded" in caught.value.message
    assert len(server.sizes) == 1  # a client error: not retried, not sent again
    assert transport.call("GetItem", {}) == {}  # and the next request goes on a new connection


@pytest.mark.parametrize("path", ["fast", "lean"])
def test_an_early_answer_over_tls_is_the_answer_or_a_lost_connection(aws_env, own_ca, path):
    # Over TLS a failed write leaves OpenSSL's connection unreadable, so the early answer is read only when it
    # came before the write failed, on botocore's urllib3 path and on the fast path alike; otherwise the request
    # fails as a lost connection (uncertain, retried), never with another answer. The layer sends nothing that
    # large: results over DynamoDB's 400 KB item limit are not stored.
    server = EarlyAnswerServer(64 * 1024, TOO_LARGE_ANSWER, tls=own_ca["context"])
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
    aws_env.setenv("AWS_CA_BUNDLE", own_ca["ca"])
    try:
        transport = make_transport("lean", fast=path == "fast", connect_timeout=2, read_timeout=2, max_attempts=3)
        with pytest.raises(DynamoDBError) as caught:
            transport.call("UpdateItem", {"Value": {"S": "x" * (8 * 1024 * 1024)}})
        if caught.value.code == "ValidationException":
            # Read on some attempt (those before it lost their connections and were retried); that a 400 read
            # so is not sent again is shown over http, where the answer always comes on the first attempt.
            assert caught.value.status == 400 and 1 <= len(server.sizes) <= 3
        else:
            assert caught.value.code in ("ConnectionClosedError", "SSLError"), caught.value
            assert caught.value.uncertain and caught.value.status is None and len(server.sizes) == 3
        assert transport.call("GetItem", {}) == {}
    finally:
        server.close()


def test_a_completion_refused_early_for_its_size_falls_back_to_one_without_the_result(early_server):
    from idempotency_layer import codec
    from idempotency_layer.config import Attributes
    from idempotency_layer.store import DynamoDBStore

    server = early_server()
    store = DynamoDBStore(quick(max_attempts=3, sleep=Sleeps()), "t", Attributes())
    assert store.complete("k", "me", codec.Encoded(codec.JSON, "x" * (8 * 1024 * 1024)), 2_000_000_000) is True
    assert len(server.sizes) == 2 and server.sizes[0] > server.limit >= server.sizes[1]


# -- the one free re-send after a dead kept-alive connection ------------------------------------------------


class DroppingServer:
    """Each connection: the first request gets `first` (kept alive); the next one on it is read and the
    connection closed without an answer, as a server that dropped it while idle. Counts requests. On every
    connection after the first, `first` is sent `later_delay` seconds late."""

    def __init__(self, first: bytes, later_delay: float = 0.0):
        self.first = first
        self.later_delay = later_delay
        self.requests = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _read(self, reader) -> bool:
        length = request_length(reader)
        if length is None:
            return False
        reader.read(length)
        with self._lock:
            self.requests += 1
        return True

    def _connection(self, client):
        with self._lock:
            self.connections += 1
            later = self.connections > 1
        reader = client.makefile("rb")
        try:
            if self._read(reader):
                if later:
                    time.sleep(self.later_delay)
                client.sendall(self.first)
                self._read(reader)
        except OSError:
            pass
        finally:
            reader.close()
            with contextlib.suppress(OSError):  # the client may have closed first (it gave up on the answer)
                client.shutdown(socket.SHUT_RDWR)
            client.close()

    def close(self):
        self._listener.close()


def test_the_free_re_send_is_one_per_call_however_many_attempts(aws_env, monkeypatch):
    body = b'{"__type":"' + PREFIX.encode() + b'InternalServerError","message":"m"}'
    server = DroppingServer(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
    monkeypatch.setattr(fast, "_alive", lambda connection: not connection.buf)  # the close races the send
    try:
        transport = quick(max_attempts=3, sleep=Sleeps())
        with pytest.raises(DynamoDBError) as caught:
            transport.call("GetItem", {})
        # Attempt 1: 500 on a new connection, kept. Attempt 2: it is dead; the one re-send gets a 500 on a new
        # one, kept. Attempt 3: dead again, and no second free re-send: the call ends there.
        assert caught.value.code == "ConnectionClosedError"
        assert server.requests == 4 and transport._http.resent == 1
    finally:
        server.close()


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


def test_a_request_lost_on_a_dead_connection_may_have_been_applied_though_the_re_send_never_connected(
    aws_env, monkeypatch
):
    server = DroppingServer(_OK)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
    try:
        transport = quick(max_attempts=1)
        assert transport.call("PutItem", {}) == {}  # its connection kept

        def refused(*args, **kwargs):
            raise ConnectionRefusedError("nothing listens any more")

        monkeypatch.setattr(socket, "create_connection", refused)  # the re-send cannot connect
        with pytest.raises(DynamoDBError) as caught:
            transport.call("PutItem", {}, time.monotonic() + 5)
        # The request went out on the kept connection, which the server read and closed: it may have been
        # applied, though the last thing that failed was a connect.
        assert caught.value.code == "EndpointConnectionError" and caught.value.uncertain
        assert server.requests == 2 and transport._http.resent == 1
    finally:
        server.close()


def test_the_re_send_on_a_new_connection_ends_within_the_attempts_time(aws_env):
    server = DroppingServer(_OK, later_delay=3.0)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
    try:
        transport = quick(read_timeout=5, max_attempts=3, sleep=Sleeps())
        assert transport.call("PutItem", {}) == {}
        started = time.monotonic()
        with pytest.raises(DynamoDBError) as caught:
            transport.call("PutItem", {}, started + 0.4)
        elapsed = time.monotonic() - started
        # The dead connection and the re-send share the one attempt's 0.4 s; the re-send's read is cut to it.
        assert caught.value.code == "ReadTimeoutError" and caught.value.uncertain
        assert transport._http.resent == 1 and server.requests == 3
        assert elapsed < 0.4 + 0.3, elapsed
    finally:
        server.close()


def test_a_fresh_connection_that_fails_is_never_sent_again_for_free(raw_server):
    raw_server((b"", True))
    transport = quick(max_attempts=1)
    with pytest.raises(DynamoDBError) as caught:
        transport.call("GetItem", {})
    assert caught.value.code == "ConnectionClosedError" and transport._http.resent == 0


# -- credentials botocore could not send either --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fast", "lean", "boto3"])
@pytest.mark.parametrize(("name", "value"), [
    ("AWS_SESSION_TOKEN", "tok\r\nX-Injected: 1"),
    ("AWS_SESSION_TOKEN", "tok\nen"),
    ("AWS_SECURITY_TOKEN", "legacy\r"),
    ("AWS_ACCESS_KEY_ID", "AKID\r\nX-Injected: 1"),
    ("AWS_SESSION_TOKEN", "t\u20acken"),  # not Latin-1: http.client could not encode it
])
def test_credentials_that_cannot_go_in_a_header_are_refused_naming_the_variable(scripted, aws_env, kind, name,
                                                                                  value):
    server = scripted(answer())
    aws_env.setenv(name, value)
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 1}
    with pytest.raises(ValueError) as caught:
        if kind == "boto3":
            make_transport("boto3", **options)
        else:
            make_transport("lean", fast=kind == "fast", **options)
    assert name in str(caught.value) and value not in str(caught.value) and "X-Injected" not in str(caught.value)
    assert server.count == 0


# -- TLS on loopback, with a CA of our own --------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_ca(tmp_path_factory):
    """A self-signed CA, a server certificate for 127.0.0.1 it signed, a server TLS context, and a second CA
    that signed nothing here."""
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("ca")

    def openssl(*args):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for name in ("ca", "other"):
        openssl("req", "-x509", *ec, "-days", "2", "-subj", f"/CN=test {name}", "-keyout", folder / f"{name}.key",
                "-out", folder / f"{name}.pem", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", folder / "server.key", "-out", folder / "server.csr")
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", folder / "server.csr", "-CA", folder / "ca.pem", "-CAkey", folder / "ca.key",
            "-CAcreateserial", "-days", "1", "-out", folder / "server.pem", "-extfile", folder / "ext")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    return {"ca": str(folder / "ca.pem"), "other": str(folder / "other.pem"), "context": context}


def both_paths():
    options = {"connect_timeout": 2, "read_timeout": 2, "max_attempts": 1}
    return make_transport("lean", fast=True, **options), make_transport("lean", fast=False, **options)


@pytest.mark.parametrize("setting", ["AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "AWS_CA_BUNDLE with ~"])
def test_tls_trusts_the_ca_bundle_botocore_would(scripted, aws_env, own_ca, setting):
    server = scripted(answer(body={"Item": {}}), tls=own_ca["context"])
    if setting.endswith("~"):  # urllib3 expands `~` in the path botocore hands it
        aws_env.setenv("HOME", str(Path(own_ca["ca"]).parent))
        aws_env.setenv("AWS_CA_BUNDLE", "~/" + Path(own_ca["ca"]).name)
    else:
        aws_env.setenv(setting, own_ca["ca"])
    fast_one, botocore_one = both_paths()
    assert isinstance(fast_one, FastTransport) and fast_one._http._cafile == own_ca["ca"]
    for transport in (fast_one, botocore_one, fast_one):
        assert transport.call("GetItem", {}) == {"Item": {}}
    assert server.count == 3 and fast_one._http.opened == 1  # kept alive over TLS
    headers = {k.lower(): v for k, v in server.requests[0][0].items()}
    assert headers["host"] == server.endpoint.split("://")[1]


def test_tls_ignores_ssl_cert_file_and_dir_as_botocore_does(scripted, aws_env, own_ca, monkeypatch):
    # OpenSSL's own variables reach only a context's default paths; botocore hands urllib3 one bundle (certifi's
    # or its own), so neither path trusts a CA given there.
    server = scripted(answer(body={"Item": {}}), tls=own_ca["context"])
    monkeypatch.setenv("SSL_CERT_FILE", own_ca["ca"])
    monkeypatch.setenv("SSL_CERT_DIR", str(Path(own_ca["ca"]).parent))
    for transport in both_paths():
        with pytest.raises(DynamoDBError) as caught:
            transport.call("GetItem", {})
        assert caught.value.code == "SSLError" and "CERTIFICATE_VERIFY_FAILED" in caught.value.message
    assert server.count == 0


def test_a_certificate_no_trusted_ca_signed_is_a_clear_error(scripted, aws_env, own_ca):
    server = scripted(answer(), tls=own_ca["context"])
    aws_env.setenv("AWS_CA_BUNDLE", own_ca["other"])
    fast_one, botocore_one = both_paths()
    for transport in (fast_one, botocore_one):
        with pytest.raises(DynamoDBError) as caught:
            transport.call("GetItem", {})
        assert caught.value.code == "SSLError" and "CERTIFICATE_VERIFY_FAILED" in caught.value.message
    with pytest.raises(DynamoDBError) as caught:
        fast_one.call("GetItem", {})
    assert server.endpoint in caught.value.message and own_ca["other"] in caught.value.message
    assert not caught.value.uncertain  # the handshake failed: nothing was sent, so a claim is not withdrawn
    assert server.count == 0


def test_a_ca_bundle_that_cannot_be_read_is_an_ssl_error_on_both_paths(scripted, aws_env, own_ca, tmp_path,
                                                                         monkeypatch):
    server = scripted(answer(), tls=own_ca["context"])
    connects = []
    real = socket.create_connection
    monkeypatch.setattr(fast.socket, "create_connection", lambda *a, **k: connects.append(a) or real(*a, **k))
    aws_env.setenv("AWS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    fast_one, botocore_one = both_paths()
    for transport in (botocore_one, fast_one):
        with pytest.raises(DynamoDBError) as caught:
            transport.call("GetItem", {})
        assert caught.value.code == "SSLError"
    assert "cannot load the CA bundle" in caught.value.message and "missing.pem" in caught.value.message  # fast's
    assert not caught.value.uncertain and connects == []  # it failed before connecting: nothing sent
    assert server.count == 0


def test_the_tls_handshake_gets_only_what_the_attempt_has_left(aws_env, own_ca, monkeypatch):
    # A connect that took most of the attempt's time must not hand the handshake the whole connect timeout
    # again: a server that never answers the ClientHello is given up on by the deadline's last chance.
    listener = socket.create_server(("127.0.0.1", 0))
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"https://127.0.0.1:{listener.getsockname()[1]}")
    aws_env.setenv("AWS_CA_BUNDLE", own_ca["ca"])
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    real = socket.create_connection

    def slow(address, timeout=None, *args, **kwargs):
        time.sleep(1.0)  # a SYN lost once and sent again
        return real(address, timeout, *args, **kwargs)

    monkeypatch.setattr(fast.socket, "create_connection", slow)
    transport = make_transport("lean", fast=True, connect_timeout=2, read_timeout=2, max_attempts=1)
    deadline = time.monotonic() + 1.5
    try:
        with pytest.raises(DynamoDBError) as caught:
            transport.call("PutItem", {}, deadline)
        ended = time.monotonic() - deadline
        assert caught.value.code == "ConnectTimeoutError" and not caught.value.uncertain
        assert ended < fast._time_left.__globals__["LAST_CHANCE_S"] + 0.25, ended  # not the 2 s again
    finally:
        for client in held:
            client.close()
        listener.close()


def test_connections_on_descriptors_past_1024_are_still_reused(scripted):
    # select() refuses descriptors past FD_SETSIZE: an idle-connection check built on it would call every
    # connection dead once the process holds many files, and open a new one per request.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("cannot hold 1100 descriptors here")
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard) if hard != resource.RLIM_INFINITY else 2048,
                                                    hard))
    held = [open(os.devnull) for _ in range(1100)]  # noqa: SIM115 - closed below
    try:
        server = scripted(answer())
        transport = quick()
        for _ in range(3):
            transport.call("GetItem", {})
        assert transport._http._idle[0].sock.fileno() > 1024
        assert transport._http.opened == 1 and len(server.peers) == 1
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- after the second hostile review ---------------------------------------------------------------------------


class ResettingServer:
    """The first request on a connection gets a whole answer, kept alive; the next gets `partial` bytes of an
    answer and then a reset (RST). Counts requests."""

    def __init__(self, partial: bytes):
        self.partial = partial
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with client:
                reader = client.makefile("rb")
                for n in range(2):
                    length = request_length(reader)
                    if length is None:
                        break
                    reader.read(length)
                    self.requests += 1
                    if n == 0:
                        client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    else:
                        client.sendall(self.partial)
                        time.sleep(0.05)  # the bytes reach the client before the reset
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                        break
                reader.close()

    def close(self):
        self._listener.close()


@pytest.mark.parametrize("partial", [b"HTTP/1.1 200 O", b"HTTP/1.1 200 OK\r\nContent-Le"])
def test_part_of_an_answer_then_a_reset_is_not_sent_again(aws_env, partial):
    # The server read the request and began answering: it may have applied it. That is an uncertain failure
    # for the retry rules to weigh, never the free re-send of a connection found dead.
    server = ResettingServer(partial)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint)
    try:
        transport = quick()
        assert transport.call("GetItem", {}) == {}
        with pytest.raises(DynamoDBError) as caught:
            transport.call("PutItem", {})
        assert caught.value.code == "ConnectionClosedError" and caught.value.uncertain
        assert server.requests == 2 and transport._http.resent == 0
    finally:
        server.close()


def test_a_trickled_answer_is_cut_at_the_attempts_end(raw_server, aws_env):
    # One byte every 50 ms never trips a 1 s read timeout; with a deadline, the attempt still ends in time.
    listener = socket.create_server(("127.0.0.1", 0))
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{listener.getsockname()[1]}")
    stop = threading.Event()

    def serve():
        client, _ = listener.accept()
        with client:
            client.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n" + b" " * 60:
                if stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    client.sendall(bytes([byte]))
                time.sleep(0.05)

    threading.Thread(target=serve, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(DynamoDBError) as caught:
            quick(read_timeout=1).call("GetItem", {}, time.monotonic() + 0.5)
        took = time.monotonic() - started
        assert caught.value.code == "ReadTimeoutError" and caught.value.uncertain
        assert took < 0.5 + fast._time_left.__globals__["LAST_CHANCE_S"] + 0.3, took  # not the 5 s of trickle
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("path", ["fast", "lean"])
def test_a_forked_child_opens_its_own_connections(scripted, path):
    # Parent and child sharing a kept-alive connection could each read the other's answer.
    server = scripted(*(answer(body={"Item": {"n": {"S": str(i)}}}) for i in range(1)))
    transport = make_transport("lean", fast=path == "fast", connect_timeout=1, read_timeout=1, max_attempts=1)
    assert transport.call("GetItem", {}) == {"Item": {"n": {"S": "0"}}}
    before = transport._http._pool if path == "lean" else list(transport._http._idle)
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's pool is handed out
        try:
            if path == "lean":
                fine = transport._http._pool is not before and transport._http._pool.num_connections == 0
            else:
                fine = transport._http._idle == [] and all(c.sock.fileno() == -1 for c in before)
        except BaseException:
            fine = False
        os._exit(0 if fine else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's connection is untouched and still reused.
    assert transport.call("GetItem", {}) == {"Item": {"n": {"S": "0"}}}
    assert len(server.peers) == 1


def test_the_tls_context_is_botocores(own_ca):
    import ssl

    from botocore.httpsession import create_urllib3_context

    ours = fast.tls_context(own_ca["ca"])
    theirs = create_urllib3_context()
    theirs.load_verify_locations(cafile=own_ca["ca"])
    for name in ("options", "verify_flags", "verify_mode", "minimum_version", "maximum_version", "protocol",
                 "post_handshake_auth"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_ca_certs() == theirs.get_ca_certs()
    assert ours.verify_mode == ssl.CERT_REQUIRED and ours.check_hostname  # urllib3 checks the name itself


@pytest.mark.parametrize("kind", ["fast", "lean", "boto3"])
def test_a_secret_that_is_not_utf8_is_refused_naming_the_variable(scripted, aws_env, kind):
    server = scripted(answer())
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "secret\udcffvalue")  # the byte 0xff, as os.environ keeps it
    options = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 1}
    with pytest.raises(ValueError) as caught:
        if kind == "boto3":
            make_transport("boto3", **options)
        else:
            make_transport("lean", fast=kind == "fast", **options)
    assert "AWS_SECRET_ACCESS_KEY" in str(caught.value) and "secret" not in str(caught.value).replace(
        "AWS_SECRET_ACCESS_KEY", "")
    assert caught.value.__context__ is None  # no UnicodeEncodeError holding the secret behind it
    assert server.count == 0


_COMPARE_TLS = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/lib/python%d.%d/site-packages" % sys.version_info[:2]]
from botocore.httpsession import create_urllib3_context
from idempotency_layer import fast
ours = fast.tls_context(sys.argv[2])
theirs = create_urllib3_context()
theirs.load_verify_locations(cafile=sys.argv[2])
names = ("options", "verify_flags", "verify_mode", "minimum_version", "maximum_version", "protocol",
         "post_handshake_auth")
differ = [n for n in names if getattr(ours, n) != getattr(theirs, n)]
if ours.get_ca_certs() != theirs.get_ca_certs():
    differ.append("ca_certs")
print(sys.version_info[:2], differ)
sys.exit(1 if differ else 0)
"""


def test_the_tls_context_is_botocores_on_every_python(own_ca, tmp_path):
    # Python 3.13 changed ssl.create_default_context's flags; the context must match botocore's on each runtime,
    # with the built layer as Lambda would load it.
    from tests.support import downloads
    from tests.support.rie import ensure_layer, unpack_layer

    runtimes = downloads.runtimes()
    assert runtimes, "no runtime venvs"
    opt = unpack_layer(ensure_layer(), tmp_path / "opt")
    for version, python in sorted(runtimes.items()):
        run = subprocess.run([str(python), "-I", "-c", _COMPARE_TLS, str(opt / "python"), own_ca["ca"]],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (version, run.stdout, run.stderr[-2000:])
