"""IDEMPOTENCY_BATCH_RESPONSE=fail end to end, for event source mappings that ignore `batchItemFailures`
(no ReportBatchItemFailures; Kafka outside provisioned mode): whenever a record of the batch must come back, the
invocation fails after the records that ran completed, so the whole batch is redelivered and what ran replays.

The built layer under RIE + awslambdaric, the unmodified batch consumers (apps/consumer.py for SQS,
apps/kafka_consumer.py), records in DynamoDB Local; executions counted from the consumers' own side effects.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Environments, Executions, get_record, marker, record_id
from tests.support import broker_events as kafka
from tests.support import events
from tests.support.dynamodb_local import wait_for
from tests.support.rie import Invocation, LambdaEnvironment

FAIL = {"IDEMPOTENCY_BATCH_RESPONSE": "fail"}
_offsets = itertools.count(int(time.time()) * 1000 + 10**9)  # Kafka offsets no other test uses


def env_of(environments: Environments, version: str, table: str, handler: str, index: int = 0,
           **settings: str) -> LambdaEnvironment:
    return environments.shared(version, table, {**FAIL, **settings}, index=index, handler=handler)


def order(**fields: Any) -> events.Message:
    return events.json_message({"marker": marker(), **fields})


def mark(message: events.Message) -> str:
    return json.loads(message.body)["marker"]


def succeeded(answer: Invocation) -> None:
    """A whole success: no error and nothing to report (Lambda would delete or commit the whole batch)."""
    assert answer.status == 200 and answer.error_type is None, answer.body
    assert not (answer.json() or {}).get("batchItemFailures"), answer.body


def test_a_message_the_consumer_failed_fails_the_invocation_and_only_it_runs_again(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = env_of(environments, primary, shared_table, "consumer.handler")
    ok, flaky, other = order(), order(fail_first=True), order()
    answer = env.invoke(events.sqs_event([ok, flaky, other]))
    assert answer.error_type is not None, answer.body  # not a partial answer Lambda would ignore
    body = answer.body.decode()
    assert all(mark(m) not in body and m.message_id not in body for m in (ok, flaky, other))
    assert [executions.count(mark(m)) for m in (ok, flaky, other)] == [1, 1, 1]
    # The queue redelivers the whole batch: the two that completed replay, the failed one runs again.
    succeeded(env.invoke(events.sqs_event([ok, flaky, other])))
    assert [executions.count(mark(m)) for m in (ok, flaky, other)] == [1, 2, 1]
    succeeded(env.invoke(events.sqs_event([ok, flaky, other])))
    assert [executions.count(mark(m)) for m in (ok, flaky, other)] == [1, 2, 1]


def test_a_fifo_batch_stopped_by_a_message_held_elsewhere_fails_and_the_redelivery_runs_the_rest(
        primary: str, environments: Environments, shared_table: str, executions: Executions, ddb_client: Any,
        tmp_path: Path) -> None:
    holder = environments.shared(primary, shared_table, index=3, handler="consumer.handler")
    other = env_of(environments, primary, shared_table, "consumer.handler", index=4)
    arn = events.queue_arn("orders", fifo=True)
    release = tmp_path / "release"
    before, busy, after = order(), order(release=str(release)), order()
    answers: list[Invocation] = []
    thread = threading.Thread(target=lambda: answers.append(holder.invoke(events.sqs_event([busy], arn))),
                              daemon=True)
    thread.start()
    try:
        wait_for(lambda: get_record(ddb_client, shared_table, record_id(busy.message_id)) is not None, 30,
                 "the holder's claim")
        answer = other.invoke(events.sqs_event([before, busy, after], arn))
    finally:
        release.touch()
        thread.join(60)
    assert answers[0].error_type is None, answers[0].body
    assert answer.error_type is not None, answer.body  # `busy` and `after` must come back: the whole batch does
    assert [executions.count(mark(m)) for m in (before, busy, after)] == [1, 1, 0]  # `after` waited behind
    succeeded(other.invoke(events.sqs_event([before, busy, after], arn)))
    assert [executions.count(mark(m)) for m in (before, busy, after)] == [1, 1, 1]


def test_a_kafka_partition_stopped_by_a_failure_fails_the_invocation_and_the_redelivery_runs_the_rest(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = env_of(environments, primary, shared_table, "kafka_consumer.handler")
    a = [kafka.kafka_record("orders", 0, next(_offsets), {"marker": marker()}),
         kafka.kafka_record("orders", 0, next(_offsets), {"marker": marker(), "fail_first": True}),
         kafka.kafka_record("orders", 0, next(_offsets), {"marker": marker()})]
    b = [kafka.kafka_record("orders", 1, next(_offsets), {"marker": marker()})]
    marks = [kafka.kafka_payload(r)["marker"] for r in a + b]
    answer = env.invoke(kafka.kafka_event(a + b))
    assert answer.error_type is not None, answer.body
    assert [executions.count(m) for m in marks] == [1, 1, 0, 1]
    # Lambda without a partial batch response retries the whole batch.
    succeeded(env.invoke(kafka.kafka_event(a + b)))
    assert [executions.count(m) for m in marks] == [1, 2, 1, 1]
