"""The in-memory table the model check explores (tools/model.py) against DynamoDB Local: a sample of
the explored histories, each one's requests sent again in the order they landed, must get the same answers
(success or ConditionalCheckFailed, the same old item, the same reads)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from idempotency_layer.dynamodb import DynamoDBError
from tests.support.memory_dynamodb import CHECK_FAILED
from tools.model import KEY, Bounds, explore

_runs = itertools.count()


def _rekey(value: Any, key: str, table: str) -> Any:
    if isinstance(value, dict):
        return {k: (table if k == "TableName" else _rekey(v, key, table)) for k, v in value.items()}
    return key if value == KEY else value


@pytest.fixture(scope="module")
def sample() -> list:
    # Histories with faults, crashes, clock jumps, SDK retries, skew and a shared environment's cache.
    histories = []
    for bounds, every in ((Bounds(invocations=2, faults=1, crashes=1, advances=2, skew_s=(0.0, 0.9)), 70),
                          (Bounds(invocations=3, faults=0, crashes=1, advances=1, environments=2, cache=True), 60)):
        _, picked = explore(bounds, sample_every=every)
        histories += picked
    return histories


def test_memory_table_answers_as_dynamodb_local_does(transport, table_name, sample) -> None:
    assert len(sample) >= 100
    compared = failed_conditions = 0
    for history in sample:
        key = f"model-{next(_runs)}"
        for (operation, params, outcome), reply in zip(history.requests, history.replies, strict=True):
            request = _rekey(params, key, table_name)
            try:
                answer = transport.call(operation, request)
                got, got_reply = "ok", answer
            except DynamoDBError as error:
                assert error.code == CHECK_FAILED, f"{operation}: {error.code}: {error.message}"
                got, got_reply = CHECK_FAILED, error.item
                failed_conditions += 1
            assert got == outcome, f"{operation} answered {got} on DynamoDB Local, {outcome} in memory"
            if operation == "GetItem" or got == CHECK_FAILED:
                expected = _rekey(reply, key, table_name)
                if operation == "GetItem":
                    got_reply = got_reply.get("Item")
                    expected = (expected or {}).get("Item")
                assert got_reply == (expected or None), f"{operation}: the items differ"
            compared += 1
    assert failed_conditions > 20, "the sample should exercise refused conditions"
    print(f"\n  {compared} requests of {len(sample)} explored histories answered alike in memory and on "
          f"DynamoDB Local ({failed_conditions} refused conditions)")
