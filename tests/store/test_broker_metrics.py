"""Kafka and Amazon MQ batches and IDEMPOTENCY_BATCH_RESPONSE=fail through the interceptor built from the
environment's settings (routing, the runner's settings), with the invocation's metrics document: a batch's counts
(issue 23). Runs are counted by the events the user's handler received."""

from __future__ import annotations

from typing import Any

import pytest

from idempotency_layer.cycle import Claimed
from idempotency_layer.errors import IdempotencyBatchIncompleteError
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from tests.store.test_metrics_counts import build, counts, documents  # noqa: F401  (build: the fixture)
from tests.support import broker_events as brokers
from tests.support.events import json_message, sqs_event


def kafka_offsets(function) -> list[int]:
    return [r["offset"] for event in function.runs for records in event["records"].values() for r in records]


def test_a_kafka_batch_and_its_retry_are_counted_as_a_batch(build, capsys):  # noqa: F811
    function = build(IDEMPOTENCY_KEY_JMESPATH=None)
    records = [brokers.kafka_record("metrics-k", p, offset, {"n": offset}) for p in (0, 1) for offset in (3, 4)]
    assert function(brokers.kafka_event(records)) == {"ok": True}  # no failures: the handler's own answer
    assert function(brokers.kafka_event(records)) == {"batchItemFailures": []}  # retried: nothing runs
    first, retry = documents(capsys, 2)
    assert (first["Source"], first["Records"], counts(first)) == ("batch", 4, {"FirstExecutions": 4})
    assert (retry["Source"], retry["Records"], counts(retry)) == ("batch", 4, {"Replays": 4})
    assert kafka_offsets(function) == [3, 4, 3, 4]  # once each


def test_an_mq_batch_with_a_failing_message_raises_after_the_rest_completed(build, capsys):  # noqa: F811
    function = build(IDEMPOTENCY_KEY_JMESPATH=None)
    other = build(IDEMPOTENCY_KEY_JMESPATH=None)
    messages = [brokers.activemq_message({"n": n}) for n in range(3)]
    # message 1 in progress in another environment: a live claim on the same table
    busy = KeyDeriver("shop", None).key_of(messages[1]["messageID"])
    assert isinstance(other.handler.cycle.claim(Invocation(30_000), busy), Claimed)
    capsys.readouterr()
    with pytest.raises(IdempotencyBatchIncompleteError, match="1 of the 3 records of the ActiveMQ batch"):
        function(brokers.activemq_event(messages))
    (doc,) = documents(capsys, 1)
    assert (doc["Source"], doc["Records"], counts(doc)) == ("batch", 3, {"FirstExecutions": 2,
                                                                         "InProgressConflicts": 1})
    assert [m["messageID"] for m in function.runs[0]["messages"]] == [messages[0]["messageID"],
                                                                       messages[2]["messageID"]]


@pytest.mark.parametrize("setting", ["partial", "fail"])
def test_the_batch_response_setting_reaches_the_runner(build, capsys, setting):  # noqa: F811
    function = build(IDEMPOTENCY_KEY_JMESPATH=None, IDEMPOTENCY_BATCH_RESPONSE=setting)
    good, bad = json_message({"n": 1}), json_message({"n": 2})

    def handler(event: Any, context: Any) -> Any:
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"]
                                      if r["messageId"] == bad.message_id]}

    function.user = handler
    if setting == "fail":
        with pytest.raises(IdempotencyBatchIncompleteError, match="IDEMPOTENCY_BATCH_RESPONSE=fail"):
            function(sqs_event([good, bad]))
    else:
        assert function(sqs_event([good, bad])) == {"batchItemFailures": [{"itemIdentifier": bad.message_id}]}
    (doc,) = documents(capsys, 1)
    assert counts(doc) == {"FirstExecutions": 2, "Releases": 1}
