"""Kafka end to end (Amazon MSK `aws:kafka` and self-managed `SelfManagedKafka`): the built layer under RIE +
awslambdaric, an unmodified Kafka consumer (apps/kafka_consumer.py), events shaped as Lambda's Kafka event
source mappings send them (tests/support/broker_events.py), records in DynamoDB Local.

Each record is its own record in the table, keyed by its cluster, topic, partition and offset (or by
IDEMPOTENCY_KEY_JMESPATH on the record). Kafka orders records within a partition, so the first record of a
partition that cannot run stops that partition, reported in Kafka's partial batch response shape
(https://docs.aws.amazon.com/lambda/latest/dg/kafka-retry-configurations.html):
{"batchItemFailures": [{"itemIdentifier": {"partition": "<topic>-<partition>", "offset": N}}]}.
Executions are counted from the consumer's own side effect, one line per record it started.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import Environments, Executions, marker
from tests.support import broker_events as kafka
from tests.support import events
from tests.support.rie import Invocation, LambdaEnvironment

KAFKA_CONSUMER = "kafka_consumer.handler"
VALUE_KEY = {"IDEMPOTENCY_KEY_JMESPATH": "powertools_json(powertools_base64(value)).marker"}
EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60")) // 2
# Offsets no other test uses: a record's default key is its cluster, topic, partition and offset.
_offsets = itertools.count(int(time.time()) * 1000)


def consumer(environments: Environments, version: str, table: str, env: dict[str, str] | None = None,
             index: int = 0) -> LambdaEnvironment:
    return environments.shared(version, table, env, index=index, handler=KAFKA_CONSUMER)


def record(partition: int = 0, topic: str = "orders", **fields: Any) -> dict[str, Any]:
    return kafka.kafka_record(topic, partition, next(_offsets), {"marker": marker(), **fields})


def mark(record: dict[str, Any]) -> str:
    return kafka.kafka_payload(record)["marker"]


def stopped(answer: Invocation) -> list[dict[str, Any]]:
    """The answer's batchItemFailures items, checked to be Kafka's shape: {"partition": str, "offset": int}."""
    assert answer.status == 200 and answer.error_type is None, answer.body
    value = answer.json()
    assert value is None or isinstance(value, dict), answer.body
    items = (value or {}).get("batchItemFailures") or []
    for item in items:
        identifier = item["itemIdentifier"]
        assert set(identifier) == {"partition", "offset"}, item
        assert isinstance(identifier["partition"], str) and type(identifier["offset"]) is int, item
    return [item["itemIdentifier"] for item in items]


def at(record: dict[str, Any]) -> dict[str, Any]:
    return {"partition": f"{record['topic']}-{record['partition']}", "offset": record["offset"]}


@pytest.mark.parametrize("msk", [True, False], ids=["msk", "self-managed"])
def test_each_record_is_keyed_by_itself_and_a_retried_batch_runs_only_what_did_not_run(
        python_version: str, environments: Environments, shared_table: str, executions: Executions,
        msk: bool) -> None:
    env = consumer(environments, python_version, shared_table)  # on every Python found
    first = [record(0), record(0), record(1), record(2, topic="refunds")]
    assert stopped(env.invoke(kafka.kafka_event(first, self_managed=not msk))) == []
    # Lambda hands the same records again (a retry, a rebalance) with a new one behind them.
    new = record(1)
    assert stopped(env.invoke(kafka.kafka_event([*first, new], self_managed=not msk))) == []
    assert [executions.count(mark(r)) for r in [*first, new]] == [1, 1, 1, 1, 1]
    # The same topic, partition and offset on another cluster is another record.
    again = kafka.kafka_event(first[:1], self_managed=not msk)
    if msk:
        again["eventSourceArn"] = kafka.CLUSTER_ARN.replace("cluster/orders/", "cluster/payments/")
    else:
        again["bootstrapServers"] = "b-1.other.example.com:9092,b-2.other.example.com:9092"
    assert stopped(env.invoke(again)) == []
    assert executions.count(mark(first[0])) == 2


def test_a_failed_record_stops_its_partition_and_the_others_go_on(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    a = [record(0), record(0, fail_first=True), record(0)]
    b = [record(1), record(1)]
    answer = env.invoke(kafka.kafka_event([a[0], b[0], a[1], b[1], a[2]]))
    assert stopped(answer) == [at(a[1])]
    assert answer.json() == {"batchItemFailures": [{"itemIdentifier": {"partition": "orders-0",
                                                                       "offset": a[1]["offset"]}}]}
    assert [executions.count(mark(r)) for r in a + b] == [1, 1, 0, 1, 1]
    # Lambda resumes orders-0 at the reported offset, in a batch with orders-1's next record.
    b.append(record(1))
    assert stopped(env.invoke(kafka.kafka_event([a[1], a[2], b[2]]))) == []
    assert [executions.count(mark(r)) for r in a + b] == [1, 2, 1, 1, 1, 1]
    # Everything again (a rebalance restarts from older commits): nothing runs a second time.
    assert stopped(env.invoke(kafka.kafka_event(a + b))) == []
    assert [executions.count(mark(r)) for r in a + b] == [1, 2, 1, 1, 1, 1]


def test_a_record_in_progress_elsewhere_stops_its_partition(
        primary: str, environments: Environments, shared_table: str, executions: Executions,
        tmp_path: Path) -> None:
    holder = consumer(environments, primary, shared_table, index=1)
    other = consumer(environments, primary, shared_table, index=2)
    release = tmp_path / "release"
    a = [record(0), record(0, release=str(release)), record(0)]
    b = [record(1), record(1)]
    answers: list[Invocation] = []
    thread = threading.Thread(target=lambda: answers.append(holder.invoke(kafka.kafka_event([a[1]]))), daemon=True)
    thread.start()
    try:
        executions.wait_for(mark(a[1]), 1)  # the holder's consumer is inside a[1]: its claim is in the table
        answer = other.invoke(kafka.kafka_event(a + b))
    finally:
        release.touch()
        thread.join(60)
    assert stopped(answers[0]) == []
    assert answer.json() == {"batchItemFailures": [{"itemIdentifier": at(a[1])}]}
    assert [executions.count(mark(r)) for r in a + b] == [1, 1, 0, 1, 1]  # a[2] waited behind a[1]
    # Resumed from a[1]: it completed in the holder, so only a[2] runs.
    assert stopped(other.invoke(kafka.kafka_event(a[1:]))) == []
    assert [executions.count(mark(r)) for r in a + b] == [1, 1, 1, 1, 1]


def test_a_key_on_the_value_runs_an_order_produced_twice_once(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table, VALUE_KEY)
    order = marker()
    first = kafka.kafka_record("orders", 0, next(_offsets), {"marker": order})
    copy = kafka.kafka_record("orders", 0, next(_offsets), {"marker": order})  # the producer's retry: a later offset
    assert stopped(env.invoke(kafka.kafka_event([first, record(1)]))) == []
    assert stopped(env.invoke(kafka.kafka_event([copy]))) == []
    assert stopped(env.invoke(kafka.kafka_event([kafka.kafka_record("orders", 3, next(_offsets),
                                                                     {"marker": order})]))) == []
    assert executions.count(order) == 1


def _drop(field: str) -> Any:
    def malformed(event: dict[str, Any]) -> None:
        del next(iter(event["records"].values()))[0][field]
    return malformed


def _replace_first(value: Any) -> Any:
    def malformed(event: dict[str, Any]) -> None:
        next(iter(event["records"].values()))[0] = value
    return malformed


def _partition_not_a_list(event: dict[str, Any]) -> None:
    name = next(iter(event["records"]))
    event["records"][name] = {"0": event["records"][name][0]}


MALFORMED = {
    "record without offset": _drop("offset"),
    "record without topic": _drop("topic"),
    "record without partition": _drop("partition"),
    "record not an object": _replace_first("not a record"),
    "record null": _replace_first(None),
    "partition not a list": _partition_not_a_list,
    "an SQS record among them": _replace_first(events.json_message({"marker": "sqs"}).deliver(events.queue_arn())),
}


@pytest.mark.parametrize("break_it", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_kafka_event_is_refused_and_nothing_runs(
        primary: str, environments: Environments, shared_table: str, executions: Executions, break_it: Any) -> None:
    env = consumer(environments, primary, shared_table)
    records = [record(0), record(0), record(1)]
    event = kafka.kafka_event(records)
    break_it(event)
    answer = env.invoke(event)
    assert answer.error_type == "IdempotencyKeyError", answer.body
    for r in records:  # nothing ran, and no record's content is in the error
        assert executions.count(mark(r)) == 0
        assert mark(r) not in answer.body.decode() and r["value"] not in answer.body.decode()


def test_records_not_an_object_is_refused(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    r = record(0)
    event = kafka.kafka_event([r])
    event["records"] = [r]
    answer = env.invoke(event)
    assert answer.error_type == "IdempotencyKeyError", answer.body
    assert executions.count(mark(r)) == 0



@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(layout=st.lists(st.lists(st.booleans(), min_size=1, max_size=5), min_size=1, max_size=4),
       rewinds=st.lists(st.booleans(), min_size=8, max_size=8), self_managed=st.booleans())
def test_any_batch_resumed_as_lambda_resumes_runs_each_record_once(
        primary: str, environments: Environments, shared_table: str, executions: Executions,
        layout: list[list[bool]], rewinds: list[bool], self_managed: bool) -> None:
    """Partitions of records, some failing their first run (`layout`: fail_first per record); Lambda sends each
    partition from its committed offset (or, on a rewind, from the start: a rebalance onto older commits) until
    every partition is committed. Each answer must stop exactly each partition's first record that fails now, and
    the consumer's side effects must match a model in which records run in order and a done record never again."""
    env = consumer(environments, primary, shared_table)
    partitions = [[record(p, fail_first=fails) for fails in flags] for p, flags in enumerate(layout)]
    committed = [0] * len(partitions)
    ran: dict[str, int] = {}
    done: set[str] = set()
    for rewind in rewinds:
        if all(c == len(records) for c, records in zip(committed, partitions, strict=True)):
            break
        starts = [0] * len(partitions) if rewind else committed
        sent = [records[start:] for start, records in zip(starts, partitions, strict=True)]
        expected = []
        for records in sent:  # the model: in order, done ones skipped, the first failing one stops its partition
            for r in records:
                if mark(r) in done:
                    continue
                ran[mark(r)] = ran.get(mark(r), 0) + 1
                if kafka.kafka_payload(r)["fail_first"] and ran[mark(r)] == 1:
                    expected.append(at(r))
                    break
                done.add(mark(r))
        answer = stopped(env.invoke(kafka.kafka_event([r for records in sent for r in records],
                                                      self_managed=self_managed)))
        key = lambda item: (item["partition"], item["offset"])  # noqa: E731
        assert sorted(answer, key=key) == sorted(expected, key=key)
        assert {mark(r): executions.count(mark(r)) for records in partitions for r in records} == {
            mark(r): ran.get(mark(r), 0) for records in partitions for r in records}
        # Lambda resumes a reported partition at the reported offset; the others were consumed to their end.
        committed = [next((i for i, r in enumerate(records) if at(r) in answer), len(records))
                     for records in partitions]
    # Each round moves every stopped partition past one failing record: eight rounds finish any layout.
    assert committed == [len(records) for records in partitions]
    assert done == {mark(r) for records in partitions for r in records}


@pytest.mark.parametrize("mode", ["checkpoint", "records"])
def test_stream_failures_apply_to_a_kafka_partition_as_to_a_shard(
        primary: str, environments: Environments, shared_table: str, executions: Executions, mode: str) -> None:
    # This consumer runs past its failure: under `checkpoint` (the default) Lambda's resume at the reported
    # offset brings the later records back and they run again; under `records` they stay completed.
    env = environments.shared(primary, shared_table, {"IDEMPOTENCY_STREAM_FAILURES": mode},
                              handler="kafka_consumer_all.handler")
    a = [record(0), record(0, fail_first=True), record(0)]
    b = [record(1)]
    assert stopped(env.invoke(kafka.kafka_event(a + b))) == [at(a[1])]
    assert [executions.count(mark(r)) for r in a + b] == [1, 1, 1, 1]
    assert stopped(env.invoke(kafka.kafka_event(a[1:]))) == []  # Lambda resumes orders-0 at a[1]
    assert [executions.count(mark(r)) for r in a + b] == [1, 2, 2 if mode == "checkpoint" else 1, 1]
    b.append(record(1))  # a rebalance hands everything over again, with a new record: only that one runs
    assert stopped(env.invoke(kafka.kafka_event(a + b))) == []
    assert [executions.count(mark(r)) for r in a + b] == [1, 2, 2 if mode == "checkpoint" else 1, 1, 1]
