"""The user's function under test: plain Lambda code that knows nothing of the layer, steered by its event.

Every execution appends one line to $EXECUTIONS_FILE before doing anything else, so tests count real
executions from this side effect rather than from anything the layer reports.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import random
import sys
import time
import uuid
from decimal import Decimal
from typing import Any

from values import Colour, Point, Row, deep

RESULTS: dict[str, Any] = {
    "none": None,
    "empty_dict": {},
    "empty_list": [],
    "zero": 0,
    "empty_str": "",
    "false": False,
    "decimal": {"price": Decimal("19.99"), "exact": Decimal("12345678901234567890.000000001"), "n": 3},
    "bytes": b"\x00\xff\xfe raw bytes \x80\n",
    "unicode": {"text": "caf\u00e9 \u2603 \U0001f600"},
    "non_finite": {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "none": None},
    "huge_int": {"n": 2**70 + 1, "neg": -(2**65)},
    "deep": deep(600),
    "enum_keys": {Colour.RED: Colour.BLUE, "plain": [Colour.RED]},
    "bytes_keys": {b"k": 1},
    "asdict_object": {"row": Row(a=1, b=[Point(1, 2)])},
    "nan_top": float("nan"),
}


def _record(event: Any) -> int:
    """Append this execution; return how many executions of the same marker came before it."""
    marker = event.get("marker") if isinstance(event, dict) else None
    path = os.environ["EXECUTIONS_FILE"]
    try:
        with open(path) as f:
            before = sum(json.loads(line)["marker"] == marker for line in f)
    except FileNotFoundError:
        before = 0
    # One short line per write on an O_APPEND file: lines from concurrent processes never interleave.
    with open(path, "a") as f:
        f.write(json.dumps({"marker": marker, "pid": os.getpid(), "at": time.time()}) + "\n")
    return before


def _wait_for_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def _big(size: int, compressible: bool, seed: int) -> Any:
    rng = random.Random(seed)
    if not compressible:
        return {"blob": rng.randbytes(size // 2).hex()}
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    rows, total = [], 0
    while total < size:
        row = {"i": len(rows), "name": rng.choice(words), "qty": rng.randint(0, 999), "ok": rng.random() < 0.5}
        rows.append(row)
        total += len(json.dumps(row)) + 2
    return {"rows": rows}


def handler(event: Any, context: Any) -> Any:
    before = _record(event)
    action = event.get("action", "random") if isinstance(event, dict) else "random"
    if action == "random":
        return {"id": uuid.uuid4().hex, "at": time.time(), "pid": os.getpid()}
    if action == "result":
        return RESULTS[event["result"]]
    if action == "raise":
        raise ValueError(f"handler failed for {event.get('marker')}")
    if action == "mutate":
        event.clear()
        event["mutated"] = True
        return {"id": uuid.uuid4().hex}
    if action == "block":
        # Held until the test creates the release file, or (block_first) only on the first execution.
        if before == 0 or not event.get("block_first"):
            _wait_for_file(event["release"], event.get("block_timeout", 60))
        return {"id": uuid.uuid4().hex, "execution": before + 1}
    if action == "pickled":
        return pickle.loads(base64.b64decode(event["value"]))  # the tests' own values
    if action == "big":
        return _big(event["size"], event.get("compressible", True), event.get("seed", 0))
    if action == "unmarshallable":
        return {"value": object()}
    if action == "own_call":
        # The function's own boto3 call, on the layer's table: its DEBUG lines are the function's to keep.
        import boto3

        boto3.client("dynamodb").get_item(TableName=os.environ["IDEMPOTENCY_TABLE"],
                                          Key={"id": {"S": f"own-call-{event.get('marker')}"}})
        return {"card": event["card"], "id": uuid.uuid4().hex}
    if action == "info":
        return {
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "executable": sys.executable,
            "handler": os.environ.get("_HANDLER"),
            "original_handler": os.environ.get("IDEMPOTENCY_ORIGINAL_HANDLER"),
            "pythonpath": os.environ.get("PYTHONPATH"),
            "cwd": os.getcwd(),
            "sys_path": sys.path[:3],
            "remaining_ms": context.get_remaining_time_in_millis(),
            "function_name": context.function_name,
            "batch_module_loaded": "idempotency_layer.sources.batch" in sys.modules,
            "id": uuid.uuid4().hex,
        }
    raise ValueError(f"unknown action {action!r}")
