"""One system in one process, driven by the parent over a pipe: a JSON command a line, a JSON answer a line.

    worker.py SYSTEM TABLE     (endpoint, credentials and region come from the environment)

The system is set up once, as at a function's init; then each `run` command invokes a batch of events and
answers with each invocation's wall and CPU time (`time.process_time`), and how often the handler body ran.
Only the handler call is timed: building the event and checking the result are not.

A `run` command with `batch` set ("sqs" or "kafka") invokes batches instead: each invocation is one batch of
SQS_BATCH records as Lambda sends them, SQS messages built by tests/support/events.py or an MSK (`aws:kafka`)
batch over KAFKA_PARTITIONS partitions built by tests/support/broker_events.py. `delivery` "redelivery" delivers
the same records again (SQS: same messageIds, new receipt handles; Kafka: same offsets). After each batch every
record's work must have run exactly once, else the answer carries `fatal` and the parent stops the bench.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

import bench_handler
from common import (
    KAFKA_PARTITIONS,
    KEY_JMESPATH,
    KEY_PREFIX,
    ROOT,
    SESSION_TOKEN,
    SQS_BATCH,
    SYSTEMS,
    TTL_SECONDS,
    Context,
    event,
    layer_env,
    make_powertools,
    make_powertools_batch,
    make_powertools_cache,
)

_RECORDS: dict[tuple[str, str, int], list[Any]] = {}  # (kind, namespace, batch index) -> its records, for redelivery


def build(system: str, table: str) -> Any:
    if system == "layer-valkey":  # `table` is the server's URL (bench/valkey_bench.py)
        os.environ.update({"IDEMPOTENCY_ORIGINAL_HANDLER": "bench_handler.handler", "IDEMPOTENCY_STORE": "valkey",
                           "IDEMPOTENCY_VALKEY_URL": table, "IDEMPOTENCY_KEY_JMESPATH": KEY_JMESPATH,
                           "IDEMPOTENCY_KEY_PREFIX": KEY_PREFIX, "IDEMPOTENCY_TTL_SECONDS": str(TTL_SECONDS)})
        from idempotency_layer import interceptor

        return interceptor.handler
    if system == "powertools-cache":
        return make_powertools_cache(table, bench_handler.handler)
    kind, settings = SYSTEMS[system.partition("@")[0]]  # "layer@base": the layer of another revision (floor.ab)
    if settings.get("token"):
        os.environ["AWS_SESSION_TOKEN"] = SESSION_TOKEN
    if kind == "bare":
        return bench_handler.handler
    if kind == "floor":
        from floor import Floor

        return Floor(layer_env(table, os.environ["AWS_ENDPOINT_URL_DYNAMODB"]), bench_handler.handler)
    if kind == "layer":
        endpoint = os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
        os.environ.update(layer_env(table, endpoint, settings["transport"], settings["cache"],
                                    settings.get("batch"), settings.get("metrics", "off"), settings.get("precheck")))
        from idempotency_layer import interceptor  # reads its settings at import, like at a function's init

        return interceptor.handler
    if settings.get("batch"):
        return make_powertools_batch(table, settings["cache"], bench_handler.process, settings["batch"])
    return make_powertools(table, settings["cache"], bench_handler.handler)


_WALL, _CPU = time.perf_counter_ns, time.process_time_ns


def _timed(handler: Any, ev: Any, context: Any, walls: list[int], cpus: list[int]) -> Any:
    """One invocation, its wall and CPU nanoseconds appended to `walls` and `cpus`."""
    c0 = _CPU()
    w0 = _WALL()
    result = handler(ev, context)
    w1 = _WALL()
    c1 = _CPU()
    walls.append(w1 - w0)
    cpus.append(c1 - c0)
    return result


def run(handler: Any, command: dict[str, Any]) -> dict[str, Any]:
    context = Context()
    walls: list[int] = []
    cpus: list[int] = []
    runs_before = bench_handler.RUNS
    wrong = 0
    prepare = getattr(handler, "prepare", None)  # the floor's work that is not the floor's (bench/floor.py)
    for index in range(command["start"], command["start"] + command["n"]):
        ev = event(command["ns"], index, command["size"], command["keyed"])
        if prepare is not None:
            prepare(ev)
        result = _timed(handler, ev, context, walls, cpus)
        expected = {"orderId": ev.get("orderId"), "status": "placed", "lines": bench_handler.lines(ev["size"])}
        wrong += result != expected
    return {"wall": walls, "cpu": cpus, "runs": bench_handler.RUNS - runs_before, "wrong": wrong}


def _events() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # tests.support, after everything the system itself imports
    from tests.support import events

    return events


def _brokers() -> Any:
    _events()
    from tests.support import broker_events

    return broker_events


def _records(command: dict[str, Any], index: int) -> list[Any]:
    """The records of batch `index`: new ones for "new" (deterministic identities), the same ones for
    "redelivery"; SQS messages (tests.support.events) or Kafka records (tests.support.broker_events)."""
    slot = (command["batch"], command["ns"], index)
    if command["delivery"] == "redelivery":
        if slot not in _RECORDS:
            raise RuntimeError(f"batch {slot} is redelivered before it was delivered")
        return _RECORDS[slot]
    if slot in _RECORDS:
        raise RuntimeError(f"batch {slot} is delivered as new twice")
    records = []
    for i in range(SQS_BATCH):
        number = index * SQS_BATCH + i
        payload = event(command["ns"], number, command["size"])
        if command["batch"] == "kafka":
            # Round robin over the partitions, each partition's offsets consecutive across batches.
            per_partition = SQS_BATCH // KAFKA_PARTITIONS
            offset = index * per_partition + i // KAFKA_PARTITIONS
            records.append(_brokers().kafka_record(f"orders-{command['ns']}", i % KAFKA_PARTITIONS, offset, payload))
        else:
            message = _events().json_message(payload)
            message.message_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{command['ns']}/{number}"))
            records.append(message)
    _RECORDS[slot] = records
    return records


def _deliver(kind: str, records: list[Any]) -> tuple[dict[str, Any], list[str]]:
    """The event Lambda sends for `records`, and each record's order id (whose work the bench counts)."""
    if kind == "kafka":
        brokers = _brokers()
        return brokers.kafka_event(records), [brokers.kafka_payload(r)["orderId"] for r in records]
    return _events().sqs_event(records), [json.loads(m.body)["orderId"] for m in records]


def run_batch(handler: Any, command: dict[str, Any]) -> dict[str, Any]:
    kind, delivery = command["batch"], command["delivery"]
    context = Context()
    walls: list[int] = []
    cpus: list[int] = []
    runs_before = bench_handler.RUNS
    for index in range(command["start"], command["start"] + command["n"]):
        records = _records(command, index)
        ev, orders = _deliver(kind, records)
        before = bench_handler.RUNS
        result = _timed(handler, ev, context, walls, cpus)
        # Correctness, from the side effect: each record's work ran once, whichever delivery this is.
        counts = {order: bench_handler.EXECUTIONS[order] for order in orders}
        ran = bench_handler.RUNS - before
        expected_runs = len(records) if delivery == "new" else 0
        if len(counts) != len(records) or any(c != 1 for c in counts.values()) or ran != expected_runs:
            wrong = {order: count for order, count in counts.items() if count != 1}
            return {"fatal": f"{kind} {delivery} batch {index}: {ran} records ran (expected {expected_runs}); "
                             f"orders whose work did not run exactly once: {wrong or 'none'}"}
        if result != {"batchItemFailures": []}:
            return {"fatal": f"{kind} {delivery} batch {index}: answer {result!r}, expected no batchItemFailures"}
    return {"wall": walls, "cpu": cpus, "runs": bench_handler.RUNS - runs_before, "wrong": 0}


def main() -> int:
    system, table = sys.argv[1], sys.argv[2]
    # The protocol gets a private copy of stdout; anything the systems print goes to stderr.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    handler = build(system, table)
    channel.write(json.dumps({"ready": system}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "exit":
            break
        channel.write(json.dumps((run_batch if command.get("batch") else run)(handler, command)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
