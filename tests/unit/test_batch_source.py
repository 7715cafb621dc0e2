"""sources.batch's pure parts: which events are batches, their identifiers, and which handler answers are
valid partial batch responses."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.errors import IdempotencyKeyError
from idempotency_layer.sources import batch
from tests.support import events

EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60"))


def test_an_sqs_batch_is_parsed_with_its_message_ids():
    messages = [events.json_message({"n": n}) for n in range(3)]
    parsed = batch.parse(events.sqs_event(messages), required=False)
    assert parsed is not None
    assert parsed.source.name == "SQS"
    assert parsed.identifiers == [m.message_id for m in messages]
    assert parsed.ordered is False


def test_a_fifo_queue_is_told_by_its_arn():
    event = events.sqs_event([events.json_message({"n": 1}, group="g")], events.queue_arn("orders", fifo=True))
    parsed = batch.parse(event, required=False)
    assert parsed is not None and parsed.ordered is True


def test_kinesis_and_dynamodb_streams_are_identified_by_sequence_number():
    kinesis = events.stream_event([events.kinesis_record({"n": 1}, sequence="111"), events.kinesis_record({"n": 2})])
    parsed = batch.parse(kinesis, required=False)
    assert parsed is not None and parsed.source.name == "Kinesis" and parsed.identifiers[0] == "111"
    assert parsed.source.identity == ("eventSourceARN", "eventID") and parsed.ordered is True
    streams = events.stream_event([events.dynamodb_record("m", sequence="222")])
    parsed = batch.parse(streams, required=False)
    assert parsed is not None and parsed.source.name == "DynamoDB Streams" and parsed.identifiers == ["222"]
    assert parsed.ordered is True  # a shard: records are applied in order


def test_streams_read_failures_as_a_checkpoint_and_sqs_fifo_included_per_message():
    """Lambda retries a shard from the earliest record reported, and an SQS queue (FIFO too) per message."""
    kinesis = batch.parse(events.stream_event([events.kinesis_record({"n": 1})]), required=False)
    streams = batch.parse(events.stream_event([events.dynamodb_record("m")]), required=False)
    fifo = batch.parse(events.sqs_event([events.json_message({"n": 1}, group="g")], events.queue_arn("o", fifo=True)),
                       required=False)
    standard = batch.parse(events.sqs_event([events.json_message({"n": 1})]), required=False)
    assert [parsed.source.checkpoint for parsed in (kinesis, streams, fifo, standard)] == [True, True, False, False]


@pytest.mark.parametrize(
    "event",
    [
        {"orderId": "1"},
        {"Records": []},
        {"Records": "x"},
        {"Records": [{"eventSource": "aws:s3", "s3": {}}]},  # S3 and SNS deliver one event as a whole
        {"Records": [{"EventSource": "aws:sns", "Sns": {}}]},
        [1, 2],
        None,
        "text",
    ],
)
def test_other_events_are_not_batches_and_record_scope_refuses_them(event):
    assert batch.parse(event, required=False) is None
    with pytest.raises(IdempotencyKeyError, match="IDEMPOTENCY_SCOPE=record, but the event is not a batch"):
        batch.parse(event, required=True)


def test_a_batch_mixing_sources_is_refused_naming_the_record():
    event = events.sqs_event([events.json_message({"n": 1})])
    event["Records"].append(events.kinesis_record({"n": 2}))
    with pytest.raises(IdempotencyKeyError, match="record 1 of the SQS batch is not an aws:sqs record"):
        batch.parse(event, required=False)


def test_any_record_naming_a_known_source_makes_it_a_batch_of_that_source():
    event = events.sqs_event([events.json_message({"n": 1})])
    event["Records"].insert(0, {"body": "no eventSource"})
    with pytest.raises(IdempotencyKeyError, match="record 0 of the SQS batch is not an aws:sqs record"):
        batch.parse(event, required=False)


@pytest.mark.parametrize("value", [None, "", 7])
def test_a_record_without_its_identifier_is_refused(value):
    event = events.sqs_event([events.json_message({"n": 1}), events.json_message({"n": 2})])
    event["Records"][1]["messageId"] = value
    with pytest.raises(IdempotencyKeyError, match="record 1 of the SQS batch has no messageId"):
        batch.parse(event, required=False)
    kinesis = events.stream_event([events.kinesis_record({"n": 1})])
    del kinesis["Records"][0]["kinesis"]["sequenceNumber"]
    with pytest.raises(IdempotencyKeyError, match=r"has no kinesis\.sequenceNumber"):
        batch.parse(kinesis, required=False)


@pytest.mark.parametrize("answer", [None, 0, "", [], "ok", {}, {"statusCode": 200}, {"batchItemFailures": None},
                                    {"batchItemFailures": []}])
def test_answers_without_failures_report_none(answer):
    assert batch.handler_failures(answer, ["a", "b"]) == set()


def test_failures_are_the_identifiers_listed():
    answer = {"batchItemFailures": [{"itemIdentifier": "b"}, {"itemIdentifier": "b"}]}
    assert batch.handler_failures(answer, ["a", "b"]) == {"b"}


@pytest.mark.parametrize(
    "items",
    [
        "b",
        {"itemIdentifier": "b"},
        [{"itemIdentifier": "c"}],  # not a record the handler was given
        [{"itemIdentifier": ""}],
        [{"itemIdentifier": None}],
        [{"itemidentifier": "b"}],  # Lambda reads the exact key name
        ["b"],
        [{"itemIdentifier": 1}],
    ],
)
def test_invalid_partial_batch_responses_are_told_apart(items):
    assert batch.handler_failures({"batchItemFailures": items}, ["a", "b"]) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
record_fields = st.fixed_dictionaries(
    {"eventSource": st.sampled_from(["aws:sqs", "aws:kinesis", "aws:dynamodb", "aws:s3", 1])},
    optional={"messageId": json_values, "eventID": json_values, "kinesis": json_values, "dynamodb": json_values,
              "eventSourceARN": json_values, "body": json_values},
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(records=st.lists(record_fields | json_values, max_size=5), extra=json_values)
def test_parse_answers_a_batch_none_or_a_key_error_for_any_event(records, extra):
    event = {"Records": records, "extra": extra}
    try:
        parsed = batch.parse(json.loads(json.dumps(event)), required=False)
    except IdempotencyKeyError:
        return
    if parsed is not None:
        assert len(parsed.identifiers) == len(records)
        assert all(isinstance(i, str) and i for i in parsed.identifiers)
        assert {r["eventSource"] for r in records} == {next(k for k, s in batch.SOURCES.items() if s is parsed.source)}
