"""What a large result costs (IDEMPOTENCY_LARGE_RESULTS_BUCKET): a first execution and a replay of a result kept in
S3 against a small one, in-process, on DynamoDB Local and moto's S3 server, each behind a counting proxy.

    .venv/bin/python bench/large_bench.py [--iterations N]

Requests (DynamoDB's and S3's), bytes sent and received, and the layer's CPU per invocation (`time.process_time`,
the handler's own work excluded: it returns a prepared value). Interleaved: small and large in turn. It reports;
it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "layer"))

from tests.support.counting_proxy import CountingProxy
from tests.support.dynamodb_local import DynamoDBLocal, create_table
from tests.support.sqs_server import SQSServer

SMALL = {"orderId": "small", "lines": [{"sku": f"SKU-{n}", "qty": n % 5} for n in range(20)]}
LARGE = {"report": base64.b64encode(os.urandom(768 * 1024)).decode()}  # 1 MiB of text that will not compress


class Context:
    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def measure(iterations: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ddb = DynamoDBLocal(Path(tmp) / "ddb.log").start()
        s3 = SQSServer(Path(tmp) / "moto.log").start()
        ddb_proxy = CountingProxy("127.0.0.1", ddb.port)
        s3_proxy = CountingProxy("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1]))
        try:
            import boto3

            creds = {"region_name": "us-east-1", "aws_access_key_id": "a", "aws_secret_access_key": "b"}
            create_table(boto3.client("dynamodb", endpoint_url=ddb.endpoint, **creds), "bench-large")
            boto3.client("s3", endpoint_url=s3.endpoint, **creds).create_bucket(Bucket="bench-large")
            os.environ.update({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_REGION": "us-east-1",
                               "AWS_ENDPOINT_URL_DYNAMODB": ddb_proxy.endpoint,
                               "AWS_ENDPOINT_URL_S3": s3_proxy.endpoint,
                               # the interceptor's own init at import (its handler unused: `build` makes ours)
                               "IDEMPOTENCY_ORIGINAL_HANDLER": "json.dumps", "IDEMPOTENCY_TABLE": "bench-large",
                               "AWS_LAMBDA_FUNCTION_NAME": "bench"})
            from idempotency_layer import config
            from idempotency_layer.interceptor import build

            settings = config.load({"IDEMPOTENCY_ORIGINAL_HANDLER": "bench.handler",
                                    "IDEMPOTENCY_TABLE": "bench-large",
                                    "AWS_LAMBDA_FUNCTION_NAME": "bench", "IDEMPOTENCY_KEY_JMESPATH": "id",
                                    "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "bench-large"})
            handler = build(settings, lambda event, context: LARGE if event["large"] else SMALL)
            rows: dict[str, dict[str, list[float]]] = {}
            for number in range(iterations + 5):
                for size in ("small", "large") if number % 2 else ("large", "small"):
                    for path in ("first", "replay"):
                        event = {"id": f"{size}-{number}", "large": size == "large"}
                        ddb_proxy.reset()
                        s3_proxy.reset()
                        started = time.process_time()
                        handler(event, Context())
                        cpu = time.process_time() - started
                        if number < 5:
                            continue  # warm-up
                        row = rows.setdefault(f"{path} {size}", {})
                        for name, value in (("cpu_ms", cpu * 1000),
                                            ("dynamodb_requests", sum(ddb_proxy.requests.values())),
                                            ("s3_requests", sum(s3_proxy.requests.values())),
                                            ("bytes_sent", ddb_proxy.bytes_sent + s3_proxy.bytes_sent),
                                            ("bytes_received", ddb_proxy.bytes_received + s3_proxy.bytes_received)):
                            row.setdefault(name, []).append(value)
            return {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
        finally:
            ddb_proxy.close()
            s3_proxy.close()
            s3.stop()
            ddb.stop()


def render(found: dict[str, Any]) -> str:
    lines = ["", "A result kept in S3 (1 MiB) against a small one, in-process, medians",
             f"{'path':<14} {'CPU ms':>8} {'DynamoDB':>9} {'S3':>4} {'bytes sent':>11} {'bytes received':>15}"]
    for name, row in found.items():
        lines.append(f"{name:<14} {row['cpu_ms']:>8.3f} {row['dynamodb_requests']:>9.0f} {row['s3_requests']:>4.0f} "
                     f"{row['bytes_sent']:>11,.0f} {row['bytes_received']:>15,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args(argv)
    print(render(measure(args.iterations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
