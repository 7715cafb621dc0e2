"""The user's batch consumer under test: plain SQS / Kinesis / DynamoDB Streams code that knows nothing of the
layer. It processes every record of `event["Records"]` and reports the ones it could not process in a partial
batch response, as any consumer with ReportBatchItemFailures does.

Every record it processes appends one line to $EXECUTIONS_FILE first, so tests count real executions per
record from this side effect. A record's payload steers it: `marker` names the record's work, `fail` reports
it as failed (`fail_first`: only on its first execution), `raise` fails the whole call, `release` holds the
call until that file exists.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any


def _payload(record: dict[str, Any]) -> dict[str, Any]:
    source = record["eventSource"]
    if source == "aws:sqs":
        return json.loads(record["body"])
    if source == "aws:kinesis":
        return json.loads(base64.b64decode(record["kinesis"]["data"]))
    image = record["dynamodb"]["NewImage"]
    return {"marker": image["Id"]["S"], "fail_first": "FailFirst" in image}


def _identifier(record: dict[str, Any]) -> str:
    source = record["eventSource"]
    if source == "aws:sqs":
        return record["messageId"]
    if source == "aws:kinesis":
        return record["kinesis"]["sequenceNumber"]
    return record["dynamodb"]["SequenceNumber"]


def _record(marker: str) -> int:
    """Append one execution of `marker`; return how many came before it."""
    path = os.environ["EXECUTIONS_FILE"]
    try:
        with open(path) as f:
            before = sum(json.loads(line)["marker"] == marker for line in f)
    except FileNotFoundError:
        before = 0
    with open(path, "a") as f:  # one short line per O_APPEND write: lines from several processes never mix
        f.write(json.dumps({"marker": marker, "pid": os.getpid(), "at": time.time()}) + "\n")
    return before


def handler(event: dict[str, Any], context: Any) -> Any:
    failures = []
    raise_after = False
    for record in event["Records"]:
        payload = _payload(record)
        release = payload.get("release")
        if release:
            deadline = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
        before = _record(payload["marker"])
        if payload.get("fail") or (payload.get("fail_first") and before == 0):
            failures.append({"itemIdentifier": _identifier(record)})
        raise_after = raise_after or bool(payload.get("raise"))
    if raise_after:
        raise RuntimeError("the consumer failed")
    return {"batchItemFailures": failures} if failures else None
