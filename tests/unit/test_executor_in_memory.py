"""The executor over the in-memory table: every kind of plan carried out, each batch source's settle rule (per
message, a stream's checkpoint, Kafka's per-partition offsets, Amazon MQ's failed invocation, a mapping that
ignores partial responses), HTTP's answers, and what each record is left as. Handler runs counted by the
handler itself. The same on DynamoDB Local: tests/store."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from idempotency_layer import config as _config
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyBatchIncompleteError, IdempotencyKeyError
from idempotency_layer.executor import Executor
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import plan
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED
from tests.support import broker_events, events, http_events
from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport

LONG = 60_000
BASE = {"IDEMPOTENCY_TABLE": "orders", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "AWS_LAMBDA_FUNCTION_NAME": "fn",
        "AWS_REGION": "us-east-1"}


class Function:
    """Settings, a cycle on an in-memory table, an executor, and a handler that does what it is told."""

    def __init__(self, **settings: str) -> None:
        self.config = _config.load({**BASE, **settings})
        self.keys = KeyDeriver(self.config.key_prefix, self.config.key_jmespath, self.config.payload_jmespath)
        self.db = MemoryDynamoDB()
        self.store = DynamoDBStore(MemoryTransport(self.db), "orders", self.config.attributes,
                                   key_prefix=self.config.key_prefix)
        self.cycle = Cycle(self.store, 3600, precheck=self.config.batch_precheck)
        self.runs: list[str] = []  # what the handler processed (record ids, or "whole")
        self.answer: Any = None  # a batch handler's answer, when set
        self.executor = Executor(self.cycle, self._handler, self.config)

    def _handler(self, event: Any, context: Any) -> Any:
        if isinstance(event, dict) and "requestContext" in event:
            self.runs.append("request")
            return {"statusCode": 201, "body": json.dumps({"n": len(self.runs)})}
        records = _ids(event)
        self.runs.extend(records if records is not None else ["whole"])
        return self.answer(event) if callable(self.answer) else self.answer if records is not None else len(self.runs)

    def __call__(self, event: Any) -> Any:
        return self.executor.run(plan(self.config, self.keys, event), event, None, Invocation(LONG))

    def status(self, key: str) -> str | None:
        item = self.db.item(key)
        return None if item is None else item["status"]["S"]


def _ids(event: Any) -> list[str] | None:
    if not isinstance(event, dict):
        return None
    if isinstance(event.get("Records"), list):
        return [r.get("messageId") or r.get("kinesis", {}).get("sequenceNumber") for r in event["Records"]]
    if isinstance(event.get("records"), dict):
        return [f"{r['partition']}@{r['offset']}" for rs in event["records"].values() for r in rs]
    if isinstance(event.get("messages"), list):
        return [m["messageID"] for m in event["messages"]]
    if isinstance(event.get("rmqMessagesByQueue"), dict):
        return [m["data"] for ms in event["rmqMessagesByQueue"].values() for m in ms]
    return None


def test_a_whole_event_runs_once_and_replays():
    function = Function(IDEMPOTENCY_KEY_JMESPATH="orderId")
    assert function({"orderId": "o-1"}) == 1 and function({"orderId": "o-1", "at": 2}) == 1
    assert function.runs == ["whole"]


def test_a_whole_event_without_a_key_runs_unguarded_or_is_refused(caplog):
    with caplog.at_level(logging.WARNING, "idempotency_layer"):
        function = Function(IDEMPOTENCY_KEY_JMESPATH="orderId")
        assert function({"n": 1}) == 1 and function({"n": 1}) == 2
    assert caplog.text.count("selected nothing from the event; running without idempotency") == 2
    with pytest.raises(IdempotencyKeyError, match="IDEMPOTENCY_REQUIRE_KEY is true"):
        Function(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_REQUIRE_KEY="true")({"n": 1})


def test_a_durable_invocation_runs_unclaimed():
    function = Function()
    envelope = {"DurableExecutionArn": "arn:aws:lambda:us-east-1:123456789012:function:fn:$LATEST/durable-execution/"
                                       "e-1/1", "CheckpointToken": "t", "InitialExecutionState": {"Operations": []}}
    assert function(envelope) == 1 and function(envelope) == 2 and function.db.items == {}


def test_an_http_request_replays_marked_and_its_errors_are_problems():
    function = Function()
    request = http_events.v2("POST", "/orders", {"Idempotency-Key": '"k-1"'}, "{}", sub="alice")
    first = function(request)
    again = function(http_events.v2("POST", "/orders", {"Idempotency-Key": '"k-1"'}, "{}", sub="alice"))
    assert again["body"] == first["body"] and again["headers"]["Idempotent-Replayed"] == "true"
    other = function(http_events.v2("POST", "/orders", {"Idempotency-Key": '"k-1"'}, '{"x": 1}', sub="alice"))
    assert other["statusCode"] == 422
    bad = function(http_events.v2("POST", "/orders", {"Idempotency-Key": '"open'}, "{}"))
    assert bad["statusCode"] == 400 and function.runs == ["request"]


def test_sqs_per_message_the_named_failures_come_back_the_rest_complete():
    function = Function()
    messages = [events.json_message({"n": i}) for i in range(3)]
    event = events.sqs_event(messages)
    function.answer = {"batchItemFailures": [{"itemIdentifier": messages[1].message_id}]}
    assert function(event) == function.answer
    keys = [function.keys.key_of(m.message_id) for m in messages]
    assert [function.status(k) for k in keys] == [COMPLETED, None, COMPLETED]
    function.answer = None
    assert function(events.sqs_event(messages)) is None  # only message 1 ran again, and the handler said nothing
    assert function.runs == [m.message_id for m in messages] + [messages[1].message_id]


def test_a_fifo_queue_stops_at_a_message_in_progress_and_reports_it_and_every_one_after_it():
    function = Function()
    messages = [events.json_message({"n": i}, group="g") for i in range(3)]
    busy = function.keys.key_of(messages[1].message_id)
    function.store.claim(busy, "f" * 32, 1.0, 10**13, 10**10)  # another invocation's live claim
    response = function(events.sqs_event(messages, events.queue_arn(fifo=True)))
    assert [item["itemIdentifier"] for item in response["batchItemFailures"]] == [m.message_id for m in messages[1:]]
    assert function.runs == [messages[0].message_id]


@pytest.mark.parametrize(("mode", "released"), [("checkpoint", [1, 2]), ("records", [1])])
def test_a_streams_failure_is_a_checkpoint_or_per_record(mode, released):
    function = Function(IDEMPOTENCY_STREAM_FAILURES=mode)
    records = [events.kinesis_record({"n": i}) for i in range(3)]
    function.answer = {"batchItemFailures": [{"itemIdentifier": records[1]["kinesis"]["sequenceNumber"]}]}
    response = function(events.stream_event(records))
    assert [item["itemIdentifier"] for item in response["batchItemFailures"]] == [
        records[i]["kinesis"]["sequenceNumber"] for i in released]
    keys = [function.keys.key_of([r["eventSourceARN"], r["eventID"]]) for r in records]
    assert [function.status(k) is None for k in keys] == [i in released for i in range(3)]


def test_kafka_answers_per_partition_the_offset_to_resume_from():
    function = Function()
    records = [broker_events.kafka_record("orders", p, o, {"id": f"{p}:{o}"}) for p in (0, 1) for o in (5, 6)]
    function.answer = {"batchItemFailures": [{"itemIdentifier": {"partition": "orders-1", "offset": 5}}]}
    response = function(broker_events.kafka_event(records))
    assert response == {"batchItemFailures": [{"itemIdentifier": {"partition": "orders-1", "offset": 5}}]}
    function.answer = None
    function(broker_events.kafka_event(records))
    assert function.runs == ["0@5", "0@6", "1@5", "1@6", "1@5", "1@6"]


def test_amazon_mq_fails_the_invocation_after_the_others_completed():
    function = Function()
    messages = [broker_events.activemq_message({"n": i}, f"ID:{i}") for i in range(3)]
    function.store.claim(function.keys.key_of("ID:1"), "f" * 32, 1.0, 10**13, 10**10)
    with pytest.raises(IdempotencyBatchIncompleteError, match="1 of the 3 records"):
        function(broker_events.activemq_event(messages))
    assert function.runs == ["ID:0", "ID:2"]
    assert function.status(function.keys.key_of("ID:0")) == COMPLETED


def test_a_mapping_that_ignores_partial_responses_gets_a_failed_invocation_and_an_invalid_answer_releases_all():
    function = Function(IDEMPOTENCY_BATCH_RESPONSE="fail")
    messages = [events.json_message({"n": i}) for i in range(2)]
    function.answer = {"batchItemFailures": [{"itemIdentifier": messages[0].message_id}]}
    with pytest.raises(IdempotencyBatchIncompleteError, match="1 of the 2 records"):
        function(events.sqs_event(messages))
    assert function.status(function.keys.key_of(messages[1].message_id)) == COMPLETED
    partial = Function()
    partial.answer = {"batchItemFailures": [{"itemIdentifier": "not in the batch"}]}
    assert partial(events.sqs_event(messages)) == partial.answer
    assert partial.db.items == {}


def test_a_record_without_its_key_is_reported_and_the_rest_run():
    function = Function(IDEMPOTENCY_KEY_JMESPATH="json_parse(body).orderId", IDEMPOTENCY_REQUIRE_KEY="true")
    messages = [events.json_message({"orderId": "a"}), events.json_message({"n": 1})]
    response = function(events.sqs_event(messages))
    assert response == {"batchItemFailures": [{"itemIdentifier": messages[1].message_id}]}
    assert function.runs == [messages[0].message_id]


def test_records_of_rabbitmq_keyed_by_content_are_said_once():
    function = Function()
    queues = {"q::/": [broker_events.rabbitmq_message({"n": 1}), broker_events.rabbitmq_message({"n": 2})]}
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("idempotency_layer").addHandler(handler)
    try:
        function(broker_events.rabbitmq_event(queues))
        function(broker_events.rabbitmq_event(queues, redelivered=True))
    finally:
        logging.getLogger("idempotency_layer").removeHandler(handler)
    assert sum("keyed by their data" in line for line in said) == 1
    assert len(function.runs) == 2


def test_a_batch_of_many_records_claims_concurrently_and_redelivered_is_one_read():
    function = Function()
    messages = [events.json_message({"n": i}) for i in range(25)]
    function(events.sqs_event(messages))
    transport = function.store.transport
    transport.requests.clear()
    assert function(events.sqs_event(messages)) == {"batchItemFailures": []}
    assert transport.requests == ["BatchGetItem"] and len(function.runs) == 25
