"""HTTP keys name the API and stage (REST, payload 2.0) and ALB's target group (security review M1, R-M1.3), in
process on DynamoDB Local: a test stage or a second API never replays another's responses; and a retry that
straddles the upgrade that changed the keys is replayed from the record under its old key, never run twice.
Executions are counted by the handler's own side effect (its runs)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from typing import Any

import orjson
import pytest

from idempotency_layer.sources import http
from tests.store import test_metrics_counts as _metrics_tests
from tests.support.http_events import alb, rest, v2

build = _metrics_tests.build  # the fixture: functions built from settings, behind the counting proxy
FUNCTION = _metrics_tests.FUNCTION


def _v2(key: str, body: str = '{"amount": 5}', **context: str) -> dict[str, Any]:
    event = v2("POST", "/orders", {"Idempotency-Key": f'"{key}"'}, body)
    event["requestContext"].update(context)
    return event


def _responding(function: Any) -> Any:
    function.user = lambda event, context: {"statusCode": 201, "body": json.dumps({"run": uuid.uuid4().hex})}
    return function


def old_key(event: dict[str, Any], value: str) -> str:
    """The key versions before this one stored for a header-keyed request of payload 2.0 without an authorizer,
    written out as they computed it: the prefix, and SHA-256 of the sorted JSON of [("header", value), the source,
    the method, the route, the caller (none)]."""
    material = [["header", value], "v2", event["requestContext"]["http"]["method"], event["routeKey"], None]
    return f"{FUNCTION}#{hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()}"


@pytest.mark.parametrize("differs", [{"apiId": "other-api"}, {"stage": "test"}])
def test_two_requests_that_differ_in_api_or_stage_both_run(build, differs: dict[str, str]) -> None:
    # T-M1.2: the same key, method, route and body, through another API or another stage.
    function = _responding(build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None))
    key = f"origin-{next(iter(differs))}"
    first = function(_v2(key, stage="prod"))
    again = function(_v2(key, stage="prod"))
    assert again["headers"]["Idempotent-Replayed"] == "true" and again["body"] == first["body"]
    other = function(_v2(key, **{"stage": "prod", **differs}))
    assert other["statusCode"] == 201 and "Idempotent-Replayed" not in other.get("headers", {})
    assert len(function.runs) == 2


def test_rest_stages_and_alb_target_groups_are_scopes_too(build) -> None:
    function = _responding(build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None))
    headers = {"Idempotency-Key": '"origin-rest"'}
    for stage in ("prod", "prod", "test"):
        event = rest("POST", "/orders", headers, "{}")
        event["requestContext"]["stage"] = stage
        function(event)
    assert len(function.runs) == 2
    for group in ("a", "a", "b"):
        event = alb("POST", "/orders", {"Idempotency-Key": '"origin-alb"'}, "{}")
        event["requestContext"]["elb"]["targetGroupArn"] += group
        function(event)
    assert len(function.runs) == 4


def _before_the_upgrade(build: Any, patch: Any) -> Any:
    """A function as the previous version built it, while `patch` lasts: its keys made of the previous material,
    and every answer below 500 stored (as before R-M1.1)."""
    from idempotency_layer import executor

    function = _responding(build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None,
                                 IDEMPOTENCY_HTTP_PREVIOUS_KEYS="off"))
    patch.setattr(http, "key_material", http.previous_key_material)
    patch.setattr(executor.Executor, "_keeps", lambda self, request, key, response: http.storable(request, response,
                                                                                                  key))
    return function


def _upgraded(build: Any, **settings: str | None) -> Any:
    settings = {"IDEMPOTENCY_HTTP_PREVIOUS_KEYS": None, **settings}  # (the old version's setting unset)
    return _responding(build(IDEMPOTENCY_METRICS="off", IDEMPOTENCY_KEY_JMESPATH=None, **settings))


def test_a_retry_that_straddles_the_upgrade_is_replayed_once_and_kept(build, proxy, ddb_client, table) -> None:
    key = "straddle-1"
    with pytest.MonkeyPatch.context() as patch:
        old = _before_the_upgrade(build, patch)
        first = old(_v2(key))
    stored = {item["id"]["S"] for item in _metrics_tests.scan(ddb_client, table)}
    assert old_key(_v2(key), key) in stored  # the record the old version wrote, under the old form
    new = _upgraded(build)
    proxy.reset()
    again = new(_v2(key))  # the client's retry reaches the upgraded function
    assert again["statusCode"] == 201 and again["body"] == first["body"]
    assert again["headers"]["Idempotent-Replayed"] == "true"
    assert len(old.runs) == 1 and new.runs == []
    # Claim of the new key, the read of the old one, the new key completed with its result.
    assert proxy.snapshot()[0] == {"PutItem": 1, "GetItem": 1, "UpdateItem": 1}
    proxy.reset()
    assert new(_v2(key))["headers"]["Idempotent-Replayed"] == "true"
    assert proxy.snapshot()[0] == {"PutItem": 1}  # from now on replayed from the new key alone
    mismatch = new(_v2(key, body='{"amount": 6}'))
    assert mismatch["statusCode"] == 422 and new.runs == []


def test_a_first_send_still_running_under_the_old_key_is_in_progress(build) -> None:
    key = "straddle-2"
    new = _upgraded(build)
    now = time.time()
    payload = orjson.dumps(["POST", "/orders", "", '{"amount": 5}'], option=orjson.OPT_SORT_KEYS)
    fingerprint = f"{hashlib.sha256(payload).hexdigest()}.http"  # method, path, query, body: unchanged
    # The old version's first send, running: its claim under the old key.
    assert new.handler.cycle.store.claim(old_key(_v2(key), key), os.urandom(16).hex(), now,
                                         int(now * 1000) + 60_000, int(now) + 3600, fingerprint) is None
    assert new(_v2(key))["statusCode"] == 409 and new.runs == []
    assert new(_v2(key, body='{"amount": 6}'))["statusCode"] == 422  # another payload under the old key
    assert new(_v2(key))["statusCode"] == 409  # our claim of the new key was released each time
    assert new.runs == []


def test_with_the_consult_off_the_old_record_is_not_read(build, proxy) -> None:
    key = "straddle-3"
    with pytest.MonkeyPatch.context() as patch:
        old = _before_the_upgrade(build, patch)
        old(_v2(key))
    new = _upgraded(build, IDEMPOTENCY_HTTP_PREVIOUS_KEYS="off")
    proxy.reset()
    assert "Idempotent-Replayed" not in new(_v2(key)).get("headers", {})
    assert proxy.snapshot()[0] == {"PutItem": 1, "UpdateItem": 1}  # no read of the old key
    assert len(old.runs) == 1 and len(new.runs) == 1  # what the consult prevents: the retry ran again


def test_an_old_record_that_set_a_cookie_for_an_anonymous_caller_is_not_replayed(build) -> None:
    # The old version stored it; this one would not have (R-M1.1), so it is not handed to whoever sends the key.
    key = "straddle-4"
    with pytest.MonkeyPatch.context() as patch:
        old = _before_the_upgrade(build, patch)
        old.user = lambda event, context: {"statusCode": 200, "body": "{}", "cookies": ["csrf=alice-token"]}
        old(_v2(key))
        assert old(_v2(key))["headers"]["Idempotent-Replayed"] == "true"  # the old version replayed it
    new = _upgraded(build)
    answer = new(_v2(key))
    assert "alice-token" not in json.dumps(answer) and len(new.runs) == 1 and len(old.runs) == 1
