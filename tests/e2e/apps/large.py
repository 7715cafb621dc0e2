"""The user's function under test for large results: plain Lambda code that knows nothing of the layer. Every
execution appends one line (the event's `marker`) to $EXECUTIONS_FILE first, then returns `size` bytes of
incompressible content: as JSON text (a whole event), or as an HTTP response whose body is those bytes, base64."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any


def handler(event: dict[str, Any], context: Any) -> Any:
    http = "requestContext" in event
    body = json.loads(base64.b64decode(event["body"]) if event.get("isBase64Encoded") else event["body"]) if http \
        else event
    with open(os.environ["EXECUTIONS_FILE"], "a") as f:
        f.write(json.dumps({"marker": body["marker"], "pid": os.getpid(), "at": time.time()}) + "\n")
    if not http and body.get("raw"):
        return os.urandom(body["size"])  # bytes: the runtime sends them as they are
    if not http:
        # base64 of random bytes: text that does not compress below 3/4 of its size
        return {"marker": body["marker"], "blob": base64.b64encode(os.urandom(body["size"] * 3 // 4)).decode()}
    return {"statusCode": 200, "headers": {"Content-Type": "application/octet-stream"}, "isBase64Encoded": True,
            "body": base64.b64encode(os.urandom(body["size"] * 3 // 4)).decode()}
