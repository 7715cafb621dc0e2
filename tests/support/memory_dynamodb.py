"""DynamoDB's semantics for the item operations the layer sends, in memory: for the model check (tools/model.py),
the differential check (tools/differential.py) and the fast unit tests of the cycle and the executor.

`MemoryDynamoDB.apply(operation, params)` answers `PutItem`, `UpdateItem`, `DeleteItem`, `GetItem` and
`BatchGetItem` as DynamoDB does: condition and update expressions evaluated per item, atomically;
`ReturnValuesOnConditionCheckFailure=ALL_OLD`; `ProjectionExpression`; DynamoDB's refusal of expression names and
values a request does not use. A table's key is a partition key, or a partition and a sort key.
tests/store/test_protocol_model_on_dynamodb.py sends a sample of what the model check sent to DynamoDB Local with
every transport and compares the answers. `MemoryTransport` puts it behind the layer's `Transport` protocol.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal
from typing import Any

try:
    from idempotency_layer.stores.dynamodb import DynamoDBError
except ImportError:  # a layer from before the storage floor (issue 43), as tools/differential.py runs it
    from idempotency_layer.dynamodb import DynamoDBError

CHECK_FAILED = "ConditionalCheckFailedException"

_TOKEN = re.compile(r"\s*(attribute_not_exists|attribute_exists|AND|OR|NOT|<>|<=|>=|[()=<>,]|#\w+|:\w+)")


def copy(value: Any) -> Any:
    """Items and requests are nested dicts of strings: far cheaper than copy.deepcopy, thousands of times over."""
    if isinstance(value, dict):
        return {k: copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy(v) for v in value]
    return value


def _tokens(expression: str) -> list[str]:
    tokens, position = [], 0
    while position < len(expression.rstrip()):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise DynamoDBError("expression", "ValidationException", f"cannot parse at {expression[position:]!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def _scalar(value: dict[str, Any] | None) -> tuple[str, Any] | None:
    if value is None:
        return None
    (kind, raw), = value.items()
    return kind, Decimal(raw) if kind == "N" else raw


class _Condition:
    """A recursive-descent evaluator for the condition grammar the layer uses."""

    def __init__(self, expression: str, names: dict, values: dict, item: dict | None, used: set[str]) -> None:
        self.tokens, self.i = _tokens(expression), 0
        self.names, self.values, self.item, self.used = names, values, item or {}, used

    def evaluate(self) -> bool:
        result = self._or()
        if self.i != len(self.tokens):
            raise DynamoDBError("expression", "ValidationException", "trailing tokens in the condition")
        return result

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None or (expected is not None and token != expected):
            raise DynamoDBError("expression", "ValidationException", f"expected {expected!r}, got {token!r}")
        self.i += 1
        return token

    def _or(self) -> bool:
        result = self._and()
        while self._peek() == "OR":
            self._take()
            right = self._and()  # both sides are parsed (and their names counted as used)
            result = result or right
        return result

    def _and(self) -> bool:
        result = self._not()
        while self._peek() == "AND":
            self._take()
            right = self._not()
            result = result and right
        return result

    def _not(self) -> bool:
        if self._peek() == "NOT":
            self._take()
            return not self._not()
        return self._primary()

    def _operand(self) -> tuple[str, Any] | None:
        token = self._take()
        self.used.add(token)
        if token.startswith("#"):
            return _scalar(self.item.get(self.names[token]))
        if token.startswith(":"):
            return _scalar(self.values[token])
        raise DynamoDBError("expression", "ValidationException", f"unexpected {token!r}")

    def _primary(self) -> bool:
        token = self._peek()
        if token == "(":
            self._take()
            result = self._or()
            self._take(")")
            return result
        if token in ("attribute_not_exists", "attribute_exists"):
            self._take()
            self._take("(")
            name = self._take()
            self.used.add(name)
            self._take(")")
            present = self.names[name] in self.item
            return present if token == "attribute_exists" else not present
        left = self._operand()
        operator = self._take()
        right = self._operand()
        if left is None or right is None or left[0] != right[0]:
            return False  # a missing attribute, or another type, compares false
        a, b = left[1], right[1]
        return {"=": a == b, "<>": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[operator]


def _apply_update(expression: str, names: dict, values: dict, item: dict, used: set[str]) -> None:
    for clause in re.findall(r"(SET|REMOVE)\s+(.*?)(?=\s+(?:SET|REMOVE)\s|$)", expression.strip()):
        action, body = clause
        for part in body.split(","):
            if action == "SET":
                name, value = (side.strip() for side in part.split("="))
                used.update((name, value))
                item[names[name]] = copy(values[value])
            else:
                name = part.strip()
                used.add(name)
                item.pop(names[name], None)


def _project(operation: str, item: dict, expression: str | None, names: dict) -> dict:
    """`item` as a read returns it: only the attributes a ProjectionExpression names, when there is one."""
    if expression is None:
        return copy(item)
    tokens = [token.strip() for token in expression.split(",")]
    unused = set(names) - set(tokens)
    if unused:
        raise DynamoDBError(operation, "ValidationException", f"unused in expressions: {sorted(unused)}", status=400)
    wanted = {names.get(token, token) for token in tokens}
    return {name: copy(value) for name, value in item.items() if name in wanted}


class MemoryDynamoDB:
    """One table keyed by `key_attr` (and `sort_attr`, when given), for the layer's item operations.

    `unprocessed` (a callable given the keys a BatchGetItem asked for) may name keys to leave unprocessed, as a
    throttled table does."""

    def __init__(self, key_attr: str = "id", sort_attr: str | None = None, table: str | None = None) -> None:
        self.key_attr = key_attr
        self.sort_attr = sort_attr
        self.table = table  # when given, requests naming another table are refused as DynamoDB refuses them
        self.items: dict[tuple[str, ...], dict] = {}
        self.lock = threading.Lock()

    def key_of(self, key: dict[str, Any]) -> tuple[str, ...]:
        found = (key[self.key_attr]["S"],)
        return found if self.sort_attr is None else (*found, key[self.sort_attr]["S"])

    def item(self, *key: str) -> dict | None:
        return self.items.get(key)

    def apply(self, operation: str, params: dict) -> dict:
        """Apply one request atomically: the response, or DynamoDBError as the real service would raise it."""
        with self.lock:
            return self._apply(operation, params)

    def _table(self, operation: str, name: str | None) -> None:
        if self.table is not None and name != self.table:
            raise DynamoDBError(operation, "ResourceNotFoundException", "Requested resource not found", status=400)

    def _apply(self, operation: str, params: dict) -> dict:
        names = params.get("ExpressionAttributeNames", {})
        if operation == "BatchGetItem":
            return self._batch_get(params)
        self._table(operation, params.get("TableName"))
        if operation == "GetItem":
            item = self.items.get(self.key_of(params["Key"]))
            if item is None:
                _project(operation, {}, params.get("ProjectionExpression"), names)  # its names checked all the same
                return {}
            return {"Item": _project(operation, item, params.get("ProjectionExpression"), names)}
        key = self.key_of(params["Item"] if operation == "PutItem" else params["Key"])
        old = self.items.get(key)
        values = params.get("ExpressionAttributeValues", {})
        used: set[str] = set()
        passed = True
        if "ConditionExpression" in params:
            passed = _Condition(params["ConditionExpression"], names, values, old, used).evaluate()
        new = None
        if operation == "UpdateItem":
            new = copy(old) if old is not None else copy(params["Key"])
            _apply_update(params["UpdateExpression"], names, values, new, used)
        unused = (set(names) | set(values)) - used
        if unused:  # DynamoDB refuses the request before looking at the item
            raise DynamoDBError(operation, "ValidationException", f"unused in expressions: {sorted(unused)}",
                                status=400)
        if not passed:
            returned = old if params.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" else None
            raise DynamoDBError(operation, CHECK_FAILED, "The conditional request failed",
                                item=copy(returned) if returned else None, status=400)
        if operation == "PutItem":
            self.items[key] = copy(params["Item"])
        elif operation == "UpdateItem":
            self.items[key] = new
        elif operation == "DeleteItem":
            self.items.pop(key, None)
        else:
            raise DynamoDBError(operation, "UnknownOperationException", operation, status=400)
        return {}

    def _batch_get(self, params: dict) -> dict:
        (table, request), = params["RequestItems"].items()
        self._table("BatchGetItem", table)
        names = request.get("ExpressionAttributeNames", {})
        found = []
        for key in request["Keys"]:
            item = self.items.get(self.key_of(key))
            projected = _project("BatchGetItem", item or {}, request.get("ProjectionExpression"), names)
            if item is not None:
                found.append(projected)
        return {"Responses": {table: found}, "UnprocessedKeys": {}}


class MemoryTransport:
    """The layer's `Transport` over a `MemoryDynamoDB`: every request applied at once (deadlines cannot cut one)."""

    def __init__(self, db: MemoryDynamoDB) -> None:
        self.db = db
        self.requests: list[str] = []  # each operation, in the order sent

    def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
        self.requests.append(operation)
        return self.db.apply(operation, copy(params))
