"""Kafka-shaped soak: the unmodified Kafka consumer (apps/kafka_consumer.py) under the built layer in several
execution environments, fed from a partitioned log the way Lambda's Kafka event source mapping feeds it
(tests/support/kafka_log.py: per-partition committed offsets, batches across partitions, each reported
partition resumed from the reported offset, whole batches again when an invocation errors or its answer is
lost to a timeout, partitions moving between pollers on rebalances, a moved partition's commit fenced).

The log is our own append-only files, not a Kafka broker: none installs from the package registries this
project reaches and runs here within CI's time. It stands in for the broker's storage and fetch (offsets,
partitions, keyed partitioning); the poller stands in for Lambda's event source mapping.

A producer appends orders keyed by their id; some it appends twice (a producer retry: the same order, the same
partition, a later offset, so only IDEMPOTENCY_KEY_JMESPATH on the value tells them apart), some fail their
first execution (the consumer reports them; their partition stops there). Once every partition's committed
offset reaches its end, the consumer's own side effects must show each order done exactly once.

The default run is small; IDEMLAYER_QUEUE_SOAK=<orders> soaks with that many orders.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Executions, marker
from tests.support import broker_events
from tests.support.dynamodb_local import create_table
from tests.support.kafka_log import EventSourceMapping, PartitionedLog

KAFKA_CONSUMER = "kafka_consumer.handler"
SETTINGS = {"IDEMPOTENCY_KEY_JMESPATH": "powertools_json(powertools_base64(value)).marker"}
ORDERS = int(os.environ.get("IDEMLAYER_QUEUE_SOAK") or 60)
PARTITIONS = 4
ENVIRONMENTS = 2
BATCH_SIZE = 10
DUPLICATE_EVERY = 5  # every 5th order is produced twice
FAIL_FIRST_EVERY = 7  # every 7th order fails its first execution
LOSE_EVERY = 8  # about one answer in 8 is lost to a timeout: the whole batch comes again
REBALANCE_EVERY = 15  # every 15th invocation moves every partition to the other poller


def executed(executions: Executions) -> Counter[str]:
    if not executions.path.exists():
        return Counter()
    return Counter(json.loads(line)["marker"] for line in executions.path.read_text().splitlines())


def produce(log: PartitionedLog, orders: list[dict[str, Any]], seed: int, pace: float) -> None:
    """Append every order, and each duplicate's copy a few orders later (the producer's retry)."""
    rng = random.Random(seed)
    pending: list[tuple[int, dict[str, Any]]] = []
    for i, order in enumerate(orders):
        log.append(order["marker"].encode(), json.dumps(order).encode())
        if order["duplicate"]:
            pending.append((i + rng.randint(0, 6), {**order, "copy": 1}))
        for due in [p for p in pending if p[0] <= i]:
            pending.remove(due)
            log.append(due[1]["marker"].encode(), json.dumps(due[1]).encode())
        time.sleep(pace)
    for _, copy in pending:
        log.append(copy["marker"].encode(), json.dumps(copy).encode())


@pytest.mark.parametrize("response", ["partial", "fail"], ids=["provisioned-partial", "ignoring-partial-fail"])
def test_a_partitioned_log_consumed_as_lambdas_kafka_mapping_does_runs_every_order_exactly_once(
        primary: str, make_env: Any, ddb_client: Any, executions: Executions, tmp_path: Path, response: str) -> None:
    """`partial`: a provisioned mapping with ReportBatchItemFailures, the layer's default. `fail`: a mapping that
    ignores batchItemFailures, with IDEMPOTENCY_BATCH_RESPONSE=fail, so a record that must come back fails the
    invocation and the whole batch comes again."""
    table = create_table(ddb_client, f"idempotency-kafka-soak-{uuid.uuid4().hex[:8]}")
    log = PartitionedLog(tmp_path, "orders", PARTITIONS)
    orders = [{"marker": marker(), "order": i, "duplicate": i % DUPLICATE_EVERY == 1,
               "fail_first": i % FAIL_FIRST_EVERY == 3} for i in range(ORDERS)]
    try:
        settings = {**SETTINGS, "IDEMPOTENCY_BATCH_RESPONSE": response}
        envs = [make_env(primary, table, env=settings, handler=KAFKA_CONSUMER) for _ in range(ENVIRONMENTS)]
        mapping = EventSourceMapping(log, [lambda event, env=env: tuple(env.invoke(event)[:2]) for env in envs],
                                     broker_events.CLUSTER_ARN, BATCH_SIZE, LOSE_EVERY, REBALANCE_EVERY, seed=ORDERS,
                                     partial=response == "partial")
        started = time.monotonic()
        deadline = started + 60 + ORDERS * 0.25  # a bound on waiting, far above what a soak takes
        mapping.start()
        try:
            produce(log, orders, ORDERS, pace=0.005)
            while not mapping.caught_up():
                assert not mapping.errors, mapping.errors
                assert time.monotonic() < deadline, f"not caught up: {dict(mapping.counts)}; {mapping.problems}"
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        finally:
            mapping.close()
        assert not mapping.errors, mapping.errors
    finally:
        ddb_client.delete_table(TableName=table)

    counts = mapping.counts
    appended = sum(log.end(p) for p in range(PARTITIONS))
    print(f"\nkafka soak ({response}): {len(orders)} orders, {appended} records in {PARTITIONS} partitions "
          f"({sum(o['duplicate'] for o in orders)} orders produced twice, {sum(o['fail_first'] for o in orders)} "
          f"failing first); {counts['invocations']} invocations by {ENVIRONMENTS} environments, {counts['records']} "
          f"records delivered, {counts['redelivered']} redelivered, {counts['stops']} partition stops, "
          f"{counts['timed_out']} answers lost, {counts['rebalances']} rebalances, {counts['fenced']} commits "
          f"fenced, {counts['errored']} invocations failed whole; {elapsed:.1f} s")

    if response == "partial":
        assert not mapping.problems, mapping.problems  # no errored invocation, no invalid answer
    else:  # the layer failed the invocations that had records to bring back, and only with its own error
        assert counts["errored"] >= 1 and counts["ignored_reports"] == 0, dict(counts)
        assert all(p.startswith("an errored invocation (IdempotencyBatchIncompleteError)")
                   for p in mapping.problems), mapping.problems
    assert mapping.committed == [log.end(p) for p in range(PARTITIONS)]  # every record consumed
    ran = executed(executions)
    # The consumer's own side effects: one successful execution per order (a fail_first order also has its
    # failed first one), whichever copy or delivery brought it.
    wrong = {o["marker"]: (ran[o["marker"]], o) for o in orders
             if ran[o["marker"]] != (2 if o["fail_first"] else 1)}
    assert not wrong, f"{len(wrong)} of {len(orders)} orders ran the wrong number of times: {list(wrong.values())[:10]}"
    # The run exercised what it is for: copies, stops and whole-batch redeliveries.
    assert appended == len(orders) + sum(o["duplicate"] for o in orders)
    assert counts["stops" if response == "partial" else "errored"] >= 1
    assert counts["timed_out"] >= 1 and counts["redelivered"] >= 1
