"""The user's stream consumer under test, written as AWS documents a Kinesis / DynamoDB Streams handler with
ReportBatchItemFailures: it processes records in order and, at the first one that fails, returns that record's
sequence number and stops (Lambda retries the shard from there). It knows nothing of the layer.

Every record it starts appends one line to $EXECUTIONS_FILE, so tests count real executions per record. A
record's payload steers it: `marker` names its work, `fail_first` fails it on its first execution.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any


def _payload(record: dict[str, Any]) -> dict[str, Any]:
    if record["eventSource"] == "aws:kinesis":
        return json.loads(base64.b64decode(record["kinesis"]["data"]))
    image = record["dynamodb"]["NewImage"]
    return {"marker": image["Id"]["S"], "fail_first": "FailFirst" in image}


def _sequence_number(record: dict[str, Any]) -> str:
    if record["eventSource"] == "aws:kinesis":
        return record["kinesis"]["sequenceNumber"]
    return record["dynamodb"]["SequenceNumber"]


def _process(payload: dict[str, Any]) -> None:
    marker = payload["marker"]
    path = os.environ["EXECUTIONS_FILE"]
    try:
        with open(path) as f:
            before = sum(json.loads(line)["marker"] == marker for line in f)
    except FileNotFoundError:
        before = 0
    with open(path, "a") as f:  # one short line per O_APPEND write
        f.write(json.dumps({"marker": marker, "pid": os.getpid()}) + "\n")
    if payload.get("fail_first") and before == 0:
        raise ValueError("could not process the record")


def handler(event: dict[str, Any], context: Any) -> Any:
    for record in event["Records"]:
        try:
            _process(_payload(record))
        except Exception:
            return {"batchItemFailures": [{"itemIdentifier": _sequence_number(record)}]}
    return {"batchItemFailures": []}
