"""The user's stream consumer under test, written as AWS documents a Kinesis / DynamoDB Streams handler with
ReportBatchItemFailures: it processes records in order and, at the first one that fails, returns that record's
sequence number and stops (Lambda retries the shard from there). It knows nothing of the layer.

Every record it starts appends one line to $EXECUTIONS_FILE, so tests count real executions per record. A
record's payload steers it: `marker` names its work, `fail_first` fails it on its first execution.
"""

from __future__ import annotations

from typing import Any

# The same record shapes and execution log as the per-record consumer.
from consumer import _identifier as _sequence_number
from consumer import _payload, _record


def _process(record: dict[str, Any]) -> None:
    payload = _payload(record)
    if _record(payload["marker"]) == 0 and payload.get("fail_first"):
        raise ValueError("could not process the record")


def handler(event: dict[str, Any], context: Any) -> Any:
    for record in event["Records"]:
        try:
            _process(record)
        except Exception:
            return {"batchItemFailures": [{"itemIdentifier": _sequence_number(record)}]}
    return {"batchItemFailures": []}
