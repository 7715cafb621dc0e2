"""Lambda durable executions: the envelope their invocations carry, the execution's input in it, and the answers
a durable function gives (as AWS's durable execution SDK writes them: `Status` always, `Result` only when it is
SUCCEEDED, `Error` with `ErrorMessage` and `ErrorType` only when it is FAILED).

Under IDEMPOTENCY_DURABLE=pass (the default) the layer never claims these invocations; under `execution` an
execution is one unit of work, keyed by its input (the EXECUTION operation's `InputPayload`, read as the SDK reads
it) and owned by its ARN.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

# A durable execution's ARN, as Lambda's API documents its pattern: the function's, then the execution's (its name
# 1 to 64 characters).
_DURABLE_ARN = (r"arn:[a-zA-Z0-9-]+:lambda:(?P<region>[a-zA-Z0-9-]+):\d{12}:function:(?P<function>[a-zA-Z0-9_-]+):"
                r"(?:\$LATEST(?:\.PUBLISHED)?|[0-9]+)/durable-execution/[a-zA-Z0-9_-]{1,64}/[a-zA-Z0-9_-]+")


def durable_target(event: Any) -> tuple[str, str] | None:
    """The (function, Region) whose durable execution `event` is the envelope of, or None: the execution's ARN,
    a checkpoint token and the execution's state so far (an object), and nothing of a batch or an HTTP request."""
    if not isinstance(event, dict) or not isinstance(event.get("InitialExecutionState"), dict):
        return None
    arn, token = event.get("DurableExecutionArn"), event.get("CheckpointToken")
    if not isinstance(arn, str) or not isinstance(token, str) or not token or "Records" in event \
            or "requestContext" in event:
        return None
    import re  # (already loaded by the runtime; imported here so the check costs nothing at import)

    match = re.fullmatch(_DURABLE_ARN, arn)
    return None if match is None else (match["function"], match["region"])


def is_durable(event: Any, function_name: str | None, region: str | None) -> bool:
    """Whether `event` is the envelope Lambda durable executions invoke this function (`function_name`, in `region`
    when known) with. Such a function is invoked many times per execution by design, each time with a new token:
    the layer never claims these invocations. Without a function name nothing is taken for one."""
    target = durable_target(event)
    return (target is not None and function_name is not None and target[0] == function_name
            and (region is None or target[1] == region))


SUCCEEDED, FAILED, PENDING = "SUCCEEDED", "FAILED", "PENDING"


def execution_input(event: dict[str, Any]) -> tuple[str, Any]:
    """(the execution's ARN, its input) from an envelope `durable_target` recognised. The input is the
    `InputPayload` of the EXECUTION operation, whose id is the ARN's last segment (as the SDK finds it), parsed as
    the SDK parses it: JSON, a missing or blank payload being {}. Raises IdempotencyKeyError when it cannot be read
    from this invocation: the service may leave the operation out of the first page of operations, which the SDK
    then fetches with the Lambda API; the layer does not, and the handler does not run."""
    from ..errors import IdempotencyKeyError

    arn = event["DurableExecutionArn"]
    wanted = arn.rsplit("/", 1)[-1]
    state = event["InitialExecutionState"]
    operations = state.get("Operations")
    found = None
    for operation in operations if isinstance(operations, list) else ():
        if isinstance(operation, dict) and operation.get("Id") == wanted:
            found = operation  # (the SDK keeps operations by id: the last one given wins)
    if found is None or found.get("Type") != "EXECUTION":
        more = " (the service sent it on a later page, which the layer does not read)" \
            if found is None and state.get("NextMarker") else ""
        raise IdempotencyKeyError(
            f"the durable execution's EXECUTION operation is not in this invocation's state{more}, so its input and "
            "key cannot be read; the handler did not run")
    details = found.get("ExecutionDetails")
    payload = details.get("InputPayload") if isinstance(details, dict) else None
    if payload is None or (isinstance(payload, str) and not payload.strip()):
        return arn, {}
    if not isinstance(payload, str):
        raise IdempotencyKeyError("the durable execution's InputPayload is not text; the handler did not run")
    import json

    try:
        return arn, json.loads(payload)
    except (ValueError, RecursionError):
        raise IdempotencyKeyError("the durable execution's input is not JSON, so its key cannot be derived; the "
                                  "handler did not run") from None


def status(answer: Any) -> str | None:
    """The status a durable function's answer gives its execution, or None for an answer that is not one."""
    if isinstance(answer, dict):
        given = answer.get("Status")
        if given in (SUCCEEDED, FAILED, PENDING):
            return given
    return None


def succeeded(result: Any) -> dict[str, Any]:
    """The answer that ends an execution with `result` (the JSON text another execution ended with)."""
    return {"Status": SUCCEEDED, "Result": result}


def failed(error: BaseException) -> dict[str, Any]:
    """The answer that fails an execution with the layer's `error`, its type named as the SDK names one (the
    module, then the class)."""
    kind = type(error)
    named = f"{kind.__module__}.{kind.__qualname__}"
    return {"Status": FAILED, "Error": {"ErrorMessage": str(error), "ErrorType": named}}
