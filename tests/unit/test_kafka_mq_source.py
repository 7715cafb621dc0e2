"""Kafka and Amazon MQ events: parsing, default keys, the narrowed event, and Kafka's partial batch response read
from the handler (issue 23). Pure functions: generated events, no store."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.config import load
from idempotency_layer.errors import IdempotencyKeyError
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import batch, plan
from tests.support import broker_events as brokers

BASE = {"IDEMPOTENCY_TABLE": "orders-table", "IDEMPOTENCY_KEY_PREFIX": "fn",
        "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler"}
BOUNDED = settings(max_examples=60, deadline=None, derandomize=True)
KEYS = KeyDeriver("fn", None)
TOPICS = st.sampled_from(["orders", "orders-eu", "pay.v1"])


@st.composite
def kafka_records(draw, min_size=1):
    """Records of up to 3 topics x 3 partitions, each partition's offsets distinct and increasing."""
    spots = draw(st.lists(st.tuples(TOPICS, st.integers(0, 2)), min_size=min_size, max_size=5, unique=True))
    records = []
    for name, partition in spots:
        offsets = sorted(draw(st.sets(st.integers(0, 2**40), min_size=1, max_size=3)))
        records += [brokers.kafka_record(name, partition, offset, {"n": offset}) for offset in offsets]
    return records


def keys_by_identity(event):
    parsed = batch.parse(event, True)
    return {(r["topic"], r["partition"], r["offset"]): batch.record_key(KEYS, parsed, i)
            for i, r in enumerate(parsed.records)}


@BOUNDED
@given(records=kafka_records(), self_managed=st.booleans(), seed=st.integers(0, 2**16))
def test_kafka_keys_survive_a_retry_in_any_partition_order_and_distinct_offsets_have_distinct_keys(
        records, self_managed, seed):
    first = keys_by_identity(brokers.kafka_event(records, self_managed))
    shuffled = copy.deepcopy(records)
    random.Random(seed).shuffle(shuffled)  # another grouping order; each partition's offsets stay in order
    shuffled.sort(key=lambda r: (r["topic"], r["partition"], r["offset"]))
    random.Random(seed).shuffle(groups := [g for g in dict.fromkeys((r["topic"], r["partition"]) for r in shuffled)])
    reordered = [r for g in groups for r in shuffled if (r["topic"], r["partition"]) == g]
    assert keys_by_identity(brokers.kafka_event(reordered, self_managed)) == first
    assert len(set(first.values())) == len(first)  # distinct (topic, partition, offset): distinct keys
    other = keys_by_identity(brokers.kafka_event(records, not self_managed))  # another cluster's name
    assert not set(other.values()) & set(first.values())


@BOUNDED
@given(records=kafka_records(), seed=st.integers(0, 2**16))
def test_the_narrowed_kafka_event_keeps_each_partitions_kept_records_in_order_and_drops_empty_ones(records, seed):
    event = brokers.kafka_event(records)
    parsed = batch.parse(event, True)
    kept = sorted(random.Random(seed).sample(range(len(parsed.records)), random.Random(seed).randint(0, len(
        parsed.records))))
    narrowed = parsed.narrowed(event, kept)
    if len(kept) == len(parsed.records):
        assert narrowed is event
        return
    assert narrowed["eventSourceArn"] == event["eventSourceArn"] and event["records"] == brokers.kafka_event(
        records)["records"]  # the event Lambda sent is not changed
    flat = [r for lst in narrowed["records"].values() for r in lst]
    assert flat == [parsed.records[i] for i in kept]
    assert all(narrowed["records"].values())  # no partition left empty
    assert list(narrowed["records"]) == [name for name in event["records"] if name in narrowed["records"]]


def malformed_variants(event):
    name = next(iter(event["records"]))
    record = event["records"][name][0]
    yield "records not an object", {**event, "records": [record]}
    yield "a partition not a list", {**event, "records": {name: record}}
    yield "a record not an object", {**event, "records": {name: ["x"]}}
    for field, bad in (("topic", None), ("topic", ""), ("topic", 7), ("partition", None), ("partition", "0"),
                       ("partition", True), ("partition", -1), ("offset", None), ("offset", "1"), ("offset", 1.0),
                       ("offset", False), ("partition", 2 ** 31), ("offset", 2 ** 63)):  # Kafka's int32, int64
        yield f"{field}={bad!r}", {**event, "records": {name: [{**record, field: bad}]}}
    yield "a record in another partition's list", {**event, "records": {
        name: [{**record, "partition": record["partition"] + 1}]}}
    yield "no records", {key: value for key, value in event.items() if key != "records"}


@BOUNDED
@given(records=kafka_records(), self_managed=st.booleans())
def test_malformed_kafka_events_are_refused_with_a_clear_error_naming_no_content(records, self_managed):
    event = brokers.kafka_event(records, self_managed)
    for problem, variant in malformed_variants(event):
        with pytest.raises(IdempotencyKeyError, match="the Kafka batch is malformed") as raised:
            batch.parse(variant, False)
        assert "did not run" in str(raised.value), problem
        assert "orders" not in str(raised.value) and "pay.v1" not in str(raised.value), problem


def test_a_kafka_event_without_its_cluster_has_no_default_key_but_an_expression_keys_it():
    event = brokers.kafka_event([brokers.kafka_record("orders", 0, 1, {"order": "o-1"})])
    del event["eventSourceArn"]
    parsed = batch.parse(event, True)
    with pytest.raises(IdempotencyKeyError, match="no cluster"):
        batch.record_key(KEYS, parsed, 0)
    by_order = KeyDeriver("fn", "powertools_json(powertools_base64(value)).order")
    assert batch.record_key(by_order, parsed, 0) == by_order.key_of("o-1")


def test_kafka_handler_answers_are_read_as_lambda_reads_them():
    sent = ["orders-0@5", "orders-1@7"]
    item = {"partition": "orders-0", "offset": 5}
    assert batch.handler_failures({"batchItemFailures": [{"itemIdentifier": item}]}, sent, "kafka") == {"orders-0@5"}
    assert batch.handler_failures({"batchItemFailures": []}, sent, "kafka") == set()
    assert batch.handler_failures(None, sent, "kafka") == set()
    for bad in ({**item, "offset": 6}, {**item, "offset": "5"}, {**item, "offset": True}, {"partition": "orders-0"},
                "orders-0@5", {**item, "partition": "orders-2"}):
        assert batch.handler_failures({"batchItemFailures": [{"itemIdentifier": bad}]}, sent, "kafka") is None
    # Amazon MQ has no partial batch response: the handler's answer names nothing.
    assert batch.handler_failures({"batchItemFailures": [{"itemIdentifier": "x"}]}, ["x"], "none") == set()


@BOUNDED
@given(payloads=st.lists(st.integers(0, 5), min_size=1, max_size=6), with_ids=st.lists(st.booleans(), min_size=6,
                                                                                       max_size=6))
def test_rabbitmq_keys_ignore_the_redelivered_flag_and_prefer_the_message_id(payloads, with_ids):
    messages = [brokers.rabbitmq_message({"n": p}, f"id-{i}" if with_ids[i] else None)
                for i, p in enumerate(payloads)]

    def keyed(redelivered):
        parsed = batch.parse(brokers.rabbitmq_event({"q::/": messages}, redelivered), True)
        return [batch.record_key(KEYS, parsed, i) for i in range(len(messages))]

    assert keyed(False) == keyed(True)
    keys = keyed(False)
    for i in range(len(messages)):
        if with_ids[i]:
            assert keys[i] == KEYS.key_of(f"id-{i}")
    # Content keys: equal data and properties are one message, anything else another.
    content = [i for i in range(len(messages)) if not with_ids[i]]
    for i in content:
        for j in content:
            assert (keys[i] == keys[j]) == (payloads[i] == payloads[j])


def _redelivered(message, headers, expiration_removed):
    again = copy.deepcopy(message)
    again["redelivered"] = True
    if headers is not None:
        properties = again["basicProperties"]
        properties["headers"] = {**(properties.get("headers") or {}), **headers}
    if expiration_removed:
        again["basicProperties"]["expiration"] = None
    return again


BROKER_HEADERS = st.dictionaries(
    st.sampled_from(["x-delivery-count", "x-acquired-count", "x-death", "x-first-death-reason", "x-last-death-queue",
                     "x-received-from", "x-shovelled"]),
    st.one_of(st.integers(0, 9), st.lists(st.dictionaries(st.sampled_from(["count", "reason"]), st.integers(0, 3)),
                                          max_size=2)), max_size=4)


@BOUNDED
@given(start=st.sampled_from(["absent", "null", "empty", "set"]), added=st.one_of(st.none(), BROKER_HEADERS),
       expiration_removed=st.booleans())
def test_a_rabbitmq_redelivery_keeps_its_content_key(start, added, expiration_removed):
    # Hostile review: a message published without a headers table got one from a quorum queue's redelivery
    # (x-delivery-count), x-acquired-count was not known, and dead lettering drops `expiration`: each made a new
    # key, and the message ran twice.
    first = brokers.rabbitmq_message({"n": 1})
    properties = first["basicProperties"]
    if start == "absent":
        del properties["headers"]
    elif start == "null":
        properties["headers"] = None
    elif start == "empty":
        properties["headers"] = {}

    def key(message):
        return batch.record_key(KEYS, batch.parse(brokers.rabbitmq_event({"q::/": [message]}), True), 0)

    assert key(_redelivered(first, added, expiration_removed)) == key(first)
    other = copy.deepcopy(first)
    other["basicProperties"]["headers"] = {**(properties.get("headers") or {}), "tenant": "b"}
    assert key(other) != key(first)  # an application header: another message
    upper = copy.deepcopy(first)
    upper["basicProperties"]["headers"] = {**(properties.get("headers") or {}), "X-Order": 2}
    assert key(upper) != key(first)  # the broker's headers are lowercase: X-Order is the publisher's
    assert key({**first, "data": brokers.b64json({"n": 2})}) != key(first)


def test_rabbitmq_content_keys_ignore_the_headers_a_redelivery_adds():
    first = brokers.rabbitmq_message({"n": 1})
    again = copy.deepcopy(first)
    again["redelivered"] = True
    again["basicProperties"]["headers"].update({  # a quorum queue's count, a trip through a dead-letter exchange
        "x-delivery-count": 2, "x-death": [{"count": 1, "reason": "rejected"}], "x-first-death-reason": "rejected",
        "x-last-death-queue": "orders"})
    other = copy.deepcopy(first)
    other["basicProperties"]["headers"]["tenant"] = "b"  # an application header: another message

    def key(message):
        return batch.record_key(KEYS, batch.parse(brokers.rabbitmq_event({"q::/": [message]}), True), 0)

    assert key(again) == key(first) != key(other)


def test_activemq_keys_by_message_id_and_refuses_a_message_without_one():
    one, two = brokers.activemq_message({"n": 1}, "ID:1"), brokers.activemq_message({"n": 1}, "ID:2")
    parsed = batch.parse(brokers.activemq_event([one, two]), True)
    assert [batch.record_key(KEYS, parsed, i) for i in range(2)] == [KEYS.key_of("ID:1"), KEYS.key_of("ID:2")]
    assert parsed.source.response == "none" and not parsed.ordered
    for bad in ({**one, "messageID": None}, {**one, "messageID": ""}, "x"):
        with pytest.raises(IdempotencyKeyError, match="ActiveMQ batch is malformed: message 1"):
            batch.parse(brokers.activemq_event([two, bad] if isinstance(bad, dict) else [two]) | (
                {"messages": [two, bad]} if not isinstance(bad, dict) else {}), False)


def test_rabbitmq_malformed_events_are_refused():
    good = brokers.rabbitmq_message({"n": 1}, "m")
    for bad in ({"q::/": good}, {"q::/": ["x"]}, {"q::/": [{**good, "basicProperties": None}]}, ["x"]):
        event = {**brokers.rabbitmq_event({}), "rmqMessagesByQueue": bad}
        with pytest.raises(IdempotencyKeyError, match="RabbitMQ batch is malformed"):
            batch.parse(event, False)


@pytest.mark.parametrize("scope", ["auto", "record", "event"])
def test_route_takes_kafka_and_mq_events_as_batches_under_auto_and_record(scope):
    config = load({**BASE, "IDEMPOTENCY_SCOPE": scope, "AWS_LAMBDA_FUNCTION_NAME": "fn"})
    for event in (brokers.kafka_event([brokers.kafka_record("orders", 0, 1, {})]),
                  brokers.kafka_event([brokers.kafka_record("orders", 0, 1, {})], self_managed=True),
                  brokers.activemq_event([brokers.activemq_message({})]),
                  brokers.rabbitmq_event({"q::/": [brokers.rabbitmq_message({})]})):
        assert plan(config, KEYS, event).kind == ("event" if scope == "event" else "batch")


def test_scope_record_names_kafka_and_mq_when_refusing_another_event():
    config = load({**BASE, "IDEMPOTENCY_SCOPE": "record", "AWS_LAMBDA_FUNCTION_NAME": "fn"})
    refused = r"Kafka or Amazon MQ.*aws:kafka, SelfManagedKafka, aws:mq or aws:rmq"
    with pytest.raises(IdempotencyKeyError, match=refused):
        plan(config, KEYS, {"orderId": 1})


def test_batch_response_setting():
    assert load({**BASE}).fail_whole_batch is False
    assert load({**BASE, "IDEMPOTENCY_BATCH_RESPONSE": "fail"}).fail_whole_batch is True
    with pytest.raises(Exception, match="IDEMPOTENCY_BATCH_RESPONSE"):
        load({**BASE, "IDEMPOTENCY_BATCH_RESPONSE": "all"})


# doctor --function: IDEMPOTENCY_BATCH_RESPONSE=fail in place of ReportBatchItemFailures; Amazon MQ mappings.

@pytest.mark.parametrize(("mapping", "partial", "fail"), [
    ({"UUID": "q", "EventSourceArn": "arn:aws:sqs:us-east-1:123456789012:q"}, ["FAIL"], ["PASS"]),
    ({"UUID": "s", "EventSourceArn": "arn:aws:kinesis:us-east-1:123456789012:stream/s"}, ["FAIL", "FAIL"],
     ["PASS", "FAIL"]),  # (no on-failure destination: fails either way)
    ({"UUID": "k", "SelfManagedEventSource": {"Endpoints": {}},
      "DestinationConfig": {"OnFailure": {"Destination": "arn:aws:sqs:us-east-1:123456789012:dlq"}}},
     ["FAIL", "FAIL", "PASS"], ["PASS", "PASS", "PASS"]),
    ({"UUID": "m", "EventSourceArn": "arn:aws:mq:us-east-1:123456789012:broker:b:b-1"}, ["PASS"], ["PASS"]),
])
def test_doctor_accepts_batch_response_fail_in_place_of_partial_batch_responses(mapping, partial, fail):
    from idempotency_layer.cli.doctor import mapping_checks

    queue = {"VisibilityTimeout": "180", "RedrivePolicy": "{}"} if ":sqs:" in mapping.get("EventSourceArn", "") \
        else None
    assert [c.status for c in mapping_checks(mapping, 30, queue)][:len(partial)] == partial
    checks = mapping_checks(mapping, 30, queue, True)
    assert [c.status for c in checks][:len(fail)] == fail
    if partial[0] == "FAIL":
        assert "IDEMPOTENCY_BATCH_RESPONSE=fail" in mapping_checks(mapping, 30, queue)[0].fix
        assert "IDEMPOTENCY_BATCH_RESPONSE=fail" in checks[0].detail
    if ":mq:" in mapping.get("EventSourceArn", ""):
        assert checks[0].name == "mapping m (Amazon MQ)" and "broker redelivers" in checks[0].detail
