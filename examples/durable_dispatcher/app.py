"""The dispatcher AWS recommends in front of a queue-fed durable function: an ordinary (non-durable) SQS consumer
that starts one durable execution per order, named after the order. Lambda starts a new durable execution for
every delivery an event source mapping makes, retries included; started by this function instead, a second start
with the same execution name and payload returns the first execution rather than starting another.

Attach the layer to this function (not to the durable one) with IDEMPOTENCY_KEY_JMESPATH=json_parse(body).orderId
and IDEMPOTENCY_REQUIRE_KEY=true: each order is then dispatched once, a message without an order id is reported
failed rather than dispatched on every delivery, and the execution name guards the start once more."""

import hashlib
import json
import os
from typing import Any

import boto3

WORKFLOW = os.environ.get("WORKFLOW_FUNCTION", "orders-workflow:live")  # the durable function, qualified
_lambda = boto3.client("lambda")


def execution_name(order_id: str) -> str:
    # Lambda allows 1 to 64 of [A-Za-z0-9_-]: the hex SHA-256 of the order's id is 64 of them.
    return hashlib.sha256(order_id.encode()).hexdigest()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures = []
    for record in event["Records"]:
        try:
            order_id = json.loads(record["body"])["orderId"]
            if not isinstance(order_id, str) or not order_id:  # no name to start it once by: never dispatched
                raise ValueError("the message has no order id")
            _lambda.invoke(FunctionName=WORKFLOW, InvocationType="Event",
                           DurableExecutionName=execution_name(order_id), Payload=record["body"].encode())
        except Exception:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
