"""The client's error model: one exception, `DynamoDBError`, for every way a call can fail.

A call either returns DynamoDB's answer or raises `DynamoDBError` once its retries are spent. `code` says what
happened: the AWS error code of an answer (`ConditionalCheckFailedException`, `ThrottlingException`, ...), or,
when no answer came, the botocore exception name a boto3 client would raise (`EndpointConnectionError`,
`ConnectTimeoutError`, `ReadTimeoutError`, `ConnectionClosedError`, `SSLError`, `ProxyConnectionError`), or
`ChecksumError` / `ResponseParserError` for an answer that was damaged or is not DynamoDB's JSON, or
`InvocationDeadline` for a call that ran out of the time it was given. `uncertain` is the one flag the cycle
acts on: True when the request may have been applied though the call failed.
"""

from __future__ import annotations

__all__ = ["CHECK_FAILED", "DEADLINE", "NOT_SENT", "DynamoDBError", "out_of_time"]

CHECK_FAILED = "ConditionalCheckFailedException"  # a condition refused: the one answer the store reads, not a failure
DEADLINE = "InvocationDeadline"  # the code of a call that ran out of the time it was given
# Failures that say the request never left (or never connected): it cannot have been applied.
NOT_SENT = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError", DEADLINE})


class DynamoDBError(Exception):
    """A DynamoDB request failed, after the client's retries.

    `item` is the `Item` that came with a `ConditionalCheckFailedException` asked for
    `ReturnValuesOnConditionCheckFailure=ALL_OLD`. `status` is the HTTP status, None when no answer came.
    `uncertain`: an attempt was sent and got no definite answer (a read timeout, a connection lost, a 5xx, a
    damaged reply), so the request may have been applied. Messages never quote an answer's body.
    """

    def __init__(
        self, operation: str, code: str, message: str, item: dict | None = None, status: int | None = None,
        uncertain: bool = False,
    ) -> None:
        super().__init__(operation, code, message)
        self.operation = operation
        self.code = code
        self.message = message
        self.item = item
        self.status = status
        self.uncertain = uncertain

    def __str__(self) -> str:
        return f"DynamoDB {self.operation} failed: {self.code}: {self.message}"


def out_of_time(operation: str, uncertain: bool = False) -> DynamoDBError:
    """The error of a call that may start no attempt: its deadline has passed."""
    return DynamoDBError(operation, DEADLINE, "the invocation has no time left for this request", uncertain=uncertain)
