"""A tracing wrapper's handler as OpenTelemetry's Lambda instrumentation has one: chained by a next wrapper that
points _HANDLER here and names the handler it wraps in $TRACED_HANDLER. Like OTel it reads the status code of a
dict result (`result.get("statusCode")`); it records what it saw to $TRACER_FILE and decorates a dict result."""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

_module, _, _name = os.environ["TRACED_HANDLER"].rpartition(".")
_wrapped = getattr(importlib.import_module(_module), _name)


def handler(event: Any, context: Any) -> Any:
    result = _wrapped(event, context)
    status = result.get("statusCode") if isinstance(result, dict) else None
    with open(os.environ["TRACER_FILE"], "a") as f:
        f.write(json.dumps({"marker": event.get("marker"), "type": type(result).__name__, "status": status}) + "\n")
    if isinstance(result, dict):
        result["traced"] = status  # a wrapper that decorates the result
    return result
