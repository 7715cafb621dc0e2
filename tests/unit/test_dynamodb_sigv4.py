"""aws.sigv4: the signer against botocore's SigV4Auth on generated requests (hypothesis) and against AWS's
published SigV4 test suite (tests/data/aws4_testsuite); the day's signing key derived once."""

from __future__ import annotations

import datetime
import hmac
import types
from pathlib import Path
from unittest import mock

import pytest
from botocore import auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.aws import sigv4
from idempotency_layer.aws.sigv4 import Signer

SUITE = Path(__file__).parent.parent / "data" / "aws4_testsuite"


def botocore_sign(access, secret, token, region, service, url, headers, body, when):
    request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
    # botocore reads the clock through this one function: pinned, so both sides sign the same instant.
    with mock.patch.object(auth, "get_current_datetime", lambda: when):
        auth.SigV4Auth(Credentials(access, secret, token), service, region).add_auth(request)
    return request.headers


header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30)
# Values with inner and outer white space: both sides trim them and collapse runs of spaces.
spaced_text = st.text(st.sampled_from("ab1 \t-"), min_size=1, max_size=12).filter(lambda s: s.strip())


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
    extra=st.dictionaries(st.sampled_from(["X-Custom", "user-agent", "X-Amzn-Trace-Id", "Expect"]),
                          st.one_of(header_text, spaced_text), max_size=3),
    later=st.lists(st.tuples(st.integers(0, 90_000), st.binary(max_size=60), st.booleans()), max_size=4),
)
def test_the_signature_is_botocores(access, secret, token, region, host, operation, body, seconds, extra, later):
    # One signer signs the request, then more (later instants, other bodies, now and then another operation):
    # each signature is botocore's, whatever the signer kept from the ones before (its plans, date and key).
    signer = Signer(access, secret, token, region, "dynamodb")
    requests = [(0, body, operation), *((delay, more, "GetItem" if other else operation)
                                          for delay, more, other in later)]
    for delay, data, name in requests:
        when = datetime.datetime.fromtimestamp(seconds + delay, datetime.timezone.utc).replace(tzinfo=None)
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "Host": host,
            "X-Amz-Target": f"DynamoDB_20120810.{name}",
            **extra,
        }
        given = dict(headers)
        ours = signer.sign(headers, data, now=seconds + delay)
        theirs = botocore_sign(access, secret, token, region, "dynamodb", f"http://{host}/", headers, data, when)
        for field in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            assert ours.get(field) == theirs.get(field), field
        assert headers == given  # the caller's headers are left as they were
        # The headers sent: the caller's, in its order, then the date, the token and the signature.
        assert list(ours) == [*headers, "X-Amz-Date", *(["X-Amz-Security-Token"] if token else []), "Authorization"]


def test_a_signature_is_botocores_on_the_wire_request():
    # The request the client sends: Host set by the client, the body bytes hashed as they are.
    fixed = datetime.datetime(2026, 1, 2, 3, 4, 5)
    body = b'{"TableName":"t","Key":{"id":{"S":"k"}}}'
    base = {"X-Amz-Target": "DynamoDB_20120810.GetItem", "Content-Type": "application/x-amz-json-1.0"}
    ours = Signer("AKID", "SECRET", "TOKEN", "eu-west-1", "dynamodb").sign(
        {**base, "Host": "dynamodb.eu-west-1.amazonaws.com"}, body, now=fixed.replace(tzinfo=datetime.timezone.utc)
        .timestamp())
    theirs = botocore_sign("AKID", "SECRET", "TOKEN", "eu-west-1", "dynamodb",
                           "https://dynamodb.eu-west-1.amazonaws.com/", base, body, fixed)
    assert ours["Authorization"] == theirs["Authorization"]
    assert ours["X-Amz-Date"] == theirs["X-Amz-Date"] == "20260102T030405Z"
    assert ours["X-Amz-Security-Token"] == "TOKEN"


def test_a_resign_replaces_the_previous_signature():
    signer = Signer("AKID", "secret", "tok", "eu-west-1", "dynamodb")
    first = signer.sign({"Host": "h"}, b"{}", now=1_700_000_000)
    again = signer.sign(first, b"{}", now=1_700_000_000)  # the old Authorization, date and token are not signed
    assert again == first


def test_the_signing_key_is_derived_once_a_day(monkeypatch):
    # Each HMAC goes through hmac.digest: four derive the day's key, one signs.
    calls = []
    counting = types.SimpleNamespace(digest=lambda *a: calls.append(a) or hmac.digest(*a))
    monkeypatch.setattr(sigv4, "hmac", counting)
    signer = Signer("AKID", "secret", None, "eu-west-1", "dynamodb")
    for second in range(0, 3600, 60):
        signer.sign({"Host": "h"}, b"", now=1_700_000_000 + second)
    assert len(calls) == 4 + 60
    signer.sign({"Host": "h"}, b"", now=1_700_000_000 + 86_400)  # the next day: a new key
    assert len(calls) == 4 + 60 + 5
    # And the key is the right one across the change of day (botocore derives it afresh each time).
    when = datetime.datetime.fromtimestamp(1_700_000_000 + 86_400, datetime.timezone.utc).replace(tzinfo=None)
    monkeypatch.undo()
    signed = signer.sign({"Host": "h"}, b"", now=1_700_000_000 + 86_400)
    assert signed["Authorization"] == botocore_sign("AKID", "secret", None, "eu-west-1", "dynamodb", "http://h/",
                                                    {"Host": "h"}, b"", when)["Authorization"]


def test_the_date_is_formatted_once_a_second_and_plans_are_bounded(monkeypatch):
    formatted = []
    real = sigv4.time.strftime
    monkeypatch.setattr(sigv4.time, "strftime", lambda *a: formatted.append(a) or real(*a))
    signer = Signer("AKID", "secret", None, "eu-west-1", "s3")
    for tenth in range(30):  # three seconds, ten signatures each
        signed = signer.sign({"Host": "h"}, b"", now=1_700_000_000 + tenth / 10)
        assert signed["X-Amz-Date"] == f"20231114T2213{20 + tenth // 10}Z"
    assert len(formatted) == 3
    for n in range(sigv4._PLANS * 3):  # an S3 object a path: the plans kept stay few
        signer.sign({"Host": "h"}, b"", method="GET", path=f"/bucket/{n}", now=1_700_000_000)
        assert len(signer._plans) <= sigv4._PLANS


# -- AWS's test suite -----------------------------------------------------------------------------------------


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
