"""The user's Kafka consumer under test (Amazon MSK or self-managed), written as AWS documents a handler with
ReportBatchItemFailures: partition by partition, records in order; at a partition's first failure it reports
that record's partition and offset and goes on with the next partition (Lambda resumes the partition from
there). It knows nothing of the layer.

Every record it starts appends one line to $EXECUTIONS_FILE, so tests count real executions per record. A
record's JSON value steers it: `marker` names its work, `fail_first` fails it on its first execution, `fail`
always, `release` holds the call, once the record's line is written, until that file exists.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from consumer import _record


def _process(record: dict[str, Any]) -> None:
    payload = json.loads(base64.b64decode(record["value"]))
    before = _record(payload["marker"])  # first, so a test sees the record started (and claimed)
    release = payload.get("release")
    if release:
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)
    if payload.get("fail") or (payload.get("fail_first") and before == 0):
        raise ValueError("could not process the record")


def handler(event: dict[str, Any], context: Any) -> Any:
    failures = []
    for partition, records in event["records"].items():
        for record in records:
            try:
                _process(record)
            except Exception:
                failures.append({"itemIdentifier": {"partition": partition, "offset": record["offset"]}})
                break
    return {"batchItemFailures": failures}
