"""The fault-injection soak's function: plain Lambda code that knows nothing of the layer.

Every execution first appends one line to $CHAOS_RUNS_FILE naming the event's key, a fresh run id and the
delivery attempt that brought it and its clock, so the soak counts executions from this side effect alone, and can tell
the runs of an environment it killed from the others. Then it works for `work_ms` (the window in which a
kill lands after the side effect) and returns the key and the run id: a replay must return the same run.
An event marked `overrun` works past the function's timeout on its key's first execution (a marker file
beside the runs file tells the first from the others), so the emulator stops it there.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, str]:
    run = uuid.uuid4().hex
    # The clock as this environment sees it: the soak checks a skewed environment's really is.
    line = json.dumps({"key": event["key"], "run": run, "attempt": event.get("attempt"), "clock": time.time()}) + "\n"
    # One short write on an O_APPEND file: lines from concurrent environments never interleave.
    with open(os.environ["CHAOS_RUNS_FILE"], "a") as runs:
        runs.write(line)
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
    return {"key": event["key"], "run": run}
