"""The read of an HTTP request's previous key (previous.py) over the in-memory table: what a record there left by
the version before the key change makes a first run do. Handler runs counted by the handler itself; the same on
DynamoDB Local in tests/store/test_http_key_origin.py."""

from __future__ import annotations

import os
import time

import pytest

from idempotency_layer import codec
from idempotency_layer.sources import http
from tests.support import http_events
from tests.unit.test_executor_in_memory import Function


def _request(body: str = "{}") -> dict:
    return http_events.v2("POST", "/orders", {"Idempotency-Key": '"p-1"'}, body)


def _previous(function: Function, event: dict) -> str:
    key = function.keys.key_of(http.previous_key_material(http.parse(event), ["header", "p-1"]))
    assert key is not None
    return key


def _fingerprint(event: dict) -> str:
    return f"{http.digest(http.default_payload(http.parse(event)))}.http"


def _write(function: Function, key: str, fingerprint: str, expires_in: int, completed: dict | None,
           claim_ms: int = 60_000) -> None:
    now = time.time()
    owner = os.urandom(16).hex()
    assert function.store.claim(key, owner, now, int(now * 1000) + claim_ms, int(now) + 3600, fingerprint) is None
    if completed is not None:
        assert function.store.complete(key, owner, codec.encode(completed), int(now) + expires_in)


@pytest.mark.parametrize(("expires_in", "claim_ms", "completed", "runs"), [
    (3600, 60_000, {"statusCode": 201, "body": "old"}, 0),  # live and completed: replayed
    (-10, 60_000, {"statusCode": 201, "body": "old"}, 1),  # expired: as none
    (3600, -5_000, None, 1),  # a claim whose invocation ended without a result: as none
])
def test_what_a_previous_record_makes_a_first_run_do(expires_in, claim_ms, completed, runs):
    function = Function()
    event = _request()
    _write(function, _previous(function, event), _fingerprint(event), expires_in, completed, claim_ms)
    answer = function(_request())
    assert len(function.runs) == runs
    assert (answer["body"] == "old") is (runs == 0)
    assert function(_request())["headers"]["Idempotent-Replayed"] == "true"  # the new key holds it now
    assert len(function.runs) == runs


@pytest.mark.parametrize(("anonymous", "runs"), [("separate", 1), ("shared", 0)])
def test_a_previous_response_that_set_a_cookie_is_replayed_only_where_this_version_would_store_it(anonymous, runs):
    function = Function(IDEMPOTENCY_HTTP_ANONYMOUS=anonymous)
    event = _request()
    cookie = {"statusCode": 200, "body": "old", "cookies": ["csrf=alice"]}
    _write(function, _previous(function, event), _fingerprint(event), 3600, cookie)
    answer = function(_request())
    assert len(function.runs) == runs and ("csrf=alice" in str(answer)) is (runs == 0)
