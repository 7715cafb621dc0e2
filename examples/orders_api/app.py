"""An ordinary HTTP API handler (payload 2.0) with no idempotency code: POST /orders places an order. The layer
makes a request carrying an Idempotency-Key header run once, from outside."""

import json
import os
import time
import uuid
from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    order = json.loads(event.get("body") or "{}")
    if not order.get("items"):
        return {"statusCode": 400, "headers": {"Content-Type": "application/json"},
                "body": json.dumps({"error": "an order needs items"})}
    time.sleep(float(os.environ.get("PLACE_ORDER_SECONDS", "0")))  # the payment provider's latency
    placed = {"orderId": uuid.uuid4().hex, "items": order["items"], "status": "placed"}
    # The side effect that must happen once per request: one line per placed order.
    with open(os.environ.get("ORDERS_FILE", "/tmp/api-orders.log"), "a", encoding="utf-8") as f:
        f.write(json.dumps(placed) + "\n")
    return {"statusCode": 201, "headers": {"Content-Type": "application/json"}, "body": json.dumps(placed)}
