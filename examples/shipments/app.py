"""An ordinary SQS consumer with no idempotency code: it ships each order of the batch and reports the ones it
could not ship in a partial batch response. The layer makes each message ship once, from outside."""

import json
import os
import uuid
from typing import Any


class WarehouseUnavailable(Exception):
    pass


def ship(order: dict[str, Any]) -> None:
    # A stand-in for a downstream service: warehouses listed in OUTAGES_FILE are down for now.
    outages = os.environ.get("OUTAGES_FILE", "/tmp/outages.txt")
    try:
        with open(outages, encoding="utf-8") as f:
            down = set(f.read().split())
    except FileNotFoundError:
        down = set()
    if order["warehouse"] in down:
        raise WarehouseUnavailable(order["warehouse"])
    # The side effect that must happen once per message: one line per shipment.
    line = json.dumps({"orderId": order["orderId"], "warehouse": order["warehouse"], "parcel": uuid.uuid4().hex})
    with open(os.environ.get("SHIPMENTS_FILE", "/tmp/shipments.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures = []
    for record in event["Records"]:
        try:
            ship(json.loads(record["body"]))
        except WarehouseUnavailable:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
