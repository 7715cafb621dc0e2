"""An ordinary Kafka consumer (Amazon MSK or self-managed Apache Kafka) with no idempotency code: it charges
each order of the batch, partition by partition in offset order, and at a partition's first order it cannot
charge it reports that partition and offset in Kafka's partial batch response and leaves the rest of the
partition for the retry, as AWS documents for ReportBatchItemFailures. The layer makes each order charge once,
from outside, even when the producer sent it twice."""

import base64
import json
import os
import uuid
from typing import Any


class PaymentsUnavailable(Exception):
    pass


def charge(order: dict[str, Any]) -> None:
    # A stand-in for a payment provider: currencies listed in OUTAGES_FILE cannot be charged for now.
    try:
        with open(os.environ.get("OUTAGES_FILE", "/tmp/outages.txt"), encoding="utf-8") as f:
            down = set(f.read().split())
    except FileNotFoundError:
        down = set()
    if order["currency"] in down:
        raise PaymentsUnavailable(order["currency"])
    # The side effect that must happen once per order: one line per charge.
    line = json.dumps({"orderId": order["orderId"], "amount": order["amount"], "charge": uuid.uuid4().hex})
    with open(os.environ.get("CHARGES_FILE", "/tmp/charges.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures = []
    for partition, records in event["records"].items():  # "<topic>-<partition>": records in offset order
        for record in records:
            try:
                charge(json.loads(base64.b64decode(record["value"])))
            except PaymentsUnavailable:
                failures.append({"itemIdentifier": {"partition": partition, "offset": record["offset"]}})
                break  # Kafka keeps order within a partition: the rest of it comes back after this one
    return {"batchItemFailures": failures}
