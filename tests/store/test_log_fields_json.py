"""Log lines that carry the key, against DynamoDB Local, formatted by the runtime's own JSON formatter
(awslambdaric's, as under AWS_LAMBDA_LOG_FORMAT=JSON): each line parsed, its `idempotency_key` the stored key
(read back from the table), its `idempotency_outcome` what happened; a batch's lines from the pool's threads
carry their own record's key. The real runtime's output is checked end to end in tests/e2e/test_metrics_and_logs.py.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import re
import sys
import uuid
from typing import Any

import pytest
from awslambdaric.lambda_runtime_log_utils import JsonFormatter

from idempotency_layer.cycle import Claimed
from idempotency_layer.errors import IdempotencyAlreadyInProgressError, IdempotencyPayloadMismatchError
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.log import LOGGER_NAME
from tests.support.events import json_message, sqs_event
from tests.support.http_events import v2
from tests.support.inprocess import Function

FUNCTION = "shop"
KEY = re.compile(rf"{FUNCTION}#[0-9a-f]{{64}}")


class Lines:
    """The layer's records as the runtime's JSON formatter writes them, and the records themselves."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(JsonFormatter())
        self.records: list[logging.LogRecord] = []
        self.handler.addFilter(lambda record: self.records.append(record) or True)

    def take(self) -> list[dict[str, Any]]:
        text = self.stream.getvalue()
        self.stream.seek(0)
        self.stream.truncate()
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def build(tmp_path, monkeypatch, layer_env, proxy, table):
    monkeypatch.delitem(sys.modules, "awslambdaric.lambda_runtime_marshaller", raising=False)
    (tmp_path / "shop_app.py").write_text("def handler(event, context):\n    return event\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    monkeypatch.setenv("AWS_LAMBDA_LOG_FORMAT", "JSON")
    monkeypatch.setenv("AWS_LAMBDA_LOG_LEVEL", "INFO")  # Lambda's application log level: the layer follows it
    base = {"IDEMPOTENCY_ORIGINAL_HANDLER": "shop_app.handler", "IDEMPOTENCY_TABLE": table}
    for name, value in base.items():
        monkeypatch.setenv(name, value)
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    sys.modules.pop("idempotency_layer.interceptor", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")  # sets the layer's level: INFO
    lines = Lines()
    logger.addHandler(lines.handler)

    def make(**settings: str) -> Function:
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        return Function(interceptor)

    make.lines = lines  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        logger.removeHandler(lines.handler)
        logger.setLevel(level)
        sys.modules.pop("idempotency_layer.interceptor", None)


def stored_keys(ddb_client: Any, table: str) -> set[str]:
    return {item["id"]["S"] for item in ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]}


def summaries(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["message"].startswith("idempotency: ")]


def keys_agree(lines: list[dict[str, Any]]) -> None:
    """Every line that names a key in its message carries that key as its field, and only that one."""
    for line in lines:
        named = set(KEY.findall(line["message"]))
        if named:
            assert named == {line["idempotency_key"]}, line


def test_whole_events_carry_their_key_and_outcome(build, ddb_client, table):
    function = build(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_PAYLOAD_JMESPATH="amount",
                     IDEMPOTENCY_LOCAL_CACHE_SIZE="4")
    order = uuid.uuid4().hex
    function({"orderId": order, "amount": 1})
    function({"orderId": order, "amount": 1})  # from the local cache
    with pytest.raises(IdempotencyPayloadMismatchError):
        function({"orderId": order, "amount": 2})
    function({"amount": 3})  # no orderId: passed through
    (key,) = stored_keys(ddb_client, table)
    lines = build.lines.take()
    keys_agree(lines)
    said = summaries(lines)
    assert [line["idempotency_outcome"] for line in said] == ["first_run", "local_cache_replay", "mismatch",
                                                              "passed_through"]
    assert [line.get("idempotency_key") for line in said] == [key, key, key, None]  # None: no field
    assert all(line["level"] == "INFO" and line["idempotency_source"] == "event" for line in said)
    assert said[0]["idempotency_store_requests"] == 2 and said[0]["idempotency_store_ms"] > 0  # claim, complete
    assert said[1]["idempotency_store_requests"] == 1  # the read that confirms the cached record
    assert f"key {key}: first run" in said[0]["message"]
    passed = [line for line in lines if "selected nothing from the event" in line["message"]]
    assert passed and passed[0]["idempotency_outcome"] == "passed_through" and "idempotency_key" not in passed[0]
    assert len(function.runs) == 2


def test_a_batch_carries_each_records_key_from_the_pool_threads(build, ddb_client, table):
    function = build()
    other = build()
    messages = [json_message({"n": n}) for n in range(4)]
    keys = KeyDeriver(FUNCTION, None)
    busy = keys.key_of(messages[3].message_id)
    assert isinstance(other.handler.cycle.claim(Invocation(30_000), busy), Claimed)  # live in another environment
    build.lines.take()
    build.lines.records.clear()

    def vanish(event: Any, context: Any) -> Any:
        # The handler removes its records' claims and reports every record failed: each release then finds its
        # claim gone and says so, from a thread of the batch's pool, naming its record's key.
        for record in event["Records"]:
            ddb_client.delete_item(TableName=table, Key={"id": {"S": keys.key_of(record["messageId"])}})
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"]]}

    function.user = vanish
    function(sqs_event(messages))
    lines = build.lines.take()
    keys_agree(lines)
    gone = [line for line in lines if "already gone at release" in line["message"]]
    expected = {keys.key_of(message.message_id) for message in messages[:3]}
    assert {line["idempotency_key"] for line in gone} == expected and len(gone) == 3
    assert all(line["idempotency_outcome"] == "released" for line in gone)
    threads = {record.threadName for record in build.lines.records if "already gone" in record.getMessage()}
    assert all(name.startswith("idempotency") for name in threads), threads  # written in the pool's threads
    conflict = [line for line in lines if "its record is reported as failed" in line["message"]]
    assert [(line["idempotency_key"], line["idempotency_outcome"]) for line in conflict] == [(busy, "in_progress")]
    (said,) = summaries(lines)
    assert said["message"].startswith("idempotency: batch of 4 record(s): 3 first run(s), 1 in progress, 3 released")
    assert said["idempotency_records"] == 4 and "idempotency_key" not in said
    assert said["idempotency_counts"] == {"FirstExecutions": 3, "InProgressConflicts": 1, "Releases": 3}


def test_http_requests_carry_their_scoped_key(build, ddb_client, table):
    function, other = build(), build()
    function.user = lambda event, context: {"statusCode": 201, "body": "made"}
    header = uuid.uuid4().hex

    def request() -> Any:
        return v2("POST", "/orders", {"Idempotency-Key": header}, "{}")

    function(request())
    function(request())
    (key,) = stored_keys(ddb_client, table)
    started = {"held": False}

    def hold(event: Any, context: Any) -> Any:
        started["held"] = True
        assert other(request())["statusCode"] == 409  # meanwhile, a copy in another environment
        return {"statusCode": 200, "body": ""}

    # A fresh key held by `function` while `other` asks for it: the 409 line names the key.
    header = uuid.uuid4().hex
    function.user = hold
    function(request())
    assert started["held"]
    lines = build.lines.take()
    keys_agree(lines)
    said = summaries(lines)
    assert [line["idempotency_source"] for line in said] == ["http"] * 4
    outcomes = [(line["idempotency_outcome"], line["idempotency_key"] == key) for line in said]
    assert outcomes[:2] == [("first_run", True), ("replay", True)]
    assert [o for o, _ in outcomes[2:]] == ["in_progress", "first_run"]  # the 409 ends before the holder
    answered = [line for line in lines if "answered 409" in line["message"]]
    assert answered[0]["idempotency_outcome"] == "in_progress"
    assert answered[0]["idempotency_key"] == said[2]["idempotency_key"] == said[3]["idempotency_key"] != key


def test_the_text_line_says_the_same_facts(build, ddb_client, table):
    function = build(IDEMPOTENCY_KEY_JMESPATH="orderId")
    text = io.StringIO()
    plain = logging.StreamHandler(text)
    plain.setFormatter(logging.Formatter("[%(levelname)s] %(name)s: %(message)s"))  # log.py's text format
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(plain)
    try:
        order = {"orderId": uuid.uuid4().hex}
        function(order)
        function(order)
        with pytest.raises(IdempotencyAlreadyInProgressError):
            other = build(IDEMPOTENCY_KEY_JMESPATH="orderId")
            fresh = {"orderId": uuid.uuid4().hex}
            other.handler.cycle.claim(Invocation(30_000), KeyDeriver(FUNCTION, "orderId").key(fresh))
            function(fresh)
    finally:
        logger.removeHandler(plain)
    lines = [line for line in text.getvalue().splitlines() if "idempotency: " in line]
    key = next(iter(stored_keys(ddb_client, table) - {KeyDeriver(FUNCTION, "orderId").key(fresh)}))
    assert len(lines) == 3
    assert re.fullmatch(rf"\[INFO\] idempotency_layer: idempotency: event key {key}: first run: the handler ran "
                        r"and its result was stored; store \d+\.\d ms in 2 request\(s\)", lines[0]), lines[0]
    assert f"key {key}: replay of the stored result" in lines[1] and "in 1 request(s)" in lines[1]
    assert "in progress in another invocation" in lines[2] and "raised IdempotencyAlreadyInProgressError" in lines[2]
