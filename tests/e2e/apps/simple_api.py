"""An HTTP API handler (payload 2.0) that returns a simple response: the value its JSON body carries pickled
(the tests' own values: Decimals as a DynamoDB item holds them, text, nesting), with no statusCode. Every
execution appends one line to $EXECUTIONS_FILE first."""

from __future__ import annotations

import base64
import json
import os
import pickle
import time
from typing import Any


def handler(event: dict[str, Any], context: Any) -> Any:
    body = json.loads(event["body"])
    with open(os.environ["EXECUTIONS_FILE"], "a") as f:
        f.write(json.dumps({"marker": body["marker"], "pid": os.getpid(), "at": time.time()}) + "\n")
    return pickle.loads(base64.b64decode(body["value"]))
