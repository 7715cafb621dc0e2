"""An ordinary order handler with no idempotency code: the layer adds exactly-once from outside."""

import datetime
import json
import os
import uuid
from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    order_id = event["orderId"]
    confirmation = uuid.uuid4().hex
    placed_at = datetime.datetime.now(datetime.timezone.utc).isoformat()
    # The side effect that must happen once per order: one line per placement.
    line = json.dumps({"orderId": order_id, "items": event.get("items", []), "confirmation": confirmation})
    with open(os.environ.get("ORDERS_FILE", "/tmp/orders.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")
    return {"orderId": order_id, "confirmation": confirmation, "placedAt": placed_at}
