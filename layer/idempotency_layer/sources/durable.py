"""Lambda durable executions: the envelope their invocations carry, which the layer never claims."""

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
