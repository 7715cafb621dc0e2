"""What record authentication costs (IDEMPOTENCY_RECORD_MAC_KEY, docs/record-authentication.md): the layer's CPU
per invocation with the MAC on over off, on first runs and replays of whole events, in one process against a fresh
DynamoDB Local (the lean transport), the two functions interleaved in batches of 10, which of them goes first
alternating. Each invocation's CPU is the calling thread's (`time.thread_time_ns`): the handler's own work is a
dict of about 1 KB. Prints the medians, their ratio and the time added.

    .venv/bin/python bench/record_mac.py [--iterations 1000] [--warmup 50]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[1:1] = [str(ROOT / "layer"), str(ROOT)]  # this checkout's layer, and tests.support

from common import CREDENTIALS  # noqa: E402

from tests.support.dynamodb_local import DynamoDBLocal, create_table  # noqa: E402

BATCH = 10
RESULT = {"receipt": "r" * 900, "lines": list(range(20))}  # about 1 KB, as a small API's answer


class _Context:
    aws_request_id = "bench"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 30_000


def _functions(table: str) -> dict[str, Any]:
    """The two functions, built as at an init: MAC off and on (a 32-byte key from the environment)."""
    os.environ.update({"IDEMPOTENCY_ORIGINAL_HANDLER": "json.dumps", "IDEMPOTENCY_DISABLED": "true",
                       "BENCH_MAC_KEY": os.urandom(32).hex()})
    sys.modules.pop("idempotency_layer.interceptor", None)
    interceptor = importlib.import_module("idempotency_layer.interceptor")
    from idempotency_layer import config

    base = {"IDEMPOTENCY_ORIGINAL_HANDLER": "json.dumps", "IDEMPOTENCY_TABLE": table,
            "AWS_LAMBDA_FUNCTION_NAME": "bench", "IDEMPOTENCY_KEY_JMESPATH": "orderId"}
    return {name: interceptor.build(config.load({**base, **extra}), lambda event, context: RESULT)
            for name, extra in (("off", {}), ("on", {"IDEMPOTENCY_RECORD_MAC_KEY": "env:BENCH_MAC_KEY"}))}


def _timed(handler: Any, event: Any) -> int:
    started = time.thread_time_ns()
    value = handler(event, _Context())
    spent = time.thread_time_ns() - started
    if value != RESULT:
        raise RuntimeError("a wrong result")
    return spent


def measure(functions: dict[str, Any], iterations: int, warmup: int) -> dict[str, dict[str, list[int]]]:
    """CPU ns per invocation: {path: {function: samples}}, the warm-up's left out."""
    samples: dict[str, dict[str, list[int]]] = {"first": {n: [] for n in functions},
                                                "replay": {n: [] for n in functions}}
    names = list(functions)
    for round_ in range(-(-(warmup + iterations) // BATCH)):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            events = [{"orderId": f"{name}-{uuid.uuid4().hex}"} for _ in range(BATCH)]
            firsts = [_timed(functions[name], event) for event in events]
            replays = [_timed(functions[name], event) for event in events]
            if round_ * BATCH >= warmup:
                samples["first"][name] += firsts
                samples["replay"][name] += replays
    return samples


def report(samples: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    rows = {}
    for path, by in samples.items():
        off, on = (statistics.median(by[name]) / 1e6 for name in ("off", "on"))
        rows[path] = {"cpu_p50_ms_off": round(off, 4), "cpu_p50_ms_on": round(on, 4), "ratio": round(on / off, 3),
                      "added_us": round((on - off) * 1000, 1), "n": len(by["on"])}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args(argv)
    os.environ.update(CREDENTIALS)
    with tempfile.TemporaryDirectory(prefix="idempotency-mac-bench-") as tmp:
        ddb = DynamoDBLocal(Path(tmp) / "dynamodb.log").start()
        try:
            import boto3

            client = boto3.client("dynamodb", endpoint_url=ddb.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                                  aws_access_key_id="bench", aws_secret_access_key="bench")
            create_table(client, "bench-mac")
            os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = ddb.endpoint
            rows = report(measure(_functions("bench-mac"), args.iterations, args.warmup))
        finally:
            ddb.stop()
    print("| path | CPU ms, MAC off | CPU ms, MAC on | ratio | added |")
    print("| --- | --- | --- | --- | --- |")
    for path, row in rows.items():
        print(f"| {path} | {row['cpu_p50_ms_off']:.3f} | {row['cpu_p50_ms_on']:.3f} | {row['ratio']:.3f} | "
              f"{row['added_us']:.0f} µs |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
