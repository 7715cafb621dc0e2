"""The fault-injection soak's function: plain Lambda code that knows nothing of the layer.

Every execution first appends one line to $CHAOS_RUNS_FILE naming the event's key, a fresh run id and the
delivery attempt that brought it and its clock, so the soak counts executions from this side effect alone, and can tell
the runs of an environment it killed from the others. Then it works for `work_ms` (the window in which a
kill lands after the side effect) and returns the key and the run id: a replay must return the same run.
An event marked `overrun` works past the function's timeout on its key's first execution (a marker file
beside the runs file tells the first from the others), so the emulator stops it there. An SQS or Kafka batch gets
one line per record, each record's body naming its key.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from typing import Any


def _ran(key: str, attempt: Any) -> str:
    run = uuid.uuid4().hex
    # The clock as this environment sees it: the soak checks a skewed environment's really is.
    line = json.dumps({"key": key, "run": run, "attempt": attempt, "clock": time.time()}) + "\n"
    # One short write on an O_APPEND file: lines from concurrent environments never interleave.
    with open(os.environ["CHAOS_RUNS_FILE"], "a") as runs:
        runs.write(line)
    return run


def batch(event: dict[str, Any], context: Any) -> None:
    """An SQS or Kafka batch: one line per record, in order, then its work, within the time the invocation has
    (less 0.8 s for the layer's writes): the handler itself never runs into the timeout."""
    if "Records" in event:
        bodies = [json.loads(record["body"]) for record in event["Records"]]
    else:
        bodies = [json.loads(base64.b64decode(record["value"])) for records in event["records"].values()
                  for record in records]
    for body in bodies:
        _ran(body["key"], event.get("attempt"))
        time.sleep(max(0.0, min(body.get("work_ms", 0) / 1000, context.get_remaining_time_in_millis() / 1000 - 0.8)))
    return None


def handler(event: dict[str, Any], context: Any) -> dict[str, str] | None:
    if "Records" in event or "records" in event:
        return batch(event, context)
    run = _ran(event["key"], event.get("attempt"))
    work = event.get("work_ms", 0) / 1000
    if event.get("overrun"):
        marker = os.path.join(os.path.dirname(os.environ["CHAOS_RUNS_FILE"]), f"overrun-{event['key']}")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            # The first: past the timeout (not by the remaining time, which a skewed clock shortens).
            work = float(os.environ["AWS_LAMBDA_FUNCTION_TIMEOUT"]) + 1
        except FileExistsError:
            pass
    time.sleep(work)
    if event.get("large"):  # over a record: base64 of random bytes does not compress enough
        return {"key": event["key"], "run": run, "pad": base64.b64encode(os.urandom(event["large"] * 3 // 4)).decode()}
    return {"key": event["key"], "run": run}
