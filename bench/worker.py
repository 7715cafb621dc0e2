"""One system in one process, driven by the parent over a pipe: a JSON command a line, a JSON answer a line.

    worker.py SYSTEM TABLE     (endpoint, credentials and region come from the environment)

The system is set up once, as at a function's init; then each `run` command invokes a batch of events and
answers with each invocation's wall and CPU time (`time.process_time`), and how often the handler body ran.
Only the handler call is timed: building the event and checking the result are not.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import bench_handler
from common import SYSTEMS, Context, event, layer_env, make_powertools


def build(system: str, table: str) -> Any:
    kind, settings = SYSTEMS[system]
    if kind == "bare":
        return bench_handler.handler
    if kind == "layer":
        endpoint = os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
        os.environ.update(layer_env(table, endpoint, settings["transport"], settings["cache"]))
        from idempotency_layer import interceptor  # reads its settings at import, like at a function's init

        return interceptor.handler
    return make_powertools(table, settings["cache"], bench_handler.handler)


def run(handler: Any, command: dict[str, Any]) -> dict[str, Any]:
    context = Context()
    walls: list[int] = []
    cpus: list[int] = []
    runs_before = bench_handler.RUNS
    wrong = 0
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    for index in range(command["start"], command["start"] + command["n"]):
        ev = event(command["ns"], index, command["size"], command["keyed"])
        c0 = cpu_clock()
        w0 = clock()
        result = handler(ev, context)
        w1 = clock()
        c1 = cpu_clock()
        walls.append(w1 - w0)
        cpus.append(c1 - c0)
        expected = {"orderId": ev.get("orderId"), "status": "placed", "lines": bench_handler.lines(ev["size"])}
        wrong += result != expected
    return {"wall": walls, "cpu": cpus, "runs": bench_handler.RUNS - runs_before, "wrong": wrong}


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
        channel.write(json.dumps(run(handler, command)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
