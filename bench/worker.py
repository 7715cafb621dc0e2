"""One system in one process, driven by the parent over a pipe: a JSON command a line, a JSON answer a line.

    worker.py SYSTEM TABLE     (endpoint, credentials and region come from the environment)

The system is set up once, as at a function's init; then each `run` command invokes a batch of events and
answers with each invocation's wall and CPU time (`time.process_time`), and how often the handler body ran.
Only the handler call is timed: building the event and checking the result are not.

A `run` command with `sqs` set ("new" or "redelivery") invokes SQS batches instead: each invocation is one
batch of SQS_BATCH messages, built by tests/support/events.py as Lambda sends them; "redelivery" delivers the
same messages again (same messageIds, new receipt handles). After each batch every message's work must have
run exactly once, else the answer carries `fatal` and the parent stops the bench.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

import bench_handler
from common import ROOT, SQS_BATCH, SYSTEMS, Context, event, layer_env, make_powertools, make_powertools_batch

_MESSAGES: dict[tuple[str, int], list[Any]] = {}  # (namespace, batch index) -> its messages, for redelivery


def build(system: str, table: str) -> Any:
    kind, settings = SYSTEMS[system]
    if kind == "bare":
        return bench_handler.handler
    if kind == "layer":
        endpoint = os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
        os.environ.update(layer_env(table, endpoint, settings["transport"], settings["cache"],
                                    settings.get("batch", False), settings.get("metrics", "off")))
        from idempotency_layer import interceptor  # reads its settings at import, like at a function's init

        return interceptor.handler
    if settings.get("batch"):
        return make_powertools_batch(table, settings["cache"], bench_handler.process)
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
    for index in range(command["start"], command["start"] + command["n"]):
        ev = event(command["ns"], index, command["size"], command["keyed"])
        result = _timed(handler, ev, context, walls, cpus)
        expected = {"orderId": ev.get("orderId"), "status": "placed", "lines": bench_handler.lines(ev["size"])}
        wrong += result != expected
    return {"wall": walls, "cpu": cpus, "runs": bench_handler.RUNS - runs_before, "wrong": wrong}


def _events() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # tests.support, after everything the system itself imports
    from tests.support import events

    return events


def _messages(command: dict[str, Any], index: int) -> list[Any]:
    """The messages of batch `index`: new ones for "new" (deterministic ids), the same ones for "redelivery"."""
    slot = (command["ns"], index)
    if command["sqs"] == "redelivery":
        if slot not in _MESSAGES:
            raise RuntimeError(f"batch {slot} is redelivered before it was delivered")
        return _MESSAGES[slot]
    if slot in _MESSAGES:
        raise RuntimeError(f"batch {slot} is delivered as new twice")
    messages = []
    for i in range(SQS_BATCH):
        number = index * SQS_BATCH + i
        message = _events().json_message(event(command["ns"], number, command["size"]))
        message.message_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{command['ns']}/{number}"))
        messages.append(message)
    _MESSAGES[slot] = messages
    return messages


def run_sqs(handler: Any, command: dict[str, Any]) -> dict[str, Any]:
    sqs_event = _events().sqs_event
    context = Context()
    walls: list[int] = []
    cpus: list[int] = []
    runs_before = bench_handler.RUNS
    for index in range(command["start"], command["start"] + command["n"]):
        messages = _messages(command, index)
        ev = sqs_event(messages)
        before = bench_handler.RUNS
        result = _timed(handler, ev, context, walls, cpus)
        # Correctness, from the side effect: each message's work ran once, whichever delivery this is.
        orders = [json.loads(m.body)["orderId"] for m in messages]
        counts = {order: bench_handler.EXECUTIONS[order] for order in orders}
        ran = bench_handler.RUNS - before
        expected_runs = len(messages) if command["sqs"] == "new" else 0
        if any(count != 1 for count in counts.values()) or ran != expected_runs:
            wrong = {order: count for order, count in counts.items() if count != 1}
            return {"fatal": f"{command['sqs']} batch {index}: {ran} records ran (expected {expected_runs}); "
                             f"orders whose work did not run exactly once: {wrong or 'none'}"}
        if result != {"batchItemFailures": []}:
            return {"fatal": f"{command['sqs']} batch {index}: answer {result!r}, expected no batchItemFailures"}
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
        channel.write(json.dumps((run_sqs if command.get("sqs") else run)(handler, command)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
