"""An answer whose item is not the record asked for (another key's item, as a broken proxy or middlebox might
send back, or an item that is no idempotency record) is an error, never a replay (issue 20). On DynamoDB
Local, the real transports wrapped by one that rewrites the answers."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.dynamodb import DynamoDBError
from idempotency_layer.stores.dynamodb.store import DynamoDBStore

LONG = 60_000


class Rewriting:
    """Passes every call to `transport`, and hands each returned item (a GetItem's, or the one a failed
    condition returns) to `rewrite` first."""

    def __init__(self, transport: Any, rewrite: Any) -> None:
        self.transport, self.rewrite, self.on = transport, rewrite, False

    def call(self, operation: str, params: dict[str, Any], deadline: float | None = None) -> dict[str, Any]:
        try:
            answer = self.transport.call(operation, params, deadline)
        except DynamoDBError as error:
            if self.on and error.item is not None:
                error.item = self.rewrite(copy.deepcopy(error.item))
            raise
        if self.on and answer.get("Item") is not None:
            answer = {**answer, "Item": self.rewrite(copy.deepcopy(answer["Item"]))}
        return answer


def _another_key(item: dict[str, Any]) -> dict[str, Any]:
    item["id"] = {"S": "fn#someone-elses-order"}
    return item


def _no_status(item: dict[str, Any]) -> dict[str, Any]:
    del item["status"]
    return item


def _odd_status(item: dict[str, Any]) -> dict[str, Any]:
    item["status"] = {"S": "DONE"}
    return item


def _expiry_not_a_number(item: dict[str, Any]) -> dict[str, Any]:
    item["expires_at"] = {"S": "soon"}
    return item


def _result_of_a_number(item: dict[str, Any]) -> dict[str, Any]:
    item["result"] = {"N": "1"}
    return item


@pytest.mark.parametrize("rewrite", [_another_key, _no_status, _odd_status, _expiry_not_a_number,
                                     _result_of_a_number])
def test_an_answer_that_is_not_the_record_asked_for_is_refused(rewrite: Any, transport: Any,
                                                               table_name: str) -> None:
    rewriting = Rewriting(transport, rewrite)
    store = DynamoDBStore(rewriting, table_name, Attributes(), key_prefix="fn")
    cycle = Cycle(store, ttl_seconds=3600)
    runs: list[int] = []
    assert cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1) or {"placed": 1}) == ({"placed": 1}, False)
    rewriting.on = True
    # The replay path (the failed claim's item) and the read path (a wait's poll) alike.
    with pytest.raises(IdempotencyPersistenceLayerError) as refused:
        cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1))
    assert "fn#order-1" in str(refused.value) and "placed" not in str(refused.value)
    with pytest.raises(IdempotencyPersistenceLayerError):
        store.get("fn#order-1")
    assert runs == [1]
    rewriting.on = False
    assert cycle.run(Invocation(LONG), "fn#order-1", lambda: runs.append(1)) == ({"placed": 1}, True)


def test_a_sort_key_table_checks_both_parts_of_the_key(transport: Any, sort_key_table: str) -> None:
    def other_partition(item: dict[str, Any]) -> dict[str, Any]:
        item["pk"] = {"S": "idempotency#another-function"}
        return item

    rewriting = Rewriting(transport, other_partition)
    store = DynamoDBStore(rewriting, sort_key_table, Attributes(key="pk", sort_key="sk"), "idempotency#fn",
                          key_prefix="fn")
    cycle = Cycle(store, ttl_seconds=3600)
    assert cycle.run(Invocation(LONG), "fn#order-2", lambda: "placed") == ("placed", False)
    rewriting.on = True
    with pytest.raises(IdempotencyPersistenceLayerError, match="another key"):
        cycle.run(Invocation(LONG), "fn#order-2", lambda: "again")
