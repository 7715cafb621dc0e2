"""The batch pre-check end to end (issue 23 part 4): the built layer under RIE + awslambdaric, the unmodified
consumer (apps/consumer.py), Lambda-shaped events, DynamoDB Local behind a proxy that counts requests on the
wire. Executions are counted from the consumer's own side effect, one line per record it processed."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Executions
from tests.e2e.test_batch import CONSUMER, failed, marker_of, order
from tests.support import events


def test_a_redelivered_sqs_batch_costs_one_request_under_the_default(
        primary: str, wired_env: Any, executions: Executions) -> None:
    with wired_env(primary, CONSUMER) as (env, proxy):
        assert failed(env.invoke(events.sqs_event([order()]))) == []  # warm: init's table check
        messages = [order() for _ in range(10)]
        proxy.reset()
        assert failed(env.invoke(events.sqs_event(messages))) == []
        assert proxy.snapshot()[0] == {"PutItem": 10, "UpdateItem": 10}  # a first delivery: no pre-check
        proxy.reset()
        assert env.invoke(events.sqs_event(messages)).json() == {"batchItemFailures": []}
        assert proxy.snapshot()[0] == {"BatchGetItem": 1}  # fully redelivered: one read answers all 10
        fresh = [order() for _ in range(3)]
        proxy.reset()
        assert failed(env.invoke(events.sqs_event(messages[:7] + fresh))) == []  # half done, redelivered
        assert proxy.snapshot()[0] == {"BatchGetItem": 1, "PutItem": 3, "UpdateItem": 3}
    assert [executions.count(marker_of(m)) for m in messages + fresh] == [1] * 13


def test_always_reads_a_retried_stream_batch_and_never_claims_every_record(
        primary: str, wired_env: Any, executions: Executions) -> None:
    marks = [order() for _ in range(5)]
    records = [events.kinesis_record({"marker": marker_of(m)}) for m in marks]
    with wired_env(primary, CONSUMER, {"IDEMPOTENCY_BATCH_PRECHECK": "always"}) as (env, proxy):
        assert failed(env.invoke(events.stream_event(records[:1]))) == []  # warm; one key: no read
        proxy.reset()
        assert failed(env.invoke(events.stream_event(records))) == []  # Lambda retried the shard's batch
        assert proxy.snapshot()[0] == {"BatchGetItem": 1, "PutItem": 4, "UpdateItem": 4}
        proxy.reset()
        assert failed(env.invoke(events.stream_event(records))) == []
        assert proxy.snapshot()[0] == {"BatchGetItem": 1}
    with wired_env(primary, CONSUMER, {"IDEMPOTENCY_BATCH_PRECHECK": "never"}) as (env, proxy):
        messages = [order() for _ in range(4)]
        assert failed(env.invoke(events.sqs_event(messages))) == []
        proxy.reset()
        assert failed(env.invoke(events.sqs_event(messages))) == []  # ApproximateReceiveCount 2
        assert proxy.snapshot()[0] == {"PutItem": 4}
    assert [executions.count(marker_of(m)) for m in marks + messages] == [1] * 9
