"""A durable function written with AWS's durable execution SDK, unmodified by the layer: it charges the order in
the execution's input (an SQS message's body) in a step, waits, and answers the receipt. Each charge appends a
line to the file ORDERS_LEDGER names, the order and the execution that charged it: the count of side effects, read
by the tests and the durable soak."""

import json
import os
import time

from aws_durable_execution_sdk_python import DurableContext, StepContext, durable_execution, durable_step
from aws_durable_execution_sdk_python.config import Duration


@durable_step
def charge(step_context: StepContext, order: str, execution: str) -> str:
    with open(os.environ["ORDERS_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"{order} {execution}\n")  # one write: one whole line, whatever runs beside it
    time.sleep(int(os.environ.get("ORDERS_STEP_WORK_MS", "0")) / 1000)  # work after the charge, before its checkpoint
    return f"charged {order}"


@durable_execution
def handler(event: dict, context: DurableContext) -> dict:
    order = json.loads(event["Records"][0]["body"])["orderId"]
    receipt = context.step(charge(order, context.execution_context.durable_execution_arn))
    context.wait(Duration.from_seconds(int(os.environ.get("ORDERS_WAIT_SECONDS", "1"))))
    if order.startswith("declined"):
        raise ValueError("card declined")  # after the charge: the execution fails, its claim is released
    return {"receipt": receipt}
