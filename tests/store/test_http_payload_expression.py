"""IDEMPOTENCY_PAYLOAD_JMESPATH on HTTP routes that are templates (a REST `/{proxy+}` or `/orders/{id}`, an HTTP API
`ANY /{proxy+}`), in process on DynamoDB Local: the key covers every path under the route, so a key reused on another
path is answered 422, whatever the expression selects (the fourth hostile review found a charge replayed to a
refund); a retry on the same path still replays."""

from __future__ import annotations

import json

import pytest

from tests.store import test_metrics_counts as _metrics_tests
from tests.support.http_events import rest, v2

build = _metrics_tests.build  # the fixture: functions built from settings, behind the counting proxy


def _responding(function):
    function.user = lambda event, context: {"statusCode": 201, "body": json.dumps({"run": len(function.runs)})}
    return function


@pytest.mark.parametrize("form", ["rest", "v2"])
def test_a_key_reused_on_another_path_under_a_template_route_is_answered_422(build, form: str) -> None:
    function = _responding(build(IDEMPOTENCY_PAYLOAD_JMESPATH="body", IDEMPOTENCY_METRICS="off",
                                 IDEMPOTENCY_KEY_JMESPATH=None))
    body = '{"amount": 5}'

    def request(path: str) -> dict:
        headers = {"Idempotency-Key": '"r-1"', "Content-Type": "application/json"}
        if form == "rest":
            return rest("POST", path, headers, body, resource="/{proxy+}")
        return v2("POST", path, headers, body, route="ANY /{proxy+}")

    first = function(request("/orders/1/charge"))
    assert first["statusCode"] == 201 and len(function.runs) == 1
    again = function(request("/orders/1/charge"))
    assert again["statusCode"] == 201 and len(function.runs) == 1  # the same request: replayed
    other = function(request("/orders/1/refund"))
    assert other["statusCode"] == 422, other
    assert "its payload or path differ" in json.loads(other["body"])["detail"]
    assert len(function.runs) == 1


def test_a_route_without_a_template_keeps_the_expressions_fingerprint(build) -> None:
    # A literal route names one path: nothing changes there (records stored before keep matching).
    function = _responding(build(IDEMPOTENCY_PAYLOAD_JMESPATH="body", IDEMPOTENCY_METRICS="off",
                                 IDEMPOTENCY_KEY_JMESPATH=None))
    headers = {"Idempotency-Key": '"r-2"'}
    assert function(rest("POST", "/orders", headers, '{"a": 1}'))["statusCode"] == 201
    mismatch = function(rest("POST", "/orders", headers, '{"a": 2}'))
    assert mismatch["statusCode"] == 422
    assert "its payload or path differ" in json.loads(mismatch["body"])["detail"]
    assert len(function.runs) == 1


@pytest.mark.parametrize("answer", [{"statusCode": 200.0, "body": "{}"}, {"statusCode": "OK", "body": "{}"}])
def test_an_answer_the_gateway_cannot_answer_is_not_stored_and_said(build, caplog, answer) -> None:
    # The gateway answers 502 to it, so a retry must run again; the hostile review found it silent.
    function = build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None)
    function.user = lambda event, context: answer
    request = v2("POST", "/orders", {"Idempotency-Key": '"r-3"'}, "{}")
    assert function(request) == answer
    assert function(v2("POST", "/orders", {"Idempotency-Key": '"r-3"'}, "{}")) == answer
    assert len(function.runs) == 2
    said = [r.getMessage() for r in caplog.records if "not a response object the gateway can answer" in r.getMessage()]
    kind = type(answer["statusCode"]).__name__
    assert len(said) == 2 and f"a {kind} statusCode, not an integer" in said[0], said
