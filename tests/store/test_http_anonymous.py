"""Callers an HTTP request does not name (no authorizer, none of IDEMPOTENCY_CALLER_HEADERS), in process on DynamoDB
Local (security review M1, E3): they share one scope per key, so a response that sets a cookie is not stored for
them unless IDEMPOTENCY_HTTP_ANONYMOUS=shared; executions are counted by the handler's own side effect."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.store import test_metrics_counts as _metrics_tests
from tests.support.http_events import rest, v2

build = _metrics_tests.build  # the fixture: functions built from settings, behind the counting proxy

USERS = {"alice": "alice@example.com", "mallory": "mallory@example.com"}


def _session_handler(function: Any, form: str) -> list[str]:
    """A handler that authenticates from its session cookie and answers with the user and a CSRF cookie (E3);
    the users it served, in order, are its side effect."""
    served: list[str] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        jar = "; ".join(event.get("cookies") or []) if form == "v2" else event["headers"].get("Cookie", "")
        user = jar.removeprefix("session=")
        served.append(user)
        response: dict[str, Any] = {"statusCode": 200, "body": json.dumps({"user": user, "email": USERS[user]})}
        if form == "v2":
            response["cookies"] = [f"csrf={user}-token"]
        else:
            response["headers"] = {"set-cookie": f"csrf={user}-token"}
        return response

    function.user = handler
    return served


def _request(form: str, user: str, key: str) -> dict[str, Any]:
    headers = {"Idempotency-Key": f'"{key}"', "Content-Type": "application/json"}
    if form == "v2":
        event = v2("POST", "/profile", headers, '{"show": true}')
        event["cookies"] = [f"session={user}"]
        return event
    return rest("POST", "/profile", {**headers, "Cookie": f"session={user}"}, '{"show": true}')


def _said(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "sets a cookie" in r.getMessage()]


@pytest.mark.parametrize("form", ["rest", "v2"])
def test_mallory_never_receives_alices_response_or_cookie(build, caplog, form: str) -> None:
    function = build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None)
    served = _session_handler(function, form)
    caplog.set_level(logging.WARNING, logger="idempotency_layer")
    alice = function(_request(form, "alice", f"e3-{form}"))
    assert json.loads(alice["body"])["user"] == "alice"
    mallory = function(_request(form, "mallory", f"e3-{form}"))
    assert mallory["statusCode"] == 200 and json.loads(mallory["body"]) == {"user": "mallory",
                                                                           "email": "mallory@example.com"}
    assert "alice" not in json.dumps(mallory)  # neither her body nor her Set-Cookie
    assert "Idempotent-Replayed" not in (mallory.get("headers") or {})
    again = function(_request(form, "alice", f"e3-{form}"))  # Alice's retry: not stored, so it runs again
    assert json.loads(again["body"])["user"] == "alice"
    assert served == ["alice", "mallory", "alice"]
    said = _said(caplog)
    assert len(said) == 1 and "IDEMPOTENCY_HTTP_ANONYMOUS=shared" in said[0], said  # once per environment
    assert "alice" not in caplog.text and "csrf" not in caplog.text


@pytest.mark.parametrize("form", ["rest", "v2"])
def test_under_shared_the_first_callers_response_is_replayed_as_before(build, caplog, form: str) -> None:
    function = build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None, IDEMPOTENCY_HTTP_ANONYMOUS="shared")
    served = _session_handler(function, form)
    caplog.set_level(logging.WARNING, logger="idempotency_layer")
    function(_request(form, "alice", f"e3-shared-{form}"))
    mallory = function(_request(form, "mallory", f"e3-shared-{form}"))
    assert json.loads(mallory["body"])["user"] == "alice" and "alice-token" in json.dumps(mallory)
    assert mallory["headers"]["Idempotent-Replayed"] == "true"
    assert served == ["alice"] and _said(caplog) == []


def test_a_named_caller_or_a_response_without_a_cookie_is_stored(build) -> None:
    # The rule is for anonymous callers' cookies only: a caller header in the scope, or no cookie, replays.
    function = build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None, IDEMPOTENCY_CALLER_HEADERS="Cookie")
    served = _session_handler(function, "rest")
    for user in ("alice", "alice", "mallory"):
        function(_request("rest", user, "e3-named"))
    assert served == ["alice", "mallory"]
    plain = build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None)
    plain.user = lambda event, context: {"statusCode": 200, "body": "{}", "headers": {"X-Set-Cookie-Hint": "no"}}
    for _ in range(2):
        plain(_request("v2", "alice", "e3-plain"))
    assert len(plain.runs) == 1


def test_an_anonymous_keyed_request_with_credentials_is_said_once_and_counted_each_time(build, caplog, capsys) -> None:
    # T-M1.3: a function that reads Authorization itself, IDEMPOTENCY_CALLER_HEADERS unset.
    function = build(IDEMPOTENCY_KEY_JMESPATH=None)
    caplog.set_level(logging.WARNING, logger="idempotency_layer")
    capsys.readouterr()
    for n in range(3):
        headers = {"Idempotency-Key": f'"m13-{n}"', "Authorization": "Bearer secret-token-of-alice"}
        assert function(v2("POST", "/orders", headers, "{}"))["ok"] is True
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    said = warnings[0].getMessage()
    assert "Authorization" in said and "IDEMPOTENCY_CALLER_HEADERS" in said and "secret-token" not in caplog.text
    docs = _metrics_tests.documents(capsys, 3)
    assert [doc.get("AnonymousScope") for doc in docs] == [1, 1, 1]
    assert len(function.runs) == 3


def test_credentials_in_the_scope_or_no_credentials_are_not_counted(build, caplog, capsys) -> None:
    named = build(IDEMPOTENCY_KEY_JMESPATH=None, IDEMPOTENCY_CALLER_HEADERS="Authorization")
    caplog.set_level(logging.WARNING, logger="idempotency_layer")
    capsys.readouterr()
    named(v2("POST", "/orders", {"Idempotency-Key": '"m13-named"', "Authorization": "Bearer a"}, "{}"))
    plain = build(IDEMPOTENCY_KEY_JMESPATH=None)
    plain(v2("POST", "/orders", {"Idempotency-Key": '"m13-plain"'}, "{}"))
    plain(v2("POST", "/orders", {"Authorization": "Bearer a"}, "{}"))  # no key: nothing is shared
    docs = _metrics_tests.documents(capsys, 3)
    assert all("AnonymousScope" not in doc for doc in docs), docs
    assert not [r for r in caplog.records if "scoped to no caller" in r.getMessage()]


@pytest.mark.parametrize("value", ["", ","])
@pytest.mark.parametrize("form", ["rest", "v2"])
def test_a_caller_header_sent_blank_scopes_no_one(build, form: str, value: str) -> None:
    # IDEMPOTENCY_CALLER_HEADERS=Authorization, and both clients send it blank (a logged-out single-page app): the
    # blank value names no one, so Alice's cookie response is not stored and Mallory runs with her own.
    function = build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None,
                     IDEMPOTENCY_CALLER_HEADERS="Authorization")
    served = _session_handler(function, form)

    def blank(user: str) -> dict[str, Any]:
        event = _request(form, user, f"blank-{form}-{len(value)}")
        event["headers"]["Authorization"] = value
        if "multiValueHeaders" in event:
            event["multiValueHeaders"]["Authorization"] = [value]
        return event

    function(blank("alice"))
    mallory = function(blank("mallory"))
    assert "alice" not in json.dumps(mallory) and json.loads(mallory["body"])["user"] == "mallory"
    assert served == ["alice", "mallory"]
