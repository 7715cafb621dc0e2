"""The in-memory table the model check explores (tools/model.py) against DynamoDB Local: a sample of the explored
histories, each one's requests sent again in the order they landed, must get the same answers (success or
ConditionalCheckFailed, the same old item, the same reads, single and batched)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from idempotency_layer.stores.dynamodb import DynamoDBError
from tests.support.memory_dynamodb import CHECK_FAILED
from tools.model import TABLE, Bounds, explore, walk

_runs = itertools.count()


def _rekey(value: Any, run: str, table: str) -> Any:
    """The request with each record key made this run's own and the table made the test's."""
    if isinstance(value, dict):
        return {(table if k == TABLE else k): (table if k == "TableName" else _rekey(v, run, table))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_rekey(v, run, table) for v in value]
    return f"{run}-{value}" if isinstance(value, str) and value.startswith("fn#") else value


def _read(operation: str, reply: Any, table: str) -> Any:
    """What a read answered: the item, or the batch's items by key (order is not DynamoDB's promise)."""
    if operation == "GetItem":
        return (reply or {}).get("Item")
    items = (reply or {}).get("Responses", {}).get(table, [])
    return sorted((item["id"]["S"], sorted(item)) for item in items)


@pytest.fixture(scope="module")
def sample() -> list:
    # Histories with faults, crashes, clock jumps, skew, a shared environment's cache, purges, late landings,
    # and batches read with BatchGetItem.
    histories = []
    for bounds, every in ((Bounds(invocations=2, faults=1, crashes=1, advances=2, skew_s=(0.0, 0.9)), 70),
                          (Bounds(invocations=3, faults=0, crashes=1, advances=1, environments=2, cache=True), 60),
                          (Bounds(invocations=3, faults=0, crashes=0, advances=1, environments=2, cache=True,
                                  purges=1), 80),
                          (Bounds(invocations=2, faults=0, crashes=1, advances=2, late=1), 200)):
        histories += explore(bounds, sample_every=every)[1]
    histories += walk(Bounds(invocations=2, faults=1, crashes=1, advances=1, kind="kinesis", precheck="always"),
                      600, sample_every=6)[1]
    return histories


def test_memory_table_answers_as_dynamodb_local_does(transport, table_name, sample) -> None:
    assert len(sample) >= 250
    compared = failed_conditions = batch_reads = 0
    for history in sample:
        run = f"model-{next(_runs)}"
        for (operation, params, outcome), reply in zip(history.requests, history.replies, strict=True):
            request = _rekey(params, run, table_name)
            try:
                answer = transport.call(operation, request)
                got, got_reply = "ok", answer
            except DynamoDBError as error:
                assert error.code == CHECK_FAILED, f"{operation}: {error.code}: {error.message}"
                got, got_reply = CHECK_FAILED, error.item
                failed_conditions += 1
            assert got == outcome, f"{operation} answered {got} on DynamoDB Local, {outcome} in memory"
            expected = _rekey(reply, run, table_name)
            if operation in ("GetItem", "BatchGetItem"):
                batch_reads += operation == "BatchGetItem"
                assert _read(operation, got_reply, table_name) == _read(operation, expected, table_name), (
                    f"{operation}: the items differ")
            elif got == CHECK_FAILED:
                assert got_reply == (expected or None), f"{operation}: the old items differ"
            compared += 1
    assert failed_conditions > 20, "the sample should exercise refused conditions"
    assert batch_reads > 20, "the sample should exercise batch reads"
    print(f"\n  {compared} requests of {len(sample)} explored histories answered alike in memory and on "
          f"DynamoDB Local ({failed_conditions} refused conditions, {batch_reads} batch reads)")
