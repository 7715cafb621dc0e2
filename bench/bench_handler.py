"""The benchmark's function: a plain handler with no idempotency code, the same for every system.

Its result is deterministic (so replays can be checked against it) and sized by the event's `size`: a small
order confirmation, or one with order lines adding up to about 1 KB or 100 KB of JSON.

`consumer` is the batch rows' function: a plain consumer that processes every record of an SQS batch
(`event["Records"]`) or a Kafka batch (`event["records"]`, lists per partition, base64 values) with
`process`, one record's work, which Powertools' record handler calls too, and reports no failures.
`EXECUTIONS` counts each order's work: the side effect the bench checks happened once.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from typing import Any

RUNS = 0  # how often the body ran: a replay must not move it
EXECUTIONS: Counter[str] = Counter()  # order id -> how often its record's work ran (batch rows)
TARGET_BYTES = {"small": 0, "1k": 1_000, "100k": 100_000}
_LINES: dict[str, list[dict[str, Any]]] = {}
_WORDS = ("mug", "book", "lamp", "chair", "desk", "pen", "bag", "cable", "plant", "clock", "shirt", "kettle")


def _line(n: int) -> dict[str, Any]:
    # Repeated keys and a hex reference: JSON that compresses like real data (a few times), not like padding.
    ref = hashlib.sha1(str(n).encode()).hexdigest()[:16]
    return {"sku": f"SKU-{n:05d}", "name": f"{_WORDS[n % 12]} {_WORDS[(n * 7) % 12]}", "qty": n % 5 + 1,
            "price": f"{(n * 37) % 10000 / 100:.2f}", "ref": ref}


def lines(size: str) -> list[dict[str, Any]]:
    """Order lines whose JSON is about TARGET_BYTES[size] long; built once, on first use."""
    found = _LINES.get(size)
    if found is None:
        found, total, n = [], 0, 0
        while total < TARGET_BYTES[size]:
            line = _line(n)
            found.append(line)
            total += len(json.dumps(line)) + 2
            n += 1
        _LINES[size] = found
    return found


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    global RUNS
    RUNS += 1
    return {"orderId": event.get("orderId"), "status": "placed", "lines": lines(event.get("size", "small"))}


def process(body: str) -> None:
    """One record's work: the order in its body (an SQS body, a Kafka value) is placed (counted once per run)."""
    global RUNS
    order = json.loads(body)
    EXECUTIONS[order["orderId"]] += 1
    RUNS += 1


def consumer(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """A batch consumer with ReportBatchItemFailures and no idempotency code: every record, none failed."""
    if "records" in event:  # Kafka: "<topic>-<partition>" -> that partition's records
        for records in event["records"].values():
            for record in records:
                process(base64.b64decode(record["value"]).decode())
    else:
        for record in event["Records"]:
            process(record["body"])
    return {"batchItemFailures": []}
