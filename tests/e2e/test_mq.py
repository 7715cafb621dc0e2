"""Amazon MQ end to end (ActiveMQ `aws:mq`, RabbitMQ `aws:rmq`): the built layer under RIE + awslambdaric, an
unmodified MQ consumer (apps/mq_consumer.py), events shaped as AWS's samples (tests/support/broker_events.py),
records in DynamoDB Local.

Amazon MQ event source mappings have no partial batch response: when a message cannot run (here: another
environment holds it), the invocation fails after every runnable message ran and completed, so the broker
redelivers the batch and what completed replays. Keys: ActiveMQ's `messageID`; RabbitMQ's
`basicProperties.messageId`, else its data and basicProperties (never `redelivered`). Executions are counted
from the consumer's own side effect.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Environments, Executions, marker
from tests.support import broker_events as mq
from tests.support.rie import Invocation, LambdaEnvironment

MQ_CONSUMER = "mq_consumer.handler"
DATA_KEY = {"IDEMPOTENCY_KEY_JMESPATH": "json_parse(base64_decode(data)).marker"}
KINDS = {"activemq": (False, True), "rabbitmq": (True, True), "rabbitmq-no-message-id": (True, False)}


def consumer(environments: Environments, version: str, table: str, env: dict[str, str] | None = None,
             index: int = 0) -> LambdaEnvironment:
    return environments.shared(version, table, env, index=index, handler=MQ_CONSUMER)


def message(rabbit: bool, with_id: bool, **fields: Any) -> dict[str, Any]:
    payload = {"marker": marker(), **fields}
    if rabbit:
        return mq.rabbitmq_message(payload, str(uuid.uuid4()) if with_id else None)
    message = mq.activemq_message(payload)
    if not with_id:
        del message["messageID"]
    return message


def deliver(messages: list[dict[str, Any]], redelivered: bool = False) -> dict[str, Any]:
    if "basicProperties" in messages[0]:
        if redelivered:  # a quorum queue counts deliveries in a header it adds
            messages = [{**m, "basicProperties": {**m["basicProperties"], "headers": {
                **m["basicProperties"]["headers"], "x-delivery-count": 1}}} for m in messages]
        return mq.rabbitmq_event({"orders::/": messages}, redelivered)
    return mq.activemq_event(messages, redelivered)


def mark(message: dict[str, Any]) -> str:
    return mq.mq_payload(message)["marker"]


def ok(answer: Invocation) -> None:
    assert answer.status == 200 and answer.error_type is None, answer.body


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_a_redelivered_batch_runs_each_message_once(
        python_version: str, environments: Environments, shared_table: str, executions: Executions,
        kind: tuple[bool, bool]) -> None:
    env = consumer(environments, python_version, shared_table)  # on every Python found
    old = [message(*kind) for _ in range(3)]
    ok(env.invoke(deliver(old)))
    new = message(*kind)
    ok(env.invoke(deliver([*old, new], redelivered=True)))  # the broker's redelivery flag differs now
    ok(env.invoke(deliver([*old, new], redelivered=True)))
    assert [executions.count(mark(m)) for m in [*old, new]] == [1, 1, 1, 1]


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_a_message_held_elsewhere_fails_the_invocation_after_the_others_completed(
        primary: str, environments: Environments, shared_table: str, executions: Executions, tmp_path: Path,
        kind: tuple[bool, bool]) -> None:
    holder = consumer(environments, primary, shared_table, index=1)
    other = consumer(environments, primary, shared_table, index=2)
    release = tmp_path / "release"
    before, busy, after = message(*kind), message(*kind, release=str(release)), message(*kind)
    answers: list[Invocation] = []
    thread = threading.Thread(target=lambda: answers.append(holder.invoke(deliver([busy]))), daemon=True)
    thread.start()
    try:
        executions.wait_for(mark(busy), 1)  # the holder's consumer is inside `busy`: its claim is in the table
        answer = other.invoke(deliver([before, busy, after]))
    finally:
        release.touch()
        thread.join(60)
    ok(answers[0])
    assert answer.error_type is not None, answer.body  # the broker redelivers the whole batch
    body = answer.body.decode()
    assert all(mark(m) not in body and m["data"] not in body for m in (before, busy, after))  # no content
    assert [executions.count(mark(m)) for m in (before, busy, after)] == [1, 1, 1]  # the others ran
    ok(other.invoke(deliver([before, busy, after], redelivered=True)))  # all three completed: none runs again
    assert [executions.count(mark(m)) for m in (before, busy, after)] == [1, 1, 1]


def test_an_activemq_message_without_an_id_is_refused_and_nothing_runs(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    messages = [message(False, True), message(False, False), message(False, True)]
    answer = env.invoke(deliver(messages))
    assert answer.error_type == "IdempotencyKeyError", answer.body
    assert [executions.count(mark(m)) for m in messages] == [0, 0, 0]


def test_a_key_expression_selects_from_each_message(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table, DATA_KEY)
    order = marker()
    first, copy = mq.activemq_message({"marker": order}), mq.activemq_message({"marker": order, "copy": 1})
    ok(env.invoke(mq.activemq_event([first])))
    ok(env.invoke(mq.activemq_event([copy])))  # another messageID, the same order
    assert executions.count(order) == 1


def test_the_consumer_raising_fails_the_invocation_and_its_messages_run_again(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = consumer(environments, primary, shared_table)
    done = message(False, True)
    ok(env.invoke(deliver([done])))
    a, b = message(False, True), message(False, True, **{"raise": True})
    assert env.invoke(deliver([done, a, b])).error_type == "RuntimeError"
    assert env.invoke(deliver([done, a, b], redelivered=True)).error_type == "RuntimeError"
    assert [executions.count(mark(m)) for m in (done, a, b)] == [1, 2, 2]


def test_rabbitmq_content_keys_are_announced_once_per_environment(
        primary: str, make_env: Any, shared_table: str, executions: Executions) -> None:
    def warnings(env: LambdaEnvironment) -> list[str]:
        return [line for line in env.logs().splitlines() if "WARN" in line and "messageId" in line]

    with_ids = make_env(primary, shared_table, handler=MQ_CONSUMER)
    for _ in range(2):
        ok(with_ids.invoke(deliver([message(True, True)])))
    without = make_env(primary, shared_table, handler=MQ_CONSUMER)
    for _ in range(3):
        ok(without.invoke(deliver([message(True, True), message(True, False)])))
    assert warnings(with_ids) == []
    (line,) = warnings(without)
    assert "data" in line and "basicProperties" in line  # what they are keyed by instead
