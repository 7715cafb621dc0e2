"""Kafka (Amazon MSK, self-managed) and Amazon MQ (ActiveMQ, RabbitMQ) batches through the batch runner and the
real store, on DynamoDB Local; and IDEMPOTENCY_BATCH_RESPONSE=fail for every batch source (issue 23).

Executions are counted by the consumers' own side effects (lists of the payload ids they processed); requests on
the wire by the proxy in front of DynamoDB Local.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.cycle import Claimed, Cycle
from idempotency_layer.errors import IdempotencyBatchIncompleteError, IdempotencyKeyError
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import batch
from tests.store.test_batch import LONG, Consumer, deliver, in_progress_elsewhere, messages
from tests.support import broker_events as brokers
from tests.support import events
from tests.support.batches import BatchRunner


class KafkaConsumer(Consumer):
    """AWS's pattern for Kafka: each partition's records in order; at a record whose payload says `fail`, report
    its offset and skip the rest of that partition; other partitions go on."""

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        self.events.append(event)
        failures = []
        for name, records in event["records"].items():
            for record in records:
                body = brokers.kafka_payload(record)
                with self.lock:
                    self.runs.append(body["id"])
                if body.get("fail"):
                    failures.append({"itemIdentifier": {"partition": name, "offset": record["offset"]}})
                    break
        if self.raises:
            raise RuntimeError("the consumer failed")
        return {"batchItemFailures": failures} if failures else None


class MQConsumer:
    """An ordinary Amazon MQ consumer: raises when a message says `fail` (MQ has no partial batch response)."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        self.events.append(event)
        if event["eventSource"] == "aws:mq":
            messages_ = event["messages"]
        else:
            messages_ = [m for queue in event["rmqMessagesByQueue"].values() for m in queue]
        for message in messages_:
            body = brokers.mq_payload(message)
            self.runs.append(body["id"])
            if body.get("fail"):
                raise RuntimeError("a message failed")
        return {"handled": len(messages_)}


def runner(store, consumer, expression=None, stream_failures="checkpoint", batch_response="partial"):
    return BatchRunner(Cycle(store, ttl_seconds=3600), KeyDeriver("fn", expression), False, consumer,
                        stream_failures, batch_response)


def topic() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"  # a topic of its own: offsets never meet another test's


def partitions(name: str, counts: dict[int, int], fail: tuple[tuple[int, int], ...] = ()) -> list[dict[str, Any]]:
    """Records of `name`, partition p holding offsets 10.. 10+counts[p]-1, payload id "<p>:<offset>"."""
    return [brokers.kafka_record(name, p, offset, {"id": f"{p}:{offset}", **({"fail": True} if (p, offset) in fail
                                                                               else {})})
            for p, n in counts.items() for offset in range(10, 10 + n)]


def kafka_key(run: BatchRunner, event: dict[str, Any], partition: str, offset: int) -> str:
    parsed = batch.parse(event, False)
    return batch.record_key(run.keys, parsed, parsed.identifiers.index(f"{partition}@{offset}"))


@pytest.mark.parametrize("self_managed", [False, True])
def test_a_kafka_batch_runs_each_offset_once_and_its_retry_runs_none(store, proxy, self_managed):
    consumer = KafkaConsumer()
    run = runner(store, consumer)
    records = partitions(topic(), {0: 3, 1: 2, 2: 1})
    proxy.reset()
    assert deliver(run, brokers.kafka_event(records, self_managed)) is None
    assert proxy.snapshot()[0] == {"PutItem": 6, "UpdateItem": 6}  # per record: claim, complete
    response = deliver(run, brokers.kafka_event(records, self_managed))  # the whole batch retried
    assert response == {"batchItemFailures": []}
    assert len(consumer.events) == 1
    assert sorted(consumer.runs) == sorted(["0:10", "0:11", "0:12", "1:10", "1:11", "2:10"])


def test_kafka_default_keys_name_the_cluster_topic_partition_and_offset(store):
    consumer = KafkaConsumer()
    run = runner(store, consumer)
    name = topic()
    deliver(run, brokers.kafka_event(partitions(name, {0: 1})))
    # The same topic, partition and offset on another cluster is another record: it runs.
    deliver(run, brokers.kafka_event(partitions(name, {0: 1}), cluster=brokers.CLUSTER_ARN + "-other"))
    assert consumer.runs == ["0:10", "0:10"]


def test_kafka_keys_by_the_expression_catch_a_producer_duplicate_at_another_offset(store):
    consumer = KafkaConsumer()
    run = runner(store, consumer, "powertools_json(powertools_base64(value)).order")
    name = topic()
    first = brokers.kafka_record(name, 0, 10, {"id": "first", "order": "o-1"})
    again = brokers.kafka_record(name, 1, 99, {"id": "again", "order": "o-1"})  # sent twice by the producer
    deliver(run, brokers.kafka_event([first]))
    assert deliver(run, brokers.kafka_event([again])) == {"batchItemFailures": []}
    assert consumer.runs == ["first"]


def test_a_copy_in_another_partition_of_a_record_that_failed_is_that_partitions_resume_point(store):
    # Hostile review: the order sent twice, to partitions 4 and 5; its first copy failed. The copy in 5 was neither
    # run nor reported, and Lambda committed partition 5 past it.
    consumer = KafkaConsumer()
    run = runner(store, consumer, "powertools_json(powertools_base64(value)).order")
    name = topic()
    failing = brokers.kafka_record(name, 4, 1, {"id": "x", "order": "o-x", "fail": True})
    copy_ = brokers.kafka_record(name, 5, 9, {"id": "x-copy", "order": "o-x"})
    later = brokers.kafka_record(name, 5, 10, {"id": "y", "order": "o-y"})
    answer = deliver(run, brokers.kafka_event([failing, copy_, later]))
    assert answer == {"batchItemFailures": [{"itemIdentifier": {"partition": f"{name}-4", "offset": 1}},
                                            {"itemIdentifier": {"partition": f"{name}-5", "offset": 9}}]}
    assert consumer.runs == ["x", "y"]
    # Lambda resumes both partitions at the offsets named; the order now succeeds, once; y stays done.
    retried = {**failing, "value": brokers.b64json({"id": "x", "order": "o-x"})}
    assert deliver(run, brokers.kafka_event([retried, copy_, later])) is None  # the consumer's own answer
    assert consumer.runs == ["x", "y", "x"]


def test_self_managed_brokers_listed_in_another_order_are_the_same_cluster(store):
    consumer = KafkaConsumer()
    run = runner(store, consumer)
    name = topic()
    event = brokers.kafka_event(partitions(name, {0: 1}), self_managed=True)
    deliver(run, {**event, "bootstrapServers": "b-1.example:9092,b-2.example:9092"})
    deliver(run, {**event, "bootstrapServers": " b-2.example:9092, B-1.Example:9092"})
    assert consumer.runs == ["0:10"]


def test_a_partition_stops_at_a_record_in_progress_elsewhere_and_the_others_go_on(store, proxy):
    consumer = KafkaConsumer()
    run = runner(store, consumer)
    name = topic()
    event = brokers.kafka_event(partitions(name, {0: 3, 1: 3}))
    in_progress_elsewhere(store, kafka_key(run, event, f"{name}-0", 11))
    proxy.reset()
    response = deliver(run, event)
    assert response == {"batchItemFailures": [{"itemIdentifier": {"partition": f"{name}-0", "offset": 11}}]}
    assert consumer.runs == ["0:10", "1:10", "1:11", "1:12"]
    handed = consumer.events[0]["records"]
    assert list(handed) == [f"{name}-0", f"{name}-1"] and [r["offset"] for r in handed[f"{name}-0"]] == [10]
    # Claims: 5 taken (offset 12 of partition 0 too, then released), 1 refused; completions 4.
    assert proxy.snapshot()[0] == {"PutItem": 6, "UpdateItem": 4, "DeleteItem": 1}
    assert store.get(kafka_key(run, event, f"{name}-0", 12)) is None


def test_a_partition_left_empty_is_dropped_from_the_event_handed_to_the_handler(store):
    consumer = KafkaConsumer()
    run = runner(store, consumer)
    name = topic()
    done = partitions(name, {0: 2})
    deliver(run, brokers.kafka_event(done))
    event = brokers.kafka_event(done + partitions(name, {1: 1}))
    event["extra"] = {"kept": True}
    assert deliver(run, event) is None
    handed = consumer.events[-1]
    assert list(handed["records"]) == [f"{name}-1"] and handed["extra"] == {"kept": True}
    assert handed["eventSourceArn"] == event["eventSourceArn"]


def test_kafka_checkpoint_per_partition_releases_from_the_reported_offset_on(store):
    """The handler stops partition 0 at offset 11 and reports it; offset 12 never ran. Lambda resumes partition 0
    from 11: 11 and 12 must run then, 10 must not; partition 1 is done."""
    consumer = KafkaConsumer()
    run = runner(store, consumer)
    name = topic()
    records = partitions(name, {0: 3, 1: 2}, fail=((0, 11),))
    response = deliver(run, brokers.kafka_event(records))
    assert response == {"batchItemFailures": [{"itemIdentifier": {"partition": f"{name}-0", "offset": 11}}]}
    retry = partitions(name, {0: 3})[1:]  # Lambda's retry from offset 11; it succeeds now
    assert deliver(run, brokers.kafka_event(retry)) is None
    assert sorted(consumer.runs) == sorted(["0:10", "0:11", "1:10", "1:11", "0:11", "0:12"])
    assert consumer.runs.count("0:12") == 1 and consumer.runs.count("0:10") == 1


def test_kafka_under_records_releases_only_the_named_offsets_and_reports_the_first_per_partition(store):
    consumer = KafkaConsumer()
    run = runner(store, consumer, stream_failures="records")
    name = topic()
    records = partitions(name, {0: 3, 1: 1}, fail=((0, 11),))
    response = deliver(run, brokers.kafka_event(records))
    assert response == {"batchItemFailures": [{"itemIdentifier": {"partition": f"{name}-0", "offset": 11}}]}
    event = brokers.kafka_event(records)
    assert store.get(kafka_key(run, event, f"{name}-0", 11)) is None
    assert store.get(kafka_key(run, event, f"{name}-0", 12)).status == "COMPLETED"  # (it never ran: records mode)


@pytest.mark.parametrize("answer", [
    {"batchItemFailures": [{"itemIdentifier": {"partition": "nowhere-0", "offset": 10}}]},
    {"batchItemFailures": [{"itemIdentifier": {"partition": "P", "offset": "10"}}]},
    {"batchItemFailures": [{"itemIdentifier": "P@10"}]},  # the layer's own spelling is not Lambda's
    {"batchItemFailures": [{"itemIdentifier": {"partition": "P", "offset": True}}]},
])
def test_an_invalid_kafka_answer_releases_every_record_and_is_returned_as_it_is(store, answer, caplog):
    name = topic()
    answer = {"batchItemFailures": [
        {"itemIdentifier": {k: (v.replace("P", f"{name}-0") if isinstance(v, str) else v)
                            for k, v in item["itemIdentifier"].items()}
         if isinstance(item["itemIdentifier"], dict) else item["itemIdentifier"].replace("P", f"{name}-0")}
        for item in answer["batchItemFailures"]]}
    seen = []

    def consumer(event, context):
        seen.extend(r["offset"] for records in event["records"].values() for r in records)
        return answer

    run = runner(store, consumer)
    event = brokers.kafka_event(partitions(name, {0: 2}))
    with caplog.at_level(logging.ERROR, logger="idempotency_layer"):
        assert deliver(run, event) is answer
    said = [r.getMessage() for r in caplog.records if "not a valid partial batch response" in r.getMessage()]
    assert len(said) == 1 and '"partition": <a partition of the batch>' in said[0] and name not in said[0]
    assert seen == [10, 11]
    assert all(store.get(kafka_key(run, event, f"{name}-0", offset)) is None for offset in (10, 11))


def test_a_valid_kafka_answer_naming_an_offset_of_the_batch_is_combined_with_the_layers(store):
    name = topic()
    event = brokers.kafka_event(partitions(name, {0: 2, 1: 2}))

    def consumer(event_, context):
        return {"batchItemFailures": [{"itemIdentifier": {"partition": f"{name}-1", "offset": 11}}], "note": "kept"}

    run = runner(store, consumer)
    in_progress_elsewhere(store, kafka_key(run, event, f"{name}-0", 10))
    assert deliver(run, event) == {"note": "kept", "batchItemFailures": [
        {"itemIdentifier": {"partition": f"{name}-0", "offset": 10}},
        {"itemIdentifier": {"partition": f"{name}-1", "offset": 11}},
    ]}


@pytest.mark.parametrize("broker", ["activemq", "rabbitmq"])
def test_mq_fails_the_invocation_after_the_runnable_messages_completed_and_they_replay_on_redelivery(store, broker):
    consumer = MQConsumer()
    run = runner(store, consumer)
    tag = uuid.uuid4().hex[:8]
    if broker == "activemq":
        batch_ = [brokers.activemq_message({"id": f"{tag}-{i}"}) for i in range(3)]

        def event(redelivered=False):
            return brokers.activemq_event(batch_, redelivered)
    else:
        batch_ = [brokers.rabbitmq_message({"id": f"{tag}-{i}"}, f"m-{tag}-{i}") for i in range(3)]

        def event(redelivered=False):
            return brokers.rabbitmq_event({"orders::/": batch_[:2], "audit::/": batch_[2:]}, redelivered)
    busy = batch.record_key(run.keys, batch.parse(event(), False), 1)
    owner = Cycle(store, ttl_seconds=3600).claim(Invocation(LONG), busy).owner
    with pytest.raises(IdempotencyBatchIncompleteError, match="1 of the 3 records") as raised:
        deliver(run, event())
    assert tag not in str(raised.value)  # no content in the message
    assert sorted(consumer.runs) == [f"{tag}-0", f"{tag}-2"]
    if broker == "rabbitmq":  # the queue left empty by the narrowing is dropped, the other kept
        assert list(consumer.events[0]["rmqMessagesByQueue"]) == ["orders::/", "audit::/"]
        assert [len(v) for v in consumer.events[0]["rmqMessagesByQueue"].values()] == [1, 1]
    Cycle(store, ttl_seconds=3600).release(Invocation(LONG), busy, owner)
    assert deliver(run, event(True)) == {"handled": 1}  # the broker's redelivery: only the one not done runs
    assert sorted(consumer.runs) == [f"{tag}-0", f"{tag}-1", f"{tag}-2"]
    assert deliver(run, event(True)) is None  # all done: nothing runs, nothing fails
    assert len(consumer.events) == 2


def test_mq_a_handler_raising_releases_every_message_and_propagates(store):
    consumer = MQConsumer()
    run = runner(store, consumer)
    tag = uuid.uuid4().hex[:8]
    batch_ = [brokers.activemq_message({"id": f"{tag}-0"}), brokers.activemq_message({"id": f"{tag}-1", "fail": 1})]
    with pytest.raises(RuntimeError):
        deliver(run, brokers.activemq_event(batch_))
    parsed = batch.parse(brokers.activemq_event(batch_), False)
    assert all(store.get(batch.record_key(run.keys, parsed, i)) is None for i in range(2))


def test_rabbitmq_without_message_id_is_keyed_by_content_not_the_redelivered_flag(store, caplog):
    consumer = MQConsumer()
    run = runner(store, consumer)
    tag = uuid.uuid4().hex[:8]
    batch_ = [brokers.rabbitmq_message({"id": f"{tag}-{i}"}) for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="idempotency_layer"):
        deliver(run, brokers.rabbitmq_event({"orders::/": batch_}))
        assert deliver(run, brokers.rabbitmq_event({"orders::/": batch_}, redelivered=True)) is None
    assert sorted(consumer.runs) == [f"{tag}-0", f"{tag}-1"]
    said = [r for r in caplog.records if "basicProperties.messageId" in r.getMessage()]
    assert len(said) == 1 and tag not in said[0].getMessage()  # one warning per environment


def test_a_rabbitmq_message_id_is_one_message_across_queues_as_the_docs_warn(store):
    # A dead-letter copy on another queue is dropped as done; so is another message given the same id.
    consumer = MQConsumer()
    run = runner(store, consumer)
    tag = uuid.uuid4().hex[:8]
    deliver(run, brokers.rabbitmq_event({"orders::/": [brokers.rabbitmq_message({"id": "first"}, tag)]}))
    assert deliver(run, brokers.rabbitmq_event({"orders-dlq::/": [brokers.rabbitmq_message({"id": "copy"}, tag)]})) \
        is None
    assert consumer.runs == ["first"]


def test_mq_messages_keyed_by_the_expression(store):
    consumer = MQConsumer()
    run = runner(store, consumer, "powertools_json(powertools_base64(data)).order")
    tag = uuid.uuid4().hex[:8]
    one = brokers.activemq_message({"id": f"{tag}-a", "order": tag})
    two = brokers.activemq_message({"id": f"{tag}-b", "order": tag})  # another messageID, the same order
    deliver(run, brokers.activemq_event([one]))
    assert deliver(run, brokers.activemq_event([two])) is None
    assert consumer.runs == [f"{tag}-a"]


@pytest.mark.parametrize("event", [
    {"eventSource": "aws:mq", "messages": [{"data": "e30="}]},
    {"eventSource": "aws:mq", "messages": "nope"},
    {"eventSource": "aws:rmq", "rmqMessagesByQueue": {"q::/": [{"data": "e30="}]}},
    {"eventSource": "aws:kafka", "records": {"t-0": [{"topic": "t", "partition": 1, "offset": 1}]}},
    {"eventSource": "SelfManagedKafka", "records": [{"topic": "t", "partition": 0, "offset": 1}]},
])
def test_a_malformed_broker_event_runs_nothing(store, proxy, event):
    consumer = MQConsumer()
    run = runner(store, consumer)
    proxy.reset()
    with pytest.raises(IdempotencyKeyError, match="malformed"):
        deliver(run, event)
    assert consumer.events == [] and proxy.snapshot()[0] == {}


# IDEMPOTENCY_BATCH_RESPONSE=fail: a mapping that ignores partial batch responses.

def test_fail_sqs_completes_what_ran_then_fails_and_the_redelivery_runs_only_the_rest(store):
    consumer = Consumer()
    run = runner(store, consumer, batch_response="fail")
    ok, bad = messages(2, "ok"), [events.json_message({"id": "bad-x", "fail": True})]
    with pytest.raises(IdempotencyBatchIncompleteError, match=r"1 of the 3 records.*IDEMPOTENCY_BATCH_RESPONSE=fail"):
        deliver(run, events.sqs_event(ok + bad))
    assert store.get(run.keys.key_of(ok[0].message_id)).status == "COMPLETED"
    assert store.get(run.keys.key_of(bad[0].message_id)) is None
    with pytest.raises(IdempotencyBatchIncompleteError):
        deliver(run, events.sqs_event(ok + bad))  # the whole batch back: only `bad` runs (and fails again)
    assert consumer.runs.count("ok-0") == 1 and consumer.runs.count("bad-x") == 2


def test_fail_with_nothing_to_bring_back_returns_the_handlers_value_as_it_is(store):
    answer = {"batchItemFailures": [], "n": 2}
    run = runner(store, lambda event, context: answer, batch_response="fail")
    assert deliver(run, events.sqs_event(messages(2, "fine"))) is answer


def test_fail_a_record_in_progress_elsewhere_fails_the_invocation(store):
    consumer = Consumer()
    run = runner(store, consumer, batch_response="fail")
    batch_ = messages(3, "busy-fail")
    in_progress_elsewhere(store, run.keys.key_of(batch_[1].message_id))
    with pytest.raises(IdempotencyBatchIncompleteError, match="1 of the 3 records"):
        deliver(run, events.sqs_event(batch_))
    assert sorted(consumer.runs) == ["busy-fail-0", "busy-fail-2"]
    assert store.get(run.keys.key_of(batch_[2].message_id)).status == "COMPLETED"


def test_fail_an_invalid_answer_fails_the_invocation_after_releasing_everything(store):
    run = runner(store, lambda event, context: {"batchItemFailures": "no"}, batch_response="fail")
    batch_ = messages(2, "invalid-fail")
    with pytest.raises(IdempotencyBatchIncompleteError, match="all 2 records"):
        deliver(run, events.sqs_event(batch_))
    assert all(store.get(run.keys.key_of(m.message_id)) is None for m in batch_)


def test_fail_kinesis_completes_before_the_checkpoint_and_fails(store):
    ran = []

    def consumer(event, context):
        for record in event["Records"]:
            ran.append(record["kinesis"]["sequenceNumber"])
            if record["kinesis"]["sequenceNumber"] == records[1]["kinesis"]["sequenceNumber"] and len(ran) == 2:
                return {"batchItemFailures": [{"itemIdentifier": record["kinesis"]["sequenceNumber"]}]}  # once
        return None

    stream = f"s-{uuid.uuid4().hex[:8]}"
    records = [events.kinesis_record({"n": i}, stream=stream) for i in range(3)]
    run = runner(store, consumer, batch_response="fail")
    with pytest.raises(IdempotencyBatchIncompleteError, match="2 of the 3 records"):
        deliver(run, events.stream_event(records))
    assert deliver(run, events.stream_event(records)) is None  # the whole batch again: 0 is done, 1 and 2 run
    assert ran == [records[i]["kinesis"]["sequenceNumber"] for i in (0, 1, 1, 2)]


def test_fail_kafka_a_stopped_partition_fails_the_invocation_and_the_retry_runs_only_the_rest(store):
    consumer = KafkaConsumer()
    run = runner(store, consumer, batch_response="fail")
    name = topic()
    records = partitions(name, {0: 2, 1: 2})
    event = brokers.kafka_event(records)
    owner_key = kafka_key(run, event, f"{name}-0", 10)
    owner = Cycle(store, ttl_seconds=3600).claim(Invocation(LONG), owner_key).owner
    with pytest.raises(IdempotencyBatchIncompleteError, match="2 of the 4 records of the Kafka batch"):
        deliver(run, event)
    Cycle(store, ttl_seconds=3600).release(Invocation(LONG), owner_key, owner)
    assert deliver(run, brokers.kafka_event(records)) is None
    assert sorted(consumer.runs) == ["0:10", "0:11", "1:10", "1:11"]


# Lambda's Kafka event source mapping, played over a few partitions: any schedule of failures, claims held elsewhere
# and duplicate deliveries drains every partition and runs each offset's work exactly once.

KAFKA_PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@KAFKA_PROPERTY
@given(data=st.data(), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       batch_size=st.integers(1, 6), batch_response=st.sampled_from(["partial", "fail"]))
def test_any_kafka_delivery_schedule_drains_each_partition_and_does_each_offset_once(
        store, data, sizes, batch_size, batch_response):
    name = topic()
    offsets = {p: list(range(100, 100 + n)) for p, n in enumerate(sizes)}
    # How many times each record fails before it succeeds (AWS's handler: report it, skip the partition's rest).
    failing = {(p, o): data.draw(st.integers(0, 2)) for p, os_ in offsets.items() for o in os_}
    done: list[tuple[int, int]] = []  # the work's side effect: one entry per successful run

    def handler(event, context):
        failures = []
        for partition_name, records in event["records"].items():
            for record in records:
                spot = (record["partition"], record["offset"])
                if failing[spot]:
                    failing[spot] -= 1
                    failures.append({"itemIdentifier": {"partition": partition_name, "offset": record["offset"]}})
                    break
                done.append(spot)
        return {"batchItemFailures": failures}

    run = runner(store, handler, batch_response=batch_response)
    other = Cycle(store, ttl_seconds=3600)
    position = {p: 0 for p in offsets}  # the mapping's committed position, an index into each partition
    for _ in range(60):
        pending = [p for p in offsets if position[p] < len(offsets[p])]
        if not pending:
            break
        records = [brokers.kafka_record(name, p, o, {"id": f"{p}:{o}"})
                   for p in pending for o in offsets[p][position[p]:position[p] + batch_size]]
        event = brokers.kafka_event(records)
        held = []  # a claim another invocation holds on one record, for this delivery only
        if data.draw(st.booleans()):
            index = data.draw(st.integers(0, len(records) - 1))
            key = batch.record_key(run.keys, batch.parse(event, False), index)
            claimed = other.claim(Invocation(LONG), key)
            if isinstance(claimed, Claimed):
                held.append((key, claimed.owner))
        try:
            response = deliver(run, event)
        except IdempotencyBatchIncompleteError:
            response = None  # the whole batch comes back: positions stay
        else:
            reported = {item["itemIdentifier"]["partition"]: item["itemIdentifier"]["offset"]
                        for item in response.get("batchItemFailures", [])}
            assert len(reported) == len(response.get("batchItemFailures", []))  # one entry per partition
            for p in pending:
                sent = offsets[p][position[p]:position[p] + batch_size]
                resume = reported.get(f"{name}-{p}")
                position[p] = offsets[p].index(resume) if resume is not None else position[p] + len(sent)
        for key, owner in held:
            other.release(Invocation(LONG), key, owner)
        if data.draw(st.booleans()):  # a duplicate delivery of the same batch (at least once)
            with contextlib.suppress(IdempotencyBatchIncompleteError):
                deliver(run, event)
    assert all(position[p] == len(offsets[p]) for p in offsets)  # drained
    assert sorted(done) == sorted((p, o) for p, os_ in offsets.items() for o in os_)  # each exactly once
