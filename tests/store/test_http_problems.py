"""What HTTP callers are told of the layer's errors (security review m3), in process on DynamoDB Local: every problem
body (400, 409, 422, 500, 503) carries a generic detail and the invocation's request id, never the key prefix, the
key expression, a stored key or a setting's name; the function's log line says the rest."""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import uuid
from typing import Any

from idempotency_layer import config as _config
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import plan
from tests.store import test_metrics_counts as _metrics_tests
from tests.support.http_events import v2
from tests.support.inprocess import Context

build = _metrics_tests.build  # the fixture: functions built from settings, behind the counting proxy

PREFIX = "orders-prefix-m3"
EXPRESSION = "json_parse(body).orderId"
SETTINGS = {"IDEMPOTENCY_METRICS": "off", "IDEMPOTENCY_KEY_PREFIX": PREFIX, "IDEMPOTENCY_KEY_JMESPATH": EXPRESSION}


def _request(body: str, key: str | None = None) -> dict[str, Any]:
    return v2("POST", "/orders", {} if key is None else {"Idempotency-Key": f'"{key}"'}, body)


def _answered(function: Any, event: dict[str, Any], status: int, problems: list[dict[str, Any]]) -> dict[str, Any]:
    context = Context()
    response = function.handler(event, context)
    assert response["statusCode"] == status, response
    assert response["headers"]["Content-Type"] == "application/problem+json"
    body = json.loads(response["body"])
    assert body["status"] == status and body["requestId"] == context.aws_request_id
    problems.append(body)
    return body


def _key_of(event: dict[str, Any]) -> str:
    config = _config.load()
    key = plan(config, KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath), event).units[0].key
    assert key is not None
    return key


def _never_told(problems: list[dict[str, Any]], keys: set[str]) -> None:
    assert len(problems) >= 1
    for body in problems:
        text = json.dumps(body)
        assert PREFIX not in text and EXPRESSION not in text and "json_parse" not in text, body
        assert "IDEMPOTENCY_" not in text and "#" not in text, body
        assert not any(key in text or key.partition("#")[2] in text for key in keys), body


def test_no_problem_body_holds_the_prefix_the_expression_or_a_key(build, caplog, ddb_client, table) -> None:
    function = build(**SETTINGS)
    function.user = lambda event, context: {"statusCode": 200, "body": "{}"}
    caplog.set_level(logging.INFO, logger="idempotency_layer")
    problems: list[dict[str, Any]] = []
    order = uuid.uuid4().hex
    # 400: the key expression cannot be applied (the body is not JSON); the log names the expression.
    _answered(function, _request("not json"), 400, problems)
    assert f"IDEMPOTENCY_KEY_JMESPATH={EXPRESSION!r} could not be applied" in caplog.text
    # 422: the key used before with another body.
    assert function(_request(json.dumps({"orderId": order, "n": 1})))["statusCode"] == 200
    mismatch = _answered(function, _request(json.dumps({"orderId": order, "n": 2})), 422, problems)
    assert "used before with another request" in mismatch["detail"]
    # 409: a live claim of another invocation on the key.
    busy = _request(json.dumps({"orderId": uuid.uuid4().hex}))
    now = time.time()
    assert function.handler.cycle.store.claim(_key_of(busy), os.urandom(16).hex(), now, int(now * 1000) + 60_000,
                                              int(now) + 3600) is None
    assert "still in progress" in _answered(function, busy, 409, problems)["detail"]
    # 500: a response too large to store, replayed.
    function.user = lambda event, context: {"statusCode": 201, "body": base64.b64encode(os.urandom(450_000)).decode()}
    large = _request(json.dumps({"orderId": uuid.uuid4().hex}))
    assert function(large)["statusCode"] == 201
    assert "too large" in _answered(function, large, 500, problems)["detail"]
    # 400: no key at all, under IDEMPOTENCY_REQUIRE_KEY (a setting, not told).
    strict = build(**SETTINGS, IDEMPOTENCY_REQUIRE_KEY="true")
    assert "Idempotency-Key header" in _answered(strict, _request("{}"), 400, problems)["detail"]
    keys = {item["id"]["S"] for item in _metrics_tests.scan(ddb_client, table)}
    assert keys and all(key.startswith(f"{PREFIX}#") for key in keys)
    _never_told(problems, keys)
    assert len(function.runs) == 2  # the first order and the large response: nothing else ran


def test_a_store_that_cannot_be_used_is_a_generic_503(build, caplog, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{_metrics_tests._closed_port()}")
    monkeypatch.setenv("IDEMPOTENCY_MAX_ATTEMPTS", "1")
    function = build(**SETTINGS)
    problems: list[dict[str, Any]] = []
    event = _request(json.dumps({"orderId": uuid.uuid4().hex}))
    body = _answered(function, event, 503, problems)
    assert body["detail"] == "the idempotency store is unavailable; the request did not run"
    _never_told(problems, {_key_of(event)})
    assert function.runs == []
    assert any(r.levelno == logging.ERROR and "answered 503" in r.getMessage() for r in caplog.records)
