"""A durable function written with AWS's durable execution SDK, unmodified by the layer: it charges the order in
the execution's input (an SQS message's body) in a step, waits, and answers the receipt. Each charge appends the
order to the file ORDERS_LEDGER names: the count of side effects, read by the tests."""

import json
import os

from aws_durable_execution_sdk_python import DurableContext, StepContext, durable_execution, durable_step
from aws_durable_execution_sdk_python.config import Duration


@durable_step
def charge(step_context: StepContext, order: str) -> str:
    with open(os.environ["ORDERS_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(order + "\n")
    return f"charged {order}"


@durable_execution
def handler(event: dict, context: DurableContext) -> dict:
    order = json.loads(event["Records"][0]["body"])["orderId"]
    receipt = context.step(charge(order))
    context.wait(Duration.from_seconds(int(os.environ.get("ORDERS_WAIT_SECONDS", "1"))))
    if order.startswith("declined"):
        raise ValueError("card declined")  # after the charge: the execution fails, its claim is released
    return {"receipt": receipt}
