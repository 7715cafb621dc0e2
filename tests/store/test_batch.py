"""Batch records (SQS, Kinesis, DynamoDB Streams) through the batch runner and the real store, on DynamoDB Local.

Executions are counted by the consumer's own side effect (a list of the payload ids it processed); requests
are counted on the wire by the proxy in front of DynamoDB Local.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer import codec
from idempotency_layer.cycle import Claimed, Cycle
from idempotency_layer.errors import IdempotencyKeyError, IdempotencyPersistenceLayerError
from idempotency_layer.executor import MAX_IN_FLIGHT
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.sources import batch
from idempotency_layer.stores.dynamodb import DynamoDBError
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.store.test_correctness import EXAMPLES
from tests.support import events
from tests.support.batches import BatchRunner

LONG = 60_000


def payload(record: dict[str, Any]) -> dict[str, Any]:
    if record["eventSource"] == "aws:sqs":
        return json.loads(record["body"])
    if record["eventSource"] == "aws:kinesis":
        return json.loads(base64.b64decode(record["kinesis"]["data"]))
    return {"id": record["dynamodb"]["NewImage"]["Id"]["S"]}


def identifier(record: dict[str, Any]) -> str:
    if record["eventSource"] == "aws:sqs":
        return record["messageId"]
    if record["eventSource"] == "aws:kinesis":
        return record["kinesis"]["sequenceNumber"]
    return record["dynamodb"]["SequenceNumber"]


class Consumer:
    """An ordinary batch consumer: processes every record, reports those whose payload says `fail`."""

    def __init__(self, raises: bool = False) -> None:
        self.runs: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.raises = raises
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        self.events.append(event)
        failures = []
        for record in event["Records"]:
            body = payload(record)
            with self.lock:
                self.runs.append(body["id"])
            if body.get("fail"):
                failures.append({"itemIdentifier": identifier(record)})
        if self.raises:
            raise RuntimeError("the consumer failed")
        return {"batchItemFailures": failures} if failures else None

    def count(self, ident: str) -> int:
        return self.runs.count(ident)


def runner(store, consumer, expression=None, require_key=False, cache_size=0):
    cycle = Cycle(store, ttl_seconds=3600, cache_size=cache_size)
    return BatchRunner(cycle, KeyDeriver("fn", expression), require_key, consumer)


def deliver(run: BatchRunner, event: dict[str, Any], scope_required: bool = False) -> Any:
    parsed = batch.parse(event, scope_required)
    assert parsed is not None
    return run.run(parsed, event, None, LONG)


def failed_ids(response: Any) -> list[str]:
    return [item["itemIdentifier"] for item in (response or {}).get("batchItemFailures", [])]


def messages(n: int, tag: str, **extra: Any) -> list[events.Message]:
    return [events.json_message({"id": f"{tag}-{i}", **extra}) for i in range(n)]


def test_a_new_batch_runs_each_record_once_and_its_redelivery_runs_none(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(10, "new")
    proxy.reset()
    assert deliver(run, events.sqs_event(batch_)) is None  # no failures: the handler's own answer
    assert proxy.snapshot()[0] == {"PutItem": 10, "UpdateItem": 10}  # per record: claim, complete
    proxy.reset()
    response = deliver(run, events.sqs_event(batch_))  # redelivered: new receipt handles and receive counts
    assert proxy.snapshot()[0] == {"BatchGetItem": 1}  # a receive count of 2: one read answers every record
    assert response == {"batchItemFailures": []}
    assert len(consumer.events) == 1
    assert sorted(consumer.runs) == sorted(f"new-{i}" for i in range(10))
    record = store.get(run.keys.key_of(batch_[0].message_id))
    assert record.status == "COMPLETED" and record.result == codec.Encoded(codec.DONE, None)


def test_an_overlapping_batch_passes_only_the_new_records_in_order_in_an_otherwise_unchanged_event(store):
    consumer = Consumer()
    run = runner(store, consumer)
    old, new = messages(3, "old"), messages(3, "fresh")
    deliver(run, events.sqs_event(old))
    mixed = [new[0], old[0], new[1], old[1], new[2], old[2]]
    event = events.sqs_event(mixed)
    event["extra"] = {"kept": True}
    assert deliver(run, event) is None
    handed = consumer.events[-1]
    assert [payload(r)["id"] for r in handed["Records"]] == ["fresh-0", "fresh-1", "fresh-2"]
    assert handed["extra"] == {"kept": True}
    assert handed["Records"][0] is event["Records"][0]  # the records themselves, untouched
    assert all(consumer.count(m) == 1 for m in ["old-0", "old-1", "old-2", "fresh-0", "fresh-1", "fresh-2"])


def test_the_handlers_failures_are_released_reported_and_run_again(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    ok, bad = events.json_message({"id": "ok"}), events.json_message({"id": "bad", "fail": True})
    proxy.reset()
    response = deliver(run, events.sqs_event([ok, bad]))
    assert failed_ids(response) == [bad.message_id]
    assert proxy.snapshot()[0] == {"PutItem": 2, "UpdateItem": 1, "DeleteItem": 1}
    assert store.get(run.keys.key_of(bad.message_id)) is None
    response = deliver(run, events.sqs_event([ok, bad]))  # Lambda redelivers only `bad`; both here to be sure
    assert failed_ids(response) == [bad.message_id]
    assert consumer.count("ok") == 1 and consumer.count("bad") == 2


def test_the_handler_raising_releases_every_claimed_record_and_propagates(store):
    done = messages(1, "done")
    runner(store, Consumer()).run(batch.parse(events.sqs_event(done), False), events.sqs_event(done), None, LONG)
    consumer = Consumer(raises=True)
    run = runner(store, consumer)
    batch_ = [*messages(2, "raise"), *done]
    with pytest.raises(RuntimeError, match="the consumer failed"):
        deliver(run, events.sqs_event(batch_))
    assert all(store.get(run.keys.key_of(m.message_id)) is None for m in batch_[:2])
    assert store.get(run.keys.key_of(done[0].message_id)).status == "COMPLETED"
    consumer.raises = False
    assert deliver(run, events.sqs_event(batch_)) is None
    assert consumer.count("raise-0") == 2 and consumer.count("done-0") == 0


def in_progress_elsewhere(store, key: str) -> None:
    assert isinstance(Cycle(store, ttl_seconds=3600).claim(Invocation(LONG), key), Claimed)


def test_a_record_in_progress_elsewhere_is_reported_and_the_rest_run(store):
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(3, "busy")
    in_progress_elsewhere(store, run.keys.key_of(batch_[1].message_id))
    response = deliver(run, events.sqs_event(batch_))
    assert failed_ids(response) == [batch_[1].message_id]
    assert consumer.runs == ["busy-0", "busy-2"]


def test_fifo_stops_at_the_first_record_that_cannot_run_and_releases_the_claims_after_it(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    arn = events.queue_arn("orders", fifo=True)
    batch_ = messages(5, "fifo")
    deliver(run, events.sqs_event(batch_[3:4], arn))  # record 3 is done already
    in_progress_elsewhere(store, run.keys.key_of(batch_[1].message_id))
    proxy.reset()
    response = deliver(run, events.sqs_event(batch_, arn))
    assert failed_ids(response) == [m.message_id for m in batch_[1:]]  # the blocked one and all after it
    assert consumer.runs == ["fifo-3", "fifo-0"]
    # record 3's second delivery: one read finds it done, the other four are claimed
    assert proxy.snapshot()[0] == {"BatchGetItem": 1, "PutItem": 4, "UpdateItem": 1, "DeleteItem": 2}
    assert store.get(run.keys.key_of(batch_[2].message_id)) is None  # claimed, then released
    assert store.get(run.keys.key_of(batch_[4].message_id)) is None


def test_a_standard_queue_does_not_stop_at_a_blocked_record(store):
    consumer = Consumer()
    run = runner(store, consumer)
    batch_ = messages(3, "std")
    in_progress_elsewhere(store, run.keys.key_of(batch_[0].message_id))
    assert failed_ids(deliver(run, events.sqs_event(batch_))) == [batch_[0].message_id]
    assert consumer.runs == ["std-1", "std-2"]


def test_a_key_twice_in_one_batch_runs_once_and_copies_share_its_outcome(store):
    consumer = Consumer()
    run = runner(store, consumer, "json_parse(body).order")
    a1, a2 = events.json_message({"id": "a1", "order": "A"}), events.json_message({"id": "a2", "order": "A"})
    b1, b2 = (events.json_message({"id": "b1", "order": "B", "fail": True}),
              events.json_message({"id": "b2", "order": "B", "fail": True}))
    response = deliver(run, events.sqs_event([a1, b1, a2, b2]))
    assert consumer.runs == ["a1", "b1"]
    assert failed_ids(response) == [b1.message_id, b2.message_id]  # b failed: its copy comes back too
    deliver(run, events.sqs_event([a2]))  # a producer's second send of order A, on its own: done
    assert consumer.runs == ["a1", "b1"]


def test_records_without_a_key_follow_require_key(store):
    no_key = events.json_message({"id": "no-key"})
    not_json = events.Message("not json")
    keyed = events.json_message({"id": "keyed", "order": "K"})
    consumer = Consumer()
    response = deliver(runner(store, consumer, "json_parse(body).order", require_key=True),
                       events.sqs_event([no_key, keyed, not_json]))
    assert failed_ids(response) == [no_key.message_id, not_json.message_id]
    assert consumer.runs == ["keyed"]
    consumer = Consumer()
    plain = events.json_message({"id": "plain"})
    run = runner(store, consumer, "json_parse(body).order", require_key=False)
    assert deliver(run, events.sqs_event([plain])) is None
    assert deliver(run, events.sqs_event([plain])) is None
    assert consumer.runs == ["plain", "plain"]  # unguarded: it runs each time
    # An expression that cannot be applied is not "no key": the record is reported, whatever the setting.
    response = deliver(run, events.sqs_event([not_json, plain]))
    assert failed_ids(response) == [not_json.message_id]
    assert consumer.runs == ["plain", "plain", "plain"]


@pytest.mark.parametrize("require_key", [False, True])
def test_an_expression_written_for_the_whole_event_is_refused_not_run_unguarded(store, proxy, require_key):
    consumer = Consumer()
    run = runner(store, consumer, "Records[0].messageId", require_key=require_key)
    proxy.reset()
    with pytest.raises(IdempotencyKeyError, match=r"selects nothing from any record of this SQS batch but selects a"):
        deliver(run, events.sqs_event(messages(2, "whole-expr")))
    assert consumer.runs == [] and proxy.snapshot()[0] == {}
    # Nothing from any record and nothing from the whole event either: the setting decides (here: unguarded).
    run = runner(store, consumer, "json_parse(body).order", require_key=False)
    assert deliver(run, events.sqs_event(messages(2, "no-order"))) is None
    assert consumer.runs == ["no-order-0", "no-order-1"]


def test_a_message_delivered_twice_in_one_batch_is_reported_once(store):
    consumer = Consumer()
    message = events.json_message({"id": "twice", "fail": True})
    event = events.sqs_event([message])
    event["Records"].append(dict(event["Records"][0]))
    response = deliver(runner(store, consumer), event)
    assert response == {"batchItemFailures": [{"itemIdentifier": message.message_id}]}
    assert consumer.runs == ["twice"]


def test_a_record_without_its_default_key_is_reported_and_the_rest_run(store):
    consumer = Consumer()
    records = [events.kinesis_record({"id": "k0"}), events.kinesis_record({"id": "k1"})]
    del records[1]["eventID"]
    response = deliver(runner(store, consumer), events.stream_event(records))
    assert failed_ids(response) == [records[1]["kinesis"]["sequenceNumber"]]
    assert consumer.runs == ["k0"]


def test_a_shard_stops_at_the_first_record_that_cannot_run_so_its_order_holds(store, proxy):
    consumer = Consumer()
    run = runner(store, consumer)
    records = [events.kinesis_record({"id": f"shard-{i}"}) for i in range(4)]
    del records[1]["eventID"]  # no usable key
    response = deliver(run, events.stream_event(records))
    assert failed_ids(response) == [r["kinesis"]["sequenceNumber"] for r in records[1:]]
    assert consumer.runs == ["shard-0"]  # nothing after the blocked record ran before it
    streams = [events.dynamodb_record(f"image-{i}") for i in range(3)]
    in_progress_elsewhere(store, run.keys.key_of(streams[1]["eventID"]))
    response = deliver(run, events.stream_event(streams))
    assert failed_ids(response) == [r["dynamodb"]["SequenceNumber"] for r in streams[1:]]
    assert consumer.runs == ["shard-0", "image-0"]
    assert store.get(run.keys.key_of(streams[2]["eventID"])) is None  # claimed, then released


def test_kinesis_records_of_two_streams_with_the_same_event_id_are_two_records(store):
    consumer = Consumer()
    run = runner(store, consumer)
    first = events.kinesis_record({"id": "stream-a"}, sequence="4955", stream="a")
    second = events.kinesis_record({"id": "stream-b"}, sequence="4955", stream="b")
    assert first["eventID"] == second["eventID"]
    deliver(run, events.stream_event([first]))
    deliver(run, events.stream_event([second]))
    assert consumer.runs == ["stream-a", "stream-b"]


def test_the_handler_may_name_any_record_of_the_batch_as_lambda_allows(store):
    consumer_runs = []
    run_done = runner(store, Consumer())
    done, new, busy = messages(3, "named")
    deliver(run_done, events.sqs_event([done]))
    in_progress_elsewhere(store, run_done.keys.key_of(busy.message_id))

    def consumer(event, context):
        consumer_runs.extend(r["messageId"] for r in event["Records"])
        return {"batchItemFailures": [{"itemIdentifier": done.message_id}]}  # a record it was not given

    run = runner(store, consumer)
    response = deliver(run, events.sqs_event([done, new, busy]))
    assert consumer_runs == [new.message_id]
    # Valid for Lambda: the layer keeps its own failure (busy) and the handler's; the new record is done.
    assert failed_ids(response) == [done.message_id, busy.message_id]
    assert store.get(run.keys.key_of(new.message_id)).status == "COMPLETED"


def test_kinesis_and_dynamodb_streams_report_sequence_numbers(store):
    consumer = Consumer()
    run = runner(store, consumer)
    records = [events.kinesis_record({"id": "k0"}), events.kinesis_record({"id": "k1", "fail": True})]
    response = deliver(run, events.stream_event(records))
    assert failed_ids(response) == [records[1]["kinesis"]["sequenceNumber"]]
    assert deliver(run, events.stream_event(records)) == failed_ids_response(records[1]["kinesis"]["sequenceNumber"])
    assert consumer.runs == ["k0", "k1", "k1"]
    streams = [events.dynamodb_record("d0"), events.dynamodb_record("d1")]
    in_progress_elsewhere(store, run.keys.key_of(streams[0]["eventID"]))
    response = deliver(run, events.stream_event(streams))
    assert failed_ids(response) == [r["dynamodb"]["SequenceNumber"] for r in streams]  # a shard stops there
    assert consumer.runs == ["k0", "k1", "k1"]


def failed_ids_response(*ids: str) -> dict[str, Any]:
    return {"batchItemFailures": [{"itemIdentifier": i} for i in ids]}


@pytest.mark.parametrize("answer", [
    {"batchItemFailures": [{"itemIdentifier": "not-in-the-batch"}]},
    {"batchItemFailures": [{"itemIdentifier": ""}]},
    {"batchItemFailures": [{"itemIdentifier": None}]},
    {"batchItemFailures": [{"id": "bad key name"}]},
    {"batchItemFailures": "not a list"},
])
def test_an_invalid_partial_batch_response_releases_every_record_and_is_returned_as_it_is(store, answer):
    seen = []

    def consumer(event, context):
        seen.extend(r["messageId"] for r in event["Records"])
        return answer

    run = runner(store, consumer)
    batch_ = messages(2, "invalid")
    assert deliver(run, events.sqs_event(batch_)) is answer
    assert all(store.get(run.keys.key_of(m.message_id)) is None for m in batch_)
    assert len(seen) == 2


def test_other_fields_of_the_handlers_answer_are_kept_beside_the_failures(store):
    def consumer(event, context):
        return {"note": "kept", "batchItemFailures": []}

    run = runner(store, consumer)
    busy, ok = messages(2, "fields")
    in_progress_elsewhere(store, run.keys.key_of(busy.message_id))
    assert deliver(run, events.sqs_event([busy, ok])) == {"note": "kept", **failed_ids_response(busy.message_id)}


class Gate:
    """A transport that holds every PutItem until `width` are in flight (or a deadline), and records the most."""

    def __init__(self, transport, width: int) -> None:
        self.transport, self.width = transport, width
        self.in_flight = self.most = 0
        self.cond = threading.Condition()

    def call(self, operation, params, deadline=None):
        if operation != "PutItem":
            return self.transport.call(operation, params, deadline)
        with self.cond:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.most >= self.width, timeout=10)
        try:
            return self.transport.call(operation, params, deadline)
        finally:
            with self.cond:
                self.in_flight -= 1


def test_claims_are_concurrent_and_bounded(transport, table_name):
    gate = Gate(transport, MAX_IN_FLIGHT)
    consumer = Consumer()
    run = runner(DynamoDBStore(gate, table_name, store_attributes(), key_prefix="fn"), consumer)
    deliver(run, events.sqs_event(messages(25, "wide")))
    assert gate.most == MAX_IN_FLIGHT  # ten at once, never more
    assert len(consumer.runs) == 25


def store_attributes():
    from idempotency_layer.config import Attributes

    return Attributes()


class FailKey:
    """A transport whose PutItem fails, after its retries, for one key."""

    def __init__(self, transport, key: str, code: str = "ProvisionedThroughputExceededException") -> None:
        self.transport, self.key, self.code = transport, key, code

    def call(self, operation, params, deadline=None):
        if operation == "PutItem" and params["Item"]["id"]["S"] == self.key:
            raise DynamoDBError(operation, self.code, "throttled", None, 400)
        return self.transport.call(operation, params, deadline)


def test_a_store_failure_while_claiming_fails_the_whole_batch_and_releases_the_claims(transport, table_name):
    batch_ = messages(4, "throttled")
    keys = KeyDeriver("fn", None)
    store = DynamoDBStore(FailKey(transport, keys.key_of(batch_[2].message_id)), table_name, store_attributes(),
                          key_prefix="fn")
    consumer = Consumer()
    with pytest.raises(IdempotencyPersistenceLayerError, match="ProvisionedThroughputExceededException"):
        deliver(runner(store, consumer), events.sqs_event(batch_))
    assert consumer.runs == []
    assert all(store.get(keys.key_of(m.message_id)) is None for m in batch_)


def test_records_the_local_cache_holds_are_read_in_one_request_and_a_purged_one_runs_again(store, proxy):
    # A stream shows no redelivery; records this environment completed do: one read answers them, and one an
    # operator purged since (issue 28: the cache replayed it as done, and the queue dropped it) runs again.
    consumer = Consumer()
    run = runner(store, consumer, cache_size=100)
    records = [events.kinesis_record({"id": f"cached-{i}"}) for i in range(3)]
    deliver(run, events.stream_event(records))
    proxy.reset()
    assert deliver(run, events.stream_event(records)) == {"batchItemFailures": []}
    assert proxy.snapshot()[0] == {"BatchGetItem": 1}
    purged = run.keys.key_of([records[1]["eventSourceARN"], records[1]["eventID"]])
    record = store.get(purged)
    assert store.purge(purged, record.status, record.owner)
    proxy.reset()
    assert deliver(run, events.stream_event(records)) is None
    assert proxy.snapshot()[0] == {"BatchGetItem": 1, "PutItem": 1, "UpdateItem": 1}
    assert sorted(consumer.runs) == ["cached-0", "cached-1", "cached-1", "cached-2"]


def test_a_whole_event_under_a_key_a_record_completed_cannot_replay_and_a_record_under_a_whole_events_is_done(store):
    cycle = Cycle(store, ttl_seconds=3600)
    run = BatchRunner(cycle, KeyDeriver("fn", "json_parse(body).order"), False, Consumer())
    deliver(run, events.sqs_event([events.json_message({"id": "x", "order": "shared"})]))
    with pytest.raises(IdempotencyKeyError, match="completed as a batch record"):
        cycle.run(Invocation(LONG), run.keys.key_of("shared"), lambda: "never")
    cycle.run(Invocation(LONG), run.keys.key_of("whole"), lambda: {"ran": True})
    consumer = Consumer()
    run.handler = consumer
    assert deliver(run, events.sqs_event([events.json_message({"id": "y", "order": "whole"})])) == {
        "batchItemFailures": []}
    assert consumer.runs == []


def test_a_refused_environment_runs_no_batch(store):
    cycle = Cycle(store, ttl_seconds=3600)
    cycle.environment.refusal = "refused for the test"
    consumer = Consumer()
    with pytest.raises(IdempotencyPersistenceLayerError, match="refused for the test"):
        deliver(BatchRunner(cycle, KeyDeriver("fn", None), False, consumer), events.sqs_event(messages(2, "r")))
    assert consumer.runs == []


def test_overlapping_batches_from_several_environments_run_each_message_once(transport, table_name):
    """Threads as environments, each with its own cycle, fed overlapping batches until the queue drains."""
    pending = messages(40, "many")
    lock = threading.Lock()
    consumer = Consumer()
    outstanding = {m.message_id: m for m in pending}
    deadline = time.monotonic() + 60

    def environment(offset: int) -> None:
        run = runner(DynamoDBStore(transport, table_name, store_attributes(), key_prefix="fn"), consumer)
        step = 0
        while time.monotonic() < deadline:
            with lock:
                left = list(outstanding.values())
            if not left:
                return
            start = (offset * 7 + step * 3) % len(left)
            chosen = (left[start:] + left[:start])[:10]
            step += 1
            response = deliver(run, events.sqs_event(chosen))
            reported = set(failed_ids(response))
            with lock:
                for message in chosen:
                    if message.message_id not in reported:
                        outstanding.pop(message.message_id, None)  # deleted, as the queue would

    threads = [threading.Thread(target=environment, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not outstanding
    assert sorted(consumer.runs) == sorted(f"many-{i}" for i in range(40))


# -- property: any mix of deliveries, duplicates, failures and FIFO drains the queue with each order done once --


class Flaky:
    """A consumer that reports an order as failed the first `fails[order]` times it sees it, and may raise."""

    def __init__(self, fails: dict[str, int]) -> None:
        self.fails = dict(fails)
        self.effective: dict[str, int] = {}  # runs that were not reported failed: the side effect that counts
        self.raise_next = False

    def __call__(self, event, context):
        failures, effects = [], []
        for record in event["Records"]:
            order = json.loads(record["body"])["order"]
            if self.fails.get(order, 0) > 0:
                self.fails[order] -= 1
                failures.append({"itemIdentifier": record["messageId"]})
            else:
                effects.append(order)
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("crashed before any side effect")
        for order in effects:
            self.effective[order] = self.effective.get(order, 0) + 1
        return {"batchItemFailures": failures}


@settings(max_examples=max(10, EXAMPLES // 3), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), orders=st.integers(1, 8), fifo=st.booleans(), cache=st.sampled_from([0, 50]))
def test_any_delivery_schedule_drains_the_queue_and_does_each_order_once(store, data, orders, fifo, cache):
    names = [f"o{i}-{time.time_ns()}" for i in range(orders)]
    sends = data.draw(st.lists(st.sampled_from(names), min_size=orders, max_size=orders * 2).map(
        lambda extra: names + extra))  # every order once, some twice: the producer sent it again
    fails = {name: data.draw(st.integers(0, 2)) for name in names}
    queue = [events.json_message({"order": name}) for name in sends]
    arn = events.queue_arn("props", fifo=fifo)
    consumer = Flaky(fails)
    run = runner(store, consumer, "json_parse(body).order", cache_size=cache)
    raises = twice = 0
    for _ in range(60):
        if not queue:
            break
        if fifo:
            chosen = queue[: data.draw(st.integers(1, 10))]
        else:
            chosen = data.draw(st.lists(st.sampled_from(queue), min_size=1, max_size=10, unique_by=id))
        if raises < 3:  # bounded, so every other step makes progress and 60 steps always drain the queue
            consumer.raise_next = data.draw(st.booleans())
            raises += consumer.raise_next
        try:
            response = deliver(run, events.sqs_event(chosen, arn))
        except RuntimeError:
            continue  # the whole batch comes back
        if twice < 3 and data.draw(st.booleans()):
            twice += 1
            deliver(run, events.sqs_event(chosen, arn))  # the mapping delivered the same batch twice
        reported = set(failed_ids(response))
        delivered = {id(m) for m in chosen if m.message_id not in reported}
        queue = [m for m in queue if id(m) not in delivered]
    assert queue == []
    assert consumer.effective == dict.fromkeys(names, 1)
