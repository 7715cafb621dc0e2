"""The user's HTTP handler under test: plain API Gateway / Function URL / ALB code that knows nothing of the
layer. Every execution appends one line to $EXECUTIONS_FILE (the `marker` of its JSON body) first."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from typing import Any


def handler(event: dict[str, Any], context: Any) -> Any:
    raw = event.get("body") or "{}"
    body = json.loads(base64.b64decode(raw) if event.get("isBase64Encoded") else raw)
    with open(os.environ["EXECUTIONS_FILE"], "a") as f:
        f.write(json.dumps({"marker": body.get("marker"), "pid": os.getpid(), "at": time.time()}) + "\n")
    release = body.get("release")
    if release:
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)
    order = {"orderId": uuid.uuid4().hex, "marker": body.get("marker")}
    if body.get("big"):
        order["blob"] = os.urandom(body["big"]).hex()  # incompressible: too large to store
    if body.get("plain"):
        return order  # payload 2.0 lets a handler return a bare value: API Gateway makes it a 200
    status = body.get("status", 201)
    response = {"statusCode": status, "headers": {"Content-Type": "application/json"}, "body": json.dumps(order)}
    if "multiValueHeaders" in event:  # ALB with multi-value headers on answers in that form only
        response["multiValueHeaders"] = {"Content-Type": ["application/json"]}
        del response["headers"]
    if event.get("requestContext", {}).get("elb"):
        response["statusDescription"] = f"{status} Created"
    return response
