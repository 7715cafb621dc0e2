"""The user's Amazon MQ consumer under test (ActiveMQ or RabbitMQ): it processes every message of the batch.
Amazon MQ event source mappings have no partial batch response, so a consumer can only fail the whole call.
It knows nothing of the layer.

Every message it processes appends one line to $EXECUTIONS_FILE first, so tests count real executions. A
message's JSON data steers it: `marker` names its work, `raise` fails the whole call, `release` holds the call,
once the message's line is written, until that file exists.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from consumer import _record


def _messages(event: dict[str, Any]) -> list[dict[str, Any]]:
    if event["eventSource"] == "aws:mq":
        return event["messages"]
    return [message for messages in event["rmqMessagesByQueue"].values() for message in messages]


def handler(event: dict[str, Any], context: Any) -> Any:
    raise_after = False
    for message in _messages(event):
        payload = json.loads(base64.b64decode(message["data"]))
        _record(payload["marker"])  # first, so a test sees the message started (and claimed)
        release = payload.get("release")
        if release:
            deadline = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
        raise_after = raise_after or bool(payload.get("raise"))
    if raise_after:
        raise RuntimeError("the consumer failed")
    return None
