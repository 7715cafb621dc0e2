"""Queue soak: the unmodified batch consumer (apps/consumer.py) fed the way Lambda's SQS event source mapping
feeds it, from a real SQS-compatible queue (moto's server), by several execution environments at once.

A producer sends orders; some are sent twice as separate messages (new messageIds, so only the body key
`json_parse(body).marker` tells them apart), some fail on their first execution (a partial batch failure,
so SQS redelivers them after the visibility timeout). One poller per environment receives up to 10
messages, invokes its environment with the SQS event Lambda would build, and deletes what Lambda would
delete: nothing when the invocation failed, else every message but the `batchItemFailures`. Once the queue
is drained, the consumer's own side effects must show each order done exactly once.

The default run is small; IDEMLAYER_QUEUE_SOAK=<orders> soaks with that many orders per queue kind.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from tests.conftest import CREDENTIALS
from tests.e2e.conftest import Executions, marker
from tests.support.dynamodb_local import create_table
from tests.support.rie import Invocation, LambdaEnvironment
from tests.support.sqs_server import SQSServer

CONSUMER = "consumer.handler"
# INFO: the layer logs each record it reports as failed because another environment holds its key.
SETTINGS = {"IDEMPOTENCY_KEY_JMESPATH": "json_parse(body).marker", "IDEMPOTENCY_LOG_LEVEL": "INFO"}
BUSY = "its record is reported as failed"
REGION = CREDENTIALS["AWS_REGION"]
ORDERS = int(os.environ.get("IDEMLAYER_QUEUE_SOAK") or 60)
ENVIRONMENTS = 3
VISIBILITY_TIMEOUT = 2  # seconds: failed and blocked messages come back quickly
BATCH_SIZE = 10  # Lambda's default for SQS, and ReceiveMessage's maximum
# The producer keeps at most this many messages on the queue, a steady flow: moto's ReceiveMessage costs
# time in proportion to the queue's depth (1.5 s at 1200 messages), which would starve the pollers.
MAX_BACKLOG = 100
POLL_WAIT = 1  # seconds of long polling per receive: short, so pollers notice the end soon
DUPLICATE_EVERY = 5  # every 5th order is sent twice (20 %)
FAIL_FIRST_EVERY = 7  # every 7th order fails its first execution (some are duplicates too)


@pytest.fixture(scope="session")
def sqs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQSServer]:
    server = SQSServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    try:
        yield server
    finally:
        server.stop()


def sqs_client(server: SQSServer) -> Any:
    return boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION,
    ).client("sqs", endpoint_url=server.endpoint)


@dataclass
class Order:
    index: int
    marker: str
    duplicate: bool
    fail_first: bool
    group: str | None

    def messages(self) -> list[dict[str, Any]]:
        """The SendMessageBatch entries for this order: one, or two alike but for `copy`."""
        entries = []
        for copy in range(2 if self.duplicate else 1):
            body = {"marker": self.marker, "order": self.index, "copy": copy, "fail_first": self.fail_first}
            entry: dict[str, Any] = {
                "Id": f"o{self.index}c{copy}", "MessageBody": json.dumps(body),
                "MessageAttributes": {
                    "order": {"DataType": "Number", "StringValue": str(self.index)},
                    "trace": {"DataType": "Binary", "BinaryValue": uuid.uuid4().bytes},
                },
            }
            if self.group is not None:  # FIFO: a fresh deduplication id, or the copy would be dropped
                entry.update(MessageGroupId=self.group, MessageDeduplicationId=uuid.uuid4().hex)
            entries.append(entry)
        return entries


def make_orders(count: int, fifo: bool) -> list[Order]:
    # FIFO: a message in flight holds its group, so a failed one stalls its group for the visibility
    # timeout; enough groups keep the soak moving (as enough groups keep a FIFO mapping's pollers busy).
    groups = max(4, count // 20)
    return [Order(i, marker(), i % DUPLICATE_EVERY == 1, i % FAIL_FIRST_EVERY == 3,
                  f"group-{i % groups}" if fifo else None) for i in range(count)]


def lambda_attribute(value: dict[str, Any]) -> dict[str, Any]:
    """A message attribute as Lambda's SQS event spells it (lower camel case, binary as base64)."""
    converted: dict[str, Any] = {}
    if "StringValue" in value:
        converted["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        converted["binaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
    converted["stringListValues"] = list(value.get("StringListValues", []))
    converted["binaryListValues"] = [base64.b64encode(v).decode() for v in value.get("BinaryListValues", [])]
    converted["dataType"] = value["DataType"]
    return converted


def lambda_record(message: dict[str, Any], arn: str) -> dict[str, Any]:
    """One received message as a record of the event Lambda's SQS event source mapping invokes with."""
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": {name: lambda_attribute(value)
                              for name, value in message.get("MessageAttributes", {}).items()},
    }
    if "MD5OfMessageAttributes" in message:
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    record.update({"md5OfBody": message["MD5OfBody"], "eventSource": "aws:sqs", "eventSourceARN": arn,
                   "awsRegion": REGION})
    return record


def to_keep(answer: Invocation, ids: list[str]) -> tuple[str, set[str]]:
    """What Lambda makes of an answer with ReportBatchItemFailures: ("ok" | "error" | "invalid", the
    messageIds that stay on the queue). A failed invocation or an invalid response keeps the whole batch."""
    if answer.status != 200 or answer.error_type is not None:
        return "error", set(ids)
    try:
        value = answer.json()
    except ValueError:
        return "invalid", set(ids)
    items = value.get("batchItemFailures") if isinstance(value, dict) else None
    if not items:  # no answer, null or an empty list: the whole batch succeeded
        return "ok", set()
    if not isinstance(items, list):
        return "invalid", set(ids)
    keep = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not isinstance(identifier, str) or identifier not in ids:
            return "invalid", set(ids)
        keep.add(identifier)
    return "ok", keep


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # errored invocations, invalid answers, failed deletes

    def add(self, problem: str | None = None, **counts: float) -> None:
        with self.lock:
            self.counts.update(counts)
            if problem is not None and len(self.problems) < 20:
                self.problems.append(problem)


class Poller(threading.Thread):
    """One execution environment's share of the event source mapping: receive, invoke, delete."""

    def __init__(self, env: LambdaEnvironment, server: SQSServer, url: str, arn: str, stats: Stats,
                 stop: threading.Event) -> None:
        super().__init__(name=f"poller-{env.port}", daemon=True)
        self.env, self.url, self.arn, self.stats, self.stop = env, url, arn, stats, stop
        self.client = sqs_client(server)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.once()
        except BaseException as error:
            self.error = error
            self.stop.set()

    def once(self) -> None:
        began = time.monotonic()
        messages = self.client.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=BATCH_SIZE, WaitTimeSeconds=POLL_WAIT,
            MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"],
        ).get("Messages", [])
        received = time.monotonic()
        self.stats.add(receive_seconds=received - began)
        if not messages:
            return
        ids = [message["MessageId"] for message in messages]
        redelivered = sum(int(message["Attributes"]["ApproximateReceiveCount"]) > 1 for message in messages)
        answer = self.env.invoke({"Records": [lambda_record(message, self.arn) for message in messages]})
        self.stats.add(invoke_seconds=time.monotonic() - received)
        outcome, keep = to_keep(answer, ids)
        delete = [message for message in messages if message["MessageId"] not in keep]
        self.stats.add(
            None if outcome == "ok" else f"{outcome}: {answer.status} {answer.body[:500]!r}",
            invocations=1, records=len(messages), redelivered=redelivered, kept=len(keep), **{outcome: 1},
        )
        if delete:
            done = self.client.delete_message_batch(QueueUrl=self.url, Entries=[
                {"Id": str(i), "ReceiptHandle": message["ReceiptHandle"]} for i, message in enumerate(delete)])
            for failure in done.get("Failed", []):
                if failure.get("Code") == "ReceiptHandleIsInvalid":
                    # The message outlived its visibility timeout during the invocation (a cold start, say),
                    # went to another poller, and that one deleted it first. Lambda ignores this too.
                    self.stats.add(stale_delete=1)
                else:
                    self.stats.add(f"delete failed: {failure}", delete_failed=1)
            self.stats.add(deleted=len(done.get("Successful", [])))


def produce(client: Any, url: str, orders: list[Order], seed: int, room: Callable[[], None]) -> int:
    """Send every order's messages, in a shuffled order (a copy may come long before or after its twin),
    calling `room()` before each batch of sends (it returns once the queue has room for more)."""
    entries = [entry for order in orders for entry in order.messages()]
    random.Random(seed).shuffle(entries)
    for start in range(0, len(entries), BATCH_SIZE):
        room()
        done = client.send_message_batch(QueueUrl=url, Entries=entries[start:start + BATCH_SIZE])
        assert not done.get("Failed"), done["Failed"]
    return len(entries)


def queue_depth(client: Any, url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed"]
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(name, 0)) for name in names)


def executed(executions: Executions) -> Counter[str]:
    """Executions per marker, read once (the file is the whole session's)."""
    if not executions.path.exists():
        return Counter()
    return Counter(json.loads(line)["marker"] for line in executions.path.read_text().splitlines())


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_a_queue_drained_by_several_environments_runs_every_order_exactly_once(
        fifo: bool, primary: str, make_env: Any, ddb_client: Any, executions: Executions,
        sqs_server: SQSServer) -> None:
    table = create_table(ddb_client, f"idempotency-soak-{uuid.uuid4().hex[:8]}")
    client = sqs_client(sqs_server)
    name = f"soak-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
    attributes = {"VisibilityTimeout": str(VISIBILITY_TIMEOUT)}
    if fifo:
        attributes["FifoQueue"] = "true"
    url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    orders = make_orders(ORDERS, fifo)
    stats, stop = Stats(), threading.Event()
    pollers: list[Poller] = []
    try:
        arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        envs = [make_env(primary, table, env=SETTINGS, handler=CONSUMER) for _ in range(ENVIRONMENTS)]
        pollers = [Poller(env, sqs_server, url, arn, stats, stop) for env in envs]
        started = time.monotonic()
        deadline = started + 60 + ORDERS * 0.25  # a bound on waiting, far above what a soak takes

        def backlog_below(limit: int) -> None:
            while (depth := queue_depth(client, url)) >= limit:
                failed = [poller.error for poller in pollers if poller.error is not None]
                if failed:
                    raise failed[0]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the queue did not drain: {depth} message(s) left; {dict(stats.counts)}; "
                                       f"{stats.problems}")
                time.sleep(0.05)

        for poller in pollers:
            poller.start()
        try:
            sent = produce(client, url, orders, ORDERS, lambda: backlog_below(MAX_BACKLOG))
            backlog_below(1)  # nothing visible, in flight or delayed: every message was deleted
            elapsed = time.monotonic() - started
        finally:
            stop.set()
            for poller in pollers:
                poller.join(timeout=POLL_WAIT + 60)  # a poller finishes the invocation it is in
        errors = [poller.error for poller in pollers if poller.error is not None]
        assert not errors, errors
        # Drained, with the pollers stopped: still nothing on the queue, and a receive finds nothing.
        assert queue_depth(client, url) == 0
        assert client.receive_message(QueueUrl=url, MaxNumberOfMessages=BATCH_SIZE).get("Messages", []) == []
    finally:
        client.delete_queue(QueueUrl=url)
        ddb_client.delete_table(TableName=table)

    counts = stats.counts
    busy = sum(env.logs().count(BUSY) for env in envs)
    print(f"\nqueue soak ({'fifo' if fifo else 'standard'}): {len(orders)} orders, {sent} messages "
          f"({sum(o.duplicate for o in orders)} orders sent twice, {sum(o.fail_first for o in orders)} failing "
          f"first); {counts['invocations']} invocations by {ENVIRONMENTS} environments, {counts['records']} "
          f"records delivered, {counts['redelivered']} redelivered, {counts['kept']} reported failed ({busy} "
          f"in progress elsewhere), {counts['deleted']} deleted ({counts['stale_delete']} already gone), "
          f"{counts['error']} errored invocations; {elapsed:.1f} s (pollers' time summed: "
          f"{counts['receive_seconds']:.1f} s receiving, {counts['invoke_seconds']:.1f} s invoking)")

    assert not stats.problems, stats.problems  # no errored invocation, invalid answer or failed delete
    assert counts["deleted"] >= sent  # every message was deleted (a message two receives raced for: twice)

    ran = executed(executions)
    # The consumer's own side effects: one successful execution per order; a fail_first order also has its
    # failed first execution, whichever of its messages brought it.
    wrong = {o.marker: (ran[o.marker], o) for o in orders if ran[o.marker] != (2 if o.fail_first else 1)}
    assert not wrong, f"{len(wrong)} of {len(orders)} orders ran the wrong number of times: {list(wrong.values())[:10]}"
    duplicates = [o for o in orders if o.duplicate]
    assert duplicates and all(ran[o.marker] == (2 if o.fail_first else 1) for o in duplicates)
    # Every failing order's failure was reported and its message came back.
    assert counts["redelivered"] >= sum(o.fail_first for o in orders) > 0
