"""IAM's `ForAllValues:StringLike` on `dynamodb:LeadingKeys`, emulated in front of a transport (the security review's
harness: security-2026-12.md, Appendix A).

IAM cannot run offline. What it would do to the layer's requests is simple enough to emulate: every partition key
value a request names (each key of a BatchGetItem; the item's key of a PutItem; the `Key` of the others) must match
one of the policy's patterns (`*` any run of characters, `?` one, everything else literal, as StringLike matches),
or the whole request is refused with `AccessDeniedException` before it reaches the table (`ForAllValues`: all of
a BatchGetItem's keys must match). Every key value is recorded with its verdict, so a test can say which keys
were denied.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from idempotency_layer.stores.dynamodb import DynamoDBError


class Seen(NamedTuple):
    operation: str
    key: str  # the partition key value
    allowed: bool


def string_like(pattern: str) -> re.Pattern[str]:
    """IAM's StringLike: `*` and `?` are the only wildcards, everything else is literal (case-sensitive)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


class LeadingKeys:
    """`inner` (a Transport) behind a policy allowing item actions only on partition keys matching `patterns`.

    `key_attr` is the table's partition key attribute. `patterns` may be changed between requests (a policy
    edited)."""

    def __init__(self, inner: Any, patterns: list[str], key_attr: str = "id") -> None:
        self.inner = inner
        self.patterns = list(patterns)
        self.key_attr = key_attr
        self.seen: list[Seen] = []

    @property
    def region(self) -> str:
        return getattr(self.inner, "region", "us-east-1")

    @property
    def endpoint(self) -> str:
        return getattr(self.inner, "endpoint", "memory")

    @property
    def denied(self) -> list[Seen]:
        return [seen for seen in self.seen if not seen.allowed]

    def keys(self) -> set[str]:
        """Every partition key value sent (allowed or not)."""
        return {seen.key for seen in self.seen}

    def allows(self, value: str) -> bool:
        return any(string_like(pattern).fullmatch(value) for pattern in self.patterns)

    def leading_keys(self, operation: str, params: dict[str, Any]) -> list[str]:
        if operation == "BatchGetItem":
            (request,) = params["RequestItems"].values()
            return [key[self.key_attr]["S"] for key in request["Keys"]]
        key = params["Item"] if operation == "PutItem" else params["Key"]
        return [key[self.key_attr]["S"]]

    def call(self, operation: str, params: dict[str, Any], deadline: Any = None) -> dict[str, Any]:
        values = self.leading_keys(operation, params)
        verdicts = [self.allows(value) for value in values]
        self.seen += [Seen(operation, value, ok) for value, ok in zip(values, verdicts, strict=True)]
        if not all(verdicts):
            raise DynamoDBError(operation, "AccessDeniedException",
                                "User is not authorized to perform this action on the resource (LeadingKeys)",
                                status=400)
        return self.inner.call(operation, params, deadline)
